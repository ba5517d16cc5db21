package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// cronBudgetScenario: a cron's fields have limits, and the schedules'
// data together a budget, the same in both engines.
func cronBudgetScenario(t *testing.T, cs []*tclient) map[string]any {
	c := cs[0]
	out := map[string]any{}
	cron := func(name string, data any) map[string]any {
		return map[string]any{"cmd": "Cron", "name": name, "queue": "cq", "repeatEvery": 3600000, "data": data}
	}
	out["data"] = c.fail(cron("big", strings.Repeat("d", 2<<20)))
	out["name"] = c.fail(cron(strings.Repeat("n", 2000), 1))
	mb := strings.Repeat("m", 1000000)
	n := 0
	for ; n < 100; n++ {
		a := c.call(cron(fmt.Sprint("c", n), mb))
		if a["ok"] != true {
			out["budget"] = a["error"]
			break
		}
	}
	out["fitting"] = n
	// At the budget, a schedule may still be replaced by one as heavy.
	c.ok(cron("c0", mb))
	c.ok(map[string]any{"cmd": "CronDelete", "name": "c1"})
	c.ok(cron("after-a-delete", mb))
	return out
}

// TestCronLimits: refusals name their limits, the same in both engines.
func TestCronLimits(t *testing.T) {
	t.Parallel()
	got := sameAsMemory(t, cronBudgetScenario)
	if got["data"] != "a cron's data is limited to 1 MiB (1048576 bytes)" ||
		got["name"] != "a cron's name is limited to 512 bytes" ||
		got["budget"] != "cron schedules together are limited to 64 MiB (67108864 bytes)" || got["fitting"] != 67 {
		t.Fatalf("cron limits: %v", got)
	}
}

// TestCronCountLimit: at most 10,000 schedules, in memory and in
// PostgreSQL mode (whose table is filled directly, for speed).
func TestCronCountLimit(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	for i := 0; i < maxCrons; i++ {
		if _, err := b.cron.Add(CronSchedule{Name: fmt.Sprint("c", i), Queue: "q", JobName: "j", RepeatEvery: 3600000}); err != nil {
			t.Fatalf("schedule %d: %v", i, err)
		}
	}
	want := "cron schedules are limited to 10000"
	if _, err := b.cron.Add(CronSchedule{Name: "one more", Queue: "q", JobName: "j", RepeatEvery: 3600000}); err == nil || err.Error() != want {
		t.Fatalf("memory, past the limit: %v", err)
	}
	if _, err := b.cron.Add(CronSchedule{Name: "c5", Queue: "q", JobName: "j2", RepeatEvery: 60000}); err != nil {
		t.Fatalf("memory, replacing one at the limit: %v", err)
	}

	// PostgreSQL mode: skipped without the database (needPG).
	t.Run("postgres", func(t *testing.T) {
		ns := pgTestNamespace(t)
		c := dial(t, startPGBroker(t, ns).addr())
		c.ok(map[string]any{"cmd": "Cron", "name": "first", "queue": "q", "repeatEvery": 3600000})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, testPGURL())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		tbl := pgx.Identifier{"queued_" + ns, "crons"}.Sanitize()
		if _, err := conn.Exec(ctx, `INSERT INTO `+tbl+` (name, next_run, record)
			SELECT 'filler' || i, $1, (SELECT record FROM `+tbl+` WHERE name = 'first') FROM generate_series(2, $2) i`,
			time.Now().Add(time.Hour).UnixMilli(), maxCrons); err != nil {
			t.Fatal(err)
		}
		if msg := c.fail(map[string]any{"cmd": "Cron", "name": "one more", "queue": "q", "repeatEvery": 3600000}); msg != want {
			t.Fatalf("PostgreSQL, past the limit: %q", msg)
		}
		c.ok(map[string]any{"cmd": "Cron", "name": "first", "queue": "q", "repeatEvery": 60000})
	})
}

// TestQueueCountLimit: pushes to ever new queue names meet --max-queues,
// by every command that makes a queue; the queues there go on working,
// and an obliterated queue makes room.
func TestQueueCountLimit(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{maxQueues: 5})
	c := dial(t, ts.addr)
	for i := 0; i < 5; i++ {
		c.ok(map[string]any{"cmd": "PUSH", "queue": fmt.Sprint("q", i), "data": i})
	}
	want := "queues are limited to 5 (--max-queues)"
	for _, m := range []map[string]any{
		{"cmd": "PUSH", "queue": "q5", "data": 1},
		{"cmd": "PUSHB", "queue": "q5", "jobs": []any{map[string]any{"data": 1}}},
		{"cmd": "Pause", "queue": "q5"},
		{"cmd": "RateLimit", "queue": "q5", "limit": 10},
		{"cmd": "SetGroupConcurrency", "queue": "q5", "groupId": "g", "concurrency": 2},
		flowFrame("fp", "q5", "q5", []string{"fk"}),
	} {
		if msg := c.fail(m); msg != want {
			t.Fatalf("%v past the limit: %q, want %q", m["cmd"], msg, want)
		}
	}
	// A long poll on a new name has no queue to wait on: it answers at once.
	start := time.Now()
	if a := c.ok(map[string]any{"cmd": "PULL", "queue": "q6", "timeout": 20000}); a["job"] != nil {
		t.Fatalf("pull: %v", a)
	}
	if time.Since(start) > 15*time.Second {
		t.Fatal("a pull on a queue past the limit waited its whole timeout")
	}
	c.ok(map[string]any{"cmd": "PUSH", "queue": "q0", "data": "more"})
	if a := c.ok(map[string]any{"cmd": "PULL", "queue": "q0", "timeout": 0}); a["job"] == nil {
		t.Fatal("an existing queue stopped working")
	}
	c.ok(map[string]any{"cmd": "Obliterate", "queue": "q1"})
	c.ok(map[string]any{"cmd": "PUSH", "queue": "q5", "data": 1})
	if msg := c.fail(map[string]any{"cmd": "PUSH", "queue": "q7", "data": 1}); msg != want {
		t.Fatalf("after the room was taken again: %q", msg)
	}
}
