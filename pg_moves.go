package main

// What is left here is not the moves' (they are in pg_control.go): the
// PostgreSQL twins of the dashboard, until their domain moves them onto
// the engine, and the count by priority they share with the reads
// (PG.CountsPerPriority, pg_query.go).

import (
	"context"
	"fmt"
)

// ---------------------------------------------------------------------------
// Reading

// countsPerPriority counts a queue's waiting and delayed jobs by priority.
func (p *PG) countsPerPriority(ctx context.Context, q pgQuerier, queue string) (map[int64]int, error) {
	rows, err := q.Query(ctx, p.sql(`SELECT priority, count(*) FROM {s}.jobs WHERE queue = $1 AND state = 1 GROUP BY priority`), queue)
	if err != nil {
		return nil, pgErr(fmt.Errorf("count jobs by priority: %w", err))
	}
	defer rows.Close()
	per := map[int64]int{}
	for rows.Next() {
		var prio, n int64
		if err := rows.Scan(&prio, &n); err != nil {
			return nil, pgErr(err)
		}
		per[prio] = int(n)
	}
	return per, pgErr(rows.Err())
}

// ---------------------------------------------------------------------------
// The dashboard: job figures from the database, so that every broker
// shows the same; throughput, latency, memory, workers and connections
// are this broker's, as in the other engines.

func pgDashboardOverview(r *Req) error {
	p, srv := r.c.srv.pg, r.c.srv
	ctx, cancel := pgCtx(r)
	defer cancel()
	tx, err := p.snapshot(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	var t Totals
	var c collectionSizes
	err = tx.QueryRow(ctx, p.sql(`SELECT
			count(*) FILTER (WHERE j.state = 1 AND j.run_at <= $1 AND j.priority <= 0),
			count(*) FILTER (WHERE j.state = 1 AND j.run_at <= $1 AND j.priority > 0),
			count(*) FILTER (WHERE j.state = 1 AND j.run_at > $1),
			count(*) FILTER (WHERE j.state = 4),
			count(*) FILTER (WHERE j.state = 6),
			count(*) FILTER (WHERE j.state = 5),
			count(*) FILTER (WHERE j.state = 1 AND j.run_at <= $1 AND q.paused),
			count(*),
			count(*) FILTER (WHERE j.result IS NOT NULL),
			count(*) FILTER (WHERE j.state = 4 AND j.lease_owner IS NOT NULL),
			(SELECT count(*) FROM {s}.queues),
			(SELECT count(*) FROM {s}.job_logs)
		FROM {s}.jobs j LEFT JOIN {s}.queues q ON q.name = j.queue`), p.now()).Scan(&t.Waiting, &t.Prioritized,
		&t.Delayed, &t.Active, &t.DLQ, &t.Completed, &t.Paused, &c.jobIndex, &c.results, &c.locks, &t.Queues, &c.logs)
	if err != nil {
		return pgErr(fmt.Errorf("dashboard figures: %w", err))
	}
	crons, err := p.crons(ctx, tx)
	if err != nil {
		return err
	}
	c.clients, c.clientJobs = srv.heldJobs()
	writeDashboardOverview(r, t, c, crons)
	return nil
}

func pgDashboardQueues(r *Req) error {
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	rows, err := p.pool.Query(ctx, p.sql(`SELECT q.name, q.created, q.paused,
			count(j.id) FILTER (WHERE j.state = 1 AND j.run_at <= $1 AND j.priority <= 0),
			count(j.id) FILTER (WHERE j.state = 1 AND j.run_at <= $1 AND j.priority > 0),
			count(j.id) FILTER (WHERE j.state = 1 AND j.run_at > $1),
			count(j.id) FILTER (WHERE j.state = 4),
			count(j.id) FILTER (WHERE j.state = 6),
			count(j.id) FILTER (WHERE j.state = 5)
		FROM {s}.queues q LEFT JOIN {s}.jobs j ON j.queue = q.name
		GROUP BY q.name, q.created, q.paused ORDER BY q.created`), p.now())
	if err != nil {
		return pgErr(fmt.Errorf("dashboard queues: %w", err))
	}
	defer rows.Close()
	var qs []queueSnap
	for rows.Next() {
		var s queueSnap
		if err := rows.Scan(&s.name, &s.created, &s.paused, &s.waiting, &s.prioritized, &s.delayed, &s.active,
			&s.dlq, &s.done); err != nil {
			return pgErr(fmt.Errorf("dashboard queues: %w", err))
		}
		qs = append(qs, s)
	}
	if err := rows.Err(); err != nil {
		return pgErr(fmt.Errorf("dashboard queues: %w", err))
	}
	writeDashboardQueues(r, qs)
	return nil
}

func pgDashboardQueue(r *Req) error {
	a, err := readDashboardQueue(r)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	tx, err := p.snapshot(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	now := p.now()
	var d dashQueue
	if d.counts, d.paused, err = p.countsTx(ctx, tx, a.queue, now); err != nil {
		return err
	}
	if d.perPrio, err = p.countsPerPriority(ctx, tx, a.queue); err != nil {
		return err
	}
	d.prioKeys = priorityKeys(d.perPrio)
	list := func(where string, args ...any) ([]*Job, error) {
		rows, err := tx.Query(ctx, p.sql(`SELECT record FROM {s}.jobs WHERE queue = $1 AND `+where), append([]any{a.queue}, args...)...)
		if err != nil {
			return nil, pgErr(fmt.Errorf("dashboard jobs: %w", err))
		}
		jobs, err := scanJobs(rows)
		return jobs, pgErr(err)
	}
	if d.dlq, err = list(`state = 6 ORDER BY dlq_at, seq LIMIT $2`, dashDLQPreview); err != nil {
		return err
	}
	if a.withJobs {
		if d.ready, err = list(`state = 1 AND run_at <= $2 ORDER BY priority DESC, sort_key, seq LIMIT $3`, now, a.limit); err != nil {
			return err
		}
		active, err := list(`state = 4`)
		if err != nil {
			return err
		}
		d.active = firstK(a.limit, func(yield func(*Job)) {
			for _, j := range active {
				yield(j)
			}
		}, byStart)
		if d.delayed, err = list(`state = 1 AND run_at > $2 ORDER BY run_at, seq LIMIT $3`, now, a.limit); err != nil {
			return err
		}
	}
	writeDashboardQueue(r, a, d, now)
	return nil
}
