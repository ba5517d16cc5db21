package main

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"
)

// TestPGCompletedRetention: with the bound lowered to 100, completed jobs
// of two queues completed through two brokers stay within it, the newest
// kept and the oldest forgotten with their logs, as memory mode's
// retention does.
func TestPGCompletedRetention(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	o := pgOptions{keepCompleted: 100}
	brokers := []*pgInProcess{startPGInProcess(t, testPGURL(), ns, nil, o), startPGInProcess(t, testPGURL(), ns, nil, o)}
	clients := []*tclient{dial(t, brokers[0].addr), dial(t, brokers[1].addr)}
	var done []string // in completion order
	for round := range 6 {
		c, queue := clients[round%2], fmt.Sprintf("keep-%d", round%2)
		jobs := make([]any, 50)
		for i := range jobs {
			jobs[i] = M{"name": "j", "data": M{"round": round, "i": i}}
		}
		c.ok(M{"cmd": "PUSHB", "queue": queue, "jobs": jobs})
		a := c.ok(M{"cmd": "PULLB", "queue": queue, "count": 50, "owner": "w"})
		got, toks := list(t, a, "jobs"), list(t, a, "tokens")
		if len(got) != 50 {
			t.Fatalf("round %d pulled %d jobs", round, len(got))
		}
		ids := make([]any, len(got))
		for i, j := range got {
			ids[i] = j.(M)["id"]
			done = append(done, ids[i].(string))
		}
		c.ok(M{"cmd": "AddLog", "id": ids[0], "message": "first of its round"})
		c.ok(M{"cmd": "ACKB", "ids": ids, "tokens": toks})
		clockPast(t, brokers[0].pg.now, brokers[0].pg.now()) // the next round completes later
	}
	completed := func() int {
		n := 0
		for q := range 2 {
			counts := sub(t, clients[q].ok(M{"cmd": "GetJobCounts", "queue": fmt.Sprintf("keep-%d", q)}), "counts")
			n += int(num(t, counts["completed"]))
		}
		return n
	}
	eventually(t, 20*time.Second, "completed jobs within the bound of 100", func() (bool, string) {
		n := completed()
		return n <= 100, fmt.Sprint(n, " completed")
	})
	if n := completed(); n < 90 {
		t.Fatalf("%d completed jobs kept of 300, want at least the newest 90", n)
	}
	for i, id := range done[len(done)-90:] {
		if st := state(t, clients[i%2], id); st != "completed" {
			t.Fatalf("job %s, of the newest 90 completed, is %s", id, st)
		}
	}
	for _, id := range done[:100] {
		if st := state(t, clients[0], id); st != "unknown" {
			t.Fatalf("job %s, of the oldest 100 completed, is %s", id, st)
		}
	}
	var logs int
	err := brokers[0].pg.pool.QueryRow(context.Background(), brokers[0].pg.sql(`SELECT count(*) FROM {s}.job_logs WHERE job_id = ANY($1)`),
		[]string{done[0], done[50], done[100]}).Scan(&logs)
	if err != nil {
		t.Fatal(err)
	}
	if logs != 0 {
		t.Fatalf("%d logs of forgotten jobs kept", logs)
	}
	if l := list(t, sub(t, clients[1].ok(M{"cmd": "GetLogs", "id": done[250]}), "data"), "logs"); len(l) != 1 {
		t.Fatalf("the logs of a kept job: %v", l)
	}
}

// TestPGRetainEveryQueue: one trim deletes the completed jobs of every
// queue up to its bound (the completed rows are indexed by queue, and the
// trim walks the queues), batch after batch in a queue with more than a
// batch of them, and no others.
func TestPGRetainEveryQueue(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	b := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{})
	c := dial(t, b.addr)
	sizes := map[string]int{"age-a": pgRetainBatch + 100, "age-b": 10, "age-c": 3}
	complete := func(queue string, n int) {
		for left := n; left > 0; left -= 500 {
			k := min(left, 500)
			jobs := make([]any, k)
			for i := range jobs {
				jobs[i] = M{"name": "j", "data": M{"i": i}}
			}
			c.ok(M{"cmd": "PUSHB", "queue": queue, "jobs": jobs})
			a := c.ok(M{"cmd": "PULLB", "queue": queue, "count": k, "owner": "w"})
			got, toks := list(t, a, "jobs"), list(t, a, "tokens")
			if len(got) != k {
				t.Fatalf("%s: pulled %d jobs of %d", queue, len(got), k)
			}
			ids := make([]any, len(got))
			for i, j := range got {
				ids[i] = j.(M)["id"]
			}
			c.ok(M{"cmd": "ACKB", "ids": ids, "tokens": toks})
		}
	}
	total := 0
	for queue, n := range sizes {
		complete(queue, n)
		total += n
	}
	cutoff := b.pg.now()
	clockPast(t, b.pg.now, cutoff) // the jobs kept complete after the cutoff
	complete("age-b", 5)
	removed, err := b.pg.retainUpTo(cutoff, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	if removed != total {
		t.Fatalf("one trim removed %d completed jobs, want %d", removed, total)
	}
	for queue := range sizes {
		counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": queue}), "counts")
		want := 0
		if queue == "age-b" {
			want = 5
		}
		if n := int(num(t, counts["completed"])); n != want {
			t.Errorf("%s: %d completed jobs left, want %d", queue, n, want)
		}
	}
}
