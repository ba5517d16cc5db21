package main

// Handlers of the job lifecycle: push, pull, ack, fail, and leases. The
// work is the engine's (JobEngine: lifecycle.go, pg_lifecycle.go).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

func cmdPush(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	j, err := parseJob(r.m, queue, "jobId", r.eng.Now())
	if err != nil {
		return err
	}
	return r.pushed(queue, r.eng.Push(r.ctx(), queue, []*Job{j}, false), false)
}

func cmdPushBatch(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	items, ok, err := r.m.Array("jobs")
	if err != nil || !ok {
		return errors.New("jobs must be an array")
	}
	jobs, err := parseJobBatch(items, queue, r.eng.Now())
	if err != nil {
		return err
	}
	return r.pushed(queue, r.eng.Push(r.ctx(), queue, jobs, true), true)
}

// pushed answers a push: at once, or from a goroutine of its own when the
// engine writes the jobs later. A connection with as many commands
// waiting as it may have waits for this one instead: the client is slowed
// down rather than its push refused.
func (r *Req) pushed(queue string, p Pushed, batch bool) error {
	if p.Wait == nil {
		return writePushed(r, queue, p.IDs, p.Made, p.Err, batch)
	}
	wait := func(ar *Req) error {
		ids, made, err := p.Wait()
		return writePushed(ar, queue, ids, made, err, batch)
	}
	if r.c.nAsync.Load() >= maxAsyncPerConn {
		return wait(r)
	}
	return r.goAsync(wait)
}

// writePushed writes PUSH's {id} or PUSHB's {ids}. A refusal of one job
// of a PUSHB names the job.
func writePushed(r *Req, queue string, ids []string, made int, err error, batch bool) error {
	if err != nil {
		var je *jobErr
		if !errors.As(err, &je) {
			return err
		}
		if batch {
			return errors.New("jobs[" + strconv.Itoa(je.i) + "]: " + je.err.Error())
		}
		return je.err
	}
	if batch {
		if len(ids) > 1 && made > 0 && r.b.hearing() {
			r.b.announce(noticeQueue("batch:pushed", queue).int("total", int64(len(ids))).
				int("inserted", int64(made)).int("duplicates", int64(len(ids)-made)))
		}
		strArray(r.field("ids"), ids)
	} else {
		r.field("id").Str(ids[0])
	}
	return nil
}

// ---------------------------------------------------------------------------
// Pull

// pullArgs are the fields PULL and PULLB share.
type pullArgs struct {
	queue   string
	timeout int64
	opts    PullOpts
}

func readPull(r *Req) (pullArgs, error) {
	var a pullArgs
	var err error
	if a.queue, err = queueArg(r.m); err != nil {
		return a, err
	}
	t, _, err := numField(r.m, "timeout", "timeout", numRule{min: 0, max: maxPullTimeout})
	if err != nil {
		return a, err
	}
	a.timeout = int64(t)
	if a.opts.Owner, _, err = r.m.Str("owner"); err != nil {
		return a, err
	}
	if err := checkKeyText("owner", a.opts.Owner); err != nil {
		return a, err
	}
	ttl, _, err := numField(r.m, "lockTtl", "lockTtl", leaseRule)
	if err != nil {
		return a, err
	}
	a.opts.TTL = int64(ttl)
	a.opts.Detach = truthy(r.m, "detach")
	a.opts.Conn = r.owner()
	a.opts.Limit = r.c.answerLimit()
	if a.opts.Group, err = readGroupPull(r.m); err != nil {
		return a, err
	}
	return a, nil
}

func cmdPull(r *Req) error {
	a, err := readPull(r)
	if err != nil {
		return err
	}
	return r.pull(a, 1, false)
}

func cmdPullBatch(r *Req) error {
	a, err := readPull(r)
	if err != nil {
		return err
	}
	n, ok, err := numField(r.m, "count", "count", numRule{min: 1, max: maxPullBatch})
	if err != nil {
		return err
	}
	if !ok {
		// The reference answers an absent count with no jobs.
		r.writeJobs(nil, nil, a.opts.Owner != "", true)
		return nil
	}
	return r.pull(a, int(n), true)
}

// pull claims at once, or waits up to the timeout from a goroutine of its
// own so that later commands on the connection are not held up. A long
// poll's wait counts in the pull latency, as the reference counts it: the
// figure is how long a worker waited for a job, so a pull that delivered
// none is not in it. The service time leaves the wait out and counts
// every pull: it is the server's work.
func (r *Req) pull(a pullArgs, n int, batch bool) error {
	start := time.Now()
	withToken := a.opts.Owner != ""
	answered, delivered := false, false
	answer := func(rr *Req) PullAnswer {
		return func(jobs []*Job, tokens []string) {
			answered, delivered = true, len(jobs) > 0
			rr.writeJobs(jobs, tokens, withToken, batch)
		}
	}
	// Jobs are claimed where their answer is built: with the answer
	// budget spent, the pull waits for room before it claims any.
	if err := r.pullRoom(); err != nil {
		return err
	}
	if r.b.drain.on() {
		// Stopping (graceful_stop.go): no more jobs are handed out.
		r.writeJobs(nil, nil, withToken, batch)
		return nil
	}
	// Only a pull that may wait needs to hear the drain begin: one that
	// answers at once makes no context of its own on the PULL path.
	ctx, stop := r.ctx(), func() {}
	if a.timeout > 0 {
		ctx, stop = r.b.drain.pullCtx(ctx)
	}
	wait, err := r.eng.Pull(ctx, a.queue, n, a.opts, a.timeout, answer(r))
	if wait == nil {
		stop()
		r.b.lat.observePull(start, 0, delivered)
		if err != nil {
			return err
		}
		if !answered {
			r.writeJobs(nil, nil, withToken, batch)
		}
		return nil
	}
	err = r.goAsync(func(ar *Req) error {
		defer stop()
		waited, err := wait(answer(ar))
		r.b.lat.observePull(start, waited, delivered)
		if err != nil {
			return err
		}
		if !answered {
			ar.writeJobs(nil, nil, withToken, batch)
		}
		return nil
	})
	if err != errAsync {
		// Refused (too many waiting commands): the poll never waits, and
		// its hook on the graceful stop would stay until the server stops.
		stop()
	}
	return err
}

// writeJobs writes PULL's {job, token} or PULLB's {jobs, tokens}; the
// token fields are there only when the pull had an owner.
func (r *Req) writeJobs(jobs []*Job, tokens []string, withToken, batch bool) {
	if !batch {
		e := r.field("job")
		if len(jobs) == 0 {
			e.Nil()
		} else {
			encodeJob(e, jobs[0], jobPlain, "", nil)
		}
		if withToken {
			e := r.field("token")
			if len(tokens) == 0 {
				e.Nil()
			} else {
				e.Str(tokens[0])
			}
		}
		return
	}
	if len(jobs) > 1 && r.b.hearing() {
		r.b.announce(noticeQueueCount("batch:pulled", jobs[0].Queue, int64(len(jobs))))
	}
	e := r.field("jobs")
	e.ArrayHead(len(jobs))
	for _, j := range jobs {
		encodeJob(e, j, jobPlain, "", nil)
	}
	if withToken {
		strArray(r.field("tokens"), tokens)
	}
}

// ---------------------------------------------------------------------------
// ACK and FAIL

// ---------------------------------------------------------------------------

// readAck reads an ACK's fields.
func readAck(r *Req) (AckItem, error) {
	id, err := idArg(r.m, "id")
	if err != nil {
		return AckItem{}, err
	}
	tok, _, err := r.m.Key("token")
	if err != nil {
		return AckItem{}, err
	}
	res := r.m.Get("result")
	if err := checkResult(res); err != nil {
		return AckItem{}, err
	}
	return AckItem{ID: id, Token: tok, Result: clone(res), HasResult: res != nil, Remove: truthy(r.m, "removeOnComplete")}, nil
}

func cmdAck(r *Req) error {
	it, err := readAck(r)
	if err != nil {
		return err
	}
	return offReader(r, ackHeld([]AckItem{it}), it, ackOne)
}

func ackOne(r *Req, ctx context.Context, it AckItem) error {
	out, err := r.eng.Ack(ctx, it)
	if err != nil {
		return err
	}
	return r.outcome(out)
}

// offReader runs fn, which calls the engine, off the connection's reader
// when the engine waits on storage before it answers (Engine.Waits), as
// the reference runs a connection's commands side by side. A worker pool
// shares a few connections: with its reader held by each ACK in turn
// until its commit, a connection carried one ACK at a time, so the
// workers on it queued behind one another and an ACK round had one ACK
// of each connection (`queued bench steady` in PostgreSQL mode fell
// behind between 1,500 and 2,000 jobs/s with 20 workers on 3
// connections; on 21 connections it kept up at 2,000). It runs at once
// when the engine answers from memory. fn works from a, read beforehand
// (see goAsync), which holds held bytes; fn is a plain function and a
// is copied into a closure only on the way off the reader, so that the
// ACK path of memory mode allocates nothing more.
//
// Bounds: the commands waiting off one connection's reader hold at most
// offReaderMaxBytes between them, and take at most half of its
// maxAsyncPerConn, so that its long polls always have room; past either,
// the command runs on the reader, which stops reading meanwhile, as
// before: the client is slowed down rather than refused. fn's context
// does not end with the connection: a FAIL cut off by the client's close
// would leave its job to be released as if the attempt had not failed,
// with its error and removeOnFail lost.
func offReader[A any](r *Req, held int, a A, fn func(r *Req, ctx context.Context, a A) error) error {
	if !r.eng.Waits() {
		return fn(r, r.ctx(), a)
	}
	ctx := context.WithoutCancel(r.ctx())
	c := r.c
	if c.nAsync.Load() >= maxAsyncPerConn/2 || c.offHeld.Load()+int64(held) > offReaderMaxBytes {
		return fn(r, ctx, a)
	}
	c.offHeld.Add(int64(held))
	args := a
	err := r.goAsync(func(ar *Req) error {
		defer c.offHeld.Add(-int64(held))
		return fn(ar, ctx, args)
	})
	if err != errAsync {
		c.offHeld.Add(-int64(held))
	}
	return err
}

// offReaderMaxBytes bounds what the commands waiting off one
// connection's reader hold (offReader): a worker pool's ACKs hold
// little, and an ACKB of large results waits its turn on the reader.
const offReaderMaxBytes = 1 << 20

// ackHeld is what ACK items hold while they wait: their ids, tokens and
// results.
func ackHeld(items []AckItem) int {
	n := 0
	for _, it := range items {
		n += len(it.ID) + len(it.Token) + len(it.Result)
	}
	return n
}

// outcome writes an applied ACK/FAIL as the plain success and one that
// came too late as {applied:false, reason:"already-finalized"}.
func (r *Req) outcome(o Outcome) error {
	if o == Applied {
		return r.okID()
	}
	e := r.field("data")
	e.MapHead(2)
	e.Str("applied")
	e.Bool(false)
	e.Str("reason")
	e.Str("already-finalized")
	return nil
}

// readAckBatch reads ACKB's parallel lists into items.
func readAckBatch(r *Req) ([]AckItem, error) {
	ids, ok, err := r.m.Keys("ids")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errors.New("ids must be an array")
	}
	tokens, hasTok, err := r.m.Keys("tokens")
	if err != nil {
		return nil, err
	}
	results, hasRes, err := r.m.Array("results")
	if err != nil {
		return nil, err
	}
	removes, hasRem, err := r.m.Array("removeOnCompletes")
	if err != nil {
		return nil, err
	}
	if hasTok && len(tokens) != len(ids) {
		return nil, errors.New("ACKB tokens length must match ids length")
	}
	if hasRes && len(results) != len(ids) {
		return nil, errors.New("ACKB results length must match ids length")
	}
	if hasRem && len(removes) != len(ids) {
		return nil, errors.New("ACKB removeOnCompletes length must match ids length")
	}
	for i := range results {
		if err := checkResult(results[i]); err != nil {
			return nil, errors.New("results[" + strconv.Itoa(i) + "]: " + err.Error())
		}
	}
	items := make([]AckItem, len(ids))
	for i, id := range ids {
		items[i].ID = id
		if hasTok {
			items[i].Token = tokens[i]
		}
		if hasRes && !results[i].IsNil() {
			items[i].Result, items[i].HasResult = clone(results[i]), true
		} else if hasRes && len(results[i]) > 0 && results[i][0] == 0xc0 {
			items[i].Result, items[i].HasResult = rawNil, true
		}
		if hasRem && len(removes[i]) > 0 && removes[i][0] == 0xc3 {
			items[i].Remove = true
		}
	}
	return items, nil
}

func cmdAckBatch(r *Req) error {
	items, err := readAckBatch(r)
	if err != nil {
		return err
	}
	return offReader(r, ackHeld(items), items, ackBatch)
}

func ackBatch(r *Req, ctx context.Context, items []AckItem) error {
	ignored, err := r.eng.AckBatch(ctx, items)
	if err != nil {
		return err
	}
	return r.ackIgnored(items, ignored)
}

// ackIgnored answers ACKB: plain success, or the items that did not apply.
func (r *Req) ackIgnored(items []AckItem, ignored []int) error {
	if len(ignored) == 0 {
		return r.okID()
	}
	// Items that could not be applied (not active any more, lease lost)
	// are reported one by one, so the rest of the batch still counts; the
	// official client reads exactly these two lists.
	e := r.field("data")
	e.MapHead(2)
	e.Str("ignoredIndices")
	e.ArrayHead(len(ignored))
	for _, i := range ignored {
		e.Int(int64(i))
	}
	e.Str("ignoredIds")
	e.ArrayHead(len(ignored))
	for _, i := range ignored {
		e.Str(items[i].ID)
	}
	return nil
}

// readFail reads a FAIL's fields.
func readFail(r *Req) (id, tok string, f failure, err error) {
	if id, err = idArg(r.m, "id"); err != nil {
		return
	}
	if tok, _, err = r.m.Key("token"); err != nil {
		return
	}
	f = failure{unrecoverable: truthy(r.m, "unrecoverable"), removeOnFail: truthy(r.m, "removeOnFail")}
	if raw := r.m.Get("error"); raw != nil {
		if len(raw) > maxErrorBytes+8 {
			// Not decoded at all: whatever it is, its text is too long.
			return id, tok, f, tooBig("a failure's error is", maxErrorBytes)
		}
		if s, err := raw.Str(); err == nil {
			f.err, f.hasErr = s, true
		} else if v, err := Decode(raw); err == nil {
			f.err, f.hasErr = jsString(v), true
		}
		if len(f.err) > maxErrorBytes {
			return id, tok, f, tooBig("a failure's error is", maxErrorBytes)
		}
	}
	// Only string lines, at most 100, before the job's own limit applies.
	if items, _, _ := r.m.Array("stack"); len(items) > 0 {
		var n int64
		for _, it := range items {
			if len(f.stack) == 100 {
				break
			}
			if s, err := it.Str(); err == nil {
				if n += int64(len(s)); n > maxStackBytes {
					return id, tok, f, tooBig("a failure's stack trace is", maxStackBytes)
				}
				f.stack = append(f.stack, s)
			}
		}
	}
	return id, tok, f, nil
}

func cmdFail(r *Req) error {
	id, tok, f, err := readFail(r)
	if err != nil {
		return err
	}
	return offReader(r, len(id)+len(tok)+f.size(), failArgs{id, tok, f}, failOne)
}

// failArgs are a FAIL's fields, as read.
type failArgs struct {
	id, tok string
	f       failure
}

func failOne(r *Req, ctx context.Context, a failArgs) error {
	out, err := r.eng.Fail(ctx, a.id, a.tok, a.f)
	if err != nil {
		return err
	}
	return r.outcome(out)
}

// ---------------------------------------------------------------------------
// Leases: JobHeartbeat, JobHeartbeatB, ExtendLock and ExtendLocks

var (
	errHeartbeat = errors.New("Job not found or not active (or invalid token)")
	errLock      = errors.New("Lock not found or invalid token")
)

// readRenewal reads one id, token and duration.
func readRenewal(r *Req) (renewals, error) {
	id, err := idArg(r.m, "id")
	if err != nil {
		return renewals{}, err
	}
	tok, _, err := r.m.Key("token")
	if err != nil {
		return renewals{}, err
	}
	d, _, err := numField(r.m, "duration", "duration", leaseRule)
	if err != nil {
		return renewals{}, err
	}
	return renewals{ids: []string{id}, tokens: []string{tok}, durations: []int64{int64(d)}}, nil
}

// readRenewals reads ids with the tokens (and durations) at the same
// index; a missing or unreadable one counts as absent, as the reference
// treats it.
func readRenewals(r *Req, withDurations bool) (renewals, error) {
	ids, ok, err := r.m.Keys("ids")
	if err != nil {
		return renewals{}, err
	}
	if !ok {
		return renewals{}, errors.New("ids must be an array")
	}
	rn := renewals{ids: ids, tokens: make([]string, len(ids)), durations: make([]int64, len(ids))}
	tokens, _, err := r.m.Array("tokens")
	if err != nil {
		return renewals{}, err
	}
	for i := range min(len(ids), len(tokens)) {
		t, err := tokens[i].Str()
		if err != nil {
			continue // unreadable counts as absent
		}
		if !storableText(t) {
			return renewals{}, &FieldError{Field: fmt.Sprintf("tokens[%d]", i), Msg: textRule}
		}
		rn.tokens[i] = t
	}
	if withDurations {
		durs, _, err := r.m.Array("durations")
		if err != nil {
			return renewals{}, err
		}
		for i := range min(len(ids), len(durs)) {
			d, err := durs[i].Float()
			if err != nil {
				continue // absent, as the reference reads it
			}
			if err := leaseRule.check("durations["+strconv.Itoa(i)+"]", d); err != nil {
				return renewals{}, err
			}
			rn.durations[i] = int64(d)
		}
	}
	return rn, nil
}

func cmdJobHeartbeat(r *Req) error {
	rn, err := readRenewal(r)
	if err != nil {
		return err
	}
	n, err := r.eng.Heartbeat(r.ctx(), rn)
	if err != nil {
		return err
	}
	if n == 0 {
		return errHeartbeat
	}
	e := r.field("data")
	e.MapHead(1)
	e.Str("ok")
	e.Bool(true)
	return nil
}

func cmdJobHeartbeatBatch(r *Req) error {
	rn, err := readRenewals(r, false)
	if err != nil {
		return err
	}
	n, err := r.eng.Heartbeat(r.ctx(), rn)
	if err != nil {
		return err
	}
	e := r.field("data")
	e.MapHead(2)
	e.Str("ok")
	e.Bool(true)
	e.Str("count")
	e.Int(int64(n))
	return nil
}

func cmdExtendLock(r *Req) error {
	rn, err := readRenewal(r)
	if err != nil {
		return err
	}
	n, err := r.eng.ExtendLocks(r.ctx(), rn)
	if err != nil {
		return err
	}
	if n == 0 {
		return errLock
	}
	return r.okID()
}

func cmdExtendLocks(r *Req) error {
	rn, err := readRenewals(r, true)
	if err != nil {
		return err
	}
	n, err := r.eng.ExtendLocks(r.ctx(), rn)
	if err != nil {
		return err
	}
	r.field("count").Int(int64(n))
	return nil
}
