package main

import (
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestProcsTunerDecides: the processors go down to one only after
// procsQuiet looks in a row below procsLow (a busy look starts the count
// again), and back to all at the first look past procsHigh on one.
func TestProcsTunerDecides(t *testing.T) {
	t.Parallel()
	tn := &procsTuner{lv: procsLocal, all: 4, cur: 4}
	look := func(cores float64) int {
		tn.cur = tn.next(cores, -1)
		return tn.cur
	}
	for i := range procsQuiet - 1 {
		if n := look(0.1); n != 4 {
			t.Fatalf("look %d below procsLow: %d processors, want 4", i+1, n)
		}
	}
	if n := look(procsLow + 0.1); n != 4 {
		t.Fatalf("a busy look: %d", n)
	}
	for range procsQuiet - 1 {
		look(0.1)
	}
	if n := look(0.1); n != 1 {
		t.Fatalf("after %d quiet looks in a row: %d processors, want 1", procsQuiet, n)
	}
	if n := look(procsHigh - 0.1); n != 1 {
		t.Fatalf("on one, a look under procsHigh: %d", n)
	}
	if n := look(procsHigh + 0.1); n != 4 {
		t.Fatalf("on one, a look past procsHigh: %d, want all", n)
	}
}

// TestProcsTunerTrial: after going down, one processor is kept only if
// it serves the requests of the quiet looks before it. A load that falls
// by more than procsTrialLoss on one (a closed loop waiting on each
// answer) takes all back at the trial's end, and going down is not tried
// again for procsHold looks; a load that holds stays on one, until a new
// load comes; a few requests of an idle server are no loss.
func TestProcsTunerTrial(t *testing.T) {
	t.Parallel()
	down := func(tn *procsTuner, reqs float64) {
		t.Helper()
		look := func(cores, reqs float64) int { tn.cur = tn.next(cores, reqs); return tn.cur }
		if n := look(0.4, -1); n != 4 || !tn.counting() {
			t.Fatalf("a first quiet look: %d processors, counting %v; want 4 and counting", n, tn.counting())
		}
		for i := range procsQuiet - 1 {
			if n := look(0.4, reqs); (n == 1) != (i == procsQuiet-2) {
				t.Fatalf("quiet look %d of %d: %d processors", i+2, procsQuiet, n)
			}
		}
		if tn.trial != procsTrial || !tn.counting() || tn.before.mean() != reqs || tn.before.looks != procsQuiet-1 {
			t.Fatalf("going down: trial %d, counting %v, before %+v; want %d looks, counting, %v requests a second over %d looks",
				tn.trial, tn.counting(), tn.before, procsTrial, reqs, procsQuiet-1)
		}
	}
	trial := func(tn *procsTuner, reqs float64) int {
		for i := range procsTrial - 1 {
			if tn.cur = tn.next(0.3, reqs); tn.cur != 1 {
				t.Fatalf("trial look %d: %d processors before the trial's end", i+1, tn.cur)
			}
		}
		tn.cur = tn.next(0.3, reqs)
		return tn.cur
	}

	// An open-loop load: as many requests on one, within chance. The
	// count goes on: a new load gets a trial of its own.
	tn := &procsTuner{lv: procsLocal, all: 4, cur: 4}
	down(tn, 4000)
	held := 4000*(1-procsTrialLoss) + 1
	if n := trial(tn, held); n != 1 || !tn.counting() || tn.base != held {
		t.Fatalf("a load that held: %d processors, counting %v, base %v; want 1, counting, %v", n, tn.counting(), tn.base, held)
	}
	// Twice the base and procsNewLoad more, procsNewLooks looks in a row:
	// a new load, all back with no hold. A look under it starts the count
	// again.
	more := 2*held + procsNewLoad + 1
	for range procsNewLooks - 1 {
		if tn.cur = tn.next(0.3, more); tn.cur != 1 {
			t.Fatalf("%d processors before %d looks past the base", tn.cur, procsNewLooks)
		}
	}
	if tn.cur = tn.next(0.3, more-2); tn.cur != 1 || tn.grow != 0 {
		t.Fatalf("a look under the new-load level: %d processors, grow %d; want 1, 0", tn.cur, tn.grow)
	}
	for range procsNewLooks - 1 {
		tn.cur = tn.next(0.3, more)
	}
	if tn.cur = tn.next(0.3, more); tn.cur != 4 || tn.hold != 0 {
		t.Fatalf("a new load: %d processors, hold %d; want all, no hold", tn.cur, tn.hold)
	}
	down(tn, more)

	// A closed loop: 12% fewer requests on one.
	tn = &procsTuner{lv: procsLocal, all: 4, cur: 4}
	down(tn, 4000)
	if n := trial(tn, 4000*0.88); n != 4 {
		t.Fatalf("a load 12%% slower on one: %d processors, want all", n)
	}
	for i := range procsHold {
		if tn.cur = tn.next(0.1, -1); tn.cur != 4 || tn.counting() {
			t.Fatalf("quiet look %d of the hold: %d processors, counting %v", i+1, tn.cur, tn.counting())
		}
	}
	down(tn, 4000)

	// An idle server: a few requests less is chance.
	tn = &procsTuner{lv: procsLocal, all: 4, cur: 4}
	down(tn, 10)
	if n := trial(tn, 0); n != 1 {
		t.Fatalf("an idle server that lost 10 requests a second: %d processors, want 1", n)
	}

	// Past high during the trial: all at once, as outside one, and a hold:
	// the load would take it down and up again.
	tn = &procsTuner{lv: procsLocal, all: 4, cur: 4}
	down(tn, 4000)
	if tn.cur = tn.next(procsHigh+0.1, 9000); tn.cur != 4 || tn.trial != 0 || tn.hold != procsHold {
		t.Fatalf("a busy look in the trial: %d processors, trial %d, hold %d; want all, no trial, hold %d", tn.cur, tn.trial, tn.hold, procsHold)
	}

	// PostgreSQL mode has no trial: it counts nothing, and one processor
	// stays whatever the requests.
	tn = &procsTuner{lv: procsPG, all: 4, cur: 4}
	for range procsQuiet {
		if tn.cur = tn.next(0.1, -1); tn.counting() {
			t.Fatal("PostgreSQL levels: counting requests")
		}
	}
	if tn.cur != 1 || tn.trial != 0 {
		t.Fatalf("PostgreSQL levels after %d quiet looks: %d processors, trial %d; want 1, none", procsQuiet, tn.cur, tn.trial)
	}
	for range 50 {
		if tn.cur = tn.next(0.1, 1e6); tn.cur != 1 {
			t.Fatalf("PostgreSQL levels on one: %d processors at a million requests a second and 0.1 of a core", tn.cur)
		}
	}
}

// TestProcsRequestCounts: requests are counted only while the tuner asks
// for a count.
// Serial: it sets the process's flags, which the in-process servers of
// parallel tests read on every request.
func TestProcsRequestCounts(t *testing.T) {
	defer procsCounting.Store(procsCounting.Load())
	defer procsRequests.Store(procsRequests.Load())
	procsCounting.Store(false)
	procsRequests.Store(0)
	procsRequest()
	if n := procsRequests.Load(); n != 0 {
		t.Fatalf("not counting: %d requests counted", n)
	}
	procsCounting.Store(true)
	procsRequest()
	procsRequest()
	if n := procsRequests.Load(); n != 2 {
		t.Fatalf("counting: %d requests counted, want 2", n)
	}
}

// TestProcsTunerPGLevels: in PostgreSQL mode the tuner starts on one
// processor, a single look past the high level is not enough to take all
// back (a burst of answers), rise looks in a row are; a large frame does
// not count, and it comes back down only below the PostgreSQL low level.
func TestProcsTunerPGLevels(t *testing.T) {
	t.Parallel()
	lv := procsPG
	if procsLocal.low != procsLow || procsLow != 0.45 || lv.low != 0.6 || lv.high != 0.8 {
		t.Fatalf("levels: memory low %v, PostgreSQL %+v; want 0.45, and 0.6 to 0.8 (the levels docs/performance.md measured)", procsLow, lv)
	}
	if !lv.one || lv.burst || lv.rise < 2 || lv.low >= lv.high || lv.high <= procsHigh {
		t.Fatalf("levels %+v: want a start on one, no bursts, rise of 2 or more, low under high, high past memory mode's %v", lv, procsHigh)
	}
	tn := &procsTuner{lv: lv, all: 2, cur: 1}
	look := func(cores float64) int {
		tn.cur = tn.next(cores, -1)
		return tn.cur
	}
	// Memory mode's high level is no load here.
	for range 10 {
		if n := look(procsHigh + 0.1); n != 1 {
			t.Fatalf("at %v cores (under %v): %d processors, want 1", procsHigh+0.1, lv.high, n)
		}
	}
	for i := range lv.rise - 1 {
		if n := look(lv.high + 0.1); n != 1 {
			t.Fatalf("busy look %d of %d: %d processors, want 1", i+1, lv.rise, n)
		}
	}
	if n := look(lv.high - 0.05); n != 1 {
		t.Fatalf("a look under high: %d", n)
	}
	// The count starts again after a look under high.
	for i := range lv.rise - 1 {
		if n := look(lv.high + 0.1); n != 1 {
			t.Fatalf("busy look %d after a quiet one: %d processors, want 1", i+1, n)
		}
	}
	if n := look(lv.high + 0.1); n != 2 {
		t.Fatalf("%d busy looks in a row: %d processors, want all", lv.rise, n)
	}
	// Down again only below low, procsQuiet looks in a row.
	for range procsQuiet + 5 {
		if n := look(lv.low + 0.05); n != 2 {
			t.Fatalf("at %v cores (over low): %d processors, want all", lv.low+0.05, n)
		}
	}
	for range procsQuiet - 1 {
		look(lv.low - 0.1)
	}
	if n := look(lv.low - 0.1); n != 1 {
		t.Fatalf("after %d quiet looks: %d processors, want 1", procsQuiet, n)
	}
}

// TestProcsBurstFollowsTheLevels: a large frame on one processor asks the
// tuner for all of them only where the levels say so (not in PostgreSQL
// mode).
// Serial: it sets the process's flags, which the in-process servers of
// parallel tests read on every request frame.
func TestProcsBurstFollowsTheLevels(t *testing.T) {
	defer procsOne.Store(procsOne.Load())
	defer procsBursts.Store(procsBursts.Load())
	drain := func() int {
		n := 0
		for {
			select {
			case <-procsWake:
				n++
			default:
				return n
			}
		}
	}
	drain()
	procsOne.Store(true)
	for _, lv := range []procsLevels{procsPG, procsLocal} {
		procsBursts.Store(lv.burst)
		procsBurst(procsBurstBytes - 1)
		if n := drain(); n != 0 {
			t.Fatalf("a frame under procsBurstBytes woke the tuner (burst %v)", lv.burst)
		}
		procsBurst(1 << 20)
		if n, want := drain(), map[bool]int{false: 0, true: 1}[lv.burst]; n != want {
			t.Fatalf("levels with burst %v: a large frame woke the tuner %d times, want %d", lv.burst, n, want)
		}
	}
	// On all processors nothing is asked.
	procsOne.Store(false)
	procsBurst(1 << 20)
	if n := drain(); n != 0 {
		t.Fatal("a large frame on all processors woke the tuner")
	}
}

// needProcsTuner skips a test of the release binary's tuner where it
// does not run: one processor, or GOMAXPROCS set.
func needProcsTuner(t *testing.T) {
	t.Helper()
	if runtime.NumCPU() < 2 {
		t.Skip("one processor: nothing to follow")
	}
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		t.Skip("GOMAXPROCS is set: the server leaves it alone")
	}
}

// pushBurst pushes 100 jobs in one PUSHB: a frame past procsBurstBytes.
func pushBurst(c *tclient) {
	jobs := make([]any, 100)
	for i := range jobs {
		jobs[i] = M{"data": M{"pad": strings.Repeat("x", 64), "i": i}}
	}
	c.ok(M{"cmd": "PUSHB", "queue": "burst", "jobs": jobs})
}

// TestProcsPGStartsOnOne: the release binary in PostgreSQL mode runs on
// one processor from its start, and a bulk push, which waits on the
// database, does not take all back (in memory mode the tuner has done so
// before the push is answered).
func TestProcsPGStartsOnOne(t *testing.T) {
	t.Parallel()
	needProcsTuner(t)
	ns := pgTestNamespace(t)
	srv := startBinary(t, "--postgres-url", testPGURL(), "--postgres-namespace", ns, "--log-level", "debug")
	// From its start: the log says so before the server says it started
	// (startBinary waits for that), not after a quiet spell.
	out := srv.output()
	one, started := strings.Index(out, "gomaxprocs=1"), strings.Index(out, "queued started")
	if one < 0 || started < 0 || one > started {
		t.Fatalf("want gomaxprocs=1 logged before the start:\n%s", out)
	}
	c := dial(t, srv.addr())
	pushBurst(c)
	// A frame of this size took all back in memory mode at once, before
	// the answer (TestProcsFollowTheLoad).
	if all := regexp.MustCompile(`gomaxprocs=([2-9]|[1-9][0-9]+)\b`); all.MatchString(srv.output()) {
		t.Fatalf("a bulk push took all processors back in PostgreSQL mode:\n%s", srv.output())
	}
}

// TestProcsFollowTheLoad: the release binary, left alone, runs on one
// processor (its log says so at debug level), and a bulk push brings all
// of them back at once.
func TestProcsFollowTheLoad(t *testing.T) {
	t.Parallel()
	needProcsTuner(t)
	srv := startBinary(t, "--memory", "--log-level", "debug")
	eventually(t, 60*time.Second, "the idle server on one processor", func() (bool, string) {
		return strings.Contains(srv.output(), "gomaxprocs=1"), "no gomaxprocs=1 in the log yet"
	})
	c := dial(t, srv.addr())
	pushBurst(c)
	// All: however many the runtime gave it at its start (a container's
	// CPU quota may make them fewer than the machine's), more than one.
	all := regexp.MustCompile(`gomaxprocs=([2-9]|[1-9][0-9]+)\b`)
	eventually(t, 30*time.Second, "all processors back after a bulk push", func() (bool, string) {
		return all.MatchString(srv.output()), "no gomaxprocs above 1 in the log yet"
	})
}
