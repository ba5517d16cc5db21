package main

// Lifecycle events for connections that sent SubscribeEvents, and for taps.
//
// Events are emitted under the shard lock, so subscribers see one queue's
// events in the order the state changed. Emitting encodes the frame once and
// copies it into each subscriber's bounded event buffer; a connection's
// writer sends it. A subscriber that does not read loses events, never the
// broker's time.

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
)

type evType uint8

const (
	evPushed evType = iota
	evPulled
	evCompleted
	evFailed
	evRetried
	evStalled
	evProgress
	evRemoved
	evDelayed
	evWaiting
	evDuplicated
	evPaused
	evResumed
	evWaitingChildren
)

var evNames = [...]string{
	evPushed: "pushed", evPulled: "pulled", evCompleted: "completed", evFailed: "failed",
	evRetried: "retried", evStalled: "stalled", evProgress: "progress", evRemoved: "removed",
	evDelayed: "delayed", evWaiting: "waiting", evDuplicated: "duplicated", evPaused: "paused",
	evResumed: "resumed", evWaitingChildren: "waiting-children",
}

// evArgs are the optional fields of an event.
type evArgs struct {
	data        Raw  // completed: the result; failed: the job's data
	undefData   bool // completed without a result: data is undefined
	noData      bool // failed from a lock expiry carries no data
	err         string
	hasErr      bool
	terminal    bool
	hasTerminal bool
	prev        string
	delay       int64
	hasDelay    bool
	stallCount  int32
	action      string
	progress    Raw
	progMsg     string
	hasProgMsg  bool
	remote      bool // happened on another broker (PostgreSQL mode)
}

// Event is one lifecycle event as taps see it (webhooks, live streams,
// metrics). Taps run under the shard lock: they must only record the event
// and return.
type Event struct {
	Type  evType
	Queue string
	// JobID is the job's id; for an event a shard emits it is made from
	// job on first use (ID), as most events meet no tap that reads it.
	JobID string
	job   *Job
	At    int64
	Args  evArgs
	Data  Raw // the job's data, for failed events
}

// ID is the event's job id. A tap that keeps the event past its call
// calls it first: job is read under the shard lock only.
func (ev *Event) ID() string {
	if ev.JobID == "" && ev.job != nil {
		ev.JobID = ev.job.ID()
	}
	return ev.JobID
}

// Name is the event's wire name.
func (ev *Event) Name() string { return evNames[ev.Type] }

// liveMaxData bounds the JSON of the data a live event carries (a failed
// job's data, a completed job's result): what one subscriber's send queue
// holds. Bigger data (a 10 MB binary result is 40 MB of JSON) is left
// out, and dataOmitted says so and where to read it.
const liveMaxData = 4 << 20

// AppendJSON renders the event as the JSON object the HTTP side carries,
// with the same fields as the wire event; data whose JSON passes
// liveMaxData is left out (dataOmitted).
func (ev *Event) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"eventType":`...)
	dst = appendJSONString(dst, []byte(ev.Name()))
	dst = append(dst, `,"queue":`...)
	dst = appendJSONString(dst, []byte(ev.Queue))
	dst = append(dst, `,"jobId":`...)
	dst = appendJSONString(dst, []byte(ev.ID()))
	dst = append(dst, `,"timestamp":`...)
	dst = strconv.AppendInt(dst, ev.At, 10)
	raw := func(key string, r Raw) {
		if r == nil || isUndefined(r) {
			return
		}
		if m := (jsonOut{measure: true, sink: dropJSON}); int64(len(r))*jsonGrowth > liveMaxData && m.raw(r) == nil && m.size() > liveMaxData {
			dst = append(dst, `,"`+key+`Omitted":`...)
			dst = appendJSONString(dst, fmt.Appendf(nil, "%s of %d bytes of JSON left out of live events, over %s; read the job (GET /jobs/%s)",
				key, m.size(), sizeText(liveMaxData), ev.ID()))
			return
		}
		dst = append(dst, ',', '"')
		dst = append(dst, key...)
		dst = append(dst, '"', ':')
		var err error
		if dst, err = appendJSON(dst, r); err != nil {
			dst = append(dst, "null"...)
		}
	}
	a := &ev.Args
	switch ev.Type {
	case evCompleted:
		raw("data", a.data)
	case evFailed:
		if a.hasErr {
			dst = append(dst, `,"error":`...)
			dst = appendJSONString(dst, []byte(a.err))
		}
		if !a.noData {
			raw("data", ev.Data)
		}
		if a.hasTerminal {
			dst = append(dst, `,"terminal":`...)
			dst = strconv.AppendBool(dst, a.terminal)
		}
	case evRetried, evRemoved, evWaiting, evWaitingChildren:
		dst = append(dst, `,"prev":`...)
		dst = appendJSONString(dst, []byte(a.prev))
	case evDelayed:
		dst = append(dst, `,"delay":`...)
		dst = strconv.AppendInt(dst, a.delay, 10)
	case evStalled:
		if a.action != "" {
			dst = append(dst, `,"data":{"stallCount":`...)
			dst = strconv.AppendInt(dst, int64(a.stallCount), 10)
			dst = append(dst, `,"action":`...)
			dst = appendJSONString(dst, []byte(a.action))
			dst = append(dst, '}')
		}
	case evProgress:
		raw("progress", a.progress)
		dst = append(dst, `,"data":{`...)
		if a.progress != nil && !isUndefined(a.progress) {
			dst = append(dst, `"progress":`...)
			var err error
			if dst, err = appendJSON(dst, a.progress); err != nil {
				dst = append(dst, "null"...)
			}
			if a.hasProgMsg {
				dst = append(dst, ',')
			}
		}
		if a.hasProgMsg {
			dst = append(dst, `"message":`...)
			dst = appendJSONString(dst, []byte(a.progMsg))
		}
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

// Tap receives every event of every queue. ev is only lent: the emitter
// reuses it, so a tap copies what it keeps.
type Tap func(ev *Event)

// addTap registers a tap; taps are few and registered at start.
func (b *Broker) addTap(t Tap) {
	b.tapMu.Lock()
	defer b.tapMu.Unlock()
	var list []Tap
	if cur := b.taps.Load(); cur != nil {
		list = append(list, *cur...)
	}
	list = append(list, t)
	b.taps.Store(&list)
}

// eventSubs are the connections subscribed to each queue's events. A
// queue's list is never changed in place but replaced under mu, so that an
// emit reads it with no lock of its own: the memory engine emits under its
// shard's lock, the PostgreSQL engine under none.
type eventSubs struct {
	mu sync.Mutex
	n  atomic.Int64 // queues with subscribers
	m  sync.Map     /* string -> []*conn */
}

func (e *eventSubs) of(queue string) []*conn {
	if e.n.Load() == 0 {
		return nil
	}
	v, ok := e.m.Load(queue)
	if !ok {
		return nil
	}
	return v.([]*conn)
}

// emitScratch is what an emit reuses from one event to the next: the
// event lent to the taps and the subscribers' frame. Its owner keeps one
// emit at a time on it (the memory engine's shard lock).
type emitScratch struct {
	ev    Event
	frame []byte
}

// emit sends one event to the queue's subscribers and the broker's taps,
// through the caller's scratch.
func (b *Broker) emit(scratch *emitScratch, queue string, t evType, j *Job, now int64, a evArgs) {
	subs := b.subs.of(queue)
	taps := b.taps.Load()
	if len(subs) == 0 && taps == nil {
		return
	}
	if taps != nil {
		scratch.ev = Event{Type: t, Queue: queue, job: j, At: now, Args: a}
		if j != nil && t == evFailed {
			scratch.ev.Data = j.Data
		}
		for _, tap := range *taps {
			tap(&scratch.ev)
		}
		scratch.ev = Event{} // holds no job's data past the call
	}
	if len(subs) == 0 {
		return
	}
	scratch.frame = encodeEventFrame(scratch.frame[:0], queue, t, j, now, a)
	for _, c := range subs {
		c.pushEvent(queue, scratch.frame)
	}
	if cap(scratch.frame) > 64<<10 {
		scratch.frame = nil // a large completed result is not kept for good
	}
}

// emit sends one of the memory engine's events. s.mu is held.
func (s *Shard) emit(q *Queue, t evType, j *Job, now int64, a evArgs) {
	s.b.Broker.emit(&s.scratch, q.name, t, j, now, a)
}

// encodeEventFrame appends to dst the frame subscribers receive: {type:
// "event", event: {eventType, queue, jobId, timestamp, ...}}, encoded
// once for all of them.
func encodeEventFrame(dst []byte, queue string, t evType, j *Job, now int64, a evArgs) []byte {
	e := Enc{B: dst}
	at := e.BeginFrame()
	e.MapHead(2)
	e.Str("type")
	e.Str("event")
	e.Str("event")
	m := e.OpenMap()
	n := 4
	e.Str("eventType")
	e.Str(evNames[t])
	e.Str("queue")
	e.Str(queue)
	e.Str("jobId")
	if j != nil {
		e.JobID(j)
	} else {
		e.Str("")
	}
	e.Str("timestamp")
	e.Int(now)
	n += appendEventFields(&e, t, j, a)
	e.CloseMap(m, n)
	e.EndFrame(at)
	return e.B
}

// appendEventFields writes the fields particular to an event of type t
// and returns how many it wrote.
func appendEventFields(e *Enc, t evType, j *Job, a evArgs) int {
	n := 0
	switch t {
	case evCompleted:
		e.Str("data")
		if a.undefData {
			e.Undefined()
		} else {
			e.Raw(a.data)
		}
		n++
	case evFailed:
		e.Str("error")
		optStr(e, a.err, a.hasErr)
		n++
		if !a.noData && j != nil {
			e.Str("data")
			e.Raw(j.Data)
			n++
		}
		if a.hasTerminal {
			e.Str("terminal")
			e.Bool(a.terminal)
			n++
		}
	case evRetried, evRemoved, evWaiting, evWaitingChildren:
		e.Str("prev")
		e.Str(a.prev)
		n++
	case evDelayed:
		e.Str("delay")
		e.Int(a.delay)
		n++
	case evStalled:
		if a.action != "" {
			e.Str("data")
			e.MapHead(2)
			e.Str("stallCount")
			e.Int(int64(a.stallCount))
			e.Str("action")
			e.Str(a.action)
			n++
		}
	case evProgress:
		e.Str("progress")
		e.Raw(a.progress)
		e.Str("data")
		e.MapHead(2)
		e.Str("progress")
		e.Raw(a.progress)
		e.Str("message")
		optStr(e, a.progMsg, a.hasProgMsg)
		n += 2
	}
	return n
}

func (b *Broker) subscribe(c *conn, queue string) {
	b.unsubscribe(c)
	e := &b.subs
	locked(&e.mu, func() {
		var list []*conn
		if v, ok := e.m.Load(queue); ok {
			list = v.([]*conn)
		} else {
			e.n.Add(1)
		}
		e.m.Store(queue, append(list[:len(list):len(list)], c))
	})
	c.setSub(queue)
}

func (b *Broker) unsubscribe(c *conn) {
	queue, ok := c.sub()
	if !ok {
		return
	}
	e := &b.subs
	locked(&e.mu, func() {
		v, ok := e.m.Load(queue)
		if !ok {
			return
		}
		list := v.([]*conn)
		for i, x := range list {
			if x == c {
				list = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			e.m.Delete(queue)
			e.n.Add(-1)
		} else {
			e.m.Store(queue, list)
		}
	})
	c.clearSub()
}
