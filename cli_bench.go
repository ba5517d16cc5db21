package main

// `queued bench`: a load generator in the spirit of redis-benchmark, for any
// server that speaks the protocol (queued or the reference). Each workload
// runs on connections of its own against a queue of its own, which is
// obliterated afterwards. Every job carries its sequence number, so that a
// drain can check that each job pushed was handed out and acknowledged
// exactly once.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const benchUsage = `Usage: queued bench [WORKLOAD...] [options]

Measures a running server (queued or any bunqueue-protocol server).
Workloads (default: push pushb drain mixed):
  push    single PUSH requests
  pushb   PUSHB requests of --batch jobs
  drain   --jobs jobs are pushed first (not timed), then pulled with PULLB and
          acknowledged with ACKB, --batch at a time; checks that every job
          was processed exactly once
  mixed   half the connections push (PUSHB, or PUSH with --batch 1) while the
          other half pull and acknowledge; reports end-to-end latency and
          checks exactly-once
  steady  (not in the default) --rate jobs a second for --duration (default
          10s), pushed one at a time (PUSHB of --batch with --batch above 1)
          on the first connection, while --workers workers on the others
          each wait in a long PULL and ACK with their token; reports the
          latency from each job's due time to a worker holding it, checks
          exactly-once, and with the server on this machine its CPU per job
          (and a local PostgreSQL's); pull_ms and ack_ms are a worker's mean
          time in a PULL that brought a job and in its ACK: while no PULL
          waits for a job, the workers take at most
          1000*workers/(pull_ms+ack_ms) jobs a second

Each workload uses a queue of its own (bench-...), removed with Obliterate at
the end. Latencies are per request (mixed/e2e: from push to acknowledgement).

Options:
`

// benchOpts are the bench's settings.
type benchOpts struct {
	cli         cliOpts
	connections int
	pipeline    int
	batch       int
	payload     int
	jobs        int
	duration    time.Duration
	workloads   []string
	progress    bool
	rate        int // steady: jobs a second
	workers     int // steady: workers waiting in a long PULL
}

// runBench is `queued bench`: it reads the options, runs the workloads
// and prints their figures.
func runBench(args []string, stdout, stderr io.Writer) int {
	// The global client options (host, port, token, TLS, json) are read
	// the same way as for every client command.
	g, rest, err := parseGlobal(args)
	if err != nil {
		fmt.Fprintln(stderr, "queued bench:", err)
		return 2
	}
	o := benchOpts{cli: g}
	fs := benchFlags(&o, stderr)
	if g.help {
		fs.SetOutput(stdout)
		fs.Usage()
		return 0
	}
	var flagArgs []string
	o.workloads, flagArgs = splitWorkloads(fs, rest)
	if err := fs.Parse(flagArgs); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if len(o.workloads) == 0 {
		o.workloads = []string{"push", "pushb", "drain", "mixed"}
	}
	if err := o.check(); err != nil {
		fmt.Fprintln(stderr, "queued bench:", err)
		return 2
	}
	o.progress = !g.json && isTerminal(stdout)

	// Interrupted (or its terminal gone), it stops and still removes its
	// queue.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	results, err := benchWorkloads(ctx, o, stdout)
	return reportBench(o, results, err, stdout, stderr)
}

// benchFlags are queued bench's own options, read into o.
func benchFlags(o *benchOpts, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("queued bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.connections, "connections", 4, "connections (mixed: half push, half work)")
	fs.IntVar(&o.pipeline, "pipeline", 16, "requests in flight on each connection")
	fs.IntVar(&o.batch, "batch", 100, "jobs per PUSHB, PULLB and ACKB")
	fs.IntVar(&o.payload, "payload", 64, "bytes of payload in each job's data")
	fs.IntVar(&o.jobs, "jobs", 100000, "jobs per workload")
	fs.DurationVar(&o.duration, "duration", 0, "run push, pushb and mixed for this long instead of --jobs (e.g. 10s)")
	fs.IntVar(&o.rate, "rate", 1000, "steady: jobs pushed a second")
	fs.IntVar(&o.workers, "workers", 20, "steady: workers, each waiting in a long PULL")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), benchUsage)
		fmt.Fprint(fs.Output(), `  --connections N   connections (mixed: half push, half work) (default 4)
  --pipeline N      requests in flight on each connection (default 16)
  --batch N         jobs per PUSHB, PULLB and ACKB, 1 to 1000 (default 100)
  --payload BYTES   payload in each job's data (default 64)
  --jobs N          jobs per workload (default 100000)
  --duration D      run push, pushb and mixed this long instead of --jobs (e.g. 10s);
                    steady: how long to push (default 10s)
  --rate N          steady: jobs pushed a second (default 1000)
  --workers N       steady: workers, each waiting in a long PULL (default 20)
  -H, --host, -p, --port, -t, --token, --tls, --tls-ca FILE, --tls-no-verify, --json
                    as for every client command (see queued help)

Examples:
  queued bench pushb --connections 4 --pipeline 8 --batch 100 --jobs 1000000
  queued bench steady --rate 1000 --duration 30s --workers 20 --batch 1
`)
	}
	return fs
}

// splitWorkloads separates the workload names, which may come before,
// between or after the options, from the options of fs.
func splitWorkloads(fs *flag.FlagSet, rest []string) (workloads, flagArgs []string) {
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if !strings.HasPrefix(a, "-") {
			workloads = append(workloads, strings.Split(a, ",")...)
			continue
		}
		flagArgs = append(flagArgs, a)
		if !strings.Contains(a, "=") && i+1 < len(rest) && fs.Lookup(strings.TrimLeft(a, "-")) != nil {
			i++
			flagArgs = append(flagArgs, rest[i])
		}
	}
	return workloads, flagArgs
}

// check refuses workloads and figures the bench cannot run.
func (o *benchOpts) check() error {
	for _, w := range o.workloads {
		if !slices.Contains([]string{"push", "pushb", "drain", "mixed", "steady"}, w) {
			return fmt.Errorf("unknown workload %q (push, pushb, drain, mixed, steady)", w)
		}
	}
	switch {
	case o.connections < 1 || o.connections > 1024:
		return errors.New("--connections must be from 1 to 1024")
	case o.pipeline < 1 || o.pipeline > 1024:
		return errors.New("--pipeline must be from 1 to 1024")
	case o.batch < 1 || o.batch > 1000:
		return errors.New("--batch must be from 1 to 1000 (the protocol's PULLB bound)")
	case o.payload < 0 || o.payload > 1<<20:
		return errors.New("--payload must be from 0 to 1048576 bytes")
	case o.jobs < 1:
		return errors.New("--jobs must be at least 1")
	case o.duration < 0:
		return errors.New("--duration must be positive")
	case slices.Contains(o.workloads, "mixed") && o.connections < 2:
		return errors.New("mixed needs at least 2 connections (producers and workers)")
	case o.rate < 1 || o.rate > 1_000_000:
		return errors.New("--rate must be from 1 to 1000000 jobs a second")
	case o.workers < 1 || o.workers > 10_000:
		return errors.New("--workers must be from 1 to 10000")
	case slices.Contains(o.workloads, "steady") && o.duration > 0 && float64(o.rate)*o.duration.Seconds() > seenMax:
		return fmt.Errorf("steady: --rate times --duration must be at most %d jobs", seenMax)
	}
	return nil
}

// reportBench prints the results, as JSON or as a table, and answers the
// exit status: 1 when the run failed or a check of exactly-once did.
func reportBench(o benchOpts, results []benchResult, err error, stdout, stderr io.Writer) int {
	if o.cli.json {
		doc := map[string]any{"server": o.cli.addr(), "connections": o.connections, "pipeline": o.pipeline,
			"batch": o.batch, "payload": o.payload, "results": results}
		if err != nil {
			doc["error"] = err.Error()
		}
		b, _ := json.MarshalIndent(doc, "", "  ")
		fmt.Fprintln(stdout, string(b))
	} else if len(results) > 0 {
		printBench(stdout, o, results)
	}
	if err != nil {
		fmt.Fprintln(stderr, "queued bench:", err)
		return 1
	}
	for _, r := range results {
		if r.Verified != nil && !r.Verified.OK {
			return 1
		}
	}
	return 0
}

// benchResult is one workload's outcome.
type benchResult struct {
	Workload   string       `json:"workload"`
	Jobs       int64        `json:"jobs"`
	Requests   int64        `json:"requests"`
	Seconds    float64      `json:"seconds"`
	JobsPerSec float64      `json:"jobsPerSec"`
	ReqsPerSec float64      `json:"requestsPerSec"`
	LatencyMs  latencyMs    `json:"latencyMs"`
	Verified   *verifyStats `json:"verified,omitempty"`
	// steady only: the schedule, the pushes' round trips, and the CPU per
	// job of a server (and a PostgreSQL) on this machine (0: not known).
	Rate          int        `json:"rate,omitempty"`
	Workers       int        `json:"workers,omitempty"`
	PushMs        *latencyMs `json:"pushLatencyMs,omitempty"`
	ServerCPUms   float64    `json:"serverCpuMsPerJob,omitempty"`
	DatabaseCPUms float64    `json:"postgresCpuMsPerJob,omitempty"`
	// steady: a worker's mean time, in ms, in a PULL that brought a job
	// and in the ACK that followed.
	PullMs      float64 `json:"pullMs,omitempty"`
	AckMs       float64 `json:"ackMs,omitempty"`
	Description string  `json:"-"`
}

type latencyMs struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// verifyStats is the exactly-once check of a run that processes jobs.
type verifyStats struct {
	OK         bool  `json:"ok"`
	Pushed     int64 `json:"pushed"`
	Processed  int64 `json:"processed"`
	Missing    int64 `json:"missing"`
	Duplicated int64 `json:"duplicated"`
	LeftOnSrv  int64 `json:"leftOnServer"`
}

// benchWorkloads runs the chosen workloads one after the other.
func benchWorkloads(ctx context.Context, o benchOpts, stdout io.Writer) ([]benchResult, error) {
	var results []benchResult
	runID := strconv.FormatInt(time.Now().UnixNano()%1e12, 36) + "-" + strconv.Itoa(os.Getpid())
	for _, w := range o.workloads {
		b, err := newBenchRun(ctx, o, "bench-"+runID+"-"+w, stdout)
		if err != nil {
			return results, err
		}
		var rs []benchResult
		switch w {
		case "push":
			rs, err = b.push(false)
		case "pushb":
			rs, err = b.push(true)
		case "drain":
			rs, err = b.drain()
		case "mixed":
			rs, err = b.mixed()
		case "steady":
			rs, err = b.steady()
		}
		b.close()
		results = append(results, rs...)
		if err != nil {
			return results, fmt.Errorf("%s: %w", w, err)
		}
	}
	return results, nil
}

// benchRun is one workload: its connections, queue and counters.
type benchRun struct {
	o       benchOpts
	ctx     context.Context
	cancel  context.CancelCauseFunc
	queue   string
	conns   []*Client
	payload string
	out     io.Writer
	start   time.Time

	pushed    atomic.Int64 // jobs the server accepted
	processed atomic.Int64 // jobs acknowledged
	requests  atomic.Int64
	seen      *seenTable
	dupes     atomic.Int64
	ackErrs   atomic.Int64
}

func newBenchRun(ctx context.Context, o benchOpts, queue string, out io.Writer) (*benchRun, error) {
	cfg, err := o.cli.clientConfig()
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancelCause(ctx)
	b := &benchRun{o: o, ctx: rctx, cancel: cancel, queue: queue, out: out,
		payload: strings.Repeat("x", o.payload), seen: &seenTable{}}
	for range o.connections {
		c, err := Dial(rctx, cfg)
		if err != nil {
			b.close()
			return nil, err
		}
		b.conns = append(b.conns, c)
	}
	return b, nil
}

// close removes the run's queue and closes its connections. The queue is
// removed even when the run was interrupted, with a fresh deadline.
func (b *benchRun) close() {
	if len(b.conns) > 0 && b.conns[0].Err() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		b.conns[0].Call(ctx, map[string]any{"cmd": "Obliterate", "queue": b.queue})
		cancel()
	}
	for _, c := range b.conns {
		c.Close()
	}
	b.cancel(nil)
}

// fail stops the run with the first error.
func (b *benchRun) fail(err error) { b.cancel(err) }

func (b *benchRun) err() error {
	if err := context.Cause(b.ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if errors.Is(b.ctx.Err(), context.Canceled) {
		return errors.New("interrupted")
	}
	return b.ctx.Err()
}

// call sends one request and checks that it succeeded.
func (b *benchRun) call(c *Client, cmd string, fields func(e *Enc) int) ([]byte, error) {
	return b.callIn(b.ctx, c, cmd, fields)
}

// callIn is call bounded by ctx instead of the run's context.
func (b *benchRun) callIn(ctx context.Context, c *Client, cmd string, fields func(e *Enc) int) ([]byte, error) {
	body, err := c.Send(ctx, cmd, fields)
	if err == nil {
		err = AnswerError(cmd, body)
	}
	b.requests.Add(1)
	return body, err
}

// writeJob writes one job's fields: its name and data {s: seq, t: µs since
// the run started, p: payload}.
func (b *benchRun) writeJob(e *Enc, seq, at int64) {
	e.MapHead(2)
	e.Str("name")
	e.Str("bench")
	e.Str("data")
	e.MapHead(3)
	e.Str("s")
	e.Int(seq)
	e.Str("t")
	e.Int(at)
	e.Str("p")
	e.Str(b.payload)
}

// pushBatch pushes jobs seq..seq+n-1 with PUSHB, or PUSH when n is 1 and
// single is set.
func (b *benchRun) pushBatch(c *Client, seq int64, n int, single bool) error {
	return b.pushAt(c, seq, n, single, -1)
}

// pushAt is pushBatch with the time the jobs carry (µs since the run
// started): at, or the moment they are written when at is negative.
func (b *benchRun) pushAt(c *Client, seq int64, n int, single bool, at int64) error {
	stamp := func() int64 {
		if at >= 0 {
			return at
		}
		return time.Since(b.start).Microseconds()
	}
	if single {
		_, err := b.call(c, "PUSH", func(e *Enc) int {
			e.Str("queue")
			e.Str(b.queue)
			e.Str("name")
			e.Str("bench")
			e.Str("data")
			e.MapHead(3)
			e.Str("s")
			e.Int(seq)
			e.Str("t")
			e.Int(stamp())
			e.Str("p")
			e.Str(b.payload)
			return 3
		})
		if err == nil {
			b.pushed.Add(1)
		}
		return err
	}
	_, err := b.call(c, "PUSHB", func(e *Enc) int {
		e.Str("queue")
		e.Str(b.queue)
		e.Str("jobs")
		e.ArrayHead(n)
		for i := range n {
			b.writeJob(e, seq+int64(i), stamp())
		}
		return 2
	})
	if err == nil {
		b.pushed.Add(int64(n))
	}
	return err
}

// lanes runs fn on pipeline goroutines for each of the given connections
// and waits for them; each lane has its own histogram.
func (b *benchRun) lanes(conns []*Client, fn func(c *Client, h *hist)) *hist {
	var wg sync.WaitGroup
	hs := make([]*hist, 0, len(conns)*b.o.pipeline)
	for _, c := range conns {
		for range b.o.pipeline {
			h := &hist{}
			hs = append(hs, h)
			wg.Go(func() { fn(c, h) })
		}
	}
	wg.Wait()
	all := &hist{}
	for _, h := range hs {
		all.merge(h)
	}
	return all
}

// progressLine redraws one status line on a terminal until stop closes.
func (b *benchRun) progressLine(name string, count func() int64, stop <-chan struct{}) func() {
	done := make(chan struct{})
	if !b.o.progress {
		close(done)
		return func() {}
	}
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		var last int64
		lastAt := time.Now()
		for {
			select {
			case <-stop:
				fmt.Fprint(b.out, "\r\033[K")
				return
			case now := <-t.C:
				n := count()
				rate := float64(n-last) / now.Sub(lastAt).Seconds()
				last, lastAt = n, now
				fmt.Fprintf(b.out, "\r\033[K%-8s %12s jobs %12s jobs/s %8s", name, groupDigits(float64(n)),
					groupDigits(rate), time.Since(b.start).Round(100*time.Millisecond))
			}
		}
	}()
	return func() { <-done }
}

// push measures PUSH (batch false) or PUSHB.
func (b *benchRun) push(batch bool) ([]benchResult, error) {
	name := "push"
	per := 1
	if batch {
		name, per = "pushb", b.o.batch
	}
	var next atomic.Int64
	total := int64(b.o.jobs)
	deadline := time.Time{}
	b.start = time.Now()
	if b.o.duration > 0 {
		deadline = b.start.Add(b.o.duration)
	}
	stop := make(chan struct{})
	wait := b.progressLine(name, b.pushed.Load, stop)
	h := b.lanes(b.conns, func(c *Client, h *hist) {
		for b.ctx.Err() == nil {
			n := int64(per)
			var seq int64
			if deadline.IsZero() {
				seq = next.Add(n) - n
				if seq >= total {
					return
				}
				n = min(n, total-seq)
			} else {
				if time.Now().After(deadline) {
					return
				}
				seq = next.Add(n) - n
			}
			t0 := time.Now()
			if err := b.pushBatch(c, seq, int(n), !batch); err != nil {
				b.fail(err)
				return
			}
			h.add(time.Since(t0))
		}
	})
	el := time.Since(b.start)
	close(stop)
	wait()
	r := b.result(name, b.pushed.Load(), b.requests.Load(), el, h)
	return []benchResult{r}, b.err()
}

// prefill pushes the jobs a drain takes, pipelined, untimed.
func (b *benchRun) prefill(total int64) error {
	var next atomic.Int64
	b.lanes(b.conns, func(c *Client, _ *hist) {
		for b.ctx.Err() == nil {
			n := int64(b.o.batch)
			seq := next.Add(n) - n
			if seq >= total {
				return
			}
			if err := b.pushBatch(c, seq, int(min(n, total-seq)), false); err != nil {
				b.fail(err)
				return
			}
		}
	})
	return b.err()
}

// work pulls and acknowledges until want jobs are processed (want < 0:
// until stopWork closes and the queue is empty). Every request's round
// trip goes into h.
func (b *benchRun) work(c *Client, h *hist, want func() (int64, bool)) {
	ids := make([]string, 0, b.o.batch)
	var fields []Field
	var jf jobFields
	for b.ctx.Err() == nil {
		target, final := want()
		if final && b.processed.Load() >= target {
			return
		}
		jobs, err := b.pullBatch(c, h, &fields)
		if err != nil {
			b.fail(err)
			return
		}
		if len(jobs) == 0 {
			continue
		}
		if ids, err = b.tally(jobs, ids[:0], h, &jf); err != nil {
			b.fail(err)
			return
		}
		if err := b.ackBatch(c, h, ids); err != nil {
			b.fail(err)
			return
		}
		b.processed.Add(int64(len(ids)))
	}
}

// pullBatch sends one PULLB and answers the jobs it got; fields is the
// parser's buffer, reused from one call to the next.
func (b *benchRun) pullBatch(c *Client, h *hist, fields *[]Field) ([]Raw, error) {
	t0 := time.Now()
	body, err := b.call(c, "PULLB", func(e *Enc) int {
		e.Str("queue")
		e.Str(b.queue)
		e.Str("count")
		e.Int(int64(b.o.batch))
		e.Str("timeout")
		e.Int(100)
		return 3
	})
	if err != nil {
		return nil, err
	}
	h.add(time.Since(t0))
	m, err := ParseMap(body, *fields)
	*fields = m.Fields[:0]
	if err != nil {
		return nil, fmt.Errorf("PULLB answer: %w", err)
	}
	jobs, _, err := m.Array("jobs")
	if err != nil {
		return nil, fmt.Errorf("PULLB answer: %w", err)
	}
	return jobs, nil
}

// jobFields are a worker's parse buffers for pulled jobs and their data,
// reused from one job to the next: parsed into fresh slices, grown field
// by field to a job's 48, the bench's own worker had spent a third of its
// CPU allocating, CPU the server it measures shares on a small machine.
type jobFields struct{ job, data []Field }

// tally counts each pulled job as seen (a second time is a duplicate),
// records its end-to-end latency in a mixed run, and answers the ids,
// appended to ids.
func (b *benchRun) tally(jobs []Raw, ids []string, h *hist, jf *jobFields) ([]string, error) {
	nowUs := time.Since(b.start).Microseconds()
	for _, jr := range jobs {
		jm, err := ParseMap(jr, jf.job[:0])
		jf.job = jm.Fields
		if err != nil {
			return ids, fmt.Errorf("PULLB job: %w", err)
		}
		id, _, _ := jm.Str("id")
		ids = append(ids, id)
		// Absent or nil data fails to parse as a map too.
		dm, err := ParseMap(jm.Get("data"), jf.data[:0])
		jf.data = dm.Fields
		if err != nil {
			return ids, fmt.Errorf("PULLB job %s: data is not the bench's", id)
		}
		seq, _, _ := dm.Int("s")
		times, ok := b.seen.inc(seq)
		if !ok {
			return ids, fmt.Errorf("PULLB job %s: sequence %d out of range", id, seq)
		}
		if times > 1 {
			b.dupes.Add(1)
		}
		if pushedAt, ok, _ := dm.Int("t"); ok && h.e2e != nil {
			h.e2e.add(time.Duration(nowUs-pushedAt) * time.Microsecond)
		}
	}
	return ids, nil
}

// ackBatch acknowledges ids with one ACKB; ids the server ignored are
// counted as ack errors.
func (b *benchRun) ackBatch(c *Client, h *hist, ids []string) error {
	t1 := time.Now()
	body, err := b.call(c, "ACKB", func(e *Enc) int {
		e.Str("ids")
		e.ArrayHead(len(ids))
		for _, id := range ids {
			e.Str(id)
		}
		return 1
	})
	if err != nil {
		return err
	}
	h.add(time.Since(t1))
	am, _ := ParseMap(body, nil)
	if dm, ok, _ := am.Map("data"); ok {
		if ign, ok, _ := dm.Array("ignoredIds"); ok && len(ign) > 0 {
			b.ackErrs.Add(int64(len(ign)))
		}
	}
	return nil
}

// verify checks the exactly-once property after a run and what the
// server still holds of the queue.
func (b *benchRun) verify(pushed int64) *verifyStats {
	v := &verifyStats{Pushed: pushed, Processed: b.processed.Load(), Duplicated: b.dupes.Load()}
	for i := range pushed {
		if b.seen.get(i) == 0 {
			v.Missing++
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ans, err := b.conns[0].Call(ctx, map[string]any{"cmd": "GetJobCounts", "queue": b.queue}); err == nil {
		if cs, ok := ans["counts"].(map[string]any); ok {
			for _, k := range []string{"waiting", "prioritized", "delayed", "active", "paused"} {
				n, _ := numOf(cs[k])
				v.LeftOnSrv += int64(n)
			}
		}
	} else {
		v.LeftOnSrv = -1
	}
	v.OK = v.Missing == 0 && v.Duplicated == 0 && v.Processed == pushed && b.ackErrs.Load() == 0 && v.LeftOnSrv == 0
	return v
}

func (b *benchRun) drain() ([]benchResult, error) {
	total := int64(b.o.jobs)
	b.start = time.Now()
	if err := b.prefill(total); err != nil {
		return nil, fmt.Errorf("pushing the jobs to drain: %w", err)
	}
	b.requests.Store(0)
	stop := make(chan struct{})
	b.start = time.Now()
	wait := b.progressLine("drain", b.processed.Load, stop)
	unwatch := b.watchStall()
	h := b.lanes(b.conns, func(c *Client, h *hist) {
		b.work(c, h, func() (int64, bool) { return total, true })
	})
	el := time.Since(b.start)
	unwatch()
	close(stop)
	wait()
	r := b.result("drain", b.processed.Load(), b.requests.Load(), el, h)
	if err := b.err(); err != nil {
		return []benchResult{r}, err
	}
	r.Verified = b.verify(total)
	return []benchResult{r}, nil
}

// watchStall fails the run when nothing is processed for 30 s: a job lost
// by the server would otherwise keep the workers polling for ever.
func (b *benchRun) watchStall() func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last, lastAt := b.processed.Load(), time.Now()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if n := b.processed.Load(); n != last {
					last, lastAt = n, time.Now()
				} else if time.Since(lastAt) > 30*time.Second {
					b.fail(fmt.Errorf("stalled: no job processed for 30s (%d of %d pushed)", n, b.pushed.Load()))
					return
				}
			}
		}
	}()
	return func() { close(done); <-stopped }
}

func (b *benchRun) mixed() ([]benchResult, error) {
	np := len(b.conns) / 2
	producers, workers := b.conns[:np], b.conns[np:]
	total := int64(b.o.jobs)
	single := b.o.batch == 1
	var deadline time.Time
	b.start = time.Now()
	if b.o.duration > 0 {
		deadline = b.start.Add(b.o.duration)
		total = seenMax
	}
	var next atomic.Int64
	var producing atomic.Bool
	producing.Store(true)
	stop := make(chan struct{})
	wait := b.progressLine("mixed", b.processed.Load, stop)
	unwatch := b.watchStall()

	var wg sync.WaitGroup
	var ph, wh *hist
	wg.Go(func() {
		ph = b.lanes(producers, func(c *Client, h *hist) {
			for b.ctx.Err() == nil {
				n := int64(b.o.batch)
				if !deadline.IsZero() && time.Now().After(deadline) {
					return
				}
				seq := next.Add(n) - n
				if seq >= total {
					return
				}
				n = min(n, total-seq)
				t0 := time.Now()
				if err := b.pushBatch(c, seq, int(n), single); err != nil {
					b.fail(err)
					return
				}
				h.add(time.Since(t0))
			}
		})
		producing.Store(false)
	})
	wg.Go(func() {
		wh = b.lanes(workers, func(c *Client, h *hist) {
			h.e2e = &hist{}
			b.work(c, h, func() (int64, bool) {
				if producing.Load() {
					return 0, false
				}
				return b.pushed.Load(), true
			})
		})
	})
	wg.Wait()
	el := time.Since(b.start)
	unwatch()
	close(stop)
	wait()
	pushed := b.pushed.Load()
	rp := b.result("mixed/push", pushed, ph.n, el, ph)
	e2e := &hist{}
	for _, h := range wh.lanes {
		if h.e2e != nil {
			e2e.merge(h.e2e)
		}
	}
	rw := b.result("mixed/e2e", b.processed.Load(), wh.n, el, e2e)
	rw.ReqsPerSec = float64(wh.n) / el.Seconds()
	rw.Requests = wh.n
	if err := b.err(); err != nil {
		return []benchResult{rp, rw}, err
	}
	rw.Verified = b.verify(pushed)
	return []benchResult{rp, rw}, nil
}

func (b *benchRun) result(name string, jobs, reqs int64, el time.Duration, h *hist) benchResult {
	s := el.Seconds()
	return benchResult{Workload: name, Jobs: jobs, Requests: reqs, Seconds: round3(s),
		JobsPerSec: math.Round(float64(jobs) / s), ReqsPerSec: math.Round(float64(reqs) / s),
		LatencyMs: h.latency()}
}

// latency is the histogram's quantiles and maximum, in ms.
func (h *hist) latency() latencyMs {
	return latencyMs{P50: h.quantileMs(0.50), P90: h.quantileMs(0.90), P95: h.quantileMs(0.95), P99: h.quantileMs(0.99),
		Max: round3(float64(h.max) / 1e6)}
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

func printBench(w io.Writer, o benchOpts, rs []benchResult) {
	mode := fmt.Sprintf("%d jobs", o.jobs)
	if o.duration > 0 {
		mode = o.duration.String() + " (push, pushb, mixed)"
	}
	tlsNote := ""
	if o.cli.tls || o.cli.tlsCA != "" || o.cli.tlsNoVerify {
		tlsNote = ", TLS"
	}
	fmt.Fprintf(w, "queued bench against %s%s: %d connections, pipeline %d, batch %d, payload %d B, %s\n\n",
		o.cli.addr(), tlsNote, o.connections, o.pipeline, o.batch, o.payload, mode)
	rows := [][]string{{"WORKLOAD", "JOBS", "TIME", "JOBS/S", "REQ/S", "P50", "P95", "P99", "MAX"}}
	for _, r := range rs {
		rows = append(rows, []string{r.Workload, groupDigits(float64(r.Jobs)), fmt.Sprintf("%.2fs", r.Seconds),
			groupDigits(r.JobsPerSec), groupDigits(r.ReqsPerSec), fmtMs(r.LatencyMs.P50), fmtMs(r.LatencyMs.P95),
			fmtMs(r.LatencyMs.P99), fmtMs(r.LatencyMs.Max)})
	}
	table(w, rows)
	for _, r := range rs {
		if r.Workload == "steady" {
			fmt.Fprintln(w, steadyLine(r))
		}
	}
	for _, r := range rs {
		if v := r.Verified; v != nil {
			if v.OK {
				fmt.Fprintf(w, "%s: all %s jobs pushed were processed exactly once\n", r.Workload, groupDigits(float64(v.Pushed)))
			} else {
				fmt.Fprintf(w, "%s: EXACTLY-ONCE CHECK FAILED: %d pushed, %d processed, %d never seen, %d seen twice or more, %d left on the server\n",
					r.Workload, v.Pushed, v.Processed, v.Missing, v.Duplicated, v.LeftOnSrv)
			}
		}
	}
}

func fmtMs(ms float64) string {
	switch {
	case ms < 1:
		return fmt.Sprintf("%.0fµs", ms*1000)
	case ms < 100:
		return fmt.Sprintf("%.2fms", ms)
	}
	return fmt.Sprintf("%.0fms", ms)
}

// groupDigits writes 1234567 as 1,234,567.
func groupDigits(f float64) string {
	s := strconv.FormatInt(int64(math.Round(f)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
