package main

// A queue's stall and DLQ policy in PostgreSQL mode, on its row, so that
// every broker's reaper applies the same one; DLQ expiry and auto-retry
// by whichever broker comes first; the DLQ itself and its figures from
// the database (PolicyEngine, as limits.go and dlq.go answer in memory).

import (
	"context"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
)

// updateSettings applies fn to a queue's policy under its row lock. With
// create, a missing row is made first; without, a queue that does not exist
// is left so.
func (p *PG) updateSettings(ctx context.Context, queue string, create bool, fn func(tx pgx.Tx, s *pgSettings) error) error {
	return p.inTx(ctx, func(tx pgx.Tx) error {
		if create {
			if err := p.registerQueue(ctx, tx, queue, false); err != nil {
				return pgRefusedOr(err)
			}
		}
		set, err := p.readSettings(ctx, tx, []string{queue}, true)
		if err != nil {
			return pgErr(err)
		}
		s := set[queue]
		if s == nil {
			return nil // no row, and none to make
		}
		if err := fn(tx, s); err != nil {
			return pgErr(err)
		}
		_, err = tx.Exec(ctx, p.sql(`UPDATE {s}.queues SET stall_enabled = $2, stall_interval = $3, stall_grace = $4,
			stall_max = $5, dlq_auto_retry = $6, dlq_retry_interval = $7, dlq_max_age = $8, dlq_max_retries = $9,
			dlq_max_entries = $10 WHERE name = $1`), queue, s.stallEnabled, s.stallInterval, s.stallGrace, s.stallMax,
			s.dlqAuto, s.dlqInterval, s.dlqMaxAge, s.dlqMaxRetries, s.dlqMaxEntries)
		if err != nil {
			return pgErr(fmt.Errorf("save the settings of %s: %w", queue, err))
		}
		return nil
	})
}

func (s *pgSettings) setStall(c StallConfig) {
	s.stallEnabled, s.stallInterval, s.stallGrace, s.stallMax = &c.Enabled, &c.StallInterval, &c.GracePeriod, &c.MaxStalls
}

func (s *pgSettings) setDLQ(c DLQConfig) {
	age := c.MaxAge
	if age == none {
		age = pgNever
	}
	entries := int32(min(c.MaxEntries, math.MaxInt32))
	s.dlqAuto, s.dlqInterval, s.dlqMaxAge, s.dlqMaxRetries, s.dlqMaxEntries = &c.AutoRetry, &c.AutoRetryInterval, &age,
		&c.MaxAutoRetries, &entries
}

// pgDLQDue is when a DLQ entry is next looked at (nil: never): its expiry
// or its next auto-retry. The reaper then decides under the queue's policy.
func pgDLQDue(e *DLQEntry) *int64 {
	d := int64(math.MaxInt64)
	if e.ExpiresAt > 0 {
		d = e.ExpiresAt
	}
	if e.NextRetryAt > 0 {
		d = min(d, e.NextRetryAt)
	}
	return pgTime(d)
}

// trimDLQ drops a queue's oldest DLQ entries over its bound. Trims of one
// queue take turns (a lock held to the end of the transaction): two
// deleting the same old rows in different orders would deadlock, and the
// loser's FAIL with it.
func (p *PG) trimDLQ(ctx context.Context, tx pgx.Tx, queue string, c DLQConfig) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "queued-dlq:"+p.schema+":"+queue); err != nil {
		return fmt.Errorf("trim the DLQ of %s: %w", queue, err)
	}
	_, err := tx.Exec(ctx, p.sql(`WITH gone AS (DELETE FROM {s}.jobs WHERE id IN (
			SELECT id FROM {s}.jobs WHERE queue = $1 AND state = {dlq} ORDER BY dlq_at DESC, seq DESC OFFSET $2)
			RETURNING id)
		DELETE FROM {s}.job_logs WHERE job_id IN (SELECT id FROM gone)`), queue, c.MaxEntries)
	if err != nil {
		return fmt.Errorf("trim the DLQ of %s: %w", queue, err)
	}
	return nil
}

// pgDLQDueSQL locks the DLQ rows whose next step (a retry or expiry) is
// due, a batch at a time.
const pgDLQDueSQL = `SELECT ` + pgJobCols + ` FROM {s}.jobs WHERE state = {dlq} AND dlq_due <= $1
		ORDER BY dlq_due LIMIT 500 FOR UPDATE SKIP LOCKED`

// reapDLQ expires DLQ entries and retries them automatically when their
// time comes, as the memory engine's dlqDue does.
func (p *PG) reapDLQ(ctx context.Context) error {
	now := p.now()
	// By queue, what the committed pass expired and retried (a pass run
	// again after a conflict counts afresh).
	var expiredIn, retriedIn map[string]int64
	err := p.txJobs(ctx, p.sql(pgDLQDueSQL), []any{now}, func(tx pgx.Tx, jobs []*Job) error {
		expiredIn, retriedIn = map[string]int64{}, map[string]int64{}
		set, err := p.settingsOf(ctx, tx, jobs)
		if err != nil {
			return err
		}
		var expired []string
		var save []*Job
		queues := map[string]bool{}
		for _, j := range jobs {
			if j.dlq == nil {
				// No entry for the policy to act on: not looked at again
				// (left due, it took a transaction every round for good).
				if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET dlq_due = NULL WHERE id = $1`), j.ID()); err != nil {
					return err
				}
				continue
			}
			cfg := set[j.Queue].dlqConfig()
			switch dlqStep(j.dlq, cfg, now) {
			case dlqExpire:
				expired = append(expired, j.ID())
				expiredIn[j.Queue]++
				continue
			case dlqRetry:
				held, err := p.uniqueHeld(ctx, tx, j)
				if err != nil {
					return err
				}
				if !held {
					resetDLQ(j, true, now)
					j.state = j.readyState()
					save = append(save, j)
					queues[j.Queue] = true
					retriedIn[j.Queue]++
					continue
				}
			}
			// Not due after all (the policy changed), or its unique key is
			// held: look again when the policy says.
			rec, data, keep := pgRecord(j)
			if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET body = $2, dlq_due = $3, plain = $4,
				data = CASE WHEN $6 THEN data ELSE $5 END WHERE id = $1`),
				j.ID(), rec, pgTime(dlqWatch(j.dlq, cfg)), pgPlainDone(j), data, keep); err != nil {
				return err
			}
		}
		if len(expired) > 0 {
			if err := p.deleteIDs(ctx, tx, expired); err != nil {
				return err
			}
		}
		if len(save) > 0 {
			if err := p.saveJobs(ctx, tx, save, nil); err != nil {
				return err
			}
		}
		for q := range queues {
			if err := p.notify(ctx, tx, q); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		for q, n := range expiredIn {
			p.b.announce(noticeQueueCount("dlq:expired", q, n))
		}
		for q, n := range retriedIn {
			p.b.announce(noticeQueueCount("dlq:auto-retried", q, n))
		}
	}
	return err
}

// pgTime is a time column's value: nil for never (MaxInt64).
func pgTime(t int64) *int64 {
	if t == math.MaxInt64 {
		return nil
	}
	return &t
}

// ---------------------------------------------------------------------------
// The engine's operations (PolicyEngine)

// SetStallConfig makes no queue for a patch that leaves the defaults as
// they are: memory mode lists no queue for it.
func (p *PG) SetStallConfig(ctx context.Context, queue string, patch stallPatch) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	create := patch.apply(defaultStall) != defaultStall
	return p.updateSettings(ctx, queue, create, func(tx pgx.Tx, s *pgSettings) error {
		s.setStall(patch.apply(s.stallConfig()))
		return nil
	})
}

// queueSettings reads a queue's policy (nil: the defaults).
func (p *PG) queueSettings(ctx context.Context, queue string) (*pgSettings, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	set, err := p.settings(ctx, p.pool, []string{queue})
	if err != nil {
		return nil, pgErr(err)
	}
	return set[queue], nil
}

func (p *PG) GetStallConfig(ctx context.Context, queue string) (StallConfig, error) {
	s, err := p.queueSettings(ctx, queue)
	if err != nil {
		return StallConfig{}, err
	}
	return s.stallConfig(), nil
}

func (p *PG) SetDLQConfig(ctx context.Context, queue string, patch dlqPatch) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.updateSettings(ctx, queue, true, func(tx pgx.Tx, s *pgSettings) error {
		c := patch.apply(s.dlqConfig())
		s.setDLQ(c)
		return p.trimDLQ(ctx, tx, queue, c)
	})
}

func (p *PG) GetDLQConfig(ctx context.Context, queue string) (DLQConfig, error) {
	s, err := p.queueSettings(ctx, queue)
	if err != nil {
		return DLQConfig{}, err
	}
	return s.dlqConfig(), nil
}

// dlqJobs reads a queue's dead-lettered jobs in the order they entered
// (with lock, their rows locked for an update), and the queue's DLQ
// policy when the selection needs it (a filter asks about retries).
func (p *PG) dlqJobs(ctx context.Context, tx pgx.Tx, queue string, sel dlqSelect, lock bool) ([]*Job, DLQConfig, error) {
	sql := `SELECT ` + pgJobCols + ` FROM {s}.jobs WHERE queue = $1 AND state = {dlq} ORDER BY dlq_at, seq`
	if lock {
		sql += ` FOR UPDATE`
	}
	rows, err := tx.Query(ctx, p.sql(sql), queue)
	if err != nil {
		return nil, DLQConfig{}, pgErr(fmt.Errorf("read the DLQ of %s: %w", queue, err))
	}
	all, err := scanJobs(rows)
	if err != nil {
		return nil, DLQConfig{}, pgErr(fmt.Errorf("read the DLQ of %s: %w", queue, err))
	}
	cfg := defaultDLQ
	if sel.filter != nil {
		set, err := p.settings(ctx, tx, []string{queue})
		if err != nil {
			return nil, cfg, pgErr(err)
		}
		cfg = set[queue].dlqConfig()
	}
	return all, cfg, nil
}

func (p *PG) DLQ(ctx context.Context, queue string, sel dlqSelect) ([]*Job, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var out []*Job
	err := p.pastUnreadable(ctx, func() error {
		return p.inTx(ctx, func(tx pgx.Tx) error {
			all, cfg, err := p.dlqJobs(ctx, tx, queue, sel, false)
			out = sel.listed(all, cfg, p.now())
			return err
		})
	})
	return out, err
}

func (p *PG) RetryDLQ(ctx context.Context, queue string, sel dlqSelect) (int64, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var n int64
	err := p.inTx(ctx, func(tx pgx.Tx) error {
		all, cfg, err := p.dlqJobs(ctx, tx, queue, sel, true)
		if err != nil {
			return err
		}
		now := p.now()
		var back []*Job
		for _, j := range sel.toRetry(all, cfg, now) {
			// A job whose unique key a live job took meanwhile stays, as in
			// memory mode.
			held, err := p.uniqueHeld(ctx, tx, j)
			if err != nil {
				return pgErr(err)
			}
			if !held {
				resetDLQ(j, false, now)
				pgEnqueue(j, now)
				back = append(back, j)
			}
		}
		n = int64(len(back))
		return pgErr(p.requeue(ctx, tx, queue, back))
	})
	return n, err
}

func (p *PG) PurgeDLQ(ctx context.Context, queue string) (int64, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.deleteJobs(ctx, queue, "state = {dlq}")
}

func (p *PG) RemoveDLQJob(ctx context.Context, queue, id string) (bool, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var n int64
	err := p.pool.QueryRow(ctx, p.sql(`WITH gone AS (DELETE FROM {s}.jobs WHERE id = $1 AND queue = $2 AND state = {dlq} RETURNING id),
		logs AS (DELETE FROM {s}.job_logs WHERE job_id IN (SELECT id FROM gone))
		SELECT count(*) FROM gone`), id, queue).Scan(&n)
	if err != nil {
		return false, pgErr(fmt.Errorf("remove DLQ job %s: %w", id, err))
	}
	return n > 0, nil
}

// DLQStats reads the DLQ and its policy in one snapshot, so that the
// figures agree with each other.
func (p *PG) DLQStats(ctx context.Context, queue string) (dlqStats, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var st dlqStats
	tx, err := p.snapshot(ctx)
	if err != nil {
		return st, err
	}
	defer tx.Rollback(context.Background())
	set, err := p.settings(ctx, tx, []string{queue})
	if err != nil {
		return st, pgErr(err)
	}
	jobs, _, err := p.dlqJobs(ctx, tx, queue, dlqSelect{}, false)
	if err != nil {
		return st, err
	}
	cfg, now := set[queue].dlqConfig(), p.now()
	for _, j := range jobs {
		st.add(j.dlq, cfg, now)
	}
	return st, nil
}
