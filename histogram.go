package main

// Latency histograms the broker feeds on its hot paths. Every observation
// is two atomic adds (a bucket and the sum) after a short scan of the
// bounds, so timing each push, pull and ack costs next to nothing and
// takes no lock. Readers (Prometheus, the dashboard) take a snapshot; the
// buckets of a snapshot may be a few observations apart from one another,
// which is harmless for monitoring and keeps the writers lock-free.

import (
	"sync/atomic"
	"time"
)

// Histogram counts observations in fixed buckets.
type Histogram struct {
	bounds []float64      // upper bounds in seconds, ascending
	limits []int64        // the same bounds in nanoseconds
	counts []atomic.Int64 // per bucket (not cumulative); the last is +Inf
	sum    atomic.Int64   // nanoseconds
}

// Bucket bounds in seconds. Operation latencies use the reference's
// bounds, so dashboards built for it read ours the same way; the time a
// job waits or runs spans milliseconds to hours.
var (
	opBounds  = []float64{0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	jobBounds = []float64{0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 21600, 86400}
)

func newHistogram(bounds []float64) *Histogram {
	h := &Histogram{bounds: bounds, limits: make([]int64, len(bounds)), counts: make([]atomic.Int64, len(bounds)+1)}
	for i, b := range bounds {
		h.limits[i] = int64(b * 1e9)
	}
	return h
}

// Observe records one duration.
func (h *Histogram) Observe(d time.Duration) {
	ns := int64(d)
	if ns < 0 {
		ns = 0
	}
	i := 0
	for i < len(h.limits) && ns > h.limits[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(ns)
}

// ObserveMs records a duration measured in milliseconds (job timestamps
// are kept in ms).
func (h *Histogram) ObserveMs(ms int64) { h.Observe(time.Duration(ms) * time.Millisecond) }

// since records the time elapsed since start.
func (h *Histogram) since(start time.Time) { h.Observe(time.Since(start)) }

// HistSnap is a point-in-time copy of a histogram.
type HistSnap struct {
	Bounds     []float64
	Cumulative []int64 // len(Bounds)+1; the last is the +Inf bucket, equal to Count
	Count      int64
	Sum        float64 // seconds
}

func (h *Histogram) Snapshot() HistSnap {
	s := HistSnap{Bounds: h.bounds, Cumulative: make([]int64, len(h.counts))}
	var run int64
	for i := range h.counts {
		run += h.counts[i].Load()
		s.Cumulative[i] = run
	}
	s.Count = run
	s.Sum = float64(h.sum.Load()) / 1e9
	return s
}

// MeanMs is the average observation in milliseconds, 0 when empty.
func (s HistSnap) MeanMs() float64 {
	if s.Count == 0 {
		return 0
	}
	return s.Sum * 1000 / float64(s.Count)
}

// QuantileMs is the upper bound, in milliseconds, of the bucket holding
// the q-th observation, as the reference reports its percentiles; 0 when
// empty. Observations past the last bound report that bound.
func (s HistSnap) QuantileMs(q float64) float64 {
	if s.Count == 0 {
		return 0
	}
	rank := int64(q * float64(s.Count))
	if float64(rank) < q*float64(s.Count) {
		rank++ // the ceiling: p50 of 3 observations is the 2nd
	}
	rank = max(rank, 1)
	for i, c := range s.Cumulative {
		if c >= rank {
			if i < len(s.Bounds) {
				return s.Bounds[i] * 1000
			}
			break
		}
	}
	return s.Bounds[len(s.Bounds)-1] * 1000
}

// latencies are the broker's histograms. Both engines feed the same ones.
type latencies struct {
	push, pull, ack *Histogram // one observation per operation
	// pullService is a pull's time less the time it slept in a long poll
	// waiting for a job: what the server spent answering it, for every
	// pull. pull counts the wait too and, as the reference's, only the
	// pulls that delivered a job, so a worker polling an idle queue for
	// 1 s records nothing there and next to nothing here.
	pullService *Histogram
	wait        *Histogram // push to first pull, per job
	proc        *Histogram // pull to ack, per job
}

func newLatencies() latencies {
	return latencies{push: newHistogram(opBounds), pull: newHistogram(opBounds), ack: newHistogram(opBounds),
		pullService: newHistogram(opBounds), wait: newHistogram(jobBounds), proc: newHistogram(jobBounds)}
}

// observePull records a pull that started at start and slept waited of
// its time waiting for a job; delivered says whether it handed out any.
// An empty pull is left out of pull, as the reference leaves it out of
// its pull latency: dashboards built for it read pull as the time a job
// took to reach a worker.
func (l latencies) observePull(start time.Time, waited time.Duration, delivered bool) {
	total := time.Since(start)
	if delivered {
		l.pull.Observe(total)
	}
	l.pullService.Observe(total - min(waited, total))
}
