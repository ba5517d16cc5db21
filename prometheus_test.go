package main

import (
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// promSample is one sample line.
type promSample struct {
	name, labels string
	value        float64
}

// promFamily is one HELP/TYPE block and its samples.
type promFamily struct {
	name, typ, help string
	samples         []promSample
}

var promSampleRe = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*)\})? (\S+)$`)

// parseProm reads the exposition text line by line and checks its form:
// blocks of HELP, TYPE, samples, separated by one empty line, a final
// newline, every sample under its own family.
func parseProm(t *testing.T, text string) map[string]*promFamily {
	t.Helper()
	if !strings.HasSuffix(text, "\n") || strings.HasSuffix(text, "\n\n") {
		t.Fatalf("the text must end with exactly one newline")
	}
	fams := map[string]*promFamily{}
	for bi, block := range strings.Split(strings.TrimSuffix(text, "\n"), "\n\n") {
		lines := strings.Split(block, "\n")
		if len(lines) < 3 {
			t.Fatalf("block %d has no samples: %q", bi, block)
		}
		help, ok := strings.CutPrefix(lines[0], "# HELP ")
		if !ok {
			t.Fatalf("block %d does not start with HELP: %q", bi, lines[0])
		}
		name, helpText, _ := strings.Cut(help, " ")
		if helpText == "" {
			t.Errorf("%s: empty HELP", name)
		}
		typ, ok := strings.CutPrefix(lines[1], "# TYPE "+name+" ")
		if !ok {
			t.Fatalf("%s: second line is not its TYPE: %q", name, lines[1])
		}
		if fams[name] != nil {
			t.Fatalf("%s: two blocks", name)
		}
		f := &promFamily{name: name, typ: typ, help: helpText}
		fams[name] = f
		for _, l := range lines[2:] {
			m := promSampleRe.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("%s: malformed sample line %q", name, l)
			}
			v, err := strconv.ParseFloat(m[4], 64)
			if err != nil {
				t.Fatalf("%s: value %q: %v", name, m[4], err)
			}
			s := promSample{name: m[1], labels: m[3], value: v}
			switch {
			case s.name == name:
			case typ == "histogram" && (s.name == name+"_bucket" || s.name == name+"_sum" || s.name == name+"_count"):
			default:
				t.Fatalf("sample %s inside the block of %s", s.name, name)
			}
			f.samples = append(f.samples, s)
		}
	}
	return fams
}

// checkPromConventions applies Prometheus' naming rules and checks every
// histogram's buckets.
func checkPromConventions(t *testing.T, fams map[string]*promFamily) {
	t.Helper()
	for name, f := range fams {
		if !strings.HasPrefix(name, "queued_") {
			t.Errorf("%s: not queued_-prefixed", name)
		}
		switch f.typ {
		case "counter":
			if !strings.HasSuffix(name, "_total") {
				t.Errorf("counter %s does not end in _total", name)
			}
		case "gauge":
			if strings.HasSuffix(name, "_total") {
				t.Errorf("gauge %s ends in _total", name)
			}
		case "histogram":
			checkHistogram(t, f)
		default:
			t.Errorf("%s: type %q", name, f.typ)
		}
		for _, bad := range []string{"_ms", "_milliseconds", "_mb", "_kb"} {
			if strings.Contains(name, bad) {
				t.Errorf("%s: not in base units", name)
			}
		}
		for _, s := range f.samples {
			if s.value < 0 {
				t.Errorf("%s{%s} = %v", s.name, s.labels, s.value)
			}
		}
	}
}

func checkHistogram(t *testing.T, f *promFamily) {
	t.Helper()
	var prevLE, prevCount float64 = -1, 0
	var inf, count float64 = -1, -1
	hasSum := false
	for _, s := range f.samples {
		switch s.name {
		case f.name + "_bucket":
			le, ok := strings.CutPrefix(s.labels, `le="`)
			le = strings.TrimSuffix(le, `"`)
			if !ok {
				t.Fatalf("%s: bucket labels %q", f.name, s.labels)
			}
			bound, err := strconv.ParseFloat(le, 64)
			if le == "+Inf" {
				inf, err = s.value, nil
				bound = prevLE + 1
			}
			if err != nil || bound <= prevLE {
				t.Errorf("%s: le %q after %v", f.name, le, prevLE)
			}
			if s.value < prevCount {
				t.Errorf("%s: bucket le=%s holds %v, less than the one before (%v): not cumulative", f.name, le, s.value, prevCount)
			}
			prevLE, prevCount = bound, s.value
		case f.name + "_sum":
			hasSum = true
		case f.name + "_count":
			count = s.value
		}
	}
	if inf < 0 || count < 0 || !hasSum || inf != count {
		t.Errorf("%s: +Inf bucket %v, count %v, sum present %v", f.name, inf, count, hasSum)
	}
}

func promValue(t *testing.T, fams map[string]*promFamily, name, labels string) float64 {
	t.Helper()
	f := fams[name]
	for _, suffix := range []string{"_count", "_sum", "_bucket"} {
		if base, ok := strings.CutSuffix(name, suffix); f == nil && ok {
			f = fams[base]
		}
	}
	if f == nil {
		t.Fatalf("no metric %s", name)
	}
	for _, s := range f.samples {
		if s.name == name && s.labels == labels {
			return s.value
		}
	}
	t.Fatalf("no sample %s{%s}", name, labels)
	return 0
}

func TestProtoPrometheus(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	for i := 0; i < 3; i++ {
		c.ok(M{"cmd": "PUSH", "queue": "pa", "data": i})
	}
	c.ok(M{"cmd": "PUSH", "queue": "pa", "data": "p", "priority": 5})
	c.ok(M{"cmd": "PUSH", "queue": "pb", "data": 1, "delay": 60000})
	c.ok(M{"cmd": "PUSH", "queue": "pc", "data": 1, "maxAttempts": 2})
	id := sub(t, c.ok(M{"cmd": "PULL", "queue": "pc"}), "job")["id"]
	c.ok(M{"cmd": "FAIL", "id": id, "error": "once"})
	id = sub(t, c.ok(M{"cmd": "PULL", "queue": "pa"}), "job")["id"]
	c.ok(M{"cmd": "ACK", "id": id})
	c.ok(M{"cmd": "AddWebhook", "url": "https://hooks.example.com/x", "events": []any{}})

	d := sub(t, c.ok(M{"cmd": "Prometheus"}), "data")
	text := str(t, d, "metrics")
	fams := parseProm(t, text)
	checkPromConventions(t, fams)

	for _, tc := range []struct {
		name, labels string
		want         float64
	}{
		// pa keeps its three priority-0 jobs (the priority-5 one was
		// pulled first); pc's retried job waits out its backoff (1 s or
		// more), so it is delayed, as pb's is.
		{"queued_jobs_waiting", "", 3},
		{"queued_jobs_prioritized", "", 0},
		{"queued_jobs_delayed", "", 2},
		{"queued_jobs_pushed_total", "", 6},
		{"queued_jobs_pulled_total", "", 2},
		{"queued_jobs_completed_total", "", 1},
		{"queued_jobs_retried_total", "", 1},
		{"queued_queue_jobs_waiting", `queue="pa"`, 3},
		{"queued_queue_jobs_prioritized", `queue="pa"`, 0},
		{"queued_queue_jobs_delayed", `queue="pb"`, 1},
		{"queued_queue_jobs_pushed_total", `queue="pa"`, 4},
		{"queued_queue_jobs_completed_total", `queue="pa"`, 1},
		{"queued_queue_jobs_retried_total", `queue="pc"`, 1},
		{"queued_queue_metrics_exported", "", 3},
		{"queued_queue_metrics_omitted", "", 0},
		{"queued_webhooks_registered", "", 1},
		{"queued_connections", "", 1},
		{"queued_push_duration_seconds_count", "", 6},
		{"queued_ack_duration_seconds_count", "", 1},
		{"queued_job_processing_seconds_count", "", 1},
	} {
		if got := promValue(t, fams, tc.name, tc.labels); got != tc.want {
			t.Errorf("%s{%s} = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if got := promValue(t, fams, "queued_job_wait_seconds_count", ""); got != 2 {
		t.Errorf("job wait observations %v, want 2 (first pulls only)", got)
	}
	for _, name := range []string{"queued_goroutines", "queued_go_heap_alloc_bytes", "queued_uptime_seconds", "queued_start_time_seconds"} {
		if fams[name] == nil || fams[name].typ != "gauge" {
			t.Errorf("%s missing or not a gauge", name)
		}
	}
	if fams["queued_sqlite_database_size_bytes"] != nil {
		t.Errorf("an SQLite figure in memory mode")
	}
	if f := fams["queued_build_info"]; f == nil || !strings.Contains(f.samples[0].labels, `version="`+version+`"`) || f.samples[0].value != 1 {
		t.Errorf("build info: %+v", f)
	}
}

// Past the cardinality limit, the first queues created keep their series
// and the rest are counted as omitted.
func TestPrometheusQueueLimit(t *testing.T) {
	ls := newLocalServer(t)
	for i := 0; i < maxPromQueues+2; i++ {
		ls.ok(M{"cmd": "PUSH", "queue": "q" + strconv.Itoa(i), "data": i})
	}
	fams := parseProm(t, string(ls.srv.prometheusText()))
	checkPromConventions(t, fams)
	if got := promValue(t, fams, "queued_queue_metrics_exported", ""); got != maxPromQueues {
		t.Errorf("exported %v", got)
	}
	if got := promValue(t, fams, "queued_queue_metrics_omitted", ""); got != 2 {
		t.Errorf("omitted %v", got)
	}
	f := fams["queued_queue_jobs_waiting"]
	if len(f.samples) != maxPromQueues || f.samples[0].labels != `queue="q0"` || f.samples[maxPromQueues-1].labels != `queue="q99"` {
		t.Errorf("per-queue series: %d, first %q", len(f.samples), f.samples[0].labels)
	}
}

func TestPromLabelEscaping(t *testing.T) {
	if got := promLabel("a\\b\"c\nd"); got != `"a\\b\"c\nd"` {
		t.Fatalf("%s", got)
	}
}

// GET /metrics and /prometheus serve the same exposition over HTTP, under
// the bearer token when tokens are set; on SQLite it has the file sizes.
func TestHTTPMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	tcp, httpAddr, stop := startSQLiteServer(t, path, "tok")
	defer stop()
	c := dial(t, tcp)
	c.ok(M{"cmd": "Auth", "token": "tok"})
	c.ok(M{"cmd": "PUSH", "queue": "h", "data": 1, "durable": true})
	get := func(route, token string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", "http://"+httpAddr+route, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, _ := get("/metrics", ""); resp.StatusCode != 401 {
		t.Fatalf("without the token: %d", resp.StatusCode)
	}
	if resp, _ := get("/metrics", "wrong"); resp.StatusCode != 401 {
		t.Fatalf("with a wrong token: %d", resp.StatusCode)
	}
	for _, route := range []string{"/metrics", "/prometheus"} {
		resp, body := get(route, "tok")
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
			t.Fatalf("%s: %d %s", route, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		fams := parseProm(t, body)
		checkPromConventions(t, fams)
		if got := promValue(t, fams, "queued_queue_jobs_waiting", `queue="h"`); got != 1 {
			t.Errorf("%s: waiting %v", route, got)
		}
		if got := promValue(t, fams, "queued_sqlite_database_size_bytes", ""); got <= 0 {
			t.Errorf("%s: database size %v", route, got)
		}
		if fams["queued_sqlite_wal_size_bytes"] == nil || fams["queued_storage_degraded"].samples[0].value != 0 {
			t.Errorf("%s: storage figures", route)
		}
	}
}

// TestPromtool runs Prometheus's own checker on the exposition text of a
// server that has seen some work (queues, failures, latencies, a queue
// name that needs escaping). promtool is Debian's prometheus package;
// without it the test is skipped, except in CI.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		needService(t, "promtool not installed", "apt-get install -y prometheus")
	}
	ts := startServerHTTP(t, nil)
	c := dial(t, ts.addr)
	for _, q := range []string{"emails", "queue.with-dots:and_colons", "reports"} {
		for i := range 5 {
			c.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": i, "maxAttempts": 1})
		}
		j := c.ok(map[string]any{"cmd": "PULL", "queue": q})["job"].(map[string]any)
		c.ok(map[string]any{"cmd": "ACK", "id": j["id"]})
		j = c.ok(map[string]any{"cmd": "PULL", "queue": q})["job"].(map[string]any)
		c.ok(map[string]any{"cmd": "FAIL", "id": j["id"], "error": "x"})
	}
	res, err := http.Get("http://" + ts.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(res.Body)
	res.Body.Close()
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(text)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		// promtool prints lint problems and exits non-zero on them.
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
	t.Logf("promtool check metrics: %d bytes, no problems", len(text))
}
