package main

// A queue's stall and DLQ policy in PostgreSQL mode, on its row, so that
// every broker's reaper applies the same one; DLQ expiry and auto-retry
// by whichever broker comes first; the DLQ figures from the database.

import (
	"context"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
)

// pgSettings are a queue row's policy columns; nil is the default.
type pgSettings struct {
	stallEnabled                 *bool
	stallInterval, stallGrace    *int64
	stallMax                     *int32
	dlqAuto                      *bool
	dlqInterval, dlqMaxAge       *int64
	dlqMaxRetries, dlqMaxEntries *int32
}

// pgNever is dlq_max_age for entries that never expire.
const pgNever = -1

func (s *pgSettings) stallConfig() StallConfig {
	c := defaultStall
	if s == nil {
		return c
	}
	if s.stallEnabled != nil {
		c.Enabled = *s.stallEnabled
	}
	if s.stallInterval != nil {
		c.StallInterval = *s.stallInterval
	}
	if s.stallGrace != nil {
		c.GracePeriod = *s.stallGrace
	}
	if s.stallMax != nil {
		c.MaxStalls = *s.stallMax
	}
	return c
}

func (s *pgSettings) dlqConfig() DLQConfig {
	c := defaultDLQ
	if s == nil {
		return c
	}
	if s.dlqAuto != nil {
		c.AutoRetry = *s.dlqAuto
	}
	if s.dlqInterval != nil {
		c.AutoRetryInterval = *s.dlqInterval
	}
	if s.dlqMaxRetries != nil {
		c.MaxAutoRetries = *s.dlqMaxRetries
	}
	if s.dlqMaxAge != nil {
		c.MaxAge = *s.dlqMaxAge
		if c.MaxAge == pgNever {
			c.MaxAge = none
		}
	}
	if s.dlqMaxEntries != nil {
		c.MaxEntries = int(*s.dlqMaxEntries)
	}
	return c
}

// pgQuerier is a transaction or the pool.
type pgQuerier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// settings reads the policy of queues (a queue without a row has the
// defaults: it is missing from the map, and a nil *pgSettings reads as
// the defaults). With lock, the rows are locked for an update.
func (p *PG) settings(ctx context.Context, q pgQuerier, queues []string) (map[string]*pgSettings, error) {
	return p.readSettings(ctx, q, queues, false)
}

func (p *PG) readSettings(ctx context.Context, q pgQuerier, queues []string, lock bool) (map[string]*pgSettings, error) {
	sql := `SELECT name, stall_enabled, stall_interval, stall_grace, stall_max, dlq_auto_retry, dlq_retry_interval,
		dlq_max_age, dlq_max_retries, dlq_max_entries FROM {s}.queues WHERE name = ANY($1) ORDER BY name`
	if lock {
		sql += ` FOR UPDATE`
	}
	rows, err := q.Query(ctx, p.sql(sql), queues)
	if err != nil {
		return nil, fmt.Errorf("read queue settings: %w", err)
	}
	defer rows.Close()
	out := map[string]*pgSettings{}
	for rows.Next() {
		var name string
		s := &pgSettings{}
		if err := rows.Scan(&name, &s.stallEnabled, &s.stallInterval, &s.stallGrace, &s.stallMax, &s.dlqAuto,
			&s.dlqInterval, &s.dlqMaxAge, &s.dlqMaxRetries, &s.dlqMaxEntries); err != nil {
			return nil, fmt.Errorf("read queue settings: %w", err)
		}
		out[name] = s
	}
	return out, rows.Err()
}

// settingsOf reads the policy of the jobs' queues.
func (p *PG) settingsOf(ctx context.Context, q pgQuerier, jobs []*Job) (map[string]*pgSettings, error) {
	names := make([]string, len(jobs))
	for i, j := range jobs {
		names[i] = j.Queue
	}
	return p.settings(ctx, q, names)
}

// leaseRenewals answers, by id, the renewals of the jobs that hold a lock
// (rows the caller has locked).
func (p *PG) leaseRenewals(ctx context.Context, q pgQuerier, jobs []*Job) (map[string]int32, error) {
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
	}
	rows, err := q.Query(ctx, p.sql(`SELECT id, lease_renewals FROM {s}.jobs WHERE id = ANY($1) AND lease_owner IS NOT NULL`), ids)
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	defer rows.Close()
	out := map[string]int32{}
	for rows.Next() {
		var id string
		var n int32
		if err := rows.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("read leases: %w", err)
		}
		out[id] = n
	}
	return out, rows.Err()
}

// updateSettings applies fn to a queue's policy under its row lock, the
// row made if missing.
func (p *PG) updateSettings(ctx context.Context, queue string, fn func(tx pgx.Tx, s *pgSettings) error) error {
	tx, err := p.begin(ctx)
	if err != nil {
		return pgErr(err)
	}
	defer tx.Rollback(context.Background())
	if err := p.registerQueue(ctx, tx, queue, false); err != nil {
		return pgRefusedOr(err)
	}
	set, err := p.readSettings(ctx, tx, []string{queue}, true)
	if err != nil {
		return pgErr(err)
	}
	s := set[queue]
	if s == nil {
		s = &pgSettings{}
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
	return pgErr(tx.Commit(ctx))
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
			SELECT id FROM {s}.jobs WHERE queue = $1 AND state = 6 ORDER BY dlq_at DESC, seq DESC OFFSET $2)
			RETURNING id)
		DELETE FROM {s}.job_logs WHERE job_id IN (SELECT id FROM gone)`), queue, c.MaxEntries)
	if err != nil {
		return fmt.Errorf("trim the DLQ of %s: %w", queue, err)
	}
	return nil
}

// reapDLQ expires DLQ entries and retries them automatically when their
// time comes, as the memory engine's dlqDue does.
func (p *PG) reapDLQ(ctx context.Context) error {
	now := p.now()
	return p.txJobs(ctx, p.sql(`SELECT record FROM {s}.jobs WHERE state = 6 AND dlq_due <= $1
		ORDER BY dlq_due LIMIT 500 FOR UPDATE SKIP LOCKED`), []any{now}, func(tx pgx.Tx, jobs []*Job) error {
		set, err := p.settingsOf(ctx, tx, jobs)
		if err != nil {
			return err
		}
		var expired []string
		var save []*Job
		queues := map[string]bool{}
		for _, j := range jobs {
			if j.dlq == nil {
				continue
			}
			cfg := set[j.Queue].dlqConfig()
			switch dlqStep(j.dlq, cfg, now) {
			case dlqExpire:
				expired = append(expired, j.ID)
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
					continue
				}
			}
			// Not due after all (the policy changed), or its unique key is
			// held: look again when the policy says.
			if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET record = $2, dlq_due = $3 WHERE id = $1`),
				j.ID, encodeRec(j), pgTime(dlqWatch(j.dlq, cfg))); err != nil {
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
}

// pgTime is a time column's value: nil for never (MaxInt64).
func pgTime(t int64) *int64 {
	if t == math.MaxInt64 {
		return nil
	}
	return &t
}

// encodeRec is a job's record column.
func encodeRec(j *Job) []byte {
	var e Enc
	encodeRecord(&e, j)
	return e.B
}

// uniqueHeld says whether another live job holds j's unique key, so that
// j cannot come back to life now.
func (p *PG) uniqueHeld(ctx context.Context, tx pgx.Tx, j *Job) (bool, error) {
	if j.UniqueKey == "" {
		return false, nil
	}
	var held bool
	err := tx.QueryRow(ctx, p.sql(`SELECT EXISTS (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND unique_key = $2
		AND state IN (1, 4, 7) AND id <> $3)`), j.Queue, j.UniqueKey, j.ID).Scan(&held)
	if err != nil {
		return false, fmt.Errorf("unique key %q: %w", j.UniqueKey, err)
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

// snapshot begins a read-only transaction whose queries all see one
// moment, so that the figures of one answer agree with each other.
func (p *PG) snapshot(ctx context.Context) (pgx.Tx, error) {
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	return tx, pgErr(err)
}

// ---------------------------------------------------------------------------
// Commands

func pgSetStallConfig(r *Req) error {
	name, patch, err := readStallPatch(r)
	if err != nil {
		return err
	}
	if patch == nil {
		return r.okID()
	}
	ctx, cancel := pgCtx(r)
	defer cancel()
	err = r.c.srv.pg.updateSettings(ctx, name, func(tx pgx.Tx, s *pgSettings) error {
		s.setStall(patch.apply(s.stallConfig()))
		return nil
	})
	if err != nil {
		return err
	}
	return r.okID()
}

// queueSettings reads the policy of the queue a request names.
func queueSettings(r *Req) (*pgSettings, error) {
	name, err := queueArg(r.m)
	if err != nil {
		return nil, err
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	set, err := p.settings(ctx, p.pool, []string{name})
	if err != nil {
		return nil, pgErr(err)
	}
	return set[name], nil
}

func pgGetStallConfig(r *Req) error {
	s, err := queueSettings(r)
	if err != nil {
		return err
	}
	writeStallConfig(r, s.stallConfig())
	return nil
}

func pgSetDlqConfig(r *Req) error {
	name, patch, err := readDlqPatch(r)
	if err != nil {
		return err
	}
	if !patch.ok {
		return r.okID()
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	err = p.updateSettings(ctx, name, func(tx pgx.Tx, s *pgSettings) error {
		c := patch.apply(s.dlqConfig())
		s.setDLQ(c)
		return p.trimDLQ(ctx, tx, name, c)
	})
	if err != nil {
		return err
	}
	return r.okID()
}

func pgGetDlqConfig(r *Req) error {
	s, err := queueSettings(r)
	if err != nil {
		return err
	}
	encodeDLQConfig(r.field("config"), s.dlqConfig())
	return nil
}

func pgGetDlqStats(r *Req) error {
	name, err := queueArg(r.m)
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
	set, err := p.settings(ctx, tx, []string{name})
	if err != nil {
		return pgErr(err)
	}
	jobs, err := p.dlqJobs(ctx, tx, name, nil, 0, false, "", false)
	if err != nil {
		return err
	}
	cfg, now := set[name].dlqConfig(), p.now()
	var st dlqStats
	for _, j := range jobs {
		st.add(j.dlq, cfg, now)
	}
	writeDlqStats(r, name, st)
	return nil
}

func pgRemoveDlqJob(r *Req) error {
	name, id, err := readRemoveDlqJob(r)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	var n int64
	err = p.pool.QueryRow(ctx, p.sql(`WITH gone AS (DELETE FROM {s}.jobs WHERE id = $1 AND queue = $2 AND state = 6 RETURNING id),
		logs AS (DELETE FROM {s}.job_logs WHERE job_id IN (SELECT id FROM gone))
		SELECT count(*) FROM gone`), id, name).Scan(&n)
	if err != nil {
		return pgErr(fmt.Errorf("remove DLQ job %s: %w", id, err))
	}
	writeRemoved(r, n > 0)
	return nil
}
