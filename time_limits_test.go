package main

// Issue 25: every command that takes a time or a priority applies PUSH's
// limits, in both engines. A value PUSH refuses is refused by the other
// commands with PUSH's own words, and leaves the job (or the setting) as
// it was; the limits themselves are still accepted. A far-off time must
// never wrap around to a time in the past.

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

// TestTimeAndPriorityLimits runs the checks against a memory-mode server.
func TestTimeAndPriorityLimits(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	checkTimeLimits(t, dial(t, ts.addr))
}

// TestPGTimeAndPriorityLimits runs the same checks against a PostgreSQL
// broker.
func TestPGTimeAndPriorityLimits(t *testing.T) {
	t.Parallel()
	p := startPGBroker(t, pgTestNamespace(t))
	checkTimeLimits(t, dial(t, p.addr()))
}

// badDelays are delays PUSH refuses, with its answer to each.
var badDelays = []struct {
	v    any
	want string
}{
	{int64(math.MaxInt64), "delay must be at most 31536000000"},
	{int64(math.MinInt64), "delay must be at least 0"},
	{1e300, "delay must be at most 31536000000"},
	{-1e300, "delay must be at least 0"},
	{math.NaN(), "delay must be a finite number"},
	{math.Inf(1), "delay must be a finite number"},
	{int64(maxDelayMs + 1), "delay must be at most 31536000000"},
	{int64(-1), "delay must be at least 0"},
}

// badPriorities are priorities PUSH refuses for a job without a group.
var badPriorities = []struct {
	v    any
	want string
}{
	{int64(math.MaxInt64), "priority must be at most 1000000"},
	{int64(math.MinInt64), "priority must be at least -1000000"},
	{1e300, "priority must be at most 1000000"},
	{-1e300, "priority must be at least -1000000"},
	{math.NaN(), "priority must be a finite number"},
	{math.Inf(-1), "priority must be a finite number"},
	{int64(maxPriority + 1), "priority must be at most 1000000"},
	{int64(-maxPriority - 1), "priority must be at least -1000000"},
	{1.5, "priority must be an integer"},
}

func checkTimeLimits(t *testing.T, c *tclient) {
	t.Helper()
	checkDelayLimits(t, c)
	checkPriorityLimits(t, c)
	checkCronLimits(t, c)
	checkQueueTimeLimits(t, c)
	checkRepeatLimits(t, c)
}

// wantRunAt checks that job id runs about delay ms from now: never in the
// past, as a wrapped-around sum would make it.
func wantRunAt(t *testing.T, c *tclient, id string, delay int64) {
	t.Helper()
	j := sub(t, c.ok(M{"cmd": "GetJob", "id": id}), "job")
	got := int64(num(t, j["runAt"])) - time.Now().UnixMilli()
	if got < delay-60000 || got > delay+60000 {
		t.Fatalf("job %s runs in %d ms, want about %d", id, got, delay)
	}
}

func wantState(t *testing.T, c *tclient, id, want string) {
	t.Helper()
	if st := str(t, c.ok(M{"cmd": "GetState", "id": id}), "state"); st != want {
		t.Fatalf("job %s is %s, want %s", id, st, want)
	}
}

func wantNothingToPull(t *testing.T, c *tclient, q string) {
	t.Helper()
	if a := c.ok(M{"cmd": "PULL", "queue": q}); a["job"] != nil {
		t.Fatalf("pulled %v from %s, want nothing", a["job"], q)
	}
}

// checkDelayLimits: ChangeDelay and MoveToDelayed, of a delayed job and of
// an active one, refuse what PUSH refuses and keep the job where it was.
func checkDelayLimits(t *testing.T, c *tclient) {
	t.Helper()
	q := "limits-delay"
	delayed := str(t, c.ok(M{"cmd": "PUSH", "queue": q, "data": 1, "delay": 600000}), "id")
	c.ok(M{"cmd": "PUSH", "queue": q + "-active", "data": 2})
	active := c.ok(M{"cmd": "PULL", "queue": q + "-active", "owner": "w", "lockTtl": 60000})
	activeID, tok := str(t, sub(t, active, "job"), "id"), str(t, active, "token")

	for _, d := range badDelays {
		if got := c.fail(M{"cmd": "PUSH", "queue": q, "data": 0, "delay": d.v}); got != d.want {
			t.Fatalf("PUSH delay %v: %q, want %q", d.v, got, d.want)
		}
		for _, cmd := range []string{"ChangeDelay", "MoveToDelayed"} {
			if got := c.fail(M{"cmd": cmd, "id": delayed, "delay": d.v}); got != d.want {
				t.Errorf("%s of a delayed job, delay %v: %q, want PUSH's %q", cmd, d.v, got, d.want)
			}
			if got := c.fail(M{"cmd": cmd, "id": activeID, "token": tok, "delay": d.v}); got != d.want {
				t.Errorf("%s of an active job, delay %v: %q, want PUSH's %q", cmd, d.v, got, d.want)
			}
		}
	}
	// Nothing moved: the delayed job still waits its 10 minutes, the
	// active one is still held.
	wantState(t, c, delayed, "delayed")
	wantRunAt(t, c, delayed, 600000)
	wantNothingToPull(t, c, q)
	wantState(t, c, activeID, "active")

	// The limit itself is accepted, and lands a year ahead, not in the
	// past.
	c.ok(M{"cmd": "ChangeDelay", "id": delayed, "delay": int64(maxDelayMs)})
	wantState(t, c, delayed, "delayed")
	wantRunAt(t, c, delayed, maxDelayMs)
	wantNothingToPull(t, c, q)
	c.ok(M{"cmd": "MoveToDelayed", "id": activeID, "token": tok, "delay": int64(maxDelayMs)})
	wantState(t, c, activeID, "delayed")
	wantRunAt(t, c, activeID, maxDelayMs)
	wantNothingToPull(t, c, q+"-active")
	// And 0 still makes the job ready.
	c.ok(M{"cmd": "ChangeDelay", "id": delayed, "delay": 0})
	if j := sub(t, c.ok(M{"cmd": "PULL", "queue": q}), "job"); j["id"] != delayed {
		t.Fatalf("after ChangeDelay 0, pulled %v, want %s", j["id"], delayed)
	}
}

// checkPriorityLimits: ChangePriority refuses what PUSH refuses, for a
// job without a group (±1,000,000) and for a group's job (0..2097151).
func checkPriorityLimits(t *testing.T, c *tclient) {
	t.Helper()
	q := "limits-prio"
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": q, "data": 1}), "id")
	prio := func(id string) float64 {
		return num(t, sub(t, c.ok(M{"cmd": "GetJob", "id": id}), "job")["priority"])
	}
	for _, p := range badPriorities {
		if got := c.fail(M{"cmd": "PUSH", "queue": q, "data": 0, "priority": p.v}); got != p.want {
			t.Fatalf("PUSH priority %v: %q, want %q", p.v, got, p.want)
		}
		if got := c.fail(M{"cmd": "ChangePriority", "id": id, "priority": p.v}); got != p.want {
			t.Errorf("ChangePriority %v: %q, want PUSH's %q", p.v, got, p.want)
		}
	}
	if p := prio(id); p != 0 {
		t.Fatalf("priority after refused changes: %v, want 0", p)
	}
	for _, p := range []int64{maxPriority, -maxPriority} {
		c.ok(M{"cmd": "ChangePriority", "id": id, "priority": p})
		if got := prio(id); got != float64(p) {
			t.Fatalf("priority after ChangePriority %d: %v", p, got)
		}
	}

	// A group's job: the group's range, as PUSH with a groupId has it.
	gid := str(t, c.ok(M{"cmd": "PUSH", "queue": q, "data": 2, "groupId": "g", "priority": 2000000}), "id")
	c.ok(M{"cmd": "ChangePriority", "id": gid, "priority": int64(maxGroupPrio)})
	for _, v := range []any{int64(maxGroupPrio + 1), int64(-1), int64(math.MaxInt64), int64(math.MinInt64), 1e300} {
		want := c.fail(M{"cmd": "PUSH", "queue": q, "data": 0, "groupId": "g", "priority": v})
		if want != "group.priority must be between 0 and 2097151" {
			t.Fatalf("PUSH with a group, priority %v: %q", v, want)
		}
		if got := c.fail(M{"cmd": "ChangePriority", "id": gid, "priority": v}); got != want {
			t.Errorf("ChangePriority of a group's job, %v: %q, want PUSH's %q", v, got, want)
		}
	}
	if p := prio(gid); p != maxGroupPrio {
		t.Fatalf("the group job's priority after refused changes: %v, want %d", p, maxGroupPrio)
	}
}

// checkCronLimits: a schedule whose jobs PUSH would refuse is refused when
// it is made, not at each run.
func checkCronLimits(t *testing.T, c *tclient) {
	t.Helper()
	q := "limits-cron"
	for _, p := range badPriorities {
		if got := c.fail(M{"cmd": "Cron", "name": "bad", "queue": q, "repeatEvery": 60000, "priority": p.v}); got != p.want {
			t.Errorf("Cron priority %v: %q, want PUSH's %q", p.v, got, p.want)
		}
	}
	for _, d := range badDelays {
		got := c.fail(M{"cmd": "Cron", "name": "bad", "queue": q, "repeatEvery": 60000, "jobOptions": M{"delay": d.v}})
		if !strings.Contains(got, d.want) {
			t.Errorf("Cron jobOptions.delay %v: %q, want PUSH's %q in it", d.v, got, d.want)
		}
	}
	if got := c.fail(M{"cmd": "Cron", "name": "bad", "queue": q, "repeatEvery": int64(maxDelayMs + 1)}); got != "repeatEvery must be at most 31536000000" {
		t.Errorf("Cron repeatEvery past a year: %q", got)
	}
	// Names PostgreSQL's text cannot hold (before, in PostgreSQL mode, the
	// database's own error reached the client; found by FuzzCommandsPG).
	for _, name := range []string{"a\x00b", "\xff\xfe"} {
		if got := c.fail(M{"cmd": "Cron", "name": name, "queue": q, "repeatEvery": 60000}); got != "Cron name must be UTF-8 text without NUL characters" {
			t.Errorf("Cron named %q: %q", name, got)
		}
		for _, cmd := range []string{"CronGet", "CronDelete"} {
			if got := c.fail(M{"cmd": cmd, "name": name}); got != "Cron job not found" {
				t.Errorf("%s %q: %q", cmd, name, got)
			}
		}
	}
	if l := list(t, c.ok(M{"cmd": "CronList"}), "crons"); len(l) != 0 {
		t.Fatalf("refused schedules were made: %v", l)
	}
	c.ok(M{"cmd": "Cron", "name": "edge", "queue": q, "repeatEvery": int64(maxDelayMs), "priority": int64(maxPriority),
		"jobOptions": M{"delay": int64(maxDelayMs)}})
	c.ok(M{"cmd": "CronDelete", "name": "edge"})
}

// checkQueueTimeLimits: the times of a queue's settings (RateLimit's
// duration and ttl, the stall policy's interval and grace period, a
// group's rate limit) and Clean's grace take PUSH's bounds for a time.
func checkQueueTimeLimits(t *testing.T, c *tclient) {
	t.Helper()
	q := "limits-queue"
	c.ok(M{"cmd": "PUSH", "queue": q, "data": 1})
	limits := func() string { return jsonOf(t, sub(t, c.ok(M{"cmd": "GetQueueLimits", "queue": q}), "data")) }
	stall := func() string { return jsonOf(t, sub(t, c.ok(M{"cmd": "GetStallConfig", "queue": q}), "config")) }
	limits0, stall0 := limits(), stall()
	for _, tc := range []struct {
		req  M
		want string
	}{
		{M{"cmd": "RateLimit", "queue": q, "limit": 5, "duration": int64(math.MaxInt64)}, "duration must be at most 31536000000"},
		{M{"cmd": "RateLimit", "queue": q, "limit": 5, "duration": -1}, "duration must be at least 0"},
		{M{"cmd": "RateLimit", "queue": q, "limit": 5, "ttl": int64(math.MaxInt64)}, "ttl must be at most 31536000000"},
		{M{"cmd": "RateLimit", "queue": q, "limit": 5, "ttl": 1e300}, "ttl must be at most 31536000000"},
		{M{"cmd": "RateLimit", "queue": q, "limit": 5, "ttl": int64(maxDelayMs + 1)}, "ttl must be at most 31536000000"},
		{M{"cmd": "RateLimit", "queue": q, "limit": 5, "ttl": -1}, "ttl must be at least 0"},
		{M{"cmd": "SetStallConfig", "queue": q, "config": M{"stallInterval": int64(math.MaxInt64)}}, "config.stallInterval must be at most 31536000000"},
		{M{"cmd": "SetStallConfig", "queue": q, "config": M{"gracePeriod": 1e300}}, "config.gracePeriod must be at most 31536000000"},
		{M{"cmd": "SetStallConfig", "queue": q, "config": M{"gracePeriod": -1}}, "config.gracePeriod must be at least 0"},
		{M{"cmd": "Clean", "queue": q, "grace": int64(math.MinInt64)}, "grace must be at least 0"},
		{M{"cmd": "Clean", "queue": q, "grace": int64(math.MaxInt64)}, "grace must be at most 31536000000"},
		{M{"cmd": "Clean", "queue": q, "grace": math.NaN()}, "grace must be a finite number"},
		{M{"cmd": "RateLimitGroup", "queue": q, "groupId": "g", "duration": int64(maxDelayMs + 1)}, "duration must be at most 31536000000"},
		{M{"cmd": "SetGroupRateLimit", "queue": q, "groupId": "g", "max": 1, "duration": int64(maxDelayMs + 1)}, "duration must be at most 31536000000"},
	} {
		if got := c.fail(tc.req); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.req, got, tc.want)
		}
	}
	if l := limits(); l != limits0 {
		t.Errorf("queue limits after refused changes: %s, want %s", l, limits0)
	}
	if s := stall(); s != stall0 {
		t.Errorf("stall config after refused changes: %s, want %s", s, stall0)
	}
	if n := num(t, sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": q}), "counts")["waiting"]); n != 1 {
		t.Errorf("waiting jobs after refused cleans: %v, want 1", n)
	}
	if a := sub(t, c.ok(M{"cmd": "GetGroupRateLimit", "queue": q, "groupId": "g"}), "data"); a["limit"] != nil {
		t.Errorf("group rate limit after refused changes: %v", a)
	}

	// The limits themselves are accepted: a rate limit that lasts a year
	// still holds (it did not wrap around to already expired).
	c.ok(M{"cmd": "RateLimit", "queue": q, "limit": 5, "duration": int64(maxDelayMs), "ttl": int64(maxDelayMs)})
	ttl := num(t, sub(t, sub(t, c.ok(M{"cmd": "GetQueueLimits", "queue": q}), "data"), "limits")["rateLimitTtl"])
	if ttl < maxDelayMs-60000 {
		t.Errorf("a rate limit set for a year expires in %v ms", ttl)
	}
	c.ok(M{"cmd": "RateLimitClear", "queue": q})
	c.ok(M{"cmd": "SetStallConfig", "queue": q, "config": M{"stallInterval": int64(maxDelayMs), "gracePeriod": int64(maxDelayMs)}})
	c.ok(M{"cmd": "Clean", "queue": q, "grace": int64(maxDelayMs)})
	c.ok(M{"cmd": "RateLimitGroup", "queue": q, "groupId": "g", "duration": int64(maxDelayMs)})
	c.ok(M{"cmd": "SetGroupRateLimit", "queue": q, "groupId": "g", "max": 1, "duration": int64(maxDelayMs)})
}

// checkRepeatLimits: PUSH's repeat option takes bounded times, and the
// next run of a repeat is found at once whatever its offset (it was found
// by stepping one interval at a time: every 1 ms with an offset of a year
// back held the shard for tens of seconds).
func checkRepeatLimits(t *testing.T, c *tclient) {
	t.Helper()
	q := "limits-repeat"
	for _, tc := range []struct {
		repeat M
		want   string
	}{
		{M{"every": int64(math.MaxInt64)}, "repeat.every must be at most 31536000000"},
		{M{"every": int64(maxDelayMs + 1)}, "repeat.every must be at most 31536000000"},
		{M{"every": 1000, "offset": int64(math.MinInt64)}, "repeat.offset must be at least -31536000000"},
		{M{"every": 1000, "offset": 1e300}, "repeat.offset must be at most 31536000000"},
		{M{"every": 1000, "startDate": int64(math.MaxInt64)}, "repeat.startDate must be at most 1000000000000000"},
		{M{"every": 1000, "endDate": int64(math.MinInt64)}, "repeat.endDate must be at least 0"},
		{M{"every": 1000, "prevMillis": 1e300}, "repeat.prevMillis must be at most 1000000000000000"},
	} {
		if got := c.fail(M{"cmd": "PUSH", "queue": q, "data": 1, "repeat": tc.repeat}); got != tc.want {
			t.Errorf("PUSH repeat %v: %q, want %q", tc.repeat, got, tc.want)
		}
	}
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": q, "data": 1, "repeat": M{"every": 1, "offset": int64(-maxDelayMs)}}), "id")
	if j := sub(t, c.ok(M{"cmd": "PULL", "queue": q}), "job"); j["id"] != id {
		t.Fatalf("pulled %v, want %s", j["id"], id)
	}
	start := time.Now()
	if _, err := c.do(M{"cmd": "ACK", "id": id}, 5*time.Second); err != nil {
		t.Fatalf("ACK of a repeat every 1 ms offset a year back: %v", err)
	}
	t.Logf("ACK with the next run found in %v", time.Since(start))
	counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": q}), "counts")
	if n := num(t, counts["waiting"]) + num(t, counts["delayed"]); n != 1 {
		t.Fatalf("after the ACK, counts %v: want the next run queued", counts)
	}
}

// jsonOf is v as JSON, times blanked (normAnswer), to compare answers.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(normAnswer("", v))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Leases and the DLQ's times take the same bounds (issue 25). PULL's and
// PULLB's lockTtl, a renewal's duration (JobHeartbeat, ExtendLock) and
// ExtendLocks' durations take at most a year either way (leaseRule: 0 or
// less still means the default, or the lock's own TTL); SetDlqConfig's
// autoRetryInterval and maxAge take 0 to a year. Before, a lockTtl of
// 2^63 wrapped now + ttl around to the past in memory and broke the
// PostgreSQL heartbeat's SQL (bigint out of range), and a maxAge of
// 1e300 became 0 and expired every DLQ entry at once.

// TestLeaseTimeLimits runs the lease checks against a memory-mode server.
func TestLeaseTimeLimits(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	checkPullLimits(t, c, nil)
	checkRenewLimits(t, c, nil)
}

// TestPGLeaseTimeLimits runs them against a PostgreSQL broker, and reads
// the leases' expiry from the database as well.
func TestPGLeaseTimeLimits(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	p := startPGBroker(t, ns)
	ctx, conn := pgTestConn(t)
	expiry := func(id string) int64 {
		t.Helper()
		var exp *int64
		if err := conn.QueryRow(ctx, "SELECT lease_expires FROM queued_"+ns+".jobs WHERE id = $1", id).Scan(&exp); err != nil {
			t.Fatalf("lease of %s: %v", id, err)
		}
		if exp == nil {
			t.Fatalf("job %s has no lease", id)
		}
		return *exp
	}
	c := dial(t, p.addr())
	checkPullLimits(t, c, expiry)
	checkRenewLimits(t, c, expiry)
}

// TestDlqTimeLimits runs the DLQ policy's checks against a memory-mode
// server.
func TestDlqTimeLimits(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	checkDlqTimeLimits(t, dial(t, ts.addr))
}

// TestPGDlqTimeLimits runs them against a PostgreSQL broker.
func TestPGDlqTimeLimits(t *testing.T) {
	t.Parallel()
	p := startPGBroker(t, pgTestNamespace(t))
	checkDlqTimeLimits(t, dial(t, p.addr()))
}

// badLeases are lock times leaseRule refuses, with the end of the answer
// (after the field's label).
var badLeases = []struct {
	v    any
	want string
}{
	{int64(math.MaxInt64), " must be at most 31536000000"},
	{math.Ldexp(1, 63), " must be at most 31536000000"},
	{int64(math.MinInt64), " must be at least -31536000000"},
	{1e300, " must be at most 31536000000"},
	{-1e300, " must be at least -31536000000"},
	{math.NaN(), " must be a finite number"},
	{math.Inf(1), " must be a finite number"},
	{math.Inf(-1), " must be a finite number"},
	{int64(maxDelayMs + 1), " must be at most 31536000000"},
	{int64(-maxDelayMs - 1), " must be at least -31536000000"},
}

// leaseExpiry reads a job's lease expiry from storage (nil: the engine
// does not show it; the checks then rely on what the server answers).
type leaseExpiry func(id string) int64

// wantAbout checks that a time is about want (within a minute).
func wantAbout(t *testing.T, what string, got, want int64) {
	t.Helper()
	if got < want-60000 || got > want+60000 {
		t.Fatalf("%s is %d, %d ms from the %d wanted", what, got, got-want, want)
	}
}

// pushPull pushes a job to q and pulls it with the given lockTtl; it
// answers the job's id and token. No other job of q may be waiting.
func pushPull(t *testing.T, c *tclient, q, cmd string, ttl int64) (string, string) {
	t.Helper()
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": q, "data": 1}), "id")
	var got, tok string
	if cmd == "PULLB" {
		a := c.ok(M{"cmd": "PULLB", "queue": q, "count": 1, "owner": "w", "lockTtl": ttl})
		jobs, toks := list(t, a, "jobs"), list(t, a, "tokens")
		if len(jobs) != 1 || len(toks) != 1 {
			t.Fatalf("PULLB lockTtl %d: %v", ttl, a)
		}
		got, tok = str(t, jobs[0].(M), "id"), toks[0].(string)
	} else {
		got, tok = pullOwned(t, c, q, M{"owner": "w", "lockTtl": ttl})
	}
	if got != id {
		t.Fatalf("%s lockTtl %d pulled %s, want %s", cmd, ttl, got, id)
	}
	return id, tok
}

// checkPullLimits: PULL and PULLB refuse a lockTtl past a year either way
// and pull nothing then; a lockTtl of a year holds the job active (it did
// not wrap around to a lease already expired), and one of minus a year is
// still the default.
func checkPullLimits(t *testing.T, c *tclient, expiry leaseExpiry) {
	t.Helper()
	q := "limits-pull"
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": q, "data": 1}), "id")
	for _, d := range badLeases {
		want := "lockTtl" + d.want
		if got := c.fail(M{"cmd": "PULL", "queue": q, "owner": "w", "lockTtl": d.v}); got != want {
			t.Errorf("PULL lockTtl %v: %q, want %q", d.v, got, want)
		}
		if got := c.fail(M{"cmd": "PULLB", "queue": q, "count": 1, "owner": "w", "lockTtl": d.v}); got != want {
			t.Errorf("PULLB lockTtl %v: %q, want %q", d.v, got, want)
		}
		if got := c.fail(M{"cmd": "PULL", "queue": q, "owner": "w", "lockTtl": d.v, "timeout": 1000}); got != want {
			t.Errorf("PULL lockTtl %v with a timeout: %q, want %q", d.v, got, want)
		}
	}
	// Nothing was pulled.
	wantState(t, c, id, "waiting")
	counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": q}), "counts")
	if num(t, counts["waiting"]) != 1 || num(t, counts["active"]) != 0 {
		t.Fatalf("after refused pulls, counts %v: want the job still waiting", counts)
	}
	if j := sub(t, c.ok(M{"cmd": "GetJob", "id": id}), "job"); num(t, j["attempts"]) != 0 || j["startedAt"] != nil {
		t.Fatalf("after refused pulls, the job is %v", j)
	}

	// The limits are accepted. A year, by PULL and by PULLB; minus a year
	// is the default lock.
	before := time.Now().UnixMilli()
	year, _ := pullOwned(t, c, q, M{"owner": "w", "lockTtl": int64(maxDelayMs)})
	if year != id {
		t.Fatalf("PULL lockTtl of a year pulled %s, want %s", year, id)
	}
	yearB, _ := pushPull(t, c, q, "PULLB", maxDelayMs)
	dflt, _ := pushPull(t, c, q, "PULL", -maxDelayMs)
	dfltB, _ := pushPull(t, c, q, "PULLB", -maxDelayMs)
	if expiry != nil {
		wantAbout(t, "the expiry of a lockTtl of a year", expiry(year), before+maxDelayMs)
		wantAbout(t, "the expiry of PULLB's lockTtl of a year", expiry(yearB), before+maxDelayMs)
		wantAbout(t, "the expiry of a lockTtl of minus a year", expiry(dflt), before+defaultLockTTL)
		wantAbout(t, "the expiry of PULLB's lockTtl of minus a year", expiry(dfltB), before+defaultLockTTL)
	}
	// A job pulled after them for half a second comes back first: their
	// leases, were they wrapped into the past, would have been reclaimed
	// before its own (the reaper takes leases in the order they expire).
	short, _ := pushPull(t, c, q, "PULL", 500)
	waitState(t, c, short, "waiting", 30*time.Second)
	for _, id := range []string{year, yearB, dflt, dfltB} {
		wantState(t, c, id, "active")
	}
}

// checkRenewLimits: JobHeartbeat's and ExtendLock's duration and
// ExtendLocks' durations refuse what a lockTtl refuses, and the lease
// then keeps its expiry; a year renews the lease for a year, and minus a
// year renews it for the lock's own TTL.
func checkRenewLimits(t *testing.T, c *tclient, expiry leaseExpiry) {
	t.Helper()
	q := "limits-lease"
	const ttl = 4000 // the leases that must end; the requests take far less
	start := time.Now()
	held, tok := pushPull(t, c, q, "PULL", ttl)
	var exp0 int64
	if expiry != nil {
		exp0 = expiry(held)
	}
	hb, hbTok := pushPull(t, c, q, "PULL", ttl)
	el, elTok := pushPull(t, c, q, "PULL", ttl)
	els, elsTok := pushPull(t, c, q, "PULL", ttl)
	own, ownTok := pushPull(t, c, q, "PULLB", maxDelayMs)
	// ctrl is pulled after them for as long: it comes back after the
	// refused job, and before any of the renewed ones, whose old leases
	// (or ones wrapped into the past) would have ended first.
	ctrl, _ := pushPull(t, c, q, "PULL", ttl)

	for _, d := range badLeases {
		want := "duration" + d.want
		if got := c.fail(M{"cmd": "JobHeartbeat", "id": held, "token": tok, "duration": d.v}); got != want {
			t.Errorf("JobHeartbeat duration %v: %q, want %q", d.v, got, want)
		}
		if got := c.fail(M{"cmd": "ExtendLock", "id": held, "token": tok, "duration": d.v}); got != want {
			t.Errorf("ExtendLock duration %v: %q, want %q", d.v, got, want)
		}
		want = "durations[0]" + d.want
		if got := c.fail(M{"cmd": "ExtendLocks", "ids": []any{held}, "tokens": []any{tok}, "durations": []any{d.v}}); got != want {
			t.Errorf("ExtendLocks durations [%v]: %q, want %q", d.v, got, want)
		}
		// A good renewal before a bad one is not made either.
		want = "durations[1]" + d.want
		if got := c.fail(M{"cmd": "ExtendLocks", "ids": []any{held, el}, "tokens": []any{tok, elTok},
			"durations": []any{int64(maxDelayMs), d.v}}); got != want {
			t.Errorf("ExtendLocks durations [a year, %v]: %q, want %q", d.v, got, want)
		}
	}
	// The lease is as it was: still held, with its old expiry.
	wantState(t, c, held, "active")
	if expiry != nil {
		if e := expiry(held); e != exp0 {
			t.Fatalf("after refused renewals the lease expires at %d, want %d as before", e, exp0)
		}
	}

	// The limits are accepted: a year renews for a year; minus a year (as
	// 0 or less) for the lock's own TTL, here a year too. A duration that
	// is not a number is absent: the lock's own TTL.
	before := time.Now().UnixMilli()
	if d := sub(t, c.ok(M{"cmd": "JobHeartbeat", "id": hb, "token": hbTok, "duration": int64(maxDelayMs)}), "data"); d["ok"] != true {
		t.Fatalf("JobHeartbeat for a year: %v", d)
	}
	c.ok(M{"cmd": "ExtendLock", "id": el, "token": elTok, "duration": int64(maxDelayMs)})
	if n := num(t, c.ok(M{"cmd": "ExtendLocks", "ids": []any{els}, "tokens": []any{elsTok}, "durations": []any{"soon"}})["count"]); n != 1 {
		t.Fatalf("ExtendLocks with a duration that is not a number renewed %v locks, want 1", n)
	}
	if n := num(t, c.ok(M{"cmd": "ExtendLocks", "ids": []any{els}, "tokens": []any{elsTok}, "durations": []any{int64(maxDelayMs)}})["count"]); n != 1 {
		t.Fatalf("ExtendLocks for a year renewed %v locks, want 1", n)
	}
	if d := sub(t, c.ok(M{"cmd": "JobHeartbeat", "id": own, "token": ownTok, "duration": int64(-maxDelayMs)}), "data"); d["ok"] != true {
		t.Fatalf("JobHeartbeat for minus a year: %v", d)
	}
	c.ok(M{"cmd": "ExtendLock", "id": own, "token": ownTok, "duration": int64(-maxDelayMs)})
	if n := num(t, c.ok(M{"cmd": "ExtendLocks", "ids": []any{own}, "tokens": []any{ownTok}, "durations": []any{int64(-maxDelayMs)}})["count"]); n != 1 {
		t.Fatalf("ExtendLocks for minus a year renewed %v locks, want 1", n)
	}
	if expiry != nil {
		for _, id := range []string{hb, el, els, own} {
			wantAbout(t, "the expiry of "+id+" renewed for a year", expiry(id), before+maxDelayMs)
		}
	}

	// The refused job's lease ends when it always would have, not before.
	waitState(t, c, held, "waiting", 30*time.Second)
	if d := time.Since(start); d < ttl*time.Millisecond-time.Second {
		t.Fatalf("the lease of %d ms came back after %v", ttl, d)
	}
	waitState(t, c, ctrl, "waiting", 30*time.Second)
	for _, id := range []string{hb, el, els, own} {
		wantState(t, c, id, "active")
	}
}

// checkDlqTimeLimits: SetDlqConfig refuses an autoRetryInterval or a
// maxAge outside 0 to a year, with the field's name, and changes nothing
// then (not even the other settings of the same config); it still ignores
// one that is not finite. A year is accepted, and a DLQ entry then
// expires and is retried a year later, not at once.
func checkDlqTimeLimits(t *testing.T, c *tclient) {
	t.Helper()
	q := "limits-dlq"
	config := func() string { return jsonOf(t, sub(t, c.ok(M{"cmd": "GetDlqConfig", "queue": q}), "config")) }
	cfg0 := config()
	for _, key := range []string{"autoRetryInterval", "maxAge"} {
		for _, tc := range []struct {
			v    any
			want string
		}{
			{int64(math.MaxInt64), "must be at most 31536000000"},
			{math.Ldexp(1, 63), "must be at most 31536000000"},
			{1e300, "must be at most 31536000000"},
			{int64(maxDelayMs + 1), "must be at most 31536000000"},
			{int64(math.MinInt64), "must be at least 0"},
			{-1e300, "must be at least 0"},
			{int64(-1), "must be at least 0"},
			{-0.5, "must be at least 0"},
		} {
			want := "config." + key + " " + tc.want
			if got := c.fail(M{"cmd": "SetDlqConfig", "queue": q, "config": M{key: tc.v}}); got != want {
				t.Errorf("SetDlqConfig %s %v: %q, want %q", key, tc.v, got, want)
			}
			got := c.fail(M{"cmd": "SetDlqConfig", "queue": q,
				"config": M{"autoRetry": true, "maxAutoRetries": 9, "maxEntries": 5, key: tc.v}})
			if got != want {
				t.Errorf("SetDlqConfig %s %v with other settings: %q, want %q", key, tc.v, got, want)
			}
		}
		if cfg := config(); cfg != cfg0 {
			t.Fatalf("DLQ config after refused %s: %s, want %s", key, cfg, cfg0)
		}
		// Not finite: ignored, as before.
		for _, v := range []any{math.NaN(), math.Inf(1), math.Inf(-1)} {
			c.ok(M{"cmd": "SetDlqConfig", "queue": q, "config": M{key: v}})
		}
		if cfg := config(); cfg != cfg0 {
			t.Fatalf("DLQ config after a %s that is not finite: %s, want %s", key, cfg, cfg0)
		}
	}

	// The limits are accepted.
	c.ok(M{"cmd": "SetDlqConfig", "queue": q, "config": M{"autoRetry": true, "autoRetryInterval": int64(maxDelayMs), "maxAge": int64(maxDelayMs)}})
	cfg := sub(t, c.ok(M{"cmd": "GetDlqConfig", "queue": q}), "config")
	if cfg["autoRetry"] != true || num(t, cfg["autoRetryInterval"]) != maxDelayMs || num(t, cfg["maxAge"]) != maxDelayMs {
		t.Fatalf("DLQ config set to a year: %v", cfg)
	}
	// deadLetter fails a job for good; it is looked at only when it can
	// still be there (an entry with a maxAge of 1 ms may be gone by then).
	deadLetter := func(look bool) string {
		id := str(t, c.ok(M{"cmd": "PUSH", "queue": q, "data": 1, "maxAttempts": 1}), "id")
		_, tok := pullOwned(t, c, q, M{"owner": "w"})
		c.ok(M{"cmd": "FAIL", "id": id, "token": tok, "error": "boom"})
		if look {
			wantState(t, c, id, "failed")
		}
		return id
	}
	before := time.Now().UnixMilli()
	year := deadLetter(true)
	ents := list(t, c.ok(M{"cmd": "Dlq", "queue": q}), "entries")
	if len(ents) != 1 {
		t.Fatalf("DLQ entries: %v", ents)
	}
	e := ents[0].(M)
	wantAbout(t, "a DLQ entry's expiresAt under a maxAge of a year", int64(num(t, e["expiresAt"])), before+maxDelayMs)
	wantAbout(t, "a DLQ entry's nextRetryAt under an interval of a year", int64(num(t, e["nextRetryAt"])), before+maxDelayMs)

	// An entry made after it with a maxAge of 1 ms expires (the server
	// shows it gone) while the year's entry stays: had its age become 0,
	// it would have expired first.
	c.ok(M{"cmd": "SetDlqConfig", "queue": q, "config": M{"maxAge": 1}})
	soon := deadLetter(false)
	waitState(t, c, soon, "unknown", 30*time.Second)
	wantState(t, c, year, "failed")
	ents = list(t, c.ok(M{"cmd": "Dlq", "queue": q}), "entries")
	if len(ents) != 1 || sub(t, ents[0].(M), "job")["id"] != year {
		t.Fatalf("DLQ entries after the short one expired: %v, want only %s", ents, year)
	}
}
