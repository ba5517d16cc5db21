package main

// The live-event catalogue end to end: commands over the wire protocol,
// a WebSocket subscribed to "*" and an SSE stream reading the notices in
// the reference's names and shapes.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"testing"
	"time"
)

// liveWatch collects the tagged messages of a WebSocket subscribed to
// patterns, in the background.
type liveWatch struct {
	t    testing.TB
	msgs chan map[string]any
	seen []map[string]any
}

func watchLive(t testing.TB, httpAddr, path string, patterns ...string) *liveWatch {
	t.Helper()
	ws := dialWS(t, httpAddr, path)
	list, _ := json.Marshal(patterns)
	ws.text(`{"cmd":"Subscribe","events":` + string(list) + `,"reqId":"sub"}`)
	if m := ws.wsJSON(); m["ok"] != true {
		t.Fatalf("Subscribe answered %v", m)
	}
	w := &liveWatch{t: t, msgs: make(chan map[string]any, 4096)}
	go func() {
		defer close(w.msgs)
		for {
			f, err := ws.read()
			if err != nil {
				return
			}
			if f.op != 0x1 {
				continue
			}
			var m map[string]any
			if json.Unmarshal(f.payload, &m) == nil {
				w.msgs <- m
			}
		}
	}()
	t.Cleanup(func() { ws.nc.Close() })
	return w
}

// expect waits for an event named name whose data has the given fields
// (numbers as float64), and returns its data.
func (w *liveWatch) expect(name string, fields map[string]any) map[string]any {
	w.t.Helper()
	match := func(m map[string]any) (map[string]any, bool) {
		if m["event"] != name {
			return nil, false
		}
		d, _ := m["data"].(map[string]any)
		for k, v := range fields {
			if fmt.Sprint(d[k]) != fmt.Sprint(v) {
				return nil, false
			}
		}
		return d, true
	}
	for _, m := range w.seen {
		if d, ok := match(m); ok {
			return d
		}
	}
	deadline := time.After(wsTestTimeout)
	for {
		select {
		case m, ok := <-w.msgs:
			if !ok {
				w.t.Fatalf("the WebSocket closed before %s %v", name, fields)
			}
			w.seen = append(w.seen, m)
			if d, ok := match(m); ok {
				return d
			}
		case <-deadline:
			w.t.Fatalf("no %s with %v; seen: %v", name, fields, w.names())
		}
	}
}

// countWhere is how many events named name, with data of the given
// fields, have been seen.
func (w *liveWatch) countWhere(name string, fields map[string]any) int {
	n := 0
	for _, m := range w.seen {
		d, _ := m["data"].(map[string]any)
		if m["event"] != name {
			continue
		}
		match := true
		for k, v := range fields {
			if fmt.Sprint(d[k]) != fmt.Sprint(v) {
				match = false
			}
		}
		if match {
			n++
		}
	}
	return n
}

// expectCount waits until n events named name, with data of the given
// fields, have been seen.
func (w *liveWatch) expectCount(name string, fields map[string]any, n int) {
	w.t.Helper()
	deadline := time.After(wsTestTimeout)
	for w.countWhere(name, fields) < n {
		select {
		case m, ok := <-w.msgs:
			if !ok {
				w.t.Fatalf("the WebSocket closed before %d of %s %v", n, name, fields)
			}
			w.seen = append(w.seen, m)
		case <-deadline:
			w.t.Fatalf("%d of %s with %v, want %d; seen: %v", w.countWhere(name, fields), name, fields, n, w.names())
		}
	}
}

// names lists the events seen so far.
func (w *liveWatch) names() []string {
	var out []string
	for _, m := range w.seen {
		out = append(out, fmt.Sprint(m["event"]))
	}
	return out
}

// settle waits for a marker's notice (a webhook added and removed through
// c): every notice announced before it has been seen.
func (w *liveWatch) settle(c *tclient) {
	w.t.Helper()
	w.expect("webhook:removed", map[string]any{"id": markerHook(w.t, c)})
}

// absent checks that no event named name was announced before now.
func (w *liveWatch) absent(name string, c *tclient) {
	w.t.Helper()
	w.settle(c)
	if n := w.count(name); n > 0 {
		w.t.Fatalf("%s was announced %d times", name, n)
	}
}

// count is how many events named name have been seen.
func (w *liveWatch) count(name string) int {
	n := 0
	for _, m := range w.seen {
		if m["event"] == name {
			n++
		}
	}
	return n
}

// TestLiveCatalogCommands: each command of the catalogue announces its
// notice, with the reference's fields, and only when the reference does.
func TestLiveCatalogCommands(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{webhookAllowPrivate: true})
	w := watchLive(t, ts.http, "/ws/queues/other", "*")
	sse := dialSSE(t, ts.http, "/events/queues/other")
	c := dial(t, ts.addr)

	// Queues. A per-queue stream gets them all: only job events are
	// filtered by queue, as in the reference.
	c.ok(M{"cmd": "Pause", "queue": "cq"})
	w.expect("queue:paused", M{"queue": "cq"})
	c.ok(M{"cmd": "Resume", "queue": "cq"})
	w.expect("queue:resumed", M{"queue": "cq"})
	c.ok(M{"cmd": "Drain", "queue": "cq"})
	w.absent("queue:drained", c) // nothing drained, nothing said
	for i := 0; i < 3; i++ {
		c.ok(M{"cmd": "PUSH", "queue": "cq", "data": M{"i": i}})
	}
	c.ok(M{"cmd": "Drain", "queue": "cq"})
	w.expect("queue:drained", M{"queue": "cq", "count": 3})
	c.ok(M{"cmd": "PUSH", "queue": "cq", "data": M{}})
	c.ok(M{"cmd": "Clean", "queue": "cq", "grace": 0, "state": "wait"})
	w.expect("queue:cleaned", M{"queue": "cq", "state": "wait", "count": 1})
	c.ok(M{"cmd": "Obliterate", "queue": "cq"})
	w.expect("queue:obliterated", M{"queue": "cq"})
	w.expect("queue:removed", M{"queue": "cq"})

	// Moves by hand: the job id as the command named it, no queue.
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "mv", "data": M{}, "delay": 60000}), "id")
	c.ok(M{"cmd": "ChangeDelay", "id": id, "delay": 30000})
	w.expect("job:delay-changed", M{"jobId": id, "newDelay": 30000})
	c.ok(M{"cmd": "Promote", "id": id})
	w.expect("job:promoted", M{"jobId": id})
	c.ok(M{"cmd": "ChangePriority", "id": id, "priority": 7})
	w.expect("job:priority-changed", M{"jobId": id, "newPriority": 7})
	c.ok(M{"cmd": "Update", "id": id, "data": M{"v": 2}})
	w.expect("job:data-updated", M{"jobId": id})
	c.ok(M{"cmd": "MoveToDelayed", "id": id, "delay": 5000})
	w.expect("job:moved-to-delayed", M{"jobId": id, "delay": 5000})
	c.ok(M{"cmd": "Discard", "id": id})
	w.expect("job:discarded", M{"jobId": id})
	c.fail(M{"cmd": "Promote", "id": "no-such-job"})
	w.settle(c)
	if n := w.count("job:promoted"); n != 1 {
		t.Errorf("job:promoted announced %d times; a Promote that failed announces nothing", n)
	}

	// Limits and policies.
	c.ok(M{"cmd": "RateLimit", "queue": "lim", "limit": 5, "duration": 2000})
	d := w.expect("ratelimit:set", M{"queue": "lim", "max": 5, "duration": 2000})
	if _, ok := d["ttl"]; ok {
		t.Errorf("ratelimit:set has a ttl the command did not send: %v", d)
	}
	c.ok(M{"cmd": "RateLimitClear", "queue": "lim"})
	w.expect("ratelimit:cleared", M{"queue": "lim"})
	c.ok(M{"cmd": "SetConcurrency", "queue": "lim", "limit": 3})
	w.expect("concurrency:set", M{"queue": "lim", "concurrency": 3})
	c.ok(M{"cmd": "ClearConcurrency", "queue": "lim"})
	w.expect("concurrency:cleared", M{"queue": "lim"})
	c.ok(M{"cmd": "SetStallConfig", "queue": "lim", "config": M{"maxStalls": 4}})
	d = w.expect("config:stall-changed", M{"queue": "lim"})
	if fmt.Sprint(d["config"]) != "map[maxStalls:4]" {
		t.Errorf("config:stall-changed config %v", d["config"])
	}
	c.ok(M{"cmd": "SetDlqConfig", "queue": "lim", "config": M{"maxEntries": 9}})
	d = w.expect("config:dlq-changed", M{"queue": "lim"})
	if fmt.Sprint(d["config"]) != "map[maxEntries:9]" {
		t.Errorf("config:dlq-changed config %v", d["config"])
	}

	// The DLQ: retries and purges announce what they moved.
	dead := func() string {
		id := str(t, c.ok(M{"cmd": "PUSH", "queue": "dq", "data": M{}, "maxAttempts": 1}), "id")
		job := jobj(t, c.ok(M{"cmd": "PULL", "queue": "dq"})["job"])
		if job["id"] != id {
			t.Fatalf("pulled %v, want %s", job["id"], id)
		}
		c.ok(M{"cmd": "FAIL", "id": id, "error": "boom"})
		return id
	}
	one := dead()
	c.ok(M{"cmd": "RetryDlq", "queue": "dq", "jobId": one})
	w.expect("dlq:retried", M{"queue": "dq", "count": 1, "jobId": one})
	c.ok(M{"cmd": "PULL", "queue": "dq"})
	c.ok(M{"cmd": "FAIL", "id": one, "error": "again"})
	dead()
	c.ok(M{"cmd": "RetryDlq", "queue": "dq"})
	w.expect("dlq:retry-all", M{"queue": "dq", "count": 2})
	for i := 0; i < 2; i++ {
		c.ok(M{"cmd": "PULL", "queue": "dq"})
	}
	c.ok(M{"cmd": "PurgeDlq", "queue": "dq"})
	w.absent("dlq:purged", c) // the two are active, not dead
	dead()
	c.ok(M{"cmd": "PurgeDlq", "queue": "dq"})
	w.expect("dlq:purged", M{"queue": "dq", "count": 1})

	// Cron.
	c.ok(M{"cmd": "Cron", "name": "nightly", "queue": "cr", "schedule": "0 3 * * *"})
	d = w.expect("cron:created", M{"name": "nightly", "queue": "cr", "pattern": "0 3 * * *"})
	if d["nextRun"] == nil || d["every"] != nil {
		t.Errorf("cron:created %v", d)
	}
	c.ok(M{"cmd": "Cron", "name": "nightly", "queue": "cr", "repeatEvery": 60000})
	w.expect("cron:updated", M{"name": "nightly", "every": 60000})
	c.ok(M{"cmd": "CronDelete", "name": "nightly"})
	w.expect("cron:deleted", M{"name": "nightly"})

	// Workers, and a connection's own.
	wc := dial(t, ts.addr)
	wd := jobj(t, wc.ok(M{"cmd": "RegisterWorker", "name": "w1", "queues": []any{"a", "b"}, "hostname": "h", "pid": 42})["data"])
	wid := fmt.Sprint(wd["workerId"])
	w.expect("worker:connected", M{"workerId": wid, "name": "w1", "hostname": "h", "pid": 42})
	wc.ok(M{"cmd": "Heartbeat", "id": wid})
	w.expect("worker:heartbeat", M{"workerId": wid})
	wc.ok(M{"cmd": "UnregisterWorker", "workerId": wid})
	w.expect("worker:disconnected", M{"workerId": wid})
	wd = jobj(t, wc.ok(M{"cmd": "RegisterWorker", "name": "w2", "queues": []any{"a"}})["data"])
	wid = fmt.Sprint(wd["workerId"])
	wc.close()
	gone := w.expect("worker:disconnected", M{"workerId": wid, "name": "w2"})
	client := fmt.Sprint(gone["clientId"])
	w.expect("client:disconnected", M{"clientId": client, "transport": "tcp"})
	w.expect("client:connected", M{"clientId": client, "transport": "tcp"})

	// Webhooks.
	hd := jobj(t, c.ok(M{"cmd": "AddWebhook", "url": "http://127.0.0.1:9/h", "events": []any{"job.failed"}})["data"])
	hid := fmt.Sprint(hd["webhookId"])
	d = w.expect("webhook:added", M{"id": hid, "url": "http://127.0.0.1:9/h"})
	if fmt.Sprint(d["events"]) != "[job.failed]" {
		t.Errorf("webhook:added events %v", d["events"])
	}
	c.ok(M{"cmd": "SetWebhookEnabled", "id": hid, "enabled": false})
	w.expect("webhook:disabled", M{"webhookId": hid})
	c.ok(M{"cmd": "SetWebhookEnabled", "id": hid, "enabled": false})
	c.ok(M{"cmd": "SetWebhookEnabled", "id": hid, "enabled": true})
	w.expect("webhook:enabled", M{"webhookId": hid})
	if n := w.count("webhook:disabled"); n != 1 {
		t.Errorf("webhook:disabled announced %d times; a second disable changes nothing", n)
	}

	// Batches.
	jobs := []any{M{"data": M{}}, M{"data": M{}, "customId": "dup-1"}, M{"data": M{}, "customId": "dup-1"}}
	c.ok(M{"cmd": "PUSHB", "queue": "bt", "jobs": jobs})
	w.expect("batch:pushed", M{"queue": "bt", "total": 3, "inserted": 2, "duplicates": 1})
	c.ok(M{"cmd": "PULLB", "queue": "bt", "count": 10})
	w.expect("batch:pulled", M{"queue": "bt", "count": 2})

	// Memory.
	c.ok(M{"cmd": "CompactMemory"})
	w.expect("memory:compacted", nil)

	// SSE streams carry the same notices, whatever queue they follow.
	for _, name := range []string{"queue:paused", "job:promoted", "cron:created", "worker:connected", "memory:compacted"} {
		ev := sse.nextNamed(name)
		if !strings.HasPrefix(ev.data, "{") {
			t.Errorf("SSE %s data %q", name, ev.data)
		}
	}
}

// TestLiveCatalogAuthFailed: a wrong token is announced, over TCP with
// the connection's id and over HTTP with the transport.
func TestLiveCatalogAuthFailed(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{authTokens: "right"})
	ws := rawHandshake(t, ts.http, wsRequest("/ws", "Authorization: Bearer right"))
	ws.text(`{"cmd":"Subscribe","events":["auth:*","client:connected"],"reqId":"s"}`)
	if m := ws.wsJSON(); m["ok"] != true {
		t.Fatalf("Subscribe answered %v", m)
	}
	c := dial(t, ts.addr)
	c.fail(M{"cmd": "Auth", "token": "wrong"})
	conn := ws.wsUntil("client:connected", func(m map[string]any) bool { return m["event"] == "client:connected" })
	m := ws.wsUntil("auth:failed", func(m map[string]any) bool { return m["event"] == "auth:failed" })
	if jobj(t, m["data"])["clientId"] != jobj(t, conn["data"])["clientId"] {
		t.Errorf("auth:failed %v, connection %v", m, conn)
	}
	req, _ := http.NewRequest("GET", "http://"+ts.http+"/stats", nil)
	req.Header.Set("Authorization", "Bearer wrong")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("GET /stats with a wrong token: %d", resp.StatusCode)
	}
	m = ws.wsUntil("auth:failed over HTTP", func(m map[string]any) bool { return m["event"] == "auth:failed" })
	if jobj(t, m["data"])["transport"] != "http" {
		t.Errorf("auth:failed over HTTP %v", m)
	}
}

// TestLiveCatalogNames keeps the catalogue the reference's: every name
// Subscribe takes, sorted, by family.
func TestLiveCatalogNames(t *testing.T) {
	t.Parallel()
	var names []string
	for p := range wsValidPatterns {
		names = append(names, p)
	}
	sort.Strings(names)
	if len(names) != 106 {
		t.Errorf("%d names and patterns, the reference has 106", len(names))
	}
	for _, n := range names {
		if n != "*" && !strings.Contains(n, ":") {
			t.Errorf("pattern %q has no family", n)
		}
	}
}

// catalogMode is a storage mode's servers: act is acted on, watch is
// watched, and another starts one more broker of the same storage
// (PostgreSQL mode only; nil otherwise).
type catalogMode struct {
	act, watch *serverProc
	another    func() *serverProc
}

// catalogModes are the storage modes the engine notices are proven in:
// each starts server subprocesses (in PostgreSQL mode, two brokers of one
// namespace: what one broker's engine does must reach the other's
// subscribers, once).
func catalogModes() map[string]func(t *testing.T) catalogMode {
	return map[string]func(t *testing.T) catalogMode{
		"memory": func(t *testing.T) catalogMode {
			p := startBinary(t, "--memory", "--webhook-allow-private")
			return catalogMode{act: p, watch: p}
		},
		"sqlite": func(t *testing.T) catalogMode {
			p := startBinary(t, "--data-path", t.TempDir()+"/q.db", "--webhook-allow-private")
			return catalogMode{act: p, watch: p}
		},
		"postgres": func(t *testing.T) catalogMode {
			ns := pgTestNamespace(t)
			start := func() *serverProc {
				return startBinary(t, "--postgres-url", testPGURL(), "--postgres-namespace", ns, "--webhook-allow-private")
			}
			return catalogMode{act: start(), watch: start(), another: start}
		},
	}
}

// TestLiveCatalogEngine: what the engines' own work announces (a job
// dead-lettered, timed out, expired, a flow completed, a cron run, ...),
// in every storage mode.
func TestLiveCatalogEngine(t *testing.T) {
	t.Parallel()
	for mode, start := range catalogModes() {
		t.Run(mode, func(t *testing.T) {
			m := start(t)
			w := watchLive(t, fmt.Sprintf("127.0.0.1:%d", m.watch.httpPort), "/ws", "*")
			c := dial(t, m.act.addr())
			catalogEngineScript(t, c, w)
			if m.another == nil {
				return
			}
			// A broker that starts tells the others.
			third := m.another()
			w.expect("server:started", M{"tcpPort": third.tcpPort})
			// Each notice reached the watching broker once.
			counts := map[string]int{}
			for _, e := range w.seen {
				if d, ok := e["data"].(map[string]any); ok && e["event"] == "queue:created" {
					counts[fmt.Sprint(d["queue"])]++
				}
			}
			for q, n := range counts {
				if n != 1 {
					t.Errorf("queue:created for %s reached the other broker %d times", q, n)
				}
			}
		})
	}
}

func catalogEngineScript(t *testing.T, c *tclient, w *liveWatch) {
	// A new queue, and a job that waits for another.
	dep := str(t, c.ok(M{"cmd": "PUSH", "queue": "e-deps", "data": M{}}), "id")
	w.expect("queue:created", M{"queue": "e-deps"})
	waiter := str(t, c.ok(M{"cmd": "PUSH", "queue": "e-deps", "data": M{}, "dependsOn": []any{dep}}), "id")
	d := w.expect("job:waiting-children", M{"jobId": waiter, "queue": "e-deps"})
	if fmt.Sprint(d["dependsOn"]) != "["+dep+"]" {
		t.Errorf("job:waiting-children dependsOn %v", d["dependsOn"])
	}
	if got := jobj(t, c.ok(M{"cmd": "PULL", "queue": "e-deps"})["job"])["id"]; got != dep {
		t.Fatalf("pulled %v, want %s", got, dep)
	}
	c.ok(M{"cmd": "ACK", "id": dep})
	w.expect("job:dependencies-resolved", M{"jobId": waiter, "queue": "e-deps"})

	// Dead-lettered, with the reason.
	dead := str(t, c.ok(M{"cmd": "PUSH", "queue": "e-dlq", "data": M{}, "maxAttempts": 1}), "id")
	c.ok(M{"cmd": "PULL", "queue": "e-dlq"})
	c.ok(M{"cmd": "FAIL", "id": dead, "error": "boom"})
	w.expect("dlq:added", M{"queue": "e-dlq", "jobId": dead, "reason": "max_attempts_exceeded"})

	// A job past its timeout, and one whose lock lapsed.
	slow := str(t, c.ok(M{"cmd": "PUSH", "queue": "e-time", "data": M{}, "timeout": 300}), "id")
	c.ok(M{"cmd": "PULL", "queue": "e-time"})
	w.expect("job:timeout", M{"jobId": slow, "queue": "e-time", "timeout": 300})
	held := str(t, c.ok(M{"cmd": "PUSH", "queue": "e-lock", "data": M{}}), "id")
	c.ok(M{"cmd": "PULL", "queue": "e-lock", "owner": "w", "lockTtl": 300})
	w.expect("job:lock-expired", M{"jobId": held, "queue": "e-lock", "renewalCount": 0})

	// A job whose ttl ran out while it waited.
	old := str(t, c.ok(M{"cmd": "PUSH", "queue": "e-ttl", "data": M{}, "ttl": 50}), "id")
	// The clock past the ttl, with room for a broker's reading of the
	// database's clock.
	made := int64(num(t, jobj(t, c.ok(M{"cmd": "GetJob", "id": old})["job"])["createdAt"]))
	clockPast(t, nowMs, made+150)
	c.ok(M{"cmd": "PULL", "queue": "e-ttl"})
	w.expect("job:expired", M{"jobId": old, "queue": "e-ttl", "ttl": 50})

	// Deduplication, by default and extending the hold.
	first := str(t, c.ok(M{"cmd": "PUSH", "queue": "e-dup", "data": M{}, "uniqueKey": "k"}), "id")
	c.ok(M{"cmd": "PUSH", "queue": "e-dup", "data": M{}, "uniqueKey": "k"})
	w.expect("job:deduplicated", M{"queue": "e-dup", "jobId": first, "strategy": "default"})
	ext := M{"ttl": 60000, "extend": true}
	kept := str(t, c.ok(M{"cmd": "PUSH", "queue": "e-dup", "data": M{}, "uniqueKey": "x", "dedup": ext}), "id")
	c.ok(M{"cmd": "PUSH", "queue": "e-dup", "data": M{}, "uniqueKey": "x", "dedup": ext})
	w.expect("job:deduplicated", M{"queue": "e-dup", "jobId": kept, "strategy": "extend"})

	// Flows: the last child completes the parent; a child dead-lettered
	// fails it.
	flow := func(parent, child string, childOpts M) {
		in := M{"parentId": parent, "data": M{"__parentId": parent, "__parentQueue": "e-flow"}}
		for k, v := range childOpts {
			in[k] = v
		}
		c.ok(M{"cmd": "PUSHF", "jobs": []any{
			M{"id": child, "queue": "e-kids", "input": in},
			M{"id": parent, "queue": "e-flow", "input": M{"dependsOn": []any{child}, "childrenIds": []any{child}, "data": M{}}},
		}})
	}
	flow("par-ok", "kid-ok", nil)
	w.expect("flow:pushed", M{"jobs": 2, "queues": 2})
	c.ok(M{"cmd": "PULL", "queue": "e-kids"})
	c.ok(M{"cmd": "ACK", "id": "kid-ok", "result": "done"})
	w.expect("flow:completed", M{"parentJobId": "par-ok", "queue": "e-flow", "childrenCount": 1})
	flow("par-bad", "kid-bad", M{"maxAttempts": 1})
	c.ok(M{"cmd": "PULL", "queue": "e-kids"})
	c.ok(M{"cmd": "FAIL", "id": "kid-bad", "error": "kid broke"})
	w.expect("flow:failed", M{"parentJobId": "par-bad", "failedChildId": "kid-bad", "queue": "e-kids", "error": "kid broke"})

	// Limits holding a ready job back.
	c.ok(M{"cmd": "SetConcurrency", "queue": "e-conc", "limit": 1})
	for i := 0; i < 2; i++ {
		c.ok(M{"cmd": "PUSH", "queue": "e-conc", "data": M{}})
	}
	c.ok(M{"cmd": "PULL", "queue": "e-conc"})
	c.ok(M{"cmd": "PULL", "queue": "e-conc"})
	w.expect("concurrency:rejected", M{"queue": "e-conc"})
	c.ok(M{"cmd": "RateLimit", "queue": "e-rate", "limit": 1, "duration": 60000})
	for i := 0; i < 2; i++ {
		c.ok(M{"cmd": "PUSH", "queue": "e-rate", "data": M{}})
	}
	c.ok(M{"cmd": "PULL", "queue": "e-rate"})
	c.ok(M{"cmd": "PULL", "queue": "e-rate"})
	w.expect("ratelimit:rejected", M{"queue": "e-rate"})

	// The DLQ's own time: an auto-retry, and an entry past its age.
	c.ok(M{"cmd": "SetDlqConfig", "queue": "e-auto", "config": M{"autoRetry": true, "autoRetryInterval": 200, "maxAutoRetries": 1}})
	auto := str(t, c.ok(M{"cmd": "PUSH", "queue": "e-auto", "data": M{}, "maxAttempts": 1}), "id")
	c.ok(M{"cmd": "PULL", "queue": "e-auto"})
	c.ok(M{"cmd": "FAIL", "id": auto})
	w.expect("dlq:auto-retried", M{"queue": "e-auto", "count": 1})
	c.ok(M{"cmd": "SetDlqConfig", "queue": "e-age", "config": M{"maxAge": 200}})
	aged := str(t, c.ok(M{"cmd": "PUSH", "queue": "e-age", "data": M{}, "maxAttempts": 1}), "id")
	c.ok(M{"cmd": "PULL", "queue": "e-age"})
	c.ok(M{"cmd": "FAIL", "id": aged})
	w.expect("dlq:expired", M{"queue": "e-age", "count": 1})

	// Cron runs: fired, and skipped for want of a worker.
	c.ok(M{"cmd": "Cron", "name": "e-tick", "queue": "e-cron", "repeatEvery": 200, "maxLimit": 1})
	w.expect("cron:fired", M{"name": "e-tick", "queue": "e-cron"})
	c.ok(M{"cmd": "Cron", "name": "e-idle", "queue": "e-cron-none", "repeatEvery": 200, "skipIfNoWorker": true})
	w.expect("cron:skipped", M{"name": "e-idle", "queue": "e-cron-none", "reason": "no-worker"})
	c.ok(M{"cmd": "CronDelete", "name": "e-idle"})

	// Webhook deliveries.
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer good.Close()
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }))
	defer bad.Close()
	okHook := fmt.Sprint(jobj(t, c.ok(M{"cmd": "AddWebhook", "url": good.URL, "events": []any{"job.pushed"}, "queue": "e-hook"})["data"])["webhookId"])
	badHook := fmt.Sprint(jobj(t, c.ok(M{"cmd": "AddWebhook", "url": bad.URL, "events": []any{"job.pushed"}, "queue": "e-hook"})["data"])["webhookId"])
	c.ok(M{"cmd": "PUSH", "queue": "e-hook", "data": M{}})
	w.expect("webhook:fired", M{"webhookId": okHook, "url": good.URL, "event": "job.pushed"})
	d = w.expect("webhook:failed", M{"webhookId": badHook, "url": bad.URL, "event": "job.pushed"})
	if d["error"] == nil {
		t.Errorf("webhook:failed without its error: %v", d)
	}
}

// TestLiveCatalogMonitor: the monitor's notices, with the reference's
// thresholds from the environment.
//
// Serial: it sets environment variables (t.Setenv).
func TestLiveCatalogMonitor(t *testing.T) {
	t.Setenv("QUEUE_IDLE_THRESHOLD_MS", "200")
	t.Setenv("QUEUE_SIZE_THRESHOLD", "3")
	t.Setenv("WORKER_OVERLOAD_THRESHOLD_MS", "200")
	t.Setenv("MEMORY_WARNING_MB", "1")
	ts := startServerHTTP(t, &config{webhookAllowPrivate: true,
		liveEvery: liveIntervals{stats: time.Hour, health: time.Hour, storage: time.Hour, monitor: 100 * time.Millisecond}})
	w := watchLive(t, ts.http, "/ws", "*")
	c := dial(t, ts.addr)
	// An active job keeps a queue busy; its job done, it goes idle.
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "m-idle", "data": M{}}), "id")
	c.ok(M{"cmd": "PULL", "queue": "m-idle"})
	// A queue gone idle after that job became active is told of twice:
	// more than two idle thresholds have passed, and the round that would
	// have told of m-idle (no later than m-ref's first) is over.
	ref := str(t, c.ok(M{"cmd": "PUSH", "queue": "m-ref", "data": M{}}), "id")
	c.ok(M{"cmd": "PULL", "queue": "m-ref"})
	c.ok(M{"cmd": "ACK", "id": ref})
	w.expectCount("queue:idle", M{"queue": "m-ref"}, 2)
	if n := w.countWhere("queue:idle", M{"queue": "m-idle"}); n > 0 {
		t.Fatalf("queue:idle was announced %d times for a queue with an active job", n)
	}
	c.ok(M{"cmd": "ACK", "id": id})
	d := w.expect("queue:idle", M{"queue": "m-idle"})
	if n, _ := d["idleSeconds"].(float64); n < 0 {
		t.Errorf("queue:idle %v", d)
	}
	for i := 0; i < 3; i++ {
		c.ok(M{"cmd": "PUSH", "queue": "m-big", "data": M{}})
	}
	w.expect("queue:threshold", M{"queue": "m-big", "size": 3, "threshold": 3})
	wd := jobj(t, c.ok(M{"cmd": "RegisterWorker", "name": "busy", "queues": []any{"m-big"}, "concurrency": 2})["data"])
	wid := fmt.Sprint(wd["workerId"])
	c.ok(M{"cmd": "Heartbeat", "id": wid, "activeJobs": 2})
	w.expect("worker:overloaded", M{"workerId": wid, "name": "busy", "activeJobs": 2, "concurrency": 2})
	d = w.expect("server:memory-warning", M{"thresholdMB": 1})
	if d["heapUsedMB"] == nil || d["rssMB"] == nil {
		t.Errorf("server:memory-warning %v", d)
	}
	// Said once while it holds: worker:overloaded, seen, took two rounds
	// begun after queue:threshold was seen, so a whole round has passed
	// since the one that told of it; one more of m-ref's notices (idle,
	// it is told of every other round) for good measure.
	w.expectCount("queue:idle", M{"queue": "m-ref"}, w.countWhere("queue:idle", M{"queue": "m-ref"})+1)
	w.settle(c)
	if n := w.count("queue:threshold"); n != 1 {
		t.Errorf("queue:threshold announced %d times while the queue stayed over it", n)
	}
}

// markerHook adds and removes a webhook: its webhook:removed is a marker
// in the stream.
func markerHook(t testing.TB, c *tclient) string {
	d := jobj(t, c.ok(M{"cmd": "AddWebhook", "url": "http://127.0.0.1:9/x", "events": []any{"job.completed"}})["data"])
	id := fmt.Sprint(d["webhookId"])
	c.ok(M{"cmd": "RemoveWebhook", "webhookId": id})
	return id
}

// TestLiveCatalogDocs: docs/http-api.md's catalogue names every event
// Subscribe takes.
func TestLiveCatalogDocs(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/http-api.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "\n### The event catalogue\n")
	if !ok {
		t.Fatal(`docs/http-api.md has no "### The event catalogue" section`)
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	for p := range wsValidPatterns {
		if strings.HasSuffix(p, "*") {
			continue
		}
		if !strings.Contains(sec, "`"+p+"`") {
			t.Errorf("%s is not in docs/http-api.md's event catalogue", p)
		}
	}
}

// TestLiveCatalogShutdown: subscribers hear the server go before their
// streams close.
func TestLiveCatalogShutdown(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	w := watchLive(t, ts.http, "/ws", "server:*")
	ts.cancel()
	w.expect("server:shutdown", M{"signal": "shutdown"})
}

// TestLiveCatalogStall: a stall, with its count and what became of the job.
func TestLiveCatalogStall(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	w := watchLive(t, ts.http, "/ws", "job:stalled")
	c := dial(t, ts.addr)
	c.ok(M{"cmd": "SetStallConfig", "queue": "st", "config": M{"stallInterval": 200, "gracePeriod": 0}})
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "st", "data": M{}, "stallTimeout": 200}), "id")
	c.ok(M{"cmd": "PULL", "queue": "st"})
	w.expect("job:stalled", M{"jobId": id, "queue": "st", "stallCount": 1, "action": "retry"})
}

// TestLiveCatalogCronMissed: a run whose push is refused is announced as
// missed, with the refusal.
func TestLiveCatalogCronMissed(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{maxQueues: 1})
	w := watchLive(t, ts.http, "/ws", "cron:*")
	c := dial(t, ts.addr)
	c.ok(M{"cmd": "PUSH", "queue": "only", "data": M{}})
	c.ok(M{"cmd": "Cron", "name": "over", "queue": "one-too-many", "repeatEvery": 200})
	d := w.expect("cron:missed", M{"name": "over", "queue": "one-too-many"})
	if !strings.Contains(fmt.Sprint(d["error"]), "--max-queues") {
		t.Errorf("cron:missed error %v", d["error"])
	}
}

// TestWorkersRemovedStale: a worker registered without a connection and
// unheard for three worker timeouts is removed and announced.
func TestWorkersRemovedStale(t *testing.T) {
	t.Parallel()
	now := int64(1_000_000)
	ws := newWorkers(func() int64 { return now })
	var got []string
	ws.announce = func(n *note) { got = append(got, n.name+" "+string(n.o.close())) }
	if _, err := ws.register(&worker{ID: "w1", Name: "http-worker", LastSeen: now}); err != nil {
		t.Fatal(err)
	}
	now += 3 * workerTimeoutMs
	if ws.count() != 1 || len(got) != 0 {
		t.Fatalf("removed at its expiry, not after: %d workers, %v", ws.count(), got)
	}
	now += 1001
	if ws.count() != 0 || len(got) != 1 || got[0] != `worker:removed-stale {"workerId":"w1","name":"http-worker"}` {
		t.Fatalf("after its expiry: %d workers, notices %v", ws.count(), got)
	}
}
