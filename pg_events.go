package main

// Events across brokers. In PostgreSQL mode a worker's job may be pushed
// through one broker, claimed through a second and acknowledged through a
// third, while the subscriber, the webhook or the dashboard that wants to
// hear of it is connected to a fourth. Each broker therefore delivers its
// own events at once, as in the other modes, and forwards them to the
// others through NOTIFY on the namespace's event channel, when there are
// others listening (pg_peers.go). Forwarding is
// batched off the command path: a command never waits for it, and a burst
// of events costs a few NOTIFYs rather than one round trip each.
//
// A NOTIFY payload is text of under 8000 bytes, so a batch is MessagePack
// in base64, split to fit. An event too large even alone (a big result or
// job data) is forwarded without its data; the note in README says so.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// pgEvRaw bounds the MessagePack of one NOTIFY so that its base64 and
	// the sender prefix stay under PostgreSQL's 8000-byte limit.
	pgEvRaw = 5600
	// pgEvBacklog bounds what waits to be forwarded while the database is
	// away; beyond it the oldest events are dropped, and counted.
	pgEvBacklog = 8 << 20
	// pgAnySender marks a notification sent from inside a transaction
	// rather than by a broker's forwarder: every broker delivers it, the
	// one whose transaction sent it too.
	pgAnySender = "tx"
	// pgEvPayloads bounds the NOTIFYs of one forwarding statement.
	pgEvPayloads = 64
)

// pgEvents is one broker's outgoing event batch.
type pgEvents struct {
	mu      sync.Mutex
	pending [][]byte // encoded events, oldest first
	size    int
	wakes   map[string]bool // queues to wake on the other brokers
	replies []string        // brokers whose hello this one owes a reply (pg_peers.go)
	dropped int64
	kick    chan struct{}
	sent    atomic.Int64 // notifications sent: events, wake-ups, replies
	wakers  *pgWakers
}

// pgWakers are the server processes of this broker's pool connections
// that have sent wake-ups (notifyAll). The listener hears every
// notification of the channel, its own broker's too; one from these
// processes woke this broker's pulls when it was sent, and taken for
// another broker's push it woke every waiting pull again and ended the
// queue's mark (pg_wait.go): two brokers, 3,000 jobs pushed one at a time,
// 4.9 claim transactions a job. A process id leaves the set when its
// connection closes (the pool's BeforeClose), and the set is emptied
// when the listener connects again: a connection whose server died is
// closed only when the pool next notices, and the database, restarted,
// may meanwhile give its process id to another broker's connection,
// whose wake-ups this broker would skip (its pulls would find those jobs
// at their next look, pgRecheck).
type pgWakers struct{ pids sync.Map } // uint32 -> struct{}

func (w *pgWakers) sending(pid uint32) { w.pids.Store(pid, struct{}{}) }

func (w *pgWakers) closed(c *pgx.Conn) { w.pids.Delete(c.PgConn().PID()) }

// forget empties the set; the connections still in use record themselves
// again at their next wake-up.
func (w *pgWakers) forget() { w.pids.Clear() }

func (w *pgWakers) own(pid uint32) bool {
	_, ok := w.pids.Load(pid)
	return ok
}

// forward queues an event for the other brokers.
func (p *PG) forward(queue string, t evType, j *Job, now int64, a evArgs) {
	var e Enc
	encodeRemoteEvent(&e, queue, t, j, now, a, false)
	if len(e.B) > pgEvRaw {
		e.B = e.B[:0]
		encodeRemoteEvent(&e, queue, t, j, now, a, true)
	}
	p.pend(e.B)
}

// forwardNotice queues a catalogue notice for the other brokers; one
// from another broker is not sent on.
func (p *PG) forwardNotice(n *Notice) {
	if n.remote {
		return
	}
	var e Enc
	encodeRemoteNotice(&e, n.Name, n.At, n.Data)
	if len(e.B) > pgEvRaw {
		// Only a notice carrying a client's long strings gets here; the
		// others hear that it happened.
		e.B = e.B[:0]
		encodeRemoteNotice(&e, n.Name, n.At, []byte("{}"))
	}
	p.pend(e.B)
}

// pend queues one encoded item for the other brokers.
func (p *PG) pend(item []byte) {
	ev := &p.ev
	ev.mu.Lock()
	ev.pending = append(ev.pending, item)
	ev.size += len(item)
	for ev.size > pgEvBacklog && len(ev.pending) > 1 {
		ev.size -= len(ev.pending[0])
		ev.pending[0] = nil
		ev.pending = ev.pending[1:]
		ev.dropped++
	}
	ev.mu.Unlock()
	p.kickForwarder()
}

// kickForwarder tells the forwarder there is something to send.
func (p *PG) kickForwarder() {
	select {
	case p.ev.kick <- struct{}{}:
	default:
	}
}

// encodeRemoteNotice writes a notice as a map whose "n" key tells it from
// a job event.
func encodeRemoteNotice(e *Enc, name string, at int64, data []byte) {
	e.MapHead(3)
	e.Str("n")
	e.Str(name)
	e.Str("at")
	e.Int(at)
	e.Str("x")
	e.Str(string(data))
}

// wakeEverywhere wakes this broker's pulls on queues at once and, when
// others listen, the other brokers' with the next batch. made, when not
// nil, is how many jobs each queue was given (a push's): as many of its
// pulls are woken here, where nil wakes them all.
func (p *PG) wakeEverywhere(queues []string, made []int) {
	for i, q := range queues {
		if made != nil {
			p.wakePushed(q, made[i])
		} else {
			p.wake(q)
		}
	}
	if !p.forwarding() {
		return
	}
	ev := &p.ev
	ev.mu.Lock()
	if ev.wakes == nil {
		ev.wakes = make(map[string]bool)
	}
	for _, q := range queues {
		ev.wakes[q] = true
	}
	ev.mu.Unlock()
	p.kickForwarder()
}

// encodeRemoteEvent writes an event as a map with short keys. Without
// data (trim) it carries what an event is, not what a job holds.
func encodeRemoteEvent(e *Enc, queue string, t evType, j *Job, now int64, a evArgs, trim bool) {
	m := e.OpenMap()
	n := 3
	e.Str("t")
	e.Int(int64(t))
	e.Str("q")
	e.Str(queue)
	e.Str("at")
	e.Int(now)
	str := func(k, v string) {
		e.Str(k)
		e.Str(v)
		n++
	}
	raw := func(k string, v Raw) {
		if len(v) > 0 && !trim {
			e.Str(k)
			e.Raw(v)
			n++
		}
	}
	flag := func(k string, v bool) {
		if v {
			e.Str(k)
			e.Bool(true)
			n++
		}
	}
	if j != nil {
		str("j", j.ID())
		if t == evFailed {
			raw("jd", j.Data)
		}
	}
	raw("d", a.data)
	flag("u", a.undefData || trim && t == evCompleted)
	flag("nd", a.noData || trim && t == evFailed)
	if a.hasErr {
		str("e", a.err)
	}
	if a.hasTerminal {
		e.Str("te")
		e.Bool(a.terminal)
		n++
	}
	if a.prev != "" {
		str("p", a.prev)
	}
	if a.hasDelay {
		e.Str("dl")
		e.Int(a.delay)
		n++
	}
	if a.stallCount != 0 {
		e.Str("sc")
		e.Int(int64(a.stallCount))
		n++
	}
	if a.action != "" {
		str("ac", a.action)
	}
	if trim && t == evProgress {
		e.Str("pr")
		e.Nil()
		n++
	} else {
		raw("pr", a.progress)
	}
	if a.hasProgMsg {
		str("pm", a.progMsg)
	}
	e.CloseMap(m, n)
}

// remoteEvent is an event decoded from another broker.
type remoteEvent struct {
	queue string
	t     evType
	job   *Job
	at    int64
	args  evArgs
}

func decodeRemoteEvent(b Raw) (remoteEvent, error) {
	m, err := ParseMap(b, nil)
	if err != nil {
		return remoteEvent{}, err
	}
	return remoteEventOf(m)
}

// remoteEventOf reads a job event from its parsed map.
func remoteEventOf(m Map) (remoteEvent, error) {
	var ev remoteEvent
	t, _, err := m.Int("t")
	if err != nil || t < 0 || int(t) >= len(evNames) {
		return ev, fmt.Errorf("event type %d: %v", t, err)
	}
	ev.t = evType(t)
	if ev.queue, _, err = m.Str("q"); err != nil {
		return ev, err
	}
	if ev.at, _, err = m.Int("at"); err != nil {
		return ev, err
	}
	id, hasID, err := m.Str("j")
	if err != nil {
		return ev, err
	}
	if hasID {
		ev.job = withID(&Job{Data: clone(m.Get("jd"))}, id)
	}
	a := &ev.args
	a.remote = true
	a.data = clone(m.Get("d"))
	a.undefData = m.Has("u")
	a.noData = m.Has("nd")
	var errs [6]error
	a.err, a.hasErr, errs[0] = m.Str("e")
	a.terminal, a.hasTerminal, errs[1] = m.Bool("te")
	a.prev, _, errs[2] = m.Str("p")
	a.delay, a.hasDelay, errs[3] = m.Int("dl")
	var sc int64
	sc, _, errs[4] = m.Int("sc")
	a.stallCount = int32(sc)
	a.action, _, errs[5] = m.Str("ac")
	if err := errors.Join(errs[:]...); err != nil {
		return ev, err
	}
	if pr := m.Get("pr"); pr != nil {
		a.progress = clone(pr)
	} else if ev.t == evProgress {
		a.progress = Raw{0xc0}
	}
	if a.progMsg, a.hasProgMsg, err = m.Str("pm"); err != nil {
		return ev, err
	}
	return ev, nil
}

// remoteNoticeOf reads a notice from its parsed map (its "n" key tells
// it from a job event).
func remoteNoticeOf(m Map) (*Notice, error) {
	name, _, err1 := m.Str("n")
	at, _, err2 := m.Int("at")
	data, _, err3 := m.Str("x")
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, err
	}
	if !wsValidPatterns[name] && !offCatalogue[name] {
		return nil, fmt.Errorf("notice %q is not in the catalogue", name)
	}
	return &Notice{Name: name, At: at, Data: []byte(data), remote: true}, nil
}

// forwarder sends the pending events until the broker stops.
func (p *PG) forwarder() {
	for {
		select {
		case <-p.stop:
			p.flushEvents() // what was emitted before the stop still goes out
			return
		case <-p.ev.kick:
		}
		if err := p.flushEvents(); err != nil {
			// The events stay pending; the next kick or the retry sends them.
			select {
			case <-p.stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			p.kickForwarder()
		}
	}
}

// flushEvents sends what is pending, oldest first, a statement at a time:
// replies to hellos first (a starting broker waits for them), then
// wake-ups, then events; replies and wake-ups that come meanwhile go
// before the next statement of events.
func (p *PG) flushEvents() error {
	ev := &p.ev
	for {
		if err := p.flushControl(); err != nil {
			return err
		}
		ev.mu.Lock()
		if d := ev.dropped; d > 0 {
			ev.dropped = 0
			p.log.Warn("events not forwarded to other brokers: backlog full", "dropped", d)
		}
		// Up to pgEvPayloads payloads go in one statement: each NOTIFY
		// sent on its own was a transaction of its own, and a commit that
		// notifies takes a namespace-wide lock and signals every listening
		// backend; under load that was thousands of commits a second
		// beside the jobs' own. One transaction delivers its
		// notifications in the order they were sent.
		var payloads []string
		taken, size := 0, 0
		for len(payloads) < pgEvPayloads && taken < len(ev.pending) {
			var batch [][]byte
			bsize := 0
			for _, b := range ev.pending[taken:] {
				if len(batch) > 0 && bsize+len(b) > pgEvRaw {
					break
				}
				batch = append(batch, b)
				bsize += len(b)
			}
			var e Enc
			e.B = make([]byte, 0, bsize+8)
			e.ArrayHead(len(batch))
			for _, b := range batch {
				e.B = append(e.B, b...)
			}
			payloads = append(payloads, p.broker+" "+base64.StdEncoding.EncodeToString(e.B))
			taken += len(batch)
			size += bsize
		}
		ev.mu.Unlock()
		if len(payloads) == 0 {
			return nil
		}
		if err := p.notifyAll(p.evName, payloads); err != nil {
			return fmt.Errorf("forward events: %w", err)
		}
		ev.mu.Lock()
		// Only this goroutine removes from the front, so the items are still there.
		for i := range taken {
			ev.pending[i] = nil
		}
		ev.pending = ev.pending[taken:]
		ev.size -= size
		ev.mu.Unlock()
	}
}

// flushControl sends the pending replies to hellos, then wake-ups.
func (p *PG) flushControl() error {
	ev := &p.ev
	ev.mu.Lock()
	var wakes []string
	for q := range ev.wakes {
		wakes = append(wakes, q)
	}
	clear(ev.wakes)
	replies := ev.replies
	ev.replies = nil
	ev.mu.Unlock()
	if len(replies) > 0 {
		payloads := make([]string, len(replies))
		for i, to := range replies {
			payloads[i] = p.replyPayload(to)
		}
		if err := p.notifyAll(p.evName, payloads); err != nil {
			ev.mu.Lock()
			ev.replies = append(replies, ev.replies...)
			ev.mu.Unlock()
			return fmt.Errorf("reply to other brokers' hellos: %w", err)
		}
	}
	if len(wakes) > 0 {
		if err := p.notifyAll(p.chName, wakes); err != nil {
			// Pulls elsewhere find the jobs on their next look (within a second).
			p.log.Debug("wake-ups not sent to other brokers", "err", err)
		}
	}
	return nil
}

// notifyAll sends payloads on channel, in their order, in one statement
// (one transaction: one commit that notifies for all of them).
func (p *PG) notifyAll(channel string, payloads []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if channel == p.chName {
		p.ev.wakers.sending(conn.Conn().PgConn().PID())
	}
	if _, err := conn.Exec(ctx, `SELECT pg_notify($1, x) FROM unnest($2::text[]) WITH ORDINALITY AS u(x, n) ORDER BY n`, channel, payloads); err != nil {
		return err
	}
	p.ev.sent.Add(int64(len(payloads)))
	return nil
}

// received delivers another broker's events to this broker's subscribers
// and taps.
func (p *PG) received(payload string) {
	from, body, ok := strings.Cut(payload, " ")
	// A reply's sender field names its sender first (pg_peers.go).
	if sender, _, _ := strings.Cut(from, "@"); !ok || sender == p.broker {
		return
	}
	if from != pgAnySender && p.heardPeer(from, body) {
		return
	}
	b, err := base64.StdEncoding.DecodeString(body)
	if err != nil {
		p.log.Warn("event notification is not base64", "err", err)
		return
	}
	items, err := Raw(b).Array()
	if err != nil {
		p.log.Warn("event notification is not an array", "err", err)
		return
	}
	for _, it := range items {
		// Each item is parsed once: a notice or a job event.
		m, err := ParseMap(it, nil)
		if err == nil && m.Has("n") {
			n, err := remoteNoticeOf(m)
			if err != nil {
				p.log.Warn("notice notification unreadable", "err", err)
				continue
			}
			p.b.deliverNotice(n)
			continue
		}
		var ev remoteEvent
		if err == nil {
			ev, err = remoteEventOf(m)
		}
		if err != nil {
			p.log.Warn("event notification unreadable", "err", err)
			continue
		}
		p.emitLocal(ev.queue, ev.t, ev.job, ev.at, ev.args)
	}
}

// emit tells this broker's subscribers and taps of an event, and the
// other brokers' through the event channel (pg_events.go).
func (p *PG) emit(queue string, t evType, j *Job, now int64, a evArgs) {
	if j != nil {
		// The first event of a job the committed transaction
		// dead-lettered: dlq:added comes before it, as in memory mode.
		p.deadLettered(j)
	}
	p.emitLocal(queue, t, j, now, a)
	if p.forwarding() {
		p.forward(queue, t, j, now, a)
	}
}

// deadLettered announces dlq:added (and flow:failed for a flow's child)
// for a job a committed transaction dead-lettered, once.
func (p *PG) deadLettered(j *Job) {
	if !j.dlqNew || j.dlq == nil {
		return
	}
	j.dlqNew = false
	p.b.announce(noticeDLQAdded(j.Queue, j.ID(), j.dlq.Reason))
	if j.cold().ParentID != "" {
		p.b.announce(noticeFlowFailed(j.cold().ParentID, j.ID(), j.Queue, j.cold().failErr, "Max attempts exceeded"))
	}
}

// emitLocal tells this broker's subscribers and taps. PG emits from many
// goroutines at once: each takes a scratch of the pool's.
func (p *PG) emitLocal(queue string, t evType, j *Job, now int64, a evArgs) {
	sc, _ := pgEmitScratch.Get().(*emitScratch)
	if sc == nil {
		sc = new(emitScratch)
	}
	p.b.emit(sc, queue, t, j, now, a)
	pgEmitScratch.Put(sc)
}

var pgEmitScratch sync.Pool
