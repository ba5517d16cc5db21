package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

// TestGCPercentFor: garbage may take gcHeadroom beyond a small live heap,
// never less than the default's 100% and never past gcPercentMax.
func TestGCPercentFor(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		live int64
		want int
	}{
		{0, 400}, {5 << 20, 400}, {25 << 20, 400}, {50 << 20, 200}, {80 << 20, 125},
		{100 << 20, 100}, {300 << 20, 100}, {8 << 30, 100},
	} {
		if got := gcPercentFor(c.live); got != c.want {
			t.Errorf("gcPercentFor(%d MB) = %d, want %d", c.live>>20, got, c.want)
		}
	}
}

// gogc is the collector's percent in force.
func gogc(t *testing.T) int64 {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatal("the runtime does not report /gc/gogc:percent")
	}
	return int64(s[0].Value.Uint64())
}

// TestPaceGC: each collection the memory watch sees sets GOGC for the live
// heap it found, once the pace it calls for is a quarter off; a recovery's
// hold on the collector is left alone and gets back the pace it found;
// an operator's GOGC turns pacing off.
//
// Serial: it sets the process's GOGC, which every test shares.
func TestPaceGC(t *testing.T) {
	old := debug.SetGCPercent(100)
	gcHolds.Lock()
	saved := gcPace
	gcPace.on = false
	gcHolds.Unlock()
	t.Cleanup(func() {
		debug.SetGCPercent(old)
		gcHolds.Lock()
		gcPace = saved
		gcHolds.Unlock()
	})
	t.Setenv("GOGC", "") // restored after the test
	os.Unsetenv("GOGC")

	startGCPace()
	paceGC(25 << 20)
	if p := gogc(t); p != 400 {
		t.Fatalf("GOGC %d for 25 MB live, want 400", p)
	}
	paceGC(26 << 20) // 384: within a quarter, left as it is
	if p := gogc(t); p != 400 {
		t.Fatalf("GOGC %d after a 26 MB heap, want it left at 400", p)
	}
	paceGC(60 << 20)
	if p := gogc(t); p != 166 {
		t.Fatalf("GOGC %d for 60 MB live, want 166", p)
	}

	holdGC()
	paceGC(25 << 20)
	releaseGC()
	if p := gogc(t); p != 166 {
		t.Fatalf("GOGC %d after a hold, want the 166 in force before it", p)
	}

	// The memory watch paces on the collections it sees.
	m := newMemLimit(1<<40, true, nil)
	runtime.GC()
	m.look()
	if want, p := gcPercentFor(m.live.Load()), gogc(t); p*4 <= int64(want)*3 || p*4 >= int64(want)*5 {
		t.Fatalf("GOGC %d after the watch saw %d MB live, want about %d", p, m.live.Load()>>20, want)
	}

	// The operator's GOGC is theirs.
	gcHolds.Lock()
	gcPace.on = false
	gcHolds.Unlock()
	debug.SetGCPercent(150)
	t.Setenv("GOGC", "150")
	startGCPace()
	paceGC(10 << 20)
	if p := gogc(t); p != 150 {
		t.Fatalf("GOGC %d with GOGC=150 set by the operator, want 150", p)
	}
}
