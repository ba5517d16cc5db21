package main

// Rules both engines follow when a job's attempt ends: whether a failure
// may be recorded, whether it retries or dead-letters, what a
// dead-letter entry's time brings, whether a lease token still holds, the
// fence an ACK or FAIL passes (finishFence), and when a job has run past
// its timeout.

import "errors"

// check says whether a failure may be recorded on j: its error lands in
// the timeline, the attempt history and (at the end) the DLQ entry, and
// its stack replaces the job's.
func (f failure) check(j *Job) error {
	stack := j.cold().Stack
	if len(f.stack) > 0 {
		stack = normalizeStack(f.stack, int(j.cold().StackTraceLimit))
	}
	n := j.size() - strsBytes(j.cold().Stack) + strsBytes(stack) + 3*int64(len(f.err))
	if n > maxJobBytes {
		return errJobTooBig
	}
	return nil
}

// failure describes why an active job failed.
type failure struct {
	err           string
	hasErr        bool
	stack         []string
	unrecoverable bool
	removeOnFail  bool
	reason        string // DLQ reason when terminal
}

// size is what a failure holds in bytes: its error and stack.
func (f failure) size() int {
	n := len(f.err) + len(f.reason)
	for _, l := range f.stack {
		n += len(l)
	}
	return n
}

// failedAttempt applies a failed attempt to an active job, the same way in
// both engines: the attempt counted, its stack and timeline kept and its
// record written. It answers whether the job retries (then RunAt is after
// the backoff and the timeline says it waits for the next attempt) and,
// when it does not, the reason it is given up with. The engine then does
// the rest: the queue it goes back to, the DLQ or its removal.
func failedAttempt(j *Job, f failure, now int64) (retry bool, reason string) {
	startedAt := j.StartedAt()
	j.Attempts++
	if len(f.stack) > 0 {
		j.warm().Stack = normalizeStack(f.stack, int(j.cold().StackTraceLimit))
	}
	j.addTimeline(TimelineEntry{State: StateFailed, At: now, Error: f.err, HasErr: f.hasErr, Attempt: j.Attempts})
	retry = !f.unrecoverable && j.Attempts < j.cold().MaxAttempts
	reason = f.reason
	if reason == "" {
		reason = "max_attempts_exceeded"
	}
	// The attempt record says why this attempt ended; the last one of a
	// job that is given up carries the DLQ reason.
	attempt := "explicit_fail"
	if f.reason == "timeout" || !retry {
		attempt = reason
	}
	j.recordAttempt(startedAt, now, attempt, f.err, f.hasErr)
	if retry {
		j.RunAt = now + backoffDelay(j)
		j.setStartedAt(0)
		j.addTimeline(TimelineEntry{State: StateWaiting, At: now, Attempt: j.Attempts + 1})
	}
	return retry, reason
}

type dlqAction int

const (
	dlqWait dlqAction = iota
	dlqExpire
	dlqRetry
)

// dlqStep decides what a DLQ entry's time brings: expiry, or an
// auto-retry (counted on the entry, with the next one's time doubling).
func dlqStep(e *DLQEntry, c DLQConfig, now int64) dlqAction {
	if e.ExpiresAt > 0 && now >= e.ExpiresAt {
		return dlqExpire
	}
	if c.AutoRetry && e.NextRetryAt > 0 && now >= e.NextRetryAt && e.RetryCount < c.MaxAutoRetries {
		e.RetryCount++
		e.LastRetryAt = now
		e.NextRetryAt = 0
		if e.RetryCount < c.MaxAutoRetries {
			// The interval doubles with each retry, up to 2^40 times: a
			// product past int64's end (a day's interval doubled 37
			// times) wrapped around to a retry due at once.
			shift := min(e.RetryCount-1, 40)
			wait := int64(maxTimestamp)
			if c.AutoRetryInterval <= maxTimestamp>>shift {
				wait = c.AutoRetryInterval << shift
			}
			e.NextRetryAt = later(now, wait)
		}
		return dlqRetry
	}
	return dlqWait
}

// checkLease applies the reference's lease rules to an ACK or FAIL of an
// active job: with a lock, the token must be given and match.
func checkLease(j *Job, token string) error {
	if j.run().lease == nil {
		return nil
	}
	if token == "" {
		return errors.New("Lock token required for job " + j.ID())
	}
	if token != j.run().lease.Token {
		return errors.New("Invalid or expired lock token for job " + j.ID())
	}
	return nil
}

// Outcome of an ACK or FAIL that did not apply but is not an error.
type Outcome uint8

const (
	Applied Outcome = iota
	AlreadyFinalized
)

// finishFacts are what an engine knows of the job an ACK or FAIL names,
// for finishFence. The engines know different things: the memory engine
// keeps the tokens a job timeout ended (retired) but not a queued job's
// last token; the PostgreSQL engine keeps every job's last token on its
// row but no retired set.
type finishFacts struct {
	id       string
	token    string // the token the request gave ("" for none)
	found    bool
	state    State
	attempts int32
	// leaseOwned: the job is active under a lease with an owner, whose
	// token an ACK or FAIL must give.
	leaseOwned bool
	leaseToken string
	// lastToken is the token of the job's last lease once it is no
	// longer active, when the engine keeps it (keepsLastToken).
	lastToken      string
	keepsLastToken bool
	// retired says whether a token was ended by a job timeout (nil: the
	// engine keeps no such set). An interface rather than a func value:
	// a method value made per ACK would be allocated per ACK.
	retired interface{ isRetired(token string) bool }
	// finishedAgainIsFinalized: a finish, with its token, of a job
	// already completed or failed answers AlreadyFinalized rather than
	// "not processing". The reference's engines differ here and queued
	// follows each: its memory engine refuses, its PostgreSQL engine
	// answers {applied: false, reason: already-finalized}.
	finishedAgainIsFinalized bool
}

// finishFence decides whether an ACK (fail false) or FAIL (fail true)
// applies: the fence that keeps a worker whose lease ran out, and whose
// job another worker may now hold, from finishing it. An outcome other
// than Applied, or an error, means the job is left as it is.
func finishFence(f finishFacts, fail bool) (Outcome, error) {
	// ended: the token was ended by a job timeout (asked only where it
	// matters: the memory engine looks it up under a lock).
	ended := func() bool { return f.token != "" && f.retired != nil && f.retired.isRetired(f.token) }
	if !f.found {
		if ended() {
			return AlreadyFinalized, nil
		}
		return Applied, errors.New(errNotProcessing + f.id)
	}
	// lastAttempt: the token is that of the attempt that ended. An engine
	// that keeps no queued job's token takes any token given to a job
	// that has run for it.
	lastAttempt := f.token != "" && f.token == f.lastToken
	if !f.keepsLastToken {
		lastAttempt = f.token != "" && f.attempts > 0
	}
	switch f.state {
	case StateActive:
		if !f.leaseOwned {
			return Applied, nil
		}
		if f.token == "" {
			return Applied, errors.New("Lock token required for job " + f.id)
		}
		if f.token != f.leaseToken {
			if ended() {
				return AlreadyFinalized, nil
			}
			return Applied, errors.New("Invalid or expired lock token for job " + f.id)
		}
		return Applied, nil
	case StateWaiting, StatePrioritized, StateDelayed:
		// The job went back to the queue: its lease ran out, its failure
		// is being retried, or a timeout ended it.
		switch {
		case ended():
			return AlreadyFinalized, nil
		case fail && lastAttempt:
			// That attempt was counted when it ended.
			return AlreadyFinalized, nil
		case !fail && (lastAttempt || f.token == "" && f.attempts > 0):
			// The worker finished after all: its work is kept, as the
			// reference keeps it, rather than running the job again.
			return Applied, nil
		}
	case StateCompleted, StateFailed:
		if ended() || f.finishedAgainIsFinalized && lastAttempt {
			return AlreadyFinalized, nil
		}
	default:
		if ended() {
			return AlreadyFinalized, nil
		}
	}
	return Applied, errors.New(errNotProcessing + f.id)
}

// timeoutAt is when job j's processing timeout ends its attempt (ok
// false: it has none).
func timeoutAt(j *Job) (at int64, ok bool) { return timeoutAtFrom(j, j.StartedAt()) }

// timeoutAtFrom is timeoutAt for j started at started.
func timeoutAtFrom(j *Job, started int64) (at int64, ok bool) {
	if t := j.cold().Timeout; t != none && t > 0 {
		return started + t, true
	}
	return 0, false
}

// timedOut says whether active job j has run past its timeout at now.
func timedOut(j *Job, now int64) bool {
	at, ok := timeoutAt(j)
	return ok && at <= now
}

// timeoutFailure is what a timeout records as the attempt's failure.
func timeoutFailure() failure {
	return failure{err: "Job timeout exceeded", hasErr: true, reason: "timeout"}
}

var errNotProcessing = "Job not found or not in processing state: "
