package main

// Sharding and per-queue state.
//
// A queue lives in shard fnv1a(name) & mask; everything about it (its ready
// heap, its delayed and active jobs, its DLQ, its waiters) is guarded by that
// shard's one mutex, so operations on queues of different shards never
// contend. Jobs are found by id through a separately partitioned index.
//
// Lock order: shard.mu, then an index partition, then the small global locks
// (results, logs, retired tokens, a connection's held-jobs set). Nothing
// takes a shard lock while holding any of those.

import (
	"errors"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"
)

// fnv1a is the 32-bit FNV-1a hash.
func fnv1a(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// shardCount is the CPU count rounded up to a power of two, at most 64.
func shardCount(cpus int) int {
	n := 1
	for n < cpus && n < 64 {
		n <<= 1
	}
	return n
}

func defaultShards() int { return shardCount(runtime.NumCPU()) }

// ---------------------------------------------------------------------------
// ---------------------------------------------------------------------------
// Shards and queues

// Shard owns the queues that hash to it.
type Shard struct {
	b      *MemEngine
	id     int
	mu     sync.Mutex
	queues map[string]*Queue

	delayed *Heap4 // delayed jobs of every queue here, by run time
	leases  *Heap4 // active jobs, by the time they must be looked at

	// Completed jobs, oldest first, bounded per shard. Entries go stale when
	// their job leaves the completed state; live counts the fresh ones.
	done     []doneEnt
	doneHead int
	doneLive int

	// emit's scratch, reused under mu: every job event built an Event
	// for the taps and a frame for the subscribers, a third of what the
	// server allocated per job; taps and pushEvent copy what they keep.
	scratch emitScratch

	lingering lingerHeap // groups kept only by a window or hold (groups.go)

	timer   *time.Timer
	armedAt int64 // deadline the timer is set for; 0 when idle
	closed  bool
}

type doneEnt struct {
	j   *Job
	gen uint32
}

var defaultStall = StallConfig{Enabled: true, StallInterval: 30000, MaxStalls: 3, GracePeriod: 5000}

var defaultDLQ = DLQConfig{AutoRetryInterval: 3600000, MaxAutoRetries: 3, MaxAge: 604800000, MaxEntries: 10000}

// Queue is one named queue's state.
type Queue struct {
	name     string
	ready    *Heap4 // waiting and prioritized jobs
	nPrio    int    // ready jobs with priority > 0
	nDelayed int
	nActive  int
	nDone    int
	nCold    int    // completed jobs retired to disk (history.go)
	dlq      []*Job // oldest first
	paused   bool
	listed   bool // shown by ListQueues
	waiters  []*waiter
	unique   map[string]*uniqueEnt

	nReady  int               // ready jobs, grouped or not
	wc      map[*Job]struct{} // jobs in waiting-children
	groups  map[string]*Group // see groups.go
	cursor  *Group            // the next group's turn
	ringLen int
	// groupsPeak is the most groups held since the map was made;
	// nGroupSettings counts those with settings (maxGroupSettings).
	groupsPeak, nGroupSettings int

	rate       *bucket // queue rate limit
	concLimit  *int64  // queue concurrency limit
	concActive int64   // jobs holding a concurrency slot
	stall      StallConfig
	dlqCfg     DLQConfig
	created    int64 // creation order, for ListQueues
}

type waiter struct {
	ch chan struct{}
}

func (s *Shard) queue(name string) *Queue {
	q := s.queues[name]
	if q == nil {
		q = &Queue{name: name, ready: newHeap(heapPlace), stall: defaultStall, dlqCfg: defaultDLQ,
			created: s.b.seq.Add(1)}
		s.queues[name] = q
		s.b.nQueues.Add(1)
		s.b.announce(noticeQueue("queue:created", name))
	}
	return q
}

// queueFor is the queue of that name, made when there is room for one
// more: a client naming queue after queue (each costs memory for as long
// as it exists, until Obliterate) meets the --max-queues limit.
func (s *Shard) queueFor(name string) (*Queue, error) {
	if q := s.queues[name]; q != nil {
		return q, nil
	}
	if err := s.b.queueRoom(1); err != nil {
		return nil, err
	}
	return s.queue(name), nil
}

// queueRoom says whether n more queues may be made.
func (b *MemEngine) queueRoom(n int) error {
	if b.maxQueues > 0 && b.nQueues.Load()+int64(n) > int64(b.maxQueues) {
		return errTooManyQueues(b.maxQueues)
	}
	return nil
}

// errTooManyQueues is the refusal of one queue more than --max-queues
// (the same in both engines).
func errTooManyQueues(limit int) error {
	return errors.New("queues are limited to " + itoa(int64(limit)) + " (--max-queues)")
}

// with runs fn holding the shard lock, released even if fn panics (the
// connection's recover then answers with an error instead of the server
// hanging on a lock nobody will release).
func (s *Shard) with(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn()
}

func (b *MemEngine) shardOf(queue string) *Shard { return b.shards[fnv1a(queue)&b.mask] }

// lockJob finds a job by id and locks its shard. The index is checked again
// under the lock, since the job may have been replaced in between.
func (b *MemEngine) lockJob(id string) (*Job, *Shard) {
	for tries := 0; tries < 4; tries++ {
		j := b.idxGet(id)
		if j == nil {
			return nil, nil
		}
		s := b.shardOf(j.Queue)
		s.mu.Lock()
		if b.idxGet(id) == j {
			return j, s
		}
		s.mu.Unlock()
	}
	return nil, nil
}

// ---------------------------------------------------------------------------
// Placement: the transitions between waiting, delayed and active. All of
// these run with s.mu held.

func readyKeys(j *Job) (pri, t, seq int64) {
	if j.cold().Lifo {
		// Among equal priorities LIFO jobs go first, newest first.
		return j.Priority, math.MinInt64, -j.seq
	}
	return j.Priority, j.RunAt, j.seq
}

// enqueue places a job that is not waiting on anything: delayed when its
// run time is ahead, else ready. It wakes one long-poll waiter.
func (s *Shard) enqueue(q *Queue, j *Job, now int64) {
	if j.cold().GroupID != "" {
		q.group(j.cold().GroupID).queued++
	}
	if j.queuedState(now) == StateDelayed {
		j.state = StateDelayed
		q.nDelayed++
		s.delayed.Push(j, 0, j.RunAt, j.seq)
		s.armFor(j.RunAt, now)
		return
	}
	s.makeReady(q, j)
	q.wake(1)
}

func (s *Shard) makeReady(q *Queue, j *Job) {
	j.state = j.readyState()
	q.nReady++
	if j.Priority > 0 {
		q.nPrio++
	}
	if j.cold().GroupID != "" {
		g := q.group(j.cold().GroupID)
		p, t, sq := groupKeys(j)
		g.ready.Push(j, p, t, sq)
		q.ringAdd(g)
		return
	}
	p, t, sq := readyKeys(j)
	q.ready.Push(j, p, t, sq)
}

// unqueue takes a waiting or delayed job out of its heap.
func (s *Shard) unqueue(q *Queue, j *Job) {
	var g *Group
	if j.cold().GroupID != "" {
		g = q.groups[j.cold().GroupID]
	}
	switch j.state {
	case StateWaiting, StatePrioritized:
		removed := false
		if g != nil {
			if removed = g.ready.Remove(j); g.ready.Len() == 0 {
				q.ringRemove(g)
			}
		} else {
			removed = q.ready.Remove(j)
		}
		if removed {
			q.nReady--
			if j.Priority > 0 {
				q.nPrio--
			}
			if g != nil {
				g.queued--
			}
		}
	case StateDelayed:
		if s.delayed.Remove(j) {
			q.nDelayed--
			if g != nil {
				g.queued--
			}
		}
	case StateWaitingChildren:
		q.delWC(j)
		s.b.unwaitAll(j)
	}
	if g != nil {
		s.tidyGroup(q, g, s.b.now())
	}
}

func (q *Queue) addWC(j *Job) {
	if q.wc == nil {
		q.wc = make(map[*Job]struct{})
	}
	q.wc[j] = struct{}{}
}

func (q *Queue) delWC(j *Job) { delete(q.wc, j) }

// eachReady visits every ready job of the queue, grouped or not.
func (q *Queue) eachReady(fn func(j *Job)) {
	q.ready.Each(func(e *hent) bool { fn(e.job); return true })
	for _, g := range q.groups {
		g.ready.Each(func(e *hent) bool { fn(e.job); return true })
	}
}

// promote moves delayed jobs whose time has come to their ready heaps.
func (s *Shard) promote(now int64) {
	for {
		e := s.delayed.Peek()
		if e == nil || e.t > now {
			return
		}
		j := s.delayed.Pop()
		q := s.queues[j.Queue]
		q.nDelayed--
		s.makeReady(q, j)
		q.wake(1)
	}
}

func (q *Queue) wake(n int) {
	for n > 0 && len(q.waiters) > 0 {
		w := q.waiters[0]
		q.waiters[0] = nil
		q.waiters = q.waiters[1:]
		select {
		case w.ch <- struct{}{}:
		default:
		}
		n--
	}
	if len(q.waiters) == 0 {
		q.waiters = nil
	}
}

func (q *Queue) wakeAll() { q.wake(len(q.waiters)) }

func (q *Queue) dropWaiter(w *waiter) {
	for i, x := range q.waiters {
		if x == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			return
		}
	}
}

// ---------------------------------------------------------------------------
// Active jobs and their deadlines

// deadline is the next moment an active job must be looked at: its lock
// expiry, its stall limit when it has no lock, or its processing timeout.
func (s *Shard) deadline(q *Queue, j *Job) int64 { return stallDeadline(j, q.stall) }

// stallDeadline is deadline under the stall policy c.
func stallDeadline(j *Job, c StallConfig) int64 {
	d := int64(math.MaxInt64)
	if j.run().lease != nil {
		d = j.run().lease.ExpiresAt
	} else if c.Enabled {
		d = j.Heartbeat() + stallLimit(j, c)
		if g := j.StartedAt() + c.GracePeriod; g > d {
			d = g
		}
	}
	if t, ok := timeoutAt(j); ok && t < d {
		d = t
	}
	return d
}

// stallLimit is how long an active job without a lock may go without a
// heartbeat: its own stall timeout, or its queue's interval.
func stallLimit(j *Job, c StallConfig) int64 {
	if j.cold().StallTimeout != none && j.cold().StallTimeout > 0 {
		return j.cold().StallTimeout
	}
	return c.StallInterval
}

func (s *Shard) watch(q *Queue, j *Job, now int64) {
	d := s.deadline(q, j)
	j.running().deadline = d
	// Every active job has an entry, even one with nothing to watch (its
	// entry then sorts last and never comes due): the lease heap is also
	// how a queue's active jobs are listed.
	s.leases.Push(j, 0, d, 0)
	if d != math.MaxInt64 {
		s.armFor(d, now)
	}
}

// ---------------------------------------------------------------------------
// The shard timer: one timer on the earliest deadline of the shard.

func (s *Shard) startTimer() {
	s.timer = time.AfterFunc(time.Hour, s.tick)
	s.timer.Stop()
}

// armFor makes sure the timer fires no later than at.
func (s *Shard) armFor(at, now int64) {
	if s.closed || (s.armedAt != 0 && s.armedAt <= at) {
		return
	}
	// The timer waits at most a day: a deadline further off (a lock of a
	// lockTtl a client chose) is looked at again then, since its wait in
	// nanoseconds could pass int64's end and wrap around to a timer that
	// fires at once, again and again.
	d := min(max(at-now, 0), maxTimerWait)
	s.armedAt = now + d
	s.timer.Reset(time.Duration(d) * time.Millisecond)
}

// maxTimerWait is the longest a shard's timer waits, in ms.
const maxTimerWait = 24 * 60 * 60 * 1000

func (s *Shard) rearm(now int64) {
	next := int64(math.MaxInt64)
	if e := s.delayed.Peek(); e != nil {
		next = e.t
	}
	if e := s.leases.Peek(); e != nil && e.t < next {
		next = e.t
	}
	if len(s.lingering) > 0 && s.lingering[0].at < next {
		next = s.lingering[0].at
	}
	// (an active job with nothing to watch sorts at MaxInt64: not a wake-up)
	s.armedAt = 0
	if next == math.MaxInt64 {
		s.timer.Stop()
		return
	}
	s.armFor(next, now)
}

func (s *Shard) tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	now := s.b.now()
	s.promote(now)
	s.expire(now)
	s.forgetLingering(now)
	s.rearm(now)
}

// expire handles active jobs whose deadline has passed.
func (s *Shard) expire(now int64) {
	for {
		e := s.leases.Peek()
		if e == nil || e.t > now {
			return
		}
		j := s.leases.Pop()
		q := s.queues[j.Queue]
		if q == nil {
			continue
		}
		if j.state == StateFailed {
			s.dlqDue(q, j, now)
			continue
		}
		if j.state != StateActive {
			continue
		}
		d := s.deadline(q, j)
		if d > now {
			// Renewed since the entry was made: look again later.
			j.running().deadline = d
			s.leases.Push(j, 0, d, 0)
			continue
		}
		switch {
		case timedOut(j, now):
			s.b.retire(j)
			s.fail(q, j, timeoutFailure(), now)
			s.b.announce(noticeQueueJob("job:timeout", q.name, j.ID()).int("timeout", j.cold().Timeout))
		case j.run().lease != nil:
			s.lockExpired(q, j, now)
		default:
			s.stalled(q, j, now)
		}
	}
}

// lockExpired: a worker held a lock and stopped renewing it. The job goes
// back where it was in its queue, or to the DLQ once it has used its
// attempts or stalled too often.
func (s *Shard) lockExpired(q *Queue, j *Job, now int64) {
	if isCronJob(j) {
		s.b.retire(j)
		s.deactivate(q, j)
		s.releaseUnique(q, j)
		s.forget(j)
		return
	}
	renewals := j.run().lease.Renewals
	s.deactivate(q, j)
	s.releaseUnique(q, j)
	if reason, msg, ev := lockLapsed(j, q.stall, renewals, now); reason != "" {
		s.emitStalled(q, j, now, "move_to_dlq")
		s.toDLQ(q, j, reason, msg, true, now)
		s.emit(q, evFailed, j, now, evArgs{err: ev, hasErr: true, noData: true})
		s.b.stats.failed.Add(1)
		s.b.announce(noticeLockExpired(q.name, j.ID(), renewals))
		return
	}
	s.enqueue(q, j, now)
	s.emit(q, evStalled, j, now, evArgs{})
	s.b.persist(j)
	s.b.announce(noticeLockExpired(q.name, j.ID(), renewals))
}

// lockLapsed counts a lapsed lock against a job. When the job has used
// its attempts or stalled too often it answers the DLQ reason, the entry's
// error and the failed event's; else the job is to go back to its queue
// as it was.
func lockLapsed(j *Job, c StallConfig, renewals int32, now int64) (reason, msg, ev string) {
	j.Attempts++
	j.warm().Stalls++
	j.setHeartbeat(now)
	j.setStartedAt(0)
	j.setLease(nil)
	if j.Attempts >= j.cold().MaxAttempts {
		return "max_attempts_exceeded", "Lock expired at max attempts (" + itoa(int64(j.cold().MaxAttempts)) + ")", "Lock expired (max attempts reached)"
	}
	if c.MaxStalls > 0 && j.cold().Stalls >= c.MaxStalls {
		return "stalled", "Lock expired after " + itoa(int64(renewals)) + " renewals", "Lock expired (max stalls reached)"
	}
	return "", "", ""
}

// stalled: an active job without a lock whose heartbeats stopped.
func (s *Shard) stalled(q *Queue, j *Job, now int64) {
	s.deactivate(q, j)
	if isCronJob(j) {
		s.releaseUnique(q, j)
		s.forget(j)
		return
	}
	s.releaseUnique(q, j)
	if reason, msg := stallLapsed(j, q.stall, now); reason != "" {
		s.emitStalled(q, j, now, "move_to_dlq")
		s.toDLQ(q, j, reason, msg, true, now)
		s.b.stats.failed.Add(1)
		return
	}
	s.enqueue(q, j, now)
	s.emitStalled(q, j, now, "retry")
	s.b.persist(j)
}

// stallLapsed counts a stall against a job without a lock. When the job
// has used its attempts or stalled too often it answers the DLQ reason
// and error; else the job is set to run again after its backoff.
func stallLapsed(j *Job, c StallConfig, now int64) (reason, msg string) {
	toDLQ := (c.MaxStalls > 0 && j.cold().Stalls+1 >= c.MaxStalls) || j.Attempts+1 >= j.cold().MaxAttempts
	j.warm().Stalls++
	j.Attempts++
	j.setStartedAt(0)
	j.setHeartbeat(now)
	if toDLQ {
		if j.Attempts >= j.cold().MaxAttempts {
			return "max_attempts_exceeded", "Job stalled at max attempts (" + itoa(int64(j.cold().MaxAttempts)) + ")"
		}
		return "stalled", "Job stalled " + itoa(int64(j.cold().Stalls)) + " times"
	}
	j.addTimeline(TimelineEntry{State: StateFailed, At: now, Error: "stalled", HasErr: true, Attempt: j.Attempts})
	j.addTimeline(TimelineEntry{State: StateWaiting, At: now, Attempt: j.Attempts + 1})
	j.RunAt = now + backoffDelay(j)
	return "", ""
}

func (s *Shard) emitStalled(q *Queue, j *Job, now int64, action string) {
	s.emit(q, evStalled, j, now, evArgs{stallCount: j.cold().Stalls, action: action})
}

// deactivate takes an active job off its lease and frees its slot.
func (s *Shard) deactivate(q *Queue, j *Job) {
	s.leases.Remove(j)
	q.nActive--
	j.setLease(nil)
	j.untrack()
	if j.concSlot {
		j.concSlot = false
		if q.concActive > 0 {
			q.concActive--
		}
		q.wake(1)
	}
	if j.groupActive {
		s.groupReleased(q, j)
		q.wake(1)
	}
}

// ---------------------------------------------------------------------------
// Completed-job retention

func (s *Shard) addDone(q *Queue, j *Job) {
	j.state = StateCompleted
	j.dgen++
	s.done = append(s.done, doneEnt{j: j, gen: j.dgen})
	s.doneLive++
	q.nDone++
	if s.b.doneTotal.Add(1) > s.b.maxDone {
		select {
		case s.b.trimKick <- struct{}{}:
		default:
		}
	}
}

// trimmer keeps the completed jobs of the whole broker within
// maxCompleted, evicting the oldest first across shards, a tenth at a time
// as the reference does. It runs apart from the shards so that a shard
// never needs another shard's lock.
func (b *MemEngine) trimmer() {
	defer close(b.trimDone)
	for {
		select {
		case <-b.trimStop:
			return
		case <-b.trimKick:
		}
		for b.doneTotal.Load() > b.maxDone {
			excess := b.doneTotal.Load() - b.maxDone + b.maxDone/10
			// Find the shard holding the oldest completion, and the time of
			// the next oldest elsewhere: evict from the first up to there.
			var oldest *Shard
			first, second := int64(math.MaxInt64), int64(math.MaxInt64)
			for _, s := range b.shards {
				s.mu.Lock()
				at, ok := s.oldestDone()
				s.mu.Unlock()
				if !ok {
					continue
				}
				if at < first {
					oldest, first, second = s, at, first
				} else if at < second {
					second = at
				}
			}
			if oldest == nil {
				break
			}
			oldest.mu.Lock()
			oldest.evictDone(int(min(excess, 1000)), second)
			oldest.mu.Unlock()
		}
	}
}

// oldestDone is when the shard's oldest kept completion happened.
func (s *Shard) oldestDone() (int64, bool) {
	for s.doneHead < len(s.done) {
		if e := &s.done[s.doneHead]; s.doneLiveEnt(e) {
			return e.j.DoneAt(), true
		}
		s.done[s.doneHead] = doneEnt{}
		s.doneHead++
	}
	return 0, false
}

func (s *Shard) doneLiveEnt(e *doneEnt) bool {
	return e.j.state == StateCompleted && e.j.dgen == e.gen
}

// evictDone forgets up to n of the oldest completed jobs, stopping at one
// completed after until (but always evicting at least one).
func (s *Shard) evictDone(n int, until int64) {
	for evicted := 0; evicted < n && s.doneHead < len(s.done); {
		e := s.done[s.doneHead]
		if !s.doneLiveEnt(&e) {
			s.done[s.doneHead] = doneEnt{}
			s.doneHead++
			continue
		}
		if evicted > 0 && e.j.DoneAt() > until {
			break
		}
		s.done[s.doneHead] = doneEnt{}
		s.doneHead++
		q := s.queues[e.j.Queue]
		if q != nil {
			q.nDone--
		}
		s.doneLive--
		s.b.doneTotal.Add(-1)
		if s.b.hist != nil {
			s.retire(q, e.j) // its row stays on disk
		} else {
			s.forget(e.j)
		}
		evicted++
	}
	s.compactDone()
}

// undone takes a completed job out of retention (re-pushed, retried).
func (s *Shard) undone(q *Queue, j *Job) {
	if j.state != StateCompleted {
		return
	}
	j.dgen++
	j.state = StateNone
	s.doneLive--
	s.b.doneTotal.Add(-1)
	q.nDone--
	s.compactDone()
}

func (s *Shard) compactDone() {
	dead := len(s.done) - s.doneLive
	if s.doneHead > 1024 && s.doneHead > len(s.done)/2 || dead > 4096 && dead > s.doneLive {
		s.compactDoneNow()
	}
}

// compactDoneNow drops the completed list's stale entries.
func (s *Shard) compactDoneNow() {
	k := 0
	for i := s.doneHead; i < len(s.done); i++ {
		if s.doneLiveEnt(&s.done[i]) {
			s.done[k] = s.done[i]
			k++
		}
	}
	clear(s.done[k:])
	s.done = s.done[:k]
	s.doneHead = 0
}

// forget drops a job from the broker entirely.
func (s *Shard) forget(j *Job) {
	j.notifyDone(waitOutcome{err: "Job was removed"})
	s.leases.Remove(j)
	j.state = StateNone
	s.b.idxDel(j)
	s.b.dropResult(j.key())
	s.b.unpersist(j)
}

func itoa(v int64) string {
	var buf [20]byte
	i := len(buf)
	neg := v < 0
	if neg {
		v = -v
	}
	for {
		i--
		buf[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	if neg {
		i--
		buf[i] = '-'
	}
	return string(buf[i:])
}

// withJob runs fn on the job of that id with its shard locked, the lock
// released even if fn panics (a recovered handler must not leave a shard
// locked for good). It reports whether there was such a job.
func (b *MemEngine) withJob(id string, fn func(j *Job, s *Shard)) bool {
	j, s := b.lockJob(id)
	if j == nil {
		return false
	}
	defer s.mu.Unlock()
	fn(j, s)
	return true
}

// dropListed takes v out of the list m keeps under k, and the list out of
// m once it is empty: the registries of waiters kept as lists by key.
func dropListed[K, V comparable](m map[K][]V, k K, v V) {
	list := m[k]
	if i := slices.Index(list, v); i >= 0 {
		list = slices.Delete(list, i, i+1)
	}
	if len(list) == 0 {
		delete(m, k)
	} else {
		m[k] = list
	}
}

// locked runs fn holding mu, released even if fn panics.
func locked(mu sync.Locker, fn func()) {
	mu.Lock()
	defer mu.Unlock()
	fn()
}
