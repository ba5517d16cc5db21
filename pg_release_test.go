package main

import (
	"testing"
	"time"
)

// TestPGReleaseOnDisconnect: a connection that drops gives back the jobs
// it pulled and did not renew, at once and without costing an attempt,
// to workers on any broker; a renewed lock is left to run out; a finished
// job is not touched.
func TestPGReleaseOnDisconnect(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	a, b := startPGBroker(t, ns), startPGBroker(t, ns)
	ca, cb := dial(t, a.addr()), dial(t, b.addr())
	kept := push(t, cb, "rel", nil)
	back := push(t, cb, "rel", nil)
	loose := push(t, cb, "rel", nil)
	done := push(t, cb, "rel", nil)

	w := dial(t, a.addr())
	got := map[string]string{}
	for range 3 {
		a := w.ok(M{"cmd": "PULL", "queue": "rel", "owner": "w1", "lockTtl": 60000})
		j := a["job"].(map[string]any)
		got[j["id"].(string)] = a["token"].(string)
	}
	lj := w.ok(M{"cmd": "PULL", "queue": "rel"})["job"].(map[string]any) // no owner, no lock
	if len(got) != 3 || lj["id"] != done {
		t.Fatalf("pulled %v and %v, want the four jobs in order", got, lj["id"])
	}
	w.ok(M{"cmd": "ExtendLock", "id": kept, "token": got[kept], "duration": 60000})
	w.ok(M{"cmd": "ACK", "id": done})
	w.close()

	// Both unrenewed jobs come back at once, through the other broker.
	deadline := time.Now().Add(10 * time.Second)
	seen := map[string]bool{}
	for len(seen) < 2 && time.Now().Before(deadline) {
		j, ok := cb.ok(M{"cmd": "PULL", "queue": "rel", "timeout": 1000})["job"].(map[string]any)
		if !ok {
			continue
		}
		id := j["id"].(string)
		seen[id] = true
		if toFloat(j["attempts"]) != 0 || toFloat(j["stallCount"]) != 0 {
			t.Errorf("released job %s counts %v attempts, %v stalls, want 0", id, j["attempts"], j["stallCount"])
		}
	}
	if !seen[back] || !seen[loose] || len(seen) != 2 {
		t.Fatalf("after the disconnect broker B got %v, want %s and %s", seen, back, loose)
	}
	// The renewed one stays with its (now gone) worker until its lock runs out.
	if st := ca.ok(M{"cmd": "GetState", "id": kept})["state"]; st != "active" {
		t.Errorf("renewed job is %v, want active", st)
	}
	if st := ca.ok(M{"cmd": "GetState", "id": done})["state"]; st != "completed" {
		t.Errorf("finished job is %v, want completed", st)
	}
}
