package main

// The reference's REST routes: the same paths, methods, JSON shapes and
// status codes. Most run one protocol command (see http.go); the few that
// the reference answers from its own state are built here from the same
// broker figures as the commands.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// ---------------------------------------------------------------------------
// Requests: commands built from a path and a body

// cmdReq builds a protocol request map. Absent values are left out, as
// JavaScript's undefined fields are when the reference packs a command.
type cmdReq struct {
	e  Enc
	at int
	n  int
}

func newCmd(name string) *cmdReq {
	c := &cmdReq{}
	c.at = c.e.OpenMap()
	return c.str("cmd", name)
}

func (c *cmdReq) str(k, v string) *cmdReq {
	c.e.Str(k)
	c.e.Str(v)
	c.n++
	return c
}

func (c *cmdReq) num(k string, v int64) *cmdReq {
	c.e.Str(k)
	c.e.Int(v)
	c.n++
	return c
}

func (c *cmdReq) boolean(k string, v bool) *cmdReq {
	c.e.Str(k)
	c.e.Bool(v)
	c.n++
	return c
}

// raw adds a value from a body; nil (absent) adds nothing.
func (c *cmdReq) raw(k string, v Raw) *cmdReq {
	if v == nil {
		return c
	}
	c.e.Str(k)
	c.e.Raw(v)
	c.n++
	return c
}

// from copies body fields under the same names.
func (c *cmdReq) from(body Map, keys ...string) *cmdReq {
	for _, k := range keys {
		c.raw(k, body.Get(k))
	}
	return c
}

func (c *cmdReq) done() Map {
	c.e.CloseMap(c.at, c.n)
	m, _ := ParseMap(c.e.B, nil)
	return m
}

// body modes of a route.
const (
	bodyNone     = iota // not read
	bodyOptional        // empty means {}, as the reference's parseJsonBody has it
	bodyRequired        // empty is a 400, as its request.json() has it
)

// httpError is an answer other than the command's.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(msg string) error { return &httpError{http.StatusBadRequest, msg} }

// readBody reads a JSON object body, bounded, into MessagePack.
func readBody(w http.ResponseWriter, r *http.Request, mode int) (Map, error) {
	if mode == bodyNone {
		return Map{}, nil
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxHTTPBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return Map{}, &httpError{http.StatusRequestEntityTooLarge,
				"request body over " + strconv.FormatInt(mbe.Limit, 10) + " bytes"}
		}
		return Map{}, badRequest("reading the request body: " + err.Error())
	}
	if len(bytes.TrimSpace(data)) == 0 {
		if mode == bodyOptional {
			return Map{}, nil
		}
		return Map{}, badRequest("Invalid JSON body: the body is empty; send a JSON object")
	}
	mp, err := jsonToMsgpack(data)
	if err != nil {
		return Map{}, badRequest("Invalid JSON body: " + strings.TrimPrefix(err.Error(), "invalid JSON: "))
	}
	m, err := ParseMap(mp, nil)
	if err != nil {
		return Map{}, badRequest("Invalid JSON body: expected a JSON object")
	}
	return m, nil
}

// exec runs one protocol command for an HTTP request and returns its
// answer, a MessagePack map. A command that waits (a long-poll PULL,
// WaitJob) is waited for; the client hanging up or the server shutting
// down ends it as a shutdown ends it on TCP, with an empty answer.
func (a *httpAPI) exec(r *http.Request, m Map) Map {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(a.ctx, cancel)()
	async := make(chan []byte, 1)
	// An answer that comes later gives its room back once handed over
	// (goAsync): it is counted again before, until written.
	c := newVirtualConn(a.srv, ctx, a.srv.httpClientKey(r), func(f []byte) {
		a.srv.answers.hold(int64(len(f)))
		async <- f
	}, true)
	c.json = true
	var e Enc
	reserved := c.dispatch(m, &e)
	f := e.B
	if len(f) == 0 {
		f = <-async
		reserved += int64(len(f))
	}
	// The answer's room stays reserved until it has been rendered and
	// written (writeJSONBytes), or the request is over.
	if ra := restAnswerOf(r); ra != nil {
		ra.reserved += reserved
	} else {
		a.srv.answers.free(reserved)
	}
	c.finishVirtual()
	ans, _ := ParseMap(f[4:], nil)
	return ans
}

// answerOK reports the ok field of an answer.
func answerOK(m Map) bool {
	v, _, _ := m.Bool("ok")
	return v
}

// writeAnswer sends a command's answer as JSON: 200 when ok, errCode when
// not.
func writeAnswer(w http.ResponseWriter, ans Map, errCode int) {
	code := http.StatusOK
	if !answerOK(ans) {
		code = errCode
		if msg, _, _ := ans.Str("error"); strings.HasPrefix(msg, busyPrefix) {
			// The answer budget had no room: the request may be repeated.
			code = http.StatusServiceUnavailable
			w.Header().Set("Retry-After", "1")
		}
	}
	writeJSONWith(w, code, func(o *jsonObj) { o.fields(ans) })
}

// jsonObj writes one JSON object, field by field, into its jsonOut: into
// memory, or a piece at a time to where the jsonOut's sink sends it.
type jsonObj struct {
	jsonOut
	n int
}

// newJSONObj is an object opened, for writing member after member:
// newJSONObj().str("a", "x").num("b", 1).close().
func newJSONObj() *jsonObj { return &jsonObj{jsonOut: jsonOut{b: []byte{'{'}}} }

// fields writes a parsed map's fields as members, in its order.
func (o *jsonObj) fields(m Map) *jsonObj {
	for _, f := range m.Fields {
		o.raw(string(f.Key), f.Val)
	}
	return o
}

func (o *jsonObj) open() { o.b = append(o.b, '{') }

func (o *jsonObj) close() []byte { return append(o.b, '}') }

func (o *jsonObj) key(k string) *jsonObj {
	if o.err != nil {
		// The client is gone: nothing more is rendered for it.
		o.b = o.b[:0]
		return o
	}
	if o.n > 0 {
		o.b = append(o.b, ',')
	}
	o.n++
	o.b = appendJSONString(o.b, []byte(k))
	o.b = append(o.b, ':')
	return o
}

// raw writes a MessagePack value; undefined is left out, as
// JSON.stringify leaves it out.
func (o *jsonObj) raw(k string, v Raw) *jsonObj {
	if len(v) == 0 || isUndefined(v) {
		return o
	}
	o.key(k)
	o.value(v)
	return o
}

// object writes member k as an object whose members f writes, in place:
// into the same output, a piece at a time when it streams.
func (o *jsonObj) object(k string, f func(sub *jsonObj)) *jsonObj {
	o.key(k)
	sub := jsonObj{jsonOut: o.jsonOut}
	sub.open()
	f(&sub)
	sub.b = append(sub.b, '}')
	o.jsonOut = sub.jsonOut
	return o
}

// rawArray writes member k as an array of MessagePack values.
func (o *jsonObj) rawArray(k string, items []Raw) *jsonObj {
	o.key(k)
	o.b = append(o.b, '[')
	for i, it := range items {
		if i > 0 {
			o.b = append(o.b, ',')
		}
		o.value(it)
	}
	o.b = append(o.b, ']')
	return o
}

// value writes a MessagePack value where a member's value or an array's
// element goes; one that is not valid MessagePack (nothing is written of
// it: raw checks it whole first) is null.
func (o *jsonObj) value(v Raw) {
	if o.err != nil {
		return
	}
	sent := o.sent
	if err := o.jsonOut.raw(v); err != nil && o.err == nil && o.sent == sent {
		o.b = append(o.b, "null"...)
	}
}

// json writes a member whose value is JSON already; a nil value stands
// for undefined, and the member is left out.
func (o *jsonObj) json(k string, v []byte) *jsonObj {
	if v == nil {
		return o
	}
	o.key(k)
	o.b = append(o.b, v...)
	return o
}

func (o *jsonObj) int(k string, v int64) *jsonObj {
	o.key(k)
	o.b = strconv.AppendInt(o.b, v, 10)
	return o
}

func (o *jsonObj) num(k string, v float64) *jsonObj {
	o.key(k)
	o.b = appendJSONNumber(o.b, v)
	return o
}

func (o *jsonObj) boolean(k string, v bool) *jsonObj {
	o.key(k)
	o.b = strconv.AppendBool(o.b, v)
	return o
}

func (o *jsonObj) str(k, v string) *jsonObj {
	o.key(k)
	o.b = appendJSONString(o.b, []byte(v))
	return o
}

// spread writes the members of a JSON object, as {...obj} does.
func (o *jsonObj) spread(obj []byte) *jsonObj {
	obj = bytes.TrimSpace(obj)
	if len(obj) < 2 || obj[0] != '{' {
		return o
	}
	inner := bytes.TrimSpace(obj[1 : len(obj)-1])
	if len(inner) == 0 {
		return o
	}
	if o.n > 0 {
		o.b = append(o.b, ',')
	}
	o.n++
	o.b = append(o.b, inner...)
	return o
}

// jsonMarshal is json.Marshal without HTML escaping, as JSON.stringify
// writes.
func jsonMarshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// ---------------------------------------------------------------------------
// Route helpers

// commandHandler answers a route with one command: the body read as the
// route's body mode, the command built from it and the path, and the
// command's answer, with rt.fail as the status of an ok:false one.
func (a *httpAPI) commandHandler(rt restRoute) func(w http.ResponseWriter, r *http.Request, p []string) {
	return func(w http.ResponseWriter, r *http.Request, p []string) {
		b, err := readBody(w, r, rt.body)
		if err != nil {
			writeHTTPError(w, err)
			return
		}
		c, err := rt.build(p, b)
		if err != nil {
			writeHTTPError(w, err)
			return
		}
		writeAnswer(w, a.exec(r, c.done()), rt.fail)
	}
}

// bodyCmd builds the command with the body's fields under the same names.
func bodyCmd(name string, fields ...string) cmdBuilder {
	return func(_ []string, b Map) (*cmdReq, error) {
		return newCmd(name).from(b, fields...), nil
	}
}

// paramCmd builds the command with the path's parameter under key, and
// the body's fields under the same names.
func paramCmd(key, name string, fields ...string) cmdBuilder {
	return func(p []string, b Map) (*cmdReq, error) {
		return newCmd(name).str(key, p[0]).from(b, fields...), nil
	}
}

// queueCmd is paramCmd for a route on /queues/:queue/...
func queueCmd(name string, fields ...string) cmdBuilder { return paramCmd("queue", name, fields...) }

// jobCmd is paramCmd for a route on /jobs/:id/...
func jobCmd(name string, fields ...string) cmdBuilder { return paramCmd("id", name, fields...) }

// queueConfigCmd builds a queue's Set*Config command from the body's
// config field, or the whole body.
func queueConfigCmd(name string) cmdBuilder {
	return func(p []string, b Map) (*cmdReq, error) {
		return newCmd(name).str("queue", p[0]).raw("config", configOrBody(b)), nil
	}
}

func writeHTTPError(w http.ResponseWriter, err error) {
	var he *httpError
	if errors.As(err, &he) {
		writeJSON(w, he.code, map[string]any{"ok": false, "error": he.msg})
		return
	}
	writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false, "error": err.Error()})
}

// jsParseInt reads a number as JavaScript's parseInt(s, 10) does, which
// is how the reference reads its integer query parameters, so that a
// script's "timeout=5000ms" or "offset=2.5" means there what it means
// here: leading white space, a sign, and the digits after them ("5000ms"
// is 5000). ok is false where parseInt gives NaN: no digits. Values past
// 2^53 are held there, where a JavaScript number stops being exact.
func jsParseInt(s string) (n int64, ok bool) {
	s = strings.TrimLeft(s, " \t\n\v\f\r\u00a0\ufeff")
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg = s[0] == '-'
		s = s[1:]
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			break
		}
		ok = true
		n = min(n*10+int64(c-'0'), 1<<53)
	}
	if neg {
		n = -n
	}
	return n, ok
}

// pageBounds is the page [lo, hi) of n items that starts at offset and
// holds at most limit of them (all the rest without a limit): a negative
// offset or limit counts as 0, and no value, however large, overflows.
func pageBounds(n int, offset, limit int64, hasLimit bool) (lo, hi int) {
	lo = int(min(max(offset, 0), int64(n)))
	if !hasLimit {
		return lo, n
	}
	return lo, lo + int(min(max(limit, 0), int64(n-lo)))
}

// ---------------------------------------------------------------------------
// The routes

// Statuses of a command route's ok:false answer.
const (
	failOK       = http.StatusOK // where the reference always answers 200
	failBad      = http.StatusBadRequest
	failNotFound = http.StatusNotFound
)

// cmdBuilder makes a route's command from the path's parameters and the
// body.
type cmdBuilder func(p []string, b Map) (*cmdReq, error)

// restRoute is one REST route: one answered by a command (build, with its
// body mode and the status of an ok:false answer), or one with a handler
// of its own (serve).
type restRoute struct {
	method, path string
	fail         int // the status of an ok:false answer
	body         int // bodyNone, bodyOptional or bodyRequired
	build        cmdBuilder
	serve        func(a *httpAPI, w http.ResponseWriter, r *http.Request, p []string)
	flags        routeFlags
}

// restRoutes are the reference's REST routes, in its order of matching
// (the first route that matches wins: /jobs/custom/:id before /jobs/:id).
var restRoutes = []restRoute{
	// Figures
	{method: "GET", path: "/stats", serve: (*httpAPI).serveStats},
	{method: "GET", path: "/dashboard", serve: (*httpAPI).serveDashboard},
	{method: "GET", path: "/dashboard/queues", serve: (*httpAPI).serveDashboardQueues},
	{method: "GET", path: "/dashboard/queues/:queue", serve: (*httpAPI).serveDashboardQueue},
	{method: "POST", path: "/gc", serve: (*httpAPI).serveGC},
	// A full collection: not for any page to trigger.
	{method: "GET", path: "/heapstats", serve: (*httpAPI).serveHeapStats, flags: routeEffects},

	// Jobs
	{method: "POST", path: "/jobs/ack-batch", fail: failBad, body: bodyOptional, build: bodyCmd("ACKB", "ids", "results", "tokens")},
	{method: "POST", path: "/jobs/extend-locks", fail: failBad, body: bodyOptional, build: bodyCmd("ExtendLocks", "ids", "tokens", "durations")},
	{method: "POST", path: "/jobs/heartbeat-batch", fail: failBad, body: bodyOptional, build: bodyCmd("JobHeartbeatB", "ids", "tokens")},
	{method: "GET", path: "/jobs/custom/:id", fail: failNotFound, build: paramCmd("customId", "GetJobByCustomId")},
	{method: "GET", path: "/jobs/:id", fail: failNotFound, build: jobCmd("GetJob")},
	{method: "DELETE", path: "/jobs/:id", fail: failOK, build: jobCmd("Cancel")},
	{method: "POST", path: "/jobs/:id/ack", fail: failBad, body: bodyOptional, build: jobCmd("ACK", "result", "token")},
	{method: "POST", path: "/jobs/:id/fail", fail: failBad, body: bodyOptional, build: jobCmd("FAIL", "error", "token", "unrecoverable", "stack")},
	{method: "POST", path: "/jobs/:id/promote", fail: failBad, build: jobCmd("Promote")},
	{method: "PUT", path: "/jobs/:id/data", fail: failBad, body: bodyRequired, build: jobCmd("Update", "data")},
	{method: "GET", path: "/jobs/:id/state", fail: failNotFound, build: jobCmd("GetState")},
	{method: "GET", path: "/jobs/:id/result", fail: failNotFound, build: jobCmd("GetResult")},
	{method: "GET", path: "/jobs/:id/progress", fail: failNotFound, build: jobCmd("GetProgress")},
	{method: "POST", path: "/jobs/:id/progress", fail: failBad, body: bodyOptional, build: jobCmd("Progress", "progress", "message")},
	{method: "PUT", path: "/jobs/:id/priority", fail: failBad, body: bodyOptional, build: jobCmd("ChangePriority", "priority", "lifo")},
	{method: "POST", path: "/jobs/:id/discard", fail: failBad, build: jobCmd("Discard")},
	{method: "POST", path: "/jobs/:id/move-to-delayed", fail: failBad, body: bodyOptional, build: jobCmd("MoveToDelayed", "delay", "token")},
	{method: "PUT", path: "/jobs/:id/delay", fail: failBad, body: bodyOptional, build: jobCmd("ChangeDelay", "delay")},
	{method: "GET", path: "/jobs/:id/children", fail: failNotFound, build: jobCmd("GetChildrenValues")},
	{method: "GET", path: "/jobs/:id/logs", fail: failOK, build: jobCmd("GetLogs")},
	{method: "POST", path: "/jobs/:id/logs", fail: failBad, body: bodyOptional, build: jobCmd("AddLog", "message", "level")},
	{method: "DELETE", path: "/jobs/:id/logs", fail: failOK, build: jobCmd("ClearLogs")},
	{method: "POST", path: "/jobs/:id/heartbeat", fail: failBad, body: bodyOptional, build: jobCmd("JobHeartbeat", "token", "duration")},
	{method: "POST", path: "/jobs/:id/wait", fail: failOK, body: bodyOptional, build: jobCmd("WaitJob", "timeout")},
	{method: "POST", path: "/jobs/:id/extend-lock", fail: failBad, body: bodyOptional, build: jobCmd("ExtendLock", "duration", "token")},
	{method: "POST", path: "/jobs/:id/move-to-wait", fail: failBad, body: bodyOptional, build: jobCmd("MoveToWait", "token")},

	// Queues
	{method: "GET", path: "/queues", fail: failOK, build: bodyCmd("ListQueues")},
	{method: "GET", path: "/queues/summary", serve: (*httpAPI).serveQueuesSummary},
	{method: "POST", path: "/queues/:queue/jobs", fail: failBad, body: bodyRequired, build: pushCmd},
	// A GET that claims a job: a route with effects.
	{method: "GET", path: "/queues/:queue/jobs", serve: (*httpAPI).servePull, flags: routeEffects},
	{method: "POST", path: "/queues/:queue/jobs/bulk", fail: failBad, body: bodyRequired, build: pushBulkCmd},
	{method: "POST", path: "/queues/:queue/jobs/pull-batch", fail: failOK, body: bodyOptional, build: queueCmd("PULLB", "count", "timeout", "owner", "lockTtl")},
	{method: "GET", path: "/queues/:queue/jobs/list", serve: (*httpAPI).serveJobsList},
	{method: "GET", path: "/queues/:queue/workers", serve: (*httpAPI).serveQueueWorkers},
	{method: "GET", path: "/queues/:queue/counts", fail: failOK, build: queueCmd("GetJobCounts")},
	{method: "GET", path: "/queues/:queue/count", fail: failOK, build: queueCmd("Count")},
	{method: "GET", path: "/queues/:queue/priority-counts", fail: failOK, build: queueCmd("GetCountsPerPriority")},
	{method: "GET", path: "/queues/:queue/paused", fail: failOK, build: queueCmd("IsPaused")},
	{method: "POST", path: "/queues/:queue/pause", fail: failOK, build: queueCmd("Pause")},
	{method: "POST", path: "/queues/:queue/resume", fail: failOK, build: queueCmd("Resume")},
	{method: "POST", path: "/queues/:queue/drain", fail: failOK, build: queueCmd("Drain")},
	{method: "POST", path: "/queues/:queue/obliterate", fail: failOK, build: queueCmd("Obliterate")},
	{method: "POST", path: "/queues/:queue/clean", fail: failOK, body: bodyOptional, build: cleanCmd},
	{method: "POST", path: "/queues/:queue/promote-jobs", fail: failOK, body: bodyOptional, build: queueCmd("PromoteJobs", "count")},
	{method: "POST", path: "/queues/:queue/retry-completed", fail: failOK, body: bodyOptional, build: queueCmd("RetryCompleted", "id")},

	// Dead-letter queue and queue settings
	{method: "GET", path: "/queues/:queue/dlq/stats", serve: (*httpAPI).serveDLQStats},
	{method: "GET", path: "/queues/:queue/dlq", serve: (*httpAPI).serveDLQ},
	{method: "POST", path: "/queues/:queue/dlq/retry", fail: failOK, body: bodyOptional, build: queueCmd("RetryDlq", "jobId")},
	{method: "POST", path: "/queues/:queue/dlq/purge", fail: failOK, build: queueCmd("PurgeDlq")},
	{method: "PUT", path: "/queues/:queue/rate-limit", fail: failOK, body: bodyOptional, build: queueCmd("RateLimit", "limit", "duration", "ttl")},
	{method: "DELETE", path: "/queues/:queue/rate-limit", fail: failOK, build: queueCmd("RateLimitClear")},
	{method: "PUT", path: "/queues/:queue/concurrency", fail: failOK, body: bodyOptional, build: setConcurrencyCmd},
	{method: "DELETE", path: "/queues/:queue/concurrency", fail: failOK, build: queueCmd("ClearConcurrency")},
	{method: "GET", path: "/queues/:queue/stall-config", fail: failOK, build: queueCmd("GetStallConfig")},
	{method: "PUT", path: "/queues/:queue/stall-config", fail: failOK, body: bodyOptional, build: queueConfigCmd("SetStallConfig")},
	{method: "GET", path: "/queues/:queue/dlq-config", fail: failOK, build: queueCmd("GetDlqConfig")},
	{method: "PUT", path: "/queues/:queue/dlq-config", fail: failOK, body: bodyOptional, build: queueConfigCmd("SetDlqConfig")},

	// Schedules, webhooks, workers
	{method: "GET", path: "/crons", fail: failOK, build: bodyCmd("CronList")},
	{method: "POST", path: "/crons", fail: failBad, body: bodyRequired, build: cronCmd},
	{method: "GET", path: "/crons/:name", fail: failNotFound, build: paramCmd("name", "CronGet")},
	{method: "DELETE", path: "/crons/:name", fail: failNotFound, build: paramCmd("name", "CronDelete")},
	{method: "GET", path: "/webhooks", fail: failOK, build: bodyCmd("ListWebhooks")},
	{method: "POST", path: "/webhooks", fail: failBad, body: bodyRequired, build: bodyCmd("AddWebhook", "url", "events", "queue", "secret")},
	{method: "DELETE", path: "/webhooks/:id", fail: failNotFound, build: paramCmd("webhookId", "RemoveWebhook")},
	{method: "PUT", path: "/webhooks/:id/enabled", fail: failBad, body: bodyOptional, build: paramCmd("id", "SetWebhookEnabled", "enabled")},
	{method: "GET", path: "/workers", fail: failOK, build: bodyCmd("ListWorkers")},
	{method: "POST", path: "/workers", fail: failBad, body: bodyRequired,
		build: bodyCmd("RegisterWorker", "name", "queues", "concurrency", "workerId", "hostname", "pid", "startedAt")},
	{method: "DELETE", path: "/workers/:id", fail: failNotFound, build: paramCmd("workerId", "UnregisterWorker")},
	{method: "POST", path: "/workers/:id/heartbeat", serve: (*httpAPI).serveWorkerHeartbeat},
	{method: "GET", path: "/ping", fail: failOK, build: bodyCmd("Ping")},
	{method: "GET", path: "/storage", fail: failOK, build: bodyCmd("StorageStatus")},
}

func (a *httpAPI) addRESTRoutes() {
	for _, rt := range restRoutes {
		if rt.serve == nil {
			a.handle(rt.method, rt.path, rt.flags, a.commandHandler(rt))
			continue
		}
		a.handle(rt.method, rt.path, rt.flags, func(w http.ResponseWriter, r *http.Request, p []string) {
			rt.serve(a, w, r, p)
		})
	}
}

// pushCmd builds POST /queues/:queue/jobs's PUSH: a job without a string
// name is named "default", and attempts is maxAttempts' older name, as in
// the reference.
func pushCmd(p []string, b Map) (*cmdReq, error) {
	c := newCmd("PUSH").str("queue", p[0])
	if name, err := b.Get("name").Str(); err == nil {
		c.str("name", name)
	} else {
		c.str("name", "default")
	}
	c.from(b, "data", "priority", "delay")
	if v := b.Get("maxAttempts"); v != nil {
		c.raw("maxAttempts", v)
	} else {
		c.raw("maxAttempts", b.Get("attempts"))
	}
	return c.from(b, "backoff", "timeout", "jobId", "removeOnComplete", "removeOnFail", "durable", "ttl",
		"uniqueKey", "groupId", "dependsOn", "tags", "lifo", "repeat"), nil
}

// pushBulkCmd builds POST /queues/:queue/jobs/bulk's PUSHB.
func pushBulkCmd(p []string, b Map) (*cmdReq, error) {
	jobs, err := withDefaultNames(b.Get("jobs"))
	if err != nil {
		return nil, err
	}
	return newCmd("PUSHB").str("queue", p[0]).raw("jobs", jobs), nil
}

// cleanCmd builds POST /queues/:queue/clean's Clean. A grace that is not
// a number is 0, as the reference reads it.
func cleanCmd(p []string, b Map) (*cmdReq, error) {
	c := newCmd("Clean").str("queue", p[0])
	if g := b.Get("grace"); g != nil {
		if _, err := g.Float(); err == nil {
			c.raw("grace", g)
		} else {
			c.num("grace", 0)
		}
	} else {
		c.num("grace", 0)
	}
	return c.from(b, "state", "limit"), nil
}

// setConcurrencyCmd builds PUT /queues/:queue/concurrency's
// SetConcurrency: the natural field name, concurrency, as well as the
// command's own, limit.
func setConcurrencyCmd(p []string, b Map) (*cmdReq, error) {
	v := b.Get("concurrency")
	if v == nil || v.IsNil() {
		v = b.Get("limit")
	}
	return newCmd("SetConcurrency").str("queue", p[0]).raw("limit", v), nil
}

// cronCmd builds POST /crons's Cron: a schedule without a string jobName
// makes jobs named "default".
func cronCmd(_ []string, b Map) (*cmdReq, error) {
	c := newCmd("Cron").from(b, "name")
	if jn, err := b.Get("jobName").Str(); err == nil {
		c.str("jobName", jn)
	} else {
		c.str("jobName", "default")
	}
	return c.from(b, "queue", "data", "schedule", "repeatEvery", "priority", "maxLimit", "timezone", "uniqueKey",
		"dedup", "skipMissedOnRestart", "immediately", "skipIfNoWorker", "preventOverlap", "jobOptions"), nil
}

// GET /queues/:queue/jobs?timeout=: PULL, a long poll when timeout is set.
// The timeout is read as the reference reads it (jsParseInt); one that is
// not a number at all, an empty one included, is PULL's own ok:false
// answer, with a 200 as all of this route's answers.
func (a *httpAPI) servePull(w http.ResponseWriter, r *http.Request, p []string) {
	var timeout int64
	if vs, set := r.URL.Query()["timeout"]; set {
		var ok bool
		if timeout, ok = jsParseInt(vs[0]); !ok {
			writeJSON(w, http.StatusOK, map[string]any{"ok": false, "error": "timeout must be a finite number"})
			return
		}
	}
	writeAnswer(w, a.exec(r, newCmd("PULL").str("queue", p[0]).num("timeout", timeout).done()), http.StatusOK)
}

// POST /workers/:id/heartbeat: the body is optional and, as in the
// reference, ignored when it is not JSON.
func (a *httpAPI) serveWorkerHeartbeat(w http.ResponseWriter, r *http.Request, p []string) {
	b, err := readBody(w, r, bodyOptional)
	var he *httpError
	if errors.As(err, &he) && he.code == http.StatusRequestEntityTooLarge {
		writeHTTPError(w, err)
		return
	}
	c := newCmd("Heartbeat").str("id", p[0]).from(b, "activeJobs", "processed", "failed")
	writeAnswer(w, a.exec(r, c.done()), http.StatusOK)
}

// configOrBody is the body's config field, or the whole body when it has
// none.
func configOrBody(b Map) Raw {
	if v := b.Get("config"); v != nil && !v.IsNil() {
		return v
	}
	var e Enc
	e.MapHead(len(b.Fields))
	for _, f := range b.Fields {
		e.Str(string(f.Key))
		e.Raw(f.Val)
	}
	return e.B
}

// withDefaultNames gives every job of a bulk push without a string name
// the name "default", as the reference does; items that are not objects
// are left for PUSHB to refuse.
func withDefaultNames(jobs Raw) (Raw, error) {
	var e Enc
	if jobs == nil || jobs.IsNil() {
		e.ArrayHead(0)
		return e.B, nil
	}
	items, err := jobs.Array()
	if err != nil {
		return nil, badRequest("jobs must be an array")
	}
	e.ArrayHead(len(items))
	for _, it := range items {
		m, err := ParseMap(it, nil)
		if err != nil {
			e.Raw(it)
			continue
		}
		if _, err := m.Get("name").Str(); err == nil {
			e.Raw(it)
			continue
		}
		kept := slices.DeleteFunc(m.Fields, func(f Field) bool { return string(f.Key) == "name" })
		e.MapHead(len(kept) + 1)
		for _, f := range kept {
			e.Str(string(f.Key))
			e.Raw(f.Val)
		}
		e.Str("name")
		e.Str("default")
	}
	return e.B, nil
}

// GET /queues/:queue/jobs/list: GetJobs with the states from state=,
// status= or states= (repeated or comma-separated).
func (a *httpAPI) serveJobsList(w http.ResponseWriter, r *http.Request, p []string) {
	q := r.URL.Query()
	var states []string
	for _, k := range []string{"state", "status", "states"} {
		for _, v := range q[k] {
			for s := range strings.SplitSeq(v, ",") {
				if s = strings.TrimSpace(s); s != "" {
					states = append(states, s)
				}
			}
		}
	}
	c := newCmd("GetJobs").str("queue", p[0])
	switch len(states) {
	case 0:
	case 1:
		c.str("state", states[0])
	default:
		var e Enc
		strArray(&e, states)
		c.raw("state", e.B)
	}
	// limit and offset as the reference reads them: empty is absent, and
	// a value that is not a number makes the page's bounds NaN there,
	// which is an empty page; limit 0 is that page here.
	var page [2]int64
	var set [2]bool
	for i, k := range []string{"limit", "offset"} {
		if v := q.Get(k); v != "" {
			n, ok := jsParseInt(v)
			if !ok {
				page, set = [2]int64{0, 0}, [2]bool{true, false}
				break
			}
			page[i], set[i] = n, true
		}
	}
	for i, k := range []string{"limit", "offset"} {
		if set[i] {
			c.num(k, page[i])
		}
	}
	writeAnswer(w, a.exec(r, c.done()), http.StatusOK)
}

// GET /queues/summary: every queue with its counts, a bare array as the
// reference answers it. The counts are the engine's (the database's in
// PostgreSQL mode), as DashboardQueues reads them.
func (a *httpAPI) serveQueuesSummary(w http.ResponseWriter, r *http.Request, _ []string) {
	qs, err := a.srv.eng.DashboardQueues(r.Context())
	if err != nil {
		writeEngineError(w, err)
		return
	}
	out := []byte{'['}
	for i, q := range qs {
		if i > 0 {
			out = append(out, ',')
		}
		o := jsonObj{jsonOut: jsonOut{b: out}}
		o.open()
		o.str("name", q.name)
		o.boolean("paused", q.paused)
		c := jsonObj{}
		c.open()
		c.int("waiting", int64(q.waiting))
		c.int("prioritized", int64(q.prioritized))
		c.int("active", int64(q.active))
		c.int("completed", int64(q.done))
		c.int("failed", int64(q.dlq))
		c.int("delayed", int64(q.delayed))
		o.json("counts", c.close())
		out = o.close()
	}
	writeJSONBytes(w, http.StatusOK, append(out, ']'))
}

// GET /queues/:queue/workers: the live workers that serve the queue.
func (a *httpAPI) serveQueueWorkers(w http.ResponseWriter, r *http.Request, p []string) {
	list, _, _ := a.b.workers.list()
	now := a.b.now()
	out := []byte{'['}
	n := 0
	for i := range list {
		wk := &list[i]
		if !slices.Contains(wk.Queues, p[0]) || !a.b.workers.alive(wk.LastSeen, now) {
			continue
		}
		if n > 0 {
			out = append(out, ',')
		}
		n++
		o := jsonObj{jsonOut: jsonOut{b: out}}
		o.open()
		o.str("id", wk.ID)
		o.str("name", wk.Name)
		qs, _ := jsonMarshal(wk.Queues)
		o.json("queues", qs)
		o.int("concurrency", wk.Concurrency)
		o.int("registeredAt", wk.Registered)
		o.int("lastSeen", wk.LastSeen)
		o.int("activeJobs", wk.Active)
		o.int("processedJobs", wk.Processed)
		o.int("failedJobs", wk.Failed)
		out = o.close()
	}
	o := jsonObj{}
	o.open()
	o.boolean("ok", true)
	o.json("workers", append(out, ']'))
	writeJSONBytes(w, http.StatusOK, o.close())
}

// GET /queues/:queue/dlq: the full entries, optionally a page of them.
// Parameters that are not numbers are ignored, as the reference ignores
// them.
func (a *httpAPI) serveDLQ(w http.ResponseWriter, r *http.Request, p []string) {
	ans := a.exec(r, newCmd("Dlq").str("queue", p[0]).done())
	if !answerOK(ans) {
		writeAnswer(w, ans, http.StatusOK)
		return
	}
	entries, _ := ans.Get("entries").Array()
	num := func(k string) (int64, bool) {
		f, err := strconv.ParseFloat(strings.TrimSpace(r.URL.Query().Get(k)), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return 0, false
		}
		// Converting a float beyond int64 is undefined: clamp first.
		return int64(max(min(f, 1<<53), -1<<53)), true
	}
	limit, hasLimit := num("limit")
	offset, _ := num("offset")
	lo, hi := pageBounds(len(entries), offset, limit, hasLimit)
	writeJSONWith(w, http.StatusOK, func(o *jsonObj) {
		o.boolean("ok", true)
		o.rawArray("entries", entries[lo:hi])
		o.int("total", int64(len(entries)))
	})
}

// GET /queues/:queue/dlq/stats: {ok, stats}.
func (a *httpAPI) serveDLQStats(w http.ResponseWriter, r *http.Request, p []string) {
	ans := a.exec(r, newCmd("GetDlqStats").str("queue", p[0]).done())
	if !answerOK(ans) {
		writeAnswer(w, ans, http.StatusOK)
		return
	}
	data, _, _ := ans.Map("data")
	o := jsonObj{}
	o.open()
	o.boolean("ok", true)
	o.raw("stats", data.Get("stats"))
	writeJSONBytes(w, http.StatusOK, o.close())
}
