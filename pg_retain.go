package main

// Completed-job retention in PostgreSQL mode. As the reference keeps
// completed jobs in storage, the namespace keeps every completed job,
// unless --completed-retention-ms is set: completed jobs older than that
// go, with their results and logs, and cleanup:completed-removed says how
// many. (Failed jobs are bounded per queue by the DLQ's maxEntries,
// pg_dlq.go, as in memory mode; jobs that complete with removeOnComplete
// are not kept at all. Tests can bound the count, keepCompleted: past it
// the oldest go, down to nine tenths of the bound.)
//
// One broker of the namespace looks at a time, whichever comes first: the
// chore's row says when the next look is due, and the broker whose UPDATE
// moves it on looks. It deletes in batches of pgRetainBatch rows, each its
// own short transaction, taking its rows FOR UPDATE SKIP LOCKED, so that
// no command waits on the trim for long and the trim waits on no command.
// A trim that runs long keeps moving the due time on, so that no other
// broker starts the same work meanwhile; one whose broker dies is due
// again within pgRetainEvery.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// pgRetainEvery is how often the namespace's completed jobs are
	// counted (by one broker).
	pgRetainEvery = 2 * time.Second
	// pgRetainBatch is how many completed jobs one transaction deletes.
	pgRetainBatch = 1000
)

// retainRound is one round of the retention and group chores (every
// pgRetainEvery). A chore may take many batches, each a transaction under
// a deadline of its own (from p.stopCtx, so that Close ends it), and so
// runs past the round's deadline.
func (p *PG) retainRound(context.Context) {
	if _, err := p.retainOnce(); err != nil && !p.closing() {
		// The next look tries again; a lost database is reported by the
		// reaper and the listener.
		p.log.Warn("completed-job retention", "err", err)
	}
	if _, err := p.reapGroupsOnce(); err != nil && !p.closing() {
		p.log.Warn("forgetting idle groups", "err", err)
	}
}

// takeChore moves a chore's due time hold past now if it is due, and
// answers whether this broker did so (and so does the chore now).
func (p *PG) takeChore(ctx context.Context, name string, hold time.Duration) (bool, error) {
	now := p.now()
	tag, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.chores SET due = $2 WHERE name = $1 AND due <= $3`),
		name, now+hold.Milliseconds(), now)
	if err != nil {
		return false, fmt.Errorf("take chore %s: %w", name, err)
	}
	return tag.RowsAffected() == 1, nil
}

// holdChore keeps a chore this broker's for hold more.
func (p *PG) holdChore(ctx context.Context, name string, hold time.Duration) error {
	_, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.chores SET due = $2 WHERE name = $1`), name, p.now()+hold.Milliseconds())
	return err
}

// retainOnce trims the namespace's completed jobs if they are over the
// bound and the chore is this broker's, and answers how many went.
func (p *PG) retainOnce() (int, error) {
	if p.keepCompleted <= 0 && p.retention == nil {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(p.stopCtx, 10*time.Second)
	defer cancel()
	mine, err := p.takeChore(ctx, "retain", pgRetainEvery)
	if err != nil || !mine {
		return 0, err
	}
	removed := 0
	if p.keepCompleted > 0 {
		n, err := p.retainCount(ctx)
		removed += n
		if err != nil {
			return removed, err
		}
	}
	if p.retention != nil {
		n, err := p.retainUpTo(p.now()-*p.retention, math.MaxInt64)
		removed += n
		if err != nil {
			return removed, err
		}
	}
	if removed > 0 && p.b != nil {
		p.b.announce(newNote("cleanup:completed-removed").num("count", float64(removed)))
	}
	return removed, nil
}

// retainCount trims the completed jobs to nine tenths of keepCompleted
// when there are more.
func (p *PG) retainCount(ctx context.Context) (int, error) {
	keep := p.keepCompleted
	// Over the bound when a completed job comes after the newest keep.
	var at, seq int64
	find := p.sql(pgRetainNthSQL)
	if err := p.pool.QueryRow(ctx, find, keep).Scan(&at, &seq); errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("count completed jobs: %w", err)
	}
	// The newest of those that go.
	if err := p.pool.QueryRow(ctx, find, keep-keep/10).Scan(&at, &seq); err != nil {
		return 0, fmt.Errorf("find the oldest completed jobs: %w", err)
	}
	removed, err := p.retainUpTo(at, seq)
	p.log.Debug("completed jobs trimmed", "removed", removed, "bound", keep)
	return removed, err
}

// pgRetainNthSQL finds the completed job that comes after the newest $1
// of the namespace: the completed rows are indexed by queue (jobs_done),
// so the newest $1 + 1 of each queue are merged.
const pgRetainNthSQL = `WITH RECURSIVE ` + pgDoneQueues + `
	SELECT x.done_at, x.seq FROM qs CROSS JOIN LATERAL (
		SELECT done_at, seq FROM {s}.jobs WHERE queue = qs.queue AND state = {done} AND done_at IS NOT NULL
		ORDER BY done_at DESC, seq DESC LIMIT $1 + 1) AS x
	WHERE qs.queue IS NOT NULL
	ORDER BY x.done_at DESC, x.seq DESC OFFSET $1 LIMIT 1`

// pgDoneQueuesSQL lists the queues that have completed jobs that
// completed no later than ($1, $2): one statement, with an index probe a
// queue, so that a round with nothing to delete sends no more.
const pgDoneQueuesSQL = `WITH RECURSIVE ` + pgDoneQueues + ` SELECT queue FROM qs WHERE queue IS NOT NULL
	AND EXISTS (SELECT 1 FROM {s}.jobs WHERE queue = qs.queue AND state = {done} AND (done_at, seq) <= ($1, $2))`

// pgDoneQueues is the recursive CTE qs of the queues that have completed
// jobs, each found from the last in jobs_done (a skip scan); it ends with
// a NULL row.
const pgDoneQueues = `qs(queue) AS (
		(SELECT queue FROM {s}.jobs WHERE state = {done} ORDER BY queue LIMIT 1)
		UNION ALL
		SELECT (SELECT j.queue FROM {s}.jobs AS j WHERE j.state = {done} AND j.queue > qs.queue ORDER BY j.queue LIMIT 1)
		FROM qs WHERE qs.queue IS NOT NULL)`

// retainUpTo deletes the completed jobs that completed no later than
// (at, seq), queue by queue (in the order of their names, each oldest
// first) and a batch at a time, holding the chore meanwhile.
func (p *PG) retainUpTo(at, seq int64) (int, error) {
	ctx, cancel := context.WithTimeout(p.stopCtx, 10*time.Second)
	rows, err := p.pool.Query(ctx, p.sql(pgDoneQueuesSQL), at, seq)
	var queues []string
	if err == nil {
		queues, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	cancel()
	if err != nil {
		return 0, fmt.Errorf("list the queues with completed jobs: %w", err)
	}
	removed := 0
	held := time.Now()
	for _, queue := range queues {
		for !p.closing() {
			n, err := p.retainBatch(queue, at, seq)
			removed += n
			if err != nil {
				return removed, err
			}
			// Held on while there is more of this queue, or many queues
			// have taken a while.
			if n == pgRetainBatch || time.Since(held) > pgRetainEvery/2 {
				hctx, hcancel := context.WithTimeout(p.stopCtx, 10*time.Second)
				err = p.holdChore(hctx, "retain", pgRetainEvery)
				hcancel()
				if err != nil {
					return removed, fmt.Errorf("hold chore retain: %w", err)
				}
				held = time.Now()
			}
			if n < pgRetainBatch {
				break
			}
		}
	}
	return removed, nil
}

// pgRetainBatchSQL deletes up to $3 of queue $4's completed jobs that
// completed no later than ($1, $2), oldest first, with their logs. =
// ANY(ARRAY(...)): the rows are found by their key, where IN lets the
// planner join against the whole table.
const pgRetainBatchSQL = `WITH gone AS (
		DELETE FROM {s}.jobs WHERE id = ANY(ARRAY(
			SELECT id FROM {s}.jobs WHERE queue = $4 AND state = {done} AND (done_at, seq) <= ($1, $2)
			ORDER BY done_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED))
		AND state = {done} RETURNING id),
	logs AS (DELETE FROM {s}.job_logs WHERE job_id = ANY(ARRAY(SELECT id FROM gone)))
	SELECT count(*) FROM gone`

// retainBatch deletes up to pgRetainBatch of a queue's completed jobs
// that completed no later than (at, seq), oldest first, with their logs.
func (p *PG) retainBatch(queue string, at, seq int64) (int, error) {
	ctx, cancel := context.WithTimeout(p.stopCtx, 10*time.Second)
	defer cancel()
	var n int
	err := p.pool.QueryRow(ctx, p.sql(pgRetainBatchSQL), at, seq, pgRetainBatch, queue).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("delete the oldest completed jobs of %s: %w", queue, err)
	}
	return n, nil
}
