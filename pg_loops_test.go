package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestPGLoopsApart: the background loops of a broker never come due
// together. Over ten seconds (a whole cycle of their intervals) no two
// loops' rounds are due within 5 ms of each other, so that an idle broker
// serves them on one or two pool connections, not one each.
func TestPGLoopsApart(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, _ := openTestPG(t, ctx, ns, pgOptions{})
	if len(p.loops) != 7 {
		t.Fatalf("%d background loops, want 7: peers, the reaper, cron, the clock, retention, ANALYZE and the inbox (docs/postgresql.md names them)", len(p.loops))
	}
	type due struct {
		at   time.Duration
		loop int
	}
	var all []due
	for i, every := range p.loops {
		for at := time.Duration(i)*pgLoopStagger + every; at <= 10*time.Second; at += every {
			all = append(all, due{at, i})
		}
	}
	slices.SortFunc(all, func(a, b due) int { return cmp.Compare(a.at, b.at) })
	for k := 1; k < len(all); k++ {
		if a, b := all[k-1], all[k]; a.loop != b.loop && b.at-a.at < 5*time.Millisecond {
			t.Fatalf("loops %d (every %v) and %d (every %v) come due %v apart, at %v", a.loop, p.loops[a.loop], b.loop, p.loops[b.loop], b.at-a.at, b.at)
		}
	}
}

// pgTrips counts what a broker's sessions send the database: statements,
// and batches as one.
type pgTrips struct{ n atomic.Int64 }

func (c *pgTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *pgTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *pgTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *pgTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *pgTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestPGIdleBrokerAsksLittle: a broker with nothing to do sends its
// database a few statements a second (7.5 measured). Its cron look read
// the schedules ten times a second in a transaction (three statements
// each), and its reaper opened two transactions four times a second:
// 39.7 a second in all, each costing the database's CPU.
func TestPGIdleBrokerAsksLittle(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	session := defaultPGSession
	trips := &pgTrips{}
	session.tracer = trips
	openTestPG(t, ctx, ns, pgOptions{session: &session})
	// Over a whole cycle of the loops' intervals, from their first
	// rounds on. A busy machine makes the loops run late and fewer
	// times, never more.
	const window = 10 * time.Second
	from := trips.n.Load()
	time.Sleep(window)
	n := trips.n.Load() - from
	t.Logf("%d round trips in %v", n, window)
	if perSecond := float64(n) / window.Seconds(); perSecond > 20 {
		t.Fatalf("an idle broker made %.1f round trips a second to its database, want at most 20", perSecond)
	}
}

// TestPGCronFiresWhenItsBrokerIsGone: a schedule added through one broker
// runs on another once the first is gone, though the other trusts what it
// read of the next run for a while (pgCronLook): its first run, due
// 300 ms after the add, is made within a few seconds, not when the
// other's reading of "no schedule" would have run out had it no bound.
func TestPGCronFiresWhenItsBrokerIsGone(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	a := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{})
	b := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{})
	eventually(t, 20*time.Second, "b read that no schedule is due", func() (bool, string) {
		at, _, fresh := b.pg.cronNext.fresh()
		return fresh && at == math.MaxInt64, fmt.Sprint(at, fresh)
	})
	dial(t, a.addr).ok(M{"cmd": "Cron", "name": "tick", "queue": "ticks", "data": M{"x": 1}, "repeatEvery": 300, "preventOverlap": false})
	a.pg.Close()
	cb := dial(t, b.addr)
	eventually(t, 10*time.Second, "a run made by the broker left", func() (bool, string) {
		counts := sub(t, cb.ok(M{"cmd": "GetJobCounts", "queue": "ticks"}), "counts")
		return num(t, counts["waiting"]) >= 1, fmt.Sprint(counts)
	})
}

// TestPGPoolOpensSessionsAtStart: a broker opens pgWarmConns sessions of
// its pool before any load, so that the first requests do not wait for
// sessions to start.
func TestPGPoolOpensSessionsAtStart(t *testing.T) {
	t.Parallel()
	_, _, p := waitTestBroker(t, 30*time.Second)
	eventually(t, 20*time.Second, "the sessions open", func() (bool, string) {
		st := p.pool.Stat()
		return st.TotalConns() >= pgWarmConns, fmt.Sprintf("%d open", st.TotalConns())
	})
}

// TestPGFailedConnectEndsAtItsDeadline: opening the engine's pool and
// schema (a broker's start after its first look, queued migrate) against
// a database that takes connections and never answers fails at the
// deadline. The pool's own MinConns, tried first for warmPool, opened its
// sessions on a context of a minute of their own, which closing the
// failed pool waited for.
func TestPGFailedConnectEndsAtItsDeadline(t *testing.T) {
	t.Parallel()
	addr := blackholeAcceptingAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	b := NewBroker()
	t.Cleanup(b.Close)
	began := time.Now()
	p, err := connectPG(ctx, "postgres://postgres@"+addr+"/test?sslmode=disable", "tdead", b, quietLog(), defaultPGSession)
	if err == nil {
		p.Close()
		t.Fatal("connecting to a database that never answers succeeded")
	}
	// The deadline is 2 s; a minute's wait is what is ruled out.
	if took := time.Since(began); took > 20*time.Second {
		t.Fatalf("the failed connect took %v", took)
	}
}
