package main

// Cron schedules (the expressions they run on are in cron_expr.go): a
// scheduler that fires schedules from one timer set on the earliest next
// run, the memory engine's cron operations (CronEngine) over it, the
// storage record of a schedule, and the repeatable jobs of PUSH's repeat
// option. pg_cron.go keeps the schedules of PostgreSQL mode.

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// ---------------------------------------------------------------------------
// Schedules

// CronSchedule is one schedule, with every field the reference's Cron
// command takes. The command layer applies the reference's defaults before
// handing one over: skipMissedOnRestart and preventOverlap default to true.
type CronSchedule struct {
	Name        string
	Queue       string
	JobName     string
	Data        Raw    // the job data, as sent
	Schedule    string // cron expression or macro; "" for an interval
	RepeatEvery int64  // ms between runs; used when Schedule is ""
	Timezone    string // IANA zone of Schedule; "" is the server's zone
	Priority    int64
	MaxLimit    int64 // runs after which the schedule ends; 0 for no limit
	UniqueKey   string
	Dedup       *CronDedup
	// SkipMissedOnRestart: a run missed while the server was down is
	// dropped at restore; otherwise it runs once at start.
	SkipMissedOnRestart bool
	Immediately         bool // a new schedule runs at once, then on time
	SkipIfNoWorker      bool // a run with no worker on the queue is skipped
	PreventOverlap      bool
	JobOptions          Raw // the jobOptions map, as sent (nil when absent)

	NextRun    int64 // ms since the epoch
	Executions int64 // runs fired (skipped runs do not count)

	// replaced: AddCron's answer took the place of a schedule of the same
	// name (cron:updated, not cron:created).
	replaced bool

	expr  *CronExpr
	loc   *time.Location
	order int64 // first insertion, for listing in the reference's order
	index int   // in the heap; -1 when out
}

// CronDedup is the dedup option of a schedule's jobs.
type CronDedup struct {
	TTL     int64 // ms; 0 for none
	Extend  bool
	Replace bool
}

// compile checks the timing fields and readies the expression and zone.
func (s *CronSchedule) compile() error {
	switch {
	case s.Name == "":
		return errors.New("cron name is required")
	case s.Queue == "":
		return fmt.Errorf("cron %q: queue is required", s.Name)
	case s.RepeatEvery < 0 || s.RepeatEvery > 1<<53-1:
		return fmt.Errorf("cron %q: repeatEvery must be a positive whole number of milliseconds", s.Name)
	case s.Schedule == "" && s.RepeatEvery == 0:
		return fmt.Errorf("cron %q: needs a schedule or repeatEvery", s.Name)
	}
	if s.MaxLimit < 0 {
		s.MaxLimit = 0
	}
	loc, err := LoadCronZone(s.Timezone)
	if err != nil {
		return fmt.Errorf("cron %q: %w", s.Name, err)
	}
	s.loc, s.expr = loc, nil
	if s.Schedule != "" {
		if s.expr, err = ParseCron(s.Schedule); err != nil {
			return fmt.Errorf("cron %q: %w", s.Name, err)
		}
	}
	return nil
}

// start readies a new schedule: its timing checked and its first run
// after now (a schedule that runs immediately is moved to now by the
// caller, which knows whether it replaces one).
func (s *CronSchedule) start(now int64) error {
	if err := s.compile(); err != nil {
		return err
	}
	s.Executions = 0
	if s.expr != nil {
		t, ok := s.expr.Next(time.UnixMilli(now), s.loc)
		if !ok {
			return fmt.Errorf("cron %q: %q has no run in the next %d years", s.Name, s.Schedule, cronHorizonYears)
		}
		s.NextRun = t.UnixMilli()
	} else {
		s.NextRun = now + s.RepeatEvery
	}
	return nil
}

// following returns the run after the one due at at, the clock reading
// now. A cron schedule counts from now, as the reference does, so a late
// wake-up does not fire the runs it slept through; an interval keeps its
// phase and steps over the runs already past.
func (s *CronSchedule) following(at, now int64) (int64, bool) {
	if s.expr != nil {
		t, ok := s.expr.Next(time.UnixMilli(max(at, now)), s.loc)
		return t.UnixMilli(), ok
	}
	next := at + s.RepeatEvery
	if next <= now {
		next += ((now-next)/s.RepeatEvery + 1) * s.RepeatEvery
	}
	return next, true
}

// Clock is the scheduler's time source; tests give it a fake one.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the one timer the scheduler keeps on its earliest run. Reset and
// Stop leave no stale tick in C, as time.Timer does since Go 1.23.
type Timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

type systemClock struct{}

func (systemClock) Now() time.Time                 { return time.Now() }
func (systemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (s systemTimer) C() <-chan time.Time   { return s.t.C }
func (s systemTimer) Reset(d time.Duration) { s.t.Reset(d) }
func (s systemTimer) Stop()                 { s.t.Stop() }

// CronConfig wires a scheduler to the server. Changed, Removed and
// HasWorkers are called with the scheduler's lock held, so they must
// return at once and not call back into it (a store records and returns,
// as the Store interface asks).
type CronConfig struct {
	Clock Clock // nil: the system clock
	// Fire is called, from the scheduler's goroutine and without its lock,
	// for each run: s is a copy, with Executions counting this run; at is
	// the time the run was due.
	Fire func(s *CronSchedule, at time.Time)
	// HasWorkers reports whether a worker serves the queue, for
	// SkipIfNoWorker; nil never skips.
	HasWorkers func(queue string) bool
	// Changed is told when a schedule's next run or executions moved
	// (a run fired or was skipped, or a missed run was dropped at restore).
	Changed func(s *CronSchedule)
	// Removed is told when a schedule ended by itself: maxLimit reached, or
	// no run left.
	Removed func(name string)
	// Skipped is told of a run skipped for want of a worker (cron:skipped),
	// under the scheduler's lock: it must only record it.
	Skipped func(s *CronSchedule)
	Log     *slog.Logger
}

// CronScheduler holds the schedules and fires them on time. One goroutine
// owns one timer, armed on the earliest next run; it wakes for that run or
// when the schedules change, never to poll.
type CronScheduler struct {
	cfg   CronConfig
	clock Clock
	log   *slog.Logger
	timer Timer

	mu     sync.Mutex
	byName map[string]*CronSchedule
	due    cronHeap
	order  int64
	bytes  int64 // the schedules' weight (cronWeight) together

	kick    chan struct{}
	flushes chan chan struct{}
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// NewCronScheduler starts a scheduler; Stop ends it.
func NewCronScheduler(cfg CronConfig) *CronScheduler {
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	c := &CronScheduler{cfg: cfg, clock: cfg.Clock, log: cfg.Log,
		byName: make(map[string]*CronSchedule), kick: make(chan struct{}, 1),
		flushes: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	c.timer = c.clock.NewTimer(time.Hour)
	c.timer.Stop()
	go c.run()
	return c
}

// Stop ends the scheduler's goroutine and waits for it: a run being fired
// completes first. Schedules stay readable; none fires any more. It must
// not be called from Fire.
func (c *CronScheduler) Stop() {
	c.once.Do(func() {
		close(c.stop)
		<-c.done
	})
}

// Flush runs the schedules due by now and returns once their Fire calls
// have returned (at once when stopped).
func (c *CronScheduler) Flush() {
	ack := make(chan struct{})
	select {
	case c.flushes <- ack:
		<-ack
	case <-c.done:
	}
}

func (c *CronScheduler) run() {
	defer close(c.done)
	var ack chan struct{}
	for {
		c.round()
		if ack != nil {
			close(ack)
			ack = nil
		}
		select {
		case <-c.stop:
			c.timer.Stop()
			return
		case <-c.kick:
		case <-c.timer.C():
		case ack = <-c.flushes:
		}
	}
}

type cronFire struct {
	s  *CronSchedule
	at time.Time
}

// round fires what is due and re-arms the timer on the earliest next run.
func (c *CronScheduler) round() {
	c.mu.Lock()
	now := c.clock.Now()
	nowMs := now.UnixMilli()
	var fires []cronFire
	for len(c.due) > 0 && c.due[0].NextRun <= nowMs {
		s := c.due[0]
		at := s.NextRun
		skip := s.SkipIfNoWorker && c.cfg.HasWorkers != nil && !c.cfg.HasWorkers(s.Queue)
		if skip && c.cfg.Skipped != nil {
			// Skipped: not counted, as the reference counts only runs.
			c.cfg.Skipped(s)
		}
		why := s.afterRun(!skip, nowMs)
		if !skip {
			// The schedule as it ran: counted, its run the one due.
			cp := *s
			cp.NextRun = at
			fires = append(fires, cronFire{&cp, time.UnixMilli(at)})
		}
		if why != "" {
			c.end(s, why)
		} else {
			heap.Fix(&c.due, 0)
			if c.cfg.Changed != nil {
				cp := *s
				c.cfg.Changed(&cp)
			}
		}
	}
	if len(c.due) == 0 {
		c.timer.Stop()
	} else {
		c.timer.Reset(time.Duration(max(c.due[0].NextRun-nowMs, 0)) * time.Millisecond)
	}
	c.mu.Unlock()
	if c.cfg.Fire != nil {
		for _, f := range fires {
			c.cfg.Fire(f.s, f.at)
		}
	}
}

// end removes a schedule that ran its course; c.mu is held.
func (c *CronScheduler) end(s *CronSchedule, why string) {
	c.remove(s)
	c.log.Info("cron schedule ended", "name", s.Name, "reason", why, "executions", s.Executions)
	if c.cfg.Removed != nil {
		c.cfg.Removed(s.Name)
	}
}

func (c *CronScheduler) remove(s *CronSchedule) {
	delete(c.byName, s.Name)
	c.bytes -= cronWeight(s)
	if s.index >= 0 {
		heap.Remove(&c.due, s.index)
	}
}

// insert adds s, replacing a schedule of the same name; c.mu is held.
func (c *CronScheduler) insert(s *CronSchedule) {
	if old := c.byName[s.Name]; old != nil {
		s.order = old.order
		c.remove(old)
	} else {
		c.order++
		s.order = c.order
	}
	c.byName[s.Name] = s
	c.bytes += cronWeight(s)
	heap.Push(&c.due, s)
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Add creates a schedule, or replaces the one of the same name, and returns
// it with its next run. As in the reference, a replaced schedule keeps its
// executions and does not honour Immediately; a new one with Immediately
// runs at once. The caller persists what it returns.
func (c *CronScheduler) Add(in CronSchedule) (CronSchedule, error) {
	s := in
	nowMs := c.clock.Now().UnixMilli()
	if err := s.start(nowMs); err != nil {
		return CronSchedule{}, err
	}
	s.index = -1
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.byName[s.Name]
	n, bytes := len(c.byName), c.bytes
	if old != nil {
		n, bytes = n-1, bytes-cronWeight(old)
	}
	if err := cronRoom(n, bytes, &s); err != nil {
		return CronSchedule{}, err
	}
	if old != nil {
		s.Executions = old.Executions
	} else if s.Immediately {
		s.NextRun = nowMs
	}
	c.insert(&s)
	got := s
	got.replaced = old != nil
	return got, nil
}

// Restore loads schedules recovered from storage, with their next runs and
// executions. A next run missed while the server was down is moved to the
// next one after now when SkipMissedOnRestart (or SkipIfNoWorker, as the
// reference does); otherwise it stays, so the schedule runs once at start,
// never once per missed run. A schedule that cannot be read is left out
// and named in the error; the others are loaded.
func (c *CronScheduler) Restore(list []CronSchedule) error {
	nowMs := c.clock.Now().UnixMilli()
	var errs []error
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range list {
		s := list[i]
		s.index = -1
		missed := s.NextRun
		ended, skipped, err := s.recover(nowMs)
		if err != nil {
			errs = append(errs, fmt.Errorf("not restored: %w", err))
			continue
		}
		if ended {
			c.log.Info("cron schedule ended", "name", s.Name, "reason", "maxLimit reached", "executions", s.Executions)
			if c.cfg.Removed != nil {
				c.cfg.Removed(s.Name)
			}
			continue
		}
		if skipped {
			c.log.Info("cron schedule skipped runs missed while stopped", "name", s.Name,
				"missed", time.UnixMilli(missed).UTC(), "next", time.UnixMilli(s.NextRun).UTC())
			if c.cfg.Changed != nil {
				cp := s
				c.cfg.Changed(&cp)
			}
		}
		c.insert(&s)
	}
	return errors.Join(errs...)
}

// recover readies a schedule read back from storage after a stop (a
// restart, or queued migrate): ended when it had used up its runs; skipped
// when its next run was missed and is moved past now.
func (s *CronSchedule) recover(nowMs int64) (ended, skipped bool, err error) {
	if err := s.compile(); err != nil {
		return false, false, err
	}
	if s.MaxLimit > 0 && s.Executions >= s.MaxLimit {
		return true, false, nil
	}
	if s.NextRun < nowMs && (s.SkipMissedOnRestart || s.SkipIfNoWorker) {
		next := nowMs + s.RepeatEvery
		if s.expr != nil {
			t, ok := s.expr.Next(time.UnixMilli(nowMs), s.loc)
			if !ok {
				return false, false, fmt.Errorf("cron %q: no run left", s.Name)
			}
			next = t.UnixMilli()
		}
		s.NextRun = next
		return false, true, nil
	}
	return false, false, nil
}

// Get returns a copy of the named schedule.
func (c *CronScheduler) Get(name string) (CronSchedule, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.byName[name]
	if !ok {
		return CronSchedule{}, false
	}
	return *s, true
}

// List returns copies of every schedule, in the order they were first
// added (the reference lists its map in insertion order).
func (c *CronScheduler) List() []CronSchedule {
	c.mu.Lock()
	out := make([]CronSchedule, 0, len(c.byName))
	for _, s := range c.byName {
		out = append(out, *s)
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b CronSchedule) int { return cmp.Compare(a.order, b.order) })
	return out
}

// Delete removes the named schedule; false when there is none.
func (c *CronScheduler) Delete(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.byName[name]
	if ok {
		c.remove(s)
	}
	return ok
}

// Len returns the number of schedules.
func (c *CronScheduler) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byName)
}

// cronHeap orders schedules by next run, then by first insertion so that
// runs due together fire in a stable order.
type cronHeap []*CronSchedule

func (h cronHeap) Len() int { return len(h) }
func (h cronHeap) Less(i, j int) bool {
	if h[i].NextRun != h[j].NextRun {
		return h[i].NextRun < h[j].NextRun
	}
	return h[i].order < h[j].order
}
func (h cronHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *cronHeap) Push(x any) {
	s := x.(*CronSchedule)
	s.index = len(*h)
	*h = append(*h, s)
}
func (h *cronHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	s.index = -1
	*h = old[:len(old)-1]
	return s
}

// ---------------------------------------------------------------------------
// Limits

// Limits of cron schedules: their count, each one's fields, and what they
// weigh together (their data and job options, kept for as long as they
// are scheduled), the same in both engines.
const (
	maxCrons         = 10000
	maxCronDataBytes = 1 << 20
	maxCronOptBytes  = 64 << 10
	maxCronsBytes    = 64 << 20
	// maxCronName leaves room for the "cron:" prefix of the unique key a
	// schedule with preventOverlap gives its jobs (maxKeyBytes at most).
	maxCronName = 512
)

// checkCron applies the limits of one schedule's fields.
func checkCron(s *CronSchedule) error {
	if len(s.Name) > maxCronName {
		return tooBig("a cron's name is", maxCronName)
	}
	for _, f := range []struct{ name, val string }{{"jobName", s.JobName},
		{"schedule", s.Schedule}, {"timezone", s.Timezone}, {"uniqueKey", s.UniqueKey}} {
		if len(f.val) > maxKeyBytes {
			return tooBig("a cron's "+f.name+" is", maxKeyBytes)
		}
	}
	if len(s.Data) > maxCronDataBytes {
		return tooBig("a cron's data is", maxCronDataBytes)
	}
	if len(s.JobOptions) > maxCronOptBytes {
		return tooBig("a cron's jobOptions are", maxCronOptBytes)
	}
	return nil
}

// cronWeight is what a schedule weighs against maxCronsBytes.
func cronWeight(s *CronSchedule) int64 {
	return int64(len(s.Data) + len(s.JobOptions) + len(s.Name) + len(s.JobName) + len(s.Schedule) +
		len(s.Timezone) + len(s.UniqueKey))
}

// cronRoom says whether s may join n other schedules weighing bytes.
func cronRoom(n int, bytes int64, s *CronSchedule) error {
	if n >= maxCrons {
		return tooMany("cron schedules are", maxCrons)
	}
	if bytes+cronWeight(s) > maxCronsBytes {
		return tooBig("cron schedules together are", maxCronsBytes)
	}
	return nil
}

// ---------------------------------------------------------------------------
// The memory engine's cron operations (CronEngine): the broker's scheduler
// holds the schedules and pushes their jobs; the store, when there is one,
// keeps them across restarts.

// startCron runs the broker's scheduler.
func (b *MemEngine) startCron() {
	b.cron = NewCronScheduler(CronConfig{
		Fire:       b.cronFire,
		HasWorkers: b.workers.serves,
		Changed: func(s *CronSchedule) {
			if b.store != nil {
				b.store.CronChanged(s)
			}
		},
		Removed: func(name string) {
			if b.store != nil {
				b.store.CronRemoved(name)
			}
		},
		Skipped: func(s *CronSchedule) { b.announce(noticeCronRun("cron:skipped", s).str("reason", "no-worker")) },
	})
}

// cronFire pushes one run's job.
func (b *MemEngine) cronFire(s *CronSchedule, at time.Time) {
	j, err := cronJob(s, b.now())
	if err != nil {
		b.log.Error("cron schedule could not make its job", "name", s.Name, "err", err)
		b.announce(noticeCronRun("cron:missed", s).str("error", err.Error()))
		return
	}
	if err := b.mem.admit(jobMemBytes([]*Job{j})); err != nil {
		b.log.Warn("cron run refused", "name", s.Name, "err", err)
		b.announce(cronOutcome(s, err))
		return
	}
	res := b.pushJobs(s.Queue, []*Job{j}, nil)
	b.announce(cronOutcome(s, res[len(res)-1].Err))
}

// cronJob builds the job a schedule pushes: its name, data and priority,
// the options of jobOptions, and its dedup key (with preventOverlap, one
// of its own, so a run does not start while the last is still pending).
func cronJob(s *CronSchedule, now int64) (*Job, error) {
	var e Enc
	at := e.OpenMap()
	n := 0
	field := func(k string) *Enc { n++; e.Str(k); return &e }
	field("name").Str(s.JobName)
	if s.Data != nil {
		field("data").Raw(s.Data)
	}
	if s.Priority != 0 {
		field("priority").Int(s.Priority)
	}
	key := s.UniqueKey
	if key == "" && s.PreventOverlap {
		key = "cron:" + s.Name
	}
	if key != "" {
		field("uniqueKey").Str(key)
	}
	if d := s.Dedup; d != nil {
		de := field("dedup")
		de.MapHead(3)
		de.Str("ttl")
		de.Int(d.TTL)
		de.Str("extend")
		de.Bool(d.Extend)
		de.Str("replace")
		de.Bool(d.Replace)
	}
	if s.JobOptions != nil {
		if o, err := ParseMap(s.JobOptions, nil); err == nil {
			for _, f := range o.Fields {
				switch k := string(f.Key); k {
				case "maxAttempts", "backoff", "timeout", "delay", "stallTimeout", "removeOnComplete", "removeOnFail", "attempts":
					if k == "attempts" {
						k = "maxAttempts"
					}
					field(k).Raw(f.Val)
				}
			}
		}
	}
	e.CloseMap(at, n)
	m, err := ParseMap(e.B, nil)
	if err != nil {
		return nil, err
	}
	return parseJob(m, s.Queue, "", now)
}

// isCronJob: jobs of a schedule with preventOverlap are dropped rather than
// retried when their worker is lost, as in the reference; the next run
// comes anyway.
func isCronJob(j *Job) bool { return strings.HasPrefix(j.cold().UniqueKey, "cron:") }

func (b *MemEngine) AddCron(_ context.Context, s CronSchedule) (CronSchedule, error) {
	got, err := b.cron.Add(s)
	if err != nil {
		return CronSchedule{}, err
	}
	if b.store != nil {
		b.store.CronChanged(&got)
	}
	return got, nil
}

func (b *MemEngine) GetCron(_ context.Context, name string) (CronSchedule, error) {
	s, ok := b.cron.Get(name)
	if !ok {
		return CronSchedule{}, errCronNotFound
	}
	return s, nil
}

func (b *MemEngine) ListCrons(context.Context) ([]CronSchedule, error) {
	return b.cron.List(), nil
}

func (b *MemEngine) DeleteCron(_ context.Context, name string) error {
	if !b.cron.Delete(name) {
		return errCronNotFound
	}
	if b.store != nil {
		b.store.CronRemoved(name)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Storage of schedules

func encodeCronRecord(s *CronSchedule) []byte {
	var e Enc
	e.ArrayHead(19)
	e.Int64Exact(1) // version
	e.Str(s.Name)
	e.Str(s.Queue)
	e.Str(s.JobName)
	e.Raw(s.Data)
	e.Str(s.Schedule)
	e.Int64Exact(s.RepeatEvery)
	e.Str(s.Timezone)
	e.Int64Exact(s.Priority)
	e.Int64Exact(s.MaxLimit)
	e.Str(s.UniqueKey)
	if d := s.Dedup; d != nil {
		e.ArrayHead(3)
		e.Int64Exact(d.TTL)
		e.Bool(d.Extend)
		e.Bool(d.Replace)
	} else {
		e.Nil()
	}
	e.Bool(s.SkipMissedOnRestart)
	e.Bool(s.Immediately)
	e.Bool(s.SkipIfNoWorker)
	e.Bool(s.PreventOverlap)
	e.Raw(s.JobOptions)
	e.Int64Exact(s.NextRun)
	e.Int64Exact(s.Executions)
	return e.B
}

func decodeCronRecord(b []byte) (CronSchedule, error) {
	rr, err := newRecReader(b)
	if err != nil {
		return CronSchedule{}, err
	}
	r := &rr
	if v := r.i64(); v != 1 {
		return CronSchedule{}, errors.New("cron record version " + itoa(v))
	}
	var s CronSchedule
	s.Name = r.str()
	s.Queue = r.str()
	s.JobName = r.str()
	s.Data = r.raw()
	s.Schedule = r.str()
	s.RepeatEvery = r.i64()
	s.Timezone = r.str()
	s.Priority = r.i64()
	s.MaxLimit = r.i64()
	s.UniqueKey = r.str()
	if d, ok := r.sub(); ok {
		s.Dedup = &CronDedup{TTL: d.i64()}
		ext, rep := d.next(), d.next()
		s.Dedup.Extend = len(ext) > 0 && ext[0] == 0xc3
		s.Dedup.Replace = len(rep) > 0 && rep[0] == 0xc3
	}
	flag := func() bool { v := r.next(); return len(v) > 0 && v[0] == 0xc3 }
	s.SkipMissedOnRestart = flag()
	s.Immediately = flag()
	s.SkipIfNoWorker = flag()
	s.PreventOverlap = flag()
	s.JobOptions = r.raw()
	s.NextRun = r.i64()
	s.Executions = r.i64()
	return s, r.err
}
