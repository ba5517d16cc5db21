package main

// WebSocket (RFC 6455), server side, for the live endpoints.
//
// A connection has one writer goroutine: it owns the socket's write side,
// so frames never interleave, and everything reaches it through a bounded
// queue, so whoever calls Send (in the end, the broker) never waits on a
// client's socket. The caller's own goroutine reads through ReadMessage,
// which also answers pings and takes part in the closing handshake. Every
// wait has a deadline, so a connection always ends: the writer closes the
// socket when it stops, which in turn ends a blocked read.
//
// No extension (permessage-deflate) or subprotocol is negotiated; a
// client that asks for one gets the plain protocol, as RFC 6455 allows.

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

type wsOpcode byte

const (
	wsContinuation wsOpcode = 0x0
	wsText         wsOpcode = 0x1
	wsBinary       wsOpcode = 0x2
	wsClose        wsOpcode = 0x8
	wsPing         wsOpcode = 0x9
	wsPong         wsOpcode = 0xA
)

func (op wsOpcode) isControl() bool { return op&0x8 != 0 }

// Close status codes (RFC 6455 section 7.4.1).
const (
	wsCloseNormal        = 1000
	wsCloseGoingAway     = 1001
	wsCloseProtocolError = 1002
	wsCloseUnsupported   = 1003
	wsCloseNoStatus      = 1005 // reported for a close frame without a body; never sent
	wsCloseInvalidData   = 1007
	wsClosePolicy        = 1008
	wsCloseTooBig        = 1009
	wsCloseInternalError = 1011
)

// wsGUID is the constant RFC 6455 mixes into the accept key, which proves
// to the client that the server understood the handshake.
const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// slowPolicy is what a full send queue does to its connection (WebSocket
// or SSE).
type slowPolicy uint8

const (
	// slowClose ends the connection (WebSocket: close 1008). The client
	// learns it missed something and reconnects; an SSE client resumes
	// with Last-Event-ID.
	slowClose slowPolicy = iota
	// slowSkip drops the message and keeps the connection, as the
	// reference does; the client never learns what it missed.
	slowSkip
)

// wsOptions tune a connection; zero fields take the defaults below.
type wsOptions struct {
	// MaxMessage bounds a message after reassembly, and so every frame, in
	// bytes. Default 1 MiB, the reference's maxPayloadLength.
	MaxMessage int64
	// AllowBinary accepts binary messages; otherwise they close the
	// connection with 1003.
	AllowBinary bool
	// SendQueue and SendQueueBytes bound what waits to be written, besides
	// the batch the writer has in hand: default 1024 messages and 4 MiB.
	// One message larger than SendQueueBytes still goes when nothing else
	// waits.
	SendQueue      int
	SendQueueBytes int
	Slow           slowPolicy
	// PingInterval is how often the server pings (default 30s). The client
	// must send something, a pong will do, within IdleTimeout (default
	// 120s, the reference's idleTimeout) or it is closed with 1001.
	PingInterval time.Duration
	IdleTimeout  time.Duration
	// WriteTimeout bounds one frame's write (default 10s). CloseTimeout
	// bounds the closing handshake, from Close to the socket being closed,
	// including what is still queued (default 3s).
	WriteTimeout time.Duration
	CloseTimeout time.Duration
	// CheckOrigin, when set, refuses handshakes it returns false for (403).
	// Browsers let any page open a WebSocket to any host, so this is what
	// stands between a hostile page and an open server.
	CheckOrigin func(*http.Request) bool
	Log         *slog.Logger
	// Answers, when set, counts the answers queued for the client
	// (SendReply) in the server's answer budget until they are written.
	Answers *answerBudget
}

func (o wsOptions) withDefaults() wsOptions {
	if o.MaxMessage <= 0 {
		o.MaxMessage = 1 << 20
	}
	if o.SendQueue <= 0 {
		o.SendQueue = 1024
	}
	if o.SendQueueBytes <= 0 {
		o.SendQueueBytes = 4 << 20
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 30 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 120 * time.Second
	}
	if o.PingInterval >= o.IdleTimeout {
		// A client that only answers pings must never look idle.
		o.PingInterval = o.IdleTimeout / 2
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 3 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// ---------------------------------------------------------------------------
// Handshake

// wsHandshakeError is a refused handshake; the HTTP answer has been sent.
type wsHandshakeError struct {
	Status int
	Reason string
}

func (e *wsHandshakeError) Error() string {
	return fmt.Sprintf("websocket handshake refused (%d): %s", e.Status, e.Reason)
}

func wsAcceptKey(key string) string {
	sum := sha1.Sum([]byte(key + wsGUID))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// headerHasToken reports whether a comma-separated header, over all its
// lines, lists token (case-insensitively, as tokens are).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for part := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(part), token) {
				return true
			}
		}
	}
	return false
}

// checkWSHandshake validates an opening handshake (RFC 6455 section 4.2.1)
// and returns the client's key, or why it is refused.
func checkWSHandshake(r *http.Request) (string, *wsHandshakeError) {
	if r.Method != http.MethodGet {
		return "", &wsHandshakeError{http.StatusMethodNotAllowed, "the method must be GET"}
	}
	if r.ProtoMajor != 1 || r.ProtoMinor < 1 {
		// HTTP/2 would need RFC 8441's extended CONNECT, which net/http's
		// server does not offer to handlers; HTTP/1.0 has no Upgrade.
		return "", &wsHandshakeError{http.StatusBadRequest, "WebSocket needs HTTP/1.1"}
	}
	if !headerHasToken(r.Header, "Upgrade", "websocket") {
		return "", &wsHandshakeError{http.StatusUpgradeRequired, "the Upgrade header must be websocket"}
	}
	if !headerHasToken(r.Header, "Connection", "upgrade") {
		return "", &wsHandshakeError{http.StatusBadRequest, "the Connection header must include upgrade"}
	}
	if v := r.Header.Get("Sec-WebSocket-Version"); v != "13" {
		return "", &wsHandshakeError{http.StatusUpgradeRequired, fmt.Sprintf("Sec-WebSocket-Version %q is not supported; this server speaks 13", v)}
	}
	key := strings.TrimSpace(r.Header.Get("Sec-WebSocket-Key"))
	if raw, err := base64.StdEncoding.DecodeString(key); err != nil || len(raw) != 16 {
		return "", &wsHandshakeError{http.StatusBadRequest, "Sec-WebSocket-Key must be 16 bytes in base64"}
	}
	return key, nil
}

// upgradeWS answers the opening handshake and takes the connection over
// from net/http. When it returns an error, the HTTP answer (400, 403, 405,
// 426 or 500 with the reason) has been written and w must not be used.
func upgradeWS(w http.ResponseWriter, r *http.Request, opts wsOptions) (*wsConn, error) {
	return upgradeWSThen(w, r, opts, nil)
}

// upgradeWSThen is upgradeWS calling ready with the connection before its
// handshake reply is written: what ready registers the connection for
// (the hub's events) it gets from the moment the client knows it is
// connected. Messages sent meanwhile wait for the writer, which starts
// after the reply.
func upgradeWSThen(w http.ResponseWriter, r *http.Request, opts wsOptions, ready func(c *wsConn)) (*wsConn, error) {
	opts = opts.withDefaults()
	key, herr := checkWSHandshake(r)
	if herr == nil && opts.CheckOrigin != nil && !opts.CheckOrigin(r) {
		herr = &wsHandshakeError{http.StatusForbidden, "origin not allowed"}
	}
	if herr != nil {
		switch herr.Status {
		case http.StatusUpgradeRequired:
			// RFC 9110 section 15.5.22 and RFC 6455 section 4.4: say what
			// to upgrade to.
			w.Header().Set("Upgrade", "websocket")
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Sec-WebSocket-Version", "13")
		case http.StatusMethodNotAllowed:
			w.Header().Set("Allow", http.MethodGet)
		}
		http.Error(w, "websocket: "+herr.Reason, herr.Status)
		return nil, herr
	}
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "websocket: the connection cannot be taken over", http.StatusInternalServerError)
		return nil, fmt.Errorf("websocket hijack: %w", err)
	}
	// net/http's deadlines were for the request; the connection keeps
	// its own from here on.
	if err := nc.SetDeadline(time.Time{}); err != nil {
		nc.Close()
		return nil, fmt.Errorf("websocket: clear deadlines: %w", err)
	}
	// Read the socket directly rather than through net/http's reader, but
	// keep whatever the client sent right behind its request.
	var src io.Reader = nc
	if n := brw.Reader.Buffered(); n > 0 {
		early, _ := brw.Reader.Peek(n)
		src = io.MultiReader(bytes.NewReader(bytes.Clone(early)), nc)
	}
	c := newWSConn(nc, bufio.NewReaderSize(src, 8<<10), opts)
	if ready != nil {
		ready(c)
	}
	reply := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Accept: " + wsAcceptKey(key) + "\r\n\r\n"
	nc.SetWriteDeadline(time.Now().Add(opts.WriteTimeout))
	if _, err := io.WriteString(nc, reply); err != nil {
		// What ready queued (events, each counted in the answer budget)
		// is let go: no writer will.
		c.drop()
		nc.Close()
		return c, fmt.Errorf("websocket handshake reply: %w", err)
	}
	go c.writeLoop()
	return c, nil
}

// ---------------------------------------------------------------------------
// Frames

// wsFrame is one frame as read, its payload unmasked.
type wsFrame struct {
	fin     bool
	op      wsOpcode
	payload []byte
}

// wsProtocolError is a peer's violation and the status to close with.
type wsProtocolError struct {
	Code   int
	Reason string
}

func (e *wsProtocolError) Error() string {
	return fmt.Sprintf("websocket protocol error %d: %s", e.Code, e.Reason)
}

// readWSFrame reads one frame from a client. Clients must mask (RFC 6455
// section 5.1), and with no extension negotiated the RSV bits must be
// clear. A data frame longer than max is refused (1009) before any of its
// payload is read or allocated; control frames have their own bound of 125.
func readWSFrame(br *bufio.Reader, max int64) (wsFrame, error) {
	var hdr [8]byte
	if _, err := io.ReadFull(br, hdr[:2]); err != nil {
		return wsFrame{}, err
	}
	f := wsFrame{fin: hdr[0]&0x80 != 0, op: wsOpcode(hdr[0] & 0x0f)}
	if hdr[0]&0x70 != 0 {
		return f, &wsProtocolError{wsCloseProtocolError, "reserved bits set without a negotiated extension"}
	}
	switch f.op {
	case wsContinuation, wsText, wsBinary, wsClose, wsPing, wsPong:
	default:
		return f, &wsProtocolError{wsCloseProtocolError, fmt.Sprintf("reserved opcode %#x", byte(f.op))}
	}
	if hdr[1]&0x80 == 0 {
		return f, &wsProtocolError{wsCloseProtocolError, "client frames must be masked"}
	}
	n := uint64(hdr[1] & 0x7f)
	switch n {
	case 126:
		if _, err := io.ReadFull(br, hdr[:2]); err != nil {
			return f, err
		}
		n = uint64(binary.BigEndian.Uint16(hdr[:2]))
	case 127:
		if _, err := io.ReadFull(br, hdr[:8]); err != nil {
			return f, err
		}
		n = binary.BigEndian.Uint64(hdr[:8])
		if n>>63 != 0 {
			return f, &wsProtocolError{wsCloseProtocolError, "payload length has its most significant bit set"}
		}
	}
	if f.op.isControl() {
		if !f.fin {
			return f, &wsProtocolError{wsCloseProtocolError, "control frames cannot be fragmented"}
		}
		if n > 125 {
			return f, &wsProtocolError{wsCloseProtocolError, "control frame payload over 125 bytes"}
		}
	} else if max < 0 || n > uint64(max) {
		return f, &wsProtocolError{wsCloseTooBig, fmt.Sprintf("message over the %d-byte limit", max)}
	}
	var key [4]byte
	if _, err := io.ReadFull(br, key[:]); err != nil {
		return f, err
	}
	f.payload = make([]byte, n)
	if _, err := io.ReadFull(br, f.payload); err != nil {
		return f, err
	}
	wsMask(key, f.payload)
	return f, nil
}

func wsMask(key [4]byte, p []byte) {
	for i := range p {
		p[i] ^= key[i&3]
	}
}

// appendWSHeader appends an unmasked, final frame header: servers never
// mask, and this server never fragments what it sends.
func appendWSHeader(dst []byte, op wsOpcode, n int) []byte {
	dst = append(dst, 0x80|byte(op))
	switch {
	case n <= 125:
		return append(dst, byte(n))
	case n <= 0xffff:
		return append(dst, 126, byte(n>>8), byte(n))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 127), uint64(n))
	}
}

// wsValidCloseCode reports whether a peer may send code (RFC 6455 section
// 7.4, and the IANA registry's 1012-1014).
func wsValidCloseCode(code int) bool {
	switch {
	case code >= 1000 && code <= 1003, code >= 1007 && code <= 1014:
		return true
	case code >= 3000 && code <= 4999:
		return true
	}
	return false
}

// wsClosePayload builds a close frame's body. The reason is cut, on a rune
// boundary, to fit the 125-byte control frame limit.
func wsClosePayload(code int, reason string) []byte {
	if code == 0 {
		return nil
	}
	for len(reason) > 123 {
		_, size := utf8.DecodeLastRuneInString(reason)
		reason = reason[:len(reason)-size]
	}
	p := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(reason)), uint16(code))
	return append(p, reason...)
}

// ---------------------------------------------------------------------------
// Connection

// wsCloseError ends ReadMessage: the peer closed (Remote) with Code, or
// this side closed with Code because of what the peer sent.
type wsCloseError struct {
	Code   int
	Reason string
	Remote bool
}

func (e *wsCloseError) Error() string {
	who := "server"
	if e.Remote {
		who = "client"
	}
	if e.Reason == "" {
		return fmt.Sprintf("websocket closed by the %s (%d)", who, e.Code)
	}
	return fmt.Sprintf("websocket closed by the %s (%d): %s", who, e.Code, e.Reason)
}

// wsConn is one WebSocket connection. ReadMessage belongs to one
// goroutine; Send and Close may be called from any.
type wsConn struct {
	nc     net.Conn
	br     *bufio.Reader
	opts   wsOptions
	remote string

	rerr error // the reader's final error, returned again on later calls

	mu        sync.Mutex
	out       outQueue
	replies   int64 // bytes of answers in out, counted in opts.Answers
	pong      []byte
	pongDue   bool
	pingDue   bool
	closing   bool      // a close frame is due or sent: Send refuses
	closeBody []byte    // the close frame's payload
	closeWait bool      // after sending it, wait for the peer's close
	closeBy   time.Time // when the socket closes whatever happens

	kick       chan struct{} // wakes the writer; capacity 1
	peerClosed chan struct{} // the peer's close frame has arrived
	peerOnce   sync.Once
	stop       chan struct{} // tear down now, without a closing handshake
	stopOnce   sync.Once
	done       chan struct{} // closed once the socket is closed
}

func newWSConn(nc net.Conn, br *bufio.Reader, opts wsOptions) *wsConn {
	return &wsConn{nc: nc, br: br, opts: opts, remote: nc.RemoteAddr().String(),
		out: outQueue{maxN: opts.SendQueue, maxB: opts.SendQueueBytes}, kick: make(chan struct{}, 1), peerClosed: make(chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{})}
}

// Done is closed when the connection is over and its socket closed.
func (c *wsConn) Done() <-chan struct{} { return c.done }

// RemoteAddr is the client's address.
func (c *wsConn) RemoteAddr() string { return c.remote }

// Send queues a text message without ever blocking. It reports false when
// the message is not sent: the connection is closing, or its queue is full
// (then, by the slow policy, the message is skipped or the connection is
// closed with 1008). text must be valid UTF-8 and is not copied, so it
// must not change afterwards; one payload can go to many connections.
func (c *wsConn) Send(text []byte) bool { return c.send(outMsg{b: text}, false) }

// sendEvent queues a hub event, counted with ref (liveRef), as Send does;
// while the answer budget is spent, a socket with messages waiting gets
// no more events.
func (c *wsConn) sendEvent(text []byte, ref *liveRef) bool {
	return c.send(outMsg{b: text, ref: ref}, false)
}

// send queues m; reply: it is an answer, counted in the answer budget
// until written.
func (c *wsConn) send(m outMsg, reply bool) bool {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return false
	}
	ok, first, n, size := c.out.offer(m, m.ref != nil && m.ref.budget.pressed())
	if ok && reply && c.opts.Answers != nil {
		c.replies += int64(len(m.b))
		c.opts.Answers.hold(int64(len(m.b)))
	}
	c.mu.Unlock()
	if !ok {
		if refused(c.opts.Log, c.opts.Slow, "websocket client", c.remote, first, n, size) {
			c.startClose(wsClosePolicy, "slow consumer: send queue full", false, true)
		}
		return false
	}
	c.wake()
	return true
}

// SendReply queues the answer to one of the client's own commands. An
// answer is never skipped, as an event may be: a client whose queue is
// full is closed (1008) rather than left waiting for an answer that will
// not come.
func (c *wsConn) SendReply(text []byte) bool { return c.sendReply(outMsg{b: text}) }

// SendFrame queues the answer frame f (MessagePack, as the command table
// answers) for one of the client's own commands, as SendReply does. A
// small one is rendered as JSON now; a big one is rendered by the writer
// as it writes it, a piece at a time (writeFrame), f held meanwhile. f
// must not change afterwards.
func (c *wsConn) SendFrame(f []byte) bool {
	if len(f) <= smallAnswer {
		return c.sendReply(outMsg{b: frameToJSON(f)})
	}
	return c.sendReply(outMsg{b: f, frame: true})
}

func (c *wsConn) sendReply(m outMsg) bool {
	if c.send(m, true) {
		return true
	}
	if !c.isClosing() {
		c.startClose(wsClosePolicy, "slow consumer: answers not read", false, true)
	}
	return false
}

// Close starts the closing handshake: what is already queued is sent,
// then a close frame with code (0: none) and reason; the socket closes
// when the client answers or CloseTimeout has passed. The reader should
// keep calling ReadMessage until it fails, so that the answer is seen.
func (c *wsConn) Close(code int, reason string) {
	c.startClose(code, reason, true, false)
}

// startClose queues the close frame. wait: wait for the peer's close
// frame before closing the socket (we are starting the handshake); discard:
// drop what is queued (the peer broke the protocol, or does not read).
// A second call cannot change the frame, but may make the close hastier.
func (c *wsConn) startClose(code int, reason string, wait, discard bool) {
	c.mu.Lock()
	if !c.closing {
		c.closing = true
		c.closeBody = wsClosePayload(code, reason)
		c.closeWait = wait
		c.closeBy = time.Now().Add(c.opts.CloseTimeout)
		// A write stuck on a client that does not read gives up at
		// closeBy instead of WriteTimeout.
		c.nc.SetWriteDeadline(c.closeBy)
	} else if !wait {
		c.closeWait = false
	}
	if discard {
		c.out.discard()
		c.freeReplies()
	}
	c.mu.Unlock()
	c.wake()
}

// freeReplies gives back the budget of the answers queued; c.mu is held.
func (c *wsConn) freeReplies() {
	if c.replies > 0 {
		c.opts.Answers.free(c.replies)
		c.replies = 0
	}
}

// queuedBytes is what waits in the send queue.
func (c *wsConn) queuedBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(c.out.bytes)
}

// overShare says whether an answer of n more bytes would pass the send
// queue's bytes, for the commands of the connection (checked before the
// answer is built). An empty queue takes any one.
func (c *wsConn) overShare(n int64) bool {
	q := c.queuedBytes()
	return q > 0 && q+n > int64(c.opts.SendQueueBytes)
}

func (c *wsConn) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// abort tears the connection down without a handshake.
func (c *wsConn) abort() {
	c.mu.Lock()
	c.closing = true
	// Whatever write is under way or still to come fails now.
	c.closeBy = time.Now()
	c.nc.SetWriteDeadline(c.closeBy)
	c.mu.Unlock()
	c.stopOnce.Do(func() { close(c.stop) })
}

// drop ends the connection and lets go of what is queued: nothing is
// queued after it (abort marks it closing), and what was is given back to
// the answer budget.
func (c *wsConn) drop() {
	c.abort()
	c.mu.Lock()
	c.out.discard()
	c.freeReplies()
	c.mu.Unlock()
}

// ReadMessage returns the next complete message, text or binary (binary
// only with AllowBinary), reassembled from its fragments. Pings are
// answered and pongs absorbed on the way. It fails for good when the
// connection closes: with a *wsCloseError for a closing handshake or a
// protocol violation (the close frame has been sent), otherwise with the
// socket's error.
func (c *wsConn) ReadMessage() (wsOpcode, []byte, error) {
	if c.rerr != nil {
		return 0, nil, c.rerr
	}
	op, msg, err := c.readMessage()
	if err != nil {
		c.rerr = err
	}
	return op, msg, err
}

func (c *wsConn) readMessage() (wsOpcode, []byte, error) {
	var (
		op    wsOpcode
		msg   []byte
		inMsg bool
	)
	for {
		c.nc.SetReadDeadline(time.Now().Add(c.opts.IdleTimeout))
		f, err := readWSFrame(c.br, c.opts.MaxMessage-int64(len(msg)))
		if err != nil {
			return 0, nil, c.readFailed(err)
		}
		switch f.op {
		case wsPing:
			c.queuePong(f.payload)
			continue
		case wsPong:
			// Proof of life only; the read deadline was moved already.
			continue
		case wsClose:
			return 0, nil, c.peerClose(f.payload)
		case wsContinuation:
			if !inMsg {
				return 0, nil, c.fail(wsCloseProtocolError, "continuation frame with no message to continue")
			}
			msg = append(msg, f.payload...)
		default:
			if inMsg {
				return 0, nil, c.fail(wsCloseProtocolError, "new message before the previous one was finished")
			}
			if f.op == wsBinary && !c.opts.AllowBinary {
				return 0, nil, c.fail(wsCloseUnsupported, "binary messages are not accepted")
			}
			op, msg, inMsg = f.op, f.payload, true
		}
		if !f.fin {
			continue
		}
		if op == wsText && !utf8.Valid(msg) {
			return 0, nil, c.fail(wsCloseInvalidData, "text message is not valid UTF-8")
		}
		if c.isClosing() {
			// Nothing can answer it any more (RFC 6455 section 1.4: no data
			// after our close frame); keep reading for the peer's close.
			op, msg, inMsg = 0, nil, false
			continue
		}
		return op, msg, nil
	}
}

func (c *wsConn) isClosing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing
}

// fail closes the connection because of the peer (RFC 6455 section 7.1.7):
// the close frame goes out at once and the socket closes right after it.
func (c *wsConn) fail(code int, reason string) error {
	c.opts.Log.Debug("websocket protocol error", "remote", c.remote, "code", code, "reason", reason)
	c.startClose(code, reason, false, true)
	return &wsCloseError{Code: code, Reason: reason}
}

func (c *wsConn) readFailed(err error) error {
	var pe *wsProtocolError
	if errors.As(err, &pe) {
		return c.fail(pe.Code, pe.Reason)
	}
	if isTimeout(err) {
		// Not even a pong for IdleTimeout: the client is gone or stuck.
		c.opts.Log.Debug("websocket client idle; closing", "remote", c.remote)
		c.startClose(wsCloseGoingAway, "idle timeout", false, true)
		return fmt.Errorf("websocket read: idle for %v: %w", c.opts.IdleTimeout, err)
	}
	c.abort()
	return fmt.Errorf("websocket read: %w", err)
}

// peerClose handles the peer's close frame: it answers with the same code
// unless this side's close frame was first, and lets the writer close the
// socket as soon as its own frame is out.
func (c *wsConn) peerClose(body []byte) error {
	code, reason := wsCloseNoStatus, ""
	switch {
	case len(body) == 1:
		return c.fail(wsCloseProtocolError, "close frame body of one byte")
	case len(body) >= 2:
		code = int(binary.BigEndian.Uint16(body))
		if !wsValidCloseCode(code) {
			return c.fail(wsCloseProtocolError, fmt.Sprintf("invalid close code %d", code))
		}
		if !utf8.Valid(body[2:]) {
			return c.fail(wsCloseInvalidData, "close reason is not valid UTF-8")
		}
		reason = string(body[2:])
	}
	echo := code
	if code == wsCloseNoStatus {
		echo = 0
	}
	c.startClose(echo, "", false, true)
	c.peerOnce.Do(func() { close(c.peerClosed) })
	return &wsCloseError{Code: code, Reason: reason, Remote: true}
}

func (c *wsConn) queuePong(payload []byte) {
	c.mu.Lock()
	// Only the latest ping needs its pong (RFC 6455 section 5.5.3).
	c.pong, c.pongDue = payload, true
	c.mu.Unlock()
	c.wake()
}

// writeDeadline moves the write deadline for the next frame. During the
// close, everything shares the one deadline closeBy.
func (c *wsConn) writeDeadline() {
	c.mu.Lock()
	if c.closing {
		c.nc.SetWriteDeadline(c.closeBy)
	} else {
		c.nc.SetWriteDeadline(time.Now().Add(c.opts.WriteTimeout))
	}
	c.mu.Unlock()
}

// writeLoop is the connection's only writer. It stops, closing the
// socket, once its close frame is out (and answered, or CloseTimeout has
// passed), on a write error, or on abort.
func (c *wsConn) writeLoop() {
	defer close(c.done)
	defer c.nc.Close()
	defer c.drop()
	w := &wsWriter{c: c, bw: bufio.NewWriterSize(c.nc, 8<<10)}
	ticker := time.NewTicker(c.opts.PingInterval)
	defer ticker.Stop()
	var batch []outMsg
	for {
		select {
		case <-c.kick:
		case <-ticker.C:
			c.mu.Lock()
			c.pingDue = true
			c.mu.Unlock()
		case <-c.stop:
			return
		}
		for {
			select {
			case <-c.stop:
				return
			default:
			}
			var more, done bool
			batch, more, done = c.writePending(w, batch)
			if done {
				return
			}
			if !more {
				break
			}
		}
	}
}

// wsWriter writes frames through the connection's buffer.
type wsWriter struct {
	c   *wsConn
	bw  *bufio.Writer
	hdr [10]byte
}

func (w *wsWriter) write(op wsOpcode, p []byte) error {
	w.c.writeDeadline()
	if _, err := w.bw.Write(appendWSHeader(w.hdr[:0], op, len(p))); err != nil {
		return err
	}
	_, err := w.bw.Write(p)
	return err
}

// writeFrame writes an answer frame f (SendFrame) as one JSON text
// message without holding its JSON whole: a first pass measures it (into
// a piece emptied as it fills), and the second renders it into the
// socket a piece at a time, each piece with its own write deadline, the
// write registered with the answer budget, which closes a client that
// does not read it while others wait for room (fair turns). An answer
// whose JSON would pass the protocol's frame limit is refused instead,
// with its reqId.
func (w *wsWriter) writeFrame(f []byte) error {
	v := Raw(f[4:])
	buf := jsonPieces.Get().(*[]byte)
	// Rendered in memory until a piece is full; from then on, measured.
	o := jsonOut{b: (*buf)[:0], sink: dropJSON, measureOnSpill: true}
	defer func() {
		if cap(o.b) <= 4*jsonPiece {
			*buf = o.b[:0]
			jsonPieces.Put(buf)
		}
	}()
	if err := o.raw(v); err != nil {
		return w.write(wsText, []byte(`{"ok":false,"error":"Internal server error"}`))
	}
	size := o.size()
	if size > MaxFrame {
		m, _ := ParseMap(v, nil)
		return w.write(wsText, wsError(errAnswerTooBig("the answer, as JSON,").Error(), m.Get("reqId")))
	}
	if o.sent == 0 {
		return w.write(wsText, o.b)
	}
	c := w.c
	c.writeDeadline()
	if _, err := w.bw.Write(appendWSHeader(w.hdr[:0], wsText, int(size))); err != nil {
		return err
	}
	a := c.opts.Answers
	var aw *answerWriter
	if a != nil {
		// Stopped as a whole: closing, its deadline now, so that the
		// next piece's deadline cannot undo it.
		aw = a.writing(c.abort)
		defer a.done(aw)
	}
	o = jsonOut{b: o.b[:0], sink: func(p []byte) error {
		c.writeDeadline()
		_, err := w.bw.Write(p)
		aw.progress()
		return err
	}}
	o.raw(v)
	return o.flush()
}

// writePending writes and flushes what is due: a pong, a ping, the queued
// messages (swapped with batch, which is answered back for reuse), and
// the close frame once nothing else is queued. done: the writer stops (a
// write failed, or the close handshake is over); more: something was
// due, so there may be more.
func (c *wsConn) writePending(w *wsWriter, batch []outMsg) (_ []outMsg, more, done bool) {
	c.mu.Lock()
	pong, pongDue, pingDue := c.pong, c.pongDue, c.pingDue
	c.pong, c.pongDue, c.pingDue = nil, false, false
	batch = c.out.take(batch)
	replies := c.replies
	c.replies = 0
	var closeBody []byte
	closeNow := c.closing && len(batch) == 0
	if closeNow {
		closeBody = c.closeBody
	}
	c.mu.Unlock()

	var err error
	if pongDue {
		err = w.write(wsPong, pong)
	}
	if pingDue && err == nil && !closeNow {
		err = w.write(wsPing, nil)
	}
	for i, m := range batch {
		if err == nil && m.frame {
			err = w.writeFrame(m.b)
		} else if err == nil {
			err = w.write(wsText, m.b)
		}
		m.done()
		batch[i] = outMsg{}
	}
	if closeNow && err == nil {
		err = w.write(wsClose, closeBody)
	}
	if err == nil {
		err = w.bw.Flush()
	}
	if replies > 0 {
		c.opts.Answers.free(replies)
	}
	if err != nil {
		if !errors.Is(err, net.ErrClosed) {
			c.opts.Log.Debug("websocket write", "remote", c.remote, "err", err)
		}
		return batch, false, true
	}
	if closeNow {
		c.awaitPeerClose()
		return batch, false, true
	}
	return batch, len(batch) > 0 || pongDue || pingDue, false
}

// awaitPeerClose waits, after our close frame, for the peer's answer when
// the close was ours to start (the server closes the TCP connection first,
// RFC 6455 section 7.1.1, but only once the handshake is done).
func (c *wsConn) awaitPeerClose() {
	c.mu.Lock()
	wait, by := c.closeWait, c.closeBy
	c.mu.Unlock()
	if !wait {
		return
	}
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	for {
		select {
		case <-c.peerClosed:
			return
		case <-c.stop:
			return
		case <-t.C:
			return
		case <-c.kick:
			// A protocol error may have cancelled the wait.
			c.mu.Lock()
			wait = c.closeWait
			c.mu.Unlock()
			if !wait {
				return
			}
		}
	}
}
