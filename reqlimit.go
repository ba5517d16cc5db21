package main

// The per-client request limiter, as the reference's RATE_LIMIT_MAX_REQUESTS
// and RATE_LIMIT_WINDOW_MS (rateLimiter.js): a client that sends more than
// max requests within window is refused until it slows down. A refusal
// answers "Rate limit exceeded" (HTTP 429) and announces ratelimit:hit.
// Off unless RATE_LIMIT_MAX_REQUESTS is set: the reference's default,
// 10,000 a minute per client, throttles an ordinary pipelining worker.
//
// The reference keeps every request's time in the window; this counts
// requests per window, in two windows, the previous one weighed by how
// much of it the sliding window still covers, in 24 bytes a client
// whatever its rate: the same limit within a few percent for a client
// that sends evenly (one that fills the end of a window can get up to
// twice the limit through across the two).
//
// A limiter must not become a way to refuse other clients, so, unlike
// the reference's:
//
//   - A TCP client is its connection, and its count lives in the
//     connection: nothing another connection sends touches it.
//   - An HTTP client is the address it connects from. X-Forwarded-For or
//     X-Real-IP, which any client can write, is read only from a peer of
//     --trusted-proxies, and only the one --trusted-proxy-header names:
//     a proxy that sets X-Real-IP passes on the X-Forwarded-For its
//     client wrote, so reading both would let that client name itself.
//     X-Forwarded-For is read from the right: the first address that is
//     not itself a trusted proxy is the one the nearest proxy saw (those
//     to its left are what the client wrote).
//   - HTTP clients are counted in two tables, one for requests that carry
//     a valid token (all requests, when the server has no tokens) and one
//     for those that do not, so that requests without a token, however
//     many addresses they come from, never count against a client that
//     holds one.
//   - Each table is bounded: when full, the client seen least recently
//     is forgotten and a new one starts fresh. Forgetting a count only
//     ever lets a client through; no two clients share one.

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// maxLimitClients bounds the HTTP clients each of the limiter's two tables
// counts at once.
const maxLimitClients = 100000

type reqLimiter struct {
	max    float64
	window int64 // ms
	now    func() int64
	// trust names the peers whose forwarding headers name the client.
	trust trustedProxies
	// authed counts the requests with a valid token (or all, without
	// tokens); anon those without. Each has its own lock, so a flood
	// without a token does not even contend with the others.
	authed, anon limitTable
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
	l := &reqLimiter{max: float64(limit), window: w, now: now}
	l.setClients(maxLimitClients)
	return l
}

// setClients bounds each table to n clients (the tests use a small n).
func (l *reqLimiter) setClients(n int) {
	l.authed.init(n)
	l.anon.init(n)
}

// allowConn counts a request of a TCP connection, whose count w is the
// connection's own (only its reader calls this: no lock); a nil limiter
// allows everything.
func (l *reqLimiter) allowConn(w *reqWindow) bool {
	if l == nil {
		return true
	}
	return w.take(l.now(), l.window, l.max)
}

// allowHTTP counts a request from an HTTP client, authed when it carries a
// valid token, and says whether it is within the limit, and who the
// client is.
func (l *reqLimiter) allowHTTP(r *http.Request, authed bool) (client netip.Addr, ok bool) {
	client = l.trust.client(r)
	return client, l.allowAddr(client, authed)
}

// allowAddr counts a request of the HTTP client at address a.
func (l *reqLimiter) allowAddr(a netip.Addr, authed bool) bool {
	t := &l.anon
	if authed {
		t = &l.authed
	}
	now := l.now()
	t.mu.Lock()
	ok := t.get(a.As16()).take(now, l.window, l.max)
	t.mu.Unlock()
	return ok
}

// take counts a request at now if the sliding window has room for it.
func (w *reqWindow) take(now, window int64, limit float64) bool {
	w.roll(now, window)
	// The previous window's requests the sliding window still covers,
	// as if they had been spread evenly; a request partly covered counts
	// whole, so that a burst just before a window's start is not let
	// through again just after it.
	cover := float64(window-(now-w.start)) / float64(window)
	if w.n+math.Ceil(w.prev*cover) >= limit {
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

// clientName is how ratelimit:hit names an HTTP client.
func clientName(a netip.Addr) string {
	if !a.IsValid() {
		return "unix" // a peer of the Unix socket, which has no address
	}
	return a.String()
}

// ---------------------------------------------------------------------------
// The tables

// limitTable is a bounded table of counts that forgets the client seen
// least recently when full: a map to slots kept on a list from the most
// recently seen to the least. Slots are reused in place, so that a table
// at its bound takes no allocation for a new client, and a key is an
// address's 16 bytes (IPv4 as IPv4-mapped IPv6; the zero key, the
// unspecified address no peer has, is a Unix socket's peer): 48 bytes a
// slot and a map entry, where a string key and a node would cost three
// allocations. All under mu.
type limitTable struct {
	mu    sync.Mutex
	max   int
	index map[[16]byte]int32
	// slots[0] is the list's sentinel: its next is the most recently
	// seen, its prev the least.
	slots []limitSlot
}

type limitSlot struct {
	key        [16]byte
	w          reqWindow
	prev, next int32
}

func (t *limitTable) init(n int) {
	t.max = max(n, 1)
	t.index = make(map[[16]byte]int32)
	t.slots = make([]limitSlot, 1, min(t.max+1, 1024))
}

// get returns key's count, marked most recently seen; a new key gets a
// fresh one, in the slot of the least recently seen when the table is
// full. The pointer is valid until the next get.
func (t *limitTable) get(key [16]byte) *reqWindow {
	if i, ok := t.index[key]; ok {
		if t.slots[0].next != i {
			t.unlink(i)
			t.pushFront(i)
		}
		return &t.slots[i].w
	}
	var i int32
	if len(t.slots)-1 < t.max {
		if len(t.slots) == cap(t.slots) {
			// Grow to at most the bound, not past it as append would.
			grown := make([]limitSlot, len(t.slots), min(2*cap(t.slots), t.max+1))
			copy(grown, t.slots)
			t.slots = grown
		}
		t.slots = append(t.slots, limitSlot{})
		i = int32(len(t.slots) - 1)
	} else {
		i = t.slots[0].prev
		t.unlink(i)
		delete(t.index, t.slots[i].key)
	}
	t.slots[i] = limitSlot{key: key}
	t.index[key] = i
	t.pushFront(i)
	return &t.slots[i].w
}

func (t *limitTable) unlink(i int32) {
	s := &t.slots[i]
	t.slots[s.prev].next = s.next
	t.slots[s.next].prev = s.prev
}

func (t *limitTable) pushFront(i int32) {
	first := t.slots[0].next
	t.slots[i].prev, t.slots[i].next = 0, first
	t.slots[first].prev = i
	t.slots[0].next = i
}

// len is the number of clients counted.
func (t *limitTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.index)
}

// ---------------------------------------------------------------------------
// Who the client is

// maxTrustedProxies bounds --trusted-proxies: every request from a proxy
// is matched against the list, hop by hop.
const maxTrustedProxies = 256

// maxForwardHops bounds the X-Forwarded-For entries read from the right:
// past this many, the last address read (a trusted proxy) is the client.
// No real chain of proxies is this long.
const maxForwardHops = 32

// trustedProxies are the peers whose X-Forwarded-For or X-Real-IP names
// the client: --trusted-proxies and --trusted-proxy-header.
type trustedProxies struct {
	prefixes []netip.Prefix
	unix     bool // peers of --http-socket
	// realIP: the proxies set X-Real-IP, and X-Forwarded-For is not read
	// (--trusted-proxy-header x-real-ip); else the reverse.
	realIP bool
}

// parseProxyHeader reads --trusted-proxy-header into t.
func (t *trustedProxies) parseProxyHeader(h string) error {
	switch strings.ToLower(strings.TrimSpace(h)) {
	case "", "x-forwarded-for":
		t.realIP = false
	case "x-real-ip":
		t.realIP = true
	default:
		return fmt.Errorf("--trusted-proxy-header: %q is neither x-forwarded-for nor x-real-ip", h)
	}
	return nil
}

// parseTrustedProxies reads --trusted-proxies: comma-separated CIDRs,
// addresses, and "unix" for the peers of the HTTP Unix socket.
func parseTrustedProxies(s string) (trustedProxies, error) {
	var t trustedProxies
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		var p netip.Prefix
		var err error
		switch {
		case f == "":
			continue
		case f == "unix":
			t.unix = true
			continue
		case strings.Contains(f, "/"):
			p, err = netip.ParsePrefix(f)
			if err == nil && p.Addr().Is4In6() && p.Bits() >= 96 {
				// ::ffff:10.0.0.0/104 is 10.0.0.0/8, as the peers it
				// is matched against are read.
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			p = p.Masked()
		default:
			var a netip.Addr
			a, err = netip.ParseAddr(f)
			a = a.Unmap().WithZone("")
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if err != nil {
			return trustedProxies{}, fmt.Errorf("--trusted-proxies: %q is not an IP address, a CIDR or unix: %w", f, err)
		}
		if len(t.prefixes) == maxTrustedProxies {
			return trustedProxies{}, fmt.Errorf("--trusted-proxies: at most %d addresses and CIDRs", maxTrustedProxies)
		}
		t.prefixes = append(t.prefixes, p)
	}
	return t, nil
}

func (t *trustedProxies) has(a netip.Addr) bool {
	for _, p := range t.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// client names the client of an HTTP request as the limiter counts it.
// From a peer that is not a trusted proxy, it is the peer's own address,
// whatever the headers say. From a trusted proxy, it is the address in
// X-Real-IP (with --trusted-proxy-header x-real-ip), else the right-most
// address of X-Forwarded-For that is not a trusted proxy (all of them
// trusted: the left-most); without one, the peer. An entry that is not an
// address stops the walk at the last proxy trusted: a proxy that appends
// to the header writes only addresses, and what it did not write does not
// name anyone.
func (t *trustedProxies) client(r *http.Request) netip.Addr {
	peer, isUnix := peerAddr(r)
	if isUnix && !t.unix || !isUnix && !t.has(peer) {
		return peer
	}
	if t.realIP {
		if a, ok := parseHop(strings.TrimSpace(r.Header.Get("X-Real-IP"))); ok {
			return a
		}
		return peer
	}
	found, named, read := peer, false, 0
	vals := r.Header.Values("X-Forwarded-For")
	for i := len(vals) - 1; i >= 0; i-- {
		rest := vals[i]
		for rest != "" {
			if read++; read > maxForwardHops {
				return found
			}
			entry := rest
			if k := strings.LastIndexByte(rest, ','); k >= 0 {
				entry, rest = rest[k+1:], rest[:k]
			} else {
				rest = ""
			}
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue
			}
			a, ok := parseHop(entry)
			if !ok {
				return found
			}
			found, named = a, true
			if !t.has(a) {
				return a
			}
		}
	}
	if named {
		return found
	}
	return peer
}

// peerAddr is the address a request's connection comes from; a peer of a
// Unix socket has none (the zero Addr, and isUnix).
func peerAddr(r *http.Request) (a netip.Addr, isUnix bool) {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone(""), false
	}
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && la.Network() == "unix" {
		return netip.Addr{}, true
	}
	// Not an address and not a Unix socket: a handler called without a
	// server (a test); the zero address, trusted as nothing is.
	return netip.Addr{}, false
}

// parseHop reads one X-Forwarded-For entry or an X-Real-IP: an address, with
// a port as some proxies write it (1.2.3.4:80, [::1]:80).
func parseHop(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return netip.Addr{}, false
		}
		a = ap.Addr()
	}
	return a.Unmap().WithZone(""), true
}

// limitExempt are the HTTP paths the limiter leaves alone, as the
// reference does: probes and the debug routes.
var limitExempt = map[string]bool{"health": true, "healthz": true, "live": true, "ready": true, "gc": true, "heapstats": true}
