package main

import (
	"errors"
	"math"
	"time"
)

// Repeatable jobs: PUSH's repeat option, read, checked, and the next run
// of a job that repeats once it completes (both engines).

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
		// The interval is a time, in PUSH's range for one.
		if err := delayRule.check("repeat.every", every); err != nil {
			return nil, err
		}
		rs.every = int64(every)
	} else if _, err := ParseCron(rs.pattern); err != nil {
		return nil, errors.New("Invalid repeat pattern: " + err.Error())
	}
	// The dates are dates PUSH takes for a timestamp, the offset a time
	// either way: the next run is a sum of them, which must not wrap
	// around past int64's end.
	dates := numRule{min: 0, max: maxTimestamp}
	for _, f := range []struct {
		key  string
		dst  *int64
		rule numRule
	}{{"startDate", &rs.startDate, dates}, {"endDate", &rs.endDate, dates}, {"prevMillis", &rs.prevMillis, dates},
		{"offset", &rs.offset, numRule{min: -maxDelayMs, max: maxDelayMs}}} {
		if v, ok, err := m.Num(f.key); err != nil || (ok && (math.IsNaN(v) || math.IsInf(v, 0))) {
			return nil, errors.New("repeat." + f.key + " must be a finite timestamp")
		} else if ok {
			if err := f.rule.check("repeat."+f.key, v); err != nil {
				return nil, err
			}
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
	if j.cold().Repeat == nil {
		return nil
	}
	if _, err := readRepeat(j.cold().Repeat); err != nil {
		return err
	}
	if j.cold().CustomID != "" {
		return errors.New("repeat jobs cannot use JobOptions.jobId; use repeat.jobId instead")
	}
	if len(j.cold().DependsOn) > 0 || j.cold().ParentID != "" {
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
		// The first run after now, and not before startDate, in whole
		// intervals: computed, not stepped to, since stepping took one
		// step per interval to catch up (billions for an interval of 1 ms
		// and an offset a year back, under the shard's lock).
		if earliest := max(now+1, rs.startDate); next < earliest {
			next += (earliest - next + rs.every - 1) / rs.every * rs.every
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
	rs, err := readRepeat(j.cold().Repeat)
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
	n.setID(newID())
	n.warm().CustomID = ""
	n.CreatedAt, n.RunAt = now, next
	n.setHeartbeat(now)
	n.setStartedAt(0)
	n.setDoneAt(0)
	n.Attempts, n.warm().Stalls = 0, 0
	n.warm().Progress, n.warm().ProgressMsg, n.warm().HasProgressMsg, n.warm().Stack = nil, "", false, nil
	n.resetTimeline()
	n.warm().history, n.dlq = nil, nil
	n.state, n.warm().failErr, n.warm().hasFail = StateNone, "", false
	n.warm().childValues, n.warm().failedKids, n.warm().ignoredKids = nil, nil, nil
	n.warm().Repeat = setDataKey(setDataKey(j.cold().Repeat, "count", intRaw(rs.count+1)), "prevMillis", intRaw(next))
	return n
}

func intRaw(v int64) Raw {
	var e Enc
	e.Int(v)
	return e.B
}
