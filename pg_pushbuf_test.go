package main

import (
	"fmt"
	"testing"
	"time"
)

// TestPGPipelinedPushesKeepOrder: pushes sent back to back on one
// connection, answered as their group commits land, are claimed in the
// order they were sent, single pushes and batches alike, and every
// answer names its own job.
func TestPGPipelinedPushesKeepOrder(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	b := startPGBroker(t, ns)
	c := dial(t, b.addr())
	other := dial(t, b.addr()) // a second connection pushing to another queue meanwhile
	const n = 600
	type sent struct {
		id string
		ch chan map[string]any
	}
	var reqs []sent
	var noise []sent
	for i := 0; i < n; i++ {
		if i%100 == 50 {
			id, ch := c.send(M{"cmd": "PUSHB", "queue": "fifo", "jobs": []any{
				M{"name": "b", "data": M{"i": i}}, M{"name": "b", "data": M{"i": i + 1}}}})
			reqs = append(reqs, sent{id, ch})
			i++
			continue
		}
		id, ch := c.send(M{"cmd": "PUSH", "queue": "fifo", "name": "s", "data": M{"i": i}})
		reqs = append(reqs, sent{id, ch})
		id, ch = other.send(M{"cmd": "PUSH", "queue": "noise", "data": M{"i": i}})
		noise = append(noise, sent{id, ch})
	}
	ids := map[string]bool{}
	for _, r := range reqs {
		a := c.await(r.id, r.ch, 30*time.Second)
		if a["ok"] != true {
			t.Fatalf("push answered %v", a)
		}
		if id, ok := a["id"].(string); ok {
			ids[id] = true
		} else {
			for _, id := range a["ids"].([]any) {
				ids[id.(string)] = true
			}
		}
	}
	for _, r := range noise {
		if a := other.await(r.id, r.ch, 30*time.Second); a["ok"] != true {
			t.Fatalf("push to another queue answered %v", a)
		}
	}
	if len(ids) != n {
		t.Fatalf("%d distinct ids answered for %d jobs", len(ids), n)
	}
	for want := 0; want < n; want++ {
		a := c.ok(M{"cmd": "PULL", "queue": "fifo"})
		j, ok := a["job"].(map[string]any)
		if !ok {
			t.Fatalf("job %d: pulled %v", want, a)
		}
		if got := toFloat(j["data"].(map[string]any)["i"]); got != float64(want) {
			t.Fatalf("pull %d got job %v: pushes were reordered", want, got)
		}
		if !ids[j["id"].(string)] {
			t.Fatalf("pulled job %v was not answered to any push", j["id"])
		}
	}
	if got := num(t, c.ok(M{"cmd": "Count", "queue": "noise"})["count"]); got != float64(len(noise)) {
		t.Fatalf("noise queue holds %v jobs, want %d", got, len(noise))
	}
}

// TestPGPushBurstBeyondAsyncLimit: more pushes in flight on one
// connection than it may have waiting commands are all written and
// answered (the connection stops reading until they are), none refused.
func TestPGPushBurstBeyondAsyncLimit(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	b := startPGBroker(t, ns)
	c := dial(t, b.addr())
	n := maxAsyncPerConn*2 + 100
	ids := make([]string, n)
	chs := make([]chan map[string]any, n)
	for i := range n {
		ids[i], chs[i] = c.send(M{"cmd": "PUSH", "queue": "burst", "data": M{"i": i}})
	}
	for i := range n {
		if a := c.await(ids[i], chs[i], 60*time.Second); a["ok"] != true {
			t.Fatalf("push %d of %d answered %v", i, n, a)
		}
	}
	if got := num(t, c.ok(M{"cmd": "Count", "queue": "burst"})["count"]); got != float64(n) {
		t.Fatalf("queue holds %v jobs, want %d", got, n)
	}
}

// TestPGCopyPushes: a PUSHB large enough to be written with COPY keeps
// what the INSERT path keeps: every job answered with its own id and
// made, claims in priority then FIFO order, delayed jobs held back, a
// new queue made (and announced by queue:created's row) or refused past
// --max-queues with nothing of it left.
func TestPGCopyPushes(t *testing.T) {
	t.Parallel()
	setup := func(b *Broker) { b.maxQueues = 2 }
	br := startPGInProcessWith(t, testPGURL(), pgTestNamespace(t), nil, pgOptions{}, setup)
	c := dial(t, br.addr)
	const n = pgCopyMin + 50
	jobs := make([]any, n)
	for i := range jobs {
		j := M{"name": "c", "data": M{"i": i}}
		switch {
		case i == n-1:
			j["priority"] = 10 // claimed first
		case i == n-2:
			j["delay"] = 60_000 // not claimed now
		}
		jobs[i] = j
	}
	a := c.ok(M{"cmd": "PUSHB", "queue": "copied", "jobs": jobs})
	ids := list(t, a, "ids")
	if len(ids) != n {
		t.Fatalf("%d ids answered for %d jobs", len(ids), n)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		seen[id.(string)] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct ids for %d jobs", len(seen), n)
	}
	want := append([]int{n - 1}, func() []int {
		var w []int
		for i := range n - 2 {
			w = append(w, i)
		}
		return w
	}()...)
	for k, i := range want {
		p := c.ok(M{"cmd": "PULL", "queue": "copied"})
		j, ok := p["job"].(map[string]any)
		if !ok {
			t.Fatalf("pull %d: %v", k, p)
		}
		if got := toFloat(j["data"].(map[string]any)["i"]); got != float64(i) {
			t.Fatalf("pull %d got job %v, want %d", k, got, i)
		}
		c.ok(M{"cmd": "ACK", "id": j["id"]})
	}
	if p := c.ok(M{"cmd": "PULL", "queue": "copied"}); p["job"] != nil {
		t.Fatalf("the delayed job was claimed: %v", p)
	}
	// A second queue fits; a third is refused whole, leaving no row.
	big := func(q string) M { return M{"cmd": "PUSHB", "queue": q, "jobs": jobs[:n-2]} }
	c.ok(big("second"))
	if msg := c.fail(big("third")); msg != "queues are limited to 2 (--max-queues)" {
		t.Fatalf("a third queue: %q", msg)
	}
	qs := c.ok(M{"cmd": "ListQueues"})
	if got := fmt.Sprint(qs["queues"]); got != "[copied second]" {
		t.Fatalf("queues %s, want [copied second]", got)
	}
	if got := num(t, c.ok(M{"cmd": "Count", "queue": "third"})["count"]); got != 0 {
		t.Fatalf("the refused queue holds %v jobs", got)
	}
}
