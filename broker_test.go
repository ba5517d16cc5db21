package main

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// completeAll pushes n jobs to queue and completes them.
func completeAll(t *testing.T, b *MemEngine, queue string, n int) []string {
	t.Helper()
	var ids []string
	for done := 0; done < n; done += 1000 {
		jobs := make([]*Job, min(1000, n-done))
		for i := range jobs {
			jobs[i] = mustJob(t, queue, map[string]any{"data": int64(done + i)})
		}
		b.pushJobs(queue, jobs, nil)
		got, tokens := claimN(b, queue, len(jobs))
		items := make([]AckItem, len(got))
		for i, j := range got {
			items[i] = AckItem{ID: j.ID(), Token: tokens[i]}
			ids = append(ids, j.ID())
		}
		if ig, _ := b.AckBatch(context.Background(), items); len(ig) > 0 {
			t.Fatalf("ack ignored %v", ig)
		}
	}
	return ids
}

// Completed jobs are bounded across the broker, oldest evicted first
// whichever shard holds them, a tenth at a time.
func TestCompletedRetentionBound(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(4, nil)
	defer b.Close()
	// Two queues in different shards.
	qa, qb := "retain-a", "retain-b"
	for i := 0; b.shardOf(qa) == b.shardOf(qb); i++ {
		qb = "retain-b" + itoa(int64(i))
	}
	oldA := completeAll(t, b, qa, 30000)
	clockPast(t, b.now, b.now()) // completion times of B are later
	newB := completeAll(t, b, qb, 30000)
	eventually(t, 10*time.Second, "completed jobs trimmed to the bound", func() (bool, string) {
		n := b.doneTotal.Load()
		return n <= maxCompleted, fmt.Sprint(n, " kept")
	})
	total := b.doneTotal.Load()
	if total > maxCompleted || total < maxCompleted*9/10-1000 {
		t.Fatalf("completed jobs kept: %d", total)
	}
	ca, cb := b.counts(qa), b.counts(qb)
	if int64(ca.Completed+cb.Completed) != total {
		t.Fatalf("queue counts %d+%d disagree with the total %d", ca.Completed, cb.Completed, total)
	}
	if cb.Completed != 30000 {
		t.Fatalf("newer completions evicted: queue B keeps %d of 30000", cb.Completed)
	}
	stateOf := func(id string) string {
		v, err := b.ReadJob(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return v.State
	}
	if stateOf(oldA[0]) != "unknown" || stateOf(oldA[len(oldA)-1]) != "completed" || stateOf(newB[0]) != "completed" {
		t.Fatal("eviction did not take the oldest first")
	}
}
