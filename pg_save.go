package main

// Writing job rows in PostgreSQL mode: a job's row from the job (its state,
// sort key, lease, record), written for many jobs in one statement.

import (
	"context"
	"math"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// pgState is the row state of a job state.
func pgState(s State) int16 {
	switch s {
	case StateActive:
		return pgActive
	case StateCompleted:
		return pgDone
	case StateFailed:
		return pgDLQ
	case StateWaitingChildren:
		return pgChildren
	}
	return pgQueued
}

// sortKey orders claims within a priority: LIFO jobs first, newest first,
// then FIFO by run time (ties go by the row's sequence number).
func sortKey(j *Job) int64 {
	if j.cold().Lifo {
		return -(j.RunAt<<10 | lifoSeq.Add(1)&1023)
	}
	return j.RunAt
}

// pgRunAt is a job's run_at column, from when a claim may take it. A job
// ready when it is written gets a time already past on every broker:
// each compares the column with its own reading of the database's clock,
// and a broker's reading may be off by up to pgClockBound while it still
// claims, so two brokers' by twice that. Written as the writer's time, a
// job pushed to run now through a broker ahead of another was delayed on
// that other for the difference: not pulled, counted as delayed. A
// delayed job's column is its run time; its record keeps the true run
// time either way (the column is only compared, never read back).
//
// Delayed is a job due after now that was put off (StateDelayed), or
// one due after the margin: a job made ready, whose run time another
// broker ahead of this one wrote, or whose state was decided at a
// moment before now was read for the write, is due a few ms past now.
func pgRunAt(j *Job, now int64) int64 {
	if j.RunAt > now && (j.state == StateDelayed || j.RunAt > now+pgReadyMargin) {
		return j.RunAt
	}
	return min(j.RunAt, now-pgReadyMargin)
}

// pgReadyMargin is how far pgRunAt puts a ready job's column before the
// writer's time, in ms: twice pgClockBound.
const pgReadyMargin = int64(2 * pgClockBound / time.Millisecond)

// lifoSeq orders LIFO jobs of the same millisecond, newest first.
var lifoSeq atomic.Int64

// saveJobs writes jobs' rows from the jobs, in one statement. results
// holds, by index, the results of jobs that just completed. A lease token
// stays on the row after the lease ends, so that a late ACK or FAIL that
// carries it is known for what it is.
func (p *PG) saveJobs(ctx context.Context, tx pgx.Tx, jobs []*Job, results map[int]Raw) error {
	set, err := p.unlockedSettings(ctx, tx, jobs)
	if err != nil {
		return err
	}
	now := p.now()
	rows := newPGSavedRows(len(jobs))
	for i, j := range jobs {
		rows.set(i, j, set[j.Queue], now)
		if r, ok := results[i]; ok && r != nil {
			rows.res[i] = r
		}
	}
	return pgLater(ctx, tx, "postgres: save jobs", p.sql(pgSaveSQL), rows.args(p.broker)...)
}

// unlockedSettings reads the settings of the queues of the active jobs
// without a lock, which stall as their queue's policy says; nil when
// there are none.
func (p *PG) unlockedSettings(ctx context.Context, tx pgx.Tx, jobs []*Job) (map[string]*pgSettings, error) {
	var watched []string
	for _, j := range jobs {
		if j.state == StateActive && j.run().lease == nil {
			watched = append(watched, j.Queue)
		}
	}
	if len(watched) == 0 {
		return nil, nil
	}
	return p.settings(ctx, tx, watched)
}

// pgSaveSQL writes job rows from pgSavedRows. A job keeps its unique key
// until it finishes, and takes it again when it comes back from finished;
// one whose key was released (or taken by a replacing job) while it lived
// does not get it back.
const pgSaveSQL = `UPDATE {s}.jobs AS j SET state=u.state, priority=u.prio, sort_key=u.key, run_at=u.run_at,
		done_at=u.done_at,
		unique_key = CASE WHEN u.uk IS NULL THEN NULL WHEN j.state IN ({done}, {dlq}) THEN u.uk ELSE j.unique_key END,
		unique_expires = CASE WHEN u.uk IS NULL THEN NULL WHEN j.state IN ({done}, {dlq}) THEN u.uexp ELSE j.unique_expires END,
		lease_token=COALESCE(u.tok, j.lease_token), lease_owner=u.owner,
		lease_broker=CASE WHEN u.state = {active} THEN $15 END, lease_expires=u.exp, lease_ttl=u.ttl, timeout_at=u.tout,
		body=u.rec, result=u.res, dlq_at=u.dlq_at, dlq_due=u.dlq_due, plain=u.plain,
		data = CASE WHEN u.keepd THEN j.data ELSE u.dat END,
		lease_renewals=CASE WHEN u.tok IS NOT NULL AND u.tok IS DISTINCT FROM j.lease_token THEN 0 ELSE j.lease_renewals END
		FROM unnest($1::text[], $2::smallint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::text[],
			$8::text[], $9::text[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bytea[], $14::bytea[],
			$16::bigint[], $17::bigint[], $18::bigint[], $19::boolean[], $20::bytea[], $21::boolean[])
			AS u(id, state, prio, key, run_at, done_at, uk, tok, owner, exp, ttl, tout, rec, res, uexp, dlq_at, dlq_due, plain, dat, keepd)
		WHERE j.id = u.id`

// pgSavedRows are job rows to write, column by column, for pgSaveSQL.
type pgSavedRows struct {
	ids                 []string
	states              []int16
	prios, keys, runAts []int64
	doneAts, uexps      []*int64
	uks, toks, owners   []*string
	exps, ttls, touts   []*int64
	recs, res           [][]byte
	dlqAts, dlqDues     []*int64
	plain               []bool
	datas               [][]byte // the data column (pg_data.go): nil, NULL unless keeps
	keeps               []bool
	arena               pgArena
}

func newPGSavedRows(n int) *pgSavedRows {
	return &pgSavedRows{
		ids: make([]string, n), states: make([]int16, n), prios: make([]int64, n), keys: make([]int64, n),
		runAts: make([]int64, n), doneAts: make([]*int64, n), uks: make([]*string, n), uexps: make([]*int64, n),
		toks: make([]*string, n), owners: make([]*string, n), exps: make([]*int64, n), ttls: make([]*int64, n),
		touts: make([]*int64, n), recs: make([][]byte, n), res: make([][]byte, n),
		dlqAts: make([]*int64, n), dlqDues: make([]*int64, n), plain: make([]bool, n),
		datas: make([][]byte, n), keeps: make([]bool, n),
	}
}

// set fills row i from job j; set is its queue's settings, when it is
// active without a lock.
func (r *pgSavedRows) set(i int, j *Job, set *pgSettings, now int64) {
	r.ids[i], r.states[i], r.prios[i], r.keys[i], r.runAts[i] = j.ID(), pgState(j.state), j.Priority, sortKey(j), pgRunAt(j, now)
	if j.DoneAt() != 0 {
		r.doneAts[i] = ptr(j.DoneAt())
	}
	if j.cold().UniqueKey != "" && j.state != StateCompleted && j.state != StateFailed {
		r.uks[i] = ptr(j.cold().UniqueKey)
		r.uexps[i] = dedupExpiry(j, now)
	}
	if j.state == StateActive {
		r.setLease(i, j, set.stallConfig())
	}
	if j.state == StateFailed && j.dlq != nil {
		r.dlqAts[i] = ptr(j.dlq.EnteredAt)
		r.dlqDues[i] = pgDLQDue(j.dlq)
	}
	r.recs[i], r.datas[i], r.keeps[i] = r.arena.record(j)
	r.plain[i] = pgPlainDone(j)
}

// pgArena holds the records a batch of rows encodes, back to back in a
// few large buffers: encoded one by one into buffers of their own, each
// record grew its buffer several times over, which showed in a drain's
// profile (growslice under Enc.Str).
type pgArena struct{ buf []byte }

// record is pgRecord with the record encoded into the arena.
func (a *pgArena) record(j *Job) (rec, data []byte, keep bool) {
	apart, data, keep := pgDataOf(j)
	return a.encode(j, apart), data, keep
}

// encode encodes j's record into the arena and answers it: without its
// data when apart (pg_data.go).
func (a *pgArena) encode(j *Job, apart bool) []byte {
	if cap(a.buf)-len(a.buf) < 1024 {
		a.buf = make([]byte, 0, 64<<10)
	}
	start := len(a.buf)
	e := Enc{B: a.buf[start:start]}
	encodeRecordAs(&e, j, apart)
	if cap(e.B) != cap(a.buf)-start {
		// It outgrew the arena and moved to a buffer of its own.
		return e.B
	}
	a.buf = a.buf[:start+len(e.B)]
	return a.buf[start:len(a.buf):len(a.buf)]
}

// setLease fills the lease columns of an active job's row i: its lock, or
// without one how long it may go without a heartbeat; its timeout; and
// when it is reclaimed.
func (r *pgSavedRows) setLease(i int, j *Job, stall StallConfig) {
	if l := j.run().lease; l != nil {
		r.toks[i], r.owners[i], r.ttls[i] = ptr(l.Token), ptr(l.Owner), ptr(l.TTL)
	} else if stall.Enabled {
		r.ttls[i] = ptr(stallLimit(j, stall))
	}
	if at, ok := timeoutAt(j); ok {
		r.touts[i] = ptr(at)
	}
	if exp := stallDeadline(j, stall); exp != math.MaxInt64 {
		r.exps[i] = ptr(exp)
	}
}

// args are pgSaveSQL's parameters; broker is written on active rows.
// Columns of pointers and of byte slices go as pgtype.FlatArray: pgx
// encodes a slice of a type it does not know by reflection, element by
// element, which took 7% of the server's CPU in a drain.
func (r *pgSavedRows) args(broker string) []any {
	return []any{r.ids, r.states, r.prios, r.keys, r.runAts, pgtype.FlatArray[*int64](r.doneAts), pgtype.FlatArray[*string](r.uks),
		pgtype.FlatArray[*string](r.toks), pgtype.FlatArray[*string](r.owners), pgtype.FlatArray[*int64](r.exps),
		pgtype.FlatArray[*int64](r.ttls), pgtype.FlatArray[*int64](r.touts), pgtype.FlatArray[[]byte](r.recs),
		pgtype.FlatArray[[]byte](r.res), broker, pgtype.FlatArray[*int64](r.uexps), pgtype.FlatArray[*int64](r.dlqAts),
		pgtype.FlatArray[*int64](r.dlqDues), r.plain, pgtype.FlatArray[[]byte](r.datas), r.keeps}
}

func ptr[T any](v T) *T { return &v }
