package main

// The dead-letter queue: where jobs end that failed for good, its per-queue
// policy (auto-retry with backoff, maximum age, maximum entries), and its
// commands.

import (
	"errors"
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
	if len(j.history) >= maxTimelineEntries {
		return
	}
	j.history = append(j.history, AttemptRec{Attempt: j.Attempts, StartedAt: startedAt, FailedAt: now,
		Reason: reason, Error: err, HasErr: hasErr})
}

func (s *Shard) toDLQ(q *Queue, j *Job, reason, err string, hasErr bool, now int64) {
	j.state = StateFailed
	j.failErr, j.hasFail = err, hasErr
	j.notifyDone(waitOutcome{err: err})
	e := j.dlq
	if e == nil || !e.kept {
		e = &DLQEntry{EnteredAt: now}
		if q.dlqCfg.MaxAge != none {
			e.ExpiresAt = now + q.dlqCfg.MaxAge
		}
		if q.dlqCfg.AutoRetry {
			e.NextRetryAt = now + q.dlqCfg.AutoRetryInterval
		}
	}
	e.kept = false
	e.Reason, e.Error, e.HasErr = reason, err, hasErr
	s.childFailed(j, err)
	j.dlq = e
	q.dlq = append(q.dlq, j)
	s.trimDLQ(q)
	s.watchDLQ(q, j, now)
	s.b.persist(j)
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
	e := j.dlq
	d := int64(math.MaxInt64)
	if e.ExpiresAt > 0 {
		d = e.ExpiresAt
	}
	if q.dlqCfg.AutoRetry && e.NextRetryAt > 0 && e.RetryCount < q.dlqCfg.MaxAutoRetries && e.NextRetryAt < d {
		d = e.NextRetryAt
	}
	if d == math.MaxInt64 {
		s.leases.Remove(j)
		return
	}
	s.leases.Push(j, 0, d, 0)
	s.armFor(d, now)
}

// dlqDue runs when a dead-lettered job's time came: it expires, or is
// retried automatically with backoff doubling per retry.
func (s *Shard) dlqDue(q *Queue, j *Job, now int64) {
	e := j.dlq
	if e == nil {
		return
	}
	if e.ExpiresAt > 0 && now >= e.ExpiresAt {
		q.removeDLQ(j)
		s.b.dropLogs(j.ID)
		s.forget(j)
		return
	}
	c := &q.dlqCfg
	if c.AutoRetry && e.NextRetryAt > 0 && now >= e.NextRetryAt && e.RetryCount < c.MaxAutoRetries {
		e.RetryCount++
		e.LastRetryAt = now
		e.NextRetryAt = 0
		if e.RetryCount < c.MaxAutoRetries {
			e.NextRetryAt = now + c.AutoRetryInterval*(int64(1)<<min(e.RetryCount-1, 40))
		}
		if s.retryDLQ(q, j, now, true) {
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

func readDlqFilter(m Map) (*dlqFilter, error) {
	fm, ok, err := m.Map("filter")
	if err != nil || !ok {
		return nil, err
	}
	f := &dlqFilter{retriable: -1, expired: -1}
	if f.reason, _, err = fm.Str("reason"); err != nil {
		return nil, &FieldError{Field: "filter.reason", Msg: "must be a string"}
	}
	if f.olderThan, _, err = fm.Int("olderThan"); err != nil {
		return nil, err
	}
	if f.newerThan, _, err = fm.Int("newerThan"); err != nil {
		return nil, err
	}
	if v, ok, _ := fm.Bool("retriable"); ok {
		f.retriable = b2i(v)
	}
	if v, ok, _ := fm.Bool("expired"); ok {
		f.expired = b2i(v)
	}
	f.offset, f.hasOffset, _ = fm.Int("offset")
	f.limit, f.hasLimit, _ = fm.Int("limit")
	return f, nil
}

func b2i(v bool) int8 {
	if v {
		return 1
	}
	return 0
}

func (f *dlqFilter) apply(q *Queue, now int64) []*Job {
	return f.applyList(q.dlq, q.dlqCfg, now)
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
	lo, hi := 0, len(out)
	if f.hasOffset {
		lo = int(min(max(f.offset, 0), int64(len(out))))
	}
	if f.hasLimit {
		hi = int(min(int64(lo)+max(f.limit, 0), int64(len(out))))
	}
	return out[lo:hi]
}

// dlqSelect is which DLQ entries a Dlq or RetryDlq request names, read
// once for both engines.
type dlqSelect struct {
	queue    string
	filter   *dlqFilter
	jobID    string // RetryDlq only
	count    int64
	hasCount bool
}

func readDlqSelect(r *Req, withJobID bool) (dlqSelect, error) {
	var d dlqSelect
	var err error
	if d.queue, err = queueArg(r.m); err != nil {
		return d, err
	}
	if d.filter, err = readDlqFilter(r.m); err != nil {
		return d, err
	}
	if withJobID {
		if d.jobID, _, err = r.m.Str("jobId"); err != nil {
			return d, err
		}
	}
	d.count, d.hasCount, err = r.m.Int("count")
	return d, err
}

// limit applies count to entries in DLQ order.
func (d dlqSelect) limit(sel []*Job) []*Job {
	if d.hasCount {
		return sel[:min(max(d.count, 0), int64(len(sel)))]
	}
	return sel
}

// writeDlq answers Dlq.
func writeDlq(r *Req, sel []*Job) {
	e := r.field("jobs")
	e.ArrayHead(len(sel))
	for _, j := range sel {
		encodeJob(e, j, jobPlain, "", nil)
	}
	e = r.field("entries")
	e.ArrayHead(len(sel))
	for _, j := range sel {
		encodeDLQEntry(e, j)
	}
}

func cmdDlq(r *Req) error {
	d, err := readDlqSelect(r, false)
	if err != nil {
		return err
	}
	r.b.withQueue(d.queue, false, func(s *Shard, q *Queue, now int64) {
		var sel []*Job
		if q != nil {
			sel = q.dlq
			if d.filter != nil {
				sel = d.filter.apply(q, now)
			}
		}
		writeDlq(r, d.limit(sel))
	})
	return nil
}

func encodeDLQEntry(e *Enc, j *Job) {
	d := j.dlq
	e.MapHead(9)
	e.Str("job")
	encodeJob(e, j, jobPlain, "", nil)
	e.Str("enteredAt")
	e.Int(d.EnteredAt)
	e.Str("reason")
	e.Str(d.Reason)
	e.Str("error")
	optStr(e, d.Error, d.HasErr)
	e.Str("attempts")
	e.ArrayHead(len(j.history))
	for _, a := range j.history {
		e.MapHead(6)
		e.Str("attempt")
		e.Int(int64(a.Attempt))
		e.Str("startedAt")
		optTime(e, a.StartedAt)
		e.Str("failedAt")
		e.Int(a.FailedAt)
		e.Str("reason")
		e.Str(a.Reason)
		e.Str("error")
		optStr(e, a.Error, a.HasErr)
		e.Str("duration")
		if a.StartedAt > 0 {
			e.Int(a.FailedAt - a.StartedAt)
		} else {
			e.Int(0)
		}
	}
	e.Str("retryCount")
	e.Int(int64(d.RetryCount))
	e.Str("lastRetryAt")
	optTime(e, d.LastRetryAt)
	e.Str("nextRetryAt")
	optTime(e, d.NextRetryAt)
	e.Str("expiresAt")
	e.Int(d.ExpiresAt)
}

// retryDLQ puts a dead-lettered job back to waiting with fresh attempts;
// s.mu is held. An auto-retry keeps the DLQ entry's history for when the
// job comes back; a retry by hand starts over.
func (s *Shard) retryDLQ(q *Queue, j *Job, now int64, auto bool) bool {
	if j.UniqueKey != "" {
		if e := q.holder(j.UniqueKey, now); e != nil && e.job != j {
			return false
		}
	}
	if !q.removeDLQ(j) {
		return false
	}
	s.leases.Remove(j)
	if auto {
		j.dlq.kept = true
	} else {
		j.dlq = nil
	}
	j.resetForRetry(now)
	s.holdUnique(q, j)
	s.enqueue(q, j, now)
	s.b.persist(j)
	return true
}

// resetForRetry starts a job from the DLQ (or a retry of a finished job)
// afresh: attempts and stalls count again from zero, and it runs now.
func (j *Job) resetForRetry(now int64) {
	j.Attempts, j.Stalls, j.StartedAt, j.DoneAt = 0, 0, 0, 0
	j.Heartbeat, j.RunAt = now, now
	j.addTimeline(TimelineEntry{State: "waiting", At: now})
}

func cmdRetryDlq(r *Req) error {
	d, err := readDlqSelect(r, true)
	if err != nil {
		return err
	}
	n := 0
	r.b.withQueue(d.queue, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		var sel []*Job
		switch {
		case d.filter != nil:
			sel = d.filter.apply(q, now)
		case d.jobID != "":
			for _, j := range q.dlq {
				if j.ID == d.jobID {
					sel = []*Job{j}
				}
			}
		default:
			sel = slices.Clone(d.limit(q.dlq))
		}
		for _, j := range sel {
			if s.retryDLQ(q, j, now, false) {
				n++
			}
		}
	})
	r.field("count").Int(int64(n))
	return nil
}

func cmdPurgeDlq(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	n := 0
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		gone := q.dlq
		q.dlq = nil
		for _, j := range gone {
			s.b.dropLogs(j.ID)
			s.forget(j)
		}
		n = len(gone)
	})
	r.field("count").Int(int64(n))
	return nil
}

// ---------------------------------------------------------------------------
// DLQ policy and figures

func encodeDLQConfig(e *Enc, c DLQConfig) {
	e.MapHead(5)
	e.Str("autoRetry")
	e.Bool(c.AutoRetry)
	e.Str("autoRetryInterval")
	e.Int(c.AutoRetryInterval)
	e.Str("maxAutoRetries")
	e.Int(int64(c.MaxAutoRetries))
	e.Str("maxAge")
	optInt(e, c.MaxAge)
	e.Str("maxEntries")
	e.Int(int64(c.MaxEntries))
}

// cmdSetDlqConfig merges the given settings over the queue's, clamped as
// the reference clamps them; unknown keys are ignored.
func cmdSetDlqConfig(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	cfg, ok, err := r.m.Map("config")
	if err != nil {
		return err
	}
	if !ok {
		return r.okID()
	}
	floorArg := func(key string) (int64, bool) {
		f, ok, err := finiteArg(cfg, key)
		if err != nil || !ok {
			return 0, false
		}
		return int64(math.Floor(f)), true
	}
	r.b.withQueue(name, true, func(s *Shard, q *Queue, now int64) {
		c := q.dlqCfg
		if v, ok, err := cfg.Bool("autoRetry"); err == nil && ok {
			c.AutoRetry = v
		}
		if v, ok := floorArg("autoRetryInterval"); ok {
			c.AutoRetryInterval = max(v, 0)
		}
		if v, ok := floorArg("maxAutoRetries"); ok {
			c.MaxAutoRetries = int32(min(max(v, 0), math.MaxInt32))
		}
		if raw := cfg.Get("maxAge"); raw != nil && raw[0] == 0xc0 {
			c.MaxAge = none
		} else if v, ok := floorArg("maxAge"); ok {
			c.MaxAge = max(v, 0)
		}
		if v, ok := floorArg("maxEntries"); ok {
			c.MaxEntries = int(max(v, 1))
		}
		q.dlqCfg = c
		q.listed = true
		s.trimDLQ(q)
		r.b.queueChanged(q)
	})
	return r.okID()
}

func cmdGetDlqConfig(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	c := defaultDLQ
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			c = q.dlqCfg
		}
	})
	encodeDLQConfig(r.field("config"), c)
	return nil
}

var dlqReasons = []string{"explicit_fail", "max_attempts_exceeded", "timeout", "stalled", "ttl_expired", "worker_lost", "unknown"}

func cmdGetDlqStats(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	byReason := map[string]int{}
	var total, pending, expired int
	var oldest, newest int64
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		for _, j := range q.dlq {
			e := j.dlq
			total++
			if slices.Contains(dlqReasons, e.Reason) {
				byReason[e.Reason]++
			} else {
				byReason["unknown"]++
			}
			if e.NextRetryAt > 0 && e.NextRetryAt <= now && e.RetryCount < q.dlqCfg.MaxAutoRetries {
				pending++
			}
			if e.ExpiresAt > 0 && e.ExpiresAt <= now {
				expired++
			}
			if oldest == 0 || e.EnteredAt < oldest {
				oldest = e.EnteredAt
			}
			newest = max(newest, e.EnteredAt)
		}
	})
	e := r.field("data")
	e.MapHead(1)
	e.Str("stats")
	e.MapHead(7)
	e.Str("total")
	e.Int(int64(total))
	e.Str("byReason")
	e.MapHead(len(dlqReasons))
	for _, k := range dlqReasons {
		e.Str(k)
		e.Int(int64(byReason[k]))
	}
	e.Str("byQueue")
	if total > 0 {
		e.MapHead(1)
		e.Str(name)
		e.Int(int64(total))
	} else {
		e.MapHead(0)
	}
	e.Str("pendingRetry")
	e.Int(int64(pending))
	e.Str("expired")
	e.Int(int64(expired))
	e.Str("oldestEntry")
	optTime(e, oldest)
	e.Str("newestEntry")
	optTime(e, newest)
	return nil
}

func cmdRemoveDlqJob(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	id, _, err := r.m.Str("jobId")
	if err != nil {
		return err
	}
	removed := false
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		for _, j := range slices.Clone(q.dlq) {
			if j.ID == id && q.removeDLQ(j) {
				s.b.dropLogs(j.ID)
				s.forget(j)
				removed = true
			}
		}
	})
	e := r.field("data")
	e.MapHead(1)
	e.Str("removed")
	e.Bool(removed)
	return nil
}

var errNoDLQ = errors.New("Failed job not in DLQ")
