package main

// Crash tests: the real binary on a SQLite file, killed with SIGKILL while
// clients work, then started again on the same file. Each test counts what
// survived against what the server had answered before the kill.

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// killMargin is how long before the kill an ordinary (buffered) change
// must have been answered to be required on disk: the 10 ms flush
// interval plus a commit made under load.
const killMargin = 250 * time.Millisecond

func (p *serverProc) addr() string { return fmt.Sprintf("127.0.0.1:%d", p.tcpPort) }

// kill9 ends the server the hard way.
func (p *serverProc) kill9(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// answered records ids with the time their answer arrived.
type answered struct {
	mu  sync.Mutex
	ids map[string]time.Time
}

func (a *answered) add(at time.Time, ids ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ids == nil {
		a.ids = map[string]time.Time{}
	}
	for _, id := range ids {
		a.ids[id] = at
	}
}

// count is how many ids have been answered.
func (a *answered) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.ids)
}

// awaitAnswers waits until n pushes have been answered, however long a
// loaded machine takes (bounded by the test's own deadline): the kill
// comes in the middle of a stream of pushes, not after a fixed time.
func awaitAnswers(t *testing.T, a *answered, n int) {
	t.Helper()
	eventually(t, 2*time.Minute, fmt.Sprintf("%d pushes answered", n), func() (bool, string) {
		got := a.count()
		return got >= n, fmt.Sprint(got, " answered")
	})
}

// before returns the ids answered before t.
func (a *answered) before(t time.Time) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for id, at := range a.ids {
		if at.Before(t) {
			out = append(out, id)
		}
	}
	return out
}

// existing counts how many of ids the server knows, by state.
func existing(t *testing.T, c *tclient, ids []string) (found int, states map[string]int) {
	t.Helper()
	states = map[string]int{}
	// Pipelined, a thousand requests at a time.
	for len(ids) > 0 {
		k := min(len(ids), 1000)
		type pend struct {
			id string
			ch chan map[string]any
		}
		ps := make([]pend, k)
		for i, id := range ids[:k] {
			rid, ch := c.send(map[string]any{"cmd": "GetState", "id": id})
			ps[i] = pend{rid, ch}
		}
		for _, p := range ps {
			st := str(t, c.await(p.id, p.ch, callTimeout), "state")
			states[st]++
			if st != "unknown" {
				found++
			}
		}
		ids = ids[k:]
	}
	return found, states
}

// drainAll pulls and acknowledges every job of queue, returning how many
// times each id was delivered.
func drainAll(t *testing.T, c *tclient, queue string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for {
		a := c.ok(map[string]any{"cmd": "PULLB", "queue": queue, "count": 500, "owner": "drain"})
		jobs := list(t, a, "jobs")
		if len(jobs) == 0 {
			return seen
		}
		ids := make([]any, len(jobs))
		for i, j := range jobs {
			id := j.(map[string]any)["id"].(string)
			seen[id]++
			ids[i] = id
		}
		c.ok(map[string]any{"cmd": "ACKB", "ids": ids, "tokens": a["tokens"]})
	}
}

func crashServer(t *testing.T) (string, *serverProc) {
	path := filepath.Join(t.TempDir(), "crash.db")
	return path, startBinary(t, "--data-path", path)
}

// (a) Every durable push that was answered survives a kill.
func TestCrashDurablePushes(t *testing.T) {
	t.Parallel()
	path, srv := crashServer(t)
	var got answered
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		c := dial(t, srv.addr())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				a, err := c.do(map[string]any{"cmd": "PUSH", "queue": "durable", "data": map[string]any{"i": i}, "durable": true}, 5*time.Second)
				if err != nil || a["ok"] != true {
					return // the kill
				}
				got.add(time.Now(), a["id"].(string))
			}
		}()
	}
	awaitAnswers(t, &got, 2000)
	srv.kill9(t)
	close(stop)
	wg.Wait()
	ids := got.before(time.Now())
	if len(ids) < 1000 {
		t.Fatalf("only %d durable pushes answered before the kill; the test needs thousands", len(ids))
	}
	srv2 := startBinary(t, "--data-path", path)
	found, states := existing(t, dial(t, srv2.addr()), ids)
	if found != len(ids) {
		t.Fatalf("%d of %d answered durable pushes survived the kill (%v)", found, len(ids), states)
	}
	t.Logf("%d answered durable pushes, all %d found after the kill", len(ids), found)
}

// (b) Every ordinary push answered more than killMargin before the kill
// survives.
func TestCrashBufferedPushes(t *testing.T) {
	t.Parallel()
	path, srv := crashServer(t)
	var got answered
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 2; w++ {
		c := dial(t, srv.addr())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				jobs := make([]any, 100)
				for k := range jobs {
					jobs[k] = map[string]any{"name": "b", "data": map[string]any{"i": i*100 + k}}
				}
				a, err := c.do(map[string]any{"cmd": "PUSHB", "queue": "buffered", "jobs": jobs}, 5*time.Second)
				if err != nil || a["ok"] != true {
					return
				}
				now := time.Now()
				for _, id := range a["ids"].([]any) {
					got.add(now, id.(string))
				}
			}
		}()
	}
	awaitAnswers(t, &got, 5000)
	// The pushes answered killMargin before the kill must survive: the
	// kill comes once 5,000 of them were answered that long ago, while
	// more come.
	eventually(t, 2*time.Minute, "5000 pushes answered a killMargin ago", func() (bool, string) {
		n := len(got.before(time.Now().Add(-killMargin)))
		return n >= 5000, fmt.Sprint(n)
	})
	killAt := time.Now()
	srv.kill9(t)
	close(stop)
	wg.Wait()
	must := got.before(killAt.Add(-killMargin))
	all := got.before(time.Now())
	if len(must) < 1000 {
		t.Fatalf("only %d pushes answered %v before the kill", len(must), killMargin)
	}
	srv2 := startBinary(t, "--data-path", path)
	c := dial(t, srv2.addr())
	found, states := existing(t, c, must)
	if found != len(must) {
		t.Fatalf("%d of %d pushes answered %v before the kill survived (%v)", found, len(must), killMargin, states)
	}
	total := num(t, sub(t, c.ok(map[string]any{"cmd": "GetJobCounts", "queue": "buffered"}), "counts")["waiting"])
	// How far back the loss reached: the earliest answered push not found.
	late := got.before(time.Now())
	var oldestLost time.Duration
	got.mu.Lock()
	at := make(map[string]time.Time, len(late))
	for _, id := range late {
		at[id] = got.ids[id]
	}
	got.mu.Unlock()
	for _, id := range late {
		if killAt.Sub(at[id]) > oldestLost && killAt.Sub(at[id]) <= killMargin {
			if st := str(t, c.ok(map[string]any{"cmd": "GetState", "id": id}), "state"); st == "unknown" {
				oldestLost = killAt.Sub(at[id])
			}
		}
	}
	t.Logf("pushes answered: %d; %d of them over %v before the kill, all found; %.0f jobs recovered in all; the oldest lost push was answered %v before the kill",
		len(all), len(must), killMargin, total, oldestLost.Round(time.Millisecond))
}

// (c) A job acknowledged before the last flush is not delivered again; (d)
// a job that was active at the kill is delivered again after restart.
func TestCrashAckedAndActive(t *testing.T) {
	t.Parallel()
	path, srv := crashServer(t)
	c := dial(t, srv.addr())
	// 6,000 jobs show what 30,000 did: 3,000 acknowledged before the
	// kill (the check needs 1,000 at least), 500 active at the kill, the
	// rest waiting; the count only made the pushes and the drain longer.
	const n = 6000
	for i := 0; i < n; i += 1000 {
		jobs := make([]any, 1000)
		for k := range jobs {
			jobs[k] = map[string]any{"name": "w", "data": i + k, "durable": k == 999}
		}
		c.ok(map[string]any{"cmd": "PUSHB", "queue": "work", "jobs": jobs})
	}
	var acked answered
	// Complete half of the jobs in batches.
	for len(acked.before(time.Now())) < n/2 {
		a := c.ok(map[string]any{"cmd": "PULLB", "queue": "work", "count": 100, "owner": "w1"})
		jobs := list(t, a, "jobs")
		ids := make([]any, len(jobs))
		strs := make([]string, len(jobs))
		for i, j := range jobs {
			strs[i] = j.(map[string]any)["id"].(string)
			ids[i] = strs[i]
		}
		c.ok(map[string]any{"cmd": "ACKB", "ids": ids, "tokens": a["tokens"]})
		acked.add(time.Now(), strs...)
	}
	// Take 500 jobs and hold them: active at the kill.
	a := c.ok(map[string]any{"cmd": "PULLB", "queue": "work", "count": 500, "owner": "w2"})
	claimed := time.Now()
	var active []string
	for _, j := range list(t, a, "jobs") {
		active = append(active, j.(map[string]any)["id"].(string))
	}
	// The claims reach the disk too: the kill comes a killMargin after
	// their answer (and so after every ACK's).
	clockPast(t, nowMs, claimed.Add(killMargin).UnixMilli())
	killAt := time.Now()
	srv.kill9(t)

	srv2 := startBinary(t, "--data-path", path)
	c2 := dial(t, srv2.addr())
	done := acked.before(killAt.Add(-killMargin))
	if len(done) < 1000 || len(active) != 500 {
		t.Fatalf("test setup: %d acknowledged, %d active", len(done), len(active))
	}
	for _, id := range active {
		if st := str(t, c2.ok(map[string]any{"cmd": "GetState", "id": id}), "state"); st != "waiting" {
			t.Fatalf("job active at the kill is %q after restart, want waiting", st)
		}
	}
	seen := drainAll(t, c2, "work")
	again := 0
	for _, id := range done {
		again += seen[id]
	}
	if again != 0 {
		t.Fatalf("%d of %d jobs acknowledged before the kill were delivered again", again, len(done))
	}
	for _, id := range active {
		if seen[id] != 1 {
			t.Fatalf("job active at the kill delivered %d times after restart, want 1", seen[id])
		}
	}
	if got := len(seen) + len(acked.before(time.Now())); got != n {
		t.Fatalf("%d jobs delivered after restart + %d acknowledged before = %d, want %d", len(seen), len(acked.ids), got, n)
	}
	t.Logf("%d acknowledged before the kill: none delivered again; %d active at the kill: each delivered once; %d delivered after restart", len(done), len(active), len(seen))
}

// A schedule survives a kill -9 with its next run; with skipMissedOnRestart
// false, a run missed while the server was down happens once at start.
func TestCrashCronSchedules(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "cron.db")
	srv := startBinary(t, "--data-path", path)
	c := dial(t, srv.addr())
	a := c.ok(map[string]any{"cmd": "Cron", "name": "nightly", "queue": "cq", "data": map[string]any{"k": 1},
		"schedule": "0 3 * * *", "timezone": "Europe/Berlin"})
	next := num(t, sub(t, a, "cron")["nextRun"])
	c.ok(map[string]any{"cmd": "Cron", "name": "often", "queue": "cq2", "data": 1, "repeatEvery": 400,
		"skipMissedOnRestart": false})
	// A durable push is answered once a flush wrote it and everything
	// before it: the schedules are on disk.
	c.ok(map[string]any{"cmd": "PUSH", "queue": "sync", "data": 1, "durable": true})
	srv.kill9(t)
	// "often" misses a run while down: its next run (400 ms at most after
	// the kill, or one the disk has from before) is past before the start.
	clockPast(t, nowMs, time.Now().Add(400*time.Millisecond).UnixMilli())

	srv2 := startBinary(t, "--data-path", path)
	c2 := dial(t, srv2.addr())
	got := sub(t, c2.ok(map[string]any{"cmd": "CronGet", "name": "nightly"}), "cron")
	if num(t, got["nextRun"]) != next || got["timezone"] != "Europe/Berlin" || got["schedule"] != "0 3 * * *" {
		t.Fatalf("schedule after restart: %v (next run was %v)", got, next)
	}
	eventually(t, 15*time.Second, "the missed run fired", func() (bool, string) {
		n := num(t, sub(t, c2.ok(map[string]any{"cmd": "GetJobCounts", "queue": "cq2"}), "counts")["waiting"])
		return n >= 1, fmt.Sprint(n)
	})
	list := list(t, c2.ok(map[string]any{"cmd": "CronList"}), "crons")
	if len(list) != 2 {
		t.Fatalf("CronList after restart: %v", list)
	}
}
