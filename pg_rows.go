package main

// Claiming and reading job rows in PostgreSQL mode: what claims
// (pg_lifecycle.go, pg_groups.go) and the other operations share.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// pgClaimPlan and pgClaimSQL claim a queue's ready jobs of no group. A
// queue that filled faster than autovacuum's statistics follow looks small
// to the planner, which then sorts every ready row of it for each claim
// (60 ms and a spill to disk for 60,000 jobs, against 0.1 ms) instead of
// reading the claim index in order; the claim's transaction forbids that.
// Forbidding it makes the cost of any plan that still sorts look huge, and
// a plan that looks that costly is compiled (JIT: 340 ms for a claim of
// 500 rows that sorted, in a trial), so the transaction turns JIT off too.
//
// A claim's commit does not wait for the WAL to reach the disk
// (synchronous_commit off, for that transaction only). What a claim
// writes matters only while the database runs: a claim lost with a
// crash of PostgreSQL (the last 0.6 s of claims at most, with the default
// wal_writer_delay) leaves its jobs waiting, as they were, and they are
// handed out again while the worker that had them may still run them,
// as after a lease that ran out (whose ACK is refused the same way).
// Nothing a client was told is done depends on it: the ACK, the FAIL and
// the push that follow commit with the flush, and the WAL is flushed in
// order, so a completion that is on disk has its claim on disk too. Under
// a steady stream every job goes through a claim round, and its flush was
// most of the round's time (queued bench steady at 3,000 jobs/s, in turn
// with claims that waited: p99 20-295 ms against 148-469 ms, the
// database's CPU 0.15-0.19 ms a job against 0.19-0.22).
const (
	pgClaimPlan = `SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true),
		set_config('synchronous_commit', 'off', true)`
	pgClaimSQL = `SELECT ` + pgJobCols + ` FROM {s}.jobs
		WHERE queue = $1 AND state = {queued} AND run_at <= $2 AND group_id IS NULL
		ORDER BY priority DESC, sort_key, seq LIMIT $3 FOR UPDATE SKIP LOCKED`
)

// pgClaimFirstSQL reads a queue's limits and settings, for a claim's
// first round trip; pgClaimFastSQL is pgClaimSQL for the same trip, which
// claims nothing from a queue whose claims need its limits first (paused,
// rate or concurrency limited, or grouped): the claim reads them, then
// goes the way claimTx says.
const (
	pgClaimFirstSQL = `SELECT paused, rate_max, rate_duration, rate_tokens, rate_at, rate_expires, rate_consumed, conc_limit, grouped,
		stall_enabled, stall_interval, stall_grace, stall_max, dlq_auto_retry, dlq_retry_interval,
		dlq_max_age, dlq_max_retries, dlq_max_entries
		FROM {s}.queues WHERE name = $1`
	pgClaimFastSQL = `SELECT ` + pgJobCols + ` FROM {s}.jobs
		WHERE queue = $1 AND state = {queued} AND run_at <= $2 AND group_id IS NULL
			AND NOT EXISTS (SELECT 1 FROM {s}.queues q WHERE q.name = $1
				AND (q.paused OR q.grouped OR q.rate_max IS NOT NULL OR q.conc_limit IS NOT NULL))
		ORDER BY priority DESC, sort_key, seq LIMIT $3 FOR UPDATE SKIP LOCKED`
)

// scanClaimFirst reads pgClaimFirstSQL's row into l and s.
func scanClaimFirst(row pgx.Row, l *pgLimits, s *pgSettings) error {
	return row.Scan(&l.paused, &l.rateMax, &l.rateDur, &l.rateTokens, &l.rateAt, &l.rateExpires, &l.rateCount, &l.conc,
		&l.grouped, &s.stallEnabled, &s.stallInterval, &s.stallGrace, &s.stallMax, &s.dlqAuto, &s.dlqInterval,
		&s.dlqMaxAge, &s.dlqMaxRetries, &s.dlqMaxEntries)
}

// pgFirst is what a claim's first round trip found.
type pgFirst struct {
	lim     pgLimits
	set     map[string]*pgSettings // the queue's settings, by name (none: the defaults)
	claimed bool                   // the queue needed none of lim: jobs is the claim
	jobs    []*Job
}

// claimFirst reads the queue's limits and settings and, in the same round
// trip (with BEGIN), claims its ready jobs of no group when the limits
// ask for nothing first. Both statements see the queue row as committed
// when they run, so the claim is taken exactly when claimTx would take
// it after reading lim (paused, limited and grouped queues claim
// nothing here).
func (p *PG) claimFirst(ctx context.Context, tx pgx.Tx, queue string, n int, now int64) (pgFirst, error) {
	var f pgFirst
	b := &pgx.Batch{}
	b.Queue(p.sql(pgClaimFirstSQL), queue)
	b.Queue(pgClaimPlan)
	b.Queue(p.sql(pgClaimFastSQL), queue, now, n)
	br := pgPipe(ctx, tx, b)
	defer br.Close()
	l := &f.lim
	s := &pgSettings{}
	err := scanClaimFirst(br.QueryRow(), l, s)
	f.set = map[string]*pgSettings{}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		f.lim = pgLimits{}
	case err != nil:
		return f, fmt.Errorf("read the limits of %s: %w", queue, err)
	default:
		f.set[queue] = s
	}
	if _, err := br.Exec(); err != nil {
		return f, fmt.Errorf("claim: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return f, fmt.Errorf("claim: %w", err)
	}
	jobs, err := scanJobs(rows)
	if err != nil {
		return f, fmt.Errorf("claim: %w", err)
	}
	if err := br.Close(); err != nil {
		return f, fmt.Errorf("claim: %w", err)
	}
	f.claimed = !f.lim.paused && !f.lim.limited() && !f.lim.grouped
	if f.claimed {
		f.jobs = jobs
		return f, nil
	}
	// The claim path from here sorts as the planner likes (the grouped
	// claim); the guard kept the fast claim from locking anything.
	return f, pgLater(ctx, tx, "claim plan", `SET LOCAL enable_sort TO DEFAULT`)
}

// claimUngrouped locks up to n ready jobs of no group, in claim order.
// (A queue that has just had its first grouped job pushed may still be
// claimed this way: its grouped jobs wait for the next claim.)
func (p *PG) claimUngrouped(ctx context.Context, tx pgx.Tx, queue string, n int, now int64) ([]*Job, error) {
	if err := pgLater(ctx, tx, "claim plan", pgClaimPlan); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, p.sql(pgClaimSQL), queue, now, n)
	if err != nil {
		return nil, err
	}
	return scanJobs(rows)
}

// pgJobCols are the columns a job is read from: its record as last
// written in full, and the state columns a claim or a plain completion
// writes instead of it (pgRow.job). The id is the record's too, and read
// for a record that cannot be decoded (pg_unreadable.go).
const pgJobCols = `id, body, state, started_at, done_at, data`

// pgRow is a job row as read through pgJobCols.
//
// A record is read where the driver holds it (DriverBytes, valid until the
// next row) and decoded at once: decoding copies what it keeps, so a copy
// of every record would be garbage.
type pgRow struct {
	id      pgtype.DriverBytes
	rec     pgtype.DriverBytes
	state   int16
	started pgtype.Int8
	done    pgtype.Int8
	data    pgtype.DriverBytes // the data, when kept apart (pg_data.go)
}

// dest is what rows.Scan fills, in pgJobCols order.
func (r *pgRow) dest() []any { return []any{&r.id, &r.rec, &r.state, &r.started, &r.done, &r.data} }

// job decodes the row's record and brings it up to the row's state. One
// recLast for the rows of a result shares their queue and name strings.
func (r *pgRow) job(last *recLast) (*Job, error) {
	j, err := last.decode(r.rec)
	if errors.Is(err, errRecordNewer) {
		return nil, fmt.Errorf("job record: %w", err)
	}
	if err != nil {
		return nil, pgUnreadable{id: string(r.id), body: bytes.Clone(r.rec), err: err} // pg_unreadable.go
	}
	if r.data != nil {
		j.Data = bytes.Clone(r.data)
		j.warm().pgData = j.Data
	}
	pgOverlay(j, r.state, r.started, r.done)
	return j, nil
}

// pgOverlay applies to a job what its row's state columns say happened
// since its record was written: a claim (state 4, started_at), then a
// completion (state 5, done_at), as activate and settle did to the job
// in hand. Any other change writes the record, so a record that agrees
// with its row's state is taken as it is.
func pgOverlay(j *Job, state int16, started, done pgtype.Int8) {
	if state != pgActive && state != pgDone {
		return
	}
	if pgState(j.state) == pgQueued && started.Valid {
		j.state = StateActive
		j.setStartedAt(started.Int64)
		j.setHeartbeat(started.Int64)
		j.addTimeline(TimelineEntry{State: StateActive, At: started.Int64})
	}
	if state == pgDone && j.state == StateActive && done.Valid {
		j.state = StateCompleted
		j.setDoneAt(done.Int64)
		if j.c != nil {
			j.c.hasFail = false // as settle does
		}
		j.addTimeline(TimelineEntry{State: StateCompleted, At: done.Int64})
	}
}

// pgPlainDone reports whether a job's completion touches no row but its own
// (the plain column): no parent to tell, no repeat to schedule, and its
// row is kept. Jobs others wait for are marked apart (waited).
func pgPlainDone(j *Job) bool {
	return j.cold().ParentID == "" && j.cold().Repeat == nil && !j.cold().RemoveOnComplete
}

// scanJobs decodes rows of pgJobCols.
func scanJobs(rows pgx.Rows) ([]*Job, error) { return scanJobsWhile(rows, nil) }

// scanJobsWhile reads jobs until keep (when set) refuses one, which is
// left out with the rows after it.
func scanJobsWhile(rows pgx.Rows, keep func(j *Job) bool) ([]*Job, error) {
	defer rows.Close()
	var jobs []*Job
	var last recLast
	var r pgRow
	dest := r.dest()
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		j, err := r.job(&last)
		if err != nil {
			return nil, err
		}
		if keep != nil && !keep(j) {
			break
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
	rows, err := tx.Query(ctx, p.sql(`SELECT `+pgJobCols+`, lease_token, lease_owner, lease_ttl, lease_expires, waited FROM {s}.jobs
		WHERE id = ANY($1) AND state <> {setaside} ORDER BY id FOR UPDATE`), sorted)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]*pgLocked, len(sorted))
	var last recLast
	var r pgRow
	var unreadable []pgUnreadable
	for rows.Next() {
		var tok, owner *string
		var ttl, exp *int64
		var waited bool
		if err := rows.Scan(append(r.dest(), &tok, &owner, &ttl, &exp, &waited)...); err != nil {
			return nil, err
		}
		j, err := r.job(&last)
		if u, ok := errors.AsType[pgUnreadable](err); ok {
			// Locked here: set aside in this transaction, and absent.
			unreadable = append(unreadable, u)
			continue
		}
		if err != nil {
			return nil, err
		}
		l := &pgLocked{j: j, waited: waited}
		if tok != nil {
			l.token = *tok
		}
		if j.state == StateActive && owner != nil {
			l.owned = true
			j.setLease(&Lease{Token: l.token, Owner: *owner})
			if ttl != nil {
				j.run().lease.TTL = *ttl
			}
			if exp != nil {
				j.run().lease.ExpiresAt = *exp
			}
		}
		out[j.ID()] = l
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows.Close()
	for _, u := range unreadable {
		if _, err := p.setAsideRow(ctx, tx, u); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ---------------------------------------------------------------------------
// Reading jobs

// pgRecord is what a job's row is written with: its record, without its
// data when that is kept apart, and the data column's value or keep
// (pgDataOf, pg_data.go).
func pgRecord(j *Job) (rec, data []byte, keep bool) {
	apart, data, keep := pgDataOf(j)
	var e Enc
	encodeRecordAs(&e, j, apart)
	return e.B, data, keep
}

// saveRecord writes a locked job's record alone, and plain with it (a
// record given a parent or a repeat is no longer completed by the ACK
// that writes its columns only): its lease and deadline stay as they are.
func (p *PG) saveRecord(ctx context.Context, tx pgx.Tx, j *Job) error {
	rec, data, keep := pgRecord(j)
	_, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET body = $2, plain = $3, data = CASE WHEN $5 THEN data ELSE $4 END WHERE id = $1`),
		j.ID(), rec, pgPlainDone(j), data, keep)
	return err
}

// uniqueHeld says whether another live job holds j's unique key, so that
// j cannot come back to life now.
func (p *PG) uniqueHeld(ctx context.Context, tx pgx.Tx, j *Job) (bool, error) {
	if j.cold().UniqueKey == "" {
		return false, nil
	}
	var held bool
	err := tx.QueryRow(ctx, p.sql(`SELECT EXISTS (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND unique_key = $2
		AND state IN ({queued}, {active}, {children}) AND id <> $3)`), j.Queue, j.cold().UniqueKey, j.ID()).Scan(&held)
	if err != nil {
		return false, fmt.Errorf("unique key %q: %w", j.cold().UniqueKey, err)
	}
	return held, nil
}

// deleteIDs deletes jobs and their logs.
func (p *PG) deleteIDs(ctx context.Context, tx pgx.Tx, ids []string) error {
	if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.jobs WHERE id = ANY($1)`), ids); err != nil {
		return fmt.Errorf("delete jobs: %w", err)
	}
	if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.job_logs WHERE job_id = ANY($1)`), ids); err != nil {
		return fmt.Errorf("delete logs: %w", err)
	}
	return nil
}

// pgScanPlan makes the scans of txJobs and reapDue walk their index in
// order (sendPlanned). The
// reaper's and the DLQ's rows come from partial indexes (state = active,
// state = dlq) that every job passes through, and until VACUUM has been
// the index keeps an entry for each row that left: after 100,000 jobs,
// 200,000 dead entries. A bitmap scan, the plan PostgreSQL picks for a
// few expected rows, visits each of their heap pages on every look (35
// ms, four times a second, on an idle broker: 14% of a core of the
// database's; measured with autovacuum off, which delays VACUUM as
// a busy table does). An index scan in order stops at its LIMIT and marks
// the dead entries it passes, so that the next scan skips them.
const pgScanPlan = `SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true)`

// sendPlanned sends query after pgScanPlan in one batch, one round trip,
// and answers the batch at query's result (the caller closes it). The
// batch's statements share one Sync, so outside a transaction they run as
// one implicit transaction, which set_config(..., true) lasts through.
func sendPlanned(ctx context.Context, s interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, query string, args ...any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.Queue(pgScanPlan)
	b.Queue(query, args...)
	br := s.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, fmt.Errorf("scan plan: %w", err)
	}
	return br, nil
}
