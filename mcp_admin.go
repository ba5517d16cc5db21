package main

// The MCP tools that manage a server rather than its jobs: queues, the
// dead-letter queue, cron, limits, webhooks, workers, monitoring and the
// HTTP handlers (the job tools and the tool table are in mcp_tools.go).

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// ---------------------------------------------------------------------------
// Queues

func mcpQueueTools() []*mcpTool {
	queue := req("queue", sStr("Queue name"))
	// done answers {success: true, queue, message} after cmd.
	done := func(cmd, message string) func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
		return func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
			if _, err := b.call(ctx, cmd, "queue", a.str("queue")); err != nil {
				return mcpResult{}, err
			}
			return okText(newJSONObj().boolean("success", true).str("queue", a.str("queue")).str("message", message).close())
		}
	}
	return []*mcpTool{
		{name: "bunqueue_list_queues", desc: "List every queue.", in: props(),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "ListQueues")
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().json("queues", b.or(m.Get("queues"), "[]")).close())
			}},
		{name: "bunqueue_count_jobs", desc: "Count a queue's jobs, in every state.", in: props(queue),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "Count", "queue", a.str("queue"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().str("queue", a.str("queue")).json("count", b.or(m.Get("count"), "0")).close())
			}},
		{name: "bunqueue_get_jobs", desc: "List a queue's jobs, optionally of one state, a page at a time.",
			in: props(queue, opt("state", sEnum("Filter by job state", "waiting", "delayed", "active", "completed", "failed")),
				opt("start", sNum("Start index for pagination (default: 0)")),
				opt("end", sNum("End index for pagination (default: 20)"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				start, ok := a.num("start")
				if !ok {
					start = 0
				}
				end, ok := a.num("end")
				if !ok {
					end = 20
				}
				head := newJSONObj().str("queue", a.str("queue")).num("count", 0).json("jobs", []byte("[]")).close()
				jobs, left, err := b.getJobs(ctx, a.str("queue"), argOrUndef(a, "state"), start, end, textCost(head))
				if err != nil {
					return mcpResult{}, err
				}
				o := newJSONObj().str("queue", a.str("queue")).num("count", float64(len(jobs))).json("jobs", jsonArr(jobs))
				jobsNote(b, o, left, "jobs of this page were", fmt.Sprintf("ask for them with start=%s", appendJSONNumber(nil, start+float64(len(jobs)))))
				return prettyText(o.close())
			}},
		{name: "bunqueue_get_job_counts", desc: "Count a queue's jobs by state (waiting, delayed, active, completed, failed).", in: props(queue),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				counts, err := b.jobCounts(ctx, a.str("queue"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().str("queue", a.str("queue")).spread(counts).close())
			}},
		{name: "bunqueue_pause_queue", desc: "Pause a queue: none of its jobs is handed out until it is resumed.", in: props(queue),
			run: done("Pause", "Queue paused")},
		{name: "bunqueue_resume_queue", desc: "Resume a paused queue.", in: props(queue),
			run: done("Resume", "Queue resumed")},
		{name: "bunqueue_drain_queue", desc: "Remove a queue's waiting jobs; active ones go on.", in: props(queue),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "Drain", "queue", a.str("queue"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", true).str("queue", a.str("queue")).json("removed", b.or(m.Get("removed"), "0")).close())
			}},
		{name: "bunqueue_obliterate_queue", desc: "Remove everything of a queue (waiting, active, completed, failed). Destructive.", in: props(queue),
			run: done("Obliterate", "Queue obliterated")},
		{name: "bunqueue_clean_queue", desc: "Remove a queue's finished jobs older than a grace period.",
			in: props(queue, req("graceMs", sNum("Grace period in ms - only remove jobs older than this").atLeast(0)),
				opt("state", sEnum("State to clean (default: both completed and failed)", "completed", "failed")),
				opt("limit", sNum("Maximum number of jobs to remove"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				grace, _ := a.num("graceMs")
				m, err := b.call(ctx, "Clean", "queue", a.str("queue"), "grace", grace, "state", argOrUndef(a, "state"), "limit", numOrUndef(a, "limit"))
				if err != nil {
					return mcpResult{}, err
				}
				ids, _, _ := m.Array("ids")
				return okText(newJSONObj().boolean("success", true).str("queue", a.str("queue")).num("removed", float64(len(ids))).
					json("ids", b.or(m.Get("ids"), "[]")).close())
			}},
		{name: "bunqueue_is_paused", desc: "Tell whether a queue is paused.", in: props(queue),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				paused, err := b.isPaused(ctx, a.str("queue"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().str("queue", a.str("queue")).json("paused", paused).close())
			}},
		{name: "bunqueue_get_counts_per_priority", desc: "Count a queue's waiting and delayed jobs by priority (active, completed and failed jobs are not counted).",
			in: props(queue),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				counts, err := b.countsPerPriority(ctx, a.str("queue"))
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(newJSONObj().str("queue", a.str("queue")).json("priorities", counts).close())
			}},
	}
}

// getJobs is the reference's getJobs: a page from start to end, the
// jobs that fit in the answer beside the rest of its text (rest), and
// how many were left out.
func (b *mcpBackend) getJobs(ctx context.Context, queue string, state any, start, end float64, rest int64) ([][]byte, int, error) {
	var limit any = undef{}
	if end >= 0 {
		limit = math.Max(0, end-start)
	}
	m, err := b.call(ctx, "GetJobs", "queue", queue, "state", state, "offset", start, "limit", limit)
	if err != nil {
		return nil, 0, err
	}
	raws, _, err := m.Array("jobs")
	if err != nil {
		return nil, 0, err
	}
	return b.fitJobs(raws, rest, 2, false)
}

func (b *mcpBackend) isPaused(ctx context.Context, queue string) ([]byte, error) {
	m, err := b.call(ctx, "IsPaused", "queue", queue)
	if err != nil {
		return nil, err
	}
	return b.or(m.Get("paused"), "false"), nil
}

func (b *mcpBackend) countsPerPriority(ctx context.Context, queue string) ([]byte, error) {
	m, err := b.call(ctx, "GetCountsPerPriority", "queue", queue)
	if err != nil {
		return nil, err
	}
	return b.or(m.Get("counts"), "{}"), nil
}

// ---------------------------------------------------------------------------
// Dead-letter queue

func mcpDLQTools() []*mcpTool {
	queue := req("queue", sStr("Queue name"))
	// retried answers {success: true, queue, key: the answer's key}.
	counted := func(cmd, key string, withID bool) func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
		return func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
			kv := []any{"queue", a.str("queue")}
			if withID {
				kv = append(kv, "id", argOrUndef(a, "jobId"))
			}
			m, err := b.call(ctx, cmd, kv...)
			if err != nil {
				return mcpResult{}, err
			}
			return okText(newJSONObj().boolean("success", true).str("queue", a.str("queue")).json(key, b.or(m.Get(key), "0")).close())
		}
	}
	return []*mcpTool{
		{name: "bunqueue_get_dlq", desc: "List a queue's dead-letter queue: the jobs that failed for good.",
			in: props(queue, opt("limit", sNum("Max entries to return (default: 20)"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				limit, ok := a.num("limit")
				if !ok {
					limit = 20
				}
				head := newJSONObj().str("queue", a.str("queue")).num("count", 0).json("jobs", []byte("[]")).close()
				jobs, left, err := b.dlq(ctx, a.str("queue"), limit, textCost(head))
				if err != nil {
					return mcpResult{}, err
				}
				o := newJSONObj().str("queue", a.str("queue")).num("count", float64(len(jobs))).json("jobs", jsonArr(jobs))
				jobsNote(b, o, left, "entries were", "the dead-letter queue is read from its start (limit), so look at the others one by one with bunqueue_get_job, or retry or purge the first ones")
				return prettyText(o.close())
			}},
		{name: "bunqueue_retry_dlq", desc: "Retry jobs of the dead-letter queue: they wait again.",
			in:  props(queue, opt("jobId", sStr("Specific job ID to retry (omit to retry all)"))),
			run: counted("RetryDlq", "retried", true)},
		{name: "bunqueue_purge_dlq", desc: "Delete every entry of a queue's dead-letter queue.",
			in:  props(queue),
			run: counted("PurgeDlq", "purged", false)},
		{name: "bunqueue_retry_completed", desc: "Run completed jobs again: they wait again.",
			in:  props(queue, opt("jobId", sStr("Specific job ID to retry (omit to retry all completed)"))),
			run: counted("RetryCompleted", "retried", true)},
	}
}

// dlq is the first entries of a queue's dead-letter queue that fit in the
// answer beside the rest of its text (rest), and how many were left out.
func (b *mcpBackend) dlq(ctx context.Context, queue string, limit float64, rest int64) ([][]byte, int, error) {
	m, err := b.call(ctx, "Dlq", "queue", queue, "count", limit)
	if err != nil {
		return nil, 0, err
	}
	raws, _, err := m.Array("jobs")
	if err != nil {
		return nil, 0, err
	}
	return b.fitJobs(raws, rest, 2, false)
}

// ---------------------------------------------------------------------------
// Cron

func mcpCronTools() []*mcpTool {
	name := req("name", sStr("Cron job name"))
	return []*mcpTool{
		{name: "bunqueue_add_cron", desc: "Add a recurring job, on a cron pattern or every N milliseconds.",
			in: props(req("name", sStr("Unique cron job name")), req("queue", sStr("Target queue name")),
				req("data", sRecord("Job payload data")),
				opt("schedule", sStr(`Cron pattern (e.g., "0 * * * *" for hourly)`)),
				opt("repeatEvery", sNum("Alternative: repeat every N milliseconds")),
				opt("priority", sNum("Job priority"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "Cron", "name", a.str("name"), "queue", a.str("queue"), "data", a.json("data"),
					"schedule", argOrUndef(a, "schedule"), "repeatEvery", numOrUndef(a, "repeatEvery"), "priority", numOrUndef(a, "priority"),
					"jobName", "default")
				if err != nil {
					return mcpResult{}, err
				}
				if err := refusal(m, "Failed to add cron"); err != nil {
					return mcpResult{}, err
				}
				cron, err := b.cron(m.Get("cron"))
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(newJSONObj().boolean("success", true).spread(cron).close())
			}},
		{name: "bunqueue_list_crons", desc: "List the cron jobs with their next run times.", in: props(),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				crons, err := b.crons(ctx)
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(newJSONObj().num("count", float64(len(crons))).json("crons", jsonArr(crons)).close())
			}},
		{name: "bunqueue_get_cron", desc: "Get a cron job by name.", in: props(name),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "CronGet", "name", a.str("name"))
				if err != nil {
					return mcpResult{}, err
				}
				if !answerOK(m) {
					return failText(newJSONObj().str("error", "Cron not found").str("name", a.str("name")).close())
				}
				cron, err := b.cron(m.Get("cron"))
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(cron)
			}},
		{name: "bunqueue_delete_cron", desc: "Delete a cron job by name.", in: props(req("name", sStr("Cron job name to delete"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "CronDelete", "name", a.str("name"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", answerOK(m)).str("name", a.str("name")).close())
			}},
	}
}

var errBadCron = errors.New("Invalid cron response from broker")

// mcpCron is a cron schedule as the tools show it, checked as the
// reference checks what its broker answers.
func (b *mcpBackend) cron(r Raw) ([]byte, error) {
	m, err := ParseMap(r, nil)
	if err != nil {
		return nil, errBadCron
	}
	name, err1 := m.Get("name").Str()
	queue, err2 := m.Get("queue").Str()
	next, err3 := m.Get("nextRun").Float()
	if err1 != nil || err2 != nil || err3 != nil || math.IsNaN(next) || math.IsInf(next, 0) {
		return nil, errBadCron
	}
	schedule, every := m.Get("schedule"), m.Get("repeatEvery")
	if !nullish(schedule) {
		if _, err := schedule.Str(); err != nil {
			return nil, errBadCron
		}
	}
	if !nullish(every) {
		if f, err := every.Float(); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, errBadCron
		}
	}
	o := newJSONObj().str("name", name).str("queue", queue)
	if !nullish(schedule) {
		o.json("schedule", b.val(schedule))
	}
	if !nullish(every) {
		o.json("repeatEvery", b.val(every))
	}
	o.str("nextRun", isoMillis(next))
	if f, err := m.Get("executions").Float(); err == nil {
		o.num("executions", f)
	} else {
		o.num("executions", 0)
	}
	return o.close(), nil
}

func (b *mcpBackend) crons(ctx context.Context) ([][]byte, error) {
	m, err := b.call(ctx, "CronList")
	if err != nil {
		return nil, err
	}
	raws, _, _ := m.Array("crons")
	out := make([][]byte, 0, len(raws))
	for _, r := range raws {
		c, err := b.cron(r)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// ---------------------------------------------------------------------------
// Rate and concurrency limits

func mcpLimitTools() []*mcpTool {
	queue := req("queue", sStr("Queue name"))
	set := func(cmd, key string) func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
		return func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
			limit, _ := a.num("limit")
			if _, err := b.call(ctx, cmd, "queue", a.str("queue"), "limit", limit); err != nil {
				return mcpResult{}, err
			}
			return okText(newJSONObj().boolean("success", true).str("queue", a.str("queue")).num(key, limit).close())
		}
	}
	clear := func(cmd, message string) func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
		return func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
			if _, err := b.call(ctx, cmd, "queue", a.str("queue")); err != nil {
				return mcpResult{}, err
			}
			return okText(newJSONObj().boolean("success", true).str("queue", a.str("queue")).str("message", message).close())
		}
	}
	return []*mcpTool{
		{name: "bunqueue_set_rate_limit", desc: "Limit how many of a queue's jobs are handed out per second.",
			in:  props(queue, req("limit", sNum("Max jobs per second").atLeast(1))),
			run: set("RateLimit", "rateLimit")},
		{name: "bunqueue_clear_rate_limit", desc: "Remove a queue's rate limit.", in: props(queue),
			run: clear("RateLimitClear", "Rate limit cleared")},
		{name: "bunqueue_set_concurrency", desc: "Limit how many of a queue's jobs are active at once.",
			in:  props(queue, req("limit", sNum("Max concurrent jobs").atLeast(1))),
			run: set("SetConcurrency", "concurrency")},
		{name: "bunqueue_clear_concurrency", desc: "Remove a queue's concurrency limit.", in: props(queue),
			run: clear("ClearConcurrency", "Concurrency limit cleared")},
	}
}

// ---------------------------------------------------------------------------
// Webhooks

// mcpWebhookEvents are the events a webhook added by a tool may ask for.
var mcpWebhookEvents = []string{"job.pushed", "job.started", "job.completed", "job.failed", "job.progress"}

func mcpWebhookTools() []*mcpTool {
	id := func(desc string) schemaProp { return req("id", sStr(desc)) }
	return []*mcpTool{
		{name: "bunqueue_add_webhook", desc: "Add a webhook: job events are POSTed to its URL.",
			in: props(req("url", sStr("Webhook URL to receive POST requests").asURI()),
				req("events", sArray(sEnum("", mcpWebhookEvents...), "Events to subscribe to")),
				opt("queue", sStr("Limit to a specific queue (omit for all queues)"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				events := strList(a.val["events"])
				m, err := b.call(ctx, "AddWebhook", "url", a.str("url"), "events", events, "queue", argOrUndef(a, "queue"))
				if err != nil {
					return mcpResult{}, err
				}
				if err := refusal(m, "Failed to add webhook"); err != nil {
					return mcpResult{}, err
				}
				// The reference's tcp mode reads an id the server does not
				// send, and answers "0": the server's webhookId is given.
				data, _, _ := m.Map("data")
				id := firstOf(rawString, "0", data.Get("webhookId"), m.Get("id"))
				o := newJSONObj().boolean("success", true).str("id", id).str("url", a.str("url")).json("events", a.json("events"))
				if a.has("queue") {
					o.str("queue", a.str("queue"))
				}
				return prettyText(o.boolean("enabled", true).close())
			}},
		{name: "bunqueue_remove_webhook", desc: "Remove a webhook by ID.", in: props(id("Webhook ID to remove")),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				// webhookId is what the server reads (the reference's tcp
				// mode sends only id, and removes nothing).
				m, err := b.call(ctx, "RemoveWebhook", "webhookId", a.str("id"), "id", a.str("id"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", answerOK(m)).str("id", a.str("id")).close())
			}},
		{name: "bunqueue_list_webhooks", desc: "List the webhooks.", in: props(),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				hooks, err := b.webhooks(ctx)
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(newJSONObj().num("count", float64(len(hooks))).json("webhooks", jsonArr(hooks)).close())
			}},
		{name: "bunqueue_set_webhook_enabled", desc: "Turn a webhook on or off without removing it.",
			in: props(id("Webhook ID"), req("enabled", sBool("Whether the webhook should be enabled"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "SetWebhookEnabled", "id", a.str("id"), "enabled", a.boolean("enabled"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", answerOK(m)).str("id", a.str("id")).boolean("enabled", a.boolean("enabled")).close())
			}},
	}
}

func (b *mcpBackend) webhooks(ctx context.Context) ([][]byte, error) {
	m, err := b.call(ctx, "ListWebhooks")
	if err != nil {
		return nil, err
	}
	// The server lists them in data.webhooks, where the reference's tcp
	// mode does not look (it always lists none).
	list := m.Get("webhooks")
	if data, _, _ := m.Map("data"); !nullish(data.Get("webhooks")) {
		list = data.Get("webhooks")
	}
	raws, _ := list.Array()
	out := make([][]byte, 0, len(raws))
	for _, r := range raws {
		w, _ := ParseMap(r, nil)
		out = append(out, newJSONObj().str("id", rawString(w.Get("id"))).json("url", b.val(w.Get("url"))).
			json("events", b.or(w.Get("events"), "[]")).json("queue", b.val(w.Get("queue"))).
			json("enabled", b.or(w.Get("enabled"), "true")).close())
	}
	return out, nil
}

// ---------------------------------------------------------------------------
// Workers

func mcpWorkerTools() []*mcpTool {
	return []*mcpTool{
		{name: "bunqueue_register_worker", desc: "Register a worker for the given queues.",
			in: props(req("name", sStr("Worker name/identifier")),
				req("queues", sArray(sStr(""), "Queues this worker will process").nonEmpty())),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				queues := strList(a.val["queues"])
				m, err := b.call(ctx, "RegisterWorker", "name", a.str("name"), "queues", queues)
				if err != nil {
					return mcpResult{}, err
				}
				// As for webhooks: the server's workerId, where the
				// reference's tcp mode answers "0".
				data, _, _ := m.Map("data")
				id := firstOf(rawString, "0", data.Get("workerId"), m.Get("id"))
				w := newJSONObj().str("id", id).str("name", a.str("name")).json("queues", a.json("queues")).
					num("active", 0).num("processed", 0).num("failed", 0).num("lastHeartbeat", float64(time.Now().UnixMilli())).close()
				return prettyText(newJSONObj().boolean("success", true).json("worker", w).close())
			}},
		{name: "bunqueue_unregister_worker", desc: "Unregister a worker.",
			in: props(req("workerId", sStr("Worker ID to unregister"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "UnregisterWorker", "workerId", a.str("workerId"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", answerOK(m)).str("workerId", a.str("workerId")).close())
			}},
		{name: "bunqueue_worker_heartbeat", desc: "Tell the server a registered worker is alive.",
			in: props(req("workerId", sStr("Worker ID"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "Heartbeat", "id", a.str("workerId"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", answerOK(m)).str("workerId", a.str("workerId")).close())
			}},
	}
}

func (b *mcpBackend) workers(ctx context.Context) ([][]byte, error) {
	m, err := b.call(ctx, "ListWorkers")
	if err != nil {
		return nil, err
	}
	list := m.Get("workers")
	if data, _, _ := m.Map("data"); !nullish(data.Get("workers")) {
		list = data.Get("workers")
	}
	raws, _ := list.Array()
	out := make([][]byte, 0, len(raws))
	for _, r := range raws {
		w, _ := ParseMap(r, nil)
		first := func(def string, keys ...string) []byte {
			for _, k := range keys {
				if !nullish(w.Get(k)) {
					return b.val(w.Get(k))
				}
			}
			return []byte(def)
		}
		out = append(out, newJSONObj().str("id", rawString(w.Get("id"))).json("name", b.val(w.Get("name"))).
			json("queues", first("[]", "queues")).json("active", first("0", "activeJobs")).
			json("processed", first("0", "processedJobs", "processed")).json("failed", first("0", "failedJobs", "failed")).
			json("lastHeartbeat", first("0", "lastSeen", "lastHeartbeat")).close())
	}
	return out, nil
}

// ---------------------------------------------------------------------------
// Monitoring

func mcpMonitorTools() []*mcpTool {
	jobID := req("jobId", sStr("Job ID"))
	return []*mcpTool{
		{name: "bunqueue_get_stats", desc: "Get the server's statistics: throughput, memory and uptime.", in: props(),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				stats, err := b.stats(ctx)
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(stats)
			}},
		{name: "bunqueue_get_queue_stats", desc: "Get a queue's job counts by state.", in: props(req("queue", sStr("Queue name"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				counts, err := b.jobCounts(ctx, a.str("queue"))
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(newJSONObj().str("queue", a.str("queue")).spread(counts).close())
			}},
		{name: "bunqueue_list_workers", desc: "List the registered workers: their queues, what they have processed, their last heartbeat.", in: props(),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				workers, err := b.workers(ctx)
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(newJSONObj().num("count", float64(len(workers))).json("workers", jsonArr(workers)).close())
			}},
		{name: "bunqueue_get_job_logs", desc: "Get a job's log entries.", in: props(jobID),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "GetLogs", "id", a.str("jobId"))
				if err != nil {
					return mcpResult{}, err
				}
				logs, _, _ := m.Array("logs")
				return prettyText(newJSONObj().str("jobId", a.str("jobId")).num("count", float64(len(logs))).json("logs", b.or(m.Get("logs"), "[]")).close())
			}},
		{name: "bunqueue_add_job_log", desc: "Add a log entry to a job.",
			in: props(jobID, req("message", sStr("Log message")), opt("level", sEnum("Log level (default: info)", "info", "warn", "error"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "AddLog", "id", a.str("jobId"), "message", a.str("message"), "level", argOrUndef(a, "level"))
				if err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", answerOK(m)).str("jobId", a.str("jobId")).close())
			}},
		{name: "bunqueue_get_storage_status", desc: "Get the storage's health: whether the disk is full, and its error if any.", in: props(),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				st, err := b.storageStatus(ctx)
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(st)
			}},
		{name: "bunqueue_get_per_queue_stats", desc: "Get each queue's figures (waiting, prioritized, delayed, active, dead-lettered).", in: props(),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "DashboardQueues")
				if err != nil {
					return mcpResult{}, err
				}
				data, _, _ := m.Map("data")
				raws, _, _ := data.Array("queues")
				o := newJSONObj()
				for _, r := range raws {
					q, _ := ParseMap(r, nil)
					name, err := q.Get("name").Str()
					if err != nil {
						continue
					}
					fig := newJSONObj()
					for _, k := range []string{"waiting", "prioritized", "delayed", "active", "dlq"} {
						fig.json(k, b.or(q.Get(k), "0"))
					}
					o.json(name, fig.close())
				}
				return prettyText(o.close())
			}},
		{name: "bunqueue_get_memory_stats", desc: "Get the server's memory figures (job index, completed jobs, caches).", in: props(),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				mem, err := b.memory(ctx)
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(mem)
			}},
		{name: "bunqueue_get_prometheus_metrics", desc: "Get the server's metrics in the Prometheus text format.", in: props(),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "Prometheus")
				if err != nil {
					return mcpResult{}, err
				}
				text, _, _ := m.Str("metrics")
				return okText([]byte(text))
			}},
		{name: "bunqueue_clear_job_logs", desc: "Clear a job's log entries, keeping the last N if asked.",
			in: props(jobID, opt("keepLogs", sNum("Number of recent log entries to keep (default: 0 = clear all)").atLeast(0))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				// The reference's TCP mode leaves keepLogs out (it clears
				// every entry); the tool says it keeps them, so it is sent.
				if _, err := b.call(ctx, "ClearLogs", "id", a.str("jobId"), "keepLogs", numOrUndef(a, "keepLogs")); err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", true).str("jobId", a.str("jobId")).close())
			}},
		{name: "bunqueue_compact_memory", desc: "Ask the server to give back memory it no longer uses.", in: props(),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				if _, err := b.call(ctx, "CompactMemory"); err != nil {
					return mcpResult{}, err
				}
				return okText(newJSONObj().boolean("success", true).str("message", "Memory compaction triggered").close())
			}},
	}
}

// stats is the Stats answer as it came, but for its reqId (the
// connection's own).
func (b *mcpBackend) stats(ctx context.Context) ([]byte, error) {
	m, err := b.call(ctx, "Stats")
	if err != nil {
		return nil, err
	}
	o := newJSONObj()
	for _, f := range m.Fields {
		if string(f.Key) == "reqId" {
			continue
		}
		o.json(string(f.Key), b.val(f.Val))
	}
	return o.close(), nil
}

func (b *mcpBackend) memory(ctx context.Context) ([]byte, error) {
	m, err := b.call(ctx, "Stats")
	if err != nil {
		return nil, err
	}
	return b.or(m.Get("memory"), "{}"), nil
}

func (b *mcpBackend) storageStatus(ctx context.Context) ([]byte, error) {
	m, err := b.call(ctx, "StorageStatus")
	if err != nil {
		return nil, err
	}
	data, _, _ := m.Map("data")
	return newJSONObj().json("diskFull", b.or(data.Get("diskFull"), "false")).json("error", b.or(data.Get("error"), "null")).close(), nil
}

// ---------------------------------------------------------------------------
// HTTP handlers

// mcpHandlerTools register a queue's HTTP handler: the server then works
// the queue's jobs by calling a URL (urlworker.go). Unlike the reference's,
// whose handler is a worker inside the MCP process, the handler lives in
// the server: it survives the agent, and in SQLite mode a restart too (in
// memory and PostgreSQL mode it lives in the broker's memory).
func mcpHandlerTools() []*mcpTool {
	queue := func(desc string) schemaProp { return req("queue", sStr(desc)) }
	return []*mcpTool{
		{name: "bunqueue_register_handler",
			desc: "Register an HTTP handler on a queue: the server works the queue's jobs by calling the URL with each. With bunqueue_add_cron, for recurring tasks.",
			in: props(queue("Queue name to attach the handler to"),
				req("url", sStr("HTTP endpoint URL to call when a job is processed").asURI()),
				req("method", sEnum("HTTP method (GET, POST, PUT, DELETE)", "GET", "POST", "PUT", "DELETE")),
				opt("headers", &schema{kind: "object", desc: "Custom HTTP headers", record: sStr("")}),
				opt("body", sAny("Request body template for POST/PUT (defaults to job data)")),
				opt("timeoutMs", sNum("Request timeout in ms (default: 30000)").atLeast(1000).atMost(120000))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "HandlerSet", "queue", a.str("queue"), "url", a.str("url"), "method", a.str("method"),
					"headers", a.json("headers"), "body", a.json("body"), "timeoutMs", numOrUndef(a, "timeoutMs"))
				if err != nil {
					return mcpResult{}, err
				}
				if err := refusal(m, "Failed to register the handler"); err != nil {
					return mcpResult{}, err
				}
				timeout, ok := a.num("timeoutMs")
				if !ok {
					timeout = defaultHandlerTimeout.Seconds() * 1000
				}
				h := newJSONObj().str("url", a.str("url")).str("method", a.str("method")).num("timeoutMs", timeout).close()
				return prettyText(newJSONObj().boolean("success", true).str("queue", a.str("queue")).json("handler", h).
					str("message", fmt.Sprintf("Worker started. Jobs in %q will be processed via %s %s", a.str("queue"), a.str("method"), a.str("url"))).close())
			}},
		{name: "bunqueue_unregister_handler", desc: "Remove a queue's HTTP handler; its jobs are no longer worked by it.",
			in: props(queue("Queue name to remove the handler from")),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "HandlerRemove", "queue", a.str("queue"))
				if err != nil {
					return mcpResult{}, err
				}
				removed, _, _ := m.Bool("removed")
				return okText(newJSONObj().boolean("success", removed).str("queue", a.str("queue")).close())
			}},
		{name: "bunqueue_list_handlers", desc: "List the HTTP handlers and whether each is working.", in: props(),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				m, err := b.call(ctx, "HandlerList")
				if err != nil {
					return mcpResult{}, err
				}
				list, _, _ := m.Array("handlers")
				return prettyText(newJSONObj().num("count", float64(len(list))).json("handlers", b.or(m.Get("handlers"), "[]")).close())
			}},
	}
}
