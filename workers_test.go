package main

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestWorkersWithoutConnectionExpire: a worker registered over HTTP has
// no connection to go away with; it goes once it has not been heard from
// for three heartbeat periods (a heartbeat keeps it), while one with a
// connection stays as long as its connection. The registry is bounded and
// its refusal names the limit.
func TestWorkersWithoutConnectionExpire(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	var clock atomic.Int64
	clock.Store(nowMs())
	b.now = clock.Load
	h := newHTTPHandler(b, memServer(b, nil, quietLog()), nil)
	call := func(method, path, body string) map[string]any {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
		var out map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s %s: %d %s", method, path, rec.Code, rec.Body.String())
		}
		return out
	}
	listed := func() int {
		t.Helper()
		return len(call("GET", "/workers", "")["data"].(map[string]any)["workers"].([]any))
	}
	wid := call("POST", "/workers", `{"name":"w1","queues":["q"]}`)["data"].(map[string]any)["workerId"].(string)
	idle := call("POST", "/workers", `{"name":"w2","queues":["q"]}`)["data"].(map[string]any)["workerId"].(string)
	connected, err := b.workers.register(&worker{ID: "tcp", Name: "tcp", LastSeen: clock.Load(), conn: &conn{}})
	if err != nil || connected == nil {
		t.Fatal(err)
	}
	clock.Add(60000)
	if out := call("POST", "/workers/"+wid+"/heartbeat", `{"activeJobs":1}`); out["ok"] != true {
		t.Fatalf("heartbeat: %v", out)
	}
	clock.Add(60000) // w2 silent for 120 s, w1 for 60 s
	if n := listed(); n != 2 {
		t.Fatalf("%d workers listed, want w1 and the connected one", n)
	}
	if out := call("POST", "/workers/"+idle+"/heartbeat", `{}`); out["ok"] != false {
		t.Fatalf("the expired worker still takes heartbeats: %v", out)
	}
	clock.Add(60000)
	if n := listed(); n != 1 {
		t.Fatalf("%d workers listed, want the connected one only", n)
	}

	// The limit: the registry fills, the next is refused by name, and
	// room comes back as silent workers expire.
	for i := b.workers.count(); i < maxWorkers; i++ {
		if _, err := b.workers.register(&worker{ID: itoa(int64(i)), LastSeen: clock.Load()}); err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
	out := call("POST", "/workers", `{"name":"one too many"}`)
	if msg, _ := out["error"].(string); msg != "registered workers are limited to 10000" {
		t.Fatalf("past the limit: %v", out)
	}
	clock.Add(3*workerTimeoutMs + 1)
	if out := call("POST", "/workers", `{"name":"later"}`); out["ok"] != true {
		t.Fatalf("after the silent ones expired: %v", out)
	}
	if n := b.workers.count(); n != 2 {
		t.Fatalf("%d workers, want the connected one and the new one", n)
	}
	long := call("POST", "/workers", `{"name":"`+strings.Repeat("n", 2000)+`"}`)
	if msg, _ := long["error"].(string); msg != "a worker's name is limited to 1 KiB (1024 bytes)" {
		t.Fatalf("a long name: %v", long)
	}
}
