package main

// Handlers that read jobs, and progress, logs and WaitJob.

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

var errJobNotFound = errors.New("Job not found")

// resultOf is a completed job's result while the results cache keeps it.
func (b *Broker) resultOf(j *Job) Raw {
	if j.state != StateCompleted {
		return nil
	}
	r, _ := b.getResult(j.ID)
	return r
}

func cmdGetJob(r *Req) error {
	id, _, err := r.m.Str("id")
	if err != nil {
		return err
	}
	j, s := r.b.lockJob(id)
	if j == nil {
		return errJobNotFound
	}
	defer s.mu.Unlock()
	encodeJob(r.field("job"), j, jobWithState, j.stateAt(r.b.now()).String(), r.b.resultOf(j))
	return nil
}

// GetJobByCustomId finds live jobs only: the reference forgets the mapping
// when a job completes or fails for good.
func cmdGetJobByCustomID(r *Req) error {
	id, _, err := r.m.Str("customId")
	if err != nil {
		return err
	}
	j, s := r.b.lockJob(id)
	if j == nil {
		return errJobNotFound
	}
	defer s.mu.Unlock()
	if !liveByCustomID(j) {
		return errJobNotFound
	}
	encodeJob(r.field("job"), j, jobWithRead, "", nil)
	return nil
}

// liveByCustomID says whether GetJobByCustomId finds j.
func liveByCustomID(j *Job) bool {
	return j.CustomID != "" && j.state != StateCompleted && j.state != StateFailed
}

// stateOf is a job's state by id, "unknown" when there is no such job.
func (b *Broker) stateOf(id string) State {
	st := StateNone
	b.withJob(id, func(j *Job, _ *Shard) { st = j.stateAt(b.now()) })
	return st
}

func cmdGetState(r *Req) error {
	id, _, err := r.m.Str("id")
	if err != nil {
		return err
	}
	r.field("id").Raw(r.m.Get("id"))
	r.field("state").Str(r.b.stateOf(id).String())
	return nil
}

func cmdGetResult(r *Req) error {
	id, _, err := r.m.Str("id")
	if err != nil {
		return err
	}
	var res Raw
	r.b.withJob(id, func(j *Job, s *Shard) {
		res = r.b.resultOf(j)
	})
	r.field("id").Raw(r.m.Get("id"))
	if res == nil {
		r.field("result").Undefined()
	} else {
		r.field("result").Raw(res)
	}
	return nil
}

// JobCounts are one queue's jobs by state.
type JobCounts struct {
	Waiting, Prioritized, Delayed, Active, Completed, Failed, WaitingChildren, Paused int
}

func (b *Broker) counts(queue string) JobCounts {
	s := b.shardOf(queue)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[queue]
	if q == nil {
		return JobCounts{}
	}
	s.promote(b.now())
	c := JobCounts{Waiting: q.nReady - q.nPrio, Prioritized: q.nPrio, Delayed: q.nDelayed,
		Active: q.nActive, Completed: q.nDone, Failed: len(q.dlq), WaitingChildren: len(q.wc)}
	if q.paused {
		c.Paused = c.Waiting + c.Prioritized
		c.Waiting, c.Prioritized = 0, 0
	}
	return c
}

func cmdGetJobCounts(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	writeCounts(r, r.b.counts(queue))
	return nil
}

// writeCounts answers GetJobCounts.
func writeCounts(r *Req, c JobCounts) {
	e := r.field("counts")
	e.MapHead(8)
	for _, kv := range []struct {
		k string
		v int
	}{{"waiting", c.Waiting}, {"prioritized", c.Prioritized}, {"delayed", c.Delayed}, {"active", c.Active},
		{"completed", c.Completed}, {"failed", c.Failed}, {"waiting-children", c.WaitingChildren}, {"paused", c.Paused}} {
		e.Str(kv.k)
		e.Int(int64(kv.v))
	}
}

func cmdCount(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	c := r.b.counts(queue)
	r.field("count").Int(int64(c.Waiting + c.Prioritized + c.Paused + c.Delayed))
	return nil
}

func cmdGetCountsPerPriority(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	s := r.b.shardOf(queue)
	var keys []int64
	var per map[int64]int
	s.with(func() { keys, per = s.countsPerPriority(queue) })
	r.field("queue").Str(queue)
	encodePriorityCounts(r.field("counts"), keys, per)
	return nil
}

// countsPerPriority counts a queue's waiting and delayed jobs by priority,
// keys in JavaScript object order; s.mu is held.
func (s *Shard) countsPerPriority(queue string) ([]int64, map[int64]int) {
	per := map[int64]int{}
	if q := s.queues[queue]; q != nil {
		q.eachReady(func(j *Job) { per[j.Priority]++ })
		s.delayed.Each(func(e *hent) bool {
			if e.job.Queue == queue {
				per[e.job.Priority]++
			}
			return true
		})
	}
	return priorityKeys(per), per
}

// priorityKeys are per's keys in JavaScript object order: non-negative
// integer keys ascending, then the rest (here: negatives).
func priorityKeys(per map[int64]int) []int64 {
	keys := make([]int64, 0, len(per))
	for k := range per {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b int64) int {
		if (a < 0) != (b < 0) {
			if a < 0 {
				return 1
			}
			return -1
		}
		return int(a - b)
	})
	return keys
}

func encodePriorityCounts(e *Enc, keys []int64, per map[int64]int) {
	e.MapHead(len(keys))
	for _, k := range keys {
		e.Str(strconv.FormatInt(k, 10))
		e.Int(int64(per[k]))
	}
}

// ---------------------------------------------------------------------------
// GetJobs

// jobsQuery are GetJobs' fields. The state filter: absent or [] means
// every state; a single name labels every job it returns with that name,
// as the reference does.
type jobsQuery struct {
	want          []string
	single        string
	offset, limit int64
	asc           bool
}

func readJobsQuery(m Map) (jobsQuery, error) {
	a := jobsQuery{limit: 100, asc: true}
	if raw := m.Get("state"); raw != nil {
		if s, err := raw.Str(); err == nil {
			a.want, a.single = []string{s}, s
		} else if arr, ok, err := m.Strs("state"); err == nil && ok {
			a.want = arr
		} else {
			return a, errors.New("state must be a string or an array of strings")
		}
	}
	var err error
	if a.offset, _, err = m.Int("offset"); err != nil {
		return a, err
	}
	if v, ok, err := m.Int("limit"); err != nil {
		return a, err
	} else if ok {
		a.limit = v
	}
	if v, ok, err := m.Bool("asc"); err != nil {
		return a, err
	} else if ok {
		a.asc = v
	}
	return a, nil
}

func cmdGetJobs(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	a, err := readJobsQuery(r.m)
	if err != nil {
		return err
	}
	want, single, offset, limit, asc := a.want, a.single, a.offset, a.limit, a.asc

	wants := func(st string) bool { return len(want) == 0 || slices.Contains(want, st) }
	s := r.b.shardOf(queue)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := r.b.now()
	s.promote(now)
	q := s.queues[queue]
	// every visits the jobs the filter selects, with their labels.
	every := func(fn func(it jobItem)) {
		if q == nil {
			return
		}
		explicit := len(want) > 0
		q.eachReady(func(j *Job) {
			st := j.state.String()
			switch {
			case q.paused && explicit:
				if wants("paused") {
					fn(jobItem{j, "paused"})
				}
			case wants(st):
				fn(jobItem{j, st})
			}
		})
		if wants("delayed") {
			s.delayed.Each(func(e *hent) bool {
				if e.job.Queue == queue {
					fn(jobItem{e.job, "delayed"})
				}
				return true
			})
		}
		if wants("active") {
			s.leases.Each(func(e *hent) bool {
				if e.job.Queue == queue && e.job.state == StateActive {
					fn(jobItem{e.job, "active"})
				}
				return true
			})
		}
		if wants("completed") {
			for i := s.doneHead; i < len(s.done); i++ {
				if d := &s.done[i]; s.doneLiveEnt(d) && d.j.Queue == queue {
					fn(jobItem{d.j, "completed"})
				}
			}
		}
		if wants("failed") {
			for _, j := range q.dlq {
				fn(jobItem{j, "failed"})
			}
		}
		if wants("waiting-children") {
			for j := range q.wc {
				fn(jobItem{j, "waiting-children"})
			}
		}
	}
	list := pageJobs(every, offset, limit, asc)
	e := r.field("jobs")
	e.ArrayHead(len(list))
	for _, it := range list {
		st := it.label
		if single != "" {
			st = single
		}
		encodeJob(e, it.j, jobWithState, st, r.b.resultOf(it.j))
	}
	return nil
}

// jobItem is a job GetJobs lists, with the state it is listed under.
type jobItem struct {
	j     *Job
	label string
}

// pageJobs is the page GetJobs answers: the jobs every visits, ordered by
// creation time then id (descending unless asc), sliced as JavaScript's
// slice(offset, offset+limit) would slice them. Only the jobs of the page
// and those ranked on the near side of it are kept, in a bounded heap,
// so that a small page of a large queue sorts only a small page: a page
// near the end is found from the end.
func pageJobs(every func(fn func(it jobItem)), offset, limit int64, asc bool) []jobItem {
	n := 0
	every(func(jobItem) { n++ })
	lo, hi := jsSlice(n, offset, offset+limit)
	if lo >= hi {
		return nil
	}
	less := func(a, b jobItem) bool {
		c := cmpInt(a.j.CreatedAt, b.j.CreatedAt)
		if c == 0 {
			c = cmpStr(a.j.ID, b.j.ID)
		}
		if !asc {
			c = -c
		}
		return c < 0
	}
	// From the front, keep the hi first; from the back, the n-lo last.
	fromFront := hi <= n-lo
	k := n - lo
	if fromFront {
		k = hi
	}
	// worse says which of two kept jobs leaves the heap first: the root is
	// the kept job farthest from the page's side.
	worse := func(a, b jobItem) bool { return less(b, a) }
	if !fromFront {
		worse = less
	}
	h := make([]jobItem, 0, k)
	down := func(i int) {
		for {
			c := 2*i + 1
			if c >= len(h) {
				return
			}
			if c+1 < len(h) && worse(h[c+1], h[c]) {
				c++
			}
			if !worse(h[c], h[i]) {
				return
			}
			h[i], h[c] = h[c], h[i]
			i = c
		}
	}
	every(func(it jobItem) {
		if len(h) < k {
			h = append(h, it)
			for i := len(h) - 1; i > 0; {
				p := (i - 1) / 2
				if !worse(h[i], h[p]) {
					break
				}
				h[i], h[p] = h[p], h[i]
				i = p
			}
			return
		}
		if worse(h[0], it) {
			h[0] = it
			down(0)
		}
	})
	slices.SortFunc(h, func(a, b jobItem) int {
		switch {
		case less(a, b):
			return -1
		case less(b, a):
			return 1
		}
		return 0
	})
	if fromFront {
		return h[lo:hi]
	}
	return h[:hi-lo]
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// jsSlice gives the bounds Array.prototype.slice(start, end) would use.
func jsSlice(n int, start, end int64) (int, int) {
	norm := func(x int64) int {
		if x < 0 {
			x += int64(n)
			if x < 0 {
				x = 0
			}
		}
		if x > int64(n) {
			x = int64(n)
		}
		return int(x)
	}
	lo, hi := norm(start), norm(end)
	if hi < lo {
		hi = lo
	}
	return lo, hi
}

// ---------------------------------------------------------------------------
// Progress

func notActive(j *Job, now int64) error {
	return errors.New("Job is not active (current state: " + j.stateAt(now).String() + ")")
}

// progressSet is what a Progress request sets, read once for both engines.
type progressSet struct {
	id     string
	prog   Raw
	msg    string
	msgSet bool // a string: set it (null clears it)
	msgKey bool // undefined keeps the message
}

func readProgress(r *Req) (progressSet, error) {
	var u progressSet
	var err error
	if u.id, _, err = r.m.Str("id"); err != nil {
		return u, err
	}
	prog := r.m.Get("progress")
	if f, err := prog.Float(); err == nil {
		var e Enc
		e.Num(math.Max(0, math.Min(100, f)))
		prog = e.B
	} else if prog.IsNil() {
		prog = Raw{0}
	} else {
		prog = clone(prog)
	}
	u.prog = prog
	for _, f := range r.m.Fields {
		if string(f.Key) == "message" && !isUndefined(f.Val) {
			u.msgKey = true
		}
	}
	if msgRaw := r.m.Get("message"); msgRaw != nil && msgRaw[0] != 0xc0 {
		if u.msg, err = msgRaw.Str(); err != nil {
			return u, &FieldError{Field: "message", Msg: "must be a string"}
		}
		u.msgSet = true
	}
	if len(u.prog) > maxProgressBytes {
		return u, tooBig("progress is", maxProgressBytes)
	}
	if len(u.msg) > maxProgressBytes {
		return u, tooBig("a progress message is", maxProgressBytes)
	}
	return u, nil
}

// apply sets the progress of an active job and returns its event.
func (u progressSet) apply(j *Job, now int64) (evArgs, error) {
	if j.state != StateActive {
		return evArgs{}, notActive(j, now)
	}
	if err := u.check(j); err != nil {
		return evArgs{}, err
	}
	j.Progress = u.prog
	if u.msgKey {
		j.ProgMsg, j.HasProgM = u.msg, u.msgSet
	}
	j.Heartbeat = now
	return evArgs{progress: u.prog, progMsg: j.ProgMsg, hasProgMsg: j.HasProgM}, nil
}

func cmdProgress(r *Req) error {
	u, err := readProgress(r)
	if err != nil {
		return err
	}
	j, s := r.b.lockJob(u.id)
	if j == nil {
		return errJobNotFound
	}
	defer s.mu.Unlock()
	now := r.b.now()
	ev, err := u.apply(j, now)
	if err != nil {
		return err
	}
	s.emit(s.queues[j.Queue], evProgress, j, now, ev)
	s.b.persist(j)
	return r.okID()
}

// writeProgress answers GetProgress for a job (nil: not found).
func writeProgress(r *Req, j *Job) error {
	if j == nil {
		return errJobNotFound
	}
	if j.state != StateActive {
		return notActive(j, r.b.now())
	}
	if j.Progress == nil {
		r.field("progress").Int(0)
	} else {
		r.field("progress").Raw(j.Progress)
	}
	optStr(r.field("message"), j.ProgMsg, j.HasProgM)
	return nil
}

func cmdGetProgress(r *Req) error {
	id, _, err := r.m.Str("id")
	if err != nil {
		return err
	}
	j, s := r.b.lockJob(id)
	if j != nil {
		defer s.mu.Unlock()
	}
	return writeProgress(r, j)
}

// ---------------------------------------------------------------------------
// Logs

// readLogEntry reads AddLog's job id and entry, for both engines, and
// applies the limits of one log line.
func readLogEntry(r *Req) (string, LogEntry, error) {
	id, _, err := r.m.Str("id")
	if err != nil {
		return "", LogEntry{}, err
	}
	level := "info"
	if l, ok, err := r.m.Str("level"); err != nil {
		return "", LogEntry{}, err
	} else if ok {
		level = l
	}
	msg := r.m.Get("message")
	if msg == nil {
		msg = rawUndefined
	}
	e := LogEntry{At: r.b.now(), Level: level, Message: msg}
	if err := checkLogEntry(e); err != nil {
		return "", LogEntry{}, err
	}
	e.Message = clone(msg)
	return id, e, nil
}

func writeLogAdded(r *Req) error {
	e := r.field("data")
	e.MapHead(1)
	e.Str("added")
	e.Bool(true)
	return nil
}

func cmdAddLog(r *Req) error {
	id, entry, err := readLogEntry(r)
	if err != nil {
		return err
	}
	if r.b.idxGet(id) == nil {
		return errJobNotFound
	}
	r.b.lmu.Lock()
	defer r.b.lmu.Unlock()
	logs, _ := r.b.logs.Get(id)
	// A new slice each time: what the store was handed stays as it was.
	logs = appendLog(logs, entry)
	r.b.logs.Put(id, logs)
	r.b.logsChanged(id, logs)
	return writeLogAdded(r)
}

// logRange is which of a job's logs GetLogs asks for.
type logRange struct {
	start, end       int64
	hasStart, hasEnd bool
}

// getLogsCmd is GetLogs, read and answered once; logsOf is the engine's.
func getLogsCmd(logsOf func(r *Req, id string) ([]LogEntry, error)) Handler {
	return func(r *Req) error {
		id, _, err := r.m.Str("id")
		if err != nil {
			return err
		}
		var lr logRange
		if lr.start, lr.hasStart, err = r.m.Int("start"); err != nil {
			return err
		}
		if lr.end, lr.hasEnd, err = r.m.Int("end"); err != nil {
			return err
		}
		logs, err := logsOf(r, id)
		if err != nil {
			return err
		}
		writeLogs(r, logs, lr)
		return nil
	}
}

func memLogs(r *Req, id string) ([]LogEntry, error) {
	r.b.lmu.Lock()
	defer r.b.lmu.Unlock()
	logs, _ := r.b.logs.Get(id)
	return slices.Clone(logs), nil
}

// writeLogs answers GetLogs: the logs from start to end (inclusive, as
// in the reference), and how many there are in all.
func writeLogs(r *Req, logs []LogEntry, lr logRange) {
	total := len(logs)
	if lr.hasStart || lr.hasEnd {
		end := lr.end
		if !lr.hasEnd {
			end = int64(total) - 1
		}
		// end is inclusive, as in the reference.
		lo, hi := jsSlice(total, lr.start, end+1)
		logs = logs[lo:hi]
	}
	e := r.field("data")
	e.MapHead(2)
	e.Str("logs")
	e.ArrayHead(len(logs))
	for _, l := range logs {
		e.MapHead(3)
		e.Str("timestamp")
		e.Int(l.At)
		e.Str("level")
		e.Str(l.Level)
		e.Str("message")
		e.Raw(l.Message)
	}
	e.Str("count")
	e.Int(int64(total))
}

// readClearLogs reads ClearLogs: the job, and how many of its newest logs
// stay (none when keepLogs is absent or not above zero).
func readClearLogs(r *Req) (string, int64, error) {
	id, _, err := r.m.Str("id")
	if err != nil {
		return "", 0, err
	}
	keep, _, err := r.m.Int("keepLogs")
	return id, keep, err
}

func cmdClearLogs(r *Req) error {
	id, keep, err := readClearLogs(r)
	if err != nil {
		return err
	}
	r.b.lmu.Lock()
	defer r.b.lmu.Unlock()
	if keep <= 0 {
		if r.b.logs.Delete(id) {
			r.b.logsChanged(id, nil)
		}
	} else if logs, ok := r.b.logs.Peek(id); ok && len(logs) > int(keep) {
		kept := append(logs[:0:0], logs[len(logs)-int(keep):]...)
		r.b.logs.Put(id, kept)
		r.b.logsChanged(id, kept)
	}
	return r.okID()
}

// ---------------------------------------------------------------------------
// WaitJob

func cmdWaitJob(r *Req) error {
	id, _, err := r.m.Str("id")
	if err != nil {
		return err
	}
	timeout, ok, err := numField(r.m, "timeout", "timeout", numRule{min: 0, max: maxWaitTimeout})
	if err != nil {
		return err
	}
	if !ok {
		timeout = 30000
	}
	ch := make(chan waitOutcome, 1)
	var done *waitOutcome
	var j *Job
	var s *Shard
	if !r.b.withJob(id, func(jj *Job, ss *Shard) {
		j, s = jj, ss
		switch j.state {
		case StateCompleted:
			res := r.b.resultOf(j)
			done = &waitOutcome{completed: true, result: res, hasResult: res != nil}
		case StateFailed:
			done = &waitOutcome{err: j.failErr}
		default:
			j.waiters = append(j.waiters, ch)
		}
	}) {
		return errJobNotFound
	}
	if done != nil {
		return writeWait(r, *done)
	}
	ctx := r.c.ctx
	return r.goAsync(func(ar *Req) error {
		t := time.NewTimer(time.Duration(timeout) * time.Millisecond)
		defer t.Stop()
		select {
		case o := <-ch:
			return writeWait(ar, o)
		case <-t.C:
		case <-ctx.Done():
		}
		s.with(func() {
			if i := slices.Index(j.waiters, ch); i >= 0 {
				j.waiters = slices.Delete(j.waiters, i, i+1)
			}
		})
		select {
		case o := <-ch: // finished just as time ran out
			return writeWait(ar, o)
		default:
		}
		ar.field("completed").Bool(false)
		return nil
	})
}

// writeWait answers WaitJob. A job that failed for good answers at once
// with completed:false and the failure, where the reference would wait out
// the whole timeout: the official client reads only `completed`.
func writeWait(r *Req, o waitOutcome) error {
	r.field("completed").Bool(o.completed)
	if o.completed {
		if o.hasResult {
			r.field("result").Raw(o.result)
		} else {
			r.field("result").Undefined()
		}
		return nil
	}
	r.field("failed").Bool(true)
	r.field("error").Str(o.err)
	return nil
}

// jsString renders a decoded value as JavaScript's String() would, for
// error messages sent as something other than a string.
func jsString(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return x
	case map[string]any:
		return "[object Object]"
	case []any:
		parts := make([]string, len(x))
		for i, it := range x {
			if it != nil {
				parts[i] = jsString(it)
			}
		}
		return fmt.Sprint(joinStr(parts, ","))
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return fmt.Sprint(v)
}

func joinStr(a []string, sep string) string {
	var b bytes.Buffer
	for i, s := range a {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(s)
	}
	return b.String()
}
