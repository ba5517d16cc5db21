package main

// Handlers of queue control and the dead-letter queue.

import (
	"slices"
)

// withQueue runs fn on a queue under its shard lock; create makes the queue
// when it does not exist yet.
func (b *Broker) withQueue(name string, create bool, fn func(s *Shard, q *Queue, now int64)) {
	s := b.shardOf(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[name]
	if q == nil {
		if !create {
			fn(s, nil, b.now())
			return
		}
		q = s.queue(name)
	}
	now := b.now()
	s.promote(now)
	fn(s, q, now)
}

func cmdPause(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	r.b.withQueue(name, true, func(s *Shard, q *Queue, now int64) {
		q.paused, q.listed = true, true
		s.emit(q, evPaused, nil, now, evArgs{})
		r.b.queueChanged(q)
	})
	return r.okID()
}

func cmdResume(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	r.b.withQueue(name, true, func(s *Shard, q *Queue, now int64) {
		q.paused = false
		q.wakeAll()
		s.emit(q, evResumed, nil, now, evArgs{})
		r.b.queueChanged(q)
	})
	return r.okID()
}

func cmdIsPaused(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	paused := false
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) { paused = q != nil && q.paused })
	r.field("paused").Bool(paused)
	return nil
}

// drain removes a queue's waiting and delayed jobs; s.mu is held.
func (s *Shard) drain(q *Queue) int {
	var gone []*Job
	q.ready.Each(func(e *hent) bool { gone = append(gone, e.job); return true })
	s.delayed.Each(func(e *hent) bool {
		if e.job.Queue == q.name {
			gone = append(gone, e.job)
		}
		return true
	})
	for _, j := range gone {
		s.unqueue(q, j)
		s.releaseUnique(q, j)
		s.b.dropLogs(j.ID)
		s.forget(j)
	}
	return len(gone)
}

func cmdDrain(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	n := 0
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			n = s.drain(q)
		}
	})
	r.field("count").Int(int64(n))
	return nil
}

func cmdObliterate(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		s.drain(q)
		var gone []*Job
		s.leases.Each(func(e *hent) bool {
			if e.job.Queue == name && e.job.state == StateActive {
				gone = append(gone, e.job)
			}
			return true
		})
		for _, j := range gone {
			s.deactivate(q, j)
		}
		for i := s.doneHead; i < len(s.done); i++ {
			if d := &s.done[i]; s.doneLiveEnt(d) && d.j.Queue == name {
				gone = append(gone, d.j)
				s.undone(q, d.j)
			}
		}
		gone = append(gone, q.dlq...)
		q.dlq = nil
		for _, j := range gone {
			s.b.dropLogs(j.ID)
			s.forget(j)
		}
		q.wakeAll()
		delete(s.queues, name)
		r.b.queueRemoved(name)
	})
	r.c.srv.mx.dropQueue(name)
	return r.okID()
}

func cmdListQueues(r *Req) error {
	type named struct {
		name string
		seq  int64
	}
	var all []named
	for _, s := range r.b.shards {
		s.mu.Lock()
		for _, q := range s.queues {
			if q.listed {
				all = append(all, named{q.name, q.created})
			}
		}
		s.mu.Unlock()
	}
	slices.SortFunc(all, func(a, b named) int { return cmpInt(a.seq, b.seq) })
	e := r.field("queues")
	e.ArrayHead(len(all))
	for _, n := range all {
		e.Str(n.name)
	}
	return nil
}

// ---------------------------------------------------------------------------
// DLQ

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
	var out []*Job
	for _, j := range q.dlq {
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
		if f.retriable >= 0 && (d.RetryCount < q.dlqCfg.MaxAutoRetries) != (f.retriable == 1) {
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

func cmdDlq(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	filter, err := readDlqFilter(r.m)
	if err != nil {
		return err
	}
	count, hasCount, err := r.m.Int("count")
	if err != nil {
		return err
	}
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		var sel []*Job
		if q != nil {
			sel = q.dlq
			if filter != nil {
				sel = filter.apply(q, now)
			}
		}
		if hasCount {
			sel = sel[:min(max(count, 0), int64(len(sel)))]
		}
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
// s.mu is held.
func (s *Shard) retryDLQ(q *Queue, j *Job, now int64) bool {
	if j.UniqueKey != "" {
		if h := q.unique[j.UniqueKey]; h != nil && h != j && h.state != StateNone {
			return false
		}
	}
	if !q.removeDLQ(j) {
		return false
	}
	j.Attempts, j.Stalls, j.StartedAt = 0, 0, 0
	j.Heartbeat, j.RunAt = now, now
	j.history = nil
	j.addTimeline(TimelineEntry{State: "waiting", At: now})
	if j.UniqueKey != "" {
		if q.unique == nil {
			q.unique = make(map[string]*Job)
		}
		q.unique[j.UniqueKey] = j
	}
	s.enqueue(q, j, now)
	s.b.persist(j)
	return true
}

func cmdRetryDlq(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	filter, err := readDlqFilter(r.m)
	if err != nil {
		return err
	}
	jobID, _, err := r.m.Str("jobId")
	if err != nil {
		return err
	}
	count, hasCount, err := r.m.Int("count")
	if err != nil {
		return err
	}
	n := 0
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		var sel []*Job
		switch {
		case filter != nil:
			sel = filter.apply(q, now)
		case jobID != "":
			for _, j := range q.dlq {
				if j.ID == jobID {
					sel = []*Job{j}
				}
			}
		case hasCount:
			sel = slices.Clone(q.dlq[:min(max(count, 0), int64(len(q.dlq)))])
		default:
			sel = slices.Clone(q.dlq)
		}
		for _, j := range sel {
			if s.retryDLQ(q, j, now) {
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
			j.dlq = nil
			s.b.dropLogs(j.ID)
			s.forget(j)
		}
		n = len(gone)
	})
	r.field("count").Int(int64(n))
	return nil
}
