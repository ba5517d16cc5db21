package main

// The cron commands and repeatable jobs, on top of the scheduler in cron.go:
// a schedule that comes due pushes an ordinary job through the push path.

import (
	"errors"
	"math"
	"strings"
	"time"
)

// startCron runs the broker's scheduler.
func (b *Broker) startCron() {
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
	})
}

// cronFire pushes one run's job.
func (b *Broker) cronFire(s *CronSchedule, at time.Time) {
	j, err := cronJob(s, b.now())
	if err != nil {
		b.log.Error("cron schedule could not make its job", "name", s.Name, "err", err)
		return
	}
	b.Push(s.Queue, []*Job{j})
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

// serves reports whether a registered worker takes jobs from queue.
func (ws *Workers) serves(queue string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, w := range ws.m {
		for _, q := range w.Queues {
			if q == queue {
				return true
			}
		}
	}
	return false
}

// isCronJob: jobs of a schedule with preventOverlap are dropped rather than
// retried when their worker is lost, as in the reference; the next run
// comes anyway.
func isCronJob(j *Job) bool { return strings.HasPrefix(j.UniqueKey, "cron:") }

// ---------------------------------------------------------------------------
// Commands

func encodeCron(e *Enc, s *CronSchedule) {
	e.MapHead(10)
	e.Str("name")
	e.Str(s.Name)
	e.Str("jobName")
	e.Str(s.JobName)
	e.Str("queue")
	e.Str(s.Queue)
	e.Str("schedule")
	optStr(e, s.Schedule, s.Schedule != "")
	e.Str("repeatEvery")
	if s.RepeatEvery > 0 {
		e.Int(s.RepeatEvery)
	} else {
		e.Nil()
	}
	e.Str("nextRun")
	e.Float64(float64(s.NextRun))
	e.Str("executions")
	e.Int(s.Executions)
	e.Str("maxLimit")
	if s.MaxLimit > 0 {
		e.Int(s.MaxLimit)
	} else {
		e.Nil()
	}
	e.Str("timezone")
	optStr(e, s.Timezone, s.Timezone != "")
	e.Str("priority")
	e.Int(s.Priority)
}

func cmdCron(r *Req) error {
	s, err := readCron(r.m)
	if err != nil {
		return err
	}
	got, err := r.b.cron.Add(s)
	if err != nil {
		return err
	}
	if r.b.store != nil {
		r.b.store.CronChanged(&got)
	}
	encodeCron(r.field("cron"), &got)
	return nil
}

// readCron reads a Cron command into a schedule, with the reference's
// defaults.
func readCron(m Map) (CronSchedule, error) {
	s := CronSchedule{SkipMissedOnRestart: true, PreventOverlap: true}
	var err error
	if s.Name, _, err = m.Str("name"); err != nil {
		return s, err
	}
	if s.Name == "" {
		return s, errors.New("name is required")
	}
	if s.Queue, err = queueArg(m); err != nil {
		return s, err
	}
	data := m.Get("data")
	if data != nil {
		s.Data = clone(data)
	}
	if jn, ok, err := m.Str("jobName"); err != nil {
		return s, err
	} else if ok && jn != "" {
		s.JobName = jn
	} else {
		// As PUSH reads a legacy {name, ...} payload.
		s.JobName, s.Data = legacyName(s.Data)
		if data == nil {
			s.Data = nil
		}
	}
	if s.Schedule, _, err = m.Str("schedule"); err != nil {
		return s, err
	}
	if f, ok, err := m.Num("repeatEvery"); err != nil {
		return s, err
	} else if ok {
		if f != math.Trunc(f) || f < 1 || f > 9007199254740991 {
			return s, errors.New("Cron repeatEvery must be a positive safe integer number of milliseconds")
		}
		s.RepeatEvery = int64(f)
	}
	if s.Schedule == "" && s.RepeatEvery == 0 {
		return s, errors.New("Cron job must have either schedule or repeatEvery")
	}
	if s.Timezone, _, err = m.Str("timezone"); err != nil {
		return s, err
	}
	if p, ok, err := finiteArg(m, "priority"); err != nil {
		return s, err
	} else if ok {
		s.Priority = int64(p)
	}
	if l, ok, err := finiteArg(m, "maxLimit"); err != nil {
		return s, err
	} else if ok && l > 0 {
		s.MaxLimit = int64(l)
	}
	if s.UniqueKey, _, err = m.Str("uniqueKey"); err != nil {
		return s, err
	}
	if d, ok, err := m.Map("dedup"); err != nil {
		return s, err
	} else if ok {
		ttl, _ := optNum(d, "ttl")
		s.Dedup = &CronDedup{Extend: truthy(d, "extend"), Replace: truthy(d, "replace")}
		if ttl != none {
			s.Dedup.TTL = ttl
		}
	}
	for _, f := range []struct {
		key string
		dst *bool
	}{{"skipMissedOnRestart", &s.SkipMissedOnRestart}, {"immediately", &s.Immediately},
		{"skipIfNoWorker", &s.SkipIfNoWorker}, {"preventOverlap", &s.PreventOverlap}} {
		if v, ok, err := m.Bool(f.key); err != nil {
			return s, err
		} else if ok {
			*f.dst = v
		}
	}
	if o := m.Get("jobOptions"); o != nil && o[0] != 0xc0 {
		if _, err := ParseMap(o, nil); err != nil {
			return s, &FieldError{Field: "jobOptions", Msg: "must be an object"}
		}
		s.JobOptions = clone(o)
	}
	if s.Schedule != "" {
		if _, err := ParseCron(s.Schedule); err != nil {
			return s, errors.New("Invalid cron expression: " + err.Error())
		}
	}
	return s, checkCron(&s)
}

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

var errCronNotFound = errors.New("Cron job not found")

func cmdCronGet(r *Req) error {
	name, _, err := r.m.Str("name")
	if err != nil {
		return err
	}
	s, ok := r.b.cron.Get(name)
	if !ok {
		return errCronNotFound
	}
	encodeCron(r.field("cron"), &s)
	return nil
}

func cmdCronList(r *Req) error {
	list := r.b.cron.List()
	e := r.field("crons")
	e.ArrayHead(len(list))
	for i := range list {
		encodeCron(e, &list[i])
	}
	return nil
}

func cmdCronDelete(r *Req) error {
	name, _, err := r.m.Str("name")
	if err != nil {
		return err
	}
	if !r.b.cron.Delete(name) {
		return errCronNotFound
	}
	if r.b.store != nil {
		r.b.store.CronRemoved(name)
	}
	return r.okID()
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
	items, err := Raw(b).Array()
	if err != nil {
		return CronSchedule{}, err
	}
	r := &recReader{items: items}
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
	if d := r.sub(); d != nil {
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

// ---------------------------------------------------------------------------
// Repeatable jobs: PUSH's repeat option

// repeatSpec is a job's repeat option.
type repeatSpec struct {
	every      int64
	pattern    string
	limit      int64 // 0: none
	count      int64
	startDate  int64
	endDate    int64
	tz         string
	prevMillis int64
	offset     int64
}

func readRepeat(raw Raw) (*repeatSpec, error) {
	m, err := ParseMap(raw, nil)
	if err != nil {
		return nil, errors.New("repeat must be an object")
	}
	rs := &repeatSpec{}
	every, hasEvery, _ := m.Num("every")
	rs.pattern, _, _ = m.Str("pattern")
	if hasEvery == (rs.pattern != "") {
		return nil, errors.New("repeat requires exactly one of every or pattern")
	}
	if hasEvery {
		if !(every > 0) || math.IsInf(every, 0) {
			return nil, errors.New("repeat.every must be a positive finite number")
		}
		rs.every = int64(every)
	} else if _, err := ParseCron(rs.pattern); err != nil {
		return nil, errors.New("Invalid repeat pattern: " + err.Error())
	}
	for _, f := range []struct {
		key string
		dst *int64
	}{{"startDate", &rs.startDate}, {"endDate", &rs.endDate}, {"prevMillis", &rs.prevMillis}, {"offset", &rs.offset}} {
		if v, ok, err := m.Num(f.key); err != nil || (ok && (math.IsNaN(v) || math.IsInf(v, 0))) {
			return nil, errors.New("repeat." + f.key + " must be a finite timestamp")
		} else if ok {
			*f.dst = int64(v)
		}
	}
	if l, ok, _ := m.Num("limit"); ok && l > 0 {
		rs.limit = int64(l)
	}
	if c, ok, _ := m.Num("count"); ok {
		rs.count = int64(c)
	}
	rs.tz, _, _ = m.Str("tz")
	return rs, nil
}

// validateRepeat checks a pushed job's repeat option.
func validateRepeat(j *Job) error {
	if j.Repeat == nil {
		return nil
	}
	if _, err := readRepeat(j.Repeat); err != nil {
		return err
	}
	if j.CustomID != "" {
		return errors.New("repeat jobs cannot use JobOptions.jobId; use repeat.jobId instead")
	}
	if len(j.DependsOn) > 0 || j.ParentID != "" {
		return errors.New("repeat jobs cannot participate in parent or dependency relationships")
	}
	return nil
}

// nextRepeat is when a repeatable job's successor runs, or false when the
// repetition is over.
func (rs *repeatSpec) next(now int64) (int64, bool) {
	if rs.limit > 0 && rs.count+1 >= rs.limit {
		return 0, false
	}
	var next int64
	if rs.every > 0 {
		switch {
		case rs.prevMillis > 0:
			next = rs.prevMillis + rs.every
		case rs.startDate > now:
			next = rs.startDate + rs.offset
		default:
			next = now + rs.every + rs.offset
		}
		for next <= now || next < rs.startDate {
			next += rs.every
		}
	} else {
		expr, err := ParseCron(rs.pattern)
		if err != nil {
			return 0, false
		}
		loc, err := LoadCronZone(rs.tz)
		if err != nil {
			return 0, false
		}
		from := max(now-rs.offset, rs.startDate-rs.offset-1, rs.prevMillis-rs.offset)
		t, ok := expr.Next(time.UnixMilli(from), loc)
		if !ok {
			return 0, false
		}
		next = t.UnixMilli() + rs.offset
	}
	if rs.startDate > 0 && next < rs.startDate || rs.endDate > 0 && next > rs.endDate {
		return 0, false
	}
	return next, true
}

// repeatSuccessor is the next job of a repeatable job that just completed.
func repeatSuccessor(j *Job, now int64) *Job {
	rs, err := readRepeat(j.Repeat)
	if err != nil {
		return nil
	}
	next, ok := rs.next(now)
	if !ok {
		return nil
	}
	// A fresh job with the same options: through the storage record, which
	// carries every field, then reset to a new job's state.
	var e Enc
	encodeRecord(&e, j)
	n, err := decodeRecord(e.B)
	if err != nil {
		return nil
	}
	n.ID = newID()
	n.CustomID = ""
	n.CreatedAt, n.RunAt, n.Heartbeat = now, next, now
	n.StartedAt, n.DoneAt, n.Attempts, n.Stalls = 0, 0, 0, 0
	n.Progress, n.ProgMsg, n.HasProgM, n.Stack = nil, "", false, nil
	n.Timeline, n.history, n.dlq = nil, nil, nil
	n.state, n.failErr, n.hasFail = StateNone, "", false
	n.childValues, n.failedKids, n.ignoredKids = nil, nil, nil
	n.Repeat = setDataKey(setDataKey(j.Repeat, "count", intRaw(rs.count+1)), "prevMillis", intRaw(next))
	return n
}

func intRaw(v int64) Raw {
	var e Enc
	e.Int(v)
	return e.B
}
