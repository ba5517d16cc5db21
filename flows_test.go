package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// flowFrame builds a PUSHF request: a parent with n children in queue q
// (children in queue cq), as the official FlowProducer writes it.
func flowFrame(parent string, q string, cq string, kids []string) map[string]any {
	var jobs []any
	for _, k := range kids {
		jobs = append(jobs, map[string]any{"id": k, "queue": cq, "input": map[string]any{
			"name": "child", "parentId": parent,
			"data": map[string]any{"k": k, "__parentId": parent, "__parentQueue": q},
		}})
	}
	ids := make([]any, len(kids))
	for i, k := range kids {
		ids[i] = k
	}
	jobs = append(jobs, map[string]any{"id": parent, "queue": q, "input": map[string]any{
		"name": "parent", "dependsOn": ids, "childrenIds": ids,
		"data": map[string]any{"p": 1, "__childrenIds": ids},
	}})
	return map[string]any{"cmd": "PUSHF", "jobs": jobs}
}

func TestFlowValidation(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	cases := map[string]func(m map[string]any){
		"flow dependency not found: ghost": func(m map[string]any) {
			p := m["jobs"].([]any)[2].(map[string]any)["input"].(map[string]any)
			p["dependsOn"] = []any{"k1", "k2", "ghost"}
		},
		"duplicate flow job id: k1": func(m map[string]any) {
			m["jobs"].([]any)[1].(map[string]any)["id"] = "k1"
		},
		"flow parent k1 does not own child k2": func(m map[string]any) {
			k := m["jobs"].([]any)[1].(map[string]any)["input"].(map[string]any)
			k["parentId"] = "k1"
			k["data"].(map[string]any)["__parentId"] = "k1"
		},
		"flow job id cannot contain a colon": func(m map[string]any) {
			m["jobs"].([]any)[0].(map[string]any)["id"] = "a:b"
		},
		"deduplication is not supported inside an atomic flow": func(m map[string]any) {
			m["jobs"].([]any)[0].(map[string]any)["input"].(map[string]any)["uniqueKey"] = "u"
		},
	}
	for want, mutate := range cases {
		m := flowFrame("P", "fq", "fq", []string{"k1", "k2"})
		mutate(m)
		if got := c.fail(m); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	// A cycle: k1 depends on k2 and k2 on k1.
	cyc := map[string]any{"cmd": "PUSHF", "jobs": []any{
		map[string]any{"id": "c1", "queue": "fq", "input": map[string]any{"data": map[string]any{}, "dependsOn": []any{"c2"}}},
		map[string]any{"id": "c2", "queue": "fq", "input": map[string]any{"data": map[string]any{}, "dependsOn": []any{"c1"}}},
	}}
	if got := c.fail(cyc); got != "flow contains a dependency cycle" {
		t.Errorf("cycle: %q", got)
	}
	// Nothing of a refused flow exists; a good one is admitted whole.
	if st := str(t, c.ok(map[string]any{"cmd": "GetState", "id": "k1"}), "state"); st != "unknown" {
		t.Fatalf("refused flow left k1 %s", st)
	}
	a := c.ok(flowFrame("P", "fq", "fq2", []string{"k1", "k2"}))
	jobs := list(t, sub(t, a, "data"), "jobs")
	if len(jobs) != 3 || jobs[2].(map[string]any)["id"] != "P" {
		t.Fatalf("answer jobs %v", jobs)
	}
	if st := str(t, c.ok(map[string]any{"cmd": "GetState", "id": "P"}), "state"); st != "waiting-children" {
		t.Fatalf("parent %s", st)
	}
	if got := c.fail(flowFrame("P", "fq", "fq2", []string{"k3"})); got != "Flow job k3 already exists" && got != "Flow job P already exists" {
		t.Fatalf("reused ids: %q", got)
	}
}

// Flows and groups survive a kill -9 of the binary mid-flow.
func TestCrashFlowsAndGroups(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "flow.db")
	srv := startBinary(t, "--data-path", path)
	c := dial(t, srv.addr())
	c.ok(flowFrame("root", "fa", "fb", []string{"c1", "c2"}))
	// Complete c1 with a result; c2 stays.
	a := c.ok(map[string]any{"cmd": "PULL", "queue": "fb", "owner": "w"})
	first := a["job"].(map[string]any)["id"].(string)
	c.ok(map[string]any{"cmd": "ACK", "id": first, "token": a["token"], "result": "r-" + first})
	// Groups: a paused group and a concurrency override, and queued jobs.
	for _, g := range []string{"A", "B"} {
		for i := 1; i <= 2; i++ {
			c.ok(map[string]any{"cmd": "PUSH", "queue": "gq", "name": fmt.Sprint(g, i), "data": 1, "groupId": g})
		}
	}
	c.ok(map[string]any{"cmd": "PauseGroup", "queue": "gq", "groupId": "B"})
	c.ok(map[string]any{"cmd": "SetGroupConcurrency", "queue": "gq", "groupId": "A", "concurrency": 1})
	// The flow goroutine has recorded the value (GetChildrenValues waits
	// for it), and a durable push is answered once a write that takes
	// every change recorded before it is committed.
	if v := sub(t, sub(t, c.ok(map[string]any{"cmd": "GetChildrenValues", "id": "root"}), "data"), "values"); v["fb:"+first] != "r-"+first {
		t.Fatalf("children values before the kill: %v", v)
	}
	c.ok(map[string]any{"cmd": "PUSH", "queue": "sync", "data": 1, "durable": true})
	srv.kill9(t)

	srv2 := startBinary(t, "--data-path", path)
	c2 := dial(t, srv2.addr())
	if st := str(t, c2.ok(map[string]any{"cmd": "GetState", "id": "root"}), "state"); st != "waiting-children" {
		t.Fatalf("root after restart: %s", st)
	}
	second := "c1"
	if first == "c1" {
		second = "c2"
	}
	a = c2.ok(map[string]any{"cmd": "PULL", "queue": "fb", "owner": "w"})
	if got := a["job"].(map[string]any)["id"]; got != second {
		t.Fatalf("after restart the queue gave %v, want %s", got, second)
	}
	c2.ok(map[string]any{"cmd": "ACK", "id": second, "token": a["token"], "result": "r-" + second})
	eventually(t, 5*time.Second, "root released", func() (bool, string) {
		st := str(t, c2.ok(map[string]any{"cmd": "GetState", "id": "root"}), "state")
		return st == "waiting", st
	})
	vals := sub(t, sub(t, c2.ok(map[string]any{"cmd": "GetChildrenValues", "id": "root"}), "data"), "values")
	if vals["fb:c1"] != "r-c1" || vals["fb:c2"] != "r-c2" {
		t.Fatalf("children values after restart: %v", vals)
	}
	if p := sub(t, c2.ok(map[string]any{"cmd": "IsGroupPaused", "queue": "gq", "groupId": "B"}), "data"); p["paused"] != true {
		t.Fatal("group pause lost")
	}
	if cc := sub(t, c2.ok(map[string]any{"cmd": "GetGroupConcurrency", "queue": "gq", "groupId": "A"}), "data"); num(t, cc["concurrency"]) != 1 {
		t.Fatal("group concurrency lost")
	}
	var names []string
	for i := 0; i < 4; i++ {
		a := c2.ok(map[string]any{"cmd": "PULL", "queue": "gq"})
		if a["job"] == nil {
			break
		}
		names = append(names, a["job"].(map[string]any)["name"].(string))
	}
	if strings.Join(names, ",") != "A1,A2" {
		t.Fatalf("after restart, with B paused, pulls gave %v", names)
	}
}

// BenchmarkPushFlow100 admits a 100-node tree: a root, 9 parents, 90 leaves.
func BenchmarkPushFlow100(b *testing.B) {
	br := NewMemEngine(0, nil)
	defer br.Close()
	frames := make([][]byte, b.N)
	for i := range frames {
		pre := fmt.Sprintf("t%d-", i)
		var jobs []any
		var mids []any
		for m := 0; m < 9; m++ {
			mid := fmt.Sprintf("%sm%d", pre, m)
			var leaves []any
			for l := 0; l < 10; l++ {
				leaf := fmt.Sprintf("%s-l%d", mid, l)
				leaves = append(leaves, leaf)
				jobs = append(jobs, map[string]any{"id": leaf, "queue": "leaves", "input": map[string]any{
					"name": "leaf", "parentId": mid, "data": map[string]any{"__parentId": mid, "__parentQueue": "mids"}}})
			}
			mids = append(mids, mid)
			jobs = append(jobs, map[string]any{"id": mid, "queue": "mids", "input": map[string]any{
				"name": "mid", "parentId": pre + "root", "dependsOn": leaves, "childrenIds": leaves,
				"data": map[string]any{"__parentId": pre + "root", "__parentQueue": "roots", "__childrenIds": leaves}}})
		}
		jobs = append(jobs, map[string]any{"id": pre + "root", "queue": "roots", "input": map[string]any{
			"name": "root", "dependsOn": mids, "childrenIds": mids, "data": map[string]any{"__childrenIds": mids}}})
		var e Enc
		e.Any(map[string]any{"jobs": jobs})
		frames[i] = e.B
	}
	// Timed: reading and validating the request, and admitting the tree.
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m, _ := ParseMap(frames[i], nil)
		fj, err := flowJobs(m, 1)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := br.PushFlow(context.Background(), fj); err != nil {
			b.Fatal(err)
		}
	}
}

// TestFlowSettleWaitsForApplying: flowSettle (which GetChildrenValues
// runs before it reads) returns only once the flow goroutine has applied
// what it took, not as soon as its queue is empty: a child's value read
// right after its ACK was sometimes missing (TestPGFlowCommands, memory
// half, on a loaded machine).
func TestFlowSettleWaitsForApplying(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(4, nil)
	defer b.Close()
	p := mustJob(t, "pq", map[string]any{"name": "parent", "data": 1})
	b.pushJobs("pq", []*Job{p}, nil)
	b.withJob(p.ID(), func(j *Job, _ *Shard) { j.warm().Children = []string{"c"} })
	// The parent's shard held: the flow goroutine takes the child's value
	// and waits for the lock, mid-apply.
	s := b.shardOf("pq")
	s.mu.Lock()
	held := true
	defer func() {
		if held {
			s.mu.Unlock()
		}
	}()
	b.flowPost(flowItem{kind: flowChildValue, parentID: p.ID(), childID: "c", key: "cq:c", val: Raw(mustEnc(t, "v"))})
	eventually(t, 10*time.Second, "the flow goroutine took the item", func() (bool, string) {
		var n int
		locked(&b.fmu, func() { n = len(b.fq) })
		return n == 0, fmt.Sprint(n, " queued")
	})
	settled := make(chan struct{})
	go func() { b.flowSettle(); close(settled) }()
	select {
	case <-settled:
		t.Fatal("flowSettle returned while the flow goroutine was still applying a child's value")
	case <-time.After(300 * time.Millisecond):
	}
	s.mu.Unlock()
	held = false
	select {
	case <-settled:
	case <-time.After(10 * time.Second):
		t.Fatal("flowSettle did not return within 10 s of the apply going on")
	}
	var vals []childKV
	b.withJob(p.ID(), func(j *Job, _ *Shard) { vals = j.cold().childValues })
	if len(vals) != 1 || vals[0].key != "cq:c" {
		t.Fatalf("the parent's children values after flowSettle: %v", vals)
	}
}

// TestLinkChildRefusesParentGone: the memory engine's link step refuses a
// parent that left the queue after UpdateParent looked at it (pulled in
// between), rather than answer ok and link nothing; one that declared the
// child already is linked.
func TestLinkChildRefusesParentGone(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	parent := mustJob(t, "lc", map[string]any{"jobId": "P", "data": map[string]any{}})
	child := mustJob(t, "lc", map[string]any{"jobId": "C", "data": map[string]any{}})
	b.pushJobs("lc", []*Job{parent, child}, nil)
	if got, _ := claimN(b, "lc", 1); len(got) != 1 || got[0].ID() != "P" {
		t.Fatalf("claimed %v, want the parent", got)
	}
	if b.linkChild("P", withID(&Job{}, "C")) {
		t.Fatal("a running parent took a child")
	}
	if err := b.UpdateParent(context.Background(), "C", "P"); err == nil || err.Error() != "Parent job P is not linkable" {
		t.Fatalf("UpdateParent to a running parent: %v", err)
	}
	var pid string
	b.withJob("C", func(c *Job, _ *Shard) { pid = c.cold().ParentID })
	if pid != "" {
		t.Fatalf("the child was given parent %q", pid)
	}
}
