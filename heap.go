package main

import "math"

// A 4-ary min-heap of jobs with generation-based lazy deletion.
//
// Four children per node halve the depth of a binary heap and keep a node's
// children next to each other in memory, which is what sift-down touches.
// Removing a job does not search the heap: the job's generation for this
// heap kind is bumped, its entry turns stale, and pops skip stale entries.
// When stale entries pass a fifth of the heap it is rebuilt in O(n).

// Heap kinds: a job sits in at most one heap of each kind at a time.
const (
	heapPlace = 0 // the queue's waiting heap or the shard's delayed heap
	heapLease = 1 // the shard's lease-expiry heap
	heapKinds = 2
)

// hent is a heap entry. Sort keys are copied in so that comparisons never
// chase the job pointer. The priority is 32 bits (priorities are bounded
// to a million either way), so that it shares a word with the
// generation: 32 bytes an entry, not 40, for every waiting job.
type hent struct {
	t   int64 // then earlier first
	seq int64 // then lower first
	job *Job
	pri int32 // higher first
	gen uint32
}

// pri32 narrows a priority key to hent's; keys out of its range (none a
// push accepts) keep their order against the others, tied at the edge.
func pri32(p int64) int32 { return int32(min(max(p, math.MinInt32), math.MaxInt32)) }

// Heap4 orders entries by (pri desc, t asc, seq asc).
type Heap4 struct {
	a     []hent
	stale int
	kind  uint8
}

func newHeap(kind uint8) *Heap4 { return &Heap4{kind: kind} }

func (h *Heap4) less(x, y *hent) bool {
	if x.pri != y.pri {
		return x.pri > y.pri
	}
	if x.t != y.t {
		return x.t < y.t
	}
	return x.seq < y.seq
}

func (h *Heap4) live(e *hent) bool {
	return e.job.inHeap[h.kind] && e.gen == e.job.hgen[h.kind]
}

// Len is the number of live entries.
func (h *Heap4) Len() int { return len(h.a) - h.stale }

// Push adds job with the given keys; an earlier entry of the same job in a
// heap of this kind goes stale.
func (h *Heap4) Push(job *Job, pri, t, seq int64) {
	if job.inHeap[h.kind] {
		h.stale++
	}
	job.hgen[h.kind]++
	job.inHeap[h.kind] = true
	if len(h.a) == cap(h.a) {
		// Doubled, not the quarter append adds to a large slice: filling
		// a heap of a million that way copied it some twenty times,
		// five times its size in garbage.
		a := make([]hent, len(h.a), max(2*len(h.a), 16))
		copy(a, h.a)
		h.a = a
	}
	h.a = append(h.a, hent{pri: pri32(pri), t: t, seq: seq, gen: job.hgen[h.kind], job: job})
	h.up(len(h.a) - 1)
}

// Remove forgets job in O(1). It reports whether the job was in the heap.
func (h *Heap4) Remove(job *Job) bool {
	if !job.inHeap[h.kind] {
		return false
	}
	job.inHeap[h.kind] = false
	job.hgen[h.kind]++
	h.stale++
	h.maybeCompact()
	return true
}

// Peek returns the first live entry without removing it.
func (h *Heap4) Peek() *hent {
	h.dropStaleTop()
	if len(h.a) == 0 {
		return nil
	}
	return &h.a[0]
}

// Pop removes and returns the first live job, or nil.
func (h *Heap4) Pop() *Job {
	h.dropStaleTop()
	if len(h.a) == 0 {
		return nil
	}
	j := h.a[0].job
	h.popTop()
	j.inHeap[h.kind] = false
	j.hgen[h.kind]++
	h.maybeCompact()
	return j
}

func (h *Heap4) dropStaleTop() {
	for len(h.a) > 0 && !h.live(&h.a[0]) {
		h.popTop()
		h.stale--
	}
}

func (h *Heap4) popTop() {
	n := len(h.a) - 1
	h.a[0] = h.a[n]
	h.a[n] = hent{}
	h.a = h.a[:n]
	if n > 0 {
		h.down(0)
	}
}

func (h *Heap4) up(i int) {
	e := h.a[i]
	for i > 0 {
		p := (i - 1) / 4
		if !h.less(&e, &h.a[p]) {
			break
		}
		h.a[i] = h.a[p]
		i = p
	}
	h.a[i] = e
}

func (h *Heap4) down(i int) {
	n := len(h.a)
	e := h.a[i]
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		best := c
		end := c + 4
		if end > n {
			end = n
		}
		for k := c + 1; k < end; k++ {
			if h.less(&h.a[k], &h.a[best]) {
				best = k
			}
		}
		if !h.less(&h.a[best], &e) {
			break
		}
		h.a[i] = h.a[best]
		i = best
	}
	h.a[i] = e
}

func (h *Heap4) maybeCompact() {
	if h.stale > 32 && h.stale*5 > len(h.a) {
		h.Rebuild()
	}
}

// Rebuild drops every stale entry and restores heap order in O(n).
func (h *Heap4) Rebuild() {
	k := 0
	for i := range h.a {
		if h.live(&h.a[i]) {
			h.a[k] = h.a[i]
			k++
		}
	}
	clear(h.a[k:])
	h.a = h.a[:k]
	h.stale = 0
	if len(h.a) > 1 {
		for i := (len(h.a) - 2) / 4; i >= 0; i-- {
			h.down(i)
		}
	}
	// Give memory back after a large drain.
	if cap(h.a) > 1024 && len(h.a) < cap(h.a)/4 {
		h.a = append(make([]hent, 0, len(h.a)*2), h.a...)
	}
}

// Each calls fn for every live entry in heap (not sorted) order; fn must not
// modify the heap.
func (h *Heap4) Each(fn func(e *hent) bool) {
	for i := range h.a {
		if h.live(&h.a[i]) {
			if !fn(&h.a[i]) {
				return
			}
		}
	}
}

// Clear forgets every entry.
func (h *Heap4) Clear() {
	for i := range h.a {
		if h.live(&h.a[i]) {
			h.a[i].job.inHeap[h.kind] = false
			h.a[i].job.hgen[h.kind]++
		}
	}
	h.a = nil
	h.stale = 0
}
