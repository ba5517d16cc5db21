package main

// The engine's PostgreSQL sessions run with JIT off: JIT compiling the
// grouped claim (a recursive CTE whose estimated cost passes
// jit_above_cost) took ~330 ms per claim on a 25-row table, which made
// grouped pulls crawl.

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// explainHasJIT runs EXPLAIN (ANALYZE) of the grouped claim's group
// selection in tx and says whether PostgreSQL compiled it with JIT.
func explainHasJIT(t *testing.T, ctx context.Context, p *PG, tx pgx.Tx, queue string) bool {
	t.Helper()
	var plan []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+p.sql(pgReadyGroups), queue, nowMs(), "").Scan(&plan); err != nil {
		t.Fatalf("explain the grouped claim: %v", err)
	}
	var out []map[string]any
	if err := json.Unmarshal(plan, &out); err != nil || len(out) != 1 {
		t.Fatalf("explain output %s: %v", plan, err)
	}
	if _, ok := out[0]["Plan"]; !ok {
		t.Fatalf("explain output without a plan: %s", plan)
	}
	_, jit := out[0]["JIT"]
	return jit
}

// TestPGSessionsWithoutJIT: a connection of the engine's pool answers
// `SHOW jit` with off, and the grouped claim through it is not JIT
// compiled even with every JIT cost threshold at 0 for the transaction,
// while the same transaction with jit turned back on is: the database
// would compile it, the engine's sessions do not let it.
func TestPGSessionsWithoutJIT(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	b := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{})
	c := dial(t, b.addr)
	jobs := make([]any, 25)
	for i := range jobs {
		g := fmt.Sprint("g", i%5)
		jobs[i] = map[string]any{"name": g, "data": i, "groupId": g}
	}
	c.ok(map[string]any{"cmd": "PUSHB", "queue": "jit", "jobs": jobs})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := b.pg.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var jit string
	if err := conn.QueryRow(ctx, "SHOW jit").Scan(&jit); err != nil {
		t.Fatal(err)
	}
	if jit != "off" {
		t.Errorf("SHOW jit on the engine's pooled connection: %q, want off", jit)
	}

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, s := range []string{"jit_above_cost", "jit_inline_above_cost", "jit_optimize_above_cost"} {
		if _, err := tx.Exec(ctx, "SET LOCAL "+s+" = 0"); err != nil {
			t.Fatal(err)
		}
	}
	if explainHasJIT(t, ctx, b.pg, tx, "jit") {
		t.Errorf("the grouped claim was JIT compiled on the engine's connection")
	}
	// The control: the same query in the same transaction with jit on.
	if _, err := tx.Exec(ctx, "SET LOCAL jit = on"); err != nil {
		t.Fatal(err)
	}
	if !explainHasJIT(t, ctx, b.pg, tx, "jit") {
		var avail bool
		tx.QueryRow(ctx, "SELECT pg_jit_available()").Scan(&avail)
		if !avail {
			needService(t, "this PostgreSQL has no JIT provider, so the test cannot show that the engine turns it off",
				"a PostgreSQL built with LLVM (Debian's postgresql packages are)")
		}
		t.Fatalf("with jit on and its thresholds at 0 the grouped claim was not JIT compiled: the test shows nothing")
	}
}
