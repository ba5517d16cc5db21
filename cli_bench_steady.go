package main

// `queued bench steady`: the load most installations carry all day, not a
// bulk run. One producer sends jobs at a fixed rate (one PUSH each, or
// PUSHB of --batch), --workers workers each wait in a long PULL and ACK
// with the token they were given, as the official client's Worker does.
// The figure is the latency from the moment a job was due to be pushed to
// the moment a worker holds it, and, with the server on this machine, the
// CPU the server (and a local PostgreSQL) spent per job.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// steadyPoll is a worker's long-poll timeout, in ms: short enough that
// workers notice the end of a run, long enough that an idle worker costs
// the server nothing but its wait.
const steadyPoll = 2000

// steady runs the steady workload: rate jobs a second for the duration,
// then waits until every job pushed is acknowledged.
func (b *benchRun) steady() ([]benchResult, error) {
	producer, workers := b.conns[:1], b.conns
	if len(b.conns) > 1 {
		workers = b.conns[1:]
	}
	dur := b.o.duration
	if dur == 0 {
		dur = 10 * time.Second
	}
	per := int64(b.o.batch)
	total := int64(float64(b.o.rate) * dur.Seconds())
	total = max(per, total/per*per)
	cpu := newCPUWatch(b.o.cli)

	stop := make(chan struct{})
	b.start = time.Now()
	wait := b.progressLine("steady", b.processed.Load, stop)
	unwatch := b.watchStall()
	// The workers' polls end with wctx: canceling the run's own context
	// would count as a failure.
	wctx, wcancel := context.WithCancel(b.ctx)
	defer wcancel()
	var wg sync.WaitGroup
	ws := make([]*steadyTimes, b.o.workers)
	for i := range b.o.workers {
		ws[i] = &steadyTimes{lat: &hist{}}
		wg.Go(func() { b.steadyWorker(wctx, workers[i%len(workers)], ws[i]) })
	}
	ph := b.steadyPush(producer, total, per)
	pushedIn := time.Since(b.start)
	for b.ctx.Err() == nil && b.processed.Load() < b.pushed.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	el := time.Since(b.start)
	wcancel()
	wg.Wait()
	unwatch()
	close(stop)
	wait()
	all, sum := &hist{}, steadyTimes{}
	for _, w := range ws {
		all.merge(w.lat)
		sum.jobs += w.jobs
		sum.pull += w.pull
		sum.ack += w.ack
	}
	r := b.result("steady", b.processed.Load(), b.requests.Load(), el, all)
	if sum.jobs > 0 {
		r.PullMs = round3(float64(sum.pull) / 1e6 / float64(sum.jobs))
		r.AckMs = round3(float64(sum.ack) / 1e6 / float64(sum.jobs))
	}
	r.Rate = b.o.rate
	r.Workers = b.o.workers
	// The rate achieved is the pushes' (the tail of the run is the last
	// jobs being worked, not the schedule).
	r.JobsPerSec = math.Round(float64(b.pushed.Load()) / pushedIn.Seconds())
	pl := ph.latency()
	r.PushMs = &pl
	if n := b.processed.Load(); n > 0 {
		r.ServerCPUms, r.DatabaseCPUms = cpu.perJob(n)
	}
	if err := b.err(); err != nil {
		return []benchResult{r}, err
	}
	r.Verified = b.verify(b.pushed.Load())
	return []benchResult{r}, nil
}

// steadyPush pushes jobs 0..total-1, per at a time, each batch at its due
// time on the rate's schedule, and answers the pushes' round trips.
func (b *benchRun) steadyPush(producer []*Client, total, per int64) *hist {
	var next atomic.Int64
	return b.lanes(producer, func(c *Client, h *hist) {
		for b.ctx.Err() == nil {
			seq := next.Add(per) - per
			if seq >= total {
				return
			}
			// Due at its place in the schedule, whatever happened to the
			// jobs before it: the latency counts from then, so a producer
			// held up shows as latency instead of a slower rate.
			due := b.start.Add(time.Duration(float64(seq) / float64(b.o.rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			t0 := time.Now()
			if err := b.pushAt(c, seq, int(per), per == 1, due.Sub(b.start).Microseconds()); err != nil {
				b.fail(err)
				return
			}
			h.add(time.Since(t0))
		}
	})
}

// steadyTimes is what one worker saw: each job's latency, and the time it
// spent in the PULLs that brought a job and in its ACKs. A worker's cycle
// is one of each: with every worker busy, workers/(pull+ack) is the most
// jobs a second they can take, however fast jobs are pushed.
type steadyTimes struct {
	lat       *hist
	jobs      int64
	pull, ack time.Duration
}

// steadyWorker waits for a job with a long PULL, takes its latency and
// acknowledges it with its token, until ctx ends.
func (b *benchRun) steadyWorker(ctx context.Context, c *Client, st *steadyTimes) {
	var fields []Field
	var jf jobFields
	ids := make([]string, 0, 1)
	lh := &hist{e2e: st.lat}
	for ctx.Err() == nil && b.ctx.Err() == nil {
		t0 := time.Now()
		body, err := b.callIn(ctx, c, "PULL", func(e *Enc) int {
			e.Str("queue")
			e.Str(b.queue)
			e.Str("timeout")
			e.Int(steadyPoll)
			e.Str("owner")
			e.Str("bench")
			return 3
		})
		if err != nil {
			if ctx.Err() == nil {
				b.fail(err)
			}
			return
		}
		m, err := ParseMap(body, fields[:0])
		fields = m.Fields
		if err != nil {
			b.fail(fmt.Errorf("PULL answer: %w", err))
			return
		}
		job := m.Get("job")
		if len(job) == 0 || job[0] == 0xc0 { // nil: the poll ran out
			continue
		}
		token, _, _ := m.Str("token")
		if ids, err = b.tally([]Raw{job}, ids[:0], lh, &jf); err != nil {
			b.fail(err)
			return
		}
		id := ids[0]
		t1 := time.Now()
		_, err = b.call(c, "ACK", func(e *Enc) int {
			e.Str("id")
			e.Str(id)
			e.Str("token")
			e.Str(token)
			return 2
		})
		if err != nil {
			b.fail(err)
			return
		}
		st.jobs++
		st.pull += t1.Sub(t0)
		st.ack += time.Since(t1)
		b.processed.Add(1)
	}
}

// cpuWatch reads the CPU time of the server the bench talks to, when it
// runs on this machine, and of a local PostgreSQL's processes, at the
// start of a run; perJob answers what each job cost since, in ms.
type cpuWatch struct {
	server     int // pid, 0 when not found
	serverAt   float64
	postgresAt float64
	postgres   bool
}

func newCPUWatch(o cliOpts) *cpuWatch {
	w := &cpuWatch{}
	if isLoopback(o.host) {
		w.server = listenerPID(o.port)
	}
	if w.server != 0 {
		w.serverAt, _ = procCPU(w.server)
	}
	w.postgresAt, w.postgres = postgresCPU()
	return w
}

// perJob answers the server's and PostgreSQL's CPU per job in ms; 0 when
// unknown.
func (w *cpuWatch) perJob(jobs int64) (server, database float64) {
	if w.server != 0 {
		if now, ok := procCPU(w.server); ok {
			server = round3((now - w.serverAt) * 1000 / float64(jobs))
		}
	}
	if w.postgres {
		if now, ok := postgresCPU(); ok {
			database = round3((now - w.postgresAt) * 1000 / float64(jobs))
		}
	}
	return server, database
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times:
// 100 on every Linux the Go runtime supports.
const clockTicks = 100

// procCPU reads a process's user and system CPU time, in seconds.
func procCPU(pid int) (float64, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	user, err1 := strconv.ParseFloat(f[11], 64)
	sys, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return (user + sys) / clockTicks, true
}

// postgresCPU sums the CPU time of this machine's processes named
// postgres (a local database's server and its backends; a backend that
// ended during the run takes its time with it).
func postgresCPU() (float64, bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	var sum float64
	found := false
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		if s, ok := procCPU(pid); ok {
			sum += s
			found = true
		}
	}
	return sum, found
}

// listenerPID finds the process listening on a local TCP port, through
// /proc/net/tcp{,6} (the socket's inode) and the processes' descriptors;
// 0 when none is found or /proc cannot be read (another system, another
// user's process).
func listenerPID(port int) int {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		listenInodes(fh, port, inodes)
		fh.Close()
	}
	if len(inodes) == 0 {
		return 0
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			l, err := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name()))
			if err == nil && strings.HasPrefix(l, "socket:[") && inodes[strings.TrimSuffix(l[len("socket:["):], "]")] {
				return pid
			}
		}
	}
	return 0
}

// listenInodes adds the inodes of the sockets listening on port, read
// from a /proc/net/tcp table, to inodes.
func listenInodes(r io.Reader, port int, inodes map[string]bool) {
	sc := bufio.NewScanner(r)
	want := fmt.Sprintf(":%04X", port)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// sl local_address rem_address st ... inode (the tenth field)
		if len(f) < 10 || f[3] != "0A" || !strings.HasSuffix(f[1], want) {
			continue
		}
		inodes[f[9]] = true
	}
}

// steadyLine is a steady run's summary, one line of key=value that a
// script can read: the rate asked and reached, the latency quantiles in
// ms, the CPU per job where it is known, and a worker's mean time in a
// PULL that brought a job and in an ACK.
func steadyLine(r benchResult) string {
	l := fmt.Sprintf("steady rate=%d achieved=%.0f workers=%d jobs=%d p50=%.3f p90=%.3f p99=%.3f max=%.3f",
		r.Rate, r.JobsPerSec, r.Workers, r.Jobs, r.LatencyMs.P50, r.LatencyMs.P90, r.LatencyMs.P99, r.LatencyMs.Max)
	if r.ServerCPUms > 0 {
		l += fmt.Sprintf(" server_cpu_ms_per_job=%.3f", r.ServerCPUms)
	}
	if r.DatabaseCPUms > 0 {
		l += fmt.Sprintf(" postgres_cpu_ms_per_job=%.3f", r.DatabaseCPUms)
	}
	return l + fmt.Sprintf(" pull_ms=%.3f ack_ms=%.3f", r.PullMs, r.AckMs)
}
