package main

// Moving jobs by hand, Clean and RetryCompleted in PostgreSQL mode. Each
// move locks the job's row and decides on what the row says, as the
// memory engine decides under its shard lock; a move that makes a job
// ready wakes the brokers' waiting pulls in the same transaction.

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
)

// pgMove is what a move by hand does to the locked job.
type pgMove struct {
	save   bool // write the job's row
	remove bool // delete the job and its logs
	// forget drops the lease token from the row, so that a late ACK or
	// FAIL of the attempt the move ended is refused, as the memory engine
	// refuses it for a job that has no earlier attempt (or that is dead).
	forget bool
	dlq    *DLQConfig // the job entered the DLQ under this policy: trim it
	emit   func()     // tells of the move once committed
}

// move runs fn on job id's locked row and applies what it answers.
func (p *PG) move(r *Req, id string, notFound error, fn func(ctx context.Context, tx pgx.Tx, j *Job, now int64) (pgMove, error)) error {
	ctx, cancel := pgCtx(r)
	defer cancel()
	tx, err := p.begin(ctx)
	if err != nil {
		return pgErr(err)
	}
	defer tx.Rollback(context.Background())
	locked, err := p.lockRows(ctx, tx, []string{id})
	if err != nil {
		return pgErr(fmt.Errorf("lock job %s: %w", id, err))
	}
	l := locked[id]
	if l == nil {
		return notFound
	}
	j, now := l.j, p.now()
	j.state = j.stateAt(now)
	m, err := fn(ctx, tx, j, now)
	if err != nil {
		return err
	}
	switch {
	case m.remove:
		err = p.deleteIDs(ctx, tx, []string{id})
	case m.save:
		if err = p.saveJobs(ctx, tx, []*Job{j}, nil); err == nil && m.forget {
			_, err = tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET lease_token = NULL WHERE id = $1`), id)
		}
		if err == nil && m.dlq != nil {
			err = p.trimDLQ(ctx, tx, j.Queue, *m.dlq)
		}
		if err == nil && (j.state == StateWaiting || j.state == StatePrioritized) {
			err = p.notify(ctx, tx, j.Queue)
		}
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		return pgErr(fmt.Errorf("move job %s: %w", id, err))
	}
	if m.emit != nil {
		m.emit()
	}
	return r.okID()
}

// pgTakeActive ends an active job's lease for a move by hand, after the
// same token check as ACK.
func pgTakeActive(j *Job, token string) error {
	if err := checkLease(j, token); err != nil {
		return err
	}
	j.lease = nil
	j.StartedAt = 0
	return nil
}

// pgEnqueue sets a job that waits on nothing to delayed or ready by its
// run time.
func pgEnqueue(j *Job, now int64) {
	if j.RunAt > now {
		j.state = StateDelayed
	} else {
		j.state = j.readyState()
	}
}

// jobIDArg reads the id of the job a move names.
func jobIDArg(r *Req) (string, error) {
	id, _, err := r.m.Str("id")
	return id, err
}

func pgCancel(r *Req) error {
	id, err := jobIDArg(r)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	return p.move(r, id, errCannotCancel, func(ctx context.Context, tx pgx.Tx, j *Job, now int64) (pgMove, error) {
		if !isQueued(j.state) {
			return pgMove{}, errCannotCancel
		}
		return pgMove{remove: true, emit: func() { p.emit(j.Queue, evRemoved, j, now, evArgs{prev: "waiting"}) }}, nil
	})
}

func pgDiscard(r *Req) error {
	id, err := jobIDArg(r)
	if err != nil {
		return err
	}
	tok, err := tokenArg(r.m)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	return p.move(r, id, errJobNotFound, func(ctx context.Context, tx pgx.Tx, j *Job, now int64) (pgMove, error) {
		switch j.state {
		case StateActive:
			startedAt := j.StartedAt
			if err := pgTakeActive(j, tok); err != nil {
				return pgMove{}, err
			}
			j.StartedAt = startedAt
		case StateWaiting, StatePrioritized, StateDelayed:
		default:
			return pgMove{}, errJobNotFound
		}
		set, err := p.settings(ctx, tx, []string{j.Queue})
		if err != nil {
			return pgMove{}, pgErr(err)
		}
		cfg := set[j.Queue].dlqConfig()
		j.recordAttempt(j.StartedAt, now, "unknown", "", false)
		pgDeadLetter(j, "unknown", "", false, cfg, now)
		return pgMove{save: true, forget: true, dlq: &cfg}, nil
	})
}

func pgPromote(r *Req) error {
	id, err := jobIDArg(r)
	if err != nil {
		return err
	}
	return r.c.srv.pg.move(r, id, errNotDelayed, func(ctx context.Context, tx pgx.Tx, j *Job, now int64) (pgMove, error) {
		if j.state != StateDelayed {
			return pgMove{}, errNotDelayed
		}
		j.RunAt = now
		pgEnqueue(j, now)
		return pgMove{save: true}, nil
	})
}

// delayMove moves a waiting or active job to run delay ms from now; a job
// in another state is refused.
func (p *PG) delayMove(r *Req, notFound error, refuse func(j *Job, now int64) error) error {
	delay, tok, err := delayArgs(r)
	if err != nil {
		return err
	}
	id, err := jobIDArg(r)
	if err != nil {
		return err
	}
	return p.move(r, id, notFound, func(ctx context.Context, tx pgx.Tx, j *Job, now int64) (pgMove, error) {
		switch j.state {
		case StateWaiting, StatePrioritized, StateDelayed:
			j.RunAt = now + delay
			pgEnqueue(j, now)
			return pgMove{save: true}, nil
		case StateActive:
			if err := pgTakeActive(j, tok); err != nil {
				return pgMove{}, err
			}
			j.RunAt = now + delay
			pgEnqueue(j, now)
			return pgMove{save: true, forget: j.Attempts == 0, emit: func() {
				p.emit(j.Queue, evDelayed, j, now, evArgs{delay: delay, hasDelay: true})
			}}, nil
		}
		return pgMove{}, refuse(j, now)
	})
}

func pgMoveToDelayed(r *Req) error {
	return r.c.srv.pg.delayMove(r, errJobNotFound, notActive)
}

func pgChangeDelay(r *Req) error {
	return r.c.srv.pg.delayMove(r, errChangeDelay, func(*Job, int64) error { return errChangeDelay })
}

func pgMoveToWait(r *Req) error {
	tok, err := tokenArg(r.m)
	if err != nil {
		return err
	}
	id, err := jobIDArg(r)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	return p.move(r, id, errJobNotFound, func(ctx context.Context, tx pgx.Tx, j *Job, now int64) (pgMove, error) {
		switch j.state {
		case StateActive:
			if err := pgTakeActive(j, tok); err != nil {
				return pgMove{}, err
			}
			j.RunAt = now
			pgEnqueue(j, now)
			return pgMove{save: true, forget: j.Attempts == 0, emit: func() {
				p.emit(j.Queue, evWaiting, j, now, evArgs{prev: "active"})
			}}, nil
		case StateDelayed:
			j.RunAt = now
			pgEnqueue(j, now)
			return pgMove{save: true}, nil
		case StateFailed:
			held, err := p.uniqueHeld(ctx, tx, j)
			if err != nil {
				return pgMove{}, pgErr(err)
			}
			if held {
				return pgMove{}, errNoDLQ
			}
			resetDLQ(j, false, now)
			pgEnqueue(j, now)
			return pgMove{save: true}, nil
		case StateWaiting, StatePrioritized:
			return pgMove{}, nil
		}
		return pgMove{}, errors.New("Cannot move job from state '" + j.state.String() + "' to waiting")
	})
}

func pgChangePriority(r *Req) error {
	a, err := readChangePriority(r)
	if err != nil {
		return err
	}
	id, err := jobIDArg(r)
	if err != nil {
		return err
	}
	return r.c.srv.pg.move(r, id, errNotInQueue, func(ctx context.Context, tx pgx.Tx, j *Job, now int64) (pgMove, error) {
		if j.state != StateWaiting && j.state != StatePrioritized && j.state != StateDelayed {
			return pgMove{}, errNotInQueue
		}
		a.apply(j)
		pgEnqueue(j, now)
		return pgMove{save: true}, nil
	})
}

func pgUpdate(r *Req) error {
	data, err := readUpdate(r)
	if err != nil {
		return err
	}
	id, err := jobIDArg(r)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	return p.move(r, id, errCannotUpdate, func(ctx context.Context, tx pgx.Tx, j *Job, now int64) (pgMove, error) {
		if !isQueued(j.state) && j.state != StateActive {
			return pgMove{}, errCannotUpdate
		}
		nd, err := mergeFlowMeta(j.Data, data)
		if err != nil {
			return pgMove{}, err
		}
		if err := setJobData(j, nd); err != nil {
			return pgMove{}, err
		}
		// Only the record: an active job's lease and deadline stay as
		// they are.
		if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET record = $2 WHERE id = $1`), j.ID, encodeRec(j)); err != nil {
			return pgMove{}, pgErr(fmt.Errorf("update job %s: %w", j.ID, err))
		}
		return pgMove{}, nil
	})
}

// ---------------------------------------------------------------------------
// Whole queues

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

func pgPromoteJobs(r *Req) error {
	a, err := readPromoteJobs(r)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	now := p.now()
	limit := int64(a.limit(math.MaxInt32))
	var n int
	err = p.txJobs(ctx, p.sql(`SELECT record FROM {s}.jobs WHERE queue = $1 AND state = 1 AND run_at > $2
		ORDER BY created_at, id LIMIT $3 FOR UPDATE`), []any{a.queue, now, limit}, func(tx pgx.Tx, jobs []*Job) error {
		for _, j := range jobs {
			j.RunAt = now
			pgEnqueue(j, now)
		}
		n = len(jobs)
		return p.requeue(ctx, tx, a.queue, jobs)
	})
	if err != nil {
		return pgErr(fmt.Errorf("promote jobs of %s: %w", a.queue, err))
	}
	r.field("count").Int(int64(n))
	return nil
}

// pgCleanWhere are the rows Clean takes by state asked for, oldest first
// ($2 is the cutoff): every queued job whatever queued state was asked,
// as the reference does.
var pgCleanWhere = map[string]string{
	"":            "state = 1 AND created_at <= $2 ORDER BY created_at, id",
	"waiting":     "state = 1 AND created_at <= $2 ORDER BY created_at, id",
	"delayed":     "state = 1 AND created_at <= $2 ORDER BY created_at, id",
	"prioritized": "state = 1 AND created_at <= $2 ORDER BY created_at, id",
	"paused":      "state = 1 AND created_at <= $2 ORDER BY created_at, id",
	"completed":   "state = 5 AND done_at <= $2 ORDER BY done_at, id",
	"failed":      "state = 6 AND dlq_at <= $2 ORDER BY dlq_at, seq",
}

func pgClean(r *Req) error {
	a, err := readClean(r)
	if err != nil {
		return err
	}
	where, ok := pgCleanWhere[a.state]
	if !ok || a.none() {
		writeCleaned(r, nil)
		return nil
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	tx, err := p.begin(ctx)
	if err != nil {
		return pgErr(err)
	}
	defer tx.Rollback(context.Background())
	// Rows a claim holds are skipped: they are becoming active.
	rows, err := tx.Query(ctx, p.sql(`SELECT id FROM {s}.jobs WHERE queue = $1 AND `+where+` LIMIT $3 FOR UPDATE SKIP LOCKED`),
		a.queue, a.cutoff(p.now()), a.limit)
	if err != nil {
		return pgErr(fmt.Errorf("clean %s: %w", a.queue, err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return pgErr(fmt.Errorf("clean %s: %w", a.queue, err))
	}
	if len(ids) > 0 {
		if err := p.deleteIDs(ctx, tx, ids); err != nil {
			return pgErr(fmt.Errorf("clean %s: %w", a.queue, err))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return pgErr(err)
	}
	writeCleaned(r, ids)
	return nil
}

func pgRetryCompleted(r *Req) error {
	a, err := readRetryCompleted(r)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	now := p.now()
	sql := `SELECT record FROM {s}.jobs WHERE queue = $1 AND state = 5 ORDER BY done_at, seq FOR UPDATE`
	args := []any{a.queue}
	if a.id != "" {
		sql = `SELECT record FROM {s}.jobs WHERE queue = $1 AND state = 5 AND id = $2 FOR UPDATE`
		args = append(args, a.id)
	}
	limit := a.limit()
	n := 0
	err = p.txJobs(ctx, p.sql(sql), args, func(tx pgx.Tx, jobs []*Job) error {
		var save []*Job
		for _, j := range jobs {
			if float64(len(save)) >= limit && a.id == "" {
				break
			}
			if a.id == "" && !a.takes(j.DoneAt) {
				continue
			}
			held, err := p.uniqueHeld(ctx, tx, j)
			if err != nil {
				return err
			}
			if held {
				continue
			}
			resetCompleted(j, now)
			pgEnqueue(j, now)
			save = append(save, j)
		}
		n = len(save)
		return p.requeue(ctx, tx, a.queue, save)
	})
	if err != nil {
		return pgErr(fmt.Errorf("retry completed jobs of %s: %w", a.queue, err))
	}
	r.field("count").Int(int64(n))
	return nil
}

// ---------------------------------------------------------------------------
// Reading

func pgGetCountsPerPriority(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	per, err := p.countsPerPriority(ctx, p.pool, queue)
	if err != nil {
		return err
	}
	r.field("queue").Str(queue)
	encodePriorityCounts(r.field("counts"), priorityKeys(per), per)
	return nil
}

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

func pgGetJobByCustomID(r *Req) error {
	id, _, err := r.m.Str("customId")
	if err != nil {
		return err
	}
	ctx, cancel := pgCtx(r)
	defer cancel()
	j, _, err := r.c.srv.pg.getJob(ctx, id)
	if err != nil {
		return err
	}
	if j == nil || !liveByCustomID(j) {
		return errJobNotFound
	}
	encodeJob(r.field("job"), j, jobWithRead, "", nil)
	return nil
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
