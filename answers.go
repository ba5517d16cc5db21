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

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	// queue holds the reservations waiting for room, first come first
	// served: bytes freed are granted to its head only, so that a free
	// wakes only those it makes room for (waking every waiter at each
	// free put hundreds of goroutines ahead of every other client's
	// answer: Pings took over a second).
	queue []*answerWaiter

	refused atomic.Int64 // answers refused for want of room
	slow    atomic.Int64 // connections closed for not reading their answers
	peak    atomic.Int64 // the most bytes held at once
	slowLog rateLog      // one line for many closes in a flood
}

func newAnswerBudget(limit, share int64) *answerBudget {
	return &answerBudget{limit: limit, share: share, wait: answerWait, slowLog: rateLog{every: 10 * time.Second}}
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

// free gives n bytes back and wakes the reservations waiting for room.
func (a *answerBudget) free(n int64) {
	if n == 0 {
		return
	}
	a.used.Add(-n)
	if a.waiting.Load() > 0 {
		a.grant()
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

// grant gives room to the waiting reservations it now fits, in order.
func (a *answerBudget) grant() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(a.queue) > 0 {
		w := a.queue[0]
		if !a.take(w.n) {
			return
		}
		w.granted = true
		close(w.ready)
		a.queue[0] = nil
		a.queue = a.queue[1:]
		a.waiting.Add(-1)
	}
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
// waiting up to a.wait for room. An answer larger than the whole budget
// gets it when nothing else is held.
func (a *answerBudget) reserve(ctx context.Context, n int64) error {
	if a.waiting.Load() == 0 && a.take(n) {
		return nil
	}
	a.mu.Lock()
	if len(a.queue) == 0 && a.take(n) {
		a.mu.Unlock()
		return nil
	}
	w := &answerWaiter{n: n, ready: make(chan struct{})}
	a.queue = append(a.queue, w)
	a.waiting.Add(1)
	a.mu.Unlock()
	timer := time.NewTimer(a.wait)
	defer timer.Stop()
	var err error
	select {
	case <-w.ready:
		return nil
	case <-timer.C:
		err = a.errBusy()
	case <-ctx.Done():
		err = errors.New("Connection closing")
	}
	a.mu.Lock()
	if w.granted {
		// Granted as the wait ended: the room is taken, so it is used.
		a.mu.Unlock()
		return nil
	}
	for i, q := range a.queue {
		if q == w {
			a.queue = append(a.queue[:i], a.queue[i+1:]...)
			a.waiting.Add(-1)
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
func (r *Req) room(n int64) error {
	if n <= smallAnswer {
		return nil
	}
	c := r.c
	if c.overShare(n) {
		c.notReading(c.pending.Load() + n)
		return c.srv.answers.errNotReading()
	}
	if err := c.srv.answers.reserve(r.ctx(), n); err != nil {
		return err
	}
	c.pending.Add(n)
	r.reserved += n
	r.grow(n)
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
	if err := a.reserve(r.ctx(), 1); err != nil {
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
// in the answer. Both engines stop their claims on it, so that a pull is
// never cut after its jobs were claimed.
func pullFits(sofar int64) bool { return sofar <= answerCap-maxJobWire }

// errAnswerTooBig refuses an answer that cannot be cut to the frame limit.
func errAnswerTooBig(what string) error {
	return fmt.Errorf("%s would be over the protocol's frame limit of %s", what, sizeText(MaxFrame))
}

// fitViews keeps the first jobs of a list that fit in one answer (the
// first always does), and says how many bytes they may take.
func fitViews(list []JobView) ([]JobView, int64) {
	fit := answerBytes{max: answerCap}
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
	v, err := read(context.WithValue(r.ctx(), readRoomKey{}, r))
	if err != nil {
		return v, err
	}
	need := size(v)
	if need > MaxFrame {
		return zero, errAnswerTooBig("the answer")
	}
	n := need - (r.reserved - before) // not yet reserved
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

// reserveRead reserves room for n bytes a read is about to bring into
// memory, for the request ctx is fetch's for; nothing otherwise.
func reserveRead(ctx context.Context, n int64) error {
	r, _ := ctx.Value(readRoomKey{}).(*Req)
	if r == nil || n <= smallAnswer {
		return nil
	}
	return r.room(n)
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

// fitDLQ keeps the first DLQ entries that fit in one answer.
func fitDLQ(jobs []*Job) []*Job {
	fit := answerBytes{max: answerCap}
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
// lists in one answer.
func fitPreview(d dashQueue) []*Job {
	rest := d
	rest.dlq = nil
	fit := answerBytes{max: answerCap - dashQueueBytes(rest)}
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
func pullKeeps(jobs []*Job) int {
	var bytes int64
	for i, j := range jobs {
		if !pullFits(bytes) {
			return i
		}
		bytes += jobWireBound(j, nil)
	}
	return len(jobs)
}
