package main

// Webhook delivery: one backlog per webhook, its own senders, and a circuit
// breaker per receiver.
//
// One shared queue with a few senders let a receiver that never answers
// take every sender for the length of its timeouts (three 10-second
// attempts), and every other webhook waited behind it. Now each webhook
// (its hookLine) has its own backlog and starts its own senders, so a
// dead receiver holds only its own:
//
//   - The backlog is bounded in count and bytes. Beyond the reserve every
//     webhook has, payload bytes come from a budget shared by all backlogs,
//     so memory stays bounded whatever the number of webhooks. A delivery
//     that does not fit is dropped and counted (per webhook, in
//     ListWebhooks' droppedCount, and in the metrics), and the drops are
//     logged at most every 10 s.
//   - A webhook has one sender while deliveries wait; up to four when they
//     pile up, the extra ones taken from a pool shared by all webhooks.
//     The number of webhooks is limited, so senders are bounded: at most
//     one per webhook plus the pool.
//   - After webhookBreakAfter deliveries in a row fail (each after all its
//     attempts), the circuit opens: deliveries are held in the backlog,
//     within its bounds, and nothing is sent until the open period ends.
//     Then one delivery is sent as a probe (half-open); if it gets through
//     the circuit closes and the backlog drains, if not the circuit opens
//     again for twice as long, up to webhookOpenMax.
//
// Order: while deliveries do not pile up a webhook's are sent one at a
// time, in order; with several senders (as with the shared senders
// before) a later one may arrive first.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"
)

const (
	webhookBacklogLen    = 1024     // deliveries one webhook may have waiting
	webhookBacklogBytes  = 4 << 20  // payload bytes one webhook may have waiting
	webhookReserveBytes  = 64 << 10 // of which a webhook may hold whatever the others hold
	webhookTotalBytes    = 64 << 20 // payload bytes all backlogs together, beyond the reserves
	webhookSenders       = 4        // senders one webhook may have
	webhookSharedSenders = 64       // senders beyond each webhook's first, for all webhooks
	webhookBreakAfter    = 5        // deliveries failed in a row that open a circuit
	webhookOpenFor       = 5 * time.Second
	webhookOpenMax       = time.Minute
	webhookCloseWait     = 5 * time.Second
	webhookDropLogEvery  = 10 * time.Second
)

// delivery is one event on its way to one webhook. The payload slices are
// the broker's own stored values, which are replaced, never written in
// place, so holding them is safe without copying under the shard lock.
type delivery struct {
	w        *Webhook
	kind     evType
	queue    string
	jobID    string
	at       int64
	data     Raw // completed: the result; failed: the job's data
	err      string
	hasErr   bool
	progress Raw
	size     int64
}

type circuitState uint8

const (
	circuitClosed   circuitState = iota // deliveries flow
	circuitOpen                         // deliveries held until retryAt
	circuitHalfOpen                     // one probe in flight
)

func (c circuitState) String() string {
	return [...]string{"closed", "open", "half-open"}[c]
}

// hookLine is one webhook's backlog, senders and circuit. The tap adds to
// it under a shard lock, so nothing slow happens under mu. Lock order:
// Webhooks.mu before hookLine.mu.
type hookLine struct {
	mu      sync.Mutex
	q       []delivery // waiting, oldest first
	bytes   int64      // their sizes
	workers int        // senders running
	busy    int        // of which sending
	off     bool       // disabled or removed: nothing is taken, senders leave

	state   circuitState
	fails   int           // deliveries failed in a row
	openFor time.Duration // the current open period
	retryAt time.Time     // when an open circuit may be probed
	probing bool          // a sender waits for retryAt or sends the probe

	dropped, dropLogged int64
}

// resetLocked empties the backlog and closes the circuit, for a webhook
// disabled (off) or enabled again.
func (l *hookLine) resetLocked(h *Webhooks, off bool) {
	for i := range l.q {
		l.q[i] = delivery{}
	}
	h.held.Add(-l.bytes)
	l.q, l.bytes, l.off = nil, 0, off
	l.state, l.fails, l.openFor = circuitClosed, 0, 0
}

// snapshot is what ListWebhooks and the metrics show of a line.
func (l *hookLine) snapshot() (state circuitState, pending int, dropped int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state, len(l.q) + l.busy, l.dropped
}

// ---------------------------------------------------------------------------
// The tap

func (h *Webhooks) tap(ev *Event) {
	bit := webhookEventBit(ev.Type)
	if bit == 0 {
		return
	}
	on := *h.active.Load()
	if len(on) == 0 {
		return
	}
	d := delivery{kind: ev.Type, queue: ev.Queue, jobID: ev.ID(), at: ev.At}
	switch ev.Type {
	case evCompleted:
		if !ev.Args.undefData {
			d.data = ev.Args.data
		}
	case evFailed:
		if !ev.Args.noData {
			d.data = ev.Data
		}
		d.err, d.hasErr = ev.Args.err, ev.Args.hasErr
	case evProgress:
		d.progress = ev.Args.progress
	}
	d.size = int64(len(d.data) + len(d.progress) + len(d.err) + len(d.jobID) + len(d.queue) + 256)
	h.life.RLock()
	defer h.life.RUnlock()
	if h.closed {
		return
	}
	for _, w := range on {
		if w.mask&bit == 0 || (w.Queue != "" && w.Queue != ev.Queue) {
			continue
		}
		d.w = w
		h.enqueue(w.line, d)
	}
}

// enqueue adds d to l's backlog if it fits, and starts a sender if one is
// wanted. Called with h.life read-locked and not closed.
func (h *Webhooks) enqueue(l *hookLine, d delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fits := !l.off && len(l.q) < h.opts.queueLen &&
		(l.bytes == 0 || l.bytes+d.size <= webhookBacklogBytes) &&
		(l.bytes+d.size <= webhookReserveBytes || h.held.Load()+d.size <= webhookTotalBytes)
	if !fits {
		l.dropped++
		h.dropped.Add(1)
		return
	}
	l.q = append(l.q, d)
	l.bytes += d.size
	h.held.Add(d.size)
	h.startSendersLocked(l)
}

// startSendersLocked starts senders while deliveries wait with no idle
// sender to take them: the first always (it is the webhook's own), more
// only while the circuit is closed, up to webhookSenders, and only from
// the shared pool. With l.mu held; the caller is the tap (h.life held) or
// a sender (counted in h.wg), so h.wg.Add cannot race Close's Wait.
func (h *Webhooks) startSendersLocked(l *hookLine) {
	for len(l.q) > l.workers-l.busy && h.ctx.Err() == nil {
		extra := l.workers > 0
		if extra {
			if l.state != circuitClosed || l.workers >= webhookSenders {
				return
			}
			select {
			case h.shared <- struct{}{}:
			default:
				return
			}
		}
		l.workers++
		h.wg.Go(func() { h.send(l, extra) })
	}
}

// ---------------------------------------------------------------------------
// The senders

// send takes deliveries from l's backlog until it is empty, or the
// circuit holds them and another sender waits to probe.
func (h *Webhooks) send(l *hookLine, extra bool) {
	if extra {
		defer func() { <-h.shared }()
	}
	var logs []func()
	l.mu.Lock()
loop:
	for len(l.q) > 0 && !l.off && h.ctx.Err() == nil {
		probe := false
		switch l.state {
		case circuitOpen:
			if l.probing {
				break loop // another sender waits to probe
			}
			if wait := time.Until(l.retryAt); wait > 0 {
				l.probing = true
				l.mu.Unlock()
				h.flushLogs(&logs)
				ok := h.sleep(wait)
				l.mu.Lock()
				l.probing = false
				if !ok {
					break loop
				}
				continue // look again: the backlog may be gone, the circuit closed
			}
			l.state, l.probing, probe = circuitHalfOpen, true, true
		case circuitHalfOpen:
			break loop // the probe is out; its sender carries on after it
		}
		d := l.q[0]
		l.q[0] = delivery{}
		l.q = l.q[1:]
		l.bytes -= d.size
		h.held.Add(-d.size)
		l.busy++
		l.mu.Unlock()
		h.flushLogs(&logs)
		res := h.deliver(&d)
		l.mu.Lock()
		l.busy--
		if log := h.settleLocked(l, d.w, res, probe); log != nil {
			logs = append(logs, log)
		}
	}
	l.workers--
	l.mu.Unlock()
	h.flushLogs(&logs)
}

func (h *Webhooks) flushLogs(logs *[]func()) {
	for _, f := range *logs {
		f()
	}
	*logs = (*logs)[:0]
}

// sleep waits for d, or for shutdown (false).
func (h *Webhooks) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-h.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

type deliveryResult uint8

const (
	deliverySkipped   deliveryResult = iota // webhook gone, or shutting down
	deliveryDone                            // a 2xx
	deliveryFailedAll                       // every attempt failed
)

// settleLocked moves l's circuit on a delivery's result, with l.mu held.
// It returns a log line to write once the lock is released, if any.
func (h *Webhooks) settleLocked(l *hookLine, w *Webhook, res deliveryResult, probe bool) func() {
	if probe {
		l.probing = false
	}
	switch res {
	case deliveryDone:
		l.fails = 0
		if l.state == circuitClosed {
			return nil
		}
		l.state, l.openFor = circuitClosed, 0
		h.startSendersLocked(l) // drain what was held
		waiting := len(l.q)
		return func() {
			h.log.Info("webhook receiver answers again: circuit closed", "webhook", w.ID, "receiver", logURL(w.URL),
				"held_deliveries", waiting)
		}
	case deliveryFailedAll:
		l.fails++
		switch {
		case probe && l.state == circuitHalfOpen:
			l.openFor = max(h.opts.openFor, min(2*l.openFor, h.opts.openMax))
			l.state, l.retryAt = circuitOpen, time.Now().Add(l.openFor)
		case l.state == circuitClosed && l.fails >= h.opts.breakAfter:
			l.openFor = h.opts.openFor
			l.state, l.retryAt = circuitOpen, time.Now().Add(l.openFor)
			fails, openFor := l.fails, l.openFor
			return func() {
				h.log.Warn("webhook receiver keeps failing: circuit open, deliveries held until a probe gets through",
					"webhook", w.ID, "receiver", logURL(w.URL), "failed_in_a_row", fails, "probe_in", openFor)
			}
		}
	case deliverySkipped:
		if probe && l.state == circuitHalfOpen {
			l.state = circuitOpen // probe again at once
		}
	}
	return nil
}

// dropReporter logs dropped deliveries now and then; the tap cannot log,
// it runs under a shard lock.
func (h *Webhooks) dropReporter() {
	t := time.NewTicker(h.opts.dropLogEvery)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
			h.reportDrops()
		}
	}
}

// reportDrops writes one line for the drops since the last one: how many,
// and the webhooks that dropped most.
func (h *Webhooks) reportDrops() {
	type drop struct {
		id, state string
		n         int64
	}
	var drops []drop
	var total int64
	h.mu.Lock()
	for _, w := range h.list {
		l := w.line
		l.mu.Lock()
		if n := l.dropped - l.dropLogged; n > 0 {
			drops = append(drops, drop{w.ID, l.state.String(), n})
			total += n
			l.dropLogged = l.dropped
		}
		l.mu.Unlock()
	}
	h.mu.Unlock()
	if total == 0 {
		return
	}
	slices.SortFunc(drops, func(a, b drop) int { return int(b.n - a.n) })
	var worst []string
	for _, d := range drops[:min(len(drops), 5)] {
		worst = append(worst, fmt.Sprintf("%s: %d (circuit %s)", d.id, d.n, d.state))
	}
	h.log.Warn("webhook deliveries dropped: backlogs full (receivers slower than the event rate, or down)",
		"dropped", total, "webhooks", len(drops), "most", worst, "dropped_total", h.dropped.Load())
}

// logURL is what logs show of a receiver's URL: scheme and host, not the
// path or query (where receivers often put a token) nor a password.
func logURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unreadable URL)"
	}
	return u.Scheme + "://" + u.Host
}

// lineStats reports the circuits open or probing and the deliveries waiting,
// for the metrics.
func (h *Webhooks) lineStats() (open int, waiting int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.list {
		st, n, _ := w.line.snapshot()
		if st != circuitClosed {
			open++
		}
		waiting += n
	}
	return open, waiting
}

// deliver makes up to opts.attempts attempts (3), retryDelay times the
// attempt number apart (1 s, then 2 s).
func (h *Webhooks) deliver(d *delivery) deliveryResult {
	w := d.w
	h.mu.Lock()
	live := w.Enabled
	h.mu.Unlock()
	if !live {
		return deliverySkipped // disabled or removed since the event
	}
	event := webhookEventName(d.kind)
	body := d.body(event)
	sig := ""
	if w.Secret != "" {
		mac := hmac.New(sha256.New, []byte(w.Secret))
		mac.Write(body)
		sig = hex.EncodeToString(mac.Sum(nil))
	}
	var err error
	for attempt := 0; attempt < h.opts.attempts; attempt++ {
		if attempt > 0 && !h.sleep(h.opts.retryDelay*time.Duration(attempt)) {
			return deliverySkipped
		}
		if err = h.post(w.URL, event, d.at, body, sig); err == nil {
			h.mu.Lock()
			w.success++
			w.lastTriggered = time.Now().UnixMilli()
			h.mu.Unlock()
			h.delivered.Add(1)
			h.announce(newNote("webhook:fired").str("webhookId", w.ID).str("url", w.URL).str("event", event))
			return deliveryDone
		}
		if h.ctx.Err() != nil {
			return deliverySkipped // shutting down: not the receiver's failure
		}
	}
	h.mu.Lock()
	w.failure++
	h.mu.Unlock()
	h.failed.Add(1)
	h.log.Warn("webhook delivery failed", "webhook", w.ID, "receiver", logURL(w.URL), "event", event,
		"attempts", h.opts.attempts, "err", err)
	h.announce(newNote("webhook:failed").str("webhookId", w.ID).str("url", w.URL).str("event", event).
		str("error", err.Error()))
	return deliveryFailedAll
}

// announce tells the live streams of a delivery (no broker in the unit
// tests that make webhooks alone).
func (h *Webhooks) announce(n *note) {
	if h.b != nil {
		h.b.announce(n)
	}
}

func (h *Webhooks) post(target, event string, at int64, body []byte, sig string) error {
	ctx, cancel := context.WithTimeout(h.ctx, h.opts.attemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Webhook-Event", event)
	req.Header.Set("X-Webhook-Timestamp", strconv.FormatInt(at, 10))
	if sig != "" {
		req.Header.Set("X-Webhook-Signature", sig)
	}
	req.Header.Set("User-Agent", "queued/"+version)
	resp, err := h.client.Do(req)
	if err != nil {
		return err
	}
	// Drain a little so the connection can be reused; the body is not
	// needed.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("receiver answered HTTP %d", resp.StatusCode)
	}
	return nil
}

// body renders the reference's payload: event, timestamp, jobId, queue,
// then the event's own fields; absent (undefined) values are left out.
func (d *delivery) body(event string) []byte {
	b := make([]byte, 0, 128+len(d.data))
	b = append(b, `{"event":`...)
	b = appendJSONString(b, []byte(event))
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, d.at, 10)
	b = append(b, `,"jobId":`...)
	b = appendJSONString(b, []byte(d.jobID))
	b = append(b, `,"queue":`...)
	b = appendJSONString(b, []byte(d.queue))
	raw := func(key string, r Raw) {
		if r == nil || isUndefined(r) {
			return
		}
		b = append(b, ',', '"')
		b = append(b, key...)
		b = append(b, '"', ':')
		var err error
		if b, err = appendJSON(b, r); err != nil {
			b = append(b, "null"...)
		}
	}
	switch d.kind {
	case evCompleted:
		raw("data", d.data)
	case evFailed:
		raw("data", d.data)
		if d.hasErr {
			b = append(b, `,"error":`...)
			b = appendJSONString(b, []byte(d.err))
		}
	case evProgress:
		raw("progress", d.progress)
	}
	return append(b, '}')
}
