package main

// Rate and concurrency limits in PostgreSQL mode (PolicyEngine, as
// limits.go answers them in memory). A queue's limits live on its row; a
// claim on a limited queue locks that row, so the brokers take tokens and
// slots one after another and the limit holds across all of them.
// Unlimited queues are claimed without touching it.

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
)

// pgLimits are a queue's limits as its row has them.
type pgLimits struct {
	paused                 bool
	rateMax                *float64
	rateDur, rateAt        *int64
	rateTokens             *float64
	rateExpires, rateCount *int64
	conc                   *int64
	grouped                bool // has had grouped jobs: claims take the grouped path
}

func (l *pgLimits) limited() bool { return l.rateMax != nil || l.conc != nil }

func (p *PG) readLimits(ctx context.Context, tx pgx.Tx, queue string, lock bool) (pgLimits, error) {
	sql := `SELECT paused, rate_max, rate_duration, rate_tokens, rate_at, rate_expires, rate_consumed, conc_limit, grouped
		FROM {s}.queues WHERE name = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	var l pgLimits
	err := tx.QueryRow(ctx, p.sql(sql), queue).Scan(&l.paused, &l.rateMax, &l.rateDur, &l.rateTokens, &l.rateAt,
		&l.rateExpires, &l.rateCount, &l.conc, &l.grouped)
	if errors.Is(err, pgx.ErrNoRows) {
		return pgLimits{}, nil
	}
	if err != nil {
		return l, fmt.Errorf("read the limits of %s: %w", queue, err)
	}
	return l, nil
}

// bucket rebuilds the token bucket of a queue row (nil: no rate limit, or
// one that has expired).
func (l *pgLimits) bucket(now int64) *bucket {
	if l.rateMax == nil || (l.rateExpires != nil && *l.rateExpires != 0 && now >= *l.rateExpires) {
		return nil
	}
	b := newBucket(*l.rateMax, deref(l.rateDur), 0, now)
	b.tokens, b.last, b.consumed = deref(l.rateTokens), deref(l.rateAt), deref(l.rateCount)
	if l.rateExpires != nil {
		b.expires = *l.rateExpires
	}
	return b
}

func deref[T any](p *T) T {
	var z T
	if p == nil {
		return z
	}
	return *p
}

// allowance is how many of n jobs a limited queue lets a claim take now,
// and when to look again if none (0: when woken).
func (p *PG) allowance(ctx context.Context, tx pgx.Tx, queue string, l pgLimits, n int, now int64) (int, int64, *bucket, error) {
	b := l.bucket(now)
	if b != nil {
		b.refill(now)
		if b.tokens < 1 {
			return 0, now + b.waitMs(now), b, nil
		}
		// Compared as floats: a limit may be any finite number, and a
		// bucket of 1e300 tokens made an int of it that wrapped to below
		// zero, a negative LIMIT the database refused (FuzzCommandsPG).
		if t := math.Floor(b.tokens); t < float64(n) {
			n = int(t)
		}
	}
	if l.conc != nil {
		var active int64
		if err := tx.QueryRow(ctx, p.sql(pgActiveCountSQL), queue).Scan(&active); err != nil {
			return 0, 0, nil, fmt.Errorf("count active jobs: %w", err)
		}
		if left := *l.conc - active; left < int64(n) {
			n = int(max(left, 0))
		}
		if n == 0 {
			// A slot frees with an ACK or FAIL through any broker; look
			// again soon.
			return 0, now + 50, b, nil
		}
	}
	return n, 0, b, nil
}

// spend takes k tokens from a queue's bucket.
func (p *PG) spend(ctx context.Context, tx pgx.Tx, queue string, b *bucket, k int) error {
	if b == nil || k == 0 {
		return nil
	}
	b.tokens -= float64(k)
	b.consumed += int64(k)
	_, err := tx.Exec(ctx, p.sql(`UPDATE {s}.queues SET rate_tokens = $2, rate_at = $3, rate_consumed = $4 WHERE name = $1`),
		queue, b.tokens, b.last, b.consumed)
	if err != nil {
		return fmt.Errorf("spend rate tokens: %w", err)
	}
	return nil
}

// setLimits sets a queue's limit columns (set, with args from $2) and
// wakes the pulls waiting on the queue. With create, a missing row is made
// first; without, a queue that does not exist is left so (clearing a
// limit makes no queue, as in memory mode).
func (p *PG) setLimits(ctx context.Context, queue string, create bool, set string, args ...any) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.inTx(ctx, func(tx pgx.Tx) error {
		if create {
			if err := p.registerQueue(ctx, tx, queue, false); err != nil {
				return pgRefusedOr(err)
			}
		}
		tag, err := tx.Exec(ctx, p.sql(`UPDATE {s}.queues SET `+set+` WHERE name = $1`), append([]any{queue}, args...)...)
		if err != nil {
			return pgErr(fmt.Errorf("set the limits of %s: %w", queue, err))
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		return pgErr(p.notify(ctx, tx, queue))
	})
}

func (p *PG) SetRateLimit(ctx context.Context, queue string, l RateLimit) error {
	b := l.bucket(p.now())
	return p.setLimits(ctx, queue, true, `rate_max = $2, rate_duration = $3, rate_tokens = $4, rate_at = $5, rate_expires = $6, rate_consumed = 0`,
		b.max, b.duration, b.tokens, b.last, b.expires)
}

func (p *PG) ClearRateLimit(ctx context.Context, queue string) error {
	return p.setLimits(ctx, queue, false, `rate_max = NULL, rate_duration = NULL, rate_tokens = NULL, rate_at = NULL,
		rate_expires = NULL, rate_consumed = NULL`)
}

func (p *PG) SetConcurrency(ctx context.Context, queue string, limit int64) error {
	return p.setLimits(ctx, queue, true, `conc_limit = $2`, limit)
}

func (p *PG) ClearConcurrency(ctx context.Context, queue string) error {
	return p.setLimits(ctx, queue, false, `conc_limit = NULL`)
}

func (p *PG) QueueLimits(ctx context.Context, queue string) (QueueLimits, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var out QueueLimits
	err := p.inTx(ctx, func(tx pgx.Tx) error {
		l, err := p.readLimits(ctx, tx, queue, false)
		if err != nil {
			return pgErr(err)
		}
		now := p.now()
		out = QueueLimits{Rate: l.bucket(now), Concurrency: l.conc, At: now}
		if l.conc != nil {
			var active int64
			if err := tx.QueryRow(ctx, p.sql(pgActiveCountSQL), queue).Scan(&active); err != nil {
				return pgErr(fmt.Errorf("count active jobs of %s: %w", queue, err))
			}
			out.Maxed = active >= *l.conc
		}
		return nil
	})
	return out, err
}

// pgActiveCountSQL counts queue $1's active jobs, from jobs_lease (the
// active rows, which the workers bound).
const pgActiveCountSQL = `SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = {active}`
