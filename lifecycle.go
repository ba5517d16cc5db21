package main

// The memory engine's job lifecycle (JobEngine): push, pull, ack, fail,
// leases and release on disconnect, on the shards (and written through to
// SQLite when a data file is set). pg_lifecycle.go answers the same in
// PostgreSQL mode.

import (
	"context"
	"math"
	"slices"
	"time"
)

// Pushed is a push's answer: the ids of its jobs (or, for a job not
// created, of the live job holding its custom id or unique key), or why it
// was refused. An engine that writes pushes in groups answers later: Wait
// is then set, and blocks until the jobs are written.
type Pushed struct {
	IDs []string
	// Made counts the jobs created; the others were already there (a
	// custom id or unique key held by a live job).
	Made int
	Err  error
	Wait func() (ids []string, made int, err error)
}

// PullAnswer takes a pull's claimed jobs (and, when the pull had an
// owner, their lock tokens, index by index). The memory engine calls it
// under the shard lock, while nothing else can change the jobs: it must
// not call the engine.
type PullAnswer func(jobs []*Job, tokens []string)

// PullWait waits for jobs to claim, up to the pull's timeout, and hands
// them to answer (not called when none came). It reports how long it
// slept waiting for a job, which is not the server's work.
type PullWait func(answer PullAnswer) (waited time.Duration, err error)

// renewals are the locks one renewal command names, index by index; a
// duration of 0 keeps the lock's own TTL.
type renewals struct {
	ids, tokens []string
	durations   []int64
}

// ---------------------------------------------------------------------------
// Push

// PushResult is the id given back for one admitted (or deduplicated) job,
// or why it was refused.
type PushResult struct {
	ID  string
	Dup bool
	Err error
}

// Push checks the jobs' dependencies, repeat and parent links, admits
// them and links the children to their parents.
func (b *MemEngine) Push(_ context.Context, queue string, jobs []*Job, batch bool) Pushed {
	var byID map[string]*Job
	if batch {
		byID = customIDBatch(jobs)
	}
	parents, err := b.pushChecks(jobs, byID)
	if err != nil {
		return Pushed{Err: err}
	}
	if err := b.admit(); err != nil {
		return Pushed{Err: err}
	}
	res := b.pushJobs(queue, jobs, byID)
	for i, p := range res {
		if parents != nil && parents[i] != "" && p.Err == nil && !p.Dup {
			b.linkChild(parents[i], jobs[i])
		}
	}
	if len(res) > 0 && res[len(res)-1].Err != nil {
		return Pushed{Err: res[len(res)-1].Err}
	}
	if err := b.syncDurable(jobs); err != nil {
		return Pushed{Err: err}
	}
	ids := make([]string, len(res))
	made := 0
	for i, p := range res {
		ids[i] = p.ID
		if !p.Dup {
			made++
		}
	}
	return Pushed{IDs: ids, Made: made}
}

// pushChecks refuses a job whose dependencies are missing, whose repeat
// is invalid or whose parent cannot take it (a *jobErr), and answers the
// parents of those that have one, by index (nil when none has).
func (b *MemEngine) pushChecks(jobs []*Job, byID map[string]*Job) ([]string, error) {
	var parents []string
	for i, j := range jobs {
		if err := b.depsExist(j, byID); err != nil {
			return nil, &jobErr{i, err}
		}
		if err := validateRepeat(j); err != nil {
			return nil, &jobErr{i, err}
		}
		if pid, pq, ok := parentLink(j); ok {
			if err := b.checkLinkable(pid, pq, j.ID()); err != nil {
				return nil, &jobErr{i, err}
			}
			if parents == nil {
				parents = make([]string, len(jobs))
			}
			parents[i] = pid
		}
	}
	return parents, nil
}

// pushJobs admits jobs, already checked, into one queue, in order. A job
// whose custom id or unique key is held by a live job is not created; its
// result names the holder. batch holds the jobs of the push by custom id,
// which others of it may depend on.
func (b *MemEngine) pushJobs(queue string, jobs []*Job, batch map[string]*Job) []PushResult {
	defer b.lat.push.since(time.Now())
	out := make([]PushResult, len(jobs))
	// A custom id held by a completed or dead-lettered job is freed before
	// the queue's shard is locked: that job may live in another shard.
	for _, j := range jobs {
		if j.cold().CustomID != "" {
			b.freeCustomID(j.cold().CustomID)
		}
	}
	s := b.shardOf(queue)
	s.with(func() {
		now := b.now()
		q, err := s.queueFor(queue)
		if err != nil {
			out = []PushResult{{Err: err}}
			return
		}
		q.listed = true
		s.promote(now)
		// A batch that would overflow a group's maxSize is refused whole,
		// before anything is admitted.
		if err := q.groupRoom(jobs); err != nil {
			out = []PushResult{{Err: err}}
			return
		}
		for i, j := range jobs {
			// Jobs are taken in order until one is refused, as the
			// reference does (the accepted prefix stays).
			if out[i] = s.admit(q, j, now, batch); out[i].Err != nil {
				out = out[:i+1]
				return
			}
		}
	})
	return out
}

func (s *Shard) admit(q *Queue, j *Job, now int64, batch map[string]*Job) PushResult {
	if j.cold().CustomID != "" {
		if h := s.b.idxHolder(j); h != nil {
			if s.b.shardOf(h.Queue) != s {
				// Held in another shard; it was live a moment ago.
				return PushResult{ID: h.ID(), Dup: true}
			}
			switch h.state {
			case StateCompleted, StateFailed:
				s.dropRecord(s.queues[h.Queue], h)
			default:
				return PushResult{ID: h.ID(), Dup: true}
			}
		}
	}
	dup, ok, err := s.dedupCheck(q, j, now)
	if err != nil {
		return PushResult{Err: err}
	}
	if ok && j.cold().GroupID != "" && j.cold().groupMax > 0 {
		if g := q.groups[j.cold().GroupID]; g != nil && int64(g.queued) >= j.cold().groupMax {
			return PushResult{Err: errGroupFull(j)}
		}
	}
	if !ok {
		return PushResult{ID: dup, Dup: true}
	}
	j.seq = s.b.seq.Add(1)
	if prev := s.b.idxPut(j); prev != nil {
		return PushResult{ID: prev.ID(), Dup: true}
	}
	s.holdUnique(q, j)
	if len(j.cold().DependsOn) > 0 {
		j.pending = s.b.registerDeps(j, batch)
	}
	s.placeNew(q, j, now)
	s.b.stats.pushed.Add(1)
	s.emit(q, evPushed, j, now, evArgs{})
	if j.pending > 0 {
		s.b.announce(noticeWaitingChildren(q.name, j))
	}
	s.b.persist(j)
	return PushResult{ID: j.ID()}
}

// freeCustomID removes a finished job that still holds id, so that a new
// job may take the id.
func (b *MemEngine) freeCustomID(id string) {
	b.withJob(id, func(j *Job, s *Shard) {
		if j.state == StateCompleted || j.state == StateFailed {
			s.dropRecord(s.queues[j.Queue], j)
		}
	})
}

// dropRecord removes a completed or dead-lettered job's record.
func (s *Shard) dropRecord(q *Queue, j *Job) {
	switch j.state {
	case StateCompleted:
		s.undone(q, j)
	case StateFailed:
		q.removeDLQ(j)
	}
	s.forget(j)
}

// customIDBatch names the jobs of a batch with custom ids, which others of
// the batch may depend on.
func customIDBatch(jobs []*Job) map[string]*Job {
	var batch map[string]*Job
	for _, j := range jobs {
		if j.cold().CustomID != "" {
			if batch == nil {
				batch = map[string]*Job{}
			}
			batch[j.cold().CustomID] = j
		}
	}
	return batch
}

// ---------------------------------------------------------------------------
// Pull

// claim takes up to n ready jobs from q and makes them active. It runs with
// s.mu held; tokens is parallel to jobs when an owner is given.
func (s *Shard) claim(q *Queue, n int, o PullOpts, now int64, jobs []*Job, tokens []string) ([]*Job, []string) {
	s.promote(now)
	if q.paused {
		return jobs, tokens
	}
	var bytes int64 // the answer's jobs so far (pullFits)
	for len(jobs) < n && q.nReady > 0 && pullFits(bytes, o.Limit) {
		if !q.admitOne(now) {
			if s.b.refusalDue(q.name, now) {
				s.b.announce(noticeQueue(q.refusal(now), q.name))
			}
			break
		}
		j := s.pickReady(q, o.Group, now)
		if j == nil {
			// Only groups held back by this pull's own limits are left.
			if q.rate != nil {
				q.rate.giveBack()
			}
			break
		}
		q.nReady--
		if j.Priority > 0 {
			q.nPrio--
		}
		if ttlExpired(j, now) {
			// Expired while waiting: dropped with no job event, as the
			// reference does (job:expired tells the live streams); the
			// token it took goes back.
			if q.rate != nil {
				q.rate.giveBack()
			}
			s.groupReleased(q, j)
			s.releaseUnique(q, j)
			s.forget(j)
			s.b.announce(noticeExpired(q.name, j, now))
			continue
		}
		if q.concLimit != nil {
			q.concActive++
			j.concSlot = true
		}
		if j.Attempts == 0 {
			// Retries are left out: their wait is the backoff, not the
			// queue's backlog.
			s.b.lat.wait.ObserveMs(now - j.CreatedAt)
		}
		var l *Lease
		if o.Owner != "" {
			l = pullLease(o, newID(), now)
			tokens = append(tokens, l.Token)
		}
		takeJob(j, now, l)
		q.nActive++
		if o.Conn != nil && !o.Detach {
			o.Conn.track(j)
		}
		s.watch(q, j, now)
		bytes += jobWireBound(j, nil)
		jobs = append(jobs, j)
		s.b.stats.pulled.Add(1)
		s.emit(q, evPulled, j, now, evArgs{})
		s.b.persist(j)
	}
	return jobs, tokens
}

// Pull claims at once. When nothing was claimed and the pull may wait, it
// answers a PullWait that waits for a job on the queue's waiters.
func (b *MemEngine) Pull(ctx context.Context, queue string, n int, o PullOpts, timeout int64, answer PullAnswer) (PullWait, error) {
	b.throttle()
	if claimed, _ := b.pull(ctx, queue, n, o, 0, false, answer); claimed || timeout <= 0 {
		return nil, nil
	}
	return func(answer PullAnswer) (time.Duration, error) {
		_, waited := b.pull(ctx, queue, n, o, timeout, true, answer)
		return waited, nil
	}, nil
}

// pull claims up to n jobs from queue, waiting up to timeout ms for some
// when wait is set, and hands them to answer. It reports whether it
// claimed any, and how long it slept waiting for a job.
func (b *MemEngine) pull(ctx context.Context, queue string, n int, o PullOpts, timeout int64, wait bool,
	answer PullAnswer) (claimed bool, waited time.Duration) {
	s := b.shardOf(queue)
	var deadline time.Time
	if wait {
		deadline = time.Now().Add(time.Duration(timeout) * time.Millisecond)
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if o.Conn != nil && o.Conn.closed.Load() {
			return false, waited
		}
		w, retryIn, claimed, done := b.pullLook(s, queue, n, o, wait, deadline, answer)
		if done {
			return claimed, waited
		}
		left := min(time.Until(deadline), retryIn)
		if timer == nil {
			timer = time.NewTimer(left)
		} else {
			timer.Reset(left)
		}
		woken := false
		slept := time.Now()
		select {
		case <-w.ch:
			woken = true
		case <-timer.C:
		case <-ctx.Done():
		}
		waited += time.Since(slept)
		s.leaveWait(ctx, queue, w, woken)
		if ctx.Err() != nil {
			return false, waited
		}
	}
}

// pullLook claims what it can of queue under the shard lock, answering
// from there (jobs are encoded while nothing else can change them). When
// nothing was claimed and the pull may wait still (done false), it has
// queued w on the queue, and a limit holding jobs back may let it look
// again after retryIn.
func (b *MemEngine) pullLook(s *Shard, queue string, n int, o PullOpts, wait bool, deadline time.Time,
	answer PullAnswer) (w *waiter, retryIn time.Duration, claimed, done bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := b.now()
	q := s.queues[queue]
	if q == nil {
		if !wait {
			return nil, 0, false, true
		}
		var err error
		if q, err = s.queueFor(queue); err != nil {
			// No room for another queue to wait on: answered empty.
			return nil, 0, false, true
		}
	}
	if jobs, tokens := s.claim(q, n, o, now, nil, nil); len(jobs) > 0 {
		answer(jobs, tokens)
		return nil, 0, true, true
	}
	if !wait || time.Until(deadline) <= 0 || s.closed {
		return nil, 0, false, true
	}
	retryIn = time.Duration(math.MaxInt64)
	if q.nReady > 0 {
		// Held back by a limit, not an empty queue: look again when a
		// token is due or a group's window opens.
		if w := min(q.limitWait(now), q.groupWait(now)); w < math.MaxInt64/int64(time.Millisecond) {
			retryIn = time.Duration(w) * time.Millisecond
		}
	}
	w = &waiter{ch: make(chan struct{}, 1)}
	q.waiters = append(q.waiters, w)
	b.pullsWaiting.Add(1)
	return w, retryIn, false, false
}

// leaveWait takes a poll's waiter off the queue. A wake-up meant for a job
// must not be lost: if this poll got one but is leaving without claiming
// (its connection went), it passes it on.
func (s *Shard) leaveWait(ctx context.Context, queue string, w *waiter, woken bool) {
	s.b.pullsWaiting.Add(-1)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[queue]
	if q == nil {
		return
	}
	q.dropWaiter(w)
	if !woken {
		select {
		case <-w.ch:
			woken = true
		default:
		}
	}
	if woken && ctx.Err() != nil {
		q.wake(1)
	}
}

// ---------------------------------------------------------------------------
// ACK and FAIL

// Waits: an ACK or a FAIL is answered from memory; SQLite mode writes it
// behind the answer (sqlite.go).
func (b *MemEngine) Waits() bool { return false }

// Ack completes one job.
func (b *MemEngine) Ack(_ context.Context, it AckItem) (Outcome, error) {
	b.throttle()
	return b.ackOne(it)
}

// ackOne is Ack without the store's throttle.
func (b *MemEngine) ackOne(it AckItem) (Outcome, error) {
	defer b.lat.ack.since(time.Now())
	j, s := b.lockJob(it.ID)
	if j == nil {
		return finishFence(b.finishFacts(it.ID, it.Token, nil), false)
	}
	defer s.mu.Unlock()
	return s.ack(j, it, b.now())
}

// finishFacts are what the memory engine knows of j (nil: not found) for
// finishFence (rule_failure.go): the tokens a job timeout ended, not a
// queued job's last token.
func (b *MemEngine) finishFacts(id, token string, j *Job) finishFacts {
	f := finishFacts{id: id, token: token, retired: b}
	if j != nil {
		// id is j's: lockJob finds a job only by its id's one spelling.
		f.found, f.state, f.attempts = true, j.state, j.Attempts
		if l := j.run().lease; l != nil && j.state == StateActive {
			f.leaseOwned, f.leaseToken = true, l.Token
		}
	}
	return f
}

func (s *Shard) ack(j *Job, it AckItem, now int64) (Outcome, error) {
	if out, err := finishFence(s.b.finishFacts(it.ID, it.Token, j), false); out != Applied || err != nil {
		return out, err
	}
	q := s.queues[j.Queue]
	if j.state == StateActive {
		s.deactivate(q, j)
	} else {
		// Back in the queue (finishFence let the worker finish after
		// all): out of it.
		s.unqueue(q, j)
	}
	s.complete(q, j, it, now)
	return Applied, nil
}

func (s *Shard) complete(q *Queue, j *Job, it AckItem, now int64) {
	s.releaseUnique(q, j)
	s.b.stats.completed.Add(1)
	if j.StartedAt() > 0 {
		s.b.lat.proc.ObserveMs(now - j.StartedAt())
	}
	j.setDoneAt(now)
	if j.c != nil {
		j.c.hasFail = false // through warm(), every completed job would carry a cold part
	}
	res := it.Result
	if !it.HasResult {
		res = nil
	}
	j.notifyDone(waitOutcome{completed: true, result: res, hasResult: it.HasResult})
	s.completedDeps(j, res, j.cold().RemoveOnComplete || it.Remove)
	if j.cold().RemoveOnComplete || it.Remove {
		s.forget(j)
	} else {
		j.addTimeline(TimelineEntry{State: StateCompleted, At: now})
		if it.HasResult {
			s.b.setResult(j.key(), it.Result)
		}
		s.addDone(q, j)
		if s.b.store != nil {
			s.b.store.JobChanged(j, res)
		}
	}
	s.emit(q, evCompleted, j, now, evArgs{data: res, undefData: !it.HasResult})
	if j.cold().Repeat != nil {
		if n := repeatSuccessor(j, now); n != nil {
			// Weighed, never refused: a refusal would end the schedule
			// (memlimit.go, admitRequest).
			s.b.mem.took(jobMemBytes([]*Job{n}))
			s.admit(q, n, now, nil)
		}
	}
}

// AckBatch completes many jobs, locking each shard once. It returns the
// indexes of the items that did not apply.
func (b *MemEngine) AckBatch(_ context.Context, items []AckItem) ([]int, error) {
	b.throttle()
	defer b.lat.ack.since(time.Now())
	var ignored []int
	byShard := make([][]int, len(b.shards))
	for i := range items {
		j := b.idxGet(items[i].ID)
		if j == nil {
			ignored = append(ignored, i)
			continue
		}
		k := fnv1a(j.Queue) & b.mask
		byShard[k] = append(byShard[k], i)
	}
	for k, list := range byShard {
		if len(list) == 0 {
			continue
		}
		s := b.shards[k]
		s.with(func() {
			now := b.now()
			for _, i := range list {
				j := b.idxGet(items[i].ID)
				if j == nil || b.shardOf(j.Queue) != s {
					// Replaced in between; take the slow path below.
					ignored = append(ignored, -1-i)
					continue
				}
				if out, err := s.ack(j, items[i], now); err != nil || out != Applied {
					ignored = append(ignored, i)
				}
			}
		})
	}
	// Items whose job moved shard while we looked are retried one by one.
	final := ignored[:0]
	for _, i := range ignored {
		if i < 0 {
			i = -1 - i
			if out, err := b.ackOne(items[i]); err == nil && out == Applied {
				continue
			}
		}
		final = append(final, i)
	}
	slices.Sort(final)
	return final, nil
}

// Fail records a failed attempt of one job.
func (b *MemEngine) Fail(_ context.Context, id, token string, f failure) (Outcome, error) {
	b.throttle()
	j, s := b.lockJob(id)
	if j == nil {
		return finishFence(b.finishFacts(id, token, nil), true)
	}
	defer s.mu.Unlock()
	now := b.now()
	q := s.queues[j.Queue]
	if out, err := finishFence(b.finishFacts(id, token, j), true); out != Applied || err != nil {
		return out, err
	}
	if err := f.check(j); err != nil {
		return Applied, err
	}
	s.fail(q, j, f, now)
	return Applied, nil
}

// fail applies a failure to an active job: retry with backoff, or the
// end (removed, or the DLQ).
func (s *Shard) fail(q *Queue, j *Job, f failure, now int64) {
	s.deactivate(q, j)
	retry, reason := failedAttempt(j, f, now)
	s.releaseUnique(q, j)
	if retry {
		s.enqueue(q, j, now)
		s.emit(q, evFailed, j, now, evArgs{err: f.err, hasErr: f.hasErr, terminal: false, hasTerminal: true})
		s.emit(q, evRetried, j, now, evArgs{prev: "failed"})
		s.b.persist(j)
		return
	}
	s.b.stats.failed.Add(1)
	if j.cold().RemoveOnFail || f.removeOnFail {
		j.notifyDone(waitOutcome{err: f.err})
		s.childFailed(j, f.err)
		s.forget(j)
	} else {
		s.toDLQ(q, j, reason, f.err, f.hasErr, now)
	}
	s.emit(q, evFailed, j, now, evArgs{err: f.err, hasErr: f.hasErr, terminal: true, hasTerminal: true})
}

// ---------------------------------------------------------------------------
// Leases

// renew extends a job's lock; s.mu is held. ttl 0 keeps the lock's own.
func (s *Shard) renew(j *Job, token string, ttl, now int64) bool {
	l := j.run().lease
	if l == nil || (token != "" && token != l.Token) || j.state != StateActive {
		return false
	}
	if ttl <= 0 {
		ttl = l.TTL
	}
	l.ExpiresAt = now + ttl
	l.Renewals++
	j.setHeartbeat(now)
	s.rewatch(j, now)
	return true
}

// rewatch brings a job's timer entry forward when its deadline moved
// earlier; a later deadline is found lazily when the old entry comes due.
func (s *Shard) rewatch(j *Job, now int64) {
	q := s.queues[j.Queue]
	if d := s.deadline(q, j); d < j.run().deadline {
		s.watch(q, j, now)
	}
}

// heartbeat marks an active job alive, renewing its lock when token
// names it.
func (b *MemEngine) heartbeat(id, token string, duration int64) bool {
	j, s := b.lockJob(id)
	if j == nil {
		return false
	}
	defer s.mu.Unlock()
	now := b.now()
	if j.state != StateActive {
		return false
	}
	if token != "" {
		return s.renew(j, token, duration, now)
	}
	j.setHeartbeat(now)
	return true
}

// extendLock renews a lock; without a token, whatever lock the job has.
func (b *MemEngine) extendLock(id, token string, duration int64) bool {
	j, s := b.lockJob(id)
	if j == nil {
		return false
	}
	defer s.mu.Unlock()
	if j.run().lease == nil {
		return false
	}
	if token == "" {
		token = j.run().lease.Token
	}
	return s.renew(j, token, duration, b.now())
}

// Heartbeat marks each job of rn alive (renewing its lock when a token
// names it) and answers how many it found.
func (b *MemEngine) Heartbeat(_ context.Context, rn renewals) (int, error) {
	n := 0
	for i, id := range rn.ids {
		if b.heartbeat(id, rn.tokens[i], rn.durations[i]) {
			n++
		}
	}
	return n, nil
}

// ExtendLocks renews the locks of rn and answers how many it renewed.
func (b *MemEngine) ExtendLocks(_ context.Context, rn renewals) (int, error) {
	n := 0
	for i, id := range rn.ids {
		if b.extendLock(id, rn.tokens[i], rn.durations[i]) {
			n++
		}
	}
	return n, nil
}

// ---------------------------------------------------------------------------
// Release on disconnect

// Release puts back the jobs a dropped connection held, except those whose
// lease was renewed: a worker that renewed is trusted to be alive elsewhere
// (another connection of its pool) until its lock runs out.
func (b *MemEngine) Release(_ context.Context, c *conn) {
	held := c.takeHeld()
	for _, j := range held {
		s := b.shardOf(j.Queue)
		s.with(func() {
			if j.run().owner != c || j.state != StateActive || b.idxHolder(j) != j {
				return // finished, or already back, in the meantime
			}
			j.setOwner(nil)
			if j.run().lease != nil && j.run().lease.Renewals > 0 {
				return
			}
			q := s.queues[j.Queue]
			now := b.now()
			s.leases.Remove(j)
			q.nActive--
			j.setLease(nil)
			j.setStartedAt(0)
			j.setHeartbeat(now)
			s.releaseUnique(q, j)
			s.enqueue(q, j, now)
			b.persist(j)
		})
	}
}
