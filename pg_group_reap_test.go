package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pgCountRows runs a count query on the broker's namespace.
func pgCountRows(t *testing.T, p *PG, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := p.pool.QueryRow(context.Background(), p.sql(sql), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestPGGroupRowsForgotten: group rows with nothing left are deleted by
// the reaper (before, a row stayed for every groupId ever pushed), and
// only those: a group with a job in any state, a setting, or a window
// still running keeps its row, and a job that comes back from the DLQ or
// is pushed again to a forgotten group is claimed as before.
func TestPGGroupRowsForgotten(t *testing.T) {
	t.Parallel()
	br := startPGInProcess(t, testPGURL(), pgTestNamespace(t), nil, pgOptions{})
	c := dial(t, br.addr)
	// The broker's own rounds put off: the test runs the reaper.
	if _, err := br.pg.pool.Exec(context.Background(), br.pg.sql(`UPDATE {s}.chores SET due = $1 WHERE name = 'groups'`), int64(1)<<62); err != nil {
		t.Fatal(err)
	}
	const q, n = "reap", 2000
	jobs := make([]any, n)
	for i := range jobs {
		jobs[i] = M{"name": "j", "data": i, "groupId": fmt.Sprint("g", i), "removeOnComplete": true}
	}
	c.ok(M{"cmd": "PUSHB", "queue": q, "jobs": jobs})
	for done := 0; done < n; {
		a := c.ok(M{"cmd": "PULLB", "queue": q, "count": 500, "owner": "w", "timeout": 1000})
		got, toks := list(t, a, "jobs"), list(t, a, "tokens")
		ids := make([]any, len(got))
		for i, j := range got {
			ids[i] = j.(M)["id"]
		}
		if len(ids) > 0 {
			c.ok(M{"cmd": "ACKB", "ids": ids, "tokens": toks})
		}
		done += len(ids)
	}
	// What must stay: a waiting job, a job in the DLQ, a completed job, a
	// setting without a job, a window still running.
	push(t, c, q, M{"groupId": "waiting"})
	dlq := push(t, c, q, M{"groupId": "dlq", "maxAttempts": 1})
	id, tok := pullOwned(t, c, q, M{"group": M{"affinity": "dlq"}})
	c.ok(M{"cmd": "FAIL", "id": id, "token": tok, "error": "x"})
	push(t, c, q, M{"groupId": "completed"})
	id, tok = pullOwned(t, c, q, M{"group": M{"affinity": "completed"}})
	c.ok(M{"cmd": "ACK", "id": id, "token": tok})
	c.ok(M{"cmd": "PauseGroup", "queue": q, "groupId": "paused"})
	push(t, c, q, M{"groupId": "window", "removeOnComplete": true})
	id, tok = pullOwned(t, c, q, M{"group": M{"affinity": "window", "limit": M{"max": 1, "duration": 600000}}})
	c.ok(M{"cmd": "ACK", "id": id, "token": tok})
	if state(t, c, dlq) != "failed" {
		t.Fatalf("job %s not in the DLQ", dlq)
	}

	before := pgCountRows(t, br.pg, `SELECT count(*) FROM {s}.groups`)
	removed, err := br.pg.reapGroups()
	if err != nil {
		t.Fatal(err)
	}
	left := pgCountRows(t, br.pg, `SELECT count(*) FROM {s}.groups`)
	t.Logf("group rows: %d before the reaper, %d removed, %d left", before, removed, left)
	if left != 5 {
		t.Fatalf("%d group rows left of %d, want the 5 with something left", left, before)
	}
	for _, g := range []string{"waiting", "dlq", "completed", "paused", "window"} {
		if pgCountRows(t, br.pg, `SELECT count(*) FROM {s}.groups WHERE queue = $1 AND group_id = $2`, q, g) != 1 {
			t.Errorf("group %s lost its row", g)
		}
	}
	// The window still holds a job pushed to its group again.
	push(t, c, q, M{"groupId": "window"})
	if a := c.ok(M{"cmd": "PULL", "queue": q, "owner": "w", "timeout": 0,
		"group": M{"affinity": "window", "limit": M{"max": 1, "duration": 600000}}}); a["job"] != nil {
		t.Fatalf("the window of a group was forgotten: %v", a)
	}
	// A job back from the DLQ, and one pushed to a forgotten group, are
	// claimed.
	c.ok(M{"cmd": "RetryDlq", "queue": q, "jobId": dlq})
	id, _ = pullOwned(t, c, q, M{"group": M{"affinity": "dlq"}})
	if id != dlq {
		t.Fatalf("pulled %s, want %s back from the DLQ", id, dlq)
	}
	again := push(t, c, q, M{"groupId": "g7"})
	if id, _ = pullOwned(t, c, q, M{"group": M{"affinity": "g7"}}); id != again {
		t.Fatalf("pulled %s, want %s of a forgotten group", id, again)
	}
	// Once its last setting is removed, a group goes too.
	c.ok(M{"cmd": "ResumeGroup", "queue": q, "groupId": "paused"})
	if _, err := br.pg.reapGroups(); err != nil {
		t.Fatal(err)
	}
	if pgCountRows(t, br.pg, `SELECT count(*) FROM {s}.groups WHERE group_id = 'paused'`) != 0 {
		t.Fatal("a group without settings or jobs kept its row")
	}
}

// TestPGGroupReapRacesPushes: pushes bringing idle groups their next job
// while the reaper runs over and over never leave a job without its
// group's row: every job pushed is claimed.
func TestPGGroupReapRacesPushes(t *testing.T) {
	t.Parallel()
	br := startPGInProcess(t, testPGURL(), pgTestNamespace(t), nil, pgOptions{})
	const q, groups, rounds = "race", 4, 60
	stop := make(chan struct{})
	var reaped atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := br.pg.reapGroups()
			if err != nil {
				t.Errorf("reap: %v", err)
				return
			}
			reaped.Add(int64(n))
		}
	}()
	var workers sync.WaitGroup
	for g := range groups {
		c := dial(t, br.addr)
		workers.Add(1)
		go func() {
			defer workers.Done()
			for i := range rounds {
				a, err := c.do(M{"cmd": "PUSH", "queue": q, "name": "j", "data": i, "groupId": fmt.Sprint("r", g), "removeOnComplete": true}, callTimeout)
				if err != nil || a["ok"] != true {
					t.Errorf("push: %v %v", err, a)
					return
				}
				a, err = c.do(M{"cmd": "PULL", "queue": q, "owner": "w", "timeout": 10000,
					"group": M{"affinity": fmt.Sprint("r", g)}}, 20*time.Second)
				if err != nil || a["job"] == nil {
					t.Errorf("group r%d, round %d: the job pushed was not claimed: %v %v", g, i, err, a)
					return
				}
				if a, err = c.do(M{"cmd": "ACK", "id": a["job"].(M)["id"], "token": a["token"]}, callTimeout); err != nil || a["ok"] != true {
					t.Errorf("ack: %v %v", err, a)
					return
				}
			}
		}()
	}
	workers.Wait()
	close(stop)
	wg.Wait()
	t.Logf("%d group rows reaped during %d pushes", reaped.Load(), groups*rounds)
	if reaped.Load() == 0 {
		t.Fatal("the reaper never removed a row: the race was not run")
	}
}

// TestPGGroupSettingsLimited: a queue's groups with settings are limited
// to maxGroupSettings in PostgreSQL mode too, with memory mode's refusal.
func TestPGGroupSettingsLimited(t *testing.T) {
	t.Parallel()
	br := startPGInProcess(t, testPGURL(), pgTestNamespace(t), nil, pgOptions{})
	c := dial(t, br.addr)
	const q = "set"
	grp := func(cmd, id string, kv ...any) M {
		m := M{"cmd": cmd, "queue": q, "groupId": id}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	c.ok(grp("PauseGroup", "g0"))
	// The rest of the limit, made at once.
	if _, err := br.pg.pool.Exec(context.Background(), br.pg.sql(`INSERT INTO {s}.groups (queue, group_id, served, paused)
		SELECT $1, 'g' || i, nextval('{s}.group_turns'), true FROM generate_series(1, $2) AS i`), q, maxGroupSettings-1); err != nil {
		t.Fatal(err)
	}
	push(t, c, q, M{"groupId": "busy"})
	want := "the groups of a queue that are paused or have a concurrency, rate limit or hold of their own are limited to 10000"
	for _, m := range []M{
		grp("PauseGroup", "new"), grp("SetGroupConcurrency", "new", "concurrency", 1),
		grp("SetGroupRateLimit", "new", "max", 1, "duration", 10), grp("RateLimitGroup", "new", "duration", 10),
		grp("PauseGroup", "busy"),
	} {
		if msg := c.fail(m); msg != want {
			t.Fatalf("%v past the limit: %q, want %q", m["cmd"], msg, want)
		}
	}
	if n := pgCountRows(t, br.pg, `SELECT count(*) FROM {s}.groups WHERE group_id = 'new'`); n != 0 {
		t.Fatal("a refused group got a row")
	}
	c.ok(grp("SetGroupConcurrency", "g7", "concurrency", 3))
	c.ok(grp("ResumeGroup", "g8"))
	c.ok(grp("PauseGroup", "busy"))
	if msg := c.fail(grp("PauseGroup", "new")); msg != want {
		t.Fatalf("after the room was taken again: %q", msg)
	}
	// An expired hold is no setting.
	c.ok(grp("RemoveGroupConcurrency", "g7"))
	c.ok(grp("ResumeGroup", "g7"))
	c.ok(grp("RateLimitGroup", "g7", "duration", 1))
	clockPast(t, br.pg.now, br.pg.now()+1) // the hold of 1 ms is over
	c.ok(grp("PauseGroup", "new"))
	c.ok(M{"cmd": "PauseGroup", "queue": "other", "groupId": "new"})
}
