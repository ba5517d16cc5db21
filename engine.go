package main

// The seam between the protocol and storage. A handler (cmd_*.go) reads
// its arguments, calls one Engine method and writes the answer; the engine
// does the work. There are two engines:
//
//   - *Broker: jobs in memory, in shards (shard.go), written through to
//     SQLite when a data file is set (sqlite.go). Its methods live in the
//     files named for each group below (queue.go, ...).
//   - *PG: jobs in a PostgreSQL namespace shared by every broker
//     (postgres.go); its methods live in pg_<group>.go, file for file.
//
// What belongs to one broker and its connections (sessions, event
// subscriptions, webhooks, workers, this broker's counters) is not the
// engine's: handlers reach it through r.b and r.c in both modes.
//
// Engine methods take the connection's context: a memory engine mostly
// ignores it, the PostgreSQL engine bounds its database work by it and
// by its own deadline (PG.opCtx). Arguments and results are plain values,
// never a *Req. Errors are ready for the client: a refusal as it is, a
// storage fault named as such.
//
// One exception: the *conn a job is pulled through (PullOpts.Conn) and
// the one Release names. The engine keeps it as the owner of the jobs it
// hands out, so that a connection that closes gives its jobs back at once:
// the memory engine on the connection's held set (conn.track, takeHeld),
// the PostgreSQL one in its own table keyed by the *conn (pg_release.go).
// Neither reads or writes the connection's socket.

import (
	"context"
	"time"
)

// Engine is everything the protocol asks of storage.
type Engine interface {
	JobEngine
	FlowEngine
	ReadEngine
	ControlEngine
	QueueEngine
	PolicyEngine
	GroupEngine
	DedupEngine
	CronEngine
	DashboardEngine
}

// JobEngine is the job lifecycle: push, pull, ack, fail, leases (lifecycle.go,
// pg_lifecycle.go).
type JobEngine interface {
	// Push admits parsed jobs into a queue, in order, until one is
	// refused (those before it stay). batch says they came as one PUSHB:
	// its jobs with custom ids may be depended on by others of it. The
	// answer may come later (Pushed.Wait): PostgreSQL writes pushes in
	// groups. A refusal of one job is a *jobErr naming its index.
	Push(ctx context.Context, queue string, jobs []*Job, batch bool) Pushed
	// Pull claims up to n ready jobs of queue for o and hands them to
	// answer, which is not called when none was claimed. When none was
	// and timeout > 0, it may instead return a PullWait: the caller runs
	// it off the connection's reader, and it waits up to timeout ms.
	Pull(ctx context.Context, queue string, n int, o PullOpts, timeout int64, answer PullAnswer) (PullWait, error)
	// Ack completes an active job (or one whose lease ran out, whose work
	// is kept); AlreadyFinalized when the token's attempt was over.
	Ack(ctx context.Context, it AckItem) (Outcome, error)
	// AckBatch completes jobs and answers the indexes of the items that
	// did not apply, in order.
	AckBatch(ctx context.Context, items []AckItem) ([]int, error)
	// Fail records a failed attempt: a retry after the backoff, the DLQ,
	// or removal.
	Fail(ctx context.Context, id, token string, f failure) (Outcome, error)
	// Heartbeat marks active jobs alive, renewing the lock of those named
	// with a token, and answers how many it found.
	Heartbeat(ctx context.Context, rn renewals) (int, error)
	// ExtendLocks renews the locks of active jobs that have one, and
	// answers how many it renewed.
	ExtendLocks(ctx context.Context, rn renewals) (int, error)
	// Release puts back what a closed connection pulled and still holds,
	// without costing an attempt, unless its lock was renewed.
	Release(ctx context.Context, c *conn)
	// HandedOut counts the jobs this broker handed out that are not yet
	// finished, for a graceful stop to wait on (graceful_stop.go).
	HandedOut(ctx context.Context) int
	// Waits says whether Ack, AckBatch and Fail wait on a round trip to
	// storage before they answer (PostgreSQL mode: for their round's
	// commit). The handlers then run them off the connection's reader
	// (offReader).
	Waits() bool
}

// FlowEngine pushes flows and answers parents about their children
// (flows.go, pg_flows.go).
type FlowEngine interface {
	// Now is the engine's clock in ms, which the jobs of a flow are
	// stamped with when they are read (PostgreSQL mode: the database's).
	Now() int64
	// PushFlow admits a flow read by flowJobs, all of it or none, and
	// answers its jobs as admitted, in the flow's order, for the caller
	// to read.
	PushFlow(ctx context.Context, jobs []flowJob) ([]*Job, error)
	// ChildrenValues answers the results of a parent's completed
	// children, by "queue:id"; none when there is no such job.
	ChildrenValues(ctx context.Context, id string) ([]childKV, error)
	// FailedChildren answers the errors of a parent's children that
	// failed and let it continue (continueParentOnFailure), by
	// "queue:id"; IgnoredChildren those of children whose failure it
	// ignores (ignoreDependencyOnFailure). Only a parent yet to finish
	// has them.
	FailedChildren(ctx context.Context, id string) ([]childKV, error)
	IgnoredChildren(ctx context.Context, id string) ([]childKV, error)
	// RemoveChildDependency stops a parent waiting for the child id and
	// unlinks them; false when the child is finished or its parent no
	// longer waits for it. A parent left waiting for nothing runs.
	RemoveChildDependency(ctx context.Context, id string) (bool, error)
	// RemoveUnprocessedChildren removes the children of id still to run.
	RemoveUnprocessedChildren(ctx context.Context, id string) error
	// MoveToWaitingChildren parks an active job, whose lease token is
	// given, until a child is linked to it.
	MoveToWaitingChildren(ctx context.Context, id, token string) error
	// UpdateParent links the child to the parent (the parent waits for
	// it unless it has completed), or tells a declared child its parent.
	UpdateParent(ctx context.Context, childID, parentID string) error
}

// ReadEngine reads jobs, counts, progress and logs, and waits for results
// (query.go, pg_query.go).
type ReadEngine interface {
	// ReadJob reads one job as it is now, for GetJob, GetState, GetResult and GetProgress. No such job: a nil Job, state
	// "unknown", no error.
	ReadJob(ctx context.Context, id string) (JobView, error)
	// ReadJobByCustomID reads the job holding a custom id, for
	// GetJobByCustomId, as ReadJob does when customIDFinds finds it
	// (rule_customid.go).
	ReadJobByCustomID(ctx context.Context, id string) (JobView, error)
	// Jobs is the page of a queue's jobs a jobsQuery selects, in
	// creation order, each labelled with the state it is listed under.
	Jobs(ctx context.Context, queue string, q jobsQuery) ([]JobView, error)
	// Counts are a queue's jobs by state (a paused queue's ready jobs
	// count as paused).
	Counts(ctx context.Context, queue string) (JobCounts, error)
	// CountsPerPriority counts a queue's waiting and delayed jobs by
	// priority.
	CountsPerPriority(ctx context.Context, queue string) (map[int64]int, error)
	// SetProgress sets an active job's progress (and message) and emits
	// the progress event.
	SetProgress(ctx context.Context, u progressSet) error
	// AddLog adds a log line to a job that exists, stamped with the
	// engine's time, dropping the oldest lines over the limits.
	AddLog(ctx context.Context, id string, e LogEntry) error
	// Logs are a job's logs, oldest first.
	Logs(ctx context.Context, id string) ([]LogEntry, error)
	// ClearLogs drops a job's logs but the keep newest.
	ClearLogs(ctx context.Context, id string, keep int64) error
	// WaitJob looks at a job: finished already, done says how; otherwise
	// wait blocks until it finishes, timeout passes (counted from the
	// call of wait) or wait's ctx ends.
	WaitJob(ctx context.Context, id string, timeout time.Duration) (done *waitOutcome, wait jobWait, err error)
}

// ControlEngine moves jobs by hand: cancel, discard, promote, delay,
// priority, update, clean, retry completed (control.go, pg_control.go).
type ControlEngine interface {
	// MoveJob moves one job by hand (Cancel, Discard, Promote,
	// MoveToWait, MoveToDelayed, ChangeDelay, ChangePriority, Update).
	// Both engines decide the move the same way (JobMove.plan); a job it
	// does not apply to is refused with the move's own error.
	MoveJob(ctx context.Context, id string, m JobMove) error
	// PromoteJobs makes up to limit of a queue's delayed jobs ready now,
	// oldest first, and says how many.
	PromoteJobs(ctx context.Context, queue string, limit int) (int64, error)
	// Clean removes up to a.limit of a queue's jobs in a.state, older
	// than the grace, oldest first, and names them.
	Clean(ctx context.Context, a cleanArgs) ([]string, error)
	// RetryCompleted puts a queue's completed jobs (or the one a.id
	// names) back to waiting, but for those whose unique key a live job
	// holds, and says how many.
	RetryCompleted(ctx context.Context, a retryCompletedArgs) (int64, error)
}

// QueueEngine pauses, empties, removes and lists queues (queue.go,
// pg_queue.go).
type QueueEngine interface {
	// SetPaused pauses (paused) or resumes a queue, making it when it does
	// not exist yet, and tells the queue's subscribers.
	SetPaused(ctx context.Context, queue string, paused bool) error
	IsPaused(ctx context.Context, queue string) (bool, error)
	// Drain removes a queue's waiting and delayed jobs and says how many
	// went.
	Drain(ctx context.Context, queue string) (int64, error)
	// Obliterate removes a queue with all its jobs, settings and groups.
	Obliterate(ctx context.Context, queue string) error
	// ListQueues names the queues, oldest first.
	ListQueues(ctx context.Context) ([]string, error)
}

// PolicyEngine keeps a queue's limits, stall and DLQ policy, and the
// dead-letter queue itself (limits.go, dlq.go; pg_limits.go, pg_dlq.go).
// Setting a policy makes the queue when it does not exist yet; clearing
// one, or reading a queue that does not exist, does not.
type PolicyEngine interface {
	// SetRateLimit gives a queue a rate limit, its bucket full, and wakes
	// the pulls waiting on it.
	SetRateLimit(ctx context.Context, queue string, limit RateLimit) error
	ClearRateLimit(ctx context.Context, queue string) error
	// SetConcurrency bounds how many of a queue's jobs are active at once.
	SetConcurrency(ctx context.Context, queue string, limit int64) error
	ClearConcurrency(ctx context.Context, queue string) error
	QueueLimits(ctx context.Context, queue string) (QueueLimits, error)
	// SetStallConfig replaces the settings the patch gives of a queue's
	// stall policy.
	SetStallConfig(ctx context.Context, queue string, patch stallPatch) error
	GetStallConfig(ctx context.Context, queue string) (StallConfig, error)

	// DLQ answers the dead-lettered jobs sel selects, oldest first, each
	// with its DLQ entry and failed attempts (copies: the caller may keep
	// them).
	DLQ(ctx context.Context, queue string, sel dlqSelect) ([]*Job, error)
	// RetryDLQ puts the dead-lettered jobs sel selects back to waiting
	// with fresh attempts, except those whose unique key a live job holds,
	// and says how many went back.
	RetryDLQ(ctx context.Context, queue string, sel dlqSelect) (int64, error)
	// PurgeDLQ removes a queue's dead-lettered jobs and says how many.
	PurgeDLQ(ctx context.Context, queue string) (int64, error)
	// RemoveDLQJob removes one dead-lettered job and says whether it was
	// there.
	RemoveDLQJob(ctx context.Context, queue, id string) (bool, error)
	// SetDLQConfig replaces the settings the patch gives of a queue's DLQ
	// policy, and trims its DLQ to the new bound.
	SetDLQConfig(ctx context.Context, queue string, patch dlqPatch) error
	GetDLQConfig(ctx context.Context, queue string) (DLQConfig, error)
	DLQStats(ctx context.Context, queue string) (dlqStats, error)
}

// GroupEngine keeps group settings and figures (groups.go, pg_groups.go).
// A group is named by its queue and its id. Reading a group that does not
// exist answers as for one with nothing set; the setters make the queue
// and the group when missing, within the queue's room for groups with
// settings (maxGroupSettings), and wake the queue's pulls.
type GroupEngine interface {
	// GroupJobsCount counts a group's queued (waiting or delayed) jobs.
	GroupJobsCount(ctx context.Context, queue, group string) (int64, error)
	// GroupsJobsCount counts the queued jobs of all a queue's groups
	// together (not a number of groups, as the reference answers it).
	GroupsJobsCount(ctx context.Context, queue string) (int64, error)
	// GroupActiveCount counts a group's active jobs.
	GroupActiveCount(ctx context.Context, queue, group string) (int64, error)

	// SetGroupRateLimit gives a group a rate limit of its own, in place
	// of the one its pulls ask for; the group's window starts afresh.
	SetGroupRateLimit(ctx context.Context, queue, group string, l groupLimit) error
	// GroupRateLimit is the group's own rate limit (nil: none).
	GroupRateLimit(ctx context.Context, queue, group string) (*groupLimit, error)
	// RemoveGroupRateLimit says whether the group had one to remove.
	RemoveGroupRateLimit(ctx context.Context, queue, group string) (bool, error)
	// GroupRateLimitTTL is how long the group is held back (by
	// RateLimitGroup or a full window), 0 when a pull of maxJobs (if
	// hasMax) would still fit, -2 when nothing holds it.
	GroupRateLimitTTL(ctx context.Context, queue, group string, maxJobs float64, hasMax bool) (int64, error)

	// SetGroupConcurrency gives a group a concurrency of its own, in
	// place of the one its pulls ask for.
	SetGroupConcurrency(ctx context.Context, queue, group string, c int64) error
	// GroupConcurrency is the group's own concurrency (0: none).
	GroupConcurrency(ctx context.Context, queue, group string) (int64, error)
	// RemoveGroupConcurrency says whether the group had one to remove.
	RemoveGroupConcurrency(ctx context.Context, queue, group string) (bool, error)

	// SetGroupPaused pauses (paused) or resumes a group and says whether
	// that changed it. Only pausing makes the group.
	SetGroupPaused(ctx context.Context, queue, group string, paused bool) (bool, error)
	IsGroupPaused(ctx context.Context, queue, group string) (bool, error)
	// RateLimitGroup holds a group back for d milliseconds.
	RateLimitGroup(ctx context.Context, queue, group string, d int64) error
}

// DedupEngine answers for deduplication keys (dedup.go, pg_dedup.go).
// A key is held by a live job until the job finishes, the key is
// removed, or its dedup ttl runs out.
type DedupEngine interface {
	// DedupJobID names the job holding a queue's key ("": none).
	DedupJobID(ctx context.Context, queue, key string) (string, error)
	// RemoveDedupKey frees a queue's key and says whether it was held.
	RemoveDedupKey(ctx context.Context, queue, key string) (bool, error)
	// RemoveJobDedupKey frees the key a job holds and says whether it
	// held one.
	RemoveJobDedupKey(ctx context.Context, id string) (bool, error)
}

// CronEngine keeps the cron schedules (cron.go, pg_cron.go). Firing them
// is each engine's own loop.
type CronEngine interface {
	// AddCron makes a schedule, or replaces the one of the same name (which
	// keeps its executions), and answers it with its next run.
	AddCron(ctx context.Context, s CronSchedule) (CronSchedule, error)
	// GetCron answers the named schedule; errCronNotFound when there is
	// none.
	GetCron(ctx context.Context, name string) (CronSchedule, error)
	// ListCrons answers every schedule, in the order they were first made.
	ListCrons(ctx context.Context) ([]CronSchedule, error)
	// DeleteCron removes the named schedule; errCronNotFound when there is
	// none.
	DeleteCron(ctx context.Context, name string) error
}

// DashboardEngine answers the figures of Stats and the dashboard
// commands (dashboard.go, pg_dashboard.go): the jobs' figures only;
// throughput, latency, workers and connections are each broker's.
type DashboardEngine interface {
	// Totals counts the jobs of every queue by state, and the queues.
	Totals(ctx context.Context) (Totals, error)
	// DashboardOverview reads the overview's totals, collection sizes and
	// cron schedules at one moment.
	DashboardOverview(ctx context.Context) (dashOverview, error)
	// DashboardQueues counts each listed queue's jobs, oldest queue first.
	DashboardQueues(ctx context.Context) ([]queueSnap, error)
	// DashboardQueue reads one queue's counts, priorities and DLQ preview
	// at one moment and, when a.withJobs, the first a.limit jobs of each
	// list.
	DashboardQueue(ctx context.Context, a dashQueueArgs) (dashQueue, error)
	// CompactMemory drops what the engine's structures keep past their
	// contents (CompactMemory, POST /gc).
	CompactMemory(ctx context.Context) error
}

var (
	_ Engine = (*MemEngine)(nil) // memory and SQLite
	_ Engine = (*PG)(nil)        // PostgreSQL
)

// jobErr is a refusal of one job of a push, by its index in the push.
type jobErr struct {
	i   int
	err error
}

func (e *jobErr) Error() string { return e.err.Error() }
