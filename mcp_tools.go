package main

// The MCP tools: the reference's 73, by the same names, with input schemas
// equivalent to its and answers of the same shape, built from the same
// wire commands its TCP mode sends (so that an agent's prompt written for
// bunqueue-mcp works unchanged). A tool's failure is a result with
// isError, {"error": "..."}; a malformed call is refused before the tool
// runs.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// mcpTool is one tool: its name, what it does, its arguments and its work.
type mcpTool struct {
	name, desc string
	in         toolSchema
	run        func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error)
}

// mcpResult is a tool's answer: one text, JSON in every tool but the
// Prometheus one.
type mcpResult struct {
	text    []byte
	isError bool
}

func okText(b []byte) (mcpResult, error)     { return mcpResult{text: b}, nil }
func prettyText(b []byte) (mcpResult, error) { return mcpResult{text: pretty(b)}, nil }
func failText(b []byte) (mcpResult, error)   { return mcpResult{text: b, isError: true}, nil }

func props(ps ...schemaProp) toolSchema { return toolSchema{top: sObject("", ps...)} }

// ---------------------------------------------------------------------------
// Arguments

// mcpArgs are a call's arguments, checked against the tool's schema.
type mcpArgs struct {
	all json.RawMessage // the arguments object as sent
	raw map[string]json.RawMessage
	val map[string]any
}

func (a mcpArgs) has(k string) bool { _, ok := a.val[k]; return ok }

func (a mcpArgs) str(k string) string { s, _ := a.val[k].(string); return s }

func (a mcpArgs) num(k string) (float64, bool) { f, ok := a.val[k].(float64); return f, ok }

func (a mcpArgs) boolean(k string) bool { v, _ := a.val[k].(bool); return v }

// json is an argument's JSON as sent; nil when absent.
func (a mcpArgs) json(k string) json.RawMessage { return a.raw[k] }

// ---------------------------------------------------------------------------
// The backend: wire commands and their answers

// mcpBackend sends the tools' commands, for one request.
type mcpBackend struct {
	send mcpSend
	// held, when set, sends instead of send, and what it holds is given
	// back by release once the request's answer is counted.
	held     mcpSendHeld
	releases []func()
	// fit, when set, is the request's room (mcp_answer.go): values past
	// it are summarised, lists cut.
	fit *mcpFit
}

// release gives back the wire answers the request held.
func (b *mcpBackend) release() {
	for _, r := range b.releases {
		r()
	}
	b.releases = nil
}

// undef is a field left out of a command, as JavaScript's undefined.
type undef struct{}

// encVal writes one value of a command: a string, a number, a bool, JSON
// (json.RawMessage, converted), strings, or a function that writes it.
func encVal(e *Enc, v any) error {
	switch x := v.(type) {
	case string:
		e.Str(x)
	case float64:
		e.Num(x)
	case int:
		e.Int(int64(x))
	case bool:
		e.Bool(x)
	case json.RawMessage:
		r, err := jsonToMsgpack(x)
		if err != nil {
			return err
		}
		e.Raw(r)
	case []string:
		e.ArrayHead(len(x))
		for _, s := range x {
			e.Str(s)
		}
	case func(e *Enc) error:
		return x(e)
	default:
		return fmt.Errorf("cannot send a %T", v)
	}
	return nil
}

// call sends cmd with the fields given as key, value pairs (an undef
// value, or a nil JSON one, is left out) and answers the answer's map.
// giveBack moves the jobs a pull took back to waiting (MoveToWait, which
// counts no attempt), for an answer that cannot carry them, and returns
// why, saying so. It runs even once the request has been cancelled: the
// jobs must not stay taken for a caller that never sees them.
func (b *mcpBackend) giveBack(ctx context.Context, raws []Raw, why error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	kept := 0
	for _, r := range raws {
		m, err := ParseMap(r, nil)
		if err != nil {
			continue
		}
		if _, err := b.call(ctx, "MoveToWait", "id", rawString(m.Get("id"))); err != nil {
			kept++
		}
	}
	if kept > 0 {
		return fmt.Errorf("%w; %d of the %d jobs taken could not be given back and stay active until their leases run out", why, kept, len(raws))
	}
	return fmt.Errorf("%w; the %d jobs taken were given back to the queue: pull fewer at once", why, len(raws))
}

func (b *mcpBackend) call(ctx context.Context, cmd string, kv ...any) (Map, error) {
	// The fields are encoded before anything is sent: a field that cannot
	// be (JSON nested too deep, say) must not leave a command sent without
	// it (a job pushed with no data).
	var fields Enc
	n := 0
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		if _, skip := v.(undef); skip {
			continue
		}
		if r, ok := v.(json.RawMessage); ok && r == nil {
			continue
		}
		fields.Str(kv[i].(string))
		if err := encVal(&fields, v); err != nil {
			return Map{}, fmt.Errorf("%s: %w", kv[i], err)
		}
		n++
	}
	write := func(e *Enc) int {
		e.B = append(e.B, fields.B...)
		return n
	}
	var body []byte
	var err error
	if b.held != nil {
		var release func()
		body, release, err = b.held(ctx, cmd, write)
		if release != nil {
			b.releases = append(b.releases, release)
		}
	} else {
		body, err = b.send(ctx, cmd, write)
	}
	if err != nil {
		return Map{}, err
	}
	m, err := ParseMap(body, nil)
	if err != nil {
		return Map{}, fmt.Errorf("%s: undecodable answer: %w", cmd, err)
	}
	if b.fit != nil && !answerOK(m) {
		// The answer budget's refusals (queued's own: the reference has
		// none) are the tool's failure, not an empty list.
		if msg, _, _ := m.Str("error"); strings.HasPrefix(msg, busyPrefix) {
			return Map{}, errors.New(msg)
		}
	}
	return m, nil
}

// optNum is a number argument, or undef when absent.
func numOrUndef(a mcpArgs, k string) any {
	if f, ok := a.num(k); ok {
		return f
	}
	return undef{}
}

// optStr is a string argument, or undef when absent.
func argOrUndef(a mcpArgs, k string) any {
	if a.has(k) {
		return a.str(k)
	}
	return undef{}
}

// nullish reports JavaScript's value == null: absent, nil or undefined.
func nullish(r Raw) bool { return r == nil || r.IsNil() || isUndefined(r) }

// absent reports JavaScript's value === undefined.
func absent(r Raw) bool { return r == nil || isUndefined(r) }

// rawJSON is a wire value as JSON; nil (left out) when undefined.
func rawJSON(r Raw) []byte {
	if absent(r) {
		return nil
	}
	b, err := appendJSON(nil, r)
	if err != nil {
		return []byte("null")
	}
	return b
}

// refusal is an ok:false answer as an error: its message, or def when it
// has none; nil for an ok answer.
func refusal(m Map, def string) error {
	if answerOK(m) {
		return nil
	}
	if msg, _, _ := m.Str("error"); msg != "" {
		return errors.New(msg)
	}
	return errors.New(def)
}

// rawString is JavaScript's String(v) of a wire value.
func rawString(r Raw) string {
	if absent(r) {
		return "undefined"
	}
	v, err := Decode(r)
	if err != nil {
		return "undefined"
	}
	return jsString(v)
}

// firstOf is the first of vs that is not nullish, through f; def when
// none is.
func firstOf(f func(Raw) string, def string, vs ...Raw) string {
	for _, v := range vs {
		if !nullish(v) {
			return f(v)
		}
	}
	return def
}

// isoMillis is JavaScript's new Date(ms).toISOString().
func isoMillis(ms float64) string {
	return time.UnixMilli(int64(ms)).UTC().Format("2006-01-02T15:04:05.000Z")
}

// truthyNum is a number that JavaScript holds true (not 0, not NaN).
func truthyNum(r Raw) (float64, bool) {
	f, err := r.Float()
	if err != nil || f == 0 || math.IsNaN(f) {
		return 0, false
	}
	return f, true
}

// errorText is a tool's failure: {"error": msg}.
func errorText(msg string) []byte { return newJSONObj().str("error", msg).close() }

// job is a job as the tools show it (the reference's parseJob).
func (b *mcpBackend) job(r Raw) ([]byte, error) {
	m, err := ParseMap(r, nil)
	if err != nil {
		return nil, fmt.Errorf("undecodable job: %w", err)
	}
	name := "default"
	if n := m.Get("name"); !absent(n) {
		s, err := n.Str()
		if err != nil || s == "" || len([]rune(s)) > 256 {
			return nil, errors.New("Job name must be a non-empty string of at most 256 characters")
		}
		name = s
	}
	o := newJSONObj().
		str("id", rawString(m.Get("id"))).
		str("name", name).
		json("queue", b.or(m.Get("queue"), `""`)).
		json("data", b.val(m.Get("data"))).
		json("priority", b.or(m.Get("priority"), "0")).
		json("progress", b.or(m.Get("progress"), "0")).
		json("attempts", b.or(m.Get("attempts"), "0")).
		json("maxAttempts", b.or(m.Get("maxAttempts"), "3"))
	if f, ok := truthyNum(m.Get("createdAt")); ok {
		o.str("createdAt", isoMillis(f))
	} else {
		o.str("createdAt", isoMillis(float64(time.Now().UnixMilli())))
	}
	if f, ok := truthyNum(m.Get("startedAt")); ok {
		o.str("startedAt", isoMillis(f))
	}
	return o.close(), nil
}

// jobCounts is the reference's getJobCounts: each state's count, 0 when
// the answer has none.
func (b *mcpBackend) jobCounts(ctx context.Context, queue string) ([]byte, error) {
	m, err := b.call(ctx, "GetJobCounts", "queue", queue)
	if err != nil {
		return nil, err
	}
	counts, _, _ := m.Map("counts")
	o := newJSONObj()
	for _, st := range []string{"waiting", "prioritized", "delayed", "active", "completed", "failed", "paused"} {
		o.json(st, b.or(counts.Get(st), "0"))
	}
	return o.close(), nil
}

// ---------------------------------------------------------------------------
// The tool table

// mcpTools are the tools, in the reference's order.
var mcpTools []*mcpTool

// mcpToolIndex finds a tool by name.
var mcpToolIndex map[string]*mcpTool

func init() {
	for _, group := range [][]*mcpTool{mcpJobTools(), mcpJobMgmtTools(), mcpConsumeTools(), mcpQueueTools(),
		mcpDLQTools(), mcpCronTools(), mcpLimitTools(), mcpWebhookTools(), mcpWorkerTools(), mcpMonitorTools(),
		mcpFlowTools(), mcpHandlerTools()} {
		mcpTools = append(mcpTools, group...)
	}
	mcpToolIndex = make(map[string]*mcpTool, len(mcpTools))
	for _, t := range mcpTools {
		mcpToolIndex[t.name] = t
	}
}

// mcpToolList is the tools/list answer.
func mcpToolList() []byte {
	items := make([][]byte, len(mcpTools))
	for i, t := range mcpTools {
		in, _ := t.in.MarshalJSON()
		items[i] = newJSONObj().str("name", t.name).str("description", t.desc).json("inputSchema", in).
			json("execution", []byte(`{"taskSupport":"forbidden"}`)).close()
	}
	return newJSONObj().json("tools", jsonArr(items)).close()
}

// callTool answers tools/call. An unknown tool, arguments that do not fit
// its schema and a failure of the tool itself are results with isError,
// as the MCP SDK's server answers them.
func (s *mcpServer) callTool(ctx context.Context, b *mcpBackend, params json.RawMessage) ([]byte, error) {
	var p struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, rpcErr(rpcInvalidParams, "Invalid params: %v", err)
	}
	t := mcpToolIndex[p.Name]
	if t == nil {
		return toolResult(mcpResult{text: []byte(fmt.Sprintf("MCP error %d: Tool %s not found", rpcInvalidParams, p.Name)), isError: true}), nil
	}
	a, err := parseToolArgs(t, p.Arguments)
	if err != nil {
		return toolResult(mcpResult{text: []byte(fmt.Sprintf("MCP error %d: Input validation error: Invalid arguments for tool %s: %v",
			rpcInvalidParams, t.name, err)), isError: true}), nil
	}
	res, err := t.run(ctx, b, a)
	if err != nil {
		res = mcpResult{text: errorText(err.Error()), isError: true}
	}
	return toolResult(res), nil
}

func parseToolArgs(t *mcpTool, args json.RawMessage) (mcpArgs, error) {
	a := mcpArgs{raw: map[string]json.RawMessage{}, val: map[string]any{}}
	if len(args) == 0 || string(args) == "null" {
		args = []byte("{}")
	}
	var v any
	if err := json.Unmarshal(args, &v); err != nil {
		return a, fmt.Errorf("arguments are not JSON: %v", err)
	}
	if err := t.in.check(v); err != nil {
		return a, err
	}
	a.val = v.(map[string]any)
	a.all = args
	if err := json.Unmarshal(args, &a.raw); err != nil {
		return a, err
	}
	return a, nil
}

func toolResult(r mcpResult) []byte {
	content := newJSONObj().str("type", "text").str("text", string(r.text)).close()
	o := newJSONObj().json("content", jsonArr([][]byte{content}))
	if r.isError {
		o.boolean("isError", true)
	}
	return o.close()
}

// ---------------------------------------------------------------------------
// Jobs

func mcpJobTools() []*mcpTool {
	jobID := req("jobId", sStr("Job ID"))
	return []*mcpTool{
		{name: "bunqueue_add_job", desc: "Add a job to a queue. Answers the new job's ID.",
			in: props(req("queue", sStr("Queue name")), req("name", sStr("Job name/type")),
				req("data", sRecord("Job payload data")),
				opt("priority", sNum("Priority (higher = processed first)")),
				opt("delay", sNum("Delay in milliseconds before processing")),
				opt("attempts", sNum("Max retry attempts (default: 3)"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "PUSH", "queue", a.str("queue"), "name", a.str("name"), "data", a.json("data"),
					"priority", numOrUndef(a, "priority"), "delay", numOrUndef(a, "delay"), "maxAttempts", numOrUndef(a, "attempts"))
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(newJSONObj().str("jobId", rawString(m.Get("id"))).close())
			}},
		{name: "bunqueue_add_jobs_bulk", desc: "Add several jobs to a queue in one operation.",
			in: props(req("queue", sStr("Queue name")),
				req("jobs", sArray(sObject("", req("name", sStr("")), req("data", sRecord("")),
					opt("priority", sNum("")), opt("delay", sNum(""))), "Jobs to add"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				var items []map[string]json.RawMessage
				if err := json.Unmarshal(a.json("jobs"), &items); err != nil {
					return mcpResult{}, err
				}
				jobs := func(e *Enc) error {
					e.ArrayHead(len(items))
					for _, it := range items {
						mp := e.BeginMap()
						for _, k := range []string{"name", "data", "priority", "delay"} {
							if v, ok := it[k]; ok {
								r, err := jsonToMsgpack(v)
								if err != nil {
									return err
								}
								mp.Key(k).Raw(r)
							}
						}
						mp.End()
					}
					return nil
				}
				m, err := b.call(ctx, "PUSHB", "queue", a.str("queue"), "jobs", jobs)
				if err != nil {
					return mcpResult{}, err
				}
				ids, _, _ := m.Array("ids")
				out := make([][]byte, len(ids))
				for i, id := range ids {
					out[i] = jsonStr(rawString(id))
				}
				return prettyText(newJSONObj().json("jobIds", jsonArr(out)).close())
			}},
		{name: "bunqueue_get_job", desc: "Get a job by ID: its state, progress, data and attempts.",
			in: props(jobID),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				return b.jobTool(ctx, "GetJob", "id", a.str("jobId"))
			}},
		{name: "bunqueue_get_job_state", desc: "Get the current state of a job (waiting, delayed, active, completed, failed).",
			in: props(jobID),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "GetState", "id", a.str("jobId"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().str("jobId", a.str("jobId")).json("state", b.or(m.Get("state"), `"unknown"`)).close())
			}},
		{name: "bunqueue_get_job_result", desc: "Get what a completed job returned.",
			in: props(jobID),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "GetResult", "id", a.str("jobId"))
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(newJSONObj().str("jobId", a.str("jobId")).json("result", b.val(m.Get("result"))).close())
			}},
		{name: "bunqueue_cancel_job", desc: "Cancel a job that is waiting or delayed.",
			in:  props(req("jobId", sStr("Job ID to cancel"))),
			run: successTool("Cancel", "id", "jobId"),
		},
		{name: "bunqueue_promote_job", desc: "Move a delayed job to waiting, to be processed now.",
			in:  props(req("jobId", sStr("Job ID to promote"))),
			run: successTool("Promote", "id", "jobId"),
		},
		{name: "bunqueue_update_progress", desc: "Set a job's progress (0-100).",
			in: props(jobID, req("progress", sNum("Progress value (0-100)").atLeast(0).atMost(100)),
				opt("message", sStr("Optional progress message"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				progress, _ := a.num("progress")
				m, err := b.call(ctx, "Progress", "id", a.str("jobId"), "progress", progress, "message", argOrUndef(a, "message"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", answerOK(m)).str("jobId", a.str("jobId")).num("progress", progress).close())
			}},
		{name: "bunqueue_get_children_values", desc: "Get what each child of a parent job returned (flows).",
			in: props(req("parentJobId", sStr("Parent job ID"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "GetChildrenValues", "id", a.str("parentJobId"))
				if err != nil {
					return mcpResult{}, err
				}
				data, _, _ := m.Map("data")
				return prettyText(newJSONObj().str("parentJobId", a.str("parentJobId")).json("children", b.or(data.Get("values"), "{}")).close())
			}},
		{name: "bunqueue_get_job_by_custom_id", desc: "Find a job by the custom ID it was given (the jobId option) when added.",
			in: props(req("customId", sStr("Custom job ID"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				return b.jobTool(ctx, "GetJobByCustomId", "customId", a.str("customId"))
			}},
		{name: "bunqueue_wait_for_job", desc: "Wait up to a timeout for a job to complete: completed is true when it did, false when the time ran out.",
			in: props(req("jobId", sStr("Job ID to wait for")),
				req("timeoutMs", sNum("Maximum wait time in milliseconds").atLeast(100).atMost(30000))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				timeout, _ := a.num("timeoutMs")
				m, err := b.call(ctx, "WaitJob", "id", a.str("jobId"), "timeout", timeout)
				if err != nil {
					return mcpResult{}, err
				}
				// The wire's completed, not its ok, which a wait that ran
				// out of time also carries. The reference's MCP server
				// reads ok, and says a job that timed out completed,
				// against its own tool's description: a bug not kept.
				done, _, _ := m.Bool("completed")
				return okText(newJSONObj().str("jobId", a.str("jobId")).boolean("completed", done).close())
			}},
	}
}

// jobTool answers one job, or isError when there is none.
func (b *mcpBackend) jobTool(ctx context.Context, cmd, key, value string) (mcpResult, error) {
	m, err := b.call(ctx, cmd, key, value)
	if err != nil {
		return mcpResult{}, err
	}
	if nullish(m.Get("job")) {
		return failText(errorText("Job not found"))
	}
	j, err := b.job(m.Get("job"))
	if err != nil {
		return mcpResult{}, err
	}
	return prettyText(j)
}

// successTool sends cmd with the string argument arg as key, and answers
// {success, arg}.
func successTool(cmd, key, arg string) func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
	return func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
		m, err := b.call(ctx, cmd, key, a.str(arg))
		if err != nil {
			return mcpResult{}, err
		}
		return okText(newJSONObj().boolean("success", answerOK(m)).str(arg, a.str(arg)).close())
	}
}

// ---------------------------------------------------------------------------
// Job management

func mcpJobMgmtTools() []*mcpTool {
	jobID := req("jobId", sStr("Job ID"))
	// withNum answers {success, jobId, key: value} after cmd.
	withNum := func(cmd, key string) func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
		return func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
			v, _ := a.num(key)
			m, err := b.call(ctx, cmd, "id", a.str("jobId"), key, v)
			if err != nil {
				return mcpResult{}, err
			}
			return okText(newJSONObj().boolean("success", answerOK(m)).str("jobId", a.str("jobId")).num(key, v).close())
		}
	}
	return []*mcpTool{
		{name: "bunqueue_update_job_data", desc: "Replace a job's payload data.",
			in: props(jobID, req("data", sRecord("New job payload data"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "Update", "id", a.str("jobId"), "data", a.json("data"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", answerOK(m)).str("jobId", a.str("jobId")).close())
			}},
		{name: "bunqueue_change_job_priority", desc: "Change a waiting job's priority (higher is processed first).",
			in:  props(jobID, req("priority", sNum("New priority value"))),
			run: withNum("ChangePriority", "priority")},
		{name: "bunqueue_move_to_delayed", desc: "Move a job to the delayed state, to run after the given delay in milliseconds.",
			in:  props(jobID, req("delay", sNum("Delay in milliseconds").atLeast(0))),
			run: withNum("MoveToDelayed", "delay")},
		{name: "bunqueue_discard_job", desc: "Discard a job for good, removing it from its queue.",
			in:  props(req("jobId", sStr("Job ID to discard"))),
			run: successTool("Discard", "id", "jobId")},
		{name: "bunqueue_get_progress", desc: "Get a job's progress and progress message.",
			in: props(jobID),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "GetProgress", "id", a.str("jobId"))
				if err != nil {
					return mcpResult{}, err
				}
				if absent(m.Get("progress")) {
					return failText(errorText("Job not found"))
				}
				return okText(newJSONObj().str("jobId", a.str("jobId")).json("progress", b.or(m.Get("progress"), "0")).
					json("message", b.or(m.Get("message"), "null")).close())
			}},
		{name: "bunqueue_change_delay", desc: "Change how long a delayed job waits.",
			in:  props(jobID, req("delay", sNum("New delay in milliseconds").atLeast(0))),
			run: withNum("MoveToDelayed", "delay")},
	}
}

// ---------------------------------------------------------------------------
// Consuming jobs

func mcpConsumeTools() []*mcpTool {
	timeout := opt("timeoutMs", sNum("Long-poll timeout in ms (0 = no wait)").atLeast(0).atMost(30000))
	ids := req("jobIds", sArray(sStr(""), "Job IDs").nonEmpty())
	return []*mcpTool{
		{name: "bunqueue_pull_job", desc: "Take one job from a queue to process it; job is null when none is ready.",
			in: props(req("queue", sStr("Queue name")), timeout),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "PULL", "queue", a.str("queue"), "timeout", numOrUndef(a, "timeoutMs"))
				if err != nil {
					return mcpResult{}, err
				}
				job := []byte("null")
				if !nullish(m.Get("job")) {
					if job, err = b.job(m.Get("job")); err != nil {
						return mcpResult{}, err
					}
				}
				return prettyText(newJSONObj().json("job", job).close())
			}},
		{name: "bunqueue_pull_job_batch", desc: "Take several jobs from a queue in one operation.",
			in: props(req("queue", sStr("Queue name")), req("count", sNum("Number of jobs to pull").atLeast(1).atMost(1000)), timeout),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				count, _ := a.num("count")
				m, err := b.call(ctx, "PULLB", "queue", a.str("queue"), "count", count, "timeout", numOrUndef(a, "timeoutMs"))
				if err != nil {
					return mcpResult{}, err
				}
				raws, _, err := m.Array("jobs")
				if err != nil {
					return mcpResult{}, err
				}
				// Every job taken is shown: those past what fits in full
				// with their values summarised.
				rest := textCost(newJSONObj().num("count", float64(len(raws))).json("jobs", []byte("[]")).close())
				jobs, _, err := b.fitJobs(raws, rest, 2, true)
				if tooBig := (*mcpTooBig)(nil); errors.As(err, &tooBig) {
					// Taken, but they cannot all be shown even summarised:
					// given back to the queue rather than left active,
					// with no one to work them, until their leases run out.
					return mcpResult{}, b.giveBack(ctx, raws, err)
				}
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(newJSONObj().num("count", float64(len(jobs))).json("jobs", jsonArr(jobs)).close())
			}},
		{name: "bunqueue_ack_job", desc: "Mark a job completed, with what it returned.",
			in: props(req("jobId", sStr("Job ID to acknowledge")), opt("result", sAny("Optional result data"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				if _, err := b.call(ctx, "ACK", "id", a.str("jobId"), "result", a.json("result")); err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", true).str("jobId", a.str("jobId")).close())
			}},
		{name: "bunqueue_ack_job_batch", desc: "Mark several jobs completed in one operation.",
			in: props(ids),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				list := strList(a.val["jobIds"])
				if _, err := b.call(ctx, "ACKB", "ids", list); err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", true).num("count", float64(len(list))).close())
			}},
		{name: "bunqueue_fail_job", desc: "Mark a job failed, with an error message.",
			in: props(req("jobId", sStr("Job ID to fail")), opt("error", sStr("Error message"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				if _, err := b.call(ctx, "FAIL", "id", a.str("jobId"), "error", argOrUndef(a, "error")); err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", true).str("jobId", a.str("jobId")).close())
			}},
		{name: "bunqueue_job_heartbeat", desc: "Tell the server an active job is alive, so that it is not taken for stalled.",
			in:  props(req("jobId", sStr("Job ID"))),
			run: successTool("JobHeartbeat", "id", "jobId")},
		{name: "bunqueue_job_heartbeat_batch", desc: "Send heartbeats for several active jobs at once.",
			in: props(ids),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "JobHeartbeatB", "ids", strList(a.val["jobIds"]))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", true).json("acknowledged", b.or(m.Get("count"), "0")).close())
			}},
		{name: "bunqueue_extend_lock", desc: "Extend the lock on an active job, so that it is not taken back.",
			in: props(req("jobId", sStr("Job ID")), req("token", sStr("Lock token")),
				req("duration", sNum("Extension duration in milliseconds").atLeast(1000))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				d, _ := a.num("duration")
				m, err := b.call(ctx, "JobHeartbeat", "id", a.str("jobId"), "token", a.str("token"), "duration", d)
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", answerOK(m)).str("jobId", a.str("jobId")).close())
			}},
	}
}

// strList is a checked array of strings.
func strList(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, s := range list {
		str, _ := s.(string)
		out = append(out, str)
	}
	return out
}
