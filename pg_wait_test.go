package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgWaitingPull starts a pull of up to n jobs on queue that waits up to
// 20 s, and answers a channel that gets the ids it was given.
func pgWaitingPull(t *testing.T, ctx context.Context, p *PG, queue string, n int) chan []string {
	t.Helper()
	return pgPullFor(t, ctx, p, queue, n, 20000)
}

// pgWaiting waits until n pulls wait on queue.
func pgWaiting(t *testing.T, p *PG, queue string, n int) {
	t.Helper()
	eventually(t, 10*time.Second, "pulls waiting", func() (bool, string) {
		p.wmu.Lock()
		defer p.wmu.Unlock()
		return len(p.waiters[queue]) == n, fmt.Sprintf("%d waiting, want %d", len(p.waiters[queue]), n)
	})
}

// waitTestBroker opens a broker on a namespace of its own, with a
// context that ends with the test or after d, before the broker closes
// (the pulls still waiting end on it rather than on a closed pool).
func waitTestBroker(t *testing.T, d time.Duration) (context.Context, string, *PG) {
	t.Helper()
	ns := pgTestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	p, _ := openTestPG(t, ctx, ns, pgOptions{})
	t.Cleanup(cancel) // after openTestPG's, so run before them
	return ctx, ns, p
}

// TestPGSteadyClaimsOncePerJob: at a steady trickle, with two pulls always
// waiting and a pull sent again as soon as one is answered (the official
// Worker's way), a job costs about one claim transaction. Before, every
// push woke every waiting pull and each new pull claimed once before it
// waited: 2.8 claims a job at 200 jobs/s, 1.9 of them finding nothing.
func TestPGSteadyClaimsOncePerJob(t *testing.T) {
	t.Parallel()
	t.Run("alone", func(t *testing.T) { t.Parallel(); steadyClaims(t, false) })
	// With another broker on the namespace, this one's wake-ups go out to
	// it, and come back: they were taken for another broker's pushes,
	// which wake every waiting pull and end the mark (two brokers, 3,000
	// jobs pushed one at a time: 4.9 claim transactions a job).
	t.Run("beside a peer", func(t *testing.T) { t.Parallel(); steadyClaims(t, true) })
}

// steadyClaims pushes jobs one at a time to two waiting pulls, which ask
// again as soon as they have their job, and counts the claim transactions.
func steadyClaims(t *testing.T, peer bool) {
	ctx, ns, p := waitTestBroker(t, 90*time.Second)
	if peer {
		openTestPG(t, ctx, ns, pgOptions{})
		eventually(t, 20*time.Second, "the broker forwarding to its peer", func() (bool, string) {
			return p.forwarding(), "alone"
		})
	}
	const q, jobs = "steady", 30
	pulls := []chan []string{pgWaitingPull(t, ctx, p, q, 10), pgWaitingPull(t, ctx, p, q, 10)}
	pgWaiting(t, p, q, 2)
	before := p.claimsRun.Load()
	seen := map[string]bool{}
	for i := range jobs {
		ids, _, err := p.Push(ctx, q, []*Job{mustJob(t, q, map[string]any{"data": i})}, false).Wait()
		if err != nil {
			t.Fatal(err)
		}
		// The pull that gets it answers; the worker asks again at once.
		var got []string
		select {
		case got = <-pulls[0]:
			pulls = pulls[1:]
		case got = <-pulls[1]:
			pulls = pulls[:1]
		case <-time.After(20 * time.Second):
			t.Fatalf("job %d: no waiting pull was given it", i)
		}
		if len(got) != 1 || got[0] != ids[0] || seen[got[0]] {
			t.Fatalf("job %d (%s): a pull was given %v", i, ids[0], got)
		}
		seen[got[0]] = true
		pulls = append(pulls, pgWaitingPull(t, ctx, p, q, 10))
		pgWaiting(t, p, q, 2)
	}
	claims := p.claimsRun.Load() - before
	t.Logf("%d claim transactions for %d jobs", claims, jobs)
	// One a job; more where a wait outlived the mark (pgRecheck), and,
	// beside a peer, where its forwarded wake-ups ended marks: 44-49 for
	// 30 with the whole suite running beside (147 before the marks).
	if claims > 2*jobs {
		t.Fatalf("%d claim transactions for %d jobs, want about one a job", claims, jobs)
	}
}

// TestPGDrainedMarkEnds: a queue a claim found empty is not claimed from by
// a new pull, which waits; every way a job becomes ready ends that: a push
// of this broker, another broker's push, a delayed job coming due.
func TestPGDrainedMarkEnds(t *testing.T) {
	t.Parallel()
	ctx, ns, p := waitTestBroker(t, 90*time.Second)
	const q = "marks"
	take := func(pull chan []string, want string, what string) {
		t.Helper()
		select {
		case got := <-pull:
			if len(got) != 1 || got[0] != want {
				t.Fatalf("%s: the waiting pull was given %v, want [%s]", what, got, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the waiting pull was not given the job", what)
		}
	}
	var other *PG
	for _, tc := range []struct {
		what string
		by   func() *PG
		job  map[string]any
	}{
		{"a push of this broker", func() *PG { return p }, map[string]any{"data": 1}},
		{"a push of another broker", func() *PG { return other }, map[string]any{"data": 2}},
		{"a delayed job", func() *PG { return p }, map[string]any{"data": 3, "delay": 300}},
	} {
		// An empty claim makes the mark; the next pull waits without one.
		began := time.Now()
		if first := <-pgPullFor(t, ctx, p, q, 1, 0); len(first) != 0 {
			t.Fatalf("%s: an empty queue gave %v", tc.what, first)
		}
		before := p.claimsRun.Load()
		pull := pgWaitingPull(t, ctx, p, q, 5)
		pgWaiting(t, p, q, 1)
		if other == nil && tc.job["data"] == 2 {
			// Opened only now: with a second broker listening, each
			// hears the other's wake-ups, and those end marks at times
			// this test does not control.
			other, _ = openTestPG(t, ctx, ns, pgOptions{})
		}
		ids, _, err := tc.by().Push(ctx, q, []*Job{mustJob(t, q, tc.job)}, false).Wait()
		if err != nil {
			t.Fatal(err)
		}
		take(pull, ids[0], tc.what)
		// One claim, after the wake-up: none before it.
		if n := p.claimsRun.Load() - before; n != 1 && other == nil && time.Since(began) < pgRecheck/2 {
			t.Fatalf("%s: the pull claimed %d times, want once", tc.what, n)
		}
	}
}

// TestPGMarkOnlyWhenNothingReady: a claim that finds nothing to take
// while a ready job is held locked by another transaction (a claim of
// another broker, a deduplicated push, a progress update) leaves no mark,
// nor does a claim that took fewer jobs than it asked for: the lock ends,
// or the other job comes due, with no wake-up, and a new pull that skipped
// its claim would have slept a second.
func TestPGMarkOnlyWhenNothingReady(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	const q = "locked"
	ids, _, err := p.Push(ctx, q, []*Job{mustJob(t, q, map[string]any{"data": 1})}, false).Wait()
	if err != nil {
		t.Fatal(err)
	}
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, p.sql(`SELECT 1 FROM {s}.jobs WHERE id = $1 FOR UPDATE`), ids[0]); err != nil {
		t.Fatal(err)
	}
	if got := <-pgPullFor(t, ctx, p, q, 1, 0); len(got) != 0 {
		t.Fatalf("a pull took %v, held locked by another transaction", got)
	}
	if empty, _ := p.knownEmpty(q, p.now()); empty {
		t.Fatal("a claim that skipped a locked ready job marked the queue empty")
	}
	tx.Rollback(ctx)
	// One ready job and one delayed: a pull of two takes the ready one.
	if _, _, err := p.Push(ctx, q, []*Job{mustJob(t, q, map[string]any{"data": 2, "delay": 60000})}, false).Wait(); err != nil {
		t.Fatal(err)
	}
	if got := <-pgPullFor(t, ctx, p, q, 2, 0); len(got) != 1 || got[0] != ids[0] {
		t.Fatalf("a pull of two was given %v, want [%s]", got, ids[0])
	}
	if empty, _ := p.knownEmpty(q, p.now()); empty {
		t.Fatal("a claim that took fewer jobs than it asked for marked the queue empty")
	}
}

// pgPullFor starts a pull of up to n jobs on queue that waits up to ms
// (0: not at all), and answers a channel that gets the ids it was given.
func pgPullFor(t *testing.T, ctx context.Context, p *PG, queue string, n int, ms int64) chan []string {
	t.Helper()
	got := make(chan []string, 1)
	var ids []string
	answer := func(jobs []*Job, _ []string) {
		for _, j := range jobs {
			ids = append(ids, j.ID())
		}
	}
	wait, err := p.Pull(ctx, queue, n, PullOpts{}, ms, answer)
	if err != nil {
		t.Fatal(err)
	}
	if wait == nil {
		got <- ids
		return got
	}
	go func() {
		if _, err := wait(answer); err != nil {
			t.Error(err)
		}
		got <- ids
	}()
	return got
}

// TestPGScansWalkTheirIndex: the reaper's and the DLQ's looks (txJobs,
// and reapDue before them) walk their partial index in order instead of a bitmap scan, which visits
// the heap page of every dead entry the index still holds (35 ms a look
// after 100,000 jobs with VACUUM behind, four looks a second).
func TestPGScansWalkTheirIndex(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	// A table most of whose rows have finished, as after a busy day, and
	// not analyzed since (as with autovacuum behind): the planner guesses a
	// few hundred rows from each partial index, and picks a bitmap scan for
	// them unless told otherwise (checked below). The broker's statistics
	// chore (pg_analyze.go) is held off, as it would analyze the table.
	// The leased and dead-lettered rows hold a newer build's record, which
	// the broker's reaper leaves as it is (a record it took for spoiled
	// would be set aside, and the rows gone from the indexes looked at).
	if _, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.chores SET due = $1 WHERE name = 'analyze'`), int64(1)<<62); err != nil {
		t.Fatal(err)
	}
	if _, err := p.pool.Exec(ctx, p.sql(`INSERT INTO {s}.jobs (id, queue, state, priority, sort_key, run_at, created_at, done_at, body)
		SELECT 'done' || i, 'q', {done}, 0, i, 0, 0, i, '\x80'::bytea FROM generate_series(1, 20000) AS i;
		INSERT INTO {s}.jobs (id, queue, state, priority, sort_key, run_at, created_at, lease_expires, dlq_due, body)
		SELECT 'x' || i, 'q', CASE WHEN i % 2 = 0 THEN {active} ELSE {dlq} END, 0, i, 0, 0, i, i, '\x9103'::bytea
		FROM generate_series(1, 400) AS i`)); err != nil {
		t.Fatal(err)
	}
	explain := func(query string, planned bool) string {
		t.Helper()
		tx, err := p.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if planned {
			if _, err := tx.Exec(ctx, pgScanPlan); err != nil {
				t.Fatal(err)
			}
		}
		var plan string
		if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+p.sql(query), p.now()).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		return plan
	}
	for name, query := range map[string]string{"reaper": pgReapSQL, "dlq": pgDLQDueSQL} {
		if plan := explain(query, false); !strings.Contains(plan, "Bitmap") {
			t.Fatalf("%s: PostgreSQL picked no bitmap scan unasked, so this table does not show what the plan is for:\n%s", name, plan)
		}
		if plan := explain(query, true); !strings.Contains(plan, `"Index Scan"`) || strings.Contains(plan, "Bitmap") {
			t.Errorf("%s: the look does not walk its index in order:\n%s", name, plan)
		}
	}
	// The reaper's look before them (reapDue) walks the same indexes,
	// sent as it sends it: in one batch with the scan plan, outside a
	// transaction.
	b := &pgx.Batch{}
	b.Queue(pgScanPlan)
	b.Queue("EXPLAIN (FORMAT JSON) "+p.sql(pgReapDueSQL), p.now())
	br := p.pool.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		t.Fatal(err)
	}
	var plan string
	if err := br.QueryRow().Scan(&plan); err != nil {
		t.Fatal(err)
	}
	br.Close()
	if !strings.Contains(plan, `"jobs_lease"`) || !strings.Contains(plan, `"jobs_dlq_due"`) ||
		strings.Contains(plan, "Bitmap") || strings.Contains(plan, "Seq Scan") {
		t.Errorf("the reaper's look does not walk the two indexes:\n%s", plan)
	}
}
