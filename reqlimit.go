package main

// The per-client request limiter, as the reference's RATE_LIMIT_MAX_REQUESTS
// and RATE_LIMIT_WINDOW_MS (rateLimiter.js): a client that sends more than
// max requests within window is refused until it slows down. A TCP client
// is its connection; an HTTP client is the address a proxy names
// (X-Forwarded-For's first, X-Real-IP), else the peer's IP. A refusal
// answers "Rate limit exceeded" (HTTP 429) and announces ratelimit:hit.
// Off unless RATE_LIMIT_MAX_REQUESTS is set: the reference's default,
// 10,000 a minute per client, throttles an ordinary pipelining worker.
//
// The reference keeps every request's time in the window; this counts
// requests per window, in two windows, the previous one weighed by how
// much of it the sliding window still covers: the same limit within a
// few percent, in 32 bytes a client whatever its rate. Clients are
// bounded: past maxLimitClients, the idle are forgotten, and if none is,
// new ones share one count.

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// maxLimitClients bounds the clients the limiter counts at once.
const maxLimitClients = 100000

type reqLimiter struct {
	max    float64
	window int64 // ms
	now    func() int64

	mu      sync.Mutex
	clients map[string]*reqWindow
	swept   int64
}

// reqWindow is one client's count: n in the window that began at start,
// prev in the one before.
type reqWindow struct {
	start   int64
	n, prev float64
}

func newReqLimiter(limit int, window time.Duration, now func() int64) *reqLimiter {
	if limit <= 0 {
		return nil
	}
	w := max(window.Milliseconds(), 1)
	return &reqLimiter{max: float64(limit), window: w, now: now, clients: map[string]*reqWindow{}}
}

// allow counts a request of client and says whether it is within the
// limit; a nil limiter allows everything.
func (l *reqLimiter) allow(client string) bool {
	if l == nil {
		return true
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.clients[client]
	if w == nil {
		if len(l.clients) >= maxLimitClients {
			l.sweep(now)
		}
		if len(l.clients) >= maxLimitClients {
			client = "" // the overflow share one count
			w = l.clients[client]
		}
		if w == nil {
			w = &reqWindow{start: now - now%l.window}
			l.clients[client] = w
		}
	}
	w.roll(now, l.window)
	// The part of the previous window the sliding window still covers.
	cover := float64(l.window-(now-w.start)) / float64(l.window)
	if w.n+w.prev*cover >= l.max {
		return false
	}
	w.n++
	return true
}

// roll moves w to the window now falls in.
func (w *reqWindow) roll(now, window int64) {
	start := now - now%window
	switch {
	case start == w.start:
	case start-w.start == window:
		w.prev, w.n, w.start = w.n, 0, start
	default:
		w.prev, w.n, w.start = 0, 0, start
	}
}

// sweep forgets the clients idle for two windows; l.mu is held.
func (l *reqLimiter) sweep(now int64) {
	if now-l.swept < l.window/4 {
		return
	}
	l.swept = now
	for k, w := range l.clients {
		if now-w.start >= 2*l.window {
			delete(l.clients, k)
		}
	}
}

// forget drops a client that is gone (a closed connection).
func (l *reqLimiter) forget(client string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	delete(l.clients, client)
	l.mu.Unlock()
}

// maxClientKey bounds a client's name as the limiter keeps it: a header
// names it, and the limiter keeps up to maxLimitClients of them.
const maxClientKey = 64

// httpClient names an HTTP request's client as the limiter counts it.
func httpClient(r *http.Request) string {
	if f := r.Header.Get("X-Forwarded-For"); f != "" {
		first, _, _ := strings.Cut(f, ",")
		first = strings.TrimSpace(first)
		return first[:min(len(first), maxClientKey)]
	}
	if ip := r.Header.Get("X-Real-IP"); ip != "" {
		return ip[:min(len(ip), maxClientKey)]
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// limitExempt are the HTTP paths the limiter leaves alone, as the
// reference does: probes and the debug routes.
var limitExempt = map[string]bool{"health": true, "healthz": true, "live": true, "ready": true, "gc": true, "heapstats": true}
