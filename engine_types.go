package main

// The values the Engine's methods take and answer (engine.go), the same
// for both engines: what a pull asks for, an acknowledgement, a job as a
// reader sees it, counts, a queue's stall and dead-letter policy, a log
// line, what a wait came to.

// AckItem is one acknowledgement.
type AckItem struct {
	ID        string
	Token     string
	Result    Raw
	HasResult bool
	Remove    bool
}

// PullOpts says how jobs are claimed.
type PullOpts struct {
	Owner  string
	TTL    int64
	Conn   *conn // tracked for release when the connection drops
	Detach bool
	Group  *groupPull
	// Limit is the bytes of jobs the answer may carry (answerLimit; 0:
	// answerCap).
	Limit int64
}

// JobView is a job as a reader saw it. Job is the reader's own copy
// (nil when there is no such job), State the state it is listed under
// ("unknown" for no job; GetJobs lists a paused queue's ready jobs as
// "paused"), Result a completed job's result while it is kept.
type JobView struct {
	Job    *Job
	State  string
	Result Raw
}

func (c *JobCounts) plus(o *JobCounts) {
	c.Waiting += o.Waiting
	c.Prioritized += o.Prioritized
	c.Delayed += o.Delayed
	c.Active += o.Active
	c.Completed += o.Completed
	c.Failed += o.Failed
	c.WaitingChildren += o.WaitingChildren
}

// JobCounts are one queue's jobs by state.
type JobCounts struct {
	Waiting, Prioritized, Delayed, Active, Completed, Failed, WaitingChildren, Paused int
}

// DLQConfig is a queue's dead-letter policy.
type DLQConfig struct {
	AutoRetry         bool
	AutoRetryInterval int64
	MaxAutoRetries    int32
	MaxAge            int64
	MaxEntries        int
}

// StallConfig is a queue's stall-detection policy.
type StallConfig struct {
	Enabled       bool
	StallInterval int64
	MaxStalls     int32
	GracePeriod   int64
}

// LogEntry is one line of a job's log.
type LogEntry struct {
	At      int64
	Level   string
	Message Raw
}

// waitOutcome is how a job ended, for WaitJob callers.
type waitOutcome struct {
	completed bool
	result    Raw
	hasResult bool
	err       string
}
