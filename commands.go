package main

// The command table: every protocol command the server answers, by name,
// the same in every storage mode. A name missing here answers "Unknown
// command: X", as the reference does. Every transport (TCP, HTTP,
// WebSocket) reaches it through conn.dispatch (server.go).
//
// A handler (cmd_<domain>.go) reads its arguments, calls one method of the
// engine (r.eng, engine.go) and writes the answer. Adding a command: a
// line here, a handler in the cmd_ file of its domain, and, when it needs
// storage, a method in engine.go's group with one implementation per
// engine (<domain>.go for memory and SQLite, pg_<domain>.go for
// PostgreSQL). docs/ARCHITECTURE.md has the whole path.
//
// Each line also says what the command does to the memory jobs hold
// (--max-memory, memlimit.go), and dispatch acts on it before the handler
// runs, the same for every transport (TCP, HTTP, WebSocket, MCP, the URL
// handlers) and every storage mode:
//
//   - grows: the command can make jobs hold more (a job made, its data,
//     progress, logs, links or a schedule's data changed, jobs made live
//     again). It is admitted by the budget: refused while the budget is
//     spent, naming it, and weighed into the estimate when let in.
//   - workerStep: a worker's step on a job it holds (pull, ACK, leases,
//     MoveToWaitingChildren). Never refused: refusing it would wedge the
//     queue, and finishing jobs is how room is made. What it can add has
//     bounds of its own (memlimit.go's admitRequest says which).
//   - workerGrows: a worker's step that keeps what it carries (FAIL: its
//     error and stack). Never refused, but weighed into the estimate.
//   - steady: cannot make jobs hold more: reads, removals, moves between
//     states, settings and registries of their own (each with a count
//     limit).
//
// A line without a class (a bare command{run: h}) is admitted as growing,
// so a forgotten class can refuse too much but never let memory in;
// TestAdmissionWalksCommandTable fails on it, and sends every command
// while the budget is spent.

import (
	"errors"
)

// command is one line of the table: the handler and its memory class.
type command struct {
	run Handler
	mem memUse
}

func grows(h Handler) command       { return command{run: h, mem: memGrows} }
func workerStep(h Handler) command  { return command{run: h, mem: memWorker} }
func workerGrows(h Handler) command { return command{run: h, mem: memWorkerGrows} }
func steady(h Handler) command      { return command{run: h, mem: memSteady} }

var commands map[string]command

func init() {
	commands = map[string]command{
		// Session (cmd_session.go)
		"Auth":              steady(cmdAuth),
		"Hello":             steady(cmdHello),
		"Ping":              steady(cmdPing),
		"SubscribeEvents":   steady(cmdSubscribe),
		"UnsubscribeEvents": steady(cmdUnsubscribe),

		// Job lifecycle (cmd_jobs.go; PUSHF in cmd_flows.go)
		"PUSH":          grows(cmdPush),
		"PUSHB":         grows(cmdPushBatch),
		"PUSHF":         grows(cmdPushFlow),
		"PULL":          workerStep(cmdPull),
		"PULLB":         workerStep(cmdPullBatch),
		"ACK":           workerStep(cmdAck),
		"ACKB":          workerStep(cmdAckBatch),
		"FAIL":          workerGrows(cmdFail),
		"JobHeartbeat":  workerStep(cmdJobHeartbeat),
		"JobHeartbeatB": workerStep(cmdJobHeartbeatBatch),
		"ExtendLock":    workerStep(cmdExtendLock),
		"ExtendLocks":   workerStep(cmdExtendLocks),

		// Reading jobs (cmd_query.go)
		"GetJob":               steady(cmdGetJob),
		"GetJobByCustomId":     steady(cmdGetJobByCustomID),
		"GetState":             steady(cmdGetState),
		"GetResult":            steady(cmdGetResult),
		"GetJobCounts":         steady(cmdGetJobCounts),
		"GetCountsPerPriority": steady(cmdGetCountsPerPriority),
		"Count":                steady(cmdCount),
		"GetJobs":              steady(cmdGetJobs),
		"GetProgress":          steady(cmdGetProgress),
		"Progress":             grows(cmdProgress),
		"AddLog":               grows(cmdAddLog),
		"GetLogs":              steady(cmdGetLogs),
		"ClearLogs":            steady(cmdClearLogs),
		"WaitJob":              steady(cmdWaitJob),

		// Moving jobs by hand (cmd_control.go)
		"Cancel":         steady(cmdCancel),
		"Discard":        steady(cmdDiscard),
		"Promote":        steady(cmdPromote),
		"PromoteJobs":    steady(cmdPromoteJobs),
		"MoveToWait":     steady(cmdMoveToWait),
		"MoveToDelayed":  steady(cmdMoveToDelayed),
		"ChangeDelay":    steady(cmdChangeDelay),
		"ChangePriority": steady(cmdChangePriority),
		"Update":         grows(cmdUpdate),
		"Clean":          steady(cmdClean),
		"RetryCompleted": grows(cmdRetryCompleted),

		// Deduplication (cmd_dedup.go)
		"GetDeduplicationJobId":     steady(cmdGetDeduplicationJobID),
		"RemoveDeduplicationKey":    steady(cmdRemoveDeduplicationKey),
		"RemoveJobDeduplicationKey": steady(cmdRemoveJobDeduplicationKey),

		// Limits and stall policy (cmd_limits.go)
		"RateLimit":        steady(cmdRateLimit),
		"RateLimitClear":   steady(cmdRateLimitClear),
		"SetConcurrency":   steady(cmdSetConcurrency),
		"ClearConcurrency": steady(cmdClearConcurrency),
		"GetQueueLimits":   steady(cmdGetQueueLimits),
		"SetStallConfig":   steady(cmdSetStallConfig),
		"GetStallConfig":   steady(cmdGetStallConfig),

		// Flows (cmd_flows.go, with PUSHF above)
		"GetChildrenValues":          steady(cmdGetChildrenValues),
		"GetFailedChildrenValues":    steady(cmdGetFailedChildrenValues),
		"GetIgnoredChildrenFailures": steady(cmdGetIgnoredChildrenFailures),
		"RemoveChildDependency":      steady(cmdRemoveChildDependency),
		"RemoveUnprocessedChildren":  steady(cmdRemoveUnprocessedChildren),
		"MoveToWaitingChildren":      workerStep(cmdMoveToWaitingChildren),
		"UpdateParent":               grows(cmdUpdateParent),

		// Cron (cmd_cron.go)
		"Cron":       grows(cmdCron),
		"CronGet":    steady(cmdCronGet),
		"CronList":   steady(cmdCronList),
		"CronDelete": steady(cmdCronDelete),

		// Groups (cmd_groups.go)
		"GetGroupJobsCount":      steady(cmdGetGroupJobsCount),
		"GetGroupsJobsCount":     steady(cmdGetGroupsJobsCount),
		"GetGroupActiveCount":    steady(cmdGetGroupActiveCount),
		"SetGroupRateLimit":      steady(cmdSetGroupRateLimit),
		"GetGroupRateLimit":      steady(cmdGetGroupRateLimit),
		"RemoveGroupRateLimit":   steady(cmdRemoveGroupRateLimit),
		"GetGroupRateLimitTtl":   steady(cmdGetGroupRateLimitTTL),
		"SetGroupConcurrency":    steady(cmdSetGroupConcurrency),
		"GetGroupConcurrency":    steady(cmdGetGroupConcurrency),
		"RemoveGroupConcurrency": steady(cmdRemoveGroupConcurrency),
		"PauseGroup":             steady(cmdPauseGroup),
		"ResumeGroup":            steady(cmdResumeGroup),
		"IsGroupPaused":          steady(cmdIsGroupPaused),
		"RateLimitGroup":         steady(cmdRateLimitGroup),

		// The dead-letter queue (cmd_dlq.go)
		"Dlq":          steady(cmdDlq),
		"RetryDlq":     grows(cmdRetryDlq),
		"PurgeDlq":     steady(cmdPurgeDlq),
		"SetDlqConfig": steady(cmdSetDlqConfig),
		"GetDlqConfig": steady(cmdGetDlqConfig),
		"GetDlqStats":  steady(cmdGetDlqStats),
		"RemoveDlqJob": steady(cmdRemoveDlqJob),

		// Queues (cmd_queue.go)
		"Pause":      steady(cmdPause),
		"Resume":     steady(cmdResume),
		"IsPaused":   steady(cmdIsPaused),
		"Drain":      steady(cmdDrain),
		"Obliterate": steady(cmdObliterate),
		"ListQueues": steady(cmdListQueues),

		// Stats (cmd_dashboard.go), Metrics (cmd_metrics.go), workers and
		// storage status (cmd_monitor.go)
		"Stats":            steady(cmdStats),
		"Metrics":          steady(cmdMetrics),
		"RegisterWorker":   steady(cmdRegisterWorker),
		"UnregisterWorker": steady(cmdUnregisterWorker),
		"Heartbeat":        steady(cmdHeartbeat),
		"ListWorkers":      steady(cmdListWorkers),
		"StorageStatus":    steady(cmdStorageStatus),

		// Per-queue figures and Prometheus (cmd_metrics.go), the dashboard
		// (cmd_dashboard.go)
		"TrimEvents":        steady(cmdTrimEvents),
		"Prometheus":        steady(cmdPrometheus),
		"CompactMemory":     steady(cmdCompactMemory),
		"DashboardOverview": steady(cmdDashboardOverview),
		"DashboardQueues":   steady(cmdDashboardQueues),
		"DashboardQueue":    steady(cmdDashboardQueue),

		// HTTP handlers, queued's own (cmd_urlworkers.go)
		"HandlerSet":    steady(cmdHandlerSet),
		"HandlerRemove": steady(cmdHandlerRemove),
		"HandlerList":   steady(cmdHandlerList),

		// Webhooks (cmd_webhooks.go)
		"AddWebhook":        steady(cmdAddWebhook),
		"RemoveWebhook":     steady(cmdRemoveWebhook),
		"ListWebhooks":      steady(cmdListWebhooks),
		"SetWebhookEnabled": steady(cmdSetWebhookEnabled),
	}
}

// Reference identity, answered by Hello.
const (
	protocolVersion = 3
	serverName      = "bunqueue"
	compatVersion   = "2.9.5"
)

// version is queued's own version, set at build time with -ldflags.
var version = "0.1.0"

// okID writes the reference's plain success: id present but undefined.
func (r *Req) okID() error {
	r.field("id").Undefined()
	return nil
}

// idArg reads the id field most job commands take.
func idArg(m Map, key string) (string, error) {
	id, ok, err := m.Key(key)
	if err != nil {
		return "", err
	}
	if !ok || id == "" {
		return "", errors.New(key + " is required")
	}
	return id, nil
}
