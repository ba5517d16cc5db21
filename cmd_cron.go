package main

// Handlers of the cron commands. The schedules are the engine's
// (CronEngine: cron.go, pg_cron.go); a schedule that comes due pushes an
// ordinary job through the push path.

import (
	"errors"
	"math"
)

func cmdCron(r *Req) error {
	s, err := readCron(r.m)
	if err != nil {
		return err
	}
	got, err := r.eng.AddCron(r.ctx(), s)
	if err != nil {
		return err
	}
	r.b.announce(noticeCron(&got))
	encodeCron(r.field("cron"), &got)
	return nil
}

func cmdCronGet(r *Req) error {
	name, _, err := r.m.Str("name")
	if err != nil {
		return err
	}
	if !storableText(name) {
		return errCronNotFound // Cron refuses such a name
	}
	s, err := r.eng.GetCron(r.ctx(), name)
	if err != nil {
		return err
	}
	encodeCron(r.field("cron"), &s)
	return nil
}

func cmdCronList(r *Req) error {
	list, err := r.eng.ListCrons(r.ctx())
	if err != nil {
		return err
	}
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
	if !storableText(name) {
		return errCronNotFound // Cron refuses such a name
	}
	if err := r.eng.DeleteCron(r.ctx(), name); err != nil {
		return err
	}
	r.b.announce(newNote("cron:deleted").str("name", name))
	return r.okID()
}

// encodeCron writes a schedule as the cron commands answer it.
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

// readCron reads a Cron command into a schedule, with the reference's
// defaults. The fields are read, and refused, in the order the reference
// checks them: the first fault is the one reported.
func readCron(m Map) (CronSchedule, error) {
	s := CronSchedule{SkipMissedOnRestart: true, PreventOverlap: true}
	var err error
	if s.Name, _, err = m.Str("name"); err != nil {
		return s, err
	}
	if s.Name == "" {
		return s, errors.New("name is required")
	}
	if !storableText(s.Name) {
		return s, errors.New("Cron name " + textRule)
	}
	if s.Queue, err = queueArg(m); err != nil {
		return s, err
	}
	for _, read := range []func(Map, *CronSchedule) error{readCronJob, readCronTiming, readCronOptions} {
		if err := read(m, &s); err != nil {
			return s, err
		}
	}
	if err := checkCron(&s); err != nil {
		return s, err
	}
	// A schedule whose job PUSH would refuse (a delay past a year in its
	// jobOptions, say) would fail at every run: it is refused now, with
	// PUSH's answer.
	if _, err := cronJob(&s, 0); err != nil {
		return s, errors.New("Cron job: " + err.Error())
	}
	return s, nil
}

// readCronJob reads the job's name and data.
func readCronJob(m Map, s *CronSchedule) error {
	data := m.Get("data")
	if data != nil {
		s.Data = clone(data)
	}
	jn, ok, err := m.Str("jobName")
	if err != nil {
		return err
	}
	if ok && jn != "" {
		s.JobName = jn
		return nil
	}
	// As PUSH reads a legacy {name, ...} payload.
	s.JobName, s.Data = legacyName(s.Data)
	if data == nil {
		s.Data = nil
	}
	return nil
}

// readCronTiming reads when the schedule runs (its expression or
// interval, time zone and run limit) and its jobs' priority.
func readCronTiming(m Map, s *CronSchedule) error {
	var err error
	if s.Schedule, _, err = m.Str("schedule"); err != nil {
		return err
	}
	if f, ok, err := m.Num("repeatEvery"); err != nil {
		return err
	} else if ok {
		if f != math.Trunc(f) || f < 1 || f > 9007199254740991 {
			return errors.New("Cron repeatEvery must be a positive safe integer number of milliseconds")
		}
		// An interval is a time, within PUSH's range for one.
		if err := delayRule.check("repeatEvery", f); err != nil {
			return err
		}
		s.RepeatEvery = int64(f)
	}
	if s.Schedule == "" && s.RepeatEvery == 0 {
		return errors.New("Cron job must have either schedule or repeatEvery")
	}
	if s.Timezone, _, err = m.Str("timezone"); err != nil {
		return err
	}
	// The jobs' priority, in PUSH's range: they are pushed with it.
	if p, ok, err := numField(m, "priority", "priority", priorityRule); err != nil {
		return err
	} else if ok {
		s.Priority = int64(p)
	}
	if l, ok, err := finiteArg(m, "maxLimit"); err != nil {
		return err
	} else if ok && l > 0 {
		s.MaxLimit = int64(l)
	}
	return nil
}

// readCronOptions reads the jobs' unique key, dedup and options and the
// schedule's switches, then checks its expression.
func readCronOptions(m Map, s *CronSchedule) error {
	var err error
	if s.UniqueKey, _, err = m.Str("uniqueKey"); err != nil {
		return err
	}
	if d, ok, err := m.Map("dedup"); err != nil {
		return err
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
			return err
		} else if ok {
			*f.dst = v
		}
	}
	if o := m.Get("jobOptions"); o != nil && o[0] != 0xc0 {
		if _, err := ParseMap(o, nil); err != nil {
			return &FieldError{Field: "jobOptions", Msg: "must be an object"}
		}
		s.JobOptions = clone(o)
	}
	if s.Schedule != "" {
		if _, err := ParseCron(s.Schedule); err != nil {
			return errors.New("Invalid cron expression: " + err.Error())
		}
	}
	return nil
}
