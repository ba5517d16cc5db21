package main

// Queue-wide limits on claiming: a rate limit (a token bucket, as the
// reference has it) and a concurrency limit. Both are checked in claim,
// under the shard lock, so they hold across every connection.

import (
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
	if b.perMs <= 0 {
		return math.MaxInt32
	}
	return int64(math.Ceil((1 - b.tokens) / b.perMs))
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

// rateLimitArgs are RateLimit's arguments, read once for both engines.
type rateLimitArgs struct {
	queue         string
	limit         float64
	duration, ttl int64
}

func readRateLimit(r *Req) (rateLimitArgs, error) {
	var a rateLimitArgs
	var err error
	if a.queue, err = queueArg(r.m); err != nil {
		return a, err
	}
	limit, ok, err := finiteArg(r.m, "limit")
	if err != nil || !ok {
		return a, errors.New("limit must be a finite number")
	}
	dur, _, err := finiteArg(r.m, "duration")
	if err != nil {
		return a, err
	}
	ttl, _, err := finiteArg(r.m, "ttl")
	if err != nil {
		return a, err
	}
	a.limit, a.duration, a.ttl = limit, int64(dur), int64(ttl)
	return a, nil
}

// bucket is the limit's token bucket, full, as of now.
func (a rateLimitArgs) bucket(now int64) *bucket {
	return newBucket(a.limit, a.duration, a.ttl, now)
}

// readConcurrency reads SetConcurrency's queue and limit.
func readConcurrency(r *Req) (string, int64, error) {
	name, err := queueArg(r.m)
	if err != nil {
		return "", 0, err
	}
	limit, ok, err := finiteArg(r.m, "limit")
	if err != nil || !ok {
		return "", 0, errors.New("limit must be a finite number")
	}
	return name, int64(limit), nil
}

func cmdRateLimit(r *Req) error {
	a, err := readRateLimit(r)
	if err != nil {
		return err
	}
	if err := r.b.withQueue(a.queue, true, func(s *Shard, q *Queue, now int64) {
		q.listed = true
		q.rate = a.bucket(now)
		q.wakeAll()
		r.b.queueChanged(q)
	}); err != nil {
		return err
	}
	return r.okID()
}

func cmdRateLimitClear(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			q.rate = nil
			q.wakeAll()
			r.b.queueChanged(q)
		}
	})
	return r.okID()
}

func cmdSetConcurrency(r *Req) error {
	name, limit, err := readConcurrency(r)
	if err != nil {
		return err
	}
	if err := r.b.withQueue(name, true, func(s *Shard, q *Queue, now int64) {
		q.listed = true
		if q.concLimit == nil {
			// A new limiter counts from zero: jobs already running were
			// claimed without a slot.
			q.concActive = 0
		}
		q.concLimit = &limit
		q.wakeAll()
		r.b.queueChanged(q)
	}); err != nil {
		return err
	}
	return r.okID()
}

func cmdClearConcurrency(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			q.concLimit, q.concActive = nil, 0
			q.wakeAll()
			r.b.queueChanged(q)
		}
	})
	return r.okID()
}

func cmdGetQueueLimits(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	maxJobs, hasMax, err := r.m.Num("maxJobs")
	if err != nil {
		return err
	}
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		var rate *bucket
		var conc *int64
		if q != nil {
			rate, conc = q.rateLimit(now), q.concLimit
		}
		writeQueueLimits(r, rate, conc, conc != nil && q.concActive >= *conc, maxJobs, hasMax, now)
	})
	return nil
}

// writeQueueLimits answers GetQueueLimits. maxJobs (when given) asks
// whether the bucket has room for that many: its ttl is then 0.
func writeQueueLimits(r *Req, rate *bucket, conc *int64, maxed bool, maxJobs float64, hasMax bool, now int64) {
	e := r.field("data")
	e.MapHead(1)
	e.Str("limits")
	e.MapHead(4)
	e.Str("rateLimit")
	ttl := int64(-2)
	if rate == nil {
		e.Nil()
	} else {
		e.MapHead(2)
		e.Str("max")
		e.Num(rate.max)
		e.Str("duration")
		e.Int(rate.duration)
		switch {
		case rate.expires != 0:
			ttl = max(0, rate.expires-now)
		case hasMax && float64(rate.consumed) < maxJobs:
			ttl = 0
		default:
			ttl = rate.waitMs(now)
		}
	}
	e.Str("rateLimitTtl")
	e.Int(ttl)
	e.Str("concurrencyLimit")
	if conc == nil {
		e.Nil()
	} else {
		e.Int(*conc)
	}
	e.Str("maxed")
	e.Bool(maxed)
}

// ---------------------------------------------------------------------------
// Stall configuration

// stallPatch is a SetStallConfig's settings: those given replace the
// queue's.
type stallPatch struct {
	enabled, hasEnabled       bool
	interval, grace, maxStall *float64
}

func readStallPatch(r *Req) (string, *stallPatch, error) {
	name, err := queueArg(r.m)
	if err != nil {
		return "", nil, err
	}
	cfg, ok, err := r.m.Map("config")
	if err != nil || !ok {
		return name, nil, err
	}
	p := &stallPatch{}
	if p.enabled, p.hasEnabled, err = cfg.Bool("enabled"); err != nil {
		return "", nil, &FieldError{Field: "config.enabled", Msg: "must be a boolean"}
	}
	for _, f := range []struct {
		key string
		dst **float64
	}{{"stallInterval", &p.interval}, {"gracePeriod", &p.grace}, {"maxStalls", &p.maxStall}} {
		if v, ok, err := finiteArg(cfg, f.key); err == nil && ok {
			*f.dst = &v
		}
	}
	return name, p, nil
}

func (p *stallPatch) apply(c StallConfig) StallConfig {
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

func cmdSetStallConfig(r *Req) error {
	name, patch, err := readStallPatch(r)
	if err != nil {
		return err
	}
	if patch == nil {
		return r.okID()
	}
	if err := r.b.withQueue(name, true, func(s *Shard, q *Queue, now int64) {
		c := patch.apply(q.stall)
		if c != defaultStall {
			q.listed = true
		}
		q.stall = c
		r.b.queueChanged(q)
	}); err != nil {
		return err
	}
	return r.okID()
}

func cmdGetStallConfig(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	c := defaultStall
	r.b.withQueue(name, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			c = q.stall
		}
	})
	writeStallConfig(r, c)
	return nil
}

func writeStallConfig(r *Req, c StallConfig) {
	e := r.field("config")
	e.MapHead(4)
	e.Str("enabled")
	e.Bool(c.Enabled)
	e.Str("stallInterval")
	e.Int(c.StallInterval)
	e.Str("maxStalls")
	e.Int(int64(c.MaxStalls))
	e.Str("gracePeriod")
	e.Int(c.GracePeriod)
}
