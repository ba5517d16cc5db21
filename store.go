package main

// Persistence behind one narrow interface. The broker calls the store on
// every state change, under the shard lock that guards the change, so an
// implementation only records what changed and returns at once; the
// writing happens elsewhere (see the SQLite write buffer). In memory mode
// the broker has no store and these calls cost a nil check.

import (
	"errors"
	"time"
)

type Store interface {
	// JobChanged records a job's current state (admitted, claimed,
	// retried, completed with result, dead-lettered...).
	JobChanged(j *Job, result Raw)
	// JobRemoved records that a job is gone for good, with its logs.
	JobRemoved(j *Job)
	// QueueChanged records a queue's settings (paused, configuration).
	QueueChanged(q *Queue)
	// QueueRemoved records that a queue was obliterated.
	QueueRemoved(name string)
	// LogsChanged records a job's log lines (nil: cleared).
	LogsChanged(id string, logs []LogEntry)
	// Admit is asked before new jobs are taken: an error refuses them (the
	// store cannot write), and it may wait while the store catches up.
	Admit() error
	// Throttle is called before other changes; it may wait while the
	// store catches up.
	Throttle()
	// Sync returns once everything recorded so far is durable.
	Sync() error
	// CronChanged and CronRemoved record schedules.
	CronChanged(s *CronSchedule)
	CronRemoved(name string)
	// Hold and Release bracket changes that must be written in the same
	// transaction (a flow): no flush starts in between.
	Hold()
	Release()
	// Status reports a write failure in progress, if any.
	Status() (since time.Time, backlog int, err error)
	// Describe names the engine and where it keeps the data.
	Describe() (driver, location string)
	Close() error
}

func (b *MemEngine) persist(j *Job) {
	if b.store != nil {
		b.store.JobChanged(j, nil)
	}
}

func (b *MemEngine) unpersist(j *Job) {
	if b.store != nil {
		b.store.JobRemoved(j)
	}
}

func (b *MemEngine) queueChanged(q *Queue) {
	if b.store != nil {
		b.store.QueueChanged(q)
	}
}

func (b *MemEngine) queueRemoved(name string) {
	if b.store != nil {
		b.store.QueueRemoved(name)
	}
}

func (b *MemEngine) logsChanged(id string, logs []LogEntry) {
	if b.store != nil {
		b.store.LogsChanged(id, logs)
	}
}

// admit asks the store whether new jobs may come in.
func (b *MemEngine) admit() error {
	if b.store == nil {
		return nil
	}
	return b.store.Admit()
}

// throttle lets the store slow a client that changes state faster than it
// can write.
func (b *MemEngine) throttle() {
	if b.store != nil {
		b.store.Throttle()
	}
}

// syncDurable makes pushes marked durable durable before they are answered.
func (b *MemEngine) syncDurable(jobs []*Job) error {
	if b.store == nil {
		return nil
	}
	for _, j := range jobs {
		if j.cold().Durable {
			if err := b.store.Sync(); err != nil {
				return errors.New("durable write failed: " + err.Error())
			}
			return nil
		}
	}
	return nil
}

// syncRemoval makes a queue's removals (Obliterate, Drain, Clean) durable
// before they are answered: jobs said to be gone must not come back after
// a crash. A big one is written as a tombstone (sqlite_purge.go), so this
// waits for one ordinary flush.
func (b *MemEngine) syncRemoval() error {
	if b.store == nil {
		return nil
	}
	// Closed: the stop writes what is pending before it ends.
	if err := b.store.Sync(); err != nil && !errors.Is(err, errStoreClosed) {
		return errors.New("removed, but not yet on disk: " + err.Error())
	}
	return nil
}

// StorageState is what StorageStatus and /health report.
type StorageState struct {
	Driver, Location string
	Err              error
	Since            time.Time
	Backlog          int
	// Dropped counts changes left out because they could never be
	// written (see SQLiteStore.isolate).
	Dropped uint64
	// Purging counts rows of removed jobs still to be deleted in the
	// background (sqlite_purge.go).
	Purging int64
}

func (b *MemEngine) memStorageState() StorageState {
	if b.store == nil {
		return StorageState{Driver: "memory"}
	}
	st := StorageState{}
	st.Driver, st.Location = b.store.Describe()
	st.Since, st.Backlog, st.Err = b.store.Status()
	if d, ok := b.store.(interface{ Dropped() uint64 }); ok {
		st.Dropped = d.Dropped()
	}
	if p, ok := b.store.(interface{ Purging() int64 }); ok {
		st.Purging = p.Purging()
	}
	return st
}

// ---------------------------------------------------------------------------
// Queue settings and logs as stored

func encodeQueueSettings(q *Queue) []byte {
	var e Enc
	n := 3
	if q.rate != nil {
		n++
	}
	if q.concLimit != nil {
		n++
	}
	// Group overrides and pauses are kept; windows, manual limits and the
	// rotation are not (as in the reference).
	var gs []*Group
	for _, g := range q.groups {
		if g.paused || g.concOverride > 0 || g.rateOverride != nil {
			gs = append(gs, g)
		}
	}
	if len(gs) > 0 {
		n++
	}
	e.MapHead(n)
	if len(gs) > 0 {
		e.Str("groups")
		e.ArrayHead(len(gs))
		for _, g := range gs {
			e.ArrayHead(5)
			e.Str(g.id)
			e.Bool(g.paused)
			e.Int64Exact(g.concOverride)
			if g.rateOverride != nil {
				e.Int64Exact(g.rateOverride.max)
				e.Int64Exact(g.rateOverride.duration)
			} else {
				e.Int64Exact(0)
				e.Int64Exact(0)
			}
		}
	}
	if q.rate != nil {
		// The bucket restarts full after a restart; its ttl deadline holds.
		e.Str("rate")
		e.ArrayHead(3)
		e.Float64(q.rate.max)
		e.Int64Exact(q.rate.duration)
		e.Int64Exact(q.rate.expires)
	}
	if q.concLimit != nil {
		e.Str("concurrency")
		e.Int64Exact(*q.concLimit)
	}
	e.Str("paused")
	e.Bool(q.paused)
	e.Str("stall")
	e.ArrayHead(4)
	e.Bool(q.stall.Enabled)
	e.Int64Exact(q.stall.StallInterval)
	e.Int64Exact(int64(q.stall.MaxStalls))
	e.Int64Exact(q.stall.GracePeriod)
	e.Str("dlq")
	e.ArrayHead(5)
	e.Bool(q.dlqCfg.AutoRetry)
	e.Int64Exact(q.dlqCfg.AutoRetryInterval)
	e.Int64Exact(int64(q.dlqCfg.MaxAutoRetries))
	e.Int64Exact(q.dlqCfg.MaxAge)
	e.Int64Exact(int64(q.dlqCfg.MaxEntries))
	return e.B
}

func decodeQueueSettings(q *Queue, b []byte) error {
	m, err := ParseMap(b, nil)
	if err != nil {
		return err
	}
	q.paused, _, _ = m.Bool("paused")
	if r := m.Get("rate"); r != nil {
		if items, err := r.Array(); err == nil && len(items) == 3 {
			mx, _ := items[0].Float()
			dur, _ := rawInt(items[1])
			exp, _ := rawInt(items[2])
			now := nowMs()
			if exp == 0 || exp > now {
				q.rate = newBucket(mx, dur, 0, now)
				q.rate.expires = exp
			}
		}
	}
	if r := m.Get("concurrency"); r != nil {
		if n, err := rawInt(r); err == nil {
			q.concLimit = &n
		}
	}
	if r := m.Get("groups"); r != nil {
		items, _ := r.Array()
		for _, it := range items {
			f, err := it.Array()
			if err != nil || len(f) != 5 {
				continue
			}
			id, err := f[0].Str()
			if err != nil {
				continue
			}
			g := q.group(id)
			g.paused = len(f[1]) > 0 && f[1][0] == 0xc3
			g.concOverride, _ = rawInt(f[2])
			if mx, _ := rawInt(f[3]); mx > 0 {
				d, _ := rawInt(f[4])
				g.rateOverride = &groupLimit{max: mx, duration: d}
			}
			// Counted, not refused: what was stored stays, even past
			// maxGroupSettings.
			q.countSettings(g, 0)
		}
	}
	if r := m.Get("stall"); r != nil {
		if items, err := r.Array(); err == nil && len(items) == 4 {
			q.stall.Enabled = len(items[0]) > 0 && items[0][0] == 0xc3
			q.stall.StallInterval, _ = rawInt(items[1])
			n, _ := rawInt(items[2])
			q.stall.MaxStalls = int32(n)
			q.stall.GracePeriod, _ = rawInt(items[3])
		}
	}
	if r := m.Get("dlq"); r != nil {
		if items, err := r.Array(); err == nil && len(items) == 5 {
			q.dlqCfg.AutoRetry = len(items[0]) > 0 && items[0][0] == 0xc3
			q.dlqCfg.AutoRetryInterval, _ = rawInt(items[1])
			n, _ := rawInt(items[2])
			q.dlqCfg.MaxAutoRetries = int32(n)
			q.dlqCfg.MaxAge, _ = rawInt(items[3])
			n, _ = rawInt(items[4])
			q.dlqCfg.MaxEntries = int(max(n, 1))
		}
	}
	return nil
}

func encodeLogs(logs []LogEntry) []byte {
	var e Enc
	e.ArrayHead(len(logs))
	for _, l := range logs {
		e.ArrayHead(3)
		e.Int64Exact(l.At)
		e.Str(l.Level)
		e.Raw(l.Message)
	}
	return e.B
}

func decodeLogs(b []byte) ([]LogEntry, error) {
	items, err := Raw(b).Array()
	if err != nil {
		return nil, err
	}
	out := make([]LogEntry, 0, len(items))
	for _, it := range items {
		f, err := it.Array()
		if err != nil || len(f) != 3 {
			return nil, errors.New("log entry is not [at, level, message]")
		}
		at, _ := rawInt(f[0])
		lvl, _ := f[1].Str()
		out = append(out, LogEntry{At: at, Level: lvl, Message: clone(f[2])})
	}
	return out, nil
}

// ---------------------------------------------------------------------------
// Recovery: the broker's side. These run before the server accepts
// connections and record nothing back to the store.

func (b *MemEngine) restoreQueue(name string, settings []byte) error {
	s := b.shardOf(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue(name)
	q.listed = true
	return decodeQueueSettings(q, settings)
}

func (b *MemEngine) noteSeq(j *Job) { b.seqAtLeast(j.seq) }

// seqAtLeast makes the next sequence number greater than v: numbers are
// never given twice in a database's life.
func (b *MemEngine) seqAtLeast(v int64) {
	for {
		cur := b.seq.Load()
		if v <= cur || b.seq.CompareAndSwap(cur, v) {
			return
		}
	}
}

// restoreQueued puts back a job that was waiting, delayed or active; an
// active job's worker is gone, so it waits again with its attempts kept.
func (b *MemEngine) restoreQueued(j *Job) {
	s := b.shardOf(j.Queue)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := b.now()
	q := s.queue(j.Queue)
	q.listed = true
	if b.idxPut(j) != nil {
		return
	}
	b.noteSeq(j)
	if j.state == StateActive {
		j.setStartedAt(0)
	}
	s.holdUnique(q, j)
	if j.state == StateWaitingChildren {
		// Its dependencies are counted once every job is back.
		q.addWC(j)
		return
	}
	if j.queuedState(now) == StateDelayed {
		j.state = StateDelayed
		q.nDelayed++
		s.delayed.Push(j, 0, j.RunAt, j.seq)
	} else {
		s.makeReady(q, j)
	}
}

func (b *MemEngine) restoreDone(j *Job, result Raw) {
	s := b.shardOf(j.Queue)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue(j.Queue)
	q.listed = true
	if b.idxPut(j) != nil {
		return
	}
	b.noteSeq(j)
	j.markDone()
	s.addDone(q, j)
	if result != nil {
		b.setResult(j.key(), result)
	}
}

func (b *MemEngine) restoreDead(j *Job) {
	s := b.shardOf(j.Queue)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue(j.Queue)
	q.listed = true
	if b.idxPut(j) != nil {
		return
	}
	b.noteSeq(j)
	j.ensureDLQEntry()
	q.dlq = append(q.dlq, j)
	s.watchDLQ(q, j, b.now())
}

// ensureDLQEntry gives a dead-lettered job read back from storage the
// entry its record lacks (one written before entries were kept).
func (j *Job) ensureDLQEntry() {
	if j.dlq == nil {
		j.dlq = &DLQEntry{EnteredAt: j.DoneAt(), Reason: "unknown"}
	}
}

func (b *MemEngine) restoreLogs(id string, logs []LogEntry) {
	b.lmu.Lock()
	b.logs.Put(id, logs)
	b.lmu.Unlock()
}

// finishRestore counts the dependencies of jobs waiting for others, now
// that every job is back, and arms the shard timers.
func (b *MemEngine) finishRestore() {
	now := b.now()
	for _, s := range b.shards {
		s.mu.Lock()
		var waiting []*Job
		for _, q := range s.queues {
			for j := range q.wc {
				waiting = append(waiting, j)
			}
		}
		s.mu.Unlock()
		for _, j := range waiting {
			// Dependencies gone from the database completed and were removed.
			n := b.registerDeps(j, nil)
			s.with(func() {
				j.pending = n
				if n == 0 && len(j.cold().DependsOn) > 0 {
					s.releaseWaiting(s.queues[j.Queue], j, now, false)
				}
			})
		}
	}
	for _, s := range b.shards {
		s.mu.Lock()
		s.rearm(now)
		s.mu.Unlock()
	}
}
