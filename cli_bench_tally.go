package main

// What queued bench counts with: how often each job was processed (the
// exactly-once check) and the latency histograms of its lanes.

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// seenTable counts how often each sequence number was processed. Its
// chunks are made as the numbers reach them, so a run pays for the jobs it
// pushes, up to seenMax.
type seenTable struct {
	chunks [seenChunks]atomic.Pointer[seenChunk]
}

type seenChunk [1 << 16]atomic.Uint32

const (
	seenChunks = 1024
	seenMax    = seenChunks << 16
)

// inc counts one more processing of seq and returns the count; false when
// seq is out of range.
func (t *seenTable) inc(seq int64) (uint32, bool) {
	if seq < 0 || seq >= seenMax {
		return 0, false
	}
	p := &t.chunks[seq>>16]
	c := p.Load()
	if c == nil {
		p.CompareAndSwap(nil, new(seenChunk))
		c = p.Load()
	}
	return c[seq&0xffff].Add(1), true
}

func (t *seenTable) get(seq int64) uint32 {
	if seq < 0 || seq >= seenMax {
		return 0
	}
	c := t.chunks[seq>>16].Load()
	if c == nil {
		return 0
	}
	return c[seq&0xffff].Load()
}

// hist is a log-linear histogram of durations: 128 buckets per power of
// two, so a quantile is within 1% of the true value, in a fixed 35 KiB
// whatever the count. Each lane has its own; they are merged at the end.
type hist struct {
	counts [histBuckets]uint64
	n      int64
	max    int64
	e2e    *hist   // a worker's push-to-ack latencies
	lanes  []*hist // after merge: the parts, for their e2e
}

const (
	histSub     = 128
	histBuckets = 48 * histSub
)

func histIndex(v int64) int {
	if v < histSub {
		return int(max(v, 0))
	}
	e := bits.Len64(uint64(v)) - 8 // v>>e is in [128, 256)
	return min((e+1)*histSub+int(v>>e)-histSub, histBuckets-1)
}

// histValue is the middle of bucket i.
func histValue(i int) float64 {
	if i < histSub {
		return float64(i)
	}
	e := i/histSub - 1
	m := i%histSub + histSub
	return (float64(m) + 0.5) * float64(int64(1)<<e)
}

func (h *hist) add(d time.Duration) {
	v := int64(d)
	h.counts[histIndex(v)]++
	h.n++
	if v > h.max {
		h.max = v
	}
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
	h.lanes = append(h.lanes, o)
}

// quantileMs is the q-quantile in milliseconds (0 with no samples).
func (h *hist) quantileMs(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	if q >= 1 {
		return round3(float64(h.max) / 1e6)
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank && c > 0 {
			return round3(min(histValue(i), float64(h.max)) / 1e6)
		}
	}
	return round3(float64(h.max) / 1e6)
}
