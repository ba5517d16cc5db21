package main

// The bounded send queue of one live subscriber, an SSE stream or a
// WebSocket: messages wait in it for the connection's writer, and what
// happens when a client stops reading is decided here, the same for both.

import "log/slog"

// outQueue holds messages for one connection's writer. It has no lock of
// its own: its connection holds the connection's lock around every call.
type outQueue struct {
	msgs    [][]byte
	bytes   int
	maxN    int
	maxB    int
	dropped bool // a refusal has been logged
}

// offer queues b, or refuses it when the queue is full by count or bytes.
// An empty queue takes any one message, so a message larger than maxB
// still goes when nothing else waits. On refusal, first says whether it is
// the first (to log once), and n and size what is waiting.
func (q *outQueue) offer(b []byte) (ok, first bool, n, size int) {
	if len(q.msgs) > 0 && (len(q.msgs) >= q.maxN || q.bytes+len(b) > q.maxB) {
		first = !q.dropped
		q.dropped = true
		return false, first, len(q.msgs), q.bytes
	}
	q.msgs = append(q.msgs, b)
	q.bytes += len(b)
	return true, false, 0, 0
}

// take hands what waits to the writer, swapping in batch (emptied) for
// reuse.
func (q *outQueue) take(batch [][]byte) [][]byte {
	out := q.msgs
	q.msgs, q.bytes = batch[:0], 0
	return out
}

// discard forgets what waits.
func (q *outQueue) discard() {
	clear(q.msgs)
	q.msgs, q.bytes = q.msgs[:0], 0
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
