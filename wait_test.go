package main

import (
	"fmt"
	"testing"
)

// TestWaitJobEndsAsMemory: WaitJob callers on one broker learn how a job
// ended through another, and both engines say the same: a job removed
// while waited on did not complete; one completed with removeOnComplete
// did, with its result, though its row is gone; one that failed for good
// did not.
func TestWaitJobEndsAsMemory(t *testing.T) {
	t.Parallel()
	obs := sameAsMemory(t, func(t *testing.T, c []*tclient) map[string]any {
		q := "waitends"
		o := map[string]any{}
		wait := func(id string) func() map[string]any {
			wid, wch := c[1].send(M{"cmd": "WaitJob", "id": id, "timeout": 20000})
			c[1].ok(M{"cmd": "Ping"}) // read, and waiting
			return func() map[string]any {
				a := c[1].await(wid, wch, 2*callTimeout)
				return map[string]any{"completed": a["completed"], "result": a["result"]}
			}
		}

		removed := push(t, c[0], q, M{"delay": 60000})
		got := wait(removed)
		c[2].ok(M{"cmd": "Cancel", "id": removed})
		o["removed"] = got()

		gone := push(t, c[0], q, M{"removeOnComplete": true})
		got = wait(gone)
		id, tok := pullOwned(t, c[2], q, nil)
		if id != gone {
			t.Fatalf("pulled %s, want %s", id, gone)
		}
		c[2].ok(M{"cmd": "ACK", "id": id, "token": tok, "result": M{"v": 1}})
		o["removeOnComplete"] = got()

		failed := push(t, c[0], q, M{"maxAttempts": 1})
		got = wait(failed)
		id, tok = pullOwned(t, c[2], q, nil)
		c[2].ok(M{"cmd": "FAIL", "id": id, "token": tok, "error": "no"})
		o["failed"] = got()
		return o
	})
	want := map[string]any{
		"removed":          map[string]any{"completed": false, "result": nil},
		"removeOnComplete": map[string]any{"completed": true, "result": map[string]any{"v": 1}},
		"failed":           map[string]any{"completed": false, "result": nil},
	}
	for k, w := range want {
		if g := obs[k]; fmt.Sprint(g) != fmt.Sprint(w) {
			t.Errorf("%s: memory mode answered %v, want %v", k, g, w)
		}
	}
}
