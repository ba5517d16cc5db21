package main

// Groups, deduplication and debounce in PostgreSQL mode, with three
// brokers as subprocesses sharing one namespace: what one broker decides
// about a group or a key holds on the others.

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// peer is the address of the server a client talks to.
func (c *tclient) peer() string { return c.nc.RemoteAddr().String() }

// together runs fn on per new connections to each broker, all let go at
// the same moment, and waits for them.
func together(t *testing.T, c []*tclient, per int, fn func(pc *tclient, broker, conn int)) {
	t.Helper()
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range c {
		for w := range per {
			pc := dial(t, c[i].peer())
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				fn(pc, i, w)
			}()
		}
	}
	close(gate)
	wg.Wait()
}

// groupWorker pulls with a group option through one broker and
// acknowledges after hold, until stop closes. held counts, per group, the
// jobs it holds between the pull's answer and the ACK's sending: never
// more than the broker counts as active.
type groupLedger struct {
	mu      sync.Mutex
	held    map[string]int
	peak    map[string]int
	done    map[string]int
	started []float64 // the jobs' startedAt, as the brokers wrote it
	errs    []string
}

func (l *groupLedger) fail(msg string) {
	l.mu.Lock()
	l.errs = append(l.errs, msg)
	l.mu.Unlock()
}

func groupWorker(c *tclient, queue, owner string, group map[string]any, count int, hold time.Duration, l *groupLedger, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		a, err := c.do(map[string]any{"cmd": "PULLB", "queue": queue, "count": count, "owner": owner,
			"lockTtl": 30000, "timeout": 200, "group": group}, 20*time.Second)
		if err != nil || a["ok"] != true {
			l.fail(fmt.Sprintf("pull: %v %v", err, a))
			return
		}
		jobs, _ := a["jobs"].([]any)
		toks, _ := a["tokens"].([]any)
		if len(jobs) == 0 {
			continue
		}
		var groups []string
		ids := make([]any, len(jobs))
		l.mu.Lock()
		for i, x := range jobs {
			j := x.(map[string]any)
			ids[i] = j["id"]
			g, _ := j["groupId"].(string)
			groups = append(groups, g)
			l.held[g]++
			l.peak[g] = max(l.peak[g], l.held[g])
			l.started = append(l.started, toFloat(j["startedAt"]))
		}
		l.mu.Unlock()
		time.Sleep(hold)
		l.mu.Lock()
		for _, g := range groups {
			l.held[g]--
		}
		l.mu.Unlock()
		r, err := c.do(map[string]any{"cmd": "ACKB", "ids": ids, "tokens": toks}, 20*time.Second)
		if err != nil || r["ok"] != true {
			l.fail(fmt.Sprintf("ack: %v %v", err, r))
			return
		}
		if d, ok := r["data"].(map[string]any); ok {
			if ig, _ := d["ignoredIndices"].([]any); len(ig) > 0 {
				l.fail(fmt.Sprintf("ACK ignored %v", ig))
			}
		}
		l.mu.Lock()
		for _, g := range groups {
			l.done[g]++
		}
		l.mu.Unlock()
	}
}

func newGroupLedger() *groupLedger {
	return &groupLedger{held: map[string]int{}, peak: map[string]int{}, done: map[string]int{}}
}

// runGroupWorkers runs two workers on each broker until every job is done.
func runGroupWorkers(t *testing.T, c []*tclient, queue string, group map[string]any, count int, hold time.Duration, total int) *groupLedger {
	t.Helper()
	l := newGroupLedger()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, cl := range c {
		for w := range 2 {
			wc := dial(t, cl.peer())
			wg.Add(1)
			go func() {
				defer wg.Done()
				groupWorker(wc, queue, fmt.Sprintf("w%d.%d", i, w), group, count, hold, l, stop)
			}()
		}
	}
	eventually(t, 60*time.Second, "every job done", func() (bool, string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		n := 0
		for _, d := range l.done {
			n += d
		}
		return n >= total || len(l.errs) > 0, fmt.Sprint(l.done)
	})
	close(stop)
	wg.Wait()
	if len(l.errs) > 0 {
		t.Fatalf("workers: %v", l.errs)
	}
	return l
}

// TestPGGroupConcurrencyAcrossBrokers: six workers on three brokers pull
// with group concurrency 2; no group ever has more than 2 jobs held at
// once, one whose concurrency was set to 1 through another broker never
// more than 1, and every job is done once.
func TestPGGroupConcurrencyAcrossBrokers(t *testing.T) {
	t.Parallel()
	c := threePG(t)
	const queue = "gconc"
	groups := []string{"A", "B", "C", "solo"}
	const per = 24
	for i, g := range groups {
		jobs := make([]any, per)
		for k := range jobs {
			jobs[k] = map[string]any{"name": g, "data": k, "groupId": g}
		}
		c[i%3].ok(map[string]any{"cmd": "PUSHB", "queue": queue, "jobs": jobs})
	}
	c[1].ok(map[string]any{"cmd": "SetGroupConcurrency", "queue": queue, "groupId": "solo", "concurrency": 1})
	if a := c[2].ok(map[string]any{"cmd": "GetGroupConcurrency", "queue": queue, "groupId": "solo"}); num(t, sub(t, a, "data")["concurrency"]) != 1 {
		t.Fatalf("GetGroupConcurrency through another broker: %v", a)
	}
	if a := c[0].ok(map[string]any{"cmd": "GetGroupsJobsCount", "queue": queue}); num(t, sub(t, a, "data")["count"]) != float64(per*len(groups)) {
		t.Fatalf("GetGroupsJobsCount: %v", a)
	}
	// Active counts seen through broker 3 while the others work.
	var samples []float64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	sc := dial(t, c[2].peer())
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(5 * time.Millisecond):
			}
			a, err := sc.do(map[string]any{"cmd": "GetGroupActiveCount", "queue": queue, "groupId": "A"}, 10*time.Second)
			if err == nil && a["ok"] == true {
				samples = append(samples, toFloat(a["data"].(map[string]any)["count"]))
			}
		}
	}()
	l := runGroupWorkers(t, c, queue, map[string]any{"concurrency": 2}, 5, 15*time.Millisecond, per*len(groups))
	close(stopSampling)
	<-sampled
	t.Logf("peak held per group %v; done %v; %d samples of A's active count, max %v", l.peak, l.done, len(samples), slices.Max(append(samples, 0)))
	for _, g := range []string{"A", "B", "C"} {
		if l.peak[g] > 2 {
			t.Errorf("group %s: %d jobs held at once, limit 2", g, l.peak[g])
		}
	}
	if l.peak["solo"] != 1 {
		t.Errorf("group solo (concurrency set to 1): peak %d", l.peak["solo"])
	}
	for _, g := range groups {
		if l.done[g] != per {
			t.Errorf("group %s: %d jobs done, want %d", g, l.done[g], per)
		}
	}
	if m := slices.Max(append(samples, 0)); m > 2 {
		t.Errorf("GetGroupActiveCount of A reached %v", m)
	}
	counts := sub(t, c[0].ok(map[string]any{"cmd": "GetJobCounts", "queue": queue}), "counts")
	if num(t, counts["completed"]) != float64(per*len(groups)) || num(t, counts["active"]) != 0 {
		t.Fatalf("counts at the end: %v", counts)
	}
	// The limit admits exactly 2, shown without depending on how the
	// workers above happened to be scheduled: two brokers each claim a D job
	// and hold it; a third claim finds D's turn used up.
	var dj []any
	for k := range 3 {
		dj = append(dj, map[string]any{"name": "D", "data": k, "groupId": "D"})
	}
	c[0].ok(map[string]any{"cmd": "PUSHB", "queue": queue, "jobs": dj})
	pullD := func(cl *tclient, owner string) int {
		a := cl.ok(map[string]any{"cmd": "PULLB", "queue": queue, "count": 1, "owner": owner,
			"lockTtl": 30000, "timeout": 0, "group": map[string]any{"concurrency": 2}})
		jobs, _ := a["jobs"].([]any)
		return len(jobs)
	}
	if n0, n1, n2 := pullD(c[0], "d0"), pullD(c[1], "d1"), pullD(c[2], "d2"); n0 != 1 || n1 != 1 || n2 != 0 {
		t.Errorf("group D with concurrency 2: claims through three brokers got %d, %d, %d jobs, want 1, 1, 0", n0, n1, n2)
	}
	if a := c[1].ok(map[string]any{"cmd": "RemoveGroupConcurrency", "queue": queue, "groupId": "solo"}); num(t, sub(t, a, "data")["removed"]) != 1 {
		t.Fatalf("RemoveGroupConcurrency: %v", a)
	}
	if a := c[2].ok(map[string]any{"cmd": "GetGroupConcurrency", "queue": queue, "groupId": "solo"}); sub(t, a, "data")["concurrency"] != nil {
		t.Fatalf("GetGroupConcurrency after removal: %v", a)
	}
}

// TestPGGroupRateLimitAcrossBrokers: workers on three brokers pull with a
// group limit of 2 jobs per 300 ms; the jobs' start times, as the brokers
// stamped them, never put more than 2 in one window, windows counted as
// the engine counts them (a window opens at the first job after the last
// one closed).
func TestPGGroupRateLimitAcrossBrokers(t *testing.T) {
	t.Parallel()
	c := threePG(t)
	const queue, max, dur, total = "grate", 2, 300, 12
	jobs := make([]any, total)
	for k := range jobs {
		jobs[k] = map[string]any{"name": "r", "data": k, "groupId": "R"}
	}
	c[0].ok(map[string]any{"cmd": "PUSHB", "queue": queue, "jobs": jobs})
	l := runGroupWorkers(t, c, queue, map[string]any{"limit": map[string]any{"max": max, "duration": dur}}, 4, 0, total)
	st := slices.Clone(l.started)
	slices.Sort(st)
	start, n, windows := st[0], 0, 1
	for _, x := range st {
		if x >= start+dur {
			start, n = x, 0
			windows++
		}
		if n++; n > max {
			t.Fatalf("%d jobs started in the window from %v: %v", n, start, st)
		}
	}
	if windows < total/max {
		t.Fatalf("%d jobs in %d windows of at most %d: %v", total, windows, max, st)
	}
	t.Logf("%d jobs over %v ms in %d windows", total, st[len(st)-1]-st[0], windows)
	// A group's own rate limit replaces the pull's, through any broker.
	c[1].ok(map[string]any{"cmd": "SetGroupRateLimit", "queue": queue, "groupId": "R", "max": 1, "duration": 60000})
	lim := sub(t, sub(t, c[2].ok(map[string]any{"cmd": "GetGroupRateLimit", "queue": queue, "groupId": "R"}), "data"), "limit")
	if num(t, lim["max"]) != 1 || num(t, lim["duration"]) != 60000 {
		t.Fatalf("GetGroupRateLimit: %v", lim)
	}
	c[0].ok(map[string]any{"cmd": "PUSHB", "queue": queue, "jobs": []any{
		map[string]any{"name": "r", "data": 1, "groupId": "R"}, map[string]any{"name": "r", "data": 2, "groupId": "R"}}})
	group := map[string]any{"limit": map[string]any{"max": 10, "duration": 1000}}
	if got := list(t, c[0].ok(map[string]any{"cmd": "PULLB", "queue": queue, "count": 5, "group": group}), "jobs"); len(got) != 1 {
		t.Fatalf("first pull under the group's own limit of 1: %d jobs", len(got))
	}
	if got := list(t, c[1].ok(map[string]any{"cmd": "PULLB", "queue": queue, "count": 5, "group": group}), "jobs"); len(got) != 0 {
		t.Fatalf("second pull, through another broker, in the same window: %d jobs", len(got))
	}
	ttl := num(t, sub(t, c[2].ok(map[string]any{"cmd": "GetGroupRateLimitTtl", "queue": queue, "groupId": "R"}), "data")["ttl"])
	if ttl <= 0 || ttl > 60000 {
		t.Fatalf("GetGroupRateLimitTtl in a full window: %v", ttl)
	}
	if a := c[2].ok(map[string]any{"cmd": "RemoveGroupRateLimit", "queue": queue, "groupId": "R"}); num(t, sub(t, a, "data")["removed"]) != 1 {
		t.Fatalf("RemoveGroupRateLimit: %v", a)
	}
	if got := list(t, c[1].ok(map[string]any{"cmd": "PULLB", "queue": queue, "count": 5, "group": group}), "jobs"); len(got) != 1 {
		t.Fatalf("pull after the group's limit was removed: %d jobs", len(got))
	}
}

// TestPGGroupPauseAcrossBrokers: a group paused through one broker is
// held on the others while other groups run; resuming through a third
// wakes a long poll; RateLimitGroup through one broker holds the group on
// all of them; a group's maxSize holds against pushes from three brokers
// at once.
func TestPGGroupPauseAcrossBrokers(t *testing.T) {
	t.Parallel()
	c := threePG(t)
	const queue = "gpause"
	if a := c[0].ok(map[string]any{"cmd": "PauseGroup", "queue": queue, "groupId": "B"}); sub(t, a, "data")["changed"] != true {
		t.Fatalf("PauseGroup: %v", a)
	}
	if a := c[0].ok(map[string]any{"cmd": "PauseGroup", "queue": queue, "groupId": "B"}); sub(t, a, "data")["changed"] != false {
		t.Fatalf("PauseGroup again: %v", a)
	}
	if a := c[1].ok(map[string]any{"cmd": "IsGroupPaused", "queue": queue, "groupId": "B"}); sub(t, a, "data")["paused"] != true {
		t.Fatalf("IsGroupPaused through another broker: %v", a)
	}
	for _, g := range []string{"A", "B", "C"} {
		c[1].ok(map[string]any{"cmd": "PUSH", "queue": queue, "name": g, "data": g, "groupId": g})
	}
	got := list(t, c[2].ok(map[string]any{"cmd": "PULLB", "queue": queue, "count": 10}), "jobs")
	var names []string
	for _, j := range got {
		names = append(names, j.(map[string]any)["name"].(string))
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"A", "C"}) {
		t.Fatalf("pulled with B paused: %v", names)
	}
	if a := c[0].ok(map[string]any{"cmd": "GetGroupJobsCount", "queue": queue, "groupId": "B"}); num(t, sub(t, a, "data")["count"]) != 1 {
		t.Fatalf("GetGroupJobsCount of B: %v", a)
	}
	id, ch := c[2].send(map[string]any{"cmd": "PULL", "queue": queue, "timeout": 20000})
	pollWaiting(t, c[2])
	if a := c[0].ok(map[string]any{"cmd": "ResumeGroup", "queue": queue, "groupId": "B"}); sub(t, a, "data")["changed"] != true {
		t.Fatalf("ResumeGroup: %v", a)
	}
	if a := c[2].await(id, ch, 25*time.Second); a["job"] == nil || a["job"].(map[string]any)["name"] != "B" {
		t.Fatalf("long poll after ResumeGroup through another broker: %v", a)
	}

	// RateLimitGroup: held through every broker until it runs out. The
	// hold counts from the RateLimitGroup, so the time is taken before
	// it is sent; and it is long enough for the checks made while it
	// holds to come before its end on a loaded machine.
	const hold = 2000
	held := time.Now()
	c[0].ok(map[string]any{"cmd": "RateLimitGroup", "queue": queue, "groupId": "H", "duration": hold})
	c[0].ok(map[string]any{"cmd": "PUSH", "queue": queue, "name": "H", "data": 0, "groupId": "H"})
	if a := c[1].ok(map[string]any{"cmd": "PULL", "queue": queue}); a["job"] != nil {
		t.Fatalf("pulled from a rate-limited group through another broker after %v: %v", time.Since(held), a)
	}
	if ttl := num(t, sub(t, c[2].ok(map[string]any{"cmd": "GetGroupRateLimitTtl", "queue": queue, "groupId": "H"}), "data")["ttl"]); ttl <= 0 || ttl > hold {
		t.Fatalf("GetGroupRateLimitTtl of a held group after %v: %v", time.Since(held), ttl)
	}
	a := c[2].ok(map[string]any{"cmd": "PULL", "queue": queue, "timeout": 3 * hold})
	if a["job"] == nil || time.Since(held) < (hold-100)*time.Millisecond {
		t.Fatalf("pull of the held group after %v: %v", time.Since(held), a)
	}

	// maxSize: 3 brokers × 4 connections push single jobs at once into a
	// group of at most 5.
	var mu sync.Mutex
	accepted, refused := 0, 0
	together(t, c, 4, func(pc *tclient, _, _ int) {
		for range 3 {
			a, err := pc.do(map[string]any{"cmd": "PUSH", "queue": queue, "name": "m", "data": 0, "groupId": "M", "groupMaxSize": 5}, 10*time.Second)
			mu.Lock()
			switch {
			case err == nil && a["ok"] == true:
				accepted++
			case err == nil && strings.Contains(fmt.Sprint(a["error"]), "maximum size of 5"):
				refused++
			default:
				t.Errorf("push into a capped group: %v %v", err, a)
			}
			mu.Unlock()
		}
	})
	n := num(t, sub(t, c[0].ok(map[string]any{"cmd": "GetGroupJobsCount", "queue": queue, "groupId": "M"}), "data")["count"])
	t.Logf("capped group: %d pushes accepted, %d refused, %v queued", accepted, refused, n)
	if accepted != 5 || refused != 31 || n != 5 {
		t.Fatalf("capped group of 5: %d accepted, %d refused, %v queued", accepted, refused, n)
	}
}

// TestPGDedupTTLRace: three brokers, four connections each, push the same
// keys at the same moment; each key makes one job, every push answers its
// id and the holder is told of as duplicated; once the ttl runs out the
// key makes a new job.
func TestPGDedupTTLRace(t *testing.T) {
	t.Parallel()
	c := threePG(t)
	// The ttl is long enough for the pushes below to finish well within it
	// on a loaded machine (they raced their holders' expiry at 5 s).
	const queue, keys, ttl = "dedup-race", 20, 15000
	start := time.Now()
	sub0 := dial(t, c[0].peer())
	sub0.ok(map[string]any{"cmd": "SubscribeEvents", "queue": queue})
	type ans struct {
		key int
		id  string
	}
	var mu sync.Mutex
	var answers []ans
	together(t, c, 4, func(pc *tclient, i, w int) {
		for k := range keys {
			d := map[string]any{"ttl": ttl}
			if k%2 == 1 {
				d = map[string]any{} // plain: held until the job finishes
			}
			a, err := pc.do(map[string]any{"cmd": "PUSH", "queue": queue, "name": "d", "data": fmt.Sprint(i, w),
				"uniqueKey": fmt.Sprint("k", k), "dedup": d}, 10*time.Second)
			if err != nil || a["ok"] != true {
				t.Errorf("push: %v %v", err, a)
				return
			}
			mu.Lock()
			answers = append(answers, ans{k, a["id"].(string)})
			mu.Unlock()
		}
	})
	// Every holder was made by now, so its ttl ends by then.
	lapsed := time.Now().Add(ttl * time.Millisecond)
	ids := map[int]string{}
	for _, a := range answers {
		if id, ok := ids[a.key]; ok && id != a.id {
			t.Fatalf("key k%d answered %s and %s", a.key, id, a.id)
		}
		ids[a.key] = a.id
	}
	if len(answers) != keys*12 || len(ids) != keys {
		t.Fatalf("%d answers for %d keys", len(answers), len(ids))
	}
	counts := sub(t, c[1].ok(map[string]any{"cmd": "GetJobCounts", "queue": queue}), "counts")
	if num(t, counts["waiting"]) != keys {
		t.Fatalf("%v jobs made for %d keys", counts["waiting"], keys)
	}
	if time.Since(start) > ttl*time.Millisecond*3/4 {
		t.Fatalf("the pushes took %v, too close to the ttl (%d ms) to judge", time.Since(start), ttl)
	}
	for k := range keys {
		d := sub(t, c[k%3].ok(map[string]any{"cmd": "GetDeduplicationJobId", "queue": queue, "deduplicationId": fmt.Sprint("k", k)}), "data")
		if d["jobId"] != ids[k] {
			t.Fatalf("GetDeduplicationJobId k%d: %v, want %s", k, d["jobId"], ids[k])
		}
	}
	// The pushes through broker 1 that were duplicates are told to its
	// subscribers.
	dupOf := map[any]bool{}
	for ev := sub0.event(5 * time.Second); ; ev = sub0.event(5 * time.Second) {
		if ev["eventType"] == "duplicated" {
			dupOf[ev["jobId"]] = true
			break
		}
	}
	if !slices.ContainsFunc(answers, func(a ans) bool { return dupOf[a.id] }) {
		t.Fatalf("duplicated event for %v, not a holder", dupOf)
	}
	// Wait until each ttl key's holder has lapsed by the clock of the
	// broker that pushes it again: that broker no longer answers it.
	eventually(t, time.Until(lapsed)+20*time.Second, "the ttl holders lapsed", func() (bool, string) {
		for k := 0; k < keys; k += 2 {
			d := sub(t, c[(k+1)%3].ok(map[string]any{"cmd": "GetDeduplicationJobId", "queue": queue, "deduplicationId": fmt.Sprint("k", k)}), "data")
			if d["jobId"] != nil {
				return false, fmt.Sprintf("k%d still held by %v", k, d["jobId"])
			}
		}
		return true, ""
	})
	for k := range keys {
		a := c[(k+1)%3].ok(map[string]any{"cmd": "PUSH", "queue": queue, "name": "d", "data": "late",
			"uniqueKey": fmt.Sprint("k", k), "dedup": map[string]any{"ttl": ttl}})
		if got := a["id"].(string); (got == ids[k]) != (k%2 == 1) {
			t.Fatalf("k%d after the ttl: %s (first job %s)", k, got, ids[k])
		}
	}
	counts = sub(t, c[2].ok(map[string]any{"cmd": "GetJobCounts", "queue": queue}), "counts")
	if num(t, counts["waiting"]) != keys+keys/2 {
		t.Fatalf("after the ttl: %v jobs, want %d", counts["waiting"], keys+keys/2)
	}
}

// TestPGDedupReplaceExtend: replace and extend through different brokers,
// with the holder waiting and running; replace racing from three brokers
// leaves one job; the keys are removed through another broker.
func TestPGDedupReplaceExtend(t *testing.T) {
	t.Parallel()
	c := threePG(t)
	const queue = "dedup-policies"
	push := func(cl *tclient, key string, data any, d map[string]any) map[string]any {
		return cl.call(map[string]any{"cmd": "PUSH", "queue": queue, "name": "d", "data": data, "uniqueKey": key, "dedup": d})
	}
	state := func(id string) string {
		return str(t, c[2].ok(map[string]any{"cmd": "GetState", "id": id}), "state")
	}
	holder := func(key string) any {
		return sub(t, c[0].ok(map[string]any{"cmd": "GetDeduplicationJobId", "queue": queue, "deduplicationId": key}), "data")["jobId"]
	}
	replace := map[string]any{"replace": true}

	// Replace a waiting holder: it goes.
	r1 := str(t, push(c[0], "r", 1, replace), "id")
	r2 := str(t, push(c[1], "r", 2, replace), "id")
	if r1 == r2 || state(r1) != "unknown" || holder("r") != r2 {
		t.Fatalf("replace: %s then %s; first %s, holder %v", r1, r2, state(r1), holder("r"))
	}
	// Replace a running holder: it goes on, the new job takes the key.
	p := c[0].ok(map[string]any{"cmd": "PULL", "queue": queue, "owner": "w", "lockTtl": 30000})
	if sub(t, p, "job")["id"] != r2 {
		t.Fatalf("pulled %v, want %s", p["job"], r2)
	}
	r3 := str(t, push(c[2], "r", 3, replace), "id")
	if r3 == r2 || state(r2) != "active" || holder("r") != r3 {
		t.Fatalf("replace of a running holder: %s; it is %s, holder %v", r3, state(r2), holder("r"))
	}
	c[0].ok(map[string]any{"cmd": "ACK", "id": r2, "token": p["token"]})
	if holder("r") != r3 || state(r3) != "waiting" {
		t.Fatalf("after the replaced job finished: holder %v, %s %s", holder("r"), r3, state(r3))
	}

	// Extend: each duplicate restarts the ttl. What the server decides
	// depends on when it ran each push, somewhere between the send and
	// the answer; a round whose timings a loaded machine made
	// inconclusive is run again with a fresh key.
	extendRound(t, 1200*time.Millisecond, func(key string) (string, time.Time, time.Time) {
		sent := time.Now()
		id := str(t, push(c[0], key, 1, map[string]any{"ttl": 2000, "extend": true}), "id")
		return id, sent, time.Now()
	})
	// Extend against a running holder is refused.
	c[2].ok(map[string]any{"cmd": "Drain", "queue": queue})
	x := str(t, push(c[0], "x", 1, map[string]any{"ttl": 5000, "extend": true}), "id")
	if j := sub(t, c[1].ok(map[string]any{"cmd": "PULL", "queue": queue}), "job"); j["id"] != x {
		t.Fatalf("pulled %v, want %s", j["id"], x)
	}
	if a := push(c[2], "x", 2, map[string]any{"ttl": 5000, "extend": true}); a["ok"] != false || a["error"] != "Duplicate unique_key (extended TTL)" {
		t.Fatalf("extend against a running holder: %v", a)
	}

	// Replace racing from three brokers: one job is left with the key.
	for round := range 5 {
		key := fmt.Sprint("race", round)
		together(t, c, 3, func(pc *tclient, i, _ int) {
			if a, err := pc.do(map[string]any{"cmd": "PUSH", "queue": queue, "name": "d", "data": i, "uniqueKey": key, "dedup": replace}, 10*time.Second); err != nil || a["ok"] != true {
				t.Errorf("replace push: %v %v", err, a)
			}
		})
	}
	counts := sub(t, c[1].ok(map[string]any{"cmd": "GetJobCounts", "queue": queue}), "counts")
	if num(t, counts["waiting"]) != 5 {
		t.Fatalf("replace races of 5 keys left %v jobs", counts["waiting"])
	}

	// Keys removed through other brokers.
	if d := sub(t, c[1].ok(map[string]any{"cmd": "RemoveDeduplicationKey", "queue": queue, "deduplicationId": "race0"}), "data"); num(t, d["count"]) != 1 {
		t.Fatalf("RemoveDeduplicationKey: %v", d)
	}
	if d := sub(t, c[2].ok(map[string]any{"cmd": "RemoveDeduplicationKey", "queue": queue, "deduplicationId": "race0"}), "data"); num(t, d["count"]) != 0 {
		t.Fatalf("RemoveDeduplicationKey again: %v", d)
	}
	if holder("race0") != nil {
		t.Fatalf("holder of a removed key: %v", holder("race0"))
	}
	held := holder("race1").(string)
	if d := sub(t, c[2].ok(map[string]any{"cmd": "RemoveJobDeduplicationKey", "id": held}), "data"); d["removed"] != true {
		t.Fatalf("RemoveJobDeduplicationKey: %v", d)
	}
	if d := sub(t, c[0].ok(map[string]any{"cmd": "RemoveJobDeduplicationKey", "id": held}), "data"); d["removed"] != false {
		t.Fatalf("RemoveJobDeduplicationKey again: %v", d)
	}
	if id := str(t, push(c[0], "race1", "new", map[string]any{}), "id"); id == held {
		t.Fatal("a removed key still deduplicated")
	}
}

// TestPGDebounce: debounceId and debounceTtl are kept with the job and
// shown by GetJob through any broker; as in memory mode and the
// reference, the server does not merge the pushes (the option is the
// client's), which the test checks against a memory-mode server.
func TestPGDebounce(t *testing.T) {
	t.Parallel()
	c := threePG(t)
	mem := dial(t, startBinary(t, "--memory").addr())
	run := func(push, get *tclient) (ids []string, job map[string]any) {
		for i := range 2 {
			a := push.ok(map[string]any{"cmd": "PUSH", "queue": "deb", "name": "d", "data": i, "debounceId": "db", "debounceTtl": 500})
			ids = append(ids, str(t, a, "id"))
		}
		return ids, sub(t, get.ok(map[string]any{"cmd": "GetJob", "id": ids[0]}), "job")
	}
	pgIDs, pgJob := run(c[0], c[1])
	memIDs, memJob := run(mem, mem)
	if pgJob["debounceId"] != "db" || num(t, pgJob["debounceTtl"]) != 500 {
		t.Fatalf("GetJob through another broker: debounceId %v, debounceTtl %v", pgJob["debounceId"], pgJob["debounceTtl"])
	}
	if (pgIDs[0] == pgIDs[1]) != (memIDs[0] == memIDs[1]) || pgJob["debounceId"] != memJob["debounceId"] ||
		num(t, pgJob["debounceTtl"]) != num(t, memJob["debounceTtl"]) {
		t.Fatalf("PostgreSQL mode %v %v, memory mode %v %v", pgIDs, pgJob, memIDs, memJob)
	}
	counts := sub(t, c[2].ok(map[string]any{"cmd": "GetJobCounts", "queue": "deb"}), "counts")
	if num(t, counts["waiting"]) != 2 {
		t.Fatalf("debounced pushes: %v", counts)
	}
}

// TestPGGroupTurnsAcrossBrokers: groups take turns whichever broker
// claims (one job a group a round, as in memory mode), ungrouped jobs go
// first, and a pull's affinity keeps it to one group or to ungrouped jobs.
func TestPGGroupTurnsAcrossBrokers(t *testing.T) {
	t.Parallel()
	c := threePG(t)
	const queue = "gturns"
	for i, g := range []string{"A", "B", "C"} {
		jobs := make([]any, 3)
		for k := range jobs {
			jobs[k] = map[string]any{"name": fmt.Sprint(g, k+1), "data": k, "groupId": g}
		}
		c[i].ok(map[string]any{"cmd": "PUSHB", "queue": queue, "jobs": jobs})
	}
	c[2].ok(map[string]any{"cmd": "PUSH", "queue": queue, "name": "plain", "data": 0})
	var order []string
	for k := range 10 {
		j := sub(t, c[k%3].ok(map[string]any{"cmd": "PULL", "queue": queue}), "job")
		order = append(order, j["name"].(string))
	}
	want := []string{"plain", "A1", "B1", "C1", "A2", "B2", "C2", "A3", "B3", "C3"}
	if !slices.Equal(order, want) {
		t.Fatalf("claims through three brokers in turn: %v, want %v", order, want)
	}
	// A batch pull hands out one job a group a round too.
	for _, g := range []string{"A", "B"} {
		c[0].ok(map[string]any{"cmd": "PUSHB", "queue": queue, "jobs": []any{
			map[string]any{"name": g + "x", "data": 0, "groupId": g}, map[string]any{"name": g + "y", "data": 0, "groupId": g}}})
	}
	c[0].ok(map[string]any{"cmd": "PUSH", "queue": queue, "name": "plain2", "data": 0})
	c[0].ok(map[string]any{"cmd": "PUSH", "queue": queue, "name": "Cz", "data": 0, "groupId": "C"})
	pick := func(cl *tclient, group map[string]any) []string {
		var names []string
		for _, j := range list(t, cl.ok(map[string]any{"cmd": "PULLB", "queue": queue, "count": 10, "group": group}), "jobs") {
			names = append(names, j.(map[string]any)["name"].(string))
		}
		return names
	}
	if got := pick(c[1], map[string]any{"affinity": "B"}); !slices.Equal(got, []string{"Bx", "By"}) {
		t.Fatalf("pull with affinity B: %v", got)
	}
	if got := pick(c[2], map[string]any{"affinity": nil}); !slices.Equal(got, []string{"plain2"}) {
		t.Fatalf("pull with affinity null (ungrouped only): %v", got)
	}
	if got := pick(c[0], nil); !slices.Equal(got, []string{"Ax", "Cz", "Ay"}) {
		t.Fatalf("batch pull: %v", got)
	}
}

// TestPGGroupAndDedupAnswersMatchMemory: the group and dedup commands,
// good and bad, answer in PostgreSQL mode exactly as in memory mode.
func TestPGGroupAndDedupAnswersMatchMemory(t *testing.T) {
	t.Parallel()
	pg := dial(t, startPGBroker(t, pgTestNamespace(t)).addr())
	mem := dial(t, startBinary(t, "--memory").addr())
	const q = "same"
	g := func(cmd string, kv ...any) map[string]any {
		m := map[string]any{"cmd": cmd, "queue": q, "groupId": "G"}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == nil {
				delete(m, kv[i].(string))
			} else {
				m[kv[i].(string)] = kv[i+1]
			}
		}
		return m
	}
	reqs := []map[string]any{
		g("IsGroupPaused"), g("GetGroupConcurrency"), g("GetGroupRateLimit"), g("GetGroupRateLimitTtl"),
		g("GetGroupActiveCount"), g("GetGroupJobsCount"), g("GetGroupsJobsCount"),
		g("RemoveGroupConcurrency"), g("RemoveGroupRateLimit"), g("ResumeGroup"),
		g("PauseGroup"), g("PauseGroup"), g("IsGroupPaused"), g("ResumeGroup"), g("ResumeGroup"),
		g("SetGroupConcurrency", "concurrency", 3), g("GetGroupConcurrency"), g("RemoveGroupConcurrency"), g("RemoveGroupConcurrency"),
		g("SetGroupRateLimit", "max", 5, "duration", 1000), g("GetGroupRateLimit"), g("GetGroupRateLimitTtl", "maxJobs", 1),
		g("RemoveGroupRateLimit"), g("GetGroupRateLimit"),
		g("PUSH", "name", "j", "data", 1, "groupMaxSize", 1), g("GetGroupJobsCount"), g("GetGroupsJobsCount"),
		// Bad input.
		g("PauseGroup", "groupId", nil), g("PauseGroup", "groupId", ""), g("PauseGroup", "groupId", 7),
		g("PauseGroup", "groupId", strings.Repeat("x", 257)), g("PauseGroup", "groupId", "a\x00b"), g("PauseGroup", "queue", nil),
		g("SetGroupConcurrency", "concurrency", 0), g("SetGroupConcurrency", "concurrency", 1.5), g("SetGroupConcurrency"),
		g("SetGroupRateLimit", "max", 5), g("SetGroupRateLimit", "max", -1, "duration", 10), g("RateLimitGroup", "duration", "x"),
		g("GetGroupRateLimitTtl", "maxJobs", "x"), g("PUSH", "name", "j", "data", 1, "groupMaxSize", 0),
		g("PUSH", "name", "j", "data", 1, "groupMaxSize", 1),
		g("PULL", "group", "x"), g("PULL", "group", map[string]any{"concurrency": 0}),
		g("PULL", "group", map[string]any{"limit": map[string]any{"max": 1}}),
		{"cmd": "GetDeduplicationJobId", "queue": q, "deduplicationId": "nope"},
		{"cmd": "GetDeduplicationJobId", "queue": q, "deduplicationId": 5},
		{"cmd": "RemoveDeduplicationKey", "queue": q, "deduplicationId": "nope"},
		{"cmd": "RemoveDeduplicationKey", "deduplicationId": "nope"},
		{"cmd": "RemoveJobDeduplicationKey", "id": "nope"},
		{"cmd": "RemoveJobDeduplicationKey", "id": 5},
		{"cmd": "PUSH", "queue": q, "name": "j", "data": 1, "uniqueKey": "k", "dedup": "x"},
		{"cmd": "PUSH", "queue": q, "name": "j", "data": 1, "uniqueKey": "k", "dedup": map[string]any{"ttl": "x"}},
	}
	for _, m := range reqs {
		a, b := pg.call(m), mem.call(m)
		for _, x := range []map[string]any{a, b} {
			delete(x, "reqId")
			if id, ok := x["id"].(string); ok && len(id) == 36 {
				x["id"] = "(a job id)"
			}
		}
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("%v:\n  postgres %v\n  memory   %v", m, a, b)
		}
	}
}

// extendRound checks an extending dedup key of a 2 s ttl: a push within
// the ttl is the holder's duplicate and extends it; one after the first
// ttl but within the extended one still is; one after the extended ttl
// makes a new job. push sends one push of the key and answers the id,
// when it was sent and when answered. A round is conclusive when the
// times leave no doubt; up to five rounds are run.
func extendRound(t *testing.T, step time.Duration, push func(key string) (id string, sent, got time.Time)) {
	t.Helper()
	// The brokers judge the ttl by the database's clock as they read it,
	// which may be a little behind this process's: the waits past a ttl
	// give it that much more.
	const ttl, skew = 2000 * time.Millisecond, 400 * time.Millisecond
	for round := 0; round < 5; round++ {
		key := fmt.Sprintf("ext-%d", round)
		e1, s1, g1 := push(key)
		clockPast(t, nowMs, g1.Add(step).UnixMilli())
		e2, s2, g2 := push(key)
		if g2.After(s1.Add(ttl)) {
			continue // the second push may have come after the ttl
		}
		if e2 != e1 {
			t.Fatalf("extend within the ttl: %s, want %s", e2, e1)
		}
		clockPast(t, nowMs, g1.Add(ttl+skew).UnixMilli())
		e3, s3, g3 := push(key)
		if !s3.After(g1.Add(ttl)) || g3.After(s2.Add(ttl)) {
			continue // not surely past the first ttl, or not surely within the extended one
		}
		if e3 != e1 {
			t.Fatalf("extend after the first ttl, within the extended one: %s, want %s", e3, e1)
		}
		clockPast(t, nowMs, g3.Add(ttl+skew).UnixMilli())
		e4, s4, _ := push(key)
		if !s4.After(g3.Add(ttl)) {
			continue
		}
		if e4 == e1 {
			t.Fatal("the key was still held after its extended ttl")
		}
		return
	}
	t.Fatal("five rounds of extend pushes, none with timings that prove anything (is the machine that loaded?)")
}
