package main

// Hostile clients at the connection layer and in the codec, in process:
// what a connection may send before Auth, how long it may take, what its
// buffers keep, what an array costs, which ext values pass, what a panic
// outside a handler does, and how failed accepts are ridden out. The
// figures that belong to a process (descriptors, resident memory) are in
// hostile_proc_test.go.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// emptyPairsMap encodes a map32 of n empty-string keys with nil values:
// two bytes a pair on the wire, one parsed field each.
func emptyPairsMap(n int) []byte {
	b := make([]byte, 5, 5+2*n)
	b[0] = 0xdf
	b[1], b[2], b[3], b[4] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	for i := 0; i < n; i++ {
		b = append(b, 0xa0, 0xc0)
	}
	return b
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// totalAlloc is the bytes allocated so far.
func totalAlloc() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// readAnswer reads one answer frame from a bare connection, into a buffer
// of its own (nothing is kept on the test's side).
func readAnswer(nc net.Conn, within time.Duration) (map[string]any, error) {
	nc.SetReadDeadline(time.Now().Add(within))
	defer nc.SetReadDeadline(time.Time{})
	body, err := ReadFrame(bufio.NewReaderSize(nc, 16), nil)
	if err != nil {
		return nil, err
	}
	v, err := Decode(body)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("answer is not a map: %#v", v)
	}
	return m, nil
}

// closedWithin reports whether the server closes nc within d (reading and
// dropping whatever it sends before).
func closedWithin(nc net.Conn, d time.Duration) bool {
	nc.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, nc)
	return err == nil || !isTimeout(err)
}

// Before Auth, a frame header announcing more than 64 KiB is refused with
// the limit named and the connection closed without its body being read;
// after Auth, large frames are fine.
func TestHostilePreAuthFrameLimit(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{authTokens: "sesame"})
	nc, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write([]byte{0x00, 0x01, 0x00, 0x01}) // 65537 bytes announced
	a, err := readAnswer(nc, callTimeout)
	if err != nil {
		t.Fatalf("no answer to an oversized frame before Auth: %v", err)
	}
	want := "Frame too large: 65537 bytes exceeds maximum 65536 before Auth (a connection that has not authenticated may send frames of 64 KiB at most)"
	if a["ok"] != false || a["error"] != want {
		t.Fatalf("got %v, want the error %q", a, want)
	}
	if !closedWithin(nc, callTimeout) {
		t.Fatal("connection not closed after an oversized frame before Auth")
	}

	// Exactly 64 KiB is read (and refused for want of Auth).
	c := dial(t, ts.addr)
	if got := c.fail(M{"cmd": "Ping", "pad": strings.Repeat("x", preAuthMaxFrame-64)}); got != "Not authenticated" {
		t.Fatalf("64 KiB frame before Auth: %q", got)
	}
	c.ok(M{"cmd": "Auth", "token": "sesame"})
	c.ok(M{"cmd": "Ping", "pad": strings.Repeat("x", 8<<20)})
}

// The 8M-empty-pairs map: before Auth it is refused on its header (16 MiB
// announced), a smaller one by the field count; after Auth the field
// count refuses it before any field is parsed, and nothing is pinned. (It
// was parsed in full, 48 bytes a field, and the fields kept for the
// connection's life: 400 MB a connection.)
//
// Serial: it measures the test process's heap.
func TestHostileEmptyPairsMap(t *testing.T) {
	ts := startServer(t, &config{authTokens: "sesame"})
	body := emptyPairsMap(8 << 20)

	// The server closes without reading the body: the write fails, the
	// answer written before the close is read.
	nc, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	go nc.Write(rawFrame(body))
	a, err := readAnswer(nc, callTimeout)
	if msg := fmt.Sprint(a["error"]); err != nil || !strings.HasPrefix(msg, "Frame too large: 16777221 bytes exceeds maximum 65536 before Auth") {
		t.Fatalf("8M empty pairs before Auth: %v %v", a, err)
	}
	if !closedWithin(nc, callTimeout) {
		t.Fatal("connection not closed")
	}

	c := dial(t, ts.addr)
	c.writeRaw(rawFrame(emptyPairsMap(20000)))
	if a := c.orphan(callTimeout); a["error"] != "Invalid command: a request before Auth is limited to 16 fields (this one has 20000)" {
		t.Fatalf("20,000 empty pairs before Auth: %v", a)
	}
	// The connection goes on: the frame boundary is intact.
	c.ok(M{"cmd": "Auth", "token": "sesame"})

	base := heapInUse()
	c.writeRaw(rawFrame(body))
	if a := c.orphan(callTimeout); a["error"] != "Invalid command: a request is limited to 1024 fields (this one has 8388608)" {
		t.Fatalf("8M empty pairs after Auth: %v", a)
	}
	c.ok(M{"cmd": "Ping"})
	if grown := int64(heapInUse()) - int64(base); grown > 32<<20 {
		t.Fatalf("the connection keeps %d MiB after one 16 MiB frame", grown>>20)
	}
	// A request at the limit is read.
	m := M{"cmd": "Ping"}
	for i := 0; len(m) < maxRequestFields-1; i++ {
		m[fmt.Sprintf("f%d", i)] = i
	}
	c.ok(m)
}

// Per-connection buffers shrink back: eight connections that each sent an
// 8 MiB frame and got a 3 MiB answer keep none of it once idle. (Each kept
// its frame buffer and its answer buffer: 88 MiB for the eight.)
//
// Serial: it measures the test process's heap.
func TestHostileConnBuffersShrink(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	id := push(t, c, "big", M{"data": strings.Repeat("d", 3<<20)})
	const n = 8
	conns := make([]net.Conn, n)
	for i := range conns {
		nc, err := dialRaw(ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		conns[i] = nc
		nc.Write(frame(M{"cmd": "Ping"}))
		if _, err := readAnswer(nc, callTimeout); err != nil {
			t.Fatal(err)
		}
	}
	base := heapInUse()
	pad := strings.Repeat("p", 8<<20)
	for _, nc := range conns {
		nc.Write(frame(M{"cmd": "Ping", "pad": pad}))
		if a, err := readAnswer(nc, callTimeout); err != nil || a["ok"] != true {
			t.Fatalf("8 MiB Ping: %v %v", a, err)
		}
		nc.Write(frame(M{"cmd": "GetJob", "id": id}))
		if a, err := readAnswer(nc, callTimeout); err != nil || a["ok"] != true {
			t.Fatalf("GetJob of a 3 MiB job: %v", err)
		}
	}
	pad = ""
	kept := int64(heapInUse()) - int64(base)
	t.Logf("%d connections after an 8 MiB frame and a 3 MiB answer each keep %.1f MiB in all", n, float64(kept)/(1<<20))
	if kept > 16<<20 {
		t.Fatalf("idle connections keep %d MiB after their large frames", kept>>20)
	}
	for _, nc := range conns {
		nc.Write(frame(M{"cmd": "Ping"}))
		if _, err := readAnswer(nc, callTimeout); err != nil {
			t.Fatal(err)
		}
	}
}

// An array costs what its bytes allow: a tags array of 8M empty strings
// (8 MiB on the wire) is refused, naming the limit, before anything is
// allocated for its elements (it cost 40 bytes an element: 320 MiB), and
// an array announcing more elements than bytes is refused at once.
//
// Serial: it measures the test process's heap.
func TestHostileArrayAllocation(t *testing.T) {
	var e Enc
	e.MapHead(1)
	e.Str("tags")
	e.B = append(e.B, 0xdd, 0x00, 0x80, 0x00, 0x00) // 8,388,608 elements
	for i := 0; i < 8<<20; i++ {
		e.B = append(e.B, 0xa0)
	}
	m, err := ParseMap(e.B, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := totalAlloc()
	_, _, err = m.Strs("tags")
	if got := totalAlloc() - before; got > 1<<20 {
		t.Errorf("refusing an 8M-element array allocated %d MiB", got>>20)
	}
	if err == nil || err.Error() != "tags is limited to 1000000 items (this one has 8388608)" {
		t.Fatalf("8M tags: %v", err)
	}
	if _, _, err := m.Array("tags"); err == nil || !strings.Contains(err.Error(), "limited to 1000000 items") {
		t.Fatalf("Array of 8M: %v", err)
	}

	// Announced but absent: refused with nothing allocated.
	e = Enc{}
	e.MapHead(1)
	e.Str("ids")
	e.B = append(e.B, 0xdd, 0x7f, 0xff, 0xff, 0xff, 0xa1, 'x')
	if m, err := ParseMap(e.B, nil); err == nil {
		t.Fatalf("an array announcing 2^31 elements in 2 bytes parsed: %v", m)
	}
	before = totalAlloc()
	if _, err := Raw(e.B[5:]).Array(); err == nil {
		t.Fatal("Raw.Array accepted 2^31 announced elements")
	}
	if _, err := Decode(e.B[5:]); err == nil {
		t.Fatal("Decode accepted 2^31 announced elements")
	}
	if got := totalAlloc() - before; got > 64<<10 {
		t.Errorf("refusing announced elements allocated %d bytes", got)
	}

	// At the limit, strings cost their slice entry and their bytes only.
	e = Enc{}
	e.MapHead(1)
	e.Str("ids")
	e.ArrayHead(maxArrayItems)
	for i := 0; i < maxArrayItems; i++ {
		e.B = append(e.B, 0xa0)
	}
	m, _ = ParseMap(e.B, nil)
	before = totalAlloc()
	ids, _, err := m.Strs("ids")
	if err != nil || len(ids) != maxArrayItems {
		t.Fatalf("%d ids: %v", len(ids), err)
	}
	if got := totalAlloc() - before; got > 17*maxArrayItems {
		t.Errorf("a million empty strings cost %d bytes, over 17 an element", got)
	}
	// Decoding goes element by element too: 16 bytes an element for the
	// []any, not 40 with a slice of raw values in between.
	before = totalAlloc()
	if _, err := Decode(e.B); err != nil {
		t.Fatal(err)
	}
	if got := totalAlloc() - before; got > 17*maxArrayItems {
		t.Errorf("decoding a million empty strings cost %d bytes, over 17 an element", got)
	}

	// Through the server: the push is refused, naming the limit.
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	var req Enc
	at := req.BeginFrame()
	req.MapHead(5)
	for _, kv := range [][2]string{{"cmd", "PUSH"}, {"reqId", "tags"}, {"queue", "q"}, {"data", "x"}} {
		req.Str(kv[0])
		req.Str(kv[1])
	}
	req.Str("tags")
	req.ArrayHead(maxArrayItems + 1)
	for i := 0; i <= maxArrayItems; i++ {
		req.B = append(req.B, 0xa0)
	}
	req.EndFrame(at)
	rid, ch := c.prepare(M{"reqId": "tags"})
	c.writeRaw(req.B)
	if a := c.await(rid, ch, callTimeout); a["ok"] != false || a["error"] != "tags is limited to 1000000 items (this one has 1000001)" {
		t.Fatalf("PUSH with 1,000,001 tags: %v", a)
	}
	if n := num(t, sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "q"}), "counts")["waiting"]); n != 0 {
		t.Fatalf("%v jobs pushed", n)
	}
}

// Ext types other than undefined and timestamp are refused wherever a
// value comes in (the reference's decoder refuses them; the official
// client could not read them back), naming the field; the reqId is echoed
// wherever it stands, and nothing is stored.
func TestHostileExtTypesRefused(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	ext := Ext{Type: 5, Data: []byte{1, 2, 3, 4}}
	big := Ext{Type: 0x42, Data: bytes.Repeat([]byte{7}, 300)} // ext16
	id := push(t, c, "ext", nil)
	a := c.ok(M{"cmd": "PULL", "queue": "ext", "owner": "w"})
	token := a["token"]
	cases := []struct {
		name  string
		kv    []any // the request's fields in order; its reqId is the case's name
		field string
		typ   int
	}{
		{"PUSH data", []any{"cmd", "PUSH", "queue", "ext2", "data", M{"x": ext}}, "data", 5},
		{"PUSH data ext16", []any{"cmd", "PUSH", "queue", "ext2", "data", []any{1, big}}, "data", 0x42},
		{"PUSHB entry", []any{"cmd", "PUSHB", "queue", "ext2", "jobs", []any{M{"name": "a", "data": 1}, M{"name": "b", "data": ext}}}, "jobs", 5},
		{"ACK result", []any{"cmd", "ACK", "id", id, "token", token, "result", ext}, "result", 5},
		{"Update data", []any{"cmd", "Update", "id", id, "data", M{"a": []any{ext}}}, "data", 5},
	}
	for i, tc := range cases {
		rid, ch := c.prepare(M{"reqId": tc.name})
		// The reqId after the fault for some, before it for others.
		kv := append([]any{"reqId", rid}, tc.kv...)
		if i%2 == 1 {
			kv = append(tc.kv, "reqId", rid)
		}
		c.writeRaw(orderedFrame(kv...))
		a := c.await(rid, ch, callTimeout)
		want := fmt.Sprintf("Invalid command: field %s holds MessagePack ext type %d, which is not supported (only undefined, ext 0, and timestamp, ext -1, are)", tc.field, tc.typ)
		if a["ok"] != false || a["error"] != want {
			t.Errorf("%s: got %v, want %q", tc.name, a, want)
		}
	}
	if n := num(t, sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "ext2"}), "counts")["waiting"]); n != 0 {
		t.Errorf("%v jobs with ext values were pushed", n)
	}
	if st := state(t, c, id); st != "active" {
		t.Errorf("job after a refused ACK: %s", st)
	}
	// Undefined and timestamp pass, inside data and as options.
	date := Ext{Type: -1, Data: []byte{0x65, 0x53, 0xf1, 0x00}}
	c.ok(M{"cmd": "PUSH", "queue": "ext3", "data": M{"when": date, "u": Undefined{}}, "delay": Undefined{}})
}

// panicConn panics in Read once armed: a fault in the connection's
// goroutine outside any handler.
type panicConn struct {
	net.Conn
	armed *atomic.Bool
}

func (p panicConn) Read(b []byte) (int, error) {
	n, err := p.Conn.Read(b)
	if bytes.Contains(b[:n], []byte("PANIC-NOW")) && p.armed.Load() {
		panic("injected fault in a connection read")
	}
	return n, err
}

type panicListener struct {
	net.Listener
	armed *atomic.Bool
}

func (l panicListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return panicConn{nc, l.armed}, nil
}

// A panic in a connection's goroutine outside a handler closes that
// connection, is logged, and leaves the server and its other connections
// alone. (It ended the process.)
func TestHostileConnPanicRecovered(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(2, nil)
	defer b.Close()
	var logs syncBuffer
	s := memServer(b, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	armed := &atomic.Bool{}
	served := make(chan error, 1)
	go func() { served <- s.Serve(panicListener{ln, armed}) }()
	defer func() {
		s.Close()
		<-served
	}()
	other := dial(t, ln.Addr().String())
	other.ok(M{"cmd": "Ping"})
	victim := dial(t, ln.Addr().String())
	victim.ok(M{"cmd": "Ping"})
	armed.Store(true)
	victim.writeRaw(frame(M{"cmd": "Ping", "pad": "PANIC-NOW"}))
	if !victim.closedByPeer(callTimeout) {
		t.Fatal("the connection whose goroutine panicked is still open")
	}
	other.ok(M{"cmd": "PUSH", "queue": "after-panic"})
	dial(t, ln.Addr().String()).ok(M{"cmd": "Ping"})
	eventually(t, callTimeout, "the panic is logged", func() (bool, string) {
		out := logs.String()
		return strings.Contains(out, "connection panic") && strings.Contains(out, "injected fault"), out
	})
	// The count drops after the socket closes, so the victim's decrement
	// may still be on its way when the client sees the close.
	eventually(t, callTimeout, "two connections counted", func() (bool, string) {
		got := s.nconns.Load()
		return got == 2, fmt.Sprintf("%d connections counted, want 2", got)
	})
}

// Failed Auth attempts are answered later each time, the connection is
// closed at the fifth, and another connection authenticates meanwhile.
// (They were answered at once, without end.)
func TestHostileAuthThrottle(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{authTokens: "sesame,open-sesame"})
	bad := dial(t, ts.addr)
	start := time.Now()
	var ids []string
	var chs []chan map[string]any
	for i := 0; i < maxAuthFailures; i++ {
		id, ch := bad.send(M{"cmd": "Auth", "token": "sesame" + strings.Repeat("!", i+1)})
		ids, chs = append(ids, id), append(chs, ch)
	}
	// Meanwhile, another connection is not held up.
	good := dial(t, ts.addr)
	good.ok(M{"cmd": "Auth", "token": "open-sesame"})
	good.ok(M{"cmd": "Ping"})
	goodDone := time.Since(start)
	for i := 0; i < maxAuthFailures; i++ {
		a := bad.await(ids[i], chs[i], 3*callTimeout)
		if i < maxAuthFailures-1 && a["error"] != "Invalid token" {
			t.Fatalf("failure %d: %v", i+1, a)
		}
		if i == maxAuthFailures-1 && a["error"] != "Invalid token: 5 failed Auth attempts, the most a connection may make; closing the connection" {
			t.Fatalf("last failure: %v", a)
		}
	}
	last := time.Since(start)
	if !bad.closedByPeer(callTimeout) {
		t.Fatal("connection still open after 5 failed Auth attempts")
	}
	// The waits are lower bounds: 200+400+800+1600 ms before the fifth
	// answer.
	if min := 3 * time.Second; last < min {
		t.Errorf("the fifth failure was answered after %v, want at least %v", last, min)
	}
	if goodDone >= last {
		t.Errorf("the other connection authenticated after %v, once the throttled one was done (%v)", goodDone, last)
	}
	t.Logf("five failures answered after %v; the other connection authenticated after %v", last, goodDone)

	// Digests compare tokens of any length: prefixes and extensions fail.
	b := NewMemEngine(1, nil)
	defer b.Close()
	s := memServer(b, []string{"sesame", "a-much-longer-token-than-the-first"}, quietLog())
	for tok, want := range map[string]bool{"sesame": true, "a-much-longer-token-than-the-first": true,
		"": false, "sesam": false, "sesame ": false, "a-much-longer-token-than-the-firs": false, "SESAME": false} {
		if s.checkToken(tok) != want {
			t.Errorf("checkToken(%q) = %v", tok, !want)
		}
	}
}

// A connection that does not authenticate in time is told so and closed,
// whether it says nothing or sends commands; an authenticated one idles
// as long as it likes. (Such connections were held forever.)
func TestHostileAuthDeadline(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{authTokens: "sesame", authTimeout: 400 * time.Millisecond})
	silent, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	busy := dial(t, ts.addr)
	authed := dial(t, ts.addr)
	authed.ok(M{"cmd": "Auth", "token": "sesame"})
	// Opened after authed and silent: once it is told of the deadline,
	// authed's is past too.
	later, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer later.Close()

	a, err := readAnswer(silent, callTimeout)
	if err != nil {
		t.Fatalf("a silent connection got no word before being closed: %v", err)
	}
	if want := "Authentication timeout: a connection must send Auth within 400ms"; a["error"] != want {
		t.Fatalf("got %v, want %q", a, want)
	}
	if !closedWithin(silent, callTimeout) {
		t.Fatal("silent connection not closed at the Auth deadline")
	}
	for !busy.closedByPeer(50 * time.Millisecond) {
		if _, err := busy.do(M{"cmd": "Ping"}, callTimeout); err != nil {
			break
		}
	}
	if !busy.closedByPeer(callTimeout) {
		t.Fatal("a connection sending commands without Auth is not closed at the deadline")
	}
	if a, err := readAnswer(later, callTimeout); err != nil || a["error"] == nil {
		t.Fatalf("a connection opened after the authenticated one got %v %v at the deadline", a, err)
	}
	authed.ok(M{"cmd": "Ping"})

	// One that sends and never reads its answers is closed as well, not
	// held while its answers wait to be written.
	deaf, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer deaf.Close()
	ping := frame(M{"cmd": "Ping"})
	burst := bytes.Repeat(ping, 4096)
	ended := make(chan error, 1)
	go func() {
		deaf.SetWriteDeadline(time.Now().Add(3 * callTimeout))
		for {
			if _, err := deaf.Write(burst); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		if isTimeout(err) {
			t.Fatalf("a connection that does not read was not closed: %v", err)
		}
	case <-time.After(2 * callTimeout):
		t.Fatal("a connection that sends without reading, and never authenticates, is still open")
	}
}

// A connection in the middle of a frame that stops sending is closed
// after the stall timeout (the reference's TCP_IDLE_TIMEOUT_MS); one idle
// between frames is not.
//
// The stall timeout is 20 times the slow writer's longest pause: with 400
// ms, a busy machine held the writer past it (a flake in CI).
func TestHostileStalledFrame(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{tcpIdleTimeout: 2000})
	idle := dial(t, ts.addr)
	idle.ok(M{"cmd": "Ping"})
	nc, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	f := frame(M{"cmd": "Ping", "reqId": "half"})
	nc.Write(f[:len(f)/2])
	a, err := readAnswer(nc, callTimeout)
	if err != nil || a["error"] != "Connection closed: an incomplete frame made no progress for 2s" {
		t.Fatalf("stalled frame: %v %v", a, err)
	}
	if !closedWithin(nc, callTimeout) {
		t.Fatal("stalled connection not closed")
	}
	// A frame that keeps arriving, slowly, is not stalled.
	slow, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	for i := range f {
		slow.Write(f[i : i+1])
		if i%8 == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if a, err := readAnswer(slow, callTimeout); err != nil || a["ok"] != true {
		t.Fatalf("slow frame: %v %v", a, err)
	}
	idle.ok(M{"cmd": "Ping"})
}

// A TLS handshake that does not complete in time ends the connection.
// (A client that connected and sent nothing was held forever.)
func TestHostileTLSHandshakeDeadline(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	cert, key := ca.issue(t, 1)
	ts := startServer(t, &config{tlsCert: cert, tlsKey: key, handshakeTimeout: 400 * time.Millisecond})
	nc, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if !closedWithin(nc, callTimeout) {
		t.Fatal("a connection that never shook hands is still open")
	}
	// Half a ClientHello counts no more than nothing.
	nc2, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	nc2.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01})
	if !closedWithin(nc2, callTimeout) {
		t.Fatal("a connection with half a handshake is still open")
	}
	// A real client is unaffected.
	tc, err := tls.Dial("tcp", ts.addr, &tls.Config{RootCAs: ca.pool(), ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	// Past the handshake deadline: a connection opened after tc shook
	// hands has reached its own.
	later, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer later.Close()
	if !closedWithin(later, callTimeout) {
		t.Fatal("a connection that never shook hands is still open")
	}
	tc.Write(frame(M{"cmd": "Ping", "reqId": "tls"}))
	if a, err := readAnswer(tc, callTimeout); err != nil || a["ok"] != true {
		t.Fatalf("Ping over TLS after the handshake deadline: %v %v", a, err)
	}
}

// Connections past --max-connections are told the limit and closed;
// once one closes, a new one is served.
func TestHostileMaxConnections(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{maxConns: 3})
	var cs []*tclient
	for i := 0; i < 3; i++ {
		c := dial(t, ts.addr)
		c.ok(M{"cmd": "Ping"})
		cs = append(cs, c)
	}
	extra, err := dialRaw(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	a, err := readAnswer(extra, callTimeout)
	want := "Too many connections: the server accepts at most 3 (--max-connections); try again later"
	if err != nil || a["ok"] != false || a["error"] != want {
		t.Fatalf("fourth connection: %v %v, want %q", a, err, want)
	}
	if !closedWithin(extra, callTimeout) {
		t.Fatal("the connection past the limit is still open")
	}
	cs[0].close()
	eventually(t, callTimeout, "a connection is served once another has closed", func() (bool, string) {
		nc, err := dialRaw(ts.addr)
		if err != nil {
			return false, err.Error()
		}
		defer nc.Close()
		nc.Write(frame(M{"cmd": "Ping", "reqId": "x"}))
		a, err := readAnswer(nc, callTimeout)
		if err != nil {
			return false, err.Error()
		}
		return a["ok"] == true, fmt.Sprint(a)
	})
	cs[1].ok(M{"cmd": "Ping"})
}

// failingListener fails its first accepts with the errors an overloaded
// machine gives, then accepts for real.
type failingListener struct {
	net.Listener
	errs  []error
	calls atomic.Int64
}

func (l *failingListener) Accept() (net.Conn, error) {
	if i := int(l.calls.Add(1)) - 1; i < len(l.errs) {
		return nil, l.errs[i]
	}
	return l.Listener.Accept()
}

func acceptErrors(n int) []error {
	kinds := []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EPROTO}
	var out []error
	for i := 0; i < n; i++ {
		out = append(out, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", kinds[i%len(kinds)])})
	}
	return out
}

// Failed accepts of every kind are retried with a growing pause and a
// rate-limited log line; the TCP server and the HTTP server both go on.
// (The TCP server stopped on the first error that was not a timeout, the
// HTTP one on the first that net/http does not deem temporary, such as
// ENOBUFS.)
func TestHostileAcceptErrors(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(2, nil)
	defer b.Close()
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	s := memServer(b, nil, log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &failingListener{Listener: ln, errs: acceptErrors(10)}
	served := make(chan error, 1)
	go func() { served <- s.Serve(fl) }()
	c := dial(t, ln.Addr().String())
	c.ok(M{"cmd": "Ping"})
	select {
	case err := <-served:
		t.Fatalf("Serve returned: %v", err)
	default:
	}
	if n := strings.Count(logs.String(), "accept failed"); n != 1 {
		t.Errorf("%d log lines for 10 failed accepts, want 1:\n%s", n, logs.String())
	}
	s.Close()
	if err := <-served; err != nil {
		t.Fatalf("Serve after Close: %v", err)
	}

	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := newRetryListener(&failingListener{Listener: hln, errs: acceptErrors(8)}, "http", log)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up") })}
	hdone := make(chan error, 1)
	go func() { hdone <- hs.Serve(rl) }()
	resp, err := (&http.Client{Timeout: callTimeout}).Get("http://" + hln.Addr().String() + "/")
	if err != nil {
		t.Fatalf("HTTP after failed accepts: %v", err)
	}
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	hs.Shutdown(ctx)
	if err := <-hdone; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("HTTP Serve: %v", err)
	}
}

// The default connection limit stays under the file limit, leaving room
// for the server's other descriptors, and allows 10,000 connections when
// the file limit does.
func TestDefaultMaxConnections(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		files     uint64
		min, max  int
		exactWant int
	}{
		{files: 64, min: 16, max: 48},
		{files: 256, min: 100, max: 200},
		{files: 1024, min: 700, max: 900, exactWant: 794},
		{files: 20000, min: 10000, max: 19000, exactWant: 17872},
		{files: 1 << 20, min: 10000, max: defaultMaxConnsCap},
	} {
		got := defaultMaxConnections(tc.files)
		if got < tc.min || got > tc.max || (tc.exactWant != 0 && got != tc.exactWant) {
			t.Errorf("defaultMaxConnections(%d) = %d, want within [%d, %d]", tc.files, got, tc.min, tc.max)
		}
	}
}

// --max-connections and QUEUED_MAX_CONNECTIONS set the limit; without
// them it follows the open-file limit; below 1 is refused.
//
// Serial: it sets environment variables (t.Setenv).
func TestMaxConnectionsFlag(t *testing.T) {
	t.Setenv("QUEUED_MAX_CONNECTIONS", "")
	fs, c := serverFlags(io.Discard)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if want := defaultMaxConnections(fileLimit()); c.maxConns != want {
		t.Errorf("default --max-connections %d, want %d", c.maxConns, want)
	}
	t.Setenv("QUEUED_MAX_CONNECTIONS", "7")
	fs, c = serverFlags(io.Discard)
	if err := fs.Parse(nil); err != nil || c.maxConns != 7 {
		t.Errorf("QUEUED_MAX_CONNECTIONS=7 gives %d (%v)", c.maxConns, err)
	}
	if err := fs.Parse([]string{"--max-connections", "9"}); err != nil || c.maxConns != 9 {
		t.Errorf("--max-connections 9 gives %d (%v)", c.maxConns, err)
	}
	var out bytes.Buffer
	if code := run([]string{"serve", "--memory", "--max-connections", "0"}, &out, &out); code != 2 ||
		!strings.Contains(out.String(), "--max-connections must be at least 1") {
		t.Errorf("--max-connections 0: exit %d, %q", code, out.String())
	}
}
