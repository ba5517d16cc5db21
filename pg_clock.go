package main

// The database's clock in PostgreSQL mode. Brokers compare each other's
// times: a lease's expiry, a job's run time, a cron's next run, a dedup
// key's expiry, rate and group windows, heartbeats and stall deadlines,
// DLQ entry times. Were each to use its own clock, a broker 40 s fast
// would reclaim every other broker's leases and run delayed jobs and
// crons early. So every time the engine writes or compares is the
// database's: a broker reads the database's clock at start and every
// pgClockEvery (the reading with the shortest round trip of a few, taken
// at its midpoint), and counts on from there with its monotonic clock,
// which a step of the wall clock does not move. Its own clock serves only
// to report how far off it is, and to notice a jump (a step, or a
// suspended machine, whose monotonic clock stood still), after which it
// reads the database's clock again.
//
// The reading is known to within half its round trip, plus what the
// monotonic clock may have drifted since (pgClockDrift), plus any jump
// seen since. While that exceeds pgClockBound the broker reads again, and
// if it still cannot tell the database's time to within the bound it
// refuses claims, and its reaper and cron wait, rather than act on a
// wrong time.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// pgClockBound is how far from the database's time a broker's may be
	// and the broker still claim jobs.
	pgClockBound = 500 * time.Millisecond
	// pgClockEvery is how often a broker reads the database's clock.
	pgClockEvery = 10 * time.Second
	// pgClockDrift bounds, in parts per million, how much faster or
	// slower the local monotonic clock runs than the database's: ten
	// times what a cheap crystal does, so that one reading is good for
	// four minutes (to half the bound) without another.
	pgClockDrift = 1000
	// pgClockReads is how many readings one look takes at most (fewer
	// when they are slow); the one with the shortest round trip is kept.
	pgClockReads = 3
)

// pgClockReading is the database's time at a local monotonic instant.
type pgClockReading struct {
	db   int64     // the database's time, µs since the epoch
	mono time.Time // the local instant it is for (the round trip's midpoint)
	wall int64     // the broker's own clock then, ms
	rtt  time.Duration
}

// pgClock is a broker's reading of the database's clock.
type pgClock struct {
	local func() int64 // the broker's own clock, ms
	cur   atomic.Pointer[pgClockReading]
	mu    sync.Mutex // one look at a time
	kick  chan struct{}
	bad   atomic.Bool // the reaper found it beyond the bound (logged once)

	// Under mu: the skew last reported, and when the last look began and
	// how it failed.
	logged    bool
	loggedAt  int64 // ms
	lookedAt  time.Time
	lastError error
}

// uncertainty is how far from the database's time now() may be at t.
func (c *pgClock) uncertainty(r *pgClockReading, t time.Time) time.Duration {
	if r == nil {
		return math.MaxInt64
	}
	age := t.Sub(r.mono)
	u := r.rtt/2 + age/1e6*pgClockDrift
	jump := time.Duration(c.local()-r.wall)*time.Millisecond - age
	return u + max(jump, -jump)
}

// now is the database's time, in ms. In PostgreSQL mode every time the
// engine writes or compares is this one.
func (p *PG) now() int64 {
	r := p.clock.cur.Load()
	if r == nil {
		// Not read yet (queued migrate, or a broker that could not): its own.
		if p.clock.local != nil {
			return p.clock.local()
		}
		return nowMs()
	}
	return (r.db + time.Since(r.mono).Microseconds()) / 1000
}

// clockReady answers whether this broker knows the database's time to
// within pgClockBound, reading it again first if it does not: claims,
// the reaper and cron go on only then.
func (p *PG) clockReady(ctx context.Context) error {
	c := &p.clock
	u := c.uncertainty(c.cur.Load(), time.Now())
	if u <= pgClockBound/2 {
		return nil
	}
	if u <= pgClockBound {
		// Good still, but not for long: look again off the command path.
		select {
		case c.kick <- struct{}{}:
		default:
		}
		return nil
	}
	err := p.readClock(ctx)
	r := c.cur.Load()
	if u = c.uncertainty(r, time.Now()); u <= pgClockBound {
		return nil
	}
	if r == nil {
		return fmt.Errorf("claims are refused until the database's clock can be read (they need this broker's time within %v of the database's): %w", pgClockBound, err)
	}
	why := fmt.Sprintf("last read %v ago with a round trip of %v", time.Since(r.mono).Round(time.Millisecond), r.rtt.Round(time.Millisecond))
	if err != nil {
		why += "; reading it again: " + err.Error()
	}
	return fmt.Errorf("claims are refused while this broker knows the database's time only to within %v, beyond the bound of %v (%s)",
		u.Round(time.Millisecond), pgClockBound, why)
}

// readClock looks at the database's clock and keeps the reading if it is
// better than the one held. Callers that wait while another looks take
// that look's reading.
func (p *PG) readClock(ctx context.Context) error {
	c := &p.clock
	asked := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lookedAt.After(asked) {
		return c.lastError
	}
	c.lookedAt = time.Now()
	best, err := p.readClockOnce(ctx)
	c.lastError = err
	if best == nil {
		return err
	}
	now := time.Now()
	if cur := c.cur.Load(); cur != nil && c.uncertainty(cur, now) <= c.uncertainty(best, now) {
		return err
	}
	c.cur.Store(best)
	skew := best.db/1000 - best.wall
	if !c.logged || max(skew-c.loggedAt, c.loggedAt-skew) > pgClockBound.Milliseconds() {
		c.logged, c.loggedAt = true, skew
		attrs := []any{"skew", time.Duration(skew) * time.Millisecond, "round_trip", best.rtt.Round(time.Microsecond)}
		if max(skew, -skew) > pgClockBound.Milliseconds() {
			p.log.Warn("this broker's clock differs from the database's; PostgreSQL mode goes by the database's (skew: the database's minus this broker's)", attrs...)
		} else {
			p.log.Info("database clock read (skew: the database's minus this broker's)", attrs...)
		}
	}
	return err
}

// readClockOnce takes up to pgClockReads readings on one connection and
// answers the one with the shortest round trip. Only the query is timed,
// not the wait for a connection; each is one round trip (the simple
// protocol: no statement to prepare first).
func (p *PG) readClockOnce(ctx context.Context) (*pgClockReading, error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the database's clock: %w", err)
	}
	defer conn.Release()
	var best *pgClockReading
	start := time.Now()
	for range pgClockReads {
		t0, w0 := time.Now(), p.clock.local()
		var us int64
		err = conn.QueryRow(ctx, `SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint`,
			pgx.QueryExecModeSimpleProtocol).Scan(&us)
		t1, w1 := time.Now(), p.clock.local()
		if err != nil {
			err = fmt.Errorf("read the database's clock: %w", err)
			break
		}
		rtt := t1.Sub(t0)
		if best == nil || rtt < best.rtt {
			best = &pgClockReading{db: us, mono: t0.Add(rtt / 2), wall: w0 + (w1-w0)/2, rtt: rtt}
		}
		if rtt < pgClockBound/50 || t1.Sub(start) > 2*pgClockBound {
			break // as good as a reading gets, or no time for another
		}
	}
	if best != nil && best.rtt/2 > pgClockBound {
		// Kept if nothing better is held, but said.
		err = errors.Join(err, fmt.Errorf("the database's clock answered in %v at best (a reading is good to half its round trip; claims need %v)",
			best.rtt.Round(time.Millisecond), pgClockBound))
	}
	return best, err
}

// clockLoop reads the database's clock every pgClockEvery, and at once
// when a claim finds the reading getting old.

// clockHolds is clockReady for the background loops: the reaper reports
// a change (once each way), cron waits quietly.
func (p *PG) clockHolds(ctx context.Context, report bool) bool {
	err := p.clockReady(ctx)
	if report {
		if err != nil && !p.clock.bad.Swap(true) {
			p.log.Error("expired leases, DLQ expiry and cron wait for the database's clock", "err", err)
		} else if err == nil && p.clock.bad.Swap(false) {
			p.log.Info("the database's clock is known again; expired leases, DLQ expiry and cron go on")
		}
	}
	return err == nil
}
