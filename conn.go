package main

// One client connection of the TCP server: reading frames, writing
// answers, the jobs it holds and the events it is sent.
//
// A connection's own answers are written into its reader's buffer and sent
// when no more input is waiting, so a pipelining client gets many answers
// per write(2). Events for subscribers go through a separate bounded
// buffer and writer goroutine, so that the broker never blocks on a
// subscriber's socket.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// conn is one client connection.
//
// An idle connection holds no buffer: it waits for its next request with
// a read into wake, a few hundred bytes of its own. Once bytes arrive it
// borrows a read buffer, an answer buffer and a field slice from a pool,
// and gives them back as soon as nothing more is waiting to be read, so
// 10,000 idle connections cost their goroutines and sockets, not 10,000
// read buffers.
type conn struct {
	srv      *Server
	id       string // the clientId of its client:* and auth:failed notices
	client   string // its client's address, for its turns at the answer budget (clientKey)
	greeted  bool   // client:connected announced (its handshake done)
	nc       net.Conn
	br       *bufio.Reader // borrowed while busy; nil while idle
	bufs     *connBufs     // what br, rb and fields were borrowed from
	src      connSource    // what br reads: the bytes woken with, then nc
	wake     [512]byte
	big      []byte // the body of a frame larger than br's buffer
	inPlace  int    // the current frame's body is in br's buffer, this long
	midFrame bool   // a frame is being read: its reads have the stall timeout
	rdl      time.Time
	authBy   time.Time // the Auth deadline (zero: none)
	fails    int       // failed Auth attempts
	closing  bool      // close once the answers are written
	rb       Enc       // the reader's answers, not yet written
	authed   bool
	limit    reqWindow // the request limiter's count (reqlimit.go), the reader's own
	ctx      context.Context
	cancel   context.CancelFunc
	async    sync.WaitGroup
	nAsync   atomic.Int32
	offHeld  atomic.Int64 // bytes held by ACKs and FAILs run off the reader (offReader)
	closed   atomic.Bool
	stopping atomic.Bool

	wmu sync.Mutex // one writer on the socket at a time

	// Asynchronous answers of the same instant, written together
	// (combine): their bytes (nil: none queued) and the count they hold
	// of the answer budget.
	omu    sync.Mutex
	ob     *answerBatch
	obHeld int64

	emu    sync.Mutex // events
	ebuf   []byte
	ekick  chan struct{}
	edrops int
	subQ   string
	hasSub bool

	hmu  sync.Mutex // jobs pulled through this connection
	held map[*Job]struct{}

	fields []Field

	// Answers held for this connection (answer_budget.go): pending counts the
	// bytes built or reserved and not yet written; rbReserved the
	// reservations of the answers waiting in rb (the reader's own).
	pending    atomic.Int64
	rbReserved int64
	dropped    atomic.Bool // closed for not reading its answers
	// backlog and onSlow, when set, replace the TCP share check and the
	// close for a transport that queues answers itself (a WebSocket):
	// backlog says whether n more bytes pass the client's share.
	backlog func(n int64) bool
	onSlow  func()

	// out, when set, replaces the socket: the connection is a WebSocket's
	// or an HTTP request's, and asynchronous answers go to out as frames.
	out func(frame []byte)
	// stateless marks an HTTP request's connection: nothing it pulls or
	// registers is tied to it, since it ends with the request (the
	// reference leaves such jobs to stall detection).
	stateless bool
	// json marks a connection whose answers are sent as JSON (an HTTP
	// request's, a WebSocket's): its lists of jobs are cut to what a JSON
	// answer carries (answerLimit).
	json bool
}

const (
	maxEventBacklog = 8 << 20 // bytes of unsent events before a subscriber loses events
	maxAsyncPerConn = 1024    // concurrent waiting commands per connection
	flushAt         = 256 << 10
	writeTimeout    = 60 * time.Second
	stopGrace       = time.Second
	// readBufSize is a busy connection's read buffer: frames up to this
	// size are read in place, larger ones into a buffer of their own.
	readBufSize = 16 << 10
	// Buffers past these sizes are let go rather than kept or pooled: one
	// large frame or answer does not pin its memory for the connection's
	// life.
	keepBig    = 1 << 20
	keepAnswer = 64 << 10
	keepFields = 256
)

// connBufs are the buffers a busy connection borrows.
type connBufs struct {
	br     *bufio.Reader
	rb     []byte
	fields []Field
}

var connBufsPool = sync.Pool{New: func() any {
	return &connBufs{br: bufio.NewReaderSize(nil, readBufSize), rb: make([]byte, 0, 4096), fields: make([]Field, 0, 32)}
}}

// connSource gives the bytes a connection woke with, then reads the socket
// with the deadline the connection's state calls for.
type connSource struct {
	c   *conn
	pre []byte
}

func (s *connSource) Read(p []byte) (int, error) {
	if len(s.pre) > 0 {
		n := copy(p, s.pre)
		s.pre = s.pre[n:]
		return n, nil
	}
	s.c.armRead()
	return s.c.nc.Read(p)
}

func newConn(s *Server, nc net.Conn) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{srv: s, nc: nc, ctx: ctx, cancel: cancel, id: newID()}
	c.src.c = c
	return c
}

func (c *conn) serve() {
	defer c.recoverPanic("closing")
	defer c.finish()
	defer c.recoverPanic("serving")
	c.client = clientKey(c.nc.RemoteAddr().String())
	if !c.handshake() {
		return
	}
	c.greeted = true
	c.srv.b.announce(noticeClient("client:connected", c.id))
	if c.srv.authRequired() {
		c.authBy = time.Now().Add(c.srv.authTimeout)
	}
	for {
		if c.br == nil || (c.br.Buffered() == 0 && len(c.src.pre) == 0) {
			c.idle()
			if err := c.awake(); err != nil {
				c.readFailed(err)
				return
			}
		}
		body, err := c.readFrame()
		if err != nil {
			c.readFailed(err)
			return
		}
		procsBurst(len(body))
		c.handleFrame(body)
		c.frameDone()
		if c.closing {
			c.farewell()
			return
		}
		// Before Auth every answer goes at once: nothing piles up for a
		// client that sends and does not read.
		// A big answer (one with a reservation) goes at once, and every
		// answer does while the server's answer budget is spent: answers
		// gathered for one write are memory held.
		if !c.frameWaiting() || len(c.rb.B) >= flushAt || c.preAuth() || c.rbReserved > 0 || c.srv.answers.pressed() {
			if !c.flush() {
				return
			}
		}
	}
}

// preAuth reports a connection that must still authenticate. Only the
// connection's reader may ask: authed is its own.
func (c *conn) preAuth() bool { return !c.authed && !c.authBy.IsZero() }

// recoverPanic keeps a fault outside a handler (which safeCall covers)
// from taking the server down: it is logged and the connection closed.
func (c *conn) recoverPanic(during string) {
	if p := recover(); p != nil {
		c.srv.log.Error("connection panic; closing the connection", "during", during,
			"remote", c.nc.RemoteAddr().String(), "panic", p, "stack", string(debug.Stack()))
	}
}

// handshake completes a TLS handshake within handshakeTimeout.
func (c *conn) handshake() bool {
	tc, ok := c.nc.(*tls.Conn)
	if !ok {
		return true
	}
	c.rdl = time.Now().Add(c.srv.handshakeTimeout)
	c.nc.SetDeadline(c.rdl)
	if c.stopping.Load() {
		return false
	}
	err := tc.Handshake()
	c.nc.SetWriteDeadline(time.Time{})
	if err != nil {
		c.srv.log.Debug("TLS handshake failed", "remote", c.nc.RemoteAddr().String(),
			"handshake_timeout", c.srv.handshakeTimeout.String(), "err", err)
		return false
	}
	return !c.stopping.Load()
}

// armRead sets the socket's read deadline for the next read: the Auth
// deadline while the connection has not authenticated, the stall timeout
// inside a frame, none otherwise. It is set only when it changes (the stall
// deadline when it moves by a second or more), since each change costs.
func (c *conn) armRead() {
	var d time.Time
	if c.preAuth() {
		d = c.authBy
	}
	if c.midFrame {
		if st := time.Now().Add(c.srv.stallTimeout); d.IsZero() || st.Before(d) {
			if moved := st.Sub(c.rdl); !c.rdl.IsZero() && moved >= 0 && moved < time.Second {
				return
			}
			d = st
		}
	}
	if d.Equal(c.rdl) {
		return
	}
	c.nc.SetReadDeadline(d)
	c.rdl = d
	// A shutdown that set its own deadline in between must not be undone.
	if c.stopping.Load() {
		c.nc.SetReadDeadline(time.Now())
	}
}

// idle gives back what a busy connection borrowed.
func (c *conn) idle() {
	if c.bufs == nil {
		return
	}
	b := c.bufs
	b.br.Reset(nil)
	b.rb = c.rb.B[:0]
	if cap(b.rb) > keepAnswer {
		b.rb = make([]byte, 0, 4096)
	}
	b.fields = c.fields[:0]
	if cap(b.fields) > keepFields {
		b.fields = make([]Field, 0, 32)
	}
	clear(b.fields[:cap(b.fields)]) // no pointers into old frames
	connBufsPool.Put(b)
	c.bufs, c.br, c.rb.B, c.fields, c.big = nil, nil, nil, nil, nil
}

// awake waits for the next request without a buffer of its own, then
// borrows one.
func (c *conn) awake() error {
	c.armRead()
	n, err := c.nc.Read(c.wake[:])
	for tries := 0; n == 0 && err == nil; tries++ {
		if tries == 100 {
			return io.ErrNoProgress
		}
		n, err = c.nc.Read(c.wake[:])
	}
	if n == 0 {
		return err
	}
	// With n > 0 an error comes back on the next read.
	c.src.pre = c.wake[:n]
	c.bufs = connBufsPool.Get().(*connBufs)
	c.br = c.bufs.br
	c.br.Reset(&c.src)
	c.rb.B = c.bufs.rb[:0]
	c.fields = c.bufs.fields[:0]
	return nil
}

// readFrame reads the next frame's body: in place in br's buffer when it
// fits (valid until frameDone), else into big, grown as the bytes arrive.
// A connection that has not authenticated (when tokens are set) may send
// preAuthMaxFrame bytes a frame; a header announcing more ends the
// connection before any of the body is read.
func (c *conn) readFrame() ([]byte, error) {
	c.midFrame = true
	defer func() { c.midFrame = false }()
	var hdr [4]byte
	if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if c.preAuth() && n > preAuthMaxFrame {
		return nil, &FrameSizeError{N: n, Max: preAuthMaxFrame, PreAuth: true}
	}
	if n > MaxFrame {
		return nil, &FrameSizeError{N: n, Max: MaxFrame}
	}
	if int(n) <= c.br.Size() {
		body, err := c.br.Peek(int(n))
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		c.inPlace = int(n)
		return body, nil
	}
	var err error
	c.big, err = readFrameBody(c.br, c.big, int(n))
	return c.big, err
}

// frameDone lets go of the frame just answered.
func (c *conn) frameDone() {
	inPlace := c.inPlace > 0
	if inPlace {
		c.br.Discard(c.inPlace)
		c.inPlace = 0
	}
	if cap(c.big) > keepBig {
		c.big = nil
	}
	if cap(c.fields) > keepFields {
		c.fields = nil
	} else if !inPlace {
		// Fields past the next request's would keep pointing into a large
		// frame's body, and keep it.
		clear(c.fields[:cap(c.fields)])
	}
}

// readFailed ends the connection after a failed read, telling the client
// why when the reason is a limit of the server's.
func (c *conn) readFailed(err error) {
	var fe *FrameSizeError
	remote := c.nc.RemoteAddr().String()
	switch {
	case errors.As(err, &fe):
		// The stream cannot be resynchronised: say why, then close.
		c.answerError(nil, fe.Error())
		if fe.PreAuth {
			c.srv.log.Debug("closing a connection that sent a large frame before Auth", "remote", remote,
				"frame_bytes", fe.N, "pre_auth_max_frame", preAuthMaxFrame)
		}
	case isTimeout(err) && !c.stopping.Load():
		if c.preAuth() && !time.Now().Before(c.authBy) {
			c.answerError(nil, fmt.Sprintf("Authentication timeout: a connection must send Auth within %v", c.srv.authTimeout))
			c.srv.log.Debug("closing a connection that did not authenticate in time", "remote", remote,
				"auth_timeout", c.srv.authTimeout.String())
		} else {
			c.answerError(nil, fmt.Sprintf("Connection closed: an incomplete frame made no progress for %v", c.srv.stallTimeout))
			c.srv.log.Debug("closing a stalled connection (incomplete frame)", "remote", remote,
				"stall_timeout", c.srv.stallTimeout.String())
		}
	case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isTimeout(err):
	default:
		c.srv.log.Debug("connection read", "remote", remote, "err", err)
	}
	c.farewell()
}

// farewell writes the last answers with a short deadline: a client being
// closed does not hold the connection's goroutine for writeTimeout.
func (c *conn) farewell() {
	c.unreserve(c.rbReserved)
	c.rbReserved = 0
	if len(c.rb.B) == 0 {
		return
	}
	c.wmu.Lock()
	c.nc.SetWriteDeadline(time.Now().Add(farewellTime))
	c.nc.Write(c.rb.B)
	c.wmu.Unlock()
	c.rb.B = c.rb.B[:0]
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
func (c *conn) write(b []byte) error { return c.writeWithin(b, writeTimeout) }

func (c *conn) writeWithin(b []byte, d time.Duration) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeHeld(b, d)
}

// writeHeld is writeWithin with c.wmu held.
func (c *conn) writeHeld(b []byte, d time.Duration) error {
	c.nc.SetWriteDeadline(time.Now().Add(d))
	if c.stopping.Load() {
		c.nc.SetWriteDeadline(time.Now().Add(stopGrace))
	}
	if len(b) > smallAnswer {
		return c.writeBig(b)
	}
	_, err := c.nc.Write(b)
	return err
}

// writePiece is how much of a big answer goes in one write: what a
// client reads shows as progress at least this often (every 0.6 s at
// 100 KB/s, under the second the budget waits before it takes a stalled
// write's room back).
const writePiece = 64 << 10

// writeBig writes a big answer a piece at a time, registered with the
// answer budget, which can tell a client that reads it slowly from one
// that does not read it at all, and close the latter while others wait
// for room (fair turns, answer_budget.go); c.wmu is held.
func (c *conn) writeBig(b []byte) error {
	a := c.srv.answers
	w := a.writing(func() {
		c.dropped.Store(true)
		c.nc.Close()
	})
	defer a.done(w)
	for len(b) > 0 {
		n, err := c.nc.Write(b[:min(len(b), writePiece)])
		if err != nil {
			return err
		}
		w.progress()
		b = b[n:]
	}
	return nil
}

// flush writes the reader's pending answers. It reports false when the
// socket is gone.
func (c *conn) flush() bool {
	c.unreserve(c.rbReserved)
	c.rbReserved = 0
	if len(c.rb.B) == 0 {
		return true
	}
	n := int64(len(c.rb.B))
	if !c.sending(n) {
		return false
	}
	defer c.freeOut(n)
	within := writeTimeout
	if c.preAuth() {
		// A connection that has not authenticated gets no more time to
		// read its answers than it has to authenticate.
		within = max(time.Until(c.authBy), farewellTime)
	}
	err := c.writeWithin(c.rb.B, within)
	if cap(c.rb.B) > keepBig {
		c.rb.B = make([]byte, 0, 4096)
	} else {
		c.rb.B = c.rb.B[:0]
	}
	return err == nil
}

// writeFrame sends one complete frame from another goroutine. On a
// socket, the frame counts among the connection's unread answers until it
// is written.
func (c *conn) writeFrame(b []byte) {
	if c.out != nil {
		c.out(b)
		return
	}
	n := int64(len(b))
	if !c.sending(n) {
		return
	}
	if len(b) <= smallAnswer && c.combine(b, n) {
		return
	}
	if err := c.write(b); err != nil {
		c.nc.Close() // the stream may end inside an answer
	}
	c.freeOut(n)
}

// combine writes b together with the other asynchronous answers for c
// that are ready at the same instant. In PostgreSQL mode answers come in
// rounds: a push round's commit answers the PUSHes it held and the pulls
// it handed jobs to, an ACK round its ACKs, a claim round its pulls, each
// from a goroutine of its own, several of them for each connection that a
// client's workers share. Written one by one they cost a system call
// each on the server, and a read and a wake-up each on the client. The
// first answer queued writes those queued by the time it holds the
// socket; the others return once theirs is queued (the connection's
// close waits for the writer, which is one of its commands). On one
// processor (procsOne: PostgreSQL mode serves on one until it is nearly
// busy) the first yields before it writes, so that the answers readied
// with it, which could not run meanwhile, queue theirs: there the yield
// wakes no other thread. On more they run beside it, and a yield would
// wake a processor to take it. queued bench steady, PostgreSQL, medians
// of 3 (docs/performance.md): at 2,000 jobs/s 3.3 writes a job to 1.1,
// the server's CPU a job 8% less and the bench's 9%, p99 60 to 42 ms;
// at 3,000/s p99 452 to 318 ms.
//
// It reports false, having queued nothing, when b does not fit beside
// what is queued (combineMax): the caller then writes b itself, waiting
// for the socket.
func (c *conn) combine(b []byte, n int64) bool {
	c.omu.Lock()
	if c.ob != nil && len(c.ob.b)+len(b) > combineMax {
		c.omu.Unlock()
		return false
	}
	first := c.ob == nil
	if first {
		c.ob = answerBatches.Get().(*answerBatch)
	}
	c.ob.b = append(c.ob.b, b...)
	c.obHeld += n
	c.omu.Unlock()
	if !first {
		return true
	}
	if procsOne.Load() {
		runtime.Gosched()
	}
	// Taken under wmu, so that a batch queued after this one is written
	// after it.
	c.wmu.Lock()
	c.omu.Lock()
	ob, held := c.ob, c.obHeld
	c.ob, c.obHeld = nil, 0
	c.omu.Unlock()
	if err := c.writeHeld(ob.b, writeTimeout); err != nil {
		c.nc.Close() // the stream may end inside an answer
	}
	c.wmu.Unlock()
	c.freeOut(held)
	ob.b = ob.b[:0]
	answerBatches.Put(ob)
	return true
}

// combineMax bounds the answers queued on a connection for a shared
// write. Past it an answer is written by its own goroutine, which waits
// for the socket holding its command's slot (maxAsyncPerConn), as every
// answer did before: a client that does not read is slowed down, not
// queued for. It is smallAnswer, so that a batch is never a big answer
// (writeBig).
const combineMax = smallAnswer

// answerBatch is a buffer of answers queued by combine, kept in a pool
// while no connection has answers queued: an idle connection holds none.
type answerBatch struct{ b []byte }

var answerBatches = sync.Pool{New: func() any { return new(answerBatch) }}

// sending counts n bytes about to be written to c's socket among its
// unread answers, unless they pass its share: then the connection is
// closed (the client does not read) and sending reports false.
func (c *conn) sending(n int64) bool {
	if c.overShare(n) {
		c.notReading(c.pending.Load() + n)
		return false
	}
	c.holdOut(n)
	return true
}

// newVirtualConn is a connection without a socket of its own, for the
// commands that arrive over a WebSocket or an HTTP request: they run
// through the same command table as TCP ones. Asynchronous answers go to
// out; ctx ends the connection's waiting commands.
func newVirtualConn(s *Server, ctx context.Context, client string, out func(frame []byte), stateless bool) *conn {
	ctx, cancel := context.WithCancel(ctx)
	// There is no token to present: the transport has checked it.
	return &conn{srv: s, ctx: ctx, cancel: cancel, out: out, stateless: stateless, authed: true,
		held: make(map[*Job]struct{}), id: newID(), client: client}
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
	c.srv.b.workers.dropConn(c)
	c.srv.eng.Release(context.Background(), c)
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
	for _, w := range b.workers.dropConn(c) {
		b.announce(noticeWorker("worker:disconnected", w.ID).str("name", w.Name).str("clientId", c.id))
	}
	c.srv.eng.Release(context.Background(), c)
	c.emu.Lock()
	c.hasSub = false
	if c.ekick != nil {
		close(c.ekick)
		c.ekick = nil
	}
	c.srv.answers.free(int64(len(c.ebuf)))
	c.ebuf = nil
	c.emu.Unlock()
	c.wmu.Lock()
	c.nc.Close()
	c.wmu.Unlock()
	c.srv.mu.Lock()
	delete(c.srv.conns, c)
	c.srv.mu.Unlock()
	c.srv.nconns.Add(-1)
	c.unreserve(c.rbReserved)
	c.rbReserved = 0
	c.inPlace = 0
	c.idle()
	if c.greeted {
		b.announce(noticeClient("client:disconnected", c.id))
	}
}

// ---------------------------------------------------------------------------
// Held jobs, for release on disconnect

func (c *conn) track(j *Job) {
	c.hmu.Lock()
	if c.held == nil {
		c.held = make(map[*Job]struct{})
	}
	c.held[j] = struct{}{}
	c.hmu.Unlock()
	j.setOwner(c)
}

// untrack runs under the job's shard lock when it stops being active.
func (j *Job) untrack() {
	if c := j.run().owner; c != nil {
		c.hmu.Lock()
		delete(c.held, j)
		c.hmu.Unlock()
		j.setOwner(nil)
	}
}

func (c *conn) takeHeld() []*Job {
	c.hmu.Lock()
	out := make([]*Job, 0, len(c.held))
	for j := range c.held {
		out = append(out, j)
	}
	c.held = nil
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

// pushEvent queues an encoded event frame of queue's; it never blocks. An
// emit reads the subscribers without a lock (Broker.emit): a connection
// that has since unsubscribed, or moved to another queue, drops it.
func (c *conn) pushEvent(queue string, frame []byte) {
	c.emu.Lock()
	if c.ekick == nil || !c.hasSub || c.subQ != queue {
		c.emu.Unlock()
		return
	}
	// A subscriber with events still unsent loses this one when its
	// backlog is full, or when the server's answer budget is spent (an
	// empty backlog takes one, so one that reads misses nothing).
	if len(c.ebuf)+len(frame) > maxEventBacklog || (len(c.ebuf) > 0 && c.srv.answers.pressed()) {
		c.edrops++
		if c.edrops == 1 {
			c.srv.log.Warn("event subscriber is not reading; dropping its events",
				"remote", c.nc.RemoteAddr().String())
		}
		c.emu.Unlock()
		return
	}
	c.ebuf = append(c.ebuf, frame...)
	c.srv.answers.hold(int64(len(frame)))
	select {
	case c.ekick <- struct{}{}:
	default:
	}
	c.emu.Unlock()
}

// eventLinger is the least time between two writes of a subscriber's
// events. An event after a quiet spell goes at once; in a stream, the
// events of a millisecond share one write. The official Worker subscribes
// to its queue, and each job makes three events (pushed, active,
// completed): written one by one, with the official client at a steady
// 1,000 jobs/s, the server made 4.2 write(2) calls a job and 2.1 futex
// wake-ups; sharing writes, 3.2 and 1.5, and 9% less CPU a job.
const eventLinger = time.Millisecond

func (c *conn) eventWriter(kick chan struct{}) {
	defer c.async.Done()
	var out []byte
	var wrote time.Time
	linger := time.NewTimer(0)
	<-linger.C
	defer linger.Stop()
	for {
		select {
		case _, ok := <-kick:
			if !ok {
				return
			}
		case <-c.ctx.Done():
			return
		}
		if since := time.Since(wrote); since < eventLinger {
			linger.Reset(eventLinger - since)
			select {
			case <-linger.C:
			case <-c.ctx.Done():
				return
			}
		}
		c.emu.Lock()
		out, c.ebuf = c.ebuf, out[:0]
		c.edrops = 0
		c.emu.Unlock()
		if len(out) > 0 {
			err := c.write(out)
			wrote = time.Now()
			c.srv.answers.free(int64(len(out)))
			if err != nil {
				return
			}
		}
	}
}

// localSend runs one command on this server, as a TCP connection's would
// run it, and answers its answer: for the server's own clients (the HTTP
// handlers), which go through the same checks, events and figures as any
// other. The answer's room in the answer budget is given back as it
// returns.
func (s *Server) localSend(ctx context.Context, cmd string, fields func(e *Enc) int) ([]byte, error) {
	ans, held, err := s.localRun(ctx, cmd, fields)
	s.answers.free(held)
	return ans, err
}

// localSendHeld is localSend for a caller that reads the answer at
// length (the MCP tools served over HTTP): the answer stays counted in
// the server's answer budget, every byte of it, until release, which the
// caller calls once it is done with it (always, error or not).
func (s *Server) localSendHeld(ctx context.Context, cmd string, fields func(e *Enc) int) (ans []byte, release func(), err error) {
	ans, held, err := s.localRun(ctx, cmd, fields)
	// The budget collects a big answer's garbage before its room goes to
	// the next (answerBudget.collect).
	return ans, func() { s.answers.free(held) }, err
}

// localRun runs the command and answers its answer, the frame it wrote
// (not a copy), and the bytes held for it in the answer budget: what the
// command reserved and the rest of the frame.
func (s *Server) localRun(ctx context.Context, cmd string, fields func(e *Enc) int) (ans []byte, held int64, err error) {
	var req Enc
	mp := req.OpenMap()
	req.Str("cmd")
	req.Str(cmd)
	n := 1
	if fields != nil {
		n += fields(&req)
	}
	req.CloseMap(mp, n)
	m, err := parseRequest(req.B, nil, maxRequestFields)
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	async := make(chan []byte, 1)
	// An answer given later is counted before it is handed over: goAsync
	// gives its reservation back once out returns, and the frame must not
	// be unaccounted in between.
	c := newVirtualConn(s, ctx, "", func(f []byte) {
		s.answers.hold(int64(len(f)))
		async <- f
	}, true)
	var e Enc
	held = c.dispatch(m, &e)
	if f := e.B; len(f) > 0 {
		// Answered at once: the room the command reserved, and the rest
		// of the frame when it wrote more (answers under smallAnswer
		// reserve nothing).
		if extra := int64(len(f)) - held; extra > 0 {
			s.answers.hold(extra)
			held += extra
		}
		c.finishVirtual()
		return f[4:], held, nil
	}
	var f []byte
	select {
	case f = <-async:
	case <-ctx.Done():
	}
	// The connection's waiting command ends with it, and what it answers
	// then is let go.
	c.finishVirtual()
	if f == nil {
		select {
		case late := <-async:
			s.answers.free(int64(len(late)))
		default:
		}
		s.answers.free(held)
		return nil, 0, ctx.Err()
	}
	return f[4:], held + int64(len(f)), nil
}
