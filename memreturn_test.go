package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"
)

// TestMemReturnOnlyWhenIdle: free memory is given back after a quiet
// interval with enough of it free, once per quiet spell, never after a
// busy interval or when there is little to give.
func TestMemReturnOnlyWhenIdle(t *testing.T) {
	t.Parallel()
	var work int64
	var free uint64
	released := 0
	m := &memReturn{minFree: 100, activity: func() int64 { return work },
		free: func() uint64 { return free }, release: func() { released++ }}
	last := m.check(0)
	for _, step := range []struct {
		busy bool
		free uint64
		want int
	}{
		{true, 1000, 0},  // busy, plenty free
		{false, 10, 0},   // idle, too little free
		{false, 1000, 1}, // idle, plenty free
		{false, 1000, 0}, // still idle: once per quiet spell, whatever the figure says
		{true, 1000, 0},  // busy again
		{false, 1000, 1}, // quiet again
	} {
		if step.busy {
			work++
		}
		free, released = step.free, 0
		last = m.check(last)
		if released != step.want {
			t.Fatalf("%+v: released %d times, want %d", step, released, step.want)
		}
	}
}

// TestMemReturnStops: the loop runs its checks and ends on Stop.
func TestMemReturnStops(t *testing.T) {
	t.Parallel()
	// Each check reads the activity count (a release comes only once
	// per quiet spell, so releases would not show a loop still running).
	var released, checks atomic.Int64
	m := &memReturn{every: time.Millisecond, minFree: 1, activity: func() int64 { checks.Add(1); return 0 },
		free: func() uint64 { return 1 }, release: func() { released.Add(1) }}
	m.start()
	eventually(t, 10*time.Second, "the loop's first release", func() (bool, string) {
		return released.Load() > 0, "none"
	})
	m.Stop()
	m.Stop() // twice is harmless
	after := checks.Load()
	if after == 0 {
		t.Fatal("the loop never checked")
	}
	// A loop of the same period, started now, checks ten times: the
	// stopped one would have too.
	var ref atomic.Int64 // its checks: each reads the activity count
	r := &memReturn{every: time.Millisecond, minFree: 1, activity: func() int64 { ref.Add(1); return 0 },
		free: func() uint64 { return 1 }, release: func() {}}
	r.start()
	eventually(t, 10*time.Second, "ten checks of another loop", func() (bool, string) {
		n := ref.Load()
		return n >= 10, fmt.Sprint(n)
	})
	r.Stop()
	if n := checks.Load(); n != after {
		t.Fatalf("the loop went on after Stop: %d checks, %d when it stopped", n, after)
	}
}

// TestHeapReclaimableReads: the runtime metrics it reads are there and
// move: 64 MiB made garbage count as reclaimable, and after a collection
// and a release they no longer do.
//
// Serial: it measures the test process's heap.
func TestHeapReclaimableReads(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection midway
	runtime.GC()
	keep := make([][]byte, 64)
	for i := range keep {
		keep[i] = make([]byte, 1<<20)
	}
	runtime.KeepAlive(keep)
	keep = nil
	if n := heapReclaimable(); n < 32<<20 {
		t.Fatalf("%d bytes reclaimable with 64 MiB of garbage", n)
	}
	debug.FreeOSMemory()
	if n := heapReclaimable(); n >= 32<<20 {
		t.Fatalf("%d bytes reclaimable after a release", n)
	}
}

// TestGCHoldsNest: overlapping holds restore the setting in force before
// the first one, whatever order they end in.
//
// Serial: it measures the test process's heap.
func TestGCHoldsNest(t *testing.T) {
	before := debug.SetGCPercent(77)
	defer debug.SetGCPercent(before)
	limit := debug.SetMemoryLimit(-1)
	holdGC()
	if l := debug.SetMemoryLimit(-1); availableMemory() > 0 && l == limit {
		t.Errorf("no memory limit stands for the hold (limit %d)", l)
	}
	holdGC()
	if p := debug.SetGCPercent(-1); p != -1 {
		t.Fatalf("GC percent %d while held, want -1 (off)", p)
	}
	releaseGC()
	if p := debug.SetGCPercent(-1); p != -1 {
		t.Fatalf("GC percent %d with one hold left, want -1 (off)", p)
	}
	releaseGC()
	if p := debug.SetGCPercent(77); p != 77 {
		t.Fatalf("GC percent %d after the last release, want 77", p)
	}
	if l := debug.SetMemoryLimit(-1); l != limit {
		t.Fatalf("memory limit %d after the last release, want %d as before", l, limit)
	}
}

// TestAvailableMemory: on Linux the figure is there and plausible.
func TestAvailableMemory(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/meminfo")
	}
	if a := availableMemory(); a < 16<<20 || a > 1<<50 {
		t.Fatalf("available memory %d bytes", a)
	}
}
