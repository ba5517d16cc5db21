package main

// The broker: the operations commands call, on top of the shards.

import (
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Broker holds every queue, job and registry of one server.
type Broker struct {
	shards []*Shard
	mask   uint32
	idx    [idxParts]idxPart

	// Completed jobs kept, across shards; past maxCompleted the trimmer
	// evicts the oldest tenth.
	doneTotal atomic.Int64
	trimKick  chan struct{}
	trimStop  chan struct{}
	trimDone  chan struct{}

	rmu     sync.Mutex
	results *LRU[string, Raw]
	lmu     sync.Mutex
	logs    *LRU[string, []LogEntry]
	tmu     sync.Mutex
	retired *LRU[string, struct{}] // lease tokens ended by a job timeout

	workers *Workers
	store   Store

	// nQueues counts the queues of every shard; maxQueues bounds them
	// (--max-queues; 0: no limit).
	nQueues   atomic.Int64
	maxQueues int
	// pgStatus reports the database in PostgreSQL mode, where there is
	// no store.
	pgStatus func() StorageState

	tapMu sync.Mutex
	taps  atomic.Pointer[[]Tap]

	flowState

	cron *CronScheduler
	log  *slog.Logger

	now     func() int64
	started int64
	stats   struct {
		pushed, pulled, completed, failed atomic.Int64
	}
	lat latencies
	// rates is the last ten minutes of the counters above, for the
	// dashboard (throughput.go).
	rates *rateHistory
	seq   atomic.Int64
}

// Bounds, as the reference has them.
const (
	maxCompleted   = 50000
	maxResults     = 10000
	maxLogJobs     = 10000
	maxLogsPerJob  = 100
	maxRetired     = 10000
	maxPullBatch   = 1000
	maxPullTimeout = 60000
	maxWaitTimeout = 600000
	// defaultMaxQueues is --max-queues' default.
	defaultMaxQueues = 10000
)

// LogEntry is one line of a job's log.
type LogEntry struct {
	At      int64
	Level   string
	Message Raw
}

func NewBroker(shards int, store Store) *Broker {
	if shards < 1 {
		shards = defaultShards()
	}
	b := &Broker{
		shards:    make([]*Shard, shards),
		mask:      uint32(shards - 1),
		results:   NewLRU[string, Raw](maxResults, nil),
		retired:   NewLRU[string, struct{}](maxRetired, nil),
		store:     store,
		now:       nowMs,
		maxQueues: defaultMaxQueues,
		lat:       newLatencies(),
	}
	// Logs pushed out of the cache are gone from storage too, so the two
	// agree after a restart.
	b.logs = NewLRU[string, []LogEntry](maxLogJobs, func(id string, _ []LogEntry) { b.logsChanged(id, nil) })
	b.logs.SetBudget(maxLogsBytes, logsBytes)
	b.workers = newWorkers(func() int64 { return b.now() })
	b.results.SetBudget(maxResultsBytes, func(r Raw) int64 { return int64(len(r)) })
	b.trimKick, b.trimStop, b.trimDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	for i := range b.idx {
		b.idx[i].m = make(map[string]*Job)
	}
	for i := range b.shards {
		s := &Shard{b: b, id: i, queues: make(map[string]*Queue), delayed: newHeap(heapPlace),
			leases: newHeap(heapLease), subs: make(map[string][]*conn)}
		s.startTimer()
		b.shards[i] = s
	}
	b.started = b.now()
	b.log = slog.New(slog.DiscardHandler)
	go b.trimmer()
	b.rates = newRateHistory(func() [4]int64 {
		return [4]int64{b.stats.pushed.Load(), b.stats.pulled.Load(), b.stats.completed.Load(), b.stats.failed.Load()}
	})
	b.rates.start()
	b.startFlows()
	b.startCron()
	return b
}

// Close stops every shard timer, the trimmer and the rate sampler, and
// wakes every waiter so that long polls end. It is safe to call more than
// once.
func (b *Broker) Close() {
	select {
	case <-b.trimStop:
	default:
		close(b.trimStop)
		<-b.trimDone
	}
	b.rates.close()
	b.stopFlows()
	b.cron.Stop()
	for _, s := range b.shards {
		s.mu.Lock()
		s.closed = true
		s.timer.Stop()
		for _, q := range s.queues {
			q.wakeAll()
		}
		s.mu.Unlock()
	}
}

// ---------------------------------------------------------------------------
// Results, logs, retired tokens

func (b *Broker) setResult(id string, r Raw) {
	locked(&b.rmu, func() {
		b.results.Put(id, r)
	})
}

func (b *Broker) getResult(id string) (Raw, bool) {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	return b.results.Get(id)
}

func (b *Broker) dropResult(id string) {
	locked(&b.rmu, func() {
		b.results.Delete(id)
	})
}

func (b *Broker) retire(j *Job) {
	if j.lease == nil {
		return
	}
	locked(&b.tmu, func() {
		b.retired.Put(j.lease.Token, struct{}{})
	})
}

func (b *Broker) isRetired(token string) bool {
	if token == "" {
		return false
	}
	b.tmu.Lock()
	defer b.tmu.Unlock()
	_, ok := b.retired.Peek(token)
	return ok
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

// Push admits jobs, already validated, into one queue, in order. A job
// whose custom id or unique key is held by a live job is not created; its
// result names the holder.
func (b *Broker) Push(queue string, jobs []*Job) []PushResult {
	return b.PushWith(queue, jobs, nil)
}

// PushWith is Push with the batch's jobs by custom id, which jobs of the
// batch may depend on.
func (b *Broker) PushWith(queue string, jobs []*Job, batch map[string]*Job) []PushResult {
	defer b.lat.push.since(time.Now())
	out := make([]PushResult, len(jobs))
	// A custom id held by a completed or dead-lettered job is freed before
	// the queue's shard is locked: that job may live in another shard.
	for _, j := range jobs {
		if j.CustomID != "" {
			b.freeCustomID(j.CustomID)
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
	if j.CustomID != "" {
		if h := s.b.idxGet(j.ID); h != nil {
			if s.b.shardOf(h.Queue) != s {
				// Held in another shard; it was live a moment ago.
				return PushResult{ID: h.ID, Dup: true}
			}
			switch h.state {
			case StateCompleted, StateFailed:
				s.dropRecord(s.queues[h.Queue], h)
			default:
				return PushResult{ID: h.ID, Dup: true}
			}
		}
	}
	dup, ok, err := s.dedupCheck(q, j, now)
	if err != nil {
		return PushResult{Err: err}
	}
	if ok && j.GroupID != "" && j.groupMax > 0 {
		if g := q.groups[j.GroupID]; g != nil && int64(g.queued) >= j.groupMax {
			return PushResult{Err: errors.New("Group " + j.GroupID + " has reached its maximum size of " + itoa(j.groupMax))}
		}
	}
	if !ok {
		return PushResult{ID: dup, Dup: true}
	}
	j.seq = s.b.seq.Add(1)
	if prev := s.b.idxPut(j); prev != nil {
		return PushResult{ID: prev.ID, Dup: true}
	}
	s.holdUnique(q, j)
	if len(j.DependsOn) > 0 {
		j.pending = s.b.registerDeps(j, batch)
	}
	s.placeNew(q, j, now)
	s.b.stats.pushed.Add(1)
	s.emit(q, evPushed, j, now, evArgs{})
	s.b.persist(j)
	return PushResult{ID: j.ID}
}

// freeCustomID removes a finished job that still holds id, so that a new
// job may take the id.
func (b *Broker) freeCustomID(id string) {
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

// ---------------------------------------------------------------------------
// Pull

// PullOpts says how jobs are claimed.
type PullOpts struct {
	Owner  string
	TTL    int64
	Conn   *conn // tracked for release when the connection drops
	Detach bool
	Group  *groupPull
}

// claim takes up to n ready jobs from q and makes them active. It runs with
// s.mu held; tokens is parallel to jobs when an owner is given.
func (s *Shard) claim(q *Queue, n int, o PullOpts, now int64, jobs []*Job, tokens []string) ([]*Job, []string) {
	s.promote(now)
	if q.paused {
		return jobs, tokens
	}
	for len(jobs) < n && q.nReady > 0 {
		if !q.admitOne(now) {
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
		if j.TTL != none && j.TTL > 0 && now > j.CreatedAt+j.TTL {
			// Expired while waiting: dropped without an event, as the
			// reference does; the token it took goes back.
			if q.rate != nil {
				q.rate.giveBack()
			}
			s.groupReleased(q, j)
			s.releaseUnique(q, j)
			s.forget(j)
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
		j.state = StateActive
		j.StartedAt = now
		j.Heartbeat = now
		j.addTimeline(TimelineEntry{State: "active", At: now})
		q.nActive++
		if o.Owner != "" {
			ttl := o.TTL
			if ttl <= 0 {
				ttl = defaultLockTTL
			}
			j.lease = &Lease{Token: newID(), Owner: o.Owner, CreatedAt: now, ExpiresAt: now + ttl, TTL: ttl}
			tokens = append(tokens, j.lease.Token)
		}
		if o.Conn != nil && !o.Detach {
			o.Conn.track(j)
		}
		s.watch(q, j, now)
		jobs = append(jobs, j)
		s.b.stats.pulled.Add(1)
		s.emit(q, evPulled, j, now, evArgs{})
		s.b.persist(j)
	}
	return jobs, tokens
}

// ---------------------------------------------------------------------------
// ACK and FAIL

// Outcome of an ACK or FAIL that did not apply but is not an error.
type Outcome uint8

const (
	Applied Outcome = iota
	AlreadyFinalized
)

var errNotProcessing = "Job not found or not in processing state: "

// checkLease applies the reference's lease rules to an ACK or FAIL of an
// active job: with a lock, the token must be given and match.
func checkLease(j *Job, token string) error {
	if j.lease == nil {
		return nil
	}
	if token == "" {
		return errors.New("Lock token required for job " + j.ID)
	}
	if token != j.lease.Token {
		return errors.New("Invalid or expired lock token for job " + j.ID)
	}
	return nil
}

// AckItem is one acknowledgement.
type AckItem struct {
	ID        string
	Token     string
	Result    Raw
	HasResult bool
	Remove    bool
}

// Ack completes one job.
func (b *Broker) Ack(it AckItem) (Outcome, error) {
	defer b.lat.ack.since(time.Now())
	j, s := b.lockJob(it.ID)
	if j == nil {
		if b.isRetired(it.Token) {
			return AlreadyFinalized, nil
		}
		return Applied, errors.New(errNotProcessing + it.ID)
	}
	defer s.mu.Unlock()
	return s.ack(j, it, b.now())
}

func (s *Shard) ack(j *Job, it AckItem, now int64) (Outcome, error) {
	q := s.queues[j.Queue]
	switch j.state {
	case StateActive:
		if err := checkLease(j, it.Token); err != nil {
			if j.lease != nil && it.Token != "" && s.b.isRetired(it.Token) {
				return AlreadyFinalized, nil
			}
			return Applied, err
		}
		s.deactivate(q, j)
	case StateWaiting, StatePrioritized, StateDelayed:
		if s.b.isRetired(it.Token) {
			return AlreadyFinalized, nil
		}
		if j.Attempts == 0 {
			return Applied, errors.New(errNotProcessing + j.ID)
		}
		// A worker whose lease ran out (or whose failure was retried)
		// finished the job after all: its work is kept, as the reference
		// keeps it, rather than running the job again.
		s.unqueue(q, j)
	default:
		if s.b.isRetired(it.Token) {
			return AlreadyFinalized, nil
		}
		return Applied, errors.New(errNotProcessing + j.ID)
	}
	s.complete(q, j, it, now)
	return Applied, nil
}

func (s *Shard) complete(q *Queue, j *Job, it AckItem, now int64) {
	s.releaseUnique(q, j)
	s.b.stats.completed.Add(1)
	if j.StartedAt > 0 {
		s.b.lat.proc.ObserveMs(now - j.StartedAt)
	}
	j.DoneAt = now
	j.hasFail = false
	res := it.Result
	if !it.HasResult {
		res = nil
	}
	j.notifyDone(waitOutcome{completed: true, result: res, hasResult: it.HasResult})
	s.completedDeps(j, res, j.RemoveOnC || it.Remove)
	if j.RemoveOnC || it.Remove {
		s.forget(j)
	} else {
		j.addTimeline(TimelineEntry{State: "completed", At: now})
		if it.HasResult {
			s.b.setResult(j.ID, it.Result)
		}
		s.addDone(q, j)
		if s.b.store != nil {
			s.b.store.JobChanged(j, res)
		}
	}
	s.emit(q, evCompleted, j, now, evArgs{data: res, undefData: !it.HasResult})
	if j.Repeat != nil {
		if n := repeatSuccessor(j, now); n != nil {
			s.admit(q, n, now, nil)
		}
	}
}

// failure describes why an active job failed.
type failure struct {
	err           string
	hasErr        bool
	stack         []string
	unrecoverable bool
	removeOnFail  bool
	reason        string // DLQ reason when terminal
}

// Fail records a failed attempt of one job.
func (b *Broker) Fail(id, token string, f failure) (Outcome, error) {
	j, s := b.lockJob(id)
	if j == nil {
		if b.isRetired(token) {
			return AlreadyFinalized, nil
		}
		return Applied, errors.New(errNotProcessing + id)
	}
	defer s.mu.Unlock()
	now := b.now()
	q := s.queues[j.Queue]
	switch j.state {
	case StateActive:
		if err := checkLease(j, token); err != nil {
			if token != "" && b.isRetired(token) {
				return AlreadyFinalized, nil
			}
			return Applied, err
		}
	case StateWaiting, StatePrioritized, StateDelayed:
		// The attempt this FAIL speaks of has already been accounted for
		// (lease expired, or retried): nothing more to do.
		if b.isRetired(token) || (token != "" && j.Attempts > 0) {
			return AlreadyFinalized, nil
		}
		return Applied, errors.New(errNotProcessing + id)
	default:
		if b.isRetired(token) {
			return AlreadyFinalized, nil
		}
		return Applied, errors.New(errNotProcessing + id)
	}
	if err := f.check(j); err != nil {
		return Applied, err
	}
	if f.reason == "" {
		f.reason = "max_attempts_exceeded"
	}
	s.fail(q, j, f, now)
	return Applied, nil
}

// fail applies a failure to an active job: retry with backoff, or the
// end (removed, or the DLQ).
func (s *Shard) fail(q *Queue, j *Job, f failure, now int64) {
	startedAt := j.StartedAt
	s.deactivate(q, j)
	j.Attempts++
	if len(f.stack) > 0 {
		j.Stack = normalizeStack(f.stack, int(j.StackLim))
	}
	j.addTimeline(TimelineEntry{State: "failed", At: now, Error: f.err, HasErr: f.hasErr, Attempt: j.Attempts})
	s.releaseUnique(q, j)
	retry := !f.unrecoverable && j.Attempts < j.MaxAtt
	// The attempt record says why this attempt ended; the last one of a
	// job that is given up carries the DLQ reason.
	reason := "explicit_fail"
	if f.reason == "timeout" || !retry {
		reason = f.reason
	}
	j.recordAttempt(startedAt, now, reason, f.err, f.hasErr)
	if retry {
		j.RunAt = now + backoffDelay(j)
		j.StartedAt = 0
		j.addTimeline(TimelineEntry{State: "waiting", At: now, Attempt: j.Attempts + 1})
		s.enqueue(q, j, now)
		s.emit(q, evFailed, j, now, evArgs{err: f.err, hasErr: f.hasErr, terminal: false, hasTerminal: true})
		s.emit(q, evRetried, j, now, evArgs{prev: "failed"})
		s.b.persist(j)
		return
	}
	s.b.stats.failed.Add(1)
	if j.RemoveOnF || f.removeOnFail {
		j.notifyDone(waitOutcome{err: f.err})
		s.childFailed(j, f.err)
		s.forget(j)
	} else {
		s.toDLQ(q, j, f.reason, f.err, f.hasErr, now)
	}
	s.emit(q, evFailed, j, now, evArgs{err: f.err, hasErr: f.hasErr, terminal: true, hasTerminal: true})
}

// normalizeStack trims lines, drops empty ones and keeps the first limit.
func normalizeStack(stack []string, limit int) []string {
	out := make([]string, 0, min(len(stack), max(limit, 0)))
	for _, l := range stack {
		if len(out) >= limit {
			break
		}
		if t := trimSpace(l); t != "" {
			out = append(out, t)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func trimSpace(s string) string {
	i, k := 0, len(s)
	for i < k && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	for k > i && (s[k-1] == ' ' || s[k-1] == '\t' || s[k-1] == '\n' || s[k-1] == '\r') {
		k--
	}
	return s[i:k]
}

// backoffDelay is the wait before the next attempt, with the reference's
// jitter: fixed is the delay ±20%; exponential (also the default for a
// plain number) doubles per attempt, times 0.5 to 1.5.
func backoffDelay(j *Job) int64 {
	maxDelay := int64(maxBackoffDelay)
	base := j.Backoff
	fixed := false
	if c := j.BackoffC; c != nil {
		base = c.Delay
		fixed = !c.Exponential
		if c.MaxDelay != none && c.MaxDelay > 0 {
			maxDelay = c.MaxDelay
		}
	}
	var d float64
	if fixed {
		d = float64(base) * (0.8 + rand.Float64()*0.4)
	} else {
		d = float64(base) * math.Pow(2, float64(j.Attempts)) * (0.5 + rand.Float64())
	}
	if d > float64(maxDelay) {
		d = float64(maxDelay)
	}
	return int64(d)
}

// ---------------------------------------------------------------------------
// Waiting for a job to finish

// waitOutcome is how a job ended, for WaitJob callers.
type waitOutcome struct {
	completed bool
	result    Raw
	hasResult bool
	err       string
}

// notifyDone wakes WaitJob callers; runs under the shard lock.
func (j *Job) notifyDone(o waitOutcome) {
	for _, ch := range j.waiters {
		ch <- o
	}
	j.waiters = nil
}

// ---------------------------------------------------------------------------
// Release on disconnect

// release puts back the jobs a dropped connection held, except those whose
// lease was renewed: a worker that renewed is trusted to be alive elsewhere
// (another connection of its pool) until its lock runs out.
func (b *Broker) release(c *conn) {
	held := c.takeHeld()
	for _, j := range held {
		s := b.shardOf(j.Queue)
		s.with(func() {
			if j.owner != c || j.state != StateActive || b.idxGet(j.ID) != j {
				return // finished, or already back, in the meantime
			}
			j.owner = nil
			if j.lease != nil && j.lease.Renewals > 0 {
				return
			}
			q := s.queues[j.Queue]
			now := b.now()
			s.leases.Remove(j)
			q.nActive--
			j.lease = nil
			j.StartedAt = 0
			j.Heartbeat = now
			s.releaseUnique(q, j)
			s.enqueue(q, j, now)
			b.persist(j)
		})
	}
}

func (b *Broker) dropLogs(id string) {
	var gone bool
	locked(&b.lmu, func() { gone = b.logs.Delete(id) })
	if gone {
		b.logsChanged(id, nil)
	}
}
