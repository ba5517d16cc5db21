package main

// The HTTP API side by side with the reference (issue 17). The route list
// is not kept here: it is parsed from the reference package's route files
// at test time (http_parity_ref_test.go). Every route is then sent, with a
// request built from the same state set up on both servers through their
// HTTP APIs, to a reference server (`bunqueue start`, in memory) and to
// queued (in memory), and the two answers are compared: the status code,
// the content type, and the JSON shape (the keys of every object, nested
// ones included, and the kind of every value; not the values, which
// legitimately differ: ids, timestamps, memory). queued may have more keys
// than the reference (an addition breaks no client); a key the reference
// has and queued lacks is a difference.
//
// The differences queued keeps on purpose are in parityAccepted, each with
// its reason, and each is listed in docs/http-api.md's "Differences from
// the reference" (TestRouteParityDocs). Any other difference fails the
// test, and so does an accepted one that no longer happens, so the list
// stays true.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// parityAccepted are the differences queued keeps. route is matched
// against the probe's route ("METHOD /path" as parsed from the reference,
// with * matching anything) and names the difference in the docs; what is
// a regular expression the difference's text must match ("" for any).
var parityAccepted = []struct{ route, what, reason string }{
	// Probes and live events.
	{"ANY /ws", notGET, "a WebSocket handshake is a GET (RFC 6455): other methods are 405 with Allow, not the reference's 400 text"},
	{"ANY /ws/queues/:queue", notGET, "as for /ws"},
	{"ANY /ws/*", "^GET /ws/other:", "only /ws and /ws/queues/{q} are streams: another path under /ws/ is a 404, not an unfiltered stream that a mistyped filter would silently become"},
	{"ANY /events", notGET, "an event stream is a read: GET (what EventSource sends) only, 405 with Allow otherwise"},
	{"ANY /events/queues/:queue", notGET, "as for /events"},
	{"ANY /events/*", "^GET /events/other:", "only /events and /events/queues/{q} are streams: another path under /events/ is a 404, not an unfiltered stream"},

	// Metrics.
	{"GET /prometheus*", "", "with --auth-tokens, /prometheus wants the token unless --metrics-auth=false (the reference: open unless METRICS_AUTH=true): metrics name every queue, which an open port should not tell; see docs/monitoring.md"},

	// The reference's own artefacts.
	{"GET /queues/:queue/jobs/list", `\._state$`, "_state is a tag the reference's in-memory engine writes on its job objects while it lists them, and then shows in every answer with that job, or not, depending on which listing touched the job last; state has the same value"},

	// Figures that have no Go counterpart.
	{"GET /heapstats", `heap\.`, "Go has no JavaScriptCore heap: heap has Go's figures (objectCount, goroutines, gcCycles, mallocs, frees) instead of protectedCount and globalCount, which would have to be made up"},

	// HTTP semantics.
	{"OTHER-METHOD /*", "", "another method on a known path is 405 with an Allow header naming the methods there (RFC 9110), where the reference answers 404 as for an unknown path; the body is still {ok:false, error}"},

	// Safety on an open port (issue 14).
	{"GET /health (no token)", "", "with --auth-tokens, a caller without a token learns only {ok, status} and the status code: the counts, connections, memory and version are for callers with the token"},
	{"POST /queues/:queue/pause (cross-origin page)", "", "a route that changes state refuses a page of another origin (403): any page a browser has open could otherwise drive the server"},
	{"GET /stats (browser, unknown Host)", "", "without tokens, a browser reaching the server by a name not on the allow-list is refused (403): DNS rebinding would otherwise make any site's page the server's own"},
}

// notGET matches the differences of a probe with another method than GET.
const notGET = "^(POST|PUT|DELETE|PATCH) "

// paritySide is one of the two servers.
type paritySide struct {
	name  string
	base  string
	token string
	c     *http.Client
}

// parityAnswer is one answer: its status, content type and body.
type parityAnswer struct {
	code  int
	ctype string
	raw   []byte
	json  any // nil when not JSON
}

type parityReq struct {
	method, path string
	body         any // string as it is, anything else as JSON
	hdr          map[string]string
	host         string
	noToken      bool
}

func (s *paritySide) send(t *testing.T, r parityReq) parityAnswer {
	t.Helper()
	var rd io.Reader
	switch b := r.body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(r.method, s.base+r.path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if s.token != "" && !r.noToken {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	for k, v := range r.hdr {
		req.Header.Set(k, v)
	}
	if r.host != "" {
		req.Host = r.host
	}
	res, err := s.c.Do(req)
	if err != nil {
		t.Fatalf("%s: %s %s: %v", s.name, r.method, r.path, err)
	}
	defer res.Body.Close()
	a := parityAnswer{code: res.StatusCode, ctype: res.Header.Get("Content-Type")}
	if strings.HasPrefix(a.ctype, "text/event-stream") {
		// A stream: its first event is its shape.
		a.raw = firstSSEData(res.Body)
	} else {
		a.raw, _ = io.ReadAll(res.Body)
	}
	if strings.HasPrefix(a.ctype, "application/json") || strings.HasPrefix(a.ctype, "text/event-stream") {
		json.Unmarshal(a.raw, &a.json)
	}
	return a
}

// firstSSEData reads a stream up to its first data line.
func firstSSEData(r io.Reader) []byte {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data:"); ok {
			return []byte(strings.TrimSpace(d))
		}
	}
	return nil
}

// ok sends a setup request and expects ok:true.
func (s *paritySide) ok(t *testing.T, method, path string, body any) map[string]any {
	t.Helper()
	a := s.send(t, parityReq{method: method, path: path, body: body})
	m, _ := a.json.(map[string]any)
	if a.code != 200 || m["ok"] != true {
		t.Fatalf("%s: setup %s %s: %d %s", s.name, method, path, a.code, a.raw)
	}
	return m
}

// parityFx is the state a request is built from, on one side.
type parityFx struct {
	q, id, token, custom, cron, webhook, worker string
}

type paritySetup func(t *testing.T, s *paritySide, f *parityFx)

func (s *paritySide) push(t *testing.T, q string, body map[string]any) string {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	if _, ok := body["data"]; !ok {
		body["data"] = map[string]any{"n": 1}
	}
	m := s.ok(t, "POST", "/queues/"+q+"/jobs", body)
	id, _ := m["id"].(string)
	return id
}

// claim pulls one job with a lock, for the routes that want a token.
func (s *paritySide) claim(t *testing.T, q string) (string, string) {
	t.Helper()
	m := s.ok(t, "POST", "/queues/"+q+"/jobs/pull-batch", map[string]any{"count": 1, "owner": "parity"})
	jobs, _ := m["jobs"].([]any)
	toks, _ := m["tokens"].([]any)
	if len(jobs) != 1 || len(toks) != 1 {
		t.Fatalf("%s: claim on %s: %v", s.name, q, m)
	}
	id, _ := jobs[0].(map[string]any)["id"].(string)
	tok, _ := toks[0].(string)
	return id, tok
}

// The fixtures.
var (
	fxNone    paritySetup = func(*testing.T, *paritySide, *parityFx) {}
	fxWaiting paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		f.id = s.push(t, f.q, map[string]any{"name": "n", "data": map[string]any{"a": 1}})
	}
	fxTwo paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		fxWaiting(t, s, f)
		s.push(t, f.q, nil)
	}
	// fxMixed: one job of each kind a queue's counts tell apart.
	fxMixed paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		f.id = s.push(t, f.q, nil)
		s.push(t, f.q, nil)
		s.claim(t, f.q) // before the prioritized job, which it would take
		s.push(t, f.q, map[string]any{"priority": 5})
		s.push(t, f.q, map[string]any{"delay": 600000})
	}
	fxDelayed paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		f.id = s.push(t, f.q, map[string]any{"delay": 600000})
	}
	fxActive paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		s.push(t, f.q, nil)
		f.id, f.token = s.claim(t, f.q)
	}
	fxCompleted paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		fxActive(t, s, f)
		s.ok(t, "POST", "/jobs/"+f.id+"/ack", map[string]any{"token": f.token, "result": map[string]any{"sent": true}})
	}
	fxDLQ paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		s.push(t, f.q, map[string]any{"maxAttempts": 1})
		f.id, f.token = s.claim(t, f.q)
		s.ok(t, "POST", "/jobs/"+f.id+"/fail", map[string]any{"token": f.token, "error": "boom"})
	}
	fxLogs paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		fxWaiting(t, s, f)
		s.ok(t, "POST", "/jobs/"+f.id+"/logs", map[string]any{"message": "hello", "level": "info"})
	}
	fxCustom paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		f.custom = "c-" + f.q
		f.id = s.push(t, f.q, map[string]any{"jobId": f.custom})
	}
	fxPaused paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		fxWaiting(t, s, f)
		s.ok(t, "POST", "/queues/"+f.q+"/pause", nil)
	}
	fxCron paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		f.cron = "cron-" + f.q
		s.ok(t, "POST", "/crons", map[string]any{"name": f.cron, "queue": f.q, "repeatEvery": 600000, "data": map[string]any{"a": 1}})
	}
	// A webhook that never fires: its queue gets no jobs (the reference
	// refuses loopback URLs, so it cannot point at the test).
	fxWebhook paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		m := s.ok(t, "POST", "/webhooks", parityWebhookBody(f.q))
		f.webhook, _ = m["data"].(map[string]any)["webhookId"].(string)
	}
	fxWorker paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		m := s.ok(t, "POST", "/workers", map[string]any{"name": "w-" + f.q, "queues": []string{f.q}, "concurrency": 2})
		f.worker, _ = m["data"].(map[string]any)["workerId"].(string)
	}
	fxOverview paritySetup = func(t *testing.T, s *paritySide, f *parityFx) {
		fxMixed(t, s, f)
		fxCron(t, s, f)
		fxWorker(t, s, f)
	}
)

func parityWebhookBody(q string) map[string]any {
	return map[string]any{"url": "https://hooks.example.invalid/parity", "events": []string{"job.failed"}, "queue": q}
}

// paritySpec is how to call one reference route.
type paritySpec struct {
	setup paritySetup
	// path has {q} {id} {custom} {cron} {webhook} {worker}; query is
	// added as it is.
	path, query string
	body        func(f *parityFx) any
	// same are values that must be equal on both sides (paths as in
	// parityAt), where the fixture makes them the same.
	same []string
	// variants are more queries sent after the first request, with the
	// same fixture: query parameters the reference reads loosely.
	variants []parityVariant
}

type parityVariant struct {
	query string
	same  []string
}

func bodyOf(v map[string]any) func(*parityFx) any { return func(*parityFx) any { return v } }

func withToken(extra map[string]any) func(f *parityFx) any {
	return func(f *parityFx) any {
		m := map[string]any{"token": f.token}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
}

func batchBody(extra map[string]any) func(f *parityFx) any {
	return func(f *parityFx) any {
		m := map[string]any{"ids": []string{f.id}, "tokens": []string{f.token}}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
}

var countsSame = []string{"counts.waiting", "counts.prioritized", "counts.delayed", "counts.active", "counts.paused"}

// paritySpecs are the requests, one per reference route bound to a
// method (the any-method probes, live streams and preflight are probed in
// the test itself).
var paritySpecs = map[string]paritySpec{
	"POST /gc":        {setup: fxNone, path: "/gc"},
	"GET /heapstats":  {setup: fxNone, path: "/heapstats"},
	"GET /prometheus": {setup: fxNone, path: "/prometheus"},
	// The figures are the whole server's: the same on both sides, which
	// have had the same requests so far.
	"GET /stats": {setup: fxMixed, path: "/stats", same: []string{"stats.waiting", "stats.prioritized", "stats.delayed",
		"stats.active", "stats.dlq", "stats.completed", "stats.totalPushed", "stats.cronJobs"}},
	"GET /metrics": {setup: fxNone, path: "/metrics"},
	"GET /dashboard": {setup: fxOverview, path: "/dashboard", same: []string{"stats.waiting", "stats.delayed", "stats.active",
		"stats.dlq", "stats.completed", "stats.totalPushed", "workers.total", "workers.active", "crons.total"}},
	"GET /dashboard/queues": {setup: fxMixed, path: "/dashboard/queues", query: "limit=500",
		same: []string{"queues[name={q}].waiting", "queues[name={q}].delayed", "queues[name={q}].active", "queues[name={q}].dlq", "queues[name={q}].paused"},
		variants: []parityVariant{{"limit=5abc", []string{"limit", "offset"}}, {"limit=x&offset=y", []string{"limit", "offset"}},
			{"limit=0&offset=-4", []string{"limit", "offset"}}, {"limit=-3&offset=2.9", []string{"limit", "offset"}}, {"limit=9999", []string{"limit"}}}},
	"GET /dashboard/queues/:queue": {setup: fxMixed, path: "/dashboard/queues/{q}", query: "includeJobs=true", same: countsSame},

	"POST /jobs/ack-batch":                {setup: fxActive, path: "/jobs/ack-batch", body: batchBody(map[string]any{"results": []any{map[string]any{"r": 1}}})},
	"POST /jobs/extend-locks":             {setup: fxActive, path: "/jobs/extend-locks", body: batchBody(map[string]any{"durations": []int{60000}})},
	"POST /jobs/heartbeat-batch":          {setup: fxActive, path: "/jobs/heartbeat-batch", body: batchBody(nil)},
	"GET /jobs/custom/:customId":          {setup: fxCustom, path: "/jobs/custom/{custom}"},
	"GET /jobs/:id":                       {setup: fxWaiting, path: "/jobs/{id}"},
	"DELETE /jobs/:id":                    {setup: fxWaiting, path: "/jobs/{id}"},
	"POST /jobs/:id/ack":                  {setup: fxActive, path: "/jobs/{id}/ack", body: withToken(map[string]any{"result": map[string]any{"sent": true}})},
	"POST /jobs/:id/fail":                 {setup: fxActive, path: "/jobs/{id}/fail", body: withToken(map[string]any{"error": "boom"})},
	"POST /jobs/:id/promote":              {setup: fxDelayed, path: "/jobs/{id}/promote"},
	"PUT /jobs/:id/data":                  {setup: fxWaiting, path: "/jobs/{id}/data", body: bodyOf(map[string]any{"data": map[string]any{"b": 2}})},
	"GET /jobs/:id/state":                 {setup: fxWaiting, path: "/jobs/{id}/state"},
	"GET /jobs/:id/result":                {setup: fxCompleted, path: "/jobs/{id}/result"},
	"GET /jobs/:id/progress":              {setup: fxActive, path: "/jobs/{id}/progress"},
	"POST /jobs/:id/progress":             {setup: fxActive, path: "/jobs/{id}/progress", body: bodyOf(map[string]any{"progress": 50, "message": "half"})},
	"PUT /jobs/:id/priority":              {setup: fxWaiting, path: "/jobs/{id}/priority", body: bodyOf(map[string]any{"priority": 7})},
	"POST /jobs/:id/discard":              {setup: fxActive, path: "/jobs/{id}/discard"},
	"POST /jobs/:id/move-to-delayed":      {setup: fxActive, path: "/jobs/{id}/move-to-delayed", body: withToken(map[string]any{"delay": 600000})},
	"PUT /jobs/:id/delay":                 {setup: fxDelayed, path: "/jobs/{id}/delay", body: bodyOf(map[string]any{"delay": 900000})},
	"GET /jobs/:id/children":              {setup: fxWaiting, path: "/jobs/{id}/children"},
	"GET /jobs/:id/logs":                  {setup: fxLogs, path: "/jobs/{id}/logs"},
	"POST /jobs/:id/logs":                 {setup: fxWaiting, path: "/jobs/{id}/logs", body: bodyOf(map[string]any{"message": "hello", "level": "info"})},
	"DELETE /jobs/:id/logs":               {setup: fxLogs, path: "/jobs/{id}/logs"},
	"POST /jobs/:id/heartbeat":            {setup: fxActive, path: "/jobs/{id}/heartbeat", body: withToken(nil)},
	"POST /jobs/:id/wait":                 {setup: fxCompleted, path: "/jobs/{id}/wait", body: bodyOf(map[string]any{"timeout": 1000})},
	"POST /jobs/:id/extend-lock":          {setup: fxActive, path: "/jobs/{id}/extend-lock", body: withToken(map[string]any{"duration": 60000})},
	"POST /jobs/:id/move-to-wait":         {setup: fxActive, path: "/jobs/{id}/move-to-wait", body: withToken(nil)},
	"GET /queues":                         {setup: fxWaiting, path: "/queues"},
	"GET /queues/summary":                 {setup: fxMixed, path: "/queues/summary", same: []string{"[name={q}].counts.waiting", "[name={q}].counts.prioritized", "[name={q}].counts.delayed", "[name={q}].counts.active"}},
	"GET /queues/:queue/workers":          {setup: fxWorker, path: "/queues/{q}/workers"},
	"GET /queues/:queue/counts":           {setup: fxMixed, path: "/queues/{q}/counts", same: countsSame},
	"GET /queues/:queue/count":            {setup: fxMixed, path: "/queues/{q}/count", same: []string{"count"}},
	"GET /queues/:queue/priority-counts":  {setup: fxMixed, path: "/queues/{q}/priority-counts"},
	"GET /queues/:queue/paused":           {setup: fxPaused, path: "/queues/{q}/paused", same: []string{"paused"}},
	"POST /queues/:queue/pause":           {setup: fxWaiting, path: "/queues/{q}/pause"},
	"POST /queues/:queue/resume":          {setup: fxPaused, path: "/queues/{q}/resume"},
	"POST /queues/:queue/drain":           {setup: fxMixed, path: "/queues/{q}/drain"},
	"POST /queues/:queue/obliterate":      {setup: fxMixed, path: "/queues/{q}/obliterate"},
	"POST /queues/:queue/clean":           {setup: fxCompleted, path: "/queues/{q}/clean", body: bodyOf(map[string]any{"grace": 0, "state": "completed", "limit": 10})},
	"POST /queues/:queue/promote-jobs":    {setup: fxDelayed, path: "/queues/{q}/promote-jobs", body: bodyOf(map[string]any{"count": 10})},
	"POST /queues/:queue/retry-completed": {setup: fxCompleted, path: "/queues/{q}/retry-completed", body: bodyOf(map[string]any{})},
	"POST /queues/:queue/jobs":            {setup: fxNone, path: "/queues/{q}/jobs", body: bodyOf(map[string]any{"name": "n", "data": map[string]any{"a": 1}, "priority": 1})},
	"GET /queues/:queue/jobs": {setup: fxTwo, path: "/queues/{q}/jobs",
		variants: []parityVariant{{"timeout=x", []string{"ok", "error"}}, {"timeout=5ms", []string{"ok"}}, {"timeout=", []string{"ok"}}}},
	"POST /queues/:queue/jobs/bulk":       {setup: fxNone, path: "/queues/{q}/jobs/bulk", body: bodyOf(map[string]any{"jobs": []any{map[string]any{"data": map[string]any{"a": 1}}, map[string]any{"name": "x", "data": map[string]any{}}}})},
	"POST /queues/:queue/jobs/pull-batch": {setup: fxTwo, path: "/queues/{q}/jobs/pull-batch", body: bodyOf(map[string]any{"count": 2, "owner": "parity"})},
	"GET /queues/:queue/jobs/list": {setup: fxMixed, path: "/queues/{q}/jobs/list", query: "state=waiting&state=delayed&limit=10",
		variants: []parityVariant{{"state=waiting&limit=x", nil}, {"state=waiting&limit=1x", nil}, {"state=waiting&offset=x", nil},
			{"state=waiting,prioritized&limit=", nil}, {"state=waiting&limit=-1", nil}}},
	"GET /queues/:queue/dlq/stats": {setup: fxDLQ, path: "/queues/{q}/dlq/stats"},
	"GET /queues/:queue/dlq": {setup: fxDLQ, path: "/queues/{q}/dlq", same: []string{"total"},
		variants: []parityVariant{{"limit=x", []string{"total"}}, {"offset=1", []string{"total"}}, {"limit=0", []string{"total"}}}},
	"POST /queues/:queue/dlq/retry":     {setup: fxDLQ, path: "/queues/{q}/dlq/retry", body: func(f *parityFx) any { return map[string]any{"jobId": f.id} }},
	"POST /queues/:queue/dlq/purge":     {setup: fxDLQ, path: "/queues/{q}/dlq/purge"},
	"PUT /queues/:queue/rate-limit":     {setup: fxNone, path: "/queues/{q}/rate-limit", body: bodyOf(map[string]any{"limit": 10, "duration": 1000})},
	"DELETE /queues/:queue/rate-limit":  {setup: fxNone, path: "/queues/{q}/rate-limit"},
	"PUT /queues/:queue/concurrency":    {setup: fxNone, path: "/queues/{q}/concurrency", body: bodyOf(map[string]any{"concurrency": 2})},
	"DELETE /queues/:queue/concurrency": {setup: fxNone, path: "/queues/{q}/concurrency"},
	"GET /queues/:queue/stall-config":   {setup: fxNone, path: "/queues/{q}/stall-config"},
	"PUT /queues/:queue/stall-config":   {setup: fxNone, path: "/queues/{q}/stall-config", body: bodyOf(map[string]any{"config": map[string]any{"enabled": true, "stallInterval": 30000, "maxStalls": 2, "gracePeriod": 5000}})},
	"GET /queues/:queue/dlq-config":     {setup: fxNone, path: "/queues/{q}/dlq-config"},
	"PUT /queues/:queue/dlq-config":     {setup: fxNone, path: "/queues/{q}/dlq-config", body: bodyOf(map[string]any{"config": map[string]any{"autoRetry": false, "maxEntries": 100}})},
	"GET /crons":                        {setup: fxCron, path: "/crons"},
	"POST /crons": {setup: fxNone, path: "/crons", body: func(f *parityFx) any {
		return map[string]any{"name": "new-" + f.q, "queue": f.q, "repeatEvery": 600000}
	}},
	"GET /crons/:name":            {setup: fxCron, path: "/crons/{cron}"},
	"DELETE /crons/:name":         {setup: fxCron, path: "/crons/{cron}"},
	"GET /webhooks":               {setup: fxWebhook, path: "/webhooks"},
	"POST /webhooks":              {setup: fxNone, path: "/webhooks", body: func(f *parityFx) any { return parityWebhookBody(f.q) }},
	"DELETE /webhooks/:id":        {setup: fxWebhook, path: "/webhooks/{webhook}"},
	"PUT /webhooks/:id/enabled":   {setup: fxWebhook, path: "/webhooks/{webhook}/enabled", body: bodyOf(map[string]any{"enabled": false})},
	"GET /workers":                {setup: fxWorker, path: "/workers"},
	"POST /workers":               {setup: fxNone, path: "/workers", body: func(f *parityFx) any { return map[string]any{"name": "w-" + f.q, "queues": []string{f.q}} }},
	"DELETE /workers/:id":         {setup: fxWorker, path: "/workers/{worker}"},
	"POST /workers/:id/heartbeat": {setup: fxWorker, path: "/workers/{worker}/heartbeat", body: bodyOf(map[string]any{"activeJobs": 0, "processed": 1, "failed": 0})},
	"GET /ping":                   {setup: fxNone, path: "/ping"},
	"GET /storage":                {setup: fxNone, path: "/storage"},
}

func (f *parityFx) fill(s string) string {
	return strings.NewReplacer("{q}", f.q, "{id}", f.id, "{custom}", f.custom, "{cron}", f.cron,
		"{webhook}", f.webhook, "{worker}", f.worker).Replace(s)
}

// parityRun collects the comparisons of one test.
type parityRun struct {
	t        *testing.T
	ref, our *paritySide
	probes   int
	diffs    map[string][]string // by route
	requests map[string][]string
	matched  map[int]bool // parityAccepted entries seen
}

// compare sends one request to both sides and records how they differ.
func (p *parityRun) compare(route string, rr, or parityReq, same []string, q string) {
	p.t.Helper()
	p.probes++
	ra := p.ref.send(p.t, rr)
	oa := p.our.send(p.t, or)
	var d []string
	label := rr.method + " " + rr.path
	if ra.code != oa.code {
		d = append(d, fmt.Sprintf("%s: status %d, queued %d", label, ra.code, oa.code))
	}
	rk, qk := contentKind(ra.ctype), contentKind(oa.ctype)
	if rr.method == "HEAD" {
		// No body: nothing but the status to compare.
	} else if rk != qk {
		d = append(d, fmt.Sprintf("%s: content %s, queued %s", label, rk, qk))
	} else if ra.json != nil {
		for _, s := range shapeDiff("", ra.json, oa.json) {
			d = append(d, label+": "+s)
		}
		for _, s := range same {
			s = strings.ReplaceAll(s, "{q}", q)
			rv, rok := parityAt(ra.json, s)
			ov, ook := parityAt(oa.json, s)
			if !rok || !ook || fmt.Sprint(rv) != fmt.Sprint(ov) {
				d = append(d, fmt.Sprintf("%s: %s is %v, queued %v", label, s, rv, ov))
			}
		}
	} else if rk == "text" && ra.code == 200 && strings.TrimSpace(string(ra.raw)) == "OK" && strings.TrimSpace(string(oa.raw)) != "OK" {
		d = append(d, fmt.Sprintf("%s: body %q, queued %q", label, ra.raw, oa.raw))
	}
	if len(d) > 0 {
		p.diffs[route] = append(p.diffs[route], d...)
		p.requests[route] = append(p.requests[route], fmt.Sprintf("%s\n    reference: %d %s\n    queued:    %d %s",
			label, ra.code, clipBody(ra.raw), oa.code, clipBody(oa.raw)))
	}
}

func clipBody(b []byte) string {
	if len(b) > 400 {
		return string(b[:400]) + "..."
	}
	return string(b)
}

func contentKind(ct string) string {
	switch {
	case ct == "":
		return "none"
	case strings.HasPrefix(ct, "application/json"):
		return "json"
	case strings.HasPrefix(ct, "text/event-stream"):
		return "event-stream"
	case strings.HasPrefix(ct, "text/plain; version=0.0.4"):
		return "prometheus"
	case strings.HasPrefix(ct, "text/"):
		return "text"
	}
	return ct
}

// jsonKind names a decoded JSON value's kind.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	}
	return fmt.Sprintf("%T", v)
}

// shapeDiff lists where ours lacks the reference's shape: a key the
// reference has and ours has not, or a value of another kind. A null on
// the reference's side says nothing of its kind; arrays are compared by
// the union of their items' shapes, since the items and their order are
// values.
func shapeDiff(at string, ref, ours any) []string {
	if ref == nil {
		return nil
	}
	if jsonKind(ref) != jsonKind(ours) {
		return []string{fmt.Sprintf("%s is %s, queued %s", nameAt(at), jsonKind(ref), jsonKind(ours))}
	}
	var out []string
	switch r := ref.(type) {
	case map[string]any:
		o := ours.(map[string]any)
		keys := make([]string, 0, len(r))
		for k := range r {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ov, ok := o[k]
			if !ok {
				out = append(out, "missing key "+join(at, k))
				continue
			}
			out = append(out, shapeDiff(join(at, k), r[k], ov)...)
		}
	case []any:
		rm, om := mergeItems(r), mergeItems(ours.([]any))
		if rm != nil && om != nil {
			out = append(out, shapeDiff(at+"[]", rm, om)...)
		}
	}
	return out
}

func nameAt(at string) string {
	if at == "" {
		return "the answer"
	}
	return at
}

func join(at, k string) string {
	if at == "" {
		return k
	}
	return at + "." + k
}

// mergeItems is the union of an array's items' shapes: objects merged key
// by key, the first non-null value of each.
func mergeItems(items []any) any {
	var m any
	for _, it := range items {
		m = mergeShape(m, it)
	}
	return m
}

func mergeShape(a, b any) any {
	if a == nil {
		return b
	}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok {
		return a
	}
	out := map[string]any{}
	for k, v := range am {
		out[k] = v
	}
	for k, v := range bm {
		out[k] = mergeShape(out[k], v)
	}
	return out
}

// parityAt reads a value by a dotted path; "key[field=value]" picks the
// object of an array whose field has that value ("[field=value]" alone
// for an array at the top).
func parityAt(v any, path string) (any, bool) {
	for part := range strings.SplitSeq(path, ".") {
		key, sel, _ := strings.Cut(part, "[")
		if key != "" {
			m, ok := v.(map[string]any)
			if !ok {
				return nil, false
			}
			if v, ok = m[key]; !ok {
				return nil, false
			}
		}
		if sel != "" {
			f, want, _ := strings.Cut(strings.TrimSuffix(sel, "]"), "=")
			arr, _ := v.([]any)
			found := false
			for _, it := range arr {
				if m, ok := it.(map[string]any); ok && fmt.Sprint(m[f]) == want {
					v, found = it, true
					break
				}
			}
			if !found {
				return nil, false
			}
		}
	}
	return v, true
}

// globMatch matches s against a pattern where * is any run of characters.
func globMatch(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	for i, p := range parts[1:] {
		if i == len(parts)-2 {
			return strings.HasSuffix(s, p)
		}
		j := strings.Index(s, p)
		if j < 0 {
			return false
		}
		s = s[j+len(p):]
	}
	return true
}

// accepted reports which parityAccepted entry covers a difference, or -1.
func acceptedFor(route, diff string) int {
	for i, a := range parityAccepted {
		if globMatch(a.route, route) && regexp.MustCompile(a.what).MatchString(diff) {
			return i
		}
	}
	return -1
}

// startParityPair starts a reference server and queued, both in memory,
// with the same tokens (none when token is "").
func startParityPair(t *testing.T, token string) (ref, ours *paritySide) {
	t.Helper()
	var env []string
	c := &config{}
	if token != "" {
		env = append(env, "AUTH_TOKENS="+token)
		c.authTokens = token
	}
	rs := startRefServer(t, env...)
	ts := startServerHTTP(t, c)
	client := &http.Client{Timeout: 30 * time.Second}
	return &paritySide{name: "reference", base: "http://" + rs.http, token: token, c: client},
		&paritySide{name: "queued", base: "http://" + ts.http, token: token, c: client}
}

// TestRouteParity is the comparison.
func TestRouteParity(t *testing.T) {
	t.Parallel()
	dir, _ := refServerDir(t)
	routes, err := parseRefRoutes(dir)
	if err != nil {
		t.Fatalf("parsing the reference's routes: %v", err)
	}
	// A parser that found nothing must not pass: the reference has 79
	// routes bound to a method, 8 that answer any method, 2 prefix
	// catch-alls and the preflight.
	bound := 0
	keys := map[string]bool{}
	for _, r := range routes {
		keys[r.key()] = true
		if !r.anyMethod && r.method != "OPTIONS" {
			bound++
		}
	}
	if len(routes) < 80 || bound < 75 {
		t.Fatalf("parsed only %d routes (%d bound to a method) from %s: has the reference's route code changed form?", len(routes), bound, dir)
	}
	for _, k := range []string{"GET /stats", "POST /queues/:queue/jobs", "GET /jobs/:id", "DELETE /jobs/:id",
		"POST /jobs/:id/ack", "PUT /queues/:queue/concurrency", "POST /queues/:queue/pause", "GET /dashboard/queues/:queue",
		"ANY /health", "ANY /events/queues/:queue", "OPTIONS /*", "POST /gc", "GET /prometheus"} {
		if !keys[k] {
			t.Errorf("route %s not found by the parser", k)
		}
	}
	for k := range paritySpecs {
		if !keys[k] {
			t.Errorf("paritySpecs has %s, which the reference does not serve (any more)", k)
		}
	}

	ref, ours := startParityPair(t, "")
	p := &parityRun{t: t, ref: ref, our: ours, diffs: map[string][]string{}, requests: map[string][]string{}, matched: map[int]bool{}}
	compared := map[string]bool{}
	n := 0
	for _, r := range routes {
		n++
		q := fmt.Sprintf("parity%02d", n)
		switch {
		case r.method == "OPTIONS":
			h := map[string]string{"Origin": "http://localhost", "Access-Control-Request-Method": "POST"}
			req := parityReq{method: "OPTIONS", path: "/queues/q/jobs", hdr: h}
			p.compare(r.key(), req, req, nil, q)
		case r.anyMethod && (strings.HasPrefix(r.path, "/ws") || strings.HasPrefix(r.path, "/events")):
			p.probeLive(r, q)
		case r.anyMethod:
			for _, m := range []string{"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"} {
				req := parityReq{method: m, path: r.path}
				p.compare(r.key(), req, req, nil, q)
			}
		default:
			spec, ok := paritySpecs[r.key()]
			if !ok {
				t.Errorf("no request for the reference's route %s (%s): add one to paritySpecs", r.key(), r.file)
				continue
			}
			p.probeRoute(r, spec, q)
		}
		compared[r.key()] = true
	}

	// Another method on each known path: 405 with Allow in queued.
	paths := map[string]bool{}
	for _, r := range routes {
		if !r.anyMethod && r.method != "OPTIONS" && !paths[r.path] {
			paths[r.path] = true
			concrete := strings.NewReplacer(":queue", "parity-other", ":id", "parity-other", ":customId", "parity-other", ":name", "parity-other").Replace(r.path)
			req := parityReq{method: "PATCH", path: concrete}
			p.compare("OTHER-METHOD "+r.path, req, req, nil, "")
		}
	}
	// Browsers (issue 14's guards).
	q := "parity-browser"
	cross := parityReq{method: "POST", path: "/queues/" + q + "/pause", hdr: map[string]string{"Origin": "http://evil.example"}}
	p.compare("POST /queues/:queue/pause (cross-origin page)", cross, cross, nil, q)
	rebound := parityReq{method: "GET", path: "/stats", host: "evil.example", hdr: map[string]string{"User-Agent": "Mozilla/5.0"}}
	p.compare("GET /stats (browser, unknown Host)", rebound, rebound, nil, q)

	// With tokens.
	tref, tours := startParityPair(t, "parity-secret")
	tp := &parityRun{t: t, ref: tref, our: tours, diffs: p.diffs, requests: p.requests, matched: p.matched}
	for _, c := range []struct {
		route string
		req   parityReq
	}{
		{"GET /stats (bare token)", parityReq{method: "GET", path: "/stats", noToken: true, hdr: map[string]string{"Authorization": "parity-secret"}}},
		{"GET /stats (no token)", parityReq{method: "GET", path: "/stats", noToken: true}},
		{"GET /stats (wrong token)", parityReq{method: "GET", path: "/stats", noToken: true, hdr: map[string]string{"Authorization": "Bearer nope"}}},
		{"GET /nope (no token)", parityReq{method: "GET", path: "/nope", noToken: true}},
		{"PUT /jobs/:id (no token)", parityReq{method: "PUT", path: "/jobs/x", noToken: true}},
		{"POST /gc (no token)", parityReq{method: "POST", path: "/gc", noToken: true}},
		{"GET /heapstats (no token)", parityReq{method: "GET", path: "/heapstats", noToken: true}},
		{"GET /health (no token)", parityReq{method: "GET", path: "/health", noToken: true}},
		{"GET /health (token)", parityReq{method: "GET", path: "/health"}},
		{"GET /ready (no token)", parityReq{method: "GET", path: "/ready", noToken: true}},
		{"GET /healthz (no token)", parityReq{method: "GET", path: "/healthz", noToken: true}},
		{"GET /prometheus (no token)", parityReq{method: "GET", path: "/prometheus", noToken: true}},
		{"GET /events (no token)", parityReq{method: "GET", path: "/events", noToken: true}},
	} {
		tp.compare(c.route, c.req, c.req, nil, "")
	}
	p.probes += tp.probes

	// The verdict.
	var routesWith []string
	for r := range p.diffs {
		routesWith = append(routesWith, r)
	}
	sort.Strings(routesWith)
	accepted := 0
	for _, r := range routesWith {
		var bad []string
		for _, d := range p.diffs[r] {
			if i := acceptedFor(r, d); i >= 0 {
				p.matched[i] = true
				accepted++
				continue
			}
			bad = append(bad, d)
		}
		if len(bad) > 0 {
			t.Errorf("%s differs from the reference:\n  %s\n  answers:\n  %s", r, strings.Join(bad, "\n  "), strings.Join(p.requests[r], "\n  "))
		}
	}
	for i, a := range parityAccepted {
		if !p.matched[i] {
			t.Errorf("accepted difference %q (%q) no longer happens: remove it from parityAccepted and docs/http-api.md", a.route, a.what)
		}
	}
	matching := 0
	for k := range compared {
		if len(p.diffs[k]) == 0 {
			matching++
		}
	}
	t.Logf("routes parsed: %d (%d bound to a method); routes compared: %d, matching: %d, with accepted differences: %d; requests compared: %d; difference lines covered by the %d accepted entries: %d",
		len(routes), bound, len(compared), matching, len(compared)-matching, p.probes, len(parityAccepted), accepted)
}

// probeRoute compares a route bound to a method: with its fixture, then
// with ids that do not exist, then (for a route with a body) with a body
// that is not JSON.
func (p *parityRun) probeRoute(r refRoute, spec paritySpec, q string) {
	t := p.t
	t.Helper()
	rf, of := &parityFx{q: q}, &parityFx{q: q}
	spec.setup(t, p.ref, rf)
	spec.setup(t, p.our, of)
	build := func(f *parityFx) parityReq {
		req := parityReq{method: r.method, path: f.fill(spec.path)}
		if spec.query != "" {
			req.path += "?" + spec.query
		}
		if spec.body != nil {
			req.body = spec.body(f)
		}
		return req
	}
	p.compare(r.key(), build(rf), build(of), spec.same, q)
	for _, v := range spec.variants {
		rr, or := build(rf), build(of)
		rr.path, or.path = rf.fill(spec.path)+"?"+v.query, of.fill(spec.path)+"?"+v.query
		p.compare(r.key(), rr, or, v.same, q)
	}

	// Ids that name nothing: the error statuses and shapes.
	if strings.Contains(r.path, "/:id") || strings.Contains(r.path, "/:customId") || strings.Contains(r.path, "/:name") {
		missing := &parityFx{q: q + "-missing", id: "parity-missing", token: "parity-missing", custom: "parity-missing",
			cron: "parity-missing", webhook: "parity-missing", worker: "parity-missing"}
		p.compare(r.key(), build(missing), build(missing), nil, q)
	}
	// A body that is not JSON.
	if r.method == "POST" || r.method == "PUT" {
		f := &parityFx{q: q + "-bad", id: "parity-missing", custom: "parity-missing", cron: "parity-missing",
			webhook: "parity-missing", worker: "parity-missing"}
		req := build(f)
		req.body = `{"x":`
		p.compare(r.key(), req, req, nil, q)
	}
}

// probeLive compares the live routes: a WebSocket handshake (101) or an
// event stream's first event, and the other methods.
func (p *parityRun) probeLive(r refRoute, q string) {
	path := strings.ReplaceAll(r.path, ":queue", q)
	if r.prefix {
		path += "other"
	}
	ws := strings.HasPrefix(r.path, "/ws")
	if ws {
		p.probes++
		rc, rl := parityWSHandshake(p.t, p.ref, path)
		oc, ol := parityWSHandshake(p.t, p.our, path)
		if rc != oc {
			p.diffs[r.key()] = append(p.diffs[r.key()], fmt.Sprintf("GET %s: handshake status %d, queued %d", path, rc, oc))
			p.requests[r.key()] = append(p.requests[r.key()], fmt.Sprintf("GET %s\n    reference: %s\n    queued:    %s", path, rl, ol))
		}
	} else {
		p.compare(r.key(), parityReq{method: "GET", path: path}, parityReq{method: "GET", path: path}, nil, q)
	}
	if r.prefix {
		return
	}
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		// A stream answers at once; the probe reads its first event.
		req := parityReq{method: m, path: path}
		p.compare(r.key(), req, req, nil, q)
	}
}

// parityWSHandshake sends a WebSocket handshake and returns the status
// and status line.
func parityWSHandshake(t *testing.T, s *paritySide, path string) (int, string) {
	t.Helper()
	addr := strings.TrimPrefix(s.base, "http://")
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", path, addr)
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, err.Error()
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0, line
	}
	code, _ := strconv.Atoi(f[1])
	return code, strings.TrimSpace(line)
}

// TestRouteParityDocs checks that every accepted difference is listed in
// docs/http-api.md's "Differences from the reference", and that the README
// points there.
func TestRouteParityDocs(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/http-api.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "\n## Differences from the reference\n")
	if !ok {
		t.Fatal(`docs/http-api.md has no "## Differences from the reference" section`)
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	var routes []string
	for _, a := range parityAccepted {
		if !slices.Contains(routes, a.route) {
			routes = append(routes, a.route)
		}
	}
	for _, r := range routes {
		if !strings.Contains(sec, "`"+r+"`") {
			t.Errorf("accepted difference `%s` is not listed in docs/http-api.md's Differences from the reference", r)
		}
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "docs/http-api.md#differences-from-the-reference") {
		t.Error("README.md does not point to docs/http-api.md#differences-from-the-reference")
	}
}
