package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// blackholeAccepting is a receiver that accepts connections and never
// answers: each attempt runs into its timeout.
func blackholeAccepting(t *testing.T) string {
	t.Helper()
	return "http://" + blackholeAcceptingAddr(t) + "/dead"
}

// blackholeAcceptingAddr is the address of a listener that accepts
// connections and never answers.
func blackholeAcceptingAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held, never read or answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// blackholeNotAccepting is a receiver whose listen queue is full and never
// served: the SYN of every new connection is dropped, so each attempt's
// connect hangs until its timeout.
func blackholeNotAccepting(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	// A backlog of 0 holds one connection; fill it.
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for full := false; !full; {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			full = true
			continue
		}
		t.Cleanup(func() { c.Close() })
	}
	return "http://" + addr + "/dead"
}

// latencyReceiver records, per job id, when its job.pushed arrived.
type latencyReceiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	at  map[string]time.Time
}

func newLatencyReceiver(t *testing.T) *latencyReceiver {
	r := &latencyReceiver{at: map[string]time.Time{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		b := jsonBody(t, body)
		r.mu.Lock()
		r.at[b["jobId"].(string)] = time.Now()
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// measure pushes n jobs, one every gap, and returns each one's delivery
// latency to r (push sent to request received), waiting for all of them
// up to within.
func (r *latencyReceiver) measure(t *testing.T, c *tclient, queue string, n int, gap, within time.Duration) []time.Duration {
	t.Helper()
	sent := map[string]time.Time{}
	for i := 0; i < n; i++ {
		at := time.Now()
		id := c.ok(M{"cmd": "PUSH", "queue": queue, "data": i})["id"].(string)
		sent[id] = at
		time.Sleep(gap)
	}
	var lat []time.Duration
	eventually(t, within, "every delivery to the healthy receiver", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		lat = lat[:0]
		for id, at := range sent {
			if got, ok := r.at[id]; ok {
				lat = append(lat, got.Sub(at))
			}
		}
		return len(lat) == n, fmt.Sprintf("%d of %d delivered", len(lat), n)
	})
	slices.Sort(lat)
	return lat
}

// A receiver that never answers, or never accepts, delays only its own
// deliveries: another webhook's latency stays where it was. Measured as
// the healthy receiver's delivery latency alone, then with two blackholed
// webhooks (and one refusing connections) subscribed to the same events;
// each of their deliveries takes three 10-second attempts.
func TestWebhookBlackholeDoesNotDelayOthers(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{webhookAllowPrivate: true})
	c := dial(t, ts.addr)
	healthy := newLatencyReceiver(t)
	c.ok(M{"cmd": "AddWebhook", "url": healthy.srv.URL, "events": []any{"job.pushed"}, "queue": "lat"})

	const n = 40
	alone := healthy.measure(t, c, "lat", n, 20*time.Millisecond, 20*time.Second)

	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedURL := "http://" + refused.Addr().String() + "/gone"
	refused.Close()
	for _, u := range []string{blackholeAccepting(t), blackholeNotAccepting(t), refusedURL} {
		c.ok(M{"cmd": "AddWebhook", "url": u, "events": []any{"job.pushed"}})
	}
	withDead := healthy.measure(t, c, "lat", n, 20*time.Millisecond, 20*time.Second)

	t.Logf("healthy receiver's delivery latency over %d deliveries: alone p50 %v max %v; beside blackholed receivers p50 %v max %v",
		n, alone[n/2], alone[n-1], withDead[n/2], withDead[n-1])
	// Generous: the blackholed deliveries take 10 s an attempt.
	if withDead[n-1] > 2*time.Second {
		t.Fatalf("beside blackholed receivers a delivery took %v (p50 %v); alone the worst was %v",
			withDead[n-1], withDead[n/2], alone[n-1])
	}
}

// switchReceiver answers 200, or hangs until the sender gives up (a
// receiver that accepts and never answers), as mode says; it records the
// job id of every request and of every one it answered 200.
type switchReceiver struct {
	srv     *httptest.Server
	hang    atomic.Bool
	mu      sync.Mutex
	reqs    int
	okByJob map[string]int
}

func newSwitchReceiver(t *testing.T) *switchReceiver {
	r := &switchReceiver{okByJob: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.reqs++
		r.mu.Unlock()
		if r.hang.Load() {
			<-req.Context().Done() // the sender's attempt timeout
			return
		}
		id, _ := jsonBody(t, body)["jobId"].(string)
		r.mu.Lock()
		r.okByJob[id]++
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *switchReceiver) requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs
}

// hookState reads a webhook's delivery state as ListWebhooks shows it.
func hookState(t *testing.T, ls *localServer) map[string]any {
	t.Helper()
	d := ls.call(M{"cmd": "ListWebhooks"})["data"].(map[string]any)
	return d["webhooks"].([]any)[0].(map[string]any)
}

// A receiver that stops answering opens its webhook's circuit after
// breakAfter failed deliveries: later deliveries are held (within the
// backlog's bound; beyond it dropped and counted), not sent, until a probe
// after the open period; a failed probe opens it again, for longer; once
// the receiver answers, a probe gets through, the circuit closes and what
// was held is delivered.
func TestWebhookCircuitBreaker(t *testing.T) {
	t.Parallel()
	recv := newSwitchReceiver(t)
	recv.hang.Store(true)
	ls := newLocalServer(t)
	h, err := newWebhooks(ls.b.Broker, webhookOptions{allowPrivate: true, retryDelay: 10 * time.Millisecond,
		attemptTimeout: 200 * time.Millisecond, breakAfter: 2, openFor: 1500 * time.Millisecond,
		openMax: 3 * time.Second, queueLen: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ls.srv.hooks = h
	ls.ok(M{"cmd": "AddWebhook", "url": recv.srv.URL, "events": []any{"job.pushed"}})

	// Two deliveries fail (three attempts each): the circuit opens.
	ls.ok(M{"cmd": "PUSH", "queue": "q", "data": 0})
	ls.ok(M{"cmd": "PUSH", "queue": "q", "data": 1})
	eventually(t, 20*time.Second, "circuit open after two failed deliveries", func() (bool, string) {
		w := hookState(t, ls)
		return w["circuit"] == "open" && num(t, w["failureCount"]) == 2, fmt.Sprint(w)
	})
	sent := recv.requests()
	if sent != 2*webhookAttempts {
		t.Fatalf("%d requests for two failed deliveries, want %d", sent, 2*webhookAttempts)
	}

	// Six more events while open: four held (the backlog's bound in this
	// test), two dropped; none sent before the probe.
	var held []string
	for i := 0; i < 6; i++ {
		held = append(held, ls.ok(M{"cmd": "PUSH", "queue": "q", "data": 2 + i})["id"].(string))
	}
	w := hookState(t, ls)
	if num(t, w["droppedCount"]) != 2 || num(t, w["pending"]) != 4 {
		t.Fatalf("while open: %v", w)
	}
	// The probe (one delivery, three attempts) fails too: that delivery
	// is given up, the circuit opens again, the other three stay held.
	eventually(t, 20*time.Second, "a failed probe", func() (bool, string) {
		w := hookState(t, ls)
		return num(t, w["failureCount"]) == 3 && w["circuit"] == "open", fmt.Sprint(w)
	})
	if got := recv.requests(); got != sent+webhookAttempts {
		t.Fatalf("%d requests after the probe, want %d: only the probe may be sent while the circuit is open",
			got, sent+webhookAttempts)
	}
	if w := hookState(t, ls); num(t, w["pending"]) != 3 {
		t.Fatalf("after the failed probe: %v", w)
	}

	// The receiver answers again: the next probe gets through, the
	// circuit closes and the held deliveries arrive.
	recv.hang.Store(false)
	eventually(t, 20*time.Second, "circuit closed, held deliveries delivered", func() (bool, string) {
		w := hookState(t, ls)
		return w["circuit"] == "closed" && num(t, w["pending"]) == 0 && num(t, w["successCount"]) == 3, fmt.Sprint(w)
	})
	recv.mu.Lock()
	for _, id := range held[1:4] {
		if recv.okByJob[id] != 1 {
			t.Errorf("held delivery for %s arrived %d times", id, recv.okByJob[id])
		}
	}
	recv.mu.Unlock()
	// Closed: deliveries flow at once again.
	id := ls.ok(M{"cmd": "PUSH", "queue": "q", "data": "after"})["id"].(string)
	eventually(t, 10*time.Second, "delivery after the circuit closed", func() (bool, string) {
		recv.mu.Lock()
		defer recv.mu.Unlock()
		return recv.okByJob[id] == 1, ""
	})
	if st := h.dropped.Load(); st != 2 {
		t.Errorf("dropped total %d, want 2", st)
	}
}

// Close returns promptly with deliveries in flight to blackholed receivers
// (whose attempts would last 10 s), and no sender is left running.
func TestWebhookCloseWithBlackholedReceivers(t *testing.T) {
	t.Parallel()
	ls := newLocalServer(t)
	h, err := newWebhooks(ls.b.Broker, webhookOptions{allowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	ls.srv.hooks = h
	for _, u := range []string{blackholeAccepting(t), blackholeNotAccepting(t)} {
		ls.ok(M{"cmd": "AddWebhook", "url": u, "events": []any{"job.pushed"}})
	}
	for i := 0; i < 20; i++ {
		ls.ok(M{"cmd": "PUSH", "queue": "q", "data": i})
	}
	eventually(t, 10*time.Second, "deliveries in flight", func() (bool, string) {
		_, pending := h.lineStats()
		return pending == 40, fmt.Sprint(pending)
	})
	start := time.Now()
	h.Close()
	took := time.Since(start)
	if strings.Contains(goroutineDump(), "(*Webhooks).send") || strings.Contains(goroutineDump(), "(*Webhooks).dropReporter") {
		t.Fatalf("webhook goroutines left after Close (took %v):\n%s", took, goroutineDump())
	}
	if took >= webhookCloseWait {
		t.Fatalf("Close took %v: it waited out its deadline", took)
	}
	t.Logf("Close with 2 blackholed receivers and 40 deliveries waiting or in flight: %v", took)
}
