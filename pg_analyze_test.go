package main

import (
	"strings"
	"testing"
	"time"
)

func TestPGStaleStats(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pages, relpages int64
		reltuples       float64
		want            bool
	}{
		{0, 0, -1, false},                  // new and empty
		{pgAnalyzePages - 1, 0, -1, false}, // never analyzed, still tiny
		{pgAnalyzePages, 0, -1, true},      // never analyzed, no longer tiny
		{pgAnalyzePages, 0, 0, true},       // analyzed empty, grown since
		{100, 60, 3000, false},             // within twofold
		{121, 60, 3000, true},              // grew past twice
		{100, 201, 9000, true},             // shrank past half
		{4, 100, 9000, false},              // shrank to tiny: the guess for tiny is near enough
	} {
		if got := pgStaleStats(c.pages, c.relpages, c.reltuples); got != c.want {
			t.Errorf("pgStaleStats(%d, %d, %v) = %v, want %v", c.pages, c.relpages, c.reltuples, got, c.want)
		}
	}
}

// TestPGAnalyzeLookDue: a young table is looked at again after
// pgYoungLook (at a push's nudge); an older one after pgRetainEvery.
func TestPGAnalyzeLookDue(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pages int64
		since time.Duration
		want  bool
	}{
		{0, time.Since(time.Time{}), true}, // the first look
		{0, pgYoungLook - time.Millisecond, false},
		{pgYoungPages - 1, pgYoungLook, true},
		{pgYoungPages, pgYoungLook, false},
		{pgYoungPages, pgRetainEvery - time.Millisecond, false},
		{pgYoungPages, pgRetainEvery, true},
		{100_000, pgRetainEvery, true},
	} {
		if got := pgAnalyzeLookDue(c.pages, c.since); got != c.want {
			t.Errorf("pgAnalyzeLookDue(%d, %v) = %v, want %v", c.pages, c.since, got, c.want)
		}
	}
}

// TestPGStatsWatchNudges: a push nudges the chore only while the table is
// young, and a nudge never waits.
func TestPGStatsWatchNudges(t *testing.T) {
	t.Parallel()
	w := pgStatsWatch{kick: make(chan struct{}, 1)}
	w.nudge()
	if len(w.kick) != 0 {
		t.Fatal("nudged while the table is not young")
	}
	w.young.Store(true)
	w.nudge()
	w.nudge() // the first is not yet taken: this one does not wait
	if len(w.kick) != 1 {
		t.Fatalf("%d nudges waiting, want 1", len(w.kick))
	}
	var zero pgStatsWatch // a broker not yet serving
	zero.young.Store(true)
	zero.nudge()
}

// TestPGPlansFollowTheTable: a session that planned the claim's UPDATE
// while the jobs table was empty (as every session of a new namespace
// does: the engine's plans are generic, made once) joined the leases to
// a scan of the whole table, and kept that plan as the table grew, as
// long as nothing analyzed the table (autovacuum off, or behind): at
// 1,000 jobs a second the database saturated. The broker's statistics
// chore analyzes the grown table, and the same session's next execution
// is planned again, by the jobs' primary key.
func TestPGPlansFollowTheTable(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "PREPARE claimed_rows AS "+p.sql(pgClaimedSQL)); err != nil {
		t.Fatal(err)
	}
	plan := func() string {
		t.Helper()
		return planText(t, conn, `EXPLAIN EXECUTE claimed_rows('{a,b}', 1, 'b', '{t,t}', '{o,o}', '{1,1}', '{1,1}', '{1,1}')`)
	}
	if got := plan(); !strings.Contains(got, "Seq Scan on jobs") {
		t.Fatalf("on the empty table the UPDATE was not planned with a scan of the table, so this test does not show what the chore is for:\n%s", got)
	}
	if _, err := p.pool.Exec(ctx, p.sql(`INSERT INTO {s}.jobs (id, queue, state, priority, sort_key, run_at, created_at, done_at, body)
		SELECT 'done' || i, 'q', {done}, 0, i, 0, 0, i, '\x80'::bytea FROM generate_series(1, 5000) AS i`)); err != nil {
		t.Fatal(err)
	}
	// The chore looks every pgRetainEvery, and sooner at a push while
	// the table is young.
	for {
		var tuples float64
		if err := conn.QueryRow(ctx, p.sql(`SELECT reltuples FROM pg_class WHERE oid = '{s}.jobs'::regclass`)).Scan(&tuples); err != nil {
			t.Fatal(err)
		}
		if tuples >= 4000 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the jobs table was not analyzed (reltuples %v)", tuples)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if got := plan(); strings.Contains(got, "Seq Scan on jobs") || !strings.Contains(got, "jobs_pkey") {
		t.Fatalf("after the table grew and was analyzed, the same session's plan:\n%s", got)
	}
}
