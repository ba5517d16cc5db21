package main

// HTTP handlers: a queue whose jobs the server works itself, by calling a
// URL with each (the MCP tools bunqueue_register_handler and friends).
// The reference runs such a handler as a worker inside its MCP process,
// so it ends with the agent; here it is the server's, kept in the data
// file (SQLite mode) or the namespace (PostgreSQL mode) and started again
// after a restart. In PostgreSQL mode every broker of the namespace runs
// the namespace's handlers: it follows the table (handlerSync), so a
// handler registered through one broker is run by all of them, each
// pulling its jobs as one more worker.
//
// A handler is a worker like any other: it pulls through the command
// table (a virtual connection), with a lock token and a lease, so a
// handler cut off by a crash leaves its job to the lease reaper, and a
// graceful stop's drain hands it no more jobs. Its calls go through the
// webhook address guard (no loopback, private or link-local receivers
// unless --webhook-allow-private), one at a time per queue on a server
// (so one per broker, in PostgreSQL mode), each within
// its timeout, and their answers are read up to maxHandlerAnswer.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Bounds on handlers.
const (
	maxHandlers           = 100     // handlers on a server
	maxHandlerHeaders     = 32      // custom headers of one handler
	maxHandlerHeaderBytes = 8 << 10 // a header's name and value together
	maxHandlerBody        = 64 << 10
	maxHandlerAnswer      = 1 << 20 // what is read of a receiver's answer
	defaultHandlerTimeout = 30 * time.Second
	minHandlerTimeout     = time.Second
	maxHandlerTimeout     = 120 * time.Second
	// handlerPoll is how long a handler's pull waits for a job before it
	// asks again.
	handlerPoll = 5 * time.Second
	// handlerSync is how often a broker looks whether another broker of a
	// shared store changed the handlers: a look is one small query.
	handlerSync = 2 * time.Second
)

// HandlerSpec is a handler as registered.
type HandlerSpec struct {
	Queue     string          `json:"queue"`
	URL       string          `json:"url"`
	Method    string          `json:"method"`
	Headers   [][2]string     `json:"headers,omitempty"`
	Body      json.RawMessage `json:"body,omitempty"` // nil: each job's data
	TimeoutMs int64           `json:"timeoutMs,omitempty"`
}

// size bounds the bytes the handler takes in an answer.
func (h *HandlerSpec) size() int64 {
	n := len(h.Queue) + len(h.URL) + len(h.Method) + 3*len(h.Body) + 64
	for _, kv := range h.Headers {
		n += len(kv[0]) + len(kv[1]) + 10
	}
	return int64(n)
}

func (h *HandlerSpec) timeout() time.Duration {
	if h.TimeoutMs <= 0 {
		return defaultHandlerTimeout
	}
	return time.Duration(h.TimeoutMs) * time.Millisecond
}

// handlerStore keeps handlers across restarts: the SQLite store, the
// PostgreSQL namespace; none in memory mode. SaveHandler refuses a new
// handler past maxHandlers; DeleteHandler answers whether there was one.
type handlerStore interface {
	SaveHandler(h *HandlerSpec) error
	DeleteHandler(queue string) (bool, error)
	LoadHandlers(ctx context.Context) ([]*HandlerSpec, error)
}

// sharedHandlerStore is a store other brokers write too (PostgreSQL
// mode). HandlersVersion changes whenever the stored handlers do; the
// broker reads them again then.
type sharedHandlerStore interface {
	handlerStore
	HandlersVersion(ctx context.Context) (string, error)
}

// Handlers runs the registered handlers.
type Handlers struct {
	send         mcpSend // a command through the server's table
	client       *http.Client
	store        handlerStore
	log          *slog.Logger
	allowPrivate bool

	// changing is held through a Set or Remove, from the count check to
	// the start, so that concurrent ones cannot pass maxHandlers.
	changing sync.Mutex
	mu       sync.Mutex
	running  map[string]*handlerRun
	order    []string // queues in registration order
	closed   bool
	skipped  map[string]bool // stored handlers not run here, warned of once

	// Following a shared store (h.changing held): the version adopted,
	// and whether the last look failed.
	seen    string
	failing bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// handlerRun is one handler's worker.
type handlerRun struct {
	spec   HandlerSpec
	cancel context.CancelFunc
	done   chan struct{}
}

// newHandlers loads the stored handlers and starts them. dial is the
// webhook guard's dialer.
func newHandlers(send mcpSend, dial func(ctx context.Context, network, addr string) (net.Conn, error),
	store handlerStore, allowPrivate bool, log *slog.Logger) (*Handlers, error) {
	tr := &http.Transport{
		Proxy:               nil, // the guard must see the receiver's own address
		DialContext:         dial,
		MaxIdleConns:        16,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
	}
	h := &Handlers{send: send, store: store, log: log, allowPrivate: allowPrivate, running: map[string]*handlerRun{},
		client: &http.Client{Transport: tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	if store == nil {
		return h, nil
	}
	if shared, ok := store.(sharedHandlerStore); ok {
		// The first look, at once, loads them: a database that cannot be
		// read now is read at a later look.
		h.changing.Lock()
		h.look(shared, "")
		h.changing.Unlock()
		h.wg.Go(func() { h.follow(shared) })
		return h, nil
	}
	list, err := store.LoadHandlers(h.ctx)
	if err != nil {
		return nil, fmt.Errorf("load handlers: %w", err)
	}
	h.adopt(list)
	return h, nil
}

// follow keeps the running handlers those of a shared store, until
// Close, looking at each handlerSync.
func (h *Handlers) follow(store sharedHandlerStore) {
	tick := time.NewTicker(handlerSync)
	defer tick.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-tick.C:
		}
		h.changing.Lock()
		h.look(store, h.seen)
		h.changing.Unlock()
	}
}

// look reads the store's version and, when it is not seen, the handlers,
// and adopts them. h.changing is held through it, so that a Set or Remove
// answered meanwhile is not undone by a list read before it. A store that
// cannot be read is tried again at the next look; the handlers run on.
func (h *Handlers) look(store sharedHandlerStore, seen string) {
	v, err := store.HandlersVersion(h.ctx)
	var list []*HandlerSpec
	if err == nil && v != seen {
		list, err = store.LoadHandlers(h.ctx)
	}
	if err != nil {
		if !h.failing && h.ctx.Err() == nil {
			h.log.Warn("handlers: cannot read the shared handlers; trying again", "every", handlerSync.String(), "err", err)
		}
		h.failing = true
		return
	}
	h.failing = false
	if v != seen {
		h.adopt(list)
		h.seen = v
	}
}

// sameHandler reports two specs alike as stored: a body's spacing, which
// the store does not keep, is no change (a restart would cancel the call
// in flight).
func sameHandler(a, b *HandlerSpec) bool {
	x, errA := json.Marshal(a)
	y, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(x, y)
}

// adopt makes the running handlers those of list, in its order: it stops
// those not in it, restarts those whose spec changed, starts the new. A
// handler this server could not call (a private address registered
// through a broker allowed them, this one not) is left out with a
// warning: run here, each of its jobs would fail an attempt. h.changing
// is held, or the Handlers not yet shared.
func (h *Handlers) adopt(stored []*HandlerSpec) {
	want := make(map[string]*HandlerSpec, len(stored))
	list := stored[:0:0]
	for _, s := range stored {
		if err := h.checkHandler(s); err != nil {
			h.warnSkipped(s.Queue, err)
			continue
		}
		want[s.Queue] = s
		list = append(list, s)
	}
	h.mu.Lock()
	var gone, changed []string
	for q, r := range h.running {
		if s, ok := want[q]; !ok {
			gone = append(gone, q)
		} else if !sameHandler(&r.spec, s) {
			changed = append(changed, q)
		}
	}
	h.mu.Unlock()
	for _, q := range append(gone, changed...) {
		h.stop(q)
	}
	h.mu.Lock()
	var added []HandlerSpec
	for _, s := range list {
		if h.running[s.Queue] == nil {
			added = append(added, *s)
		}
	}
	h.mu.Unlock()
	for _, s := range added {
		h.start(s)
	}
	h.mu.Lock()
	order := make([]string, 0, len(list))
	for _, s := range list {
		if h.running[s.Queue] != nil {
			order = append(order, s.Queue)
		}
	}
	h.order = order
	h.mu.Unlock()
}

// checkHandler refuses a handler that could not be run, naming the limit.
func (h *Handlers) checkHandler(s *HandlerSpec) error {
	if s.Queue == "" {
		return errors.New("queue is required")
	}
	if len(s.Queue) > maxQueueName {
		return fmt.Errorf("queue name is limited to %d bytes", maxQueueName)
	}
	if err := checkWebhookURL(s.URL, h.allowPrivate); err != nil {
		return errors.New(strings.Replace(err.Error(), "Webhook URL", "Handler URL", 1))
	}
	if !slices.Contains([]string{"GET", "POST", "PUT", "DELETE"}, s.Method) {
		return errors.New("method must be GET, POST, PUT or DELETE")
	}
	if len(s.Headers) > maxHandlerHeaders {
		return fmt.Errorf("a handler has at most %d headers (this one has %d)", maxHandlerHeaders, len(s.Headers))
	}
	for _, kv := range s.Headers {
		if len(kv[0])+len(kv[1]) > maxHandlerHeaderBytes {
			return fmt.Errorf("header %.64q is over %d bytes", kv[0], maxHandlerHeaderBytes)
		}
		if !validHeader(kv[0], kv[1]) {
			return fmt.Errorf("header %.64q is not a valid HTTP header", kv[0])
		}
	}
	if len(s.Body) > maxHandlerBody {
		return fmt.Errorf("a handler's body is limited to %d bytes (this one has %d)", maxHandlerBody, len(s.Body))
	}
	if d := s.timeout(); s.TimeoutMs != 0 && (d < minHandlerTimeout || d > maxHandlerTimeout) {
		return fmt.Errorf("timeoutMs must be from %d to %d", minHandlerTimeout.Milliseconds(), maxHandlerTimeout.Milliseconds())
	}
	return nil
}

// validHeader reports a header name of token characters and a value
// without line breaks.
func validHeader(name, value string) bool {
	if name == "" {
		return false
	}
	for _, c := range []byte(name) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return !strings.ContainsAny(value, "\r\n\x00")
}

// Set registers a handler, replacing the queue's: stored first, then
// started.
func (h *Handlers) Set(s HandlerSpec) error {
	if err := h.checkHandler(&s); err != nil {
		return err
	}
	h.changing.Lock()
	defer h.changing.Unlock()
	h.mu.Lock()
	_, replacing := h.running[s.Queue]
	full := !replacing && len(h.running) >= maxHandlers
	h.mu.Unlock()
	if full {
		return fmt.Errorf("a server has at most %d handlers", maxHandlers)
	}
	if h.store != nil {
		if err := h.store.SaveHandler(&s); err != nil {
			return err
		}
	}
	h.stop(s.Queue)
	h.start(s)
	return nil
}

// Remove unregisters a queue's handler; false when it had none. With a
// store, the store says: in PostgreSQL mode the handler may have been
// registered through another broker a moment ago, or removed.
func (h *Handlers) Remove(queue string) (bool, error) {
	h.changing.Lock()
	defer h.changing.Unlock()
	h.mu.Lock()
	_, ok := h.running[queue]
	h.mu.Unlock()
	if h.store != nil {
		stored, err := h.store.DeleteHandler(queue)
		if err != nil {
			return false, err
		}
		ok = stored
	}
	h.stop(queue)
	return ok, nil
}

// warnSkipped says once a queue's stored handler is not run here.
func (h *Handlers) warnSkipped(queue string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.skipped == nil {
		h.skipped = map[string]bool{}
	}
	if !h.skipped[queue] {
		h.skipped[queue] = true
		h.log.Warn("handlers: a stored handler is not run by this server", "queue", queue, "err", err)
	}
}

// handlerState is a handler as listed.
type handlerState struct {
	spec   HandlerSpec
	active bool
}

// List answers the handlers in registration order.
func (h *Handlers) List() []handlerState {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]handlerState, 0, len(h.order))
	for _, q := range h.order {
		if r := h.running[q]; r != nil {
			out = append(out, handlerState{spec: r.spec, active: true})
		}
	}
	return out
}

func (h *Handlers) start(s HandlerSpec) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	ctx, cancel := context.WithCancel(h.ctx)
	r := &handlerRun{spec: s, cancel: cancel, done: make(chan struct{})}
	h.running[s.Queue] = r
	h.order = append(h.order, s.Queue)
	h.wg.Go(func() {
		defer close(r.done)
		h.work(ctx, r)
	})
}

// stop ends a queue's handler and waits for it: a call in flight is
// cancelled, and its job goes back by its lease.
func (h *Handlers) stop(queue string) {
	h.mu.Lock()
	r := h.running[queue]
	delete(h.running, queue)
	if i := slices.Index(h.order, queue); i >= 0 {
		h.order = slices.Delete(h.order, i, i+1)
	}
	h.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
	}
}

// Close stops every handler and waits for them. Nil does nothing.
func (h *Handlers) Close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
	h.client.CloseIdleConnections()
}

// work pulls the queue's jobs one at a time and calls the handler with
// each, until ctx ends.
func (h *Handlers) work(ctx context.Context, r *handlerRun) {
	owner := "handler:" + r.spec.Queue
	lease := r.spec.timeout() + 30*time.Second
	failures := 0
	b := &mcpBackend{send: h.send}
	for ctx.Err() == nil {
		m, err := b.call(ctx, "PULL", "queue", r.spec.Queue, "timeout", float64(handlerPoll.Milliseconds()),
			"owner", owner, "lockTtl", float64(lease.Milliseconds()))
		if err == nil {
			err = refusal(m, "pull refused")
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			h.log.Warn("handler: pull failed", "queue", r.spec.Queue, "err", err)
			pause := time.NewTimer(min(time.Duration(failures)*time.Second, 30*time.Second))
			select {
			case <-pause.C:
			case <-ctx.Done():
				pause.Stop()
				return
			}
			continue
		}
		failures = 0
		if nullish(m.Get("job")) {
			continue
		}
		job, _ := ParseMap(m.Get("job"), nil)
		id := rawString(job.Get("id"))
		token, _, _ := m.Str("token")
		result, callErr := h.call(ctx, &r.spec, job.Get("data"))
		if ctx.Err() != nil {
			return // stopped: the job goes back by its lease
		}
		// The outcome is a worker's step, which the memory budget never
		// refuses (commands.go): the receiver's answer, at most
		// maxHandlerAnswer, is kept as the job's result in the results
		// cache, whose bytes are fitted inside the budget (fitCaches); an
		// error lands in the job's bounded timeline and attempts.
		actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if callErr != nil {
			m, err = b.call(actx, "FAIL", "id", id, "token", token, "error", callErr.Error())
		} else {
			m, err = b.call(actx, "ACK", "id", id, "token", token, "result", json.RawMessage(result))
		}
		cancel()
		if err == nil {
			// A refusal (a lost lock, a result over its limit) is an answer
			// too, and as worth a line in the log.
			err = refusal(m, "outcome refused")
		}
		if err != nil {
			h.log.Warn("handler: job outcome not recorded; its lease will return it", "queue", r.spec.Queue, "job", id, "err", err)
		}
	}
}

// call makes one request for a job whose data is data, and answers
// {status, body} as JSON, or the failure.
func (h *Handlers) call(ctx context.Context, s *HandlerSpec, data Raw) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout())
	defer cancel()
	var body io.Reader
	if s.Method != "GET" && s.Method != "DELETE" {
		payload := []byte(s.Body)
		if payload == nil {
			payload = rawJSON(data)
			if payload == nil {
				payload = []byte("null")
			}
		}
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, s.Method, s.URL, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "queued-handler/"+version)
	for _, kv := range s.Headers {
		req.Header.Set(kv[0], kv[1])
	}
	resp, err := h.client.Do(req)
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return nil, fmt.Errorf("timed out after %v", s.timeout())
		}
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxHandlerAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(raw) > maxHandlerAnswer {
		return nil, fmt.Errorf("HTTP %d: answer over %d bytes", resp.StatusCode, maxHandlerAnswer)
	}
	answer := jsonStr(string(raw))
	if strings.Contains(resp.Header.Get("Content-Type"), "json") {
		if !json.Valid(raw) {
			return nil, fmt.Errorf("HTTP %d: the answer is not the JSON it says it is", resp.StatusCode)
		}
		answer = bytes.TrimSpace(raw)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		text := string(raw)
		if len(text) > 1024 {
			text = text[:1024] + "..."
		}
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, text)
	}
	return newJSONObj().num("status", float64(resp.StatusCode)).json("body", answer).close(), nil
}
