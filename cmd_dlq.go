package main

// Handlers of the dead-letter queue: its entries, retries by hand, its
// policy and figures. The work is the engine's (PolicyEngine: dlq.go,
// pg_dlq.go).

import (
	"context"
	"math"
)

func cmdDlq(r *Req) error {
	name, sel, err := readDlqSelect(r.m, false)
	if err != nil {
		return err
	}
	jobs, err := fetch(r, func(ctx context.Context) ([]*Job, error) {
		jobs, err := r.eng.DLQ(ctx, name, sel)
		return fitDLQ(jobs, r.c.answerLimit()), err
	}, dlqBytes)
	if err != nil {
		return err
	}
	e := r.field("jobs")
	e.ArrayHead(len(jobs))
	for _, j := range jobs {
		encodeJob(e, j, jobPlain, "", nil)
	}
	e = r.field("entries")
	e.ArrayHead(len(jobs))
	for _, j := range jobs {
		encodeDLQEntry(e, j)
	}
	return nil
}

// readDlqSelect reads which DLQ entries a Dlq or RetryDlq request names.
func readDlqSelect(m Map, withJobID bool) (string, dlqSelect, error) {
	var d dlqSelect
	name, err := queueArg(m)
	if err != nil {
		return "", d, err
	}
	if d.filter, err = readDlqFilter(m); err != nil {
		return "", d, err
	}
	if withJobID {
		if d.jobID, _, err = m.Key("jobId"); err != nil {
			return "", d, err
		}
	}
	d.count, d.hasCount, err = m.Int("count")
	return name, d, err
}

// readDlqFilter reads the reference's filter object (nil: none).
func readDlqFilter(m Map) (*dlqFilter, error) {
	fm, ok, err := m.Map("filter")
	if err != nil || !ok {
		return nil, err
	}
	f := &dlqFilter{retriable: -1, expired: -1}
	if f.reason, _, err = fm.Str("reason"); err != nil {
		return nil, &FieldError{Field: "filter.reason", Msg: "must be a string"}
	}
	if f.olderThan, _, err = fm.Int("olderThan"); err != nil {
		return nil, err
	}
	if f.newerThan, _, err = fm.Int("newerThan"); err != nil {
		return nil, err
	}
	if v, ok, _ := fm.Bool("retriable"); ok {
		f.retriable = b2i(v)
	}
	if v, ok, _ := fm.Bool("expired"); ok {
		f.expired = b2i(v)
	}
	f.offset, f.hasOffset, _ = fm.Int("offset")
	f.limit, f.hasLimit, _ = fm.Int("limit")
	return f, nil
}

func b2i(v bool) int8 {
	if v {
		return 1
	}
	return 0
}

func encodeDLQEntry(e *Enc, j *Job) {
	d := j.dlq
	e.MapHead(9)
	e.Str("job")
	encodeJob(e, j, jobPlain, "", nil)
	e.Str("enteredAt")
	e.Int(d.EnteredAt)
	e.Str("reason")
	e.Str(d.Reason)
	e.Str("error")
	optStr(e, d.Error, d.HasErr)
	e.Str("attempts")
	e.ArrayHead(len(j.cold().history))
	for _, a := range j.cold().history {
		e.MapHead(6)
		e.Str("attempt")
		e.Int(int64(a.Attempt))
		e.Str("startedAt")
		optTime(e, a.StartedAt)
		e.Str("failedAt")
		e.Int(a.FailedAt)
		e.Str("reason")
		e.Str(a.Reason)
		e.Str("error")
		optStr(e, a.Error, a.HasErr)
		e.Str("duration")
		if a.StartedAt > 0 {
			e.Int(a.FailedAt - a.StartedAt)
		} else {
			e.Int(0)
		}
	}
	e.Str("retryCount")
	e.Int(int64(d.RetryCount))
	e.Str("lastRetryAt")
	optTime(e, d.LastRetryAt)
	e.Str("nextRetryAt")
	optTime(e, d.NextRetryAt)
	e.Str("expiresAt")
	e.Int(d.ExpiresAt)
}

func cmdRetryDlq(r *Req) error {
	name, sel, err := readDlqSelect(r.m, true)
	if err != nil {
		return err
	}
	n, err := r.eng.RetryDLQ(r.ctx(), name, sel)
	if err != nil {
		return err
	}
	if sel.jobID != "" {
		r.b.announce(noticeQueueCount("dlq:retried", name, n).str("jobId", sel.jobID))
	} else {
		r.b.announce(noticeQueueCount("dlq:retry-all", name, n))
	}
	r.field("count").Int(n)
	return nil
}

func cmdPurgeDlq(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	n, err := r.eng.PurgeDLQ(r.ctx(), name)
	if err != nil {
		return err
	}
	r.b.announce(noticeQueueCount("dlq:purged", name, n))
	r.field("count").Int(n)
	return nil
}

func cmdSetDlqConfig(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	patch, ok, err := readDlqPatch(r.m)
	if err != nil {
		return err
	}
	if ok {
		if err := r.eng.SetDLQConfig(r.ctx(), name, patch); err != nil {
			return err
		}
	}
	r.b.announce(noticeDLQConfig(name, patch, ok))
	return r.okID()
}

// readDlqPatch reads SetDlqConfig's config (ok: there is one). Settings
// of the wrong type are ignored, as the reference ignores them; numbers
// are floored.
func readDlqPatch(m Map) (p dlqPatch, ok bool, err error) {
	cfg, ok, err := m.Map("config")
	if err != nil || !ok {
		return p, false, err
	}
	// Unreadable values are left out, as the reference ignores them; the
	// two times are bounded as PUSH bounds a delay (a huge maxAge turned
	// into 0 and expired every entry at once).
	var refusal error
	floorArg := func(key string, times bool) *int64 {
		f, ok, err := finiteArg(cfg, key)
		if err != nil || !ok {
			return nil
		}
		if times && refusal == nil {
			refusal = delayRule.check("config."+key, f)
		}
		v := int64(math.Floor(f))
		return &v
	}
	if v, ok, err := cfg.Bool("autoRetry"); err == nil && ok {
		p.autoRetry = &v
	}
	p.interval = floorArg("autoRetryInterval", true)
	p.maxRetries = floorArg("maxAutoRetries", false)
	if raw := cfg.Get("maxAge"); raw != nil && raw[0] == 0xc0 {
		p.noMaxAge = true
	} else {
		p.maxAge = floorArg("maxAge", true)
	}
	p.maxEntries = floorArg("maxEntries", false)
	if refusal != nil {
		return p, false, refusal
	}
	return p, true, nil
}

func cmdGetDlqConfig(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	c, err := r.eng.GetDLQConfig(r.ctx(), name)
	if err != nil {
		return err
	}
	e := r.field("config")
	e.MapHead(5)
	e.Str("autoRetry")
	e.Bool(c.AutoRetry)
	e.Str("autoRetryInterval")
	e.Int(c.AutoRetryInterval)
	e.Str("maxAutoRetries")
	e.Int(int64(c.MaxAutoRetries))
	e.Str("maxAge")
	optInt(e, c.MaxAge)
	e.Str("maxEntries")
	e.Int(int64(c.MaxEntries))
	return nil
}

func cmdGetDlqStats(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	st, err := r.eng.DLQStats(r.ctx(), name)
	if err != nil {
		return err
	}
	writeDlqStats(r, name, st)
	return nil
}

func writeDlqStats(r *Req, name string, st dlqStats) {
	e := r.field("data")
	e.MapHead(1)
	e.Str("stats")
	e.MapHead(7)
	e.Str("total")
	e.Int(int64(st.total))
	e.Str("byReason")
	e.MapHead(len(dlqReasons))
	for _, k := range dlqReasons {
		e.Str(k)
		e.Int(int64(st.byReason[k]))
	}
	e.Str("byQueue")
	if st.total > 0 {
		e.MapHead(1)
		e.Str(name)
		e.Int(int64(st.total))
	} else {
		e.MapHead(0)
	}
	e.Str("pendingRetry")
	e.Int(int64(st.pending))
	e.Str("expired")
	e.Int(int64(st.expired))
	e.Str("oldestEntry")
	optTime(e, st.oldest)
	e.Str("newestEntry")
	optTime(e, st.newest)
}

func cmdRemoveDlqJob(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	id, _, err := r.m.Key("jobId")
	if err != nil {
		return err
	}
	removed, err := r.eng.RemoveDLQJob(r.ctx(), name, id)
	if err != nil {
		return err
	}
	e := r.field("data")
	e.MapHead(1)
	e.Str("removed")
	e.Bool(removed)
	return nil
}
