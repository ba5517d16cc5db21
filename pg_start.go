package main

// Opening a broker's PostgreSQL engine when the database may not be
// reachable yet: a broker started beside its database (compose, a host's
// boot order) comes up once the database does, rather than exiting.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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
