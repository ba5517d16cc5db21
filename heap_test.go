package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"
)

// model is the obvious implementation: a slice sorted on every pop.
type modelEnt struct {
	pri, t, seq int64
	job         *Job
}

func modelLess(a, b modelEnt) int {
	switch {
	case a.pri != b.pri:
		if a.pri > b.pri {
			return -1
		}
		return 1
	case a.t != b.t:
		if a.t < b.t {
			return -1
		}
		return 1
	case a.seq != b.seq:
		if a.seq < b.seq {
			return -1
		}
		return 1
	}
	return 0
}

// TestHeapMatchesModel drives the heap and the model with the same random
// pushes, pops and removals and requires the same answers throughout.
func TestHeapMatchesModel(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7))
		h := newHeap(heapPlace)
		var model []modelEnt
		var seq int64
		for step := 0; step < 3000; step++ {
			switch op := rng.IntN(10); {
			case op < 5: // push, with few distinct keys so ties are common
				seq++
				j := withID(&Job{}, itoa(seq))
				e := modelEnt{pri: int64(rng.IntN(4)), t: int64(rng.IntN(5)), seq: seq, job: j}
				h.Push(j, e.pri, e.t, e.seq)
				model = append(model, e)
			case op < 8: // pop
				slices.SortFunc(model, modelLess)
				got := h.Pop()
				if len(model) == 0 {
					if got != nil {
						t.Fatalf("seed %d step %d: pop from empty gave %s", seed, step, got.ID())
					}
					continue
				}
				if got != model[0].job {
					t.Fatalf("seed %d step %d: pop gave %v, model %v", seed, step, got, model[0].job)
				}
				model = model[1:]
			default: // remove a random live job, O(1) through the generation
				if len(model) == 0 {
					continue
				}
				i := rng.IntN(len(model))
				if !h.Remove(model[i].job) {
					t.Fatalf("seed %d: remove of a live job failed", seed)
				}
				if h.Remove(model[i].job) {
					t.Fatalf("seed %d: second remove succeeded", seed)
				}
				model = append(model[:i], model[i+1:]...)
			}
			if h.Len() != len(model) {
				t.Fatalf("seed %d step %d: Len %d, model %d", seed, step, h.Len(), len(model))
			}
			if h.stale*5 > len(h.a) && h.stale > 32 {
				t.Fatalf("seed %d step %d: %d stale of %d not compacted", seed, step, h.stale, len(h.a))
			}
		}
		// Drain: the rest comes out in model order.
		slices.SortFunc(model, modelLess)
		for i, e := range model {
			if got := h.Pop(); got != e.job {
				t.Fatalf("seed %d drain %d: got %v want %v", seed, i, got, e.job)
			}
		}
		if h.Pop() != nil || h.Len() != 0 {
			t.Fatalf("seed %d: heap not empty after drain", seed)
		}
	}
}

// A job pushed again (re-prioritised) leaves exactly one live entry.
func TestHeapRepushAndRebuild(t *testing.T) {
	t.Parallel()
	h := newHeap(heapPlace)
	jobs := make([]*Job, 1000)
	for i := range jobs {
		jobs[i] = &Job{}
		h.Push(jobs[i], 0, int64(i), int64(i))
	}
	// Remove most of them: compaction must kick in and keep order.
	for i := 0; i < 900; i++ {
		h.Remove(jobs[i])
	}
	if h.stale > len(h.a)/5+32 {
		t.Fatalf("stale %d of %d after mass removal", h.stale, len(h.a))
	}
	h.Remove(jobs[950])
	h.Push(jobs[950], 5, 0, 0) // back with a higher priority
	if got := h.Pop(); got != jobs[950] {
		t.Fatal("re-pushed job with higher priority not first")
	}
	for i := 900; i < 1000; i++ {
		if i == 950 {
			continue
		}
		if got := h.Pop(); got != jobs[i] {
			t.Fatalf("order broken at %d", i)
		}
	}
	if h.Pop() != nil {
		t.Fatal("extra entry")
	}
	// Each skips stale entries; Clear forgets all.
	for i := 0; i < 10; i++ {
		h.Push(jobs[i], 0, int64(i), int64(i))
	}
	h.Remove(jobs[3])
	n := 0
	h.Each(func(e *hent) bool { n++; return true })
	if n != 9 {
		t.Fatalf("Each saw %d live entries, want 9", n)
	}
	h.Clear()
	if h.Len() != 0 || h.Pop() != nil || jobs[0].inHeap[heapPlace] {
		t.Fatal("Clear left entries")
	}
}

// Ordering as the broker uses it: priority, then LIFO newest first, then
// FIFO by run time and insertion.
func TestReadyOrder(t *testing.T) {
	t.Parallel()
	h := newHeap(heapPlace)
	mk := func(id string, pri, runAt, seq int64, lifo bool) *Job {
		j := withID(&Job{Priority: pri, RunAt: runAt, seq: seq}, id)
		if lifo {
			j.warm().Lifo = true
		}
		p, tt, s := readyKeys(j)
		h.Push(j, p, tt, s)
		return j
	}
	mk("none-a", 0, 100, 1, false)
	mk("low", 1, 100, 2, false)
	mk("neg", -5, 100, 3, false)
	mk("high", 10, 100, 4, false)
	mk("mid", 5, 100, 5, false)
	mk("mid-lifo", 5, 100, 6, true)
	mk("none-lifo-1", 0, 100, 7, true)
	mk("none-lifo-2", 0, 100, 8, true)
	mk("none-early", 0, 50, 9, false)
	var got []string
	for j := h.Pop(); j != nil; j = h.Pop() {
		got = append(got, j.ID())
	}
	want := []string{"high", "mid-lifo", "mid", "low", "none-lifo-2", "none-lifo-1", "none-early", "none-a", "neg"}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func BenchmarkHeapPushPop1M(b *testing.B) {
	const n = 1 << 20
	jobs := make([]*Job, n)
	keys := make([][3]int64, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range jobs {
		jobs[i] = &Job{}
		keys[i] = [3]int64{int64(rng.IntN(10)), rng.Int64N(1 << 40), int64(i)}
	}
	h := newHeap(heapPlace)
	for i, j := range jobs {
		h.Push(j, keys[i][0], keys[i][1], keys[i][2])
	}
	b.ReportAllocs()
	b.ResetTimer()
	// One op = pop the first of a million and push it back.
	for i := 0; i < b.N; i++ {
		j := h.Pop()
		k := i % n
		h.Push(j, keys[k][0], keys[k][1], int64(n+i))
	}
}

func BenchmarkHeapFill1M(b *testing.B) {
	const n = 1 << 20
	jobs := make([]*Job, n)
	for i := range jobs {
		jobs[i] = &Job{}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h := newHeap(heapPlace)
		for k, j := range jobs {
			h.Push(j, int64(k%7), int64(k), int64(k))
		}
		for h.Pop() != nil {
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(2*n), "ns/heap-op")
}

// TestHentSize: a heap entry is 32 bytes, one for every waiting job; and
// priorities past the 32 bits it keeps still order against the rest.
func TestHentSize(t *testing.T) {
	t.Parallel()
	if n := unsafe.Sizeof(hent{}); n != 32 {
		t.Errorf("a heap entry is %d bytes, want 32", n)
	}
	h := newHeap(heapPlace)
	keys := []int64{math.MinInt64, -maxPriority, 0, maxPriority, math.MaxInt32 + 1, math.MaxInt64}
	jobs := make([]*Job, len(keys))
	for i, p := range keys {
		jobs[i] = withID(&Job{}, fmt.Sprint(i))
		h.Push(jobs[i], p, 0, int64(i))
	}
	// Higher first; the two past MaxInt32 tie at the edge and fall back
	// to their sequence numbers.
	want := []int{4, 5, 3, 2, 1, 0}
	for _, w := range want {
		if j := h.Pop(); j != jobs[w] {
			t.Fatalf("popped %v, want job %d", j, w)
		}
	}
}
