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

import (
	"errors"
)

var commands map[string]Handler

func init() {
	commands = map[string]Handler{
		// Session (cmd_session.go)
		"Auth":              cmdAuth,
		"Hello":             cmdHello,
		"Ping":              cmdPing,
		"SubscribeEvents":   cmdSubscribe,
		"UnsubscribeEvents": cmdUnsubscribe,

		// Job lifecycle (cmd_jobs.go; PUSHF in cmd_flows.go)
		"PUSH":          cmdPush,
		"PUSHB":         cmdPushBatch,
		"PUSHF":         cmdPushFlow,
		"PULL":          cmdPull,
		"PULLB":         cmdPullBatch,
		"ACK":           cmdAck,
		"ACKB":          cmdAckBatch,
		"FAIL":          cmdFail,
		"JobHeartbeat":  cmdJobHeartbeat,
		"JobHeartbeatB": cmdJobHeartbeatBatch,
		"ExtendLock":    cmdExtendLock,
		"ExtendLocks":   cmdExtendLocks,

		// Reading jobs (cmd_query.go)
		"GetJob":               cmdGetJob,
		"GetJobByCustomId":     cmdGetJobByCustomID,
		"GetState":             cmdGetState,
		"GetResult":            cmdGetResult,
		"GetJobCounts":         cmdGetJobCounts,
		"GetCountsPerPriority": cmdGetCountsPerPriority,
		"Count":                cmdCount,
		"GetJobs":              cmdGetJobs,
		"GetProgress":          cmdGetProgress,
		"Progress":             cmdProgress,
		"AddLog":               cmdAddLog,
		"GetLogs":              cmdGetLogs,
		"ClearLogs":            cmdClearLogs,
		"WaitJob":              cmdWaitJob,

		// Moving jobs by hand (cmd_control.go)
		"Cancel":         cmdCancel,
		"Discard":        cmdDiscard,
		"Promote":        cmdPromote,
		"PromoteJobs":    cmdPromoteJobs,
		"MoveToWait":     cmdMoveToWait,
		"MoveToDelayed":  cmdMoveToDelayed,
		"ChangeDelay":    cmdChangeDelay,
		"ChangePriority": cmdChangePriority,
		"Update":         cmdUpdate,
		"Clean":          cmdClean,
		"RetryCompleted": cmdRetryCompleted,

		// Deduplication (cmd_dedup.go)
		"GetDeduplicationJobId":     cmdGetDeduplicationJobID,
		"RemoveDeduplicationKey":    cmdRemoveDeduplicationKey,
		"RemoveJobDeduplicationKey": cmdRemoveJobDeduplicationKey,

		// Limits and stall policy (cmd_limits.go)
		"RateLimit":        cmdRateLimit,
		"RateLimitClear":   cmdRateLimitClear,
		"SetConcurrency":   cmdSetConcurrency,
		"ClearConcurrency": cmdClearConcurrency,
		"GetQueueLimits":   cmdGetQueueLimits,
		"SetStallConfig":   cmdSetStallConfig,
		"GetStallConfig":   cmdGetStallConfig,

		// Flows (cmd_flows.go, with PUSHF above)
		"GetChildrenValues":          cmdGetChildrenValues,
		"GetFailedChildrenValues":    cmdGetFailedChildrenValues,
		"GetIgnoredChildrenFailures": cmdGetIgnoredChildrenFailures,
		"RemoveChildDependency":      cmdRemoveChildDependency,
		"RemoveUnprocessedChildren":  cmdRemoveUnprocessedChildren,
		"MoveToWaitingChildren":      cmdMoveToWaitingChildren,
		"UpdateParent":               cmdUpdateParent,

		// Cron (cmd_cron.go)
		"Cron":       cmdCron,
		"CronGet":    cmdCronGet,
		"CronList":   cmdCronList,
		"CronDelete": cmdCronDelete,

		// Groups (cmd_groups.go)
		"GetGroupJobsCount":      cmdGetGroupJobsCount,
		"GetGroupsJobsCount":     cmdGetGroupsJobsCount,
		"GetGroupActiveCount":    cmdGetGroupActiveCount,
		"SetGroupRateLimit":      cmdSetGroupRateLimit,
		"GetGroupRateLimit":      cmdGetGroupRateLimit,
		"RemoveGroupRateLimit":   cmdRemoveGroupRateLimit,
		"GetGroupRateLimitTtl":   cmdGetGroupRateLimitTTL,
		"SetGroupConcurrency":    cmdSetGroupConcurrency,
		"GetGroupConcurrency":    cmdGetGroupConcurrency,
		"RemoveGroupConcurrency": cmdRemoveGroupConcurrency,
		"PauseGroup":             cmdPauseGroup,
		"ResumeGroup":            cmdResumeGroup,
		"IsGroupPaused":          cmdIsGroupPaused,
		"RateLimitGroup":         cmdRateLimitGroup,

		// The dead-letter queue (cmd_dlq.go)
		"Dlq":          cmdDlq,
		"RetryDlq":     cmdRetryDlq,
		"PurgeDlq":     cmdPurgeDlq,
		"SetDlqConfig": cmdSetDlqConfig,
		"GetDlqConfig": cmdGetDlqConfig,
		"GetDlqStats":  cmdGetDlqStats,
		"RemoveDlqJob": cmdRemoveDlqJob,

		// Queues (cmd_queue.go)
		"Pause":      cmdPause,
		"Resume":     cmdResume,
		"IsPaused":   cmdIsPaused,
		"Drain":      cmdDrain,
		"Obliterate": cmdObliterate,
		"ListQueues": cmdListQueues,

		// Stats (cmd_dashboard.go), Metrics (cmd_metrics.go), workers and
		// storage status (cmd_monitor.go)
		"Stats":            cmdStats,
		"Metrics":          cmdMetrics,
		"RegisterWorker":   cmdRegisterWorker,
		"UnregisterWorker": cmdUnregisterWorker,
		"Heartbeat":        cmdHeartbeat,
		"ListWorkers":      cmdListWorkers,
		"StorageStatus":    cmdStorageStatus,

		// Per-queue figures and Prometheus (cmd_metrics.go), the dashboard
		// (cmd_dashboard.go)
		"TrimEvents":        cmdTrimEvents,
		"Prometheus":        cmdPrometheus,
		"CompactMemory":     cmdCompactMemory,
		"DashboardOverview": cmdDashboardOverview,
		"DashboardQueues":   cmdDashboardQueues,
		"DashboardQueue":    cmdDashboardQueue,

		// HTTP handlers, queued's own (cmd_handlers.go)
		"HandlerSet":    cmdHandlerSet,
		"HandlerRemove": cmdHandlerRemove,
		"HandlerList":   cmdHandlerList,

		// Webhooks (cmd_webhooks.go)
		"AddWebhook":        cmdAddWebhook,
		"RemoveWebhook":     cmdRemoveWebhook,
		"ListWebhooks":      cmdListWebhooks,
		"SetWebhookEnabled": cmdSetWebhookEnabled,
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
	id, ok, err := m.Str(key)
	if err != nil {
		return "", err
	}
	if !ok || id == "" {
		return "", errors.New(key + " is required")
	}
	return id, nil
}
