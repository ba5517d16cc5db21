package main

// Claiming and reading job rows in PostgreSQL mode: what claims
// (pg_jobs.go, pg_groups.go) and the other operations share.

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
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
