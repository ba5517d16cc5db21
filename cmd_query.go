package main

// Handlers that read jobs, counts, progress and logs, and WaitJob. The
// work is the engine's (ReadEngine: query.go, pg_query.go).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// jobIDOf reads the id of the job a read names, under key.
func jobIDOf(r *Req, key string) (string, error) {
	id, _, err := r.m.Key(key)
	return id, err
}

// readJobAt reads the job named under key, as the engine has it (a view
// without a job when there is none).
func readJobAt(r *Req, key string) (JobView, error) { return readJobIn(r.ctx(), r, key) }

// readJobIn is readJobAt under ctx (fetch's, which lets the engine reserve
// the answer's room before it brings a big job into memory).
func readJobIn(ctx context.Context, r *Req, key string) (JobView, error) {
	id, err := jobIDOf(r, key)
	if err != nil {
		return JobView{}, err
	}
	return r.eng.ReadJob(ctx, id)
}

func cmdGetJob(r *Req) error {
	v, err := fetch(r, func(ctx context.Context) (JobView, error) { return readJobIn(ctx, r, "id") }, viewBytes)
	if err != nil {
		return err
	}
	if v.Job == nil {
		return errJobNotFound
	}
	encodeJob(r.field("job"), v.Job, jobWithState, v.State, v.Result)
	return nil
}

// GetJobByCustomId: which jobs it finds is the engine's (rule_customid.go).
func cmdGetJobByCustomID(r *Req) error {
	v, err := fetch(r, func(ctx context.Context) (JobView, error) {
		id, err := jobIDOf(r, "customId")
		if err != nil {
			return JobView{}, err
		}
		return r.eng.ReadJobByCustomID(ctx, id)
	}, viewBytes)
	if err != nil {
		return err
	}
	if v.Job == nil {
		return errJobNotFound
	}
	encodeJob(r.field("job"), v.Job, jobWithRead, "", nil)
	return nil
}

func cmdGetState(r *Req) error {
	v, err := readJobAt(r, "id")
	if err != nil {
		return err
	}
	r.field("id").Raw(r.m.Get("id"))
	r.field("state").Str(v.State)
	return nil
}

func cmdGetResult(r *Req) error {
	v, err := fetch(r, func(ctx context.Context) (JobView, error) { return readJobIn(ctx, r, "id") }, func(v JobView) int64 { return int64(len(v.Result)) + 256 })
	if err != nil {
		return err
	}
	r.field("id").Raw(r.m.Get("id"))
	if v.Result == nil {
		r.field("result").Undefined()
	} else {
		r.field("result").Raw(v.Result)
	}
	return nil
}

func cmdGetJobCounts(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	c, err := r.eng.Counts(r.ctx(), queue)
	if err != nil {
		return err
	}
	writeCounts(r, c)
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
	c, err := r.eng.Counts(r.ctx(), queue)
	if err != nil {
		return err
	}
	r.field("count").Int(int64(c.Waiting + c.Prioritized + c.Paused + c.Delayed))
	return nil
}

func cmdGetCountsPerPriority(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	per, err := r.eng.CountsPerPriority(r.ctx(), queue)
	if err != nil {
		return err
	}
	r.field("queue").Str(queue)
	encodePriorityCounts(r.field("counts"), priorityKeys(per), per)
	return nil
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
	// A page of big jobs is cut to what one answer carries: the client
	// pages on with a larger offset.
	a.maxBytes = r.c.answerLimit()
	list, err := fetch(r, func(ctx context.Context) ([]JobView, error) {
		list, err := r.eng.Jobs(ctx, queue, a)
		list, _ = fitViews(list, a.maxBytes)
		return list, err
	}, viewsBytes)
	if err != nil {
		return err
	}
	e := r.field("jobs")
	e.ArrayHead(len(list))
	for _, v := range list {
		label := v.State
		if a.single != "" {
			label = a.single
		}
		encodeJob(e, v.Job, jobWithState, label, v.Result)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Progress

// readProgress reads what a Progress request sets.
func readProgress(r *Req) (progressSet, error) {
	var u progressSet
	var err error
	if u.id, _, err = r.m.Key("id"); err != nil {
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

func cmdProgress(r *Req) error {
	u, err := readProgress(r)
	if err != nil {
		return err
	}
	if err := r.eng.SetProgress(r.ctx(), u); err != nil {
		return err
	}
	return r.okID()
}

func cmdGetProgress(r *Req) error {
	v, err := readJobAt(r, "id")
	if err != nil {
		return err
	}
	return writeProgress(r, v)
}

// writeProgress answers GetProgress: an active job's progress.
func writeProgress(r *Req, v JobView) error {
	j := v.Job
	if j == nil {
		return errJobNotFound
	}
	if j.state != StateActive {
		return notActiveIn(v.State)
	}
	if j.cold().Progress == nil {
		r.field("progress").Int(0)
	} else {
		r.field("progress").Raw(j.cold().Progress)
	}
	optStr(r.field("message"), j.cold().ProgressMsg, j.cold().HasProgressMsg)
	return nil
}

// ---------------------------------------------------------------------------
// Logs

// readLogEntry reads AddLog's job id and entry (the engine stamps its
// time), and applies the limits of one log line.
func readLogEntry(r *Req) (string, LogEntry, error) {
	id, _, err := r.m.Key("id")
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
	e := LogEntry{Level: level, Message: msg}
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
	if err := r.eng.AddLog(r.ctx(), id, entry); err != nil {
		return err
	}
	return writeLogAdded(r)
}

// logRange is which of a job's logs GetLogs asks for.
type logRange struct {
	start, end       int64
	hasStart, hasEnd bool
}

// readGetLogs reads GetLogs: the job, and which of its logs.
func readGetLogs(r *Req) (string, logRange, error) {
	var lr logRange
	id, err := jobIDOf(r, "id")
	if err != nil {
		return "", lr, err
	}
	if lr.start, lr.hasStart, err = r.m.Int("start"); err != nil {
		return "", lr, err
	}
	if lr.end, lr.hasEnd, err = r.m.Int("end"); err != nil {
		return "", lr, err
	}
	return id, lr, nil
}

func cmdGetLogs(r *Req) error {
	id, lr, err := readGetLogs(r)
	if err != nil {
		return err
	}
	logs, err := fetch(r, func(ctx context.Context) ([]LogEntry, error) { return r.eng.Logs(ctx, id) }, logAnswerBytes)
	if err != nil {
		return err
	}
	writeLogs(r, logs, lr)
	return nil
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
	id, _, err := r.m.Key("id")
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
	if err := r.eng.ClearLogs(r.ctx(), id, keep); err != nil {
		return err
	}
	return r.okID()
}

// ---------------------------------------------------------------------------
// WaitJob

// readWaitJob reads WaitJob: the job, and how long to wait (30 s unless
// said).
func readWaitJob(r *Req) (string, time.Duration, error) {
	id, err := jobIDOf(r, "id")
	if err != nil {
		return "", 0, err
	}
	timeout, ok, err := numField(r.m, "timeout", "timeout", numRule{min: 0, max: maxWaitTimeout})
	if err != nil {
		return "", 0, err
	}
	if !ok {
		timeout = 30000
	}
	return id, time.Duration(timeout) * time.Millisecond, nil
}

// cmdWaitJob answers at once for a job that has finished, and otherwise
// later (goAsync), when the job finishes or the wait ends.
func cmdWaitJob(r *Req) error {
	id, timeout, err := readWaitJob(r)
	if err != nil {
		return err
	}
	done, wait, err := r.eng.WaitJob(r.ctx(), id, timeout)
	if err != nil {
		return err
	}
	if done != nil {
		return writeWait(r, *done)
	}
	ctx := r.ctx()
	err = r.goAsync(func(ar *Req) error {
		o, finished, err := wait(ctx)
		if err != nil {
			return err
		}
		if !finished {
			ar.field("completed").Bool(false)
			return nil
		}
		return writeWait(ar, o)
	})
	if err != errAsync {
		// Refused (too many waiting commands): the engine registered the
		// wait's waiter with the job; a wait on a context already ended
		// takes it off again at once. Left there, it would stay until the
		// job finished, one more for every WaitJob refused.
		ended, cancel := context.WithCancel(ctx)
		cancel()
		wait(ended)
	}
	return err
}

// writeWait answers WaitJob. A job that failed for good answers at once
// with completed:false and the failure, where the reference would wait out
// the whole timeout: the official client reads only `completed`.
func writeWait(r *Req, o waitOutcome) error {
	if err := r.room(int64(len(o.result))); err != nil {
		return err
	}
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
