package main

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestPanickingCommandFreesItsShard: a command that panics while it holds
// a shard's lock (here a tap that panics on the event the command emits)
// is answered with an error by the connection's recover, and the shard is
// not left locked: the queue goes on answering.
func TestPanickingCommandFreesItsShard(t *testing.T) {
	t.Parallel()
	// Closed at the end only: with a shard left locked, Close would hang
	// and the test would never report.
	b := NewMemEngine(2, nil)
	var armed atomic.Bool
	b.addTap(func(ev *Event) {
		if armed.Load() && ev.Type == evRemoved {
			panic("a tap fails")
		}
	})
	srv := memServer(b, nil, quietLog())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	c := dial(t, ln.Addr().String())
	c.ok(flowFrame("parent", "pq", "cq", []string{"k1", "k2"}))
	armed.Store(true)
	if msg := c.fail(map[string]any{"cmd": "RemoveUnprocessedChildren", "id": "parent"}); msg != "Internal server error" {
		t.Fatalf("the panicking command answered %q", msg)
	}
	armed.Store(false)
	s := b.shardOf("cq")
	eventually(t, 10*time.Second, "the children's shard unlocked", func() (bool, string) {
		if s.mu.TryLock() {
			s.mu.Unlock()
			return true, ""
		}
		return false, "still locked"
	})
	c.ok(map[string]any{"cmd": "GetJobCounts", "queue": "cq"})
	c.close()
	srv.Close()
	b.Close()
}
