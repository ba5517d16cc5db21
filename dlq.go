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
	j.dlq = dlqEntry(j.dlq, j.dlq != nil && j.dlq.kept, q.dlqCfg, reason, err, hasErr, now)
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
			e.ExpiresAt = now + cfg.MaxAge
		}
		if cfg.AutoRetry {
			e.NextRetryAt = now + cfg.AutoRetryInterval
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
		s.b.dropLogs(j.ID)
		s.forget(j)
		return
	case dlqRetry:
		if s.retryDLQ(q, j, now, true) {
			return
		}
	}
	s.watchDLQ(q, j, now)
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
			e.NextRetryAt = now + c.AutoRetryInterval*(int64(1)<<min(e.RetryCount-1, 40))
		}
		return dlqRetry
	}
	return dlqWait
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
	lo, hi := pageBounds(len(out), f.offset, f.limit, f.hasLimit) // an absent offset is 0
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
	j.Attempts, j.Stalls, j.StartedAt = 0, 0, 0
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

// dlqPatch is a SetDlqConfig's settings: those given replace the queue's,
// clamped as the reference clamps them; unknown keys are ignored.
type dlqPatch struct {
	cfg Map
	ok  bool
}

func readDlqPatch(r *Req) (string, dlqPatch, error) {
	name, err := queueArg(r.m)
	if err != nil {
		return "", dlqPatch{}, err
	}
	cfg, ok, err := r.m.Map("config")
	return name, dlqPatch{cfg, ok}, err
}

func (p dlqPatch) apply(c DLQConfig) DLQConfig {
	cfg := p.cfg
	floorArg := func(key string) (int64, bool) {
		f, ok, err := finiteArg(cfg, key)
		if err != nil || !ok {
			return 0, false
		}
		return int64(math.Floor(f)), true
	}
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
	return c
}

func cmdSetDlqConfig(r *Req) error {
	name, patch, err := readDlqPatch(r)
	if err != nil {
		return err
	}
	if !patch.ok {
		return r.okID()
	}
	if err := r.b.withQueue(name, true, func(s *Shard, q *Queue, now int64) {
		q.dlqCfg = patch.apply(q.dlqCfg)
		q.listed = true
		s.trimDLQ(q)
		r.b.queueChanged(q)
	}); err != nil {
		return err
	}
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

func cmdGetDlqStats(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	var st dlqStats
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		for _, j := range q.dlq {
			st.add(j.dlq, q.dlqCfg, now)
		}
	})
	writeDlqStats(r, name, st)
	return nil
}

func writeDlqStats(r *Req, name string, st dlqStats) {
	e := r.field("data")
	e.MapHead(1)
	e.Str("stats")
	e.MapHead(7)
	e.Str("total")
	e.Int(int64(st.total))
	e.Str("byReason")
	e.MapHead(len(dlqReasons))
	for _, k := range dlqReasons {
		e.Str(k)
		e.Int(int64(st.byReason[k]))
	}
	e.Str("byQueue")
	if st.total > 0 {
		e.MapHead(1)
		e.Str(name)
		e.Int(int64(st.total))
	} else {
		e.MapHead(0)
	}
	e.Str("pendingRetry")
	e.Int(int64(st.pending))
	e.Str("expired")
	e.Int(int64(st.expired))
	e.Str("oldestEntry")
	optTime(e, st.oldest)
	e.Str("newestEntry")
	optTime(e, st.newest)
}

func readRemoveDlqJob(r *Req) (string, string, error) {
	name, err := queueArg(r.m)
	if err != nil {
		return "", "", err
	}
	id, _, err := r.m.Str("jobId")
	return name, id, err
}

func writeRemoved(r *Req, removed bool) {
	e := r.field("data")
	e.MapHead(1)
	e.Str("removed")
	e.Bool(removed)
}

func cmdRemoveDlqJob(r *Req) error {
	name, id, err := readRemoveDlqJob(r)
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
	writeRemoved(r, removed)
	return nil
}

var errNoDLQ = errors.New("Failed job not in DLQ")
