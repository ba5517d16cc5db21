package main

// The command table of PostgreSQL mode. Job commands read and write the
// shared database (postgres.go); what belongs to one broker and its
// connections (sessions, workers, event subscriptions, webhooks, this
// broker's counters) stays local. A command whose subsystem does not yet
// work across brokers answers that plainly rather than acting on state
// the other brokers cannot see.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgHandlers replace the memory handlers of the same name.
var pgHandlers = map[string]Handler{
	"PUSH":          pgPush,
	"PUSHB":         pgPushBatch,
	"PULL":          pgPull,
	"PULLB":         pgPullBatch,
	"ACK":           pgAck,
	"ACKB":          pgAckBatch,
	"FAIL":          pgFail,
	"JobHeartbeat":  jobHeartbeatCmd(pgRenew),
	"JobHeartbeatB": jobHeartbeatBatchCmd(pgRenew),
	"ExtendLock":    extendLockCmd(pgRenew),
	"ExtendLocks":   extendLocksCmd(pgRenew),
}

// pgCommands builds the PostgreSQL mode command table: the command
// table, with the handlers not yet moved onto the engine seam (engine.go)
// replaced by their PostgreSQL twins.
func pgCommands() map[string]Handler {
	t := make(map[string]Handler, len(commands))
	for name, h := range commands {
		t[name] = h
	}
	for name, h := range pgHandlers {
		t[name] = h
	}
	return t
}

// pgCtx bounds one command's database work.
func pgCtx(r *Req) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.c.ctx, 30*time.Second)
}

// ---------------------------------------------------------------------------
// Push

func pgPush(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	j, err := parseJob(r.m, queue, "jobId", p.now())
	if err != nil {
		return err
	}
	return p.pushAsync(r, queue, []*Job{j}, false, func(r *Req, ids []string) { r.field("id").Str(ids[0]) })
}

func pgPushBatch(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	items, ok, err := r.m.Array("jobs")
	if err != nil || !ok {
		return errors.New("jobs must be an array")
	}
	p := r.c.srv.pg
	now := p.now()
	jobs := make([]*Job, len(items))
	for i, it := range items {
		m, err := ParseMap(it, nil)
		if err != nil {
			return errors.New("jobs[" + strconv.Itoa(i) + "]: job must be an object")
		}
		if jobs[i], err = parseJob(m, queue, "customId", now); err != nil {
			return errors.New("jobs[" + strconv.Itoa(i) + "]: " + err.Error())
		}
	}
	return p.pushAsync(r, queue, jobs, true, func(r *Req, ids []string) { strArray(r.field("ids"), ids) })
}

// pgPushErr answers a failed push: a refusal as it is, a job's own fault
// naming the job in a batch, anything else as it comes (the database's,
// named so).
func pgPushErr(err error, batch bool) error {
	var je *jobErr
	if errors.As(err, &je) {
		if batch {
			return errors.New("jobs[" + strconv.Itoa(je.i) + "]: " + je.err.Error())
		}
		return je.err
	}
	var rf pgRefused
	if errors.As(err, &rf) {
		return rf.error
	}
	return err // already named as the database's
}

// inserted tells of what a committed insertJobs did.
func (p *PG) inserted(queue string, res pgInserted) {
	p.pushed(queue, res.made)
	now := p.now()
	for _, id := range res.dups {
		p.emit(queue, evDuplicated, &Job{ID: id, Queue: queue}, now, evArgs{})
	}
}

// pushed counts and tells of jobs inserted by a committed transaction.
func (p *PG) pushed(queue string, made []*Job) {
	p.b.stats.pushed.Add(int64(len(made)))
	now := p.now()
	for _, j := range made {
		p.emit(queue, evPushed, j, now, evArgs{})
	}
}

// insertTx is insert within the caller's transaction; it answers the ids
// and the jobs it made (to be told of once the transaction commits). A
// refused job is an error here (a pgRefused): the caller rolls back.
func (p *PG) insertTx(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job) ([]string, []*Job, error) {
	res, err := p.insertJobs(ctx, tx, queue, jobs)
	if err == nil && res.refused != nil {
		err = pgRefused{res.refused}
	}
	if err != nil {
		return nil, nil, err
	}
	return res.ids, res.made, nil
}

// pgAdmit gives a job being pushed its first state.
func pgAdmit(j *Job, now int64) {
	switch {
	case j.pending > 0:
		j.state = StateWaitingChildren // waits for dependencies (pg_flows.go)
	case j.RunAt > now:
		j.state = StateDelayed
	default:
		j.state = j.readyState()
	}
	j.Timeline = append(j.Timeline, TimelineEntry{State: j.state.String(), At: now})
}

const (
	pgInsertSQL = `INSERT INTO {s}.jobs (id, queue, state, priority, sort_key, run_at, created_at, unique_key, unique_expires, group_id, record)
		SELECT u.id, $1, u.state, u.prio, u.key, u.run_at, u.created, u.uk, u.uexp, NULLIF(u.grp, ''), u.rec
		FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::text[], $8::bytea[], $9::bigint[], $10::text[], $11::smallint[])
			WITH ORDINALITY AS u(id, prio, key, run_at, created, uk, rec, uexp, grp, state, ord)
		ORDER BY u.ord
		ON CONFLICT DO NOTHING RETURNING id`
)

// pgInsertBareSQL is pgInsertSQL for a queue pgRegisterBareSQL may have
// refused: nothing is inserted when the queue has no row.
var pgInsertBareSQL = strings.Replace(pgInsertSQL, "ORDER BY u.ord",
	"WHERE EXISTS (SELECT 1 FROM {s}.queues WHERE name = $1) ORDER BY u.ord", 1)

// pgRows are new job rows, column by column, for pgInsertSQL.
type pgRows struct {
	ids, groups                  []string
	prios, keys, runAts, created []int64
	states                       []int16
	uks                          []*string
	uexps                        []*int64
	recs                         [][]byte
}

func (r *pgRows) add(j *Job, uexp *int64) {
	r.ids, r.prios, r.keys = append(r.ids, j.ID), append(r.prios, j.Priority), append(r.keys, sortKey(j))
	r.runAts, r.created, r.states = append(r.runAts, j.RunAt), append(r.created, j.CreatedAt), append(r.states, pgState(j.state))
	var uk *string
	if j.UniqueKey != "" {
		uk = ptr(j.UniqueKey)
	}
	r.uks, r.uexps, r.groups = append(r.uks, uk), append(r.uexps, uexp), append(r.groups, j.GroupID)
	var e Enc
	encodeRecord(&e, j)
	r.recs = append(r.recs, e.B)
}

func (r *pgRows) args(queue string) []any {
	return []any{queue, r.ids, r.prios, r.keys, r.runAts, r.created, r.uks, r.recs, r.uexps, r.groups, r.states}
}

// pgInserted is what insertJobs did.
type pgInserted struct {
	ids     []string // by job: its id, or the one answered for it
	made    []*Job   // created, to be told of once committed
	dups    []string // holders of unique keys to tell of as duplicated
	refused error    // the job after the last of ids was refused
}

// insertJobs is insertTx with the refusal and the duplicates told apart.
func (p *PG) insertJobs(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job) (pgInserted, error) {
	var res pgInserted
	now := p.now()
	grouped := false
	for _, j := range jobs {
		pgAdmit(j, now)
		grouped = grouped || j.GroupID != ""
	}
	// A queue's first grouped job turns its claims to the grouped path.
	// A new queue past --max-queues is refused whole (a pgRefused).
	if err := p.registerQueue(ctx, tx, queue, grouped); err != nil {
		return res, err
	}
	if err := p.groupsTx(ctx, tx, queue, jobs); err != nil {
		var rf pgRefused
		if errors.As(err, &rf) {
			res.refused = rf.error
			return res, nil
		}
		return res, err
	}
	var custom []string
	for _, j := range jobs {
		if j.CustomID != "" {
			custom = append(custom, j.CustomID)
		}
	}
	if len(custom) > 0 {
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.jobs WHERE id = ANY($1) AND state IN (5, 6)`), custom); err != nil {
			return res, fmt.Errorf("free custom ids: %w", err)
		}
	}
	plan, err := p.dedupTx(ctx, tx, queue, jobs, now)
	if err != nil {
		return res, err
	}
	jobs = jobs[:plan.upto]
	res.dups, res.refused = plan.events, plan.refused
	var rows pgRows
	ready := false
	for i, j := range jobs {
		if _, dup := plan.dup[i]; dup || plan.dropped[i] {
			continue
		}
		ready = ready || j.state == StateWaiting || j.state == StatePrioritized
		rows.add(j, plan.expires[i])
	}
	ins, err := tx.Query(ctx, p.sql(pgInsertSQL), rows.args(queue)...)
	if err != nil {
		return res, fmt.Errorf("insert jobs: %w", err)
	}
	made := make(map[string]bool, len(rows.ids))
	for ins.Next() {
		var id string
		if err := ins.Scan(&id); err != nil {
			ins.Close()
			return res, err
		}
		made[id] = true
	}
	ins.Close()
	if err := ins.Err(); err != nil {
		return res, fmt.Errorf("insert jobs: %w", err)
	}
	res.ids = make([]string, len(jobs))
	for i, j := range jobs {
		res.ids[i] = j.ID
		if id, dup := plan.dup[i]; dup {
			res.ids[i] = id
			continue
		}
		if made[j.ID] && !plan.dropped[i] {
			res.made = append(res.made, j)
			made[j.ID] = false // a second job of the batch with this id is a duplicate
			continue
		}
		if j.UniqueKey != "" && j.CustomID == "" && !plan.dropped[i] {
			// Held by a live job with the key: answer its id.
			err := tx.QueryRow(ctx, p.sql(`SELECT id FROM {s}.jobs WHERE queue = $1 AND unique_key = $2 AND state IN (1, 4, 7)`),
				queue, j.UniqueKey).Scan(&res.ids[i])
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return res, fmt.Errorf("find the holder of unique key %q: %w", j.UniqueKey, err)
			}
		}
	}
	if ready && len(res.made) > 0 {
		if err := p.notify(ctx, tx, queue); err != nil {
			return res, err
		}
	}
	return res, nil
}

// emit tells this broker's subscribers and taps of an event, and the
// other brokers' through the event channel (pg_events.go).
func (p *PG) emit(queue string, t evType, j *Job, now int64, a evArgs) {
	p.emitLocal(queue, t, j, now, a)
	p.forward(queue, t, j, now, a)
}

func (p *PG) emitLocal(queue string, t evType, j *Job, now int64, a evArgs) {
	s := p.b.shardOf(queue)
	s.with(func() { s.emit(&Queue{name: queue}, t, j, now, a) })
}

// ---------------------------------------------------------------------------
// Pull

func pgPull(r *Req) error {
	a, err := readPull(r)
	if err != nil {
		return err
	}
	return pgPullN(r, a, 1, false)
}

func pgPullBatch(r *Req) error {
	a, err := readPull(r)
	if err != nil {
		return err
	}
	n, ok, err := numField(r.m, "count", "count", numRule{min: 1, max: maxPullBatch})
	if err != nil {
		return err
	}
	if !ok {
		return r.writeJobs(nil, nil, a.opts.Owner != "", true, 0)
	}
	return pgPullN(r, a, int(n), true)
}

// pgPullN records the same latencies as memory mode's pull: the whole
// time, and the time less the long poll's sleep waiting for a job.
func pgPullN(r *Req, a pullArgs, n int, batch bool) error {
	p := r.c.srv.pg
	withToken := a.opts.Owner != ""
	start := time.Now()
	if a.timeout <= 0 {
		ctx, cancel := pgCtx(r)
		defer cancel()
		jobs, tokens, _, err := p.claim(ctx, a.queue, n, a.opts)
		p.b.lat.observePull(start, 0)
		if err != nil {
			return pgErr(err)
		}
		p.holdFor(a.opts, jobs, tokens)
		return r.writeJobs(jobs, tokens, withToken, batch, 0)
	}
	ctx := r.c.ctx
	return r.goAsync(func(ar *Req) error {
		jobs, tokens, waited, err := p.pull(ctx, a.queue, n, a.opts, a.timeout)
		p.b.lat.observePull(start, waited)
		if err != nil {
			return pgErr(err)
		}
		p.holdFor(a.opts, jobs, tokens)
		return ar.writeJobs(jobs, tokens, withToken, batch, 0)
	})
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
	for {
		w := p.addWaiter(queue)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		jobs, tokens, next, err := p.claim(cctx, queue, n, o)
		cancel()
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
			sleep = min(sleep, time.Duration(max(next-p.now(), 1))*time.Millisecond)
		}
		t.Reset(sleep)
		slept := time.Now()
		select {
		case <-w.ch:
			if !t.Stop() {
				<-t.C
			}
		case <-t.C:
		case <-ctx.Done():
		case <-p.stop:
		}
		waited += time.Since(slept)
		p.dropWaiter(queue, w)
	}
}

func (p *PG) closing() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

// claim takes up to n ready jobs of a queue, skipping rows other brokers
// are claiming. With nothing to claim it answers when the next delayed job
// comes due (0: none).
func (p *PG) claim(ctx context.Context, queue string, n int, o PullOpts) ([]*Job, []string, int64, error) {
	if err := p.clockReady(ctx); err != nil {
		return nil, nil, 0, err
	}
	now := p.now()
	tx, err := p.begin(ctx)
	if err != nil {
		return nil, nil, 0, err
	}
	defer tx.Rollback(context.Background())
	lim, err := p.readLimits(ctx, tx, queue, false)
	if err != nil {
		return nil, nil, 0, err
	}
	if lim.limited() {
		// Limited: take the queue row, so that the brokers' claims count
		// against the limits one after another.
		if lim, err = p.readLimits(ctx, tx, queue, true); err != nil {
			return nil, nil, 0, err
		}
	}
	if lim.paused {
		return nil, nil, 0, tx.Commit(ctx)
	}
	var rate *bucket
	if lim.limited() {
		var wait int64
		if n, wait, rate, err = p.allowance(ctx, tx, queue, lim, n, now); err != nil {
			return nil, nil, 0, err
		}
		if n == 0 {
			return nil, nil, wait, tx.Commit(ctx)
		}
	}
	var jobs []*Job
	var wait int64
	if lim.grouped {
		jobs, wait, err = p.claimGrouped(ctx, tx, queue, n, o.Group, now)
	} else {
		jobs, err = p.claimUngrouped(ctx, tx, queue, n, now)
	}
	if err != nil {
		return nil, nil, 0, fmt.Errorf("claim: %w", err)
	}
	if len(jobs) == 0 {
		var next *int64
		err := tx.QueryRow(ctx, p.sql(`SELECT min(run_at) FROM {s}.jobs WHERE queue = $1 AND state = 1 AND run_at > $2`),
			queue, now).Scan(&next)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("claim: %w", err)
		}
		if next != nil && (wait == 0 || *next < wait) {
			wait = *next
		}
		return nil, nil, wait, tx.Commit(ctx)
	}
	var claimed []*Job
	var expired []string
	var tokens []string
	for _, j := range jobs {
		if j.TTL != none && j.TTL > 0 && now > j.CreatedAt+j.TTL {
			// Expired while waiting: dropped without an event, as in
			// memory mode.
			expired = append(expired, j.ID)
			continue
		}
		j.state = StateActive
		j.StartedAt, j.Heartbeat = now, now
		j.addTimeline(TimelineEntry{State: "active", At: now})
		if o.Owner != "" {
			ttl := o.TTL
			if ttl <= 0 {
				ttl = defaultLockTTL
			}
			j.lease = &Lease{Token: newID(), Owner: o.Owner, CreatedAt: now, ExpiresAt: now + ttl, TTL: ttl}
			tokens = append(tokens, j.lease.Token)
		}
		claimed = append(claimed, j)
	}
	if len(expired) > 0 {
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.jobs WHERE id = ANY($1)`), expired); err != nil {
			return nil, nil, 0, fmt.Errorf("drop expired jobs: %w", err)
		}
	}
	if len(claimed) > 0 {
		if err := p.saveJobs(ctx, tx, claimed, nil); err != nil {
			return nil, nil, 0, err
		}
		if err := p.spend(ctx, tx, queue, rate, len(claimed)); err != nil {
			return nil, nil, 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, 0, fmt.Errorf("claim: %w", err)
	}
	p.b.stats.pulled.Add(int64(len(claimed)))
	for _, j := range claimed {
		if j.Attempts == 0 {
			// As in memory mode: retries wait for their backoff, not
			// for the queue's backlog.
			p.b.lat.wait.ObserveMs(now - j.CreatedAt)
		}
		p.emit(queue, evPulled, j, now, evArgs{})
	}
	return claimed, tokens, 0, nil
}

// pgClaimPlan and pgClaimSQL claim a queue's ready jobs of no group. A
// queue that filled faster than autovacuum's statistics follow looks small
// to the planner, which then sorts every ready row of it for each claim
// (60 ms and a spill to disk for 60,000 jobs, against 0.1 ms) instead of
// reading the claim index in order; the claim's transaction forbids that.
const (
	pgClaimPlan = `SET LOCAL enable_sort = off`
	pgClaimSQL  = `SELECT record FROM {s}.jobs
		WHERE queue = $1 AND state = 1 AND run_at <= $2 AND group_id IS NULL
		ORDER BY priority DESC, sort_key, seq LIMIT $3 FOR UPDATE SKIP LOCKED`
)

// claimUngrouped locks up to n ready jobs of no group, in claim order.
// (A queue that has just had its first grouped job pushed may still be
// claimed this way: its grouped jobs wait for the next claim.)
func (p *PG) claimUngrouped(ctx context.Context, tx pgx.Tx, queue string, n int, now int64) ([]*Job, error) {
	if _, err := tx.Exec(ctx, pgClaimPlan); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, p.sql(pgClaimSQL), queue, now, n)
	if err != nil {
		return nil, err
	}
	return scanJobs(rows)
}

// scanJobs decodes rows of one column, the job record.
func scanJobs(rows pgx.Rows) ([]*Job, error) {
	defer rows.Close()
	var jobs []*Job
	for rows.Next() {
		var rec []byte
		if err := rows.Scan(&rec); err != nil {
			return nil, err
		}
		j, err := decodeRecord(rec)
		if err != nil {
			return nil, fmt.Errorf("job record: %w", err)
		}
		jobs = append(jobs, j)
	}
	return jobs, rows.Err()
}

// ---------------------------------------------------------------------------
// ACK and FAIL

// pgLocked is a job row taken FOR UPDATE, with its lease columns.
type pgLocked struct {
	j      *Job
	token  string // the current lease's token, or the last one's
	owned  bool   // the lease has an owner: ACK and FAIL must carry its token
	waited bool   // other jobs wait for this one (pg_flows.go)
}

// lockRows locks the rows of ids (in id order, so that two brokers never
// wait on each other) and answers them by id.
func (p *PG) lockRows(ctx context.Context, tx pgx.Tx, ids []string) (map[string]*pgLocked, error) {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	rows, err := tx.Query(ctx, p.sql(`SELECT record, lease_token, lease_owner, lease_ttl, lease_expires, waited FROM {s}.jobs
		WHERE id = ANY($1) ORDER BY id FOR UPDATE`), sorted)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]*pgLocked, len(sorted))
	for rows.Next() {
		var rec []byte
		var tok, owner *string
		var ttl, exp *int64
		var waited bool
		if err := rows.Scan(&rec, &tok, &owner, &ttl, &exp, &waited); err != nil {
			return nil, err
		}
		j, err := decodeRecord(rec)
		if err != nil {
			return nil, fmt.Errorf("job record: %w", err)
		}
		l := &pgLocked{j: j, waited: waited}
		if tok != nil {
			l.token = *tok
		}
		if j.state == StateActive && owner != nil {
			l.owned = true
			j.lease = &Lease{Token: l.token, Owner: *owner}
			if ttl != nil {
				j.lease.TTL = *ttl
			}
			if exp != nil {
				j.lease.ExpiresAt = *exp
			}
		}
		out[j.ID] = l
	}
	return out, rows.Err()
}

// finishRule decides whether an ACK or FAIL with token applies to a
// locked job: the fence that keeps a broker whose lease ran out, and whose
// job another worker now holds, from finishing it.
func finishRule(l *pgLocked, id, token string, isFail bool) (Outcome, error) {
	if l == nil {
		return Applied, errors.New(errNotProcessing + id)
	}
	j := l.j
	switch j.state {
	case StateActive:
		if l.owned {
			if token == "" {
				return Applied, errors.New("Lock token required for job " + id)
			}
			if token != l.token {
				return Applied, errors.New("Invalid or expired lock token for job " + id)
			}
		}
		return Applied, nil
	case StateWaiting, StatePrioritized, StateDelayed:
		if token != "" && token == l.token {
			if isFail {
				// That attempt was already counted when its lease ran out.
				return AlreadyFinalized, nil
			}
			// The worker finished after all: its work is kept, as in
			// memory mode, rather than running the job again.
			return Applied, nil
		}
		if !isFail && token == "" && j.Attempts > 0 {
			return Applied, nil
		}
	case StateCompleted, StateFailed:
		if token != "" && token == l.token {
			return AlreadyFinalized, nil
		}
	}
	return Applied, errors.New(errNotProcessing + id)
}

// ack completes jobs; it answers, by item, the outcome or the reason it
// did not apply.
func (p *PG) ack(ctx context.Context, items []AckItem) (outs []Outcome, errs []error, err error) {
	defer p.b.lat.ack.since(time.Now())
	err = pgRetry(func() error {
		outs, errs, err = p.ackOnce(ctx, items)
		return err
	})
	return outs, errs, err
}

func (p *PG) ackOnce(ctx context.Context, items []AckItem) ([]Outcome, []error, error) {
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.ID
	}
	outs := make([]Outcome, len(items))
	errs := make([]error, len(items))
	tx, err := p.begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer tx.Rollback(context.Background())
	locked, err := p.lockRows(ctx, tx, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("ack: %w", err)
	}
	now := p.now()
	type doneEv struct {
		j     *Job
		data  Raw
		undef bool
	}
	var save []*Job
	var done []doneEv
	results := map[int]Raw{}
	var remove []string
	var flows []pgDoneJob
	finished := map[string]bool{}
	for i, it := range items {
		if finished[it.ID] {
			// The same job twice in one batch: the first ACK finished it.
			errs[i] = errors.New(errNotProcessing + it.ID)
			continue
		}
		l := locked[it.ID]
		if outs[i], errs[i] = finishRule(l, it.ID, it.Token, false); errs[i] != nil || outs[i] != Applied {
			continue
		}
		j := l.j
		finished[j.ID] = true
		j.state = StateCompleted
		j.lease = nil
		j.DoneAt = now
		j.hasFail = false
		done = append(done, doneEv{j, it.Result, !it.HasResult})
		if l.waited || j.ParentID != "" || j.Repeat != nil {
			d := pgDoneJob{j: j, waited: l.waited}
			if it.HasResult {
				d.result = it.Result
			}
			flows = append(flows, d)
		}
		if j.RemoveOnC || it.Remove {
			remove = append(remove, j.ID)
			continue
		}
		j.addTimeline(TimelineEntry{State: "completed", At: now})
		if it.HasResult {
			results[len(save)] = it.Result
		}
		save = append(save, j)
	}
	var fl *pgFlowTx
	if len(flows) > 0 {
		saving := make(map[string]bool, len(save))
		for _, j := range save {
			saving[j.ID] = true
		}
		if fl, err = p.completed(ctx, tx, flows, locked, saving, now); err != nil {
			return nil, nil, fmt.Errorf("ack: %w", err)
		}
	}
	if len(save) > 0 {
		if err := p.saveJobs(ctx, tx, save, results); err != nil {
			return nil, nil, err
		}
	}
	if len(remove) > 0 {
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.jobs WHERE id = ANY($1)`), remove); err != nil {
			return nil, nil, fmt.Errorf("ack: remove completed jobs: %w", err)
		}
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.job_logs WHERE job_id = ANY($1)`), remove); err != nil {
			return nil, nil, fmt.Errorf("ack: remove logs: %w", err)
		}
	}
	if fl != nil {
		if err := p.repeated(ctx, tx, fl, flows, now); err != nil {
			return nil, nil, fmt.Errorf("ack: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, fmt.Errorf("ack: %w", err)
	}
	p.b.stats.completed.Add(int64(len(done)))
	for _, d := range done {
		if d.j.StartedAt > 0 {
			p.b.lat.proc.ObserveMs(now - d.j.StartedAt)
		}
		p.emit(d.j.Queue, evCompleted, d.j, now, evArgs{data: d.data, undefData: d.undef})
	}
	fl.after(p, now)
	return outs, errs, nil
}

func pgAck(r *Req) error {
	it, err := readAck(r)
	if err != nil {
		return err
	}
	ctx, cancel := pgCtx(r)
	defer cancel()
	outs, errs, err := r.c.srv.pg.ack(ctx, []AckItem{it})
	if err != nil {
		return pgErr(err)
	}
	if errs[0] != nil {
		return errs[0]
	}
	if outs[0] == Applied {
		r.c.srv.pg.unhold(it.ID)
	}
	return r.outcome(outs[0])
}

func pgAckBatch(r *Req) error {
	items, err := readAckBatch(r)
	if err != nil {
		return err
	}
	ctx, cancel := pgCtx(r)
	defer cancel()
	outs, errs, err := r.c.srv.pg.ack(ctx, items)
	if err != nil {
		return pgErr(err)
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
	r.c.srv.pg.unhold(done...)
	return r.ackIgnored(items, ignored)
}

func pgFail(r *Req) error {
	id, tok, f, err := readFail(r)
	if err != nil {
		return err
	}
	ctx, cancel := pgCtx(r)
	defer cancel()
	out, err := r.c.srv.pg.fail(ctx, id, tok, f)
	if err != nil {
		return err
	}
	if out == Applied {
		r.c.srv.pg.unhold(id)
	}
	return r.outcome(out)
}

// fail records a failed attempt: a retry after the backoff, the DLQ, or
// removal.
func (p *PG) fail(ctx context.Context, id, token string, f failure) (out Outcome, err error) {
	err = pgRetry(func() error {
		out, err = p.failOnce(ctx, id, token, f)
		return err
	})
	return out, err
}

func (p *PG) failOnce(ctx context.Context, id, token string, f failure) (Outcome, error) {
	tx, err := p.begin(ctx)
	if err != nil {
		return Applied, pgErr(err)
	}
	defer tx.Rollback(context.Background())
	locked, err := p.lockRows(ctx, tx, []string{id})
	if err != nil {
		return Applied, pgErr(fmt.Errorf("fail: %w", err))
	}
	l := locked[id]
	out, err := finishRule(l, id, token, true)
	if err != nil || out != Applied {
		return out, err
	}
	j := l.j
	if j.state != StateActive {
		// Finished by a FAIL whose lease had run out but whose job had
		// not been claimed again: nothing more to count.
		return AlreadyFinalized, nil
	}
	if err := f.check(j); err != nil {
		return Applied, err
	}
	now := p.now()
	if f.reason == "" {
		f.reason = "max_attempts_exceeded"
	}
	set, err := p.settings(ctx, tx, []string{j.Queue})
	if err != nil {
		return Applied, pgErr(fmt.Errorf("fail: %w", err))
	}
	dlq := set[j.Queue].dlqConfig()
	keep := pgFailJob(j, f, dlq, now)
	if keep {
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
	if err == nil && j.state != StateDelayed && j.ParentID != "" {
		err = p.childFailed(ctx, tx, fl, j, f.err, now)
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		return Applied, pgErr(fmt.Errorf("fail: %w", err))
	}
	p.b.stats.failed.Add(1)
	terminal := j.state != StateDelayed
	p.emit(j.Queue, evFailed, j, now, evArgs{err: f.err, hasErr: f.hasErr, terminal: terminal, hasTerminal: true})
	if !terminal {
		p.emit(j.Queue, evRetried, j, now, evArgs{prev: "failed"})
	}
	fl.after(p, now)
	return Applied, nil
}

// ---------------------------------------------------------------------------
// Leases

// heartbeat renews an active job's lease. With a token it must match, and
// the lease runs for duration (or its own TTL) from now; without one, a
// job pulled without an owner is marked alive for another stall interval.
func (p *PG) heartbeat(ctx context.Context, ids, tokens []string, durations []int64, lockOnly bool) (int, error) {
	now := p.now()
	// Without a lock, lease_ttl is the stall limit (NULL: stalls are not
	// watched) and the deadline never comes before the grace period's end.
	tag, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.jobs AS j SET lease_expires = CASE
			WHEN j.lease_owner IS NULL THEN CASE WHEN j.lease_ttl IS NULL THEN j.lease_expires
				ELSE LEAST(GREATEST($4::bigint + j.lease_ttl, j.lease_expires), COALESCE(j.timeout_at, $4::bigint + j.lease_ttl)) END
			WHEN u.tok = '' AND NOT $5::boolean THEN j.lease_expires
			ELSE LEAST($4::bigint + CASE WHEN u.dur > 0 THEN u.dur ELSE j.lease_ttl END,
				COALESCE(j.timeout_at, $4::bigint + CASE WHEN u.dur > 0 THEN u.dur ELSE j.lease_ttl END)) END,
			lease_renewals = j.lease_renewals + CASE WHEN j.lease_owner IS NOT NULL AND u.tok <> '' THEN 1 ELSE 0 END
		FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(id, tok, dur)
		WHERE j.id = u.id AND j.state = 4 AND (u.tok = '' OR j.lease_token = u.tok)
			AND (NOT $5::boolean OR j.lease_owner IS NOT NULL)`),
		ids, tokens, durations, now, lockOnly)
	if err != nil {
		return 0, pgErr(fmt.Errorf("heartbeat: %w", err))
	}
	return int(tag.RowsAffected()), nil
}

func pgRenew(r *Req, rn renewals, lockOnly bool) (int, error) {
	ctx, cancel := pgCtx(r)
	defer cancel()
	return r.c.srv.pg.heartbeat(ctx, rn.ids, rn.tokens, rn.durations, lockOnly)
}

// ---------------------------------------------------------------------------
// Reading jobs

// getJob reads one job and its result; nil when there is none.
func (p *PG) getJob(ctx context.Context, id string) (*Job, Raw, error) {
	var rec, res []byte
	err := p.pool.QueryRow(ctx, p.sql(`SELECT record, result FROM {s}.jobs WHERE id = $1`), id).Scan(&rec, &res)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, pgErr(fmt.Errorf("read job %s: %w", id, err))
	}
	j, err := decodeRecord(rec)
	if err != nil {
		return nil, nil, pgErr(fmt.Errorf("job record %s: %w", id, err))
	}
	return j, Raw(res), nil
}

// pgCountCols counts job rows by wire state, in the order of pgDest; now
// is the placeholder of the current time (it tells delayed from waiting).
func pgCountCols(now string) string {
	return strings.ReplaceAll(`count(*) FILTER (WHERE state = 1 AND run_at <= $now AND priority <= 0),
			count(*) FILTER (WHERE state = 1 AND run_at <= $now AND priority > 0),
			count(*) FILTER (WHERE state = 1 AND run_at > $now),
			count(*) FILTER (WHERE state = 4),
			count(*) FILTER (WHERE state = 5),
			count(*) FILTER (WHERE state = 6),
			count(*) FILTER (WHERE state = 7)`, "$now", now)
}

// pgDest are the scan targets of pgCountCols.
func (c *JobCounts) pgDest() []any {
	return []any{&c.Waiting, &c.Prioritized, &c.Delayed, &c.Active, &c.Completed, &c.Failed, &c.WaitingChildren}
}

// countsTx counts a queue's jobs by state through q (Counts, the
// dashboard), with whether the queue is paused.
func (p *PG) countsTx(ctx context.Context, q pgQuerier, queue string, now int64) (JobCounts, bool, error) {
	var c JobCounts
	var paused bool
	err := q.QueryRow(ctx, p.sql(`SELECT `+pgCountCols("$2")+`,
			COALESCE((SELECT paused FROM {s}.queues WHERE name = $1), false)
		FROM {s}.jobs WHERE queue = $1`), queue, now).Scan(append(c.pgDest(), &paused)...)
	if err != nil {
		return c, false, pgErr(fmt.Errorf("count jobs: %w", err))
	}
	if paused {
		c.Paused = c.Waiting + c.Prioritized
		c.Waiting, c.Prioritized = 0, 0
	}
	return c, paused, nil
}
