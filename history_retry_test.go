package main

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// RetryCompleted in SQLite mode reaches the completed jobs only the
// history on disk holds (memory keeps the newest --max-completed-jobs):
// all of a queue's, or one by id; the retried jobs wait again, after a
// restart too, and the history no longer counts them. Before, only the
// jobs still in memory were retried (2 of 6 here).
func TestRetryCompletedReachesHistory(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "queued.db")
	flags := []string{"--data-path", path, "--max-completed-jobs", "2"}
	srv := startBinary(t, flags...)
	c := dial(t, srv.addr())
	q := "retry-history"
	var ids []string
	for i := range 8 {
		ids = append(ids, str(t, c.ok(M{"cmd": "PUSH", "queue": q, "data": i}), "id"))
	}
	for range ids {
		id, tok := pullOwned(t, c, q, M{"owner": "w"})
		c.ok(M{"cmd": "ACK", "id": id, "token": tok, "result": "r"})
	}
	eventually(t, 10*time.Second, "completed jobs past the memory's two retired", func() (bool, string) {
		n := countsOf(t, c, q)
		return num(t, n["completed"]) == 8, fmt.Sprint(n)
	})
	// One by id: the first completed, long retired.
	if a := c.ok(M{"cmd": "RetryCompleted", "queue": q, "id": ids[0]}); num(t, a["count"]) != 1 {
		t.Fatalf("RetryCompleted of retired job %s: %v", ids[0], a)
	}
	wantState(t, c, ids[0], "waiting")
	// Then the queue's, up to a count: memory's two first, then the
	// history's oldest.
	if a := c.ok(M{"cmd": "RetryCompleted", "queue": q, "count": 4}); num(t, a["count"]) != 4 {
		t.Fatalf("RetryCompleted count 4: %v", a)
	}
	if a := c.ok(M{"cmd": "RetryCompleted", "queue": q}); num(t, a["count"]) != 3 {
		t.Fatalf("RetryCompleted of the rest: %v", a)
	}
	if n := countsOf(t, c, q); num(t, n["waiting"]) != 8 || num(t, n["completed"]) != 0 {
		t.Fatalf("after every completed job was retried: %v", n)
	}
	srv.stop(t)
	srv = startBinary(t, flags...)
	c = dial(t, srv.addr())
	if n := countsOf(t, c, q); num(t, n["waiting"]) != 8 || num(t, n["completed"]) != 0 {
		t.Fatalf("after a restart: %v", n)
	}
	for _, id := range ids {
		wantState(t, c, id, "waiting")
	}
}
