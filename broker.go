package main

// The broker: the memory engine's state (shards, the job index, results,
// logs, retired tokens) and helpers its operations share. The operations
// live in the files of their group (lifecycle.go, queue.go, ...; engine.go).

import (
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// Broker holds every queue, job and registry of one server.
type Broker struct {
	shards []*Shard
	mask   uint32
	idx    [idxParts]idxPart

	// Completed jobs kept, across shards; past maxCompleted the trimmer
	// evicts the oldest tenth.
	doneTotal atomic.Int64
	maxDone   int64 // --max-completed-jobs
	trimKick  chan struct{}
	trimStop  chan struct{}
	trimDone  chan struct{}

	rmu     sync.Mutex
	results *LRU[idKey, Raw] // by id, in the form the index keeps it (no text made)
	lmu     sync.Mutex
	logs    *LRU[string, []LogEntry]
	tmu     sync.Mutex
	retired *LRU[string, struct{}] // lease tokens ended by a job timeout

	workers *Workers
	store   Store
	// mem is the memory budget for jobs (--max-memory): pushes are
	// refused past it. nil: none.
	mem *memLimit
	// pullsWaiting counts the long polls waiting for a job, in either
	// engine: a push now would wake them (bunqueue_pulls_waiting).
	pullsWaiting atomic.Int64

	// nQueues counts the queues of every shard; maxQueues bounds them
	// (--max-queues; 0: no limit).
	nQueues   atomic.Int64
	maxQueues int
	// pgStatus reports the database in PostgreSQL mode, where there is
	// no store.
	pgStatus func() StorageState

	tapMu   sync.Mutex
	taps    atomic.Pointer[[]Tap]
	notices noticeTaps // the live-event catalogue's (live_catalog.go)

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

	// Completed history (history.go): the store that keeps it (SQLite
	// mode), and how long completed jobs are kept (-1: for ever).
	hist                   historyStore
	retention              int64
	retainStop, retainDone chan struct{}

	// drain says the server is stopping gracefully (graceful_stop.go).
	drain *drainState
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

func NewBroker(shards int, store Store) *Broker {
	if shards < 1 {
		shards = defaultShards()
	}
	b := &Broker{
		shards:    make([]*Shard, shards),
		mask:      uint32(shards - 1),
		results:   NewLRU[idKey, Raw](maxResults, nil),
		retired:   NewLRU[string, struct{}](maxRetired, nil),
		store:     store,
		now:       nowMs,
		maxQueues: defaultMaxQueues,
		lat:       newLatencies(),
		maxDone:   maxCompleted,
		retention: -1,
		drain:     newDrainState(),
	}
	if h, ok := store.(historyStore); ok {
		b.hist = h
	}
	// Logs pushed out of the cache are gone from storage too, so the two
	// agree after a restart.
	b.logs = NewLRU[string, []LogEntry](maxLogJobs, func(id string, _ []LogEntry) { b.logsChanged(id, nil) })
	b.logs.SetBudget(maxLogsBytes, logsBytes)
	b.workers = newWorkers(func() int64 { return b.now() })
	b.workers.announce = b.announce
	b.results.SetBudget(maxResultsBytes, rawBytes)
	b.trimKick, b.trimStop, b.trimDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
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
	if b.retainStop != nil {
		select {
		case <-b.retainStop:
		default:
			close(b.retainStop)
			<-b.retainDone
		}
	}
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

func rawBytes(r Raw) int64 { return int64(len(r)) }

func (b *Broker) setResult(id idKey, r Raw) {
	locked(&b.rmu, func() {
		b.results.Put(id, r)
	})
}

func (b *Broker) getResult(id idKey) (Raw, bool) {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	return b.results.Get(id)
}

func (b *Broker) dropResult(id idKey) {
	locked(&b.rmu, func() {
		b.results.Delete(id)
	})
}

func (b *Broker) retire(j *Job) {
	if j.run().lease == nil {
		return
	}
	locked(&b.tmu, func() {
		b.retired.Put(j.run().lease.Token, struct{}{})
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
// Helpers of ACK and FAIL that other commands use too

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
	base := j.cold().Backoff
	fixed := false
	if c := j.cold().BackoffObj; c != nil {
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

// notifyDone wakes WaitJob callers; runs under the shard lock.
func (j *Job) notifyDone(o waitOutcome) {
	if j.c == nil {
		return // nobody waits; warm() here gave every finished job a cold part
	}
	for _, ch := range j.c.waiters {
		ch <- o
	}
	j.c.waiters = nil
}

// ---------------------------------------------------------------------------
// Logs

func (b *Broker) dropLogs(id string) {
	var gone bool
	locked(&b.lmu, func() { gone = b.logs.Delete(id) })
	if gone {
		b.logsChanged(id, nil)
	}
}
