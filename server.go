package main

// The TCP server: one goroutine per connection reads frames and answers them
// in order of arrival; commands that wait (long-poll pulls, WaitJob) answer
// from their own goroutine when they are done, so they never hold up the
// commands pipelined behind them.
//
// A connection's own answers are written into its reader's buffer and sent
// when no more input is waiting, so a pipelining client gets many answers
// per write(2). Events for subscribers go through a separate bounded
// buffer and writer goroutine, so that the broker never blocks on a
// subscriber's socket.

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server accepts connections and dispatches their commands to the broker.
type Server struct {
	b      *Broker
	tokens []string
	log    *slog.Logger

	ln     net.Listener
	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool
	wg     sync.WaitGroup
	nconns atomic.Int64

	mx    *Metrics  // per-queue figures, fed by a broker tap
	hooks *Webhooks // set by runServer; nil answers that webhooks are unavailable

	cmds map[string]Handler // the command table: commands, or pgCommands()
	pg   *PG                // PostgreSQL mode's engine; nil in the other modes
}

func NewServer(b *Broker, tokens []string, log *slog.Logger) *Server {
	return &Server{b: b, tokens: tokens, log: log, conns: make(map[*conn]struct{}), mx: newMetrics(b), cmds: commands}
}

// Serve accepts on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
			tc.SetKeepAlive(true)
			tc.SetKeepAlivePeriod(30 * time.Second)
		}
		c := newConn(s, nc)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		s.nconns.Add(1)
		go c.serve()
	}
}

// Close stops accepting, lets every connection answer what it has read,
// ends long polls with empty answers, and waits for all of it.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	if s.ln != nil {
		s.ln.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.shutdown()
	}
	s.wg.Wait()
}

func (s *Server) authRequired() bool { return len(s.tokens) > 0 }

func (s *Server) checkToken(tok string) bool {
	ok := 0
	for _, t := range s.tokens {
		ok |= subtle.ConstantTimeCompare([]byte(tok), []byte(t))
	}
	return ok == 1
}

// ---------------------------------------------------------------------------

// conn is one client connection.
type conn struct {
	srv      *Server
	nc       net.Conn
	br       *bufio.Reader
	rb       Enc // the reader's answers, not yet written
	authed   bool
	ctx      context.Context
	cancel   context.CancelFunc
	async    sync.WaitGroup
	nAsync   atomic.Int32
	closed   atomic.Bool
	stopping atomic.Bool

	wmu sync.Mutex // one writer on the socket at a time

	emu     sync.Mutex // events
	ebuf    []byte
	ekick   chan struct{}
	edrops  int
	subQ    string
	hasSub  bool
	writing bool

	hmu  sync.Mutex // jobs pulled through this connection
	held map[*Job]struct{}

	fields []Field

	// out, when set, replaces the socket: the connection is a WebSocket's
	// or an HTTP request's, and asynchronous answers go to out as frames.
	out func(frame []byte)
	// stateless marks an HTTP request's connection: nothing it pulls or
	// registers is tied to it, since it ends with the request (the
	// reference leaves such jobs to stall detection).
	stateless bool
}

const (
	maxEventBacklog = 8 << 20 // bytes of unsent events before a subscriber loses events
	maxAsyncPerConn = 1024    // concurrent waiting commands per connection
	flushAt         = 256 << 10
	writeTimeout    = 60 * time.Second
	stopGrace       = time.Second
)

func newConn(s *Server, nc net.Conn) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	return &conn{srv: s, nc: nc, br: bufio.NewReaderSize(nc, 64<<10), ctx: ctx, cancel: cancel,
		held: make(map[*Job]struct{}), rb: Enc{B: make([]byte, 0, 4096)}}
}

func (c *conn) serve() {
	defer c.srv.wg.Done()
	defer c.finish()
	var buf []byte
	for {
		body, err := ReadFrame(c.br, buf)
		buf = body
		if err != nil {
			var fe *FrameSizeError
			if errors.As(err, &fe) {
				// The stream cannot be resynchronised: say why, then close.
				c.answerError(nil, fe.Error())
				c.flush()
			} else if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isTimeout(err) {
				c.srv.log.Debug("connection read", "remote", c.nc.RemoteAddr().String(), "err", err)
			}
			c.flush()
			return
		}
		c.handleFrame(body)
		if !c.frameWaiting() || len(c.rb.B) >= flushAt {
			if !c.flush() {
				return
			}
		}
	}
}

// frameWaiting reports whether a whole next frame is already read in: then
// its answer can share this write. A partial frame does not count, since
// the rest of it may take any time to arrive.
func (c *conn) frameWaiting() bool {
	n := c.br.Buffered()
	if n < 4 {
		return false
	}
	hdr, err := c.br.Peek(4)
	if err != nil {
		return false
	}
	return uint64(n) >= 4+uint64(binary.BigEndian.Uint32(hdr))
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// write sends bytes on the socket. A client that does not read its answers
// for writeTimeout is dropped; once the server is stopping, it gets a
// moment only, so that a stuck client cannot hold up a shutdown.
func (c *conn) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	if c.stopping.Load() {
		c.nc.SetWriteDeadline(time.Now().Add(stopGrace))
	}
	_, err := c.nc.Write(b)
	return err
}

// flush writes the reader's pending answers. It reports false when the
// socket is gone.
func (c *conn) flush() bool {
	if len(c.rb.B) == 0 {
		return true
	}
	err := c.write(c.rb.B)
	if cap(c.rb.B) > 4<<20 {
		c.rb.B = make([]byte, 0, 4096)
	} else {
		c.rb.B = c.rb.B[:0]
	}
	return err == nil
}

// writeFrame sends one complete frame from another goroutine.
func (c *conn) writeFrame(b []byte) {
	if c.out != nil {
		c.out(b)
		return
	}
	c.write(b)
}

// newVirtualConn is a connection without a socket of its own, for the
// commands that arrive over a WebSocket or an HTTP request: they run
// through the same command table as TCP ones. Asynchronous answers go to
// out; ctx ends the connection's waiting commands.
func newVirtualConn(s *Server, ctx context.Context, out func(frame []byte), stateless bool) *conn {
	ctx, cancel := context.WithCancel(ctx)
	// There is no token to present: the transport has checked it.
	return &conn{srv: s, ctx: ctx, cancel: cancel, out: out, stateless: stateless, authed: true,
		held: make(map[*Job]struct{})}
}

// owner is the connection that jobs pulled and workers registered by this
// request belong to: none for a stateless one.
func (r *Req) owner() *conn {
	if r.c.stateless {
		return nil
	}
	return r.c
}

// finishVirtual ends a virtual connection as finish ends a TCP one: its
// waiting commands end, and its workers and the jobs it held are let go.
func (c *conn) finishVirtual() {
	c.closed.Store(true)
	c.cancel()
	c.async.Wait()
	b := c.srv.b
	b.workers.dropConn(c)
	b.release(c)
	if pg := c.srv.pg; pg != nil {
		pg.release(c)
	}
}

// shutdown asks the connection to stop: the reader stops after the frame it
// is reading, waiting commands end with empty answers, and a write blocked
// on a client that does not read gives up after stopGrace.
func (c *conn) shutdown() {
	c.stopping.Store(true)
	c.nc.SetReadDeadline(time.Now())
	c.nc.SetWriteDeadline(time.Now().Add(stopGrace))
	c.cancel()
}

func (c *conn) finish() {
	c.closed.Store(true)
	c.cancel()
	c.async.Wait()
	b := c.srv.b
	b.unsubscribe(c)
	b.workers.dropConn(c)
	b.release(c)
	if pg := c.srv.pg; pg != nil {
		pg.release(c)
	}
	c.emu.Lock()
	c.hasSub = false
	if c.ekick != nil {
		close(c.ekick)
		c.ekick = nil
	}
	c.emu.Unlock()
	c.wmu.Lock()
	c.nc.Close()
	c.wmu.Unlock()
	c.srv.mu.Lock()
	delete(c.srv.conns, c)
	c.srv.mu.Unlock()
	c.srv.nconns.Add(-1)
}

// ---------------------------------------------------------------------------
// Held jobs, for release on disconnect

func (c *conn) track(j *Job) {
	c.hmu.Lock()
	c.held[j] = struct{}{}
	c.hmu.Unlock()
	j.owner = c
}

// untrack runs under the job's shard lock when it stops being active.
func (j *Job) untrack() {
	if c := j.owner; c != nil {
		c.hmu.Lock()
		delete(c.held, j)
		c.hmu.Unlock()
		j.owner = nil
	}
}

func (c *conn) takeHeld() []*Job {
	c.hmu.Lock()
	out := make([]*Job, 0, len(c.held))
	for j := range c.held {
		out = append(out, j)
	}
	c.held = map[*Job]struct{}{}
	c.hmu.Unlock()
	return out
}

// ---------------------------------------------------------------------------
// Events

func (c *conn) setSub(q string) {
	c.emu.Lock()
	c.subQ, c.hasSub = q, true
	if c.ekick == nil && !c.closed.Load() {
		c.ekick = make(chan struct{}, 1)
		c.async.Add(1)
		go c.eventWriter(c.ekick)
	}
	c.emu.Unlock()
}

func (c *conn) clearSub() {
	c.emu.Lock()
	c.hasSub = false
	c.emu.Unlock()
}

func (c *conn) sub() (string, bool) {
	c.emu.Lock()
	defer c.emu.Unlock()
	return c.subQ, c.hasSub
}

// pushEvent queues an encoded event frame; it never blocks.
func (c *conn) pushEvent(frame []byte) {
	c.emu.Lock()
	if c.ekick == nil {
		c.emu.Unlock()
		return
	}
	if len(c.ebuf)+len(frame) > maxEventBacklog {
		c.edrops++
		if c.edrops == 1 {
			c.srv.log.Warn("event subscriber is not reading; dropping its events",
				"remote", c.nc.RemoteAddr().String())
		}
		c.emu.Unlock()
		return
	}
	c.ebuf = append(c.ebuf, frame...)
	select {
	case c.ekick <- struct{}{}:
	default:
	}
	c.emu.Unlock()
}

func (c *conn) eventWriter(kick chan struct{}) {
	defer c.async.Done()
	var out []byte
	for {
		select {
		case _, ok := <-kick:
			if !ok {
				return
			}
		case <-c.ctx.Done():
			return
		}
		c.emu.Lock()
		out, c.ebuf = c.ebuf, out[:0]
		c.edrops = 0
		c.emu.Unlock()
		if len(out) > 0 {
			if err := c.write(out); err != nil {
				return
			}
		}
	}
}

// ---------------------------------------------------------------------------
// Requests and answers

// Req is one command being answered. Handlers write the answer's fields
// (after ok:true) into e with field(); the frame, ok and reqId are the
// dispatcher's.
type Req struct {
	c     *conn
	m     Map
	e     *Enc
	reqID Raw
	n     int
	b     *Broker
}

// field writes a key; the caller writes its value next.
func (r *Req) field(k string) *Enc {
	r.e.Str(k)
	r.n++
	return r.e
}

// errAsync tells the dispatcher that the handler answers later.
var errAsync = errors.New("answered asynchronously")

// Handler answers one command.
type Handler func(r *Req) error

func (c *conn) handleFrame(body []byte) {
	m, err := ParseMap(body, c.fields)
	c.fields = m.Fields[:0]
	if err != nil {
		// The frame boundary is intact, so the connection goes on; the
		// reqId is echoed when it could be read before the fault.
		var fe *FieldError
		msg := "Invalid command format: " + err.Error()
		if errors.As(err, &fe) {
			msg = "Invalid command format: field " + fe.Error()
		} else if errors.Is(err, errNotMap) {
			msg = "Invalid command: a request must be a map"
		}
		c.answerError(m.Get("reqId"), msg)
		return
	}
	cmdRaw := m.Get("cmd")
	cmd, cerr := cmdRaw.Str()
	if cmdRaw.IsNil() || cerr != nil || cmd == "" {
		c.answerError(m.Get("reqId"), "Invalid command")
		return
	}
	if cmd != "Auth" && c.srv.authRequired() && !c.authed {
		c.answerError(m.Get("reqId"), "Not authenticated")
		return
	}
	h := c.srv.cmds[cmd]
	if h == nil {
		c.answerError(m.Get("reqId"), "Unknown command: "+cmd)
		return
	}
	c.run(h, m, &c.rb)
}

// run executes a handler and frames its answer into e.
func (c *conn) run(h Handler, m Map, e *Enc) {
	start := len(e.B)
	r := Req{c: c, m: m, e: e, reqID: m.Get("reqId"), b: c.srv.b}
	at := e.BeginFrame()
	mp := e.OpenMap()
	e.Str("ok")
	okPos := len(e.B)
	e.Bool(true)
	r.n = 1
	err := safeCall(h, &r)
	if err == errAsync {
		e.B = e.B[:start]
		return
	}
	if err != nil {
		e.B = e.B[:okPos]
		e.Bool(false)
		e.Str("error")
		e.Str(err.Error())
		r.n = 2
	}
	e.Str("reqId")
	if r.reqID == nil {
		e.Undefined()
	} else {
		e.Raw(r.reqID)
	}
	e.CloseMap(mp, r.n+1)
	e.EndFrame(at)
}

// safeCall keeps a handler bug from taking the server down with it: the
// client gets an error and the fault is logged.
func safeCall(h Handler, r *Req) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.c.srv.log.Error("handler panic", "panic", p, "stack", string(debug.Stack()))
			err = errors.New("Internal server error")
		}
	}()
	return h(r)
}

func (c *conn) answerError(reqID Raw, msg string) {
	e := &c.rb
	at := e.BeginFrame()
	e.MapHead(3)
	e.Str("ok")
	e.Bool(false)
	e.Str("error")
	e.Str(msg)
	e.Str("reqId")
	if reqID == nil {
		e.Undefined()
	} else {
		e.Raw(reqID)
	}
	e.EndFrame(at)
}

// goAsync answers the request from a goroutine of its own running fn. The
// request's fields are gone by then (the frame buffer is reused): fn works
// from values the handler read beforehand.
func (r *Req) goAsync(fn func(r *Req) error) error {
	c := r.c
	if c.nAsync.Add(1) > maxAsyncPerConn {
		c.nAsync.Add(-1)
		return errors.New("too many waiting commands on this connection")
	}
	var reqID Raw
	if r.reqID != nil {
		reqID = append(Raw(nil), r.reqID...)
	}
	c.async.Add(1)
	go func() {
		defer c.async.Done()
		defer c.nAsync.Add(-1)
		e := &Enc{}
		c.run(func(ar *Req) error {
			ar.reqID = reqID
			return fn(ar)
		}, Map{}, e)
		c.writeFrame(e.B)
	}()
	return errAsync
}

func splitTokens(s string) []string {
	var out []string
	for _, t := range strings.Split(s, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}
