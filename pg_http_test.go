package main

// The HTTP figures in PostgreSQL mode: /stats, /health, /queues/summary
// and /heapstats read the job figures from the engine, so every broker
// shows the database's (they read the in-memory broker once, which holds
// no jobs in PostgreSQL mode: /stats said waiting=0 with jobs waiting).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
)

// figuresScript puts jobs in every state through c: queue g has 2
// waiting, 1 prioritized, 1 delayed, 1 active, 1 dead-lettered and 1
// completed job; queue gflow a flow's child (waiting) and its parent
// (waiting for children).
func figuresScript(t *testing.T, c *tclient) {
	t.Helper()
	q := "g"
	c.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 1, "jobId": "x1", "maxAttempts": 1})
	c.ok(map[string]any{"cmd": "PULL", "queue": q})
	c.ok(map[string]any{"cmd": "FAIL", "id": "x1", "error": "boom"})
	c.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 1, "jobId": "c1"})
	c.ok(map[string]any{"cmd": "PULL", "queue": q})
	c.ok(map[string]any{"cmd": "ACK", "id": "c1"})
	for _, id := range []string{"w1", "w2", "w3"} {
		c.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 1, "jobId": id})
	}
	c.ok(map[string]any{"cmd": "PULL", "queue": q, "owner": "figures", "lockTtl": 600000})
	c.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 1, "jobId": "p1", "priority": 5})
	c.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 1, "jobId": "d1", "delay": 600000})
	c.ok(map[string]any{"cmd": "PUSHF", "jobs": []any{
		map[string]any{"id": "kid", "queue": "gflow", "input": map[string]any{"parentId": "par", "data": map[string]any{"__parentId": "par", "__parentQueue": "gflow"}}},
		map[string]any{"id": "par", "queue": "gflow", "input": map[string]any{"dependsOn": []any{"kid"}, "childrenIds": []any{"kid"}, "data": map[string]any{}}},
	}})
}

// httpFigures reads the figures the HTTP routes show through one server.
func httpFigures(t *testing.T, httpPort int) map[string]any {
	t.Helper()
	get := func(path string) any {
		res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", httpPort, path))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var v any
		if err := json.NewDecoder(res.Body).Decode(&v); err != nil || res.StatusCode != 200 {
			t.Fatalf("GET %s: %d %v", path, res.StatusCode, err)
		}
		return v
	}
	out := map[string]any{}
	stats := get("/stats").(map[string]any)
	for _, k := range []string{"waiting", "prioritized", "delayed", "active", "dlq", "completed", "waiting-children"} {
		out["stats."+k] = stats["stats"].(map[string]any)[k]
	}
	for _, k := range []string{"queuedTotal", "processingTotal", "completedJobs", "jobIndex"} {
		out["stats.collections."+k] = stats["collections"].(map[string]any)[k]
	}
	health := get("/health").(map[string]any)["queues"].(map[string]any)
	for _, k := range []string{"count", "waiting", "prioritized", "delayed", "active", "dlq", "completed"} {
		out["health.queues."+k] = health[k]
	}
	for _, q := range get("/queues/summary").([]any) {
		m := q.(map[string]any)
		c, _ := json.Marshal(m["counts"])
		out["summary."+m["name"].(string)] = string(c)
	}
	heap := get("/heapstats").(map[string]any)["collections"].(map[string]any)
	out["heapstats.collections.queuedTotal"] = heap["queuedTotal"]
	out["heapstats.collections.processingTotal"] = heap["processingTotal"]
	return out
}

func TestPGHTTPFiguresFromTheDatabase(t *testing.T) {
	t.Parallel()
	want := map[string]any{
		"stats.waiting": 3.0, "stats.prioritized": 1.0, "stats.delayed": 1.0, "stats.active": 1.0, "stats.dlq": 1.0,
		"stats.completed": 1.0, "stats.waiting-children": 1.0,
		"stats.collections.queuedTotal": 5.0, "stats.collections.processingTotal": 1.0,
		"stats.collections.completedJobs": 1.0, "stats.collections.jobIndex": 9.0,
		"health.queues.count": 2.0, "health.queues.waiting": 3.0, "health.queues.prioritized": 1.0,
		"health.queues.delayed": 1.0, "health.queues.active": 1.0, "health.queues.dlq": 1.0, "health.queues.completed": 1.0,
		"summary.g":                         `{"active":1,"completed":1,"delayed":1,"failed":1,"prioritized":1,"waiting":2}`,
		"summary.gflow":                     `{"active":0,"completed":0,"delayed":0,"failed":0,"prioritized":0,"waiting":1}`,
		"heapstats.collections.queuedTotal": 5.0, "heapstats.collections.processingTotal": 1.0,
	}
	check := func(mode string, port int) {
		got := httpFigures(t, port)
		for k, v := range want {
			if fmt.Sprint(got[k]) != fmt.Sprint(v) {
				t.Errorf("%s, HTTP port %d: %s = %v, want %v", mode, port, k, got[k], v)
			}
		}
	}
	// Memory mode: the figures the script makes.
	mem := startBinary(t, "--memory")
	figuresScript(t, dial(t, mem.addr()))
	check("memory", mem.httpPort)
	// PostgreSQL mode, through the broker that made them and through one
	// that did nothing.
	ns := pgTestNamespace(t)
	pa, pb := startPGBroker(t, ns), startPGBroker(t, ns)
	figuresScript(t, dial(t, pa.addr()))
	check("postgres, the broker that pushed", pa.httpPort)
	check("postgres, another broker", pb.httpPort)
}
