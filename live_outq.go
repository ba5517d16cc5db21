package main

// The bounded send queue of one live subscriber, an SSE stream or a
// WebSocket: messages wait in it for the connection's writer, and what
// happens when a client stops reading is decided here, the same for both.

import (
	"log/slog"
	"sync/atomic"
)

// outQueue holds messages for one connection's writer. It has no lock of
// its own: its connection holds the connection's lock around every call.
type outQueue struct {
	msgs    []outMsg
	bytes   int
	maxN    int
	maxB    int
	dropped bool // a refusal has been logged
}

// outMsg is one message waiting: text to send as it is or, for a
// WebSocket's big answers (frame), an answer frame the writer renders as
// JSON while it writes it, so that the JSON (four times the bytes of
// binary data) is never held whole.
type outMsg struct {
	b     []byte
	frame bool
	// ref, for an event, counts it among the subscribers holding it; it
	// is released once the message is written or dropped.
	ref *liveRef
}

// offer queues m, or refuses it when the queue is full by count or bytes,
// or, when pressed (the answer budget is spent) and m is an event no
// other subscriber holds yet (it would add bytes), holds anything at all.
// An empty queue takes any one message, so a message larger than maxB
// still goes when nothing else waits. On refusal, first says whether it is
// the first (to log once), and n and size what is waiting.
func (q *outQueue) offer(m outMsg, pressed bool) (ok, first bool, n, size int) {
	adds := m.ref == nil || m.ref.n.Load() == 0
	if len(q.msgs) > 0 && (pressed && adds || len(q.msgs) >= q.maxN || q.bytes+len(m.b) > q.maxB) {
		first = !q.dropped
		q.dropped = true
		return false, first, len(q.msgs), q.bytes
	}
	q.msgs = append(q.msgs, m)
	q.bytes += len(m.b)
	m.ref.acquire()
	return true, false, 0, 0
}

// take hands what waits to the writer, swapping in batch (emptied) for
// reuse. The writer releases each message once written (outMsg.done).
func (q *outQueue) take(batch []outMsg) []outMsg {
	out := q.msgs
	q.msgs, q.bytes = batch[:0], 0
	return out
}

// discard forgets what waits.
func (q *outQueue) discard() {
	for _, m := range q.msgs {
		m.ref.release()
	}
	clear(q.msgs)
	q.msgs, q.bytes = q.msgs[:0], 0
}

// done releases a message the writer has written or dropped.
func (m outMsg) done() { m.ref.release() }

// liveRef counts the subscriber queues holding one event, so that its
// bytes count once in the answer budget while any of them holds it: an
// event is one copy in memory, however many subscribers it goes to, and
// every copy held for a subscriber that does not read is counted, whatever
// its size (a thousand subscribers stalled one after the other, each on
// its own few megabytes of events, would hold gigabytes uncounted).
type liveRef struct {
	n      atomic.Int32
	size   int64
	budget *answerBudget
}

func (r *liveRef) acquire() {
	if r != nil && r.n.Add(1) == 1 {
		r.budget.hold(r.size)
	}
}

func (r *liveRef) release() {
	if r != nil && r.n.Add(-1) == 0 {
		r.budget.free(r.size)
	}
}

// refused logs a refused message by the slow policy and says whether the
// connection must be ended (slowClose) rather than the message skipped.
// what names the transport in the log ("websocket client", "event stream
// client"). Called without the connection's lock.
func refused(log *slog.Logger, policy slowPolicy, what, remote string, first bool, n, size int) (end bool) {
	switch policy {
	case slowSkip:
		if first {
			log.Warn(what+" is not keeping up; skipping messages", "remote", remote, "queued", n, "queuedBytes", size)
		}
		return false
	case slowClose:
	}
	log.Warn(what+" is not keeping up; ending its connection", "remote", remote, "queued", n, "queuedBytes", size)
	return true
}
