package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLogFormatJSON: LOG_FORMAT=json, as the reference reads it, makes
// every log line one JSON object, from the start line to the stop.
func TestLogFormatJSON(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, queuedBinary(t), "serve", "--memory", "--host", "127.0.0.1", "--tcp-port", "0",
		"--http-port", fmt.Sprint(freePort(t)))
	cmd.Env = append(os.Environ(), "LOG_FORMAT=json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.Contains(sc.Text(), `"msg":"queued started"`) {
			cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("server: %v\n%s", err, strings.Join(lines, "\n"))
	}
	if len(lines) < 3 {
		t.Fatalf("only %d log lines:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil || m["msg"] == nil || m["level"] == nil || m["time"] == nil {
			t.Fatalf("not a JSON log object: %q (%v)", l, err)
		}
	}
	t.Logf("%d lines, each a JSON object; the first: %s", len(lines), lines[0])
}

// TestLogJSONDurations: a duration in a JSON log line reads as in the
// text log ("30s"), not as the nanoseconds slog's JSON writes by default
// (the drain's "left":20000000000, found by a newcomer's read).
func TestLogJSONDurations(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l, err := newLogger(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("draining", "left", 30*time.Second, "took", 1500*time.Millisecond)
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m["left"] != "30s" || m["took"] != "1.5s" {
		t.Fatalf("durations in a JSON line: %s", buf.String())
	}
}

// TestHealthcheckCommand: queued healthcheck exits 0 for a server that
// answers healthy, and 1 for one that does not answer, answers otherwise,
// or redirects; it prints nothing of the answer.
//
// Serial: it sets environment variables (t.Setenv).
func TestHealthcheckCommand(t *testing.T) {
	srv := startBinary(t, "--memory")
	probe := func(args ...string) (int, string) {
		var out, errs bytes.Buffer
		code := runHealthcheck(args, &out, &errs)
		return code, out.String() + errs.String()
	}
	if code, out := probe(fmt.Sprintf("http://127.0.0.1:%d/health", srv.httpPort)); code != 0 || out != "healthy\n" {
		t.Fatalf("a healthy server: exit %d, %q", code, out)
	}
	t.Setenv("HTTP_PORT", fmt.Sprint(srv.httpPort))
	if code, _ := probe(); code != 0 {
		t.Fatalf("the default URL on HTTP_PORT: exit %d", code)
	}
	degraded := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			http.Redirect(w, r, "/health", http.StatusFound)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"ok":true,"status":"degraded","secret":"do-not-print"}`))
	}))
	defer degraded.Close()
	for _, args := range [][]string{{degraded.URL + "/health"}, {degraded.URL + "/moved"}, {"ftp://127.0.0.1/"},
		{"a", "b"}, {fmt.Sprintf("http://127.0.0.1:%d/health", freePort(t))}} {
		code, out := probe(args...)
		if code != 1 || out != "Health check failed\n" {
			t.Fatalf("%v: exit %d, %q", args, code, out)
		}
	}
}

// referenceServerSettings are the environment variables the reference's
// server reads: those its dist reads outside the client, the MCP server
// and the command line.
func referenceServerSettings(t *testing.T) map[string]bool {
	t.Helper()
	dir, _ := compatDir(t)
	root := filepath.Join(dir, "node_modules", "bunqueue", "dist")
	re := regexp.MustCompile(`(?:Bun|process)\.env\.([A-Z][A-Z0-9_]+)`)
	out := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() && (rel == "client" || rel == "mcp" || rel == "cli") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".js") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 50 {
		t.Fatalf("only %d settings found in %s", len(out), root)
	}
	return out
}

// honouredSettings are the variables queued's code reads: named as a
// string in a source file (a flag's environment list, a direct read), other
// than settings.go, which lists those it does not.
func honouredSettings(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	lit := regexp.MustCompile(`"([A-Z][A-Z0-9]*_[A-Z0-9_]+|HOST)"`)
	out := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "settings.go" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
	}
	return out
}

// TestReferenceSettingsAccounted: every variable the reference's server
// reads is honoured (queued's code reads it) or listed in ignoredSettings
// with a reason, and docs/compatibility.md lists those; nothing is both, and the
// list names nothing the reference does not read.
func TestReferenceSettingsAccounted(t *testing.T) {
	t.Parallel()
	ref, ours := referenceServerSettings(t), honouredSettings(t)
	docs, err := os.ReadFile("docs/compatibility.md")
	if err != nil {
		t.Fatal(err)
	}
	honoured := 0
	for name := range ref {
		_, ignored := ignoredSettings[name]
		switch {
		case ours[name] && ignored:
			t.Errorf("%s is honoured and listed as ignored", name)
		case ours[name]:
			honoured++
		case !ignored:
			t.Errorf("the reference reads %s: honour it or list it in ignoredSettings with why", name)
		case !strings.Contains(string(docs), "| `"+name+"` |"):
			t.Errorf("docs/compatibility.md does not list %s, which queued does not honour", name)
		}
	}
	for name := range ignoredSettings {
		if !ref[name] {
			t.Errorf("ignoredSettings lists %s, which the reference does not read", name)
		}
	}
	t.Logf("%d settings of the reference: %d honoured, %d not (listed with why)", len(ref), honoured, len(ref)-honoured)
}

// TestIgnoredSettingWarned: a reference setting queued does not honour is
// named in a warning at start, with why, and without its value.
//
// Serial: it sets environment variables (t.Setenv).
func TestIgnoredSettingWarned(t *testing.T) {
	t.Setenv("BUNQUEUE_CLOUD_API_KEY", "sekrit-value")
	var buf bytes.Buffer
	warnIgnoredSettings(slog.New(slog.NewTextHandler(&buf, nil)))
	if out := buf.String(); !strings.Contains(out, "name=BUNQUEUE_CLOUD_API_KEY") || !strings.Contains(out, "bunqueue Cloud") ||
		strings.Contains(out, "sekrit") {
		t.Fatalf("warning: %q", out)
	}
}

// TestStatsIntervalLine: STATS_INTERVAL_MS makes the server log a line of
// queue statistics that often, as the reference does.
//
// Serial: it sets environment variables (t.Setenv).
func TestStatsIntervalLine(t *testing.T) {
	t.Setenv("STATS_INTERVAL_MS", "100")
	srv := startBinary(t, "--memory")
	c := dial(t, srv.addr())
	c.ok(map[string]any{"cmd": "PUSH", "queue": "st", "data": 1})
	eventually(t, 20*time.Second, "a statistics line counting the job", func() (bool, string) {
		return strings.Contains(srv.output(), `msg="queue statistics" waiting=1`), srv.output()
	})
}

// TestWorkerTimeoutSetting: WORKER_TIMEOUT_MS is how long a silent worker
// stays active, as in the reference.
//
// Serial: it sets environment variables (t.Setenv).
func TestWorkerTimeoutSetting(t *testing.T) {
	t.Setenv("WORKER_TIMEOUT_MS", "300")
	srv := startBinary(t, "--memory")
	c := dial(t, srv.addr())
	c.ok(map[string]any{"cmd": "RegisterWorker", "name": "quiet", "queues": []any{"q"}})
	status := func() string {
		ws := c.ok(map[string]any{"cmd": "ListWorkers"})["data"].(map[string]any)["workers"].([]any)
		return ws[0].(map[string]any)["status"].(string)
	}
	first := status()
	eventually(t, 20*time.Second, "the silent worker stale", func() (bool, string) {
		st := status()
		return st == "stale", st
	})
	if first != "active" {
		t.Fatalf("a worker just registered is %q", first)
	}
}

// TestWebhookRetrySettings: WEBHOOK_MAX_RETRIES and WEBHOOK_RETRY_DELAY_MS
// are how many times a failing delivery is tried, and how far apart.
//
// Serial: it sets environment variables (t.Setenv).
func TestWebhookRetrySettings(t *testing.T) {
	recv := newSwitchReceiver(t)
	recv.hang.Store(true)
	ls := newLocalServer(t)
	h, err := newWebhooks(ls.b.Broker, webhookOptions{allowPrivate: true, attempts: 5, retryDelay: 5 * time.Millisecond,
		attemptTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ls.srv.hooks = h
	ls.ok(M{"cmd": "AddWebhook", "url": recv.srv.URL, "events": []any{"job.pushed"}})
	ls.ok(M{"cmd": "PUSH", "queue": "q", "data": 0})
	eventually(t, 20*time.Second, "the delivery given up", func() (bool, string) {
		w := hookState(t, ls)
		return num(t, w["failureCount"]) == 1, fmt.Sprint(w)
	})
	if got := recv.requests(); got != 5 {
		t.Fatalf("%d attempts, want the 5 asked for", got)
	}
	t.Setenv("WEBHOOK_MAX_RETRIES", "7")
	t.Setenv("WEBHOOK_RETRY_DELAY_MS", "250")
	fs, c := serverFlags(io.Discard)
	if err := fs.Parse(nil); err != nil || c.webhookRetries != 7 || c.webhookRetryDelay != 250 {
		t.Fatalf("from the environment: %d attempts, %d ms (%v)", c.webhookRetries, c.webhookRetryDelay, err)
	}
}

// TestReferenceAliasSettings: the reference's other names for the data
// file and the S3 bucket and endpoint, and its PostgreSQL pool size, set
// what the reference's set.
//
// Serial: it sets environment variables (t.Setenv).
func TestReferenceAliasSettings(t *testing.T) {
	t.Setenv("SQLITE_PATH", "/tmp/from-sqlite-path.db")
	t.Setenv("AWS_BUCKET", "from-aws-bucket")
	t.Setenv("AWS_ENDPOINT", "http://from-aws-endpoint:9000")
	t.Setenv("BUNQUEUE_POSTGRES_POOL_SIZE", "12")
	t.Setenv("TCP_IDLE_TIMEOUT_MS", "400") // TestHostileStalledFrame: what it does
	fs, c := serverFlags(io.Discard)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if c.tcpIdleTimeout != 400 {
		t.Fatalf("TCP_IDLE_TIMEOUT_MS read as %d", c.tcpIdleTimeout)
	}
	if c.dataPath != "/tmp/from-sqlite-path.db" || c.backup.bucket != "from-aws-bucket" ||
		c.backup.endpoint != "http://from-aws-endpoint:9000" || c.pgSession.poolSize != 12 {
		t.Fatalf("read: data %q, bucket %q, endpoint %q, pool %d", c.dataPath, c.backup.bucket, c.backup.endpoint, c.pgSession.poolSize)
	}
	ns := pgTestNamespace(t)
	session := defaultPGSession
	// BUNQUEUE_BROKER_ID names the broker's sessions; its own id stays
	// unique.
	session.brokerID = "edge-7"
	named := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{session: &session})
	ctx, conn := pgTestConn(t)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, pgAppName(ns, "edge-7")).Scan(&n); err != nil || n == 0 {
		t.Fatalf("sessions named %q: %d (%v)", pgAppName(ns, "edge-7"), n, err)
	}
	if !strings.HasPrefix(named.pg.broker, "edge-7/") || len(named.pg.broker) <= len("edge-7/") {
		t.Fatalf("the broker's id: %q", named.pg.broker)
	}
	session.brokerID = ""
	for _, c := range []struct{ asked, want int32 }{{12, 12}, {4, pgMinPool}} {
		session.poolSize = int(c.asked)
		p := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{session: &session})
		if got := p.pg.pool.Config().MaxConns; got != c.want {
			t.Fatalf("asked for %d, the pool allows %d connections, want %d", c.asked, got, c.want)
		}
	}
}

// TestRequestLimiter: with RATE_LIMIT_MAX_REQUESTS, a client past the
// limit within the window is refused, on TCP with "Rate limit exceeded"
// and over HTTP with 429, and ratelimit:hit names it; another client, and
// the health probe, are not held back.
func TestRequestLimiter(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{rateLimitMax: 5, rateLimitWindow: 60000, trustedProxies: "127.0.0.1"})
	c := dial(t, ts.addr)
	for i := range 5 {
		c.ok(map[string]any{"cmd": "Ping", "n": i})
	}
	if msg := c.fail(map[string]any{"cmd": "Ping"}); msg != "Rate limit exceeded" {
		t.Fatalf("the sixth request: %q", msg)
	}
	other := dial(t, ts.addr)
	other.ok(map[string]any{"cmd": "Ping"})

	get := func(path, client string) int {
		req, _ := http.NewRequest("GET", "http://"+ts.http+path, nil)
		req.Header.Set("X-Forwarded-For", "10.0.0.1, "+client) // the proxy, 127.0.0.1, added client
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 5 {
		if code := get("/queues", "203.0.113.7"); code != 200 {
			t.Fatalf("within the limit: %d", code)
		}
	}
	if code := get("/queues", "203.0.113.7"); code != http.StatusTooManyRequests {
		t.Fatalf("past the limit: %d, want 429", code)
	}
	if code := get("/health", "203.0.113.7"); code != 200 {
		t.Fatalf("/health past the limit: %d", code)
	}
	if code := get("/queues", "203.0.113.8"); code != 200 {
		t.Fatalf("another client: %d", code)
	}
	// Off by default.
	free := startServer(t, nil)
	fc := dial(t, free.addr)
	for range 50 {
		fc.ok(map[string]any{"cmd": "Ping"})
	}
}

// TestReqLimiterSlides: the window slides: a client at the limit is let
// through again as the counted requests age out of it.
func TestReqLimiterSlides(t *testing.T) {
	t.Parallel()
	var now int64 = 1_000_000
	l := newReqLimiter(10, time.Second, func() int64 { return now })
	var c reqWindow
	for i := range 10 {
		if !l.allowConn(&c) {
			t.Fatalf("request %d refused", i)
		}
	}
	if l.allowConn(&c) {
		t.Fatal("the eleventh within the window allowed")
	}
	now += 1500 // half the window holds the ten: about five count
	n := 0
	for l.allowConn(&c) {
		n++
	}
	if n < 4 || n > 6 {
		t.Fatalf("half a window on, %d allowed, want about 5", n)
	}
	now += 2000
	if !l.allowConn(&c) {
		t.Fatal("two windows on, refused")
	}
}

// TestUnixSockets: TCP_SOCKET_PATH and HTTP_SOCKET_PATH serve the wire
// protocol and HTTP on Unix sockets instead of ports, as the reference's
// do; a socket file left behind is replaced, and the files go at the stop.
func TestUnixSockets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tcpSock, httpSock := filepath.Join(dir, "q.sock"), filepath.Join(dir, "http.sock")
	stale, err := net.Listen("unix", tcpSock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close() // a socket file with nobody behind it, as a killed server leaves
	ts := startServerHTTP(t, &config{tcpSocket: tcpSock, httpSocket: httpSock})
	c := dial(t, "unix:"+tcpSock)
	c.ok(map[string]any{"cmd": "PUSH", "queue": "sock", "data": 1})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", httpSock)
	}}}
	resp, err := hc.Get("http://localhost/queues/sock/counts")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"waiting":1`) {
		t.Fatalf("HTTP over the socket: %d %s", resp.StatusCode, body)
	}
	c.close()
	ts.stop(15 * time.Second)
	for _, p := range []string{tcpSock, httpSock} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left after the stop (%v)", p, err)
		}
	}
}
