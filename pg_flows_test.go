package main

// Flows, dependencies and repeat in PostgreSQL mode, with brokers as
// subprocesses sharing one namespace. Where the memory engine is the
// reference for an answer, the same scenario runs against it and the
// observations must match.

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// threePG starts three brokers on a fresh namespace and answers a client
// on each.
func threePG(t *testing.T) []*tclient {
	t.Helper()
	ns := pgTestNamespace(t)
	var cs []*tclient
	for range 3 {
		cs = append(cs, dial(t, startPGBroker(t, ns).addr()))
	}
	return cs
}

// sameAsMemory runs scenario against a memory server (three connections
// to it) and against three PostgreSQL brokers, and requires the same
// observations. The PostgreSQL half is the subtest "postgres", skipped
// without the database (needPG); the memory half's observations are then
// what the caller checks.
func sameAsMemory(t *testing.T, scenario func(t *testing.T, cs []*tclient) map[string]any) map[string]any {
	t.Helper()
	ts := startServer(t, nil)
	mem := scenario(t, []*tclient{dial(t, ts.addr), dial(t, ts.addr), dial(t, ts.addr)})
	var pg map[string]any
	t.Run("postgres", func(t *testing.T) {
		obs := scenario(t, threePG(t))
		if !reflect.DeepEqual(mem, obs) {
			var diff []string
			for k := range mem {
				if !reflect.DeepEqual(mem[k], obs[k]) {
					diff = append(diff, fmt.Sprintf("%s: memory %v, postgres %v", k, mem[k], obs[k]))
				}
			}
			for k := range obs {
				if _, ok := mem[k]; !ok {
					diff = append(diff, fmt.Sprintf("%s: memory none, postgres %v", k, obs[k]))
				}
			}
			sort.Strings(diff)
			t.Fatalf("PostgreSQL mode differs from the memory engine:\n%s", strings.Join(diff, "\n"))
		}
		keys := make([]string, 0, len(obs))
		for k := range obs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			t.Logf("%s: %v", k, obs[k])
		}
		pg = obs
	})
	if t.Failed() {
		t.FailNow()
	}
	if pg == nil {
		return mem
	}
	return pg
}

// workLoop sends req through a new connection to addr until stop closes
// or a request fails, and hands each answer to handle.
func workLoop(t *testing.T, addr string, req map[string]any, stop <-chan struct{}, wg *sync.WaitGroup, handle func(c *tclient, a map[string]any)) {
	c := dial(t, addr)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			a, err := c.do(req, 20*time.Second)
			if err != nil || a["ok"] != true {
				return
			}
			handle(c, a)
		}
	}()
}

// tokensOf maps the ids of the jobs a PULLB answered to their lease tokens.
func tokensOf(t *testing.T, a map[string]any) map[string]any {
	t.Helper()
	token := map[string]any{}
	toks := list(t, a, "tokens")
	for i, j := range list(t, a, "jobs") {
		token[j.(map[string]any)["id"].(string)] = toks[i]
	}
	return token
}

// shot is a request to send through a broker at the same moment as
// others.
type shot struct {
	via *tclient // a client of the broker
	req map[string]any
}

// atOnce sends every shot at the same moment, each on a connection of its
// own to its broker, and stops the test if any is refused.
func atOnce(t *testing.T, shots []shot) {
	t.Helper()
	conns := make([]*tclient, len(shots))
	for i, s := range shots {
		conns[i] = dial(t, s.via.peer())
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan string, len(shots))
	for i, s := range shots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := conns[i].do(s.req, 30*time.Second)
			if err != nil || r["ok"] != true {
				errs <- fmt.Sprint(s.req, ": ", r, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("refused: %s", e)
	}
	if t.Failed() {
		t.FailNow()
	}
}

// releasedOnce requires one step to waiting on a parent's timeline.
func releasedOnce(t *testing.T, j map[string]any) {
	t.Helper()
	released := 0
	for _, e := range j["timeline"].([]any) {
		if e.(map[string]any)["state"] == "waiting" {
			released++
		}
	}
	if released != 1 {
		t.Fatalf("parent %v released %d times: %v", j["id"], released, j["timeline"])
	}
}

func stateOf(t *testing.T, c *tclient, id string) string {
	t.Helper()
	return str(t, c.ok(map[string]any{"cmd": "GetState", "id": id}), "state")
}

// settle reads a parent's children values: in the memory engine that
// waits for its flow goroutine, so that what follows sees its work done.
func settle(t *testing.T, c *tclient, id string) map[string]any {
	t.Helper()
	return sub(t, sub(t, c.ok(map[string]any{"cmd": "GetChildrenValues", "id": id}), "data"), "values")
}

// TestPGFlowManyChildrenThreeBrokers: a parent with 300 children, claimed
// and acknowledged by workers on three brokers. The parent waits until the
// last child completes, then runs exactly once, and its children's values
// are all there.
//
// What the children's state is when the parent runs is asked of the
// server (GetJobCounts through the broker that handed the parent out),
// not read from the workers' own tally: a worker records its ACKB after
// the answer has come back, and the commit that released the parent may
// reach another worker first.
func TestPGFlowManyChildrenThreeBrokers(t *testing.T) {
	t.Parallel()
	cs := threePG(t)
	const n = 300
	kids := make([]string, n)
	for i := range kids {
		kids[i] = fmt.Sprint("k", i)
	}
	cs[0].ok(flowFrame("P", "parents", "kids", kids))
	if st := stateOf(t, cs[1], "P"); st != "waiting-children" {
		t.Fatalf("parent after PUSHF: %s", st)
	}
	// The children's queue is paused until every worker is polling, so
	// that the first workers up do not take them all before the others
	// have started: each broker's workers get some.
	cs[0].ok(map[string]any{"cmd": "Pause", "queue": "kids"})
	var mu sync.Mutex
	acked := map[string]int{}
	perBroker := make([]int, 3)
	parentRuns := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for b := range cs {
		addr := cs[b].nc.RemoteAddr().String()
		for w := 0; w < 2; w++ {
			workLoop(t, addr, map[string]any{"cmd": "PULLB", "queue": "kids", "count": 7, "owner": "w", "timeout": 200}, stop, &wg,
				func(c *tclient, a map[string]any) {
					jobs, _ := a["jobs"].([]any)
					if len(jobs) == 0 {
						return
					}
					ids, res := make([]any, len(jobs)), make([]any, len(jobs))
					for i, j := range jobs {
						ids[i] = j.(map[string]any)["id"]
						res[i] = map[string]any{"from": ids[i]}
					}
					r, err := c.do(map[string]any{"cmd": "ACKB", "ids": ids, "tokens": a["tokens"], "results": res}, 20*time.Second)
					if err != nil || r["ok"] != true {
						t.Errorf("ACKB through broker %d: %v %v", b+1, r, err)
						return
					}
					if d, ok := r["data"].(map[string]any); ok {
						if ig, _ := d["ignoredIndices"].([]any); len(ig) > 0 {
							t.Errorf("ACKB through broker %d ignored %v", b+1, ig)
						}
					}
					mu.Lock()
					for _, id := range ids {
						acked[id.(string)]++
					}
					perBroker[b] += len(ids)
					mu.Unlock()
				})
			workLoop(t, addr, map[string]any{"cmd": "PULL", "queue": "parents", "timeout": 300}, stop, &wg,
				func(c *tclient, a map[string]any) {
					j, ok := a["job"].(map[string]any)
					if !ok {
						return
					}
					mu.Lock()
					parentRuns++
					mu.Unlock()
					// The server's word on the children, as the parent runs.
					r, err := c.do(map[string]any{"cmd": "GetJobCounts", "queue": "kids"}, 20*time.Second)
					if err != nil || r["ok"] != true {
						t.Errorf("GetJobCounts of the children through broker %d: %v %v", b+1, r, err)
					} else if k, _ := r["counts"].(map[string]any); toFloat(k["completed"]) != n {
						t.Errorf("the parent ran with the children at %v, want all %d completed", k, n)
					}
					c.do(map[string]any{"cmd": "ACK", "id": j["id"], "result": "done"}, 20*time.Second)
				})
		}
	}
	cs[1].ok(map[string]any{"cmd": "Resume", "queue": "kids"})
	eventually(t, 60*time.Second, "the parent completed", func() (bool, string) {
		st := stateOf(t, cs[2], "P")
		return st == "completed", st
	})
	// Long enough for a second release to be claimed, were there one.
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	// Every worker has returned: the tallies are complete. What they say
	// is held to what the server says.
	if parentRuns != 1 {
		t.Fatalf("the parent ran %d times", parentRuns)
	}
	for _, k := range kids {
		if acked[k] != 1 {
			t.Fatalf("child %s acknowledged %d times", k, acked[k])
		}
	}
	for b, k := range perBroker {
		if k == 0 {
			t.Fatalf("no child acknowledged through broker %d: %v", b+1, perBroker)
		}
	}
	for q, want := range map[string]float64{"kids": n, "parents": 1} {
		c := countsOf(t, cs[0], q)
		left := 0.0
		for st, v := range c {
			if st != "completed" {
				left += toFloat(v)
			}
		}
		if toFloat(c["completed"]) != want || left != 0 {
			t.Fatalf("%s after the flow: %v, want %v completed and nothing else", q, c, want)
		}
	}
	vals := settle(t, cs[1], "P")
	if len(vals) != n {
		t.Fatalf("GetChildrenValues: %d values, want %d", len(vals), n)
	}
	for _, k := range kids {
		v, ok := vals["kids:"+k].(map[string]any)
		if !ok || v["from"] != k {
			t.Fatalf("value of %s: %v", k, vals["kids:"+k])
		}
	}
	j := sub(t, cs[0].ok(map[string]any{"cmd": "GetJob", "id": "P"}), "job")
	var steps []string
	for _, e := range j["timeline"].([]any) {
		steps = append(steps, e.(map[string]any)["state"].(string))
	}
	if want := []string{"waiting-children", "waiting", "active", "completed"}; !reflect.DeepEqual(steps, want) {
		t.Fatalf("parent timeline %v, want %v", steps, want)
	}
	t.Logf("%d children acknowledged through the three brokers: %v; the parent ran once", n, perBroker)
}

// TestPGFlowSimultaneousAcks: the two children of each of 40 parents are
// acknowledged at the same moment through two different brokers; every
// parent is released exactly once.
func TestPGFlowSimultaneousAcks(t *testing.T) {
	t.Parallel()
	cs := threePG(t)
	const parents = 40
	var jobs []any
	for i := 0; i < parents; i++ {
		p := fmt.Sprint("p", i)
		kids := []any{fmt.Sprint("a", i), fmt.Sprint("b", i)}
		for _, k := range kids {
			jobs = append(jobs, map[string]any{"id": k, "queue": "pair", "input": map[string]any{
				"parentId": p, "data": map[string]any{"__parentId": p, "__parentQueue": "pp"}}})
		}
		jobs = append(jobs, map[string]any{"id": p, "queue": "pp", "input": map[string]any{
			"dependsOn": kids, "childrenIds": kids, "data": map[string]any{}}})
	}
	cs[0].ok(map[string]any{"cmd": "PUSHF", "jobs": jobs})
	token := tokensOf(t, cs[0].ok(map[string]any{"cmd": "PULLB", "queue": "pair", "count": 2 * parents, "owner": "w"}))
	if len(token) != 2*parents {
		t.Fatalf("pulled %d children", len(token))
	}
	var shots []shot
	for i := 0; i < parents; i++ {
		for k, pre := range []string{"a", "b"} {
			id := fmt.Sprint(pre, i)
			// The two children of a parent through two brokers.
			shots = append(shots, shot{cs[(i+k)%3], map[string]any{"cmd": "ACK", "id": id, "token": token[id], "result": id}})
		}
	}
	atOnce(t, shots)
	counts := sub(t, cs[1].ok(map[string]any{"cmd": "GetJobCounts", "queue": "pp"}), "counts")
	if num(t, counts["waiting"]) != parents || num(t, counts["waiting-children"]) != 0 {
		t.Fatalf("parents after their children: %v", counts)
	}
	got := list(t, cs[2].ok(map[string]any{"cmd": "PULLB", "queue": "pp", "count": 2 * parents}), "jobs")
	seen := map[string]bool{}
	for _, j := range got {
		jm := j.(map[string]any)
		id := jm["id"].(string)
		if seen[id] {
			t.Fatalf("parent %s handed out twice", id)
		}
		seen[id] = true
		releasedOnce(t, jm)
	}
	if len(seen) != parents {
		t.Fatalf("%d parents ready, want %d", len(seen), parents)
	}
	for i := 0; i < parents; i++ {
		p := fmt.Sprint("p", i)
		vals := settle(t, cs[i%3], p)
		if len(vals) != 2 || vals["pair:a"+fmt.Sprint(i)] != "a"+fmt.Sprint(i) || vals["pair:b"+fmt.Sprint(i)] != "b"+fmt.Sprint(i) {
			t.Fatalf("values of %s: %v", p, vals)
		}
	}
	t.Logf("%d parents, each released once by two simultaneous ACKs through two brokers", parents)
}

// drainQueue pulls and acknowledges jobs of a queue through the clients in
// turn until want jobs are done, answering their names in order.
func drainQueue(t *testing.T, cs []*tclient, queue string, want int) []string {
	t.Helper()
	var order []string
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; len(order) < want; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("%s: only %v done", queue, order)
		}
		c := cs[i%len(cs)]
		a := c.ok(map[string]any{"cmd": "PULL", "queue": queue, "timeout": 2000})
		j, ok := a["job"].(map[string]any)
		if !ok {
			continue
		}
		order = append(order, j["name"].(string))
		cs[(i+1)%len(cs)].ok(map[string]any{"cmd": "ACK", "id": j["id"], "result": j["name"]})
	}
	return order
}

// TestPGDependsOn: chains and fan-in across brokers, within a batch, on a
// job already done, and the refusals; the same as the memory engine.
func TestPGDependsOn(t *testing.T) {
	t.Parallel()
	sameAsMemory(t, func(t *testing.T, cs []*tclient) map[string]any {
		obs := map[string]any{}
		push := func(c *tclient, m map[string]any) {
			m["cmd"], m["queue"] = "PUSH", "chain"
			m["name"], m["data"] = m["jobId"], map[string]any{}
			c.ok(m)
		}
		push(cs[0], map[string]any{"jobId": "a"})
		push(cs[1], map[string]any{"jobId": "b", "dependsOn": []any{"a"}})
		push(cs[2], map[string]any{"jobId": "c", "dependsOn": []any{"b"}})
		push(cs[0], map[string]any{"jobId": "d", "dependsOn": []any{"a", "c"}, "delay": 0})
		for _, id := range []string{"a", "b", "c", "d"} {
			obs["state "+id] = stateOf(t, cs[1], id)
		}
		obs["counts"] = sub(t, cs[2].ok(map[string]any{"cmd": "GetJobCounts", "queue": "chain"}), "counts")
		obs["ghost"] = cs[0].fail(map[string]any{"cmd": "PUSH", "queue": "chain", "data": 1, "dependsOn": []any{"ghost"}})
		obs["self"] = cs[1].fail(map[string]any{"cmd": "PUSH", "queue": "chain", "data": 1, "jobId": "s", "dependsOn": []any{"s"}})
		obs["batch ghost"] = cs[2].fail(map[string]any{"cmd": "PUSHB", "queue": "chain", "jobs": []any{
			map[string]any{"data": 1}, map[string]any{"data": 2, "dependsOn": []any{"nope"}}}})
		obs["order"] = drainQueue(t, cs, "chain", 4)
		// A dependency already done is met at once.
		push(cs[2], map[string]any{"jobId": "e", "dependsOn": []any{"a", "d"}})
		obs["state e"] = stateOf(t, cs[0], "e")
		// Within one batch, by custom id.
		ids := list(t, cs[1].ok(map[string]any{"cmd": "PUSHB", "queue": "batch", "jobs": []any{
			map[string]any{"name": "y", "data": 1, "customId": "y", "dependsOn": []any{"x"}},
			map[string]any{"name": "x", "data": 2, "customId": "x"}}}), "ids")
		obs["batch ids"] = ids
		obs["state y"] = stateOf(t, cs[0], "y")
		obs["batch order"] = drainQueue(t, cs, "batch", 2)
		obs["y job dependsOn"] = sub(t, cs[2].ok(map[string]any{"cmd": "GetJob", "id": "y"}), "job")["dependsOn"]
		return obs
	})
}

// policyFlow pushes a parent P<tag> with children bad<tag> (carrying
// the policy) and good<tag>, fails bad for good and completes good, each
// through another broker, and answers what the parent shows.
func policyFlow(t *testing.T, cs []*tclient, policy, tag string) map[string]any {
	q := "pol" + tag
	bad, good, par := "bad"+tag, "good"+tag, "P"+tag
	opts := map[string]any{"parentId": par, "maxAttempts": 1, "data": map[string]any{"__parentId": par, "__parentQueue": q}}
	if policy != "none" {
		opts[policy] = true
	}
	kids := []any{bad, good}
	cs[0].ok(map[string]any{"cmd": "PUSHF", "jobs": []any{
		map[string]any{"id": bad, "queue": q, "input": opts},
		map[string]any{"id": good, "queue": q, "input": map[string]any{"parentId": par, "data": map[string]any{"__parentId": par, "__parentQueue": q}}},
		map[string]any{"id": par, "queue": q, "input": map[string]any{"dependsOn": kids, "childrenIds": kids, "data": map[string]any{}}},
	}})
	for i := 0; i < 2; i++ {
		a := cs[1].ok(map[string]any{"cmd": "PULL", "queue": q})
		j := a["job"].(map[string]any)
		if j["id"] == bad {
			cs[2].ok(map[string]any{"cmd": "FAIL", "id": bad, "error": "child broke"})
		} else {
			cs[2].ok(map[string]any{"cmd": "ACK", "id": good, "result": "g"})
		}
	}
	obs := map[string]any{}
	obs["values"] = settle(t, cs[0], par)
	j := sub(t, cs[0].ok(map[string]any{"cmd": "GetJob", "id": par}), "job")
	obs["state"], obs["failedReason"], obs["dependsOn"] = j["state"], j["failedReason"], j["dependsOn"]
	obs["failed"] = cs[1].ok(map[string]any{"cmd": "GetFailedChildrenValues", "id": par})["values"]
	obs["ignored"] = cs[2].ok(map[string]any{"cmd": "GetIgnoredChildrenFailures", "id": par})["values"]
	obs["dlq"] = len(list(t, cs[1].ok(map[string]any{"cmd": "Dlq", "queue": q}), "jobs"))
	return obs
}

// TestPGFlowPolicies: each child failure policy, a failure passed up two
// levels, the same as the memory engine.
func TestPGFlowPolicies(t *testing.T) {
	t.Parallel()
	got := sameAsMemory(t, func(t *testing.T, cs []*tclient) map[string]any {
		obs := map[string]any{}
		for i, pol := range []string{"failParentOnFailure", "continueParentOnFailure", "ignoreDependencyOnFailure", "removeDependencyOnFailure", "none"} {
			obs[pol] = policyFlow(t, cs, pol, fmt.Sprint(i))
		}
		// Two levels: the leaf fails its parent, which fails the root.
		cs[0].ok(map[string]any{"cmd": "PUSHF", "jobs": []any{
			map[string]any{"id": "leaf", "queue": "lv", "input": map[string]any{"parentId": "mid", "maxAttempts": 1, "failParentOnFailure": true,
				"data": map[string]any{"__parentId": "mid", "__parentQueue": "lv"}}},
			map[string]any{"id": "mid", "queue": "lv", "input": map[string]any{"parentId": "root", "failParentOnFailure": true,
				"dependsOn": []any{"leaf"}, "childrenIds": []any{"leaf"}, "data": map[string]any{"__parentId": "root", "__parentQueue": "lv"}}},
			map[string]any{"id": "root", "queue": "lv", "input": map[string]any{"dependsOn": []any{"mid"}, "childrenIds": []any{"mid"}, "data": map[string]any{}}},
		}})
		a := cs[1].ok(map[string]any{"cmd": "PULL", "queue": "lv"})
		cs[2].ok(map[string]any{"cmd": "FAIL", "id": a["job"].(map[string]any)["id"], "error": "deep"})
		settle(t, cs[0], "root")
		settle(t, cs[0], "root") // the memory engine applies the second level after the first
		for _, id := range []string{"leaf", "mid", "root"} {
			j := sub(t, cs[0].ok(map[string]any{"cmd": "GetJob", "id": id}), "job")
			obs["two levels "+id] = fmt.Sprint(j["state"], " / ", j["failedReason"])
		}
		return obs
	})
	t.Logf("outcomes: %v", got)
	if got["failParentOnFailure"].(map[string]any)["state"] != "failed" || got["continueParentOnFailure"].(map[string]any)["state"] != "waiting" ||
		got["none"].(map[string]any)["state"] != "waiting-children" || !strings.HasPrefix(got["two levels root"].(string), "failed") {
		t.Fatalf("outcomes: %v", got)
	}
}

// TestPGFlowPolicyOnStall: a child whose lease runs out, with no attempts
// left, fails its parent through whichever broker reclaims it.
func TestPGFlowPolicyOnStall(t *testing.T) {
	t.Parallel()
	cs := threePG(t)
	cs[0].ok(map[string]any{"cmd": "PUSHF", "jobs": []any{
		map[string]any{"id": "s1", "queue": "st", "input": map[string]any{"parentId": "SP", "maxAttempts": 1, "failParentOnFailure": true,
			"data": map[string]any{"__parentId": "SP", "__parentQueue": "st"}}},
		map[string]any{"id": "SP", "queue": "st", "input": map[string]any{"dependsOn": []any{"s1"}, "childrenIds": []any{"s1"}, "data": map[string]any{}}},
	}})
	cs[1].ok(map[string]any{"cmd": "PULL", "queue": "st", "owner": "gone", "lockTtl": 300})
	eventually(t, 15*time.Second, "the parent failed", func() (bool, string) {
		j := sub(t, cs[2].ok(map[string]any{"cmd": "GetJob", "id": "SP"}), "job")
		return j["state"] == "failed", fmt.Sprint(j["state"], j["failedReason"])
	})
	entries := list(t, cs[0].ok(map[string]any{"cmd": "Dlq", "queue": "st"}), "entries")
	errs := map[string]any{}
	for _, e := range entries {
		em := e.(map[string]any)
		errs[em["job"].(map[string]any)["id"].(string)] = em["error"]
	}
	if r, _ := errs["SP"].(string); !strings.HasPrefix(r, "Child job s1 failed: Lock expired") || len(errs) != 2 {
		t.Fatalf("DLQ errors %v", errs)
	}
	t.Logf("DLQ: %v", errs)
}

// TestPGRepeatAcrossBrokers: a job repeating every 50 ms with a limit of
// six runs six times, with workers on three brokers.
func TestPGRepeatAcrossBrokers(t *testing.T) {
	t.Parallel()
	cs := threePG(t)
	cs[0].ok(map[string]any{"cmd": "PUSH", "queue": "rep", "name": "tick", "data": map[string]any{"x": 1},
		"repeat": map[string]any{"every": 50, "limit": 6}})
	var mu sync.Mutex
	counts := map[float64]int{}
	perBroker := make([]int, 3)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for b := range cs {
		workLoop(t, cs[b].nc.RemoteAddr().String(), map[string]any{"cmd": "PULL", "queue": "rep", "owner": "w", "timeout": 200}, stop, &wg,
			func(c *tclient, a map[string]any) {
				j, ok := a["job"].(map[string]any)
				if !ok {
					return
				}
				c.do(map[string]any{"cmd": "ACK", "id": j["id"], "token": a["token"]}, 20*time.Second)
				rep, _ := j["repeat"].(map[string]any)
				mu.Lock()
				counts[toFloat(rep["count"])]++
				perBroker[b]++
				mu.Unlock()
			})
	}
	eventually(t, 30*time.Second, "six runs", func() (bool, string) {
		c := sub(t, cs[1].ok(map[string]any{"cmd": "GetJobCounts", "queue": "rep"}), "counts")
		return num(t, c["completed"]) >= 6, fmt.Sprint(c)
	})
	time.Sleep(500 * time.Millisecond) // ten periods: a seventh run would be there
	close(stop)
	wg.Wait()
	c := sub(t, cs[2].ok(map[string]any{"cmd": "GetJobCounts", "queue": "rep"}), "counts")
	if num(t, c["completed"]) != 6 || num(t, c["delayed"])+num(t, c["waiting"])+num(t, c["active"]) != 0 {
		t.Fatalf("counts after the repeat ended: %v", c)
	}
	// The first run has no count yet; its successors count from 1.
	for _, k := range []float64{-1, 1, 2, 3, 4, 5} {
		if counts[k] != 1 {
			t.Fatalf("runs by repeat count: %v", counts)
		}
	}
	t.Logf("six runs through the brokers: %v", perBroker)
	// A repeatable job with a unique key hands the key to its next run.
	cs[1].ok(map[string]any{"cmd": "PUSH", "queue": "repu", "name": "u", "data": 1, "uniqueKey": "one",
		"repeat": map[string]any{"every": 30, "limit": 3}})
	drainQueue(t, cs, "repu", 3)
	if c := sub(t, cs[0].ok(map[string]any{"cmd": "GetJobCounts", "queue": "repu"}), "counts"); num(t, c["completed"]) != 3 {
		t.Fatalf("repeat with a unique key: %v", c)
	}
	// Refusals, as in the memory engine.
	if msg := cs[0].fail(map[string]any{"cmd": "PUSH", "queue": "rep", "data": 1, "jobId": "r", "repeat": map[string]any{"every": 10}}); msg != "repeat jobs cannot use JobOptions.jobId; use repeat.jobId instead" {
		t.Fatalf("repeat with a jobId: %q", msg)
	}
	if msg := cs[0].fail(map[string]any{"cmd": "PUSH", "queue": "rep", "data": 1, "repeat": map[string]any{"every": 0}}); msg != "repeat.every must be a positive finite number" {
		t.Fatalf("repeat every 0: %q", msg)
	}
}

// TestPGFlowCommands: linking children by PUSH and UpdateParent, removing
// a dependency, removing unprocessed children, parking an active job to
// wait for children; the same as the memory engine.
func TestPGFlowCommands(t *testing.T) {
	t.Parallel()
	sameAsMemory(t, func(t *testing.T, cs []*tclient) map[string]any {
		obs := map[string]any{}
		job := func(id string) map[string]any {
			return sub(t, cs[2].ok(map[string]any{"cmd": "GetJob", "id": id}), "job")
		}
		cs[0].ok(map[string]any{"cmd": "PUSH", "queue": "fc", "jobId": "P", "data": map[string]any{}})
		cs[1].ok(map[string]any{"cmd": "PUSH", "queue": "fc", "jobId": "c1", "parentId": "P", "data": map[string]any{"__parentId": "P", "__parentQueue": "fc"}})
		obs["P after c1"] = fmt.Sprint(job("P")["state"], job("P")["childrenIds"], job("P")["dependsOn"])
		obs["bad queue"] = cs[2].fail(map[string]any{"cmd": "PUSH", "queue": "fc", "parentId": "P", "data": map[string]any{"__parentId": "P", "__parentQueue": "other"}})
		obs["no parent"] = cs[2].fail(map[string]any{"cmd": "PUSH", "queue": "fc", "parentId": "X", "data": map[string]any{"__parentId": "X", "__parentQueue": "fc"}})
		cs[2].ok(map[string]any{"cmd": "PUSH", "queue": "fc2", "jobId": "c2", "data": map[string]any{"v": 2}})
		cs[0].ok(map[string]any{"cmd": "UpdateParent", "childId": "c2", "parentId": "P"})
		obs["c2 data"] = job("c2")["data"]
		obs["c2 parent"] = job("c2")["parentId"]
		obs["P after c2"] = fmt.Sprint(job("P")["state"], job("P")["childrenIds"], job("P")["data"])
		obs["own parent"] = cs[1].fail(map[string]any{"cmd": "UpdateParent", "childId": "c2", "parentId": "c2"})
		obs["no child"] = cs[1].fail(map[string]any{"cmd": "UpdateParent", "childId": "zz", "parentId": "P"})
		cs[2].ok(map[string]any{"cmd": "PUSH", "queue": "fc2", "jobId": "c3", "data": map[string]any{}})
		obs["missing parent"] = cs[1].fail(map[string]any{"cmd": "UpdateParent", "childId": "c3", "parentId": "zz"})
		// A parent that left the queue (here: running) takes no child, and
		// the child is left as it was.
		cs[0].ok(map[string]any{"cmd": "PUSH", "queue": "fr", "jobId": "Rrun", "data": map[string]any{}})
		cs[1].ok(map[string]any{"cmd": "PULL", "queue": "fr", "owner": "w"})
		obs["running parent"] = cs[1].fail(map[string]any{"cmd": "UpdateParent", "childId": "c3", "parentId": "Rrun"})
		obs["c3 after the refusal"] = fmt.Sprint(job("c3")["parentId"], job("c3")["data"])
		obs["rcd c2"] = cs[1].ok(map[string]any{"cmd": "RemoveChildDependency", "id": "c2"})["removed"]
		obs["P after rcd c2"] = fmt.Sprint(job("P")["state"], job("P")["childrenIds"])
		obs["c2 data after"] = job("c2")["data"]
		obs["rcd c2 again"] = cs[2].fail(map[string]any{"cmd": "RemoveChildDependency", "id": "c2"})
		obs["rcd missing"] = cs[2].fail(map[string]any{"cmd": "RemoveChildDependency", "id": "nope"})
		obs["rcd c1"] = cs[0].ok(map[string]any{"cmd": "RemoveChildDependency", "id": "c1"})["removed"]
		settle(t, cs[0], "P")
		obs["P after rcd c1"] = fmt.Sprint(job("P")["state"], job("P")["childrenIds"], job("P")["data"])

		// A running job linked as a child: its lease holds, and its result
		// goes to the parent.
		cs[0].ok(map[string]any{"cmd": "PUSH", "queue": "fq", "jobId": "Q", "data": map[string]any{}})
		cs[1].ok(map[string]any{"cmd": "PUSH", "queue": "fa", "jobId": "ca", "data": map[string]any{}})
		run := cs[2].ok(map[string]any{"cmd": "PULL", "queue": "fa", "owner": "w", "lockTtl": 60000})
		cs[0].ok(map[string]any{"cmd": "UpdateParent", "childId": "ca", "parentId": "Q"})
		obs["Q linked to a running child"] = stateOf(t, cs[1], "Q")
		obs["ca heartbeat"] = cs[1].call(map[string]any{"cmd": "JobHeartbeat", "id": "ca", "token": run["token"]})["ok"]
		cs[1].ok(map[string]any{"cmd": "ACK", "id": "ca", "token": run["token"], "result": "ran"})
		obs["Q values"] = settle(t, cs[2], "Q")
		obs["Q after ca"] = stateOf(t, cs[2], "Q")

		// Parking an active job, then a child linked to it.
		cs[0].ok(map[string]any{"cmd": "PUSH", "queue": "mw", "jobId": "M", "data": map[string]any{}})
		a := cs[1].ok(map[string]any{"cmd": "PULL", "queue": "mw", "owner": "w"})
		obs["mtwc bad token"] = cs[2].fail(map[string]any{"cmd": "MoveToWaitingChildren", "id": "M", "token": "nope"})
		obs["mtwc"] = cs[2].ok(map[string]any{"cmd": "MoveToWaitingChildren", "id": "M", "token": a["token"]})["data"]
		obs["mtwc again"] = cs[0].fail(map[string]any{"cmd": "MoveToWaitingChildren", "id": "M"})
		obs["M state"] = stateOf(t, cs[0], "M")
		cs[1].ok(map[string]any{"cmd": "PUSH", "queue": "mk", "jobId": "k", "parentId": "M", "data": map[string]any{"__parentId": "M", "__parentQueue": "mw"}})
		k := cs[2].ok(map[string]any{"cmd": "PULL", "queue": "mk"})
		cs[0].ok(map[string]any{"cmd": "ACK", "id": k["job"].(map[string]any)["id"], "result": 42})
		obs["M values"] = settle(t, cs[1], "M")
		obs["M after k"] = stateOf(t, cs[1], "M")

		// Removing the children not yet started.
		fa := cs[0].ok(flowFrame("R", "ru", "rk", []string{"r1", "r2", "r3"}))
		for _, j := range list(t, sub(t, fa, "data"), "jobs") {
			jm := j.(map[string]any)
			var steps []any
			for _, e := range jm["timeline"].([]any) {
				steps = append(steps, e.(map[string]any)["state"])
			}
			obs["PUSHF answer "+jm["id"].(string)] = fmt.Sprint(jm["queue"], jm["parentId"], jm["dependsOn"], jm["childrenIds"], jm["data"], steps)
		}
		obs["PUSHF again"] = cs[1].fail(flowFrame("R", "ru", "rk", []string{"r1", "r2", "r3"}))
		cs[1].ok(map[string]any{"cmd": "PULL", "queue": "rk"}) // r1 is active
		cs[2].ok(map[string]any{"cmd": "RemoveUnprocessedChildren", "id": "R"})
		for _, id := range []string{"r1", "r2", "r3", "R"} {
			obs["after rupc "+id] = stateOf(t, cs[0], id)
		}
		obs["values of nothing"] = settle(t, cs[0], "nothing")
		return obs
	})
}

// TestPGDependentWakesLongPoll: a long poll on a dependent's queue through
// one broker is answered with the dependent when its dependency is
// acknowledged through another.
func TestPGDependentWakesLongPoll(t *testing.T) {
	t.Parallel()
	cs := threePG(t)
	cs[0].ok(map[string]any{"cmd": "PUSH", "queue": "first", "jobId": "a", "data": 1})
	cs[0].ok(map[string]any{"cmd": "PUSH", "queue": "then", "jobId": "b", "data": 2, "dependsOn": []any{"a"}})
	if a := cs[1].ok(map[string]any{"cmd": "PULL", "queue": "then"}); a["job"] != nil {
		t.Fatalf("a job waiting for its dependency was handed out: %v", a)
	}
	id, ch := cs[1].send(map[string]any{"cmd": "PULL", "queue": "then", "timeout": 20000})
	a := cs[2].ok(map[string]any{"cmd": "PULL", "queue": "first", "owner": "w"})
	start := time.Now()
	cs[2].ok(map[string]any{"cmd": "ACK", "id": "a", "token": a["token"]})
	r := cs[1].await(id, ch, 25*time.Second)
	if j, ok := r["job"].(map[string]any); !ok || j["id"] != "b" {
		t.Fatalf("long poll after the dependency completed: %v", r)
	}
	t.Logf("the ACK through broker 3 woke a poll on broker 2 in %v", time.Since(start))
}

// TestPGFlowAckAndPolicyAtOnce: for each of 30 parents, one child is
// acknowledged while the other fails with a policy that releases the
// parent, at the same moment, through two brokers. Neither waits for the
// other forever (no deadlock), and each parent is released once.
func TestPGFlowAckAndPolicyAtOnce(t *testing.T) {
	t.Parallel()
	cs := threePG(t)
	const parents = 30
	var jobs []any
	for i := 0; i < parents; i++ {
		p := fmt.Sprint("p", i)
		pol := "continueParentOnFailure"
		if i%2 == 1 {
			pol = "ignoreDependencyOnFailure"
		}
		kids := []any{fmt.Sprint("a", i), fmt.Sprint("b", i)}
		link := map[string]any{"__parentId": p, "__parentQueue": "mixp"}
		jobs = append(jobs,
			map[string]any{"id": kids[0], "queue": "mix", "input": map[string]any{"parentId": p, "data": link}},
			map[string]any{"id": kids[1], "queue": "mix", "input": map[string]any{"parentId": p, "data": link, "maxAttempts": 1, pol: true}},
			map[string]any{"id": p, "queue": "mixp", "input": map[string]any{"dependsOn": kids, "childrenIds": kids, "data": map[string]any{}}})
	}
	cs[0].ok(map[string]any{"cmd": "PUSHF", "jobs": jobs})
	token := tokensOf(t, cs[0].ok(map[string]any{"cmd": "PULLB", "queue": "mix", "count": 2 * parents, "owner": "w"}))
	if len(token) != 2*parents {
		t.Fatalf("pulled %d children", len(token))
	}
	var shots []shot
	for i := 0; i < parents; i++ {
		for k, req := range []map[string]any{
			{"cmd": "ACK", "id": fmt.Sprint("a", i), "result": i},
			{"cmd": "FAIL", "id": fmt.Sprint("b", i), "error": "broke"},
		} {
			req["token"] = token[req["id"].(string)]
			shots = append(shots, shot{cs[(i+k)%3], req})
		}
	}
	atOnce(t, shots)
	counts := sub(t, cs[1].ok(map[string]any{"cmd": "GetJobCounts", "queue": "mixp"}), "counts")
	if num(t, counts["waiting"]) != parents {
		t.Fatalf("parents after their children: %v", counts)
	}
	for i := 0; i < parents; i++ {
		releasedOnce(t, sub(t, cs[i%3].ok(map[string]any{"cmd": "GetJob", "id": fmt.Sprint("p", i)}), "job"))
	}
}

// TestPGPushAndAckAtOnce: pushes that depend on a job and on its
// dependent race the job's ACK through another broker (the two lock the
// same rows in opposite orders; PostgreSQL aborts one to break the
// deadlock, and it runs again). Nothing is refused, and every pushed job
// ends up waiting for exactly what is not done.
func TestPGPushAndAckAtOnce(t *testing.T) {
	t.Parallel()
	cs := threePG(t)
	const n = 40
	for i := 0; i < n; i++ {
		cs[0].ok(map[string]any{"cmd": "PUSH", "queue": "base", "jobId": fmt.Sprint("zb", i), "data": i})
		cs[0].ok(map[string]any{"cmd": "PUSH", "queue": "mid", "jobId": fmt.Sprint("c", i), "data": i, "dependsOn": []any{fmt.Sprint("zb", i)}})
	}
	token := tokensOf(t, cs[1].ok(map[string]any{"cmd": "PULLB", "queue": "base", "count": n, "owner": "w"}))
	var shots []shot
	for i := 0; i < n; i++ {
		b := fmt.Sprint("zb", i)
		shots = append(shots,
			shot{cs[1], map[string]any{"cmd": "ACK", "id": b, "token": token[b]}},
			shot{cs[2], map[string]any{"cmd": "PUSH", "queue": "top", "jobId": fmt.Sprint("d", i), "data": i, "dependsOn": []any{fmt.Sprint("c", i), b}}})
	}
	atOnce(t, shots)
	for i := 0; i < n; i++ {
		if st := stateOf(t, cs[0], fmt.Sprint("c", i)); st != "waiting" {
			t.Fatalf("c%d after its dependency completed: %s", i, st)
		}
		if st := stateOf(t, cs[0], fmt.Sprint("d", i)); st != "waiting-children" {
			t.Fatalf("d%d, whose dependency c%d is not done: %s", i, i, st)
		}
	}
	drainQueue(t, cs, "mid", n)
	c := sub(t, cs[2].ok(map[string]any{"cmd": "GetJobCounts", "queue": "top"}), "counts")
	if num(t, c["waiting"]) != n || num(t, c["waiting-children"]) != 0 {
		t.Fatalf("pushed jobs after all their dependencies completed: %v", c)
	}
}

// TestPGDedupReplaceKeepsDependedOn: a replacing push does not remove a
// job that live jobs depend on: it is refused, and both jobs stay.
func TestPGDedupReplaceKeepsDependedOn(t *testing.T) {
	t.Parallel()
	sameAsMemory(t, func(t *testing.T, cs []*tclient) map[string]any {
		obs := map[string]any{}
		dedup := map[string]any{"ttl": 60000, "replace": true}
		cs[0].ok(map[string]any{"cmd": "PUSH", "queue": "dr", "data": 1, "jobId": "held", "uniqueKey": "k",
			"dedup": map[string]any{"ttl": 60000}})
		cs[1].ok(map[string]any{"cmd": "PUSH", "queue": "dr", "data": 2, "jobId": "after", "dependsOn": []any{"held"}})
		obs["refused"] = cs[2].fail(map[string]any{"cmd": "PUSH", "queue": "dr", "data": 3, "jobId": "new",
			"uniqueKey": "k", "dedup": dedup})
		obs["held"] = stateOf(t, cs[0], "held")
		obs["after"] = stateOf(t, cs[0], "after")
		obs["new"] = cs[1].fail(map[string]any{"cmd": "GetJob", "id": "new"})
		return obs
	})
}
