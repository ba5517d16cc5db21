package main

import (
	"sync"
	"testing"
	"time"
)

func TestHistogramBucketsAndQuantiles(t *testing.T) {
	t.Parallel()
	h := newHistogram(opBounds)
	if s := h.Snapshot(); s.Count != 0 || s.QuantileMs(0.5) != 0 || s.MeanMs() != 0 {
		t.Fatalf("empty histogram: %+v", s)
	}
	// 0.0001 s is its own bucket's upper bound: the bound is inclusive, as
	// Prometheus' "le" says.
	h.Observe(100 * time.Microsecond)
	h.Observe(300 * time.Microsecond)
	h.Observe(2 * time.Millisecond)
	h.Observe(20 * time.Second) // past the last bound
	s := h.Snapshot()
	want := map[float64]int64{0.0001: 1, 0.0005: 2, 0.001: 2, 0.0025: 3, 10: 3}
	for i, b := range s.Bounds {
		if w, ok := want[b]; ok && s.Cumulative[i] != w {
			t.Errorf("le=%v: %d, want %d", b, s.Cumulative[i], w)
		}
	}
	if inf := s.Cumulative[len(s.Cumulative)-1]; inf != 4 || s.Count != 4 {
		t.Errorf("+Inf bucket %d, count %d; want 4", inf, s.Count)
	}
	if got := s.Sum; got < 20.0023 || got > 20.0024 {
		t.Errorf("sum %v s", got)
	}
	for q, ms := range map[float64]float64{0.25: 0.1, 0.5: 0.5, 0.75: 2.5, 0.99: 10000} {
		if got := s.QuantileMs(q); got != ms {
			t.Errorf("q%v = %v ms, want %v", q, got, ms)
		}
	}
}

// Observations from many goroutines are all counted (run with -race).
func TestHistogramConcurrent(t *testing.T) {
	t.Parallel()
	h := newHistogram(jobBounds)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				h.ObserveMs(int64(i))
			}
		}()
	}
	wg.Wait()
	if s := h.Snapshot(); s.Count != 8000 {
		t.Fatalf("count %d, want 8000", s.Count)
	}
}
