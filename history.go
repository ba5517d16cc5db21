package main

// Completed history, the broker's side. Memory holds the newest completed
// jobs, at most maxDone of them (--max-completed-jobs, the reference's
// BUNQUEUE_MAX_COMPLETED_JOBS, 50,000 by default); past that the trimmer
// (shard.go) takes the oldest out. In memory mode they are gone. In SQLite
// mode their rows stay, as the reference keeps completed jobs in storage
// past its cache: they are retired (sqlite_history.go), and reads by id,
// the counts and the completed listings find them there, after a restart
// too. --completed-retention-ms deletes completed jobs older than that, in
// memory and on disk, a bounded batch at a time, with the reference's
// cleanup:completed-removed event. (PostgreSQL mode keeps every completed
// job in the database: pg_retain.go.)

import (
	"context"
	"math"
	"time"
)

// historyStore is the store that keeps completed history (SQLiteStore).
type historyStore interface {
	// JobRetired records that j leaves memory and stays on disk; it is
	// called under the job's shard lock.
	JobRetired(j *Job)
	// Retired reads the latest retired job of an id, with its result (nil
	// when there is none).
	Retired(ctx context.Context, id string) (*Job, Raw, error)
	// ResultOf reads a completed job's result by its sequence number.
	ResultOf(ctx context.Context, seq int64) (Raw, error)
	// RetiredCounts counts each queue's retired jobs.
	RetiredCounts(ctx context.Context) (map[string]int, error)
	// RetiredPage is the first k retired jobs of a queue in GetJobs' order,
	// with their results.
	RetiredPage(ctx context.Context, queue string, k int, asc bool) ([]*Job, map[*Job]Raw, error)
	// DeleteRetired deletes up to limit retired jobs completed at or
	// before doneBefore, oldest first (of every queue for "").
	DeleteRetired(ctx context.Context, queue string, doneBefore int64, limit int) ([]retiredRef, error)
}

const (
	// retainEvery is how often completed jobs past the retention are looked
	// for, as the reference's cleanup does.
	retainEvery = 10 * time.Second
	// retainBatch is how many go at most per look, as in the reference.
	retainBatch = 1000
)

// SetCompletedLimits sets how many completed jobs memory holds (0 keeps
// the default) and, from retention ms on (negative: never), when they are
// deleted; it starts the retention loop. Called once, before serving.
func (b *MemEngine) SetCompletedLimits(maxDone, retention int64) {
	if maxDone > 0 {
		b.maxDone = maxDone
	}
	if retention < 0 {
		return
	}
	b.retention = retention
	b.retainStop, b.retainDone = make(chan struct{}), make(chan struct{})
	go b.retainLoop()
}

func (b *MemEngine) retainLoop() {
	defer close(b.retainDone)
	t := time.NewTicker(retainEvery)
	defer t.Stop()
	for {
		select {
		case <-b.retainStop:
			return
		case <-t.C:
		}
		if n, err := b.retainOnce(context.Background()); err != nil {
			b.log.Warn("completed-job retention", "err", err)
		} else if n > 0 {
			b.log.Debug("completed jobs past their retention deleted", "count", n)
		}
	}
}

// retainOnce deletes up to retainBatch completed jobs older than the
// retention, oldest first, from memory then from disk, and announces how
// many went.
func (b *MemEngine) retainOnce(ctx context.Context) (int, error) {
	cutoff := b.now() - b.retention
	n := b.retainHot(cutoff, retainBatch)
	var err error
	if b.hist != nil && n < retainBatch {
		var gone []retiredRef
		b.histMu.Lock()
		gone, err = b.hist.DeleteRetired(ctx, "", cutoff, retainBatch-n)
		b.forgetRetired(gone)
		b.histMu.Unlock()
		n += len(gone)
	}
	if n > 0 {
		b.announce(newNote("cleanup:completed-removed").num("count", float64(n)))
	}
	return n, err
}

// retainHot forgets up to limit completed jobs held in memory that
// completed at or before cutoff, oldest first, across shards.
func (b *MemEngine) retainHot(cutoff int64, limit int) int {
	n := 0
	for n < limit {
		var oldest *Shard
		first := int64(math.MaxInt64)
		for _, s := range b.shards {
			s.mu.Lock()
			at, ok := s.oldestDone()
			s.mu.Unlock()
			if ok && at < first {
				oldest, first = s, at
			}
		}
		if oldest == nil || first > cutoff {
			return n
		}
		oldest.mu.Lock()
		n += oldest.dropDone(cutoff, limit-n)
		oldest.mu.Unlock()
	}
	return n
}

// dropDone forgets up to n of the shard's oldest completed jobs that
// completed at or before cutoff; s.mu is held.
func (s *Shard) dropDone(cutoff int64, n int) int {
	dropped := 0
	for dropped < n {
		at, ok := s.oldestDone()
		if !ok || at > cutoff {
			break
		}
		j := s.done[s.doneHead].j
		q := s.queues[j.Queue]
		if q == nil {
			break
		}
		s.undone(q, j)
		s.b.dropLogs(j.ID())
		s.forget(j)
		dropped++
	}
	return dropped
}

// retire takes a completed job out of memory, leaving it to the store's
// history; s.mu is held and the job is no longer counted among the
// shard's completed ones.
func (s *Shard) retire(q *Queue, j *Job) {
	s.b.idxDel(j)
	s.b.dropResult(j.key())
	s.b.hist.JobRetired(j)
	if q != nil {
		q.nCold++
	}
}

// forgetRetired drops what memory still knows of retired jobs deleted from
// disk: their counts, cached logs and results.
func (b *MemEngine) forgetRetired(gone []retiredRef) {
	for _, r := range gone {
		s := b.shardOf(r.queue)
		s.mu.Lock()
		if q := s.queues[r.queue]; q != nil && q.nCold > 0 {
			q.nCold--
		}
		s.mu.Unlock()
		if b.idxGet(r.id) == nil {
			b.dropLogs(r.id)
			b.dropResult(keyOf(r.id))
		}
	}
}

// restoreHistory counts the retired jobs of each queue at recovery.
func (b *MemEngine) restoreHistory(ctx context.Context) error {
	if b.hist == nil {
		return nil
	}
	counts, err := b.hist.RetiredCounts(ctx)
	if err != nil {
		return err
	}
	for name, n := range counts {
		s := b.shardOf(name)
		s.with(func() {
			q := s.queue(name)
			q.listed = true
			q.nCold += n
		})
	}
	return nil
}

// readHistory completes a reader's view from disk: a job memory no longer
// holds, or the result of a completed one the results cache let go.
func (b *MemEngine) readHistory(ctx context.Context, id string, v JobView) (JobView, error) {
	if b.hist == nil {
		return v, nil
	}
	if v.Job == nil {
		j, res, err := b.hist.Retired(ctx, id)
		if err != nil || j == nil {
			return v, err
		}
		return JobView{Job: j.readCopy(), State: StateCompleted.String(), Result: res}, nil
	}
	if v.State == StateCompleted.String() && v.Result == nil && v.Job.seq > 0 {
		res, err := b.hist.ResultOf(ctx, v.Job.seq)
		if err != nil {
			return v, err
		}
		v.Result = res
	}
	return v, nil
}

// cleanHistory deletes up to limit of a queue's retired jobs completed at
// or before cutoff, after Clean has taken those in memory.
func (b *MemEngine) cleanHistory(ctx context.Context, queue string, cutoff, limit int64) ([]string, error) {
	if b.hist == nil || limit <= 0 {
		return nil, nil
	}
	b.histMu.Lock()
	gone, err := b.hist.DeleteRetired(ctx, queue, cutoff, int(min(limit, math.MaxInt32)))
	b.forgetRetired(gone)
	b.histMu.Unlock()
	ids := make([]string, len(gone))
	for i, r := range gone {
		ids[i] = r.id
	}
	return ids, err
}

// obliterateHistory deletes every retired job of a queue, a batch at a
// time, so that no write waits on one long transaction.
func (b *MemEngine) obliterateHistory(ctx context.Context, queue string) error {
	if b.hist == nil {
		return nil
	}
	b.histMu.Lock()
	defer b.histMu.Unlock()
	for {
		gone, err := b.hist.DeleteRetired(ctx, queue, math.MaxInt64, retainBatch)
		if err != nil {
			return err
		}
		for _, r := range gone {
			b.dropLogs(r.id)
		}
		if len(gone) < retainBatch {
			return nil
		}
	}
}

// retryHistory retries, after the n retried in memory, completed jobs of
// a.queue that only the history on disk holds: the one a.id names, or the
// oldest first up to a.limit(). Pages are read from the oldest; the jobs
// a page held that were not taken (completed after a.ts, or whose unique
// key a live job holds) stay at the front, so the next page is that much
// longer. It holds histMu, as the deletions of history do: a row read
// here is not deleted (by Clean, retention, Obliterate) before it is
// revived. It stops when the memory budget is spent: the jobs it brings
// back are new in memory.
func (b *MemEngine) retryHistory(ctx context.Context, a retryCompletedArgs, n int) (int, error) {
	if b.hist == nil || float64(n) >= a.limit() {
		return n, nil
	}
	b.histMu.Lock()
	defer b.histMu.Unlock()
	if a.id != "" {
		j, _, err := b.hist.Retired(ctx, a.id)
		if err != nil || j == nil {
			return n, err
		}
		if b.revive(a, j) {
			n++
		}
		return n, nil
	}
	skipped := 0
	for float64(n) < a.limit() {
		want := skipped + int(min(a.limit()-float64(n), retainBatch))
		page, _, err := b.hist.RetiredPage(ctx, a.queue, want, true)
		if err != nil {
			return n, err
		}
		for _, j := range page[min(skipped, len(page)):] {
			if b.mem.spent() {
				return n, nil
			}
			if float64(n) < a.limit() && b.revive(a, j) {
				n++
			} else {
				skipped++
			}
		}
		if len(page) < want {
			break
		}
	}
	return n, nil
}

// revive puts a retired job back to waiting, as requeueCompleted does one
// in memory. Its record goes to a new row and the row it was retired under
// is deleted in the same transaction (Hold).
func (b *MemEngine) revive(a retryCompletedArgs, j *Job) bool {
	if j.Queue != a.queue || !a.takes(j.DoneAt()) {
		return false
	}
	ok := false
	b.withQueue(a.queue, false, func(s *Shard, q *Queue, now int64) {
		if q == nil {
			return
		}
		if uk := j.cold().UniqueKey; uk != "" && q.holder(uk, now) != nil {
			return
		}
		// The index first: a live job with the id (a push of the same
		// custom id, in any queue) keeps it.
		if b.idxPut(j) != nil {
			return
		}
		retired := j.seq
		j.seq = b.seq.Add(1)
		resetCompleted(j, now)
		s.holdUnique(q, j)
		s.enqueue(q, j, now)
		b.store.Hold()
		b.persist(j)
		b.unpersist(&Job{seq: retired})
		b.store.Release()
		if q.nCold > 0 {
			q.nCold--
		}
		ok = true
	})
	return ok
}
