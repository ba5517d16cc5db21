package main

// Cron in PostgreSQL mode: schedules live in the database, and every
// broker looks for due ones. A due schedule's row is taken FOR UPDATE SKIP
// LOCKED, its job inserted and its next run written in one transaction, so
// each run fires once however many brokers are up.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgCronTick is how often a broker looks for due schedules.
const pgCronTick = 100 * time.Millisecond

func (p *PG) cronLoop() {
	defer p.wg.Done()
	t := time.NewTicker(pgCronTick)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if !p.clockHolds(ctx, false) {
			// A run is due by the database's time, or not at all.
			cancel()
			continue
		}
		if err := p.cronOnce(ctx); err != nil && ctx.Err() == nil && !p.closing() {
			p.setDown(err)
		}
		cancel()
	}
}

func (p *PG) cronOnce(ctx context.Context) error {
	now := p.now()
	tx, err := p.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	rows, err := tx.Query(ctx, p.sql(`SELECT record FROM {s}.crons WHERE next_run <= $1
		ORDER BY next_run LIMIT 100 FOR UPDATE SKIP LOCKED`), now)
	if err != nil {
		return fmt.Errorf("due schedules: %w", err)
	}
	var due []CronSchedule
	for rows.Next() {
		var rec []byte
		if err := rows.Scan(&rec); err != nil {
			rows.Close()
			return err
		}
		s, err := decodeCronRecord(rec)
		if err != nil {
			rows.Close()
			return fmt.Errorf("cron record: %w", err)
		}
		due = append(due, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(due) == 0 {
		return tx.Commit(ctx)
	}
	type fired struct {
		queue string
		made  []*Job
	}
	var out []fired
	for i := range due {
		s := &due[i]
		if err := s.compile(); err != nil {
			// Unreadable: it stays, and says so, rather than vanishing.
			p.log.Error("cron schedule cannot run", "name", s.Name, "err", err)
			s.NextRun = now + 60000
			if err := p.saveCron(ctx, tx, s); err != nil {
				return err
			}
			continue
		}
		if !s.SkipIfNoWorker || p.b.workers.serves(s.Queue) {
			j, err := cronJob(s, now)
			if err != nil {
				p.log.Error("cron schedule could not make its job", "name", s.Name, "err", err)
			} else {
				_, made, err := p.insertTx(ctx, tx, s.Queue, []*Job{j})
				var refused pgRefused
				switch {
				case errors.As(err, &refused):
					// Refused for what it asks (a group full, a key held
					// by a running job): the run is spent, as in memory
					// mode, and the other schedules go on.
					p.log.Warn("cron run refused", "name", s.Name, "err", refused.error)
				case err != nil:
					return fmt.Errorf("cron %s: %w", s.Name, err)
				default:
					out = append(out, fired{s.Queue, made})
				}
				s.Executions++
			}
		}
		if s.MaxLimit > 0 && s.Executions >= s.MaxLimit {
			p.log.Info("cron schedule ended", "name", s.Name, "reason", "maxLimit reached", "executions", s.Executions)
			if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.crons WHERE name = $1`), s.Name); err != nil {
				return err
			}
			continue
		}
		next, ok := s.following(s.NextRun, now)
		if !ok {
			p.log.Info("cron schedule ended", "name", s.Name, "reason", "no run left")
			if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.crons WHERE name = $1`), s.Name); err != nil {
				return err
			}
			continue
		}
		s.NextRun = next
		if err := p.saveCron(ctx, tx, s); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("fire schedules: %w", err)
	}
	for _, f := range out {
		p.pushed(f.queue, f.made)
	}
	return nil
}

func (p *PG) saveCron(ctx context.Context, tx pgx.Tx, s *CronSchedule) error {
	_, err := tx.Exec(ctx, p.sql(`INSERT INTO {s}.crons (name, next_run, record) VALUES ($1, $2, $3)
		ON CONFLICT (name) DO UPDATE SET next_run = EXCLUDED.next_run, record = EXCLUDED.record`),
		s.Name, s.NextRun, encodeCronRecord(s))
	if err != nil {
		return fmt.Errorf("save schedule %s: %w", s.Name, err)
	}
	return nil
}

// readCronRow reads one schedule; nil when there is none.
func (p *PG) readCronRow(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, name string, lock bool) (*CronSchedule, error) {
	sql := `SELECT record FROM {s}.crons WHERE name = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	var rec []byte
	err := q.QueryRow(ctx, p.sql(sql), name).Scan(&rec)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, pgErr(fmt.Errorf("read schedule %s: %w", name, err))
	}
	s, err := decodeCronRecord(rec)
	if err != nil {
		return nil, pgErr(fmt.Errorf("schedule %s: %w", name, err))
	}
	return &s, nil
}

func pgCron(r *Req) error {
	s, err := readCron(r.m)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	now := p.now()
	if err := s.start(now); err != nil {
		return err
	}
	ctx, cancel := pgCtx(r)
	defer cancel()
	tx, err := p.begin(ctx)
	if err != nil {
		return pgErr(err)
	}
	defer tx.Rollback(context.Background())
	old, err := p.readCronRow(ctx, tx, s.Name, true)
	if err != nil {
		return err
	}
	// The other schedules, as the memory engine counts them: the records
	// carry the fields cronWeight counts, and a few bytes more.
	var n int
	var bytes int64
	if err := tx.QueryRow(ctx, p.sql(`SELECT count(*), COALESCE(sum(length(record)), 0) FROM {s}.crons WHERE name <> $1`),
		s.Name).Scan(&n, &bytes); err != nil {
		return pgErr(fmt.Errorf("count schedules: %w", err))
	}
	if err := cronRoom(n, bytes, &s); err != nil {
		return err
	}
	if old != nil {
		s.Executions = old.Executions
	} else if s.Immediately {
		s.NextRun = now
	}
	if err := p.saveCron(ctx, tx, &s); err != nil {
		return pgErr(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return pgErr(err)
	}
	encodeCron(r.field("cron"), &s)
	return nil
}

func pgCronGet(r *Req) error {
	name, _, err := r.m.Str("name")
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	s, err := p.readCronRow(ctx, p.pool, name, false)
	if err != nil {
		return err
	}
	if s == nil {
		return errCronNotFound
	}
	encodeCron(r.field("cron"), s)
	return nil
}

func pgCronList(r *Req) error {
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	crons, err := p.crons(ctx, p.pool)
	if err != nil {
		return err
	}
	e := r.field("crons")
	e.ArrayHead(len(crons))
	for i := range crons {
		encodeCron(e, &crons[i])
	}
	return nil
}

// crons reads every schedule, in the order they were made.
func (p *PG) crons(ctx context.Context, q pgQuerier) ([]CronSchedule, error) {
	rows, err := q.Query(ctx, p.sql(`SELECT record FROM {s}.crons ORDER BY created`))
	if err != nil {
		return nil, pgErr(err)
	}
	recs, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, pgErr(err)
	}
	out := make([]CronSchedule, len(recs))
	for i, rec := range recs {
		if out[i], err = decodeCronRecord(rec); err != nil {
			return nil, pgErr(fmt.Errorf("cron record: %w", err))
		}
	}
	return out, nil
}

func pgCronDelete(r *Req) error {
	name, _, err := r.m.Str("name")
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	tag, err := p.pool.Exec(ctx, p.sql(`DELETE FROM {s}.crons WHERE name = $1`), name)
	if err != nil {
		return pgErr(err)
	}
	if tag.RowsAffected() == 0 {
		return errCronNotFound
	}
	return r.okID()
}
