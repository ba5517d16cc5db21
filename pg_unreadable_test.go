package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestPGUnreadableRecordSetAside: a job row whose record this build cannot
// read (spoiled by hand here; a tool or a bug could write one) is set aside
// and named in the log. Before, it failed every claim of its queue, every
// round of the reaper (which then called the database down in /health)
// or of the DLQ's upkeep, for good: one row stopped the work around it.
// A record written by a newer build is not set aside: that build reads it.
func TestPGUnreadableRecordSetAside(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	logs := &syncBuffer{}
	b := NewBroker()
	t.Cleanup(b.Close)
	p, err := openPG(ctx, testPGURL(), ns, b, slog.New(slog.NewTextHandler(logs, nil)), pgOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	push := func(q string, prio int) string {
		t.Helper()
		ids, _, err := p.Push(ctx, q, []*Job{mustJob(t, q, map[string]any{"data": 1, "priority": prio})}, false).Wait()
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	// 0xc1 is the one byte MessagePack never uses: not even a record's
	// header can be read. [3] is a record of version 3, which no build
	// reads yet.
	spoil := func(id, hex string) {
		t.Helper()
		if _, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.jobs SET body = decode($2, 'hex') WHERE id = $1`), id, hex); err != nil {
			t.Fatal(err)
		}
	}
	stateOf := func(id string) int16 {
		t.Helper()
		var st int16
		if err := p.pool.QueryRow(ctx, p.sql(`SELECT state FROM {s}.jobs WHERE id = $1`), id).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	pull := func(q string, n int, o PullOpts) ([]string, error) {
		t.Helper()
		var got []string
		_, err := p.Pull(ctx, q, n, o, 0, func(jobs []*Job, _ []string) {
			for _, j := range jobs {
				got = append(got, j.ID())
			}
		})
		return got, err
	}

	// Claims, in a transaction (no owner) and by a take (an owner): the
	// spoiled jobs come first in claim order.
	var bad []string
	for _, o := range []PullOpts{{}, {Owner: "w", TTL: 60_000}} {
		q := "claims" + o.Owner
		spoilt := []string{push(q, 10), push(q, 10)}
		good := []string{push(q, 0), push(q, 0)}
		spoil(spoilt[0], "c1")
		spoil(spoilt[1], "c1")
		got, err := pull(q, 4, o)
		if err != nil || !slices.Equal(got, good) {
			t.Fatalf("%q: a pull past two spoiled records: %v (%v), want %v", q, got, err, good)
		}
		for _, id := range spoilt {
			if st := stateOf(id); st != pgSetAside {
				t.Fatalf("%q: the spoiled job's row: state %d, want %d (set aside)", q, st, pgSetAside)
			}
		}
		bad = append(bad, spoilt...)
	}

	// The reaper: two leases run out, one job's record spoiled meanwhile.
	badLease := push("leases", 10)
	goodLease := push("leases", 0)
	if got, err := pull("leases", 2, PullOpts{Owner: "w", TTL: 60_000}); err != nil || len(got) != 2 {
		t.Fatalf("pulled %v (%v)", got, err)
	}
	spoil(badLease, "c1")
	if _, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.jobs SET lease_expires = 1 WHERE queue = 'leases'`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the good job's lease reaped, the spoiled one set aside", func() (bool, string) {
		g, s := stateOf(goodLease), stateOf(badLease)
		return g == pgQueued && s == pgSetAside, fmt.Sprintf("states %d and %d", g, s)
	})
	if err := p.Down(); err != nil {
		t.Fatalf("the broker says its database is down: %v", err)
	}

	// The DLQ's upkeep: an entry due, its record spoiled.
	dead := push("dlq", 0)
	if _, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.jobs SET state = {dlq}, dlq_due = 1 WHERE id = $1`), dead); err != nil {
		t.Fatal(err)
	}
	spoil(dead, "c1")
	eventually(t, 30*time.Second, "the spoiled DLQ row set aside", func() (bool, string) {
		st := stateOf(dead)
		return st == pgSetAside, fmt.Sprint("state ", st)
	})
	// Listings: a queue's waiting jobs, a queue's DLQ (its entry not due).
	listed := push("listed", 0)
	spoiltListed := push("listed", 0)
	spoil(spoiltListed, "c1")
	views, err := p.Jobs(ctx, "listed", jobsQuery{want: []string{"waiting"}, limit: 10})
	if err != nil || len(views) != 1 || views[0].Job.ID() != listed {
		t.Fatalf("a listing over a spoiled record: %d jobs (%v), want %s", len(views), err, listed)
	}
	deadListed := push("dlq-listed", 0)
	if _, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.jobs SET state = {dlq}, dlq_due = NULL WHERE id = $1`), deadListed); err != nil {
		t.Fatal(err)
	}
	spoil(deadListed, "c1")
	if _, err := p.DLQ(ctx, "dlq-listed", dlqSelect{}); err != nil {
		t.Fatalf("the DLQ over a spoiled record: %v", err)
	}
	for _, id := range []string{spoiltListed, deadListed} {
		if st := stateOf(id); st != pgSetAside {
			t.Fatalf("a spoiled record listed: state %d, want %d", st, pgSetAside)
		}
	}

	for _, id := range append(bad, badLease, dead, spoiltListed, deadListed) {
		if !strings.Contains(logs.String(), id) {
			t.Errorf("the log does not name the job set aside, %s:\n%s", id, logs.String())
		}
	}

	// A push of a set-aside job's custom id makes a new job: the row set
	// aside is a job that can never run (before, the push answered the id
	// and made nothing).
	custom := mustJob(t, "reused", map[string]any{"data": 1, "jobId": "reused-1"})
	if _, _, err := p.Push(ctx, "reused", []*Job{custom}, false).Wait(); err != nil {
		t.Fatal(err)
	}
	spoil("reused-1", "c1")
	if got, err := pull("reused", 1, PullOpts{}); err != nil || len(got) != 0 {
		t.Fatalf("a pull of the spoiled job: %v (%v)", got, err)
	}
	again := mustJob(t, "reused", map[string]any{"data": 2, "jobId": "reused-1"})
	if ids, _, err := p.Push(ctx, "reused", []*Job{again}, false).Wait(); err != nil || ids[0] != "reused-1" {
		t.Fatalf("the push again: %v (%v)", ids, err)
	}
	if got, err := pull("reused", 1, PullOpts{}); err != nil || !slices.Equal(got, []string{"reused-1"}) {
		t.Fatalf("the job pushed again under the set-aside job's id: pulled %v (%v)", got, err)
	}

	// Reading a set-aside job says so.
	if _, err := p.ReadJob(ctx, bad[0]); err == nil || !strings.Contains(err.Error(), "set aside") {
		t.Fatalf("reading a set-aside job: %v, want it said to be set aside", err)
	}

	// Obliterate takes a queue's rows set aside with the rest.
	if err := p.Obliterate(ctx, "claims"); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := p.pool.QueryRow(ctx, p.sql(`SELECT count(*) FROM {s}.jobs WHERE queue = 'claims'`)).Scan(&left); err != nil || left != 0 {
		t.Fatalf("after obliterate: %d rows of the queue left (%v)", left, err)
	}

	// A newer build's record is left as it is: the claim fails, saying so.
	newer := push("newer", 0)
	spoil(newer, "9103")
	if got, err := pull("newer", 1, PullOpts{}); err == nil || !strings.Contains(err.Error(), "version 3") {
		t.Fatalf("a pull of a newer build's record: %v (%v), want the version named", got, err)
	}
	if st := stateOf(newer); st != pgQueued {
		t.Fatalf("a newer build's record: state %d, want it left waiting", st)
	}
}

// TestPGUnreadableParentSetAside: a flow's parent whose record cannot be
// read is set aside when its child's ACK locks it, and the ACK is taken:
// before, every ACK of its children failed on it.
func TestPGUnreadableParentSetAside(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	b := startPGBroker(t, ns)
	c := dial(t, b.addr())
	link := map[string]any{"__parentId": "parent", "__parentQueue": "parents"}
	c.ok(map[string]any{"cmd": "PUSHF", "jobs": []any{
		map[string]any{"id": "child", "queue": "kids", "input": map[string]any{"parentId": "parent", "data": link}},
		map[string]any{"id": "parent", "queue": "parents", "input": map[string]any{"dependsOn": []any{"child"}, "childrenIds": []any{"child"}, "data": map[string]any{}}},
	}})
	token := tokensOf(t, c.ok(map[string]any{"cmd": "PULLB", "queue": "kids", "count": 1, "owner": "w"}))
	ctx, conn := pgTestConn(t)
	if _, err := conn.Exec(ctx, `UPDATE queued_`+ns+`.jobs SET body = '\xc1' WHERE id = 'parent'`); err != nil {
		t.Fatal(err)
	}
	c.ok(map[string]any{"cmd": "ACK", "id": "child", "token": token["child"]})
	if st := str(t, c.ok(map[string]any{"cmd": "GetState", "id": "child"}), "state"); st != "completed" {
		t.Fatalf("the child after its ACK: %s", st)
	}
	var st int16
	if err := conn.QueryRow(ctx, `SELECT state FROM queued_`+ns+`.jobs WHERE id = 'parent'`).Scan(&st); err != nil || st != pgSetAside {
		t.Fatalf("the spoiled parent: state %d (%v), want %d", st, err, pgSetAside)
	}
	eventually(t, 10*time.Second, "the log names the parent set aside", func() (bool, string) {
		out := b.output()
		return strings.Contains(out, "set aside") && strings.Contains(out, "parent"), out
	})
}
