package main

// The PostgreSQL engine's job lifecycle (JobEngine), as lifecycle.go answers it
// in memory: push (plain pushes go through the group commit of
// pg_pushbuf.go), pull and claim, ACK and FAIL behind the lease fence, and
// lock renewals. Release on disconnect is pg_release.go's.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// ---------------------------------------------------------------------------
// Push

// Push writes plain jobs through the group commit, answered once written
// (Pushed.Wait); jobs that cannot share a transaction (flows, groups,
// dedup policies) are written at once, in one of their own.
func (p *PG) Push(ctx context.Context, queue string, jobs []*Job, batch bool) Pushed {
	for _, j := range jobs {
		if !pgPlain(j) {
			return p.pushNow(ctx, queue, jobs, batch)
		}
	}
	return p.pushAsync(queue, jobs)
}

// pushNow writes jobs in a transaction of their own.
func (p *PG) pushNow(ctx context.Context, queue string, jobs []*Job, batch bool) Pushed {
	defer p.b.lat.push.since(time.Now())
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var byID map[string]*Job
	if batch {
		byID = customIDBatch(jobs)
	}
	ids, made, err := p.pushJobs(ctx, queue, jobs, byID)
	if err != nil {
		return Pushed{Err: pgPushErr(err)}
	}
	return Pushed{IDs: ids, Made: made}
}

// pgPushErr makes a failed push's error ready for the client: a refusal of
// one job (a *jobErr, which the handler names) and the database's faults
// (named so already) as they are, any other refusal unwrapped.
func pgPushErr(err error) error {
	var je *jobErr
	if errors.As(err, &je) {
		return je
	}
	var rf pgRefused
	if errors.As(err, &rf) {
		return rf.error
	}
	return err
}

// ---------------------------------------------------------------------------
// Pull

// Pull claims at once when the pull may not wait. One that may answers a
// PullWait at once: looking costs a round trip to the database, which the
// connection's reader does not wait for.
func (p *PG) Pull(ctx context.Context, queue string, n int, o PullOpts, timeout int64, answer PullAnswer) (PullWait, error) {
	if timeout > 0 {
		return func(answer PullAnswer) (time.Duration, error) {
			jobs, tokens, waited, err := p.pull(ctx, queue, n, o, timeout)
			if err != nil {
				return waited, err
			}
			p.pulled(o, jobs, tokens, answer)
			return waited, nil
		}, nil
	}
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	jobs, tokens, _, err := p.claim(ctx, queue, n, o)
	if err != nil {
		return nil, err
	}
	p.pulled(o, jobs, tokens, answer)
	return nil, nil
}

// pulled records the jobs a pull claimed against its connection, for
// release on disconnect, and hands them to answer.
func (p *PG) pulled(o PullOpts, jobs []*Job, tokens []string, answer PullAnswer) {
	if keep := pullKeeps(jobs, o.Limit); keep < len(jobs) {
		// More than one answer carries (a claim round takes its rows
		// before their sizes are known): the rest go back at once.
		p.unclaim(jobs[keep:], tokens[min(keep, len(tokens)):])
		jobs = jobs[:keep]
		tokens = tokens[:min(keep, len(tokens))]
	}
	p.holdFor(o, jobs, tokens)
	if len(jobs) > 0 {
		answer(jobs, tokens)
	}
}

// pgRecheck bounds a waiting pull's sleep: it looks again even when no
// notification came (the listener may be reconnecting).
const pgRecheck = time.Second

// pull claims, and when nothing is ready waits for a push (any broker's),
// for the next delayed job to come due, or for the timeout. It reports how
// long it slept waiting.
func (p *PG) pull(ctx context.Context, queue string, n int, o PullOpts, timeout int64) (_ []*Job, _ []string, waited time.Duration, _ error) {
	deadline := time.Now().Add(time.Duration(timeout) * time.Millisecond)
	t := time.NewTimer(0)
	<-t.C
	defer t.Stop()
	for first := true; ; first = false {
		w := p.addWaiter(queue, n, o)
		jobs, tokens, next, err := p.pullClaim(ctx, queue, n, o, first)
		if err != nil || len(jobs) > 0 {
			p.dropWaiter(queue, w)
			if err != nil && ctx.Err() != nil {
				return nil, nil, waited, nil
			}
			return jobs, tokens, waited, err
		}
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil || p.closing() {
			p.dropWaiter(queue, w)
			return nil, nil, waited, nil
		}
		sleep := min(left, pgRecheck)
		if next > 0 {
			// Bounded before it becomes nanoseconds: a time far off
			// would pass int64's end there.
			sleep = min(sleep, time.Duration(min(max(next-p.now(), 1), pgRecheck.Milliseconds()))*time.Millisecond)
		}
		t.Reset(sleep)
		slept := time.Now()
		p.wmu.Lock()
		w.sleeping = true
		p.wmu.Unlock()
		woke := false
		select {
		case <-w.ch:
			woke = true
		case <-w.handed:
		case <-t.C:
		case <-ctx.Done():
		case <-p.stop:
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		p.wmu.Lock()
		w.sleeping = false
		handed := w.reserved
		p.wmu.Unlock()
		if handed {
			// A push is handing this pull jobs (pg_handoff.go): they are
			// its once the push's transaction settles, whatever woke it.
			<-w.handed
		}
		waited += time.Since(slept)
		p.dropWaiter(queue, w)
		if handed {
			if woke {
				// The wake-up taken was for another job.
				p.wmu.Lock()
				p.wakeSome(queue, 1)
				p.wmu.Unlock()
			}
			if len(w.jobs) > 0 {
				return w.jobs, w.tokens, waited, nil
			}
		}
	}
}

// pullClaim is one look of a waiting pull. A new pull on a queue a claim
// has just found empty does not claim (pg_wait.go): it answers nothing
// and when the queue's next delayed job comes due. The pull's waiter is in
// place before the mark is read, so the wake-up that ends the mark is not
// missed.
func (p *PG) pullClaim(ctx context.Context, queue string, n int, o PullOpts, first bool) ([]*Job, []string, int64, error) {
	if first && o.Group == nil {
		if empty, next := p.knownEmpty(queue, p.now()); empty {
			return nil, nil, next, nil
		}
	}
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.claim(ctx, queue, n, o)
}

// ---------------------------------------------------------------------------
// ACK and FAIL

// Waits: an ACK or a FAIL is answered once its round has committed.
func (p *PG) Waits() bool { return true }

// Ack completes one job; the job is no longer this broker's to release.
func (p *PG) Ack(ctx context.Context, it AckItem) (Outcome, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	outs, errs, err := p.ack(ctx, []AckItem{it})
	if err != nil {
		return Applied, err
	}
	if errs[0] != nil {
		return Applied, errs[0]
	}
	if outs[0] == Applied {
		p.unhold(it.ID)
	}
	return outs[0], nil
}

// AckBatch completes jobs in one transaction.
func (p *PG) AckBatch(ctx context.Context, items []AckItem) ([]int, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	outs, errs, err := p.ack(ctx, items)
	if err != nil {
		return nil, err
	}
	var ignored []int
	done := make([]string, 0, len(items))
	for i := range items {
		if errs[i] != nil || outs[i] != Applied {
			ignored = append(ignored, i)
		} else {
			done = append(done, items[i].ID)
		}
	}
	p.unhold(done...)
	return ignored, nil
}

// Fail records a failed attempt of one job.
func (p *PG) Fail(ctx context.Context, id, token string, f failure) (Outcome, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	out, err := p.fail(ctx, id, token, f)
	if err != nil {
		return Applied, err
	}
	if out == Applied {
		p.unhold(id)
	}
	return out, nil
}

// finishFacts are what the PostgreSQL engine knows of a locked job (nil:
// not found) for finishFence (rule_failure.go): its last lease's token,
// kept on its row, and no set of retired tokens.
func (l *pgLocked) finishFacts(id, token string) finishFacts {
	f := finishFacts{id: id, token: token, keepsLastToken: true, finishedAgainIsFinalized: true}
	if l != nil {
		f.found, f.state, f.attempts = true, l.j.state, l.j.Attempts
		f.leaseOwned, f.leaseToken, f.lastToken = l.owned, l.token, l.token
	}
	return f
}

// pgAcked is what an ACK's transaction does, and tells of once it has
// committed.
type pgAcked struct {
	now     int64
	outs    []Outcome // by item
	errs    []error   // by item: why it did not apply
	done    []pgDoneEv
	save    []*Job      // completed jobs kept
	results map[int]Raw // save[i]'s result
	remove  []string    // completed jobs removed
	flows   []pgDoneJob // completed jobs flows care about
	fl      *pgFlowTx
}

// pgDoneEv is a completion to tell of: item i's job, completed at at.
type pgDoneEv struct {
	i     int
	j     *Job
	at    int64
	data  Raw
	undef bool
}

// pgAckReq is one ACK or ACKB waiting for its round.
type pgAckReq struct {
	items []AckItem
	outs  []Outcome
	errs  []error
	err   error
	done  chan struct{}
}

const (
	// pgAckLanes is how many ACK rounds may be in flight at once.
	pgAckLanes = 4
	// pgAckMax bounds the items of one round (a request's are never split).
	pgAckMax = 1000
	// pgAckSmall is the backlog, in items, past which a second lane
	// starts, and at which a round stops waiting for company.
	pgAckSmall = 64
	// pgAckGather bounds a round's wait for company (ackGather).
	pgAckGather = 3 * time.Millisecond
)

// ack completes jobs; it answers, by item, the outcome or the reason it
// did not apply. Its errors are the database's, named so.
//
// ACKs are written in rounds, as pushes and claims are: each round is one
// transaction for the ACKs that came meanwhile, in the order they came, so
// that sixteen ACK batches in flight cost a few transactions, not sixteen
// (each with its statements and its commit). The outcome of every item is
// the one it would have had in a transaction of its own run in that
// order: the same job twice is finished by the first. The round runs on
// a context of its own, so that a client gone away does not take the
// others' ACKs with it.
func (p *PG) ack(_ context.Context, items []AckItem) ([]Outcome, []error, error) {
	defer p.b.lat.ack.since(time.Now())
	req := &pgAckReq{items: items, done: make(chan struct{})}
	p.ackMu.Lock()
	start := p.acks.addSmall(req, pgAckLanes, pgAckSmall, ackSize)
	p.ackMu.Unlock()
	if start {
		go p.ackRounds()
	} else {
		select {
		case p.ackArrived <- struct{}{}:
		default:
		}
	}
	<-req.done
	return req.outs, req.errs, req.err
}

// ackRounds writes ACK rounds until none is waiting.
func (p *PG) ackRounds() {
	for answered, last := 0, 0; ; {
		if last < pgAckSmall {
			p.ackGather(answered)
		}
		p.ackMu.Lock()
		round, total, ok := p.acks.next(pgAckMax, ackSize)
		p.ackMu.Unlock()
		if !ok {
			return
		}
		answered, last = len(round), total
		items := make([]AckItem, 0, total)
		for _, r := range round {
			items = append(items, r.items...)
		}
		p.acksRun.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), pgOpTimeout)
		outs, errs, err := p.ackRound(ctx, items)
		cancel()
		for _, r := range round {
			n := len(r.items)
			if outs == nil {
				r.err = err
				close(r.done)
				continue
			}
			ro, re := outs[:n:n], errs[:n:n]
			outs, errs = outs[n:], errs[n:]
			if err != nil && slices.Contains(re, err) {
				// Some of its items were not written: the request fails
				// (those of its items that were are told of all the same).
				r.err = err
			} else {
				r.outs, r.errs = ro, re
			}
			close(r.done)
		}
	}
}

func ackSize(r *pgAckReq) int { return len(r.items) }

// ackGather waits, after a small round (under pgAckSmall items: a bulk
// load's rounds go on at once) that answered answered requests, until as
// many wait as it answered, for pgAckSmall items, or for pgAckGather,
// whichever is first. An ACK costs its round a commit and a statement
// (0.2-0.3 ms of the database's CPU on the machine of docs/performance.md
// whatever they hold): under a steady stream of workers each round then
// carries the ACKs of a few milliseconds, where each ACK had a round of
// its own, while a client sending one ACK at a time, which is back as
// soon as it is answered, hardly waits.
//
// The ACKs that came while the round ran count: since ACKs run off the
// connections' readers (offReader) many do, and waiting for as many
// more again on top of them (as it did) kept each round's ACKs waiting
// up to the whole pgAckGather. queued bench steady, PostgreSQL, in turn
// with that rule, at 3,000 jobs/s six runs each: p99 lower in 4 (125-925
// ms against 201-1,850 in those), the database's CPU a job lower in 5;
// at 2,000/s p99 11-15 ms against 17-19, 0.30 commits a job against
// 0.35. The official client at 1,000/s: the same (p99 14-15 ms).
func (p *PG) ackGather(answered int) {
	if answered == 0 {
		return
	}
	target := answered
	waitForCompany(pgAckGather, p.ackArrived, p.stop, func() bool {
		p.ackMu.Lock()
		defer p.ackMu.Unlock()
		items := 0
		for _, r := range p.acks.pending {
			items += len(r.items)
		}
		return len(p.acks.pending) >= target || items >= pgAckSmall
	})
}

// ackRound completes the items of a round: first those pgAckFastSQL can
// complete in one statement, then the others in one transaction that
// reads their rows and applies the finish rule to each, in order. When
// that transaction fails after the statement committed, the error is the
// others' (errs) as well as the round's.
func (p *PG) ackRound(ctx context.Context, items []AckItem) ([]Outcome, []error, error) {
	now := p.now()
	var fast []*Job // by item: the job the fast statement completed
	err := pgRetry(ctx, func() error {
		var err error
		fast, err = p.ackFast(ctx, items, now)
		return err
	})
	if err != nil {
		return nil, nil, pgErr(fmt.Errorf("ack: %w", err))
	}
	outs, errs := make([]Outcome, len(items)), make([]error, len(items))
	finished := map[string]bool{}
	var rest []int
	var ids []string
	var done []pgDoneEv
	for i, it := range items {
		if j := fast[i]; j != nil {
			finished[it.ID] = true
			done = append(done, pgDoneEv{i: i, j: j, at: now, data: it.Result, undef: !it.HasResult})
		} else {
			rest, ids = append(rest, i), append(ids, it.ID)
		}
	}
	a := &pgAcked{now: now}
	var failed error
	if len(rest) > 0 {
		err = pgRetry(ctx, func() error {
			return p.inTx(ctx, func(tx pgx.Tx) error {
				locked, err := p.lockRows(ctx, tx, ids)
				if err != nil {
					return pgErr(fmt.Errorf("ack: %w", err))
				}
				a = &pgAcked{now: p.now(), outs: outs, errs: errs, results: map[int]Raw{}}
				a.settle(items, rest, maps.Clone(finished), locked)
				return pgErr(p.writeAcked(ctx, tx, a, locked))
			})
		})
		if err != nil {
			if len(done) == 0 {
				return nil, nil, err
			}
			// The fast statement committed on its own: its jobs are
			// completed, and told of below; the others are not.
			failed = err
			a = &pgAcked{now: now}
			fastIDs := make([]string, 0, len(done))
			for _, d := range done {
				fastIDs = append(fastIDs, d.j.ID())
			}
			for _, i := range rest {
				outs[i], errs[i] = Applied, err
			}
			p.unhold(fastIDs...)
		}
	}
	if len(a.done) > 0 {
		// Told of in the order the items came, as one transaction would.
		done = append(done, a.done...)
		slices.SortFunc(done, func(x, y pgDoneEv) int { return x.i - y.i })
	}
	p.b.stats.completed.Add(int64(len(done)))
	for _, d := range done {
		if d.j.StartedAt() > 0 {
			p.b.lat.proc.ObserveMs(d.at - d.j.StartedAt())
		}
		p.emit(d.j.Queue, evCompleted, d.j, d.at, evArgs{data: d.data, undefData: d.undef})
	}
	a.fl.after(p, a.now)
	return outs, errs, failed
}

// pgAckFastSQL completes jobs without reading their rows first: those
// active, plain (pgPlainDone) and waited on by no other job, whose lock,
// if they have one, is the item's. A completion writes the state columns,
// not the record (pgOverlay); as a full write would, it keeps the lease
// token, so that a late FAIL carrying it is known, and releases the
// unique key. It answers the rows it completed: what their completed
// events and the processing time need, not their records (decoding them
// was a fifth of the server's time in a drain).
const pgAckFastSQL = `UPDATE {s}.jobs AS j SET state = {done}, done_at = $2, result = u.res,
		lease_owner = NULL, lease_broker = NULL, lease_expires = NULL, lease_ttl = NULL, timeout_at = NULL,
		unique_key = NULL, unique_expires = NULL
		FROM unnest($1::text[], $3::text[], $4::bytea[]) AS u(id, tok, res)
		WHERE j.id = u.id AND j.state = {active} AND j.plain AND NOT j.waited
			AND (j.lease_owner IS NULL OR j.lease_token = u.tok)
		RETURNING j.id, j.queue, j.started_at`

// ackFast completes what it can of a round's items with pgAckFastSQL, in
// a statement of its own, and answers the jobs it completed by item (each
// with its id, queue and start only: all a completed event tells). It
// tries the first item of each job only, and none that asks for its job
// to be removed: a second ACK of a job, or one after a removal, has the
// outcome the finish rule gives it once the first has applied. The rows
// are given in id order, as lockRows takes them, so that two brokers'
// rounds do not wait on each other: the plan (a nested loop over the
// array) takes them in that order; should another plan not, the deadlock
// PostgreSQL breaks is retried (pgRetry).
func (p *PG) ackFast(ctx context.Context, items []AckItem, now int64) ([]*Job, error) {
	seen := make(map[string]int, len(items))
	var cand []int
	for i, it := range items {
		if _, dup := seen[it.ID]; dup {
			continue
		}
		seen[it.ID] = i
		if !it.Remove {
			cand = append(cand, i)
		}
	}
	fast := make([]*Job, len(items))
	if len(cand) == 0 {
		return fast, nil
	}
	slices.SortFunc(cand, func(x, y int) int { return strings.Compare(items[x].ID, items[y].ID) })
	ids, toks, res := make([]string, len(cand)), make([]string, len(cand)), make([][]byte, len(cand))
	for k, i := range cand {
		ids[k], toks[k] = items[i].ID, items[i].Token
		if items[i].HasResult && items[i].Result != nil {
			res[k] = items[i].Result
		}
	}
	rows, err := p.pool.Query(ctx, p.sql(pgAckFastSQL), ids, now, toks, pgtype.FlatArray[[]byte](res))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var queue string // a round's jobs mostly share their queue: one string for them
	for rows.Next() {
		var id string
		var q []byte
		var started pgtype.Int8
		if err := rows.Scan(&id, &q, &started); err != nil {
			return nil, err
		}
		if queue != string(q) {
			queue = string(q)
		}
		j := withID(&Job{Queue: queue, state: StateCompleted}, id)
		j.setStartedAt(started.Int64)
		j.setDoneAt(now)
		fast[seen[id]] = j
	}
	return fast, rows.Err()
}

// settle applies the finish rule to the items at idx, in order, and
// completes the jobs it lets through, in hand: writeAcked writes them.
// finished holds the jobs this round completed already.
func (a *pgAcked) settle(items []AckItem, idx []int, finished map[string]bool, locked map[string]*pgLocked) {
	for _, i := range idx {
		it := items[i]
		if finished[it.ID] {
			// The same job twice in one batch: the first ACK finished it.
			a.errs[i] = errors.New(errNotProcessing + it.ID)
			continue
		}
		l := locked[it.ID]
		if a.outs[i], a.errs[i] = finishFence(l.finishFacts(it.ID, it.Token), false); a.errs[i] != nil || a.outs[i] != Applied {
			continue
		}
		j := l.j
		finished[j.ID()] = true
		j.state = StateCompleted
		j.setLease(nil)
		j.setDoneAt(a.now)
		if j.c != nil {
			j.c.hasFail = false // not through warm(): see Shard.complete
		}
		a.done = append(a.done, pgDoneEv{i: i, j: j, at: a.now, data: it.Result, undef: !it.HasResult})
		if l.waited || j.cold().ParentID != "" || j.cold().Repeat != nil {
			d := pgDoneJob{j: j, waited: l.waited}
			if it.HasResult {
				d.result = it.Result
			}
			a.flows = append(a.flows, d)
		}
		if j.cold().RemoveOnComplete || it.Remove {
			a.remove = append(a.remove, j.ID())
			continue
		}
		j.addTimeline(TimelineEntry{State: StateCompleted, At: a.now})
		if it.HasResult {
			a.results[len(a.save)] = it.Result
		}
		a.save = append(a.save, j)
	}
}

// writeAcked writes what settle did, with what it means for flows.
func (p *PG) writeAcked(ctx context.Context, tx pgx.Tx, a *pgAcked, locked map[string]*pgLocked) error {
	if len(a.flows) > 0 {
		saving := make(map[string]bool, len(a.save))
		for _, j := range a.save {
			saving[j.ID()] = true
		}
		var err error
		if a.fl, err = p.completed(ctx, tx, a.flows, locked, saving, a.now); err != nil {
			return fmt.Errorf("ack: %w", err)
		}
	}
	if len(a.save) > 0 {
		if err := p.saveJobs(ctx, tx, a.save, a.results); err != nil {
			return err
		}
	}
	if len(a.remove) > 0 {
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.jobs WHERE id = ANY($1)`), a.remove); err != nil {
			return fmt.Errorf("ack: remove completed jobs: %w", err)
		}
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.job_logs WHERE job_id = ANY($1)`), a.remove); err != nil {
			return fmt.Errorf("ack: remove logs: %w", err)
		}
	}
	if a.fl != nil {
		if err := p.repeated(ctx, tx, a.fl, a.flows, a.now); err != nil {
			return fmt.Errorf("ack: %w", err)
		}
	}
	return nil
}

// pgFailed is what a FAIL's transaction did, to tell of once it has
// committed.
type pgFailed struct {
	out Outcome
	j   *Job // nil: nothing changed
	f   failure
	fl  *pgFlowTx
	now int64
}

// fail records a failed attempt: a retry after the backoff, the DLQ, or
// removal.
func (p *PG) fail(ctx context.Context, id, token string, f failure) (Outcome, error) {
	var d pgFailed
	err := pgRetry(ctx, func() error {
		return p.inTx(ctx, func(tx pgx.Tx) error {
			var err error
			d, err = p.failTx(ctx, tx, id, token, f)
			return err
		})
	})
	if err != nil || d.j == nil {
		return d.out, err
	}
	j, f, now := d.j, d.f, d.now
	terminal := j.state != StateDelayed
	if terminal {
		// Failed for good, as memory mode counts it: a retried attempt is
		// not a failed job.
		p.b.stats.failed.Add(1)
	}
	p.emit(j.Queue, evFailed, j, now, evArgs{err: f.err, hasErr: f.hasErr, terminal: terminal, hasTerminal: true})
	if !terminal {
		p.emit(j.Queue, evRetried, j, now, evArgs{prev: "failed"})
	}
	d.fl.after(p, now)
	return Applied, nil
}

// failTx is a FAIL's transaction. A refusal comes back as it is (the
// transaction, which changed nothing, rolls back).
func (p *PG) failTx(ctx context.Context, tx pgx.Tx, id, token string, f failure) (pgFailed, error) {
	locked, err := p.lockRows(ctx, tx, []string{id})
	if err != nil {
		return pgFailed{}, pgErr(fmt.Errorf("fail: %w", err))
	}
	l := locked[id]
	out, err := finishFence(l.finishFacts(id, token), true)
	if err != nil || out != Applied {
		return pgFailed{out: out}, err
	}
	j := l.j
	if err := f.check(j); err != nil {
		return pgFailed{}, err
	}
	now := p.now()
	set, err := p.settings(ctx, tx, []string{j.Queue})
	if err != nil {
		return pgFailed{}, pgErr(fmt.Errorf("fail: %w", err))
	}
	dlq := set[j.Queue].dlqConfig()
	if pgFailJob(j, f, dlq, now) {
		err = p.saveJobs(ctx, tx, []*Job{j}, nil)
		if err == nil && j.state == StateFailed {
			err = p.trimDLQ(ctx, tx, j.Queue, dlq)
		}
	} else {
		_, err = tx.Exec(ctx, p.sql(`DELETE FROM {s}.jobs WHERE id = $1`), id)
	}
	if err == nil && j.state == StateDelayed {
		err = p.notify(ctx, tx, j.Queue)
	}
	fl := &pgFlowTx{}
	if err == nil && j.state != StateDelayed && j.cold().ParentID != "" {
		err = p.childFailed(ctx, tx, fl, j, f.err, now)
	}
	if err != nil {
		return pgFailed{}, pgErr(fmt.Errorf("fail: %w", err))
	}
	return pgFailed{out: Applied, j: j, f: f, fl: fl, now: now}, nil
}

// ---------------------------------------------------------------------------
// Leases

// Heartbeat renews the leases of active jobs (see heartbeat).
func (p *PG) Heartbeat(ctx context.Context, rn renewals) (int, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.heartbeat(ctx, rn, false)
}

// ExtendLocks renews the locks of active jobs that have one.
func (p *PG) ExtendLocks(ctx context.Context, rn renewals) (int, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.heartbeat(ctx, rn, true)
}

// heartbeat renews an active job's lease. With a token it must match, and
// the lease runs for duration (or its own TTL) from now; without one, a
// job pulled without an owner is marked alive for another stall interval.
// lockOnly renews only jobs that have a lock.
func (p *PG) heartbeat(ctx context.Context, rn renewals, lockOnly bool) (int, error) {
	now := p.now()
	rn, extra, fresh := p.renewFresh(rn, now)
	if len(rn.ids) == 0 {
		return len(fresh), nil
	}
	// Without a lock, lease_ttl is the stall limit (NULL: stalls are not
	// watched) and the deadline never comes before the grace period's end.
	tag, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.jobs AS j SET lease_expires = CASE
			WHEN j.lease_owner IS NULL THEN CASE WHEN j.lease_ttl IS NULL THEN j.lease_expires
				ELSE LEAST(GREATEST($4::bigint + j.lease_ttl, j.lease_expires), COALESCE(j.timeout_at, $4::bigint + j.lease_ttl)) END
			WHEN u.tok = '' AND NOT $5::boolean THEN j.lease_expires
			ELSE LEAST($4::bigint + CASE WHEN u.dur > 0 THEN u.dur ELSE j.lease_ttl END,
				COALESCE(j.timeout_at, $4::bigint + CASE WHEN u.dur > 0 THEN u.dur ELSE j.lease_ttl END)) END,
			lease_renewals = j.lease_renewals + CASE WHEN j.lease_owner IS NOT NULL AND u.tok <> '' THEN 1 + u.extra ELSE 0 END
		FROM unnest($1::text[], $2::text[], $3::bigint[], $6::int[]) AS u(id, tok, dur, extra)
		WHERE j.id = u.id AND j.state = {active} AND (u.tok = '' OR j.lease_token = u.tok)
			AND (NOT $5::boolean OR j.lease_owner IS NOT NULL)`),
		rn.ids, rn.tokens, rn.durations, now, lockOnly, extra)
	if err != nil {
		p.renewFailed(rn, extra, fresh)
		return 0, pgErr(fmt.Errorf("heartbeat: %w", err))
	}
	return len(fresh) + int(tag.RowsAffected()), nil
}
