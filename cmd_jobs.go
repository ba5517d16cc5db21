package main

// Handlers of the job lifecycle: push, pull, ack, fail, and leases.

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"time"
)

func cmdPush(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	j, err := parseJob(r.m, queue, "jobId", r.b.now())
	if err != nil {
		return err
	}
	if err := r.b.depsExist(j, nil); err != nil {
		return err
	}
	if err := validateRepeat(j); err != nil {
		return err
	}
	pid, pq, linked := parentLink(j)
	if linked {
		if err := r.b.checkLinkable(pid, pq, j.ID); err != nil {
			return err
		}
	}
	if err := r.b.admit(); err != nil {
		return err
	}
	res := r.b.Push(queue, []*Job{j})
	if res[0].Err != nil {
		return res[0].Err
	}
	if linked && !res[0].Dup {
		r.b.linkChild(pid, j, queue)
	}
	if err := r.b.syncDurable([]*Job{j}); err != nil {
		return err
	}
	r.field("id").Str(res[0].ID)
	return nil
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
	now := r.b.now()
	jobs := make([]*Job, len(items))
	durable := false
	for i, it := range items {
		m, err := ParseMap(it, nil)
		if err != nil {
			return errors.New("jobs[" + strconv.Itoa(i) + "]: job must be an object")
		}
		if jobs[i], err = parseJob(m, queue, "customId", now); err != nil {
			return errors.New("jobs[" + strconv.Itoa(i) + "]: " + err.Error())
		}
		durable = durable || jobs[i].Durable
	}
	batch := customIDBatch(jobs)
	links := make([][2]string, len(jobs))
	for i, j := range jobs {
		if err := r.b.depsExist(j, batch); err != nil {
			return errors.New("jobs[" + strconv.Itoa(i) + "]: " + err.Error())
		}
		if err := validateRepeat(j); err != nil {
			return errors.New("jobs[" + strconv.Itoa(i) + "]: " + err.Error())
		}
		if pid, pq, ok := parentLink(j); ok {
			if err := r.b.checkLinkable(pid, pq, j.ID); err != nil {
				return errors.New("jobs[" + strconv.Itoa(i) + "]: " + err.Error())
			}
			links[i] = [2]string{pid, pq}
		}
	}
	if err := r.b.admit(); err != nil {
		return err
	}
	res := r.b.PushWith(queue, jobs, batch)
	for i, p := range res {
		if links[i][0] != "" && p.Err == nil && !p.Dup {
			r.b.linkChild(links[i][0], jobs[i], queue)
		}
	}
	if len(res) > 0 && res[len(res)-1].Err != nil {
		return res[len(res)-1].Err
	}
	if durable {
		if err := r.b.syncDurable(jobs); err != nil {
			return err
		}
	}
	e := r.field("ids")
	e.ArrayHead(len(res))
	for _, p := range res {
		e.Str(p.ID)
	}
	return nil
}

// customIDBatch names the jobs of a batch with custom ids, which others of
// the batch may depend on.
func customIDBatch(jobs []*Job) map[string]*Job {
	var batch map[string]*Job
	for _, j := range jobs {
		if j.CustomID != "" {
			if batch == nil {
				batch = map[string]*Job{}
			}
			batch[j.CustomID] = j
		}
	}
	return batch
}

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
	ttl, _, err := r.m.Num("lockTtl")
	if err != nil {
		return a, err
	}
	a.opts.TTL = int64(ttl)
	a.opts.Detach = truthy(r.m, "detach")
	a.opts.Conn = r.owner()
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
		return r.writeJobs(nil, nil, a.opts.Owner != "", true, 0)
	}
	return r.pull(a, int(n), true)
}

// pull claims at once, or waits up to the timeout from a goroutine of its
// own so that later commands on the connection are not held up.
func (r *Req) pull(a pullArgs, n int, batch bool) error {
	// A long poll's wait counts in the pull latency, as the reference
	// counts it: the figure is how long a worker waited for its answer.
	// The service time leaves the wait out: it is the server's work.
	start := time.Now()
	r.b.throttle()
	withToken := a.opts.Owner != ""
	answered := false
	var werr error
	write := func(rr *Req) func(jobs []*Job, tokens []string, now int64) {
		return func(jobs []*Job, tokens []string, now int64) {
			answered = true
			werr = rr.writeJobs(jobs, tokens, withToken, batch, now)
		}
	}
	waited := r.b.pull(context.Background(), a.queue, n, a.opts, 0, false, write(r))
	if answered || a.timeout <= 0 {
		r.b.lat.observePull(start, waited)
		if !answered {
			return r.writeJobs(nil, nil, withToken, batch, 0)
		}
		return werr
	}
	ctx := r.c.ctx
	return r.goAsync(func(ar *Req) error {
		answered = false
		waited := r.b.pull(ctx, a.queue, n, a.opts, a.timeout, true, write(ar))
		r.b.lat.observePull(start, waited)
		if !answered {
			return ar.writeJobs(nil, nil, withToken, batch, 0)
		}
		return werr
	})
}

// writeJobs writes PULL's {job, token} or PULLB's {jobs, tokens}; the
// token fields are there only when the pull had an owner.
func (r *Req) writeJobs(jobs []*Job, tokens []string, withToken, batch bool, now int64) error {
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
		return nil
	}
	e := r.field("jobs")
	e.ArrayHead(len(jobs))
	for _, j := range jobs {
		encodeJob(e, j, jobPlain, "", nil)
	}
	if withToken {
		strArray(r.field("tokens"), tokens)
	}
	return nil
}

// pull claims up to n jobs from queue, waiting up to timeout ms for some
// when wait is set. emit runs under the shard lock with what was claimed
// (jobs are encoded there, while nothing else can change them); it is not
// called when nothing was claimed. It reports how long it slept waiting
// for a job, which is not the server's work.
func (b *Broker) pull(ctx context.Context, queue string, n int, o PullOpts, timeout int64, wait bool,
	emit func(jobs []*Job, tokens []string, now int64)) (waited time.Duration) {
	s := b.shardOf(queue)
	var deadline time.Time
	if wait {
		deadline = time.Now().Add(time.Duration(timeout) * time.Millisecond)
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if o.Conn != nil && o.Conn.closed.Load() {
			return
		}
		var w *waiter
		done := false
		retryIn := time.Duration(math.MaxInt64)
		s.with(func() {
			now := b.now()
			q := s.queues[queue]
			if q == nil {
				var err error
				if !wait {
					done = true
					return
				}
				if q, err = s.queueFor(queue); err != nil {
					// No room for another queue to wait on: answered empty.
					done = true
					return
				}
			}
			jobs, tokens := s.claim(q, n, o, now, nil, nil)
			if len(jobs) > 0 {
				emit(jobs, tokens, now)
				done = true
				return
			}
			if !wait || time.Until(deadline) <= 0 || s.closed {
				done = true
				return
			}
			if q.nReady > 0 {
				// Held back by a limit, not an empty queue: look again when
				// a token is due or a group's window opens.
				if w := min(q.limitWait(now), q.groupWait(now)); w < math.MaxInt64/int64(time.Millisecond) {
					retryIn = time.Duration(w) * time.Millisecond
				}
			}
			w = &waiter{ch: make(chan struct{}, 1)}
			q.waiters = append(q.waiters, w)
		})
		if done {
			return
		}
		left := min(time.Until(deadline), retryIn)
		if timer == nil {
			timer = time.NewTimer(left)
		} else {
			timer.Reset(left)
		}
		woken := false
		slept := time.Now()
		select {
		case <-w.ch:
			woken = true
		case <-timer.C:
		case <-ctx.Done():
		}
		waited += time.Since(slept)
		s.with(func() {
			if q := s.queues[queue]; q != nil {
				q.dropWaiter(w)
				// A wake-up meant for a job must not be lost: if this poll
				// got one but is leaving without claiming, pass it on.
				if !woken {
					select {
					case <-w.ch:
						woken = true
					default:
					}
				}
				if woken && ctx.Err() != nil {
					q.wake(1)
				}
			}
		})
		if ctx.Err() != nil {
			return
		}
	}
}

// ---------------------------------------------------------------------------

// readAck reads an ACK's fields.
func readAck(r *Req) (AckItem, error) {
	id, err := idArg(r.m, "id")
	if err != nil {
		return AckItem{}, err
	}
	tok, _, err := r.m.Str("token")
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
	r.b.throttle()
	out, err := r.b.Ack(it)
	if err != nil {
		return err
	}
	return r.outcome(out)
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
	ids, ok, err := r.m.Strs("ids")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errors.New("ids must be an array")
	}
	tokens, hasTok, err := r.m.Strs("tokens")
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
	r.b.throttle()
	return r.ackIgnored(items, r.b.AckBatch(items))
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

// AckBatch completes many jobs, locking each shard once. It returns the
// indexes of the items that did not apply.
func (b *Broker) AckBatch(items []AckItem) []int {
	defer b.lat.ack.since(time.Now())
	var ignored []int
	byShard := make([][]int, len(b.shards))
	for i := range items {
		j := b.idxGet(items[i].ID)
		if j == nil {
			ignored = append(ignored, i)
			continue
		}
		k := fnv1a(j.Queue) & b.mask
		byShard[k] = append(byShard[k], i)
	}
	for k, list := range byShard {
		if len(list) == 0 {
			continue
		}
		s := b.shards[k]
		s.with(func() {
			now := b.now()
			for _, i := range list {
				j := b.idxGet(items[i].ID)
				if j == nil || b.shardOf(j.Queue) != s {
					// Replaced in between; take the slow path below.
					ignored = append(ignored, -1-i)
					continue
				}
				if out, err := s.ack(j, items[i], now); err != nil || out != Applied {
					ignored = append(ignored, i)
				}
			}
		})
	}
	// Items whose job moved shard while we looked are retried one by one.
	final := ignored[:0]
	for _, i := range ignored {
		if i < 0 {
			i = -1 - i
			if out, err := b.Ack(items[i]); err == nil && out == Applied {
				continue
			}
		}
		final = append(final, i)
	}
	slices.Sort(final)
	return final
}

// readFail reads a FAIL's fields.
func readFail(r *Req) (id, tok string, f failure, err error) {
	if id, err = idArg(r.m, "id"); err != nil {
		return
	}
	if tok, _, err = r.m.Str("token"); err != nil {
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
	r.b.throttle()
	out, err := r.b.Fail(id, tok, f)
	if err != nil {
		return err
	}
	return r.outcome(out)
}

// ---------------------------------------------------------------------------
// Leases

var (
	errHeartbeat = errors.New("Job not found or not active (or invalid token)")
	errLock      = errors.New("Lock not found or invalid token")
)

// renew extends a job's lock; s.mu is held. ttl 0 keeps the lock's own.
func (s *Shard) renew(j *Job, token string, ttl, now int64) bool {
	l := j.lease
	if l == nil || (token != "" && token != l.Token) || j.state != StateActive {
		return false
	}
	if ttl <= 0 {
		ttl = l.TTL
	}
	l.ExpiresAt = now + ttl
	l.Renewals++
	j.Heartbeat = now
	s.rewatch(j, now)
	return true
}

// rewatch brings a job's timer entry forward when its deadline moved
// earlier; a later deadline is found lazily when the old entry comes due.
func (s *Shard) rewatch(j *Job, now int64) {
	q := s.queues[j.Queue]
	if d := s.deadline(q, j); d < j.deadline {
		s.watch(q, j, now)
	}
}

func (b *Broker) heartbeat(id, token string, duration int64) bool {
	j, s := b.lockJob(id)
	if j == nil {
		return false
	}
	defer s.mu.Unlock()
	now := b.now()
	if j.state != StateActive {
		return false
	}
	if token != "" {
		return s.renew(j, token, duration, now)
	}
	j.Heartbeat = now
	return true
}

// extendLock renews a lock; without a token, whatever lock the job has.
func (b *Broker) extendLock(id, token string, duration int64) bool {
	j, s := b.lockJob(id)
	if j == nil {
		return false
	}
	defer s.mu.Unlock()
	if j.lease == nil {
		return false
	}
	if token == "" {
		token = j.lease.Token
	}
	return s.renew(j, token, duration, b.now())
}

// Lock renewals: JobHeartbeat, JobHeartbeatB, ExtendLock and ExtendLocks
// are parsed and answered once; renewFn is what an engine does.

// renewals are the locks one request names, index by index.
type renewals struct {
	ids, tokens []string
	durations   []int64
}

// renewFn renews what rn names and reports how many it renewed.
// lockOnly is ExtendLock's rule (the job must hold a lock); otherwise a
// heartbeat without a token marks an active job alive.
type renewFn func(r *Req, rn renewals, lockOnly bool) (int, error)

func memRenew(r *Req, rn renewals, lockOnly bool) (int, error) {
	n := 0
	for i, id := range rn.ids {
		var ok bool
		if lockOnly {
			ok = r.b.extendLock(id, rn.tokens[i], rn.durations[i])
		} else {
			ok = r.b.heartbeat(id, rn.tokens[i], rn.durations[i])
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// readRenewal reads one id, token and duration.
func readRenewal(r *Req) (renewals, error) {
	id, err := idArg(r.m, "id")
	if err != nil {
		return renewals{}, err
	}
	tok, _, err := r.m.Str("token")
	if err != nil {
		return renewals{}, err
	}
	d, _, err := r.m.Num("duration")
	if err != nil {
		return renewals{}, err
	}
	return renewals{ids: []string{id}, tokens: []string{tok}, durations: []int64{int64(d)}}, nil
}

// readRenewals reads ids with the tokens (and durations) at the same
// index; a missing or unreadable one counts as absent, as the reference
// treats it.
func readRenewals(r *Req, withDurations bool) (renewals, error) {
	ids, ok, err := r.m.Strs("ids")
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
		rn.tokens[i], _ = tokens[i].Str()
	}
	if withDurations {
		durs, _, err := r.m.Array("durations")
		if err != nil {
			return renewals{}, err
		}
		for i := range min(len(ids), len(durs)) {
			d, _ := durs[i].Float()
			rn.durations[i] = int64(d)
		}
	}
	return rn, nil
}

func jobHeartbeatCmd(renew renewFn) Handler {
	return func(r *Req) error {
		rn, err := readRenewal(r)
		if err != nil {
			return err
		}
		n, err := renew(r, rn, false)
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
}

func jobHeartbeatBatchCmd(renew renewFn) Handler {
	return func(r *Req) error {
		rn, err := readRenewals(r, false)
		if err != nil {
			return err
		}
		n, err := renew(r, rn, false)
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
}

func extendLockCmd(renew renewFn) Handler {
	return func(r *Req) error {
		rn, err := readRenewal(r)
		if err != nil {
			return err
		}
		n, err := renew(r, rn, true)
		if err != nil {
			return err
		}
		if n == 0 {
			return errLock
		}
		return r.okID()
	}
}

func extendLocksCmd(renew renewFn) Handler {
	return func(r *Req) error {
		rn, err := readRenewals(r, true)
		if err != nil {
			return err
		}
		n, err := renew(r, rn, true)
		if err != nil {
			return err
		}
		r.field("count").Int(int64(n))
		return nil
	}
}
