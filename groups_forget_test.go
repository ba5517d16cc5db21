package main

// Groups are forgotten once nothing is left of them: no job, no setting,
// no window that still holds them back. And groups with settings, which
// a client can make without a job, are a registry with a count limit.

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// churnGroups pushes n jobs, each in its own group, in batches, and pulls
// and acknowledges each as it goes, through a pull with the group option o.
func churnGroups(t testing.TB, b *MemEngine, queue string, n int, o *groupPull) {
	t.Helper()
	churn(t, b, queue, n, o, true)
}

// churn is churnGroups, with jobs in no group unless grouped.
func churn(t testing.TB, b *MemEngine, queue string, n int, o *groupPull, grouped bool) {
	t.Helper()
	const batch = 1000
	s := b.shardOf(queue)
	for i := 0; i < n; i += batch {
		jobs := make([]*Job, 0, batch)
		for k := i; k < min(i+batch, n); k++ {
			f := map[string]any{"data": k, "removeOnComplete": true}
			if grouped {
				f["groupId"] = fmt.Sprint("g", k)
			}
			jobs = append(jobs, mustJob(t, queue, f))
		}
		for _, r := range b.pushJobs(queue, jobs, nil) {
			if r.Err != nil {
				t.Fatalf("push: %v", r.Err)
			}
		}
		s.mu.Lock()
		claimed, tokens := s.claim(s.queues[queue], len(jobs), PullOpts{Owner: "w", TTL: 60000, Group: o}, b.now(), nil, nil)
		s.mu.Unlock()
		if len(claimed) != len(jobs) {
			t.Fatalf("claimed %d of %d", len(claimed), len(jobs))
		}
		for k, j := range claimed {
			if _, err := b.ackOne(AckItem{ID: j.ID(), Token: tokens[k]}); err != nil {
				t.Fatalf("ack: %v", err)
			}
		}
	}
}

func groupsOf(b *MemEngine, queue string) int {
	s := b.shardOf(queue)
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.queues[queue]; q != nil {
		return len(q.groups)
	}
	return -1
}

// TestGroupsForgottenWhenDrained: jobs pushed each in a group of its own
// and drained leave no group behind (before, every groupId ever pushed
// kept a group, and its heap, for the life of the server: 62 MB for
// 200,000 groups), and the heap grows by what the same jobs without a
// group leave (the job index keeps its size), not by a group each.
//
// Serial: it measures the test process's heap.
func TestGroupsForgottenWhenDrained(t *testing.T) {
	n := 200000
	if raceEnabled || testing.Short() {
		n = 20000
	}
	grown := func(grouped bool) int64 {
		b := NewMemEngine(1, nil)
		defer b.Close()
		// A first round makes the queue, so that what stays is what the
		// jobs leave.
		churn(t, b, "g", 1000, nil, grouped)
		before := heapInUse()
		start := time.Now()
		churn(t, b, "g", n, nil, grouped)
		after := heapInUse()
		t.Logf("%d jobs (grouped %v) pushed, claimed and acknowledged in %v: live heap %d bytes before, %d after (%+d)",
			n, grouped, time.Since(start).Round(time.Millisecond), before, after, int64(after)-int64(before))
		if left := groupsOf(b, "g"); left != 0 {
			t.Fatalf("%d groups left after every job was acknowledged", left)
		}
		return int64(after) - int64(before)
	}
	plain := grown(false)
	grouped := grown(true)
	// A group cost about 310 bytes; allow a fifth of that for noise.
	if extra := grouped - plain; extra > int64(n)*64 {
		t.Fatalf("jobs in distinct groups left %d bytes more than jobs in none (%d bytes a job)", extra, extra/int64(n))
	}
}

// serveBroker serves b on a loopback port for the length of the test.
func serveBroker(t *testing.T, b *MemEngine) string {
	t.Helper()
	srv := memServer(b, nil, quietLog())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})
	return ln.Addr().String()
}

// wantGroups waits until the queue has n groups.
func wantGroups(t *testing.T, b *MemEngine, queue string, n int, what string) {
	t.Helper()
	eventually(t, 20*time.Second, what, func() (bool, string) {
		got := groupsOf(b, queue)
		return got == n, fmt.Sprintf("%d groups, want %d", got, n)
	})
}

// TestGroupForgottenOnEveryExit: a group is forgotten by whichever way its
// last job leaves it, and kept while a job is still in it.
func TestGroupForgottenOnEveryExit(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(2, nil)
	defer b.Close()
	c := dial(t, serveBroker(t, b))
	g := M{"groupId": "G"}
	with := func(extra M) M {
		m := M{"groupId": "G"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name string
		run  func(q string)
	}{
		{"ACK", func(q string) {
			push(t, c, q, g)
			id, tok := pullOwned(t, c, q, nil)
			c.ok(M{"cmd": "ACK", "id": id, "token": tok})
		}},
		{"FAIL to the DLQ", func(q string) {
			push(t, c, q, with(M{"maxAttempts": 1}))
			id, tok := pullOwned(t, c, q, nil)
			c.ok(M{"cmd": "FAIL", "id": id, "token": tok, "error": "x"})
		}},
		{"FAIL retried, then ACK", func(q string) {
			push(t, c, q, with(M{"maxAttempts": 2, "backoff": 1}))
			id, tok := pullOwned(t, c, q, nil)
			c.ok(M{"cmd": "FAIL", "id": id, "token": tok, "error": "x"})
			if n := groupsOf(b, q); n != 1 {
				t.Fatalf("a retried job's group was forgotten (%d groups)", n)
			}
			eventually(t, 20*time.Second, "the retry", func() (bool, string) {
				a := c.ok(M{"cmd": "PULL", "queue": q, "owner": "w", "timeout": 0})
				if j, ok := a["job"].(M); ok {
					c.ok(M{"cmd": "ACK", "id": j["id"], "token": a["token"]})
					return true, ""
				}
				return false, "no job yet"
			})
		}},
		{"Cancel", func(q string) {
			id := push(t, c, q, g)
			c.ok(M{"cmd": "Cancel", "id": id})
		}},
		{"Discard", func(q string) {
			push(t, c, q, g)
			id, tok := pullOwned(t, c, q, nil)
			c.ok(M{"cmd": "Discard", "id": id, "token": tok})
		}},
		{"Drain", func(q string) {
			push(t, c, q, g)
			push(t, c, q, with(M{"delay": 60000}))
			c.ok(M{"cmd": "Drain", "queue": q})
		}},
		{"Clean", func(q string) {
			push(t, c, q, g)
			c.ok(M{"cmd": "Clean", "queue": q, "grace": 0, "state": "waiting"})
		}},
		{"Promote, ChangePriority, then ACK", func(q string) {
			id := push(t, c, q, with(M{"delay": 60000}))
			c.ok(M{"cmd": "Promote", "id": id})
			c.ok(M{"cmd": "ChangePriority", "id": id, "priority": 5})
			if n := groupsOf(b, q); n != 1 {
				t.Fatalf("a moved job's group was forgotten (%d groups)", n)
			}
			id, tok := pullOwned(t, c, q, nil)
			c.ok(M{"cmd": "ACK", "id": id, "token": tok})
		}},
		{"expired while waiting", func(q string) {
			id := push(t, c, q, with(M{"ttl": 1}))
			made := int64(num(t, job(t, c.ok(M{"cmd": "GetJob", "id": id}))["createdAt"]))
			clockPast(t, b.now, made+1) // past the ttl by the engine's clock
			if a := c.ok(M{"cmd": "PULL", "queue": q, "timeout": 0}); a["job"] != nil {
				t.Fatalf("an expired job was handed out: %v", a)
			}
		}},
		{"lock expired to the DLQ", func(q string) {
			push(t, c, q, with(M{"maxAttempts": 1}))
			pullOwned(t, c, q, M{"lockTtl": 50})
		}},
	} {
		q := "exit-" + strings.NewReplacer(" ", "-", ",", "").Replace(tc.name)
		tc.run(q)
		wantGroups(t, b, q, 0, tc.name+": the group forgotten")
	}
}

// TestGroupKeptWhileItsWindowRuns: a group whose rate window is still
// running is kept with no job, so that a job pushed to it again waits for
// the window as before; it is forgotten once the window is over.
func TestGroupKeptWhileItsWindowRuns(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	c := dial(t, serveBroker(t, b))
	const q = "win"
	limit := M{"limit": M{"max": 1, "duration": 1500}}
	push(t, c, q, M{"groupId": "G"})
	id, tok := pullOwned(t, c, q, M{"group": limit})
	c.ok(M{"cmd": "ACK", "id": id, "token": tok})
	if n := groupsOf(b, q); n != 1 {
		t.Fatalf("a group in its window was forgotten (%d groups)", n)
	}
	push(t, c, q, M{"groupId": "G"})
	if a := c.ok(M{"cmd": "PULL", "queue": q, "owner": "w", "timeout": 0, "group": limit}); a["job"] != nil {
		t.Fatalf("the window was forgotten: a second job in it was handed out: %v", a)
	}
	var a M
	eventually(t, 20*time.Second, "the second job, after the window", func() (bool, string) {
		a = c.ok(M{"cmd": "PULL", "queue": q, "owner": "w", "timeout": 0, "group": limit})
		return a["job"] != nil, "none yet"
	})
	c.ok(M{"cmd": "ACK", "id": job(t, a)["id"], "token": a["token"]})
	wantGroups(t, b, q, 0, "the group forgotten once its window is over")
	// Many groups drained in their windows are forgotten too. The windows
	// outlast the churn on a loaded machine (200 ms did not: the check
	// below found them over and forgotten).
	churnGroups(t, b, q, 2000, &groupPull{limit: &groupLimit{max: 5, duration: 3000}})
	if n := groupsOf(b, q); n == 0 {
		t.Fatal("groups in their windows were forgotten at once")
	}
	wantGroups(t, b, q, 0, "2000 groups forgotten once their windows are over")
	s := b.shardOf(q)
	s.mu.Lock()
	lingering := len(s.lingering)
	s.mu.Unlock()
	if lingering != 0 {
		t.Fatalf("%d groups still lingering", lingering)
	}
}

// TestGroupSettingsKeptAndLimited: a group with settings and no job is
// kept until the last setting is removed (a RateLimitGroup hold until it
// ends), and a queue's groups with settings are limited to
// maxGroupSettings, the refusal naming the limit.
func TestGroupSettingsKeptAndLimited(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	c := dial(t, serveBroker(t, b))
	const q = "set"
	grp := func(cmd, id string, kv ...any) M {
		m := M{"cmd": cmd, "queue": q, "groupId": id}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	c.ok(grp("PauseGroup", "p"))
	c.ok(grp("SetGroupConcurrency", "p", "concurrency", 2))
	c.ok(grp("SetGroupRateLimit", "r", "max", 1, "duration", 1000))
	c.ok(grp("GetGroupConcurrency", "nobody"))
	wantGroups(t, b, q, 2, "the groups with settings kept, a read making none")
	c.ok(grp("ResumeGroup", "p"))
	if n := groupsOf(b, q); n != 2 {
		t.Fatalf("a group with a concurrency left was forgotten (%d groups)", n)
	}
	c.ok(grp("RemoveGroupConcurrency", "p"))
	c.ok(grp("RemoveGroupRateLimit", "r"))
	wantGroups(t, b, q, 0, "the groups forgotten with their last setting")
	c.ok(grp("RateLimitGroup", "h", "duration", 300))
	if n := groupsOf(b, q); n != 1 {
		t.Fatalf("a held group was forgotten at once (%d groups)", n)
	}
	wantGroups(t, b, q, 0, "a held group forgotten when its hold ends")

	// The limit: pipelined, maxGroupSettings paused groups.
	var waits []func() M
	for i := range maxGroupSettings {
		id, ch := c.send(grp("PauseGroup", fmt.Sprint("g", i)))
		waits = append(waits, func() M { return c.await(id, ch, callTimeout) })
	}
	for i, w := range waits {
		if a := w(); a["ok"] != true {
			t.Fatalf("PauseGroup %d: %v", i, a)
		}
	}
	want := "the groups of a queue that are paused or have a concurrency, rate limit or hold of their own are limited to 10000"
	push(t, c, q, M{"groupId": "busy"})
	for _, m := range []M{
		grp("PauseGroup", "new"), grp("SetGroupConcurrency", "new", "concurrency", 1),
		grp("SetGroupRateLimit", "new", "max", 1, "duration", 10), grp("RateLimitGroup", "new", "duration", 10),
		grp("PauseGroup", "busy"),
	} {
		if msg := c.fail(m); msg != want {
			t.Fatalf("%v past the limit: %q, want %q", m["cmd"], msg, want)
		}
	}
	if n := groupsOf(b, q); n != maxGroupSettings+1 {
		t.Fatalf("%d groups after the refusals, want %d", n, maxGroupSettings+1)
	}
	// A group with settings takes more; one removed makes room.
	c.ok(grp("SetGroupConcurrency", "g7", "concurrency", 3))
	c.ok(grp("ResumeGroup", "g8"))
	c.ok(grp("PauseGroup", "busy"))
	if msg := c.fail(grp("PauseGroup", "new")); msg != want {
		t.Fatalf("after the room was taken again: %q", msg)
	}
	// Other queues have their own room.
	c.ok(M{"cmd": "PauseGroup", "queue": "other", "groupId": "new"})
}

// TestGroupSettingsRestoredCounted: groups with settings come back from
// SQLite counted against the limit, and go once their settings are
// removed.
func TestGroupSettingsRestoredCounted(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "g.db")
	b, st, _ := openTestStore(t, path)
	c := dial(t, serveBroker(t, b))
	c.ok(M{"cmd": "PauseGroup", "queue": "q", "groupId": "p"})
	c.ok(M{"cmd": "SetGroupConcurrency", "queue": "q", "groupId": "c", "concurrency": 2})
	c.close()
	b.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	b2, st2, _ := openTestStore(t, path)
	defer st2.Close()
	defer b2.Close()
	settings := func() int {
		s := b2.shardOf("q")
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.queues["q"].nGroupSettings
	}
	if n, g := settings(), groupsOf(b2, "q"); n != 2 || g != 2 {
		t.Fatalf("restored %d groups, %d counted with settings; want 2 and 2", g, n)
	}
	c2 := dial(t, serveBroker(t, b2))
	if a := c2.ok(M{"cmd": "IsGroupPaused", "queue": "q", "groupId": "p"}); sub(t, a, "data")["paused"] != true {
		t.Fatalf("pause not restored: %v", a)
	}
	c2.ok(M{"cmd": "ResumeGroup", "queue": "q", "groupId": "p"})
	c2.ok(M{"cmd": "RemoveGroupConcurrency", "queue": "q", "groupId": "c"})
	if n, g := settings(), groupsOf(b2, "q"); n != 0 || g != 0 {
		t.Fatalf("after their settings were removed: %d groups, %d counted", g, n)
	}
}
