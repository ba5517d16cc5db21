package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestPGEventsAcrossBrokers: a subscriber hears what happens to a queue
// through any broker, each event once, in the order one broker made them.
func TestPGEventsAcrossBrokers(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	a, b := startPGBroker(t, ns), startPGBroker(t, ns)
	ca, cb := dial(t, a.addr()), dial(t, b.addr())
	subA, subB := dial(t, a.addr()), dial(t, b.addr())
	subA.ok(M{"cmd": "SubscribeEvents", "queue": "ev"})
	subB.ok(M{"cmd": "SubscribeEvents", "queue": "ev"})

	// Pushed through A, claimed and acknowledged through B, with progress.
	id := push(t, ca, "ev", nil)
	_, tok := pullOwned(t, cb, "ev", nil)
	cb.ok(M{"cmd": "Progress", "id": id, "progress": 50, "message": "half"})
	cb.ok(M{"cmd": "ACK", "id": id, "token": tok, "result": M{"r": 1}})
	// A result too large for one notification: the event still arrives.
	big := push(t, ca, "ev", nil)
	_, tok = pullOwned(t, ca, "ev", nil)
	ca.ok(M{"cmd": "ACK", "id": big, "token": tok, "result": M{"blob": strings.Repeat("x", 9000)}})

	// Events made by one broker keep their order; those made on different
	// brokers may interleave either way (by the time a NOTIFY takes).
	want := map[string][]string{
		id:  {"pushed", "pulled", "progress", "completed"},
		big: {"pushed", "pulled", "completed"},
	}
	for name, s := range map[string]*tclient{"A": subA, "B": subB} {
		got := map[string][]string{}
		for range 7 {
			ev := s.event(10 * time.Second)
			jid, _ := ev["jobId"].(string)
			typ, _ := ev["eventType"].(string)
			got[jid] = append(got[jid], typ)
			if ev["queue"] != "ev" {
				t.Errorf("subscriber on %s: event on queue %v", name, ev["queue"])
			}
			switch {
			case typ == "progress" && toFloat(ev["progress"]) != 50:
				t.Errorf("subscriber on %s: progress event %v", name, ev)
			case typ == "completed" && jid == id && !reflect.DeepEqual(ev["data"], M{"r": int64(1)}):
				t.Errorf("subscriber on %s: completed data %#v", name, ev["data"])
			}
		}
		// B made pulled, progress and completed itself and heard pushed
		// from A: that one may come anywhere among them (by the time the
		// NOTIFY takes on a loaded machine), the others keep their order.
		if g := got[id]; name == "B" && len(g) > 0 && g[0] != "pushed" {
			if at := slices.Index(g, "pushed"); at > 0 {
				t.Logf("subscriber on B heard A's pushed after %v", g[:at])
				got[id] = append([]string{"pushed"}, slices.Delete(slices.Clone(g), at, at+1)...)
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("subscriber on %s heard %v, want %v", name, got, want)
		}
	}

	// Broker B's counters count what B did, not what it heard.
	// B claimed and completed the first job; A pushed both, and did the
	// second itself.
	m := sub(t, cb.ok(M{"cmd": "Metrics"}), "metrics")
	if num(t, m["totalPushed"]) != 0 || num(t, m["totalPulled"]) != 1 || num(t, m["totalCompleted"]) != 1 {
		t.Errorf("metrics on B count events heard from A: %v", m)
	}

	// Each event once: nothing else arrives. A marker pushed through the
	// other broker is heard after every notification sent before it
	// (they come in the order they were committed); the marker pushed
	// through the subscriber's own broker may come anywhere.
	markA := push(t, cb, "ev", nil) // heard by A's subscriber from B
	markB := push(t, ca, "ev", nil) // heard by B's subscriber from A
	for name, s := range map[string]*tclient{"A": subA, "B": subB} {
		remote, local := markA, markB
		if name == "B" {
			remote, local = markB, markA
		}
		// Both markers, each once: the local one may come after the
		// remote one, so the reading goes on until both are in.
		seen := map[string]int{}
		for seen[remote] == 0 || seen[local] == 0 {
			ev := s.event(10 * time.Second)
			jid, _ := ev["jobId"].(string)
			if ev["eventType"] != "pushed" || (jid != remote && jid != local) {
				t.Errorf("subscriber on %s: extra event %v", name, ev)
				continue
			}
			if seen[jid]++; seen[jid] > 1 {
				t.Errorf("subscriber on %s: marker %s twice", name, jid)
			}
		}
	}
}

// TestRemoteEventRoundTrip: every field of an event survives the trip
// through a notification, and an oversized one loses only its data.
func TestRemoteEventRoundTrip(t *testing.T) {
	t.Parallel()
	j := withID(&Job{Data: Raw{0x81, 0xa1, 'k', 0x01}}, "j1")
	all := evArgs{data: Raw{0x2a}, err: "boom", hasErr: true, terminal: true, hasTerminal: true,
		prev: "failed", delay: 1500, hasDelay: true, stallCount: 2, action: "retry",
		progress: Raw{0x32}, progMsg: "m", hasProgMsg: true}
	for _, tc := range []struct {
		t    evType
		j    *Job
		a    evArgs
		trim bool
	}{
		{evFailed, j, all, false},
		{evCompleted, j, evArgs{undefData: true}, false},
		{evPaused, nil, evArgs{}, false},
		{evProgress, j, evArgs{progress: Raw{0x32}}, true},
		{evCompleted, j, evArgs{data: Raw{0x2a}}, true},
	} {
		var e Enc
		encodeRemoteEvent(&e, "q", tc.t, tc.j, 77, tc.a, tc.trim)
		ev, err := decodeRemoteEvent(e.B)
		if err != nil {
			t.Fatalf("%s: decode: %v", evNames[tc.t], err)
		}
		if ev.queue != "q" || ev.t != tc.t || ev.at != 77 || (ev.job == nil) != (tc.j == nil) {
			t.Fatalf("%s: decoded %+v", evNames[tc.t], ev)
		}
		want := tc.a
		want.remote = true
		switch {
		case tc.trim && tc.t == evCompleted:
			want.data, want.undefData = nil, true
		case tc.trim && tc.t == evProgress:
			want.progress = Raw{0xc0}
		}
		if !reflect.DeepEqual(ev.args, want) {
			t.Errorf("%s: args %+v, want %+v", evNames[tc.t], ev.args, want)
		}
		if tc.t == evFailed && !bytes.Equal(ev.job.Data, j.Data) {
			t.Errorf("failed event job data %x", ev.job.Data)
		}
	}
	if _, err := decodeRemoteEvent(Raw{0x81, 0xa1, 't', 0x7f}); err == nil {
		t.Error("an unknown event type was accepted")
	}
}

// TestPGListensBeforeServing: a broker hears the other brokers' events
// from the moment it is open. It used to start its LISTEN in the
// background, so that an event sent in its first milliseconds was lost
// (a subscriber that connected at once missed it: TestPGEventsAcrossBrokers
// failed now and then on a busy machine).
func TestPGListensBeforeServing(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The other broker's connection is ready before this one opens, so
	// that its NOTIFY follows the open as closely as it can.
	other, err := pgx.Connect(ctx, testPGURL())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	b := NewBroker()
	defer b.Close()
	heard := make(chan string, 8)
	b.addTap(func(ev *Event) {
		select {
		case heard <- ev.Name() + " " + ev.ID():
		default:
		}
	})
	p, err := OpenPG(ctx, testPGURL(), ns, b, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	notifyPushed(t, ctx, other, p.evName, "another-broker", "q", "j1")
	select {
	case got := <-heard:
		if got != "pushed j1" {
			t.Fatalf("heard %q, want the pushed event of j1", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an event another broker sent right after this one opened was not heard")
	}
}

// notifyPushed sends, as broker from would, the pushed event of job id
// on queue to the brokers listening on channel.
func notifyPushed(t *testing.T, ctx context.Context, conn *pgx.Conn, channel, from, queue, id string) {
	t.Helper()
	var e Enc
	e.ArrayHead(1)
	encodeRemoteEvent(&e, queue, evPushed, withID(&Job{}, id), nowMs(), evArgs{}, false)
	if _, err := conn.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, from+" "+base64.StdEncoding.EncodeToString(e.B)); err != nil {
		t.Fatal(err)
	}
}
