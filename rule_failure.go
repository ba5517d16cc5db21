package main

// Rules both engines follow when a job's attempt ends: whether a failure
// may be recorded, whether it retries or dead-letters, what a
// dead-letter entry's time brings, whether a lease token still holds,
// and the outcome of an ACK or FAIL that did not apply.

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
