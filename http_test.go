package main

// Tests of the HTTP API against a running server: every route's status
// and shape, bad input, tokens, CORS, and waiting requests.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// hc is an HTTP client for one test server.
type hc struct {
	t     *testing.T
	base  string
	token string
	hdr   map[string]string
}

func newHC(t *testing.T, ts *testServer) *hc {
	return &hc{t: t, base: "http://" + ts.http}
}

// do sends a request; body is sent as it is when a string, as JSON
// otherwise. It returns the status, the decoded JSON (nil when the answer
// is not JSON) and the raw body.
func (c *hc) do(method, path string, body any) (int, any, []byte) {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for k, v := range c.hdr {
		req.Header.Set(k, v)
	}
	res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var v any
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			c.t.Fatalf("%s %s: invalid JSON %q: %v", method, path, raw, err)
		}
	}
	return res.StatusCode, v, raw
}

// obj expects a status and a JSON object.
func (c *hc) obj(method, path string, body any, status int) map[string]any {
	c.t.Helper()
	code, v, raw := c.do(method, path, body)
	if code != status {
		c.t.Fatalf("%s %s: status %d, want %d: %s", method, path, code, status, raw)
	}
	m, ok := v.(map[string]any)
	if !ok {
		c.t.Fatalf("%s %s: not a JSON object: %s", method, path, raw)
	}
	return m
}

// ok expects 200 and ok:true.
func (c *hc) ok(method, path string, body any) map[string]any {
	c.t.Helper()
	m := c.obj(method, path, body, 200)
	if m["ok"] != true {
		c.t.Fatalf("%s %s: %v", method, path, m)
	}
	return m
}

// fail expects a status and ok:false, and returns the error.
func (c *hc) fail(method, path string, body any, status int) string {
	c.t.Helper()
	m := c.obj(method, path, body, status)
	if m["ok"] != false {
		c.t.Fatalf("%s %s: expected ok:false, got %v", method, path, m)
	}
	e, _ := m["error"].(string)
	if e == "" {
		c.t.Fatalf("%s %s: no error in %v", method, path, m)
	}
	return e
}

func mapKeys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func hasKeys(t *testing.T, what string, m map[string]any, want ...string) {
	t.Helper()
	for _, k := range want {
		if _, ok := m[k]; !ok {
			t.Fatalf("%s: no %q in %v", what, k, mapKeys(m))
		}
	}
}

func jnum(t *testing.T, v any) int64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("%v (%T) is not a number", v, v)
	}
	i, err := n.Int64()
	if err != nil {
		t.Fatalf("%v: %v", v, err)
	}
	return i
}

func jobj(t testing.TB, v any) map[string]any {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%v (%T) is not an object", v, v)
	}
	return m
}

func jarr(t *testing.T, v any) []any {
	t.Helper()
	a, ok := v.([]any)
	if !ok {
		t.Fatalf("%v (%T) is not an array", v, v)
	}
	return a
}

func TestHTTPProbes(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := newHC(t, ts)
	h := c.ok("GET", "/health", nil)
	hasKeys(t, "/health", h, "ok", "status", "uptime", "version", "queues", "connections", "memory", "storage", "workers")
	if h["status"] != "healthy" {
		t.Fatalf("status %v", h["status"])
	}
	hasKeys(t, "/health connections", jobj(t, h["connections"]), "tcp", "ws", "sse")
	hasKeys(t, "/health memory", jobj(t, h["memory"]), "heapUsed", "heapTotal", "rss")
	hasKeys(t, "/health queues", jobj(t, h["queues"]), "waiting", "active", "delayed", "completed", "dlq")
	for _, p := range []string{"/healthz", "/live"} {
		if code, _, raw := c.do("GET", p, nil); code != 200 || string(raw) != "OK" {
			t.Fatalf("%s: %d %q", p, code, raw)
		}
	}
	if r := c.ok("GET", "/ready", nil); r["ready"] != true {
		t.Fatalf("/ready %v", r)
	}
	// HEAD works where GET does, and the probes answer any method, as the
	// reference's do (a load balancer's check may be set to POST).
	if code, _, _ := c.do("HEAD", "/healthz", nil); code != 200 {
		t.Fatalf("HEAD /healthz: %d", code)
	}
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH", "OPTIONS"} {
		for _, p := range []string{"/health", "/healthz", "/live", "/ready"} {
			want := 200
			if m == "OPTIONS" {
				want = 204 // a preflight, before any route
			}
			if code, _, raw := c.do(m, p, nil); code != want {
				t.Errorf("%s %s: %d %.100s", m, p, code, raw)
			}
		}
	}
}

func TestHTTPNotFoundAndMethods(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := newHC(t, ts)
	if e := c.fail("GET", "/nope", nil, 404); e != "Not found" {
		t.Fatalf("error %q", e)
	}
	c.fail("GET", "/queues/a/b/c/d", nil, 404)
	code, _, _ := c.do("DELETE", "/queues", nil)
	if code != 405 {
		t.Fatalf("DELETE /queues: %d", code)
	}
	req, _ := http.NewRequest("PATCH", c.base+"/jobs/x", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 405 || res.Header.Get("Allow") != "GET, DELETE" {
		t.Fatalf("PATCH /jobs/x: %d, Allow %q", res.StatusCode, res.Header.Get("Allow"))
	}
}

// Serial: it lowers maxHTTPBody, which every HTTP server of the process reads.
func TestHTTPBadInput(t *testing.T) {
	ts := startServerHTTP(t, nil)
	c := newHC(t, ts)
	for _, tc := range []struct{ body, want string }{
		{`{"data":`, "Invalid JSON body: unexpected end of input"},
		{`{"data": tru}`, "Invalid JSON body: invalid character"},
		{``, "Invalid JSON body: the body is empty"},
		{`[1,2]`, "Invalid JSON body: expected a JSON object"},
		{`{"a":1} {"b":2}`, "Invalid JSON body: more than one value"},
	} {
		e := c.fail("POST", "/queues/q/jobs", tc.body, 400)
		if !strings.HasPrefix(e, tc.want) {
			t.Errorf("body %q: error %q, want %q...", tc.body, e, tc.want)
		}
	}
	// A syntax error says where it is.
	if e := c.fail("POST", "/queues/q/jobs", `{"data": [1, 2,, 3]}`, 400); !strings.Contains(e, "at byte") {
		t.Errorf("error %q does not say where", e)
	}
	// An optional body may be empty; a bad one still is a 400.
	c.ok("POST", "/queues/q/dlq/purge", nil)
	c.fail("POST", "/jobs/ack-batch", `{"ids":`, 400)
	// A command's own validation answers with its message.
	if e := c.fail("POST", "/queues/q/jobs", `{"data":{},"priority":"high"}`, 400); !strings.Contains(e, "priority") {
		t.Errorf("error %q", e)
	}
	// Query parameters are read as the reference reads them, with
	// JavaScript's parseInt: a number's leading digits count, and what is
	// not a number is PULL's ok:false, or an empty page of a listing.
	if e := c.fail("GET", "/queues/q/jobs?timeout=soon", nil, 200); e != "timeout must be a finite number" {
		t.Errorf("error %q", e)
	}
	c.ok("POST", "/queues/lim/jobs", map[string]any{"data": 1})
	c.ok("POST", "/queues/lim/jobs", map[string]any{"data": 2})
	for query, want := range map[string]int{"limit=x": 0, "offset=x": 0, "limit=1x": 1, "limit=": 2, "limit=%201": 1, "offset=1.9": 1} {
		if got := jarr(t, c.ok("GET", "/queues/lim/jobs/list?"+query, nil)["jobs"]); len(got) != want {
			t.Errorf("jobs/list?%s: %d jobs, want %d", query, len(got), want)
		}
	}
	if j := c.ok("GET", "/queues/lim/jobs?timeout=5ms", nil); j["job"] == nil {
		t.Errorf("pull with timeout=5ms: %v", j)
	}
	c.fail("GET", "/dashboard/queues/"+strings.Repeat("x", 300), nil, 400)

	// Bodies are bounded.
	old := maxHTTPBody
	maxHTTPBody = 1 << 10
	t.Cleanup(func() { maxHTTPBody = old })
	if e := c.fail("POST", "/queues/q/jobs", `{"data":"`+strings.Repeat("x", 2<<10)+`"}`, 413); !strings.Contains(e, "1024 bytes") {
		t.Errorf("error %q", e)
	}
}

// TestHTTPJobLifecycle walks one job through the job routes.
func TestHTTPJobLifecycle(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := newHC(t, ts)

	// Push: the data keeps its keys' order and its numbers.
	id := c.ok("POST", "/queues/mail/jobs", `{"name":"welcome","data":{"z":1,"a":[1.5,-2,"x",null,true],"m":{"k":12345678901}},"priority":5,"jobId":"custom-1"}`)["id"].(string)
	_, _, raw := c.do("GET", "/jobs/"+id, nil)
	if !bytes.Contains(raw, []byte(`"data":{"z":1,"a":[1.5,-2,"x",null,true],"m":{"k":12345678901}}`)) {
		t.Fatalf("data not as sent: %s", raw)
	}
	j := jobj(t, c.ok("GET", "/jobs/"+id, nil)["job"])
	if j["state"] != "prioritized" || j["name"] != "welcome" || j["customId"] != "custom-1" {
		t.Fatalf("job %v", j)
	}
	c.fail("GET", "/jobs/no-such-job", nil, 404)
	if jobj(t, c.ok("GET", "/jobs/custom/custom-1", nil)["job"])["id"] != id {
		t.Fatal("custom id lookup")
	}
	c.fail("GET", "/jobs/custom/nope", nil, 404)
	if st := c.ok("GET", "/jobs/"+id+"/state", nil); st["state"] != "prioritized" {
		t.Fatalf("state %v", st)
	}
	// As in the reference: a job it does not know is in state "unknown".
	if st := c.ok("GET", "/jobs/no-such-job/state", nil); st["state"] != "unknown" {
		t.Fatalf("state %v", st)
	}
	c.ok("PUT", "/jobs/"+id+"/data", map[string]any{"data": map[string]any{"v": 2}})
	c.ok("PUT", "/jobs/"+id+"/priority", map[string]any{"priority": 0})
	c.fail("POST", "/jobs/"+id+"/promote", nil, 400) // not delayed
	if e := c.fail("PUT", "/jobs/"+id+"/data", nil, 400); !strings.Contains(e, "empty") {
		t.Fatalf("PUT data without a body: %q", e)
	}

	// Pull over HTTP, then work on it.
	p := c.ok("GET", "/queues/mail/jobs", nil)
	pj := jobj(t, p["job"])
	if pj["id"] != id || jobj(t, pj["data"])["v"] == nil {
		t.Fatalf("pulled %v", p)
	}
	c.ok("POST", "/jobs/"+id+"/progress", map[string]any{"progress": 40, "message": "halfway"})
	if pr := jobj(t, c.ok("GET", "/jobs/"+id+"/progress", nil)); pr == nil {
		t.Fatal("progress")
	}
	c.ok("POST", "/jobs/"+id+"/logs", map[string]any{"message": "step 1", "level": "info"})
	logs := jobj(t, c.ok("GET", "/jobs/"+id+"/logs", nil)["data"])
	if jnum(t, logs["count"]) != 1 {
		t.Fatalf("logs %v", logs)
	}
	c.ok("DELETE", "/jobs/"+id+"/logs", nil)
	c.ok("POST", "/jobs/"+id+"/heartbeat", nil)
	// A plain pull takes no lock, so there is none to extend.
	c.fail("POST", "/jobs/"+id+"/extend-lock", map[string]any{"duration": 60000}, 400)
	c.ok("POST", "/jobs/"+id+"/ack", map[string]any{"result": map[string]any{"sent": true}})
	c.fail("POST", "/jobs/"+id+"/ack", nil, 400) // not active any more
	if r := c.ok("GET", "/jobs/"+id+"/result", nil); jobj(t, r["result"])["sent"] != true {
		t.Fatalf("result %v", r)
	}
	c.ok("GET", "/jobs/"+id+"/children", nil)

	// Delay, promote, cancel.
	d := c.ok("POST", "/queues/mail/jobs", map[string]any{"data": 1, "delay": 60000})["id"].(string)
	c.ok("PUT", "/jobs/"+d+"/delay", map[string]any{"delay": 120000})
	c.ok("POST", "/jobs/"+d+"/promote", nil)
	c.ok("POST", "/jobs/"+d+"/discard", nil)
	c.obj("DELETE", "/jobs/"+d, nil, 200)
	// Discard sent it to the dead-letter queue; start the next part empty.
	c.ok("POST", "/queues/mail/dlq/purge", nil)

	// Fail: with one attempt the job goes to the dead-letter queue.
	f := c.ok("POST", "/queues/mail/jobs", map[string]any{"data": map[string]any{"n": 1}, "maxAttempts": 1})["id"].(string)
	if jobj(t, c.ok("GET", "/queues/mail/jobs?timeout=0", nil)["job"])["id"] != f {
		t.Fatal("pull order")
	}
	c.ok("POST", "/jobs/"+f+"/fail", map[string]any{"error": "boom"})
	dlq := c.ok("GET", "/queues/mail/dlq", nil)
	if jnum(t, dlq["total"]) != 1 {
		t.Fatalf("dlq %v", dlq)
	}
	e := jobj(t, jarr(t, dlq["entries"])[0])
	hasKeys(t, "dlq entry", e, "job", "enteredAt", "reason", "error", "attempts", "retryCount", "expiresAt")
	if e["error"] != "boom" || jobj(t, e["job"])["id"] != f {
		t.Fatalf("entry %v", e)
	}
	if got := c.ok("GET", "/queues/mail/dlq?limit=0", nil); len(jarr(t, got["entries"])) != 0 || jnum(t, got["total"]) != 1 {
		t.Fatalf("paged dlq %v", got)
	}
	if got := c.ok("GET", "/queues/mail/dlq?limit=x", nil); len(jarr(t, got["entries"])) != 1 {
		t.Fatalf("a limit that is no number is ignored: %v", got)
	}
	st := jobj(t, c.ok("GET", "/queues/mail/dlq/stats", nil)["stats"])
	if jnum(t, st["total"]) != 1 {
		t.Fatalf("dlq stats %v", st)
	}
	c.ok("POST", "/queues/mail/dlq/retry", map[string]any{"jobId": f})
	if c.ok("GET", "/jobs/"+f+"/state", nil)["state"] != "waiting" {
		t.Fatal("retried job is not waiting")
	}
	c.ok("POST", "/queues/mail/dlq/purge", nil)
}

func TestHTTPBatchesAndQueues(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := newHC(t, ts)
	ids := jarr(t, c.ok("POST", "/queues/b/jobs/bulk", `{"jobs":[{"data":{"i":1}},{"name":"named","data":{"i":2}},{"name":7,"data":{"i":3}}]}`)["ids"])
	if len(ids) != 3 {
		t.Fatalf("ids %v", ids)
	}
	jobs := jarr(t, c.ok("GET", "/queues/b/jobs/list?state=waiting", nil)["jobs"])
	var names []string
	for _, j := range jobs {
		names = append(names, jobj(t, j)["name"].(string))
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"default", "default", "named"}) {
		t.Fatalf("names %v", names)
	}
	if n := len(jarr(t, c.ok("GET", "/queues/b/jobs/list?states=waiting,delayed&limit=2", nil)["jobs"])); n != 2 {
		t.Fatalf("limit: %d jobs", n)
	}
	pulled := c.ok("POST", "/queues/b/jobs/pull-batch", map[string]any{"count": 2, "owner": "w1"})
	pj, toks := jarr(t, pulled["jobs"]), jarr(t, pulled["tokens"])
	if len(pj) != 2 || len(toks) != 2 {
		t.Fatalf("pull-batch %v", pulled)
	}
	pid := []any{jobj(t, pj[0])["id"], jobj(t, pj[1])["id"]}
	c.ok("POST", "/jobs/heartbeat-batch", map[string]any{"ids": pid, "tokens": toks})
	c.ok("POST", "/jobs/extend-locks", map[string]any{"ids": pid, "tokens": toks, "durations": []int{30000, 30000}})
	c.ok("POST", "/jobs/ack-batch", map[string]any{"ids": pid, "tokens": toks})
	c.fail("POST", "/jobs/ack-batch", map[string]any{"ids": "nope"}, 400)

	q := jarr(t, c.ok("GET", "/queues", nil)["queues"])
	if len(q) != 1 || q[0] != "b" {
		t.Fatalf("queues %v", q)
	}
	code, v, raw := c.do("GET", "/queues/summary", nil)
	sum := jarr(t, v)
	if code != 200 || len(sum) != 1 {
		t.Fatalf("summary %d %s", code, raw)
	}
	s := jobj(t, sum[0])
	hasKeys(t, "summary", s, "name", "paused", "counts")
	hasKeys(t, "summary counts", jobj(t, s["counts"]), "waiting", "prioritized", "active", "completed", "failed", "delayed")
	counts := jobj(t, c.ok("GET", "/queues/b/counts", nil)["counts"])
	if jnum(t, counts["waiting"]) != 1 || jnum(t, counts["completed"]) != 2 {
		t.Fatalf("counts %v", counts)
	}
	if jnum(t, c.ok("GET", "/queues/b/count", nil)["count"]) != 1 {
		t.Fatal("count")
	}
	c.ok("GET", "/queues/b/priority-counts", nil)
	c.ok("POST", "/queues/b/pause", nil)
	if c.ok("GET", "/queues/b/paused", nil)["paused"] != true {
		t.Fatal("not paused")
	}
	c.ok("POST", "/queues/b/resume", nil)
	c.ok("POST", "/queues/b/promote-jobs", map[string]any{"count": 10})
	c.ok("POST", "/queues/b/retry-completed", nil)
	c.ok("POST", "/queues/b/clean", map[string]any{"grace": 0, "state": "completed"})
	c.ok("POST", "/queues/b/clean", map[string]any{"grace": "not a number"})
	c.ok("POST", "/queues/b/drain", nil)

	// Settings.
	c.ok("PUT", "/queues/b/rate-limit", map[string]any{"limit": 10, "duration": 1000})
	c.ok("DELETE", "/queues/b/rate-limit", nil)
	c.ok("PUT", "/queues/b/concurrency", map[string]any{"concurrency": 3})
	c.ok("DELETE", "/queues/b/concurrency", nil)
	c.ok("PUT", "/queues/b/stall-config", map[string]any{"stallInterval": 5000})
	c.ok("GET", "/queues/b/stall-config", nil)
	c.ok("PUT", "/queues/b/dlq-config", map[string]any{"config": map[string]any{"maxEntries": 50}})
	dc := jobj(t, c.ok("GET", "/queues/b/dlq-config", nil)["config"])
	if jnum(t, dc["maxEntries"]) != 50 {
		t.Fatalf("dlq config %v", dc)
	}
	c.ok("POST", "/queues/b/obliterate", nil)
	if q := jarr(t, c.ok("GET", "/queues", nil)["queues"]); len(q) != 0 {
		t.Fatalf("queues after obliterate %v", q)
	}
}

func TestHTTPResources(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := newHC(t, ts)
	cr := jobj(t, c.ok("POST", "/crons", map[string]any{"name": "nightly", "queue": "r", "schedule": "0 3 * * *", "data": map[string]any{"k": 1}})["cron"])
	if cr["jobName"] != "default" {
		t.Fatalf("cron %v", cr)
	}
	c.fail("POST", "/crons", map[string]any{"name": "bad", "queue": "r", "schedule": "not cron"}, 400)
	if l := jarr(t, c.ok("GET", "/crons", nil)["crons"]); len(l) != 1 {
		t.Fatalf("crons %v", l)
	}
	c.ok("GET", "/crons/nightly", nil)
	c.fail("GET", "/crons/missing", nil, 404)
	c.ok("DELETE", "/crons/nightly", nil)
	c.fail("DELETE", "/crons/nightly", nil, 404)

	// Private addresses are refused by the webhook guard.
	c.fail("POST", "/webhooks", map[string]any{"url": "http://127.0.0.1:9/hook", "events": []string{"job.completed"}}, 400)
	c.ok("GET", "/webhooks", nil)
	c.fail("DELETE", "/webhooks/nope", nil, 404)

	w := jobj(t, c.ok("POST", "/workers", map[string]any{"name": "w1", "queues": []string{"r"}, "concurrency": 2})["data"])
	wid := w["workerId"].(string)
	c.ok("POST", "/workers/"+wid+"/heartbeat", map[string]any{"activeJobs": 1})
	c.ok("POST", "/workers/"+wid+"/heartbeat", "not json")
	ws := jarr(t, c.ok("GET", "/queues/r/workers", nil)["workers"])
	if len(ws) != 1 {
		t.Fatalf("queue workers %v", ws)
	}
	hasKeys(t, "queue worker", jobj(t, ws[0]), "id", "name", "queues", "concurrency", "registeredAt", "lastSeen", "activeJobs", "processedJobs", "failedJobs")
	if n := len(jarr(t, c.ok("GET", "/queues/other/workers", nil)["workers"])); n != 0 {
		t.Fatalf("%d workers on another queue", n)
	}
	lw := jobj(t, c.ok("GET", "/workers", nil)["data"])
	if len(jarr(t, lw["workers"])) != 1 {
		t.Fatalf("workers %v", lw)
	}
	c.ok("DELETE", "/workers/"+wid, nil)
	c.fail("DELETE", "/workers/"+wid, nil, 404)

	if jobj(t, c.ok("GET", "/ping", nil)["data"])["pong"] != true {
		t.Fatal("ping")
	}
	hasKeys(t, "/storage", jobj(t, c.ok("GET", "/storage", nil)["data"]), "diskFull", "error", "since")
}

func TestHTTPFigures(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := newHC(t, ts)
	for i := range 3 {
		c.ok("POST", "/queues/f/jobs", map[string]any{"data": i})
	}
	st := c.ok("GET", "/stats", nil)
	hasKeys(t, "/stats", st, "stats", "memory", "collections")
	s := jobj(t, st["stats"])
	hasKeys(t, "/stats stats", s, "waiting", "prioritized", "delayed", "active", "dlq", "completed", "waiting-children",
		"totalPushed", "totalPulled", "totalCompleted", "totalFailed", "uptime", "cronJobs", "cronPending",
		"pushPerSec", "pullPerSec", "completePerSec", "failPerSec")
	if jnum(t, s["waiting"]) != 3 || jnum(t, s["totalPushed"]) != 3 {
		t.Fatalf("stats %v", s)
	}
	hasKeys(t, "/stats memory", jobj(t, st["memory"]), "heapUsed", "heapTotal", "rss", "external", "arrayBuffers")

	// /metrics: the reference's JSON, whatever the client accepts;
	// /prometheus: the exposition text.
	m := jobj(t, c.ok("GET", "/metrics", nil)["metrics"])
	if jnum(t, m["totalPushed"]) != 3 {
		t.Fatalf("metrics %v", m)
	}
	if code, _, raw := c.do("GET", "/prometheus", nil); code != 200 || !bytes.Contains(raw, []byte("# TYPE bunqueue_jobs_pushed_total counter")) {
		t.Fatalf("/prometheus %d %.200s", code, raw)
	}

	d := c.ok("GET", "/dashboard", nil)
	hasKeys(t, "/dashboard", d, "stats", "throughput", "latency", "memory", "collections", "workers", "crons", "storage", "timestamp")
	hasKeys(t, "/dashboard workers", jobj(t, d["workers"]), "total", "active", "list", "truncated")
	hasKeys(t, "/dashboard crons", jobj(t, d["crons"]), "total", "list", "truncated")
	dq := c.ok("GET", "/dashboard/queues?limit=0&offset=-4", nil)
	if jnum(t, dq["limit"]) != 100 || jnum(t, dq["offset"]) != 0 || jnum(t, dq["total"]) != 1 {
		t.Fatalf("/dashboard/queues %v", dq)
	}
	hasKeys(t, "/dashboard/queues item", jobj(t, jarr(t, dq["queues"])[0]), "name", "waiting", "delayed", "active", "dlq", "paused")
	// waiting leaves out prioritized jobs, as the reference counts it.
	c.ok("POST", "/queues/f/jobs", map[string]any{"data": 9, "priority": 5})
	if w := jnum(t, jobj(t, jarr(t, c.ok("GET", "/dashboard/queues", nil)["queues"])[0])["waiting"]); w != 3 {
		t.Fatalf("/dashboard/queues waiting %d, want 3 (the prioritized job is not waiting)", w)
	}
	// Integers are read as JavaScript's parseInt reads them.
	if dq := c.ok("GET", "/dashboard/queues?limit=5abc&offset=x", nil); jnum(t, dq["limit"]) != 5 || jnum(t, dq["offset"]) != 0 {
		t.Fatalf("/dashboard/queues?limit=5abc %v", dq)
	}
	if n := len(jarr(t, c.ok("GET", "/dashboard/queues?offset=5", nil)["queues"])); n != 0 {
		t.Fatalf("offset past the end: %d", n)
	}
	qd := c.ok("GET", "/dashboard/queues/f?includeJobs=true", nil)
	hasKeys(t, "/dashboard/queues/f", qd, "name", "counts", "paused", "priorityCounts", "dlqPreview", "timestamp", "jobs")
	if _, ok := c.ok("GET", "/dashboard/queues/f", nil)["jobs"]; ok {
		t.Fatal("jobs listed without includeJobs")
	}
	gc := c.ok("POST", "/gc", nil)
	hasKeys(t, "/gc", gc, "before", "after")
	hasKeys(t, "/heapstats", c.ok("GET", "/heapstats", nil), "memory", "heap", "collections", "topObjectTypes")
}

// TestHTTPWaits: a long-poll pull and WaitJob answer when the job comes,
// and a shutdown ends a waiting request with an empty answer.
func TestHTTPWaits(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := newHC(t, ts)
	got := make(chan map[string]any, 1)
	go func() {
		_, v, _ := c.do("GET", "/queues/lp/jobs?timeout=25000", nil)
		m, _ := v.(map[string]any)
		got <- m
	}()
	awaitPullsWaiting(t, ts.addr, 1)
	id := c.ok("POST", "/queues/lp/jobs", map[string]any{"data": "x"})["id"]
	select {
	case m := <-got:
		if m == nil || m["ok"] != true || jobj(t, m["job"])["id"] != id {
			t.Fatalf("long poll answered %v", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("long poll did not answer when a job came")
	}

	waited := make(chan map[string]any, 1)
	waits := parkedIn(parkedWaitJob)
	go func() {
		_, v, _ := c.do("POST", fmt.Sprintf("/jobs/%s/wait", id), map[string]any{"timeout": 25000})
		m, _ := v.(map[string]any)
		waited <- m
	}()
	awaitParked(t, parkedWaitJob, waits+1)
	c.ok("POST", fmt.Sprintf("/jobs/%s/ack", id), map[string]any{"result": 42})
	select {
	case m := <-waited:
		if m["completed"] != true || jnum(t, m["result"]) != 42 {
			t.Fatalf("wait answered %v", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitJob did not answer")
	}

	// A shutdown answers a request still waiting.
	pending := make(chan map[string]any, 1)
	go func() {
		_, v, _ := c.do("GET", "/queues/empty/jobs?timeout=30000", nil)
		m, _ := v.(map[string]any)
		pending <- m
	}()
	// Parked, not merely sent: a request the server has not read yet
	// when it stops would be refused, not answered.
	awaitPullsWaiting(t, ts.addr, 1)
	start := time.Now()
	if !ts.stop(10 * time.Second) {
		t.Fatal("the server did not stop")
	}
	select {
	case m := <-pending:
		if m == nil || m["ok"] != true || m["job"] != nil {
			t.Fatalf("waiting pull answered %v at shutdown", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting pull got no answer at shutdown")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("shutdown took %v with a request waiting", d)
	}
}

func TestHTTPAuth(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{authTokens: "s3cret,other"})
	c := newHC(t, ts)
	// Open: the probes and the dashboard's files.
	for _, p := range []string{"/health", "/healthz", "/live", "/ready", "/", "/ui/app.js", "/ui/style.css"} {
		if code, _, raw := c.do("GET", p, nil); code != 200 {
			t.Errorf("%s without a token: %d %.100s", p, code, raw)
		}
	}
	// Everything else needs the token.
	for _, r := range [][2]string{{"GET", "/queues"}, {"POST", "/queues/q/jobs"}, {"GET", "/jobs/x"}, {"GET", "/stats"},
		{"GET", "/metrics"}, {"GET", "/prometheus"}, {"GET", "/dashboard"}, {"GET", "/events"}, {"GET", "/ws"},
		{"GET", "/crons"}, {"GET", "/workers"}, {"POST", "/gc"}, {"GET", "/backup"}, {"POST", "/backup/s3"}} {
		if e := c.fail(r[0], r[1], nil, 401); e != "Unauthorized" {
			t.Errorf("%s %s: %q", r[0], r[1], e)
		}
	}
	// Without a token, nothing is learnt of the routes: an unknown path
	// and a wrong method are a 401 too, as in the reference.
	c.fail("GET", "/nope", nil, 401)
	c.fail("PUT", "/jobs/x", nil, 401)
	c.token = "wrong"
	c.fail("GET", "/queues", nil, 401)
	c.fail("GET", "/nope", nil, 401)
	c.token = "other"
	c.ok("GET", "/queues", nil)
	c.ok("POST", "/queues/q/jobs", map[string]any{"data": 1})
	c.fail("GET", "/nope", nil, 404)
	c.fail("PUT", "/jobs/x", nil, 405)
	// The bare token, without "Bearer ", as the reference takes it.
	c.token = ""
	c.hdr = map[string]string{"Authorization": "s3cret"}
	c.ok("GET", "/queues", nil)
	c.hdr = map[string]string{"Authorization": "Bearer"}
	c.fail("GET", "/queues", nil, 401)
	c.hdr = nil
	// A browser's preflight comes without the token.
	c.token = ""
	if code, _, _ := c.do("OPTIONS", "/queues", nil); code != 204 {
		t.Fatalf("OPTIONS: %d", code)
	}
}

func TestHTTPCORS(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{corsOrigins: "https://ops.example, https://other.example"})
	c := newHC(t, ts)
	get := func(method, origin string) *http.Response {
		req, _ := http.NewRequest(method, c.base+"/queues/c/pause", nil)
		if method == "GET" {
			req, _ = http.NewRequest(method, c.base+"/queues", nil)
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	if r := get("GET", "https://ops.example"); r.Header.Get("Access-Control-Allow-Origin") != "https://ops.example" {
		t.Fatalf("allowed origin: %v", r.Header)
	}
	if r := get("GET", "https://evil.example"); r.Header.Get("Access-Control-Allow-Origin") != "" || r.StatusCode != 200 {
		t.Fatalf("other origin: %d %v", r.StatusCode, r.Header)
	}
	// Changing state from a page of another site is refused; from an
	// allowed origin or the server's own pages it is not.
	if r := get("POST", "https://evil.example"); r.StatusCode != 403 {
		t.Fatalf("cross-site POST: %d", r.StatusCode)
	}
	if r := get("POST", "https://other.example"); r.StatusCode != 200 {
		t.Fatalf("allowed POST: %d", r.StatusCode)
	}
	if r := get("POST", "http://"+ts.http); r.StatusCode != 200 {
		t.Fatalf("same-origin POST: %d", r.StatusCode)
	}
	if r := get("POST", ""); r.StatusCode != 200 {
		t.Fatalf("POST without Origin: %d", r.StatusCode)
	}
	req, _ := http.NewRequest("OPTIONS", c.base+"/queues", nil)
	req.Header.Set("Origin", "https://ops.example")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 204 || !strings.Contains(res.Header.Get("Access-Control-Allow-Headers"), "Authorization") ||
		res.Header.Get("Access-Control-Allow-Origin") != "https://ops.example" {
		t.Fatalf("preflight: %d %v", res.StatusCode, res.Header)
	}

	// "*": any origin.
	ts2 := startServerHTTP(t, &config{corsOrigins: "*"})
	req, _ = http.NewRequest("POST", "http://"+ts2.http+"/queues/c/pause", nil)
	req.Header.Set("Origin", "https://anywhere.example")
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("*: %d %v", res.StatusCode, res.Header)
	}
}

var refRE = regexp.MustCompile(`(src|href|url)[=(]["']?([^"')\s>]+)`)

func TestHTTPDashboardFiles(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := newHC(t, ts)
	for _, tc := range []struct{ path, ctype, has string }{
		{"/", "text/html", `<script src="/ui/app.js">`},
		{"/ui/app.js", "javascript", "EventSource"},
		{"/ui/style.css", "text/css", "--bg"},
	} {
		req, _ := http.NewRequest("GET", c.base+tc.path, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.Contains(res.Header.Get("Content-Type"), tc.ctype) || !bytes.Contains(body, []byte(tc.has)) {
			t.Errorf("%s: %d %q", tc.path, res.StatusCode, res.Header.Get("Content-Type"))
		}
		if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("%s: CSP %q", tc.path, csp)
		}
		// Nothing is loaded from another host: every reference is local.
		for _, m := range refRE.FindAllSubmatch(body, -1) {
			if u := string(m[2]); !strings.HasPrefix(u, "/") && !strings.HasPrefix(u, "data:") && !strings.HasPrefix(u, "#") {
				t.Errorf("%s refers to %q", tc.path, u)
			}
		}
	}
	c.fail("GET", "/ui/nope.js", nil, 404)
}

// newHTTPHandler is the HTTP API with the default settings, for tests.
func newHTTPHandler(b *MemEngine, srv *Server, bk *BackupService) http.Handler {
	return newHTTPAPI(b.Broker, srv, bk, httpConfig{})
}
