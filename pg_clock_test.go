package main

// PostgreSQL mode goes by the database's clock: brokers run in this
// process, one of them on a clock of the test's.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pgInProcess is a PostgreSQL-mode broker in this process, on the clock
// and with the engine options the test gives.
type pgInProcess struct {
	b    *Broker
	pg   *PG
	addr string
}

func startPGInProcess(t *testing.T, dbURL, ns string, clock func() int64, o pgOptions) *pgInProcess {
	t.Helper()
	return startPGInProcessWith(t, dbURL, ns, clock, o, nil)
}

// startPGInProcessWith is startPGInProcess with setup run on the broker
// before it opens the namespace (setting --max-queues, say).
func startPGInProcessWith(t *testing.T, dbURL, ns string, clock func() int64, o pgOptions, setup func(b *Broker)) *pgInProcess {
	t.Helper()
	b := NewBroker()
	if clock != nil {
		b.now = clock
	}
	if setup != nil {
		setup(b)
	}
	log := quietLog()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pg, err := openPG(ctx, dbURL, ns, b, log, o)
	if err != nil {
		b.Close()
		t.Fatal(err)
	}
	srv := NewServer(b, pg, nil, log)
	srv.usePG(pg)
	addr := serveTest(t, srv, func() {
		pg.Close()
		b.Close()
	})
	return &pgInProcess{b: b, pg: pg, addr: addr}
}

// dbNow reads the database's clock, in ms.
func dbNow(t *testing.T, p *PG) int64 {
	t.Helper()
	var ms int64
	if err := p.pool.QueryRow(context.Background(), `SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint`).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	return ms
}

// TestPGClockSkewStealsNothing: a broker whose clock is 40 s fast takes
// no lease another broker handed out, claims no delayed job early and
// fires no cron early; times either broker writes hold on the other.
func TestPGClockSkewStealsNothing(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	a := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{})
	b := startPGInProcess(t, testPGURL(), ns, func() int64 { return nowMs() + 40000 }, pgOptions{})
	if skew, ok := b.pg.clockSkew(); !ok || skew > -39*time.Second || skew < -41*time.Second {
		t.Fatalf("the fast broker measured a skew of %v (read: %v), want about -40s", skew, ok)
	}
	// The database's time is read between two of the broker's, so that
	// a slow query (a loaded machine) widens the window, not the skew.
	before := b.pg.now()
	db := dbNow(t, a.pg)
	after := b.pg.now()
	if db < before-500 || db > after+500 {
		t.Fatalf("the database's time is %d ms before the fast broker's or %d ms after it, want within 500",
			before-db, db-after)
	}
	ca, cb := dial(t, a.addr), dial(t, b.addr)

	// Through A: a job leased for 30 s, one leased for 1 s (which must
	// come back, so that the reapers are seen to run), a job delayed
	// 20 s and a cron due every 20 s.
	lease, tok := push(t, ca, "skew-lease", nil), ""
	if id, tk := pullOwned(t, ca, "skew-lease", M{"lockTtl": 30000}); id != lease {
		t.Fatalf("pulled %s, want %s", id, lease)
	} else {
		tok = tk
	}
	short := push(t, ca, "skew-short", nil)
	pullOwned(t, ca, "skew-short", M{"lockTtl": 1000})
	delayed := push(t, ca, "skew-delay", M{"delay": 20000})
	ca.ok(M{"cmd": "Cron", "name": "skew-cron", "queue": "skew-cron", "data": M{"x": 1}, "repeatEvery": 20000})

	if a := cb.ok(M{"cmd": "PULL", "queue": "skew-delay", "timeout": 0}); a["job"] != nil {
		t.Fatalf("the fast broker claimed a job delayed 20 s at once: %v", a)
	}
	waitState(t, cb, short, "waiting", 20*time.Second)
	// Every reaper and cron loop has run several times since the leases
	// were handed out.
	time.Sleep(time.Second)
	if st := state(t, cb, lease); st != "active" {
		t.Fatalf("the 30 s lease is %s after a few seconds, want active", st)
	}
	if st := state(t, cb, delayed); st != "delayed" {
		t.Fatalf("the job delayed 20 s is %s, want delayed", st)
	}
	if a := cb.ok(M{"cmd": "PULL", "queue": "skew-delay", "timeout": 0}); a["job"] != nil {
		t.Fatalf("the fast broker claimed a job delayed 20 s early: %v", a)
	}
	counts := sub(t, cb.ok(M{"cmd": "GetJobCounts", "queue": "skew-cron"}), "counts")
	for k, v := range counts {
		if num(t, v) != 0 {
			t.Fatalf("the cron due in 20 s fired early: %s=%v", k, v)
		}
	}
	if a := ca.ok(M{"cmd": "ACK", "id": lease, "token": tok}); a["data"] != nil {
		if d, _ := a["data"].(M); d["applied"] == false {
			t.Fatalf("the ACK of the 30 s lease was refused: %v", a)
		}
	}
	if st := state(t, ca, lease); st != "completed" {
		t.Fatalf("the 30 s lease's job is %s after its ACK", st)
	}

	// The other way: a job delayed 1.5 s through the fast broker is due
	// 1.5 s later by the database's time, not 41.5 s.
	push(t, cb, "skew-soon", M{"delay": 1500})
	got, err := ca.do(M{"cmd": "PULL", "queue": "skew-soon", "timeout": 15000}, 20*time.Second)
	if err != nil || got["job"] == nil {
		t.Fatalf("a job delayed 1.5 s through the fast broker was not claimable through the other within 15 s: %v %v", got, err)
	}
}

// slowProxy forwards to PostgreSQL, holding each answer back by delay.
type slowProxy struct {
	addr  string
	delay atomic.Int64 // ns
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newSlowProxy(t *testing.T, target string) *slowProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &slowProxy{addr: ln.Addr().String(), ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() {
				defer p.wg.Done()
				io.Copy(up, c)
				up.Close()
				c.Close()
			}()
			go func() {
				defer p.wg.Done()
				buf := make([]byte, 32<<10)
				for {
					n, err := up.Read(buf)
					if n > 0 {
						time.Sleep(time.Duration(p.delay.Load()))
						if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				up.Close()
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// TestPGClockUnmeasurable: a broker whose clock jumped, and which cannot
// read the database's clock again to within the bound (the database
// answers only after 1.2 s), refuses claims with an error naming the
// bound; once the database answers promptly it claims again.
func TestPGClockUnmeasurable(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	u, err := url.Parse(testPGURL())
	if err != nil {
		t.Fatal(err)
	}
	px := newSlowProxy(t, u.Host)
	u.Host = px.addr
	var jump atomic.Int64
	b := startPGInProcess(t, u.String(), ns, func() int64 { return nowMs() + jump.Load() }, pgOptions{})
	c := dial(t, b.addr)
	id := push(t, c, "clock-q", nil)

	px.delay.Store(int64(1200 * time.Millisecond))
	jump.Store(5000)
	a, err := c.do(M{"cmd": "PULL", "queue": "clock-q", "timeout": 0}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := a["error"].(string)
	if a["ok"] != false || !strings.Contains(msg, "bound of 500ms") {
		t.Fatalf("a claim while the database's time is known only to within 600 ms: %v", a)
	}
	t.Logf("refused: %s", msg)

	px.delay.Store(0)
	eventually(t, 20*time.Second, "a claim once the database answers promptly", func() (bool, string) {
		a, err := c.do(M{"cmd": "PULL", "queue": "clock-q", "timeout": 0}, 20*time.Second)
		if err != nil {
			return false, err.Error()
		}
		j, _ := a["job"].(M)
		return j != nil && j["id"] == id, fmt.Sprint(a)
	})
	if skew, _ := b.pg.clockSkew(); skew > -4500*time.Millisecond || skew < -5500*time.Millisecond {
		t.Fatalf("skew after the jump: %v, want about -5s", skew)
	}
}

// clockSkew is how far the database's clock is ahead of this broker's
// (negative: behind), as last read.
func (p *PG) clockSkew() (time.Duration, bool) {
	r := p.clock.cur.Load()
	if r == nil {
		return 0, false
	}
	return time.Duration(r.db/1000-r.wall) * time.Millisecond, true
}

// TestPGRunNowAcrossBrokers: a job made ready to run now through one
// broker is ready on every other at once, though each knows the
// database's time only to within its reading (here one broker's is taken
// 400 ms ahead, inside what a broker tolerates before it refuses
// claims): pulled without a wait, its state, the counts. Each broker had
// compared the writer's time with its own, so a job pushed through a
// broker slightly ahead looked delayed, and could not be pulled, on the
// others for as long as the difference.
func TestPGRunNowAcrossBrokers(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	a := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{})
	b := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{})
	// B's reading, 400 ms ahead; B looks again no sooner than an hour
	// from now, so that no new reading replaces it during the test.
	b.pg.clock.mu.Lock()
	r := *b.pg.clock.cur.Load()
	r.db += 400_000
	b.pg.clock.cur.Store(&r)
	b.pg.clock.lookedAt = time.Now().Add(time.Hour)
	b.pg.clock.mu.Unlock()
	if d := b.pg.now() - a.pg.now(); d < 390 {
		t.Fatalf("B is %d ms ahead of A, want 400", d)
	}
	ca, cb := dial(t, a.addr), dial(t, b.addr)
	ready := func(id, how string) {
		t.Helper()
		if st := state(t, ca, id); st != "waiting" {
			t.Fatalf("%s through B: %s through A, want waiting", how, st)
		}
		counts := sub(t, ca.ok(M{"cmd": "GetJobCounts", "queue": "runnow"}), "counts")
		if num(t, counts["waiting"]) != 1 || num(t, counts["delayed"]) != 0 {
			t.Fatalf("%s through B: counts through A %v, want one waiting", how, counts)
		}
		got := ca.ok(M{"cmd": "PULL", "queue": "runnow", "timeout": 0})
		if j, _ := got["job"].(map[string]any); j == nil || j["id"] != id {
			t.Fatalf("%s through B: a PULL through A without a wait answered %v, want %s", how, got, id)
		}
		ca.ok(M{"cmd": "ACK", "id": id})
	}
	ready(push(t, cb, "runnow", nil), "pushed")
	// Written again through B: a delayed job promoted.
	later := push(t, cb, "runnow", M{"delay": 600000})
	if st := state(t, ca, later); st != "delayed" {
		t.Fatalf("a job delayed 10 minutes is %s, want delayed", st)
	}
	cb.ok(M{"cmd": "Promote", "id": later})
	ready(later, "promoted")
	// A batch large enough to be copied in (pgCopyMin).
	var jobs []any
	for i := range pgCopyMin {
		jobs = append(jobs, M{"data": i})
	}
	ids := list(t, cb.ok(M{"cmd": "PUSHB", "queue": "runcopy", "jobs": jobs}), "ids")
	counts := sub(t, ca.ok(M{"cmd": "GetJobCounts", "queue": "runcopy"}), "counts")
	if num(t, counts["waiting"]) != float64(len(ids)) || num(t, counts["delayed"]) != 0 {
		t.Fatalf("a PUSHB of %d through B: counts through A %v, want all waiting", len(ids), counts)
	}
	if got := ca.ok(M{"cmd": "PULLB", "queue": "runcopy", "count": len(ids), "timeout": 0}); len(list(t, got, "jobs")) != len(ids) {
		t.Fatalf("a PULLB through A without a wait took %d of %d jobs", len(list(t, got, "jobs")), len(ids))
	}
	// A job delayed past the skew stays delayed on both.
	soon := push(t, cb, "runnow", M{"delay": 5000})
	for _, c := range []*tclient{ca, cb} {
		if st := state(t, c, soon); st != "delayed" {
			t.Fatalf("a job delayed 5 s is %s, want delayed", st)
		}
	}
	if d := b.pg.now() - a.pg.now(); d < 390 {
		t.Fatalf("B's reading was replaced during the test: %d ms ahead of A", d)
	}
}
