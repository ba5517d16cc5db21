package main

// A small wire-protocol client and server harness for the TCP tests in
// server_test.go. Requests are maps encoded with the package's own codec;
// answers are decoded with Decode and matched to requests by reqId, since
// the server may answer out of order. Event frames (no reqId) go to a
// channel of their own, as do answers without a string reqId (frame-level
// errors, numeric reqIds).

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// callTimeout bounds every ordinary request/answer round trip. It is far
// above anything a healthy server needs, so it only trips on a real hang.
const callTimeout = 10 * time.Second

// ---------------------------------------------------------------------------
// Server harness

type testServer struct {
	addr   string
	http   string // host:port of the HTTP side, when started with it
	cancel context.CancelFunc
	done   chan error // receives runServer's result once
	err    error
	exited bool
}

// startServer runs runServer in memory on an ephemeral port. Cleanup
// cancels it and waits for it to return; it is registered before the
// cleanups of clients dialled later, so it runs after they have closed.
func startServer(t testing.TB, c *config) *testServer {
	t.Helper()
	return startServerOn(t, c, -1)
}

// startServerHTTP is startServer with the HTTP side on an ephemeral port
// too (ts.http).
func startServerHTTP(t testing.TB, c *config) *testServer {
	t.Helper()
	return startServerOn(t, c, 0)
}

func startServerOn(t testing.TB, c *config, httpPort int) *testServer {
	t.Helper()
	if c == nil {
		c = &config{}
	}
	c.host, c.tcpPort, c.httpPort = "127.0.0.1", 0, httpPort
	c.memory = true
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{cancel: cancel, done: make(chan error, 1)}
	type addrs struct{ tcp, http string }
	ready := make(chan addrs, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() {
		ts.done <- runServer(ctx, c, log, func(tcp, h net.Addr) {
			a := addrs{tcp: tcp.String()}
			if h != nil {
				a.http = h.String()
			}
			ready <- a
		})
	}()
	select {
	case a := <-ready:
		ts.addr, ts.http = a.tcp, a.http
	case err := <-ts.done:
		cancel()
		t.Fatalf("runServer returned before it was ready: %v", err)
	case <-time.After(callTimeout):
		cancel()
		t.Fatal("server did not become ready")
	}
	t.Cleanup(func() {
		if !ts.stop(15 * time.Second) {
			t.Errorf("runServer did not return within 15s of cancel")
		}
	})
	return ts
}

// stop cancels the server and reports whether runServer returned in time.
func (ts *testServer) stop(within time.Duration) bool {
	ts.cancel()
	if ts.exited {
		return true
	}
	select {
	case ts.err = <-ts.done:
		ts.exited = true
		return true
	case <-time.After(within):
		return false
	}
}

// ---------------------------------------------------------------------------
// Frames

// frame encodes m as one length-prefixed request frame.
func frame(m map[string]any) []byte { return appendFrame(nil, m) }

// appendFrame appends m's request frame to dst.
func appendFrame(dst []byte, m map[string]any) []byte {
	e := Enc{B: dst}
	at := e.BeginFrame()
	if err := e.Any(m); err != nil {
		panic(err)
	}
	e.EndFrame(at)
	return e.B
}

// orderedFrame encodes a request map with its keys in the order given
// (key, value, key, value...), for tests where the order matters: a reqId
// is echoed only when it comes before a fault.
func orderedFrame(kv ...any) []byte {
	var e Enc
	at := e.BeginFrame()
	e.MapHead(len(kv) / 2)
	for i := 0; i+1 < len(kv); i += 2 {
		e.Str(kv[i].(string))
		if err := e.Any(kv[i+1]); err != nil {
			panic(err)
		}
	}
	e.EndFrame(at)
	return e.B
}

// rawFrame wraps an already encoded body in a length prefix.
// The length is written here rather than by EndFrame, whose test-build
// check would refuse the malformed bodies some tests send on purpose.
func rawFrame(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// ---------------------------------------------------------------------------
// Client

type tclient struct {
	t  testing.TB
	nc net.Conn

	wmu sync.Mutex
	// wbuf is the frame being written, reused: under the race detector
	// every fresh buffer's memory has its shadow cleared, and a flood of
	// big requests spent most of the test's CPU there.
	wbuf []byte

	mu      sync.Mutex
	pending map[string]chan map[string]any

	events  chan map[string]any // {type:"event"} frames, in arrival order
	orphans chan map[string]any // answers with no string reqId
	order   chan string         // reqIds in the order their answers arrived

	seq      atomic.Int64
	done     chan struct{} // closed when the reader exits
	readErr  error         // why the reader exited; read after done
	closeOne sync.Once
}

// dial connects a client; it is closed at the end of the test.
func dial(t testing.TB, addr string) *tclient {
	t.Helper()
	network := "tcp"
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", path
	}
	nc, err := net.DialTimeout(network, addr, callTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c := &tclient{t: t, nc: nc, pending: map[string]chan map[string]any{},
		events: make(chan map[string]any, 1<<14), orphans: make(chan map[string]any, 1024),
		order: make(chan string, 1<<14), done: make(chan struct{})}
	go c.readLoop()
	t.Cleanup(c.close)
	return c
}

// dialRaw opens a bare connection, for tests that drive the socket directly.
func dialRaw(addr string) (net.Conn, error) {
	return net.DialTimeout("tcp", addr, 2*time.Second)
}

func (c *tclient) readLoop() {
	defer close(c.done)
	br := bufio.NewReaderSize(c.nc, 64<<10)
	var body []byte
	for {
		var err error
		// The frame's buffer is read into again: Decode copies what it
		// answers out of it (a frame of 64 MiB grown afresh for each
		// answer cost more CPU under the race detector than the server
		// spent making it).
		body, err = ReadFrame(br, body)
		if err != nil {
			c.readErr = err
			return
		}
		v, err := Decode(body)
		if err != nil {
			c.readErr = fmt.Errorf("undecodable answer %x: %w", body, err)
			return
		}
		m, ok := v.(map[string]any)
		if !ok {
			c.readErr = fmt.Errorf("answer is not a map: %#v", v)
			return
		}
		if m["type"] == "event" {
			select {
			case c.events <- m:
			default:
				c.readErr = errors.New("test client: event channel overflow")
				return
			}
			continue
		}
		id, isStr := m["reqId"].(string)
		if !isStr {
			select {
			case c.orphans <- m:
			default:
			}
			continue
		}
		select {
		case c.order <- id:
		default:
		}
		c.mu.Lock()
		ch := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if ch == nil {
			c.readErr = fmt.Errorf("answer for unknown reqId %q: %v", id, m)
			return
		}
		ch <- m
	}
}

// close closes the socket and waits for the reader to stop.
func (c *tclient) close() {
	c.closeOne.Do(func() {
		c.nc.Close()
		<-c.done
	})
}

func (c *tclient) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(b)
}

// writeFrame encodes m into the client's frame buffer and sends it.
func (c *tclient) writeFrame(m map[string]any) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf = appendFrame(c.wbuf[:0], m)
	return c.writeLocked(c.wbuf)
}

// writeLocked sends b; c.wmu is held.
func (c *tclient) writeLocked(b []byte) error {
	c.nc.SetWriteDeadline(time.Now().Add(callTimeout))
	_, err := c.nc.Write(b)
	return err
}

// writeRaw sends bytes as they are; the test fails when the write does.
func (c *tclient) writeRaw(b []byte) {
	c.t.Helper()
	if err := c.write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// prepare gives m a fresh string reqId (unless it has one) and registers
// the channel its answer will arrive on.
func (c *tclient) prepare(m map[string]any) (string, chan map[string]any) {
	id, ok := m["reqId"].(string)
	if !ok {
		id = "r" + strconv.FormatInt(c.seq.Add(1), 10)
		m["reqId"] = id
	}
	ch := make(chan map[string]any, 1)
	c.mu.Lock()
	c.pending[id] = ch
	c.mu.Unlock()
	return id, ch
}

// send writes one request and returns its reqId and answer channel.
func (c *tclient) send(m map[string]any) (string, chan map[string]any) {
	id, ch := c.prepare(m)
	if err := c.writeFrame(m); err != nil {
		ch <- map[string]any{"ok": false, "error": "test client write: " + err.Error(), "reqId": id}
	}
	return id, ch
}

// do sends a request and waits for its answer; safe from any goroutine.
func (c *tclient) do(m map[string]any, timeout time.Duration) (map[string]any, error) {
	id, ch := c.send(m)
	return c.wait(id, ch, timeout)
}

func (c *tclient) wait(id string, ch chan map[string]any, timeout time.Duration) (map[string]any, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case a := <-ch:
		return a, nil
	case <-c.done:
		select {
		case a := <-ch:
			return a, nil
		default:
		}
		return nil, fmt.Errorf("connection closed before the answer to %s (%v)", id, c.readErr)
	case <-t.C:
		return nil, fmt.Errorf("no answer to %s within %v", id, timeout)
	}
}

// await waits for an answer from the test goroutine.
func (c *tclient) await(id string, ch chan map[string]any, timeout time.Duration) map[string]any {
	c.t.Helper()
	a, err := c.wait(id, ch, timeout)
	if err != nil {
		c.t.Fatal(err)
	}
	return a
}

// call sends a request and returns its answer, whatever ok says.
func (c *tclient) call(m map[string]any) map[string]any {
	c.t.Helper()
	id, ch := c.send(m)
	return c.await(id, ch, callTimeout)
}

// ok sends a request and requires ok:true.
func (c *tclient) ok(m map[string]any) map[string]any {
	c.t.Helper()
	return c.okWithin(m, callTimeout)
}

// okWithin is ok for a request that may take longer than callTimeout (an
// answer of tens of megabytes read from PostgreSQL, under the race
// detector).
func (c *tclient) okWithin(m map[string]any, timeout time.Duration) map[string]any {
	c.t.Helper()
	cmd := m["cmd"]
	id, ch := c.send(m)
	a := c.await(id, ch, timeout)
	if a["ok"] != true {
		c.t.Fatalf("%v: want ok:true, got %v", cmd, a)
	}
	return a
}

// fail sends a request, requires ok:false and returns the error.
func (c *tclient) fail(m map[string]any) string {
	c.t.Helper()
	cmd := m["cmd"]
	a := c.call(m)
	if a["ok"] != false {
		c.t.Fatalf("%v: want ok:false, got %v", cmd, a)
	}
	s, _ := a["error"].(string)
	return s
}

// orphan waits for an answer that carried no string reqId.
func (c *tclient) orphan(timeout time.Duration) map[string]any {
	c.t.Helper()
	select {
	case m := <-c.orphans:
		return m
	case <-time.After(timeout):
		c.t.Fatalf("no reqId-less answer within %v", timeout)
	}
	return nil
}

// event waits for the next event frame and returns its event map.
func (c *tclient) event(timeout time.Duration) map[string]any {
	c.t.Helper()
	select {
	case m := <-c.events:
		ev, ok := m["event"].(map[string]any)
		if !ok {
			c.t.Fatalf("event frame without an event map: %v", m)
		}
		return ev
	case <-time.After(timeout):
		c.t.Fatalf("no event within %v", timeout)
	}
	return nil
}

// closedByPeer reports whether the connection ended within d.
func (c *tclient) closedByPeer(d time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(d):
		return false
	}
}

// ---------------------------------------------------------------------------
// Answer helpers

// num reads a decoded number of any width.
func num(t testing.TB, v any) float64 {
	t.Helper()
	switch x := v.(type) {
	case int64:
		return float64(x)
	case uint64:
		return float64(x)
	case float64:
		return x
	case float32:
		return float64(x)
	}
	t.Fatalf("not a number: %#v", v)
	return 0
}

func isNum(v any) bool {
	switch v.(type) {
	case int64, uint64, float64, float32:
		return true
	}
	return false
}

// sub reads a nested map.
func sub(t testing.TB, m map[string]any, key string) map[string]any {
	t.Helper()
	v, ok := m[key].(map[string]any)
	if !ok {
		t.Fatalf("%q is not a map in %v", key, m)
	}
	return v
}

// str reads a string field.
func str(t testing.TB, m map[string]any, key string) string {
	t.Helper()
	v, ok := m[key].(string)
	if !ok {
		t.Fatalf("%q is not a string in %v", key, m)
	}
	return v
}

// list reads an array field.
func list(t testing.TB, m map[string]any, key string) []any {
	t.Helper()
	v, ok := m[key].([]any)
	if !ok {
		t.Fatalf("%q is not an array in %v", key, m)
	}
	return v
}

// serveTest serves srv on a loopback port until the test ends, and
// answers its address. done runs after the server has stopped (closing
// what the server used: its broker, its engine), and also if it cannot
// listen.
func serveTest(t testing.TB, srv *Server, done func()) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		done()
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { srv.Serve(ln); close(served) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
		done()
	})
	return ln.Addr().String()
}

// clockPast waits until now() has moved past mark: what is made next is
// later than what was made before (a completion time, a push's age), by
// the clock that judges it.
func clockPast(t testing.TB, now func() int64, mark int64) {
	t.Helper()
	eventually(t, 10*time.Second, "the clock past its mark", func() (bool, string) {
		n := now()
		return n > mark, fmt.Sprint(n, " <= ", mark)
	})
}

// retryPause is the pause of a load generator's worker before it tries
// again after an error (a fault test's producers and consumers, while
// their broker is cut off): not a wait for anything, a brake on a loop
// that would otherwise spin.
func retryPause() { time.Sleep(20 * time.Millisecond) }

// eventually polls cond until it holds or the deadline passes; the last
// failure message is reported. The pause between polls grows from 2 ms to
// 50 ms: a condition met at once is seen at once, and a wait of seconds
// (a schedule, a flood being dealt with) does not spend the machine's CPU
// asking, often through a metrics scrape, a hundred times a second.
func eventually(t testing.TB, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	pause := 2 * time.Millisecond
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v (last: %s)", what, within, msg)
		}
		time.Sleep(pause)
		pause = min(pause*3/2, 50*time.Millisecond)
	}
}

// memServer is a protocol server over memory engine b and its broker.
func memServer(b *MemEngine, tokens []string, log *slog.Logger) *Server {
	return NewServer(b.Broker, b, tokens, log)
}
