package main

// Deduplication by unique key, per queue. A key is held by the job that
// registered it until the job completes, fails for good, or is removed
// (or, with a dedup ttl, until the ttl runs out); while it is held, pushes
// with the same key return the holder's id.

import (
	"context"
)

type uniqueEnt struct {
	job     *Job
	expires int64 // 0: held until released
}

// holder returns the live holder of key, forgetting an expired entry.
func (q *Queue) holder(key string, now int64) *uniqueEnt {
	e := q.unique[key]
	if e == nil {
		return nil
	}
	if (e.expires != 0 && now >= e.expires) || e.job.state == StateNone {
		delete(q.unique, key)
		return nil
	}
	return e
}

// holdUnique registers j as the holder of its key; s.mu is held.
func (s *Shard) holdUnique(q *Queue, j *Job) {
	if j.cold().UniqueKey == "" {
		return
	}
	if q.unique == nil {
		q.unique = make(map[string]*uniqueEnt)
	}
	e := &uniqueEnt{job: j}
	if j.cold().DedupTTL != none && j.cold().DedupTTL > 0 {
		e.expires = s.b.now() + j.cold().DedupTTL
	}
	q.unique[j.cold().UniqueKey] = e
}

// releaseUnique frees the job's unique key when it holds it.
func (s *Shard) releaseUnique(q *Queue, j *Job) {
	if j.cold().UniqueKey == "" {
		return
	}
	if e := q.unique[j.cold().UniqueKey]; e != nil && e.job == j {
		delete(q.unique, j.cold().UniqueKey)
	}
}

// dedupCheck applies the job's dedup policy against the key's holder. It
// returns the holder's id when the push is a duplicate, and whether the new
// job should be admitted.
func (s *Shard) dedupCheck(q *Queue, j *Job, now int64) (dupID string, admit bool, err error) {
	if j.cold().UniqueKey == "" {
		return "", true, nil
	}
	e := q.holder(j.cold().UniqueKey, now)
	if e == nil {
		return "", true, nil
	}
	owner := e.job
	act, removeHolder, err := dedupPolicy(j, owner.state)
	switch act {
	case dedupReplace:
		if removeHolder {
			if s.hasLiveDependents(owner) {
				return "", false, errDependedOn(owner.ID())
			}
			s.unqueue(q, owner)
			delete(q.unique, j.cold().UniqueKey)
			s.forget(owner)
		}
		return "", true, nil
	case dedupExtend:
		e.expires = now + j.cold().DedupTTL
		if err != nil {
			return "", false, err
		}
		s.b.announce(noticeDeduplicated(q.name, owner.ID(), "extend"))
		return owner.ID(), false, nil
	}
	s.emit(q, evDuplicated, owner, now, evArgs{})
	s.b.announce(noticeDeduplicated(q.name, owner.ID(), "default"))
	return owner.ID(), false, nil
}

// hasLiveDependents: whether a job still waiting on this one would be left
// without it.
func (s *Shard) hasLiveDependents(j *Job) bool {
	if !j.depWaited() {
		return false
	}
	s.b.depMu.Lock()
	defer s.b.depMu.Unlock()
	return len(s.b.deps[j.ID()]) > 0
}

// The memory engine's dedup key operations (DedupEngine)

func (b *MemEngine) DedupJobID(_ context.Context, queue, key string) (string, error) {
	id := ""
	b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			if e := q.holder(key, now); e != nil {
				id = e.job.ID()
			}
		}
	})
	return id, nil
}

func (b *MemEngine) RemoveDedupKey(_ context.Context, queue, key string) (bool, error) {
	removed := false
	b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q != nil && q.holder(key, now) != nil {
			delete(q.unique, key)
			removed = true
		}
	})
	return removed, nil
}

func (b *MemEngine) RemoveJobDedupKey(_ context.Context, id string) (bool, error) {
	removed := false
	b.withJob(id, func(j *Job, s *Shard) {
		if q := s.queues[j.Queue]; q != nil && j.cold().UniqueKey != "" {
			if e := q.holder(j.cold().UniqueKey, b.now()); e != nil && e.job == j {
				delete(q.unique, j.cold().UniqueKey)
				removed = true
			}
		}
	})
	return removed, nil
}
