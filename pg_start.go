package main

// Opening a broker's PostgreSQL engine when the database may not be
// reachable yet: a broker started beside its database (compose, a host's
// boot order) comes up once the database does, rather than exiting. Once
// open, it has sessions ready for the first load (warmPool).

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// pgStartWait is how long a starting broker waits for its database
	// to become reachable, by default (--postgres-start-wait).
	pgStartWait = 2 * time.Minute
	// pgStartAttempt bounds one attempt (a database that does not answer
	// at all).
	pgStartAttempt = 30 * time.Second
)

// openPGWaiting opens the PostgreSQL engine, trying again, with back-off,
// while the database cannot be reached, until --postgres-start-wait has
// passed; what the database answers (no such database, a refused
// password, no rights) ends the start at once, as does a stop asked for
// meanwhile.
func (c *config) openPGWaiting(ctx context.Context, b *Broker, log *slog.Logger, o pgOptions) (*PG, error) {
	patience := time.Duration(max(c.pgStartWait, 0)) * time.Millisecond
	giveUp := time.Now().Add(patience)
	wait := 500 * time.Millisecond
	for {
		octx, cancel := context.WithTimeout(ctx, min(pgStartAttempt, max(time.Until(giveUp), time.Second)))
		pg, err := openPG(octx, c.pgURL, c.pgNamespace, b, log, o)
		cancel()
		if err == nil || ctx.Err() != nil || !pgUnreachable(err) || time.Now().Add(wait).After(giveUp) {
			return pg, err
		}
		log.Warn("PostgreSQL cannot be reached yet; trying again", "in", wait.String(),
			"gives_up_after", patience.String(), "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, 5*time.Second)
	}
}

// pgUnreachable reports a failure to reach the database rather than an
// answer of its: nothing listening, a name not resolved, a connection cut
// or timed out, a database still starting (57P03) or out of connections
// (53300). A TLS or authentication failure of the client's own is not:
// trying again would meet it again.
func pgUnreachable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "57P03" || pe.Code == "53300"
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, context.DeadlineExceeded)
}

// pgWarmConns are the sessions of the pool a broker opens at start
// (warmPool).
const pgWarmConns = 4

// warmPool opens pgWarmConns sessions of the pool at start, before the
// load comes: a session the first requests open themselves costs them its
// start (25-35 ms of the database's CPU on the machine of
// docs/performance.md), and through the official client at a steady
// 1,000 jobs/s the jobs of the first 300 ms waited 30-100 ms while the
// pool grew from two sessions to six (p99 over 10 s: 84 ms median, 54
// with four open from the start). Acquired rather than made by the pool's
// MinConns, whose sessions are opened on a context of their own: a
// database that drops connection attempts held Close (and so a failed
// start) for up to a minute; Close ends these at once (stopCtx). The
// sessions stay in the pool until idle for its MaxConnIdleTime.
func (p *PG) warmPool() {
	n := min(pgWarmConns, int(p.pool.Config().MaxConns))
	conns := make([]*pgxpool.Conn, n)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			if c, err := p.pool.Acquire(p.stopCtx); err == nil {
				conns[i] = c
			}
		})
	}
	wg.Wait()
	for _, c := range conns {
		if c != nil {
			c.Release()
		}
	}
}
