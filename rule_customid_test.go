package main

import (
	"fmt"
	"testing"
)

// GetJobByCustomId after a job completed and after one failed for good:
// in memory and SQLite mode not found, as the reference's memory engine
// forgets the custom id then; in PostgreSQL mode found, in its state, as
// the reference's PostgreSQL mode finds every job its table holds (a user
// moved with queued migrate --from-bunqueue kept finding them). Over the
// wire and over HTTP (GET /jobs/custom/ID).
func TestCustomIDFindsFinished(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"memory", "sqlite", "postgres"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := startBinary(t, storageFlags(t, mode)...)
			c := dial(t, srv.addr())
			q := "custom-finished"
			c.ok(M{"cmd": "PUSH", "queue": q, "data": 1, "jobId": "done-1"})
			c.ok(M{"cmd": "PUSH", "queue": q, "data": 2, "jobId": "dead-1", "maxAttempts": 1})
			c.ok(M{"cmd": "PUSH", "queue": q, "data": 3, "jobId": "live-1", "delay": 60000})
			for range 2 {
				id, tok := pullOwned(t, c, q, M{"owner": "w"})
				if id == "done-1" {
					c.ok(M{"cmd": "ACK", "id": id, "token": tok, "result": "r"})
				} else {
					c.ok(M{"cmd": "FAIL", "id": id, "token": tok, "error": "boom"})
				}
			}
			wantState(t, c, "done-1", "completed")
			wantState(t, c, "dead-1", "failed")
			finds := mode == "postgres"
			for id, state := range map[string]string{"done-1": "completed", "dead-1": "failed", "live-1": "delayed"} {
				a := c.call(M{"cmd": "GetJobByCustomId", "customId": id})
				found := a["ok"] == true
				if want := finds || state == "delayed"; found != want {
					t.Errorf("GetJobByCustomId %s (%s): %v, want found %v", id, state, a, want)
					continue
				}
				if found && str(t, sub(t, a, "job"), "id") != id {
					t.Errorf("GetJobByCustomId %s: %v", id, a)
				}
				if !found && a["error"] != errJobNotFound.Error() {
					t.Errorf("GetJobByCustomId %s (%s): %v, want %q", id, state, a, errJobNotFound)
				}
				resp, _ := httpGet(t, fmt.Sprintf("127.0.0.1:%d", srv.httpPort), "/jobs/custom/"+id, "")
				if (resp.StatusCode == 200) != found {
					t.Errorf("GET /jobs/custom/%s: %s, wire found %v", id, resp.Status, found)
				}
			}
		})
	}
}
