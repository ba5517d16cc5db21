package main

// The broker: what one queued process keeps whatever its engine (memory,
// SQLite or PostgreSQL). Each engine is given the Broker and feeds it; the
// server, the HTTP API, the live streams and the metrics read it. It is
// not an Engine: jobs live in the engine (engine.go).

import (
	"log/slog"
	"sync"
	"sync/atomic"
)

// Broker is the process: event taps and subscriptions, notices of the live
// catalogue, registered workers, counters and latencies, the memory
// budget, the graceful stop, and the state of the storage for /health.
type Broker struct {
	workers *Workers
	// mem is the memory budget for jobs (--max-memory): pushes are
	// refused past it. nil: none.
	mem *memLimit
	// pullsWaiting counts the long polls waiting for a job, in either
	// engine: a push now would wake them (bunqueue_pulls_waiting).
	pullsWaiting atomic.Int64
	// maxQueues bounds the queues an engine keeps (--max-queues; 0: no
	// limit).
	maxQueues int
	// storage reports the engine's storage (StorageStatus, /health); set
	// by the engine when it is made.
	storage func() StorageState

	tapMu   sync.Mutex
	taps    atomic.Pointer[[]Tap]
	subs    eventSubs  // events.go
	notices noticeTaps // the live-event catalogue's (live_catalog.go)

	log     *slog.Logger
	now     func() int64
	started int64
	stats   struct {
		pushed, pulled, completed, failed atomic.Int64
	}
	lat latencies
	// rates is the last ten minutes of the counters above, for the
	// dashboard (throughput.go).
	rates *rateHistory

	// drain says the server is stopping gracefully (graceful_stop.go).
	drain *drainState

	closeOnce sync.Once
}

// NewBroker makes a broker and starts its rate sampler (Close stops it).
func NewBroker() *Broker {
	b := &Broker{
		now:       nowMs,
		maxQueues: defaultMaxQueues,
		lat:       newLatencies(),
		drain:     newDrainState(),
		log:       slog.New(slog.DiscardHandler),
		storage:   func() StorageState { return StorageState{Driver: "memory"} },
	}
	b.workers = newWorkers(func() int64 { return b.now() })
	b.workers.announce = b.announce
	b.started = b.now()
	b.rates = newRateHistory(func() [4]int64 {
		return [4]int64{b.stats.pushed.Load(), b.stats.pulled.Load(), b.stats.completed.Load(), b.stats.failed.Load()}
	})
	b.rates.start()
	return b
}

// Close stops the rate sampler; it is safe to call more than once.
func (b *Broker) Close() {
	b.closeOnce.Do(b.rates.close)
}

// storageState is what StorageStatus and /health report of the engine's
// storage.
func (b *Broker) storageState() StorageState { return b.storage() }
