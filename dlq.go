package main

// The dead-letter queue: where jobs end that failed for good, and its
// per-queue policy (auto-retry with backoff, maximum age, maximum
// entries). Here too the memory engine's DLQ operations (PolicyEngine);
// pg_dlq.go answers the same in PostgreSQL mode.

import (
	"context"
	"math"
	"slices"
)

// DLQEntry is what the DLQ keeps about a job besides the job itself.
type DLQEntry struct {
	EnteredAt   int64
	Reason      string
	Error       string
	HasErr      bool
	RetryCount  int32
	LastRetryAt int64
	NextRetryAt int64
	ExpiresAt   int64 // 0: never (maxAge null)
	// kept: the job left the DLQ by an auto-retry; if it comes back, the
	// entry (entered-at, retry count, expiry) carries on.
	kept bool
}

// AttemptRec is one failed attempt, as the DLQ entry lists them.
type AttemptRec struct {
	Attempt   int32
	StartedAt int64
	FailedAt  int64
	Reason    string
	Error     string
	HasErr    bool
}

func (j *Job) recordAttempt(startedAt, now int64, reason, err string, hasErr bool) {
	if len(j.cold().history) >= maxTimelineEntries {
		return
	}
	j.warm().history = append(j.cold().history, AttemptRec{Attempt: j.Attempts, StartedAt: startedAt, FailedAt: now,
		Reason: reason, Error: err, HasErr: hasErr})
}

func (s *Shard) toDLQ(q *Queue, j *Job, reason, err string, hasErr bool, now int64) {
	j.state = StateFailed
	j.warm().failErr, j.warm().hasFail = err, hasErr
	j.notifyDone(waitOutcome{err: err})
	j.dlq = dlqEntry(j.dlq, j.dlq != nil && j.dlq.kept, q.dlqCfg, reason, err, hasErr, now)
	s.b.announce(noticeDLQAdded(q.name, j.ID(), reason))
	if j.cold().ParentID != "" {
		s.b.announce(noticeFlowFailed(j.cold().ParentID, j.ID(), q.name, err, "Max attempts exceeded"))
	}
	s.childFailed(j, err)
	q.dlq = append(q.dlq, j)
	s.trimDLQ(q)
	s.watchDLQ(q, j, now)
	s.b.persist(j)
}

// dlqEntry is the DLQ entry of a job entering the DLQ: a fresh one, or
// prev carried on when the job left the DLQ by an auto-retry (kept).
func dlqEntry(prev *DLQEntry, kept bool, cfg DLQConfig, reason, err string, hasErr bool, now int64) *DLQEntry {
	e := prev
	if !kept {
		e = &DLQEntry{EnteredAt: now}
		if cfg.MaxAge != none {
			e.ExpiresAt = later(now, cfg.MaxAge)
		}
		if cfg.AutoRetry {
			e.NextRetryAt = later(now, cfg.AutoRetryInterval)
		}
	}
	e.kept = false
	e.Reason, e.Error, e.HasErr = reason, err, hasErr
	return e
}

// trimDLQ drops the oldest entries over the queue's bound.
func (s *Shard) trimDLQ(q *Queue) {
	for len(q.dlq) > q.dlqCfg.MaxEntries {
		old := q.dlq[0]
		q.dlq[0] = nil
		q.dlq = q.dlq[1:]
		s.forget(old)
	}
}

// watchDLQ puts a dead-lettered job on the shard timer for its next
// auto-retry or its expiry. (The lease heap is free for it: the job is not
// active.)
func (s *Shard) watchDLQ(q *Queue, j *Job, now int64) {
	d := dlqWatch(j.dlq, q.dlqCfg)
	if d == math.MaxInt64 {
		s.leases.Remove(j)
		return
	}
	s.leases.Push(j, 0, d, 0)
	s.armFor(d, now)
}

// dlqWatch is when a DLQ entry must be looked at next: its expiry or its
// next auto-retry (MaxInt64: never).
func dlqWatch(e *DLQEntry, c DLQConfig) int64 {
	d := int64(math.MaxInt64)
	if e.ExpiresAt > 0 {
		d = e.ExpiresAt
	}
	if c.AutoRetry && e.NextRetryAt > 0 && e.RetryCount < c.MaxAutoRetries && e.NextRetryAt < d {
		d = e.NextRetryAt
	}
	return d
}

// dlqDue runs when a dead-lettered job's time came: it expires, or is
// retried automatically with backoff doubling per retry.
func (s *Shard) dlqDue(q *Queue, j *Job, now int64) {
	if j.dlq == nil {
		return
	}
	switch dlqStep(j.dlq, q.dlqCfg, now) {
	case dlqExpire:
		q.removeDLQ(j)
		s.b.dropLogs(j.ID())
		s.forget(j)
		s.b.announce(noticeQueueCount("dlq:expired", q.name, 1))
		return
	case dlqRetry:
		if s.retryDLQ(q, j, now, true) {
			s.b.announce(noticeQueueCount("dlq:auto-retried", q.name, 1))
			return
		}
	}
	s.watchDLQ(q, j, now)
}

func (q *Queue) removeDLQ(j *Job) bool {
	for i, x := range q.dlq {
		if x == j {
			copy(q.dlq[i:], q.dlq[i+1:])
			q.dlq[len(q.dlq)-1] = nil
			q.dlq = q.dlq[:len(q.dlq)-1]
			return true
		}
	}
	return false
}

// dlqFilter selects DLQ entries, as the reference's filter object does.
type dlqFilter struct {
	reason              string
	olderThan           int64
	newerThan           int64
	retriable, expired  int8 // -1 any, 0 false, 1 true
	offset, limit       int64
	hasOffset, hasLimit bool
}

// applyList filters dead-lettered jobs under a queue's DLQ policy.
func (f *dlqFilter) applyList(dlq []*Job, cfg DLQConfig, now int64) []*Job {
	var out []*Job
	for _, j := range dlq {
		d := j.dlq
		if f.reason != "" && d.Reason != f.reason {
			continue
		}
		if f.olderThan != 0 && d.EnteredAt >= f.olderThan {
			continue
		}
		if f.newerThan != 0 && d.EnteredAt <= f.newerThan {
			continue
		}
		if f.expired >= 0 && (now >= d.ExpiresAt) != (f.expired == 1) {
			continue
		}
		if f.retriable >= 0 && (d.RetryCount < cfg.MaxAutoRetries) != (f.retriable == 1) {
			continue
		}
		out = append(out, j)
	}
	lo, hi := pageBounds(len(out), f.offset, f.limit, f.hasLimit) // an absent offset is 0
	return out[lo:hi]
}

// dlqSelect is which DLQ entries a Dlq or RetryDlq request names.
type dlqSelect struct {
	filter   *dlqFilter
	jobID    string // RetryDlq only
	count    int64
	hasCount bool
}

// limit applies count to entries in DLQ order.
func (d dlqSelect) limit(sel []*Job) []*Job {
	if d.hasCount {
		return sel[:min(max(d.count, 0), int64(len(sel)))]
	}
	return sel
}

// listed is the part of a queue's DLQ that Dlq shows: the entries the
// filter selects, count of them at most.
func (d dlqSelect) listed(dlq []*Job, cfg DLQConfig, now int64) []*Job {
	if d.filter != nil {
		dlq = d.filter.applyList(dlq, cfg, now)
	}
	return d.limit(dlq)
}

// toRetry is the part of a queue's DLQ that RetryDlq retries: the
// entries the filter selects, or the job named, or the first count
// entries (all without count). The result may share dlq's array.
func (d dlqSelect) toRetry(dlq []*Job, cfg DLQConfig, now int64) []*Job {
	switch {
	case d.filter != nil:
		return d.filter.applyList(dlq, cfg, now)
	case d.jobID != "":
		for _, j := range dlq {
			if j.ID() == d.jobID {
				return []*Job{j}
			}
		}
		return nil
	}
	return d.limit(dlq)
}

// dlqCopy copies a dead-lettered job for an answer written after the
// shard lock is let go (an auto-retry may change the live job meanwhile):
// what readers see, its DLQ entry and its failed attempts.
func (j *Job) dlqCopy() *Job {
	c := j.readCopy()
	if j.dlq != nil {
		d := *j.dlq
		c.dlq = &d
	}
	c.warm().history = slices.Clone(j.cold().history)
	return c
}

func (b *MemEngine) DLQ(_ context.Context, queue string, sel dlqSelect) ([]*Job, error) {
	var out []*Job
	b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		for _, j := range sel.listed(q.dlq, q.dlqCfg, now) {
			out = append(out, j.dlqCopy())
		}
	})
	return out, nil
}

// retryDLQ puts a dead-lettered job back to waiting with fresh attempts;
// s.mu is held. An auto-retry keeps the DLQ entry's history for when the
// job comes back; a retry by hand starts over.
func (s *Shard) retryDLQ(q *Queue, j *Job, now int64, auto bool) bool {
	if j.cold().UniqueKey != "" {
		if e := q.holder(j.cold().UniqueKey, now); e != nil && e.job != j {
			return false
		}
	}
	if !q.removeDLQ(j) {
		return false
	}
	s.leases.Remove(j)
	resetDLQ(j, auto, now)
	s.holdUnique(q, j)
	s.enqueue(q, j, now)
	s.b.persist(j)
	return true
}

// resetDLQ clears a dead-lettered job's run for a retry.
func resetDLQ(j *Job, auto bool, now int64) {
	if auto {
		j.dlq.kept = true
	} else {
		j.dlq = nil
	}
	j.Attempts, j.warm().Stalls = 0, 0
	j.setStartedAt(0)
	j.setHeartbeat(now)
	j.RunAt = now
	j.addTimeline(TimelineEntry{State: StateWaiting, At: now})
}

// RetryDLQ is admitted by the memory budget as a command that grows what
// jobs hold (commands.go): the jobs it puts back are in memory already,
// but once waiting they no longer go when the queue's DLQ is trimmed to
// its maxEntries. Its weight is its request's.
func (b *MemEngine) RetryDLQ(_ context.Context, queue string, sel dlqSelect) (int64, error) {
	n := int64(0)
	b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		// retryDLQ takes the jobs out of q.dlq, which toRetry may share.
		for _, j := range slices.Clone(sel.toRetry(q.dlq, q.dlqCfg, now)) {
			if s.retryDLQ(q, j, now, false) {
				n++
			}
		}
	})
	return n, nil
}

func (b *MemEngine) PurgeDLQ(_ context.Context, queue string) (int64, error) {
	n := 0
	b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		gone := q.dlq
		q.dlq = nil
		for _, j := range gone {
			s.b.dropLogs(j.ID())
			s.forget(j)
		}
		n = len(gone)
	})
	return int64(n), nil
}

func (b *MemEngine) RemoveDLQJob(_ context.Context, queue, id string) (bool, error) {
	removed := false
	b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		for _, j := range slices.Clone(q.dlq) {
			if j.ID() == id && q.removeDLQ(j) {
				s.b.dropLogs(j.ID())
				s.forget(j)
				removed = true
			}
		}
	})
	return removed, nil
}

// ---------------------------------------------------------------------------
// DLQ policy and figures

// dlqPatch is a SetDlqConfig's settings, read and clamped as the
// reference clamps them: those given replace the queue's.
type dlqPatch struct {
	autoRetry                    *bool
	interval, maxRetries, maxAge *int64
	maxEntries                   *int64
	noMaxAge                     bool // maxAge: null, entries never expire
}

func (p dlqPatch) apply(c DLQConfig) DLQConfig {
	if p.autoRetry != nil {
		c.AutoRetry = *p.autoRetry
	}
	if p.interval != nil {
		c.AutoRetryInterval = max(*p.interval, 0)
	}
	if p.maxRetries != nil {
		c.MaxAutoRetries = int32(min(max(*p.maxRetries, 0), math.MaxInt32))
	}
	if p.noMaxAge {
		c.MaxAge = none
	} else if p.maxAge != nil {
		c.MaxAge = max(*p.maxAge, 0)
	}
	if p.maxEntries != nil {
		c.MaxEntries = int(max(*p.maxEntries, 1))
	}
	return c
}

func (b *MemEngine) SetDLQConfig(_ context.Context, queue string, patch dlqPatch) error {
	return b.withQueue(queue, true, func(s *Shard, q *Queue, now int64) {
		q.dlqCfg = patch.apply(q.dlqCfg)
		q.listed = true
		s.trimDLQ(q)
		b.queueChanged(q)
	})
}

func (b *MemEngine) GetDLQConfig(_ context.Context, queue string) (DLQConfig, error) {
	c := defaultDLQ
	b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			c = q.dlqCfg
		}
	})
	return c, nil
}

var dlqReasons = []string{"explicit_fail", "max_attempts_exceeded", "timeout", "stalled", "ttl_expired", "worker_lost", "unknown"}

// dlqStats are GetDlqStats' figures of one queue.
type dlqStats struct {
	byReason                map[string]int
	total, pending, expired int
	oldest, newest          int64
}

func (st *dlqStats) add(e *DLQEntry, cfg DLQConfig, now int64) {
	if st.byReason == nil {
		st.byReason = map[string]int{}
	}
	st.total++
	if slices.Contains(dlqReasons, e.Reason) {
		st.byReason[e.Reason]++
	} else {
		st.byReason["unknown"]++
	}
	if e.NextRetryAt > 0 && e.NextRetryAt <= now && e.RetryCount < cfg.MaxAutoRetries {
		st.pending++
	}
	if e.ExpiresAt > 0 && e.ExpiresAt <= now {
		st.expired++
	}
	if st.oldest == 0 || e.EnteredAt < st.oldest {
		st.oldest = e.EnteredAt
	}
	st.newest = max(st.newest, e.EnteredAt)
}

func (b *MemEngine) DLQStats(_ context.Context, queue string) (dlqStats, error) {
	var st dlqStats
	b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		for _, j := range q.dlq {
			st.add(j.dlq, q.dlqCfg, now)
		}
	})
	return st, nil
}
