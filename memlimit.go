package main

// The memory budget for jobs (--max-memory), as Redis' maxmemory with its
// noeviction policy: past it, whatever would make jobs hold more (pushes,
// flows, cron runs, Update, Progress, AddLog, UpdateParent, a schedule, a
// retry of completed or dead-lettered jobs: the commands the table marks
// grows, commands.go) is refused with an error that names the limit,
// while pulls, ACKs, FAILs, removals and reads go on, and once workers
// have made room it is accepted again. A producer faster than its
// workers meets a clear refusal rather than the OOM killer, which in
// memory mode would take every job with it, and a SQLite file never holds
// more than the server can load back.
//
// What is measured is the Go heap that is live: what the last collection
// found, plus an estimate of what was let in since (the figure after a
// collection is a collection old). Growth is refused from memHigh of the
// budget and accepted again under memLow; the runtime's own soft limit is
// the budget, so that garbage is collected before the process passes it.

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// What grows jobs is refused once the live heap reaches memHigh
	// percent of the budget, and accepted again under memLow percent.
	memHigh = 80
	memLow  = 70
	// jobMemOverhead is what a job costs in memory besides its strings:
	// its record, its place in the index and heaps (about 400 bytes
	// measured, TestJobMemOverhead).
	jobMemOverhead = 512
	// memCheckEvery is how often the live heap is looked at; while pushes
	// are refused, a collection is forced when none ran for memForceGC,
	// so that what workers freed is seen.
	memCheckEvery = 100 * time.Millisecond
	memForceGC    = time.Second
)

// memLimit is the process's memory budget for jobs.
type memLimit struct {
	limit     int64 // bytes; 0: no budget
	high, low int64
	// countJobs: jobs live in this process (memory and SQLite modes), so
	// what a push admits is added to the estimate at once.
	countJobs bool
	log       *slog.Logger
	// warn, when set, tells the live side that pushes are being refused
	// (the reference's server:memory-warning); set before the server
	// serves.
	warn func(liveMB, limitMB int64)

	cycles   uint64       // collections seen (look's own)
	live     atomic.Int64 // live heap at the last collection
	admitted atomic.Int64 // estimated bytes of jobs admitted since
	// inflight weighs the requests let in whose handlers still run: in
	// the estimate from the moment they are let in, so that many sent at
	// once cannot all pass while none has yet been weighed. Not reset by
	// a collection: what they add is not yet in the heap it measured.
	inflight atomic.Int64
	refusing atomic.Bool
	refused  atomic.Int64 // pushes refused
	spells   atomic.Int64 // times pushes started being refused

	setLimit bool // setRuntimeLimit set the runtime's limit
	started  bool
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
}

func newMemLimit(limit int64, countJobs bool, log *slog.Logger) *memLimit {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &memLimit{limit: limit, countJobs: countJobs, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	if limit > 0 {
		m.high, m.low = limit/100*memHigh, limit/100*memLow
	}
	return m
}

// defaultMaxMemory is three quarters of the host's memory (the cgroup's
// limit or the machine's); 0 (no budget) when it cannot be read.
func defaultMaxMemory() int64 { return hostMemory() / 4 * 3 &^ (1<<20 - 1) }

// setRuntimeLimit makes the budget the runtime's soft memory limit,
// unless GOMEMLIMIT (or anything else) set one: the collector then works
// harder as the process nears the budget, rather than letting garbage
// take it past. It is set before a data file is loaded, which the load's
// collector hold (holdGC) keeps to.
func (m *memLimit) setRuntimeLimit() {
	if m == nil || m.limit <= 0 {
		return
	}
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set && debug.SetMemoryLimit(-1) == math.MaxInt64 {
		debug.SetMemoryLimit(m.limit)
		m.setLimit = true
	}
}

// start watches the heap until Stop.
func (m *memLimit) start() {
	if m == nil || m.limit <= 0 {
		return
	}
	m.started = true
	m.look()
	go m.run()
}

// Stop ends the watch and gives the runtime its limit back.
func (m *memLimit) Stop() {
	if m == nil {
		return
	}
	if m.started {
		m.once.Do(func() { close(m.stop) })
		<-m.done
	}
	if m.setLimit {
		debug.SetMemoryLimit(math.MaxInt64)
		m.setLimit = false
	}
}

func (m *memLimit) run() {
	defer close(m.done)
	t := time.NewTicker(memCheckEvery)
	defer t.Stop()
	lastGC := time.Now()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		if m.look() {
			lastGC = now
		} else if m.refusing.Load() && now.Sub(lastGC) >= memForceGC {
			// Workers freed jobs, but nothing allocates while pushes are
			// refused: without a collection the figure would not move.
			runtime.GC()
			lastGC = now
			m.look()
		}
	}
}

// look reads the live heap and decides; it reports whether a collection
// ran since it last looked (the figure is new).
func (m *memLimit) look() bool {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	ran := s[1].Value.Uint64() != m.cycles
	if ran {
		m.cycles = s[1].Value.Uint64()
		m.live.Store(int64(s[0].Value.Uint64()))
		m.admitted.Store(0)
		paceGC(int64(s[0].Value.Uint64()))
	}
	m.decide()
	return ran
}

// decide starts or ends refusing pushes from the estimate.
func (m *memLimit) decide() {
	est := m.estimate()
	switch {
	case !m.refusing.Load() && est >= m.high:
		m.startRefusing(est)
	case m.refusing.Load() && est < m.low:
		m.refusing.Store(false)
		m.log.Info("memory back under the budget; pushes accepted again", "live_heap_mb", est>>20,
			"max_memory_mb", m.limit>>20, "refused", m.refused.Load())
	}
}

// estimate is the live heap now, as far as is known.
func (m *memLimit) estimate() int64 {
	return m.live.Load() + m.admitted.Load() + m.inflight.Load()
}

func (m *memLimit) startRefusing(est int64) {
	if m.refusing.Swap(true) {
		return
	}
	m.spells.Add(1)
	m.log.Warn("memory budget reached; pushes and whatever else would add to jobs are refused until workers make room", "live_heap_mb", est>>20,
		"max_memory_mb", m.limit>>20, "refused_from_mb", m.high>>20)
	if m.warn != nil {
		m.warn(est>>20, m.limit>>20)
	}
}

// memUse is what a command does to the memory jobs hold: its class in the
// command table (commands.go), which dispatch gives admitRequest before
// the handler runs.
type memUse uint8

const (
	// memUnset is a line of the table given no class: admitted as
	// memGrows, so that a forgotten class refuses too much rather than
	// lets memory in.
	memUnset memUse = iota
	memGrows
	memWorker
	// memWorkerGrows is a worker's step that keeps what it carries (a
	// FAIL's error and stack, in the job's timeline and attempts): never
	// refused, but weighed as a growing command is.
	memWorkerGrows
	memSteady
)

// admitRequest is the one admission of the command table: a command that
// grows what jobs hold is refused while the budget is spent; let in, it
// answers its admission: its bytes are in the estimate while the handler
// runs (inflight), and its weight (requestWeight) joins it (settle) once
// the command did not answer with an error: a request refused for a bad field made
// nothing, and cannot swell the estimate (and so refuse everyone until
// the next collection) by claiming jobs it never makes. A request whose
// weight takes the estimate past the mark is let in, and the next ones
// are refused: many sent at once pass only until their weight together
// reaches it. The others pass.
//
// A worker's step is never refused. What it can add is bounded apart:
//   - an ACK's result (a URL handler's answer too) is kept in the results
//     cache, whose byte budget is fitted inside this one (fitCaches);
//   - a FAIL's error and stack land in at most maxTimelineEntries
//     timeline and as many attempt entries of the job, the whole job
//     within maxJobBytes (failure.check), and are weighed as the FAIL's
//     bytes (memWorkerGrows), as is the record of a failed child its
//     parent keeps (applyPolicy);
//   - a repeating job's next run, made by its ACK, is weighed (took)
//     though never refused, which would end the schedule;
//   - a child's result copied into its parent's values is weighed too, so
//     that what may be refused is once they pile up: each is within
//     maxResultBytes and a parent has at most maxDeps children, but the
//     values of all parents together have no bound of their own.
//
// In PostgreSQL mode jobs live in the database (countJobs is false):
// nothing is added to the estimate, but what these commands carry still
// passes through the process (a push's jobs parsed and waiting for their
// group commit, an Update's data on its way to the database), so while
// the live heap is over the mark they are refused all the same, and the
// process keeps within its budget.
func (m *memLimit) admitRequest(use memUse, req Map) (admission, error) {
	if use == memWorker || use == memSteady || m == nil || m.limit <= 0 {
		return admission{}, nil
	}
	if use == memWorkerGrows {
		if !m.countJobs {
			return admission{}, nil
		}
		n := int64(req.size())
		m.inflight.Add(n)
		return admission{weight: n, bytes: n}, nil
	}
	if m.refusing.Load() {
		m.refused.Add(1)
		return admission{}, m.errFull()
	}
	if !m.countJobs {
		return admission{}, nil
	}
	adm := admission{weight: requestWeight(req), bytes: int64(req.size())}
	if m.live.Load()+m.admitted.Load()+m.inflight.Add(adm.bytes) >= m.high {
		// This one is in; what comes next waits for room.
		m.startRefusing(m.estimate())
	}
	return adm, nil
}

// admission is what admitRequest let a request in with: its weight, which
// joins the estimate once it made what it asked, and its bytes, in the
// estimate while it runs. Only the bytes, which the request does carry:
// the weight counts a job's own cost for each job a PUSHB may make, and a
// request of half a million jobs refused for a bad field would otherwise
// have started the budget refusing everyone while it ran.
type admission struct{ weight, bytes int64 }

// spent says whether what grows jobs is being refused (false without a
// budget, or in PostgreSQL mode, where jobs are not in the process).
func (m *memLimit) spent() bool {
	return m != nil && m.limit > 0 && m.countJobs && m.refusing.Load()
}

// refuse counts a refusal made past the command table's admission (an
// engine's, for a move that makes a job live again) and answers it.
func (m *memLimit) refuse() error {
	m.refused.Add(1)
	return m.errFull()
}

// settle ends a request's admission: its bytes leave the requests under
// way and, if the command made what it asked (made), its weight joins
// what was admitted since the last collection.
func (m *memLimit) settle(adm admission, made bool) {
	if m == nil || adm == (admission{}) {
		return
	}
	m.inflight.Add(-adm.bytes)
	if made {
		m.took(adm.weight)
	}
}

// requestWeight bounds what a request can make jobs hold: every byte it
// carries (a job's data and strings, new data, a progress, a log line, a
// child's id, a schedule's data all come from it), and a job's own cost
// (jobMemOverhead) for each job it may make, a PUSHB's or PUSHF's jobs
// counted from their array's header.
func requestWeight(req Map) int64 {
	jobs := 1
	if raw := req.Get("jobs"); !raw.IsNil() {
		if n, _, err := arrayHead(raw); err == nil && n > 1 {
			jobs = n
		}
	}
	return int64(req.size()) + int64(jobs)*jobMemOverhead
}

// took adds what weighs n bytes, let in already, to the estimate: a
// command admitted by admitRequest once it did its work, or jobs made on a
// path that may not refuse them (a repeating job's next run, made by its
// ACK), so that what may be refused is once the budget is reached.
func (m *memLimit) took(n int64) {
	if m == nil || m.limit <= 0 || !m.countJobs {
		return
	}
	if m.live.Load()+m.admitted.Add(n) >= m.high {
		// What took it there is in (high is under the limit); what comes
		// next waits for room.
		m.startRefusing(m.estimate())
	}
}

// cacheShare is the part of the budget the results cache, and apart the
// logs cache, may hold at most (1/cacheShare of it each).
const cacheShare = 8

// fitCaches fits the results and logs caches inside the budget. Their own
// byte bounds (maxResultsBytes, maxLogsBytes) are for a large budget: with
// --max-memory 256MiB, ACKs' results alone could otherwise hold all of it,
// and an ACK is never refused. Each cache may hold an eighth of the
// budget, up to its own bound; past that the least recently used entries
// go, as past the bound. Called once the budget is set, before a data
// file is loaded. PostgreSQL mode keeps results and logs in the database.
func (b *MemEngine) fitCaches() {
	m := b.mem
	if m == nil || m.limit <= 0 || !m.countJobs {
		return
	}
	share := m.limit / cacheShare
	locked(&b.rmu, func() { b.results.SetBudget(min(maxResultsBytes, share), rawBytes) })
	locked(&b.lmu, func() { b.logs.SetBudget(min(maxLogsBytes, share), logsBytes) })
}

// errFull is the refusal of whatever would make jobs hold more.
func (m *memLimit) errFull() error {
	return fmt.Errorf("Out of memory: jobs fill the server's memory budget of %s (--max-memory); what would add to them (pushes, updates, progress, logs, retries) is refused until workers make room",
		sizeText(m.limit))
}

// admit lets jobs weighing n bytes (jobMemBytes) in, or refuses them while
// the budget is spent: a cron run, made by the server itself.
func (m *memLimit) admit(n int64) error {
	if m == nil || m.limit <= 0 {
		return nil
	}
	if m.refusing.Load() {
		m.refused.Add(1)
		return m.errFull()
	}
	m.took(n)
	return nil
}

// jobMemBytes is what jobs are expected to cost in memory.
func jobMemBytes(jobs []*Job) int64 {
	var n int64
	for _, j := range jobs {
		n += j.size() + jobMemOverhead
	}
	return n
}

// fitsAtStart refuses, before a data file is loaded, jobs that would not
// fit in the budget: a server that cannot start is better said so than
// killed half-way through loading.
func (m *memLimit) fitsAtStart(jobs, bytes int64) error {
	if m == nil || m.limit <= 0 {
		return nil
	}
	need := bytes + jobs*jobMemOverhead
	if need <= m.limit {
		return nil
	}
	return fmt.Errorf("the data file holds %d jobs needing about %s of memory, more than --max-memory %s: start with --max-memory %dMiB or more",
		jobs, sizeText(need/(1<<20)*(1<<20)), sizeText(m.limit), (need*100/memHigh)>>20+1)
}
