package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// pgOwnedPull sends a pull of one job with an owner that may wait ms,
// and answers on the channel the ids and tokens it is given.
func pgOwnedPull(t *testing.T, ctx context.Context, p *PG, queue string, ms int64) chan [2][]string {
	t.Helper()
	return pgOwnedPullN(t, ctx, p, queue, 1, ms)
}

// pgOwnedPullN is pgOwnedPull for n jobs.
func pgOwnedPullN(t *testing.T, ctx context.Context, p *PG, queue string, n int, ms int64) chan [2][]string {
	t.Helper()
	got := make(chan [2][]string, 1)
	var ids, toks []string
	answer := func(jobs []*Job, tokens []string) {
		for i, j := range jobs {
			ids, toks = append(ids, j.ID()), append(toks, tokens[i])
		}
	}
	wait, err := p.Pull(ctx, queue, n, PullOpts{Owner: "w", TTL: 30000}, ms, answer)
	if err != nil {
		t.Fatal(err)
	}
	if wait == nil {
		got <- [2][]string{ids, toks}
		return got
	}
	go func() {
		if _, err := wait(answer); err != nil {
			t.Error(err)
		}
		got <- [2][]string{ids, toks}
	}()
	return got
}

// pgSleeping waits until n pulls of queue sleep (a push may hand them jobs).
func pgSleeping(t *testing.T, p *PG, queue string, n int) {
	t.Helper()
	eventually(t, 10*time.Second, "pulls asleep", func() (bool, string) {
		p.wmu.Lock()
		defer p.wmu.Unlock()
		k := 0
		for _, w := range p.waiters[queue] {
			if w.sleeping {
				k++
			}
		}
		return k == n, fmt.Sprintf("%d asleep, want %d", k, n)
	})
}

// pgReadyJob is mustJob made on p's clock (the database's), a second
// back: ready when pushed. mustJob's own clock is this process's, which
// p's estimate of the database's time may trail by a few milliseconds
// under load: the job was then delayed by as much, and a push hands no
// delayed job (TestPGPushHandsToSleepingPull failed so, 1 run in 4 with
// the machine's cores busy).
func pgReadyJob(t *testing.T, p *PG, queue string, fields map[string]any) *Job {
	t.Helper()
	return mustJobAt(t, queue, fields, p.now()-1000)
}

func takePull(t *testing.T, pull chan [2][]string, what string) (ids, tokens []string) {
	t.Helper()
	select {
	case got := <-pull:
		return got[0], got[1]
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: the waiting pull was not answered", what)
		return nil, nil
	}
}

// TestPGPushHandsToSleepingPull: a job pushed while a pull with an owner
// sleeps on its queue is that pull's without a claim: the push's
// transaction writes its lease, and the pull answers it with the token
// the row holds, which an ACK then takes. Before, the push woke the pull,
// which claimed the job in a transaction of its own. (A pull's recheck,
// every second, may be claiming just as a push comes on a loaded machine:
// that push is claimed as before, so a few are tried.)
func TestPGPushHandsToSleepingPull(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	const q = "hand"
	for try := 0; ; try++ {
		pull := pgOwnedPull(t, ctx, p, q, 20000)
		pgSleeping(t, p, q, 1)
		before := p.handed.Load()
		ids, _, err := p.Push(ctx, q, []*Job{pgReadyJob(t, p, q, map[string]any{"data": try})}, false).Wait()
		if err != nil {
			t.Fatal(err)
		}
		got, toks := takePull(t, pull, "the push")
		if len(got) != 1 || got[0] != ids[0] || toks[0] == "" {
			t.Fatalf("the pull was given %v %v, want %s with a token", got, toks, ids[0])
		}
		var state int16
		var token, owner string
		if err := p.pool.QueryRow(ctx, p.sql(`SELECT state, lease_token, lease_owner FROM {s}.jobs WHERE id = $1`), ids[0]).
			Scan(&state, &token, &owner); err != nil {
			t.Fatal(err)
		}
		if state != pgState(StateActive) || token != toks[0] || owner != "w" {
			t.Fatalf("the job's row: state %d, lease %s of %s; want active, %s of w", state, token, owner, toks[0])
		}
		if out, err := p.Ack(ctx, AckItem{ID: ids[0], Token: toks[0]}); err != nil || out != Applied {
			t.Fatalf("ACK with the token: %v %v", out, err)
		}
		if p.handed.Load() == before+1 {
			return
		}
		if try == 4 {
			t.Fatalf("none of %d jobs pushed to a sleeping pull was handed to it", try+1)
		}
	}
}

// TestPGPushHandsPartly: a push of more ready jobs than its queue's
// sleeping pulls take hands them the oldest, leases written in the push's
// own transaction, and writes the rest waiting, for the next pull to
// claim. Before, such a push handed none: every pull woken claimed in a
// transaction of its own (at 1,500 jobs/s through bench steady, a push in
// four found too few pulls asleep). A pull's recheck may claim just as a
// push comes on a loaded machine, so a few are tried, each on a queue of
// its own.
func TestPGPushHandsPartly(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	for try := 0; ; try++ {
		q := fmt.Sprintf("partly%d", try)
		pulls := []chan [2][]string{pgOwnedPull(t, ctx, p, q, 20000)}
		pgSleeping(t, p, q, 1)
		pulls = append(pulls, pgOwnedPull(t, ctx, p, q, 20000))
		pgSleeping(t, p, q, 2)
		before := p.handed.Load()
		jobs := []*Job{pgReadyJob(t, p, q, map[string]any{"data": 1}), pgReadyJob(t, p, q, map[string]any{"data": 2}),
			pgReadyJob(t, p, q, map[string]any{"data": 3})}
		ids, _, err := p.Push(ctx, q, jobs, false).Wait()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for i, pull := range pulls {
			g, toks := takePull(t, pull, fmt.Sprintf("pull %d", i))
			if len(g) != 1 || toks[0] == "" {
				t.Fatalf("pull %d was given %v %v, want one job with a token", i, g, toks)
			}
			got[g[0]] = toks[0]
		}
		if got[ids[2]] != "" || len(got) != 2 {
			t.Fatalf("the sleeping pulls were given %v, want the two oldest of %v", got, ids)
		}
		handed := p.handed.Load() - before
		for i, id := range ids {
			var state int16
			var token *string
			if err := p.pool.QueryRow(ctx, p.sql(`SELECT state, lease_token FROM {s}.jobs WHERE id = $1`), id).
				Scan(&state, &token); err != nil {
				t.Fatal(err)
			}
			switch {
			case i < 2 && (state != pgState(StateActive) || token == nil || *token != got[id]):
				t.Fatalf("job %d: state %d, lease %v; want active with the token its pull was given, %s", i, state, token, got[id])
			case i == 2 && handed == 2 && state != pgState(StateWaiting):
				t.Fatalf("the job no pull slept for was made %d, want %d (waiting)", state, pgState(StateWaiting))
			}
		}
		if handed == 2 {
			next, _ := takePull(t, pgOwnedPull(t, ctx, p, q, 20000), "the next pull")
			if len(next) != 1 || next[0] != ids[2] {
				t.Fatalf("the next pull was given %v, want the third job %s", next, ids[2])
			}
			return
		}
		if try == 4 {
			t.Fatalf("none of %d pushes of three jobs to two sleeping pulls handed them two (last: %d)", try+1, handed)
		}
	}
}

// TestPGHandGivesTheOldest: a push whose jobs' times run backwards (a
// client's timestamp option) hands the sleeping pull the one first in
// claim order, not the first pushed. Handing in push order gave the pull
// the later job and left the older one waiting (found in review).
func TestPGHandGivesTheOldest(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	for try := 0; ; try++ {
		q := fmt.Sprintf("oldest%d", try)
		pull := pgOwnedPull(t, ctx, p, q, 20000)
		pgSleeping(t, p, q, 1)
		before := p.handed.Load()
		now := p.now()
		later := mustJobAt(t, q, map[string]any{"data": "later", "timestamp": now - 1000}, now)
		older := mustJobAt(t, q, map[string]any{"data": "older", "timestamp": now - 60000}, now)
		if _, _, err := p.Push(ctx, q, []*Job{later, older}, false).Wait(); err != nil {
			t.Fatal(err)
		}
		if got, _ := takePull(t, pull, "the push"); len(got) != 1 || got[0] != older.ID() {
			t.Fatalf("the sleeping pull was given %v, want the older job %s (the later is %s)", got, older.ID(), later.ID())
		}
		if got, _ := takePull(t, pgOwnedPull(t, ctx, p, q, 20000), "the next pull"); len(got) != 1 || got[0] != later.ID() {
			t.Fatalf("the next pull was given %v, want the later job %s", got, later.ID())
		}
		if p.handed.Load() == before+1 {
			return
		}
		if try == 4 {
			t.Fatalf("none of %d pushes of two jobs to a sleeping pull handed it one", try+1)
		}
	}
}

// TestPGHandKeepsClaimOrder: a push does not hand its job while an older
// job of the queue is ready (here one written without waking anyone, as a
// job come due or another broker's push may be for a moment): the pull
// is given the older job, as a claim gives it, and the next pull the new
// one. Nor does a push hand a job of a paused queue.
func TestPGHandKeepsClaimOrder(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	const q = "order"
	pull := pgOwnedPull(t, ctx, p, q, 20000)
	pgSleeping(t, p, q, 1)
	old := mustJob(t, q, map[string]any{"data": "old"})
	now := p.now()
	pgAdmit(old, now)
	var rows pgRows
	rows.add(old, nil, now)
	if _, err := p.pool.Exec(ctx, p.sql(pgInsertSQL), rows.args(q)...); err != nil {
		t.Fatal(err)
	}
	ids, _, err := p.Push(ctx, q, []*Job{mustJob(t, q, map[string]any{"data": "new"})}, false).Wait()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := takePull(t, pull, "the push"); len(got) != 1 || got[0] != old.ID() {
		t.Fatalf("the sleeping pull was given %v, want the older job %s", got, old.ID())
	}
	if got, _ := takePull(t, pgOwnedPull(t, ctx, p, q, 20000), "the next pull"); len(got) != 1 || got[0] != ids[0] {
		t.Fatalf("the next pull was given %v, want the new job %s", got, ids[0])
	}

	if err := p.SetPaused(ctx, q, true); err != nil {
		t.Fatal(err)
	}
	pull = pgOwnedPull(t, ctx, p, q, 20000)
	pgSleeping(t, p, q, 1)
	ids, _, err = p.Push(ctx, q, []*Job{mustJob(t, q, map[string]any{"data": "paused"})}, false).Wait()
	if err != nil {
		t.Fatal(err)
	}
	var state int16
	if err := p.pool.QueryRow(ctx, p.sql(`SELECT state FROM {s}.jobs WHERE id = $1`), ids[0]).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if state != pgState(StateWaiting) {
		t.Fatalf("a job pushed to a paused queue was made %d, want %d (waiting)", state, pgState(StateWaiting))
	}
	if err := p.SetPaused(ctx, q, false); err != nil {
		t.Fatal(err)
	}
	if got, _ := takePull(t, pull, "the resume"); len(got) != 1 || got[0] != ids[0] {
		t.Fatalf("after the resume the pull was given %v, want %s", got, ids[0])
	}
}

// TestPGAcksShareRounds: ACKs sent at the same moment by twenty workers
// are written in a round or two (one statement and one commit each), not
// a round each; every one applies. Before, four lanes each took an ACK
// as it came: five rounds for twenty.
func TestPGAcksShareRounds(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	const q, n = "acks", 20
	jobs := make([]*Job, n)
	for i := range jobs {
		jobs[i] = mustJob(t, q, map[string]any{"data": i})
	}
	if _, _, err := p.Push(ctx, q, jobs, true).Wait(); err != nil {
		t.Fatal(err)
	}
	ids, toks := takePull(t, pgOwnedPullN(t, ctx, p, q, n, 0), "the pull")
	if len(ids) != n {
		t.Fatalf("pulled %d jobs, want %d", len(ids), n)
	}
	before := p.acksRun.Load()
	start := make(chan struct{})
	outs := make([]Outcome, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			outs[i], errs[i] = p.Ack(ctx, AckItem{ID: ids[i], Token: toks[i]})
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil || outs[i] != Applied {
			t.Fatalf("ACK %d: %v %v", i, outs[i], errs[i])
		}
	}
	rounds := p.acksRun.Load() - before
	t.Logf("%d rounds for %d ACKs", rounds, n)
	if rounds > 4 {
		t.Fatalf("%d ACK rounds for %d ACKs sent at once, want a few", rounds, n)
	}
}

// TestPGAcksOnOneConnectionShareRounds: ACKs sent together on one
// connection, as a worker pool's share a few connections, are read
// while the first waits for its commit and share its next round. Before,
// the connection's reader waited on each ACK in turn: twenty ACKs made
// twenty rounds, one commit each.
func TestPGAcksOnOneConnectionShareRounds(t *testing.T) {
	t.Parallel()
	srv := startPGInProcess(t, testPGURL(), pgTestNamespace(t), nil, pgOptions{})
	c := dial(t, srv.addr)
	defer c.close()
	const q, n = "acks-one-conn", 20
	jobs := make([]any, n)
	for i := range jobs {
		jobs[i] = M{"data": M{"i": i}}
	}
	c.ok(M{"cmd": "PUSHB", "queue": q, "jobs": jobs})
	ids, toks := pullOwnedWire(t, c, q, n)
	acks := make([]M, n)
	for i := range acks {
		acks[i] = M{"cmd": "ACK", "id": ids[i], "token": toks[i]}
	}
	before := srv.pg.acksRun.Load()
	sendTogether(t, c, acks)
	rounds := srv.pg.acksRun.Load() - before
	t.Logf("%d rounds for %d ACKs on one connection", rounds, n)
	if rounds > n/2 {
		t.Fatalf("%d ACK rounds for %d ACKs sent together on one connection, want them to share rounds", rounds, n)
	}
	if cnt := c.ok(M{"cmd": "GetJobCounts", "queue": q}); fmt.Sprint(cnt["counts"].(map[string]any)["completed"]) != fmt.Sprint(n) {
		t.Fatalf("counts after the ACKs: %v", cnt)
	}
}

// TestPGFailThenCloseCounts: a FAIL sent just before the client closes
// its connection still counts. FAIL runs off the connection's reader in
// PostgreSQL mode; run on the connection's context, the close cancelled
// its transaction, and the job was then released as if it had not
// failed: a job of one attempt went back to waiting instead of failing,
// and a worker that failed and exited each time retried it for ever.
func TestPGFailThenCloseCounts(t *testing.T) {
	t.Parallel()
	srv := startPGInProcess(t, testPGURL(), pgTestNamespace(t), nil, pgOptions{})
	look := dial(t, srv.addr)
	defer look.close()
	const q, n = "fail-close", 5
	ids := make([]string, n)
	for i := range ids {
		ids[i] = look.ok(M{"cmd": "PUSH", "queue": q, "data": M{"i": i}, "maxAttempts": 1})["id"].(string)
	}
	for i := range n {
		w := dial(t, srv.addr)
		pulled := w.ok(M{"cmd": "PULL", "queue": q, "owner": "w", "lockTtl": 60000})
		job, _ := pulled["job"].(map[string]any)
		if job == nil {
			t.Fatalf("pull %d: %v", i, pulled)
		}
		// The FAIL and the close, with no wait for the answer between.
		w.writeRaw(appendFrame(nil, M{"cmd": "FAIL", "id": job["id"], "token": pulled["token"], "error": "boom"}))
		w.close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range ids {
		for {
			st := look.ok(M{"cmd": "GetState", "id": id})["state"]
			if st == "failed" {
				break
			}
			if st != "active" {
				t.Fatalf("job %s is %v after its one attempt failed and its worker closed, want failed", id, st)
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s still active 30 s after its FAIL", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestPGAcksPastTheReaderBound: ACKs whose results are more than
// offReaderMaxBytes together, sent at once on one connection, all
// complete with their results: those past the bound run on the reader.
func TestPGAcksPastTheReaderBound(t *testing.T) {
	t.Parallel()
	srv := startPGInProcess(t, testPGURL(), pgTestNamespace(t), nil, pgOptions{})
	c := dial(t, srv.addr)
	defer c.close()
	const q, n = "acks-big", 4
	size := offReaderMaxBytes/2 + 1024 // two of them pass the bound
	for i := range n {
		c.ok(M{"cmd": "PUSH", "queue": q, "data": M{"i": i}})
	}
	ids, toks := pullOwnedWire(t, c, q, n)
	acks := make([]M, n)
	for i := range acks {
		acks[i] = M{"cmd": "ACK", "id": ids[i], "token": toks[i], "result": M{"blob": strings.Repeat(string(rune('a'+i)), size)}}
	}
	sendTogether(t, c, acks)
	for i, id := range ids {
		res := c.ok(M{"cmd": "GetResult", "id": id})
		blob, _ := res["result"].(map[string]any)["blob"].(string)
		if len(blob) != size || blob[0] != byte('a'+i) {
			t.Fatalf("job %d's result: %d bytes of %q, want %d of %q", i, len(blob), blob[:min(len(blob), 1)], size, string(rune('a'+i)))
		}
	}
}

// pullOwnedWire pulls n jobs of queue over the wire with one PULLB and a
// lock owner, and answers their ids and tokens.
func pullOwnedWire(t *testing.T, c *tclient, queue string, n int) (ids, tokens []string) {
	t.Helper()
	pulled := c.ok(M{"cmd": "PULLB", "queue": queue, "count": n, "owner": "w", "lockTtl": 30000})
	jobs, _ := pulled["jobs"].([]any)
	toks, _ := pulled["tokens"].([]any)
	if len(jobs) != n || len(toks) != n {
		t.Fatalf("pulled %d jobs and %d tokens, want %d: %v", len(jobs), len(toks), n, pulled)
	}
	for i, j := range jobs {
		ids = append(ids, j.(map[string]any)["id"].(string))
		tokens = append(tokens, toks[i].(string))
	}
	return ids, tokens
}

// sendTogether writes the requests in one write, so that the server
// reads them together, and fails the test unless each is answered ok.
func sendTogether(t *testing.T, c *tclient, reqs []M) {
	t.Helper()
	var buf []byte
	ids := make([]string, len(reqs))
	chs := make([]chan map[string]any, len(reqs))
	for i, m := range reqs {
		ids[i], chs[i] = c.prepare(m)
		buf = appendFrame(buf, m)
	}
	c.writeRaw(buf)
	for i := range reqs {
		if a := c.await(ids[i], chs[i], callTimeout); a["ok"] != true {
			t.Fatalf("%v %d: %v", reqs[i]["cmd"], i, a)
		}
	}
}
