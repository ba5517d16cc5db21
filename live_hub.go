package main

// The fan-out hub for live events: WebSocket and SSE subscribers register
// with a filter (every queue, or one), and Publish hands each event to the
// ones that match. Publish never waits on a subscriber: each has its own
// bounded queue and writer, and an event that does not fit is dropped (and
// counted) under the subscriber's slow policy.
//
// Every event gets an id, in publishing order, which SSE sends as its id:
// field; the last ones are kept so that a reconnecting EventSource, which
// sends the last id it saw, gets what it missed. As in the reference, ids
// start again at 1 with the process, and nothing is kept while nobody
// listens.

import (
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// hubOptions tune a hub; zero fields take the defaults.
type hubOptions struct {
	WS  wsOptions
	SSE sseOptions
	// Replay is how many recent events are kept for Last-Event-ID
	// (default 1000, as the reference; negative: none).
	Replay int
	// ReplayBytes bounds what the kept events weigh together (default
	// defaultReplayBytes): the oldest go first, whatever their count.
	ReplayBytes int64
	Log         *slog.Logger
}

var errHubClosed = errors.New("live events: the server is shutting down")

// defaultReplayBytes bounds the replay ring: 1,000 events of a few KB each
// fit, 1,000 events carrying 10 MB of job data each do not.
const defaultReplayBytes = 32 << 20

// weight is what an event kept for replay costs, counting its SSE form
// even before it is made (a replay makes it in place).
func (ev *hubEvent) weight() int64 {
	sse := len(ev.sse)
	if sse == 0 {
		sse = len(ev.data) + len(ev.event) + 64
	}
	return int64(len(ev.data)+len(ev.legacy)+len(ev.tagged)+sse) + 64
}

// hubEvent is one published event. sse is its SSE form, made once for
// every stream that gets it.
type hubEvent struct {
	id    uint64
	queue string
	event string
	data  []byte
	sse   []byte
	// legacy and tagged are the forms a WebSocket with a selection gets
	// (see wsSelection); nil leaves those subscribers out.
	legacy, tagged []byte
	// system events (figures, not jobs) reach every subscriber whatever
	// its queue, and are not kept for replay, as in the reference.
	system bool
	w      int64 // weight when kept for replay
	// ref counts the subscribers holding the event, for the answer
	// budget (nil without one).
	ref *liveRef
}

func (ev *hubEvent) sseBytes() []byte {
	if ev.sse == nil {
		ev.sse = appendSSE(nil, sseEvent{ID: strconv.FormatUint(ev.id, 10), Event: ev.event, Data: ev.data})
	}
	return ev.sse
}

// hubSub is one subscriber: a WebSocket or an SSE stream.
type hubSub struct {
	queue string // "" for every queue
	ws    *wsConn
	sel   *wsSelection // nil: the WebSocket gets every event's data
	sse   *sseStream
}

func (s *hubSub) wants(ev *hubEvent) bool {
	return ev.system || s.queue == "" || s.queue == ev.queue
}

// send hands ev over, reporting false when it was dropped. An event the
// subscriber did not select is not a drop.
func (s *hubSub) send(ev *hubEvent) bool {
	if s.ws != nil {
		p := ev.data
		if s.sel != nil {
			if p = s.sel.pick(ev); p == nil {
				return true
			}
		}
		return s.ws.sendEvent(p, ev.ref)
	}
	return s.sse.sendEvent(ev.sseBytes(), ev.ref)
}

// wsSelection is what one WebSocket asked for, as the reference's ws
// handler keeps it: until the client sends Subscribe, job events in their
// legacy form (the raw event object); after it, the {event, ts, data} form
// of the events that match its patterns, system events included.
type wsSelection struct {
	mu       sync.Mutex
	patterns []string // in the order subscribed; nil until Subscribe
}

func (w *wsSelection) pick(ev *hubEvent) []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.patterns == nil {
		if ev.system {
			return nil
		}
		return ev.legacy
	}
	if ev.tagged != nil && matchesWSPattern(ev.event, w.patterns) {
		return ev.tagged
	}
	return nil
}

// subscribe adds patterns and returns the whole list.
func (w *wsSelection) subscribe(patterns []string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.patterns == nil {
		w.patterns = []string{}
	}
	for _, p := range patterns {
		if !slices.Contains(w.patterns, p) {
			w.patterns = append(w.patterns, p)
		}
	}
	return slices.Clone(w.patterns)
}

// unsubscribe removes patterns (all of them when none are named) and
// returns what is left. A client that never subscribed stays legacy.
func (w *wsSelection) unsubscribe(patterns []string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.patterns == nil {
		return []string{}
	}
	if len(patterns) == 0 {
		w.patterns = w.patterns[:0]
	} else {
		w.patterns = slices.DeleteFunc(w.patterns, func(p string) bool { return slices.Contains(patterns, p) })
	}
	return slices.Clone(w.patterns)
}

// matchesWSPattern: "*" is everything, "job:*" every event named job:...,
// anything else the one event.
func matchesWSPattern(event string, patterns []string) bool {
	prefix, _, _ := strings.Cut(event, ":")
	for _, p := range patterns {
		if p == "*" || p == event || (strings.HasSuffix(p, ":*") && p[:len(p)-2] == prefix) {
			return true
		}
	}
	return false
}

type hub struct {
	opts hubOptions
	log  *slog.Logger

	mu     sync.Mutex
	subs   map[*hubSub]struct{}
	closed bool
	lastID uint64
	ring   []hubEvent // the last events, oldest first
	ringB  int64      // their weight

	nWS   atomic.Int64
	nSSE  atomic.Int64
	drops atomic.Uint64
	wg    sync.WaitGroup // one per registered subscriber
}

func newHub(opts hubOptions) *hub {
	if opts.Replay == 0 {
		opts.Replay = 1000
	}
	if opts.ReplayBytes == 0 {
		opts.ReplayBytes = defaultReplayBytes
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.WS.Log == nil {
		opts.WS.Log = opts.Log
	}
	if opts.SSE.Log == nil {
		opts.SSE.Log = opts.Log
	}
	return &hub{opts: opts, log: opts.Log, subs: make(map[*hubSub]struct{})}
}

// Subscribers is how many subscribers are connected: with none, the
// caller can skip encoding events at all.
func (h *hub) Subscribers() int { return int(h.nWS.Load() + h.nSSE.Load()) }

// Counts splits Subscribers by transport, as /health reports them.
func (h *hub) Counts() (ws, sse int) { return int(h.nWS.Load()), int(h.nSSE.Load()) }

// Drops counts the events that did not reach a subscriber because it was
// not keeping up (or was already closing).
func (h *hub) Drops() uint64 { return h.drops.Load() }

// Publish hands an event of queue, already encoded as JSON, to the
// subscribers that want it. It never blocks on them. payload is not
// copied and must not change afterwards.
func (h *hub) Publish(queue string, payload []byte) { h.PublishEvent(queue, "", payload) }

// PublishEvent is Publish with an SSE event name (the event: field, which
// browsers dispatch to addEventListener(name)); WebSocket subscribers get
// the payload alone.
func (h *hub) PublishEvent(queue, event string, payload []byte) {
	h.publish(hubEvent{queue: queue, event: event, data: payload})
}

// publish fans ev out; its id is given here. Its byte slices are not
// copied and must not change afterwards.
func (h *hub) publish(ev hubEvent) {
	if h.Subscribers() == 0 {
		return
	}
	// One lock for the whole fan-out keeps ids in order on every
	// subscriber, which Last-Event-ID relies on. The sends under it only
	// append to queues.
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.lastID++
	ev.id = h.lastID
	if b := h.opts.WS.Answers; b != nil {
		// Weighed with its SSE form, which the first stream makes.
		ev.ref = &liveRef{size: ev.weight(), budget: b}
	}
	for s := range h.subs {
		if s.wants(&ev) && !s.send(&ev) {
			h.drops.Add(1)
		}
	}
	if !ev.system {
		h.remember(ev)
	}
}

// remember keeps ev for replay, dropping the oldest events while the
// ring is over its count or its byte budget. h.mu is held.
func (h *hub) remember(ev hubEvent) {
	if h.opts.Replay < 0 {
		return
	}
	// The weight is fixed now: a replay may make the SSE form in place.
	ev.w = ev.weight()
	h.ring = append(h.ring, ev)
	h.ringB += ev.w
	for len(h.ring) > 0 && (len(h.ring) > h.opts.Replay || h.ringB > h.opts.ReplayBytes) {
		h.ringB -= h.ring[0].w
		h.ring[0] = hubEvent{}
		h.ring = h.ring[1:]
	}
}

// add registers s; an SSE stream first gets the kept events after the
// id its client last saw. The replay and the registration happen under
// one lock, so nothing is missed or sent twice in between.
func (h *hub) add(s *hubSub) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	if s.sse != nil {
		if after, err := strconv.ParseUint(s.sse.LastEventID(), 10, 64); err == nil && after <= h.lastID {
			// An id above lastID is from before a restart: nothing here
			// follows it in any meaningful way.
			for i := range h.ring {
				ev := &h.ring[i]
				if ev.id > after && s.wants(ev) && !s.send(ev) {
					h.drops.Add(1)
				}
			}
		}
	}
	h.subs[s] = struct{}{}
	h.count(s, 1)
	h.wg.Add(1)
	return true
}

func (h *hub) count(s *hubSub, d int64) {
	if s.ws != nil {
		h.nWS.Add(d)
	} else {
		h.nSSE.Add(d)
	}
}

func (h *hub) remove(s *hubSub) {
	h.mu.Lock()
	if _, ok := h.subs[s]; ok {
		delete(h.subs, s)
		h.count(s, -1)
		h.wg.Done()
	}
	h.mu.Unlock()
}

// ServeWS upgrades the request to a WebSocket that receives the events of
// queue ("" for all) and runs its read loop until the connection ends.
// onMessage, when set, gets each message the client sends (on this
// goroutine; answer with c.Send). It returns nil after a closing
// handshake, otherwise why the connection ended (a refused handshake,
// which has been answered; a protocol violation, which has been closed
// with its code; an idle client; a broken socket), for the caller to log.
func (h *hub) ServeWS(w http.ResponseWriter, r *http.Request, queue string, onMessage func(c *wsConn, op wsOpcode, msg []byte)) error {
	return h.ServeWSSelect(w, r, queue, nil, onMessage)
}

// ServeWSSelect is ServeWS for a subscriber whose events sel chooses
// (nil: every event's data).
func (h *hub) ServeWSSelect(w http.ResponseWriter, r *http.Request, queue string, sel *wsSelection,
	onMessage func(c *wsConn, op wsOpcode, msg []byte)) error {
	if h.isClosed() {
		http.Error(w, "server shutting down", http.StatusServiceUnavailable)
		return errHubClosed
	}
	// Registered before the client hears it is connected: an event that
	// happens once it knows reaches it.
	var s *hubSub
	added := false
	c, err := upgradeWSThen(w, r, h.opts.WS, func(c *wsConn) {
		s = &hubSub{queue: queue, ws: c, sel: sel}
		added = h.add(s)
	})
	if added {
		defer h.remove(s)
	}
	if err != nil {
		return err
	}
	if !added {
		c.Close(wsCloseGoingAway, "server shutting down")
	}
	var end error
	for {
		op, msg, err := c.ReadMessage()
		if err != nil {
			end = err
			break
		}
		if onMessage != nil {
			onMessage(c, op, msg)
		}
	}
	// The writer finishes the closing handshake; the subscriber counts
	// until it has, so that Close waits for it.
	<-c.Done()
	var ce *wsCloseError
	if errors.As(end, &ce) && ce.Remote {
		return nil
	}
	return end
}

// ServeSSE streams the events of queue ("" for all) until the client goes
// away or the hub closes. onOpen, when set, can send the stream's first
// events, before any replay or live event.
func (h *hub) ServeSSE(w http.ResponseWriter, r *http.Request, queue string, onOpen func(s *sseStream)) error {
	if h.isClosed() {
		http.Error(w, "server shutting down", http.StatusServiceUnavailable)
		return errHubClosed
	}
	// Registered before the client sees the stream open, its first
	// messages (onOpen's) queued ahead of any event: an event that happens
	// once the client knows it is connected reaches it.
	var s *hubSub
	added := false
	st, err := startSSEThen(w, r, h.opts.SSE, func(st *sseStream) {
		if onOpen != nil {
			onOpen(st)
		}
		s = &hubSub{queue: queue, sse: st}
		added = h.add(s)
	})
	if added {
		defer h.remove(s)
	}
	if err != nil {
		return err
	}
	if !added {
		st.Close()
	}
	return st.Run()
}

func (h *hub) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// Close ends every subscriber (WebSockets with 1001, going away) and waits
// until they are gone, which their CloseTimeout bounds. Call it before
// http.Server.Shutdown, which would otherwise wait for the SSE handlers.
func (h *hub) Close() {
	h.mu.Lock()
	h.closed = true
	subs := make([]*hubSub, 0, len(h.subs))
	for s := range h.subs {
		subs = append(subs, s)
	}
	h.ring, h.ringB = nil, 0
	h.mu.Unlock()
	for _, s := range subs {
		if s.ws != nil {
			s.ws.Close(wsCloseGoingAway, "server shutting down")
		} else {
			s.sse.Close()
		}
	}
	h.wg.Wait()
}
