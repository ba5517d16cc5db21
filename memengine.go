package main

// The memory engine (memory and SQLite mode): its state (shards, the job
// index, results, logs, retired tokens) and helpers its operations share.
// The operations live in the files of their group (lifecycle.go, queue.go,
// ...; engine.go). What the process keeps whatever the engine (taps,
// subscriptions, workers, counters, the memory budget) is the Broker
// (broker.go), which the engine embeds.

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// MemEngine holds every queue, job and registry in this process's memory,
// written through to a Store in SQLite mode.
type MemEngine struct {
	*Broker
	// ownsBroker: NewMemEngine made the Broker, so Close closes it.
	ownsBroker bool

	shards []*Shard
	mask   uint32
	idx    [idxParts]idxPart

	// Completed jobs kept, across shards; past maxCompleted the trimmer
	// evicts the oldest tenth.
	doneTotal atomic.Int64
	maxDone   int64 // --max-completed-jobs
	// histMu orders RetryCompleted's reads and revivals of the history
	// on disk with its deletions (history.go).
	histMu   sync.Mutex
	trimKick chan struct{}
	trimStop chan struct{}
	trimDone chan struct{}

	rmu     sync.Mutex
	results *LRU[idKey, Raw] // by id, in the form the index keeps it (no text made)
	lmu     sync.Mutex
	logs    *LRU[string, []LogEntry]
	tmu     sync.Mutex
	retired *LRU[string, struct{}] // lease tokens ended by a job timeout

	store Store

	// nQueues counts the queues of every shard (bounded by the Broker's
	// maxQueues).
	nQueues atomic.Int64

	flowState

	cron *CronScheduler
	seq  atomic.Int64

	// Completed history (history.go): the store that keeps it (SQLite
	// mode), and how long completed jobs are kept (-1: for ever).
	hist                   historyStore
	retention              int64
	retainStop, retainDone chan struct{}
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

// NewMemEngine makes a memory engine with a Broker of its own (tests, and
// tools that run no server).
func NewMemEngine(shards int, store Store) *MemEngine {
	b := newMemEngine(NewBroker(), shards, store)
	b.ownsBroker = true
	return b
}

// newMemEngine makes the memory engine of broker br.
func newMemEngine(br *Broker, shards int, store Store) *MemEngine {
	if shards < 1 {
		shards = defaultShards()
	}
	b := &MemEngine{
		Broker:    br,
		shards:    make([]*Shard, shards),
		mask:      uint32(shards - 1),
		results:   NewLRU[idKey, Raw](maxResults, nil),
		retired:   NewLRU[string, struct{}](maxRetired, nil),
		store:     store,
		maxDone:   maxCompleted,
		retention: -1,
	}
	if h, ok := store.(historyStore); ok {
		b.hist = h
	}
	br.storage = b.memStorageState
	// Logs pushed out of the cache are gone from storage too, so the two
	// agree after a restart.
	b.logs = NewLRU[string, []LogEntry](maxLogJobs, func(id string, _ []LogEntry) { b.logsChanged(id, nil) })
	b.logs.SetBudget(maxLogsBytes, logsBytes)
	b.results.SetBudget(maxResultsBytes, rawBytes)
	b.trimKick, b.trimStop, b.trimDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	for i := range b.shards {
		s := &Shard{b: b, id: i, queues: make(map[string]*Queue), delayed: newHeap(heapPlace),
			leases: newHeap(heapLease)}
		s.startTimer()
		b.shards[i] = s
	}
	go b.trimmer()
	b.startFlows()
	b.startCron()
	return b
}

// Close stops every shard timer and the trimmer (and the Broker's rate
// sampler when the engine made its Broker), and wakes every waiter so that
// long polls end. It is safe to call more than once.
func (b *MemEngine) Close() {
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
	if b.ownsBroker {
		b.Broker.Close()
	}
}

// ---------------------------------------------------------------------------
// Results, logs, retired tokens

func rawBytes(r Raw) int64 { return int64(len(r)) }

func (b *MemEngine) setResult(id idKey, r Raw) {
	locked(&b.rmu, func() {
		b.results.Put(id, r)
	})
}

func (b *MemEngine) getResult(id idKey) (Raw, bool) {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	return b.results.Get(id)
}

func (b *MemEngine) dropResult(id idKey) {
	locked(&b.rmu, func() {
		b.results.Delete(id)
	})
}

func (b *MemEngine) retire(j *Job) {
	if j.run().lease == nil {
		return
	}
	locked(&b.tmu, func() {
		b.retired.Put(j.run().lease.Token, struct{}{})
	})
}

func (b *MemEngine) isRetired(token string) bool {
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

func (b *MemEngine) dropLogs(id string) {
	var gone bool
	locked(&b.lmu, func() { gone = b.logs.Delete(id) })
	if gone {
		b.logsChanged(id, nil)
	}
}
