package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// limitGet sends one HTTP request to the server at addr with the headers
// given (name, value, ...) and returns its status code.
func limitGet(t *testing.T, hc *http.Client, method, url string, body string, hdr ...string) int {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// An hour's window. A test's burst may cross the start of a window (they
// start on the hour): the sliding count then covers the last window's
// requests less, by a hundredth (window/limit) in 36 s, and a request
// partly covered counts whole, so one more passes only if the burst goes
// on 36 s past the hour, which none of these does on any machine.
const limitTestWindow = 3600000

// TestLimiterIgnoresSpoofedHeaders: with no trusted proxies, the headers a
// client writes do not name it: 300 requests from one address, each with
// a different X-Forwarded-For and X-Real-IP, pass 100 times in all under a
// limit of 100. Before, all 300 passed, each counted as a new client.
func TestLimiterIgnoresSpoofedHeaders(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{rateLimitMax: 100, rateLimitWindow: limitTestWindow})
	hc := &http.Client{}
	passed, refused := 0, 0
	for i := range 300 {
		spoof := fmt.Sprintf("198.51.%d.%d", i/250, i%250)
		switch code := limitGet(t, hc, "GET", "http://"+ts.http+"/queues", "",
			"X-Forwarded-For", spoof+", 203.0.113."+strconv.Itoa(i%200), "X-Real-IP", spoof); code {
		case http.StatusOK:
			passed++
		case http.StatusTooManyRequests:
			refused++
		default:
			t.Fatalf("request %d: status %d", i, code)
		}
	}
	if passed != 100 || refused != 200 {
		t.Fatalf("%d of 300 requests with rotating forwarding headers passed, %d refused; want 100 and 200", passed, refused)
	}
}

// TestLimiterTrustedProxy: from a peer of --trusted-proxies, the client is
// the right-most X-Forwarded-For address that is not a trusted proxy, so
// what a client writes to the left changes nothing; X-Real-IP names it
// when there is no X-Forwarded-For; each forwarded client has its own
// count, and the proxy itself none of theirs.
func TestLimiterTrustedProxy(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{rateLimitMax: 100, rateLimitWindow: limitTestWindow,
		trustedProxies: "127.0.0.1, 10.0.0.0/8"})
	hc := &http.Client{}
	url := "http://" + ts.http + "/queues"
	count := func(n int, hdr func(i int) []string) (passed int) {
		for i := range n {
			switch code := limitGet(t, hc, "GET", url, "", hdr(i)...); code {
			case http.StatusOK:
				passed++
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("status %d", code)
			}
		}
		return passed
	}
	// One client behind two proxies (10.1.2.3 then this one), writing a
	// new address to the left each time.
	a := func(i int) []string {
		return []string{"X-Forwarded-For", fmt.Sprintf("198.51.100.%d, 203.0.113.1, 10.1.2.3", i%250)}
	}
	if got := count(150, a); got != 100 {
		t.Fatalf("client 203.0.113.1, rotating what it wrote: %d of 150 passed, want 100", got)
	}
	// The same client, the header split over two lines.
	if got := count(1, func(int) []string {
		return []string{"X-Forwarded-For", "198.51.100.7", "X-Forwarded-For", "203.0.113.1"}
	}); got != 0 {
		t.Fatal("client 203.0.113.1 passed again with its header on two lines")
	}
	// Others are counted apart: another forwarded client, one with a port
	// in the header; and the proxy itself, whatever X-Real-IP says (not
	// the header --trusted-proxy-header names).
	for _, c := range []struct {
		name string
		hdr  []string
	}{
		{"203.0.113.2", []string{"X-Forwarded-For", "203.0.113.1, 203.0.113.2"}},
		{"[2001:db8::1]:443", []string{"X-Forwarded-For", "[2001:db8::1]:443"}},
		{"the proxy", []string{"X-Real-IP", "203.0.113.3"}},
	} {
		if got := count(101, func(int) []string { return c.hdr }); got != 100 {
			t.Fatalf("client %s: %d of 101 passed, want 100", c.name, got)
		}
	}
	// An entry that is not an address stops the walk at the last proxy
	// trusted: here 10.9.9.9, a client of its own.
	if got := count(101, func(int) []string { return []string{"X-Forwarded-For", "203.0.113.1, bogus, 10.9.9.9"} }); got != 100 {
		t.Fatalf("past a bogus entry: %d of 101 passed, want 100 (counted as 10.9.9.9)", got)
	}
}

// TestTrustedProxiesFlag: --trusted-proxies takes addresses, CIDRs and
// unix; anything else is refused at start, naming the flag and the entry.
func TestTrustedProxiesFlag(t *testing.T) {
	t.Parallel()
	tp, err := parseTrustedProxies(" 10.0.0.0/8,192.168.1.7, ::1,fd00::/8 , ::ffff:172.16.0.0/108, 10.1.2.3/8, unix,")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		addr string
		in   bool
	}{{"10.200.0.1", true}, {"192.168.1.7", true}, {"192.168.1.8", false}, {"::1", true},
		{"fd12::5", true}, {"fe80::1", false}, {"172.16.3.4", true}, {"172.32.0.1", false}, {"11.0.0.1", false}} {
		if got := tp.has(netip.MustParseAddr(c.addr)); got != c.in {
			t.Errorf("%s trusted: %v, want %v", c.addr, got, c.in)
		}
	}
	if !tp.unix {
		t.Error("unix not read")
	}
	for _, bad := range []string{"10.0.0.0/33", "10.0.0.300", "example.com", "10.0.0.0/8;", "fe80::1%eth0/64", "*"} {
		if _, err := parseTrustedProxies("127.0.0.1," + bad); err == nil || !strings.Contains(err.Error(), "--trusted-proxies") ||
			!strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("%q: %v, want a refusal naming the flag and the entry", bad, err)
		}
	}
	many := strings.Repeat("10.0.0.1,", maxTrustedProxies+1)
	if _, err := parseTrustedProxies(many); err == nil || !strings.Contains(err.Error(), "at most 256") {
		t.Errorf("%d entries: %v", maxTrustedProxies+1, err)
	}
	// At start: the server does not run.
	err = runServer(context.Background(), &config{memory: true, trustedProxies: "10.0.0.0/40"}, quietLog(), nil)
	if err == nil || !strings.Contains(err.Error(), `--trusted-proxies: "10.0.0.0/40"`) {
		t.Fatalf("runServer with a bad CIDR: %v", err)
	}
}

// TestTrustedProxiesClient: who a request's client is, header by header.
func TestTrustedProxiesClient(t *testing.T) {
	t.Parallel()
	tp, err := parseTrustedProxies("10.0.0.0/8, ::1")
	if err != nil {
		t.Fatal(err)
	}
	chain := strings.Repeat("10.0.0.9, ", 40)
	for _, c := range []struct {
		peer string
		hdr  []string
		want string
	}{
		{"192.0.2.1:5", []string{"X-Forwarded-For", "198.51.100.1", "X-Real-IP", "198.51.100.2"}, "192.0.2.1"},
		{"10.0.0.1:5", []string{"X-Forwarded-For", "198.51.100.1, 203.0.113.5, 10.0.0.2"}, "203.0.113.5"},
		{"10.0.0.1:5", []string{"X-Forwarded-For", "10.0.0.3, 10.0.0.2"}, "10.0.0.3"},
		{"10.0.0.1:5", []string{"X-Forwarded-For", "198.51.100.1", "X-Forwarded-For", "203.0.113.5,10.0.0.2"}, "203.0.113.5"},
		{"10.0.0.1:5", []string{"X-Forwarded-For", "198.51.100.1, 203.0.113.5,, ,10.0.0.2,"}, "203.0.113.5"},
		{"10.0.0.1:5", []string{"X-Forwarded-For", "::ffff:203.0.113.5"}, "203.0.113.5"},
		{"10.0.0.1:5", []string{"X-Forwarded-For", "203.0.113.5:8080"}, "203.0.113.5"},
		// X-Real-IP is not the header read.
		{"10.0.0.1:5", []string{"X-Real-IP", " 203.0.113.6 "}, "10.0.0.1"},
		{"10.0.0.1:5", []string{"X-Forwarded-For", "unknown"}, "10.0.0.1"},
		{"10.0.0.1:5", []string{"X-Forwarded-For", "203.0.113.5, unknown, 10.0.0.2"}, "10.0.0.2"},
		{"10.0.0.1:5", []string{"X-Forwarded-For", "203.0.113.5, " + chain + "10.0.0.2"}, "10.0.0.9"},
		{"[::ffff:10.0.0.1]:5", []string{"X-Forwarded-For", "203.0.113.5"}, "203.0.113.5"},
		{"[::1]:5", []string{"X-Forwarded-For", "2001:db8::7"}, "2001:db8::7"},
		{"[2001:db8::1]:5", []string{"X-Forwarded-For", "203.0.113.5"}, "2001:db8::1"},
	} {
		r, _ := http.NewRequest("GET", "/queues", nil)
		r.RemoteAddr = c.peer
		for i := 0; i+1 < len(c.hdr); i += 2 {
			r.Header.Add(c.hdr[i], c.hdr[i+1])
		}
		if got := tp.client(r); got != netip.MustParseAddr(c.want) {
			t.Errorf("peer %s, %q: client %v, want %s", c.peer, c.hdr, got, c.want)
		}
	}
}

// TestTrustedProxyHeaderRealIP: with --trusted-proxy-header x-real-ip,
// only X-Real-IP names the client. A proxy that sets X-Real-IP passes
// on the X-Forwarded-For its client wrote: before, that header was read
// first, and a client behind such a proxy named itself anew with each
// request (300 of 300 passed a limit of 100).
func TestTrustedProxyHeaderRealIP(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{rateLimitMax: 100, rateLimitWindow: limitTestWindow,
		trustedProxies: "127.0.0.1", trustedProxyHeader: "X-Real-IP"})
	hc := &http.Client{}
	url := "http://" + ts.http + "/queues"
	passed := 0
	for i := range 300 {
		// The proxy names the client 203.0.113.1; the client wrote the
		// X-Forwarded-For, a new address each time.
		switch code := limitGet(t, hc, "GET", url, "", "X-Real-IP", "203.0.113.1",
			"X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i%250)); code {
		case http.StatusOK:
			passed++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("status %d", code)
		}
	}
	if passed != 100 {
		t.Fatalf("rotating X-Forwarded-For behind an X-Real-IP proxy: %d of 300 passed, want 100", passed)
	}
	// Another client the proxy names is counted apart.
	if code := limitGet(t, hc, "GET", url, "", "X-Real-IP", "203.0.113.2"); code != http.StatusOK {
		t.Fatalf("client 203.0.113.2: status %d", code)
	}

	tp, _ := parseTrustedProxies("10.0.0.0/8")
	if err := tp.parseProxyHeader("x-real-ip"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		hdr  []string
		want string
	}{
		{[]string{"X-Real-IP", " 203.0.113.6 "}, "203.0.113.6"},
		{[]string{"X-Real-IP", "[2001:db8::6]:443"}, "2001:db8::6"},
		{[]string{"X-Real-IP", "unknown", "X-Forwarded-For", "198.51.100.1"}, "10.0.0.1"},
		{[]string{"X-Forwarded-For", "198.51.100.1"}, "10.0.0.1"},
	} {
		r, _ := http.NewRequest("GET", "/queues", nil)
		r.RemoteAddr = "10.0.0.1:5"
		for i := 0; i+1 < len(c.hdr); i += 2 {
			r.Header.Add(c.hdr[i], c.hdr[i+1])
		}
		if got := tp.client(r); got != netip.MustParseAddr(c.want) {
			t.Errorf("%q: client %v, want %s", c.hdr, got, c.want)
		}
	}
	// Any other header is refused at start, naming the flag.
	err := runServer(context.Background(), &config{memory: true, trustedProxies: "127.0.0.1",
		trustedProxyHeader: "forwarded"}, quietLog(), nil)
	if err == nil || !strings.Contains(err.Error(), `--trusted-proxy-header: "forwarded"`) {
		t.Fatalf("runServer with --trusted-proxy-header forwarded: %v", err)
	}
}

// TestLimiterClientOfUnixSocket: over --http-socket a peer has no address;
// its headers name the client only with "unix" among the trusted proxies.
func TestLimiterClientOfUnixSocket(t *testing.T) {
	t.Parallel()
	req := func(xff string) *http.Request {
		r, _ := http.NewRequest("GET", "/queues", nil)
		r.RemoteAddr = "@"
		r.Header.Set("X-Forwarded-For", xff)
		la := &net.UnixAddr{Name: "/run/queued.sock", Net: "unix"}
		return r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, la))
	}
	var none trustedProxies
	if got := none.client(req("203.0.113.9")); got.IsValid() || clientName(got) != "unix" {
		t.Fatalf("untrusted socket peer: %v (%s)", got, clientName(got))
	}
	unix, _ := parseTrustedProxies("unix")
	if got := unix.client(req("198.51.100.1, 203.0.113.9")); got != netip.MustParseAddr("203.0.113.9") {
		t.Fatalf("trusted socket peer: %v", got)
	}
}

// TestLimiterTableForgetsOldest: the table is bounded; when full, the
// client seen least recently is forgotten (and would start fresh), while
// those seen since keep their counts. No client shares another's count.
func TestLimiterTableForgetsOldest(t *testing.T) {
	t.Parallel()
	var now int64 = 1_000_000
	l := newReqLimiter(3, time.Hour, func() int64 { return now })
	l.setClients(3)
	ip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}) }
	fill := func(i int) {
		for range 3 {
			if !l.allowAddr(ip(i), true) {
				t.Fatalf("client %d refused within its limit", i)
			}
		}
		if l.allowAddr(ip(i), true) {
			t.Fatalf("client %d past its limit allowed", i)
		}
	}
	fill(1)
	fill(2)
	fill(3)
	if l.allowAddr(ip(1), true) { // 1 is now the most recently seen
		t.Fatal("client 1 past its limit allowed")
	}
	fill(4) // forgets 2, the least recently seen
	if n := l.authed.len(); n != 3 {
		t.Fatalf("%d clients counted, want the bound, 3", n)
	}
	for _, i := range []int{1, 3, 4} {
		if l.allowAddr(ip(i), true) {
			t.Fatalf("client %d forgot its count", i)
		}
	}
	fill(2) // forgotten: a fresh count, which in turn forgets 1
	fill(1)
	// A table of one, and the slots reused in place many times over.
	l.setClients(1)
	for i := range 1000 {
		if !l.allowAddr(ip(i%256), false) {
			t.Fatalf("request %d of a new client refused", i)
		}
	}
	if n := l.anon.len(); n != 1 {
		t.Fatalf("%d clients in a table of one", n)
	}
}

// TestLimiterFloodWithoutTokenLocksNobodyOut: 101,000 requests without a
// token, each from a new address, plus one address that spends its
// limit, pass the table's bound of 100,000 clients. Afterwards a client
// with a token is counted fresh: new, or at an address the flood used.
// Before, past 100,000 clients every new one shared one count, so every
// new client, with a token or not, was refused for the whole window.
func TestLimiterFloodWithoutTokenLocksNobodyOut(t *testing.T) {
	t.Parallel()
	var now int64 = 1_000_000
	l := newReqLimiter(100, time.Minute, func() int64 { return now })
	flooder := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}) }
	for i := range 101000 {
		l.allowAddr(flooder(i), false)
	}
	busy := netip.MustParseAddr("198.51.100.1")
	for range 150 {
		l.allowAddr(busy, false)
	}
	if l.allowAddr(busy, false) {
		t.Fatal("the busy flooder past its limit allowed")
	}
	if n := l.anon.len(); n != maxLimitClients {
		t.Fatalf("%d clients without a token counted, want the bound %d", n, maxLimitClients)
	}
	for _, c := range []netip.Addr{netip.MustParseAddr("192.0.2.1"), flooder(100999), busy} {
		for i := range 100 {
			if !l.allowAddr(c, true) {
				t.Fatalf("a client with a token at %v: request %d refused after the flood", c, i)
			}
		}
	}
	if !l.allowAddr(netip.MustParseAddr("192.0.2.2"), false) {
		t.Fatal("a new client without a token refused: it should start fresh")
	}
	var w reqWindow // a new TCP connection's count
	if !l.allowConn(&w) {
		t.Fatal("a new TCP connection refused")
	}
}

// TestLimiterLockoutEndToEnd: through a real server with tokens and the
// limit at 100, requests without a token flood the HTTP port from 1,100
// addresses (a trusted proxy forwards them; the table's bound lowered to
// 1,000 to keep this quick), and 300 more from the flood's own address.
// Then a new TCP client authenticates and is answered, and HTTP clients
// with the token (new, at a flooded address, at the flood's own) are
// answered, a WebSocket and /mcp included. Before, once the table was
// full every new client shared one count and all of these were refused.
func TestLimiterLockoutEndToEnd(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{authTokens: "T", rateLimitMax: 100, rateLimitWindow: limitTestWindow,
		trustedProxies: "127.0.0.1", rateLimitClients: 1000})
	hc := &http.Client{}
	url := "http://" + ts.http + "/queues"
	for i := range 1100 {
		xff := fmt.Sprintf("10.0.%d.%d", i/250, i%250)
		if code := limitGet(t, hc, "GET", url, "", "X-Forwarded-For", xff); code != http.StatusUnauthorized {
			t.Fatalf("flood request %d: %d, want 401", i, code)
		}
	}
	refused := 0
	for range 300 {
		if limitGet(t, hc, "GET", url, "") == http.StatusTooManyRequests {
			refused++
		}
	}
	if refused != 200 {
		t.Fatalf("the flood's own address: %d of 300 refused, want 200", refused)
	}

	c := dial(t, ts.addr)
	c.ok(map[string]any{"cmd": "Auth", "token": "T"})
	c.ok(map[string]any{"cmd": "Ping"})

	bearer := "Bearer T"
	for _, xff := range []string{"", "10.0.0.5", "192.0.2.1"} {
		hdr := []string{"Authorization", bearer}
		if xff != "" {
			hdr = append(hdr, "X-Forwarded-For", xff)
		}
		for i := range 100 {
			if code := limitGet(t, hc, "GET", url, "", hdr...); code != http.StatusOK {
				t.Fatalf("a client with the token (X-Forwarded-For %q): request %d answered %d", xff, i, code)
			}
		}
	}
	mcp := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	if code := limitGet(t, hc, "POST", "http://"+ts.http+"/mcp", mcp, "Authorization", bearer,
		"Content-Type", "application/json", "Accept", "application/json, text/event-stream", "X-Forwarded-For", "10.0.0.6"); code != http.StatusOK {
		t.Fatalf("/mcp with the token: %d", code)
	}
	ws := rawHandshake(t, ts.http, wsRequest("/ws", "Authorization: "+bearer, "X-Forwarded-For: 10.0.0.7"))
	if ws.resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("a WebSocket with the token: %s", ws.resp.Status)
	}
	ws.text(`{"cmd":"Ping","reqId":"p"}`)
	if _, msg := ws.readData(); !strings.Contains(msg, `"ok":true`) {
		t.Fatalf("a WebSocket's Ping: %s", msg)
	}
	// And a new client without the token starts fresh: 401, not 429.
	if code := limitGet(t, hc, "GET", url, "", "X-Forwarded-For", "192.0.2.2"); code != http.StatusUnauthorized {
		t.Fatalf("a new client without the token: %d, want 401", code)
	}
}

// TestMeasureLimiterAttack measures the limiter's attacks of issue 44 on
// a server process (memory mode, --rate-limit-max-requests 100
// --auth-tokens T): 300 requests with the token and rotating
// X-Forwarded-For and X-Real-IP from 127.0.0.3; 101,000 requests without
// a token from 127.0.0.1, each with a new X-Forwarded-For and X-Real-IP,
// from 8 clients; then a new TCP client with the token (Auth, Ping), and
// HTTP clients with the token from the flood's address and from
// 127.0.0.2. Once as deployed without a proxy,
// once with --trusted-proxies 127.0.0.1, where the flood is 101,000
// clients (a proxy forwarding them), past the table's bound. A
// measurement, not a check: it runs when asked,
// QUEUED_MEASURE=1 go test -count=1 -run TestMeasureLimiterAttack -v .
func TestMeasureLimiterAttack(t *testing.T) {
	t.Parallel()
	if os.Getenv("QUEUED_MEASURE") != "1" {
		t.Skip("a measurement; QUEUED_MEASURE=1 runs it")
	}
	from := func(src string, conns int) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: conns}}
	}
	for _, extra := range [][]string{nil, {"--trusted-proxies", "127.0.0.1"}} {
		srv := startBinary(t, append([]string{"--memory", "--rate-limit-max-requests", "100", "--auth-tokens", "T"}, extra...)...)
		t.Logf("queued serve --memory --rate-limit-max-requests 100 --auth-tokens T %s", strings.Join(extra, " "))
		url := fmt.Sprintf("http://127.0.0.1:%d/queues", srv.httpPort)

		passed, rc := 0, from("127.0.0.3", 1)
		for i := range 300 {
			ip := fmt.Sprintf("198.51.%d.%d", i/250, i%250)
			if limitGet(t, rc, "GET", url, "", "Authorization", "Bearer T", "X-Forwarded-For", ip, "X-Real-IP", ip) == http.StatusOK {
				passed++
			}
		}
		t.Logf("300 requests with the token and rotating X-Forwarded-For and X-Real-IP from 127.0.0.3: %d passed", passed)

		const flood = 101000
		hc := from("127.0.0.1", 8)
		var next atomic.Int64
		var mu sync.Mutex
		codes := map[int]int{}
		start := time.Now()
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				mine := map[int]int{}
				for i := next.Add(1) - 1; i < flood; i = next.Add(1) - 1 {
					ip := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
					mine[limitGet(t, hc, "GET", url, "", "X-Forwarded-For", ip, "X-Real-IP", ip)]++
				}
				mu.Lock()
				for k, v := range mine {
					codes[k] += v
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		t.Logf("%d spoofed requests without a token in %v: %d answered 401, %d refused 429, others %v",
			flood, time.Since(start).Round(10*time.Millisecond), codes[401], codes[429], codes)

		c := dial(t, srv.addr())
		at := time.Now()
		auth := c.call(map[string]any{"cmd": "Auth", "token": "T"})
		ping := c.call(map[string]any{"cmd": "Ping"})
		t.Logf("then a new TCP client with the token, in %v: Auth %v; Ping %v", time.Since(at).Round(time.Microsecond), auth, ping)
		if auth["ok"] != true || ping["ok"] != true {
			t.Errorf("a TCP client with the token refused after the flood")
		}
		for _, src := range []string{"127.0.0.1", "127.0.0.2"} {
			code := limitGet(t, from(src, 1), "GET", url, "", "Authorization", "Bearer T")
			t.Logf("an HTTP client with the token from %s: %d", src, code)
			if code != http.StatusOK {
				t.Errorf("an HTTP client with the token refused after the flood: %d", code)
			}
		}
		_, peak := procMem(t, srv.cmd.Process.Pid)
		t.Logf("server peak resident memory: %.1f MiB", float64(peak)/(1<<20))
		c.close()
		srv.stop(t)
	}
}

// benchClock stands for the clock in the limiter's benchmarks: a read of
// the real one (about 300 ns on the 2-core VM this was built on) would
// be most of what they measure.
func benchClock() int64 { return 1_000_000 }

// BenchmarkReqLimiterHTTP: an HTTP request's cost in the limiter, one
// client well within its limit: who it is, and its count.
func BenchmarkReqLimiterHTTP(b *testing.B) {
	for _, bc := range []struct {
		name, trusted, xff string
	}{{"direct", "", "198.51.100.7"}, {"proxied", "10.0.0.0/8", "198.51.100.7, 10.1.2.3"}} {
		b.Run(bc.name, func(b *testing.B) {
			l := newReqLimiter(1<<30, time.Minute, benchClock)
			l.trust, _ = parseTrustedProxies(bc.trusted)
			req, _ := http.NewRequest("GET", "/queues", nil)
			req.RemoteAddr = "10.0.0.1:5555"
			req.Header.Set("X-Forwarded-For", bc.xff)
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := l.allowHTTP(req, true); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
}

// BenchmarkReqLimiterNewClients: a request from a new client each time
// into a table at its bound: the least recently seen is forgotten.
func BenchmarkReqLimiterNewClients(b *testing.B) {
	l := newReqLimiter(100, time.Minute, benchClock)
	const n = 1 << 18 // more than the bound: every request a new client
	addrs := make([]netip.Addr, n)
	for i := range addrs {
		addrs[i] = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	}
	for _, a := range addrs[:maxLimitClients] {
		l.allowAddr(a, false)
	}
	b.ReportAllocs()
	i := maxLimitClients
	for b.Loop() {
		l.allowAddr(addrs[i%n], false)
		i++
	}
}

// BenchmarkReqLimiterConn: a TCP frame's cost in the limiter.
func BenchmarkReqLimiterConn(b *testing.B) {
	l := newReqLimiter(1<<30, time.Minute, benchClock)
	var w reqWindow
	b.ReportAllocs()
	for b.Loop() {
		l.allowConn(&w)
	}
}

// BenchmarkReqLimiterTableBytes: what a full table holds, in bytes a
// client (b/client): 100,000 clients, one request each, then 1,000 more
// that push the least recently seen out.
func BenchmarkReqLimiterTableBytes(b *testing.B) {
	var perClient float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		l := newReqLimiter(100, time.Minute, benchClock)
		for i := range maxLimitClients + 1000 {
			l.allowAddr(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), false)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perClient = float64(after.HeapAlloc-before.HeapAlloc) / float64(l.anon.len())
		runtime.KeepAlive(l)
	}
	b.ReportMetric(perClient, "b/client")
}
