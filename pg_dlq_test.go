package main

import (
	"fmt"
	"testing"
	"time"
)

// TestPGDLQRowWithoutEntryLeftAlone: a row in the DLQ state that carries
// no DLQ entry (nothing for the policy to act on) is not looked at again.
// The reaper took it, found no entry and left its due time as it was,
// so every round (four a second) opened a transaction for it for good.
func TestPGDLQRowWithoutEntryLeftAlone(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 30*time.Second)
	// A job pushed as usual, then put in the DLQ state by hand: its
	// record has no DLQ entry.
	ids, _, err := p.Push(ctx, "q", []*Job{mustJob(t, "q", map[string]any{"data": 1})}, false).Wait()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.jobs SET state = {dlq}, dlq_due = 1 WHERE id = $1`), ids[0]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the reaper set the row's due time aside", func() (bool, string) {
		var due *int64
		if err := p.pool.QueryRow(ctx, p.sql(`SELECT dlq_due FROM {s}.jobs WHERE id = $1`), ids[0]).Scan(&due); err != nil {
			t.Fatal(err)
		}
		return due == nil, fmt.Sprint(due)
	})
	if leases, dlq, err := p.reapDue(ctx); err != nil || leases || dlq {
		t.Fatalf("the reaper's look after: leases %v, DLQ %v (%v)", leases, dlq, err)
	}
}
