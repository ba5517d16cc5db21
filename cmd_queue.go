package main

// Handlers of queue control and the dead-letter queue.

import (
	"slices"
)

// withQueue runs fn on a queue under its shard lock; create makes the queue
// when it does not exist yet.
func (b *Broker) withQueue(name string, create bool, fn func(s *Shard, q *Queue, now int64)) error {
	s := b.shardOf(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[name]
	if q == nil {
		if !create {
			fn(s, nil, b.now())
			return nil
		}
		var err error
		if q, err = s.queueFor(name); err != nil {
			return err
		}
	}
	now := b.now()
	s.promote(now)
	fn(s, q, now)
	return nil
}

func cmdPause(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	if err := r.b.withQueue(name, true, func(s *Shard, q *Queue, now int64) {
		q.paused, q.listed = true, true
		s.emit(q, evPaused, nil, now, evArgs{})
		r.b.queueChanged(q)
	}); err != nil {
		return err
	}
	return r.okID()
}

func cmdResume(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	if err := r.b.withQueue(name, true, func(s *Shard, q *Queue, now int64) {
		q.paused = false
		q.wakeAll()
		s.emit(q, evResumed, nil, now, evArgs{})
		r.b.queueChanged(q)
	}); err != nil {
		return err
	}
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
	q.eachReady(func(j *Job) { gone = append(gone, j) })
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
		r.b.nQueues.Add(-1)
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
		s.with(func() {
			for _, q := range s.queues {
				if q.listed {
					all = append(all, named{q.name, q.created})
				}
			}
		})
	}
	slices.SortFunc(all, func(a, b named) int { return cmpInt(a.seq, b.seq) })
	e := r.field("queues")
	e.ArrayHead(len(all))
	for _, n := range all {
		e.Str(n.name)
	}
	return nil
}
