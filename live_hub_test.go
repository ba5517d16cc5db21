package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// hubMux mounts a hub at the reference's paths: /ws, /ws/queues/{q},
// /events, /events/queues/{q}. WebSocket messages are answered with
// "re:" and the message, to show that onMessage runs.
func hubMux(hb *hub) *http.ServeMux {
	reply := func(c *wsConn, op wsOpcode, msg []byte) {
		c.Send(append([]byte("re:"), msg...))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ws", func(w http.ResponseWriter, r *http.Request) { hb.ServeWS(w, r, "", reply) })
	mux.HandleFunc("GET /ws/queues/{q}", func(w http.ResponseWriter, r *http.Request) {
		hb.ServeWS(w, r, r.PathValue("q"), reply)
	})
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) { hb.ServeSSE(w, r, "", nil) })
	mux.HandleFunc("GET /events/queues/{q}", func(w http.ResponseWriter, r *http.Request) {
		hb.ServeSSE(w, r, r.PathValue("q"), nil)
	})
	return mux
}

// startHub serves a hub; at cleanup, the hub closes before the server,
// which would otherwise wait for the SSE handlers.
func startHub(t testing.TB, opts hubOptions) (*hub, string) {
	hb := newHub(opts)
	ts := httptest.NewServer(hubMux(hb))
	t.Cleanup(func() {
		hb.Close()
		ts.Close()
	})
	return hb, ts.Listener.Addr().String()
}

func waitSubscribers(t testing.TB, hb *hub, n int) {
	t.Helper()
	eventually(t, wsTestTimeout, fmt.Sprintf("%d subscribers", n), func() (bool, string) {
		return hb.Subscribers() == n, fmt.Sprint(hb.Subscribers())
	})
}

func TestHubFilters(t *testing.T) {
	t.Parallel()
	hb, addr := startHub(t, hubOptions{})
	wsAll := dialWS(t, addr, "/ws")
	wsA := dialWS(t, addr, "/ws/queues/a")
	sseAll := dialSSE(t, addr, "/events")
	sseB := dialSSE(t, addr, "/events/queues/b")
	waitSubscribers(t, hb, 4)
	if ws, sse := hb.Counts(); ws != 2 || sse != 2 {
		t.Errorf("Counts: %d ws, %d sse", ws, sse)
	}

	hb.PublishEvent("a", "job:pushed", []byte(`{"n":1}`))
	hb.PublishEvent("b", "job:completed", []byte(`{"n":2}`))
	hb.Publish("a", []byte(`{"n":3}`))

	for _, want := range []string{`{"n":1}`, `{"n":2}`, `{"n":3}`} {
		if _, got := wsAll.readData(); got != want {
			t.Errorf("ws, all queues: %s, want %s", got, want)
		}
	}
	for _, want := range []string{`{"n":1}`, `{"n":3}`} {
		if _, got := wsA.readData(); got != want {
			t.Errorf("ws, queue a: %s, want %s", got, want)
		}
	}
	for _, want := range []sseTestEvent{
		{id: "1", event: "job:pushed", data: `{"n":1}`},
		{id: "2", event: "job:completed", data: `{"n":2}`},
		{id: "3", data: `{"n":3}`},
	} {
		if got := sseAll.nextData(); got.id != want.id || got.event != want.event || got.data != want.data {
			t.Errorf("sse, all queues: %+v, want %+v", got, want)
		}
	}
	hb.Publish("b", []byte(`{"n":4}`))
	for _, want := range []string{"2", "4"} {
		if got := sseB.nextData(); got.id != want {
			t.Errorf("sse, queue b: id %s, want %s", got.id, want)
		}
	}
	wsA.text("hello")
	if _, got := wsA.readData(); got != "re:hello" {
		t.Errorf("onMessage answered %q", got)
	}
	if d := hb.Drops(); d != 0 {
		t.Errorf("%d drops", d)
	}
}

func TestHubLastEventIDReplay(t *testing.T) {
	t.Parallel()
	hb, addr := startHub(t, hubOptions{Replay: 3})
	hb.Publish("a", []byte(`{"unheard":true}`)) // nobody listens: not kept, no id
	first := dialSSE(t, addr, "/events")
	waitSubscribers(t, hb, 1)
	for i := 1; i <= 5; i++ {
		hb.PublishEvent([]string{"a", "b"}[(i+1)%2], "job:pushed", fmt.Appendf(nil, `{"n":%d}`, i))
	}
	for i := 1; i <= 5; i++ {
		if ev := first.nextData(); ev.id != fmt.Sprint(i) {
			t.Fatalf("event %d has id %q", i, ev.id)
		}
	}
	// The ring holds 3, 4 and 5 (3 and 5 on queue a).
	cases := []struct {
		path, last string
		replay     []string
	}{
		{"/events", "3", []string{"4", "5"}},
		{"/events/queues/a", "0", []string{"3", "5"}},
		{"/events", "1", []string{"3", "4", "5"}}, // 2 is gone: what is kept
		{"/events", "5", nil},
		{"/events", "999", nil}, // from before a restart
		{"/events", "junk", nil},
	}
	clients := make([]*sseClient, len(cases))
	for i, tc := range cases {
		clients[i] = dialSSE(t, addr, tc.path, "Last-Event-ID: "+tc.last)
		waitSubscribers(t, hb, i+2)
	}
	hb.Publish("a", []byte(`{"n":6}`))
	for i, tc := range cases {
		var got []string
		for {
			ev := clients[i].nextData()
			if ev.id == "6" {
				break
			}
			got = append(got, ev.id)
		}
		if strings.Join(got, ",") != strings.Join(tc.replay, ",") {
			t.Errorf("%s after %s: replayed %v, want %v", tc.path, tc.last, got, tc.replay)
		}
	}
}

// TestHubSlowConsumer: two subscribers that do not read (a WebSocket and
// an SSE stream) while a third keeps up. Publish never waits on them; they
// are dropped, counted, and the reader gets everything.
func TestHubSlowConsumer(t *testing.T) {
	t.Parallel()
	small := wsOptions{SendQueue: 64, SendQueueBytes: 256 << 10, CloseTimeout: 300 * time.Millisecond}
	hb, addr := startHub(t, hubOptions{WS: small,
		SSE: sseOptions{SendQueue: 64, SendQueueBytes: 256 << 10, CloseTimeout: 300 * time.Millisecond}})
	slowWS := dialWS(t, addr, "/ws")
	slowWS.slowReader()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetReadBuffer(16 << 10)
	slowSSE := sseHandshake(t, nc, "/events")
	good := dialWS(t, addr, "/ws")
	waitSubscribers(t, hb, 3)

	received := make(chan int, 1<<16)
	go func() {
		defer close(received)
		for {
			f, err := good.read()
			if err != nil {
				return
			}
			if f.op == 0x1 {
				received <- len(f.payload)
			}
		}
	}()
	payload := []byte(strings.Repeat("x", 16<<10))
	var slowest, total time.Duration
	published, got := 0, 0
	for hb.Subscribers() > 1 {
		if published > (64<<20)/len(payload) {
			// Dropping ends with a close handshake that may take a moment
			// on a loaded machine: wait for it rather than publish on.
			eventually(t, 5*time.Second, fmt.Sprintf("the slow subscribers dropped after %d events", published), func() (bool, string) {
				n := hb.Subscribers()
				return n <= 1, fmt.Sprint(n, " subscribers")
			})
			break
		}
		for range 8 {
			t0 := time.Now()
			hb.Publish("q", payload)
			d := time.Since(t0)
			slowest, total = max(slowest, d), total+d
			published++
		}
		// Pace by the good reader, so that only the slow ones fall behind.
		for got < published {
			select {
			case n, ok := <-received:
				if !ok {
					t.Fatalf("the good reader's connection ended after %d events", got)
				}
				if n != len(payload) {
					t.Fatalf("a %d-byte message", n)
				}
				got++
			case <-time.After(wsTestTimeout):
				t.Fatalf("the good reader has %d of %d events", got, published)
			}
		}
	}
	t.Logf("%d events published in %v in all (slowest Publish %v); %d drops", published, total, slowest, hb.Drops())
	if slowest > time.Second {
		t.Errorf("a Publish took %v", slowest)
	}
	if hb.Drops() == 0 {
		t.Error("no drops counted")
	}
	// The dropped clients see their connections end.
	slowWS.nc.(*net.TCPConn).SetReadBuffer(4 << 20)
	nc.(*net.TCPConn).SetReadBuffer(4 << 20)
	for what, r := range map[string]io.Reader{"ws": slowWS.br, "sse": slowSSE.br} {
		slowWS.nc.SetReadDeadline(time.Now().Add(wsTestTimeout))
		nc.SetReadDeadline(time.Now().Add(wsTestTimeout))
		if _, err := io.Copy(io.Discard, r); err != nil && isTimeout(err) {
			t.Errorf("the slow %s client's connection is still open", what)
		}
	}
}

// TestHubShutdownNoLeaks: Close ends every subscriber, including one that
// never reads, within its CloseTimeout, and leaves no goroutine behind.
//
// Serial: it counts the process's goroutines.
func TestHubShutdownNoLeaks(t *testing.T) {
	runtime.GC()
	base := runtime.NumGoroutine()

	hb := newHub(hubOptions{WS: wsOptions{CloseTimeout: 500 * time.Millisecond},
		SSE: sseOptions{CloseTimeout: 500 * time.Millisecond}})
	ts := httptest.NewServer(hubMux(hb))
	addr := ts.Listener.Addr().String()
	polite := dialWS(t, addr, "/ws")
	mute := dialWS(t, addr, "/ws/queues/q")
	sse1 := dialSSE(t, addr, "/events")
	sse2 := dialSSE(t, addr, "/events/queues/q")
	waitSubscribers(t, hb, 4)
	hb.Publish("q", []byte(`{"n":1}`))
	if _, m := polite.readData(); m != `{"n":1}` {
		t.Fatalf("got %q", m)
	}
	sse1.nextData()

	start := time.Now()
	closed := make(chan struct{})
	go func() {
		hb.Close()
		close(closed)
	}()
	if code, reason := polite.expectClose(); code != 1001 {
		t.Errorf("close %d %q, want 1001", code, reason)
	}
	polite.write(wsFrameBytes(true, 0, 0x8, wsCloseBody(1001, ""), true))
	polite.expectEOF()
	if ev := sse2.nextData(); ev.data != `{"n":1}` {
		t.Errorf("sse2 got %+v", ev)
	}
	sse1.expectEnd()
	sse2.expectEnd()
	select {
	case <-closed:
	case <-time.After(wsTestTimeout):
		t.Fatal("Close did not return")
	}
	t.Logf("Close returned after %v", time.Since(start))
	// The one that never read has had its socket closed under it.
	mute.nc.SetReadDeadline(time.Now().Add(wsTestTimeout))
	if _, err := io.Copy(io.Discard, mute.br); err != nil && isTimeout(err) {
		t.Error("the silent client's connection is still open")
	}

	// Closed means closed.
	hb.Publish("q", []byte(`{"n":2}`))
	if c := rawHandshake(t, addr, wsRequest("/ws")); c.resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("WebSocket after Close: %s", c.resp.Status)
	}
	if c := dialSSE(t, addr, "/events"); c.resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("SSE after Close: %s", c.resp.Status)
	}

	for _, nc := range []net.Conn{polite.nc, mute.nc, sse1.nc, sse2.nc} {
		nc.Close()
	}
	ts.Close()
	var now int
	eventually(t, wsTestTimeout, "goroutines back to their count before the hub", func() (bool, string) {
		now = runtime.NumGoroutine()
		return now <= base, fmt.Sprintf("%d goroutines, %d before\n%s", now, base, goroutineDump())
	})
	t.Logf("goroutines: %d before, %d after", base, now)
}

// TestHubReplayByteBudget: the replay ring keeps events up to its byte
// budget, dropping the oldest, however few they are; a reconnecting
// stream gets the kept ones.
func TestHubReplayByteBudget(t *testing.T) {
	t.Parallel()
	hb, addr := startHub(t, hubOptions{ReplayBytes: 40 << 10})
	first := dialSSE(t, addr, "/events")
	waitSubscribers(t, hb, 1)
	big := strings.Repeat("x", 8<<10)
	for i := 1; i <= 10; i++ {
		hb.PublishEvent("a", "job:pushed", fmt.Appendf(nil, `{"n":%d,"pad":"%s"}`, i, big))
	}
	for i := 1; i <= 10; i++ {
		if ev := first.nextData(); ev.id != fmt.Sprint(i) {
			t.Fatalf("event %d has id %q", i, ev.id)
		}
	}
	hb.mu.Lock()
	kept, weight := len(hb.ring), hb.ringB
	hb.mu.Unlock()
	if kept == 0 || kept >= 10 || weight > 40<<10 {
		t.Fatalf("%d events of 8 KB kept, %d bytes, with a budget of 40 KiB", kept, weight)
	}
	late := dialSSE(t, addr, "/events", "Last-Event-ID: 0")
	waitSubscribers(t, hb, 2)
	hb.Publish("a", []byte(`{"n":11}`))
	var got []string
	for {
		ev := late.nextData()
		if ev.id == "11" {
			break
		}
		got = append(got, ev.id)
	}
	if len(got) != kept || got[len(got)-1] != "10" {
		t.Fatalf("replayed %v, want the %d kept, the last of them 10", got, kept)
	}
	t.Logf("10 events of 8 KB, budget 40 KiB: %d kept (%d bytes)", kept, weight)
}
