package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// stepClock moves on by step at each reading: a sampler on it sees
// rateEvery between its samples however fast it is made to run. With a
// step of 0 it stands still, and so does the history (a sample at the
// time of the last one is ignored).
type stepClock struct {
	at, step atomic.Int64
}

func newStepClock(step int64) *stepClock {
	c := &stepClock{}
	c.at.Store(1_800_000_000_000)
	c.step.Store(step)
	return c
}

func (c *stepClock) now() int64 { return c.at.Add(c.step.Load()) }

// memInProcess is a memory-mode server in the test's process, TCP and
// HTTP, so that the test holds its broker.
type memInProcess struct {
	b    *MemEngine
	addr string
	http string // base URL
}

func startMemInProcess(t *testing.T) *memInProcess {
	t.Helper()
	b := NewMemEngine(2, nil)
	srv := memServer(b, nil, quietLog())
	addr := serveTest(t, srv, b.Close)
	api := newHTTPAPI(b.Broker, srv, nil, httpConfig{})
	hs := httptest.NewServer(api)
	t.Cleanup(func() { // before the server's own, registered first
		hs.Close()
		api.Close()
	})
	return &memInProcess{b: b, addr: addr, http: hs.URL}
}

// getJSON fetches a JSON document.
func getJSON(t *testing.T, url string) map[string]any {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	var out map[string]any
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("GET %s: %d %s", url, res.StatusCode, body)
	}
	return out
}

// dashHistory is /dashboard's history, decoded.
type dashHistory struct {
	Now                                                int64
	At                                                 []int64
	PushPerSec, PullPerSec, CompletePerSec, FailPerSec []float64
}

func getHistory(t *testing.T, base string) (dashHistory, map[string]any) {
	t.Helper()
	d := getJSON(t, base+"/dashboard")
	raw, _ := json.Marshal(d["history"])
	var h dashHistory
	if err := json.Unmarshal(raw, &h); err != nil || d["history"] == nil {
		t.Fatalf("/dashboard history: %v in %v", err, d)
	}
	return h, d
}

// TestRateHistoryRing: samples at injected times. The ring keeps the last
// rateSlots intervals (ten minutes of rateEvery) and no more, each with
// its own rates; a repeated time is ignored and a clock that stepped back
// starts the history over.
func TestRateHistoryRing(t *testing.T) {
	t.Parallel()
	if time.Duration(rateSlots)*rateEvery != 10*time.Minute {
		t.Fatalf("the ring holds %v of history, want ten minutes", time.Duration(rateSlots)*rateEvery)
	}
	var cnt [4]int64
	h := newRateHistory(func() [4]int64 { return cnt })
	const step = int64(5000)
	t0 := int64(1_800_000_000_000)
	if s := h.series(); len(s.at) != 0 || h.current() != [4]float64{} {
		t.Fatalf("an empty history: %+v %v", s, h.current())
	}
	h.record(t0)
	const intervals = 3*rateSlots + 7
	for i := int64(1); i <= intervals; i++ {
		cnt[0] += 5 * i
		cnt[1] += 10 * i
		cnt[2] += 15 * i
		cnt[3] += i % 3 * 5
		h.record(t0 + i*step)
	}
	s := h.series()
	if len(s.at) != rateSlots {
		t.Fatalf("%d intervals kept, want %d", len(s.at), rateSlots)
	}
	for k, at := range s.at {
		i := int64(intervals - rateSlots + 1 + k) // the interval's number
		if at != t0+i*step {
			t.Fatalf("interval %d ends at %d, want %d", k, at, t0+i*step)
		}
		want := [4]float64{float64(i), float64(2 * i), float64(3 * i), float64(i % 3)}
		for c := range want {
			if s.series[c][k] != want[c] {
				t.Fatalf("interval %d, counter %d: %v/s, want %v/s", k, c, s.series[c][k], want[c])
			}
		}
	}
	if span := s.at[len(s.at)-1] - s.at[0] + step; span != 600_000 {
		t.Errorf("the history covers %d ms, want ten minutes", span)
	}
	if cur := h.current(); cur != [4]float64{intervals, 2 * intervals, 3 * intervals, intervals % 3} {
		t.Errorf("current rates %v, want the last interval's", cur)
	}

	// The same time again adds nothing; a clock stepped back starts over.
	h.record(t0 + intervals*step)
	if n := len(h.series().at); n != rateSlots {
		t.Errorf("a repeated sample changed the history: %d intervals", n)
	}
	h.record(t0)
	if s := h.series(); len(s.at) != 0 || h.current() != [4]float64{} {
		t.Errorf("after the clock stepped back: %d intervals, rates %v", len(s.at), h.current())
	}
	cnt[0] += 50
	h.record(t0 + 10_000)
	if cur := h.current(); cur[0] != 5 {
		t.Errorf("after the step back, %v/s pushed, want 5", cur[0])
	}
}

// TestRateHistoryLoop: the sampling loop, run fast on a clock that says
// rateEvery passes between its samples, fills ten minutes of history
// without the wait, stays at rateSlots intervals however long it runs,
// and ends with the broker.
func TestRateHistoryLoop(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	clock := newStepClock(rateEvery.Milliseconds())
	start := clock.at.Load()
	b.rates.restart(time.Millisecond, clock.now)
	eventually(t, 20*time.Second, "three times the ring's length sampled", func() (bool, string) {
		return clock.at.Load() > start+3*(rateSlots+1)*rateEvery.Milliseconds(), fmt.Sprint(clock.at.Load() - start)
	})
	s := b.rates.series()
	if len(s.at) != rateSlots {
		t.Fatalf("%d intervals kept, want %d", len(s.at), rateSlots)
	}
	for k := 1; k < len(s.at); k++ {
		if d := s.at[k] - s.at[k-1]; d != rateEvery.Milliseconds() {
			t.Fatalf("intervals %d and %d end %d ms apart", k-1, k, d)
		}
	}
	b.Close()
	if b.rates.stop != nil {
		t.Fatal("the loop is still set after Close")
	}
	// Close waited for the loop to return: the clock is read no more.
	at := clock.at.Load()
	// A loop of the same period, started now, samples fifty times: the
	// closed one would have too.
	ref := newStepClock(rateEvery.Milliseconds())
	from := ref.at.Load()
	h := newRateHistory(func() [4]int64 { return [4]int64{} })
	h.restart(time.Millisecond, ref.now)
	eventually(t, 20*time.Second, "fifty samples of another loop", func() (bool, string) {
		n := (ref.at.Load() - from) / rateEvery.Milliseconds()
		return n >= 50, fmt.Sprint(n)
	})
	h.close()
	if clock.at.Load() != at {
		t.Fatal("the sampler still runs after Close")
	}
	b.Close() // twice is fine
}

// TestDashboardHistoryEndpoint: GET /dashboard answers the last ten
// minutes of rates, sampled at injected times while jobs were pushed,
// pulled, completed and failed over TCP, and reports the last interval's
// rates as the current ones (over HTTP and in DashboardOverview).
func TestDashboardHistoryEndpoint(t *testing.T) {
	t.Parallel()
	m := startMemInProcess(t)
	m.b.rates.close() // the test takes the samples
	c := dial(t, m.addr)
	const step = int64(5000)
	t0 := int64(1_800_000_000_000)
	m.b.rates.record(t0)
	const intervals = rateSlots + 10
	per := func(i int) int { return i%4 + 2 } // jobs pushed in interval i
	for i := 1; i <= intervals; i++ {
		k := per(i)
		jobs := make([]any, k)
		for x := range jobs {
			jobs[x] = map[string]any{"data": x, "maxAttempts": 1}
		}
		c.ok(map[string]any{"cmd": "PUSHB", "queue": "h", "jobs": jobs})
		got := list(t, c.ok(map[string]any{"cmd": "PULLB", "queue": "h", "count": k}), "jobs")
		if len(got) != k {
			t.Fatalf("pulled %d of %d", len(got), k)
		}
		ids := make([]any, 0, k-1)
		for _, j := range got[1:] {
			ids = append(ids, j.(map[string]any)["id"])
		}
		c.ok(map[string]any{"cmd": "ACKB", "ids": ids})
		c.ok(map[string]any{"cmd": "FAIL", "id": got[0].(map[string]any)["id"], "error": "no"})
		m.b.rates.record(t0 + int64(i)*step)
	}

	h, d := getHistory(t, m.http)
	if len(h.At) != rateSlots {
		t.Fatalf("%d intervals in the history, want %d", len(h.At), rateSlots)
	}
	for _, col := range [][]float64{h.PushPerSec, h.PullPerSec, h.CompletePerSec, h.FailPerSec} {
		if len(col) != rateSlots {
			t.Fatalf("a column of %d rates, want %d", len(col), rateSlots)
		}
	}
	if span := h.At[len(h.At)-1] - h.At[0] + step; span != 600_000 {
		t.Errorf("the history covers %d ms, want ten minutes", span)
	}
	if h.Now < h.At[len(h.At)-1] {
		t.Errorf("history.now %d before its last interval %d", h.Now, h.At[len(h.At)-1])
	}
	r2 := func(f float64) float64 { return math.Round(f*100) / 100 }
	for k := range h.At {
		i := intervals - rateSlots + 1 + k
		if h.At[k] != t0+int64(i)*step {
			t.Fatalf("interval %d ends at %d, want %d", k, h.At[k], t0+int64(i)*step)
		}
		n := float64(per(i))
		want := []float64{r2(n / 5), r2(n / 5), r2((n - 1) / 5), r2(1.0 / 5)}
		got := []float64{h.PushPerSec[k], h.PullPerSec[k], h.CompletePerSec[k], h.FailPerSec[k]}
		for x := range want {
			if got[x] != want[x] {
				t.Fatalf("interval %d: rates %v, want %v", k, got, want)
			}
		}
	}
	last := float64(per(intervals))
	wantNow := map[string]float64{"pushPerSec": r2(last / 5), "pullPerSec": r2(last / 5),
		"completePerSec": r2((last - 1) / 5), "failPerSec": 0.2}
	tp := sub(t, d, "throughput")
	ov := sub(t, sub(t, c.ok(map[string]any{"cmd": "DashboardOverview"}), "data"), "throughput")
	for k, want := range wantNow {
		if num(t, tp[k]) != want || num(t, ov[k]) != want {
			t.Errorf("throughput %s: %v over HTTP, %v in DashboardOverview, want %v", k, tp[k], ov[k], want)
		}
	}
}

// TestDashboardHistoryAfterRun: a server run with a sampler made fast (and
// a clock that says rateEvery passes between samples) under load answers
// ten minutes of history on GET /dashboard, with the load in it.
func TestDashboardHistoryAfterRun(t *testing.T) {
	t.Parallel()
	clock := newStepClock(rateEvery.Milliseconds())
	ts := startServerHTTP(t, &config{rateEvery: time.Millisecond, rateNow: clock.now})
	c := dial(t, ts.addr)
	stop := make(chan struct{})
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := c.do(map[string]any{"cmd": "PUSH", "queue": "run", "data": 1}, callTimeout); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); <-loaded }()
	base := "http://" + ts.http
	var h dashHistory
	eventually(t, 20*time.Second, "ten minutes of history with pushes in it", func() (bool, string) {
		h, _ = getHistory(t, base)
		sum := 0.0
		for _, v := range h.PushPerSec {
			sum += v
		}
		return len(h.At) == rateSlots && sum > 0, fmt.Sprintf("%d intervals, %v pushes/s in all", len(h.At), sum)
	})
	if span := h.At[len(h.At)-1] - h.At[0] + rateEvery.Milliseconds(); span != 600_000 {
		t.Errorf("the history covers %d ms, want ten minutes", span)
	}
}

// TestPullServiceExcludesLongPollWait: a long poll that waits a second for
// a job counts its wait in the pull latency (as the reference does) but
// not in the service time, which the dashboard shows and Prometheus
// exports as bunqueue_pull_service_seconds; one that waits a second for
// nothing is in the service time only (the reference's pull latency
// leaves empty pulls out).
func TestPullServiceExcludesLongPollWait(t *testing.T) {
	t.Parallel()
	m := startMemInProcess(t)
	checkPullService(t, m.b.Broker, m.addr, func() { awaitPullsWaiting(t, m.addr, 1) })
	d := getJSON(t, m.http+"/dashboard")
	ps := sub(t, d, "pullService")
	pull := sub(t, sub(t, sub(t, d, "latency"), "percentiles"), "pull")
	if num(t, ps["p95"]) >= 1000 || num(t, pull["p95"]) < 1000 {
		t.Errorf("/dashboard: pull p95 %v ms, service p95 %v ms: want the wait in the first only", pull["p95"], ps["p95"])
	}
	res, err := http.Get(m.http + "/prometheus")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, line := range []string{"bunqueue_pull_service_seconds_count 2", "bunqueue_pull_duration_seconds_count 1"} {
		if !strings.Contains(string(body), "\n"+line+"\n") {
			t.Errorf("/prometheus has no %q", line)
		}
	}
}

// checkPullService runs the two long polls through a server on b and
// checks b's histograms. asleep returns once the first poll sleeps
// waiting for a job: what the server spent before that is service, and
// under load it may be long (a PostgreSQL claim took a second once in CI,
// counted as service while the test thought the poll was waiting).
func checkPullService(t *testing.T, b *Broker, addr string, asleep func()) {
	t.Helper()
	pull0, svc0 := b.lat.pull.Snapshot(), b.lat.pullService.Snapshot()
	c, p := dial(t, addr), dial(t, addr)
	id, ch := c.send(map[string]any{"cmd": "PULL", "queue": "lp", "timeout": 10000})
	asleep()
	time.Sleep(time.Second)
	p.ok(map[string]any{"cmd": "PUSH", "queue": "lp", "data": 1})
	if a := c.await(id, ch, 15*time.Second); a["job"] == nil {
		t.Fatalf("the long poll got no job: %v", a)
	}
	c.ok(map[string]any{"cmd": "PULL", "queue": "lp-empty", "timeout": 1000})

	pull, svc := b.lat.pull.Snapshot(), b.lat.pullService.Snapshot()
	pull.Count, pull.Sum = pull.Count-pull0.Count, pull.Sum-pull0.Sum
	svc.Count, svc.Sum = svc.Count-svc0.Count, svc.Sum-svc0.Sum
	if pull.Count != 1 || svc.Count != 2 {
		t.Fatalf("%d pulls timed, %d served: want the one that delivered a job timed, both served", pull.Count, svc.Count)
	}
	// A second of waiting for the job, by the test's own clock.
	if pull.Sum < 1 {
		t.Errorf("the pull latency counts %.3f s, want the 1 s of waiting in it", pull.Sum)
	}
	if svc.Sum >= 1 {
		t.Errorf("the service time counts %.3f s in all for two pulls that waited 1 s each: the wait is in it", svc.Sum)
	}
	t.Logf("two long polls: %.3f s of latency, %.6f s of service", pull.Sum, svc.Sum)
}

// TestPGLatencyHistograms: in PostgreSQL mode the push, pull, ack, wait
// and processing histograms count what the broker does, as in memory mode
// (they stayed at zero), and the pull service time leaves the long poll's
// wait out there too.
func TestPGLatencyHistograms(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	p := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{})
	c := dial(t, p.addr)
	for i := 0; i < 3; i++ {
		c.ok(map[string]any{"cmd": "PUSH", "queue": "lat", "data": i})
	}
	c.ok(map[string]any{"cmd": "PUSHB", "queue": "lat", "jobs": []any{
		map[string]any{"data": 3}, map[string]any{"data": 4}, map[string]any{"data": 5}}})
	one := sub(t, c.ok(map[string]any{"cmd": "PULL", "queue": "lat"}), "job")
	rest := list(t, c.ok(map[string]any{"cmd": "PULLB", "queue": "lat", "count": 10}), "jobs")
	if len(rest) != 5 {
		t.Fatalf("PULLB: %d jobs, want 5", len(rest))
	}
	c.ok(map[string]any{"cmd": "ACK", "id": one["id"]})
	ids := make([]any, len(rest))
	for i, j := range rest {
		ids[i] = j.(map[string]any)["id"]
	}
	c.ok(map[string]any{"cmd": "ACKB", "ids": ids})

	b := p.b
	for _, h := range []struct {
		name string
		h    *Histogram
		want int64
	}{{"push", b.lat.push, 4}, {"pull", b.lat.pull, 2}, {"pull service", b.lat.pullService, 2},
		{"ack", b.lat.ack, 2}, {"wait", b.lat.wait, 6}, {"processing", b.lat.proc, 6}} {
		if got := h.h.Snapshot().Count; got != h.want {
			t.Errorf("%s histogram: %d observations, want %d", h.name, got, h.want)
		}
	}
	// The dashboard's figures are no longer zero.
	lat := sub(t, sub(t, c.ok(map[string]any{"cmd": "DashboardOverview"}), "data"), "latency")
	for _, k := range []string{"push", "pull", "ack"} {
		if p50 := num(t, sub(t, sub(t, lat, "percentiles"), k)["p50"]); p50 <= 0 {
			t.Errorf("DashboardOverview %s p50 %v", k, p50)
		}
	}

	// Long polls, as in memory mode.
	// Here the poll's first claim runs beside the connection's reader, so
	// a Ping's answer says nothing: wait until the engine shows it asleep.
	checkPullService(t, b, p.addr, func() { pgSleeping(t, p.pg, "lp", 1) })
}
