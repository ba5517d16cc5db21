package main

// The memory engine's queue operations (QueueEngine): pause, drain,
// obliterate, list. pg_queue.go answers the same in PostgreSQL mode.

import (
	"context"
	"errors"
	"slices"
)

// withQueue runs fn on a queue under its shard lock; create makes the queue
// when it does not exist yet.
func (b *MemEngine) withQueue(name string, create bool, fn func(s *Shard, q *Queue, now int64)) error {
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

func (b *MemEngine) SetPaused(_ context.Context, name string, paused bool) error {
	return b.withQueue(name, true, func(s *Shard, q *Queue, now int64) {
		q.paused = paused
		if paused {
			q.listed = true
			s.emit(q, evPaused, nil, now, evArgs{})
		} else {
			q.wakeAll()
			s.emit(q, evResumed, nil, now, evArgs{})
		}
		b.queueChanged(q)
	})
}

func (b *MemEngine) IsPaused(_ context.Context, name string) (bool, error) {
	paused := false
	b.withQueue(name, false, func(s *Shard, q *Queue, now int64) { paused = q != nil && q.paused })
	return paused, nil
}

// drain removes a queue's waiting and delayed jobs; s.mu is held.
func (s *Shard) drain(q *Queue) int {
	gone := make([]*Job, 0, q.nReady+q.nDelayed)
	q.ready.Each(func(e *hent) bool { gone = append(gone, e.job); return true })
	// The queue's own heap is emptied at once: taken out one by one, a
	// million jobs rebuilt it again and again.
	for _, j := range gone {
		q.nReady--
		if j.Priority > 0 {
			q.nPrio--
		}
	}
	q.ready.Clear()
	plain := len(gone)
	for _, g := range q.groups {
		g.ready.Each(func(e *hent) bool { gone = append(gone, e.job); return true })
	}
	s.delayed.Each(func(e *hent) bool {
		if e.job.Queue == q.name {
			gone = append(gone, e.job)
		}
		return true
	})
	for i, j := range gone {
		if i >= plain {
			s.unqueue(q, j) // grouped, or in the shard's delayed heap
		}
		s.releaseUnique(q, j)
		s.b.dropLogs(j.ID())
		s.forget(j)
	}
	return len(gone)
}

func (b *MemEngine) Drain(_ context.Context, name string) (int64, error) {
	n := 0
	b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			n = s.drain(q)
		}
	})
	if n > 0 {
		return int64(n), b.syncRemoval()
	}
	return 0, nil
}

func (b *MemEngine) Obliterate(ctx context.Context, name string) error {
	found := false
	b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if found = q != nil; found {
			s.obliterate(q)
		}
	})
	var err error
	if found {
		err = b.syncRemoval()
	}
	// The history goes whatever the sync said: memory has let the queue
	// go, and history left on disk would bring it back after a restart.
	return errors.Join(err, b.obliterateHistory(ctx, name))
}

// obliterate removes a queue and every job of it; s.mu is held.
func (s *Shard) obliterate(q *Queue) {
	s.drain(q)
	var gone []*Job
	s.leases.Each(func(e *hent) bool {
		if e.job.Queue == q.name && e.job.state == StateActive {
			gone = append(gone, e.job)
		}
		return true
	})
	for _, j := range gone {
		s.deactivate(q, j)
	}
	for i := s.doneHead; i < len(s.done); i++ {
		if d := &s.done[i]; s.doneLiveEnt(d) && d.j.Queue == q.name {
			gone = append(gone, d.j)
			s.undone(q, d.j)
		}
	}
	gone = append(gone, q.dlq...)
	q.dlq = nil
	for _, j := range gone {
		s.b.dropLogs(j.ID())
		s.forget(j)
	}
	q.wakeAll()
	delete(s.queues, q.name)
	s.b.nQueues.Add(-1)
	s.b.queueRemoved(q.name)
}

func (b *MemEngine) ListQueues(context.Context) ([]string, error) {
	type named struct {
		name string
		seq  int64
	}
	var all []named
	for _, s := range b.shards {
		s.with(func() {
			for _, q := range s.queues {
				if q.listed {
					all = append(all, named{q.name, q.created})
				}
			}
		})
	}
	slices.SortFunc(all, func(a, b named) int { return cmpInt(a.seq, b.seq) })
	names := make([]string, len(all))
	for i, n := range all {
		names[i] = n.name
	}
	return names, nil
}
