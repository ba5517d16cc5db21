package main

// Claiming and reading job rows in PostgreSQL mode: what claims
// (pg_jobs.go, pg_groups.go) and the other operations share.

import (
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
const (
	pgClaimPlan = `SET LOCAL enable_sort = off`
	pgClaimSQL  = `SELECT record FROM {s}.jobs
		WHERE queue = $1 AND state = 1 AND run_at <= $2 AND group_id IS NULL
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
	pgClaimFastSQL = `SELECT record FROM {s}.jobs
		WHERE queue = $1 AND state = 1 AND run_at <= $2 AND group_id IS NULL
			AND NOT EXISTS (SELECT 1 FROM {s}.queues q WHERE q.name = $1
				AND (q.paused OR q.grouped OR q.rate_max IS NOT NULL OR q.conc_limit IS NOT NULL))
		ORDER BY priority DESC, sort_key, seq LIMIT $3 FOR UPDATE SKIP LOCKED`
)

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
	err := br.QueryRow().Scan(&l.paused, &l.rateMax, &l.rateDur, &l.rateTokens, &l.rateAt, &l.rateExpires, &l.rateCount, &l.conc,
		&l.grouped, &s.stallEnabled, &s.stallInterval, &s.stallGrace, &s.stallMax, &s.dlqAuto, &s.dlqInterval,
		&s.dlqMaxAge, &s.dlqMaxRetries, &s.dlqMaxEntries)
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

// scanJobs decodes rows of one column, the job record.
//
// A record is read where the driver holds it (DriverBytes, valid until the
// next row) and decoded at once: decoding copies what it keeps, so a copy
// of every record would be garbage. One recLast for the rows shares their
// queue and name strings.
func scanJobs(rows pgx.Rows) ([]*Job, error) {
	defer rows.Close()
	var jobs []*Job
	var last recLast
	var rec pgtype.DriverBytes
	for rows.Next() {
		if err := rows.Scan(&rec); err != nil {
			return nil, err
		}
		j, err := last.decode(rec)
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
	var last recLast
	var rec pgtype.DriverBytes // as in scanJobs
	for rows.Next() {
		var tok, owner *string
		var ttl, exp *int64
		var waited bool
		if err := rows.Scan(&rec, &tok, &owner, &ttl, &exp, &waited); err != nil {
			return nil, err
		}
		j, err := last.decode(rec)
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
