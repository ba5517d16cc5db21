package main

// Moves by hand, queue maintenance, and the stall and DLQ policy in
// PostgreSQL mode, through several brokers sharing one namespace.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// moveScript drives moves by hand through two connections (a and b) and
// records every answer, normalised: times, lease tokens and durations
// differ from run to run, nothing else may.
func moveScript(t *testing.T, a, b *tclient) []string {
	t.Helper()
	q := "moves"
	tok := ""
	steps := []struct {
		c   *tclient
		req map[string]any
	}{
		{a, map[string]any{"cmd": "PUSH", "queue": q, "data": map[string]any{"v": 1}, "jobId": "a", "delay": 60000}},
		{b, map[string]any{"cmd": "PUSH", "queue": q, "data": 2, "jobId": "b"}},
		{a, map[string]any{"cmd": "PUSH", "queue": q, "data": 3, "jobId": "c", "priority": 3}},
		{b, map[string]any{"cmd": "GetState", "id": "a"}},
		{a, map[string]any{"cmd": "Promote", "id": "a"}},
		{b, map[string]any{"cmd": "Promote", "id": "a"}},
		{b, map[string]any{"cmd": "Promote", "id": "nope"}},
		{b, map[string]any{"cmd": "GetState", "id": "a"}},
		{b, map[string]any{"cmd": "ChangeDelay", "id": "a", "delay": 60000}},
		{a, map[string]any{"cmd": "GetState", "id": "a"}},
		{a, map[string]any{"cmd": "ChangeDelay", "id": "nope", "delay": 1}},
		{a, map[string]any{"cmd": "ChangeDelay", "id": "a", "delay": "soon"}},
		// Times and priorities out of PUSH's range are refused, naming
		// the limit, and move nothing (issue 25); the limits themselves
		// are accepted.
		{a, map[string]any{"cmd": "ChangeDelay", "id": "a", "delay": int64(math.MaxInt64)}},
		{b, map[string]any{"cmd": "ChangeDelay", "id": "a", "delay": int64(math.MinInt64)}},
		{a, map[string]any{"cmd": "ChangeDelay", "id": "a", "delay": 1e300}},
		{b, map[string]any{"cmd": "ChangeDelay", "id": "a", "delay": math.NaN()}},
		{a, map[string]any{"cmd": "ChangeDelay", "id": "a", "delay": int64(maxDelayMs + 1)}},
		{b, map[string]any{"cmd": "MoveToDelayed", "id": "a", "delay": int64(math.MaxInt64)}},
		{a, map[string]any{"cmd": "MoveToDelayed", "id": "a", "delay": -1}},
		{b, map[string]any{"cmd": "ChangeDelay", "id": "nope", "delay": int64(math.MaxInt64)}},
		{a, map[string]any{"cmd": "GetState", "id": "a"}},
		{b, map[string]any{"cmd": "PULL", "queue": q + "-none"}},
		{b, map[string]any{"cmd": "ChangeDelay", "id": "a", "delay": int64(maxDelayMs)}},
		{a, map[string]any{"cmd": "GetState", "id": "a"}},
		{a, map[string]any{"cmd": "ChangePriority", "id": "c", "priority": int64(math.MaxInt64)}},
		{b, map[string]any{"cmd": "ChangePriority", "id": "c", "priority": int64(math.MinInt64)}},
		{a, map[string]any{"cmd": "ChangePriority", "id": "c", "priority": -1e300}},
		{b, map[string]any{"cmd": "ChangePriority", "id": "c", "priority": math.Inf(1)}},
		{a, map[string]any{"cmd": "ChangePriority", "id": "c", "priority": int64(maxPriority + 1)}},
		{b, map[string]any{"cmd": "ChangePriority", "id": "c", "priority": 2.5}},
		{a, map[string]any{"cmd": "GetCountsPerPriority", "queue": q}},
		{b, map[string]any{"cmd": "ChangePriority", "id": "c", "priority": int64(maxPriority)}},
		{a, map[string]any{"cmd": "GetCountsPerPriority", "queue": q}},
		{b, map[string]any{"cmd": "ChangePriority", "id": "c", "priority": 3}},
		{a, map[string]any{"cmd": "PUSH", "queue": q + "-g", "data": 1, "jobId": "g1", "groupId": "g", "priority": 2000000}},
		{b, map[string]any{"cmd": "ChangePriority", "id": "g1", "priority": int64(maxGroupPrio)}},
		{a, map[string]any{"cmd": "ChangePriority", "id": "g1", "priority": int64(maxGroupPrio + 1)}},
		{b, map[string]any{"cmd": "ChangePriority", "id": "g1", "priority": -1}},
		{a, map[string]any{"cmd": "GetCountsPerPriority", "queue": q + "-g"}},
		{b, map[string]any{"cmd": "Cancel", "id": "g1"}},
		{a, map[string]any{"cmd": "Clean", "queue": q, "grace": int64(math.MaxInt64)}},
		{b, map[string]any{"cmd": "Clean", "queue": q, "grace": -1}},
		{b, map[string]any{"cmd": "PromoteJobs", "queue": q, "count": 10}},
		{b, map[string]any{"cmd": "PromoteJobs", "queue": q}},
		{b, map[string]any{"cmd": "ChangePriority", "id": "a", "priority": 7}},
		{a, map[string]any{"cmd": "GetCountsPerPriority", "queue": q}},
		{a, map[string]any{"cmd": "ChangePriority", "id": "zz", "priority": 1}},
		{a, map[string]any{"cmd": "Update", "id": "a", "data": map[string]any{"v": 2}}},
		{b, map[string]any{"cmd": "GetJob", "id": "a"}},
		{b, map[string]any{"cmd": "Cancel", "id": "b"}},
		{a, map[string]any{"cmd": "GetState", "id": "b"}},
		{a, map[string]any{"cmd": "Cancel", "id": "b"}},
		{a, map[string]any{"cmd": "MoveToDelayed", "id": "c", "delay": 60000}},
		{b, map[string]any{"cmd": "GetState", "id": "c"}},
		{b, map[string]any{"cmd": "MoveToWait", "id": "c"}},
		{a, map[string]any{"cmd": "GetState", "id": "c"}},
		{b, map[string]any{"cmd": "GetJobByCustomId", "customId": "a"}},
		{b, map[string]any{"cmd": "GetJobByCustomId", "customId": "nope"}},
		// An active job: moves check its lock as ACK does, and a late ACK
		// or FAIL of the attempt a move ended is refused.
		{a, map[string]any{"cmd": "PULL", "queue": q, "owner": "w1", "lockTtl": 30000}},
		{b, map[string]any{"cmd": "Cancel", "id": "a"}},
		{b, map[string]any{"cmd": "MoveToDelayed", "id": "a", "delay": 60000, "token": "wrong"}},
		{b, map[string]any{"cmd": "MoveToDelayed", "id": "a", "delay": 60000}},
		{b, map[string]any{"cmd": "ChangePriority", "id": "a", "priority": 1}},
		{b, map[string]any{"cmd": "Update", "id": "a", "data": map[string]any{"v": 3}}},
		{b, map[string]any{"cmd": "MoveToWait", "id": "a", "token": "$tok"}},
		{a, map[string]any{"cmd": "ACK", "id": "a", "token": "$tok"}},
		{a, map[string]any{"cmd": "FAIL", "id": "a", "token": "$tok"}},
		{a, map[string]any{"cmd": "GetState", "id": "a"}},
		{a, map[string]any{"cmd": "PULL", "queue": q, "owner": "w1", "lockTtl": 30000}},
		{b, map[string]any{"cmd": "ChangeDelay", "id": "a", "delay": 0, "token": "$tok"}},
		{a, map[string]any{"cmd": "GetState", "id": "a"}},
		{a, map[string]any{"cmd": "PULL", "queue": q, "owner": "w1", "lockTtl": 30000}},
		{b, map[string]any{"cmd": "Discard", "id": "a", "token": "$tok"}},
		{a, map[string]any{"cmd": "ACK", "id": "a", "token": "$tok"}},
		{a, map[string]any{"cmd": "FAIL", "id": "a", "token": "$tok"}},
		{b, map[string]any{"cmd": "Dlq", "queue": q}},
		{a, map[string]any{"cmd": "GetDlqStats", "queue": q}},
		{a, map[string]any{"cmd": "GetDlqConfig", "queue": q}},
		{a, map[string]any{"cmd": "GetStallConfig", "queue": q}},
		{a, map[string]any{"cmd": "SetDlqConfig", "queue": q, "config": map[string]any{"maxEntries": 5, "maxAge": nil, "autoRetryInterval": 1.5}}},
		{b, map[string]any{"cmd": "GetDlqConfig", "queue": q}},
		{a, map[string]any{"cmd": "SetStallConfig", "queue": q, "config": map[string]any{"maxStalls": 2, "stallInterval": 1000}}},
		{b, map[string]any{"cmd": "GetStallConfig", "queue": q}},
		{b, map[string]any{"cmd": "SetStallConfig", "queue": q, "config": map[string]any{"enabled": "x"}}},
		// (GetJobByCustomId of the failed job differs between the engines
		// on purpose: TestCustomIDFindsFinished.)
		{a, map[string]any{"cmd": "MoveToWait", "id": "a"}},
		{b, map[string]any{"cmd": "GetState", "id": "a"}},
		{a, map[string]any{"cmd": "PULL", "queue": q}},
		{b, map[string]any{"cmd": "ACK", "id": "a", "result": "done"}},
		{a, map[string]any{"cmd": "MoveToWait", "id": "a"}},
		{a, map[string]any{"cmd": "RetryCompleted", "queue": q, "id": "a"}},
		{b, map[string]any{"cmd": "GetJob", "id": "a"}},
		{b, map[string]any{"cmd": "RetryCompleted", "queue": q, "id": "a"}},
		{a, map[string]any{"cmd": "Clean", "queue": q, "grace": 0, "limit": 1, "state": "wait"}},
		{b, map[string]any{"cmd": "GetJobCounts", "queue": q}},
		{b, map[string]any{"cmd": "Discard", "id": "c"}},
		{a, map[string]any{"cmd": "GetDlqStats", "queue": q}},
		{a, map[string]any{"cmd": "RemoveDlqJob", "queue": q, "jobId": "c"}},
		{b, map[string]any{"cmd": "RemoveDlqJob", "queue": q, "jobId": "c"}},
		{b, map[string]any{"cmd": "Clean", "queue": q, "grace": 0, "state": "completed"}},
		{b, map[string]any{"cmd": "Clean", "queue": q, "state": "completed"}},
		{a, map[string]any{"cmd": "GetJobCounts", "queue": q}},
		// A dead job whose unique key a live job took stays in the DLQ.
		{a, map[string]any{"cmd": "PUSH", "queue": q, "data": 4, "jobId": "u1", "uniqueKey": "k", "maxAttempts": 1}},
		{b, map[string]any{"cmd": "PULL", "queue": q}},
		{a, map[string]any{"cmd": "FAIL", "id": "u1", "error": "no"}},
		{b, map[string]any{"cmd": "PUSH", "queue": q, "data": 5, "jobId": "u2", "uniqueKey": "k"}},
		{a, map[string]any{"cmd": "RetryDlq", "queue": q}},
		{b, map[string]any{"cmd": "MoveToWait", "id": "u1"}},
		{a, map[string]any{"cmd": "Cancel", "id": "u2"}},
		{b, map[string]any{"cmd": "RetryDlq", "queue": q}},
		{a, map[string]any{"cmd": "GetState", "id": "u1"}},
	}
	var out []string
	for i, s := range steps {
		req := map[string]any{}
		for k, v := range s.req {
			if v == "$tok" {
				v = tok
			}
			req[k] = v
		}
		ans := s.c.call(req)
		if tk, ok := ans["token"].(string); ok {
			tok = tk
		}
		out = append(out, answerLine(t, i, s.req["cmd"], ans))
	}
	return out
}

// normAnswer blanks what differs between runs: times, tokens, durations.
func normAnswer(key string, v any) any {
	switch key {
	case "token", "tokens", "duration", "uptime":
		return "~"
	}
	switch x := v.(type) {
	case map[string]any:
		m := map[string]any{}
		for k, e := range x {
			m[k] = normAnswer(k, e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = normAnswer("", e)
		}
		return l
	}
	if isNum(v) {
		if f := toFloat(v); f > 1e12 {
			return "T"
		}
	}
	return v
}

// answerLine is step i's answer as a script records it: the command and
// the answer normalised (normAnswer), without its reqId.
func answerLine(t *testing.T, i int, cmd any, ans map[string]any) string {
	t.Helper()
	delete(ans, "reqId")
	js, err := json.Marshal(normAnswer("", ans))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d %v: %s", i, cmd, js)
}

// answersAsMemory runs script through two connections to one memory-mode
// server, then through one connection to each of two brokers of a fresh
// namespace, and reports every answer that differs.
func answersAsMemory(t *testing.T, script func(t *testing.T, a, b *tclient) []string) {
	t.Helper()
	mem := startBinary(t, "--memory")
	want := script(t, dial(t, mem.addr()), dial(t, mem.addr()))

	ns := pgTestNamespace(t)
	pa, pb := startPGBroker(t, ns), startPGBroker(t, ns)
	got := script(t, dial(t, pa.addr()), dial(t, pb.addr()))
	if len(got) != len(want) {
		t.Fatalf("%d answers, want %d", len(got), len(want))
	}
	diffs := 0
	for i := range want {
		if got[i] != want[i] {
			diffs++
			t.Errorf("answer differs:\n memory:   %s\n postgres: %s", want[i], got[i])
		}
	}
	t.Logf("%d answers compared, %d differ", len(want), diffs)
}

// TestPGMovesAnswerAsMemory: the same moves through two brokers of one
// namespace answer as through one memory-mode server, field for field.
func TestPGMovesAnswerAsMemory(t *testing.T) {
	t.Parallel()
	answersAsMemory(t, moveScript)
}

// listenWake listens on a namespace's wake-up channel and returns a
// function that waits for a wake-up of queue.
func listenWake(t *testing.T, ns string) (drain func(), wait func(queue string)) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testPGURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{"queued_" + ns + "_wake"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	drain = func() {
		for {
			c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := conn.WaitForNotification(c)
			cancel()
			if err != nil {
				return
			}
		}
	}
	wait = func(queue string) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for {
			n, err := conn.WaitForNotification(c)
			if err != nil {
				t.Fatalf("no wake-up for %s: %v", queue, err)
			}
			if n.Payload == queue {
				return
			}
		}
	}
	return drain, wait
}

// TestPGMovesWakeOtherBrokers: every move that makes a job ready through
// broker A notifies, in its transaction, and a long poll on broker B gets
// the job.
func TestPGMovesWakeOtherBrokers(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	pa, pb := startPGBroker(t, ns), startPGBroker(t, ns)
	a, b := dial(t, pa.addr()), dial(t, pb.addr())
	drain, wait := listenWake(t, ns)
	q := "wake"
	cases := []struct {
		name  string
		setup func() string
		move  func(id string)
	}{
		{"Promote", func() string {
			return str(t, a.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 1, "delay": 600000}), "id")
		}, func(id string) { a.ok(map[string]any{"cmd": "Promote", "id": id}) }},
		{"PromoteJobs", func() string {
			return str(t, a.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 2, "delay": 600000}), "id")
		}, func(id string) {
			if n := num(t, a.ok(map[string]any{"cmd": "PromoteJobs", "queue": q})["count"]); n != 1 {
				t.Fatalf("PromoteJobs promoted %v", n)
			}
		}},
		{"ChangeDelay 0", func() string {
			return str(t, a.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 3, "delay": 600000}), "id")
		}, func(id string) { a.ok(map[string]any{"cmd": "ChangeDelay", "id": id, "delay": 0}) }},
		{"MoveToWait", func() string {
			return str(t, a.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 4, "delay": 600000}), "id")
		}, func(id string) { a.ok(map[string]any{"cmd": "MoveToWait", "id": id}) }},
		{"MoveToWait from the DLQ", func() string {
			id := str(t, a.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 5, "delay": 600000}), "id")
			a.ok(map[string]any{"cmd": "Discard", "id": id})
			return id
		}, func(id string) { a.ok(map[string]any{"cmd": "MoveToWait", "id": id}) }},
		{"RetryCompleted", func() string {
			id := str(t, a.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 6}), "id")
			p := a.ok(map[string]any{"cmd": "PULL", "queue": q})
			if j := sub(t, p, "job"); j["id"] != id {
				t.Fatalf("pulled %v, want %s", j["id"], id)
			}
			a.ok(map[string]any{"cmd": "ACK", "id": id})
			return id
		}, func(id string) {
			if n := num(t, a.ok(map[string]any{"cmd": "RetryCompleted", "queue": q, "id": id})["count"]); n != 1 {
				t.Fatalf("RetryCompleted retried %v", n)
			}
		}},
	}
	for _, c := range cases {
		id := c.setup()
		drain()
		rid, ch := b.send(map[string]any{"cmd": "PULL", "queue": q, "timeout": 20000})
		pollWaiting(t, b)
		start := time.Now()
		c.move(id)
		wait(q)
		ans := b.await(rid, ch, 25*time.Second)
		j, ok := ans["job"].(map[string]any)
		if !ok || j["id"] != id {
			t.Fatalf("%s: the long poll on B got %v, want job %s", c.name, ans, id)
		}
		b.ok(map[string]any{"cmd": "ACK", "id": id})
		t.Logf("%s through A: notified, and the poll on B had the job after %v", c.name, time.Since(start))
	}
}

// TestPGStallConfigAcrossBrokers: a stall policy set through broker A
// (then stopped) is the one broker B's reaper applies, to jobs with and
// without a lock; a queue without a policy keeps the defaults.
func TestPGStallConfigAcrossBrokers(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	pa := startPGBroker(t, ns)
	a := dial(t, pa.addr())
	a.ok(map[string]any{"cmd": "SetStallConfig", "queue": "strict", "config": map[string]any{"maxStalls": 1, "stallInterval": 400, "gracePeriod": 0}})
	a.ok(map[string]any{"cmd": "SetStallConfig", "queue": "off", "config": map[string]any{"enabled": false, "stallInterval": 400, "gracePeriod": 0}})
	a.close()
	pa.stop(t)

	pb := startPGBroker(t, ns)
	b := dial(t, pb.addr())
	cfg := sub(t, b.ok(map[string]any{"cmd": "GetStallConfig", "queue": "strict"}), "config")
	if num(t, cfg["maxStalls"]) != 1 || num(t, cfg["stallInterval"]) != 400 || num(t, cfg["gracePeriod"]) != 0 || cfg["enabled"] != true {
		t.Fatalf("stall config through B: %v", cfg)
	}
	push := func(q string) string {
		return str(t, b.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 1, "maxAttempts": 5}), "id")
	}
	pull := func(q string, owner bool) {
		req := map[string]any{"cmd": "PULL", "queue": q}
		if owner {
			req["owner"], req["lockTtl"] = "w", 300
		}
		if _, ok := b.ok(req)["job"].(map[string]any); !ok {
			t.Fatalf("nothing to pull from %s", q)
		}
	}
	state := func(id string) string { return str(t, b.ok(map[string]any{"cmd": "GetState", "id": id}), "state") }

	// Without a lock: no heartbeat for the interval is a stall, and one
	// stall is the maximum.
	s1 := push("strict")
	pull("strict", false)
	// With a lock that lapses: the same maximum.
	s2 := push("strict")
	pull("strict", true)
	// The default policy: a lapsed lock puts the job back (one stall of
	// three).
	d1 := push("default")
	pull("default", true)
	// Stall detection off: the job stays active without heartbeats.
	o1 := push("off")
	pull("off", false)

	eventually(t, 10*time.Second, "stalled jobs dead-lettered", func() (bool, string) {
		s, s2s, d := state(s1), state(s2), state(d1)
		return s == "failed" && s2s == "failed" && d == "waiting", s + " " + s2s + " " + d
	})
	dlq := b.ok(map[string]any{"cmd": "Dlq", "queue": "strict"})
	var reasons []string
	for _, e := range list(t, dlq, "entries") {
		reasons = append(reasons, str(t, e.(map[string]any), "reason"))
	}
	if !slices.Equal(reasons, []string{"stalled", "stalled"}) {
		t.Fatalf("DLQ reasons %v", reasons)
	}
	job := sub(t, b.ok(map[string]any{"cmd": "GetJob", "id": d1}), "job")
	if num(t, job["attempts"]) != 1 || num(t, job["stallCount"]) != 1 {
		t.Fatalf("the default queue's job after a lapsed lock: %v", job)
	}
	// A heartbeat keeps a job without a lock alive past the interval: a2
	// is beaten until c2, pulled with it and never beaten, has stalled
	// (so the reaper ran past the interval of both).
	a2 := push("strict")
	pull("strict", false)
	c2 := push("strict")
	pull("strict", false)
	eventually(t, 10*time.Second, "the unbeaten job stalled", func() (bool, string) {
		b.ok(map[string]any{"cmd": "JobHeartbeat", "id": a2})
		st := state(c2)
		return st == "failed", st
	})
	if st := state(a2); st != "active" {
		t.Fatalf("a job with heartbeats while another stalled (interval 400) is %s", st)
	}
	// Long past the interval (c2 stalled after it), the unwatched job is
	// still active.
	if st := state(o1); st != "active" {
		t.Fatalf("a job of a queue with stall detection off is %s", st)
	}
	b.ok(map[string]any{"cmd": "ACK", "id": a2})
}

// TestPGCleanLimitAndGrace: Clean through several brokers removes at
// most limit jobs per call, oldest first, only those older than the
// grace period, and each job once.
func TestPGCleanLimitAndGrace(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ps := []*serverProc{startPGBroker(t, ns), startPGBroker(t, ns), startPGBroker(t, ns)}
	c := []*tclient{dial(t, ps[0].addr()), dial(t, ps[1].addr()), dial(t, ps[2].addr())}
	q := "clean"
	old := pushMany(t, c, q, 30, 7)
	// The old jobs are past the grace from here on (the clock past the
	// last one's creation by 2.5 s, and a margin for the brokers' reading
	// of the database's clock); the fresh ones stay within it for 2.5 s
	// after their push, which a busy machine's cleaning takes far less
	// than (with 1 s, a loaded run cleaned them too).
	last := sub(t, c[0].ok(map[string]any{"cmd": "GetJob", "id": old[len(old)-1]}), "job")
	clockPast(t, nowMs, int64(num(t, last["createdAt"]))+2500+200)
	fresh := pushMany(t, c, q, 10, 5)

	// Three brokers clean at once, 4 at a time, with a grace that spares
	// the fresh jobs.
	type res struct {
		ids []string
		err error
	}
	results := make(chan res, 3)
	for i := range c {
		go func(cl *tclient) {
			var got []string
			for {
				a, err := cl.do(map[string]any{"cmd": "Clean", "queue": q, "grace": 2500, "limit": 4, "state": "waiting"}, 20*time.Second)
				if err != nil || a["ok"] != true {
					results <- res{err: fmt.Errorf("clean: %v %v", a, err)}
					return
				}
				ids, _ := a["ids"].([]any)
				if int(toFloat(a["count"])) != len(ids) || len(ids) > 4 {
					results <- res{err: fmt.Errorf("clean answered count %v with %d ids (limit 4)", a["count"], len(ids))}
					return
				}
				if len(ids) == 0 {
					results <- res{ids: got}
					return
				}
				for _, id := range ids {
					got = append(got, id.(string))
				}
			}
		}(c[i])
	}
	var all []string
	for range c {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		all = append(all, r.ids...)
	}
	slices.Sort(all)
	want := slices.Clone(old)
	slices.Sort(want)
	if !slices.Equal(all, want) {
		t.Fatalf("cleaned %d jobs (%d distinct of the %d old ones)", len(all), len(slices.Compact(slices.Clone(all))), len(old))
	}
	counts := sub(t, c[1].ok(map[string]any{"cmd": "GetJobCounts", "queue": q}), "counts")
	if num(t, counts["waiting"]) != float64(len(fresh)) {
		t.Fatalf("after cleaning, counts %v, want %d waiting", counts, len(fresh))
	}
	// Oldest first: one at a time, the fresh jobs go in push order.
	for i := 0; i < 3; i++ {
		a := c[i].ok(map[string]any{"cmd": "Clean", "queue": q, "grace": 0, "limit": 1})
		if ids := list(t, a, "ids"); len(ids) != 1 || ids[0] != fresh[i] {
			t.Fatalf("Clean limit 1 took %v, want %s", ids, fresh[i])
		}
	}
	// Completed jobs by completion time, failed ones from the DLQ.
	for i := 0; i < 5; i++ {
		p := c[i%3].ok(map[string]any{"cmd": "PULL", "queue": q})
		id := sub(t, p, "job")["id"]
		if i < 3 {
			c[(i+1)%3].ok(map[string]any{"cmd": "ACK", "id": id})
		} else {
			c[(i+1)%3].ok(map[string]any{"cmd": "FAIL", "id": id, "error": "x", "unrecoverable": true})
		}
	}
	if n := num(t, c[2].ok(map[string]any{"cmd": "Clean", "queue": q, "grace": 0, "limit": 2, "state": "completed"})["count"]); n != 2 {
		t.Fatalf("Clean completed limit 2: %v", n)
	}
	if n := num(t, c[0].ok(map[string]any{"cmd": "Clean", "queue": q, "grace": 60000, "state": "failed"})["count"]); n != 0 {
		t.Fatalf("Clean failed within the grace period: %v", n)
	}
	if n := num(t, c[1].ok(map[string]any{"cmd": "Clean", "queue": q, "grace": 0, "state": "failed"})["count"]); n != 2 {
		t.Fatalf("Clean failed: %v", n)
	}
	counts = sub(t, c[0].ok(map[string]any{"cmd": "GetJobCounts", "queue": q}), "counts")
	if num(t, counts["completed"]) != 1 || num(t, counts["failed"]) != 0 || num(t, counts["waiting"]) != 2 {
		t.Fatalf("counts at the end %v", counts)
	}
}

// TestPGDlqConfigAcrossBrokers: the DLQ policy set through one broker
// bounds the DLQ filled through others, expires its entries, and retries
// them automatically, each retry once whichever broker's reaper runs it.
func TestPGDlqConfigAcrossBrokers(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ps := []*serverProc{startPGBroker(t, ns), startPGBroker(t, ns), startPGBroker(t, ns)}
	c := []*tclient{dial(t, ps[0].addr()), dial(t, ps[1].addr()), dial(t, ps[2].addr())}
	failOne := func(cl *tclient, q string) string {
		id := str(t, cl.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 1, "maxAttempts": 1}), "id")
		p := cl.ok(map[string]any{"cmd": "PULL", "queue": q})
		if sub(t, p, "job")["id"] != id {
			t.Fatalf("pulled %v, want %s", p, id)
		}
		cl.ok(map[string]any{"cmd": "FAIL", "id": id, "error": "boom"})
		return id
	}

	// maxEntries: the oldest entries go.
	c[0].ok(map[string]any{"cmd": "SetDlqConfig", "queue": "bounded", "config": map[string]any{"maxEntries": 3}})
	var ids []string
	for i := 0; i < 5; i++ {
		ids = append(ids, failOne(c[1+i%2], "bounded"))
	}
	var got []string
	for _, j := range list(t, c[2].ok(map[string]any{"cmd": "Dlq", "queue": "bounded"}), "jobs") {
		got = append(got, str(t, j.(map[string]any), "id"))
	}
	if !slices.Equal(got, ids[2:]) {
		t.Fatalf("DLQ bounded at 3: %v, want %v", got, ids[2:])
	}
	st := sub(t, sub(t, c[0].ok(map[string]any{"cmd": "GetDlqStats", "queue": "bounded"}), "data"), "stats")
	if num(t, st["total"]) != 3 || num(t, sub(t, st, "byReason")["max_attempts_exceeded"]) != 3 {
		t.Fatalf("DLQ stats %v", st)
	}
	// Lowering the bound trims at once.
	c[1].ok(map[string]any{"cmd": "SetDlqConfig", "queue": "bounded", "config": map[string]any{"maxEntries": 1}})
	if l := list(t, c[2].ok(map[string]any{"cmd": "Dlq", "queue": "bounded"}), "jobs"); len(l) != 1 || l[0].(map[string]any)["id"] != ids[4] {
		t.Fatalf("DLQ after maxEntries 1: %v", l)
	}

	// maxAge: entries expire.
	c[2].ok(map[string]any{"cmd": "SetDlqConfig", "queue": "aging", "config": map[string]any{"maxAge": 300}})
	aged := failOne(c[0], "aging")
	entry := list(t, c[1].ok(map[string]any{"cmd": "Dlq", "queue": "aging"}), "entries")[0].(map[string]any)
	if num(t, entry["expiresAt"])-num(t, entry["enteredAt"]) != 300 {
		t.Fatalf("DLQ entry under maxAge 300: %v", entry)
	}
	eventually(t, 10*time.Second, "the DLQ entry expired", func() (bool, string) {
		st := str(t, c[1].ok(map[string]any{"cmd": "GetState", "id": aged}), "state")
		return st == "unknown", st
	})

	// Auto-retry: a job that always fails comes back maxAutoRetries times,
	// then stays.
	c[0].ok(map[string]any{"cmd": "SetDlqConfig", "queue": "again", "config": map[string]any{"autoRetry": true, "autoRetryInterval": 200, "maxAutoRetries": 2}})
	id := failOne(c[1], "again")
	runs := 1
	deadline := time.Now().Add(20 * time.Second)
	for runs < 3 && time.Now().Before(deadline) {
		p := c[runs%3].ok(map[string]any{"cmd": "PULL", "queue": "again", "timeout": 2000})
		j, ok := p["job"].(map[string]any)
		if !ok {
			continue
		}
		if j["id"] != id {
			t.Fatalf("pulled %v, want %s", j["id"], id)
		}
		runs++
		c[runs%3].ok(map[string]any{"cmd": "FAIL", "id": id, "error": "again"})
	}
	if runs != 3 {
		t.Fatalf("the job ran %d times, want 3 (once, then 2 auto-retries)", runs)
	}
	// No third retry.
	if p := c[2].ok(map[string]any{"cmd": "PULL", "queue": "again", "timeout": 1500}); p["job"] != nil {
		t.Fatalf("a retry past maxAutoRetries: %v", p)
	}
	entry = list(t, c[0].ok(map[string]any{"cmd": "Dlq", "queue": "again"}), "entries")[0].(map[string]any)
	if num(t, entry["retryCount"]) != 2 || entry["nextRetryAt"] != nil {
		t.Fatalf("DLQ entry after its retries: %v", entry)
	}
	if a := c[1].ok(map[string]any{"cmd": "RemoveDlqJob", "queue": "again", "jobId": id}); sub(t, a, "data")["removed"] != true {
		t.Fatalf("RemoveDlqJob: %v", a)
	}
	if a := c[2].ok(map[string]any{"cmd": "RemoveDlqJob", "queue": "again", "jobId": id}); sub(t, a, "data")["removed"] != false {
		t.Fatalf("RemoveDlqJob twice: %v", a)
	}
}

// TestPGMoveBadInput: bad fields answer ok:false naming the field.
func TestPGMoveBadInput(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	c := dial(t, startPGBroker(t, ns).addr())
	for _, tc := range []struct {
		req   map[string]any
		field string
	}{
		{map[string]any{"cmd": "ChangeDelay", "id": "x", "delay": "soon"}, "delay"},
		{map[string]any{"cmd": "ChangePriority", "id": "x", "priority": "high"}, "priority"},
		{map[string]any{"cmd": "MoveToWait", "id": "x", "token": 5}, "token"},
		{map[string]any{"cmd": "Clean", "queue": "q", "grace": "old"}, "grace"},
		{map[string]any{"cmd": "RetryCompleted", "queue": "q", "count": "all"}, "count"},
		{map[string]any{"cmd": "PromoteJobs", "queue": "q", "count": "all"}, "count"},
		{map[string]any{"cmd": "SetStallConfig", "queue": "q", "config": map[string]any{"enabled": 1}}, "config.enabled"},
		{map[string]any{"cmd": "SetDlqConfig", "queue": "q", "config": 7}, "config"},
		{map[string]any{"cmd": "GetJobByCustomId", "customId": 7}, "customId"},
		{map[string]any{"cmd": "RemoveDlqJob", "queue": "q", "jobId": 7}, "jobId"},
	} {
		msg := c.fail(tc.req)
		if !strings.Contains(msg, tc.field) {
			t.Errorf("%v: %q does not name %s", tc.req, msg, tc.field)
		}
	}
	// And they changed nothing, or made no queue.
	if qs := list(t, c.ok(map[string]any{"cmd": "ListQueues"}), "queues"); len(qs) != 0 {
		t.Fatalf("queues after refused commands: %v", qs)
	}
}

// dashScript puts jobs of one queue in every state through a and b, then
// reads the dashboard through both; it answers what a and b showed.
func dashScript(t *testing.T, a, b *tclient) (fromA, fromB []string) {
	t.Helper()
	q := "dash"
	a.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": "done", "jobId": "d1"})
	p := b.ok(map[string]any{"cmd": "PULL", "queue": q})
	b.ok(map[string]any{"cmd": "ACK", "id": sub(t, p, "job")["id"]})
	a.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": "dead", "jobId": "d2", "maxAttempts": 1})
	p = a.ok(map[string]any{"cmd": "PULL", "queue": q})
	b.ok(map[string]any{"cmd": "FAIL", "id": sub(t, p, "job")["id"], "error": "x"})
	a.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": "run", "jobId": "d3"})
	b.ok(map[string]any{"cmd": "PULL", "queue": q, "owner": "w", "lockTtl": 60000})
	for i, pr := range []int{0, 0, 5, 2} {
		b.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": i, "jobId": fmt.Sprint("w", i), "priority": pr})
	}
	a.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": "later", "jobId": "l1", "delay": 600000})
	a.ok(map[string]any{"cmd": "PUSH", "queue": "other", "data": 1, "jobId": "o1"})
	a.ok(map[string]any{"cmd": "Pause", "queue": "other"})
	read := func(c *tclient) []string {
		var out []string
		for _, req := range []map[string]any{
			{"cmd": "DashboardQueue", "queue": q, "includeJobs": true, "jobsLimit": 3},
			{"cmd": "DashboardQueue", "queue": "other", "includeJobs": true},
			{"cmd": "DashboardQueue", "queue": "none"},
			{"cmd": "DashboardQueues"},
		} {
			ans := c.ok(req)
			if d, ok := ans["data"].(map[string]any); ok {
				if cs, ok := d["counts"].(map[string]any); ok {
					// This broker's event counters, not the queue's.
					delete(cs, "totalCompleted")
					delete(cs, "totalFailed")
				}
			}
			delete(ans, "reqId")
			js, _ := json.Marshal(normAnswer("", ans))
			out = append(out, fmt.Sprintf("%v %v: %s", req["cmd"], req["queue"], js))
		}
		d := sub(t, c.ok(map[string]any{"cmd": "DashboardOverview"}), "data")
		st, col := sub(t, d, "stats"), sub(t, d, "collections")
		out = append(out, fmt.Sprintf("stats waiting=%v active=%v delayed=%v completed=%v dlq=%v", st["waiting"], st["active"],
			st["delayed"], st["completed"], st["dlq"]))
		out = append(out, fmt.Sprintf("collections jobIndex=%v completedJobs=%v jobLocks=%v processingTotal=%v queuedTotal=%v delayedHeapTotal=%v",
			col["jobIndex"], col["completedJobs"], col["jobLocks"], col["processingTotal"], col["queuedTotal"], col["delayedHeapTotal"]))
		return out
	}
	return read(a), read(b)
}

// TestPGDashboardFromTheDatabase: the dashboard commands answer the same
// figures through every broker, and as memory mode does.
func TestPGDashboardFromTheDatabase(t *testing.T) {
	t.Parallel()
	mem := startBinary(t, "--memory")
	want, _ := dashScript(t, dial(t, mem.addr()), dial(t, mem.addr()))
	ns := pgTestNamespace(t)
	pa, pb := startPGBroker(t, ns), startPGBroker(t, ns)
	fromA, fromB := dashScript(t, dial(t, pa.addr()), dial(t, pb.addr()))
	for i := range want {
		if fromA[i] != fromB[i] {
			t.Errorf("brokers differ:\n A: %s\n B: %s", fromA[i], fromB[i])
		}
		if fromA[i] != want[i] {
			t.Errorf("differs from memory mode:\n memory:   %s\n postgres: %s", want[i], fromA[i])
		}
	}
	t.Logf("%d dashboard answers compared", len(want))
	// The HTTP dashboard's queue list through the broker that did least.
	for _, p := range []*serverProc{pa, pb} {
		res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/dashboard/queues", p.httpPort))
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Queues []map[string]any `json:"queues"`
			Total  int              `json:"total"`
		}
		err = json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(body.Queues)
		want := `[{"active":1,"delayed":1,"dlq":1,"name":"dash","paused":false,"waiting":2},{"active":0,"delayed":0,"dlq":0,"name":"other","paused":true,"waiting":1}]`
		if string(got) != want || body.Total != 2 {
			t.Fatalf("GET /dashboard/queues on port %d: %s (total %d), want %s", p.httpPort, got, body.Total, want)
		}
	}
}

// TestPGDlqBoundUnderLoad: brokers failing jobs into one bounded DLQ at
// once all succeed, and the DLQ ends at its bound.
func TestPGDlqBoundUnderLoad(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ps := []*serverProc{startPGBroker(t, ns), startPGBroker(t, ns), startPGBroker(t, ns)}
	var c []*tclient
	for i := 0; i < 6; i++ {
		c = append(c, dial(t, ps[i%3].addr()))
	}
	q := "busy"
	c[0].ok(map[string]any{"cmd": "SetDlqConfig", "queue": q, "config": map[string]any{"maxEntries": 5}})
	const n = 90
	jobs := make([]any, n)
	for i := range jobs {
		jobs[i] = map[string]any{"name": "j", "data": i, "maxAttempts": 1}
	}
	c[1].ok(map[string]any{"cmd": "PUSHB", "queue": q, "jobs": jobs})
	errs := make(chan error, len(c))
	var failed atomic.Int64
	for _, cl := range c {
		go func(cl *tclient) {
			for {
				p, err := cl.do(map[string]any{"cmd": "PULL", "queue": q}, 20*time.Second)
				if err != nil || p["ok"] != true {
					errs <- fmt.Errorf("pull: %v %v", p, err)
					return
				}
				j, ok := p["job"].(map[string]any)
				if !ok {
					errs <- nil
					return
				}
				a, err := cl.do(map[string]any{"cmd": "FAIL", "id": j["id"], "error": "x"}, 20*time.Second)
				if err != nil || a["ok"] != true {
					errs <- fmt.Errorf("fail: %v %v", a, err)
					return
				}
				failed.Add(1)
			}
		}(cl)
	}
	for range c {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if failed.Load() != n {
		t.Fatalf("%d FAILs accepted, want %d", failed.Load(), n)
	}
	counts := sub(t, c[2].ok(map[string]any{"cmd": "GetJobCounts", "queue": q}), "counts")
	if num(t, counts["failed"]) != 5 {
		t.Fatalf("DLQ bounded at 5 holds %v", counts["failed"])
	}
	t.Logf("%d jobs failed into a DLQ of 5 through 3 brokers at once; %v left", n, counts["failed"])
}
