package main

// Webhooks: AddWebhook, RemoveWebhook, ListWebhooks, SetWebhookEnabled, and
// delivery of job events to the registered URLs.
//
// Delivery leaves the hot path at once. A broker tap, running under the
// emitting shard's lock, matches the event against a copy-on-write list of
// the enabled webhooks and puts one delivery per match on a bounded queue;
// a few sender goroutines do the HTTP. When the queue is full (receivers
// slower than the event rate) deliveries are dropped and counted, never
// waited for.
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
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
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

	webhookQueueLen     = 4096     // deliveries waiting for a sender
	webhookQueueBytes   = 64 << 20 // payload bytes they may hold
	webhookSenders      = 4
	webhookDropLogEvery = 10 * time.Second
)

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

// webhookOptions configure the registry.
type webhookOptions struct {
	allowPrivate bool         // skip both address checks
	store        webhookStore // nil in memory mode
	log          *slog.Logger
	lookup       lookupFunc    // nil: the system resolver
	queueLen     int           // 0: webhookQueueLen (tests make it small)
	retryDelay   time.Duration // 0: webhookRetryDelay
}

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

// Webhooks is the registry and its delivery machinery.
type Webhooks struct {
	opts   webhookOptions
	log    *slog.Logger
	client *http.Client
	tr     *http.Transport

	wmu    sync.Mutex // serialises changes, so storage and memory agree
	mu     sync.Mutex // guards the list, Enabled and the delivery figures
	list   []*Webhook // registration order
	active atomic.Pointer[[]*Webhook]

	queue      chan delivery
	queueBytes atomic.Int64
	dropped    atomic.Int64
	delivered  atomic.Int64 // deliveries that got a 2xx
	failed     atomic.Int64 // deliveries that used every attempt
	dropMu     sync.Mutex
	dropLogged int64
	dropLogAt  time.Time

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
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
	if opts.queueLen <= 0 {
		opts.queueLen = webhookQueueLen
	}
	if opts.retryDelay <= 0 {
		opts.retryDelay = webhookRetryDelay
	}
	h := &Webhooks{opts: opts, log: opts.log, queue: make(chan delivery, opts.queueLen)}
	if opts.store != nil {
		list, err := opts.store.LoadWebhooks()
		if err != nil {
			return nil, fmt.Errorf("load webhooks: %w", err)
		}
		for _, w := range list {
			w.mask = eventMask(w.Events)
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
		TLSHandshakeTimeout:   webhookTimeout,
		ResponseHeaderTimeout: webhookTimeout,
	}
	h.client = &http.Client{
		Transport: h.tr,
		// A receiver answers; it does not send the request elsewhere. A
		// redirect counts as a failed attempt.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	for i := 0; i < webhookSenders; i++ {
		h.wg.Add(1)
		go h.sender()
	}
	b.addTap(h.tap)
	return h, nil
}

// Close stops the senders, abandoning deliveries still queued, and waits
// for them. It is safe to call more than once.
func (h *Webhooks) Close() {
	h.closeOnce.Do(func() {
		h.cancel()
		h.wg.Wait()
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
// The tap and the senders

func (h *Webhooks) tap(ev *Event) {
	bit := webhookEventBit(ev.Type)
	if bit == 0 {
		return
	}
	on := *h.active.Load()
	if len(on) == 0 {
		return
	}
	d := delivery{kind: ev.Type, queue: ev.Queue, jobID: ev.JobID, at: ev.At}
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
	d.size = int64(len(d.data) + len(d.progress) + len(d.err) + len(d.jobID) + 256)
	for _, w := range on {
		if w.mask&bit == 0 || (w.Queue != "" && w.Queue != ev.Queue) {
			continue
		}
		d.w = w
		if h.queueBytes.Add(d.size) > webhookQueueBytes {
			h.queueBytes.Add(-d.size)
			h.dropped.Add(1)
			continue
		}
		select {
		case h.queue <- d:
		default:
			h.queueBytes.Add(-d.size)
			h.dropped.Add(1)
		}
	}
}

func (h *Webhooks) sender() {
	defer h.wg.Done()
	for {
		select {
		case <-h.ctx.Done():
			return
		case d := <-h.queue:
			h.queueBytes.Add(-d.size)
			h.deliver(&d)
			h.reportDrops()
		}
	}
}

// reportDrops logs dropped deliveries now and then; the tap cannot log, it
// runs under a shard lock.
func (h *Webhooks) reportDrops() {
	n := h.dropped.Load()
	h.dropMu.Lock()
	defer h.dropMu.Unlock()
	if n == h.dropLogged || time.Since(h.dropLogAt) < webhookDropLogEvery {
		return
	}
	h.log.Warn("webhook deliveries dropped: receivers are slower than the event rate",
		"dropped", n-h.dropLogged, "dropped_total", n)
	h.dropLogged, h.dropLogAt = n, time.Now()
}

// deliver makes up to webhookAttempts attempts, 1 s then 2 s apart.
func (h *Webhooks) deliver(d *delivery) {
	w := d.w
	h.mu.Lock()
	live := w.Enabled
	h.mu.Unlock()
	if !live {
		return // disabled or removed since the event
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
	for attempt := 0; attempt < webhookAttempts; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(h.opts.retryDelay * time.Duration(attempt))
			select {
			case <-h.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if err = h.post(w.URL, event, d.at, body, sig); err == nil {
			h.mu.Lock()
			w.success++
			w.lastTriggered = time.Now().UnixMilli()
			h.mu.Unlock()
			h.delivered.Add(1)
			return
		}
		if h.ctx.Err() != nil {
			return // shutting down: not the receiver's failure
		}
	}
	h.mu.Lock()
	w.failure++
	h.mu.Unlock()
	h.failed.Add(1)
	h.log.Warn("webhook delivery failed", "webhook", w.ID, "url", redactURL(w.URL), "event", event, "attempts", webhookAttempts, "err", err)
}

func (h *Webhooks) post(target, event string, at int64, body []byte, sig string) error {
	ctx, cancel := context.WithTimeout(h.ctx, webhookTimeout)
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

// ---------------------------------------------------------------------------
// Registry changes

var errWebhookNotFound = errors.New("Webhook not found")

// errInternal is what the reference answers for a storage failure; the
// cause is logged.
var errInternal = errors.New("Internal server error")

func (h *Webhooks) add(w *Webhook) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
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
	w.Enabled = false // deliveries already queued for it are skipped
	h.list = append(h.list[:at:at], h.list[at+1:]...)
	h.mu.Unlock()
	h.publish()
	return nil
}

func (h *Webhooks) setEnabled(id string, on bool) error {
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
		return errWebhookNotFound
	}
	same := w.Enabled == on
	def := *w
	h.mu.Unlock()
	if same {
		return nil
	}
	if h.opts.store != nil {
		def.Enabled = on
		if err := h.opts.store.SaveWebhook(&def); err != nil {
			h.log.Error("webhook not saved", "webhook", id, "err", err)
			return errInternal
		}
	}
	h.mu.Lock()
	w.Enabled = on
	h.mu.Unlock()
	h.publish()
	return nil
}

// ---------------------------------------------------------------------------
// Commands

func (r *Req) webhooks() (*Webhooks, error) {
	if h := r.c.srv.hooks; h != nil {
		return h, nil
	}
	return nil, errors.New("webhooks are not available on this server")
}

func cmdAddWebhook(r *Req) error {
	h, err := r.webhooks()
	if err != nil {
		return err
	}
	rawURL := r.m.Get("url")
	if rawURL.IsNil() {
		return errors.New("Webhook URL is required")
	}
	target, err := rawURL.Str()
	if err != nil {
		return errors.New("Invalid URL format")
	}
	if err := checkWebhookURL(target, h.opts.allowPrivate); err != nil {
		return err
	}
	items, ok, err := r.m.Array("events")
	if err != nil || !ok {
		return errors.New("events must be an array of event names")
	}
	events := make([]string, len(items))
	var bad []string
	for i, it := range items {
		s, err := it.Str()
		if err != nil {
			v, _ := Decode(it)
			s = jsString(v)
		}
		events[i] = s
		if eventMask([]string{s}) == 0 || err != nil {
			bad = append(bad, s)
		}
	}
	if len(bad) > 0 {
		return errors.New("Invalid webhook event(s): " + strings.Join(bad, ", ") + ". Valid: " + strings.Join(webhookEvents[:], ", "))
	}
	queue, _, err := r.m.Str("queue")
	if err != nil {
		return err
	}
	secret, _, err := r.m.Str("secret")
	if err != nil {
		return err
	}
	w := &Webhook{ID: newID(), URL: target, Events: events, Queue: queue, Secret: secret,
		CreatedAt: r.b.now(), Enabled: true, mask: eventMask(events)}
	if err := h.add(w); err != nil {
		return err
	}
	e := r.field("data")
	e.MapHead(5)
	e.Str("webhookId")
	e.Str(w.ID)
	e.Str("url")
	e.Str(w.URL)
	e.Str("events")
	strArray(e, w.Events)
	e.Str("queue")
	optStr(e, w.Queue, w.Queue != "")
	e.Str("createdAt")
	e.Int(w.CreatedAt)
	return nil
}

func cmdRemoveWebhook(r *Req) error {
	h, err := r.webhooks()
	if err != nil {
		return err
	}
	id, _, err := r.m.Str("webhookId")
	if err != nil {
		return err
	}
	if err := h.remove(id); err != nil {
		return err
	}
	e := r.field("data")
	e.MapHead(1)
	e.Str("removed")
	e.Bool(true)
	return nil
}

func cmdListWebhooks(r *Req) error {
	h, err := r.webhooks()
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e := r.field("data")
	e.MapHead(2)
	e.Str("webhooks")
	e.ArrayHead(len(h.list))
	enabled := 0
	for _, w := range h.list {
		e.MapHead(9)
		e.Str("id")
		e.Str(w.ID)
		e.Str("url")
		e.Str(w.URL)
		e.Str("events")
		strArray(e, w.Events)
		e.Str("queue")
		optStr(e, w.Queue, w.Queue != "")
		e.Str("createdAt")
		e.Int(w.CreatedAt)
		e.Str("lastTriggered")
		if w.lastTriggered != 0 {
			e.Int(w.lastTriggered)
		} else {
			e.Nil()
		}
		e.Str("successCount")
		e.Int(w.success)
		e.Str("failureCount")
		e.Int(w.failure)
		e.Str("enabled")
		e.Bool(w.Enabled)
		if w.Enabled {
			enabled++
		}
	}
	e.Str("stats")
	e.MapHead(2)
	e.Str("total")
	e.Int(int64(len(h.list)))
	e.Str("enabled")
	e.Int(int64(enabled))
	return nil
}

func cmdSetWebhookEnabled(r *Req) error {
	h, err := r.webhooks()
	if err != nil {
		return err
	}
	id, _, err := r.m.Str("id")
	if err != nil {
		return err
	}
	if err := h.setEnabled(id, truthy(r.m, "enabled")); err != nil {
		return err
	}
	return r.okID()
}
