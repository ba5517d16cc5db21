package main

// The TCP server: one goroutine per connection reads frames and answers them
// in order of arrival; commands that wait (long-poll pulls, WaitJob) answer
// from their own goroutine when they are done, so they never hold up the
// commands pipelined behind them.
//
// The connection itself, its reading and writing, is in conn.go.

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server accepts connections and dispatches their commands to the broker.
type Server struct {
	b *Broker
	// reqLimit is the per-client request limiter (reqlimit.go); nil: off.
	reqLimit *reqLimiter
	// trusted are the proxies whose headers name an HTTP client
	// (--trusted-proxies), for the limiter and for the answer budget's
	// turns.
	trusted trustedProxies
	tokens  []string
	log     *slog.Logger

	// frames counts the requests read, for memReturn's idea of idle.
	frames atomic.Int64

	// tokenSums are the tokens' SHA-256 digests: an Auth is compared
	// digest to digest, so that the time taken says nothing of a token's
	// length (a comparison of unequal lengths returns at once).
	tokenSums [][sha256.Size]byte

	ln     net.Listener
	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool
	done   chan struct{} // closed by Close: ends an accept backoff
	wg     sync.WaitGroup
	nconns atomic.Int64

	// maxConns bounds the TCP connections held at once (0: no bound);
	// connections past it are told so and closed.
	maxConns int
	refusing atomic.Int32 // connections being told that the server is full
	refused  rateLog
	// authTimeout is how long a connection may take to authenticate when
	// tokens are set; handshakeTimeout bounds a TLS handshake.
	authTimeout      time.Duration
	handshakeTimeout time.Duration
	stallTimeout     time.Duration
	authFails        authGate

	mx    *Metrics  // per-queue figures, fed by a broker tap
	hooks *Webhooks // set by runServer; nil answers that webhooks are unavailable
	// handlers work queues by calling URLs (urlworker.go); set by
	// runServer, nil answers that they are unavailable.
	handlers *Handlers
	// bk and live are set by runServer before it serves, for the
	// Prometheus figures; nil (no S3 backups, no HTTP port) gives zeros.
	bk   *BackupService
	live *live
	// promMaxQueues bounds the queues given labelled Prometheus series
	// (--metrics-max-queues).
	promMaxQueues int

	// answers bounds the answer bytes held for clients (answer_budget.go).
	answers *answerBudget

	eng Engine // storage: the broker itself, or pg
	pg  *PG    // PostgreSQL mode's engine; nil in the other modes
}

// usePG makes pg the server's engine (PostgreSQL mode).
func (s *Server) usePG(pg *PG) {
	s.pg, s.eng = pg, pg
}

const (
	defaultAuthTimeout      = 10 * time.Second
	defaultHandshakeTimeout = 10 * time.Second
	// Before Auth (when tokens are set) a connection may send small frames
	// of a few fields only: an Auth request is three.
	preAuthMaxFrame  = 64 << 10
	preAuthMaxFields = 16
	// maxRequestFields bounds the top-level map of any request. Each field
	// costs 48 bytes parsed against 2 on the wire; real requests have a
	// few dozen.
	maxRequestFields = 1024
	// defaultStallTimeout closes a connection whose incomplete frame makes
	// no progress for this long, as the reference does (its
	// TCP_IDLE_TIMEOUT_MS); a connection idle between frames is not timed.
	defaultStallTimeout = 60 * time.Second
	// Failed Auth attempts: each answer on a connection waits longer than
	// the one before (from authFailDelay, doubling), the connection is
	// closed at maxAuthFailures, and across all connections failures are
	// answered authFailSpacing apart at most, which bounds the guesses a
	// second whatever the number of connections.
	maxAuthFailures = 5
	authFailDelay   = 200 * time.Millisecond
	authFailSpacing = 10 * time.Millisecond
	maxAuthFailWait = 5 * time.Second
	// Connections past maxConns are told so by a goroutine each, for
	// refuseWithin at most; past maxRefusing at once they are closed
	// without a word.
	maxRefusing  = 64
	refuseWithin = 2 * time.Second
	farewellTime = 2 * time.Second // to write a last error before closing
)

// NewServer makes the protocol server of broker b over engine eng (in
// PostgreSQL mode nil, then usePG).
func NewServer(b *Broker, eng Engine, tokens []string, log *slog.Logger) *Server {
	s := &Server{b: b, tokens: tokens, log: log, conns: make(map[*conn]struct{}), done: make(chan struct{}),
		mx: newMetrics(b), eng: eng, promMaxQueues: defaultPromMaxQueues,
		answers:     newAnswerBudget(defaultAnswerBudget(), defaultWriteQueueBytes),
		authTimeout: defaultAuthTimeout, handshakeTimeout: defaultHandshakeTimeout, stallTimeout: defaultStallTimeout}
	for _, t := range tokens {
		s.tokenSums = append(s.tokenSums, sha256.Sum256([]byte(t)))
	}
	s.refused = rateLog{every: 10 * time.Second}
	s.answers.log = log
	return s
}

// Serve accepts on ln until Close. A failed accept (out of descriptors,
// of buffers, a connection aborted before it was taken) is retried after a
// pause that grows while the failures go on: it never ends the server.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.ln = ln
	closed := s.closed
	s.mu.Unlock()
	if closed {
		// Closed before it served: Close had no listener to close.
		ln.Close()
		return nil
	}
	bo := acceptBackoff{log: s.log, name: "tcp", done: s.done}
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				// Closed by someone else: there is nothing left to accept from.
				return err
			}
			bo.failed(err)
			continue
		}
		bo.ok()
		nc = quietSocket(nc) // a socket not under TLS; main.go's TLS listener takes quiet ones
		if tc, ok := socketOf(nc).(*net.TCPConn); ok {
			tc.SetNoDelay(true)
			tc.SetKeepAlive(true)
			tc.SetKeepAlivePeriod(30 * time.Second)
		}
		if s.maxConns > 0 && s.nconns.Load() >= int64(s.maxConns) {
			s.refuse(nc)
			continue
		}
		c := newConn(s, nc)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.nconns.Add(1)
		s.wg.Go(c.serve) // under the lock, as in refuse
		s.mu.Unlock()
	}
}

// refuse tells a connection past the limit why it is closed, from a
// goroutine of its own with a deadline: the accept loop never waits on a
// client.
func (s *Server) refuse(nc net.Conn) {
	if n := s.refused.hit(); n > 0 {
		s.log.Warn("connection limit reached; refusing connections", "max_connections", s.maxConns, "refused", n)
	}
	s.mu.Lock()
	if s.closed || s.refusing.Add(1) > maxRefusing {
		if !s.closed {
			s.refusing.Add(-1)
		}
		s.mu.Unlock()
		nc.Close()
		return
	}
	// Started under the lock, so that Close, which waits for s.wg once it
	// has set s.closed, waits for this one too.
	s.wg.Go(func() {
		defer s.refusing.Add(-1)
		nc.SetDeadline(time.Now().Add(refuseWithin))
		var e Enc
		appendError(&e, nil, fmt.Sprintf("Too many connections: the server accepts at most %d (--max-connections); try again later", s.maxConns))
		nc.Write(e.B) // a TLS connection shakes hands first, within the deadline
		nc.Close()
	})
	s.mu.Unlock()
}

// Close stops accepting, lets every connection answer what it has read,
// ends long polls with empty answers, and waits for all of it.
func (s *Server) Close() {
	s.mu.Lock()
	if !s.closed {
		close(s.done)
	}
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

// checkToken compares fixed-size digests in constant time, against every
// token.
func (s *Server) checkToken(tok string) bool {
	sum := sha256.Sum256([]byte(tok))
	ok := 0
	for i := range s.tokenSums {
		ok |= subtle.ConstantTimeCompare(sum[:], s.tokenSums[i][:])
	}
	return ok == 1
}

// authGate spaces failed Auth answers across all connections.
type authGate struct {
	mu   sync.Mutex
	next time.Time
}

// reserve returns how long a failure must wait for its turn, or false
// when the wait would pass maxAuthFailWait (the turn is then not taken).
func (g *authGate) reserve(now time.Time) (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	slot := g.next
	if slot.Before(now) {
		slot = now
	}
	if slot.Sub(now) > maxAuthFailWait {
		return 0, false
	}
	g.next = slot.Add(authFailSpacing)
	return slot.Sub(now), true
}

// rateLog lets a repeated log line through once a period; hit returns the
// number of events the line stands for (0: stay quiet).
type rateLog struct {
	mu    sync.Mutex
	every time.Duration
	last  time.Time
	n     int
}

func (r *rateLog) hit() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if now := time.Now(); now.Sub(r.last) >= r.every {
		n := r.n
		r.last, r.n = now, 0
		return n
	}
	return 0
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
	b     *Broker // this broker: sessions, subscribers, workers, counters
	eng   Engine  // storage (engine.go)
	// reserved is the room the answer reserved in the answer budget
	// (Req.room), given back by run's caller once the answer is written.
	reserved int64
}

// ctx is the context engine calls run under: the connection's, which ends
// when it closes or the server stops.
func (r *Req) ctx() context.Context { return r.c.ctx }

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
	c.srv.frames.Add(1)
	procsRequest()
	preAuth := c.preAuth()
	maxFields := maxRequestFields
	if preAuth {
		maxFields = preAuthMaxFields
	}
	m, err := parseRequest(body, c.fields, maxFields)
	c.fields = m.Fields[:0]
	if !c.srv.reqLimit.allowConn(&c.limit) {
		// Counted whether the frame reads or not, as the reference counts.
		// The count is the connection's own: no other client's frames
		// touch it, so a client with a token always gets its Auth read.
		c.srv.b.announce(newNote("ratelimit:hit").str("clientId", c.id))
		c.answerError(m.Get("reqId"), "Rate limit exceeded")
		return
	}
	if err != nil {
		// The frame boundary is intact, so the connection goes on; the
		// reqId is echoed when it could be read before the fault.
		var fe *FieldError
		var fce *FieldCountError
		var xe *ExtError
		msg := "Invalid command format: " + err.Error()
		switch {
		case errors.As(err, &fe):
			msg = "Invalid command format: field " + fe.Error()
		case errors.As(err, &fce):
			fce.PreAuth = preAuth
			msg = "Invalid command: " + fce.Error()
		case errors.As(err, &xe):
			msg = "Invalid command: " + xe.Error()
		case errors.Is(err, errNotMap):
			msg = "Invalid command: a request must be a map"
		}
		c.answerError(m.Get("reqId"), msg)
		return
	}
	c.rbReserved += c.dispatch(m, &c.rb)
}

// dispatch answers one request into e. It is the one path of every
// transport: a TCP frame, an HTTP route's command, a WebSocket message.
// A request without a command name, one other than Auth before the
// session authenticated (a virtual connection's transport checked the
// token already), or one naming no command is answered with an error, as
// the reference does; anything else runs its handler. It returns the
// room the answer reserved in the answer budget, which the caller gives
// back (conn.unreserve) once the answer is written or handed on.
func (c *conn) dispatch(m Map, e *Enc) (reserved int64) {
	cmdRaw := m.Get("cmd")
	cmd, cerr := cmdRaw.Str()
	switch {
	case cmdRaw.IsNil() || cerr != nil || cmd == "":
		appendError(e, m.Get("reqId"), "Invalid command")
	case cmd != "Auth" && c.srv.authRequired() && !c.authed:
		appendError(e, m.Get("reqId"), "Not authenticated")
	case commands[cmd].run == nil:
		appendError(e, m.Get("reqId"), "Unknown command: "+cmd)
	default:
		// The one admission of whatever grows what jobs hold (commands.go).
		h := commands[cmd]
		adm, err := c.srv.b.mem.admitRequest(h.mem, m)
		if err != nil {
			appendError(e, m.Get("reqId"), err.Error())
			return 0
		}
		return c.run(h.run, m, e, adm)
	}
	return 0
}

// run executes a handler and frames its answer into e. It returns the
// room the answer reserved (see dispatch). adm is what the memory budget
// let the request in with: its weight joins the estimate once the command
// did not answer with an error, so that a request refused for a bad field
// cannot swell the estimate.
func (c *conn) run(h Handler, m Map, e *Enc, adm admission) (reserved int64) {
	start := len(e.B)
	r := Req{c: c, m: m, e: e, reqID: m.Get("reqId"), b: c.srv.b, eng: c.srv.eng}
	at := e.BeginFrame()
	mp := e.OpenMap()
	e.Str("ok")
	okPos := len(e.B)
	e.Bool(true)
	r.n = 1
	err := safeCall(h, &r)
	c.srv.b.mem.settle(adm, err == nil || err == errAsync)
	if err == errAsync {
		e.B = e.B[:start]
		return r.reserved
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
	if body := len(e.B) - start - 4; body > MaxFrame {
		// A read that should have cut its answer did not: the frame is
		// not sent, since no client could read it.
		c.srv.log.Warn("an answer over the frame limit was refused", "bytes", body, "max_frame", MaxFrame)
		e.B = e.B[:start]
		appendError(e, r.reqID, errAnswerTooBig("the answer").Error())
	}
	return r.reserved
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

func (c *conn) answerError(reqID Raw, msg string) { appendError(&c.rb, reqID, msg) }

// appendError frames an error answer into e.
func appendError(e *Enc, reqID Raw, msg string) {
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

// authFailed answers a failed Auth. On a connection of its own (not a
// WebSocket's or an HTTP request's, whose transport checked the token)
// and when tokens are set, the answer waits: longer after each failure on
// the connection, and its turn among the failures of all connections (see
// authGate). Only this connection's reader waits; the connection is closed
// at maxAuthFailures.
func (c *conn) authFailed() error {
	invalid := errors.New("Invalid token")
	c.srv.b.announce(newNote("auth:failed").str("clientId", c.id))
	if c.nc == nil || !c.srv.authRequired() {
		return invalid
	}
	c.fails++
	if c.fails >= maxAuthFailures {
		c.closing = true
		c.srv.log.Info("closing a connection after failed Auth attempts", "remote", c.nc.RemoteAddr().String(),
			"failures", c.fails)
		return fmt.Errorf("Invalid token: %d failed Auth attempts, the most a connection may make; closing the connection", maxAuthFailures)
	}
	delay := authFailDelay << (c.fails - 1)
	turn, ok := c.srv.authFails.reserve(time.Now())
	if !ok {
		c.closing = true
		return fmt.Errorf("Invalid token: too many failed Auth attempts on the server (one every %v at most); closing the connection", authFailSpacing)
	}
	t := time.NewTimer(max(delay, turn))
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.ctx.Done():
	}
	return invalid
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
		e := asyncEncs.get()
		reserved := c.run(func(ar *Req) error {
			ar.reqID = reqID
			return fn(ar)
		}, Map{}, e, admission{})
		// The frame is counted as it is written (writeFrame) or queued
		// (a virtual connection's out): its reservation is no longer needed
		// then.
		if c.out == nil {
			c.unreserve(reserved)
			reserved = 0
		}
		c.writeFrame(e.B)
		c.unreserve(reserved)
		// A socket's write is done with the bytes when it returns; a
		// virtual connection's out may keep them, so its buffer is not
		// reused.
		if c.out == nil {
			asyncEncs.put(e)
		}
	}()
	return errAsync
}

// asyncEncs are the buffers asynchronous answers are encoded into. In
// PostgreSQL mode every PULLB and ACKB is answered that way, and an
// encoder grown from nothing for each answer of a hundred jobs was a
// fifth of what the server allocated in a drain. A free list of its own,
// not a sync.Pool: a pool is emptied by the collections, which came ten
// times a second in a drain, and its buffers were grown again from 4 KB
// for every answer. It keeps buffers of at most asyncEncKeepBytes, and
// asyncEncsKeptBytes of them in all: a drain through 4 connections with
// 16 requests in flight each had up to 64 answers under way, most of
// them 128 KB.
var asyncEncs encFreeList

const (
	asyncEncKeepBytes   = 256 << 10
	asyncEncsKeptBytes  = 8 << 20
	asyncEncInitialSize = 4096
)

// encFreeList is a bounded stack of encoders for reuse.
type encFreeList struct {
	mu    sync.Mutex
	free  []*Enc
	bytes int // the capacity of the kept buffers
}

func (l *encFreeList) get() *Enc {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.free); n > 0 {
		e := l.free[n-1]
		l.free[n-1] = nil
		l.free = l.free[:n-1]
		l.bytes -= cap(e.B)
		return e
	}
	return &Enc{B: make([]byte, 0, asyncEncInitialSize)}
}

// put keeps e for reuse unless it is too big to keep or enough is kept.
func (l *encFreeList) put(e *Enc) {
	if cap(e.B) > asyncEncKeepBytes {
		return
	}
	e.B = e.B[:0]
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bytes+cap(e.B) <= asyncEncsKeptBytes {
		l.free = append(l.free, e)
		l.bytes += cap(e.B)
	}
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

// httpClientKey names an HTTP request's client for its turns at the answer
// budget (clientKey): as the request limiter names it, so that behind a
// trusted proxy each client has its turn rather than the proxy one.
func (s *Server) httpClientKey(r *http.Request) string {
	if a := s.trusted.client(r); a.IsValid() {
		return a.String()
	}
	return ""
}
