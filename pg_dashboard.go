package main

// The PostgreSQL engine's dashboard figures (DashboardEngine), as
// dashboard.go answers them in memory: from the database, so that every
// broker shows the same.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// totals counts the namespace's jobs as the memory engine's totals do;
// with sizes, in the same pass, the collection sizes of the overview.
func (p *PG) totals(ctx context.Context, q pgQuerier, sizes *collectionSizes) (Totals, error) {
	var t Totals
	dst := []any{&t.Waiting, &t.Prioritized, &t.Delayed, &t.Active, &t.DLQ, &t.Completed, &t.Paused, &t.WaitingChildren, &t.Queues}
	sql := `SELECT
			count(*) FILTER (WHERE j.state = {queued} AND j.run_at <= $1 AND j.priority <= 0),
			count(*) FILTER (WHERE j.state = {queued} AND j.run_at <= $1 AND j.priority > 0),
			count(*) FILTER (WHERE j.state = {queued} AND j.run_at > $1),
			count(*) FILTER (WHERE j.state = {active}),
			count(*) FILTER (WHERE j.state = {dlq}),
			count(*) FILTER (WHERE j.state = {done}),
			count(*) FILTER (WHERE j.state = {queued} AND j.run_at <= $1 AND q.paused),
			count(*) FILTER (WHERE j.state = {children}),
			(SELECT count(*) FROM {s}.queues)`
	if sizes != nil {
		sql += `,
			count(*),
			count(*) FILTER (WHERE j.result IS NOT NULL),
			count(*) FILTER (WHERE j.state = {active} AND j.lease_owner IS NOT NULL),
			(SELECT count(*) FROM {s}.job_logs)`
		dst = append(dst, &sizes.jobIndex, &sizes.results, &sizes.locks, &sizes.logs)
	}
	sql += `
		FROM {s}.jobs j LEFT JOIN {s}.queues q ON q.name = j.queue`
	if err := q.QueryRow(ctx, p.sql(sql), p.now()).Scan(dst...); err != nil {
		return Totals{}, pgErr(fmt.Errorf("job figures: %w", err))
	}
	return t, nil
}

func (p *PG) Totals(ctx context.Context) (Totals, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.totals(ctx, p.pool, nil)
}

func (p *PG) DashboardOverview(ctx context.Context) (dashOverview, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	tx, err := p.snapshot(ctx)
	if err != nil {
		return dashOverview{}, err
	}
	defer tx.Rollback(context.Background())
	var o dashOverview
	if o.totals, err = p.totals(ctx, tx, &o.sizes); err != nil {
		return dashOverview{}, err
	}
	if o.crons, err = p.crons(ctx, tx); err != nil {
		return dashOverview{}, err
	}
	return o, nil
}

func (p *PG) DashboardQueues(ctx context.Context) ([]queueSnap, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	rows, err := p.pool.Query(ctx, p.sql(`SELECT q.name, q.created, q.paused,
			count(j.id) FILTER (WHERE j.state = {queued} AND j.run_at <= $1 AND j.priority <= 0),
			count(j.id) FILTER (WHERE j.state = {queued} AND j.run_at <= $1 AND j.priority > 0),
			count(j.id) FILTER (WHERE j.state = {queued} AND j.run_at > $1),
			count(j.id) FILTER (WHERE j.state = {active}),
			count(j.id) FILTER (WHERE j.state = {dlq}),
			count(j.id) FILTER (WHERE j.state = {done})
		FROM {s}.queues q LEFT JOIN {s}.jobs j ON j.queue = q.name
		GROUP BY q.name, q.created, q.paused ORDER BY q.created`), p.now())
	if err != nil {
		return nil, pgErr(fmt.Errorf("dashboard queues: %w", err))
	}
	defer rows.Close()
	var qs []queueSnap
	for rows.Next() {
		var s queueSnap
		if err := rows.Scan(&s.name, &s.created, &s.paused, &s.waiting, &s.prioritized, &s.delayed, &s.active,
			&s.dlq, &s.done); err != nil {
			return nil, pgErr(fmt.Errorf("dashboard queues: %w", err))
		}
		qs = append(qs, s)
	}
	if err := rows.Err(); err != nil {
		return nil, pgErr(fmt.Errorf("dashboard queues: %w", err))
	}
	return qs, nil
}

func (p *PG) DashboardQueue(ctx context.Context, a dashQueueArgs) (dashQueue, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	tx, err := p.snapshot(ctx)
	if err != nil {
		return dashQueue{}, err
	}
	defer tx.Rollback(context.Background())
	d := dashQueue{at: p.now()}
	if d.counts, d.paused, err = p.countsTx(ctx, tx, a.queue, d.at); err != nil {
		return dashQueue{}, err
	}
	if d.perPrio, err = p.countsPerPriority(ctx, tx, a.queue); err != nil {
		return dashQueue{}, err
	}
	d.prioKeys = priorityKeys(d.perPrio)
	if d.dlq, err = p.dashList(ctx, tx, a.queue, `state = {dlq} ORDER BY dlq_at, seq LIMIT $2`, dashDLQPreview); err != nil {
		return dashQueue{}, err
	}
	if a.withJobs {
		if err := p.dashJobs(ctx, tx, a, &d); err != nil {
			return dashQueue{}, err
		}
	}
	return d, nil
}

// dashJobs lists the first a.limit of the queue's ready, active and
// delayed jobs into d, in the memory engine's orders.
func (p *PG) dashJobs(ctx context.Context, tx pgx.Tx, a dashQueueArgs, d *dashQueue) error {
	var err error
	if d.ready, err = p.dashList(ctx, tx, a.queue, `state = {queued} AND run_at <= $2 ORDER BY priority DESC, sort_key, seq LIMIT $3`,
		d.at, a.limit); err != nil {
		return err
	}
	active, err := p.dashList(ctx, tx, a.queue, `state = {active}`)
	if err != nil {
		return err
	}
	// By start, which the rows do not index: ordered as the memory engine
	// orders them.
	d.active = firstK(a.limit, func(yield func(*Job)) {
		for _, j := range active {
			yield(j)
		}
	}, byStart)
	d.delayed, err = p.dashList(ctx, tx, a.queue, `state = {queued} AND run_at > $2 ORDER BY run_at, seq LIMIT $3`, d.at, a.limit)
	return err
}

// dashList reads a queue's jobs matching where ($1 is the queue, args
// are $2 on).
func (p *PG) dashList(ctx context.Context, tx pgx.Tx, queue, where string, args ...any) ([]*Job, error) {
	rows, err := tx.Query(ctx, p.sql(`SELECT `+pgJobCols+` FROM {s}.jobs WHERE queue = $1 AND `+where), append([]any{queue}, args...)...)
	if err != nil {
		return nil, pgErr(fmt.Errorf("dashboard jobs: %w", err))
	}
	jobs, err := scanJobs(rows)
	return jobs, pgErr(err)
}

// CompactMemory has nothing to compact: PostgreSQL mode keeps no jobs in
// this process's structures.
func (p *PG) CompactMemory(context.Context) error { return nil }
