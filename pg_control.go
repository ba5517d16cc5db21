package main

// The PostgreSQL engine's moves by hand (ControlEngine), as control.go
// answers them in memory. A move of one job locks its row and carries out
// what JobMove.plan decides on what the row says, as the memory engine
// does under its shard lock; a move that makes jobs ready wakes the
// brokers' waiting pulls in the same transaction.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

func (p *PG) MoveJob(ctx context.Context, id string, m JobMove) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var told func()
	moved := false // an active job moved out of active
	err := p.inTx(ctx, func(tx pgx.Tx) error {
		locked, err := p.lockRows(ctx, tx, []string{id})
		if err != nil {
			return pgErr(fmt.Errorf("lock job %s: %w", id, err))
		}
		l := locked[id]
		if l == nil {
			return m.notFound()
		}
		j, now := l.j, p.now()
		j.state = j.stateAt(now)
		step, err := m.plan(j, now)
		if err != nil {
			return err
		}
		moved = l.j.state == StateActive && step != stepKeep && step != stepData
		told, err = p.moveJob(ctx, tx, j, m, step, now)
		return err
	})
	if err != nil {
		return err
	}
	if moved {
		// No longer active under its lock: a renewal of it is refused
		// without asking the database (pg_renew.go).
		p.unhold(id)
	}
	if told != nil {
		told()
	}
	return nil
}

// moveJob carries out a planned move on a locked job's row. It answers
// what tells of the move, to run once committed (nil: nothing to tell).
func (p *PG) moveJob(ctx context.Context, tx pgx.Tx, j *Job, m JobMove, step moveStep, now int64) (func(), error) {
	active := j.state == StateActive
	var err error
	switch step {
	case stepKeep:
		return nil, nil
	case stepRemove:
		if err := p.deleteIDs(ctx, tx, []string{j.ID()}); err != nil {
			return nil, pgErr(fmt.Errorf("move job %s: %w", j.ID(), err))
		}
		return func() { p.emit(j.Queue, evRemoved, j, now, evArgs{prev: "waiting"}) }, nil
	case stepDLQ:
		if err = p.discard(ctx, tx, j, m.Token, now); err == nil {
			return func() { p.deadLettered(j) }, nil
		}
	case stepQueue:
		if active {
			if err := pgTakeActive(j, m.Token); err != nil {
				return nil, err
			}
		}
		m.place(j, now)
		pgEnqueue(j, now)
		// A job with earlier attempts keeps its token, as in memory.
		if err = p.saveMoved(ctx, tx, j, active && j.Attempts == 0, nil); err == nil && active {
			ev, a := m.activeEvent()
			return func() { p.emit(j.Queue, ev, j, now, a) }, nil
		}
	case stepRetry:
		err = p.retryFailed(ctx, tx, j, now)
	case stepData:
		err = p.setData(ctx, tx, j, m.Data)
	}
	return nil, err
}

// discard dead-letters a locked job (Discard), its attempt recorded.
func (p *PG) discard(ctx context.Context, tx pgx.Tx, j *Job, token string, now int64) error {
	if j.state == StateActive {
		// The attempt the DLQ records is the one the move ended.
		startedAt := j.StartedAt()
		if err := pgTakeActive(j, token); err != nil {
			return err
		}
		j.setStartedAt(startedAt)
	}
	set, err := p.settings(ctx, tx, []string{j.Queue})
	if err != nil {
		return pgErr(err)
	}
	cfg := set[j.Queue].dlqConfig()
	j.recordAttempt(j.StartedAt(), now, "unknown", "", false)
	pgDeadLetter(j, "unknown", "", false, cfg, now)
	return p.saveMoved(ctx, tx, j, true, &cfg)
}

// retryFailed puts a dead-lettered job back to waiting (MoveToWait),
// unless a live job took its unique key meanwhile.
func (p *PG) retryFailed(ctx context.Context, tx pgx.Tx, j *Job, now int64) error {
	held, err := p.uniqueHeld(ctx, tx, j)
	if err != nil {
		return pgErr(err)
	}
	if held {
		return errNoDLQ
	}
	resetDLQ(j, false, now)
	pgEnqueue(j, now)
	return p.saveMoved(ctx, tx, j, false, nil)
}

// setData replaces a locked job's data (Update). Only the record is
// written: an active job's lease and deadline stay as they are.
func (p *PG) setData(ctx context.Context, tx pgx.Tx, j *Job, data Raw) error {
	nd, err := mergeFlowMeta(j.Data, data)
	if err != nil {
		return err
	}
	if err := setJobData(j, nd); err != nil {
		return err
	}
	if err := p.saveRecord(ctx, tx, j); err != nil {
		return pgErr(fmt.Errorf("update job %s: %w", j.ID(), err))
	}
	return nil
}

// saveMoved writes a moved job's row. forget drops the lease token from
// the row, so that a late ACK or FAIL of the attempt the move ended is
// refused, as the memory engine refuses it for a job that has no earlier
// attempt (or that is dead). dlq is the policy of the DLQ the job entered,
// to trim it by. A job made ready wakes the pulls waiting on its queue.
func (p *PG) saveMoved(ctx context.Context, tx pgx.Tx, j *Job, forget bool, dlq *DLQConfig) error {
	err := p.saveJobs(ctx, tx, []*Job{j}, nil)
	if err == nil && forget {
		_, err = tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET lease_token = NULL WHERE id = $1`), j.ID())
	}
	if err == nil && dlq != nil {
		err = p.trimDLQ(ctx, tx, j.Queue, *dlq)
	}
	if err == nil && (j.state == StateWaiting || j.state == StatePrioritized) {
		err = p.notify(ctx, tx, j.Queue)
	}
	if err != nil {
		return pgErr(fmt.Errorf("move job %s: %w", j.ID(), err))
	}
	return nil
}

// pgTakeActive ends an active job's lease for a move by hand, after the
// same token check as ACK.
func pgTakeActive(j *Job, token string) error {
	if err := checkLease(j, token); err != nil {
		return err
	}
	j.setLease(nil)
	j.setStartedAt(0)
	return nil
}

// pgEnqueue sets a job that waits on nothing to delayed or ready by its
// run time.
func pgEnqueue(j *Job, now int64) {
	j.state = j.queuedState(now)
}

// ---------------------------------------------------------------------------
// A queue's jobs

// lockJobs runs query, which locks job rows and answers their records,
// and decodes the jobs.
func (p *PG) lockJobs(ctx context.Context, tx pgx.Tx, query string, args ...any) ([]*Job, error) {
	rows, err := tx.Query(ctx, p.sql(query), args...)
	if err != nil {
		return nil, err
	}
	return scanJobs(rows)
}

// requeue saves jobs of a queue made ready and wakes the pulls waiting
// on it.
func (p *PG) requeue(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job) error {
	if len(jobs) == 0 {
		return nil
	}
	if err := p.saveJobs(ctx, tx, jobs, nil); err != nil {
		return err
	}
	return p.notify(ctx, tx, queue)
}

func (p *PG) PromoteJobs(ctx context.Context, queue string, limit int) (int64, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var n int
	err := p.inTx(ctx, func(tx pgx.Tx) error {
		now := p.now()
		jobs, err := p.lockJobs(ctx, tx, `SELECT `+pgJobCols+` FROM {s}.jobs WHERE queue = $1 AND state = {queued} AND run_at > $2
			ORDER BY created_at, id LIMIT $3 FOR UPDATE`, queue, now, limit)
		if err != nil {
			return pgErr(fmt.Errorf("promote jobs of %s: %w", queue, err))
		}
		for _, j := range jobs {
			j.RunAt = now
			pgEnqueue(j, now)
		}
		n = len(jobs)
		return pgErr(p.requeue(ctx, tx, queue, jobs))
	})
	return int64(n), err
}

// pgCleanWhere are the rows Clean takes by state asked for, oldest first
// ($2 is the cutoff): every queued job whatever queued state was asked,
// as the reference does.
var pgCleanWhere = map[string]string{
	"":            "state = {queued} AND created_at <= $2 ORDER BY created_at, id",
	"waiting":     "state = {queued} AND created_at <= $2 ORDER BY created_at, id",
	"delayed":     "state = {queued} AND created_at <= $2 ORDER BY created_at, id",
	"prioritized": "state = {queued} AND created_at <= $2 ORDER BY created_at, id",
	"paused":      "state = {queued} AND created_at <= $2 ORDER BY created_at, id",
	"completed":   "state = {done} AND done_at <= $2 ORDER BY done_at, id",
	"failed":      "state = {dlq} AND dlq_at <= $2 ORDER BY dlq_at, seq",
}

func (p *PG) Clean(ctx context.Context, a cleanArgs) ([]string, error) {
	where, ok := pgCleanWhere[a.state]
	if !ok || a.none() {
		return nil, nil
	}
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var ids []string
	err := p.inTx(ctx, func(tx pgx.Tx) error {
		// Rows a claim holds are skipped: they are becoming active.
		rows, err := tx.Query(ctx, p.sql(`SELECT id FROM {s}.jobs WHERE queue = $1 AND `+where+` LIMIT $3 FOR UPDATE SKIP LOCKED`),
			a.queue, a.cutoff(p.now()), a.limit)
		if err == nil {
			ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err == nil && len(ids) > 0 {
			err = p.deleteIDs(ctx, tx, ids)
		}
		if err != nil {
			return pgErr(fmt.Errorf("clean %s: %w", a.queue, err))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

func (p *PG) RetryCompleted(ctx context.Context, a retryCompletedArgs) (int64, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	query := `SELECT ` + pgJobCols + ` FROM {s}.jobs WHERE queue = $1 AND state = {done} ORDER BY done_at, seq FOR UPDATE`
	args := []any{a.queue}
	if a.id != "" {
		query = `SELECT ` + pgJobCols + ` FROM {s}.jobs WHERE queue = $1 AND state = {done} AND id = $2 FOR UPDATE`
		args = append(args, a.id)
	}
	var n int
	err := p.inTx(ctx, func(tx pgx.Tx) error {
		jobs, err := p.lockJobs(ctx, tx, query, args...)
		if err == nil {
			n, err = p.requeueCompleted(ctx, tx, a, jobs)
		}
		if err != nil {
			return pgErr(fmt.Errorf("retry completed jobs of %s: %w", a.queue, err))
		}
		return nil
	})
	return int64(n), err
}

// requeueCompleted puts the completed jobs a RetryCompleted takes back to
// waiting, but for those whose unique key a live job took meanwhile, and
// answers how many went.
func (p *PG) requeueCompleted(ctx context.Context, tx pgx.Tx, a retryCompletedArgs, jobs []*Job) (int, error) {
	now := p.now()
	limit := a.limit()
	var save []*Job
	for _, j := range jobs {
		if a.id == "" {
			if float64(len(save)) >= limit {
				break
			}
			if !a.takes(j.DoneAt()) {
				continue
			}
		}
		held, err := p.uniqueHeld(ctx, tx, j)
		if err != nil {
			return 0, err
		}
		if held {
			continue
		}
		resetCompleted(j, now)
		pgEnqueue(j, now)
		save = append(save, j)
	}
	return len(save), p.requeue(ctx, tx, a.queue, save)
}
