package main

// Live events end to end: a running server, jobs moved over the wire
// protocol, and SSE and WebSocket clients reading what the broker's tap
// fed the hub, in the reference's shapes.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

func decodeJSON(t testing.TB, s string) map[string]any {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("not a JSON object: %q: %v", s, err)
	}
	return m
}

// nextNamed reads SSE events until one named name, skipping the others,
// for wsTestTimeout at most: the periodic figures keep a stream busy, so
// a read deadline alone would never end the wait for an event that is
// not coming.
func (c *sseClient) nextNamed(name string) sseTestEvent {
	c.t.Helper()
	deadline := time.Now().Add(wsTestTimeout)
	var skipped []string
	for time.Now().Before(deadline) {
		ev := c.nextData()
		if ev.event == name {
			return ev
		}
		skipped = append(skipped, ev.event)
	}
	c.t.Fatalf("no %s within %v; skipped %v", name, wsTestTimeout, skipped)
	return sseTestEvent{}
}

// wsJSON reads the next text message as JSON.
func (c *wsClient) wsJSON() map[string]any {
	c.t.Helper()
	_, msg := c.readData()
	return decodeJSON(c.t, msg)
}

// wsUntil reads messages until one satisfies ok.
func (c *wsClient) wsUntil(what string, ok func(m map[string]any) bool) map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(wsTestTimeout)
	for time.Now().Before(deadline) {
		if m := c.wsJSON(); ok(m) {
			return m
		}
	}
	c.t.Fatalf("no %s", what)
	return nil
}

func TestLiveSSE(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{liveEvery: liveIntervals{stats: 150 * time.Millisecond, health: 200 * time.Millisecond, storage: 250 * time.Millisecond}})
	all := dialSSE(t, ts.http, "/events")
	if ct := all.resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	// The first event: the retry delay and the connected message, in one.
	first := all.mustNext()
	if first.retry != "3000" || !strings.HasPrefix(first.data, `{"connected":true,"clientId":"`) {
		t.Fatalf("first event %+v", first)
	}
	onlyB := dialSSE(t, ts.http, "/events/queues/b")
	onlyB.mustNext()

	c := dial(t, ts.addr)
	id := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "a", "data": map[string]any{"x": 1}}), "id")
	ev := all.nextNamed("job:pushed")
	if ev.id == "" {
		t.Fatal("no id on a job event")
	}
	d := decodeJSON(t, ev.data)
	if d["queue"] != "a" || d["jobId"] != id || d["timestamp"] == nil || len(d) != 3 {
		t.Fatalf("job:pushed data %v", d)
	}
	c.ok(map[string]any{"cmd": "PULL", "queue": "a"})
	all.nextNamed("job:active")
	c.ok(map[string]any{"cmd": "ACK", "id": id, "result": "done"})
	if d := decodeJSON(t, all.nextNamed("job:completed").data); d["jobId"] != id {
		t.Fatalf("job:completed %v", d)
	}
	counts := decodeJSON(t, all.nextNamed("queue:counts").data)
	for _, k := range []string{"queue", "waiting", "prioritized", "active", "completed", "failed", "delayed"} {
		if _, ok := counts[k]; !ok {
			t.Fatalf("queue:counts %v has no %s", counts, k)
		}
	}
	// A failure carries its error.
	fid := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "a", "data": 1, "maxAttempts": 1}), "id")
	c.ok(map[string]any{"cmd": "PULL", "queue": "a"})
	c.ok(map[string]any{"cmd": "FAIL", "id": fid, "error": "it broke"})
	if d := decodeJSON(t, all.nextNamed("job:failed").data); d["error"] != "it broke" {
		t.Fatalf("job:failed %v", d)
	}
	// Figures come to every subscriber.
	st := decodeJSON(t, all.nextNamed("stats:snapshot").data)
	for _, k := range []string{"waiting", "active", "totalPushed", "pushPerSec", "queues", "workers", "cronJobs"} {
		if _, ok := st[k]; !ok {
			t.Fatalf("stats:snapshot %v has no %s", st, k)
		}
	}
	all.nextNamed("health:status")
	all.nextNamed("storage:status")

	// The per-queue stream gets its queue's job events, not another's.
	c.ok(map[string]any{"cmd": "PUSH", "queue": "b", "data": 2})
	for {
		ev := onlyB.nextData()
		if strings.HasPrefix(ev.event, "job:") {
			if d := decodeJSON(t, ev.data); d["queue"] != "b" {
				t.Fatalf("queue b's stream got %v", d)
			}
			break
		}
	}

	// A reconnecting client gets what it missed after its last id.
	again := dialSSE(t, ts.http, "/events", "Last-Event-ID: "+ev.id)
	again.mustNext()
	if got := again.nextData(); got.event != "job:active" {
		t.Fatalf("replay starts with %+v, want the job:active after id %s", got, ev.id)
	}
}

func TestLiveWebSocket(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	legacy := dialWS(t, ts.http, "/ws")
	sub := dialWS(t, ts.http, "/ws/queues/w")
	c := dial(t, ts.addr)

	// Subscribe picks events by pattern and answers with the list.
	sub.text(`{"cmd":"Subscribe","events":["job:completed","queue:*"],"reqId":"s1"}`)
	if m := sub.wsJSON(); m["ok"] != true || m["reqId"] != "s1" || fmt.Sprint(m["subscribed"]) != "[job:completed queue:*]" {
		t.Fatalf("Subscribe answered %v", m)
	}
	sub.text(`{"cmd":"Subscribe","events":["job:nope"],"reqId":"s2"}`)
	if m := sub.wsJSON(); m["ok"] != false || m["error"] != "Invalid: job:nope" || m["reqId"] != "s2" {
		t.Fatalf("bad pattern answered %v", m)
	}
	sub.text(`{"cmd":"Subscribe","events":[]}`)
	if m := sub.wsJSON(); m["error"] != "events must be a non-empty array" {
		t.Fatalf("empty Subscribe answered %v", m)
	}

	id := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "w", "data": map[string]any{"n": 1}}), "id")
	// A client that never subscribed gets the raw event object.
	m := legacy.wsJSON()
	if m["eventType"] != "pushed" || m["queue"] != "w" || m["jobId"] != id || m["timestamp"] == nil {
		t.Fatalf("legacy event %v", m)
	}
	c.ok(map[string]any{"cmd": "PULL", "queue": "w"})
	c.ok(map[string]any{"cmd": "ACK", "id": id})
	// The subscriber gets job:completed (not pushed or active) in the
	// tagged form, and queue:counts.
	got := sub.wsUntil("job:completed", func(m map[string]any) bool { return m["event"] == "job:completed" })
	if d := jobj(t, got["data"]); d["jobId"] != id || d["queue"] != "w" || got["ts"] == nil {
		t.Fatalf("tagged event %v", got)
	}
	sub.wsUntil("queue:counts", func(m map[string]any) bool { return m["event"] == "queue:counts" })

	sub.text(`{"cmd":"Unsubscribe","events":["queue:*"],"reqId":"u"}`)
	sub.wsUntil("the Unsubscribe answer", func(m map[string]any) bool {
		if m["reqId"] != "u" {
			return false
		}
		if fmt.Sprint(m["subscribed"]) != "[job:completed]" {
			t.Fatalf("Unsubscribe answered %v", m)
		}
		return true
	})
}

// TestLiveWebSocketCommands: protocol commands as JSON text, answered with
// what TCP answers.
func TestLiveWebSocketCommands(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	ws := dialWS(t, ts.http, "/ws")
	c := dial(t, ts.addr)
	sendAnswer := func(cmd string) map[string]any {
		t.Helper()
		ws.text(cmd)
		return ws.wsUntil("an answer", func(m map[string]any) bool { _, ok := m["ok"]; return ok })
	}
	ws.text(`{"cmd":"Subscribe","events":["stats:snapshot"]}`) // no job events from here on
	ws.wsJSON()

	m := sendAnswer(`{"cmd":"PUSH","queue":"wc","name":"n","data":{"b":1,"a":2},"reqId":"p1"}`)
	if m["ok"] != true || m["reqId"] != "p1" || m["id"] == nil {
		t.Fatalf("PUSH answered %v", m)
	}
	id := m["id"].(string)
	// The same answer as over TCP, field for field.
	over := sendAnswer(`{"cmd":"GetJob","id":"` + id + `","reqId":"g"}`)
	tcp := c.ok(map[string]any{"cmd": "GetJob", "id": id})
	wj, tj := jobj(t, over["job"]), tcp["job"].(map[string]any)
	for k, v := range tj {
		if k == "returnvalue" || k == "failedReason" {
			continue // undefined over TCP, so absent in JSON
		}
		a, _ := json.Marshal(wj[k])
		b, _ := json.Marshal(v)
		if string(a) != string(b) {
			t.Errorf("GetJob %s: ws %s, tcp %s", k, a, b)
		}
	}
	if len(wj) != len(tj)-2 {
		t.Errorf("GetJob: ws has %d fields, tcp %d", len(wj), len(tj))
	}

	for _, tc := range []struct{ in, want string }{
		{`{"cmd":`, `{"ok":false,"error":"Invalid JSON"}`},
		{`null`, `{"ok":false,"error":"Invalid JSON"}`},
		{`{"reqId":"x"}`, `{"ok":false,"error":"Invalid command"}`},
		{`[1]`, `{"ok":false,"error":"Invalid command"}`},
		{`{"cmd":"Nope","reqId":"r"}`, `{"ok":false,"error":"Unknown command: Nope","reqId":"r"}`},
		{`{"cmd":"SubscribeEvents","queue":"x","reqId":"r"}`, `{"ok":false,"error":"Unknown command: SubscribeEvents","reqId":"r"}`},
		{`{"cmd":"PUSH","queue":"","reqId":7}`, ""},
	} {
		ws.text(tc.in)
		_, got := ws.readData()
		switch {
		case tc.want != "" && got != tc.want:
			t.Errorf("%s: answered %s, want %s", tc.in, got, tc.want)
		case tc.want == "" && !(strings.HasPrefix(got, `{"ok":false,"error":`) && strings.HasSuffix(got, `"reqId":7}`)):
			t.Errorf("%s: answered %s, want a validation error with the reqId", tc.in, got)
		}
	}

	// A long poll answers from its own goroutine: a Ping sent after it is
	// answered first.
	ws.text(`{"cmd":"PULL","queue":"lp","timeout":3000,"reqId":"long"}`)
	ws.text(`{"cmd":"Ping","reqId":"ping"}`)
	if m := ws.wsJSON(); m["reqId"] != "ping" {
		t.Fatalf("first answer %v, want the Ping's", m)
	}
	c.ok(map[string]any{"cmd": "PUSH", "queue": "lp", "data": "x"})
	if m := ws.wsJSON(); m["reqId"] != "long" || m["job"] == nil {
		t.Fatalf("long poll answered %v", m)
	}

	// WaitJob waits without holding the connection up either.
	ws.text(`{"cmd":"WaitJob","id":"` + id + `","timeout":5000,"reqId":"wait"}`)
	ws.text(`{"cmd":"PULL","queue":"wc","reqId":"pull"}`)
	if m := ws.wsJSON(); m["reqId"] != "pull" {
		t.Fatalf("first answer %v, want the PULL's", m)
	}
	c.ok(map[string]any{"cmd": "ACK", "id": id, "result": map[string]any{"r": true}})
	if m := ws.wsJSON(); m["reqId"] != "wait" || m["completed"] != true {
		t.Fatalf("WaitJob answered %v", m)
	}
}

// TestLiveWebSocketReleasesJobs: jobs pulled over a WebSocket go back to
// waiting when it closes, and its workers are gone, as on TCP.
func TestLiveWebSocketReleasesJobs(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := dial(t, ts.addr)
	id := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "rel", "data": 1}), "id")
	ws := dialWS(t, ts.http, "/ws")
	ws.text(`{"cmd":"RegisterWorker","name":"ws-worker","queues":["rel"],"reqId":"r"}`)
	ws.wsUntil("RegisterWorker", func(m map[string]any) bool { return m["reqId"] == "r" })
	ws.text(`{"cmd":"PULL","queue":"rel","reqId":"p"}`)
	m := ws.wsUntil("PULL", func(m map[string]any) bool { return m["reqId"] == "p" })
	if jobj(t, m["job"])["id"] != id {
		t.Fatalf("pulled %v", m)
	}
	if st := str(t, c.ok(map[string]any{"cmd": "GetState", "id": id}), "state"); st != "active" {
		t.Fatalf("state %s", st)
	}
	ws.write(wsFrameBytes(true, 0, 0x8, wsCloseBody(1000, "bye"), true))
	eventually(t, 5*time.Second, "the job back to waiting", func() (bool, string) {
		st := str(t, c.ok(map[string]any{"cmd": "GetState", "id": id}), "state")
		return st == "waiting", st
	})
	workers := c.ok(map[string]any{"cmd": "ListWorkers"})["data"].(map[string]any)["workers"].([]any)
	if len(workers) != 0 {
		t.Fatalf("workers after close: %v", workers)
	}
}

// TestLiveSlowConsumer: a WebSocket client that reads nothing, and an SSE
// client that reads nothing, do not slow the broker; they miss events.
func TestLiveSlowConsumer(t *testing.T) {
	t.Parallel()
	// Dropped only by a write refused for longer than the test can take:
	// on a busy machine its 3,000 jobs take more than the default 10 s.
	ts := startServerHTTP(t, &config{liveEvery: liveIntervals{write: 5 * time.Minute}})
	ws := dialWS(t, ts.http, "/ws")
	sse := dialSSE(t, ts.http, "/events")
	sse.mustNext()
	ws.text(`{"cmd":"Ping"}`) // a command, then never a read
	c := dial(t, ts.addr)
	// Failed events carry the job's data (in the WebSocket's legacy form):
	// big payloads fill the client's queue and socket quickly.
	data := strings.Repeat("x", 16<<10)
	const n = 3000
	start := time.Now()
	jobs := make([]any, 100)
	for i := range jobs {
		jobs[i] = map[string]any{"name": "j", "data": map[string]any{"pad": data}, "maxAttempts": 1}
	}
	for range n / 100 {
		c.ok(map[string]any{"cmd": "PUSHB", "queue": "slow", "jobs": jobs})
	}
	for range n / 100 {
		r := c.ok(map[string]any{"cmd": "PULLB", "queue": "slow", "count": 100})
		for _, j := range r["jobs"].([]any) {
			c.ok(map[string]any{"cmd": "FAIL", "id": j.(map[string]any)["id"], "error": "no"})
		}
	}
	took := time.Since(start)
	t.Logf("%d jobs pushed, pulled and failed in %v with two clients not reading", n, took)
	// A broker held to the clients' pace would never have answered: they
	// do not read at all, and every call above has a deadline.
	// The server still answers on every side.
	resp := c.ok(map[string]any{"cmd": "Ping"})
	if resp["ok"] != true {
		t.Fatal("ping")
	}
	h := newHC(t, ts).ok("GET", "/health", nil)
	conns := jobj(t, h["connections"])
	if jnum(t, conns["ws"]) != 1 || jnum(t, conns["sse"]) != 1 {
		t.Fatalf("the slow clients were dropped: %v", conns)
	}
	if d := jnum(t, jobj(t, h["events"])["dropped"]); d == 0 {
		t.Fatal("no event was dropped: the test did not fill the clients' queues")
	} else {
		t.Logf("%d events dropped", d)
	}
}

// A failed job's data whose JSON passes liveMaxData is left out of the
// WebSocket's legacy event, which says so and where to read it; smaller
// data is carried as before. And live events are counted in the answer
// budget while subscribers that do not read hold them, and given back
// once those go.
func TestLiveEventsCounted(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := dial(t, ts.addr)
	legacy := dialWS(t, ts.http, "/ws")
	failed := func(data any) map[string]any {
		t.Helper()
		id := str(t, c.ok(M{"cmd": "PUSH", "queue": "ev", "data": data, "maxAttempts": 1}), "id")
		c.ok(M{"cmd": "PULL", "queue": "ev"})
		c.ok(M{"cmd": "FAIL", "id": id, "error": "no"})
		for {
			m := legacy.wsJSON()
			if m["eventType"] == "failed" && m["jobId"] == id {
				return m
			}
		}
	}
	small := failed(map[string]any{"a": 1})
	if d, ok := small["data"].(map[string]any); !ok || fmt.Sprint(d["a"]) != "1" || small["dataOmitted"] != nil {
		t.Fatalf("failed event of a small job: %v", small)
	}
	big := failed(binaryData(2_000_000)) // 7.3 MB of JSON
	note, _ := big["dataOmitted"].(string)
	if _, has := big["data"]; has || !strings.Contains(note, "GET /jobs/"+str(t, big, "jobId")) {
		t.Fatalf("failed event of a job with 2 MB of binary data: dataOmitted %q, data present %v", note, big["data"] != nil)
	}

	// Two subscribers that read nothing, and events of 64 KB of data.
	stalled := dialWS(t, ts.http, "/ws")
	stalled.slowReader()
	sse := dialSSE(t, ts.http, "/events")
	sse.mustNext()
	pad := strings.Repeat("x", 64<<10)
	for range 200 {
		id := str(t, c.ok(M{"cmd": "PUSH", "queue": "held", "data": pad, "maxAttempts": 1}), "id")
		c.ok(M{"cmd": "PULL", "queue": "held"})
		c.ok(M{"cmd": "FAIL", "id": id, "error": "no"})
	}
	if n := scrapeOne(t, ts.http, "bunqueue_answer_bytes"); n == 0 {
		t.Fatal("events held for subscribers that do not read are not counted in the answer budget")
	}
	stalled.nc.Close()
	sse.nc.Close()
	eventually(t, 20*time.Second, "the events they held given back", func() (bool, string) {
		n := scrapeOne(t, ts.http, "bunqueue_answer_bytes")
		return n == 0, fmt.Sprint(n, " bytes held")
	})
}
