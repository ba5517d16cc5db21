package main

// Webhooks: AddWebhook, RemoveWebhook, ListWebhooks, SetWebhookEnabled, and
// delivery of job events to the registered URLs.
//
// Delivery leaves the hot path at once. A broker tap, running in the
// emitter's path (in memory mode under its shard's lock), matches the event against a copy-on-write list of
// the enabled webhooks and puts one delivery per match on that webhook's
// own bounded backlog, served by that webhook's own senders, so that a
// slow or dead receiver delays nobody else (webhook_delivery.go). When a
// backlog is full deliveries are dropped and counted, never waited for.
//
// A webhook URL is a way to make the server send requests, so it is
// checked twice: when it is registered, with the reference's rules (which
// look at the URL's host as written, with WHATWG's reading of numeric IPv4
// forms such as 127.1 or 2130706433), and again on every connection, on
// the address the name actually resolved to. The second check is what
// stops DNS rebinding (a name that resolved to a public address when
// registered and to 127.0.0.1 when used) and names that merely point
// inside. --webhook-allow-private turns both off, for receivers on the
// operator's own network.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Delivery parameters, as the reference has them.
const (
	maxWebhookURL     = 2048
	webhookTimeout    = 10 * time.Second // per attempt
	webhookAttempts   = 3
	webhookRetryDelay = time.Second // times the attempt number: 1 s, then 2 s
)

// Limits the reference does not have: a webhook costs a backlog and a
// sender, and its fields are stored and echoed, so both the number and
// the sizes are bounded, far above what a real setup uses.
const (
	maxWebhooks        = 1000
	maxWebhookSecret   = 1024 // bytes
	maxWebhookEvents   = 64   // entries of the events list (5 names exist)
	maxWebhookEchoName = 100  // bytes of a refused event name quoted back
)

var errTooManyWebhooks = fmt.Errorf("webhooks are limited to %d per server; remove one before adding another", maxWebhooks)

// webhookEvents are the names a webhook may subscribe to; the index is the
// event's bit in a webhook's mask.
var webhookEvents = [...]string{"job.pushed", "job.started", "job.completed", "job.failed", "job.progress"}

// webhookEventBit maps a broker event to its webhook event bit (0: none).
func webhookEventBit(t evType) uint8 {
	switch t {
	case evPushed:
		return 1 << 0
	case evPulled:
		return 1 << 1
	case evCompleted:
		return 1 << 2
	case evFailed:
		return 1 << 3
	case evProgress:
		return 1 << 4
	}
	return 0
}

func webhookEventName(t evType) string {
	bit := webhookEventBit(t)
	for i := range webhookEvents {
		if bit == 1<<i {
			return webhookEvents[i]
		}
	}
	return ""
}

// Webhook is one registered receiver. The definition fields never change
// after registration except Enabled; the tap reads only Queue and mask.
type Webhook struct {
	ID        string
	URL       string
	Events    []string
	Queue     string // "" matches every queue
	Secret    string // "" sends no signature
	CreatedAt int64
	Enabled   bool // guarded by Webhooks.mu

	mask uint8

	// Delivery figures, in memory only; guarded by Webhooks.mu.
	lastTriggered    int64
	success, failure int64

	line *hookLine // its backlog, senders and circuit
}

// webhookStore is the persistence the registry needs; the SQLite store
// provides it, and memory mode has none.
type webhookStore interface {
	SaveWebhook(w *Webhook) error
	DeleteWebhook(id string) error
	LoadWebhooks() ([]*Webhook, error)
}

// lookupFunc resolves a host name to addresses.
type lookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

// webhookOptions configure the registry. Zero values take the defaults;
// tests make them small.
type webhookOptions struct {
	allowPrivate bool         // skip both address checks
	store        webhookStore // nil in memory mode
	log          *slog.Logger
	lookup       lookupFunc // nil: the system resolver

	attempts       int           // deliveries of an event (webhookAttempts)
	queueLen       int           // one webhook's backlog (webhookBacklogLen)
	retryDelay     time.Duration // webhookRetryDelay
	attemptTimeout time.Duration // webhookTimeout
	breakAfter     int           // webhookBreakAfter
	openFor        time.Duration // webhookOpenFor
	openMax        time.Duration // webhookOpenMax
	closeWait      time.Duration // webhookCloseWait
	dropLogEvery   time.Duration // webhookDropLogEvery
}

// Webhooks is the registry and its delivery machinery.
type Webhooks struct {
	opts   webhookOptions
	log    *slog.Logger
	b      *Broker // announces webhook:fired and webhook:failed
	client *http.Client
	tr     *http.Transport

	wmu    sync.Mutex // serialises changes, so storage and memory agree
	mu     sync.Mutex // guards the list, Enabled and the delivery figures
	list   []*Webhook // registration order
	active atomic.Pointer[[]*Webhook]

	held      atomic.Int64  // payload bytes in all backlogs
	shared    chan struct{} // senders beyond each webhook's first
	dropped   atomic.Int64  // deliveries refused by a full backlog
	delivered atomic.Int64  // deliveries that got a 2xx
	failed    atomic.Int64  // deliveries that used every attempt

	ctx       context.Context
	cancel    context.CancelFunc
	life      sync.RWMutex // closed, and starting senders against Close
	closed    bool
	wg        sync.WaitGroup // senders and the drop reporter
	closeOnce sync.Once
}

// newWebhooks loads the stored webhooks, registers the delivery tap on b
// and starts the senders; Close stops them.
func newWebhooks(b *Broker, opts webhookOptions) (*Webhooks, error) {
	if opts.log == nil {
		opts.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.lookup == nil {
		opts.lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&opts.retryDelay, webhookRetryDelay)
	def(&opts.attemptTimeout, webhookTimeout)
	def(&opts.openFor, webhookOpenFor)
	def(&opts.openMax, webhookOpenMax)
	def(&opts.closeWait, webhookCloseWait)
	def(&opts.dropLogEvery, webhookDropLogEvery)
	if opts.queueLen <= 0 {
		opts.queueLen = webhookBacklogLen
	}
	if opts.attempts <= 0 {
		opts.attempts = webhookAttempts
	}
	if opts.breakAfter <= 0 {
		opts.breakAfter = webhookBreakAfter
	}
	h := &Webhooks{opts: opts, log: opts.log, shared: make(chan struct{}, webhookSharedSenders), b: b}
	if opts.store != nil {
		list, err := opts.store.LoadWebhooks()
		if err != nil {
			return nil, fmt.Errorf("load webhooks: %w", err)
		}
		for _, w := range list {
			w.mask = eventMask(w.Events)
			w.line = &hookLine{}
		}
		h.list = list
	}
	h.publish()
	h.tr = &http.Transport{
		// No proxy: the dial check must see the receiver's own address,
		// not a proxy's, or it would check nothing.
		Proxy:                 nil,
		DialContext:           h.dialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          32,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   opts.attemptTimeout,
		ResponseHeaderTimeout: opts.attemptTimeout,
	}
	h.client = &http.Client{
		Transport: h.tr,
		// A receiver answers; it does not send the request elsewhere. A
		// redirect counts as a failed attempt.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.wg.Go(h.dropReporter)
	b.addTap(h.tap)
	return h, nil
}

// Close stops the senders, abandoning deliveries still waiting and
// cancelling those in flight, and waits for them, for closeWait at most:
// a request is cancelled at once by its context, so the wait only guards
// against what should not happen. It is safe to call more than once.
func (h *Webhooks) Close() {
	h.closeOnce.Do(func() {
		h.life.Lock()
		h.closed = true // no sender starts after this
		h.life.Unlock()
		h.cancel()
		done := make(chan struct{})
		go func() {
			h.wg.Wait()
			close(done)
		}()
		t := time.NewTimer(h.opts.closeWait)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			h.log.Warn("webhook senders still running at shutdown; not waiting for them", "waited", h.opts.closeWait)
		}
		h.tr.CloseIdleConnections()
	})
}

func eventMask(events []string) uint8 {
	var m uint8
	for _, e := range events {
		for i, name := range webhookEvents {
			if e == name {
				m |= 1 << i
			}
		}
	}
	return m
}

// publish rebuilds the tap's list of enabled webhooks.
func (h *Webhooks) publish() {
	h.mu.Lock()
	on := make([]*Webhook, 0, len(h.list))
	for _, w := range h.list {
		if w.Enabled && w.mask != 0 {
			on = append(on, w)
		}
	}
	h.mu.Unlock()
	h.active.Store(&on)
}

// counts reports how many webhooks there are and how many are enabled.
func (h *Webhooks) counts() (total, enabled int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.list {
		if w.Enabled {
			enabled++
		}
	}
	return len(h.list), enabled
}

// ---------------------------------------------------------------------------
// Registry changes

var errWebhookNotFound = errors.New("Webhook not found")

// errInternal is what the reference answers for a storage failure; the
// cause is logged.
var errInternal = errors.New("Internal server error")

func (h *Webhooks) add(w *Webhook) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	h.mu.Lock()
	n := len(h.list)
	h.mu.Unlock()
	if n >= maxWebhooks {
		return errTooManyWebhooks
	}
	w.line = &hookLine{}
	if h.opts.store != nil {
		if err := h.opts.store.SaveWebhook(w); err != nil {
			h.log.Error("webhook not saved", "webhook", w.ID, "err", err)
			return errInternal
		}
	}
	h.mu.Lock()
	h.list = append(h.list, w)
	h.mu.Unlock()
	h.publish()
	return nil
}

func (h *Webhooks) remove(id string) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	h.mu.Lock()
	at := -1
	for i, w := range h.list {
		if w.ID == id {
			at = i
		}
	}
	h.mu.Unlock()
	if at < 0 {
		return errWebhookNotFound
	}
	if h.opts.store != nil {
		if err := h.opts.store.DeleteWebhook(id); err != nil {
			h.log.Error("webhook not deleted", "webhook", id, "err", err)
			return errInternal
		}
	}
	h.mu.Lock()
	w := h.list[at]
	w.Enabled = false // deliveries in flight for it are skipped
	h.list = append(h.list[:at:at], h.list[at+1:]...)
	h.mu.Unlock()
	h.publish()
	w.line.mu.Lock()
	w.line.resetLocked(h, true) // and those waiting dropped
	w.line.mu.Unlock()
	return nil
}

func (h *Webhooks) setEnabled(id string, on bool) (changed bool, err error) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	h.mu.Lock()
	var w *Webhook
	for _, x := range h.list {
		if x.ID == id {
			w = x
		}
	}
	if w == nil {
		h.mu.Unlock()
		return false, errWebhookNotFound
	}
	same := w.Enabled == on
	def := *w
	h.mu.Unlock()
	if same {
		return false, nil
	}
	if h.opts.store != nil {
		def.Enabled = on
		if err := h.opts.store.SaveWebhook(&def); err != nil {
			h.log.Error("webhook not saved", "webhook", id, "err", err)
			return false, errInternal
		}
	}
	h.mu.Lock()
	w.Enabled = on
	h.mu.Unlock()
	h.publish()
	// Disabled: what waits is dropped. Enabled again: a fresh start,
	// circuit closed, as the operator asks for.
	w.line.mu.Lock()
	w.line.resetLocked(h, !on)
	w.line.mu.Unlock()
	return true, nil
}

// webhookView is a webhook as ListWebhooks shows it, copied under the
// registry's lock with its delivery line's state.
type webhookView struct {
	Webhook
	circuit circuitState
	pending int
	dropped int64
}

// snapshot copies the registry for a listing.
func (h *Webhooks) snapshot() []webhookView {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]webhookView, len(h.list))
	for i, w := range h.list {
		st, pending, dropped := w.line.snapshot()
		out[i] = webhookView{Webhook: *w, circuit: st, pending: pending, dropped: dropped}
	}
	return out
}
