package main

// Bounds on what the server writes back. Requests are bounded where they
// are read (budgets.go); answers are bounded here, the same for TCP, HTTP
// and WebSocket:
//
//   - No answer frame is larger than the protocol's frame limit: a read
//     whose answer would be (GetJobs, Dlq, PULLB of big jobs, a dashboard
//     page) is cut to the jobs that fit, and one that cannot be cut is
//     refused, naming the limit.
//   - Answers waiting to be written share one server-wide budget
//     (--max-answer-bytes). A big answer reserves its room before it is
//     built, waiting a while for room and refused if none comes, so a
//     client that never reads holds at most what the budget lets it, and
//     the server never allocates first and regrets it. Small answers (a
//     Ping, an ACK) never wait: they are counted, and other clients keep
//     their latency.
//   - One connection's unread answers have a share of their own
//     (--max-write-queue-bytes, the reference's TCP_MAX_WRITE_QUEUE_BYTES):
//     a connection that passes it is not reading, and is closed.
//   - Turns are fair: a client that does not read cannot keep the
//     budget from the others (see "Fair turns" below).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// smallAnswer: answers up to this size are built without a
	// reservation (counted once written into the connection's buffer).
	smallAnswer = 64 << 10
	// answerCap bounds the bytes of jobs one answer carries: the frame
	// limit, less room for the envelope, tokens and keys around them.
	answerCap = MaxFrame - 256<<10
	// defaultWriteQueueBytes is one connection's share, the reference's
	// default for TCP_MAX_WRITE_QUEUE_BYTES.
	defaultWriteQueueBytes = 64 << 20
	// answerWait is how long a big answer waits for room in the budget
	// before it is refused.
	answerWait = 5 * time.Second
	// answerStall is how long a big answer's write may make no progress
	// while others wait for room before its client is taken for one that
	// does not read; reclaimEvery how often waiting reservations look.
	answerStall  = time.Second
	reclaimEvery = 100 * time.Millisecond
	// The default server-wide budget: a 64th of the host's memory,
	// within these bounds.
	minAnswerBudget = 32 << 20
	maxAnswerBudget = 128 << 20
)

// answerBudget is the server-wide count of answer bytes held for clients:
// built and not yet written, or reserved to be built.
type answerBudget struct {
	limit int64 // server-wide (--max-answer-bytes)
	share int64 // one connection's unread answers (0: no share)
	wait  time.Duration

	used    atomic.Int64
	waiting atomic.Int32 // len(queue), read without the lock
	mu      sync.Mutex
	// queue holds the reservations waiting for room, in the order they
	// came. Bytes freed go to the next in turn only (nextTurn), so that a
	// free wakes only those it makes room for (waking every waiter at
	// each free put hundreds of goroutines ahead of every other client's
	// answer: Pings took over a second).
	queue []*answerWaiter
	// turns is, for each client with reservations waiting, the turn it
	// was last granted one (0: none yet); turn counts the grants.
	turns map[string]uint64
	turn  uint64
	// writers are the writes of big answers under way (fair turns),
	// under wmu.
	wmu     sync.Mutex
	writers map[*answerWriter]struct{}
	stall   time.Duration
	// lastReclaim is when a waiter last looked for stalled writes (unix
	// nanoseconds; reclaimDue).
	lastReclaim atomic.Int64
	// reclaimed counts the clients closed for sitting on the budget.
	reclaimed  atomic.Int64
	freed      atomic.Int64 // given back while others waited, since collect last ran
	collecting atomic.Bool  // collect's collection is under way
	log        *slog.Logger // set before the server serves

	refused atomic.Int64 // answers refused for want of room
	slow    atomic.Int64 // connections closed for not reading their answers
	peak    atomic.Int64 // the most bytes held at once
	slowLog rateLog      // one line for many closes in a flood
	// reclaimLog is reclaim's: one line for many closes.
	reclaimLog rateLog
}

func newAnswerBudget(limit, share int64) *answerBudget {
	return &answerBudget{limit: limit, share: share, wait: answerWait, stall: answerStall,
		turns: map[string]uint64{}, writers: map[*answerWriter]struct{}{},
		slowLog: rateLog{every: 10 * time.Second}, reclaimLog: rateLog{every: 10 * time.Second}}
}

// defaultAnswerBudget derives the server-wide budget from the host's
// memory: a 64th of it, at least minAnswerBudget and at most
// maxAnswerBudget (unknown memory: the most).
func defaultAnswerBudget() int64 {
	m := hostMemory()
	if m <= 0 {
		return maxAnswerBudget
	}
	return min(max(m/64, minAnswerBudget), maxAnswerBudget)
}

// hostMemory is the memory this process may use at most: the cgroup's
// limit when it has one below the machine's memory, else the machine's
// memory; 0 when neither can be read.
func hostMemory() int64 {
	var total int64
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				total = kb << 10
			}
		}
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		// "max" when the cgroup sets no limit.
		if m, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && m > 0 && (total == 0 || m < total) {
			total = m
		}
	}
	return total
}

// answerWaiter is one reservation waiting in the queue.
type answerWaiter struct {
	n       int64
	client  string        // whose turn it is (clientKey)
	ready   chan struct{} // closed once granted
	granted bool          // under mu
}

// hold counts n bytes held for a client; it never waits.
func (a *answerBudget) hold(n int64) {
	if n == 0 {
		return
	}
	if u := a.used.Add(n); u > a.peak.Load() {
		a.peak.Store(u)
	}
}

// free gives n bytes back and wakes the reservations waiting for room
// (collecting a big answer's garbage first: collect).
func (a *answerBudget) free(n int64) {
	if n == 0 {
		return
	}
	a.used.Add(-n)
	if a.waiting.Load() > 0 {
		if n > smallAnswer {
			a.collect(n)
		}
		a.grant()
	}
}

// collect starts a collection once a quarter of the budget has been
// given back in big answers (n bytes now) since the last, while others
// wait for room. The budget counts an answer's bytes as free once it is
// written or dropped, but the memory is free only once collected, and the
// collector lets the heap grow to twice what is live first: with the
// budget full of answers for clients that do not read, the garbage of
// those given back (their buffers, and in PostgreSQL mode the rows read
// for them) doubled what the server held, and ten MCP callers reading six
// 9.9 MB jobs each took 414-418 MB. The collection runs in a goroutine of
// its own, one at a time: a full collection marks every job in memory,
// which no goroutine letting go of an answer (perhaps under its
// connection's lock) should wait for.
//
// It gives the freed pages back to the system too (FreeOSMemory, not
// just a collection): the runtime otherwise keeps them and returns them
// slowly, and the next big answers were built in fresh pages beside
// them. On a slower machine (a system call 1 µs) the ten callers took
// the server to 401-439 MB again in 3 runs of 6 with a collection alone,
// and to 242-318 MB in 5 runs of 5 with the pages given back. It costs
// the faults of touching those pages again, and only while big answers
// wait for room.
func (a *answerBudget) collect(n int64) {
	if f := a.freed.Add(n); f < a.limit/4 || !a.freed.CompareAndSwap(f, 0) {
		return
	}
	if a.collecting.CompareAndSwap(false, true) {
		go func() {
			defer a.collecting.Store(false)
			debug.FreeOSMemory()
		}()
	}
}

// take adds n to what is held if it fits (anything fits when nothing is
// held).
func (a *answerBudget) take(n int64) bool {
	for {
		cur := a.used.Load()
		if cur != 0 && cur+n > a.limit {
			return false
		}
		if a.used.CompareAndSwap(cur, cur+n) {
			if cur+n > a.peak.Load() {
				a.peak.Store(cur + n)
			}
			return true
		}
	}
}

// grant gives room to the waiting reservations it now fits, in turn.
func (a *answerBudget) grant() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(a.queue) > 0 {
		i := a.nextTurn()
		w := a.queue[i]
		if !a.take(w.n) {
			return
		}
		w.granted = true
		close(w.ready)
		a.turn++
		a.turns[w.client] = a.turn
		a.dequeue(i)
	}
}

// nextTurn is the place in the queue of the reservation whose turn is
// next: that of the client granted one longest ago (or never), the
// earliest of its own; a.mu is held. Many connections of one client
// thus take turns with a single connection of another, rather than
// queueing ahead of it.
func (a *answerBudget) nextTurn() int {
	best := 0
	for i, w := range a.queue {
		if a.turns[w.client] < a.turns[a.queue[best].client] {
			best = i
		}
	}
	return best
}

// dequeue takes the reservation at i out of the queue, and forgets its
// client's turn once it has none left waiting; a.mu is held.
func (a *answerBudget) dequeue(i int) {
	client := a.queue[i].client
	a.queue = append(a.queue[:i], a.queue[i+1:]...)
	a.waiting.Add(-1)
	for _, w := range a.queue {
		if w.client == client {
			return
		}
	}
	delete(a.turns, client)
}

// pressed says the budget is spent: the buffered answers of every
// connection are then written one by one rather than gathered.
func (a *answerBudget) pressed() bool { return a.used.Load() >= a.limit }

// errAnswerBusy is the refusal of an answer the budget had no room for.
func (a *answerBudget) errBusy() error {
	return fmt.Errorf("Server busy: answers not yet read by clients fill the server's budget of %s (--max-answer-bytes); try again",
		sizeText(a.limit))
}

// busyPrefix starts every refusal for want of room, so that the HTTP
// side can answer it 503.
const busyPrefix = "Server busy: "

// reserve takes n bytes of the budget for an answer about to be built,
// waiting up to a.wait for room, for a client known to no one.
func (a *answerBudget) reserve(ctx context.Context, n int64) error {
	return a.reserveFor(ctx, n, "")
}

// reserveFor takes n bytes of the budget for an answer about to be built
// for client (clientKey), waiting up to a.wait for room, its turn among
// the clients waiting, and reclaiming room from writes that have stalled
// meanwhile. An answer larger than the whole budget gets it when nothing
// else is held.
func (a *answerBudget) reserveFor(ctx context.Context, n int64, client string) error {
	if a.waiting.Load() == 0 && a.take(n) {
		return nil
	}
	a.mu.Lock()
	if len(a.queue) == 0 && a.take(n) {
		a.mu.Unlock()
		return nil
	}
	w := &answerWaiter{n: n, client: client, ready: make(chan struct{})}
	a.queue = append(a.queue, w)
	a.waiting.Add(1)
	if _, ok := a.turns[client]; !ok {
		a.turns[client] = 0
	}
	a.mu.Unlock()
	timer := time.NewTimer(a.wait)
	defer timer.Stop()
	look := time.NewTicker(reclaimEvery)
	defer look.Stop()
	var err error
wait:
	for {
		select {
		case <-w.ready:
			return nil
		case <-look.C:
			a.reclaimDue(time.Now())
		case <-timer.C:
			err = a.errBusy()
			break wait
		case <-ctx.Done():
			err = errors.New("Connection closing")
			break wait
		}
	}
	a.mu.Lock()
	if w.granted {
		// Granted as the wait ended: the room is taken, so it is used.
		a.mu.Unlock()
		return nil
	}
	for i, q := range a.queue {
		if q == w {
			a.dequeue(i)
			break
		}
	}
	a.mu.Unlock()
	if ctx.Err() == nil {
		a.refused.Add(1)
	}
	// The head leaving may let the next ones in.
	a.grant()
	return err
}

// ---------------------------------------------------------------------------
// Fair turns
//
// A client that does not read its answers must not keep the budget from
// the others. Two rules keep it from doing so:
//
//   - Turns go round the clients. Reservations waiting for room are
//     granted by client (the peer's address, clientKey): next is the one
//     whose client was granted room longest ago, so that many connections
//     of one client take turns with another client's single request
//     instead of queueing ahead of it.
//   - Room held for a client that does not read is taken back while others
//     wait. Every write of a big answer is registered (answerWriter) with
//     the time it last wrote anything; while a reservation waits, a write
//     that made no progress for answerStall is stopped: its connection is
//     closed (its client was not reading), and what the connection held
//     goes back to the budget. A slow client that reads keeps its answer.

// answerWriter is one big answer's write under way, as the budget sees it.
type answerWriter struct {
	last atomic.Int64 // unix nanoseconds of its last progress
	stop func()       // ends the write and its connection
	mu   sync.Mutex
	// ended: the write is over (done) or stopped; stop is called only
	// before, under mu, so that a write that has just finished is not
	// ended after the fact.
	ended bool
}

// writing registers a big answer's write, which stop can end; done must
// follow. The write calls progress as bytes go out.
func (a *answerBudget) writing(stop func()) *answerWriter {
	w := &answerWriter{stop: stop}
	w.progress()
	a.wmu.Lock()
	a.writers[w] = struct{}{}
	a.wmu.Unlock()
	return w
}

// progress says the write has sent bytes.
func (w *answerWriter) progress() {
	if w != nil {
		w.last.Store(time.Now().UnixNano())
	}
}

// done ends w's registration.
func (a *answerBudget) done(w *answerWriter) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.ended = true
	w.mu.Unlock()
	a.wmu.Lock()
	delete(a.writers, w)
	a.wmu.Unlock()
}

// reclaimDue runs reclaim unless another waiter did within the last
// reclaimEvery: every waiting reservation looks, and a thousand of them
// walking every write ten times a second each would be a thousand times
// the work for the same answer.
func (a *answerBudget) reclaimDue(now time.Time) {
	last := a.lastReclaim.Load()
	if now.UnixNano()-last < int64(reclaimEvery)*9/10 || !a.lastReclaim.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	a.reclaim(now)
}

// reclaim stops the writes that have made no progress for a.stall, for
// reservations waiting for room: their clients are not reading. It
// reports how many it stopped.
func (a *answerBudget) reclaim(now time.Time) int {
	var stalled []*answerWriter
	a.wmu.Lock()
	for w := range a.writers {
		if now.UnixNano()-w.last.Load() >= int64(a.stall) {
			stalled = append(stalled, w)
			delete(a.writers, w)
		}
	}
	a.wmu.Unlock()
	n := 0
	for _, w := range stalled {
		w.mu.Lock()
		if !w.ended {
			w.ended = true
			w.stop()
			n++
		}
		w.mu.Unlock()
	}
	a.reclaimed.Add(int64(n))
	if n > 0 && a.log != nil {
		if hits := a.reclaimLog.hit(); hits > 0 {
			a.log.Warn("closing connections that do not read a big answer while other answers wait for room",
				"stalled_for", a.stall.String(), "closed", hits)
		}
	}
	return n
}

// clientKey names a client for its turns: its address without the port,
// written as Server.httpClientKey writes it (an IPv4 address mapped into
// IPv6 as IPv4).
func clientKey(addr string) string {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return ap.Addr().Unmap().WithZone("").String()
	}
	return addr
}

// ---------------------------------------------------------------------------
// A connection's share

// errNotReading refuses an answer to a connection that is being closed
// because it does not read its answers.
func (a *answerBudget) errNotReading() error {
	return fmt.Errorf("Connection closed: answers not read by this client passed %s (--max-write-queue-bytes)", sizeText(a.share))
}

// overShare says whether n more bytes for c pass its share. Nothing held
// yet: any one answer goes.
func (c *conn) overShare(n int64) bool {
	share := c.srv.answers.share
	if c.backlog != nil {
		return c.backlog(n)
	}
	held := c.pending.Load()
	return share > 0 && held > 0 && held+n > share
}

// holdOut counts n bytes of answers built for c and not yet written.
func (c *conn) holdOut(n int64) {
	c.pending.Add(n)
	c.srv.answers.hold(n)
}

// freeOut gives back what holdOut counted, once written (or dropped).
func (c *conn) freeOut(n int64) {
	c.pending.Add(-n)
	c.srv.answers.free(n)
}

// notReading closes a connection whose unread answers passed its share:
// a client that does not read must not make the server hold its answers.
func (c *conn) notReading(held int64) {
	if c.dropped.Swap(true) {
		return
	}
	a := c.srv.answers
	a.slow.Add(1)
	if n := a.slowLog.hit(); n > 0 {
		transport := "tcp"
		if c.nc == nil {
			transport = "websocket"
		}
		c.srv.log.Warn("closing connections that do not read their answers", "transport", transport,
			"unread_bytes", held, "max_write_queue_bytes", a.share, "closed", n)
	}
	switch {
	case c.onSlow != nil:
		c.onSlow()
	case c.nc != nil:
		c.nc.Close()
	}
	// An HTTP request's connection has no socket of its own: the refusal
	// is its answer.
}

// room reserves n bytes for the answer r is about to build, when it is
// more than a small answer: from the connection's share (a connection past
// it is closed) and from the server's budget (waiting for room, refused
// when none comes). The reservation lasts until the answer is written
// (conn.run's caller gives it back), and the answer's buffer is grown once
// to take it.
func (r *Req) room(n int64) error { return r.roomGrow(n, n) }

// roomGrow is room for n bytes, of which the answer's buffer is grown to
// take grow (a read holds more than its answer while it lasts).
func (r *Req) roomGrow(n, grow int64) error {
	if n <= smallAnswer {
		return nil
	}
	c := r.c
	if c.overShare(n) {
		c.notReading(c.pending.Load() + n)
		return c.srv.answers.errNotReading()
	}
	if err := c.srv.answers.reserveFor(r.ctx(), n, c.client); err != nil {
		return err
	}
	c.pending.Add(n)
	r.reserved += n
	r.grow(grow)
	return nil
}

// unreserve gives back a reservation of c's, once its answer is written or
// counted by the transport that holds it.
func (c *conn) unreserve(n int64) {
	if n > 0 {
		c.freeOut(n)
	}
}

// pullRoom waits, before a pull claims anything, until the budget has
// room: a pull's answer is built where its jobs are claimed (under the
// shard's lock in memory mode, where nothing may wait), and jobs claimed
// for an answer that cannot be sent would sit active for nothing.
func (r *Req) pullRoom() error {
	a := r.c.srv.answers
	if !a.pressed() {
		return nil
	}
	if err := a.reserveFor(r.ctx(), 1, r.c.client); err != nil {
		return err
	}
	a.free(1)
	return nil
}

// ---------------------------------------------------------------------------
// Jobs in answers

// jobWireBound is at least the bytes encodeJob writes for j with the
// result rv: its strings and data (j.size), the queue name, the result,
// a header for each string of its lists and each timeline entry, and the
// fixed keys. TestJobWireBound holds it to the encoder.
func jobWireBound(j *Job, rv Raw) int64 {
	c := j.cold()
	strs := len(c.Tags) + len(c.DependsOn) + len(c.Children) + len(c.Stack)
	return j.size() + int64(len(j.Queue)+len(rv)) + 5*int64(strs) + 64*int64(j.timelineLen()) + 2048
}

// maxJobWire is the most jobWireBound can be for a job without a result:
// what is left of answerCap when a pull decides whether one more job fits.
const maxJobWire = maxJobBytes + 5*(maxTags+2*maxDeps+maxStackLines) + 64*maxTimelineEntries + 2048 + maxKeyBytes

// maxStackLines is the most lines a job's stack trace keeps (its
// stackTraceLimit is at most that).
const maxStackLines = 1000

// answerBytes tells how many of a list of jobs fit in one answer.
type answerBytes struct {
	used int64
	max  int64
}

// fits adds a job's bound when it fits; the first job always does (a
// single job fits in any frame).
func (a *answerBytes) fits(n int64) bool {
	if a.used > 0 && a.used+n > a.max {
		return false
	}
	a.used += n
	return true
}

// pullFits says whether a pull that has taken jobs of sofar bytes may
// take one more, whatever its size: one more job of any size still fits
// in an answer carrying at most limit bytes of jobs (answerLimit). Both
// engines stop their claims on it, so that a pull is never cut after its
// jobs were claimed. The first job always goes; limit 0 is answerCap.
func pullFits(sofar, limit int64) bool {
	if limit == 0 {
		limit = answerCap
	}
	return sofar == 0 || sofar <= limit-maxJobWire
}

// jsonAnswerCap bounds the MessagePack of the jobs one JSON answer (HTTP,
// WebSocket) carries: a quarter of answerCap, since binary data, the
// commonest big data, is four times as long in JSON ("255,"). It cannot
// be less: pullFits lets a pull take one more job while what it took
// leaves room for the largest job, and a sixth of answerCap (for strings
// of control characters, six times as long as "\u0001") is less than
// that, so every pull over JSON took one job. Data whose JSON grows more
// is measured before its answer is sent, and an answer whose JSON would
// pass the frame limit is refused, naming it (writeJSONWith,
// wsWriter.writeFrame).
const jsonAnswerCap = answerCap / 4

// answerLimit is the bytes of jobs one of c's answers carries at most:
// answerCap, jsonAnswerCap for a transport that answers in JSON.
func (c *conn) answerLimit() int64 {
	if c.json {
		return jsonAnswerCap
	}
	return answerCap
}

// errAnswerTooBig refuses an answer that cannot be cut to the frame limit.
func errAnswerTooBig(what string) error {
	return fmt.Errorf("%s would be over the protocol's frame limit of %s", what, sizeText(MaxFrame))
}

// fitViews keeps the first jobs of a list that fit in limit bytes (the
// first always does), and says how many bytes they may take.
func fitViews(list []JobView, limit int64) ([]JobView, int64) {
	fit := answerBytes{max: limit}
	for i, v := range list {
		if !fit.fits(jobWireBound(v.Job, v.Result)) {
			return list[:i], fit.used
		}
	}
	return list, fit.used
}

// tryRoom reserves n bytes for r's answer if the budget has room now; ok
// false (and no error) when it has not.
func (r *Req) tryRoom(n int64) (ok bool, err error) {
	c := r.c
	if c.overShare(n) {
		c.notReading(c.pending.Load() + n)
		return false, c.srv.answers.errNotReading()
	}
	// Not ahead of reservations waiting their turn.
	if a := c.srv.answers; a.waiting.Load() > 0 || !a.take(n) {
		return false, nil
	}
	c.pending.Add(n)
	r.reserved += n
	r.grow(n)
	return true, nil
}

// grow makes room for n more bytes in the answer's buffer at once, rather
// than by doubling as the answer is written.
func (r *Req) grow(n int64) {
	r.e.B = growBig(r.e.B, int(n)+1024)
}

// fetch reads what an answer carries, then reserves the room the answer
// needs (size). read runs under a context that lets an engine which
// copies what it reads (PostgreSQL) reserve the room before it brings a
// big job into memory (reserveRead); what it reserved counts. When the
// budget has no room at once, what was read is let go while the
// reservation waits, and read again once it has room: a request waiting
// for room holds nothing.
func fetch[T any](r *Req, read func(ctx context.Context) (T, error), size func(T) int64) (T, error) {
	var zero T
	before := r.reserved
	room := &readRoom{}
	room.r.Store(r)
	v, err := read(context.WithValue(r.ctx(), readRoomKey{}, room))
	// A context may outlive the read (the database driver's pool keeps the
	// one a connection was made for): it keeps nothing of the request, its
	// answer's buffer above all.
	room.r.Store(nil)
	if err != nil {
		return v, err
	}
	need := size(v)
	if need > MaxFrame {
		return zero, errAnswerTooBig("the answer")
	}
	n := need - (r.reserved - before) // not yet reserved
	if n < 0 {
		// The read reserved more than its answer takes (the driver's
		// buffer for the rows it read, let go; the jobs decoded, which
		// are let go once the answer is encoded): the rest goes back.
		r.c.unreserve(-n)
		r.reserved += n
	}
	if n <= smallAnswer {
		return v, nil
	}
	if ok, err := r.tryRoom(n); ok || err != nil {
		return v, err
	}
	v = zero
	if err := r.room(n); err != nil {
		return zero, err
	}
	// Read again, the room held (the engine reserves nothing more).
	if v, err = read(r.ctx()); err != nil {
		return v, err
	}
	if extra := size(v) - (r.reserved - before); extra > 0 {
		// It grew meanwhile: the rest is counted without waiting.
		r.c.pending.Add(extra)
		r.c.srv.answers.hold(extra)
		r.reserved += extra
	}
	return v, nil
}

// readRoomKey carries, in the context fetch reads under, the request the
// read is for.
type readRoomKey struct{}

// readRoom is the request a read reserves room for, while it reads.
type readRoom struct{ r atomic.Pointer[Req] }

// reserveRead reserves room for n bytes a read is about to bring into
// memory, of which answer will be its answer's, for the request ctx is
// fetch's for; nothing otherwise.
func reserveRead(ctx context.Context, n, answer int64) error {
	room, _ := ctx.Value(readRoomKey{}).(*readRoom)
	if room == nil || n <= smallAnswer {
		return nil
	}
	r := room.r.Load()
	if r == nil {
		return nil
	}
	// What a read holds besides its answer is brief: it is not allowed to
	// ask for more than half the budget, or it would wait for the budget
	// to be all but empty, which it rarely is on a busy server.
	n = max(answer, min(n, r.c.srv.answers.limit/2))
	return r.roomGrow(n, answer)
}

// wantsReadRoom says whether ctx is fetch's: a read that can tell the
// size of what it would bring reserves it first.
func wantsReadRoom(ctx context.Context) bool { return ctx.Value(readRoomKey{}) != nil }

// viewBytes bounds the answer of a job read (nothing when there is none).
func viewBytes(v JobView) int64 {
	if v.Job == nil {
		return 0
	}
	return jobWireBound(v.Job, v.Result)
}

func viewsBytes(list []JobView) int64 {
	var n int64
	for _, v := range list {
		n += jobWireBound(v.Job, v.Result)
	}
	return n
}

// dlqWireBound bounds a DLQ entry as Dlq answers it: the job twice (in
// jobs and in its entry) and the entry's attempts.
func dlqWireBound(j *Job) int64 {
	n := 2*jobWireBound(j, nil) + 256
	if d := j.dlq; d != nil {
		n += int64(len(d.Reason) + len(d.Error))
	}
	return n + 128*int64(len(j.cold().history))
}

func dlqBytes(jobs []*Job) int64 {
	var n int64
	for _, j := range jobs {
		n += dlqWireBound(j)
	}
	return n
}

// fitDLQ keeps the first DLQ entries that fit in limit bytes.
func fitDLQ(jobs []*Job, limit int64) []*Job {
	fit := answerBytes{max: limit}
	for i, j := range jobs {
		if !fit.fits(dlqWireBound(j)) {
			return jobs[:i]
		}
	}
	return jobs
}

// logAnswerBytes bounds GetLogs' answer.
func logAnswerBytes(logs []LogEntry) int64 {
	var n int64
	for _, l := range logs {
		n += int64(len(l.Level)+len(l.Message)) + 48
	}
	return n
}

// kvsBytes bounds the answer of a parent's children's values. They are
// not cut (a client would take a part for the whole); kvsBytes is then
// over any budget, and the answer is refused for it.
func kvsBytes(vals []childKV) int64 {
	var n int64
	for _, kv := range vals {
		n += int64(len(kv.key)+len(kv.val)) + 10
	}
	return n
}

// dashQueueBytes bounds DashboardQueue's answer: the DLQ preview's data
// and the job lists' progress, with their keys.
func dashQueueBytes(d dashQueue) int64 {
	n := int64(4096)
	for _, j := range d.dlq {
		n += int64(j.idLen()+len(j.Data)) + 64
	}
	for _, l := range [][]*Job{d.ready, d.active, d.delayed} {
		for _, j := range l {
			n += int64(j.idLen()+len(j.cold().Progress)) + 96
		}
	}
	return n
}

// fitPreview keeps the DLQ preview's first jobs that fit beside the job
// lists in limit bytes.
func fitPreview(d dashQueue, limit int64) []*Job {
	rest := d
	rest.dlq = nil
	fit := answerBytes{max: limit - dashQueueBytes(rest)}
	for i, j := range d.dlq {
		if !fit.fits(int64(j.idLen()+len(j.Data)) + 64) {
			return d.dlq[:i]
		}
	}
	return d.dlq
}

// pullKeeps is how many of the jobs a pull claimed its answer carries, by
// pullFits: those the memory engine would have stopped its claim before
// go back (PostgreSQL claims its rows before it knows their size).
func pullKeeps(jobs []*Job, limit int64) int {
	var bytes int64
	for i, j := range jobs {
		if !pullFits(bytes, limit) {
			return i
		}
		bytes += jobWireBound(j, nil)
	}
	return len(jobs)
}
