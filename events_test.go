package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestEventIDMadeForTaps: a shard's event names its job's id only when a
// tap asks (Event.ID), for a UUID id kept as bytes and for a custom id
// alike; a copy a tap keeps after asking still names it once the shard
// has moved on, and an event no tap asked about never made the text.
func TestEventIDMadeForTaps(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	var asked, kept []Event
	var unasked []string
	b.addTap(func(ev *Event) {
		if ev.Type != evPushed {
			return
		}
		unasked = append(unasked, ev.JobID) // before anyone asked
		ev.ID()
		kept = append(kept, *ev)
		asked = append(asked, Event{JobID: ev.ID()})
	})
	uuidJob := mustJob(t, "ev", map[string]any{"name": "a", "data": int64(1)})
	customJob := mustJob(t, "ev", map[string]any{"name": "b", "data": int64(2), "jobId": "order-42"})
	res := b.pushJobs("ev", []*Job{uuidJob, customJob}, nil)
	if len(res) != 2 || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("push: %+v", res)
	}
	want := []string{res[0].ID, "order-42"}
	if len(asked) != 2 || len(kept) != 2 {
		t.Fatalf("the tap saw %d pushed events, want 2", len(asked))
	}
	for i, w := range want {
		if asked[i].JobID != w || kept[i].JobID != w {
			t.Fatalf("event %d named %q (kept copy %q), want %q", i, asked[i].JobID, kept[i].JobID, w)
		}
		if unasked[i] != "" {
			t.Fatalf("event %d carried its id text %q before a tap asked", i, unasked[i])
		}
	}
	if len(want[0]) != 36 || uuidJob.id == ([16]byte{}) {
		t.Fatalf("the broker's id %q is not kept as 16 bytes", want[0])
	}
}

// TestEventAfterSubscriptionMoved: an emit reads the subscribers without a
// lock, so it may still hold a connection that has since moved to another
// queue; that connection drops the old queue's event, and hears the new
// queue's.
func TestEventAfterSubscriptionMoved(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	addr := serveTest(t, memServer(b, nil, quietLog()), b.Close)
	c := dial(t, addr)
	c.ok(M{"cmd": "SubscribeEvents", "queue": "old"})
	held := b.subs.of("old") // what an emit under way read
	if len(held) != 1 {
		t.Fatalf("%d subscribers of old", len(held))
	}
	c.ok(M{"cmd": "SubscribeEvents", "queue": "new"})
	frame := encodeEventFrame(nil, "old", evPushed, nil, 1, evArgs{})
	held[0].pushEvent("old", frame) // the emit goes on
	p := dial(t, addr)
	p.ok(M{"cmd": "PUSH", "queue": "new", "data": 1})
	if ev := c.event(10 * time.Second); ev["queue"] != "new" {
		t.Fatalf("first event after moving: %v", ev)
	}
}

// TestSubscribeEventsNeedsASocket: SubscribeEvents on a connection
// without a socket (a WebSocket's or an HTTP request's commands run on
// one) is refused. It started an event writer with nothing to write to,
// and the first event took the process down (a nil socket written in a
// goroutine of its own; found by FuzzCommands). Events on the queue go on.
func TestSubscribeEventsNeedsASocket(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	srv := memServer(b, nil, quietLog())
	c := newVirtualConn(srv, context.Background(), "t", func([]byte) {}, false)
	defer c.finishVirtual()
	var req Enc
	mp := req.OpenMap()
	for _, kv := range [][2]string{{"cmd", "SubscribeEvents"}, {"queue", "q"}, {"reqId", "r1"}} {
		req.Str(kv[0])
		req.Str(kv[1])
	}
	req.CloseMap(mp, 3)
	m, err := parseRequest(req.B, nil, maxRequestFields)
	if err != nil {
		t.Fatal(err)
	}
	var e Enc
	c.dispatch(m, &e)
	v, err := Decode(e.B[4:])
	if err != nil {
		t.Fatal(err)
	}
	ans := v.(map[string]any)
	if ans["ok"] != false || !strings.Contains(ans["error"].(string), "needs a TCP connection") {
		t.Fatalf("SubscribeEvents without a socket: %v", ans)
	}
	if _, subscribed := c.sub(); subscribed {
		t.Fatal("the connection is subscribed")
	}
	if _, err := srv.localSend(context.Background(), "PUSH", func(e *Enc) int {
		e.Str("queue")
		e.Str("q")
		e.Str("data")
		e.Int(1)
		return 2
	}); err != nil {
		t.Fatal(err)
	}
}
