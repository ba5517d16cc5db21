package main

// queued bench: every workload runs briefly against a live server, checks
// exactly-once, cleans up its queues; the check itself catches loss and
// duplicates; the histogram's quantiles are close to the true ones.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func benchArgs(ts *testServer, extra ...string) []string {
	host, port, _ := net.SplitHostPort(ts.addr)
	return append([]string{"bench", "-H", host, "-p", port}, extra...)
}

func TestBenchAllWorkloads(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	code, out, errOut := runCLI(t, benchArgs(ts, "--jobs", "3000", "--connections", "2", "--pipeline", "4",
		"--batch", "50", "--payload", "16")...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"WORKLOAD", "JOBS/S", "P50", "P95", "P99", "MAX", "push ", "pushb ", "drain ",
		"mixed/push", "mixed/e2e", "drain: all 3,000 jobs pushed were processed exactly once",
		"mixed/e2e: all 3,000 jobs pushed were processed exactly once"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "\r") {
		t.Error("a progress line was drawn on output that is not a terminal")
	}
	// Its queues are gone.
	c := dial(t, ts.addr)
	if qs := list(t, c.ok(map[string]any{"cmd": "ListQueues"}), "queues"); len(qs) != 0 {
		t.Errorf("queues left behind: %v", qs)
	}
}

func TestBenchJSONAndDuration(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	start := time.Now()
	code, out, errOut := runCLI(t, benchArgs(ts, "push,mixed", "--duration", "300ms", "--connections", "2",
		"--pipeline", "2", "--batch", "1", "--json")...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("a 300ms run took %v", el)
	}
	var doc struct {
		Server  string        `json:"server"`
		Results []benchResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	var names []string
	for _, r := range doc.Results {
		names = append(names, r.Workload)
		if r.Jobs <= 0 || r.JobsPerSec <= 0 || r.LatencyMs.P50 <= 0 || r.LatencyMs.Max < r.LatencyMs.P99 ||
			r.LatencyMs.P99 < r.LatencyMs.P50 {
			t.Errorf("implausible result: %+v", r)
		}
	}
	if !slices.Equal(names, []string{"push", "mixed/push", "mixed/e2e"}) {
		t.Fatalf("workloads: %v", names)
	}
	v := doc.Results[2].Verified
	if v == nil || !v.OK || v.Pushed != doc.Results[1].Jobs || v.Processed != v.Pushed {
		t.Errorf("mixed verification: %+v", v)
	}
}

func TestBenchBadOptions(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench", "frob"},
		{"bench", "--connections", "0"},
		{"bench", "--batch", "5000"},
		{"bench", "--pipeline", "-1"},
		{"bench", "--jobs", "0"},
		{"bench", "mixed", "--connections", "1"},
		{"bench", "--nosuch"},
	} {
		if code, _, errOut := runCLI(t, args...); code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
	if code, out, _ := runCLI(t, "bench", "--help"); code != 0 || !strings.Contains(out, "--pipeline") {
		t.Errorf("bench --help: %d %q", code, out)
	}
	// A server that is not there: exit 1, saying where.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	if code, _, errOut := runCLI(t, "bench", "push", "-H", "127.0.0.1", "-p", port); code != 1 ||
		!strings.Contains(errOut, "127.0.0.1:"+port) {
		t.Errorf("no server: exit %d, %q", code, errOut)
	}
}

// The exactly-once check reports jobs never seen, seen twice, and jobs
// still on the server.
func TestBenchVerifyCatchesLossAndDuplicates(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	host, port, _ := net.SplitHostPort(ts.addr)
	g, _, err := parseGlobal([]string{"-H", host, "-p", port})
	if err != nil {
		t.Fatal(err)
	}
	o := benchOpts{cli: g, connections: 1, pipeline: 1, batch: 10, jobs: 10}
	b, err := newBenchRun(context.Background(), o, "bench-verify-test", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	for i := range int64(10) {
		b.seen.inc(i)
	}
	if v := b.verify(10); v.OK {
		t.Errorf("processed was never counted, yet verified: %+v", v)
	}
	b.processed.Store(10)
	if v := b.verify(10); !v.OK {
		t.Errorf("all seen once: %+v", v)
	}
	mark := func(seqs ...int64) {
		b.seen = &seenTable{}
		b.dupes.Store(0)
		for _, i := range seqs {
			if n, _ := b.seen.inc(i); n > 1 {
				b.dupes.Add(1)
			}
		}
	}
	mark(0, 1, 2, 3, 3, 5, 6, 7, 8, 9)
	v := b.verify(10)
	if v.OK || v.Missing != 1 || v.Duplicated != 1 {
		t.Errorf("one lost, one twice: %+v", v)
	}
	// A job left on the server fails the check too.
	mark(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
	c := dial(t, ts.addr)
	c.ok(map[string]any{"cmd": "PUSH", "queue": "bench-verify-test", "data": 1})
	if v = b.verify(10); v.OK || v.LeftOnSrv != 1 {
		t.Errorf("a job left waiting: %+v", v)
	}
	var buf strings.Builder
	printBench(&buf, o, []benchResult{{Workload: "drain", Verified: v}})
	if !strings.Contains(buf.String(), "EXACTLY-ONCE CHECK FAILED") {
		t.Errorf("report: %s", buf.String())
	}
}

func TestBenchHistogramQuantiles(t *testing.T) {
	t.Parallel()
	var h hist
	vals := make([]int64, 0, 100000)
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		// Log-uniform from 1µs to 1s, the range latencies live in.
		v := int64(float64(int64(1000)<<r.IntN(20)) * (1 + r.Float64()))
		vals = append(vals, v)
		h.add(time.Duration(v))
	}
	slices.Sort(vals)
	for _, q := range []float64{0.5, 0.95, 0.99} {
		want := float64(vals[int(q*float64(len(vals)))-1]) / 1e6
		got := h.quantileMs(q)
		if d := (got - want) / want; d > 0.01 || d < -0.01 {
			t.Errorf("p%v: %v ms, true %v ms (%.2f%% off)", q*100, got, want, d*100)
		}
	}
	if got := h.quantileMs(1); got != round3(float64(vals[len(vals)-1])/1e6) {
		t.Errorf("max: %v", got)
	}
	var empty hist
	if empty.quantileMs(0.5) != 0 {
		t.Error("empty histogram")
	}
	var st seenTable
	if _, ok := st.inc(-1); ok {
		t.Error("negative sequence accepted")
	}
	if _, ok := st.inc(seenMax); ok {
		t.Error("sequence past the table accepted")
	}
	if n, _ := st.inc(70000); n != 1 || st.get(70000) != 1 || st.get(5) != 0 {
		t.Error("seen table counts")
	}
	if groupDigits(1234567) != "1,234,567" || groupDigits(12) != "12" || groupDigits(-1000) != "-1,000" {
		t.Error("groupDigits")
	}
}

// The bench's worker counts pulled jobs without allocating a parse buffer
// for each: its CPU is taken from the server it measures when both run on
// one machine. A job of the protocol's 48 fields parsed into a fresh
// slice took seven allocations (the slice grown from empty) and its data
// two more; what is left is the id's string.
//
// Serial: it counts allocations (AllocsPerRun).
func TestBenchTallyReusesBuffers(t *testing.T) {
	ts := startServer(t, nil)
	host, port, _ := net.SplitHostPort(ts.addr)
	o := benchOpts{connections: 1, batch: 100, payload: 16}
	o.cli.host = host
	fmt.Sscan(port, &o.cli.port)
	b, err := newBenchRun(context.Background(), o, "bench-tally", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	b.start = time.Now()
	if err := b.pushBatch(b.conns[0], 0, 100, false); err != nil {
		t.Fatal(err)
	}
	var fields []Field
	jobs, err := b.pullBatch(b.conns[0], &hist{}, &fields)
	if err != nil || len(jobs) != 100 {
		t.Fatalf("pulled %d jobs, err %v", len(jobs), err)
	}
	var jf jobFields
	ids := make([]string, 0, len(jobs))
	h := &hist{}
	if ids, err = b.tally(jobs, ids[:0], h, &jf); err != nil || len(ids) != 100 {
		t.Fatalf("tally: %d ids, err %v", len(ids), err)
	}
	for seq := range int64(100) {
		if n := b.seen.get(seq); n != 1 {
			t.Fatalf("job %d seen %d times", seq, n)
		}
	}
	perJob := testing.AllocsPerRun(20, func() {
		ids, _ = b.tally(jobs, ids[:0], h, &jf)
	}) / float64(len(jobs))
	if perJob > 1 {
		t.Errorf("tally allocates %.2f times a job, want at most 1 (the id)", perJob)
	}
}

// steady: jobs pushed at the rate asked for the duration, each taken by a
// worker in a long PULL and acknowledged with its token, exactly once;
// the summary line carries what a script reads, and the in-process
// server is found listening on this machine and its CPU counted.
func TestBenchSteady(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	code, out, errOut := runCLI(t, benchArgs(ts, "steady", "--rate", "400", "--duration", "1s", "--workers", "4",
		"--batch", "1", "--json")...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	var doc struct {
		Results []benchResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Results) != 1 {
		t.Fatalf("not one result: %v\n%s", err, out)
	}
	r := doc.Results[0]
	if r.Workload != "steady" || r.Jobs != 400 || r.Rate != 400 || r.Workers != 4 {
		t.Errorf("steady result: %+v", r)
	}
	if v := r.Verified; v == nil || !v.OK || v.Pushed != 400 {
		t.Errorf("steady verification: %+v", v)
	}
	if r.LatencyMs.P50 <= 0 || r.LatencyMs.P90 < r.LatencyMs.P50 || r.LatencyMs.P99 < r.LatencyMs.P90 ||
		r.LatencyMs.Max < r.LatencyMs.P99 || r.PushMs == nil || r.PushMs.P50 <= 0 {
		t.Errorf("implausible latencies: %+v push %+v", r.LatencyMs, r.PushMs)
	}
	if r.ServerCPUms <= 0 {
		t.Errorf("the server listens in this process, its CPU per job not found: %+v", r)
	}
	if r.PullMs <= 0 || r.AckMs <= 0 {
		t.Errorf("a worker's time in its PULLs and ACKs not told: %+v", r)
	}

	// PUSHB of 5 on the producer's side; the text output's summary line.
	code, out, errOut = runCLI(t, benchArgs(ts, "steady", "--rate", "500", "--duration", "400ms", "--workers", "2",
		"--batch", "5")...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	line := regexp.MustCompile(`(?m)^steady rate=500 achieved=\d+ workers=2 jobs=200 p50=[\d.]+ p90=[\d.]+ p99=[\d.]+ max=[\d.]+ server_cpu_ms_per_job=[\d.]+( postgres_cpu_ms_per_job=[\d.]+)? pull_ms=[\d.]+ ack_ms=[\d.]+$`)
	if !line.MatchString(out) || !strings.Contains(out, "steady: all 200 jobs pushed were processed exactly once") {
		t.Errorf("steady output:\n%s", out)
	}
	c := dial(t, ts.addr)
	if qs := list(t, c.ok(map[string]any{"cmd": "ListQueues"}), "queues"); len(qs) != 0 {
		t.Errorf("queues left behind: %v", qs)
	}
	for _, args := range [][]string{{"steady", "--rate", "0"}, {"steady", "--workers", "0"},
		{"steady", "--rate", "1000000", "--duration", "1h"}} {
		if code, _, errOut := runCLI(t, benchArgs(ts, args...)...); code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
}

// The server's process is found from its listening port: the inode in
// /proc/net/tcp, then the descriptor that holds it.
func TestBenchFindsLocalServer(t *testing.T) {
	t.Parallel()
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1A0B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1A0B 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1A0C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0
`
	got := map[string]bool{}
	listenInodes(strings.NewReader(table), 0x1A0B, got)
	if len(got) != 1 || !got["4242"] {
		t.Errorf("listening inodes of port 0x1A0B: %v, want 4242 only (4343 is a connection)", got)
	}
	if runtime.GOOS != "linux" {
		return
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if pid := listenerPID(l.Addr().(*net.TCPAddr).Port); pid != os.Getpid() {
		t.Errorf("listener of this process's port: pid %d, want %d", pid, os.Getpid())
	}
	if s, ok := procCPU(os.Getpid()); !ok || s <= 0 {
		t.Errorf("this process's CPU: %v %v", s, ok)
	}
}
