package main

// Queue-wide limits on claiming: a rate limit (a token bucket, as the
// reference has it) and a concurrency limit. Both are checked in claim,
// under the shard lock, so they hold across every connection. Here too
// the memory engine's limit and stall policy operations (PolicyEngine);
// pg_limits.go and pg_dlq.go answer the same in PostgreSQL mode.

import (
	"context"
	"errors"
	"math"
)

// bucket is a token bucket: max tokens, refilled continuously at max per
// duration, starting full.
type bucket struct {
	max      float64
	duration int64
	perMs    float64
	tokens   float64
	last     int64
	expires  int64 // the limit clears itself then (0: never)
	consumed int64
}

func newBucket(max float64, duration, ttl, now int64) *bucket {
	if duration <= 0 {
		duration = 1000
	}
	b := &bucket{max: max, duration: duration, perMs: max / float64(duration), tokens: max, last: now}
	if b.max < 0 {
		b.max = 0
	}
	b.tokens = b.max
	if ttl > 0 {
		b.expires = now + ttl
	}
	return b
}

func (b *bucket) refill(now int64) {
	if now > b.last {
		b.tokens = math.Min(b.max, b.tokens+float64(now-b.last)*b.perMs)
		b.last = now
	}
}

func (b *bucket) take(now int64) bool {
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		b.consumed++
		return true
	}
	return false
}

func (b *bucket) giveBack() {
	b.tokens = math.Min(b.max, b.tokens+1)
	b.consumed--
}

// waitMs is how long until a token is there.
func (b *bucket) waitMs(now int64) int64 {
	b.refill(now)
	if b.tokens >= 1 {
		return 0
	}
	// A bucket that never gets a token back (no rate, or a limit below
	// one per duration) waits MaxInt32 ms, then is looked at again; so
	// does one whose wait is longer, which a limit of 1e-300 made
	// overflow int64 (a wait in the past, then now plus the wait).
	w := math.Ceil((1 - b.tokens) / b.perMs)
	if b.perMs <= 0 || !(w < math.MaxInt32) {
		return math.MaxInt32
	}
	return int64(w)
}

// rateLimit returns the queue's live bucket, dropping one whose ttl ran out.
func (q *Queue) rateLimit(now int64) *bucket {
	if q.rate != nil && q.rate.expires != 0 && now >= q.rate.expires {
		q.rate = nil
	}
	return q.rate
}

// admitOne takes the queue-wide slot and token one claim needs. It says
// whether a job may be claimed now.
func (q *Queue) admitOne(now int64) bool {
	if q.concLimit != nil && q.concActive >= *q.concLimit {
		return false
	}
	if r := q.rateLimit(now); r != nil && !r.take(now) {
		return false
	}
	return true
}

// refusal names the limit admitOne found full, as the live notice.
func (q *Queue) refusal(now int64) string {
	if q.concLimit != nil && q.concActive >= *q.concLimit {
		return "concurrency:rejected"
	}
	return "ratelimit:rejected"
}

// limitWait is how long a waiting pull should sleep at most before trying
// again, because a limit rather than an empty queue held it back.
// (A pull held back by concurrency is woken when a slot frees instead.)
func (q *Queue) limitWait(now int64) int64 {
	if q.concLimit != nil && q.concActive >= *q.concLimit {
		return math.MaxInt64
	}
	if r := q.rateLimit(now); r != nil {
		if w := r.waitMs(now); w > 0 {
			return w
		}
		return 1
	}
	return math.MaxInt64
}

func finiteArg(m Map, key string) (float64, bool, error) {
	f, ok, err := m.Num(key)
	if err != nil || (ok && (math.IsNaN(f) || math.IsInf(f, 0))) {
		return 0, false, errors.New(key + " must be a finite number")
	}
	return f, ok, nil
}

// RateLimit is a queue's rate limit as RateLimit sets it: Max claims per
// Duration ms (1000 when not positive), dropped after TTL ms (0: kept).
type RateLimit struct {
	Max           float64
	Duration, TTL int64
}

// bucket is the limit's token bucket, full, as of now.
func (l RateLimit) bucket(now int64) *bucket {
	return newBucket(l.Max, l.Duration, l.TTL, now)
}

// QueueLimits is a queue's limits as GetQueueLimits shows them.
type QueueLimits struct {
	Rate        *bucket // a copy of the live bucket; nil: no rate limit
	Concurrency *int64  // nil: no concurrency limit
	Maxed       bool    // every concurrency slot is taken
	At          int64   // when they were read: the bucket's waits count from then
}

func (b *MemEngine) SetRateLimit(_ context.Context, queue string, l RateLimit) error {
	return b.withQueue(queue, true, func(s *Shard, q *Queue, now int64) {
		q.listed = true
		q.rate = l.bucket(now)
		q.wakeAll()
		b.queueChanged(q)
	})
}

func (b *MemEngine) ClearRateLimit(_ context.Context, queue string) error {
	return b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			q.rate = nil
			q.wakeAll()
			b.queueChanged(q)
		}
	})
}

func (b *MemEngine) SetConcurrency(_ context.Context, queue string, limit int64) error {
	return b.withQueue(queue, true, func(s *Shard, q *Queue, now int64) {
		q.listed = true
		if q.concLimit == nil {
			// A new limiter counts from zero: jobs already running were
			// claimed without a slot.
			q.concActive = 0
		}
		q.concLimit = &limit
		q.wakeAll()
		b.queueChanged(q)
	})
}

func (b *MemEngine) ClearConcurrency(_ context.Context, queue string) error {
	return b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			q.concLimit, q.concActive = nil, 0
			q.wakeAll()
			b.queueChanged(q)
		}
	})
}

func (b *MemEngine) QueueLimits(_ context.Context, queue string) (QueueLimits, error) {
	var l QueueLimits
	err := b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		l.At = now
		if q == nil {
			return
		}
		if rate := q.rateLimit(now); rate != nil {
			c := *rate
			l.Rate = &c
		}
		if q.concLimit != nil {
			c := *q.concLimit
			l.Concurrency, l.Maxed = &c, q.concActive >= c
		}
	})
	return l, err
}

// ---------------------------------------------------------------------------
// Stall configuration

// stallPatch is a SetStallConfig's settings: those given replace the
// queue's.
type stallPatch struct {
	enabled, hasEnabled       bool
	interval, grace, maxStall *float64
}

func (p stallPatch) apply(c StallConfig) StallConfig {
	if p.hasEnabled {
		c.Enabled = p.enabled
	}
	if p.interval != nil {
		c.StallInterval = int64(max(*p.interval, 0))
	}
	if p.grace != nil {
		c.GracePeriod = int64(max(*p.grace, 0))
	}
	if p.maxStall != nil {
		c.MaxStalls = int32(max(*p.maxStall, 0))
	}
	return c
}

func (b *MemEngine) SetStallConfig(_ context.Context, queue string, patch stallPatch) error {
	return b.withQueue(queue, true, func(s *Shard, q *Queue, now int64) {
		c := patch.apply(q.stall)
		if c != defaultStall {
			q.listed = true
		}
		q.stall = c
		b.queueChanged(q)
	})
}

func (b *MemEngine) GetStallConfig(_ context.Context, queue string) (StallConfig, error) {
	c := defaultStall
	err := b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			c = q.stall
		}
	})
	return c, err
}
