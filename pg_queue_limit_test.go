package main

import (
	"fmt"
	"testing"
	"time"
)

// TestPGQueueCountLimit: in PostgreSQL mode --max-queues bounds the
// namespace's queue rows (before, a push to every new name made a row),
// by every command that makes a queue and whichever way a push is written
// (the pipeline of bare pushes, the transaction of pushes with custom
// ids, a push of its own with a group, a flow), with memory mode's
// refusal; the queues there go on working, a refused queue leaves no row
// and no job, and an obliterated queue makes room.
func TestPGQueueCountLimit(t *testing.T) {
	t.Parallel()
	const limit = 5
	setup := func(b *Broker) { b.maxQueues = limit }
	br := startPGInProcessWith(t, testPGURL(), pgTestNamespace(t), nil, pgOptions{}, setup)
	c := dial(t, br.addr)
	for i := range limit {
		c.ok(M{"cmd": "PUSH", "queue": fmt.Sprint("q", i), "data": i})
	}
	want := "queues are limited to 5 (--max-queues)"
	for _, m := range []M{
		{"cmd": "PUSH", "queue": "q5", "data": 1},
		{"cmd": "PUSH", "queue": "q5", "data": 1, "jobId": "custom"},
		{"cmd": "PUSH", "queue": "q5", "data": 1, "groupId": "g"},
		{"cmd": "PUSHB", "queue": "q5", "jobs": []any{M{"data": 1}}},
		{"cmd": "PUSHB", "queue": "q5", "jobs": []any{M{"data": 1, "uniqueKey": "k"}}},
		{"cmd": "Pause", "queue": "q5"},
		{"cmd": "Resume", "queue": "q5"},
		{"cmd": "RateLimit", "queue": "q5", "limit": 10},
		{"cmd": "SetConcurrency", "queue": "q5", "limit": 2},
		{"cmd": "SetStallConfig", "queue": "q5", "config": M{"stallInterval": 5000}},
		{"cmd": "SetDlqConfig", "queue": "q5", "config": M{"maxEntries": 10}},
		{"cmd": "SetGroupConcurrency", "queue": "q5", "groupId": "g", "concurrency": 2},
		{"cmd": "PauseGroup", "queue": "q5", "groupId": "g"},
		flowFrame("fp", "q5", "q5", []string{"fk"}),
	} {
		if msg := c.fail(m); msg != want {
			t.Fatalf("%v past the limit: %q, want %q", m, msg, want)
		}
	}
	// Pipelined pushes to a queue there and to new ones, which the push
	// buffer may write together: each answered for its own queue.
	type sent struct {
		queue string
		id    string
		ch    chan map[string]any
	}
	var all []sent
	for i := range 40 {
		q := "q0"
		if i%2 == 1 {
			q = fmt.Sprint("new", i)
		}
		id, ch := c.send(M{"cmd": "PUSH", "queue": q, "data": i})
		all = append(all, sent{q, id, ch})
	}
	for _, s := range all {
		a := c.await(s.id, s.ch, callTimeout)
		if s.queue == "q0" && a["ok"] != true {
			t.Fatalf("a push to a queue there, beside refused ones: %v", a)
		}
		if s.queue != "q0" && (a["ok"] != false || a["error"] != want) {
			t.Fatalf("a push to %s past the limit: %v", s.queue, a)
		}
	}
	if n := pgCountRows(t, br.pg, `SELECT count(*) FROM {s}.queues`); n != limit {
		t.Fatalf("%d queue rows, want %d", n, limit)
	}
	if n := pgCountRows(t, br.pg, `SELECT count(*) FROM {s}.jobs WHERE queue <> ALL($1)`, []string{"q0", "q1", "q2", "q3", "q4"}); n != 0 {
		t.Fatalf("%d jobs of refused queues", n)
	}
	if n := pgCountRows(t, br.pg, `SELECT count(*) FROM {s}.groups WHERE queue = 'q5'`); n != 0 {
		t.Fatalf("%d group rows of a refused queue", n)
	}
	// A long poll on a new name makes nothing.
	start := time.Now()
	if a := c.ok(M{"cmd": "PULL", "queue": "q6", "timeout": 100}); a["job"] != nil {
		t.Fatalf("pull: %v", a)
	}
	if time.Since(start) > 15*time.Second {
		t.Fatal("a pull on a new queue waited far past its timeout")
	}
	c.ok(M{"cmd": "PUSH", "queue": "q0", "data": "more", "groupId": "g"})
	c.ok(M{"cmd": "Pause", "queue": "q1"})
	c.ok(M{"cmd": "SetGroupConcurrency", "queue": "q2", "groupId": "g", "concurrency": 2})
	c.ok(M{"cmd": "Obliterate", "queue": "q1"})
	c.ok(M{"cmd": "PUSH", "queue": "q5", "data": 1})
	if msg := c.fail(M{"cmd": "PUSH", "queue": "q7", "data": 1}); msg != want {
		t.Fatalf("after the room was taken again: %q", msg)
	}
}
