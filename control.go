package main

// Moves by hand (ControlEngine): one job at a time (MoveJob), and a
// queue's jobs in bulk (PromoteJobs, Clean, RetryCompleted).
//
// What a move does to a job in each state is decided once, for both
// engines (JobMove.plan, rule_move.go); the memory engine here and the
// PostgreSQL engine (pg_control.go) each carry the plan out on their own
// storage.

import (
	"context"
	"errors"
	"slices"
)

func isQueued(st State) bool {
	return st == StateWaiting || st == StatePrioritized || st == StateDelayed || st == StateWaitingChildren
}

// ---------------------------------------------------------------------------
// The memory engine: one job

// onJob locks job id's shard, brings its delayed jobs due, and runs fn on
// the job; notFound is the answer when there is no such job.
func (b *MemEngine) onJob(id string, notFound error, fn func(s *Shard, q *Queue, j *Job, now int64) error) error {
	j, s := b.lockJob(id)
	if j == nil {
		return notFound
	}
	defer s.mu.Unlock()
	now := b.now()
	s.promote(now)
	return fn(s, s.queues[j.Queue], j, now)
}

func (b *MemEngine) MoveJob(_ context.Context, id string, m JobMove) error {
	return b.onJob(id, m.notFound(), func(s *Shard, q *Queue, j *Job, now int64) error {
		step, err := m.plan(j, now)
		if err != nil {
			return err
		}
		if step == stepRetry && b.mem.spent() {
			// MoveToWait of a failed job is RetryDlq's retry: the job
			// leaves the dead-letter queue, whose bounds can let it go,
			// for waiting, where nothing does. Refused while the budget
			// is spent, as RetryDlq is (commands.go); a move of a job
			// already live (MoveToWait's other uses) never is.
			return b.mem.refuse()
		}
		return s.moveJob(q, j, m, step, now)
	})
}

// moveJob carries out a planned move; s.mu is held.
func (s *Shard) moveJob(q *Queue, j *Job, m JobMove, step moveStep, now int64) error {
	active := j.state == StateActive
	switch step {
	case stepRemove:
		s.unqueue(q, j)
		s.releaseUnique(q, j)
		s.forget(j)
		s.emit(q, evRemoved, j, now, evArgs{prev: "waiting"})
	case stepDLQ:
		if active {
			// The attempt the DLQ records is the one the move ended.
			startedAt := j.StartedAt()
			if err := s.takeActive(q, j, m.Token); err != nil {
				return err
			}
			j.setStartedAt(startedAt)
		} else {
			s.unqueue(q, j)
			s.releaseUnique(q, j)
		}
		j.recordAttempt(j.StartedAt(), now, "unknown", "", false)
		s.toDLQ(q, j, "unknown", "", false, now)
	case stepQueue:
		if active {
			if err := s.takeActive(q, j, m.Token); err != nil {
				return err
			}
		} else {
			s.unqueue(q, j)
		}
		m.place(j, now)
		s.enqueue(q, j, now)
		if active {
			ev, a := m.activeEvent()
			s.emit(q, ev, j, now, a)
		}
		s.b.persist(j)
	case stepRetry:
		if !s.retryDLQ(q, j, now, false) {
			return errNoDLQ
		}
	case stepData:
		return s.setData(j, m.Data)
	}
	return nil
}

// takeActive ends an active job's lease for a move by hand, after the same
// token check as ACK.
func (s *Shard) takeActive(q *Queue, j *Job, token string) error {
	if err := checkLease(j, token); err != nil {
		return err
	}
	s.deactivate(q, j)
	s.releaseUnique(q, j)
	j.setStartedAt(0)
	return nil
}

// setData replaces a job's data (Update); s.mu is held.
func (s *Shard) setData(j *Job, data Raw) error {
	nd, err := mergeFlowMeta(j.Data, data)
	if err != nil {
		return err
	}
	if err := setJobData(j, nd); err != nil {
		return err
	}
	s.b.persist(j)
	return nil
}

// mergeFlowMeta keeps a flow job's link keys (__parentId, ...) when its data
// is replaced, and refuses new data that would set them itself.
func mergeFlowMeta(old, nw Raw) (Raw, error) {
	om, err := ParseMap(old, nil)
	if err != nil {
		return clone(nw), nil
	}
	var meta []Field
	for _, f := range om.Fields {
		switch string(f.Key) {
		case "__parentId", "__parentQueue", "__childrenIds", "__flowParentId", "__flowParentIds":
			meta = append(meta, f)
		}
	}
	if len(meta) == 0 {
		return clone(nw), nil
	}
	nm, err := ParseMap(nw, nil)
	if err != nil {
		return nil, errors.New("flow job data must be an object")
	}
	var e Enc
	e.MapHead(len(nm.Fields) + len(meta))
	for _, f := range nm.Fields {
		if len(f.Key) >= 2 && f.Key[0] == '_' && f.Key[1] == '_' {
			return nil, errors.New("flow job data key is reserved: " + string(f.Key))
		}
		e.Str(string(f.Key))
		e.Raw(f.Val)
	}
	for _, f := range meta {
		e.Str(string(f.Key))
		e.Raw(f.Val)
	}
	return e.B, nil
}

// ---------------------------------------------------------------------------
// The memory engine: a queue's jobs

func (b *MemEngine) PromoteJobs(_ context.Context, queue string, limit int) (int64, error) {
	n := 0
	b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		list := s.delayedOf(queue)
		slices.SortFunc(list, byCreated)
		n = min(limit, len(list))
		for _, j := range list[:n] {
			s.promoteJob(q, j, now)
		}
	})
	return int64(n), nil
}

// delayedOf lists a queue's delayed jobs; s.mu is held.
func (s *Shard) delayedOf(queue string) []*Job {
	var list []*Job
	s.delayed.Each(func(e *hent) bool {
		if e.job.Queue == queue {
			list = append(list, e.job)
		}
		return true
	})
	return list
}

// promoteJob makes a delayed job ready now.
func (s *Shard) promoteJob(q *Queue, j *Job, now int64) {
	s.unqueue(q, j)
	j.RunAt = now
	s.enqueue(q, j, now)
	s.b.persist(j)
}

func byCreated(a, b *Job) int {
	if c := cmpInt(a.CreatedAt, b.CreatedAt); c != 0 {
		return c
	}
	return cmpStr(a.ID(), b.ID())
}

func (b *MemEngine) Clean(ctx context.Context, a cleanArgs) ([]string, error) {
	var ids []string
	if a.state == "completed" && !a.none() {
		// The oldest first: those on disk (history.go), then memory's.
		var err error
		if ids, err = b.cleanHistory(ctx, a.queue, a.cutoff(b.now()), a.limit); err != nil {
			return ids, err
		}
		a.limit -= int64(len(ids))
	}
	fromHistory := len(ids) // written already: cleanHistory syncs
	b.withQueue(a.queue, false, func(s *Shard, q *Queue, now int64) {
		if q == nil || a.none() {
			return
		}
		cutoff := a.cutoff(now)
		switch a.state {
		case "", "waiting", "delayed", "prioritized", "paused":
			// As the reference does, every queued job is a candidate
			// whatever the state asked for.
			ids = s.cleanQueued(q, cutoff, a.limit)
		case "completed":
			ids = append(ids, s.cleanCompleted(q, cutoff, a.limit)...)
		case "failed":
			ids = s.cleanFailed(q, cutoff, a.limit)
		}
	})
	if len(ids) > fromHistory {
		return ids, b.syncRemoval()
	}
	return ids, nil
}

// cleanQueued removes up to limit of a queue's waiting and delayed jobs
// made at cutoff or before, oldest first; s.mu is held.
func (s *Shard) cleanQueued(q *Queue, cutoff, limit int64) []string {
	var list []*Job
	q.eachReady(func(j *Job) { list = append(list, j) })
	list = append(list, s.delayedOf(q.name)...)
	list = slices.DeleteFunc(list, func(j *Job) bool { return j.CreatedAt > cutoff })
	slices.SortFunc(list, byCreated)
	var ids []string
	for _, j := range list[:min(int64(len(list)), limit)] {
		s.unqueue(q, j)
		s.forget(j)
		ids = append(ids, j.ID())
	}
	return ids
}

// cleanCompleted removes up to limit of a queue's jobs completed at cutoff
// or before, oldest first; s.mu is held.
func (s *Shard) cleanCompleted(q *Queue, cutoff, limit int64) []string {
	var list []*Job
	for i := s.doneHead; i < len(s.done); i++ {
		if d := &s.done[i]; s.doneLiveEnt(d) && d.j.Queue == q.name && d.j.DoneAt() <= cutoff {
			list = append(list, d.j)
		}
	}
	slices.SortFunc(list, func(a, b *Job) int {
		if c := cmpInt(a.DoneAt(), b.DoneAt()); c != 0 {
			return c
		}
		return cmpStr(a.ID(), b.ID())
	})
	var ids []string
	for _, j := range list[:min(int64(len(list)), limit)] {
		s.undone(q, j)
		s.b.dropLogs(j.ID())
		s.forget(j)
		ids = append(ids, j.ID())
	}
	return ids
}

// cleanFailed removes up to limit of a queue's DLQ entries made at cutoff
// or before, oldest first; s.mu is held.
func (s *Shard) cleanFailed(q *Queue, cutoff, limit int64) []string {
	var list []*Job
	for _, j := range q.dlq {
		if int64(len(list)) >= limit {
			break
		}
		if j.dlq.EnteredAt <= cutoff {
			list = append(list, j)
		}
	}
	var ids []string
	for _, j := range list {
		q.removeDLQ(j)
		s.b.dropLogs(j.ID())
		s.forget(j)
		ids = append(ids, j.ID())
	}
	return ids
}

// RetryCompleted is admitted by the memory budget as a command that grows
// what jobs hold (commands.go): the jobs it puts back from memory are
// there already, but once waiting they no longer go when
// --max-completed-jobs trims the history; those it reads back from the
// history on disk (SQLite mode) are new in memory, and it stops reading
// them when the budget is spent (retryHistory). Its weight is its
// request's.
func (b *MemEngine) RetryCompleted(ctx context.Context, a retryCompletedArgs) (int64, error) {
	n := 0
	b.withQueue(a.queue, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		if a.id != "" {
			if j := s.b.idxGet(a.id); j != nil && j.Queue == a.queue && j.state == StateCompleted && s.requeueCompleted(q, j, now) {
				n = 1
			}
			return
		}
		limit := a.limit()
		var list []*Job
		for i := s.doneHead; i < len(s.done); i++ {
			if d := &s.done[i]; s.doneLiveEnt(d) && d.j.Queue == a.queue && a.takes(d.j.DoneAt()) {
				list = append(list, d.j)
			}
		}
		for _, j := range list {
			if float64(n) >= limit {
				break
			}
			if s.requeueCompleted(q, j, now) {
				n++
			}
		}
	})
	if a.id == "" || n == 0 {
		// Then what the history on disk holds (SQLite mode, history.go).
		var err error
		n, err = b.retryHistory(ctx, a, n)
		return int64(n), err
	}
	return int64(n), nil
}

// requeueCompleted puts a completed job back to waiting; s.mu is held.
func (s *Shard) requeueCompleted(q *Queue, j *Job, now int64) bool {
	if j.cold().UniqueKey != "" {
		if e := q.holder(j.cold().UniqueKey, now); e != nil && e.job != j {
			return false
		}
	}
	s.undone(q, j)
	s.b.dropResult(j.key())
	resetCompleted(j, now)
	s.holdUnique(q, j)
	s.enqueue(q, j, now)
	s.b.persist(j)
	return true
}

// resetCompleted clears a completed job's run for another one.
func resetCompleted(j *Job, now int64) {
	j.Attempts = 0
	j.setStartedAt(0)
	j.setDoneAt(0)
	j.RunAt = now
	j.setHeartbeat(now)
	if j.c != nil { // through warm(), a plain job would get a cold part of defaults
		j.c.Progress, j.c.ProgressMsg, j.c.HasProgressMsg = nil, "", false
	}
	j.addTimeline(TimelineEntry{State: StateWaiting, At: now})
}
