package main

import (
	"io"
	"log/slog"
	"reflect"
	"testing"
)

// localServer is a server without sockets, for tests that need the
// broker's clock in hand: commands run through the same dispatcher as
// over TCP, on a connection that has no socket.
type localServer struct {
	t   *testing.T
	b   *MemEngine
	srv *Server
	c   *conn
	now int64
}

func newLocalServer(t *testing.T) *localServer {
	t.Helper()
	b := NewMemEngine(2, nil)
	ls := &localServer{t: t, b: b, now: 1_800_000_000_000}
	b.now = func() int64 { return ls.now }
	b.started = ls.now
	ls.srv = memServer(b, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ls.c = newConn(ls.srv, nil) // never read from or written to
	t.Cleanup(b.Close)
	return ls
}

// call runs one command and returns the decoded answer.
func (ls *localServer) call(m map[string]any) map[string]any {
	ls.t.Helper()
	v, err := Decode(ls.raw(m))
	if err != nil {
		ls.t.Fatal(err)
	}
	return v.(map[string]any)
}

// raw runs one command and returns the answer's encoded body, for tests
// of key order.
func (ls *localServer) raw(m map[string]any) []byte {
	ls.t.Helper()
	var req Enc
	if err := req.Any(m); err != nil {
		ls.t.Fatal(err)
	}
	pm, err := ParseMap(req.B, nil)
	if err != nil {
		ls.t.Fatal(err)
	}
	h := commands[m["cmd"].(string)].run
	if h == nil {
		ls.t.Fatalf("no command %v", m["cmd"])
	}
	var e Enc
	ls.c.run(h, pm, &e, admission{})
	return e.B[4:]
}

// keys lists a map's keys in encoded order, following path through nested
// maps.
func keys(t *testing.T, body []byte, path ...string) []string {
	t.Helper()
	m, err := ParseMap(body, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range path {
		if m, _, err = m.Map(k); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	var out []string
	for _, f := range m.Fields {
		out = append(out, string(f.Key))
	}
	return out
}

func (ls *localServer) ok(m map[string]any) map[string]any {
	ls.t.Helper()
	a := ls.call(m)
	if a["ok"] != true {
		ls.t.Fatalf("%v: %v", m["cmd"], a)
	}
	return a
}

func nums(t *testing.T, v any) []float64 {
	t.Helper()
	a, ok := v.([]any)
	if !ok {
		t.Fatalf("not an array: %#v", v)
	}
	out := make([]float64, len(a))
	for i, x := range a {
		out[i] = num(t, x)
	}
	return out
}

func TestMinuteSeries(t *testing.T) {
	t.Parallel()
	var s minuteSeries
	t0 := int64(1_800_000_000_000) // a minute boundary
	s.add(t0 + 5)
	s.add(t0 + 59_999)
	s.add(t0 + 3*60_000)
	if s.total != 3 || s.prevTS != t0+3*60_000 || s.prevCount != 1 {
		t.Fatalf("meta: %+v", s)
	}
	if !reflect.DeepEqual(s.counts, []uint32{2, 0, 0, 1}) {
		t.Fatalf("counts %v", s.counts)
	}
	// An event from before the first bucket (the clock stepped back) is
	// kept while inside the window.
	s.add(t0 - 60_000)
	if !reflect.DeepEqual(s.counts, []uint32{1, 2, 0, 0, 1}) || s.prevCount != 1 {
		t.Fatalf("after an older event: %v", s.counts)
	}
	// Moving the newest bucket on keeps at most maxMetricMinutes buckets.
	s.add(t0 + (maxMetricMinutes+2)*60_000)
	if len(s.counts) != maxMetricMinutes || s.counts[len(s.counts)-1] != 1 {
		t.Fatalf("window: %d buckets", len(s.counts))
	}
	if s.total != 5 {
		t.Fatalf("total %d", s.total)
	}
	// A jump past the whole window starts over.
	s.add(t0 + 10*maxMetricMinutes*60_000)
	if len(s.counts) != 1 || s.total != 6 {
		t.Fatalf("after a long gap: %d buckets, total %d", len(s.counts), s.total)
	}
	// Too old for the window: counted, not bucketed.
	s.add(t0)
	if len(s.counts) != 1 || s.total != 7 || s.prevCount != 0 {
		t.Fatalf("too old: %d buckets, total %d, prevCount %d", len(s.counts), s.total, s.prevCount)
	}
}

// The queue form of Metrics over three minutes: newest bucket first, gaps
// as zeros, start/end slicing, and only terminal failures counted.
func TestMetricsQueueFormSeries(t *testing.T) {
	t.Parallel()
	ls := newLocalServer(t)
	t0 := ls.now
	complete := func() {
		ls.ok(M{"cmd": "PUSH", "queue": "mq", "data": 1})
		id := sub(t, ls.ok(M{"cmd": "PULL", "queue": "mq"}), "job")["id"]
		ls.ok(M{"cmd": "ACK", "id": id, "result": "r"})
	}
	complete()
	complete()
	ls.now = t0 + 2*60_000 + 30_000
	complete()
	// A failure that will be retried is not counted; a final one is.
	ls.ok(M{"cmd": "PUSH", "queue": "mq", "data": 1, "maxAttempts": 2})
	id := sub(t, ls.ok(M{"cmd": "PULL", "queue": "mq"}), "job")["id"]
	ls.ok(M{"cmd": "FAIL", "id": id, "error": "first"})
	got := sub(t, ls.ok(M{"cmd": "Metrics", "queue": "mq", "type": "failed"}), "data")
	if num(t, sub(t, got, "meta")["count"]) != 0 || num(t, got["count"]) != 0 {
		t.Fatalf("a retried failure was counted: %v", got)
	}
	ls.now += 1000
	ls.ok(M{"cmd": "PUSH", "queue": "mq", "data": 1, "maxAttempts": 1})
	id = sub(t, ls.ok(M{"cmd": "PULL", "queue": "mq"}), "job")["id"]
	ls.ok(M{"cmd": "FAIL", "id": id, "error": "final"})

	d := sub(t, ls.ok(M{"cmd": "Metrics", "queue": "mq", "type": "completed"}), "data")
	meta := sub(t, d, "meta")
	if num(t, meta["count"]) != 3 || num(t, meta["prevTS"]) != float64(t0+150_000) || num(t, meta["prevCount"]) != 1 {
		t.Errorf("completed meta: %v", meta)
	}
	if s := nums(t, d["data"]); !reflect.DeepEqual(s, []float64{1, 0, 2}) || num(t, d["count"]) != 3 {
		t.Errorf("completed series: %v count %v, want [1 0 2] count 3", d["data"], d["count"])
	}
	d = sub(t, ls.ok(M{"cmd": "Metrics", "queue": "mq", "type": "failed"}), "data")
	if num(t, sub(t, d, "meta")["count"]) != 1 || !reflect.DeepEqual(nums(t, d["data"]), []float64{1}) {
		t.Errorf("failed: %v", d)
	}
	for _, c := range []struct {
		start, end any
		want       []float64
	}{
		{1, nil, []float64{0, 2}},
		{0, 0, []float64{1}},
		{1, 1, []float64{0}},
		{2, 10, []float64{2}},
		{1, 0, []float64{}},
		{5, nil, []float64{}},
		{0, -1, []float64{1, 0, 2}},
	} {
		req := M{"cmd": "Metrics", "queue": "mq", "type": "completed", "start": c.start}
		if c.end != nil {
			req["end"] = c.end
		}
		d := sub(t, ls.ok(req), "data")
		if got := nums(t, d["data"]); !reflect.DeepEqual(got, c.want) || num(t, d["count"]) != 3 {
			t.Errorf("start %v end %v: %v (count %v), want %v", c.start, c.end, got, d["count"], c.want)
		}
	}
	// The per-queue counters behind the dashboard and Prometheus.
	if c := ls.srv.mx.counters("mq"); c != (queueCounters{pushed: 5, pulled: 5, completed: 3, failed: 1, retried: 1}) {
		t.Errorf("counters %+v", c)
	}
}

func TestProtoMetricsQueueForm(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	// Validation, in the reference's order and words.
	for _, tc := range []struct {
		req  M
		want string
	}{
		{M{"type": "completed"}, "Metrics queue is required"},
		{M{"queue": nil, "type": "completed"}, "Metrics queue is required"},
		{M{"queue": 5, "type": "completed"}, "Metrics queue is required"},
		{M{"queue": "", "type": "completed"}, "Queue name is required"},
		{M{"queue": "a b", "type": "completed"}, "Queue name contains invalid characters"},
		{M{"queue": "m"}, "Metrics type must be 'completed' or 'failed'"},
		{M{"queue": "m", "type": "waiting"}, "Metrics type must be 'completed' or 'failed'"},
		{M{"queue": "m", "type": "failed", "start": -1}, "start must be a non-negative safe integer"},
		{M{"queue": "m", "type": "failed", "start": 1.5}, "start must be a non-negative safe integer"},
		{M{"queue": "m", "type": "failed", "start": "1"}, "start must be a non-negative safe integer"},
		{M{"queue": "m", "type": "failed", "start": nil}, "start must be a non-negative safe integer"},
		{M{"queue": "m", "type": "failed", "end": -2}, "end must be a non-negative safe integer"},
		{M{"queue": "m", "type": "failed", "end": 2.5}, "end must be a non-negative safe integer"},
	} {
		tc.req["cmd"] = "Metrics"
		if got := c.fail(tc.req); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.req, got, tc.want)
		}
	}
	// Nothing yet: the reference's empty answer.
	d := sub(t, c.ok(M{"cmd": "Metrics", "queue": "m", "type": "completed"}), "data")
	meta := sub(t, d, "meta")
	if num(t, meta["count"]) != 0 || num(t, meta["prevTS"]) != 0 || num(t, meta["prevCount"]) != 0 ||
		len(list(t, d, "data")) != 0 || num(t, d["count"]) != 0 {
		t.Fatalf("empty: %v", d)
	}
	// Two completed, one failed for good, one failure retried.
	for i := 0; i < 4; i++ {
		c.ok(M{"cmd": "PUSH", "queue": "m", "data": i, "maxAttempts": 1 + i/3})
	}
	var ids []any
	for i := 0; i < 4; i++ {
		ids = append(ids, sub(t, c.ok(M{"cmd": "PULL", "queue": "m"}), "job")["id"])
	}
	c.ok(M{"cmd": "ACK", "id": ids[0]})
	c.ok(M{"cmd": "ACK", "id": ids[1]})
	c.ok(M{"cmd": "FAIL", "id": ids[2], "error": "boom"})
	c.ok(M{"cmd": "FAIL", "id": ids[3], "error": "again"})
	before := float64(nowMs())
	d = sub(t, c.ok(M{"cmd": "Metrics", "queue": "m", "type": "completed"}), "data")
	meta = sub(t, d, "meta")
	if num(t, meta["count"]) != 2 || num(t, meta["prevTS"]) > before || num(t, meta["prevTS"]) < before-60_000 {
		t.Errorf("completed: %v", d)
	}
	if s := nums(t, d["data"]); len(s) == 0 || s[0] == 0 || num(t, d["count"]) != float64(len(s)) {
		t.Errorf("completed series: %v", d)
	}
	d = sub(t, c.ok(M{"cmd": "Metrics", "queue": "m", "type": "failed"}), "data")
	if num(t, sub(t, d, "meta")["count"]) != 1 {
		t.Errorf("failed (the retried failure must not count): %v", d)
	}
	// The global form is still there without queue and type, with the
	// averages now measured.
	g := sub(t, c.ok(M{"cmd": "Metrics"}), "metrics")
	if num(t, g["totalCompleted"]) != 2 || !isNum(g["avgLatencyMs"]) || !isNum(g["avgProcessingMs"]) {
		t.Errorf("global: %v", g)
	}
}

func TestProtoTrimEvents(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	for _, tc := range []struct {
		req  M
		want string
	}{
		{M{"maxLength": 3}, "Queue name is required"},
		{M{"queue": "t"}, "maxLength must be a non-negative safe integer"},
		{M{"queue": "t", "maxLength": -1}, "maxLength must be a non-negative safe integer"},
		{M{"queue": "t", "maxLength": 1.5}, "maxLength must be a non-negative safe integer"},
		{M{"queue": "t", "maxLength": "3"}, "maxLength must be a non-negative safe integer"},
	} {
		tc.req["cmd"] = "TrimEvents"
		if got := c.fail(tc.req); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.req, got, tc.want)
		}
	}
	// 21 events (the reference's verified case), trimmed to 3.
	for i := 0; i < 21; i++ {
		c.ok(M{"cmd": "PUSH", "queue": "t", "data": i})
	}
	removed := func(q string, n int) float64 {
		return num(t, sub(t, c.ok(M{"cmd": "TrimEvents", "queue": q, "maxLength": n}), "data")["removed"])
	}
	if got := removed("t", 3); got != 18 {
		t.Fatalf("removed %v, want 18", got)
	}
	if got := removed("t", 3); got != 0 {
		t.Fatalf("second trim removed %v, want 0", got)
	}
	if got := removed("nosuch", 0); got != 0 {
		t.Fatalf("unknown queue: %v", got)
	}
	// Every event type counts (pause and resume too); obliterating the
	// queue deletes what was retained.
	c.ok(M{"cmd": "Pause", "queue": "t"})
	c.ok(M{"cmd": "Resume", "queue": "t"})
	if got := removed("t", 0); got != 5 {
		t.Fatalf("after pause/resume: removed %v, want 5", got)
	}
	c.ok(M{"cmd": "PUSH", "queue": "t", "data": 1})
	id := sub(t, c.ok(M{"cmd": "PULL", "queue": "t"}), "job")["id"]
	c.ok(M{"cmd": "ACK", "id": id})
	c.ok(M{"cmd": "Obliterate", "queue": "t"})
	if got := removed("t", 0); got != 0 {
		t.Fatalf("after Obliterate: removed %v, want 0", got)
	}
	d := sub(t, c.ok(M{"cmd": "Metrics", "queue": "t", "type": "completed"}), "data")
	if num(t, sub(t, d, "meta")["count"]) != 0 {
		t.Fatalf("figures of an obliterated queue: %v", d)
	}
}
