package main

// Tests for live_ws.go. The client here is written from RFC 6455 directly: it
// builds frames byte by byte (masked or not, fragmented, broken on
// purpose) and parses the server's frames with its own code, so the
// server's codec is never checked against itself.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// wsTestTimeout bounds every wait for the server; it only trips on a hang.
const wsTestTimeout = 10 * time.Second

// ---------------------------------------------------------------------------
// The test client

type wsClient struct {
	t    testing.TB
	nc   net.Conn
	br   *bufio.Reader
	resp *http.Response
}

var wsMaskCounter atomic.Uint32

// wsFrameBytes lays out one frame. rsv goes into bits 4-6 of the first
// byte; a masked frame gets a key that changes from frame to frame.
func wsFrameBytes(fin bool, rsv, op byte, payload []byte, mask bool) []byte {
	b0 := op&0x0f | (rsv&7)<<4
	if fin {
		b0 |= 0x80
	}
	out := []byte{b0}
	var m byte
	if mask {
		m = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		out = append(out, m|byte(n))
	case n < 1<<16:
		out = append(out, m|126, byte(n>>8), byte(n))
	default:
		out = append(out, m|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	if !mask {
		return append(out, payload...)
	}
	var key [4]byte
	binary.BigEndian.PutUint32(key[:], 0x9e3779b9*wsMaskCounter.Add(1))
	out = append(out, key[:]...)
	for i, b := range payload {
		out = append(out, b^key[i%4])
	}
	return out
}

func wsCloseBody(code int, reason string) []byte {
	return append(binary.BigEndian.AppendUint16(nil, uint16(code)), reason...)
}

// wsRequest is an opening handshake; extra lines replace or add headers
// ("Name: value"; "Name:" alone removes one).
func wsRequest(path string, extra ...string) string {
	hdr := map[string]string{
		"Host": "test", "Upgrade": "websocket", "Connection": "Upgrade",
		"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13",
	}
	order := []string{"Host", "Upgrade", "Connection", "Sec-WebSocket-Key", "Sec-WebSocket-Version"}
	method, proto := "GET", "HTTP/1.1"
	for _, e := range extra {
		k, v, _ := strings.Cut(e, ":")
		switch k {
		case "METHOD":
			method = strings.TrimSpace(v)
			continue
		case "PROTO":
			proto = strings.TrimSpace(v)
			continue
		}
		if _, ok := hdr[k]; !ok {
			order = append(order, k)
		}
		hdr[k] = strings.TrimSpace(v)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s\r\n", method, path, proto)
	for _, k := range order {
		if hdr[k] != "" {
			fmt.Fprintf(&b, "%s: %s\r\n", k, hdr[k])
		}
	}
	b.WriteString("\r\n")
	return b.String()
}

// rawHandshake sends req (and whatever follows it) and reads the answer.
func rawHandshake(t testing.TB, addr, req string, after ...[]byte) *wsClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(wsTestTimeout))
	out := []byte(req)
	for _, a := range after {
		out = append(out, a...)
	}
	if _, err := nc.Write(out); err != nil {
		t.Fatal(err)
	}
	c := &wsClient{t: t, nc: nc, br: bufio.NewReader(nc)}
	c.resp, err = http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("reading the handshake answer: %v", err)
	}
	return c
}

// dialWS opens a WebSocket and checks the server's side of the handshake.
func dialWS(t testing.TB, addr, path string, after ...[]byte) *wsClient {
	t.Helper()
	c := rawHandshake(t, addr, wsRequest(path), after...)
	if c.resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(c.resp.Body)
		t.Fatalf("handshake: %s %s", c.resp.Status, body)
	}
	if got := c.resp.Header.Get("Sec-WebSocket-Accept"); got != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("Sec-WebSocket-Accept %q", got)
	}
	if !strings.EqualFold(c.resp.Header.Get("Upgrade"), "websocket") || !strings.EqualFold(c.resp.Header.Get("Connection"), "upgrade") {
		t.Fatalf("handshake headers %v", c.resp.Header)
	}
	return c
}

func (c *wsClient) write(frames ...[]byte) {
	c.t.Helper()
	c.nc.SetWriteDeadline(time.Now().Add(wsTestTimeout))
	if _, err := c.nc.Write(bytes.Join(frames, nil)); err != nil {
		c.t.Fatalf("client write: %v", err)
	}
}

func (c *wsClient) text(s string) { c.t.Helper(); c.write(wsFrameBytes(true, 0, 0x1, []byte(s), true)) }

type wsTestFrame struct {
	fin     bool
	op      byte
	payload []byte
}

// read parses one server frame. Server frames must not be masked and,
// with no extension, have clear RSV bits.
func (c *wsClient) read() (wsTestFrame, error) {
	c.nc.SetReadDeadline(time.Now().Add(wsTestTimeout))
	var h [2]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return wsTestFrame{}, err
	}
	f := wsTestFrame{fin: h[0]&0x80 != 0, op: h[0] & 0x0f}
	if h[0]&0x70 != 0 {
		return f, fmt.Errorf("server frame with RSV bits %#x", h[0])
	}
	if h[1]&0x80 != 0 {
		return f, errors.New("server frame is masked")
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(c.br, b[:]); err != nil {
			return f, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
		if n < 126 {
			return f, fmt.Errorf("non-minimal 16-bit length %d", n)
		}
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(c.br, b[:]); err != nil {
			return f, err
		}
		n = binary.BigEndian.Uint64(b[:])
		if n < 1<<16 || n > 1<<32 {
			return f, fmt.Errorf("odd 64-bit length %d", n)
		}
	}
	f.payload = make([]byte, n)
	_, err := io.ReadFull(c.br, f.payload)
	return f, err
}

func (c *wsClient) mustRead() wsTestFrame {
	c.t.Helper()
	f, err := c.read()
	if err != nil {
		c.t.Fatalf("client read: %v", err)
	}
	return f
}

// readData returns the next data frame's payload, skipping pings.
func (c *wsClient) readData() (byte, string) {
	c.t.Helper()
	for {
		f := c.mustRead()
		switch f.op {
		case 0x9:
			continue
		case 0x1, 0x2:
			if !f.fin {
				c.t.Fatalf("the server fragmented a message")
			}
			return f.op, string(f.payload)
		default:
			c.t.Fatalf("expected a data frame, got opcode %#x %q", f.op, f.payload)
		}
	}
}

// expectClose reads up to the server's close frame (skipping pings and
// data) and returns its code (0 for none) and reason.
func (c *wsClient) expectClose() (int, string) {
	c.t.Helper()
	for {
		f := c.mustRead()
		switch f.op {
		case 0x8:
			if len(f.payload) == 0 {
				return 0, ""
			}
			if len(f.payload) < 2 {
				c.t.Fatalf("close frame body %x", f.payload)
			}
			return int(binary.BigEndian.Uint16(f.payload)), string(f.payload[2:])
		case 0x9, 0x1, 0x2:
		default:
			c.t.Fatalf("expected a close frame, got opcode %#x", f.op)
		}
	}
}

// slowReader shrinks the client's receive buffer, so that a client that
// does not read fills up in kilobytes rather than megabytes.
func (c *wsClient) slowReader() {
	if tc, ok := c.nc.(*net.TCPConn); ok {
		tc.SetReadBuffer(16 << 10)
	}
}

// expectEOF checks that the server has closed the TCP connection.
func (c *wsClient) expectEOF() {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(wsTestTimeout))
	n, err := io.Copy(io.Discard, c.br)
	if err != nil && !errors.Is(err, net.ErrClosed) && !isConnReset(err) {
		c.t.Fatalf("waiting for the server to close: %v (after %d bytes)", err, n)
	}
	if n > 0 {
		c.t.Fatalf("%d more bytes after the close frame", n)
	}
}

func isConnReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// ---------------------------------------------------------------------------
// A server that echoes text and reports what it read

type wsTestMsg struct {
	op  wsOpcode
	msg string
}

type wsHarness struct {
	addr  string
	conns chan *wsConn
	msgs  chan wsTestMsg
	ends  chan error
}

func startWSServer(t testing.TB, opts wsOptions) *wsHarness {
	h := &wsHarness{conns: make(chan *wsConn, 16), msgs: make(chan wsTestMsg, 1024), ends: make(chan error, 16)}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := upgradeWS(w, r, opts)
		if err != nil {
			return
		}
		h.conns <- c
		for {
			op, msg, err := c.ReadMessage()
			if err != nil {
				<-c.Done()
				h.ends <- err
				return
			}
			h.msgs <- wsTestMsg{op, string(msg)}
			if op == wsText {
				c.Send(msg)
			}
		}
	}))
	t.Cleanup(ts.Close)
	h.addr = ts.Listener.Addr().String()
	return h
}

func (h *wsHarness) conn(t testing.TB) *wsConn {
	t.Helper()
	select {
	case c := <-h.conns:
		return c
	case <-time.After(wsTestTimeout):
		t.Fatal("no connection on the server")
		return nil
	}
}

func (h *wsHarness) msg(t testing.TB) wsTestMsg {
	t.Helper()
	select {
	case m := <-h.msgs:
		return m
	case <-time.After(wsTestTimeout):
		t.Fatal("no message on the server")
		return wsTestMsg{}
	}
}

// end returns the error that ended the server's read loop, once the
// connection is fully closed.
func (h *wsHarness) end(t testing.TB) error {
	t.Helper()
	select {
	case err := <-h.ends:
		return err
	case <-time.After(wsTestTimeout):
		t.Fatal("the server's connection did not end")
		return nil
	}
}

// ---------------------------------------------------------------------------
// Handshake

func TestWSAcceptKey(t *testing.T) {
	t.Parallel()
	// RFC 6455 section 1.3.
	if got := wsAcceptKey("dGhlIHNhbXBsZSBub25jZQ=="); got != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("wsAcceptKey = %q", got)
	}
	h := startWSServer(t, wsOptions{})
	c := dialWS(t, h.addr, "/ws")
	c.text("hello")
	if op, m := c.readData(); op != 0x1 || m != "hello" {
		t.Fatalf("echo: %#x %q", op, m)
	}
}

func TestWSHandshakeTokens(t *testing.T) {
	t.Parallel()
	// Header tokens are case-insensitive and may come in lists.
	h := startWSServer(t, wsOptions{})
	c := rawHandshake(t, h.addr, wsRequest("/", "Upgrade: WebSocket", "Connection: keep-alive, Upgrade"))
	if c.resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %s", c.resp.Status)
	}
}

func TestWSBadHandshakes(t *testing.T) {
	t.Parallel()
	h := startWSServer(t, wsOptions{CheckOrigin: func(r *http.Request) bool {
		return r.Header.Get("Origin") != "https://evil.example"
	}})
	cases := []struct {
		name   string
		extra  []string
		status int
		header string // a header the refusal must carry, "Name: value"
		reason string
	}{
		{"post", []string{"METHOD: POST"}, 405, "Allow: GET", "GET"},
		{"http 1.0", []string{"PROTO: HTTP/1.0"}, 400, "", "HTTP/1.1"},
		{"no upgrade", []string{"Upgrade:"}, 426, "Upgrade: websocket", "Upgrade"},
		{"upgrade h2c", []string{"Upgrade: h2c"}, 426, "Upgrade: websocket", "Upgrade"},
		{"connection keep-alive", []string{"Connection: keep-alive"}, 400, "", "Connection"},
		{"no connection", []string{"Connection:"}, 400, "", "Connection"},
		{"version 8", []string{"Sec-WebSocket-Version: 8"}, 426, "Sec-WebSocket-Version: 13", "13"},
		{"no version", []string{"Sec-WebSocket-Version:"}, 426, "Sec-WebSocket-Version: 13", "13"},
		{"no key", []string{"Sec-WebSocket-Key:"}, 400, "", "Sec-WebSocket-Key"},
		{"key not base64", []string{"Sec-WebSocket-Key: not base64!"}, 400, "", "Sec-WebSocket-Key"},
		{"key of 15 bytes", []string{"Sec-WebSocket-Key: AAAAAAAAAAAAAAAAAAAA"}, 400, "", "Sec-WebSocket-Key"},
		{"origin refused", []string{"Origin: https://evil.example"}, 403, "", "origin"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := rawHandshake(t, h.addr, wsRequest("/ws", tc.extra...))
			body, _ := io.ReadAll(c.resp.Body)
			if c.resp.StatusCode != tc.status {
				t.Fatalf("status %s (%s), want %d", c.resp.Status, body, tc.status)
			}
			if !strings.Contains(string(body), tc.reason) {
				t.Errorf("body %q does not say why (%q)", body, tc.reason)
			}
			if tc.header != "" {
				k, v, _ := strings.Cut(tc.header, ": ")
				if got := c.resp.Header.Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
		})
	}
	select {
	case <-h.conns:
		t.Fatal("a refused handshake produced a connection")
	default:
	}
}

func TestWSFramesRightAfterHandshake(t *testing.T) {
	t.Parallel()
	// A client may send frames in the same packet as its request; they sit
	// in net/http's buffer at the hijack and must not be lost.
	h := startWSServer(t, wsOptions{})
	c := dialWS(t, h.addr, "/ws", wsFrameBytes(true, 0, 0x1, []byte("early"), true))
	if _, m := c.readData(); m != "early" {
		t.Fatalf("echo %q", m)
	}
}

// ---------------------------------------------------------------------------
// Frames

func TestWSReadFrameRFCExamples(t *testing.T) {
	t.Parallel()
	// RFC 6455 section 5.7: a masked "Hello" from a client.
	br := bufio.NewReader(bytes.NewReader([]byte{0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58}))
	f, err := readWSFrame(br, 1024)
	if err != nil || !f.fin || f.op != wsText || string(f.payload) != "Hello" {
		t.Fatalf("got %+v %q, %v", f, f.payload, err)
	}
	// The same section's unmasked frames, as the server writes them.
	for _, tc := range []struct {
		op   wsOpcode
		n    int
		want []byte
	}{
		{wsText, 5, []byte{0x81, 0x05}},
		{wsBinary, 256, []byte{0x82, 0x7e, 0x01, 0x00}},
		{wsBinary, 65536, []byte{0x82, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0}},
	} {
		if got := appendWSHeader(nil, tc.op, tc.n); !bytes.Equal(got, tc.want) {
			t.Errorf("header for %d bytes: % x, want % x", tc.n, got, tc.want)
		}
	}
}

func TestWSMaskedMessages(t *testing.T) {
	t.Parallel()
	h := startWSServer(t, wsOptions{AllowBinary: true})
	c := dialWS(t, h.addr, "/ws")
	for _, n := range []int{0, 1, 125, 126, 65535, 65536, 200000} {
		msg := strings.Repeat("é", n/2) + strings.Repeat("x", n%2)
		c.text(msg)
		if got := h.msg(t); got.op != wsText || got.msg != msg {
			t.Fatalf("%d bytes: server read %d bytes (op %d)", n, len(got.msg), got.op)
		}
		if _, echo := c.readData(); echo != msg {
			t.Fatalf("%d bytes: echo of %d bytes", n, len(echo))
		}
	}
	c.write(wsFrameBytes(true, 0, 0x2, []byte{0, 1, 2, 0xff}, true))
	if got := h.msg(t); got.op != wsBinary || got.msg != "\x00\x01\x02\xff" {
		t.Fatalf("binary: %+v", got)
	}
}

func TestWSFragmentedWithInterleavedPing(t *testing.T) {
	t.Parallel()
	h := startWSServer(t, wsOptions{})
	c := dialWS(t, h.addr, "/ws")
	// "héllo wörld" in three fragments, split inside a two-byte rune, with
	// a ping between the second and third.
	msg := []byte("héllo wörld")
	cut := bytes.IndexByte(msg, 0xc3) + 1 // the middle of é
	c.write(
		wsFrameBytes(false, 0, 0x1, msg[:cut], true),
		wsFrameBytes(false, 0, 0x0, msg[cut:8], true),
		wsFrameBytes(true, 0, 0x9, []byte("are you there"), true),
		wsFrameBytes(true, 0, 0x0, msg[8:], true),
	)
	f := c.mustRead()
	if f.op != 0xA || string(f.payload) != "are you there" {
		t.Fatalf("expected the pong first, got %#x %q", f.op, f.payload)
	}
	if got := h.msg(t); got.msg != string(msg) {
		t.Fatalf("reassembled %q", got.msg)
	}
	if _, echo := c.readData(); echo != string(msg) {
		t.Fatalf("echo %q", echo)
	}
	// An unsolicited pong is fine and changes nothing.
	c.write(wsFrameBytes(true, 0, 0xA, []byte("x"), true))
	c.text("still here")
	if _, echo := c.readData(); echo != "still here" {
		t.Fatalf("echo %q", echo)
	}
}

// TestWSProtocolErrors sends each kind of broken input and checks the
// close code, that the server closes the TCP connection after its close
// frame, and that nothing reached the application.
func TestWSProtocolErrors(t *testing.T) {
	t.Parallel()
	big := func(n int) []byte { return bytes.Repeat([]byte("a"), n) }
	lengthOnly := func(n uint64) []byte { // a header that promises n bytes, and nothing else
		return binary.BigEndian.AppendUint64([]byte{0x82, 0x80 | 127}, n)
	}
	cases := []struct {
		name   string
		frames [][]byte
		code   int
	}{
		{"unmasked", [][]byte{wsFrameBytes(true, 0, 0x1, []byte("hi"), false)}, 1002},
		{"rsv1 without extension", [][]byte{wsFrameBytes(true, 4, 0x1, []byte("hi"), true)}, 1002},
		{"rsv3", [][]byte{wsFrameBytes(true, 1, 0x1, []byte("hi"), true)}, 1002},
		{"reserved data opcode", [][]byte{wsFrameBytes(true, 0, 0x3, nil, true)}, 1002},
		{"reserved control opcode", [][]byte{wsFrameBytes(true, 0, 0xB, nil, true)}, 1002},
		{"continuation first", [][]byte{wsFrameBytes(true, 0, 0x0, []byte("x"), true)}, 1002},
		{"text inside a fragmented message", [][]byte{
			wsFrameBytes(false, 0, 0x1, []byte("a"), true),
			wsFrameBytes(true, 0, 0x1, []byte("b"), true)}, 1002},
		{"fragmented ping", [][]byte{wsFrameBytes(false, 0, 0x9, nil, true)}, 1002},
		{"ping of 126 bytes", [][]byte{wsFrameBytes(true, 0, 0x9, big(126), true)}, 1002},
		{"length with the top bit set", [][]byte{lengthOnly(1 << 63)}, 1002},
		{"close body of one byte", [][]byte{wsFrameBytes(true, 0, 0x8, []byte{3}, true)}, 1002},
		{"close code 999", [][]byte{wsFrameBytes(true, 0, 0x8, wsCloseBody(999, ""), true)}, 1002},
		{"close code 1004", [][]byte{wsFrameBytes(true, 0, 0x8, wsCloseBody(1004, ""), true)}, 1002},
		{"close code 1005", [][]byte{wsFrameBytes(true, 0, 0x8, wsCloseBody(1005, ""), true)}, 1002},
		{"close code 1006", [][]byte{wsFrameBytes(true, 0, 0x8, wsCloseBody(1006, ""), true)}, 1002},
		{"close code 1015", [][]byte{wsFrameBytes(true, 0, 0x8, wsCloseBody(1015, ""), true)}, 1002},
		{"close code 2999", [][]byte{wsFrameBytes(true, 0, 0x8, wsCloseBody(2999, ""), true)}, 1002},
		{"close code 5000", [][]byte{wsFrameBytes(true, 0, 0x8, wsCloseBody(5000, ""), true)}, 1002},
		{"binary not accepted", [][]byte{wsFrameBytes(true, 0, 0x2, []byte{1}, true)}, 1003},
		{"invalid UTF-8", [][]byte{wsFrameBytes(true, 0, 0x1, []byte{'a', 0xff, 'b'}, true)}, 1007},
		{"overlong UTF-8", [][]byte{wsFrameBytes(true, 0, 0x1, []byte{0xc0, 0xaf}, true)}, 1007},
		{"UTF-16 surrogate", [][]byte{wsFrameBytes(true, 0, 0x1, []byte{0xed, 0xa0, 0x80}, true)}, 1007},
		{"UTF-8 cut at the end", [][]byte{
			wsFrameBytes(false, 0, 0x1, []byte("ok"), true),
			wsFrameBytes(true, 0, 0x0, []byte{0xe2, 0x82}, true)}, 1007},
		{"close reason not UTF-8", [][]byte{wsFrameBytes(true, 0, 0x8, wsCloseBody(1000, "\xff"), true)}, 1007},
		{"frame over the limit", [][]byte{wsFrameBytes(true, 0, 0x1, big(1025), true)}, 1009},
		// Refused from the header: the server neither waits for nor
		// allocates the terabyte.
		{"terabyte promised", [][]byte{lengthOnly(1 << 40)}, 1009},
		{"fragments over the limit", [][]byte{
			wsFrameBytes(false, 0, 0x1, big(400), true),
			wsFrameBytes(false, 0, 0x0, big(400), true),
			wsFrameBytes(true, 0, 0x0, big(400), true)}, 1009},
	}
	h := startWSServer(t, wsOptions{MaxMessage: 1024})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialWS(t, h.addr, "/ws")
			srv := h.conn(t)
			c.write(tc.frames...)
			code, reason := c.expectClose()
			if code != tc.code {
				t.Fatalf("close code %d (%q), want %d", code, reason, tc.code)
			}
			if reason == "" {
				t.Errorf("close %d without a reason", code)
			}
			c.expectEOF()
			var ce *wsCloseError
			if err := h.end(t); !errors.As(err, &ce) || ce.Code != tc.code || ce.Remote {
				t.Errorf("ReadMessage ended with %v", err)
			}
			select {
			case m := <-h.msgs:
				t.Errorf("the application got %+v", m)
			default:
			}
			if srv.Send([]byte("late")) {
				t.Error("Send succeeded on a closed connection")
			}
		})
	}
}

func TestWSPeerCloseIsEchoed(t *testing.T) {
	t.Parallel()
	h := startWSServer(t, wsOptions{})
	for _, tc := range []struct {
		body []byte
		code int // what the server answers; 0: a close without a body
	}{
		{wsCloseBody(1000, "done"), 1000},
		{wsCloseBody(1001, ""), 1001},
		{wsCloseBody(3000, "app"), 3000},
		{wsCloseBody(4999, "private"), 4999},
		{nil, 0},
	} {
		c := dialWS(t, h.addr, "/ws")
		c.text("before")
		c.readData()
		c.write(wsFrameBytes(true, 0, 0x8, tc.body, true))
		if code, _ := c.expectClose(); code != tc.code {
			t.Errorf("sent % x: answered %d, want %d", tc.body, code, tc.code)
		}
		c.expectEOF()
		<-h.msgs
		want := tc.code
		if want == 0 {
			want = wsCloseNoStatus
		}
		var ce *wsCloseError
		if err := h.end(t); !errors.As(err, &ce) || !ce.Remote || ce.Code != want {
			t.Errorf("sent % x: ReadMessage ended with %v, want code %d", tc.body, err, want)
		}
	}
}

func TestWSServerCloseHandshake(t *testing.T) {
	t.Parallel()
	h := startWSServer(t, wsOptions{CloseTimeout: 5 * time.Second})
	c := dialWS(t, h.addr, "/ws")
	srv := h.conn(t)
	srv.Send([]byte("queued before the close"))
	srv.Close(wsCloseNormal, "bye")
	if srv.Send([]byte("after")) {
		t.Error("Send succeeded after Close")
	}
	if _, m := c.readData(); m != "queued before the close" {
		t.Fatalf("got %q", m)
	}
	code, reason := c.expectClose()
	if code != 1000 || reason != "bye" {
		t.Fatalf("close %d %q", code, reason)
	}
	// The server waits for the answer before it closes the socket.
	select {
	case <-srv.Done():
		t.Fatal("closed the socket before the client answered")
	case <-time.After(50 * time.Millisecond):
	}
	c.write(wsFrameBytes(true, 0, 0x8, wsCloseBody(1000, ""), true))
	c.expectEOF()
	var ce *wsCloseError
	if err := h.end(t); !errors.As(err, &ce) || ce.Code != 1000 || !ce.Remote {
		t.Errorf("ReadMessage ended with %v", err)
	}
}

func TestWSServerCloseUnanswered(t *testing.T) {
	t.Parallel()
	h := startWSServer(t, wsOptions{CloseTimeout: 200 * time.Millisecond})
	c := dialWS(t, h.addr, "/ws")
	srv := h.conn(t)
	start := time.Now()
	srv.Close(wsCloseGoingAway, "shutting down")
	if code, _ := c.expectClose(); code != 1001 {
		t.Fatalf("close %d", code)
	}
	c.expectEOF()
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("socket closed after %v, before CloseTimeout", d)
	}
	h.end(t)
}

func TestWSKeepalive(t *testing.T) {
	t.Parallel()
	h := startWSServer(t, wsOptions{PingInterval: 30 * time.Millisecond, IdleTimeout: 400 * time.Millisecond})
	c := dialWS(t, h.addr, "/ws")
	// A client that answers pings stays, for several idle timeouts.
	pings := 0
	for until := time.Now().Add(1200 * time.Millisecond); time.Now().Before(until); {
		f := c.mustRead()
		if f.op != 0x9 {
			t.Fatalf("expected pings, got %#x", f.op)
		}
		pings++
		c.write(wsFrameBytes(true, 0, 0xA, f.payload, true))
	}
	c.text("alive")
	if _, m := c.readData(); m != "alive" {
		t.Fatalf("got %q", m)
	}
	if pings < 3 {
		t.Errorf("%d pings in 1.2s at a 30ms interval", pings)
	}
	// One that stops answering is closed as idle.
	if code, reason := c.expectClose(); code != 1001 || !strings.Contains(reason, "idle") {
		t.Fatalf("close %d %q", code, reason)
	}
	c.expectEOF()
	h.end(t)
}

// TestWSSlowConsumerClosed: a client that does not read fills its socket,
// then its queue; Send never blocks meanwhile, and the connection is
// closed with 1008 once the queue is full.
func TestWSSlowConsumerClosed(t *testing.T) {
	t.Parallel()
	h := startWSServer(t, wsOptions{SendQueue: 64, SendQueueBytes: 256 << 10, CloseTimeout: 5 * time.Second})
	c := dialWS(t, h.addr, "/ws")
	c.slowReader()
	srv := h.conn(t)
	payload := []byte(strings.Repeat("x", 16<<10))
	start := time.Now()
	var slowest time.Duration
	sent := 0
	for ; sent < 100000; sent++ {
		t0 := time.Now()
		ok := srv.Send(payload)
		slowest = max(slowest, time.Since(t0))
		if !ok {
			break
		}
		// Paced, so that the writer keeps up until the socket is full and
		// the queue fills behind a blocked write, not behind a burst.
		time.Sleep(100 * time.Microsecond)
	}
	elapsed := time.Since(start)
	t.Logf("%d messages queued before the drop, in %v; slowest Send %v", sent, elapsed, slowest)
	if sent == 100000 {
		t.Fatal("the queue never filled")
	}
	if slowest > time.Second {
		t.Errorf("a Send took %v", slowest)
	}
	if srv.Send(payload) {
		t.Error("Send succeeded after the drop")
	}
	// The client reads now: what was on the way, then the close.
	c.nc.(*net.TCPConn).SetReadBuffer(4 << 20)
	got := 0
	for {
		f := c.mustRead()
		if f.op == 0x8 {
			if code := binary.BigEndian.Uint16(f.payload); code != 1008 {
				t.Fatalf("close %d %q", code, f.payload[2:])
			}
			break
		}
		got++
	}
	if got >= sent {
		t.Errorf("got all %d messages: nothing was dropped", got)
	}
	c.write(wsFrameBytes(true, 0, 0x8, wsCloseBody(1000, ""), true))
	c.expectEOF()
	h.end(t)
}

func TestWSSlowConsumerSkips(t *testing.T) {
	t.Parallel()
	h := startWSServer(t, wsOptions{SendQueue: 64, SendQueueBytes: 256 << 10, Slow: slowSkip})
	c := dialWS(t, h.addr, "/ws")
	c.slowReader()
	srv := h.conn(t)
	payload := []byte(strings.Repeat("x", 16<<10))
	var slowest time.Duration
	dropped := 0
	for i := 0; i < 100000 && dropped < 100; i++ {
		t0 := time.Now()
		if !srv.Send(payload) {
			dropped++
		}
		slowest = max(slowest, time.Since(t0))
	}
	if dropped < 100 {
		t.Fatal("the queue never filled")
	}
	if slowest > time.Second {
		t.Errorf("a Send took %v", slowest)
	}
	// The connection lives on: once the client reads, new messages pass.
	c.nc.(*net.TCPConn).SetReadBuffer(4 << 20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			f, err := c.read()
			if err != nil {
				t.Errorf("client read: %v", err)
				return
			}
			if f.op == 0x1 && string(f.payload) == "marker" {
				return
			}
		}
	}()
	eventually(t, wsTestTimeout, "a Send accepted again", func() (bool, string) {
		return srv.Send([]byte("marker")), ""
	})
	select {
	case <-done:
	case <-time.After(wsTestTimeout):
		t.Fatal("the marker never arrived")
	}
	select {
	case <-srv.Done():
		t.Fatal("the connection was closed")
	default:
	}
}

// ---------------------------------------------------------------------------
// Fuzzing

// FuzzWSReadFrame feeds arbitrary bytes to the frame reader, frame after
// frame. Whatever it accepts must obey RFC 6455's limits and read back the
// same from the test client's own encoding; whatever it refuses must be
// refused with 1002 or 1009, or be the input running out.
func FuzzWSReadFrame(f *testing.F) {
	f.Add([]byte{0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58})
	f.Add(bytes.Join([][]byte{
		wsFrameBytes(false, 0, 0x1, []byte("frag"), true),
		wsFrameBytes(true, 0, 0x9, []byte("ping"), true),
		wsFrameBytes(true, 0, 0x0, []byte("ment"), true),
		wsFrameBytes(true, 0, 0x8, wsCloseBody(1000, "bye"), true),
	}, nil))
	f.Add(wsFrameBytes(true, 0, 0x2, bytes.Repeat([]byte{7}, 300), true))
	f.Add(wsFrameBytes(true, 0, 0x1, []byte("unmasked"), false))
	f.Add(wsFrameBytes(true, 4, 0x1, []byte("rsv"), true))
	f.Add(wsFrameBytes(false, 0, 0x9, nil, true))
	f.Add(binary.BigEndian.AppendUint64([]byte{0x82, 0xff}, 1<<63))
	f.Add([]byte{0x82, 0xfe, 0x00, 0x05, 1, 2, 3, 4, 'a', 'b', 'c', 'd', 'e'}) // a 16-bit length that did not need 16 bits
	const max = 4096
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &countingReader{r: bytes.NewReader(data)}
		br := bufio.NewReaderSize(in, 16)
		for range 64 {
			before := in.n - int64(br.Buffered())
			fr, err := readWSFrame(br, max)
			if err != nil {
				var pe *wsProtocolError
				switch {
				case errors.As(err, &pe):
					if pe.Code != wsCloseProtocolError && pe.Code != wsCloseTooBig {
						t.Fatalf("refused with %d", pe.Code)
					}
				case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
				default:
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			used := in.n - int64(br.Buffered()) - before
			if fr.op.isControl() && (!fr.fin || len(fr.payload) > 125) {
				t.Fatalf("accepted control frame fin=%v len=%d", fr.fin, len(fr.payload))
			}
			if !fr.op.isControl() && len(fr.payload) > max {
				t.Fatalf("accepted %d bytes over the limit", len(fr.payload))
			}
			// header + length + key + payload, whatever length form was used
			if minUsed := int64(2 + 4 + len(fr.payload)); used < minUsed || used > minUsed+8 {
				t.Fatalf("consumed %d bytes for a %d-byte payload", used, len(fr.payload))
			}
			again, err := readWSFrame(bufio.NewReader(bytes.NewReader(
				wsFrameBytes(fr.fin, 0, byte(fr.op), fr.payload, true))), max)
			if err != nil || again.fin != fr.fin || again.op != fr.op || !bytes.Equal(again.payload, fr.payload) {
				t.Fatalf("re-encoded frame reads back as %+v, %v; was %+v", again, err, fr)
			}
		}
	})
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// TestWSReadyBeforeReply: what upgradeWSThen's ready registers is in place
// before the client reads the handshake reply, and a message sent from
// ready arrives first. (The hub registered a subscriber after the reply:
// a job pushed the moment a client connected could miss it.)
func TestWSReadyBeforeReply(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := upgradeWSThen(w, r, wsOptions{}, func(c *wsConn) {
			c.Send([]byte("registered"))
			<-release
		})
		if err != nil {
			return
		}
		c.ReadMessage()
		<-c.Done()
	}))
	defer ts.Close()
	nc, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := io.WriteString(nc, wsRequest("/ws")); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var b [1]byte
	if n, err := nc.Read(b[:]); n > 0 || err == nil {
		t.Fatal("the handshake reply came before ready returned")
	}
	close(release)
	nc.SetReadDeadline(time.Now().Add(wsTestTimeout))
	c := &wsClient{t: t, nc: nc, br: bufio.NewReader(nc)}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %v %v", resp, err)
	}
	if _, msg := c.readData(); msg != "registered" {
		t.Fatalf("first message %q", msg)
	}
}
