package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"testing"
	"time"
)

// openTestPG opens an in-process broker on namespace ns, with a tap that
// reports the ids of the pushed events it hears.
func openTestPG(t *testing.T, ctx context.Context, ns string, o pgOptions) (*PG, chan string) {
	t.Helper()
	b := NewBroker()
	t.Cleanup(b.Close)
	heard := make(chan string, 256)
	b.addTap(func(ev *Event) {
		if ev.Name() == "pushed" {
			select {
			case heard <- ev.ID():
			default:
			}
		}
	})
	p, err := openPG(ctx, testPGURL(), ns, b, quietLog(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, heard
}

// hear waits for the pushed event of id on a tap.
func hear(t *testing.T, heard chan string, id, who string) {
	t.Helper()
	for deadline := time.After(20 * time.Second); ; {
		select {
		case got := <-heard:
			if got == id {
				return
			}
		case <-deadline:
			t.Fatalf("%s did not hear job %s pushed", who, id)
		}
	}
}

// TestPGPeersForwardOnlyToListeners: a broker alone on its namespace sends
// no notification for what it does; a second broker that opens is
// answered before it serves, so it hears the first one's events from its
// first moment; once it is gone, the first is alone again. A broker of an
// older version (no presence lock) is noticed by the events it sends.
func TestPGPeersForwardOnlyToListeners(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// The hello waits for its replies as long as the test runs, so that a
	// loaded machine cannot turn a late reply into a missed event.
	o := pgOptions{helloWait: time.Minute}
	a, heardA := openTestPG(t, ctx, ns, o)
	a.peers.mu.Lock()
	a.peers.quiet = 0
	a.peers.mu.Unlock()
	eventually(t, 20*time.Second, "alone", func() (bool, string) { return !a.forwarding(), "forwarding" })

	push := func(p *PG) string {
		t.Helper()
		j := mustJob(t, "pe", map[string]any{"data": 1})
		ids, _, err := p.Push(ctx, "pe", []*Job{j}, false).Wait()
		if err != nil || len(ids) != 1 {
			t.Fatalf("push: %v %v", ids, err)
		}
		return ids[0]
	}
	sent := a.ev.sent.Load()
	for range 20 {
		hear(t, heardA, push(a), "the broker itself")
	}
	a.ev.mu.Lock()
	pending := len(a.ev.pending) + len(a.ev.wakes)
	a.ev.mu.Unlock()
	if got := a.ev.sent.Load(); got != sent || pending != 0 {
		t.Fatalf("alone, the broker sent %d notifications and has %d pending for 20 pushes", got-sent, pending)
	}

	// B opens: A forwards before B serves.
	b, heardB := openTestPG(t, ctx, ns, o)
	if !a.forwarding() {
		t.Fatal("a second broker opened and the first still thinks it is alone")
	}
	b.peers.mu.Lock()
	answered := b.peers.answered
	b.peers.mu.Unlock()
	if answered != 1 {
		t.Fatalf("the second broker had %d replies to its hello, want 1", answered)
	}
	id := push(a)
	hear(t, heardB, id, "the second broker")
	if a.ev.sent.Load() == sent {
		t.Fatal("with a second broker listening, the first sent no notification")
	}

	// B goes: A is alone again at its next count.
	b.Close()
	eventually(t, 20*time.Second, "alone once the second broker closed", func() (bool, string) { return !a.forwarding(), "forwarding" })

	// A broker of an older version holds no lock; an event from it turns
	// forwarding on, and it stays on for pgPeerQuiet after the last one.
	a.peers.mu.Lock()
	a.peers.quiet = time.Hour
	a.peers.mu.Unlock()
	_, conn := pgTestConn(t)
	notifyPushed(t, ctx, conn, a.evName, "old-broker", "pe", "old-1")
	hear(t, heardA, "old-1", "the broker")
	if !a.forwarding() {
		t.Fatal("an event from a broker that holds no lock left this one alone")
	}
	// Its next count still finds it the only holder: it keeps forwarding.
	peerRound(t, ctx, a)
	if !a.forwarding() {
		t.Fatal("a count of the lock holders ended forwarding within pgPeerQuiet of an older broker's event")
	}
}

// peerRound runs one count of the brokers listening, as the loop does.
func peerRound(t *testing.T, ctx context.Context, p *PG) {
	t.Helper()
	p.peers.mu.Lock()
	pid := p.peers.pid
	p.peers.mu.Unlock()
	if pid == 0 {
		t.Fatal("the broker's listener holds no presence lock")
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	p.peerRound(rctx)
}

// TestPGPeersListenerLost: a broker whose listener connection is gone
// cannot tell who listens, and forwards until it is back; so does one
// whose listener's session the database does not show holding the lock
// (cut off, and not noticed yet).
func TestPGPeersListenerLost(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	a, _ := openTestPG(t, ctx, ns, pgOptions{})
	a.peers.mu.Lock()
	a.peers.quiet = 0
	a.peers.mu.Unlock()
	eventually(t, 20*time.Second, "alone", func() (bool, string) { return !a.forwarding(), "forwarding" })

	// The database shows another session where this broker believes its
	// listener is: the count proves nothing, it forwards.
	// (gen moves on with each change, as the broker's own changes do, so
	// that a count of the broker's own loop in flight is not kept.)
	a.peers.mu.Lock()
	pid := a.peers.pid
	a.peers.pid = -1
	a.peers.gen++
	a.peers.mu.Unlock()
	peerRound(t, ctx, a)
	if !a.forwarding() {
		t.Fatal("alone by a count that did not find this broker's own listener")
	}
	a.peers.mu.Lock()
	if a.peers.pid == -1 {
		a.peers.pid = pid
		a.peers.gen++
	}
	a.peers.mu.Unlock()
	peerRound(t, ctx, a)
	if a.forwarding() {
		t.Fatal("not alone again by a count that found its listener alone")
	}

	// The test takes the lock exclusively as soon as the listener's
	// session ends, so that the listener cannot take it again until the
	// test lets it: meanwhile the broker forwards.
	_, locker := pgTestConn(t)
	_, killer := pgTestConn(t)
	locked := make(chan error, 1)
	go func() {
		_, err := locker.Exec(ctx, `SELECT pg_advisory_lock($1, $2)`, pgPeerClass, a.peers.key)
		locked <- err
	}()
	eventually(t, 20*time.Second, "the test's lock request waiting", func() (bool, string) {
		var n int
		err := killer.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2`, pgPeerClass, a.peers.key).Scan(&n)
		return err == nil && n == 1, fmt.Sprint(n, err)
	})
	if _, err := killer.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2`, pgPeerClass, a.peers.key); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "forwarding with the listener gone", func() (bool, string) { return a.forwarding(), "alone" })
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	a.peerRound(rctx) // a round while the listener cannot take its lock changes nothing
	rcancel()
	if !a.forwarding() {
		t.Fatal("alone while its listener holds no lock")
	}
	if _, err := locker.Exec(ctx, `SELECT pg_advisory_unlock($1, $2)`, pgPeerClass, a.peers.key); err != nil {
		t.Fatal(err)
	}
	// It listens again, holds the lock again, and is alone again.
	eventually(t, 30*time.Second, "alone once the listener is back", func() (bool, string) { return !a.forwarding(), "forwarding" })
}

// TestPeerPayloadsAreEmptyBatches: a hello and its reply read, to a
// broker of an older version, as batches of no events.
func TestPeerPayloadsAreEmptyBatches(t *testing.T) {
	t.Parallel()
	for _, body := range []string{pgHello, pgReply} {
		b, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		items, err := Raw(b).Array()
		if err != nil || len(items) != 0 {
			t.Fatalf("%q reads as %v, %v; want an empty array", body, items, err)
		}
	}
	if pgHello == pgReply {
		t.Fatal("a hello and a reply look the same")
	}
}
