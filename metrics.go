package main

// Per-queue figures fed by a broker tap: lifetime counters, the per-minute
// buckets of completed and failed jobs behind the queue form of Metrics,
// and the retained-event count TrimEvents trims.
//
// The tap runs in the emitter's path (in memory mode under its shard's
// lock). The figures are partitioned by the queue's hash, each part under
// a lock of its own, so that emitters of different queues seldom meet.

import (
	"math"
	"sync"
)

// Bounds, as the reference has them.
const (
	maxQueueEvents   = 10000 // retained events per queue
	maxMetricMinutes = 20160 // per-minute buckets kept, relative to the newest (14 days)
)

// Metrics holds the tap-fed figures of every queue.
type Metrics struct {
	b     *Broker
	parts []metricsPart
	mask  uint32
}

type metricsPart struct {
	mu sync.Mutex
	m  map[string]*queueMetrics
	_  [40]byte // keep partitions on separate cache lines
}

// queueMetrics are one queue's figures since the server started.
type queueMetrics struct {
	pushed, pulled, completed, failed, retried int64
	events                                     int64 // retained-event count, at most maxQueueEvents
	done, dead                                 minuteSeries
}

// newMetrics registers the tap on b.
func newMetrics(b *Broker) *Metrics {
	n := defaultShards()
	mx := &Metrics{b: b, parts: make([]metricsPart, n), mask: uint32(n - 1)}
	for i := range mx.parts {
		mx.parts[i].m = make(map[string]*queueMetrics)
	}
	b.addTap(mx.tap)
	return mx
}

func (mx *Metrics) part(queue string) *metricsPart { return &mx.parts[fnv1a(queue)&mx.mask] }

func (mx *Metrics) tap(ev *Event) {
	if ev.Args.remote {
		return // another broker counts its own; Prometheus sums the brokers
	}
	p := mx.part(ev.Queue)
	p.mu.Lock()
	qm := p.m[ev.Queue]
	if qm == nil {
		qm = &queueMetrics{}
		p.m[ev.Queue] = qm
	}
	if qm.events < maxQueueEvents {
		qm.events++
	}
	switch ev.Type {
	case evPushed:
		qm.pushed++
	case evPulled:
		qm.pulled++
	case evCompleted:
		qm.completed++
		qm.done.add(ev.At)
	case evFailed:
		// A failure that will be retried is not a failed job; the
		// reference counts every other failed event (terminal, lock
		// expiry, flow parent), which carry no terminal:false.
		if !ev.Args.hasTerminal || ev.Args.terminal {
			qm.failed++
			qm.dead.add(ev.At)
		}
	case evRetried:
		qm.retried++
	}
	p.mu.Unlock()
}

// queueCounters is a copy of one queue's lifetime counters.
type queueCounters struct {
	pushed, pulled, completed, failed, retried int64
}

func (mx *Metrics) counters(queue string) queueCounters {
	p := mx.part(queue)
	p.mu.Lock()
	defer p.mu.Unlock()
	qm := p.m[queue]
	if qm == nil {
		return queueCounters{}
	}
	return queueCounters{qm.pushed, qm.pulled, qm.completed, qm.failed, qm.retried}
}

// totalRetried sums the retried counter over every queue.
func (mx *Metrics) totalRetried() int64 {
	var n int64
	for i := range mx.parts {
		p := &mx.parts[i]
		p.mu.Lock()
		for _, qm := range p.m {
			n += qm.retried
		}
		p.mu.Unlock()
	}
	return n
}

// trimEvents keeps the newest maxLength retained events of a queue and
// reports how many went.
func (mx *Metrics) trimEvents(queue string, maxLength int64) int64 {
	p := mx.part(queue)
	p.mu.Lock()
	defer p.mu.Unlock()
	qm := p.m[queue]
	if qm == nil || qm.events <= maxLength {
		return 0
	}
	removed := qm.events - maxLength
	qm.events = maxLength
	return removed
}

// dropQueue forgets an obliterated queue's figures: its retained events,
// as the reference deletes the queue's journal, and with them its counters
// and buckets, so that queues created and obliterated by the thousand do
// not leave their figures behind.
func (mx *Metrics) dropQueue(queue string) {
	p := mx.part(queue)
	p.mu.Lock()
	delete(p.m, queue)
	p.mu.Unlock()
}

// ---------------------------------------------------------------------------
// Per-minute buckets

// minuteSeries counts events per minute, over at most maxMetricMinutes
// minutes up to the newest bucket.
type minuteSeries struct {
	total     int64    // every event counted, never pruned
	prevTS    int64    // timestamp of the last event counted
	prevCount int64    // its minute's count after it was added
	base      int64    // minute of counts[0]
	counts    []uint32 // oldest first
}

func (s *minuteSeries) add(ts int64) {
	m := floorDiv(ts, 60000)
	s.total++
	s.prevTS = ts
	if len(s.counts) == 0 {
		s.base = m
		s.counts = append(s.counts, 0)
	}
	newest := s.base + int64(len(s.counts)) - 1
	switch {
	case m > newest && m-newest >= maxMetricMinutes:
		// Everything kept is older than the window: start again.
		s.counts = append(s.counts[:0], 0)
		s.base = m
	case m > newest:
		for k := newest; k < m; k++ {
			s.counts = append(s.counts, 0)
		}
		if over := len(s.counts) - maxMetricMinutes; over > 0 {
			s.counts = s.counts[over:]
			s.base += int64(over)
		}
	case m < s.base:
		// The clock stepped back: an older minute, kept if it is still
		// inside the window.
		if newest-m >= maxMetricMinutes {
			s.prevCount = 0
			return
		}
		grown := make([]uint32, int(s.base-m)+len(s.counts))
		copy(grown[s.base-m:], s.counts)
		s.counts, s.base = grown, m
	}
	s.counts[m-s.base]++
	s.prevCount = int64(s.counts[m-s.base])
}

// ---------------------------------------------------------------------------
// Metrics and TrimEvents

func isSafeUint(f float64) bool {
	return f >= 0 && f <= 9007199254740991 && f == math.Trunc(f)
}

// safeUintArg reads an optional non-negative safe integer the way the
// reference's Number.isSafeInteger check sees it: absent (or undefined)
// gives def; anything else that is not such a number is refused.
func safeUintArg(m Map, key string, def int64, allowMinusOne bool) (int64, bool) {
	r := m.Get(key)
	if r == nil {
		return def, true
	}
	f, err := r.Float()
	if err != nil || math.IsNaN(f) {
		return 0, false
	}
	if allowMinusOne && f == -1 {
		return -1, true
	}
	if !isSafeUint(f) {
		return 0, false
	}
	return int64(f), true
}

// series copies a queue's per-minute series of completed jobs, or of
// failed ones.
func (mx *Metrics) series(queue string, failed bool) minuteSeries {
	p := mx.part(queue)
	p.mu.Lock()
	defer p.mu.Unlock()
	var s minuteSeries
	if qm := p.m[queue]; qm != nil {
		src := &qm.done
		if failed {
			src = &qm.dead
		}
		s = *src
		s.counts = append([]uint32(nil), src.counts...)
	}
	return s
}
