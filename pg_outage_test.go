package main

// A broker that loses its database: PostgreSQL here is a shared service
// and is not stopped; the broker reaches it through a TCP proxy the test
// cuts (every connection closed, new ones refused) and restores.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cutProxy forwards a local port to PostgreSQL until cut.
type cutProxy struct {
	addr   string // where it listens, kept across a cut
	target string

	mu    sync.Mutex
	down  bool // cut: a new connection is closed at once
	conns map[net.Conn]bool
	drop  func() bool // when set, whether to close a new connection at once
	wg    sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: ln.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	p.serve(ln)
	t.Cleanup(func() {
		p.cut()
		ln.Close()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) serve(ln net.Listener) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			drop, down := p.drop, p.down
			p.mu.Unlock()
			if down || drop != nil && drop() {
				c.Close()
				continue
			}
			up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.down {
				// Cut meanwhile.
				p.mu.Unlock()
				c.Close()
				up.Close()
				continue
			}
			p.conns[c], p.conns[up] = true, true
			p.mu.Unlock()
			p.wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer p.wg.Done()
				io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
}

// pgProxy is a proxy to the test database, and the database's URL.
func pgProxy(t *testing.T) (*cutProxy, *url.URL) {
	t.Helper()
	pgURL, err := url.Parse(testPGURL())
	if err != nil {
		t.Fatal(err)
	}
	return newCutProxy(t, pgURL.Host), pgURL
}

// cut closes every connection and closes each new one at once. It keeps
// listening: a port let go could be taken by another test's listener or
// outgoing connection meanwhile (seen in CI), and restore would fail.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// restore forwards new connections again.
func (p *cutProxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// url is the test database's URL through the proxy.
func (p *cutProxy) url(t *testing.T) string {
	u, err := url.Parse(testPGURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.addr
	return u.String()
}

// health reads a broker's /health.
func health(t *testing.T, port int) (int, map[string]any) {
	t.Helper()
	cl := &http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
	if err != nil {
		t.Fatalf("/health: %v", err)
	}
	defer resp.Body.Close()
	var doc map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatalf("/health: %v", err)
	}
	return resp.StatusCode, doc
}

// TestPGDatabaseOutage: through an outage a broker answers clear storage
// errors promptly and stays up; its /health says degraded. Once the
// database is back it serves again without a restart (pool and LISTEN
// reconnect), the leases it handed out before still hold, the jobs whose
// leases ran out meanwhile come back, and every job completes once.
func TestPGDatabaseOutage(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	px, _ := pgProxy(t)
	b := startBinary(t, "--postgres-url", px.url(t), "--postgres-namespace", ns)
	other := startPGBroker(t, ns) // straight to the database
	c, direct := dial(t, b.addr()), dial(t, other.addr())
	const q, total = "outage", 30
	ids := pushMany(t, []*tclient{c}, q, total, 10)
	held := c.ok(map[string]any{"cmd": "PULLB", "queue": q, "count": 5, "owner": "long", "lockTtl": 120000})
	short := c.ok(map[string]any{"cmd": "PULLB", "queue": q, "count": 3, "owner": "short", "lockTtl": 1000})
	if len(list(t, held, "jobs")) != 5 || len(list(t, short, "jobs")) != 3 {
		t.Fatalf("pulled %v and %v", held, short)
	}
	if code, doc := health(t, b.httpPort); code != 200 || doc["status"] != "healthy" {
		t.Fatalf("/health before the outage: %d %v", code, doc)
	}

	// A long poll waiting when the database goes answers the error too.
	pollID, pollCh := c.send(map[string]any{"cmd": "PULL", "queue": "empty", "owner": "x", "timeout": 30000})
	pollWaiting(t, c)
	px.cut()
	if a := c.await(pollID, pollCh, callTimeout); a["ok"] != false || !strings.Contains(fmt.Sprint(a["error"]), "storage error (postgres)") {
		t.Fatalf("a long poll waiting at the outage: %v", a)
	}
	heldJob := list(t, held, "jobs")[0].(map[string]any)
	for _, m := range []map[string]any{
		{"cmd": "PUSH", "queue": q, "data": "lost"},
		{"cmd": "PULL", "queue": q, "owner": "x"},
		{"cmd": "PULL", "queue": q, "owner": "x", "timeout": 5000},
		{"cmd": "ACK", "id": heldJob["id"], "token": list(t, held, "tokens")[0]},
		{"cmd": "GetJobCounts", "queue": q},
	} {
		// c.fail waits at most callTimeout (10 s): a command that hung on
		// the database would fail the test here.
		began := time.Now()
		msg := c.fail(m)
		if !strings.Contains(msg, "storage error (postgres)") {
			t.Fatalf("%v during the outage: %q", m["cmd"], msg)
		}
		t.Logf("%v during the outage: %q after %v", m["cmd"], msg, time.Since(began).Round(time.Millisecond))
	}
	c.ok(map[string]any{"cmd": "Ping"})
	eventually(t, 10*time.Second, "/health degraded", func() (bool, string) {
		code, doc := health(t, b.httpPort)
		return code == http.StatusServiceUnavailable && doc["status"] == "degraded", fmt.Sprint(code, doc)
	})
	_, doc := health(t, b.httpPort)
	if st := doc["storage"].(map[string]any); st["driver"] != "postgres" || st["ok"] != false ||
		!strings.Contains(fmt.Sprint(st["error"]), "storage error (postgres)") {
		t.Fatalf("/health storage during the outage: %v", st)
	}
	if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", b.httpPort)); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/ready during the outage: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// Long enough for the short leases to run out meanwhile: the broker
	// that still reaches the database has put their jobs back.
	eventually(t, 30*time.Second, "the short leases ran out", func() (bool, string) {
		for _, id := range idsOf(list(t, short, "jobs")) {
			if st := str(t, direct.ok(map[string]any{"cmd": "GetState", "id": id}), "state"); st == "active" {
				return false, fmt.Sprint(id, " ", st)
			}
		}
		return true, ""
	})
	select {
	case <-b.done:
		t.Fatalf("the broker exited during the outage:\n%s", b.output())
	default:
	}

	px.restore()
	eventually(t, 30*time.Second, "/health healthy again", func() (bool, string) {
		code, doc := health(t, b.httpPort)
		return code == 200 && doc["status"] == "healthy", fmt.Sprint(code, doc)
	})
	eventually(t, 30*time.Second, "the wake-up listener back", func() (bool, string) {
		return strings.Contains(b.output(), "postgres wake-ups listening again"), "not in the log yet"
	})
	// A long poll through the broker is woken by a push through the other.
	id, ch := c.send(map[string]any{"cmd": "PULL", "queue": "wake", "owner": "w", "timeout": 20000})
	pollWaiting(t, c)
	woke := str(t, direct.ok(map[string]any{"cmd": "PUSH", "queue": "wake", "data": 1}), "id")
	if a := c.await(id, ch, 25*time.Second); a["ok"] != true || a["job"].(map[string]any)["id"] != woke {
		t.Fatalf("long poll after the outage: %v", a)
	}

	// The leases taken before the outage still hold: their ACKs apply.
	acks := map[string]int{}
	a := c.ok(map[string]any{"cmd": "ACKB", "ids": idsOf(list(t, held, "jobs")), "tokens": held["tokens"]})
	if d, ok := a["data"].(map[string]any); ok && len(d["ignoredIndices"].([]any)) > 0 {
		t.Fatalf("ACKs of leases held through the outage: %v", a)
	}
	for _, id := range idsOf(list(t, held, "jobs")) {
		acks[id.(string)]++
	}
	// The short leases ran out: their jobs come back, and the late ACK
	// of the first holder is refused once they are taken again.
	for len(acks) < total {
		a := c.ok(map[string]any{"cmd": "PULLB", "queue": q, "count": 10, "owner": "after", "timeout": 5000})
		jobs := list(t, a, "jobs")
		if len(jobs) == 0 {
			t.Fatalf("%d of %d jobs completed; nothing more to pull: %v", len(acks), total, countsOf(t, c, q))
		}
		r := c.ok(map[string]any{"cmd": "ACKB", "ids": idsOf(jobs), "tokens": a["tokens"]})
		if d, ok := r["data"].(map[string]any); ok && len(d["ignoredIndices"].([]any)) > 0 {
			t.Fatalf("ACKB after the outage: %v", r)
		}
		for _, id := range idsOf(jobs) {
			acks[id.(string)]++
		}
	}
	sj := list(t, short, "jobs")[0].(map[string]any)
	if msg := c.fail(map[string]any{"cmd": "ACK", "id": sj["id"], "token": list(t, short, "tokens")[0]}); msg == "" {
		t.Fatal("a late ACK of an expired lease was accepted")
	}
	for _, id := range ids {
		if acks[id] != 1 {
			t.Fatalf("job %s completed %d times", id, acks[id])
		}
	}
	counts := countsOf(t, direct, q)
	if num(t, counts["completed"]) != total || num(t, counts["waiting"])+num(t, counts["active"])+num(t, counts["delayed"]) != 0 {
		t.Fatalf("counts at the end: %v", counts)
	}
}

func idsOf(jobs []any) []any {
	out := make([]any, len(jobs))
	for i, j := range jobs {
		out[i] = j.(map[string]any)["id"]
	}
	return out
}

// outageWorker pulls and acknowledges through one broker until stop,
// going on through storage errors. An ACKB answered with an error may
// still have committed (the connection can drop after the commit): its
// jobs are marked unknown.
func outageWorker(c *tclient, queue, owner string, led *ackLedger, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		a, err := c.do(map[string]any{"cmd": "PULLB", "queue": queue, "count": 20, "owner": owner,
			"lockTtl": 2000, "timeout": 200}, callTimeout)
		if err != nil {
			return
		}
		jobs, _ := a["jobs"].([]any)
		if a["ok"] != true || len(jobs) == 0 {
			retryPause()
			continue
		}
		ids := idsOf(jobs)
		r, err := c.do(map[string]any{"cmd": "ACKB", "ids": ids, "tokens": a["tokens"]}, callTimeout)
		if err != nil {
			return
		}
		ignored := map[int]bool{}
		if d, ok := r["data"].(map[string]any); ok {
			list, _ := d["ignoredIndices"].([]any)
			for _, x := range list {
				ignored[int(toFloat(x))] = true
			}
		}
		led.mu.Lock()
		for i, id := range ids {
			switch {
			case r["ok"] != true:
				led.unknown[id.(string)] = true
			case !ignored[i]:
				led.accepted[id.(string)]++
				led.total.Add(1)
			}
		}
		led.mu.Unlock()
	}
}

// TestPGOutageUnderLoad cuts a broker's database while workers pull and
// acknowledge through it and through a second broker, then restores it:
// every job is completed, none twice.
func TestPGOutageUnderLoad(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	px, _ := pgProxy(t)
	b := startBinary(t, "--postgres-url", px.url(t), "--postgres-namespace", ns)
	other := startPGBroker(t, ns)
	admin := dial(t, other.addr())
	const q, total = "load", 3000
	ids := pushMany(t, []*tclient{admin}, q, total, 500)
	led := &ackLedger{accepted: map[string]int{}, unknown: map[string]bool{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, addr := range []string{b.addr(), b.addr(), other.addr()} {
		c := dial(t, addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			outageWorker(c, q, fmt.Sprint("w", i), led, stop)
		}()
	}
	eventually(t, 60*time.Second, "a fifth of the jobs acknowledged", func() (bool, string) {
		n := led.total.Load()
		return n >= total/5, fmt.Sprint(n)
	})
	px.cut()
	cutAt := led.total.Load()
	time.Sleep(2 * time.Second)
	px.restore()
	t.Logf("cut after %d ACKs, restored after %d", cutAt, led.total.Load())
	eventually(t, 120*time.Second, "every job completed", func() (bool, string) {
		c := countsOf(t, admin, q)
		return num(t, c["completed"]) == total, fmt.Sprint(c)
	})
	close(stop)
	wg.Wait()
	led.mu.Lock()
	defer led.mu.Unlock()
	for _, id := range ids {
		if n := led.accepted[id]; n > 1 || n == 0 && !led.unknown[id] {
			t.Fatalf("job %s: %d ACKs accepted (answer lost in the cut: %v)", id, n, led.unknown[id])
		}
	}
	select {
	case <-b.done:
		t.Fatalf("the broker exited:\n%s", b.output())
	default:
	}
	t.Logf("%d ACKs accepted, %d answered with the storage error", led.total.Load(), len(led.unknown))
}

// TestPGStartWaitsForDatabase: a broker started while its database cannot
// be reached (here a proxy that drops the first connections, as a
// database still starting beside it in compose would) tries again and
// serves once it can, rather than exiting; one whose database answers a
// refusal (no such database) exits at once, naming it.
func TestPGStartWaitsForDatabase(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	px, pgURL := pgProxy(t)
	// Every connection is dropped for the first 1.5 s after the first:
	// the broker's first attempts fail however slow the machine is.
	var first atomic.Int64
	px.mu.Lock()
	px.drop = func() bool {
		first.CompareAndSwap(0, time.Now().UnixNano())
		return time.Since(time.Unix(0, first.Load())) < 1500*time.Millisecond
	}
	px.mu.Unlock()
	// A password that is also the user's name: the failure's text, which
	// names the user, has it masked, and the failure must still be told
	// for one of reaching the database (trust authentication ignores it).
	through, err := url.Parse(px.url(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, set := through.User.Password(); !set {
		through.User = url.UserPassword(through.User.Username(), through.User.Username())
	}
	b := startBinary(t, "--postgres-url", through.String(), "--postgres-namespace", ns)
	if out := b.output(); !strings.Contains(out, "PostgreSQL cannot be reached yet; trying again") {
		t.Errorf("the broker's log does not say it waits:\n%s", out)
	}
	c := dial(t, b.addr())
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "late", "data": 1}), "id")
	if got := c.ok(M{"cmd": "PULL", "queue": "late"}); got["job"].(map[string]any)["id"] != id {
		t.Fatalf("pulled %v", got)
	}

	wrong := *pgURL
	wrong.Path = "/no_such_database_" + ns
	var out bytes.Buffer
	started := time.Now()
	code := runBinaryEnv(t, nil, []string{"serve", "--host", "127.0.0.1", "--tcp-port", "0", "--http-port", "-1",
		"--postgres-url", wrong.String(), "--postgres-namespace", ns}, &out, &out)
	if code == 0 || !strings.Contains(out.String(), "no_such_database_") || strings.Contains(out.String(), "trying again") {
		t.Fatalf("a broker on a database that does not exist: exit %d after %v\n%s", code, time.Since(started), out.String())
	}
}

// TestPGListenBackoff: the listener's wait before reconnecting doubles
// from 100 ms up to 5 s while the database stays away, or drops each
// listener soon after it is in place, and starts again at 100 ms once a
// listener had served for listenSteady: before, an outage long after an
// earlier one waited the earlier one's 5 s before its first try.
func TestPGListenBackoff(t *testing.T) {
	t.Parallel()
	var waits []time.Duration
	var b time.Duration
	for i := range 8 {
		// A listener in place for a moment, every other time: a database
		// in a crash loop.
		b = listenBackoff(b, time.Duration(i%2)*time.Second)
		waits = append(waits, b)
	}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000}
	for i := range want {
		if waits[i] != want[i]*time.Millisecond {
			t.Fatalf("waits while away: %v", waits)
		}
	}
	if got := listenBackoff(5*time.Second, listenSteady); got != 100*time.Millisecond {
		t.Errorf("after a listener that served %v: %v, want 100ms", listenSteady, got)
	}
}
