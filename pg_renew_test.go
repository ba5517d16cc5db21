package main

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// pgLeaseRow reads a job's state, lease end and renewal count.
func pgLeaseRow(t *testing.T, ctx context.Context, p *PG, id string) (state int16, expires int64, renewals int32) {
	t.Helper()
	if err := p.pool.QueryRow(ctx, p.sql(`SELECT state, coalesce(lease_expires, 0), lease_renewals FROM {s}.jobs WHERE id = $1`), id).
		Scan(&state, &expires, &renewals); err != nil {
		t.Fatal(err)
	}
	return state, expires, renewals
}

// pgPullHeld pushes a job to queue and pulls it through c with an owner
// and a lock of ttl ms, as a connection's pull does; it answers the job's
// id and token, and when the pull's claim began.
func pgPullHeld(t *testing.T, ctx context.Context, p *PG, c *conn, queue string, ttl int64) (id, token string, at time.Time) {
	t.Helper()
	if _, _, err := p.Push(ctx, queue, []*Job{mustJob(t, queue, map[string]any{"data": 1})}, false).Wait(); err != nil {
		t.Fatal(err)
	}
	at = time.Now()
	answer := func(jobs []*Job, tokens []string) { id, token = jobs[0].ID(), tokens[0] }
	wait, err := p.Pull(ctx, queue, 1, PullOpts{Owner: "w", TTL: ttl, Conn: c}, 5000, answer)
	if err != nil {
		t.Fatal(err)
	}
	if wait != nil {
		if _, err := wait(answer); err != nil {
			t.Fatal(err)
		}
	}
	if id == "" {
		t.Fatal("the pull was given no job")
	}
	return id, token, at
}

// TestPGRenewalOfAFreshLease: the official Worker renews the lock of each
// batch it pulls as soon as it has it. A renewal of a lock this broker
// wrote moments ago, which would move its end by less than the slack, is
// answered without a write (before, each was an UPDATE and a commit):
// the row keeps its lease, and the count of renewals is written with the
// next renewal that is. A renewal asking for a longer lock, or coming
// later, is written; one with the wrong token, or for a lock finished
// through this broker, renews nothing. And a job whose lock was renewed
// so is trusted to be alive, as after a write: its connection's close
// leaves it active, where a job never renewed goes back to its queue.
func TestPGRenewalOfAFreshLease(t *testing.T) {
	t.Parallel()
	ctx, _, p := waitTestBroker(t, 60*time.Second)
	const q, ttl = "renew", 30000
	c := &conn{}
	var id, tok string
	var exp int64
	for try := 0; ; try++ {
		var at time.Time
		id, tok, at = pgPullHeld(t, ctx, p, c, q, ttl)
		_, exp, _ = pgLeaseRow(t, ctx, p, id)
		n, err := p.Heartbeat(ctx, renewals{ids: []string{id}, tokens: []string{tok}, durations: []int64{0}})
		if err != nil || n != 1 {
			t.Fatalf("a renewal with the token: %d renewed, %v", n, err)
		}
		_, exp2, count := pgLeaseRow(t, ctx, p, id)
		if exp2 == exp && count == 0 {
			break
		}
		// Written: only right if the renewal came past the slack (a
		// loaded machine), so another job is tried.
		if time.Since(at) <= time.Duration(renewSlack(ttl))*time.Millisecond || try == 4 {
			t.Fatalf("a renewal right after the claim was written: lease end %d -> %d, renewals %d", exp, exp2, count)
		}
	}

	// A longer lock is written at once, with the renewal answered before.
	n, err := p.Heartbeat(ctx, renewals{ids: []string{id}, tokens: []string{tok}, durations: []int64{ttl * 2}})
	if err != nil || n != 1 {
		t.Fatalf("a renewal for a longer lock: %d renewed, %v", n, err)
	}
	if _, exp2, count := pgLeaseRow(t, ctx, p, id); exp2 < exp+ttl/2 || count != 2 {
		t.Fatalf("after a renewal for twice the TTL: lease end %d (was %d), renewals %d; want it later by about %d ms, and 2", exp2, exp, count, ttl)
	}
	// After the write, every renewal is written.
	if n, err := p.Heartbeat(ctx, renewals{ids: []string{id}, tokens: []string{tok}, durations: []int64{0}}); err != nil || n != 1 {
		t.Fatalf("a renewal after a write: %d renewed, %v", n, err)
	}
	if _, _, count := pgLeaseRow(t, ctx, p, id); count != 3 {
		t.Fatalf("renewals %d after a third renewal, want 3", count)
	}
	if n, err := p.Heartbeat(ctx, renewals{ids: []string{id}, tokens: []string{"wrong"}, durations: []int64{0}}); err != nil || n != 0 {
		t.Fatalf("a renewal with the wrong token: %d renewed, %v", n, err)
	}
	if out, err := p.Ack(ctx, AckItem{ID: id, Token: tok}); err != nil || out != Applied {
		t.Fatalf("ACK: %v %v", out, err)
	}
	if n, err := p.Heartbeat(ctx, renewals{ids: []string{id}, tokens: []string{tok}, durations: []int64{0}}); err != nil || n != 0 {
		t.Fatalf("a renewal of a completed job: %d renewed, %v", n, err)
	}

	// Moved back to waiting through this broker, the job's lock renews
	// nothing, right after the claim as later.
	movedID, movedTok, _ := pgPullHeld(t, ctx, p, c, "renew-moved", ttl)
	if err := p.MoveJob(ctx, movedID, JobMove{Kind: MoveToWait, Token: movedTok}); err != nil {
		t.Fatal(err)
	}
	if n, err := p.Heartbeat(ctx, renewals{ids: []string{movedID}, tokens: []string{movedTok}, durations: []int64{0}}); err != nil || n != 0 {
		t.Fatalf("a renewal of a job moved back to waiting: %d renewed, %v", n, err)
	}

	// Release on close: renewed without a write, the job stays active;
	// never renewed, it goes back to its queue.
	for try := 0; ; try++ {
		kept, closed := &conn{}, &conn{}
		rq := fmt.Sprint("renew-close-", try)
		keptID, keptTok, _ := pgPullHeld(t, ctx, p, kept, rq, ttl)
		if n, err := p.Heartbeat(ctx, renewals{ids: []string{keptID}, tokens: []string{keptTok}, durations: []int64{0}}); err != nil || n != 1 {
			t.Fatalf("a renewal with the token: %d renewed, %v", n, err)
		}
		backID, _, _ := pgPullHeld(t, ctx, p, closed, rq, ttl)
		p.Release(ctx, kept)
		p.Release(ctx, closed)
		if st, _, _ := pgLeaseRow(t, ctx, p, backID); st != pgState(StateWaiting) {
			t.Fatalf("a job never renewed is in state %d after its connection closed, want waiting", st)
		}
		st, _, count := pgLeaseRow(t, ctx, p, keptID)
		if st != pgState(StateActive) {
			t.Fatalf("a job renewed right after its claim is in state %d after its connection closed, want active", st)
		}
		// Written (a loaded machine): right either way, but the case
		// to show is the renewal answered without a write.
		if count == 0 || try == 4 {
			break
		}
	}
}

// TestPGRenewalWhileAWriteIsUnderWay: once a renewal of a lock goes to
// the database (here one asking for a longer lock), no renewal of it is
// answered without a write, even before that write is done: the write
// may move the lock's end anywhere. The renewals answered before are
// added by the write, and kept for the next one should it fail.
func TestPGRenewalWhileAWriteIsUnderWay(t *testing.T) {
	t.Parallel()
	p := &PG{}
	j := mustJob(t, "q", map[string]any{"data": 1})
	const now, ttl = int64(1_000_000), int64(30000)
	j.setLease(&Lease{Token: "tok", Owner: "w", CreatedAt: now, ExpiresAt: now + ttl, TTL: ttl})
	p.hold(&conn{}, []*Job{j}, []string{"tok"})
	rn := func(dur int64) renewals {
		return renewals{ids: []string{j.ID()}, tokens: []string{"tok"}, durations: []int64{dur}}
	}
	if rest, _, fresh := p.renewFresh(rn(0), now+10); len(fresh) != 1 || len(rest.ids) != 0 {
		t.Fatalf("a renewal 10 ms after the claim: %d answered, %d to write; want 1 and 0", len(fresh), len(rest.ids))
	}
	rest, extra, fresh := p.renewFresh(rn(2*ttl), now+20)
	if len(fresh) != 0 || len(rest.ids) != 1 || extra[0] != 1 {
		t.Fatalf("a renewal for a longer lock: %d answered, %d to write adding %v; want 0, 1 adding [1]", len(fresh), len(rest.ids), extra)
	}
	if rest2, extra2, fresh2 := p.renewFresh(rn(0), now+30); len(fresh2) != 0 || len(rest2.ids) != 1 || extra2[0] != 0 {
		t.Fatalf("a renewal while the write is under way: %d answered, %d to write adding %v; want 0, 1 adding [0]", len(fresh2), len(rest2.ids), extra2)
	}
	p.renewFailed(rest, extra, fresh)
	if _, extra3, _ := p.renewFresh(rn(0), now+40); extra3[0] != 1 {
		t.Fatalf("after a failed write the next write adds %v, want [1]", extra3)
	}
}
