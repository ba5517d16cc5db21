package main

// Cron in PostgreSQL mode: schedules live in the database, and every
// broker looks for due ones. A due schedule's row is taken FOR UPDATE SKIP
// LOCKED, its job inserted and its next run written in one transaction, so
// each run fires once however many brokers are up.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgCronTick is how often a broker looks for due schedules.
const pgCronTick = 100 * time.Millisecond

// pgCronLook is how long a broker trusts what it read of the next run. A
// schedule another broker adds or moves is seen within it; its own are
// seen at once. One look a tick took an idle broker's database three
// statements ten times a second; it takes one a second now.
const pgCronLook = time.Second

// pgCronNext is when the namespace's next schedule falls due, as the
// broker last read it, so that a tick with nothing due asks nothing of the
// database.
type pgCronNext struct {
	mu   sync.Mutex
	at   int64     // the earliest next_run read (math.MaxInt64: none)
	read time.Time // when it was read (zero: read again)
	// gen counts forget: a reading under way when a schedule was saved
	// may not have seen it, and is not kept.
	gen uint64
}

// fresh answers the next run read, if the reading is younger than
// pgCronLook; gen is for a new reading (set).
func (c *pgCronNext) fresh() (at int64, gen uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at, c.gen, !c.read.IsZero() && time.Since(c.read) < pgCronLook
}

// forget has the next tick read the next run again: a schedule was added,
// changed or fired.
func (c *pgCronNext) forget() {
	c.mu.Lock()
	c.read = time.Time{}
	c.gen++
	c.mu.Unlock()
}

// set keeps a reading begun at gen (fresh), unless forget came between.
func (c *pgCronNext) set(gen uint64, at int64, read time.Time) {
	c.mu.Lock()
	if c.gen == gen {
		c.at, c.read = at, read
	}
	c.mu.Unlock()
}

// cronRound is one look for due schedules (every pgCronTick).
func (p *PG) cronRound(ctx context.Context) {
	if !p.clockHolds(ctx, false) {
		// A run is due by the database's time, or not at all.
		return
	}
	due, err := p.cronDue(ctx)
	if due {
		err = p.cronOnce(ctx)
		p.cronNext.forget()
	}
	if err != nil && ctx.Err() == nil && !p.closing() {
		p.setDown(err)
	}
}

// cronDue reports whether a schedule may be due now: by the last reading
// while it is young, else by a new one.
func (p *PG) cronDue(ctx context.Context) (bool, error) {
	now := p.now()
	at, gen, ok := p.cronNext.fresh()
	if ok {
		return at <= now, nil
	}
	read := time.Now()
	var least *int64
	if err := p.pool.QueryRow(ctx, p.sql(`SELECT min(next_run) FROM {s}.crons`)).Scan(&least); err != nil {
		return false, fmt.Errorf("next schedule: %w", err)
	}
	next := int64(math.MaxInt64)
	if least != nil {
		next = *least
	}
	p.cronNext.set(gen, next, read)
	return next <= now, nil
}

// cronOnce fires the schedules due now, up to 100, in one transaction.
func (p *PG) cronOnce(ctx context.Context) error {
	now := p.now()
	tx, err := p.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	due, err := p.dueCrons(ctx, tx, now)
	if err != nil {
		return err
	}
	if len(due) == 0 {
		return tx.Commit(ctx)
	}
	var out []pgCronRun
	for i := range due {
		run, err := p.fireCron(ctx, tx, &due[i], now)
		if err != nil {
			return err
		}
		out = append(out, run)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("fire schedules: %w", err)
	}
	for _, f := range out {
		if f.made != nil {
			p.pushed(f.queue, f.made)
		}
		p.b.announce(f.note)
	}
	return nil
}

// dueCrons takes the schedules due by now, locked, skipping those
// another broker is firing.
func (p *PG) dueCrons(ctx context.Context, tx pgx.Tx, now int64) ([]CronSchedule, error) {
	rows, err := tx.Query(ctx, p.sql(`SELECT record FROM {s}.crons WHERE next_run <= $1
		ORDER BY next_run LIMIT 100 FOR UPDATE SKIP LOCKED`), now)
	if err != nil {
		return nil, fmt.Errorf("due schedules: %w", err)
	}
	defer rows.Close()
	var due []CronSchedule
	for rows.Next() {
		var rec []byte
		if err := rows.Scan(&rec); err != nil {
			return nil, err
		}
		s, err := decodeCronRecord(rec)
		if err != nil {
			return nil, fmt.Errorf("cron record: %w", err)
		}
		due = append(due, s)
	}
	return due, rows.Err()
}

// pgCronRun is a run's job, told to the queue's pollers after the commit.
type pgCronRun struct {
	queue string
	made  []*Job
	note  *note // cron:fired, cron:skipped or cron:missed (nil: none)
}

// fireCron pushes a due schedule's job in tx (unless it skips the run)
// and moves it to its next run, or removes it when it is over.
func (p *PG) fireCron(ctx context.Context, tx pgx.Tx, s *CronSchedule, now int64) (pgCronRun, error) {
	var run pgCronRun
	if err := s.compile(); err != nil {
		// Unreadable: it stays, and says so, rather than vanishing.
		p.log.Error("cron schedule cannot run", "name", s.Name, "err", err)
		s.NextRun = now + 60000
		return run, p.saveCron(ctx, tx, s)
	}
	ran := !s.SkipIfNoWorker || p.b.workers.serves(s.Queue)
	if ran {
		j, err := cronJob(s, now)
		if err == nil {
			// Past the memory budget the run is spent, refused as a push
			// would be.
			if merr := p.b.mem.admit(jobMemBytes([]*Job{j})); merr != nil {
				p.log.Warn("cron run refused", "name", s.Name, "err", merr)
				run.note = cronOutcome(s, merr)
				return run, p.nextCronRun(ctx, tx, s, true, now)
			}
		}
		if err != nil {
			// Spent and counted (afterRun): the reference counts it too.
			p.log.Error("cron schedule could not make its job", "name", s.Name, "err", err)
			run.note = noticeCronRun("cron:missed", s).str("error", err.Error())
		} else {
			_, made, err := p.insertTx(ctx, tx, s.Queue, []*Job{j})
			var refused pgRefused
			switch {
			case errors.As(err, &refused):
				// Refused for what it asks (a group full, a key held
				// by a running job): the run is spent, as in memory
				// mode, and the other schedules go on.
				p.log.Warn("cron run refused", "name", s.Name, "err", refused.error)
				run.note = cronOutcome(s, refused.error)
			case err != nil:
				return run, fmt.Errorf("cron %s: %w", s.Name, err)
			default:
				run = pgCronRun{s.Queue, made, cronOutcome(s, nil)}
			}
		}
	} else {
		run.note = noticeCronRun("cron:skipped", s).str("reason", "no-worker")
	}
	return run, p.nextCronRun(ctx, tx, s, ran, now)
}

// nextCronRun saves a schedule whose due run was handled (ran: not
// skipped) with its next run, or removes it when it has run its course
// (afterRun, rule_cron.go).
func (p *PG) nextCronRun(ctx context.Context, tx pgx.Tx, s *CronSchedule, ran bool, now int64) error {
	if why := s.afterRun(ran, now); why != "" {
		p.log.Info("cron schedule ended", "name", s.Name, "reason", why, "executions", s.Executions)
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.crons WHERE name = $1`), s.Name); err != nil {
			return fmt.Errorf("end schedule %s: %w", s.Name, err)
		}
		return nil
	}
	return p.saveCron(ctx, tx, s)
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

func (p *PG) AddCron(ctx context.Context, s CronSchedule) (CronSchedule, error) {
	now := p.now()
	if err := s.start(now); err != nil {
		return CronSchedule{}, err
	}
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	err := p.inTx(ctx, func(tx pgx.Tx) error {
		old, err := p.readCronRow(ctx, tx, s.Name, true)
		if err != nil {
			return err
		}
		// The other schedules, as the memory engine counts them: the
		// records carry the fields cronWeight counts, and a few bytes more.
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
		s.replaced = old != nil
		return pgErr(p.saveCron(ctx, tx, &s))
	})
	if err != nil {
		return CronSchedule{}, err
	}
	p.cronNext.forget()
	return s, nil
}

func (p *PG) GetCron(ctx context.Context, name string) (CronSchedule, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	s, err := p.readCronRow(ctx, p.pool, name, false)
	if err != nil {
		return CronSchedule{}, err
	}
	if s == nil {
		return CronSchedule{}, errCronNotFound
	}
	return *s, nil
}

func (p *PG) ListCrons(ctx context.Context) ([]CronSchedule, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.crons(ctx, p.pool)
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

func (p *PG) DeleteCron(ctx context.Context, name string) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	tag, err := p.pool.Exec(ctx, p.sql(`DELETE FROM {s}.crons WHERE name = $1`), name)
	if err != nil {
		return pgErr(fmt.Errorf("delete schedule %s: %w", name, err))
	}
	if tag.RowsAffected() == 0 {
		return errCronNotFound
	}
	return nil
}
