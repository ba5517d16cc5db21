package main

// The HTTP side against browser-borne requests (DNS rebinding, cross-site
// GETs with effects), what /health and /ready tell a caller without the
// token, paging values that overflow, and GET /backup's one-at-a-time
// copies.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// browserReq sends a request as a browser would: a browser's User-Agent,
// the Sec-Fetch-* headers, and the given Host and extra headers.
func browserReq(t *testing.T, ts *testServer, method, path, host string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+ts.http+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header.Set("User-Agent", "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.Header.Set("Sec-Fetch-Mode", "cors")
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s (Host %s): %v", method, path, host, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

// TestHTTPHostAllowList: without tokens, a browser's request is answered
// only for a Host on the allow-list, which is what stops a DNS-rebound
// page (whose requests are same-origin to it); scripts may use any name.
func TestHTTPHostAllowList(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{allowedHosts: "queue.lan, .corp.example", corsOrigins: "https://ops.example"})
	_, port, _ := net.SplitHostPort(ts.http)

	// A page of evil.example rebound to this server: its GETs, its POSTs
	// (Origin is its own, so the origin check alone would pass), its
	// event stream, the dashboard page itself.
	evil := "evil.example:" + port
	for _, r := range []struct{ method, path string }{{"GET", "/queues"}, {"GET", "/"}, {"GET", "/health"},
		{"GET", "/events"}, {"POST", "/queues/q/pause"}, {"GET", "/queues/q/jobs"}} {
		code, body := browserReq(t, ts, r.method, r.path, evil, map[string]string{"Origin": "http://" + evil})
		if code != 403 || !strings.Contains(body, `host \"evil.example\" is not allowed`) || !strings.Contains(body, "--allowed-hosts") {
			t.Errorf("rebound %s %s: %d %s", r.method, r.path, code, body)
		}
	}
	if code, _ := browserReq(t, ts, "GET", "/queues", evil, nil); code != 403 {
		t.Errorf("rebound same-origin GET without Origin: %d", code)
	}
	// The names a browser may use.
	for _, h := range []string{"localhost:" + port, "LOCALHOST", "app.localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port,
		"10.1.2.3", "queue.lan:" + port, "queue.lan.", "corp.example", "a.b.corp.example:" + port, "ops.example"} {
		if code, body := browserReq(t, ts, "GET", "/queues", h, nil); code != 200 {
			t.Errorf("Host %s: %d %s", h, code, body)
		}
	}
	for _, h := range []string{"sub.queue.lan", "corp.example.evil", "localhost.evil.example", "127.0.0.1.nip.io"} {
		if code, _ := browserReq(t, ts, "GET", "/queues", h, nil); code != 403 {
			t.Errorf("Host %s: %d, want 403", h, code)
		}
	}
	// A page of a --cors-origins origin calling by any name is a
	// cross-origin call, not a rebound one.
	if code, body := browserReq(t, ts, "POST", "/queues/q/resume", "queue.internal", map[string]string{"Origin": "https://ops.example", "Sec-Fetch-Site": "cross-site"}); code != 200 {
		t.Errorf("configured origin by another name: %d %s", code, body)
	}
	// Each browser header alone marks a browser.
	for _, hdr := range []map[string]string{{"Origin": "http://" + evil, "Sec-Fetch-Site": "", "Sec-Fetch-Mode": "", "User-Agent": "x"},
		{"Sec-Fetch-Mode": "", "User-Agent": "x"}, {"Sec-Fetch-Site": "", "User-Agent": "x"},
		{"Sec-Fetch-Site": "", "Sec-Fetch-Mode": "", "Referer": "http://" + evil + "/", "User-Agent": "x"},
		{"Sec-Fetch-Site": "", "Sec-Fetch-Mode": ""}} {
		if code, _ := browserReq(t, ts, "GET", "/queues", evil, hdr); code != 403 {
			t.Errorf("rebound with only %v: %d", hdr, code)
		}
	}
	// curl, a script, a client library: any name.
	c := newHC(t, ts)
	req, _ := http.NewRequest("GET", c.base+"/queues", nil)
	req.Host = "queued.internal:" + port
	req.Header.Set("User-Agent", "curl/8.5.0")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("a script by host name: %d", res.StatusCode)
	}

	// A WebSocket from the rebound page is refused too; from the
	// server's own page, by its address, it opens.
	if code, _ := wsHandshake(t, ts.http, evil, "http://"+evil); code != 403 {
		t.Errorf("rebound WebSocket: %d", code)
	}
	if code, _ := wsHandshake(t, ts.http, ts.http, "http://"+ts.http); code != 101 {
		t.Errorf("same-origin WebSocket: %d", code)
	}

	// --allowed-hosts '*' turns the check off; tokens make it needless.
	open := startServerHTTP(t, &config{allowedHosts: "*"})
	if code, _ := browserReq(t, open, "GET", "/queues", "evil.example", nil); code != 200 {
		t.Errorf("allowed-hosts *: %d", code)
	}
	tok := startServerHTTP(t, &config{authTokens: "s3cret"})
	if code, _ := browserReq(t, tok, "GET", "/queues", "evil.example", map[string]string{"Authorization": "Bearer s3cret"}); code != 200 {
		t.Errorf("with a token by any name: %d", code)
	}
}

// wsHandshake sends a WebSocket upgrade with the given Host and Origin and
// returns the status.
func wsHandshake(t *testing.T, addr, host, origin string) (int, string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, callTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(callTimeout))
	fmt.Fprintf(nc, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nOrigin: %s\r\n"+
		"User-Agent: Mozilla/5.0\r\n\r\n", host, origin)
	res, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	return res.StatusCode, string(body)
}

// TestHTTPEffectsNeedOrigin: a GET with effects (a pull, a backup, a
// collection) from another site's image or link is refused, as a POST is;
// the server's own pages, an address typed by the user and scripts are
// not.
func TestHTTPEffectsNeedOrigin(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := newHC(t, ts)
	c.ok("POST", "/queues/fx/jobs", map[string]any{"data": 1})
	count := func() int64 { return jnum(t, c.ok("GET", "/queues/fx/count", nil)["count"]) }
	for _, hdr := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"},
		{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate"}, // another port of the same host
		{"Sec-Fetch-Site": "", "Sec-Fetch-Mode": "", "Referer": "http://evil.example/page.html"},
		{"Origin": "null"},
	} {
		code, body := browserReq(t, ts, "GET", "/queues/fx/jobs", ts.http, hdr)
		if code != 403 || !strings.Contains(body, "refused") || !strings.Contains(body, "--cors-origins") {
			t.Errorf("pull with %v: %d %s", hdr, code, body)
		}
		for _, p := range []string{"/backup", "/heapstats"} {
			if code, body := browserReq(t, ts, "GET", p, ts.http, hdr); code != 403 {
				t.Errorf("GET %s with %v: %d %s", p, hdr, code, body)
			}
		}
	}
	if n := count(); n != 1 {
		t.Fatalf("the refused pulls took the job: %d left", n)
	}
	// Reads are not held to the origin: CORS keeps their answers from
	// other pages.
	if code, _ := browserReq(t, ts, "GET", "/queues/fx/count", ts.http, map[string]string{"Sec-Fetch-Site": "cross-site"}); code != 200 {
		t.Errorf("cross-site read: %d", code)
	}
	// The dashboard's own call, a typed address, a script.
	for _, hdr := range []map[string]string{{"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"},
		{"Sec-Fetch-Site": "", "Sec-Fetch-Mode": "", "Referer": "http://" + ts.http + "/"}} {
		c.ok("POST", "/queues/fx/jobs", map[string]any{"data": 1})
		if code, body := browserReq(t, ts, "GET", "/queues/fx/jobs", ts.http, hdr); code != 200 || !strings.Contains(body, `"job":{`) {
			t.Errorf("pull with %v: %d %s", hdr, code, body)
		}
	}
	c.ok("POST", "/queues/fx/jobs", map[string]any{"data": 1})
	if j := c.ok("GET", "/queues/fx/jobs", nil); j["job"] == nil {
		t.Errorf("script pull: %v", j)
	}
	if n := count(); n != 1 { // the one the refused pulls left
		t.Fatalf("%d jobs left", n)
	}
}

// TestHTTPHealthWithTokens: with tokens, /health and /ready tell a caller
// without one whether the server is up, and nothing of its paths, its
// database's address or its storage error; the token shows them.
func TestHTTPHealthWithTokens(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	srv := memServer(b, []string{"tok"}, quietLog())
	api := newHTTPAPI(b.Broker, srv, nil, httpConfig{})
	defer api.Close()
	get := func(path, token string) (int, map[string]any, string) {
		req := httptest.NewRequest("GET", path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		var m map[string]any
		json.Unmarshal(rec.Body.Bytes(), &m)
		return rec.Code, m, rec.Body.String()
	}
	code, m, _ := get("/health", "")
	if code != 200 || len(m) != 2 || m["ok"] != true || m["status"] != "healthy" {
		t.Fatalf("healthy, without the token: %d %v", code, m)
	}
	if _, m, _ := get("/health", "wrong"); len(m) != 2 {
		t.Fatalf("with a wrong token: %v", m)
	}
	if _, m, _ := get("/health", "tok"); m["version"] == nil || m["queues"] == nil || m["storage"] == nil || m["memory"] == nil {
		t.Fatalf("with the token: %v", m)
	}

	// Degraded storage whose error names the database's address.
	b.storage = func() StorageState {
		return StorageState{Driver: "postgres", Location: "queued_private_ns", Since: time.Now(),
			Err: pgErr(errors.New("dial tcp 10.9.8.7:5432: connect: connection refused"))}
	}
	code, m, raw := get("/health", "")
	if code != 503 || len(m) != 2 || m["status"] != "degraded" || strings.Contains(raw, "10.9.8.7") || strings.Contains(raw, "queued_private_ns") {
		t.Fatalf("degraded, without the token: %d %s", code, raw)
	}
	code, _, raw = get("/ready", "")
	if code != 503 || strings.Contains(raw, "10.9.8.7") || !strings.Contains(raw, "storage writes are failing") {
		t.Fatalf("/ready without the token: %d %s", code, raw)
	}
	code, m, raw = get("/health", "tok")
	if code != 503 || !strings.Contains(raw, "10.9.8.7") || jobj(t, m["storage"])["path"] != "queued_private_ns" {
		t.Fatalf("degraded, with the token: %d %s", code, raw)
	}
	if _, _, raw := get("/ready", "tok"); !strings.Contains(raw, "10.9.8.7") {
		t.Fatalf("/ready with the token: %s", raw)
	}
}

// TestHTTPPagingOverflow: offsets and limits at the ends of int64 page
// like any other number (they used to overflow into a slice panic).
func TestHTTPPagingOverflow(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := newHC(t, ts)
	tc := dial(t, ts.addr)
	for _, q := range []string{"pa", "pb", "pc"} {
		c.ok("POST", "/queues/"+q+"/jobs", map[string]any{"data": 1})
	}
	max := fmt.Sprint(int64(math.MaxInt64))
	for _, tcase := range []struct {
		query string
		n     int
	}{{"offset=" + max, 0}, {"offset=" + max + "&limit=500", 0}, {"offset=1&limit=" + max, 2},
		{"offset=-" + max, 3}, {"offset=2", 1}, {"limit=-5", 1}} {
		m := c.ok("GET", "/dashboard/queues?"+tcase.query, nil)
		if got := len(jarr(t, m["queues"])); got != tcase.n {
			t.Errorf("/dashboard/queues?%s: %d queues, want %d", tcase.query, got, tcase.n)
		}
	}

	// The dead-letter queue: over HTTP and through the Dlq command's
	// filter, with more entries than the 1,023 that let a huge limit
	// overflow.
	const n = 1100
	jobs := make([]any, n)
	for i := range jobs {
		jobs[i] = map[string]any{"name": "d", "data": i}
	}
	ids := list(t, tc.ok(map[string]any{"cmd": "PUSHB", "queue": "dl", "jobs": jobs}), "ids")
	for _, id := range ids {
		tc.ok(map[string]any{"cmd": "Discard", "id": id})
	}
	bigLimit := "9223372036854774784" // the largest float64 below 2^63
	for _, tcase := range []struct {
		query string
		n     int
	}{{"offset=" + max, 0}, {"offset=1050&limit=" + bigLimit, n - 1050}, {"offset=1e300&limit=1e300", 0},
		{"offset=NaN&limit=3", 3}, {"offset=-1e300&limit=" + bigLimit, n}, {"offset=5&limit=-1e300", 0}} {
		m := c.ok("GET", "/queues/dl/dlq?"+tcase.query, nil)
		if got := len(jarr(t, m["entries"])); got != tcase.n || jnum(t, m["total"]) != n {
			t.Errorf("/queues/dl/dlq?%s: %d entries of %v, want %d", tcase.query, got, m["total"], tcase.n)
		}
	}
	for _, f := range []map[string]any{{"offset": int64(1), "limit": int64(math.MaxInt64)}, {"offset": int64(math.MaxInt64), "limit": int64(math.MaxInt64)}} {
		a := tc.call(map[string]any{"cmd": "Dlq", "queue": "dl", "filter": f})
		if a["ok"] != true {
			t.Fatalf("Dlq with %v: %v", f, a)
		}
	}
	if got := len(list(t, tc.ok(map[string]any{"cmd": "Dlq", "queue": "dl", "filter": map[string]any{"offset": int64(1), "limit": int64(math.MaxInt64)}}), "entries")); got != n-1 {
		t.Fatalf("Dlq offset 1, limit MaxInt64: %d entries", got)
	}
}

// blockingWriter is a ResponseWriter whose writes wait for release, or
// fail once failed is set: a slow client, or one that hung up.
type blockingWriter struct {
	h       http.Header
	code    int
	n       int
	started chan struct{}
	release chan struct{}
	once    sync.Once
	fail    bool
}

func newBlockingWriter(fail bool) *blockingWriter {
	return &blockingWriter{h: http.Header{}, started: make(chan struct{}), release: make(chan struct{}), fail: fail}
}

func (w *blockingWriter) Header() http.Header { return w.h }
func (w *blockingWriter) WriteHeader(c int)   { w.code = c }
func (w *blockingWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = 200
	}
	w.once.Do(func() { close(w.started) })
	if w.fail {
		return 0, errors.New("connection reset by peer")
	}
	<-w.release
	w.n += len(b)
	return len(b), nil
}

// downloads lists the backup copies beside the database.
func downloads(t *testing.T, dataPath string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Dir(dataPath))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), downloadPrefix(dataPath)) {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestHTTPBackupDownloadOneAtATime: a second GET /backup while one is
// being sent is answered 429, and the copy on disk goes when the request
// ends, whether the client read it all, hung up, or the server shut down.
func TestHTTPBackupDownloadOneAtATime(t *testing.T) {
	t.Parallel()
	live := filepath.Join(t.TempDir(), "live.db")
	b, st, _ := openTestStore(t, live)
	defer st.Close()
	defer b.Close()
	pushN(t, b, st, "bk", 2000)
	api := newHTTPAPI(b.Broker, memServer(b, nil, quietLog()), nil, httpConfig{dataPath: live, dataFile: st})
	defer api.Close()

	slow := newBlockingWriter(false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		api.ServeHTTP(slow, httptest.NewRequest("GET", "/backup", nil))
	}()
	select {
	case <-slow.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the first download did not start")
	}
	if got := downloads(t, live); len(got) != 1 {
		t.Fatalf("copies while sending: %v", got)
	}
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequest("GET", "/backup", nil))
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "one at a time") {
		t.Fatalf("second download: %d %v %.200q", rec.Code, rec.Header(), rec.Body.String())
	}
	if got := downloads(t, live); len(got) != 1 {
		t.Fatalf("copies after the refused one: %v", got)
	}
	close(slow.release)
	<-done
	if slow.code != 200 || fmt.Sprint(slow.n) != slow.h.Get("Content-Length") {
		t.Fatalf("first download: %d, %d bytes of %s", slow.code, slow.n, slow.h.Get("Content-Length"))
	}
	if got := downloads(t, live); len(got) != 0 {
		t.Fatalf("copies left after a download: %v", got)
	}

	// A client that hangs up.
	gone := newBlockingWriter(true)
	api.ServeHTTP(gone, httptest.NewRequest("GET", "/backup", nil))
	if got := downloads(t, live); len(got) != 0 {
		t.Fatalf("copies left after a client hung up: %v", got)
	}
	// A request cancelled before the copy is made.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec = httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequest("GET", "/backup", nil).WithContext(ctx))
	if rec.Code != 500 || len(downloads(t, live)) != 0 {
		t.Fatalf("cancelled: %d %s, copies %v", rec.Code, rec.Body.String(), downloads(t, live))
	}
	// The slot is free again.
	rec = httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequest("GET", "/backup", nil))
	if rec.Code != 200 || !strings.HasPrefix(rec.Body.String(), "SQLite format 3\x00") {
		t.Fatalf("third download: %d", rec.Code)
	}
	// Shutdown ends a download in progress.
	slow = newBlockingWriter(false)
	done = make(chan struct{})
	go func() {
		defer close(done)
		api.ServeHTTP(slow, httptest.NewRequest("GET", "/backup", nil))
	}()
	<-slow.started
	api.Close()
	close(slow.release)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the download outlived shutdown")
	}
	if slow.n >= 2*downloadChunk || len(downloads(t, live)) != 0 {
		t.Fatalf("after shutdown: %d bytes sent, copies %v", slow.n, downloads(t, live))
	}
}

// TestHTTPBackupStaleCopiesRemovedAtStart: copies a killed server left
// beside its database are gone once the next one has started; other
// files there are not touched.
func TestHTTPBackupStaleCopiesRemovedAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	live := filepath.Join(dir, "live.db")
	stale := filepath.Join(dir, downloadPrefix(live)+"123456")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "backup.db"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, ".other.db.download-1")
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, httpAddr, stop := startSQLiteServer(t, live, "")
	defer stop()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale copy still there: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("another database's file was removed: %v", err)
	}
	// And a download through the running server leaves nothing.
	res, err := http.Get("http://" + httpAddr + "/backup")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("download: %d", res.StatusCode)
	}
	// The handler removes it once the answer is sent.
	eventually(t, 10*time.Second, "the copy removed", func() (bool, string) {
		got := downloads(t, live)
		return len(got) == 0, fmt.Sprint(got)
	})
}

// TestBrowserRebindingAndCrossSite runs the attacks in headless Chromium
// (skipped where it is not installed, but in CI): a page of another site
// loads an image from the pull route, posts a no-cors form-like request
// and opens a WebSocket; a page whose name was rebound to the server (the
// browser's resolver maps rebound.test to 127.0.0.1) fetches the pull
// route same-origin. The job stays waiting and the queue unpaused; the
// dashboard opened by localhost still works.
func TestBrowserRebindingAndCrossSite(t *testing.T) {
	t.Parallel()
	d := startBrowser(t, "--host-resolver-rules=MAP evil.test 127.0.0.1, MAP rebound.test 127.0.0.1")
	ts := startServerHTTP(t, nil)
	_, port, _ := net.SplitHostPort(ts.http)
	c := newHC(t, ts)
	c.ok("POST", "/queues/xs/jobs", map[string]any{"data": 1})

	target := "http://127.0.0.1:" + port
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><img src="%[1]s/queues/xs/jobs?timeout=0" onload="window.img=1" onerror="window.img=1">
<script>
fetch('%[1]s/queues/xs/pause', {method: 'POST', mode: 'no-cors'}).finally(() => { window.post = 1; });
const ws = new WebSocket('%[2]s/ws');
ws.onopen = () => { ws.send(JSON.stringify({cmd: 'PULL', queue: 'xs', timeout: 0, reqId: '1'})); };
ws.onmessage = (m) => { window.wsAnswer = String(m.data); };
ws.onclose = () => { window.wsDone = 1; };
</script>`, target, "ws://127.0.0.1:"+port)
	}))
	defer evil.Close()
	_, evilPort, _ := net.SplitHostPort(evil.Listener.Addr().String())
	d.must("POST", "/url", map[string]string{"url": "http://evil.test:" + evilPort + "/"})
	d.waitFor(10*time.Second, "the attacking page's requests to end", func() (bool, error) {
		return d.script(`return String(window.img && window.post && window.wsDone)`) == "1", nil
	})
	if a := d.script(`return window.wsAnswer || ''`); a != "" {
		t.Errorf("the cross-site WebSocket was answered: %s", a)
	}

	// The rebound page: its script fetches the pull route, same-origin.
	d.must("POST", "/url", map[string]string{"url": "http://rebound.test:" + port + "/"})
	if body := d.script(`return document.body.innerText`); !strings.Contains(body, "is not allowed") {
		t.Errorf("the dashboard by a rebound name: %q", body)
	}
	v := d.must("POST", "/execute/async", map[string]any{"args": []any{}, "script": `const done = arguments[0];
fetch('/queues/xs/jobs?timeout=0').then(r => r.text().then(t => done(r.status + ' ' + t))).catch(e => done('error ' + e));`})
	var got string
	json.Unmarshal(v, &got)
	if !strings.HasPrefix(got, "403 ") {
		t.Errorf("the rebound page's pull: %s", got)
	}

	if n := jnum(t, c.ok("GET", "/queues/xs/count", nil)["count"]); n != 1 {
		t.Errorf("the job was taken: %d waiting", n)
	}
	if p := c.ok("GET", "/queues/xs/paused", nil); p["paused"] != false {
		t.Errorf("the queue was paused: %v", p)
	}

	// The dashboard by localhost, and its own pull from the page.
	d.must("POST", "/url", map[string]string{"url": "http://localhost:" + port + "/"})
	d.waitFor(10*time.Second, "the dashboard by localhost", func() (bool, error) {
		return d.script(`return document.getElementById('live') ? document.getElementById('live').className : ''`) == "live on", nil
	})
	v = d.must("POST", "/execute/async", map[string]any{"args": []any{}, "script": `const done = arguments[0];
fetch('/queues/xs/jobs?timeout=0').then(r => r.json().then(j => done(r.status + ' ' + (j.job ? 'job' : 'none')))).catch(e => done('error ' + e));`})
	json.Unmarshal(v, &got)
	if got != "200 job" {
		t.Errorf("the dashboard's own pull: %s", got)
	}
}
