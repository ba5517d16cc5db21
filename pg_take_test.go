package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgLeaseCols is a job row's state and lease, as a claim wrote them.
type pgLeaseCols struct {
	state                 int16
	token, owner, broker  string
	started, expires, ttl int64
	timeout               *int64
}

func pgLeaseOf(t *testing.T, p *PG, id string) (pgLeaseCols, bool) {
	t.Helper()
	var l pgLeaseCols
	err := p.pool.QueryRow(t.Context(), p.sql(`SELECT state, coalesce(lease_token, ''), coalesce(lease_owner, ''),
		coalesce(lease_broker, ''), coalesce(started_at, 0), coalesce(lease_expires, 0), coalesce(lease_ttl, 0), timeout_at
		FROM {s}.jobs WHERE id = $1`), id).Scan(&l.state, &l.token, &l.owner, &l.broker, &l.started, &l.expires, &l.ttl, &l.timeout)
	if err != nil {
		return l, false
	}
	return l, true
}

// TestPGTakeClaimsInOneTrip: a claim round whose pulls all have an owner
// locks the jobs and writes their leases in one statement. The jobs go
// in claim order (priority, then as pushed) to the round's pulls in the
// order they came, each pull's with its own owner and lock; the rows hold
// the tokens the pulls were given. A job's own timeout ends its lease
// and is written as its timeout; a job whose TTL ran out while it waited
// is removed and given to no pull.
func TestPGTakeClaimsInOneTrip(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	const q = "take"
	low1 := pgReadyJob(t, p, q, map[string]any{"data": 1})
	high := pgReadyJob(t, p, q, map[string]any{"data": 2, "priority": 5})
	timed := pgReadyJob(t, p, q, map[string]any{"data": 3, "timeout": 4000})
	stale := mustJobAt(t, q, map[string]any{"data": 4, "ttl": 1000}, p.now()-60_000)
	low2 := pgReadyJob(t, p, q, map[string]any{"data": 5})
	left := pgReadyJob(t, p, q, map[string]any{"data": 6})
	for _, j := range []*Job{low1, high, timed, stale, low2, left} {
		if _, _, err := p.Push(ctx, q, []*Job{j}, false).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	a := &pgClaimReq{n: 2, o: PullOpts{Owner: "a", TTL: 10_000}, done: make(chan struct{})}
	b := &pgClaimReq{n: 3, o: PullOpts{Owner: "b", TTL: 20_000}, done: make(chan struct{})}
	before := p.claimLanes.taken.Load()
	p.claimRound(ctx, q, []*pgClaimReq{a, b})
	if a.err != nil || b.err != nil {
		t.Fatal(a.err, b.err)
	}
	if got := p.claimLanes.taken.Load() - before; got != 1 {
		t.Fatalf("%d rounds taken in one trip, want 1", got)
	}
	ids := func(jobs []*Job) []string {
		var s []string
		for _, j := range jobs {
			s = append(s, j.ID())
		}
		return s
	}
	// Claim order: high, stale (made a minute before the others), low1,
	// timed, low2. Pull a has the first two, less the one dropped; b the
	// next three.
	if want := []string{high.ID()}; !slices.Equal(ids(a.jobs), want) {
		t.Fatalf("pull a got %v, want %v", ids(a.jobs), want)
	}
	if want := []string{low1.ID(), timed.ID(), low2.ID()}; !slices.Equal(ids(b.jobs), want) {
		t.Fatalf("pull b got %v, want %v", ids(b.jobs), want)
	}
	for _, pull := range []struct {
		r     *pgClaimReq
		owner string
		ttl   int64
	}{{a, "a", 10_000}, {b, "b", 20_000}} {
		for i, j := range pull.r.jobs {
			l, ok := pgLeaseOf(t, p, j.ID())
			if !ok {
				t.Fatalf("job %s: no row", j.ID())
			}
			want := pull.r.tokens[i]
			if l.state != pgActive || l.token != want || l.owner != pull.owner || l.broker != p.broker || l.ttl != pull.ttl {
				t.Fatalf("job %s row %+v: want active, token %s, owner %s, broker %s, ttl %d", j.ID(), l, want, pull.owner, p.broker, pull.ttl)
			}
			if l := j.run().lease; l == nil || l.Token != want || l.Owner != pull.owner || l.TTL != pull.ttl {
				t.Fatalf("job %s in hand: lease %+v, want token %s", j.ID(), l, want)
			}
			end := l.started + pull.ttl
			if j.ID() == timed.ID() {
				if l.timeout == nil || *l.timeout != l.started+4000 {
					t.Fatalf("timed job: timeout_at %v, want %d", l.timeout, l.started+4000)
				}
				end = l.started + 4000
			} else if l.timeout != nil {
				t.Fatalf("job %s: timeout_at %d, want none", j.ID(), *l.timeout)
			}
			if l.expires != end {
				t.Fatalf("job %s: lease ends %d, want %d", j.ID(), l.expires, end)
			}
		}
	}
	if _, ok := pgLeaseOf(t, p, stale.ID()); ok {
		t.Fatal("the job whose TTL ran out is still there")
	}
	if l, _ := pgLeaseOf(t, p, left.ID()); l.state != pgQueued {
		t.Fatalf("the job no pull asked for is in state %d, want waiting", l.state)
	}
}

// TestPGTakeLeavesLimitedQueues: a queue with a concurrency limit claims
// in a transaction, which counts the limit; the round that finds it so
// costs no job, and the queue is remembered: its next rounds go to the
// transaction at once. Once the limit is cleared, rounds take again.
func TestPGTakeLeavesLimitedQueues(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	const q = "takelimited"
	for i := range 4 {
		if _, _, err := p.Push(ctx, q, []*Job{pgReadyJob(t, p, q, map[string]any{"data": i})}, false).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.SetConcurrency(ctx, q, 1); err != nil {
		t.Fatal(err)
	}
	claim := func(n int) []*Job {
		t.Helper()
		jobs, _, _, err := p.claim(ctx, q, n, PullOpts{Owner: "w", TTL: 10_000})
		if err != nil {
			t.Fatal(err)
		}
		return jobs
	}
	before := p.claimLanes.taken.Load()
	if got := claim(3); len(got) != 1 {
		t.Fatalf("a claim of 3 under a concurrency of 1 got %d jobs", len(got))
	}
	if got := claim(3); len(got) != 0 {
		t.Fatalf("a claim at the limit got %d jobs", len(got))
	}
	if n := p.claimLanes.taken.Load() - before; n != 0 {
		t.Fatalf("%d rounds of a limited queue taken in one trip", n)
	}
	p.claimMu.Lock()
	limited := p.claimLanes.limited[q]
	p.claimMu.Unlock()
	if !limited {
		t.Fatal("the limited queue is not remembered")
	}
	if err := p.ClearConcurrency(ctx, q); err != nil {
		t.Fatal(err)
	}
	if got := claim(1); len(got) != 1 {
		t.Fatalf("after the limit was cleared a claim got %d jobs", len(got))
	}
	if got := claim(2); len(got) != 2 {
		t.Fatalf("the next claim got %d jobs, want the last 2", len(got))
	}
	if n := p.claimLanes.taken.Load() - before; n != 1 {
		t.Fatalf("%d rounds taken in one trip after the limit was cleared, want 1", n)
	}
}

// TestPGTakePutsBackWhatItCouldNotHand: the take commits as its batch
// ends, before the broker reads what it took. A row whose record cannot
// be read, a newer build's here (a spoiled one is set aside and the round
// taken again: pg_unreadable.go), fails the round, as it failed a claim in
// a transaction; the jobs the take claimed go back to waiting at once,
// with no lease, rather than active under tokens no pull was given until
// those end.
func TestPGTakePutsBackWhatItCouldNotHand(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	const q = "takeback"
	good := pgReadyJob(t, p, q, map[string]any{"data": 1})
	if _, _, err := p.Push(ctx, q, []*Job{good}, false).Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.pool.Exec(ctx, p.sql(`INSERT INTO {s}.jobs (id, queue, state, priority, sort_key, run_at, created_at, body, plain)
		SELECT 'bad-record', queue, state, priority, sort_key + 1, run_at, created_at, '\x9103'::bytea, plain FROM {s}.jobs WHERE id = $1`), good.ID()); err != nil {
		t.Fatal(err)
	}
	before := p.claimLanes.taken.Load()
	if jobs, _, _, err := p.claim(ctx, q, 2, PullOpts{Owner: "w", TTL: 10_000}); err == nil || !strings.Contains(err.Error(), "newer build") {
		t.Fatalf("a round over a record that cannot be read claimed %d jobs and %v, want the newer build named", len(jobs), err)
	}
	if n := p.claimLanes.taken.Load() - before; n != 0 {
		t.Fatalf("%d rounds counted as taken", n)
	}
	for _, id := range []string{good.ID(), "bad-record"} {
		l, ok := pgLeaseOf(t, p, id)
		if !ok || l.state != pgQueued || l.token != "" || l.owner != "" || l.expires != 0 {
			t.Fatalf("job %s after the failed round: %+v (found %v), want waiting with no lease", id, l, ok)
		}
	}
	// Once the bad row is gone, the good job is claimed as any.
	if _, err := p.pool.Exec(ctx, p.sql(`DELETE FROM {s}.jobs WHERE id = 'bad-record'`)); err != nil {
		t.Fatal(err)
	}
	jobs, _, _, err := p.claim(ctx, q, 2, PullOpts{Owner: "w", TTL: 10_000})
	if err != nil || len(jobs) != 1 || jobs[0].ID() != good.ID() {
		t.Fatalf("the claim after: %d jobs, %v", len(jobs), err)
	}
}

// TestPGClaimCommitsWithoutFlush: a claim's transaction commits without
// waiting for its WAL (pgClaimPlan), and only that transaction: the next
// statements on the same session, an ACK's among them, commit with the
// flush again. A setting that outlived its claim would leave the
// session's later completions unflushed: done, and lost with a crash.
func TestPGClaimCommitsWithoutFlush(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	setting := func() string {
		t.Helper()
		var s string
		if err := conn.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// What the session must come back to: on, set here for the session
	// so that a database set otherwise still tests something.
	if _, err := conn.Exec(ctx, `SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	base := setting()
	// As a take sends it: one batch, one implicit transaction.
	b := &pgx.Batch{}
	b.Queue(pgClaimPlan)
	b.Queue(`SELECT current_setting('synchronous_commit')`)
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		t.Fatal(err)
	}
	var in string
	if err := br.QueryRow().Scan(&in); err != nil {
		t.Fatal(err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if in != "off" {
		t.Errorf("inside a claim's batch synchronous_commit is %s, want off", in)
	}
	if s := setting(); s != base {
		t.Errorf("after a claim's batch the session has synchronous_commit %s, want %s", s, base)
	}
	// As claimUngrouped runs it: inside BEGIN ... COMMIT.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, pgClaimPlan); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&in); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if in != "off" {
		t.Errorf("inside a claim's transaction synchronous_commit is %s, want off", in)
	}
	if s := setting(); s != base {
		t.Errorf("after a claim's transaction the session has synchronous_commit %s, want %s", s, base)
	}
}
