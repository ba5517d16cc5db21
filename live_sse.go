package main

// Server-Sent Events: a response that stays open and carries events as
// they happen (the WHATWG HTML "server-sent events" format).
//
// Events are formatted by whoever sends them and queued, boundedly, for
// the handler's goroutine, which is the only one that writes the response
// (a ResponseWriter is not safe for concurrent use). Send never blocks, so
// a client that does not read costs its events, or its stream, never the
// sender's time.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// sseOptions tune a stream; zero fields take the defaults below.
type sseOptions struct {
	// Heartbeat is how often a comment line goes out (default 30s, the
	// reference's interval), so that proxies keep an idle stream open and
	// a client that is gone is noticed by the failed write.
	Heartbeat time.Duration
	// Retry is the reconnection delay suggested to the client (default 3s,
	// as the reference; negative: none).
	Retry time.Duration
	// SendQueue and SendQueueBytes bound what waits to be written, besides
	// the batch being written: default 1024 events and 4 MiB.
	SendQueue      int
	SendQueueBytes int
	Slow           slowPolicy
	// WriteTimeout bounds one write (default 10s); CloseTimeout bounds the
	// end of the stream, queued events included (default 3s).
	WriteTimeout time.Duration
	CloseTimeout time.Duration
	Log          *slog.Logger
}

func (o sseOptions) withDefaults() sseOptions {
	if o.Heartbeat <= 0 {
		o.Heartbeat = 30 * time.Second
	}
	if o.Retry == 0 {
		o.Retry = 3 * time.Second
	}
	if o.SendQueue <= 0 {
		o.SendQueue = 1024
	}
	if o.SendQueueBytes <= 0 {
		o.SendQueueBytes = 4 << 20
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

// sseEvent is one event. Empty ID and Event are left out; the client then
// keeps its last id and dispatches the event as "message".
type sseEvent struct {
	ID    string
	Event string
	Data  []byte
}

// sseFieldValue drops what would end a field early: a line break would
// start a new field (and let a value inject one), and the client ignores
// an id that contains NUL.
func sseFieldValue(v string) string {
	if !strings.ContainsAny(v, "\r\n\x00") {
		return v
	}
	return strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' || r == 0 {
			return -1
		}
		return r
	}, v)
}

// appendSSE formats one event. Data goes out as one data: line per line
// (CRLF, LF and CR all end a line for the client), which the client joins
// back with LF; a blank line ends the event.
func appendSSE(dst []byte, ev sseEvent) []byte {
	if ev.ID != "" {
		dst = append(dst, "id: "...)
		dst = append(dst, sseFieldValue(ev.ID)...)
		dst = append(dst, '\n')
	}
	if ev.Event != "" {
		dst = append(dst, "event: "...)
		dst = append(dst, sseFieldValue(ev.Event)...)
		dst = append(dst, '\n')
	}
	data := ev.Data
	for {
		i := bytes.IndexAny(data, "\r\n")
		line := data
		if i >= 0 {
			line = data[:i]
		}
		dst = append(dst, "data: "...)
		dst = append(dst, line...)
		dst = append(dst, '\n')
		if i < 0 {
			break
		}
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	return append(dst, '\n')
}

var sseHeartbeat = []byte(":heartbeat\n\n")

// sseStream is one client's event stream. Run belongs to the handler's
// goroutine; Send and Close may be called from any.
type sseStream struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	ctx    context.Context
	opts   sseOptions
	lastID string
	remote string

	mu      sync.Mutex
	out     outQueue
	closing bool
	closeBy time.Time
	running bool // Run is writing: rc may be used

	kick     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
}

// startSSE sends the stream's headers (and the retry delay) and returns
// the stream, for Run to carry. When it fails, an error status has been
// answered, or the client is gone.
func startSSE(w http.ResponseWriter, r *http.Request, opts sseOptions) (*sseStream, error) {
	return startSSEThen(w, r, opts, nil)
}

// startSSEThen is startSSE calling ready with the stream before its
// headers go out: what ready registers the stream for (the hub's events)
// it gets from the moment the client knows the stream is open. What is
// sent meanwhile waits for Run.
func startSSEThen(w http.ResponseWriter, r *http.Request, opts sseOptions, ready func(s *sseStream)) (*sseStream, error) {
	opts = opts.withDefaults()
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	if r.ProtoMajor == 1 {
		// HTTP/2 forbids connection-specific headers.
		h.Set("Connection", "keep-alive")
	}
	// nginx buffers proxied responses unless told not to.
	h.Set("X-Accel-Buffering", "no")
	s := &sseStream{w: w, rc: rc, ctx: r.Context(), opts: opts, remote: r.RemoteAddr,
		lastID: r.Header.Get("Last-Event-ID"), out: outQueue{maxN: opts.SendQueue, maxB: opts.SendQueueBytes},
		kick: make(chan struct{}, 1), stop: make(chan struct{})}
	if opts.Retry > 0 {
		s.sendRaw(fmt.Appendf(nil, "retry: %d\n\n", opts.Retry.Milliseconds()))
	}
	if ready != nil {
		ready(s)
	}
	// Flushing first sends the headers now, so the client knows the stream
	// is open, and finds out whether this writer can stream at all while
	// an error status can still be answered.
	if err := rc.Flush(); err != nil {
		if errors.Is(err, http.ErrNotSupported) {
			for _, k := range []string{"Content-Type", "Cache-Control", "Connection", "X-Accel-Buffering"} {
				h.Del(k)
			}
			http.Error(w, "event streams are not supported here", http.StatusInternalServerError)
		}
		// What ready queued (a replay of events, each counted in the
		// answer budget) is let go: Run will not.
		s.end(true)
		return s, fmt.Errorf("sse: start: %w", err)
	}
	return s, nil
}

// LastEventID is the id the client last saw, from a reconnecting
// EventSource's Last-Event-ID header ("" for a first connection).
func (s *sseStream) LastEventID() string { return s.lastID }

// Send queues an event without ever blocking; see sendRaw.
func (s *sseStream) Send(ev sseEvent) bool { return s.sendRaw(appendSSE(nil, ev)) }

// sendEvent queues a hub event's SSE form, counted with ref (liveRef),
// without ever blocking, as sendRaw does; while the answer budget is
// spent, a stream with events waiting gets no more.
func (s *sseStream) sendEvent(b []byte, ref *liveRef) bool {
	return s.send(outMsg{b: b, ref: ref}, ref != nil && ref.budget.pressed())
}

// sendRaw queues formatted bytes without ever blocking. It reports false
// when they are not sent: the stream is ending, or its queue is full (then,
// by the slow policy, they are skipped or the stream ends). b is not
// copied, so it must not change afterwards.
func (s *sseStream) sendRaw(b []byte) bool { return s.send(outMsg{b: b}, false) }

func (s *sseStream) send(m outMsg, pressed bool) bool {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return false
	}
	ok, first, n, size := s.out.offer(m, pressed)
	s.mu.Unlock()
	if !ok {
		if refused(s.opts.Log, s.opts.Slow, "event stream client", s.remote, first, n, size) {
			s.end(true)
		}
		return false
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return true
}

// Close ends the stream once what is queued is written, within
// CloseTimeout.
func (s *sseStream) Close() { s.end(false) }

func (s *sseStream) end(discard bool) {
	s.mu.Lock()
	if !s.closing {
		s.closing = true
		s.closeBy = time.Now().Add(s.opts.CloseTimeout)
		if s.running {
			// Cuts short a write stuck on a client that does not read. The
			// deadline lives on the connection, which allows setting it
			// while another goroutine writes; running guarantees the
			// handler has not returned.
			s.rc.SetWriteDeadline(s.closeBy)
		}
	}
	if discard {
		s.out.discard()
	}
	s.mu.Unlock()
	s.stopOnce.Do(func() { close(s.stop) })
}

// Run writes the stream until the client goes away, a write fails, or
// Close (or the slow policy) ends it. It must run on the handler's
// goroutine, and the handler returns after it. A client going away or a
// Close is a normal end (nil).
func (s *sseStream) Run() error {
	s.mu.Lock()
	s.running = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running, s.closing = false, true
		// What the stream still held is let go (and its events'
		// counts with it).
		s.out.discard()
		s.mu.Unlock()
		s.stopOnce.Do(func() { close(s.stop) })
	}()
	heartbeat := time.NewTicker(s.opts.Heartbeat)
	defer heartbeat.Stop()
	var batch []outMsg
	for {
		beat, stopping := false, false
		select {
		case <-s.kick:
		case <-heartbeat.C:
			beat = true
		case <-s.stop:
			stopping = true
		case <-s.ctx.Done():
			return nil
		}
		s.mu.Lock()
		batch = s.out.take(batch)
		s.mu.Unlock()
		var err error
		if beat {
			err = s.write(sseHeartbeat)
		}
		for i, m := range batch {
			if err == nil {
				err = s.write(m.b)
			}
			m.done()
			batch[i] = outMsg{}
		}
		if err == nil && (beat || len(batch) > 0) {
			err = s.rc.Flush()
		}
		if err != nil {
			if s.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("sse: write to %s: %w", s.remote, err)
		}
		if stopping {
			s.hangUp()
			return nil
		}
	}
}

// hangUp closes the connection under a stream that Close or the slow
// policy ended. Letting net/http finish the response instead would leave
// the close's write deadline on a connection it may reuse for the next
// request; and a client that was dropped for not reading must not hold
// the handler's goroutine. EventSource reconnects either way. HTTP/2
// streams cannot be hijacked, and need not be: their deadlines are their
// own.
func (s *sseStream) hangUp() {
	if nc, _, err := s.rc.Hijack(); err == nil {
		nc.Close()
	}
}

func (s *sseStream) write(b []byte) error {
	s.mu.Lock()
	if s.closing {
		s.rc.SetWriteDeadline(s.closeBy)
	} else {
		s.rc.SetWriteDeadline(time.Now().Add(s.opts.WriteTimeout))
	}
	s.mu.Unlock()
	_, err := s.w.Write(b)
	return err
}
