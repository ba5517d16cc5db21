package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"
)

// lifecycleScript claims and completes jobs every way an ACK can go (with
// and without a lock, a result, a wrong or missing token, twice in one
// ACKB, removed on completion, after a failed attempt) and reads them back,
// through two connections; it records every answer, normalised as
// moveScript's are.
func lifecycleScript(t *testing.T, a, b *tclient) []string {
	t.Helper()
	q := "life"
	toks := map[string]string{}
	steps := []struct {
		c   *tclient
		req map[string]any
	}{
		{a, M{"cmd": "PUSH", "queue": q, "data": M{"n": 1}, "jobId": "p1"}},
		{a, M{"cmd": "PUSH", "queue": q, "data": M{"n": 2}, "jobId": "p2"}},
		{a, M{"cmd": "PUSH", "queue": q, "data": M{"n": 3}, "jobId": "p3"}},
		{a, M{"cmd": "PUSH", "queue": q, "data": M{"n": 4}, "jobId": "p4", "removeOnComplete": true}},
		{a, M{"cmd": "PUSH", "queue": q, "data": M{"n": 5}, "jobId": "p5", "maxAttempts": 3, "backoff": M{"type": "fixed", "delay": 300}}},
		{a, M{"cmd": "PUSH", "queue": q, "data": M{"n": 6}, "jobId": "p6"}},
		{b, M{"cmd": "PULL", "queue": q, "owner": "w1", "lockTtl": 30000}}, // p1
		{b, M{"cmd": "GetJob", "id": "p1"}},
		{b, M{"cmd": "ACK", "id": "p1", "token": "$p1", "result": M{"r": 1}}},
		{a, M{"cmd": "GetJob", "id": "p1"}},
		{a, M{"cmd": "GetResult", "id": "p1"}},
		{a, M{"cmd": "GetState", "id": "p1"}},
		{b, M{"cmd": "PULL", "queue": q}}, // p2, no lock
		{b, M{"cmd": "ACKB", "ids": []any{"p2", "p2"}}},
		{a, M{"cmd": "GetJob", "id": "p2"}},
		{b, M{"cmd": "PULL", "queue": q, "owner": "w2", "lockTtl": 30000}}, // p3
		{b, M{"cmd": "ACK", "id": "p3", "token": "not-the-token"}},
		{b, M{"cmd": "ACK", "id": "p3"}},
		{a, M{"cmd": "GetState", "id": "p3"}},
		{b, M{"cmd": "ACKB", "ids": []any{"p3", "p3"}, "tokens": []any{"$p3", "$p3"}, "results": []any{"first", "second"}}},
		{a, M{"cmd": "GetResult", "id": "p3"}},
		{b, M{"cmd": "PULL", "queue": q}}, // p4, removed on completion
		{b, M{"cmd": "ACK", "id": "p4"}},
		{a, M{"cmd": "GetJob", "id": "p4"}},
		{b, M{"cmd": "PULL", "queue": q, "owner": "w3", "lockTtl": 30000}}, // p5
		{b, M{"cmd": "FAIL", "id": "p5", "token": "$p5", "error": "boom"}},
		{a, M{"cmd": "GetJob", "id": "p5"}},
		{b, M{"cmd": "PULL", "queue": q, "owner": "w3", "lockTtl": 30000, "wait": "p5"}}, // p6 or p5, whichever is due
		{b, M{"cmd": "PULL", "queue": q, "owner": "w3", "lockTtl": 30000, "wait": "p5"}},
		{b, M{"cmd": "ACKB", "ids": []any{"p5", "p6"}, "tokens": []any{"$p5", "$p6"}, "results": []any{5, 6}}},
		{a, M{"cmd": "GetJob", "id": "p5"}},
		{a, M{"cmd": "GetJob", "id": "p6"}},
		{a, M{"cmd": "GetJobCounts", "queue": q}},
		{a, M{"cmd": "GetJobs", "queue": q, "state": "completed", "start": 0, "end": 10}},
	}
	var out []string
	for i, s := range steps {
		req := map[string]any{}
		for k, v := range s.req {
			req[k] = v
		}
		if s.req["cmd"] == "PULL" && s.req["wait"] != nil {
			// The failed job waits out its backoff (300 ms, give or take
			// a fifth) before it is due again: wait until it is, so that
			// both modes pull alike.
			delete(req, "wait")
			wait := s.req["wait"]
			eventually(t, 10*time.Second, fmt.Sprint(wait, " due again"), func() (bool, string) {
				st := str(t, s.c.ok(M{"cmd": "GetState", "id": wait}), "state")
				return st == "waiting", st
			})
		}
		for k, v := range req {
			if str, ok := v.(string); ok && len(str) > 1 && str[0] == '$' {
				req[k] = toks[str[1:]]
			}
			if l, ok := v.([]any); ok {
				l2 := make([]any, len(l))
				for i, e := range l {
					if str, ok := e.(string); ok && len(str) > 1 && str[0] == '$' {
						e = toks[str[1:]]
					}
					l2[i] = e
				}
				req[k] = l2
			}
		}
		ans := s.c.call(req)
		if j, ok := ans["job"].(map[string]any); ok && s.req["cmd"] == "PULL" {
			if tk, ok := ans["token"].(string); ok {
				toks[fmt.Sprint(j["id"])] = tk
			}
		}
		out = append(out, answerLine(t, i, s.req["cmd"], ans))
	}
	return out
}

// TestPGLifecycleAnswersAsMemory: claims and completions, which in
// PostgreSQL mode write a row's state columns rather than its record, read
// back through two brokers as they do from one memory-mode server, field
// for field.
func TestPGLifecycleAnswersAsMemory(t *testing.T) {
	t.Parallel()
	answersAsMemory(t, lifecycleScript)
}

// TestPGClaimAndAckLeaveTheRecord: a plain job's claim and completion
// write its row's columns only (the record stays as pushed), and the job
// reads back with the times the columns hold; a job that is not plain
// (removed on completion) goes the way that reads its row, and is gone.
func TestPGClaimAndAckLeaveTheRecord(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	srv := startPGBroker(t, ns)
	c := dial(t, srv.addr())
	ctx, conn := pgTestConn(t)
	row := func(id string) (body []byte, state int16, started, done *int64, plain bool) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT body, state, started_at, done_at, plain FROM queued_`+ns+`.jobs WHERE id = $1`, id).
			Scan(&body, &state, &started, &done, &plain); err != nil {
			t.Fatalf("row %s: %v", id, err)
		}
		return
	}

	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "q", "data": M{"x": 1}}), "id")
	pushed, st, _, _, plain := row(id)
	if st != pgQueued || !plain {
		t.Fatalf("pushed row: state %d plain %v", st, plain)
	}
	p := c.ok(M{"cmd": "PULL", "queue": "q", "owner": "w", "lockTtl": 30000})
	tok := str(t, p, "token")
	body, st, started, _, _ := row(id)
	if st != pgActive || started == nil || !bytes.Equal(body, pushed) {
		t.Fatalf("claimed row: state %d started %v, record rewritten %v", st, started, !bytes.Equal(body, pushed))
	}
	j := c.ok(M{"cmd": "GetJob", "id": id})["job"].(map[string]any)
	if toFloat(j["startedAt"]) != float64(*started) {
		t.Fatalf("active job: startedAt %v, started_at %d", j["startedAt"], *started)
	}
	c.ok(M{"cmd": "ACK", "id": id, "token": tok, "result": "r"})
	body, st, started2, done, _ := row(id)
	if st != pgDone || done == nil || *started2 != *started || !bytes.Equal(body, pushed) {
		t.Fatalf("completed row: state %d done %v, record rewritten %v", st, done, !bytes.Equal(body, pushed))
	}
	j = c.ok(M{"cmd": "GetJob", "id": id})["job"].(map[string]any)
	if toFloat(j["completedAt"]) != float64(*done) || toFloat(j["startedAt"]) != float64(*started) {
		t.Fatalf("completed job: startedAt %v completedAt %v, columns %d %d", j["startedAt"], j["completedAt"], *started, *done)
	}
	if r := c.ok(M{"cmd": "GetResult", "id": id})["result"]; r != "r" {
		t.Fatalf("result %v", r)
	}

	rm := str(t, c.ok(M{"cmd": "PUSH", "queue": "q", "data": 2, "removeOnComplete": true}), "id")
	if _, _, _, _, plain := row(rm); plain {
		t.Fatal("a job removed on completion is marked plain")
	}
	c.ok(M{"cmd": "PULL", "queue": "q"})
	c.ok(M{"cmd": "ACK", "id": rm})
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM queued_`+ns+`.jobs WHERE id = $1`, rm).Scan(&n); err != nil || n != 0 {
		t.Fatalf("removed on completion: %d rows (%v)", n, err)
	}
}

// TestPGAckRoundHalfWritten: when an ACK round's transaction fails after
// its fast statement committed, the jobs that statement completed are
// answered as applied and counted, and only the other items carry the
// error.
func TestPGAckRoundHalfWritten(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	srv := startPGBroker(t, ns)
	c := dial(t, srv.addr())
	fast := str(t, c.ok(M{"cmd": "PUSH", "queue": "h", "data": 1}), "id")
	slow := str(t, c.ok(M{"cmd": "PUSH", "queue": "h", "data": 2}), "id")
	if got := list(t, c.ok(M{"cmd": "PULLB", "queue": "h", "count": 2}), "jobs"); len(got) != 2 {
		t.Fatalf("pulled %d jobs", len(got))
	}

	ctx, conn := pgTestConn(t)
	b := NewBroker()
	defer b.Close()
	p, err := OpenPG(ctx, testPGURL(), ns, b, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Another transaction holds the slow item's row: the round's
	// transaction waits for it until the round's deadline.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM queued_`+ns+`.jobs WHERE id = $1 FOR UPDATE`, slow); err != nil {
		t.Fatal(err)
	}

	// Long enough for the fast statement on a busy machine; the slow
	// transaction waits for the held row until then.
	rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
	defer rcancel()
	// The second item asks for its job to be removed: not a fast one.
	outs, errs, err := p.ackRound(rctx, []AckItem{{ID: fast}, {ID: slow, Remove: true}})
	if err == nil || outs == nil {
		t.Fatalf("round: outs %v, err %v; want the items' outcomes and the error", outs, err)
	}
	if outs[0] != Applied || errs[0] != nil {
		t.Fatalf("fast item: %v %v", outs[0], errs[0])
	}
	if errs[1] != err {
		t.Fatalf("slow item: %v, want the round's error %v", errs[1], err)
	}
	if n := b.stats.completed.Load(); n != 1 {
		t.Fatalf("completed counted: %d, want 1", n)
	}
	tx.Rollback(ctx)
	if st := c.ok(M{"cmd": "GetState", "id": fast}); st["state"] != "completed" {
		t.Fatalf("fast job: %v", st)
	}
	if st := c.ok(M{"cmd": "GetState", "id": slow}); st["state"] != "active" {
		t.Fatalf("slow job: %v", st)
	}
}
