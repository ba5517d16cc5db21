package main

// The scheduler's processors follow the load. At a steady, light rate
// (the official client at 1,000 jobs a second, the server using a tenth
// of a core) a job costs mostly wake-ups: each request readies a
// goroutine, the runtime wakes a second thread to run it on the idle
// processor, and that thread spins looking for more work before it
// sleeps again (futex calls and nanosleeps: 5.5 and 4.3 a job). With one
// processor the same run cost the server 0.081 ms of CPU a job instead of
// 0.110, with the job's latency no worse. So while the server uses little
// CPU it runs on one processor, and it takes all of them back as soon as
// it uses more than one could give comfortably: bulk work, a burst, a
// heavy query.
//
// In PostgreSQL mode the server mostly waits on the database, which on a
// small host runs on the same cores: there one processor serves until it
// is nearly busy (procsPG). Through `queued bench steady` on two cores
// shared with PostgreSQL, in turn with the old levels, medians of 3: at
// 1,000 jobs a second the server spent 0.280 against 0.356 ms of CPU a
// job and p99 was 13 against 21 ms; at 1,500 (past this machine's edge
// either way) 0.270 against 0.318 ms, the database a tenth less; bulk
// pushes and drains ran as fast (docs/performance.md). A large request
// frame does not bring the processors back there: a bulk load waits on
// the database, not on the server.
//
// GOMAXPROCS set by the operator is left alone, as is a machine of one
// processor. Going back up asks the runtime for its default again
// (runtime.SetDefaultGOMAXPROCS), so that a container's CPU quota is
// still followed. A rise waits for a garbage collection under way to
// finish (the runtime's rule), so a burst that meets one stays on one
// processor until it has.

import (
	"log/slog"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// procsEvery is how often the server's CPU use is read.
	procsEvery = 100 * time.Millisecond
	// procsLow: below this many cores used, for procsQuiet looks in a
	// row, one processor is tried (every look, not their average). On
	// two, a load costs more than on one: the official client at 1,000
	// jobs/s kept the server at 0.28-0.33 of a core on two processors and
	// 0.17 on one, so a lower level (0.3, before) left it on two.
	// Whether one processor serves the load as well is what the trial
	// tells (procsTrial).
	procsLow   = 0.45
	procsQuiet = 20 // 2 s
	// procsHigh: on one processor, past this many cores used in one look,
	// all come back: the one processor is getting busy (memory and SQLite
	// mode; PostgreSQL mode's levels are procsPG).
	procsHigh = 0.5
	// procsBurstBytes: on one processor, a TCP request frame this large
	// (a PUSHB or ACKB of tens of jobs) brings all back at once, before
	// the next look. A bulk push of 100,000 jobs after a quiet spell takes
	// a tenth of a second, and ran 30% slower on one processor.
	procsBurstBytes = 4 << 10
	// procsTrial: for this many looks after going down to one, the
	// requests served a second are compared with those of the quiet looks
	// before (memory and SQLite mode). An open-loop load (requests sent
	// at a rate, as most clients do) is served as fast on one processor,
	// and cheaper. A closed-loop one (a Worker of concurrency 50 working a
	// backlog as fast as the answers come) at 0.3-0.45 of a core ran 12%
	// slower on one (the upstream benchmark's Process row,
	// docs/performance.md), and the CPU reading alone cannot tell the two
	// apart: when the requests fall by more than procsTrialLoss (and by
	// procsTrialFloor a second, so that a few requests of an idle server
	// do not count) all come back, and the tuner waits procsHold looks
	// before it tries again. It waits as long when the one processor got
	// busy during the trial: the load would take it down and up again.
	procsTrial      = 10 // 1 s
	procsTrialLoss  = 0.07
	procsTrialFloor = 20.0
	procsHold       = 300 // 30 s
	// procsNewLoad: on one processor after a trial, procsNewLooks looks
	// in a row with more than twice the requests a second the trial saw,
	// and procsNewLoad more, are a new load (a Worker starting on an idle
	// server): all come back, and it has a trial of its own once it has
	// been quiet for procsQuiet looks.
	procsNewLoad  = 200.0
	procsNewLooks = 3
)

// procsLevels are the thresholds a tuner follows, in cores used: below
// low for procsQuiet looks in a row it goes down to one processor, past
// high on one for rise looks in a row it takes all back; burst: a large
// request frame takes all back too; one: it starts on one processor;
// trial: one processor is kept only if it serves the load as fast
// (procsTrial).
type procsLevels struct {
	low, high         float64
	rise              int
	burst, one, trial bool
}

var (
	// procsLocal: memory and SQLite mode, where the server does the work.
	procsLocal = procsLevels{low: procsLow, high: procsHigh, rise: 1, burst: true, trial: true}
	// procsPG: PostgreSQL mode; high leaves room for the one processor to
	// answer without a queue of runnable goroutines, and takes three looks
	// (a burst of answers from the database is not a load). It starts on
	// one: a load that comes at once would otherwise keep all of them, its
	// looks at two processors seldom all under low in a row.
	procsPG = procsLevels{low: 0.6, high: 0.8, rise: 3, one: true}
)

// procsTuning is off in the tests' own process, whose in-process servers
// (a serve command run by a test) share its runtime.
var procsTuning = true

// procsOne is set while the server runs on one processor; procsWake
// asks the tuner for all of them (procsBurst).
// procsBursts is set when large frames bring the processors back
// (procsLevels.burst).
var (
	procsOne    atomic.Bool
	procsBursts atomic.Bool
	procsWake   = make(chan struct{}, 1)
	// procsCounting is set while the tuner counts requests in
	// procsRequests (procsLevels.trial): after a quiet look on all
	// processors, and on one.
	procsCounting atomic.Bool
	procsRequests atomic.Int64
)

// procsRequest tells the tuner of a request (a frame of the wire
// protocol, over TCP or a WebSocket, or an HTTP request): one load of a
// flag, and a count while the tuner wants one.
func procsRequest() {
	if procsCounting.Load() {
		procsRequests.Add(1)
	}
}

// procsBurst tells the tuner of a request frame of n bytes: one load of a
// flag on the request path, a channel send when the frame is large and
// the server on one processor. The sender then yields, so that the tuner
// runs now rather than when this goroutine next blocks.
func procsBurst(n int) {
	if n >= procsBurstBytes && procsOne.Load() && procsBursts.Load() {
		select {
		case procsWake <- struct{}{}:
			runtime.Gosched()
		default:
		}
	}
}

// procsTuner moves GOMAXPROCS between all the processors and one.
type procsTuner struct {
	lv       procsLevels
	all, cur int
	quiet    int // looks in a row below lv.low
	busy     int // on one processor, looks in a row past lv.high
	// The requests a second of the quiet looks (those counted: -1 is a
	// look without a count), and of the trial on one processor; base is
	// the trial's, once it kept one.
	before, during procsRate
	base           float64
	trial          int  // looks of the trial still to come
	hold           int  // looks before going down may be tried again
	grow           int  // on one after a trial, looks in a row past the base
	counted        bool // requests were counted during the look under way
	log            *slog.Logger
	stop           chan struct{}
	done           chan struct{}
}

// startProcsTuner starts following the load at the levels lv; nil when
// GOMAXPROCS is the operator's or there is one processor only.
func startProcsTuner(log *slog.Logger, lv procsLevels) *procsTuner {
	if _, set := os.LookupEnv("GOMAXPROCS"); set || !procsTuning {
		return nil
	}
	all := runtime.GOMAXPROCS(0)
	if all < 2 {
		return nil
	}
	procsBursts.Store(lv.burst)
	t := &procsTuner{lv: lv, all: all, cur: all, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	if lv.one {
		t.set(1)
	}
	go t.run()
	return t
}

// procsRate sums the requests a second of some looks.
type procsRate struct {
	sum   float64
	looks int
}

func (r *procsRate) add(reqs float64) {
	if reqs >= 0 {
		r.sum += reqs
		r.looks++
	}
}

func (r procsRate) mean() float64 {
	if r.looks == 0 {
		return 0
	}
	return r.sum / float64(r.looks)
}

// next is the processors to run with after a look that found cores used
// and reqs requests a second (-1: not counted) since the last.
func (t *procsTuner) next(cores, reqs float64) int {
	if t.cur == 1 {
		return t.nextOnOne(cores, reqs)
	}
	if t.hold > 0 {
		t.hold--
		return t.cur
	}
	if cores < t.lv.low {
		t.quiet++
		t.before.add(reqs)
	} else {
		t.quiet = 0
		t.before = procsRate{}
	}
	if t.quiet >= procsQuiet {
		before := t.before
		t.restart()
		if t.lv.trial {
			t.before, t.trial = before, procsTrial
		}
		return 1
	}
	return t.cur
}

// nextOnOne is next on one processor.
func (t *procsTuner) nextOnOne(cores, reqs float64) int {
	if cores <= t.lv.high {
		t.busy = 0
	} else if t.busy++; t.busy >= t.lv.rise {
		inTrial := t.trial > 0
		t.restart()
		if inTrial {
			t.hold = procsHold
		}
		return t.all
	}
	switch {
	case !t.lv.trial:
	case t.trial > 0:
		t.during.add(reqs)
		if t.trial--; t.trial == 0 {
			if t.slower() {
				t.restart()
				t.hold = procsHold
				return t.all
			}
			t.base = t.during.mean()
		}
	case reqs > 2*t.base+procsNewLoad:
		if t.grow++; t.grow >= procsNewLooks {
			t.restart()
			return t.all
		}
	default:
		t.grow = 0
	}
	return 1
}

// slower reports whether the trial on one processor served fewer
// requests a second than the quiet looks before it, by more than chance.
func (t *procsTuner) slower() bool {
	before, during := t.before.mean(), t.during.mean()
	return before-during > max(before*procsTrialLoss, procsTrialFloor)
}

// restart forgets the looks counted toward a change, and a trial.
func (t *procsTuner) restart() {
	t.quiet, t.busy, t.trial, t.grow = 0, 0, 0, 0
	t.before, t.during, t.base = procsRate{}, procsRate{}, 0
}

// counting reports whether the next look wants the requests counted: on
// levels with a trial, after a quiet look on all processors (unless
// held), and on one.
func (t *procsTuner) counting() bool {
	if !t.lv.trial {
		return false
	}
	return t.cur == 1 || (t.quiet > 0 && t.hold == 0)
}

func (t *procsTuner) run() {
	defer close(t.done)
	tick := time.NewTicker(procsEvery)
	defer tick.Stop()
	last, _ := cpuTime()
	lastAt := time.Now()
	defer procsCounting.Store(false)
	for {
		var n int
		select {
		case <-t.stop:
			t.set(t.all)
			return
		case <-procsWake:
			t.restart()
			n = t.all
		case <-tick.C:
			used, ok := cpuTime()
			if !ok {
				t.restart()
				n = t.all // no reading: the safe side
				break
			}
			now := time.Now()
			secs := now.Sub(lastAt).Seconds()
			cores := (used - last).Seconds() / secs
			reqs := float64(procsRequests.Swap(0)) / secs
			if !t.counted {
				reqs = -1
			}
			last, lastAt = used, now
			n = t.next(cores, reqs)
		}
		t.set(n)
		t.counted = t.counting()
		procsCounting.Store(t.counted)
		if !t.counted {
			procsRequests.Store(0)
		}
	}
}

// set runs the server on n processors: 1, or all of them as the runtime
// would choose now (t.all follows it).
func (t *procsTuner) set(n int) {
	if n == t.cur {
		return
	}
	if n == 1 {
		runtime.GOMAXPROCS(1)
	} else {
		runtime.SetDefaultGOMAXPROCS()
		n = runtime.GOMAXPROCS(0)
		t.all = n
	}
	t.cur = n
	procsOne.Store(n == 1)
	t.log.Debug("processors follow the load", "gomaxprocs", n)
}

// Close stops following the load and gives all the processors back. Nil
// does nothing.
func (t *procsTuner) Close() {
	if t == nil {
		return
	}
	close(t.stop)
	<-t.done
}

// cpuTime is the process's CPU time so far, user and system; false when
// it cannot be read.
func cpuTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
