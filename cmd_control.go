package main

// Job control: moving single jobs between states by hand, and cleaning.

import (
	"errors"
	"math"
	"slices"
)

// jobCmd locks the job named by the request's id and runs fn on it.
func (r *Req) jobCmd(notFound error, fn func(s *Shard, q *Queue, j *Job, now int64) error) error {
	id, err := jobIDArg(r)
	if err != nil {
		return err
	}
	j, s := r.b.lockJob(id)
	if j == nil {
		return notFound
	}
	defer s.mu.Unlock()
	now := r.b.now()
	s.promote(now)
	return fn(s, s.queues[j.Queue], j, now)
}

func isQueued(st State) bool {
	return st == StateWaiting || st == StatePrioritized || st == StateDelayed || st == StateWaitingChildren
}

func tokenArg(m Map) (string, error) {
	tok, _, err := m.Str("token")
	return tok, err
}

// takeActive ends an active job's lease for a move by hand, after the same
// token check as ACK.
func (s *Shard) takeActive(q *Queue, j *Job, token string) error {
	if err := checkLease(j, token); err != nil {
		return err
	}
	s.deactivate(q, j)
	s.releaseUnique(q, j)
	j.StartedAt = 0
	return nil
}

var errCannotCancel = errors.New("Job not found or cannot be cancelled")

func cmdCancel(r *Req) error {
	if err := r.jobCmd(errCannotCancel, func(s *Shard, q *Queue, j *Job, now int64) error {
		if !isQueued(j.state) {
			return errCannotCancel
		}
		s.unqueue(q, j)
		s.releaseUnique(q, j)
		s.forget(j)
		s.emit(q, evRemoved, j, now, evArgs{prev: "waiting"})
		return nil
	}); err != nil {
		return err
	}
	return r.okID()
}

func cmdDiscard(r *Req) error {
	tok, err := tokenArg(r.m)
	if err != nil {
		return err
	}
	if err := r.jobCmd(errJobNotFound, func(s *Shard, q *Queue, j *Job, now int64) error {
		switch {
		case j.state == StateActive:
			startedAt := j.StartedAt
			if err := s.takeActive(q, j, tok); err != nil {
				return err
			}
			j.StartedAt = startedAt
		case j.state == StateWaiting || j.state == StatePrioritized || j.state == StateDelayed:
			s.unqueue(q, j)
			s.releaseUnique(q, j)
		default:
			return errJobNotFound
		}
		j.recordAttempt(j.StartedAt, now, "unknown", "", false)
		s.toDLQ(q, j, "unknown", "", false, now)
		return nil
	}); err != nil {
		return err
	}
	return r.okID()
}

var errNotDelayed = errors.New("Job not found or not delayed")

// promoteJob makes a delayed job ready now.
func (s *Shard) promoteJob(q *Queue, j *Job, now int64) {
	s.unqueue(q, j)
	j.RunAt = now
	s.enqueue(q, j, now)
	s.b.persist(j)
}

func cmdPromote(r *Req) error {
	if err := r.jobCmd(errNotDelayed, func(s *Shard, q *Queue, j *Job, now int64) error {
		if j.state != StateDelayed {
			return errNotDelayed
		}
		s.promoteJob(q, j, now)
		return nil
	}); err != nil {
		return err
	}
	return r.okID()
}

// promoteArgs are PromoteJobs' fields.
type promoteArgs struct {
	queue    string
	count    float64
	hasCount bool
}

func readPromoteJobs(r *Req) (promoteArgs, error) {
	var a promoteArgs
	var err error
	if a.queue, err = queueArg(r.m); err != nil {
		return a, err
	}
	a.count, a.hasCount, err = r.m.Num("count")
	return a, err
}

// limit is how many of n delayed jobs to promote.
func (a promoteArgs) limit(n int) int {
	if a.hasCount {
		return int(min(max(math.Floor(a.count), 0), float64(n)))
	}
	return n
}

func cmdPromoteJobs(r *Req) error {
	a, err := readPromoteJobs(r)
	if err != nil {
		return err
	}
	name := a.queue
	n := 0
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		var list []*Job
		s.delayed.Each(func(e *hent) bool {
			if e.job.Queue == name {
				list = append(list, e.job)
			}
			return true
		})
		slices.SortFunc(list, byCreated)
		limit := a.limit(len(list))
		for _, j := range list[:limit] {
			s.promoteJob(q, j, now)
		}
		n = limit
	})
	r.field("count").Int(int64(n))
	return nil
}

func byCreated(a, b *Job) int {
	if c := cmpInt(a.CreatedAt, b.CreatedAt); c != 0 {
		return c
	}
	return cmpStr(a.ID, b.ID)
}

// delayJob moves a waiting or active job to run delay ms from now.
func (s *Shard) delayJob(q *Queue, j *Job, delay, now int64, token string) (bool, error) {
	switch j.state {
	case StateWaiting, StatePrioritized, StateDelayed:
		s.unqueue(q, j)
		j.RunAt = now + delay
		s.enqueue(q, j, now)
		s.b.persist(j)
		return true, nil
	case StateActive:
		if err := s.takeActive(q, j, token); err != nil {
			return false, err
		}
		j.RunAt = now + delay
		s.enqueue(q, j, now)
		s.emit(q, evDelayed, j, now, evArgs{delay: delay, hasDelay: true})
		s.b.persist(j)
		return true, nil
	}
	return false, nil
}

func delayArgs(r *Req) (int64, string, error) {
	d, _, err := r.m.Num("delay")
	if err != nil {
		return 0, "", err
	}
	if math.IsNaN(d) || math.IsInf(d, 0) {
		return 0, "", errors.New("delay must be a finite number")
	}
	tok, err := tokenArg(r.m)
	return int64(max(d, 0)), tok, err
}

func cmdMoveToDelayed(r *Req) error {
	delay, tok, err := delayArgs(r)
	if err != nil {
		return err
	}
	if err := r.jobCmd(errJobNotFound, func(s *Shard, q *Queue, j *Job, now int64) error {
		ok, err := s.delayJob(q, j, delay, now, tok)
		if err != nil {
			return err
		}
		if !ok {
			return notActive(j, now)
		}
		return nil
	}); err != nil {
		return err
	}
	return r.okID()
}

var errChangeDelay = errors.New("Job not found or cannot change delay")

func cmdChangeDelay(r *Req) error {
	delay, tok, err := delayArgs(r)
	if err != nil {
		return err
	}
	if err := r.jobCmd(errChangeDelay, func(s *Shard, q *Queue, j *Job, now int64) error {
		ok, err := s.delayJob(q, j, delay, now, tok)
		if err != nil {
			return err
		}
		if !ok {
			return errChangeDelay
		}
		return nil
	}); err != nil {
		return err
	}
	return r.okID()
}

func cmdMoveToWait(r *Req) error {
	tok, err := tokenArg(r.m)
	if err != nil {
		return err
	}
	if err := r.jobCmd(errJobNotFound, func(s *Shard, q *Queue, j *Job, now int64) error {
		switch j.state {
		case StateActive:
			if err := s.takeActive(q, j, tok); err != nil {
				return err
			}
			j.RunAt = now
			s.enqueue(q, j, now)
			s.emit(q, evWaiting, j, now, evArgs{prev: "active"})
			s.b.persist(j)
		case StateDelayed:
			s.promoteJob(q, j, now)
		case StateFailed:
			if !s.retryDLQ(q, j, now, false) {
				return errNoDLQ
			}
		case StateWaiting, StatePrioritized:
		default:
			return errors.New("Cannot move job from state '" + j.stateAt(now).String() + "' to waiting")
		}
		return nil
	}); err != nil {
		return err
	}
	return r.okID()
}

var errNotInQueue = errors.New("Job not found or not in queue")

// priorityArgs are ChangePriority's fields.
type priorityArgs struct {
	prio          int64
	lifo, hasLifo bool
}

func readChangePriority(r *Req) (priorityArgs, error) {
	var a priorityArgs
	prio, hasPrio, err := r.m.Num("priority")
	if err != nil {
		return a, err
	}
	if hasPrio && (math.IsNaN(prio) || math.IsInf(prio, 0)) {
		return a, errors.New("priority must be a finite number")
	}
	a.prio = int64(prio)
	a.lifo, a.hasLifo, err = r.m.Bool("lifo")
	return a, err
}

// apply sets a queued job's priority (and LIFO flag when given).
func (a priorityArgs) apply(j *Job) {
	j.Priority = a.prio
	if a.hasLifo {
		j.Lifo = a.lifo
	}
}

func cmdChangePriority(r *Req) error {
	a, err := readChangePriority(r)
	if err != nil {
		return err
	}
	if err := r.jobCmd(errNotInQueue, func(s *Shard, q *Queue, j *Job, now int64) error {
		if j.state != StateWaiting && j.state != StatePrioritized && j.state != StateDelayed {
			return errNotInQueue
		}
		s.unqueue(q, j)
		a.apply(j)
		s.enqueue(q, j, now)
		s.b.persist(j)
		return nil
	}); err != nil {
		return err
	}
	return r.okID()
}

var errCannotUpdate = errors.New("Job not found or cannot be updated")

func readUpdate(r *Req) (Raw, error) {
	data := r.m.Get("data")
	if data == nil {
		data = rawUndefined
	}
	if len(data) > maxDataBytes {
		return nil, errors.New("Job data too large (max 10MB)")
	}
	return data, nil
}

func cmdUpdate(r *Req) error {
	data, err := readUpdate(r)
	if err != nil {
		return err
	}
	if err := r.jobCmd(errCannotUpdate, func(s *Shard, q *Queue, j *Job, now int64) error {
		if !isQueued(j.state) && j.state != StateActive {
			return errCannotUpdate
		}
		nd, err := mergeFlowMeta(j.Data, data)
		if err != nil {
			return err
		}
		if err := setJobData(j, nd); err != nil {
			return err
		}
		s.b.persist(j)
		return nil
	}); err != nil {
		return err
	}
	return r.okID()
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
// Clean and RetryCompleted

// cleanArgs are Clean's fields.
type cleanArgs struct {
	queue    string
	grace    float64
	hasGrace bool
	limit    int64
	state    string
}

func readClean(r *Req) (cleanArgs, error) {
	a := cleanArgs{limit: 1000}
	var err error
	if a.queue, err = queueArg(r.m); err != nil {
		return a, err
	}
	if a.grace, a.hasGrace, err = r.m.Num("grace"); err != nil {
		return a, err
	}
	if l, ok, err := r.m.Num("limit"); err != nil {
		return a, err
	} else if ok {
		if math.IsNaN(l) || math.IsInf(l, 0) {
			a.limit = 0
		} else {
			a.limit = int64(max(math.Trunc(l), 0))
		}
	}
	if a.state, _, err = r.m.Str("state"); err != nil {
		return a, err
	}
	if a.state == "wait" {
		a.state = "waiting"
	}
	return a, nil
}

// none says Clean removes nothing whatever the queue holds.
func (a cleanArgs) none() bool { return !a.hasGrace || math.IsNaN(a.grace) || a.limit == 0 }

func (a cleanArgs) cutoff(now int64) int64 { return now - int64(a.grace) }

// writeCleaned answers Clean.
func writeCleaned(r *Req, ids []string) {
	r.field("count").Int(int64(len(ids)))
	strArray(r.field("ids"), nonNil(ids))
}

func cmdClean(r *Req) error {
	a, err := readClean(r)
	if err != nil {
		return err
	}
	name, limit, state := a.queue, a.limit, a.state
	var ids []string
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q == nil || a.none() {
			return
		}
		cutoff := a.cutoff(now)
		var list []*Job
		switch state {
		case "", "waiting", "delayed", "prioritized", "paused":
			// As the reference does, every queued job is a candidate
			// whatever the state asked for.
			q.eachReady(func(j *Job) { list = append(list, j) })
			s.delayed.Each(func(e *hent) bool {
				if e.job.Queue == name {
					list = append(list, e.job)
				}
				return true
			})
			list = slices.DeleteFunc(list, func(j *Job) bool { return j.CreatedAt > cutoff })
			slices.SortFunc(list, byCreated)
			for _, j := range list[:min(int64(len(list)), limit)] {
				s.unqueue(q, j)
				s.forget(j)
				ids = append(ids, j.ID)
			}
		case "completed":
			for i := s.doneHead; i < len(s.done); i++ {
				if d := &s.done[i]; s.doneLiveEnt(d) && d.j.Queue == name && d.j.DoneAt <= cutoff {
					list = append(list, d.j)
				}
			}
			slices.SortFunc(list, func(a, b *Job) int {
				if c := cmpInt(a.DoneAt, b.DoneAt); c != 0 {
					return c
				}
				return cmpStr(a.ID, b.ID)
			})
			for _, j := range list[:min(int64(len(list)), limit)] {
				s.undone(q, j)
				s.b.dropLogs(j.ID)
				s.forget(j)
				ids = append(ids, j.ID)
			}
		case "failed":
			for _, j := range q.dlq {
				if int64(len(list)) >= limit {
					break
				}
				if j.dlq.EnteredAt <= cutoff {
					list = append(list, j)
				}
			}
			for _, j := range list {
				q.removeDLQ(j)
				s.b.dropLogs(j.ID)
				s.forget(j)
				ids = append(ids, j.ID)
			}
		}
	})
	writeCleaned(r, ids)
	return nil
}

func nonNil(a []string) []string {
	if a == nil {
		return []string{}
	}
	return a
}

// requeueCompleted puts a completed job back to waiting; s.mu is held.
func (s *Shard) requeueCompleted(q *Queue, j *Job, now int64) bool {
	if j.UniqueKey != "" {
		if e := q.holder(j.UniqueKey, now); e != nil && e.job != j {
			return false
		}
	}
	s.undone(q, j)
	s.b.dropResult(j.ID)
	resetCompleted(j, now)
	s.holdUnique(q, j)
	s.enqueue(q, j, now)
	s.b.persist(j)
	return true
}

// retryCompletedArgs are RetryCompleted's fields.
type retryCompletedArgs struct {
	queue, id       string
	count, ts       float64
	hasCount, hasTS bool
}

func readRetryCompleted(r *Req) (retryCompletedArgs, error) {
	var a retryCompletedArgs
	var err error
	if a.queue, err = queueArg(r.m); err != nil {
		return a, err
	}
	if a.id, _, err = r.m.Str("id"); err != nil {
		return a, err
	}
	if a.count, a.hasCount, err = r.m.Num("count"); err != nil {
		return a, err
	}
	a.ts, a.hasTS, err = r.m.Num("timestamp")
	return a, err
}

// limit is how many completed jobs may be retried.
func (a retryCompletedArgs) limit() float64 {
	if !a.hasCount {
		return math.Inf(1)
	}
	if a.count > 0 && !math.IsInf(a.count, 0) {
		return math.Floor(a.count)
	}
	return 0
}

// takes says whether a job completed at doneAt is one to retry.
func (a retryCompletedArgs) takes(doneAt int64) bool { return !a.hasTS || float64(doneAt) <= a.ts }

// resetCompleted clears a completed job's run for another one.
func resetCompleted(j *Job, now int64) {
	j.Attempts, j.StartedAt, j.DoneAt = 0, 0, 0
	j.RunAt, j.Heartbeat = now, now
	j.Progress, j.ProgMsg, j.HasProgM = nil, "", false
	j.addTimeline(TimelineEntry{State: "waiting", At: now})
}

func cmdRetryCompleted(r *Req) error {
	a, err := readRetryCompleted(r)
	if err != nil {
		return err
	}
	name, id := a.queue, a.id
	n := 0
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		if id != "" {
			if j := s.b.idxGet(id); j != nil && j.Queue == name && j.state == StateCompleted && s.requeueCompleted(q, j, now) {
				n = 1
			}
			return
		}
		limit := a.limit()
		var list []*Job
		for i := s.doneHead; i < len(s.done); i++ {
			if d := &s.done[i]; s.doneLiveEnt(d) && d.j.Queue == name && a.takes(d.j.DoneAt) {
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
	r.field("count").Int(int64(n))
	return nil
}
