package main

// The PostgreSQL engine's queue operations (QueueEngine), as queue.go
// answers them in memory.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

func (p *PG) SetPaused(ctx context.Context, queue string, paused bool) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	err := p.inTx(ctx, func(tx pgx.Tx) error {
		var made bool
		if err := tx.QueryRow(ctx, p.sql(`INSERT INTO {s}.queues (name, paused) VALUES ($1, $2)
			ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused RETURNING (xmax = 0)`), queue, paused).Scan(&made); err != nil {
			return pgErr(fmt.Errorf("pause %s: %w", queue, err))
		}
		if made {
			if err := p.queueMade(ctx, tx, queue); err != nil {
				return pgRefusedOr(err)
			}
			if err := p.queueCreated(ctx, tx, queue); err != nil {
				return pgErr(err)
			}
		}
		if !paused {
			return pgErr(p.notify(ctx, tx, queue))
		}
		return nil
	})
	if err != nil {
		return err
	}
	ev := evResumed
	if paused {
		ev = evPaused
	}
	p.emit(queue, ev, nil, p.now(), evArgs{})
	return nil
}

func (p *PG) IsPaused(ctx context.Context, queue string) (bool, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var paused bool
	err := p.pool.QueryRow(ctx, p.sql(`SELECT COALESCE((SELECT paused FROM {s}.queues WHERE name = $1), false)`), queue).Scan(&paused)
	return paused, pgErr(err)
}

// pgDeleteJobsSQL deletes the jobs of queue $1 matching where, and their
// logs, and counts them.
func pgDeleteJobsSQL(where string) string {
	return `WITH gone AS (DELETE FROM {s}.jobs WHERE queue = $1 AND (` + where + `) RETURNING id),
		logs AS (DELETE FROM {s}.job_logs WHERE job_id IN (SELECT id FROM gone))
		SELECT count(*) FROM gone`
}

// deleteJobs deletes a queue's jobs matching where, and their logs, and
// answers how many jobs went.
func (p *PG) deleteJobs(ctx context.Context, queue, where string) (int64, error) {
	var n int64
	err := p.pool.QueryRow(ctx, p.sql(pgDeleteJobsSQL(where)), queue).Scan(&n)
	if err != nil {
		return 0, pgErr(fmt.Errorf("delete jobs of %s: %w", queue, err))
	}
	return n, nil
}

func (p *PG) Drain(ctx context.Context, queue string) (int64, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.deleteJobs(ctx, queue, "state = {queued}")
}

func (p *PG) Obliterate(ctx context.Context, queue string) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	// With the rows set aside (pg_unreadable.go), which no other query takes.
	if _, err := p.deleteJobs(ctx, queue, pgAnyState+` OR state = {setaside}`); err != nil {
		return err
	}
	if _, err := p.pool.Exec(ctx, p.sql(`DELETE FROM {s}.queues WHERE name = $1`), queue); err != nil {
		return pgErr(err)
	}
	_, err := p.pool.Exec(ctx, p.sql(`DELETE FROM {s}.groups WHERE queue = $1`), queue)
	return pgErr(err)
}

func (p *PG) ListQueues(ctx context.Context) ([]string, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	rows, err := p.pool.Query(ctx, p.sql(`SELECT name FROM {s}.queues ORDER BY created`))
	if err != nil {
		return nil, pgErr(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return names, pgErr(err)
}
