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
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgHandlers replace the memory handlers of the same name.
var pgHandlers = map[string]Handler{
	"GetJob":       pgGetJob,
	"GetState":     pgGetState,
	"GetResult":    pgGetResult,
	"GetJobCounts": pgGetJobCounts,
	"Count":        pgCount,
	"GetJobs":      pgGetJobs,
	"Progress":     pgProgress,
	"GetProgress":  pgGetProgress,
	"AddLog":       pgAddLog,
	"GetLogs":      getLogsCmd(pgLogs),
	"ClearLogs":    pgClearLogs,
	"WaitJob":      pgWaitJob,

	// Reads (pg_moves.go)
	"GetCountsPerPriority": pgGetCountsPerPriority,
	"GetJobByCustomId":     pgGetJobByCustomID,
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
// Inserting jobs: what pushes (pg_jobs.go, pg_pushbuf.go), flows and cron
// share

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

// closing reports that the engine is stopping.
func (p *PG) closing() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

// ---------------------------------------------------------------------------
// Claiming and reading rows: what claims (pg_jobs.go, pg_groups.go) and
// the other commands share

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

// pgJobRead is a command that reads one job, by the request's id, and
// answers from it (j nil: no such job).
func pgJobRead(answer func(r *Req, j *Job, res Raw) error) Handler {
	return func(r *Req) error {
		id, _, err := r.m.Str("id")
		if err != nil {
			return err
		}
		ctx, cancel := pgCtx(r)
		defer cancel()
		j, res, err := r.c.srv.pg.getJob(ctx, id)
		if err != nil {
			return err
		}
		return answer(r, j, res)
	}
}

var pgGetJob = pgJobRead(func(r *Req, j *Job, res Raw) error {
	if j == nil {
		return errJobNotFound
	}
	encodeJob(r.field("job"), j, jobWithState, j.stateAt(r.c.srv.pg.now()).String(), res)
	return nil
})

var pgGetState = pgJobRead(func(r *Req, j *Job, _ Raw) error {
	st := StateNone
	if j != nil {
		st = j.stateAt(r.c.srv.pg.now())
	}
	r.field("id").Raw(r.m.Get("id"))
	r.field("state").Str(st.String())
	return nil
})

var pgGetResult = pgJobRead(func(r *Req, j *Job, res Raw) error {
	r.field("id").Raw(r.m.Get("id"))
	if j == nil || j.state != StateCompleted || res == nil {
		r.field("result").Undefined()
	} else {
		r.field("result").Raw(res)
	}
	return nil
})

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

// counts are a queue's jobs by state.
func (p *PG) counts(ctx context.Context, queue string) (JobCounts, error) {
	c, _, err := p.countsTx(ctx, p.pool, queue, p.now())
	return c, err
}

// countsTx is counts through q, with whether the queue is paused.
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

func pgGetJobCounts(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	ctx, cancel := pgCtx(r)
	defer cancel()
	c, err := r.c.srv.pg.counts(ctx, queue)
	if err != nil {
		return err
	}
	writeCounts(r, c)
	return nil
}

func pgCount(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	ctx, cancel := pgCtx(r)
	defer cancel()
	c, err := r.c.srv.pg.counts(ctx, queue)
	if err != nil {
		return err
	}
	r.field("count").Int(int64(c.Waiting + c.Prioritized + c.Paused + c.Delayed))
	return nil
}

// pgStateWhere is the row condition of a wire state name ($2 is now).
var pgStateWhere = map[string]string{
	"waiting":          "(state = 1 AND run_at <= $2 AND priority <= 0)",
	"prioritized":      "(state = 1 AND run_at <= $2 AND priority > 0)",
	"delayed":          "(state = 1 AND run_at > $2)",
	"paused":           "(state = 1 AND run_at <= $2)",
	"active":           "state = 4",
	"completed":        "state = 5",
	"failed":           "state = 6",
	"waiting-children": "state = 7",
}

func pgGetJobs(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	a, err := readJobsQuery(r.m)
	if err != nil {
		return err
	}
	want, single, offset, limit, asc := a.want, a.single, a.offset, a.limit, a.asc
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	var paused bool
	if err := p.pool.QueryRow(ctx, p.sql(`SELECT COALESCE((SELECT paused FROM {s}.queues WHERE name = $1), false)`), queue).Scan(&paused); err != nil {
		return pgErr(err)
	}
	explicit := len(want) > 0
	where := "true"
	if explicit {
		where = "false"
		for _, st := range want {
			c, ok := pgStateWhere[st]
			if !ok || (st == "paused" && !paused) {
				continue
			}
			if paused && (st == "waiting" || st == "prioritized") {
				// A paused queue's ready jobs are listed as paused.
				continue
			}
			where += " OR " + c
		}
	}
	order := "ASC"
	if !asc {
		order = "DESC"
	}
	q := `SELECT record FROM {s}.jobs WHERE queue = $1 AND $2::bigint IS NOT NULL AND (` + where + `) ORDER BY created_at ` + order + `, id ` + order
	args := []any{queue, p.now()}
	sliced := false
	if offset >= 0 && limit >= 0 {
		q += ` OFFSET $3 LIMIT $4`
		args = append(args, offset, limit)
		sliced = true
	}
	rows, err := p.pool.Query(ctx, p.sql(q), args...)
	if err != nil {
		return pgErr(fmt.Errorf("list jobs: %w", err))
	}
	jobs, err := scanJobs(rows)
	if err != nil {
		return pgErr(fmt.Errorf("list jobs: %w", err))
	}
	if !sliced {
		lo, hi := jsSlice(len(jobs), offset, offset+limit)
		jobs = jobs[lo:hi]
	}
	now := p.now()
	var results map[string]Raw
	for _, j := range jobs {
		if j.state == StateCompleted {
			if results == nil {
				results = map[string]Raw{}
			}
			results[j.ID] = nil
		}
	}
	if len(results) > 0 {
		ids := make([]string, 0, len(results))
		for id := range results {
			ids = append(ids, id)
		}
		rows, err := p.pool.Query(ctx, p.sql(`SELECT id, result FROM {s}.jobs WHERE id = ANY($1) AND result IS NOT NULL`), ids)
		if err != nil {
			return pgErr(err)
		}
		for rows.Next() {
			var id string
			var res []byte
			if err := rows.Scan(&id, &res); err != nil {
				rows.Close()
				return pgErr(err)
			}
			results[id] = res
		}
		rows.Close()
	}
	e := r.field("jobs")
	e.ArrayHead(len(jobs))
	for _, j := range jobs {
		st := j.stateAt(now)
		label := st.String()
		if paused && explicit && (st == StateWaiting || st == StatePrioritized) {
			label = "paused"
		}
		if single != "" {
			label = single
		}
		encodeJob(e, j, jobWithState, label, results[j.ID])
	}
	return nil
}

// ---------------------------------------------------------------------------
// Progress and logs

func pgProgress(r *Req) error {
	u, err := readProgress(r)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	tx, err := p.begin(ctx)
	if err != nil {
		return pgErr(err)
	}
	defer tx.Rollback(context.Background())
	locked, err := p.lockRows(ctx, tx, []string{u.id})
	if err != nil {
		return pgErr(err)
	}
	l := locked[u.id]
	if l == nil {
		return errJobNotFound
	}
	j := l.j
	now := p.now()
	ev, err := u.apply(j, now)
	if err != nil {
		return err
	}
	var e Enc
	encodeRecord(&e, j)
	if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET record = $2 WHERE id = $1`), u.id, e.B); err != nil {
		return pgErr(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return pgErr(err)
	}
	p.emit(j.Queue, evProgress, j, now, ev)
	return r.okID()
}

var pgGetProgress = pgJobRead(func(r *Req, j *Job, _ Raw) error { return writeProgress(r, j) })

func pgAddLog(r *Req) error {
	id, entry, err := readLogEntry(r)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	entry.At = p.now()
	ctx, cancel := pgCtx(r)
	defer cancel()
	tx, err := p.begin(ctx)
	if err != nil {
		return pgErr(err)
	}
	defer tx.Rollback(context.Background())
	var exists bool
	if err := tx.QueryRow(ctx, p.sql(`SELECT EXISTS (SELECT 1 FROM {s}.jobs WHERE id = $1 FOR KEY SHARE)`), id).Scan(&exists); err != nil {
		return pgErr(err)
	}
	if !exists {
		return errJobNotFound
	}
	logs, err := p.readLogs(ctx, tx, id, true)
	if err != nil {
		return err
	}
	if err := p.writeLogs(ctx, tx, id, appendLog(logs, entry)); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return pgErr(err)
	}
	return writeLogAdded(r)
}

func (p *PG) readLogs(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, id string, lock bool) ([]LogEntry, error) {
	sql := `SELECT logs FROM {s}.job_logs WHERE job_id = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	var b []byte
	err := q.QueryRow(ctx, p.sql(sql), id).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, pgErr(fmt.Errorf("read logs of %s: %w", id, err))
	}
	logs, err := decodeLogs(b)
	if err != nil {
		return nil, pgErr(fmt.Errorf("logs of %s: %w", id, err))
	}
	return logs, nil
}

func (p *PG) writeLogs(ctx context.Context, tx pgx.Tx, id string, logs []LogEntry) error {
	var err error
	if len(logs) == 0 {
		_, err = tx.Exec(ctx, p.sql(`DELETE FROM {s}.job_logs WHERE job_id = $1`), id)
	} else {
		_, err = tx.Exec(ctx, p.sql(`INSERT INTO {s}.job_logs (job_id, logs) VALUES ($1, $2)
			ON CONFLICT (job_id) DO UPDATE SET logs = EXCLUDED.logs`), id, encodeLogs(logs))
	}
	if err != nil {
		return pgErr(fmt.Errorf("write logs of %s: %w", id, err))
	}
	return nil
}

func pgLogs(r *Req, id string) ([]LogEntry, error) {
	ctx, cancel := pgCtx(r)
	defer cancel()
	return r.c.srv.pg.readLogs(ctx, r.c.srv.pg.pool, id, false)
}

func pgClearLogs(r *Req) error {
	id, keep, err := readClearLogs(r)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	tx, err := p.begin(ctx)
	if err != nil {
		return pgErr(err)
	}
	defer tx.Rollback(context.Background())
	logs, err := p.readLogs(ctx, tx, id, true)
	if err != nil {
		return err
	}
	if keep <= 0 {
		logs = nil
	} else if len(logs) > int(keep) {
		logs = logs[len(logs)-int(keep):]
	}
	if err := p.writeLogs(ctx, tx, id, logs); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return pgErr(err)
	}
	return r.okID()
}

// pgWaitPoll is how often WaitJob looks at a job it waits on.
const pgWaitPoll = 50 * time.Millisecond

func pgWaitJob(r *Req) error {
	id, _, err := r.m.Str("id")
	if err != nil {
		return err
	}
	timeout, ok, err := numField(r.m, "timeout", "timeout", numRule{min: 0, max: maxWaitTimeout})
	if err != nil {
		return err
	}
	if !ok {
		timeout = 30000
	}
	p := r.c.srv.pg
	check := func(ctx context.Context) (*waitOutcome, error) {
		j, res, err := p.getJob(ctx, id)
		if err != nil {
			return nil, err
		}
		if j == nil {
			return nil, errJobNotFound
		}
		switch j.state {
		case StateCompleted:
			return &waitOutcome{completed: true, result: res, hasResult: res != nil}, nil
		case StateFailed:
			return &waitOutcome{err: j.failErr}, nil
		}
		return nil, nil
	}
	ctx, cancel := pgCtx(r)
	o, err := check(ctx)
	cancel()
	if err != nil {
		return err
	}
	if o != nil {
		return writeWait(r, *o)
	}
	cctx := r.c.ctx
	return r.goAsync(func(ar *Req) error {
		deadline := time.Now().Add(time.Duration(timeout) * time.Millisecond)
		t := time.NewTicker(pgWaitPoll)
		defer t.Stop()
		for time.Now().Before(deadline) {
			select {
			case <-t.C:
			case <-cctx.Done():
				ar.field("completed").Bool(false)
				return nil
			case <-p.stop:
				ar.field("completed").Bool(false)
				return nil
			}
			ctx, cancel := context.WithTimeout(cctx, 10*time.Second)
			o, err := check(ctx)
			cancel()
			if err == errJobNotFound {
				// Removed on completion.
				return writeWait(ar, waitOutcome{completed: true})
			}
			if err != nil {
				return err
			}
			if o != nil {
				return writeWait(ar, *o)
			}
		}
		ar.field("completed").Bool(false)
		return nil
	})
}
