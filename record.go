package main

// The storage record of a job: everything the broker needs to rebuild the
// job after a restart, as one MessagePack array. The wire format is for
// clients; this one is ours, compact, positional and versioned.

import (
	"errors"
	"fmt"
)

// recordVersion is a record with the job's data; recordVersionApart one
// without it, whose data its PostgreSQL row keeps beside it (pg_data.go).
const (
	recordVersion      = 1
	recordVersionApart = 2
)

// Flag bits of a record.
const (
	rfLifo = 1 << iota
	rfRemoveOnC
	rfRemoveOnF
	rfFailParent
	rfRemoveDep
	rfContinueParent
	rfIgnoreDep
	rfDedupExtend
	rfDedupReplace
	rfDurable
	rfHasProgMsg
	rfHasFail
)

func recInt(e *Enc, v int64) { e.Int64Exact(v) }

func recStrs(e *Enc, a []string) {
	if a == nil {
		e.Nil()
		return
	}
	strArray(e, a)
}

func recOptStr(e *Enc, s string, ok bool) {
	if ok {
		e.Str(s)
	} else {
		e.Nil()
	}
}

// encodeRecord appends j's record to e. It runs under the job's shard lock.
// The parts write the 43 positions in order; decodeRecord reads them back
// with parts of the same names.
func encodeRecord(e *Enc, j *Job) { encodeRecordAs(e, j, false) }

// encodeRecordAs is encodeRecord, or with apart a record without the
// job's data, which is kept beside it (pg_data.go): of version
// recordVersionApart, so that a build that knows no such record refuses
// it (a record newer than it reads) rather than take it for a job with
// no data.
func encodeRecordAs(e *Enc, j *Job, apart bool) {
	e.ArrayHead(43)
	if apart {
		recInt(e, recordVersionApart) // 1
		encRecordCore(e, j, nil)      // 15
	} else {
		recInt(e, recordVersion)    // 1
		encRecordCore(e, j, j.Data) // 15
	}
	encRecordLinks(e, j)      // 8
	encRecordProgress(e, j)   // 10
	recInt(e, recordFlags(j)) // 1
	encRecordDedup(e, j)      // 1
	encRecordTimeline(e, j)   // 1
	encRecordBroker(e, j)     // 4
	encRecordHistory(e, j)    // 1
	encRecordFlows(e, j)      // 1
}

// encRecordCore writes who the job is, its times, attempts, retry
// settings, ttl and timeout.
func encRecordCore(e *Enc, j *Job, data Raw) {
	e.JobID(j)
	e.Str(j.Queue)
	e.Str(j.Name)
	e.Raw(data)
	recInt(e, j.Priority)
	recInt(e, j.CreatedAt)
	recInt(e, j.RunAt)
	recInt(e, j.StartedAt())
	recInt(e, j.DoneAt())
	recInt(e, int64(j.Attempts))
	recInt(e, int64(j.cold().MaxAttempts))
	recInt(e, j.cold().Backoff)
	if c := j.cold().BackoffObj; c != nil {
		e.ArrayHead(3)
		e.Bool(c.Exponential)
		recInt(e, c.Delay)
		recInt(e, c.MaxDelay)
	} else {
		e.Nil()
	}
	recInt(e, j.cold().TTL)
	recInt(e, j.cold().Timeout)
}

// encRecordLinks writes what ties the job to others: its ids,
// dependencies, parent, children, tags and group.
func encRecordLinks(e *Enc, j *Job) {
	e.Str(j.cold().UniqueKey)
	e.Str(j.cold().CustomID)
	recStrs(e, j.cold().DependsOn)
	e.Str(j.cold().ParentID)
	recStrs(e, j.cold().Children)
	recInt(e, int64(j.cold().ChildDone))
	recStrs(e, j.cold().Tags)
	e.Str(j.cold().GroupID)
}

// encRecordProgress writes what a running job reports and the limits it
// runs under.
func encRecordProgress(e *Enc, j *Job) {
	e.Raw(j.cold().Progress)
	e.Str(j.cold().ProgressMsg)
	recStrs(e, j.cold().Stack)
	e.Raw(j.cold().Repeat)
	recInt(e, j.Heartbeat())
	recInt(e, j.cold().StallTimeout)
	recInt(e, int64(j.cold().Stalls))
	recInt(e, int64(j.cold().StackTraceLimit))
	recInt(e, j.cold().KeepLogs)
	recInt(e, j.cold().SizeLimit)
}

// recordFlags packs the job's booleans into one integer.
func recordFlags(j *Job) int64 {
	var f int64
	for _, b := range []struct {
		on  bool
		bit int64
	}{{j.cold().Lifo, rfLifo}, {j.cold().RemoveOnComplete, rfRemoveOnC}, {j.cold().RemoveOnFail, rfRemoveOnF}, {j.cold().FailParent, rfFailParent},
		{j.cold().RemoveDepOnFail, rfRemoveDep}, {j.cold().ContinueParent, rfContinueParent}, {j.cold().IgnoreDepOnFail, rfIgnoreDep},
		{j.cold().DedupExtend, rfDedupExtend}, {j.cold().DedupReplace, rfDedupReplace}, {j.cold().Durable, rfDurable},
		{j.cold().HasProgressMsg, rfHasProgMsg}, {j.cold().hasFail, rfHasFail}} {
		if b.on {
			f |= b.bit
		}
	}
	return f
}

// encRecordDedup writes the dedup and debounce settings, which travel as
// one array.
func encRecordDedup(e *Enc, j *Job) {
	e.ArrayHead(3)
	recInt(e, j.cold().DedupTTL)
	e.Str(j.cold().DebounceID)
	recInt(e, j.cold().DebounceTTL)
}

func encRecordTimeline(e *Enc, j *Job) {
	// The record keeps every entry, the implied first one too: a reader
	// need not know the rule.
	e.ArrayHead(j.timelineLen())
	if j.tl0 != StateNone {
		e.ArrayHead(4)
		e.Str(j.tl0.String())
		recInt(e, j.CreatedAt)
		recOptStr(e, "", false)
		recInt(e, 0)
	}
	for _, t := range j.Timeline() {
		e.ArrayHead(4)
		e.Str(t.State.String())
		recInt(e, t.At)
		recOptStr(e, t.Error, t.HasErr)
		recInt(e, int64(t.Attempt))
	}
}

// encRecordBroker writes the broker's own bookkeeping, never on the wire:
// state, sequence, failure and dead-letter entry.
func encRecordBroker(e *Enc, j *Job) {
	recInt(e, int64(j.state))
	recInt(e, j.seq)
	e.Str(j.cold().failErr)
	if d := j.dlq; d != nil {
		e.ArrayHead(7)
		recInt(e, d.EnteredAt)
		e.Str(d.Reason)
		recOptStr(e, d.Error, d.HasErr)
		recInt(e, int64(d.RetryCount))
		recInt(e, d.LastRetryAt)
		recInt(e, d.NextRetryAt)
		recInt(e, d.ExpiresAt)
	} else {
		e.Nil()
	}
}

// encRecordHistory writes the job's failed attempts.
func encRecordHistory(e *Enc, j *Job) {
	e.ArrayHead(len(j.cold().history))
	for _, a := range j.cold().history {
		e.ArrayHead(5)
		recInt(e, int64(a.Attempt))
		recInt(e, a.StartedAt)
		recInt(e, a.FailedAt)
		e.Str(a.Reason)
		recOptStr(e, a.Error, a.HasErr)
	}
}

// encRecordFlows writes the flow records: children's results, failed and
// ignored children; nil when there are none, as for most jobs.
func encRecordFlows(e *Enc, j *Job) {
	if len(j.cold().childValues)+len(j.cold().failedKids)+len(j.cold().ignoredKids) == 0 {
		e.Nil()
		return
	}
	e.ArrayHead(3)
	for _, kvs := range [][]childKV{j.cold().childValues, j.cold().failedKids, j.cold().ignoredKids} {
		e.ArrayHead(len(kvs))
		for _, kv := range kvs {
			e.ArrayHead(2)
			e.Str(kv.key)
			e.Raw(kv.val)
		}
	}
}

// recReader reads a record's fields in order; the first fault sticks.
// It walks the record's bytes as it goes rather than splitting them into
// a slice of items first: a restart reads a million records, and those
// slices were most of what it allocated.
type recReader struct {
	b   Raw // the fields not read yet
	n   int // how many there are
	at  int // index of the next field, for errors
	err error
}

// newRecReader reads the array header of a record.
func newRecReader(v Raw) (recReader, error) {
	n, i, err := arrayHead(v)
	if err != nil {
		return recReader{}, err
	}
	return recReader{b: v[i:], n: n}, nil
}

func (r *recReader) next() Raw {
	if r.err != nil {
		return rawNil
	}
	if r.n == 0 {
		r.err = errors.New("record too short")
		return rawNil
	}
	e, err := skip(r.b, 0, 1, extAny)
	if err != nil {
		r.err = fmt.Errorf("record field %d: %w", r.at, err)
		return rawNil
	}
	v := r.b[:e:e]
	r.b, r.n, r.at = r.b[e:], r.n-1, r.at+1
	return v
}

func (r *recReader) fail(what string, err error) {
	if r.err == nil {
		r.err = fmt.Errorf("record field %d (%s): %w", r.at-1, what, err)
	}
}

func (r *recReader) i64() int64 {
	v := r.next()
	if v.IsNil() {
		return 0
	}
	n, err := rawInt(v)
	if err != nil {
		r.fail("integer", err)
	}
	return n
}

func (r *recReader) str() string {
	v := r.next()
	if v.IsNil() {
		return ""
	}
	s, err := v.Str()
	if err != nil {
		r.fail("string", err)
	}
	return s
}

// strLike reads a string, reusing *last when it holds the same text:
// records read in a row mostly share their queue and job name, and one
// string for a million jobs is a million allocations fewer.
func (r *recReader) strLike(last *string) string {
	if b := r.strBytes(); string(b) != *last {
		*last = string(b)
	}
	return *last
}

// stateName reads a timeline state by its name; one this build does not
// know reads as StateNone.
func (r *recReader) stateName() State {
	st, _ := stateNamed(r.strBytes())
	return st
}

// strBytes reads a string field's bytes, in place (nil for nil).
func (r *recReader) strBytes() []byte {
	v := r.next()
	if v.IsNil() {
		return nil
	}
	a, e, err := strRange(v, 0)
	if err != nil || e != len(v) {
		if err == nil {
			err = errNotStr
		}
		r.fail("string", err)
		return nil
	}
	return v[a:e]
}

func (r *recReader) optStr() (string, bool) {
	v := r.next()
	if v.IsNil() {
		return "", false
	}
	s, err := v.Str()
	if err != nil {
		r.fail("string", err)
	}
	return s, true
}

func (r *recReader) raw() Raw {
	v := r.next()
	if len(v) == 0 || v[0] == 0xc0 {
		return nil
	}
	return clone(v)
}

func (r *recReader) strs() []string {
	v := r.next()
	if v.IsNil() {
		return nil
	}
	items, err := v.Array()
	if err != nil {
		r.fail("array", err)
		return nil
	}
	out := make([]string, len(items))
	for i, it := range items {
		if out[i], err = it.Str(); err != nil {
			r.fail("string in array", err)
		}
	}
	return out
}

// sub reads a nested array; ok is false when the field is nil or not an
// array (a fault in the latter case).
func (r *recReader) sub() (recReader, bool) {
	v := r.next()
	if v.IsNil() {
		return recReader{}, false
	}
	c, err := newRecReader(v)
	if err != nil {
		r.fail("array", err)
		return recReader{}, false
	}
	return c, true
}

// rawInt reads an integer of any encoding exactly (int64 included).
func rawInt(v Raw) (int64, error) {
	if len(v) > 0 && v[0] == 0xd3 && len(v) == 9 {
		var n int64
		for _, b := range v[1:] {
			n = n<<8 | int64(b)
		}
		return n, nil
	}
	f, err := v.Float()
	return int64(f), err
}

// decodeRecord rebuilds a job from its record. The parts read the
// positions encodeRecord wrote, in the same order; the first fault sticks
// in r and is the error returned.
func decodeRecord(b []byte) (*Job, error) {
	var last recLast
	return last.decode(b)
}

// errRecordNewer: a record written by a newer build, which this one cannot
// read but must not take for spoiled.
var errRecordNewer = errors.New("written by a newer build")

// recLast is what a run of decodes shares: the last queue and job name
// read (see strLike). A recovery or a page of rows uses one.
type recLast struct{ queue, name string }

func (l *recLast) decode(b []byte) (*Job, error) {
	rr, err := newRecReader(b)
	if err != nil {
		return nil, fmt.Errorf("job record: %w", err)
	}
	r := &rr
	if v := r.i64(); v != recordVersion && v != recordVersionApart {
		err := fmt.Errorf("job record version %d, this build reads %d and %d", v, recordVersion, recordVersionApart)
		if v > recordVersionApart {
			err = fmt.Errorf("%w: %w", err, errRecordNewer)
		}
		return nil, err
	}
	j := &Job{}
	decRecordCore(r, j, l)
	decRecordLinks(r, j)
	decRecordProgress(r, j)
	setRecordFlags(j, r.i64())
	decRecordDedup(r, j)
	decRecordTimeline(r, j)
	decRecordBroker(r, j)
	decRecordHistory(r, j)
	decRecordFlows(r, j)
	if r.err != nil {
		return nil, r.err
	}
	if j.idLen() == 0 || j.Queue == "" {
		return nil, errors.New("job record without id or queue")
	}
	j.settle()
	return j, nil
}

func decRecordCore(r *recReader, j *Job, l *recLast) {
	j.setIDBytes(r.strBytes())
	j.Queue = r.strLike(&l.queue)
	j.Name = r.strLike(&l.name)
	j.Data = r.raw()
	if j.Data == nil {
		j.Data = rawNil
	}
	j.Priority = r.i64()
	j.CreatedAt = r.i64()
	j.RunAt = r.i64()
	j.setStartedAt(r.i64())
	j.setDoneAt(r.i64())
	j.Attempts = int32(r.i64())
	j.warm().MaxAttempts = int32(r.i64())
	j.warm().Backoff = r.i64()
	if c, ok := r.sub(); ok {
		exp := c.next()
		j.warm().BackoffObj = &Backoff{Exponential: len(exp) > 0 && exp[0] == 0xc3, Delay: c.i64(), MaxDelay: c.i64()}
		if c.err != nil {
			r.fail("backoff", c.err)
		}
	}
	j.warm().TTL = r.i64()
	j.warm().Timeout = r.i64()
}

func decRecordLinks(r *recReader, j *Job) {
	j.warm().UniqueKey = r.str()
	j.warm().CustomID = r.str()
	j.warm().DependsOn = r.strs()
	j.warm().ParentID = r.str()
	j.warm().Children = r.strs()
	j.warm().ChildDone = int32(r.i64())
	j.warm().Tags = r.strs()
	j.warm().GroupID = r.str()
}

func decRecordProgress(r *recReader, j *Job) {
	j.warm().Progress = r.raw()
	j.warm().ProgressMsg = r.str()
	j.warm().Stack = r.strs()
	j.warm().Repeat = r.raw()
	j.setHeartbeat(r.i64())
	j.warm().StallTimeout = r.i64()
	j.warm().Stalls = int32(r.i64())
	j.warm().StackTraceLimit = int32(r.i64())
	j.warm().KeepLogs = r.i64()
	j.warm().SizeLimit = r.i64()
}

// setRecordFlags unpacks what recordFlags packed.
func setRecordFlags(j *Job, f int64) {
	j.warm().Lifo, j.warm().RemoveOnComplete, j.warm().RemoveOnFail = f&rfLifo != 0, f&rfRemoveOnC != 0, f&rfRemoveOnF != 0
	j.warm().FailParent, j.warm().RemoveDepOnFail = f&rfFailParent != 0, f&rfRemoveDep != 0
	j.warm().ContinueParent, j.warm().IgnoreDepOnFail = f&rfContinueParent != 0, f&rfIgnoreDep != 0
	j.warm().DedupExtend, j.warm().DedupReplace, j.warm().Durable = f&rfDedupExtend != 0, f&rfDedupReplace != 0, f&rfDurable != 0
	j.warm().HasProgressMsg, j.warm().hasFail = f&rfHasProgMsg != 0, f&rfHasFail != 0
}

func decRecordDedup(r *recReader, j *Job) {
	if d, ok := r.sub(); ok {
		j.warm().DedupTTL = d.i64()
		j.warm().DebounceID = d.str()
		j.warm().DebounceTTL = d.i64()
		if d.err != nil {
			r.fail("dedup", d.err)
		}
	}
}

// decRecordTimeline reads the timeline; an empty one stays nil, as a new
// job's is, and a first entry at the job's creation is implied (tl0), as
// addTimeline makes it.
func decRecordTimeline(r *recReader, j *Job) {
	tl, ok := r.sub()
	if !ok || tl.n == 0 {
		return
	}
	total := tl.n // tl.n counts down as entries are read
	for i := range total {
		t, ok := tl.sub()
		if !ok {
			break
		}
		var e TimelineEntry
		e.State = t.stateName()
		e.At = t.i64()
		e.Error, e.HasErr = t.optStr()
		e.Attempt = int32(t.i64())
		if t.err != nil {
			r.fail("timeline", t.err)
		}
		if i == 0 && j.impliable(e) {
			j.tl0 = e.State
			continue
		}
		if j.Timeline() == nil {
			j.setTimeline(make([]TimelineEntry, 0, total-i))
		}
		j.setTimeline(append(j.Timeline(), e))
	}
}

func decRecordBroker(r *recReader, j *Job) {
	j.state = State(r.i64())
	j.seq = r.i64()
	j.warm().failErr = r.str()
	if d, ok := r.sub(); ok {
		e := &DLQEntry{}
		e.EnteredAt = d.i64()
		e.Reason = d.str()
		e.Error, e.HasErr = d.optStr()
		e.RetryCount = int32(d.i64())
		e.LastRetryAt = d.i64()
		e.NextRetryAt = d.i64()
		e.ExpiresAt = d.i64()
		if d.err != nil {
			r.fail("dlq", d.err)
		}
		j.dlq = e
	}
}

func decRecordHistory(r *recReader, j *Job) {
	h, ok := r.sub()
	if !ok {
		return
	}
	for range h.n {
		a, ok := h.sub()
		if !ok {
			break
		}
		var rec AttemptRec
		rec.Attempt = int32(a.i64())
		rec.StartedAt = a.i64()
		rec.FailedAt = a.i64()
		rec.Reason = a.str()
		rec.Error, rec.HasErr = a.optStr()
		if a.err != nil {
			r.fail("history", a.err)
		}
		j.warm().history = append(j.cold().history, rec)
	}
}

// decRecordFlows reads the flow records; a malformed entry fails the
// record.
func decRecordFlows(r *recReader, j *Job) {
	f, ok := r.sub()
	if !ok || f.n != 3 {
		return
	}
	for _, dst := range []*[]childKV{&j.warm().childValues, &j.warm().failedKids, &j.warm().ignoredKids} {
		list, ok := f.sub()
		if !ok {
			continue
		}
		for range list.n {
			kv, ok := list.sub()
			if !ok || kv.n != 2 {
				r.fail("flow record", errors.New("bad entry"))
				break
			}
			key := kv.str()
			*dst = append(*dst, childKV{key: key, val: kv.raw()})
		}
	}
}
