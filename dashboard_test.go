package main

import (
	"reflect"
	"testing"
)

func TestDashboardOverviewShape(t *testing.T) {
	ls := newLocalServer(t)
	ls.ok(M{"cmd": "RegisterWorker", "name": "w1", "queues": []any{"o"}, "workerId": "wk-1"})
	for i := 0; i < 3; i++ {
		ls.ok(M{"cmd": "PUSH", "queue": "o", "data": i})
	}
	ls.ok(M{"cmd": "PUSH", "queue": "o", "data": "later", "delay": 5000})
	// Two jobs active under locks (pulled with an owner).
	ls.ok(M{"cmd": "PULL", "queue": "o", "owner": "w1"})
	ls.ok(M{"cmd": "PULL", "queue": "o", "owner": "w1"})
	ls.now += 1500

	body := ls.raw(M{"cmd": "DashboardOverview"})
	if got, want := keys(t, body, "data"), []string{"stats", "throughput", "latency", "memory", "collections", "workers",
		"crons", "storage", "timestamp"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("data keys %v", got)
	}
	for path, want := range map[string][]string{
		"stats":       {"waiting", "active", "delayed", "completed", "dlq", "totalPushed", "totalPulled", "totalCompleted", "totalFailed", "uptime"},
		"throughput":  {"pushPerSec", "pullPerSec", "completePerSec", "failPerSec"},
		"latency":     {"averages", "percentiles"},
		"memory":      {"heapUsed", "heapTotal", "rss"},
		"workers":     {"total", "active", "list"},
		"storage":     {"diskFull", "error", "since"},
		"collections": {"jobIndex", "completedJobs", "jobResults", "jobLogs", "customIdMap", "jobLocks", "clientJobs", "clientJobsTotal", "pendingDepChecks", "stalledCandidates", "processingTotal", "queuedTotal", "waitingDepsTotal", "temporalIndexTotal", "delayedHeapTotal"},
	} {
		if got := keys(t, body, "data", path); !reflect.DeepEqual(got, want) {
			t.Errorf("%s keys %v, want %v", path, got, want)
		}
	}
	d := sub(t, ls.ok(M{"cmd": "DashboardOverview"}), "data")
	st := sub(t, d, "stats")
	for k, want := range map[string]float64{"waiting": 1, "active": 2, "delayed": 1, "completed": 0, "dlq": 0,
		"totalPushed": 4, "totalPulled": 2, "totalCompleted": 0, "totalFailed": 0, "uptime": 1500} {
		if num(t, st[k]) != want {
			t.Errorf("stats.%s = %v, want %v", k, st[k], want)
		}
	}
	lat := sub(t, d, "latency")
	if got := keys(t, body, "data", "latency", "percentiles"); !reflect.DeepEqual(got, []string{"push", "pull", "ack"}) {
		t.Errorf("percentiles keys %v", got)
	}
	pp := sub(t, sub(t, lat, "percentiles"), "push")
	if num(t, pp["p50"]) <= 0 || num(t, pp["p99"]) < num(t, pp["p50"]) {
		t.Errorf("push percentiles after 4 pushes: %v", pp)
	}
	col := sub(t, d, "collections")
	for k, want := range map[string]float64{"jobIndex": 4, "jobLocks": 2, "processingTotal": 2, "queuedTotal": 2, "delayedHeapTotal": 1} {
		if num(t, col[k]) != want {
			t.Errorf("collections.%s = %v, want %v", k, col[k], want)
		}
	}
	w := sub(t, d, "workers")
	wl := list(t, w, "list")
	if num(t, w["total"]) != 1 || len(wl) != 1 {
		t.Fatalf("workers: %v", w)
	}
	if got := keys(t, body, "data", "workers"); !reflect.DeepEqual(got, []string{"total", "active", "list"}) {
		t.Errorf("workers keys %v", got)
	}
	entry := wl[0].(map[string]any)
	if entry["id"] != "wk-1" || entry["name"] != "w1" || len(entry) != 7 || !reflect.DeepEqual(entry["queues"], []any{"o"}) {
		t.Errorf("worker entry: %v", entry)
	}
	if c := list(t, d, "crons"); len(c) != 0 {
		t.Errorf("crons: %v", c)
	}
	if s := sub(t, d, "storage"); s["diskFull"] != false || s["error"] != nil || s["since"] != nil {
		t.Errorf("storage: %v", s)
	}
	if num(t, d["timestamp"]) != float64(ls.now) {
		t.Errorf("timestamp %v", d["timestamp"])
	}
}

func TestDashboardQueues(t *testing.T) {
	ls := newLocalServer(t)
	ls.ok(M{"cmd": "PUSH", "queue": "z-first", "data": 1})
	ls.ok(M{"cmd": "PUSH", "queue": "a-second", "data": 1, "priority": 3})
	ls.ok(M{"cmd": "PUSH", "queue": "a-second", "data": 2})
	ls.ok(M{"cmd": "PUSH", "queue": "a-second", "data": 3, "delay": 1000})
	ls.ok(M{"cmd": "Pause", "queue": "a-second"})
	body := ls.raw(M{"cmd": "DashboardQueues"})
	if got := keys(t, body, "data"); !reflect.DeepEqual(got, []string{"queues", "timestamp"}) {
		t.Fatalf("keys %v", got)
	}
	d := sub(t, ls.ok(M{"cmd": "DashboardQueues"}), "data")
	qs := list(t, d, "queues")
	if len(qs) != 2 {
		t.Fatalf("queues: %v", qs)
	}
	first, second := qs[0].(map[string]any), qs[1].(map[string]any)
	if first["name"] != "z-first" || second["name"] != "a-second" {
		t.Fatalf("not in creation order: %v", qs)
	}
	want := map[string]any{"name": "a-second", "waiting": int64(1), "prioritized": int64(1), "delayed": int64(1),
		"active": int64(0), "dlq": int64(0), "paused": true}
	for k, v := range want {
		if second[k] != v && !(isNum(v) && num(t, second[k]) == num(t, v)) {
			t.Errorf("%s = %v, want %v", k, second[k], v)
		}
	}
	if len(second) != 7 {
		t.Errorf("entry keys: %v", second)
	}
}

func TestDashboardQueue(t *testing.T) {
	ls := newLocalServer(t)
	if got := ls.call(M{"cmd": "DashboardQueue"}); got["ok"] != false || got["error"] != "Queue name is required" {
		t.Fatalf("no queue: %v", got)
	}
	// An unknown queue: all zeros.
	d := sub(t, ls.ok(M{"cmd": "DashboardQueue", "queue": "nobody"}), "data")
	if d["name"] != "nobody" || d["paused"] != false || len(list(t, d, "dlqPreview")) != 0 || len(sub(t, d, "priorityCounts")) != 0 {
		t.Fatalf("unknown queue: %v", d)
	}
	if _, ok := d["jobs"]; ok {
		t.Fatalf("jobs without includeJobs: %v", d)
	}

	const q = "dq"
	for i := 0; i < 4; i++ {
		ls.ok(M{"cmd": "PUSH", "queue": q, "data": i, "priority": i % 2})
	}
	ls.ok(M{"cmd": "PUSH", "queue": q, "data": "later", "delay": 60000})
	// One completed, one failed for good (into the DLQ), one active.
	id := sub(t, ls.ok(M{"cmd": "PULL", "queue": q}), "job")["id"]
	ls.ok(M{"cmd": "ACK", "id": id})
	ls.ok(M{"cmd": "PUSH", "queue": q, "data": M{"bad": true}, "maxAttempts": 1, "priority": 9})
	failed := sub(t, ls.ok(M{"cmd": "PULL", "queue": q}), "job")["id"]
	ls.ok(M{"cmd": "FAIL", "id": failed, "error": "x"})
	active := sub(t, ls.ok(M{"cmd": "PULL", "queue": q}), "job")["id"]
	ls.ok(M{"cmd": "Progress", "id": active, "progress": 40})

	body := ls.raw(M{"cmd": "DashboardQueue", "queue": q, "includeJobs": true, "jobsLimit": 1})
	if got := keys(t, body, "data"); !reflect.DeepEqual(got, []string{"name", "counts", "paused", "priorityCounts", "dlqPreview", "timestamp", "jobs"}) {
		t.Fatalf("keys %v", got)
	}
	if got := keys(t, body, "data", "counts"); !reflect.DeepEqual(got, []string{"waiting", "prioritized", "delayed", "active",
		"completed", "failed", "waiting-children", "totalCompleted", "totalFailed", "paused"}) {
		t.Fatalf("counts keys %v", got)
	}
	if got := keys(t, body, "data", "jobs"); !reflect.DeepEqual(got, []string{"waiting", "active", "delayed", "paused"}) {
		t.Fatalf("jobs keys %v", got)
	}
	d = sub(t, ls.ok(M{"cmd": "DashboardQueue", "queue": q, "includeJobs": true, "jobsLimit": 1}), "data")
	c := sub(t, d, "counts")
	for k, want := range map[string]float64{"waiting": 2, "prioritized": 0, "delayed": 1, "active": 1, "completed": 1,
		"failed": 1, "waiting-children": 0, "totalCompleted": 1, "totalFailed": 1, "paused": 0} {
		if num(t, c[k]) != want {
			t.Errorf("counts.%s = %v, want %v", k, c[k], want)
		}
	}
	if pc := sub(t, d, "priorityCounts"); len(pc) != 1 || num(t, pc["0"]) != 3 {
		t.Errorf("priorityCounts %v", pc)
	}
	dlq := list(t, d, "dlqPreview")
	if len(dlq) != 1 {
		t.Fatalf("dlqPreview %v", dlq)
	}
	if e := dlq[0].(map[string]any); e["id"] != failed || !reflect.DeepEqual(e["data"], map[string]any{"bad": true}) ||
		num(t, e["attempts"]) != 1 || !isNum(e["createdAt"]) || len(e) != 4 {
		t.Errorf("dlq entry %v", e)
	}
	jobs := sub(t, d, "jobs")
	for _, k := range []string{"waiting", "active", "delayed"} {
		if l := list(t, jobs, k); len(l) != 1 {
			t.Errorf("jobs.%s: %v (limit 1)", k, l)
		}
	}
	if l := list(t, jobs, "paused"); len(l) != 0 {
		t.Errorf("jobs.paused of a running queue: %v", l)
	}
	a := list(t, jobs, "active")[0].(map[string]any)
	if a["id"] != active || num(t, a["progress"]) != 40 || len(a) != 6 {
		t.Errorf("active entry %v", a)
	}
	// The waiting list is in pull order: the next job out comes first.
	next := list(t, jobs, "waiting")[0].(map[string]any)["id"]

	// Paused: ready jobs count and list as paused.
	ls.ok(M{"cmd": "Pause", "queue": q})
	d = sub(t, ls.ok(M{"cmd": "DashboardQueue", "queue": q, "includeJobs": true, "jobsLimit": 500}), "data")
	c = sub(t, d, "counts")
	if num(t, c["waiting"]) != 0 || num(t, c["prioritized"]) != 0 || num(t, c["paused"]) != 2 || d["paused"] != true {
		t.Errorf("paused counts %v", c)
	}
	jobs = sub(t, d, "jobs")
	if len(list(t, jobs, "waiting")) != 0 || len(list(t, jobs, "paused")) != 2 {
		t.Errorf("paused lists: %v", jobs)
	}
	ls.ok(M{"cmd": "Resume", "queue": q})
	if got := sub(t, ls.ok(M{"cmd": "PULL", "queue": q}), "job")["id"]; got != next {
		t.Errorf("first waiting job listed %v, but PULL gave %v", next, got)
	}
}

func TestFirstK(t *testing.T) {
	var all []*Job
	for i := 0; i < 100; i++ {
		all = append(all, &Job{RunAt: int64((i * 37) % 100), seq: int64(i)})
	}
	each := func(yield func(*Job)) {
		for _, j := range all {
			yield(j)
		}
	}
	got := firstK(5, each, func(a, b *Job) bool { return a.RunAt < b.RunAt })
	for i, j := range got {
		if j.RunAt != int64(i) {
			t.Fatalf("firstK: %d-th has RunAt %d", i, j.RunAt)
		}
	}
	if len(firstK(0, each, func(a, b *Job) bool { return false })) != 0 {
		t.Fatal("k = 0")
	}
}

func TestCompactMemory(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	for i := 0; i < 50; i++ {
		c.ok(M{"cmd": "PUSH", "queue": "cm", "data": i})
	}
	for i := 0; i < 40; i++ {
		id := sub(t, c.ok(M{"cmd": "PULL", "queue": "cm"}), "job")["id"]
		c.ok(M{"cmd": "ACK", "id": id})
	}
	a := c.ok(M{"cmd": "CompactMemory"})
	wantUndefined(t, "CompactMemory id", a["id"])
	counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "cm"}), "counts")
	if num(t, counts["waiting"]) != 10 || num(t, counts["completed"]) != 40 {
		t.Fatalf("after CompactMemory: %v", counts)
	}
	for i := 0; i < 10; i++ {
		if j := c.ok(M{"cmd": "PULL", "queue": "cm"})["job"]; j == nil {
			t.Fatalf("job %d lost by CompactMemory", i)
		}
	}
}

// Over TCP: the overview counts connections holding jobs.
func TestProtoDashboardOverviewClients(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	w := dial(t, ts.addr)
	c.ok(M{"cmd": "PUSH", "queue": "oc", "data": 1})
	c.ok(M{"cmd": "PUSH", "queue": "oc", "data": 2})
	w.ok(M{"cmd": "PULLB", "queue": "oc", "count": 2})
	col := sub(t, sub(t, c.ok(M{"cmd": "DashboardOverview"}), "data"), "collections")
	if num(t, col["clientJobs"]) != 1 || num(t, col["clientJobsTotal"]) != 2 {
		t.Fatalf("collections: %v", col)
	}
}
