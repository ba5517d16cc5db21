package main

// The collector's pace follows the live heap. Go collects when the heap
// has grown by GOGC percent of what the last collection found live: 100,
// so a server holding 25 MB of jobs collected at every 25 MB allocated,
// twice a second at 20,000 jobs/s, each time with a quarter of the
// processors marking for over 10 ms. While the live heap is small the
// collector may let garbage take up to gcHeadroom beyond it instead
// (GOGC up to gcPercentMax); from 100 MB live on, GOGC is the default.
// Through queued bench steady at 20,000 jobs/s in memory mode, in turn,
// 6 runs each: p99 6.1-10.1 ms (median 6.5) against 7.4-10.9 (8.8), p90
// (3 runs each) 1.16-1.23 against 1.35-1.43, the server's CPU a job the
// same (docs/performance.md). What it costs is memory under load, at
// most gcHeadroom more; once the server is quiet it is given back
// (memreturn.go), and near the memory budget the runtime's soft limit
// (memlimit.go) collects sooner whatever GOGC says.
//
// Memory mode only. In SQLite mode the same pace made the same runs
// worse, in turn with Go's default (GOGC=100), 8 runs each: p99 16-200
// ms (median 93) against 16-91 (23); in two other runs the workers fell
// behind for good (p50 1.5 s), which no run of the build before did. Why
// is not known: SQLite's own memory is not the Go heap's. PostgreSQL
// mode was not measured with it.
//
// GOGC set by the operator is left alone, and so is the collector while a
// recovery holds it (holdGC): the hold restores what it found. The pace
// is set from the memory watch's looks, so with no memory budget
// (--max-memory 0) there is none either.

import (
	"os"
	"runtime/debug"
)

const (
	gcHeadroom   = 100 << 20 // garbage the collector may let grow beyond what is live
	gcPercentMax = 400
)

// gcPace is the pace set last; pacing is off (operator's GOGC) until
// startGCPace. Guarded by gcHolds' mutex, the one for the collector's
// settings.
var gcPace struct {
	on      bool
	percent int
}

// startGCPace lets paceGC set GOGC, unless the operator did; in memory
// mode only (above).
func startGCPace() {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	gcHolds.Lock()
	gcPace.on, gcPace.percent = true, 100
	gcHolds.Unlock()
}

// gcPercentFor is the GOGC that lets garbage take gcHeadroom beyond a
// live heap of live bytes, between the default and gcPercentMax.
func gcPercentFor(live int64) int {
	if live <= 0 {
		return gcPercentMax
	}
	return int(min(max(gcHeadroom*100/live, 100), gcPercentMax))
}

// paceGC sets GOGC for the live heap a collection found, when the pace
// it calls for is a quarter off the one in force (so that a heap moving
// a little does not reset it at every collection).
func paceGC(live int64) {
	want := gcPercentFor(live)
	gcHolds.Lock()
	defer gcHolds.Unlock()
	if !gcPace.on || gcHolds.n > 0 {
		return
	}
	if cur := gcPace.percent; want*4 > cur*3 && want*4 < cur*5 {
		return
	}
	debug.SetGCPercent(want)
	gcPace.percent = want
}
