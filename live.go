package main

// Live events for the HTTP side: SSE at /events and /events/queues/{q},
// WebSocket at /ws and /ws/queues/{q}, with the reference's message shapes.
//
// A broker tap copies each event into a bounded channel and returns: it
// runs under a shard lock. One goroutine renders the events (the legacy
// JSON a WebSocket gets until it subscribes, the {event, ts, data} form
// after, the SSE form) and hands them to the hub, which never waits on a
// subscriber. When the channel is full, events are dropped and counted:
// the broker never waits for the live side either.
//
// A second goroutine (live_figures.go) reads storage for the figures:
// the reference's periodic snapshots, queue:counts for the queues that
// changed, and the monitor's notices (queue:idle and the like).
//
// A WebSocket also takes every protocol command as JSON text and answers
// with the JSON the reference answers, through the same command table as
// TCP. Jobs it pulls and workers it registers are let go when it closes.

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

const (
	liveQueueLen       = 16384 // events between the tap and the renderer
	liveMaxClients     = 1000  // per transport, as the reference
	liveCountsCoalesce = 10 * time.Millisecond
	// livePGCountsCoalesce: in PostgreSQL mode each count is a query.
	livePGCountsCoalesce = 250 * time.Millisecond
	liveStatsEvery       = 5 * time.Second
	liveHealthEvery      = 10 * time.Second
	liveStorageEvery     = 30 * time.Second
)

// liveIntervals can be shortened by tests.
type liveIntervals struct {
	stats, health, storage, monitor time.Duration
	// write is how long a client's socket may refuse a write before it
	// is dropped (0: the hub's 10 s); a test that never reads sets it
	// past its own length, so that a slow machine does not drop it.
	write time.Duration
}

type live struct {
	srv *Server
	b   *Broker
	hub *hub
	log *slog.Logger
	in  chan liveItem
	// dropped counts events the renderer could not keep up with.
	dropped atomic.Uint64
	every   liveIntervals

	// checkOrigin is the HTTP side's rule for who may act (set by it).
	checkOrigin func(*http.Request) bool

	// countsReq hands the queues events touched to the figures goroutine;
	// coalesce is how long they gather first.
	countsReq chan map[string]struct{}
	coalesce  time.Duration
	mon       liveMonitor

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// liveEventName maps a broker event to the reference's dashboard name.
func liveEventName(t evType) string {
	switch t {
	case evPulled:
		return "job:active"
	}
	return "job:" + evNames[t]
}

func newLive(srv *Server, log *slog.Logger, every liveIntervals) *live {
	if every.stats == 0 {
		every = liveIntervals{stats: liveStatsEvery, health: liveHealthEvery, storage: liveStorageEvery, write: every.write}
	}
	if every.monitor == 0 {
		every.monitor = liveMonitorEvery
	}
	l := &live{srv: srv, b: srv.b, log: log, in: make(chan liveItem, liveQueueLen), every: every,
		countsReq: make(chan map[string]struct{}), coalesce: liveCountsCoalesce, mon: newLiveMonitor()}
	if srv.pg != nil {
		// Each count is a query: a dashboard open on a busy queue asks a
		// few times a second, not a hundred.
		l.coalesce = livePGCountsCoalesce
	}
	l.hub = newHub(hubOptions{
		Log: log,
		// As the reference: a client that does not keep up misses
		// messages rather than its connection; binary messages are read
		// as text.
		WS: wsOptions{AllowBinary: true, Slow: slowSkip, Answers: srv.answers, WriteTimeout: every.write,
			CheckOrigin: func(r *http.Request) bool { return l.checkOrigin == nil || l.checkOrigin(r) }},
		// The first chunk carries the retry delay with the connected
		// message, as the reference sends it (see serveSSE).
		SSE: sseOptions{Slow: slowSkip, Retry: -1, WriteTimeout: every.write},
	})
	l.ctx, l.cancel = context.WithCancel(context.Background())
	if m := l.b.mem; m != nil {
		// As the reference's warning, with the budget as the threshold.
		m.warn = func(liveMB, limitMB int64) {
			rss, _ := memoryMB(false)["rss"].(int64)
			l.local(newNote("server:memory-warning").int("heapUsedMB", liveMB).int("thresholdMB", limitMB).int("rssMB", rss))
		}
	}
	l.b.addTap(l.tap)
	l.b.addNoticeTap(NoticeTap{wants: func() bool { return l.hub.Subscribers() > 0 }, take: l.takeNotice})
	l.wg.Go(l.run)
	l.wg.Go(l.figures)
	return l
}

// Shutdown tells every subscriber the server is going (server:shutdown),
// straight to the hub: the renderer may stop before it would take it.
// Close, which follows, sends what is queued before closing.
func (l *live) Shutdown(signal string) {
	l.local(newNote("server:shutdown").str("signal", signal))
}

// Close ends every live subscriber and the renderer, and waits for them.
// Call it before the HTTP server's Shutdown, which would otherwise wait
// for the streams.
func (l *live) Close() {
	l.cancel()
	l.hub.Close()
	l.wg.Wait()
}

// tap runs in the emitter's path (in memory mode under its shard's lock):
// it only queues. An event's
// byte slices are never changed once emitted, so the copy may keep them.
func (l *live) tap(ev *Event) {
	if l.hub.Subscribers() == 0 {
		return
	}
	ev.ID() // the copy is read after the emitter has gone on
	it := liveItem{ev: *ev}
	it.ev.job = nil
	l.queue(it)
}

// liveItem is a job event or a notice: one channel for both keeps the
// order they happened in (queue:created before the job:pushed it comes
// with, dlq:added before job:failed).
type liveItem struct {
	ev Event
	n  *Notice
}

func (l *live) queue(it liveItem) {
	select {
	case l.in <- it:
	default:
		l.dropped.Add(1)
	}
}

// takeNotice runs where the notice was announced, maybe under a shard
// lock: it only queues.
func (l *live) takeNotice(n *Notice) { l.queue(liveItem{n: n}) }

// run renders the events and notices in the order they came, and hands
// the queues they touched to the figures goroutine, coalesced, for their
// queue:counts. It never waits on storage.
func (l *live) run() {
	counts := time.NewTimer(time.Hour)
	counts.Stop()
	defer counts.Stop()
	changed := map[string]struct{}{}
	armed := false
	for {
		select {
		case <-l.ctx.Done():
			return
		case it := <-l.in:
			if it.n != nil {
				l.systemAt(it.n.Name, it.n.At, it.n.Data)
				continue
			}
			ev := &it.ev
			l.publishJobEvent(ev)
			changed[ev.Queue] = struct{}{}
			if !armed {
				counts.Reset(l.coalesce)
				armed = true
			}
		case <-counts.C:
			select {
			case l.countsReq <- changed:
				changed = map[string]struct{}{}
				armed = false
			default:
				// Still counting the last ones: these go with the next.
				counts.Reset(l.coalesce)
			}
		}
	}
}

// publishJobEvent renders one broker event in its three forms.
func (l *live) publishJobEvent(ev *Event) {
	name := liveEventName(ev.Type)
	a := &ev.Args
	// The fields the reference copies into the dashboard forms, under its
	// conditions: a non-empty error or prev, a progress or delay that is
	// there at all.
	extra := func(o *jsonObj) {
		if ev.Type == evFailed && a.hasErr && a.err != "" {
			o.str("error", a.err)
		}
		if ev.Type == evProgress {
			o.raw("progress", a.progress)
		}
		switch ev.Type {
		case evRetried, evRemoved, evWaiting, evWaitingChildren:
			if a.prev != "" {
				o.str("prev", a.prev)
			}
		case evDelayed:
			o.int("delay", a.delay)
		case evStalled:
			// The reference sends a stall twice, {queue, jobId} and
			// {jobId, queue, stallCount, action}; here it is once, with
			// both's fields.
			if a.action != "" {
				o.int("stallCount", int64(a.stallCount))
				o.str("action", a.action)
			}
		}
	}
	d := jsonObj{}
	d.open()
	d.str("queue", ev.Queue)
	d.str("jobId", ev.ID())
	extra(&d)
	wsData := d.close()

	t := jsonObj{}
	t.open()
	t.str("event", name)
	t.int("ts", ev.At)
	t.json("data", wsData)

	s := jsonObj{}
	s.open()
	s.str("queue", ev.Queue)
	s.str("jobId", ev.ID())
	s.int("timestamp", ev.At)
	extra(&s)

	l.hub.publish(hubEvent{queue: ev.Queue, event: name, data: s.close(),
		legacy: ev.AppendJSON(nil), tagged: t.close()})
}

// system publishes a figure to every subscriber, whatever its queue.
func (l *live) system(name string, data []byte) { l.systemAt(name, l.b.now(), data) }

// systemAt publishes an event that is no job's to every subscriber,
// whatever queue it follows (the reference filters only job events by
// queue), stamped at.
func (l *live) systemAt(name string, at int64, data []byte) {
	t := jsonObj{}
	t.open()
	t.str("event", name)
	t.int("ts", at)
	t.json("data", data)
	l.hub.publish(hubEvent{event: name, data: data, tagged: t.close(), system: true})
}

// ---------------------------------------------------------------------------
// Endpoints

// serveSSE streams the events of queue ("" for all).
func (l *live) serveSSE(w http.ResponseWriter, r *http.Request, queue string) {
	if _, n := l.hub.Counts(); n >= liveMaxClients {
		http.Error(w, "Too many SSE connections", http.StatusServiceUnavailable)
		return
	}
	id := newID()
	err := l.hub.ServeSSE(w, r, queue, func(s *sseStream) {
		s.sendRaw([]byte("retry: 3000\ndata: {\"connected\":true,\"clientId\":\"" + id + "\"}\n\n"))
	})
	if err != nil {
		l.log.Debug("event stream ended", "remote", r.RemoteAddr, "err", err)
	}
}

// serveWS upgrades to a WebSocket that carries the events of queue ("" for
// all) and answers protocol commands.
func (l *live) serveWS(w http.ResponseWriter, r *http.Request, queue string) {
	if n, _ := l.hub.Counts(); n >= liveMaxClients {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ok": false, "error": "Too many WebSocket connections"})
		return
	}
	sel := &wsSelection{}
	var vc *conn
	err := l.hub.ServeWSSelect(w, r, queue, sel, func(c *wsConn, _ wsOpcode, msg []byte) {
		if vc == nil {
			// Made at the first command: most clients only listen.
			vc = newVirtualConn(l.srv, l.ctx, l.srv.httpClientKey(r), func(f []byte) { c.SendFrame(f) }, false)
			vc.json = true
			// A big answer is checked against the client's send queue
			// before it is built: a client that does not read is closed.
			vc.backlog = c.overShare
			vc.onSlow = func() { c.startClose(wsClosePolicy, "slow consumer: answers not read", false, true) }
		}
		l.onMessage(c, vc, sel, msg)
	})
	if vc != nil {
		vc.finishVirtual()
	}
	if err != nil {
		l.log.Debug("websocket ended", "remote", r.RemoteAddr, "err", err)
	}
}

// frameToJSON renders an answer frame as the JSON the reference sends.
func frameToJSON(f []byte) []byte {
	// Sized for the usual case (JSON a little longer than MessagePack),
	// so that a big answer is not copied again and again as it grows.
	out, err := appendJSON(make([]byte, 0, len(f)+len(f)/8+64), f[4:])
	if err != nil {
		return []byte(`{"ok":false,"error":"Internal server error"}`)
	}
	return out
}

func wsError(msg string, reqID Raw) []byte {
	o := jsonObj{}
	o.open()
	o.boolean("ok", false)
	o.str("error", msg)
	o.raw("reqId", reqID)
	return o.close()
}

// onMessage answers one message, as the reference's ws handler does:
// Subscribe and Unsubscribe choose events; anything else is a protocol
// command.
func (l *live) onMessage(c *wsConn, vc *conn, sel *wsSelection, msg []byte) {
	mp, err := jsonToMsgpack(msg)
	if err != nil || (len(mp) == 1 && mp[0] == 0xc0) {
		c.SendReply([]byte(`{"ok":false,"error":"Invalid JSON"}`))
		return
	}
	m, err := ParseMap(mp, nil)
	if err != nil {
		c.SendReply([]byte(`{"ok":false,"error":"Invalid command"}`))
		return
	}
	reqID := m.Get("reqId")
	cmdRaw := m.Get("cmd")
	cmd, serr := cmdRaw.Str()
	switch {
	case cmdRaw == nil || cmdRaw.IsNil() || (serr == nil && cmd == ""):
		c.SendReply([]byte(`{"ok":false,"error":"Invalid command"}`))
		return
	case cmd == "Subscribe" || cmd == "Unsubscribe":
		c.SendReply(l.subscription(sel, cmd == "Subscribe", m, reqID))
		return
	case cmd == "SubscribeEvents" || cmd == "UnsubscribeEvents":
		// A TCP connection's own events; here Subscribe does that.
		c.SendReply(wsError("Unknown command: "+cmd, reqID))
		return
	}
	procsRequest()
	var e Enc
	reserved := vc.dispatch(m, &e)
	if len(e.B) > 0 {
		c.SendFrame(e.B)
	}
	vc.unreserve(reserved)
}

// subscription answers Subscribe and Unsubscribe with the patterns now
// subscribed.
func (l *live) subscription(sel *wsSelection, add bool, m Map, reqID Raw) []byte {
	items, err := m.Get("events").Array()
	var events []string
	if err == nil {
		for _, it := range items {
			s, err := it.Str()
			if err != nil {
				s = string(appendJSONOrNull(it))
			}
			events = append(events, s)
		}
	}
	var now []string
	if add {
		if err != nil || len(events) == 0 {
			return wsError("events must be a non-empty array", reqID)
		}
		var invalid []string
		for _, e := range events {
			if !wsValidPatterns[e] {
				invalid = append(invalid, e)
			}
		}
		if len(invalid) > 0 {
			msg := "Invalid: "
			for i, s := range invalid {
				if i > 0 {
					msg += ", "
				}
				msg += s
			}
			return wsError(msg, reqID)
		}
		now = sel.subscribe(events)
	} else {
		now = sel.unsubscribe(events)
	}
	o := jsonObj{}
	o.open()
	o.boolean("ok", true)
	list, _ := jsonMarshal(now)
	o.json("subscribed", list)
	o.raw("reqId", reqID)
	return o.close()
}

func appendJSONOrNull(r Raw) []byte {
	out, err := appendJSON(nil, r)
	if err != nil {
		return []byte("null")
	}
	return out
}
