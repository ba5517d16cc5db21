package main

// Handlers of the moves by hand: one job (Cancel, Discard, Promote,
// MoveToWait, MoveToDelayed, ChangeDelay, ChangePriority, Update) and a
// queue's jobs (PromoteJobs, Clean, RetryCompleted). The work is the
// engine's (ControlEngine: control.go, pg_control.go).

import (
	"errors"
	"math"
)

// jobIDArg reads the id of the job a move names.
func jobIDArg(r *Req) (string, error) {
	id, _, err := r.m.Key("id")
	return id, err
}

func tokenArg(m Map) (string, error) {
	tok, _, err := m.Key("token")
	return tok, err
}

// moveCmd moves the job the request names, its own arguments read.
func moveCmd(r *Req, m JobMove) error {
	id, err := jobIDArg(r)
	if err != nil {
		return err
	}
	if err := r.eng.MoveJob(r.ctx(), id, m); err != nil {
		return err
	}
	r.b.announce(noticeMove(m.Kind, id, r.m))
	return r.okID()
}

func cmdCancel(r *Req) error  { return moveCmd(r, JobMove{Kind: MoveCancel}) }
func cmdPromote(r *Req) error { return moveCmd(r, JobMove{Kind: MovePromote}) }

func cmdDiscard(r *Req) error    { return tokenMoveCmd(r, MoveDiscard) }
func cmdMoveToWait(r *Req) error { return tokenMoveCmd(r, MoveToWait) }

// tokenMoveCmd moves a job that may be active, by its lease token.
func tokenMoveCmd(r *Req, kind MoveKind) error {
	tok, err := tokenArg(r.m)
	if err != nil {
		return err
	}
	return moveCmd(r, JobMove{Kind: kind, Token: tok})
}

func cmdMoveToDelayed(r *Req) error { return delayCmd(r, MoveToDelayed) }
func cmdChangeDelay(r *Req) error   { return delayCmd(r, MoveChangeDelay) }

// delayCmd reads MoveToDelayed's and ChangeDelay's delay within PUSH's
// range, so that the job's new run time is one PUSH could have given it
// (and now plus the delay cannot wrap around to the past).
func delayCmd(r *Req, kind MoveKind) error {
	d, _, err := numField(r.m, "delay", "delay", delayRule)
	if err != nil {
		return err
	}
	tok, err := tokenArg(r.m)
	if err != nil {
		return err
	}
	return moveCmd(r, JobMove{Kind: kind, Token: tok, Delay: int64(d)})
}

// priorityArgs are ChangePriority's fields.
type priorityArgs struct {
	prio          float64 // a finite integer; its range is check's
	lifo, hasLifo bool
}

// check refuses a priority PUSH would refuse for this job. The range
// depends on the job (a group's job takes the group's, 0..2097151), so it
// is checked on the job the engine found, in JobMove.plan, which both
// engines run: the handler can only see that it is a finite integer.
func (a priorityArgs) check(j *Job) error { return checkPriority(a.prio, j.cold().GroupID != "") }

// apply sets a queued job's priority (and LIFO flag when given), once
// check has taken it.
func (a priorityArgs) apply(j *Job) {
	j.Priority = int64(a.prio)
	if a.hasLifo {
		j.warm().Lifo = a.lifo
	}
}

func cmdChangePriority(r *Req) error {
	prio, _, err := numField(r.m, "priority", "priority", anyNumber(true))
	if err != nil {
		return err
	}
	a := priorityArgs{prio: prio}
	if a.lifo, a.hasLifo, err = r.m.Bool("lifo"); err != nil {
		return err
	}
	return moveCmd(r, JobMove{Kind: MoveChangePriority, Prio: a})
}

func cmdUpdate(r *Req) error {
	data := r.m.Get("data")
	if data == nil {
		data = rawUndefined
	}
	if len(data) > maxDataBytes {
		return errors.New("Job data too large (max 10MB)")
	}
	return moveCmd(r, JobMove{Kind: MoveUpdate, Data: data})
}

// ---------------------------------------------------------------------------
// A queue's jobs

func cmdPromoteJobs(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	count, hasCount, err := r.m.Num("count")
	if err != nil {
		return err
	}
	// Without a count, every delayed job (MaxInt32 of them: more than a
	// queue holds); a count that is not a number promotes none.
	limit := math.MaxInt32
	if hasCount {
		limit = 0
		if count > 0 {
			limit = int(min(math.Floor(count), math.MaxInt32))
		}
	}
	n, err := r.eng.PromoteJobs(r.ctx(), queue, limit)
	if err != nil {
		return err
	}
	r.field("count").Int(n)
	return nil
}

// cleanArgs are Clean's fields.
type cleanArgs struct {
	queue    string
	grace    float64
	hasGrace bool
	limit    int64
	state    string
}

func readClean(r *Req) (cleanArgs, error) {
	a := cleanArgs{limit: 1000}
	var err error
	if a.queue, err = queueArg(r.m); err != nil {
		return a, err
	}
	// The grace is an age: a time as PUSH bounds one, so that now minus
	// the grace cannot wrap around.
	if a.grace, a.hasGrace, err = numField(r.m, "grace", "grace", delayRule); err != nil {
		return a, err
	}
	if l, ok, err := r.m.Num("limit"); err != nil {
		return a, err
	} else if ok {
		if math.IsNaN(l) || math.IsInf(l, 0) {
			a.limit = 0
		} else {
			a.limit = int64(max(math.Trunc(l), 0))
		}
	}
	if a.state, _, err = r.m.Str("state"); err != nil {
		return a, err
	}
	if a.state == "wait" {
		a.state = "waiting"
	}
	return a, nil
}

// none says Clean removes nothing whatever the queue holds.
func (a cleanArgs) none() bool { return !a.hasGrace || a.limit == 0 }

func (a cleanArgs) cutoff(now int64) int64 { return now - int64(a.grace) }

func cmdClean(r *Req) error {
	a, err := readClean(r)
	if err != nil {
		return err
	}
	ids, err := r.eng.Clean(r.ctx(), a)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		r.b.announce(noticeQueue("queue:cleaned", a.queue).raw("state", r.m.Get("state")).int("count", int64(len(ids))))
	}
	r.field("count").Int(int64(len(ids)))
	strArray(r.field("ids"), nonNil(ids))
	return nil
}

func nonNil(a []string) []string {
	if a == nil {
		return []string{}
	}
	return a
}

// retryCompletedArgs are RetryCompleted's fields.
type retryCompletedArgs struct {
	queue, id       string
	count, ts       float64
	hasCount, hasTS bool
}

func readRetryCompleted(r *Req) (retryCompletedArgs, error) {
	var a retryCompletedArgs
	var err error
	if a.queue, err = queueArg(r.m); err != nil {
		return a, err
	}
	if a.id, _, err = r.m.Key("id"); err != nil {
		return a, err
	}
	if a.count, a.hasCount, err = r.m.Num("count"); err != nil {
		return a, err
	}
	a.ts, a.hasTS, err = r.m.Num("timestamp")
	return a, err
}

// limit is how many completed jobs may be retried.
func (a retryCompletedArgs) limit() float64 {
	if !a.hasCount {
		return math.Inf(1)
	}
	if a.count > 0 && !math.IsInf(a.count, 0) {
		return math.Floor(a.count)
	}
	return 0
}

// takes says whether a job completed at doneAt is one to retry.
func (a retryCompletedArgs) takes(doneAt int64) bool { return !a.hasTS || float64(doneAt) <= a.ts }

func cmdRetryCompleted(r *Req) error {
	a, err := readRetryCompleted(r)
	if err != nil {
		return err
	}
	n, err := r.eng.RetryCompleted(r.ctx(), a)
	if err != nil {
		return err
	}
	r.field("count").Int(n)
	return nil
}
