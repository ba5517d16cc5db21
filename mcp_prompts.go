package main

// The MCP resources (read-only documents an agent can load: stats, queues,
// crons, workers, webhooks) and prompts (a health report, a queue's
// diagnosis, an incident's triage), with the reference's names, URIs and
// arguments. A prompt gathers the figures it needs through the same
// backend as the tools, and asks the agent for a report in sections.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// mcpResource is one resource: its name, URI, what it holds and how it is
// read.
type mcpResource struct {
	name, uri, desc string
	read            func(ctx context.Context, b *mcpBackend) ([]byte, error)
}

var mcpResources = []mcpResource{
	{"stats", "bunqueue://stats", "Overall queue server statistics", func(ctx context.Context, b *mcpBackend) ([]byte, error) {
		return b.stats(ctx)
	}},
	{"queues", "bunqueue://queues", "All queues with job counts per state", func(ctx context.Context, b *mcpBackend) ([]byte, error) {
		queues, err := b.queueNames(ctx)
		if err != nil {
			return nil, err
		}
		items := make([][]byte, 0, len(queues))
		for _, q := range queues {
			counts, err := b.jobCounts(ctx, q)
			if err != nil {
				return nil, err
			}
			items = append(items, newJSONObj().str("name", q).spread(counts).close())
		}
		return jsonArr(items), nil
	}},
	{"crons", "bunqueue://crons", "All scheduled cron jobs", func(ctx context.Context, b *mcpBackend) ([]byte, error) {
		crons, err := b.crons(ctx)
		return jsonArr(crons), err
	}},
	{"workers", "bunqueue://workers", "Active workers and their status", func(ctx context.Context, b *mcpBackend) ([]byte, error) {
		workers, err := b.workers(ctx)
		return jsonArr(workers), err
	}},
	{"webhooks", "bunqueue://webhooks", "Registered webhooks", func(ctx context.Context, b *mcpBackend) ([]byte, error) {
		hooks, err := b.webhooks(ctx)
		return jsonArr(hooks), err
	}},
}

// queueNames lists the queues (ListQueues).
func (b *mcpBackend) queueNames(ctx context.Context) ([]string, error) {
	m, err := b.call(ctx, "ListQueues")
	if err != nil {
		return nil, err
	}
	names, _, _ := m.Strs("queues")
	return names, nil
}

func mcpResourceList() []byte {
	items := make([][]byte, len(mcpResources))
	for i, r := range mcpResources {
		items[i] = newJSONObj().str("name", r.name).str("uri", r.uri).str("description", r.desc).
			str("mimeType", "application/json").close()
	}
	return newJSONObj().json("resources", jsonArr(items)).close()
}

// readResource answers resources/read. A resource that cannot be read
// answers its error as its content, as the reference's do.
func (s *mcpServer) readResource(ctx context.Context, b *mcpBackend, params json.RawMessage) ([]byte, error) {
	var p struct {
		URI string `json:"uri"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, rpcErr(rpcInvalidParams, "Invalid params: %v", err)
	}
	for _, r := range mcpResources {
		if r.uri != p.URI {
			continue
		}
		text, err := r.read(ctx, b)
		if err != nil {
			text = newJSONObj().str("error", err.Error()).boolean("isError", true).close()
		} else {
			text = pretty(text)
		}
		c := newJSONObj().str("uri", r.uri).str("text", string(text)).str("mimeType", "application/json").close()
		return newJSONObj().json("contents", jsonArr([][]byte{c})).close(), nil
	}
	return nil, rpcErr(rpcInvalidParams, "Resource %s not found", p.URI)
}

// ---------------------------------------------------------------------------
// Prompts

// mcpPrompt is one prompt: its name, what it does, its arguments and how
// its text is made.
type mcpPrompt struct {
	name, desc string
	args       []mcpPromptArg
	build      func(ctx context.Context, b *mcpBackend, args map[string]string) (desc, text string, err error)
}

type mcpPromptArg struct {
	name, desc string
	required   bool
}

// mcpReportQueues bounds the queues a prompt lists, so that a server with
// thousands of queues does not make a prompt past an agent's context.
const mcpReportQueues = 50

var mcpPrompts = []mcpPrompt{
	{name: "bunqueue_health_report",
		desc:  "Generate a comprehensive health report for the bunqueue server with severity levels (OK/WARNING/CRITICAL).",
		build: healthReport},
	{name: "bunqueue_debug_queue",
		desc:  "Deep diagnostic of a specific queue: job counts, pause status, DLQ entries, active jobs, and priority distribution.",
		args:  []mcpPromptArg{{"queue", "Queue name to debug", true}},
		build: debugQueue},
	{name: "bunqueue_incident_response",
		desc:  `Incident response playbook: identifies backed-up queues, checks worker health, provides step-by-step triage for "jobs not processing".`,
		args:  []mcpPromptArg{{"queue", "Specific queue to investigate (omit to check all)", false}},
		build: incidentResponse},
}

func mcpPromptList() []byte {
	items := make([][]byte, len(mcpPrompts))
	for i, p := range mcpPrompts {
		o := newJSONObj().str("name", p.name).str("description", p.desc)
		if len(p.args) > 0 {
			args := make([][]byte, len(p.args))
			for k, a := range p.args {
				args[k] = newJSONObj().str("name", a.name).str("description", a.desc).boolean("required", a.required).close()
			}
			o.json("arguments", jsonArr(args))
		}
		items[i] = o.close()
	}
	return newJSONObj().json("prompts", jsonArr(items)).close()
}

// getPrompt answers prompts/get. Figures that cannot be gathered make a
// prompt that says so, as the reference's do.
func (s *mcpServer) getPrompt(ctx context.Context, b *mcpBackend, params json.RawMessage) ([]byte, error) {
	var p struct {
		Name      string            `json:"name"`
		Arguments map[string]string `json:"arguments"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, rpcErr(rpcInvalidParams, "Invalid params: %v", err)
	}
	for _, pr := range mcpPrompts {
		if pr.name != p.Name {
			continue
		}
		for _, a := range pr.args {
			if _, ok := p.Arguments[a.name]; a.required && !ok {
				return nil, rpcErr(rpcInvalidParams, "Invalid arguments for prompt %s: %s: required", pr.name, a.name)
			}
		}
		desc, text, err := pr.build(ctx, b, p.Arguments)
		if err != nil {
			text = fmt.Sprintf("Failed to gather bunqueue data: %v\n\nThe server may be unreachable. Check connectivity and try again.", err)
		}
		msg := newJSONObj().str("role", "user").json("content", newJSONObj().str("type", "text").str("text", text).close()).close()
		return newJSONObj().str("description", desc).json("messages", jsonArr([][]byte{msg})).close(), nil
	}
	return nil, rpcErr(rpcInvalidParams, "Prompt %s not found", p.Name)
}

// promptShare is what a prompt's list leaves of the answer to the rest
// (fitJobs' rest): each list has a quarter of it.
func promptShare(b *mcpBackend) int64 {
	if b.fit == nil {
		return 0
	}
	return b.fit.text - b.fit.text/4
}

// notShown tells, in a prompt's title, how many of a list it left out.
func notShown(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d of them not shown, to keep the prompt within --mcp-max-answer-bytes", n)
}

// section is a titled block of JSON in a prompt.
func section(sb *strings.Builder, title string, v []byte) {
	fmt.Fprintf(sb, "## %s\n%s\n\n", title, pretty(v))
}

// queueFacts is what the prompts tell of one queue.
type queueFacts struct {
	name          string
	counts        []byte
	paused        []byte
	waiting, actv float64
	dlq           int
}

func (b *mcpBackend) queueFacts(ctx context.Context, q string, dlqLimit float64) (queueFacts, error) {
	f := queueFacts{name: q}
	var err error
	if f.counts, err = b.jobCounts(ctx, q); err != nil {
		return f, err
	}
	if f.paused, err = b.isPaused(ctx, q); err != nil {
		return f, err
	}
	var c struct {
		Waiting float64 `json:"waiting"`
		Active  float64 `json:"active"`
	}
	json.Unmarshal(f.counts, &c)
	f.waiting, f.actv = c.Waiting, c.Active
	if dlqLimit > 0 {
		// Counted, not shown: nothing of the jobs is rendered.
		m, err := b.call(ctx, "Dlq", "queue", q, "count", dlqLimit)
		if err != nil {
			return f, err
		}
		raws, _, err := m.Array("jobs")
		if err != nil {
			return f, err
		}
		f.dlq = len(raws)
	}
	return f, nil
}

func healthReport(ctx context.Context, b *mcpBackend, _ map[string]string) (string, string, error) {
	const desc = "Comprehensive bunqueue server health report"
	stats, err := b.stats(ctx)
	if err != nil {
		return "Error gathering health data", "", err
	}
	storage, err := b.storageStatus(ctx)
	if err != nil {
		return "Error gathering health data", "", err
	}
	queues, err := b.queueNames(ctx)
	if err != nil {
		return "Error gathering health data", "", err
	}
	workers, err := b.workers(ctx)
	if err != nil {
		return "Error gathering health data", "", err
	}
	crons, err := b.crons(ctx)
	if err != nil {
		return "Error gathering health data", "", err
	}
	memory, err := b.memory(ctx)
	if err != nil {
		return "Error gathering health data", "", err
	}
	shown := queues[:min(len(queues), mcpReportQueues)]
	details := make([][]byte, 0, len(shown))
	for _, q := range shown {
		f, err := b.queueFacts(ctx, q, 0)
		if err != nil {
			return "Error gathering health data", "", err
		}
		details = append(details, newJSONObj().str("name", q).json("counts", f.counts).json("paused", f.paused).close())
	}
	of := ""
	if len(queues) > len(shown) {
		of = fmt.Sprintf(" of %d", len(queues))
	}
	var sb strings.Builder
	sb.WriteString("Assess the health of this bunqueue server from the data below, and write a report that gives each area a severity: OK, WARNING or CRITICAL.\n\n")
	section(&sb, "System Stats", stats)
	section(&sb, "Storage Status", storage)
	section(&sb, fmt.Sprintf("Queue Details (%d%s queues)", len(details), of), jsonArr(details))
	section(&sb, fmt.Sprintf("Workers (%d registered)", len(workers)), jsonArr(workers))
	section(&sb, fmt.Sprintf("Cron Jobs (%d scheduled)", len(crons)), jsonArr(crons))
	section(&sb, "Memory Stats", memory)
	sb.WriteString(`---
The report's sections:
1. **Overall Health**: one line, with the overall severity
2. **Storage**: CRITICAL when the disk is full or storage reports an error
3. **Queues**: each queue; flag failed above 10% of its jobs, and paused queues
4. **Workers**: how many, and whether their heartbeats are fresh (stale past 60 s)
5. **Memory**: collections close to their limits
6. **Cron Jobs**: the schedules, and any next run already missed
7. **Recommendations**: what to do, most urgent first`)
	return desc, sb.String(), nil
}

func debugQueue(ctx context.Context, b *mcpBackend, args map[string]string) (string, string, error) {
	q := args["queue"]
	f, err := b.queueFacts(ctx, q, 0)
	if err != nil {
		return fmt.Sprintf("Error debugging queue %q", q), "", err
	}
	// Each list has a quarter of the answer; the rest of the prompt is
	// small.
	share := promptShare(b)
	dlq, dlqLeft, err := b.dlq(ctx, q, 10, share)
	if err != nil {
		return fmt.Sprintf("Error debugging queue %q", q), "", err
	}
	active, activeLeft, err := b.getJobs(ctx, q, "active", 0, -1, share)
	if err != nil {
		return fmt.Sprintf("Error debugging queue %q", q), "", err
	}
	priorities, err := b.countsPerPriority(ctx, q)
	if err != nil {
		return fmt.Sprintf("Error debugging queue %q", q), "", err
	}
	var c struct{ Waiting, Delayed, Active, Completed, Failed float64 }
	json.Unmarshal(f.counts, &c)
	total := c.Waiting + c.Delayed + c.Active + c.Completed + c.Failed
	var sb strings.Builder
	fmt.Fprintf(&sb, "Diagnose bunqueue queue %q from the data below, and say what is wrong with it, if anything.\n\n", q)
	section(&sb, "Job State Breakdown", f.counts)
	fmt.Fprintf(&sb, "## Queue Status\n- Paused: %s\n- Total jobs: %s\n\n", f.paused, appendJSONNumber(nil, total))
	section(&sb, fmt.Sprintf("Active Jobs (%d currently processing%s)", len(active)+activeLeft, notShown(activeLeft)), jsonArr(active))
	section(&sb, fmt.Sprintf("Dead Letter Queue (%d entries, showing up to 10%s)", len(dlq)+dlqLeft, notShown(dlqLeft)), jsonArr(dlq))
	section(&sb, "Priority Distribution", priorities)
	sb.WriteString(`---
Report:
1. **Queue Health**: HEALTHY, DEGRADED or UNHEALTHY
2. **Backlog Analysis**: waiting against active; is the queue growing?
3. **Failure Analysis**: failed jobs, dead-letter entries, what they have in common
4. **Stuck Jobs**: active jobs that may have stalled (look at startedAt)
5. **Priority Issues**: low-priority jobs starved by higher ones
6. **Recommendations**: what to do about each problem found`)
	return fmt.Sprintf("Deep diagnostic for queue %q", q), sb.String(), nil
}

func incidentResponse(ctx context.Context, b *mcpBackend, args map[string]string) (string, string, error) {
	q, one := args["queue"]
	desc := "Incident response: jobs not processing"
	if one && q != "" {
		desc = fmt.Sprintf("Incident response for queue %q", q)
	}
	queues, err := b.queueNames(ctx)
	if err != nil {
		return "Error gathering incident data", "", err
	}
	workers, err := b.workers(ctx)
	if err != nil {
		return "Error gathering incident data", "", err
	}
	stats, err := b.stats(ctx)
	if err != nil {
		return "Error gathering incident data", "", err
	}
	targets := queues[:min(len(queues), mcpReportQueues)]
	if one && q != "" {
		targets = []string{q}
	}
	var diag, flagged [][]byte
	for _, name := range targets {
		f, err := b.queueFacts(ctx, name, 5)
		if err != nil {
			return "Error gathering incident data", "", err
		}
		d := newJSONObj().str("name", name).json("counts", f.counts).json("paused", f.paused).num("dlqEntries", float64(f.dlq)).close()
		diag = append(diag, d)
		if string(f.paused) == "true" || f.dlq > 0 || (f.waiting > 0 && f.actv == 0) {
			flagged = append(flagged, d)
		}
	}
	var sb strings.Builder
	sb.WriteString("INCIDENT: jobs are not being processed. Find out why, and resolve it.\n\n")
	section(&sb, "System Overview", stats)
	section(&sb, fmt.Sprintf("Workers (%d registered)", len(workers)), jsonArr(workers))
	section(&sb, fmt.Sprintf("Queue Diagnostics (%d queues)", len(diag)), jsonArr(diag))
	section(&sb, fmt.Sprintf("Flagged Queues (%d problematic)", len(flagged)), jsonArr(flagged))
	sb.WriteString("---\nGo through these steps:\n" +
		"### Step 1: Worker Health\n- Is any worker registered? (none is the root cause)\n- Are their heartbeats fresh? (stale past 60 s)\n- Do they work the affected queues?\n" +
		"### Step 2: Queue Status\n- Which queues are paused? (`bunqueue_resume_queue` resumes one)\n- Which have jobs waiting and none active? (those are stuck)\n" +
		"### Step 3: Throughput\n- Is throughput zero, or far below normal?\n- Are jobs pushed faster than they are pulled?\n" +
		"### Step 4: DLQ Analysis\n- Which queues have dead-lettered jobs?\n- Do jobs fail again and again? (`bunqueue_get_dlq` shows them)\n" +
		"### Step 5: Root Cause & Resolution\nName the most likely root cause, and the bunqueue tools that resolve it.")
	return desc, sb.String(), nil
}
