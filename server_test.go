package main

// End-to-end tests of the server over real TCP: framing and bad input,
// pipelining, auth, the job lifecycle, leases, long polls, disconnects,
// batches, queries, events, graceful shutdown and concurrency. The client
// and the server harness are in testclient_test.go.
//
// Timing rule: nothing here asserts a tight latency. Waits are polls with
// generous deadlines; the only time bounds asserted are "answered before
// the request's own timeout" and "waited at least as long as asked".

import (
	"bytes"
	"fmt"
	"net"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type M = map[string]any

// job returns the "job" map of an answer.
func job(t testing.TB, a M) M {
	t.Helper()
	return sub(t, a, "job")
}

func state(t testing.TB, c *tclient, id string) string {
	t.Helper()
	return str(t, c.ok(M{"cmd": "GetState", "id": id}), "state")
}

// waitState polls GetState until the job is in want.
func waitState(t testing.TB, c *tclient, id, want string, within time.Duration) {
	t.Helper()
	eventually(t, within, "job "+id+" in state "+want, func() (bool, string) {
		got := state(t, c, id)
		return got == want, got
	})
}

// wantAlreadyFinalized checks the answer of an ACK or FAIL that came too late.
func wantAlreadyFinalized(t testing.TB, a M) {
	t.Helper()
	want := M{"applied": false, "reason": "already-finalized"}
	if a["ok"] != true || !reflect.DeepEqual(a["data"], want) {
		t.Fatalf("want ok:true data:%v, got %v", want, a)
	}
}

// push pushes one job and returns its id.
func push(t testing.TB, c *tclient, queue string, extra M) string {
	t.Helper()
	m := M{"cmd": "PUSH", "queue": queue, "name": "task", "data": M{"v": 1}}
	for k, v := range extra {
		m[k] = v
	}
	return str(t, c.ok(m), "id")
}

// pullOwned pulls one job with an owner and returns its id and token.
func pullOwned(t testing.TB, c *tclient, queue string, extra M) (string, string) {
	t.Helper()
	m := M{"cmd": "PULL", "queue": queue, "owner": "worker-1"}
	for k, v := range extra {
		m[k] = v
	}
	a := c.ok(m)
	j, ok := a["job"].(M)
	if !ok {
		t.Fatalf("PULL %s: no job in %v", queue, a)
	}
	return str(t, j, "id"), str(t, a, "token")
}

func wantUndefined(t testing.TB, what string, v any) {
	t.Helper()
	if _, undef := v.(Undefined); !undef {
		t.Errorf("%s = %#v, want undefined", what, v)
	}
}

// ===========================================================================
// 1. Framing and bad input

func TestProtoFrameTooLarge(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	c.ok(M{"cmd": "Ping"})

	// Only a header, declaring MaxFrame+1 bytes.
	c.writeRaw([]byte{0x04, 0x00, 0x00, 0x01})
	a := c.orphan(callTimeout)
	if a["ok"] != false {
		t.Fatalf("want ok:false, got %v", a)
	}
	msg, _ := a["error"].(string)
	if !strings.Contains(msg, "Frame too large") {
		t.Fatalf("error %q does not say Frame too large", msg)
	}
	if want := "Frame too large: 67108865 bytes exceeds maximum 67108864"; msg != want {
		t.Errorf("error = %q, want %q", msg, want)
	}
	wantUndefined(t, "reqId", a["reqId"])
	if !c.closedByPeer(callTimeout) {
		t.Fatal("connection not closed after an oversized frame")
	}

	// The server itself goes on.
	c2 := dial(t, ts.addr)
	if d := sub(t, c2.ok(M{"cmd": "Ping"}), "data"); d["pong"] != true {
		t.Fatalf("Ping on a second connection: %v", d)
	}
}

// TestProtoExtValues: an ext type the official client cannot read is
// refused wherever it stands, naming the field (the timestamp and
// undefined types are carried: TestProtoExtTimestampInJobData), and a field
// the server reads refuses an ext value, naming it.
func TestProtoExtValues(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)

	// {cmd:"Ping", reqId:"e1", when:<fixext1 type 5>}: even an unread field.
	var e Enc
	e.MapHead(3)
	e.Str("cmd")
	e.Str("Ping")
	e.Str("reqId")
	e.Str("e1")
	e.Str("when")
	e.B = append(e.B, 0xd4, 0x05, 0x00)
	id, ch := c.prepare(M{"reqId": "e1"})
	c.writeRaw(rawFrame(e.B))
	if a := c.await(id, ch, callTimeout); a["ok"] != false || !strings.Contains(fmt.Sprint(a["error"]), "field when holds MessagePack ext type 5") {
		t.Fatalf("Ping with an ext field: got %v, want a refusal naming the field", a)
	}

	// An ext where the server reads a string: refused, naming the field.
	e = Enc{}
	e.MapHead(4)
	e.Str("reqId")
	e.Str("e2")
	e.Str("cmd")
	e.Str("PUSH")
	e.Str("queue")
	e.B = append(e.B, 0xd4, 0xff, 0x00)
	e.Str("data")
	e.Nil()
	id, ch = c.prepare(M{"reqId": "e2"})
	c.writeRaw(rawFrame(e.B))
	if a := c.await(id, ch, callTimeout); a["ok"] != false || a["error"] != "queue must be a string" {
		t.Fatalf("PUSH with an ext queue: got %v", a)
	}
	c.ok(M{"cmd": "Ping"})
}

func TestProtoMalformedBodies(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	cases := []struct {
		name string
		body []byte
		want string
	}{
		// {cmd:"Ping", <a third pair that is not there>}
		{"truncated map", []byte{0xde, 0x00, 0x03, 0xa3, 'c', 'm', 'd', 0xa4, 'P', 'i', 'n', 'g'},
			"Invalid command format: truncated MessagePack value"},
		// {1:"x", cmd:"Ping"}
		{"non-string key", []byte{0x82, 0x01, 0xa1, 'x', 0xa3, 'c', 'm', 'd', 0xa4, 'P', 'i', 'n', 'g'},
			"Invalid command format: map keys must be strings"},
		{"top-level array", []byte{0x92, 0x01, 0x02}, "Invalid command: a request must be a map"},
		{"empty body", []byte{}, "Invalid command format: truncated MessagePack value"},
		{"trailing bytes", []byte{0x81, 0xa3, 'c', 'm', 'd', 0xa4, 'P', 'i', 'n', 'g', 0x00},
			"Invalid command format: 1 trailing bytes after MessagePack value"},
		{"byte 0xc1", []byte{0xc1}, "Invalid command: a request must be a map"},
	}
	for _, tc := range cases {
		c.writeRaw(rawFrame(tc.body))
		a := c.orphan(callTimeout)
		if a["ok"] != false || a["error"] != tc.want {
			t.Errorf("%s: got %v, want ok:false error %q", tc.name, a, tc.want)
		}
		wantUndefined(t, tc.name+": reqId", a["reqId"])
		// The connection goes on.
		c.ok(M{"cmd": "Ping"})
	}

	// Several bad frames in one write, then a good one.
	var b []byte
	for i := 0; i < 3; i++ {
		b = append(b, rawFrame([]byte{0x92, 0x01, 0x02})...)
	}
	id, ch := c.prepare(M{"reqId": "after-bad"})
	b = append(b, frame(M{"cmd": "Ping", "reqId": id})...)
	c.writeRaw(b)
	for i := 0; i < 3; i++ {
		if a := c.orphan(callTimeout); a["ok"] != false {
			t.Fatalf("bad frame %d answered %v", i, a)
		}
	}
	if a := c.await(id, ch, callTimeout); a["ok"] != true {
		t.Fatalf("Ping after bad frames: %v", a)
	}
}

func TestProtoUndefinedIsAbsent(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	u := Undefined{}

	// msgpackr's undefined (d4 00 00) on an unknown field, and on fields that
	// are validated when present: all read as absent.
	c.ok(M{"cmd": "Ping", "extra": u})
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "undef", "data": M{"a": u}, "priority": u, "delay": u,
		"maxAttempts": u, "jobId": u, "timeout": u, "backoff": u}), "id")
	j := job(t, c.ok(M{"cmd": "GetJob", "id": id}))
	if j["state"] != "waiting" || num(t, j["priority"]) != 0 || num(t, j["maxAttempts"]) != 3 ||
		num(t, j["backoff"]) != 1000 || j["customId"] != nil || j["timeout"] != nil {
		t.Fatalf("job pushed with undefined options: %v", j)
	}
	// Inside the job's data (an opaque value) the undefined is kept as sent.
	if d := sub(t, j, "data"); !reflect.DeepEqual(d, M{"a": u}) {
		t.Errorf("data = %#v", d)
	}

	// An undefined reqId is absent too: the answer carries undefined.
	c.writeRaw(frame(M{"cmd": "Ping", "reqId": u}))
	a := c.orphan(callTimeout)
	if a["ok"] != true {
		t.Fatalf("Ping with undefined reqId: %v", a)
	}
	wantUndefined(t, "reqId", a["reqId"])
}

func TestProtoReqIDEchoedBeforeFault(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)

	// {reqId:"t1", cmd:"Ping", <missing third pair>}
	var e Enc
	e.B = append(e.B, 0xde, 0x00, 0x03)
	e.Str("reqId")
	e.Str("t1")
	e.Str("cmd")
	e.Str("Ping")
	id, ch := c.prepare(M{"reqId": "t1"})
	c.writeRaw(rawFrame(e.B))
	a := c.await(id, ch, callTimeout)
	if a["ok"] != false || a["error"] != "Invalid command format: truncated MessagePack value" {
		t.Fatalf("got %v", a)
	}

	// A reqId after the fault cannot be read: undefined is echoed. (The
	// cmd string declares 50 bytes and the frame ends first.)
	e = Enc{}
	e.MapHead(2)
	e.Str("cmd")
	e.B = append(e.B, 0xd9, 50, 'P')
	e.Str("reqId")
	e.Str("t2")
	c.writeRaw(rawFrame(e.B))
	a = c.orphan(callTimeout)
	if a["ok"] != false {
		t.Fatalf("got %v, want ok:false", a)
	}
	wantUndefined(t, "reqId", a["reqId"])

	// A non-string reqId is echoed with its type.
	c.writeRaw(frame(M{"cmd": "Ping", "reqId": 42}))
	a = c.orphan(callTimeout)
	if a["ok"] != true || a["reqId"] != int64(42) {
		t.Fatalf("numeric reqId: got %#v", a)
	}
}

func TestProtoUnknownAndMissingCommand(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	if got := c.fail(M{"cmd": "Bogus"}); got != "Unknown command: Bogus" {
		t.Errorf("Bogus: %q", got)
	}
	if got := c.fail(M{"cmd": "ping"}); got != "Unknown command: ping" {
		t.Errorf("ping: %q", got)
	}
	if got := c.fail(M{"queue": "q"}); got != "Invalid command" {
		t.Errorf("no cmd: %q", got)
	}
	if got := c.fail(M{"cmd": ""}); got != "Invalid command" {
		t.Errorf("empty cmd: %q", got)
	}
	if got := c.fail(M{"cmd": nil}); got != "Invalid command" {
		t.Errorf("nil cmd: %q", got)
	}
	c.ok(M{"cmd": "Ping"})
}

// ===========================================================================
// 2. Pipelining

func TestProtoPipelining200(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	type pend struct {
		id, cmd string
		ch      chan M
	}
	var buf []byte
	var ps []pend
	pushes := 0
	for i := 0; i < 200; i++ {
		m := M{"cmd": "Ping"}
		if i%2 == 1 {
			m = M{"cmd": "PUSH", "queue": "pipe", "data": i}
			pushes++
		}
		id, ch := c.prepare(m)
		ps = append(ps, pend{id, m["cmd"].(string), ch})
		buf = append(buf, frame(m)...)
	}
	c.writeRaw(buf) // all 200 in one write
	for _, p := range ps {
		a := c.await(p.id, p.ch, callTimeout)
		if a["ok"] != true || a["reqId"] != p.id {
			t.Fatalf("%s %s: %v", p.cmd, p.id, a)
		}
		if p.cmd == "PUSH" {
			str(t, a, "id")
		}
	}
	// Commands that answer at once answer in request order.
	for i, p := range ps {
		select {
		case got := <-c.order:
			if got != p.id {
				t.Fatalf("answer %d is %s, want %s", i, got, p.id)
			}
		default:
			t.Fatalf("only %d answers recorded", i)
		}
	}
	if n := num(t, c.ok(M{"cmd": "Count", "queue": "pipe"})["count"]); n != float64(pushes) {
		t.Fatalf("Count = %v, want %d", n, pushes)
	}
}

// ===========================================================================
// 3-4. Session

func TestServerAuth(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{authTokens: "a,b"})
	c := dial(t, ts.addr)
	for _, cmd := range []string{"Ping", "Hello", "Bogus"} {
		if got := c.fail(M{"cmd": cmd}); got != "Not authenticated" {
			t.Errorf("%s before Auth: %q", cmd, got)
		}
	}
	if got := c.fail(M{"cmd": "Auth", "token": "wrong"}); got != "Invalid token" {
		t.Errorf("wrong token: %q", got)
	}
	if got := c.fail(M{"cmd": "Ping"}); got != "Not authenticated" {
		t.Errorf("Ping after a bad Auth: %q", got)
	}
	wantUndefined(t, "Auth answer id", c.ok(M{"cmd": "Auth", "token": "b"})["id"])
	if d := sub(t, c.ok(M{"cmd": "Ping"}), "data"); d["pong"] != true {
		t.Fatalf("Ping after Auth: %v", d)
	}
	// A failed Auth does not undo a good one.
	c.fail(M{"cmd": "Auth", "token": "nope"})
	c.ok(M{"cmd": "Ping"})

	// Authentication is per connection.
	c2 := dial(t, ts.addr)
	if got := c2.fail(M{"cmd": "PUSH", "queue": "q"}); got != "Not authenticated" {
		t.Errorf("second connection: %q", got)
	}
	c2.ok(M{"cmd": "Auth", "token": "a"})
	c2.ok(M{"cmd": "PUSH", "queue": "q"})

	// Without configured tokens, Auth always fails and nothing needs it.
	ts2 := startServer(t, nil)
	c3 := dial(t, ts2.addr)
	if got := c3.fail(M{"cmd": "Auth", "token": "a"}); got != "Invalid token" {
		t.Errorf("Auth on an open server: %q", got)
	}
	c3.ok(M{"cmd": "Ping"})
}

func TestServerHelloPing(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	h := c.ok(M{"cmd": "Hello", "protocolVersion": 3})
	if num(t, h["protocolVersion"]) != 3 || h["server"] != "bunqueue" || h["version"] != "2.9.5" {
		t.Fatalf("Hello: %v", h)
	}
	if caps := list(t, h, "capabilities"); !reflect.DeepEqual(caps, []any{"pipelining", "separate-job-name"}) {
		t.Errorf("capabilities: %v", caps)
	}
	// The version asked for does not matter.
	if h := c.ok(M{"cmd": "Hello", "protocolVersion": 1}); num(t, h["protocolVersion"]) != 3 {
		t.Errorf("Hello v1: %v", h)
	}
	before := float64(time.Now().UnixMilli())
	d := sub(t, c.ok(M{"cmd": "Ping"}), "data")
	if d["pong"] != true {
		t.Fatalf("Ping: %v", d)
	}
	if tm := num(t, d["time"]); tm < before-60000 || tm > before+60000 {
		t.Errorf("Ping time %v is not a current ms timestamp", tm)
	}
}

// ===========================================================================
// 5. Job lifecycle

func TestServerJobLifecycleAck(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	id := push(t, c, "life", M{"name": "email", "data": M{"to": "a@example.com"}})
	if st := state(t, c, id); st != "waiting" {
		t.Fatalf("pushed job is %s", st)
	}

	a := c.ok(M{"cmd": "PULL", "queue": "life", "owner": "w1"})
	j := job(t, a)
	if j["id"] != id || j["name"] != "email" || !reflect.DeepEqual(j["data"], M{"to": "a@example.com"}) {
		t.Fatalf("pulled job: %v", j)
	}
	if _, has := j["state"]; has {
		t.Errorf("PULL's job has a state key: %v", j)
	}
	tok := str(t, a, "token")
	if tok == "" {
		t.Fatal("empty token")
	}
	if st := state(t, c, id); st != "active" {
		t.Fatalf("pulled job is %s", st)
	}

	if got := c.fail(M{"cmd": "ACK", "id": id}); got != "Lock token required for job "+id {
		t.Errorf("ACK without token: %q", got)
	}
	if got := c.fail(M{"cmd": "ACK", "id": id, "token": "not-the-token"}); got != "Invalid or expired lock token for job "+id {
		t.Errorf("ACK with a wrong token: %q", got)
	}
	if st := state(t, c, id); st != "active" {
		t.Fatalf("a refused ACK moved the job to %s", st)
	}
	result := M{"sum": 3, "tags": []any{"x", "y"}, "pi": 3.25}
	wantUndefined(t, "ACK answer id", c.ok(M{"cmd": "ACK", "id": id, "token": tok, "result": result})["id"])
	if got := c.fail(M{"cmd": "ACK", "id": id, "token": tok}); got != "Job not found or not in processing state: "+id {
		t.Errorf("second ACK: %q", got)
	}

	wantResult := M{"sum": int64(3), "tags": []any{"x", "y"}, "pi": 3.25}
	g := job(t, c.ok(M{"cmd": "GetJob", "id": id}))
	if g["state"] != "completed" {
		t.Errorf("GetJob state = %v", g["state"])
	}
	if !reflect.DeepEqual(g["returnvalue"], wantResult) {
		t.Errorf("returnvalue = %#v, want %#v", g["returnvalue"], wantResult)
	}
	if !isNum(g["completedAt"]) || !isNum(g["startedAt"]) {
		t.Errorf("completedAt/startedAt: %v / %v", g["completedAt"], g["startedAt"])
	}
	var states []string
	for _, e := range list(t, g, "timeline") {
		states = append(states, fmt.Sprint(e.(M)["state"]))
	}
	if !reflect.DeepEqual(states, []string{"waiting", "active", "completed"}) {
		t.Errorf("timeline states = %v", states)
	}
	if st := state(t, c, id); st != "completed" {
		t.Errorf("GetState = %s", st)
	}
	r := c.ok(M{"cmd": "GetResult", "id": id})
	if r["id"] != id || !reflect.DeepEqual(r["result"], wantResult) {
		t.Errorf("GetResult: %v", r)
	}

	// Unknown ids.
	if got := c.fail(M{"cmd": "GetJob", "id": "no-such-job"}); got != "Job not found" {
		t.Errorf("GetJob unknown: %q", got)
	}
	if st := state(t, c, "no-such-job"); st != "unknown" {
		t.Errorf("GetState unknown: %s", st)
	}
	if got := c.fail(M{"cmd": "ACK", "id": "no-such-job"}); got != "Job not found or not in processing state: no-such-job" {
		t.Errorf("ACK unknown: %q", got)
	}
	wantUndefined(t, "GetResult of an unknown id", c.ok(M{"cmd": "GetResult", "id": "no-such-job"})["result"])

	// PULL on an empty queue: no token key without an owner, token:nil with one.
	a = c.ok(M{"cmd": "PULL", "queue": "life"})
	if _, has := a["token"]; a["job"] != nil || has {
		t.Errorf("empty PULL without owner: %v", a)
	}
	a = c.ok(M{"cmd": "PULL", "queue": "life", "owner": "w1"})
	if tk, has := a["token"]; a["job"] != nil || !has || tk != nil {
		t.Errorf("empty PULL with owner: %v", a)
	}
}

func TestServerFailRetryDLQ(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	const q = "retry"
	id := push(t, c, q, M{"maxAttempts": 2, "backoff": 50})

	_, tok := pullOwned(t, c, q, nil)
	// FAIL and GetState go out back to back, so the state is read well
	// within the shortest possible backoff (50ms * 2^1 * 0.5).
	fid, fch := c.send(M{"cmd": "FAIL", "id": id, "token": tok, "error": "boom 1"})
	sid, sch := c.send(M{"cmd": "GetState", "id": id})
	if a := c.await(fid, fch, callTimeout); a["ok"] != true {
		t.Fatalf("first FAIL: %v", a)
	}
	if st := c.await(sid, sch, callTimeout)["state"]; st != "delayed" {
		t.Fatalf("after the first FAIL the job is %v, want delayed", st)
	}
	// The same token again: that attempt was already accounted for.
	wantAlreadyFinalized(t, c.ok(M{"cmd": "FAIL", "id": id, "token": tok, "error": "again"}))

	// The retry comes back by itself: a long poll picks it up.
	a := c.ok(M{"cmd": "PULL", "queue": q, "owner": "w1", "timeout": 10000})
	j, ok := a["job"].(M)
	if !ok || j["id"] != id {
		t.Fatalf("retry not pulled: %v", a)
	}
	if num(t, j["attempts"]) != 1 {
		t.Errorf("retried job attempts = %v, want 1", j["attempts"])
	}
	tok2 := str(t, a, "token")
	c.ok(M{"cmd": "FAIL", "id": id, "token": tok2, "error": "boom 2"})
	if st := state(t, c, id); st != "failed" {
		t.Fatalf("after the last FAIL the job is %v, want failed", st)
	}

	d := c.ok(M{"cmd": "Dlq", "queue": q})
	jobs, entries := list(t, d, "jobs"), list(t, d, "entries")
	if len(jobs) != 1 || len(entries) != 1 {
		t.Fatalf("Dlq: %v", d)
	}
	ent := entries[0].(M)
	if ent["reason"] != "max_attempts_exceeded" || ent["error"] != "boom 2" {
		t.Errorf("DLQ entry reason/error: %v / %v", ent["reason"], ent["error"])
	}
	if dj := jobs[0].(M); dj["id"] != id || num(t, dj["attempts"]) != 2 {
		t.Errorf("DLQ job: %v", dj)
	}
	if att := list(t, ent, "attempts"); len(att) != 2 || att[0].(M)["reason"] != "explicit_fail" ||
		att[1].(M)["reason"] != "max_attempts_exceeded" {
		t.Errorf("DLQ attempts: %v", att)
	}
	g := job(t, c.ok(M{"cmd": "GetJob", "id": id}))
	if g["state"] != "failed" || g["failedReason"] != "boom 2" {
		t.Errorf("GetJob of the failed job: state %v failedReason %v", g["state"], g["failedReason"])
	}
	if cnt := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": q}), "counts"); num(t, cnt["failed"]) != 1 {
		t.Errorf("counts: %v", cnt)
	}
	if got := c.fail(M{"cmd": "ACK", "id": id, "token": tok2}); got != "Job not found or not in processing state: "+id {
		t.Errorf("ACK of a failed job: %q", got)
	}

	// RetryDlq puts it back to waiting with fresh attempts.
	if n := num(t, c.ok(M{"cmd": "RetryDlq", "queue": q})["count"]); n != 1 {
		t.Fatalf("RetryDlq count = %v", n)
	}
	if st := state(t, c, id); st != "waiting" {
		t.Fatalf("after RetryDlq the job is %v", st)
	}
	if g := job(t, c.ok(M{"cmd": "GetJob", "id": id})); num(t, g["attempts"]) != 0 {
		t.Errorf("attempts after RetryDlq: %v", g["attempts"])
	}
	if n := len(list(t, c.ok(M{"cmd": "Dlq", "queue": q}), "jobs")); n != 0 {
		t.Errorf("DLQ still has %d jobs", n)
	}

	// An unrecoverable failure goes straight to the DLQ; PurgeDlq empties it.
	_, tok3 := pullOwned(t, c, q, nil)
	c.ok(M{"cmd": "FAIL", "id": id, "token": tok3, "error": "fatal", "unrecoverable": true})
	if st := state(t, c, id); st != "failed" {
		t.Fatalf("after an unrecoverable FAIL the job is %v", st)
	}
	if n := num(t, c.ok(M{"cmd": "PurgeDlq", "queue": q})["count"]); n != 1 {
		t.Fatalf("PurgeDlq count = %v", n)
	}
	if st := state(t, c, id); st != "unknown" {
		t.Errorf("after PurgeDlq the job is %v", st)
	}
	if n := num(t, c.ok(M{"cmd": "PurgeDlq", "queue": q})["count"]); n != 0 {
		t.Errorf("second PurgeDlq count = %v", n)
	}
}

// ===========================================================================
// 6. Leases and timeouts

func TestServerLeaseExpiry(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	id := push(t, c, "lease", nil)
	_, tok := pullOwned(t, c, "lease", M{"lockTtl": 200})
	waitState(t, c, id, "waiting", 5*time.Second)

	j := job(t, c.ok(M{"cmd": "GetJob", "id": id}))
	if num(t, j["attempts"]) != 1 || num(t, j["stallCount"]) != 1 {
		t.Fatalf("after lock expiry: attempts %v stallCount %v, want 1 and 1", j["attempts"], j["stallCount"])
	}
	if j["startedAt"] != nil {
		t.Errorf("startedAt = %v, want nil", j["startedAt"])
	}
	wantAlreadyFinalized(t, c.ok(M{"cmd": "FAIL", "id": id, "token": tok, "error": "late"}))
	if st := state(t, c, id); st != "waiting" {
		t.Errorf("a late FAIL moved the job to %v", st)
	}
	if got := c.fail(M{"cmd": "JobHeartbeat", "id": id, "token": tok}); got != "Job not found or not active (or invalid token)" {
		t.Errorf("heartbeat with the expired token: %q", got)
	}

	// The job can be pulled again, with a new token.
	_, tok2 := pullOwned(t, c, "lease", nil)
	if tok2 == tok {
		t.Fatal("the same token was handed out twice")
	}
	c.ok(M{"cmd": "ACK", "id": id, "token": tok2})
}

func TestServerJobHeartbeatKeepsLease(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	id := push(t, c, "hb", nil)
	// Renewed at most every 50 ms (eventually's pause), so 1 s leaves
	// room for a loaded machine; 400 ms once lapsed under load.
	_, tok := pullOwned(t, c, "hb", M{"lockTtl": 1000})

	if got := c.fail(M{"cmd": "JobHeartbeat", "id": id, "token": "wrong"}); got != "Job not found or not active (or invalid token)" {
		t.Errorf("heartbeat with a wrong token: %q", got)
	}
	// Renew over three lock lifetimes, each shown by a job of the same
	// lockTtl that is not renewed: its lock lapses and it is put back.
	for round := range 3 {
		q := fmt.Sprint("hb-other-", round)
		other := push(t, c, q, nil)
		pullOwned(t, c, q, M{"lockTtl": 1000})
		eventually(t, 10*time.Second, fmt.Sprint("round ", round, ": the lock that was not renewed lapsed"), func() (bool, string) {
			a := c.ok(M{"cmd": "JobHeartbeat", "id": id, "token": tok})
			if d := sub(t, a, "data"); d["ok"] != true {
				t.Fatalf("JobHeartbeat: %v", a)
			}
			st := state(t, c, other)
			return st == "waiting", st
		})
	}
	if st := state(t, c, id); st != "active" {
		t.Fatalf("renewed job is %v, want active", st)
	}
	j := job(t, c.ok(M{"cmd": "GetJob", "id": id}))
	if num(t, j["attempts"]) != 0 || num(t, j["stallCount"]) != 0 {
		t.Errorf("renewed job: attempts %v stallCount %v", j["attempts"], j["stallCount"])
	}
	c.ok(M{"cmd": "ACK", "id": id, "token": tok})
	if st := state(t, c, id); st != "completed" {
		t.Errorf("after ACK: %v", st)
	}
}

func TestServerJobTimeout(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)

	t.Run("terminal", func(t *testing.T) {
		c := dial(t, ts.addr)
		id := push(t, c, "tmo", M{"timeout": 100, "maxAttempts": 1})
		_, tok := pullOwned(t, c, "tmo", nil)
		waitState(t, c, id, "failed", 5*time.Second)
		ents := list(t, c.ok(M{"cmd": "Dlq", "queue": "tmo"}), "entries")
		if len(ents) != 1 {
			t.Fatalf("DLQ entries: %v", ents)
		}
		if e := ents[0].(M); e["reason"] != "timeout" || e["error"] != "Job timeout exceeded" {
			t.Errorf("DLQ entry: reason %v error %v", e["reason"], e["error"])
		}
		if g := job(t, c.ok(M{"cmd": "GetJob", "id": id})); g["failedReason"] != "Job timeout exceeded" {
			t.Errorf("failedReason = %v", g["failedReason"])
		}
		wantAlreadyFinalized(t, c.ok(M{"cmd": "ACK", "id": id, "token": tok, "result": 1}))
		if st := state(t, c, id); st != "failed" {
			t.Errorf("a late ACK moved the job to %v", st)
		}
	})

	t.Run("retried", func(t *testing.T) {
		c := dial(t, ts.addr)
		// Default 3 attempts and backoff 1000: after the timeout the job
		// waits at least a second for its next attempt.
		id := push(t, c, "tmo2", M{"timeout": 100})
		_, tok := pullOwned(t, c, "tmo2", nil)
		eventually(t, 5*time.Second, "timeout of job "+id, func() (bool, string) {
			st := state(t, c, id)
			return st != "active", st
		})
		g := job(t, c.ok(M{"cmd": "GetJob", "id": id}))
		if g["failedReason"] != "Job timeout exceeded" || num(t, g["attempts"]) != 1 {
			t.Errorf("timed-out job: failedReason %v attempts %v", g["failedReason"], g["attempts"])
		}
		wantAlreadyFinalized(t, c.ok(M{"cmd": "ACK", "id": id, "token": tok}))
		wantAlreadyFinalized(t, c.ok(M{"cmd": "FAIL", "id": id, "token": tok}))
		if st := state(t, c, id); st != "delayed" && st != "waiting" {
			t.Errorf("after a late ACK and FAIL the job is %v", st)
		}
	})
}

// ===========================================================================
// 7. Long polls

func TestServerLongPoll(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)

	t.Run("woken by a push", func(t *testing.T) {
		c, c2 := dial(t, ts.addr), dial(t, ts.addr)
		start := time.Now()
		// A timeout long enough that a busy machine never reaches it
		// before the push's wake-up does; reaching it is the failure.
		pid, pch := c.send(M{"cmd": "PULL", "queue": "lp", "owner": "w", "timeout": 10000})
		c.ok(M{"cmd": "Ping"}) // the PULL was read and is waiting
		id := push(t, c2, "lp", nil)
		a := c.await(pid, pch, 2*callTimeout)
		elapsed := time.Since(start)
		if j, ok := a["job"].(M); a["ok"] != true || !ok || j["id"] != id {
			t.Fatalf("long poll answered %v, want job %s", a, id)
		}
		if _, ok := a["token"].(string); !ok {
			t.Errorf("no token: %v", a)
		}
		if elapsed >= 10000*time.Millisecond {
			t.Errorf("long poll answered after %v, not before its 10000ms timeout", elapsed)
		}
	})

	t.Run("times out empty", func(t *testing.T) {
		c := dial(t, ts.addr)
		start := time.Now()
		a := c.ok(M{"cmd": "PULL", "queue": "lp-empty", "timeout": 200})
		if elapsed := time.Since(start); elapsed < 190*time.Millisecond {
			t.Errorf("answered after %v, before the 200ms timeout", elapsed)
		}
		if _, has := a["token"]; a["job"] != nil || has {
			t.Errorf("timed-out PULL: %v", a)
		}
		a = c.ok(M{"cmd": "PULL", "queue": "lp-empty", "owner": "w", "timeout": 100})
		if tk, has := a["token"]; a["job"] != nil || !has || tk != nil {
			t.Errorf("timed-out PULL with owner: %v", a)
		}
		a = c.ok(M{"cmd": "PULLB", "queue": "lp-empty", "owner": "w", "count": 5, "timeout": 100})
		if !reflect.DeepEqual(a["jobs"], []any{}) || !reflect.DeepEqual(a["tokens"], []any{}) {
			t.Errorf("timed-out PULLB: %v", a)
		}
	})

	t.Run("does not block later commands", func(t *testing.T) {
		c, c2 := dial(t, ts.addr), dial(t, ts.addr)
		pull := M{"cmd": "PULL", "queue": "lp-block", "timeout": 5000}
		ping := M{"cmd": "Ping"}
		pid, pch := c.prepare(pull)
		gid, gch := c.prepare(ping)
		c.writeRaw(append(frame(pull), frame(ping)...)) // one write
		if a := c.await(gid, gch, callTimeout); a["ok"] != true {
			t.Fatalf("Ping: %v", a)
		}
		select {
		case a := <-pch:
			t.Fatalf("the long poll answered before the Ping behind it: %v", a)
		default:
		}
		id := push(t, c2, "lp-block", nil)
		a := c.await(pid, pch, callTimeout)
		if j, ok := a["job"].(M); !ok || j["id"] != id {
			t.Fatalf("long poll: %v", a)
		}
	})

	t.Run("validation", func(t *testing.T) {
		c := dial(t, ts.addr)
		if got := c.fail(M{"cmd": "PULL", "queue": "lp", "timeout": 60001}); got != "timeout must be at most 60000" {
			t.Errorf("timeout 60001: %q", got)
		}
		if got := c.fail(M{"cmd": "PULL", "queue": "lp", "timeout": -1}); got != "timeout must be at least 0" {
			t.Errorf("timeout -1: %q", got)
		}
		if got := c.fail(M{"cmd": "PULL", "queue": "bad queue"}); got != "Queue name contains invalid characters" {
			t.Errorf("bad queue: %q", got)
		}
		if got := c.fail(M{"cmd": "PULL"}); got != "Queue name is required" {
			t.Errorf("no queue: %q", got)
		}
	})
}

// ===========================================================================
// 8. Disconnect

func TestServerDisconnectReleasesJobs(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	id := push(t, c, "disc", nil)
	id2 := push(t, c, "disc", nil)

	a := dial(t, ts.addr)
	gotID, tok := pullOwned(t, a, "disc", nil)
	if gotID != id {
		t.Fatalf("pulled %s, want %s", gotID, id)
	}
	// A job pulled without an owner is released too.
	if j := job(t, a.ok(M{"cmd": "PULL", "queue": "disc"})); j["id"] != id2 {
		t.Fatalf("second pull: %v", j)
	}
	if state(t, c, id) != "active" || state(t, c, id2) != "active" {
		t.Fatal("pulled jobs are not active")
	}
	a.close()

	waitState(t, c, id, "waiting", 5*time.Second)
	waitState(t, c, id2, "waiting", 5*time.Second)
	for _, jid := range []string{id, id2} {
		j := job(t, c.ok(M{"cmd": "GetJob", "id": jid}))
		if num(t, j["attempts"]) != 0 || num(t, j["stallCount"]) != 0 || j["startedAt"] != nil {
			t.Errorf("released job %s: attempts %v stallCount %v startedAt %v", jid, j["attempts"], j["stallCount"], j["startedAt"])
		}
	}
	if got := c.fail(M{"cmd": "ACK", "id": id, "token": tok}); got != "Job not found or not in processing state: "+id {
		t.Errorf("ACK after release: %q", got)
	}
	// Released jobs keep their place: the first pushed comes out first.
	if gotID, _ := pullOwned(t, c, "disc", nil); gotID != id {
		t.Errorf("after release pulled %s, want %s", gotID, id)
	}
}

// ===========================================================================
// 9. PUSHB

func TestServerPushBatch(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	const q = "pb"
	a := c.ok(M{"cmd": "PUSHB", "queue": q, "jobs": []any{
		M{"name": "a", "data": 1},
		M{"name": "b", "data": 2, "customId": "cust-1"},
		M{"name": "c", "data": 3, "customId": "cust-1"}, // duplicate within the batch
		M{"name": "d", "data": 4, "jobId": "ignored-in-pushb"},
	}})
	ids := list(t, a, "ids")
	if len(ids) != 4 {
		t.Fatalf("ids: %v", ids)
	}
	if ids[1] != "cust-1" || ids[2] != "cust-1" {
		t.Errorf("custom ids: %v", ids)
	}
	if ids[0] == ids[3] || ids[3] == "ignored-in-pushb" {
		t.Errorf("generated ids: %v", ids)
	}
	jobs := list(t, c.ok(M{"cmd": "GetJobs", "queue": q}), "jobs")
	var gotIDs, names []any
	for _, j := range jobs {
		gotIDs = append(gotIDs, j.(M)["id"])
		names = append(names, j.(M)["name"])
	}
	// One batch shares one createdAt, so GetJobs orders it by id as text (as
	// the reference does): the generated UUIDv7s ("01...") before "cust-1".
	if !reflect.DeepEqual(gotIDs, []any{ids[0], ids[3], "cust-1"}) || !reflect.DeepEqual(names, []any{"a", "d", "b"}) {
		t.Errorf("jobs in the queue: ids %v names %v", gotIDs, names)
	}

	// A duplicate across batches returns the existing id and keeps its data.
	a = c.ok(M{"cmd": "PUSHB", "queue": q, "jobs": []any{M{"name": "z", "data": "new", "customId": "cust-1"}, M{"name": "e"}}})
	ids2 := list(t, a, "ids")
	if len(ids2) != 2 || ids2[0] != "cust-1" || ids2[1] == "cust-1" {
		t.Fatalf("second batch ids: %v", ids2)
	}
	if g := job(t, c.ok(M{"cmd": "GetJob", "id": "cust-1"})); g["data"] != int64(2) || g["name"] != "b" {
		t.Errorf("a duplicate push changed the job: %v", g)
	}
	// A single PUSH with the same custom id (jobId there) dedups too.
	if got := push(t, c, q, M{"jobId": "cust-1"}); got != "cust-1" {
		t.Errorf("PUSH jobId duplicate: %s", got)
	}
	if n := num(t, c.ok(M{"cmd": "Count", "queue": q})["count"]); n != 4 {
		t.Fatalf("Count = %v, want 4", n)
	}

	// One bad entry: the whole batch is refused.
	got := c.fail(M{"cmd": "PUSHB", "queue": q, "jobs": []any{M{"name": "ok"}, M{"name": "bad", "priority": "high"}}})
	if got != "jobs[1]: priority must be a number" {
		t.Errorf("bad entry: %q", got)
	}
	if n := num(t, c.ok(M{"cmd": "Count", "queue": q})["count"]); n != 4 {
		t.Errorf("Count after a refused batch = %v, want 4", n)
	}
	if got := c.fail(M{"cmd": "PUSHB", "queue": q, "jobs": []any{M{"name": "ok"}, "not-an-object"}}); got != "jobs[1]: job must be an object" {
		t.Errorf("non-map entry: %q", got)
	}
	if a := c.ok(M{"cmd": "PUSHB", "queue": q, "jobs": []any{}}); !reflect.DeepEqual(a["ids"], []any{}) {
		t.Errorf("empty batch: %v", a)
	}
}

// ===========================================================================
// 10. Queries and queue control

func TestServerQueriesAndQueueControl(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	push(t, c, "lq-first", nil)
	const q = "qq"
	var ids []string
	for i := 0; i < 5; i++ {
		ids = append(ids, push(t, c, q, M{"data": i}))
	}
	push(t, c, "lq-last", nil)

	dataOf := func(a M) []any {
		var out []any
		for _, j := range list(t, a, "jobs") {
			out = append(out, j.(M)["data"])
		}
		return out
	}
	all := c.ok(M{"cmd": "GetJobs", "queue": q, "state": "waiting"})
	if got := dataOf(all); !reflect.DeepEqual(got, []any{int64(0), int64(1), int64(2), int64(3), int64(4)}) {
		t.Errorf("GetJobs waiting: %v", got)
	}
	for _, j := range list(t, all, "jobs") {
		if j.(M)["state"] != "waiting" {
			t.Errorf("GetJobs state label: %v", j.(M)["state"])
		}
	}
	if got := dataOf(c.ok(M{"cmd": "GetJobs", "queue": q, "offset": 1, "limit": 2})); !reflect.DeepEqual(got, []any{int64(1), int64(2)}) {
		t.Errorf("GetJobs offset 1 limit 2: %v", got)
	}
	if got := dataOf(c.ok(M{"cmd": "GetJobs", "queue": q, "asc": false, "limit": 2})); !reflect.DeepEqual(got, []any{int64(4), int64(3)}) {
		t.Errorf("GetJobs desc limit 2: %v", got)
	}
	if got := dataOf(c.ok(M{"cmd": "GetJobs", "queue": q, "state": []any{"active", "completed"}})); len(got) != 0 {
		t.Errorf("GetJobs active/completed: %v", got)
	}
	if got := dataOf(c.ok(M{"cmd": "GetJobs", "queue": "no-such-queue"})); len(got) != 0 {
		t.Errorf("GetJobs unknown queue: %v", got)
	}

	wantCounts := func(what string, want map[string]float64) {
		t.Helper()
		got := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": q}), "counts")
		for k, v := range want {
			if num(t, got[k]) != v {
				t.Errorf("%s: counts[%s] = %v, want %v (all: %v)", what, k, got[k], v, got)
			}
		}
	}

	c.ok(M{"cmd": "Pause", "queue": q})
	if p := c.ok(M{"cmd": "IsPaused", "queue": q}); p["paused"] != true {
		t.Errorf("IsPaused: %v", p)
	}
	wantCounts("paused", map[string]float64{"waiting": 0, "prioritized": 0, "paused": 5, "active": 0})
	if a := c.ok(M{"cmd": "PULL", "queue": q}); a["job"] != nil {
		t.Errorf("PULL on a paused queue: %v", a)
	}
	if st := state(t, c, ids[0]); st != "waiting" {
		t.Errorf("a job of a paused queue reads %v", st)
	}
	c.ok(M{"cmd": "Resume", "queue": q})
	if p := c.ok(M{"cmd": "IsPaused", "queue": q}); p["paused"] != false {
		t.Errorf("IsPaused after Resume: %v", p)
	}
	wantCounts("resumed", map[string]float64{"waiting": 5, "paused": 0})

	activeID, _ := pullOwned(t, c, q, nil)
	if activeID != ids[0] {
		t.Errorf("pulled %s, want the oldest %s", activeID, ids[0])
	}
	wantCounts("one active", map[string]float64{"waiting": 4, "active": 1})

	if n := num(t, c.ok(M{"cmd": "Drain", "queue": q})["count"]); n != 4 {
		t.Errorf("Drain count = %v, want 4", n)
	}
	wantCounts("drained", map[string]float64{"waiting": 0, "active": 1})
	if st := state(t, c, ids[1]); st != "unknown" {
		t.Errorf("a drained job reads %v", st)
	}
	if n := num(t, c.ok(M{"cmd": "Drain", "queue": q})["count"]); n != 0 {
		t.Errorf("second Drain count = %v", n)
	}

	queues := list(t, c.ok(M{"cmd": "ListQueues"}), "queues")
	if !reflect.DeepEqual(queues, []any{"lq-first", q, "lq-last"}) {
		t.Errorf("ListQueues = %v", queues)
	}

	c.ok(M{"cmd": "Obliterate", "queue": q})
	wantCounts("obliterated", map[string]float64{"waiting": 0, "active": 0, "completed": 0, "failed": 0, "paused": 0})
	if st := state(t, c, activeID); st != "unknown" {
		t.Errorf("the active job of an obliterated queue reads %v", st)
	}
	queues = list(t, c.ok(M{"cmd": "ListQueues"}), "queues")
	if !reflect.DeepEqual(queues, []any{"lq-first", "lq-last"}) {
		t.Errorf("ListQueues after Obliterate = %v", queues)
	}
	c.ok(M{"cmd": "Obliterate", "queue": "never-existed"})
}

// ===========================================================================
// 11. ACKB

func TestServerAckBatchIgnoredIndices(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	const q = "ackb"
	for i := 0; i < 3; i++ {
		push(t, c, q, M{"data": i})
	}
	a := c.ok(M{"cmd": "PULLB", "queue": q, "owner": "w", "count": 3})
	jobs, toks := list(t, a, "jobs"), list(t, a, "tokens")
	if len(jobs) != 3 || len(toks) != 3 {
		t.Fatalf("PULLB: %v", a)
	}
	var ids []any
	for _, j := range jobs {
		ids = append(ids, j.(M)["id"])
	}
	r := c.ok(M{"cmd": "ACKB",
		"ids":     []any{ids[0], "missing-job", ids[1], ids[2]},
		"tokens":  []any{toks[0], "", toks[1], toks[2]},
		"results": []any{"r0", "rx", "r1", "r2"}})
	d := sub(t, r, "data")
	if !reflect.DeepEqual(d["ignoredIndices"], []any{int64(1)}) || !reflect.DeepEqual(d["ignoredIds"], []any{"missing-job"}) {
		t.Fatalf("ACKB answer: %v", r)
	}
	for i, id := range ids {
		if st := state(t, c, id.(string)); st != "completed" {
			t.Errorf("job %d is %v after ACKB", i, st)
		}
		if res := c.ok(M{"cmd": "GetResult", "id": id})["result"]; res != fmt.Sprintf("r%d", i) {
			t.Errorf("job %d result %v", i, res)
		}
	}
	if cnt := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": q}), "counts"); num(t, cnt["completed"]) != 3 || num(t, cnt["active"]) != 0 {
		t.Errorf("counts: %v", cnt)
	}

	// Nothing ignored: the plain success.
	push(t, c, q, nil)
	a = c.ok(M{"cmd": "PULLB", "queue": q, "owner": "w", "count": 3})
	jobs, toks = list(t, a, "jobs"), list(t, a, "tokens")
	if len(jobs) != 1 {
		t.Fatalf("PULLB: %v", a)
	}
	r = c.ok(M{"cmd": "ACKB", "ids": []any{jobs[0].(M)["id"]}, "tokens": toks})
	if _, has := r["data"]; has {
		t.Errorf("ACKB with nothing ignored: %v", r)
	}
	wantUndefined(t, "ACKB answer id", r["id"])
	if got := c.fail(M{"cmd": "ACKB", "ids": []any{"a", "b"}, "tokens": []any{"x"}}); got != "ACKB tokens length must match ids length" {
		t.Errorf("length mismatch: %q", got)
	}
}

// ===========================================================================
// 12. WaitJob

func TestServerWaitJob(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	w := dial(t, ts.addr)
	id := push(t, c, "wj", nil)

	wid, wch := w.send(M{"cmd": "WaitJob", "id": id, "timeout": 20000})
	w.ok(M{"cmd": "Ping"}) // the WaitJob was read and waits
	select {
	case a := <-wch:
		t.Fatalf("WaitJob answered before the job finished: %v", a)
	default:
	}
	_, tok := pullOwned(t, c, "wj", nil)
	c.ok(M{"cmd": "ACK", "id": id, "token": tok, "result": M{"done": true}})
	a := w.await(wid, wch, callTimeout)
	if a["ok"] != true || a["completed"] != true || !reflect.DeepEqual(a["result"], M{"done": true}) {
		t.Fatalf("WaitJob: %v", a)
	}
	// Already completed: answered at once.
	if a := w.ok(M{"cmd": "WaitJob", "id": id, "timeout": 100}); a["completed"] != true {
		t.Errorf("WaitJob on a completed job: %v", a)
	}

	id2 := push(t, c, "wj", nil)
	start := time.Now()
	a = w.ok(M{"cmd": "WaitJob", "id": id2, "timeout": 200})
	if a["completed"] != false {
		t.Errorf("WaitJob timeout: %v", a)
	}
	if _, has := a["result"]; has {
		t.Errorf("WaitJob timeout has a result key: %v", a)
	}
	if el := time.Since(start); el < 190*time.Millisecond {
		t.Errorf("WaitJob timed out after %v, before its 200ms", el)
	}
	if got := w.fail(M{"cmd": "WaitJob", "id": "no-such-job", "timeout": 100}); got != "Job not found" {
		t.Errorf("WaitJob unknown: %q", got)
	}
}

// ===========================================================================
// 13. Events

func TestServerEvents(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	s := dial(t, ts.addr)
	c := dial(t, ts.addr)
	wantUndefined(t, "SubscribeEvents answer id", s.ok(M{"cmd": "SubscribeEvents", "queue": "ev"})["id"])

	push(t, c, "ev-other", nil) // another queue: not delivered
	id := push(t, c, "ev", nil)
	_, tok := pullOwned(t, c, "ev", nil)
	c.ok(M{"cmd": "ACK", "id": id, "token": tok, "result": M{"r": 1}})

	for _, want := range []string{"pushed", "pulled", "completed"} {
		ev := s.event(callTimeout)
		if ev["eventType"] != want || ev["queue"] != "ev" {
			t.Fatalf("event %v, want %s on ev", ev, want)
		}
		if jid, ok := ev["jobId"].(string); !ok || jid != id {
			t.Errorf("%s jobId = %#v, want %q", want, ev["jobId"], id)
		}
		if !isNum(ev["timestamp"]) || num(t, ev["timestamp"]) <= 0 {
			t.Errorf("%s timestamp = %#v", want, ev["timestamp"])
		}
		if want == "completed" && !reflect.DeepEqual(ev["data"], M{"r": int64(1)}) {
			t.Errorf("completed data = %#v", ev["data"])
		}
	}

	// Unsubscribed: nothing more arrives. A later subscription's first
	// event is that of a later push: one queue's events come in order, so
	// an event of the push made while unsubscribed would have come first.
	s.ok(M{"cmd": "UnsubscribeEvents"})
	push(t, c, "ev", nil)
	s.ok(M{"cmd": "SubscribeEvents", "queue": "ev"})
	mark := push(t, c, "ev", nil)
	if ev := s.event(callTimeout); ev["eventType"] != "pushed" || ev["jobId"] != mark {
		t.Errorf("event after UnsubscribeEvents: %v (the later push was %s)", ev, mark)
	}
}

// ===========================================================================
// 14. Graceful shutdown and goroutine leaks

// Serial: it counts the process's goroutines.
func TestServerGracefulShutdownNoLeaks(t *testing.T) {
	runtime.GC()
	base := runtime.NumGoroutine()

	ts := startServer(t, nil)
	c1 := dial(t, ts.addr)
	c2 := dial(t, ts.addr)
	c3 := dial(t, ts.addr)

	pid, pch := c1.send(M{"cmd": "PULL", "queue": "sd", "owner": "w", "timeout": 30000})
	c1.ok(M{"cmd": "Ping"}) // the long poll is waiting
	id := push(t, c2, "sd-wait", nil)
	wid, wch := c2.send(M{"cmd": "WaitJob", "id": id, "timeout": 30000})
	c2.ok(M{"cmd": "Ping"}) // so is the WaitJob
	c3.ok(M{"cmd": "SubscribeEvents", "queue": "sd"})
	push(t, c3, "sd-other", nil)
	pullOwned(t, c3, "sd-other", nil) // a held job, released at close

	start := time.Now()
	if !ts.stop(10 * time.Second) {
		t.Fatal("runServer did not return within 10s of cancel")
	}
	t.Logf("runServer returned %v after cancel", time.Since(start))
	if ts.err != nil {
		t.Errorf("runServer: %v", ts.err)
	}

	// Pending requests end with empty answers (or the connection closes).
	if a, err := c1.wait(pid, pch, callTimeout); err == nil {
		if _, has := a["token"]; a["ok"] != true || a["job"] != nil || !has {
			t.Errorf("pending PULL answered %v, want an empty answer", a)
		}
	} else if !c1.closedByPeer(0) {
		t.Errorf("pending PULL: %v", err)
	}
	if a, err := c2.wait(wid, wch, callTimeout); err == nil {
		if a["ok"] != true || a["completed"] != false {
			t.Errorf("pending WaitJob answered %v, want completed:false", a)
		}
	} else if !c2.closedByPeer(0) {
		t.Errorf("pending WaitJob: %v", err)
	}
	for i, c := range []*tclient{c1, c2, c3} {
		if !c.closedByPeer(callTimeout) {
			t.Errorf("connection %d still open after shutdown", i+1)
		}
		c.close()
	}
	if nc, err := dialRaw(ts.addr); err == nil {
		nc.Close()
		t.Error("the server still accepts connections after shutdown")
	}

	var now int
	eventually(t, 10*time.Second, "goroutines back to their count before the server", func() (bool, string) {
		now = runtime.NumGoroutine()
		return now <= base+1, fmt.Sprintf("%d goroutines, %d before\n%s", now, base, goroutineDump())
	})
	t.Logf("goroutines: %d before the server, %d after", base, now)
}

// goroutineDump returns the stacks of the goroutines running package code.
func goroutineDump() string {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	var keep []string
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		if strings.Contains(g, "main.") && !strings.Contains(g, "testing.tRunner") {
			keep = append(keep, g)
		}
	}
	return strings.Join(keep, "\n\n")
}

// ===========================================================================
// Concurrency

func TestServerConcurrentPushPullAck(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{shards: 4})
	const (
		total   = 5000
		pushers = 4
		pullers = 6
		q       = "conc"
	)
	conns := make([]*tclient, 3)
	for i := range conns {
		conns[i] = dial(t, ts.addr)
	}
	var (
		pushed   sync.Map
		acked    sync.Map
		nAcked   atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
	)
	fail := func(err error) { firstErr.CompareAndSwap(nil, err) }
	failed := func() bool { return firstErr.Load() != nil }
	deadline := time.Now().Add(60 * time.Second)

	for p := 0; p < pushers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			c := conns[p%len(conns)]
			for k := 0; k < total/pushers && !failed(); k++ {
				a, err := c.do(M{"cmd": "PUSH", "queue": q, "data": M{"p": p, "k": k}}, callTimeout)
				if err != nil {
					fail(err)
					return
				}
				id, ok := a["id"].(string)
				if a["ok"] != true || !ok {
					fail(fmt.Errorf("PUSH: %v", a))
					return
				}
				if _, dup := pushed.LoadOrStore(id, true); dup {
					fail(fmt.Errorf("PUSH returned id %s twice", id))
					return
				}
			}
		}(p)
	}
	record := func(id string) {
		if _, dup := acked.LoadOrStore(id, true); dup {
			fail(fmt.Errorf("job %s acked twice", id))
		}
		nAcked.Add(1)
	}
	for w := 0; w < pullers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := conns[w%len(conns)]
			owner := fmt.Sprintf("worker-%d", w)
			batch := w%2 == 1 // half the workers use PULLB/ACKB
			for nAcked.Load() < total && !failed() {
				if time.Now().After(deadline) {
					fail(fmt.Errorf("worker %d: only %d of %d acked in time", w, nAcked.Load(), total))
					return
				}
				if !batch {
					a, err := c.do(M{"cmd": "PULL", "queue": q, "owner": owner, "timeout": 100}, callTimeout)
					if err != nil {
						fail(err)
						return
					}
					if a["ok"] != true {
						fail(fmt.Errorf("PULL: %v", a))
						return
					}
					j, ok := a["job"].(M)
					if !ok {
						continue
					}
					id := j["id"].(string)
					r, err := c.do(M{"cmd": "ACK", "id": id, "token": a["token"], "result": id}, callTimeout)
					if err != nil {
						fail(err)
						return
					}
					if _, has := r["data"]; r["ok"] != true || has {
						fail(fmt.Errorf("ACK %s: %v", id, r))
						return
					}
					record(id)
					continue
				}
				a, err := c.do(M{"cmd": "PULLB", "queue": q, "owner": owner, "count": 7, "timeout": 100}, callTimeout)
				if err != nil {
					fail(err)
					return
				}
				jobs, _ := a["jobs"].([]any)
				toks, _ := a["tokens"].([]any)
				if a["ok"] != true || len(jobs) != len(toks) {
					fail(fmt.Errorf("PULLB: %v", a))
					return
				}
				if len(jobs) == 0 {
					continue
				}
				ids := make([]any, len(jobs))
				for i, j := range jobs {
					ids[i] = j.(M)["id"]
				}
				r, err := c.do(M{"cmd": "ACKB", "ids": ids, "tokens": toks}, callTimeout)
				if err != nil {
					fail(err)
					return
				}
				if _, has := r["data"]; r["ok"] != true || has {
					fail(fmt.Errorf("ACKB: %v", r))
					return
				}
				for _, id := range ids {
					record(id.(string))
				}
			}
		}(w)
	}
	wg.Wait()
	if err := firstErr.Load(); err != nil {
		t.Fatal(err)
	}
	if n := nAcked.Load(); n != total {
		t.Fatalf("acked %d, want %d", n, total)
	}
	nPushed, missing := 0, 0
	pushed.Range(func(k, _ any) bool {
		nPushed++
		if _, ok := acked.Load(k); !ok {
			missing++
		}
		return true
	})
	if nPushed != total || missing != 0 {
		t.Fatalf("%d jobs pushed, %d of them never acked", nPushed, missing)
	}
	c := conns[0]
	cnt := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": q}), "counts")
	for k, want := range map[string]float64{"completed": total, "waiting": 0, "active": 0, "delayed": 0, "failed": 0} {
		if num(t, cnt[k]) != want {
			t.Errorf("counts[%s] = %v, want %v", k, cnt[k], want)
		}
	}
	m := sub(t, c.ok(M{"cmd": "Metrics"}), "metrics")
	if num(t, m["totalPushed"]) != total || num(t, m["totalCompleted"]) != total || num(t, m["totalPulled"]) != total {
		t.Errorf("metrics: %v", m)
	}
}

// ===========================================================================
// Regressions: each of these failed before its fix.

// A JavaScript Date in job data arrives as the MessagePack timestamp ext
// (type -1), as msgpackr packs it for queue.add('x', {when: new Date()}).
// The reference accepts it and so must queued, giving the value back as
// sent. (It was refused when ParseMap rejected every ext value.)
func TestProtoExtTimestampInJobData(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)

	// The exact request the reference answered ok:true.
	body := []byte{0x83, 0xa3, 'c', 'm', 'd', 0xa4, 'P', 'i', 'n', 'g', 0xa5, 'r', 'e', 'q', 'I', 'd',
		0xa4, 'e', 'x', 't', '2', 0xa1, 'x', 0xd6, 0xff, 0x65, 0x00, 0x00, 0x00}
	id, ch := c.prepare(M{"reqId": "ext2"})
	c.writeRaw(rawFrame(body))
	if a := c.await(id, ch, callTimeout); a["ok"] != true {
		t.Errorf("Ping with a timestamp ext value: got %v; the reference answers ok:true", a)
	}

	// Job data holding a Date, as msgpackr packs {when: new Date(1700000000000)}.
	// (reqId first, so that a refusal is still matched to the request)
	date := Ext{Type: -1, Data: []byte{0x65, 0x53, 0xf1, 0x00}}
	pid, pch := c.prepare(M{"reqId": "push-date"})
	c.writeRaw(orderedFrame("reqId", pid, "cmd", "PUSH", "queue", "dates", "data", M{"when": date}))
	a := c.await(pid, pch, callTimeout)
	if a["ok"] != true {
		t.Fatalf("PUSH with a Date in its data: got %v, want ok:true", a)
	}
	j := job(t, c.ok(M{"cmd": "GetJob", "id": a["id"]}))
	if !reflect.DeepEqual(j["data"], M{"when": date}) {
		t.Errorf("data = %#v, want the Date back as sent", j["data"])
	}
}

// A complete request that arrives with the first bytes of the next frame
// is answered at once, not when the rest of that frame arrives. (Answers
// were flushed only when the read buffer was empty.)
func TestProtoPartialFrameDoesNotHoldAnswers(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	first := M{"cmd": "Ping"}
	second := M{"cmd": "Ping"}
	id, ch := c.prepare(first)
	sid, sch := c.prepare(second)
	next := frame(second)
	c.writeRaw(append(frame(first), next[:2]...))
	_, err := c.wait(id, ch, 2*time.Second)
	c.writeRaw(next[2:]) // lets a held answer out either way
	if err != nil {
		t.Errorf("a complete Ping followed by 2 bytes of another frame: %v", err)
	}
	c.await(sid, sch, callTimeout)
}

// A client that stops reading its answers cannot hold up a shutdown: its
// blocked write gives up after a grace period. (Shutdown waited forever.)
func TestServerShutdownWithSlowReader(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	id := push(t, c, "slow", M{"data": strings.Repeat("x", 1<<20)})

	// Ask for ~64 MiB of answers and read none of them.
	nc, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var buf bytes.Buffer
	for i := 0; i < 64; i++ {
		buf.Write(frame(M{"cmd": "GetJob", "id": id, "reqId": fmt.Sprint(i)}))
	}
	nc.SetWriteDeadline(time.Now().Add(callTimeout))
	if _, err := nc.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	// The server has filled the socket buffers: its write of an answer
	// waits for the client to read.
	eventually(t, 20*time.Second, "the server's write blocked", func() (bool, string) {
		n := blockedIn("IO wait", ".(*conn).writeBig")
		return n > 0, fmt.Sprint(n, " writes blocked")
	})

	returned := ts.stop(5 * time.Second)
	nc.Close() // unblocks the server's write, so that cleanup can finish
	if !returned {
		t.Errorf("runServer did not return within 5s of cancel while a client was not reading its answers")
	}
}

// The reference keeps the last 50,000 completed jobs of the whole server;
// one queue, living in one shard, must be able to keep them all. (The bound
// was split per shard: 1,000 completions read back as 763 with 64 shards.)
func TestServerCompletedRetentionAcrossShards(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{shards: 64})
	c := dial(t, ts.addr)
	const n, q = 1000, "retention"
	var first string
	for done := 0; done < n; {
		jobs := make([]any, 100)
		for i := range jobs {
			jobs[i] = M{"name": "j"}
		}
		ids := list(t, c.ok(M{"cmd": "PUSHB", "queue": q, "jobs": jobs}), "ids")
		if first == "" {
			first = ids[0].(string)
		}
		pulled := list(t, c.ok(M{"cmd": "PULLB", "queue": q, "count": 100}), "jobs")
		pids := make([]any, len(pulled))
		for i, j := range pulled {
			pids[i] = j.(M)["id"]
		}
		c.ok(M{"cmd": "ACKB", "ids": pids})
		done += len(pids)
	}
	cnt := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": q}), "counts")
	if got := num(t, cnt["completed"]); got != n {
		t.Errorf("GetJobCounts completed = %v after %d completions in one queue, want %d", got, n, n)
	}
	if st := state(t, c, first); st != "completed" {
		t.Errorf("the first completed job reads %q, want completed", st)
	}
}

// TestServeAfterClose: a server closed before it served returns from
// Serve at once and closes the listener (a test that ended before its
// server's goroutine started waited for Serve for ever).
func TestServeAfterClose(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	srv := memServer(b, nil, quietLog())
	srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case <-done:
	case <-time.After(callTimeout):
		t.Fatal("Serve after Close did not return")
	}
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Fatal("the listener is still open")
	}
}

// TestEncFreeListBounded: the encoders kept for asynchronous answers are
// reused, emptied, and bounded: none bigger than asyncEncKeepBytes, and
// no more than asyncEncsKeptBytes of them in all.
func TestEncFreeListBounded(t *testing.T) {
	t.Parallel()
	var l encFreeList
	e := l.get()
	e.B = append(e.B, "answer"...)
	l.put(e)
	if got := l.get(); got != e || len(got.B) != 0 {
		t.Fatalf("a kept encoder is not handed back empty: %p %p %q", got, e, got.B)
	}
	l.put(&Enc{B: make([]byte, 0, asyncEncKeepBytes+1)})
	if l.bytes != 0 || len(l.free) != 0 {
		t.Fatalf("an encoder over %d bytes was kept (%d bytes kept)", asyncEncKeepBytes, l.bytes)
	}
	for range 2 * asyncEncsKeptBytes / asyncEncKeepBytes {
		l.put(&Enc{B: make([]byte, 0, asyncEncKeepBytes)})
	}
	if l.bytes != asyncEncsKeptBytes || len(l.free) != asyncEncsKeptBytes/asyncEncKeepBytes {
		t.Fatalf("%d encoders of %d bytes kept, want %d bytes in all", len(l.free), l.bytes, asyncEncsKeptBytes)
	}
	for len(l.free) > 0 {
		l.get()
	}
	if l.bytes != 0 {
		t.Fatalf("%d bytes counted with nothing kept", l.bytes)
	}
	if e := l.get(); cap(e.B) != asyncEncInitialSize {
		t.Fatalf("a new encoder has %d bytes, want %d", cap(e.B), asyncEncInitialSize)
	}
}
