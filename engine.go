package main

// The seam between the protocol and storage. A handler (cmd_*.go) reads
// its arguments, calls one Engine method and writes the answer; the engine
// does the work. There are two engines:
//
//   - *Broker: jobs in memory, in shards (shard.go), written through to
//     SQLite when a data file is set (sqlite.go). Its methods live in the
//     files named for each group below (queue.go, ...).
//   - *PG: jobs in a PostgreSQL namespace shared by every broker
//     (postgres.go); its methods live in pg_<group>.go, file for file.
//
// What belongs to one broker and its connections (sessions, event
// subscriptions, webhooks, workers, this broker's counters) is not the
// engine's: handlers reach it through r.b and r.c in both modes.
//
// Engine methods take the connection's context: a memory engine mostly
// ignores it, the PostgreSQL engine bounds its database work by it and
// by its own deadline (PG.opCtx). Arguments and results are plain values,
// never a *Req. Errors are ready for the client: a refusal as it is, a
// storage fault named as such.

import "context"

// Engine is everything the protocol asks of storage.
type Engine interface {
	QueueEngine
}

// QueueEngine pauses, empties, removes and lists queues (queue.go,
// pg_queue.go).
type QueueEngine interface {
	// SetPaused pauses (paused) or resumes a queue, making it when it does
	// not exist yet, and tells the queue's subscribers.
	SetPaused(ctx context.Context, queue string, paused bool) error
	IsPaused(ctx context.Context, queue string) (bool, error)
	// Drain removes a queue's waiting and delayed jobs and says how many
	// went.
	Drain(ctx context.Context, queue string) (int64, error)
	// Obliterate removes a queue with all its jobs, settings and groups.
	Obliterate(ctx context.Context, queue string) error
	// ListQueues names the queues, oldest first.
	ListQueues(ctx context.Context) ([]string, error)
}

var (
	_ Engine = (*Broker)(nil) // memory and SQLite
	_ Engine = (*PG)(nil)     // PostgreSQL
)
