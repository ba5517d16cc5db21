package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
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

// promProcessNames are the unprefixed families the reference exports, as
// Prometheus' client libraries name their process collectors.
var promProcessNames = map[string]bool{"process_cpu_seconds_total": true, "process_start_time_seconds": true,
	"process_resident_memory_bytes": true, "process_heap_bytes": true}

// checkPromConventions applies Prometheus' naming rules and checks every
// histogram's buckets.
func checkPromConventions(t *testing.T, fams map[string]*promFamily) {
	t.Helper()
	for name, f := range fams {
		if !strings.HasPrefix(name, "bunqueue_") && !promProcessNames[name] {
			t.Errorf("%s: neither bunqueue_-prefixed nor one of the reference's process_* families", name)
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

// promOrder lists the families of an exposition text in the order they
// come.
func promOrder(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(l, "# HELP "); ok {
			name, _, _ := strings.Cut(rest, " ")
			out = append(out, name)
		}
	}
	return out
}

var promLabelNameRe = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)

// promLabelNames lists the label names of a sample's labels, le left out
// (it is the histogram's own).
func promLabelNames(labels string) string {
	var names []string
	for _, m := range promLabelNameRe.FindAllStringSubmatch(labels, -1) {
		if m[1] != "le" {
			names = append(names, m[1])
		}
	}
	return strings.Join(names, ",")
}

// When a reference family is present.
type refCond int

const (
	refAlways refCond = iota
	refSQLite         // SQLite mode only
	refQueues         // only when at least one queue is labelled
)

// refFamily is one family of the reference: its type, its HELP text
// verbatim, the names of its labels (in their order) and when it is
// present.
type refFamily struct {
	name, typ, help, labels string
	when                    refCond
}

// refFamilies is the spec: every family bunqueue 2.9.5 exports, in its
// order. Dashboards and alert rules written for bunqueue read these.
var refFamilies = []refFamily{
	{"bunqueue_jobs_waiting", "gauge", "Number of jobs waiting in queue", "", refAlways},
	{"bunqueue_jobs_prioritized", "gauge", "Number of prioritized jobs (priority > 0)", "", refAlways},
	{"bunqueue_jobs_delayed", "gauge", "Number of delayed jobs", "", refAlways},
	{"bunqueue_jobs_active", "gauge", "Number of jobs being processed", "", refAlways},
	{"bunqueue_jobs_dlq", "gauge", "Number of jobs in dead letter queue", "", refAlways},
	{"bunqueue_jobs_completed", "gauge", "Number of completed jobs", "", refAlways},
	{"bunqueue_jobs_pushed_total", "counter", "Total jobs pushed", "", refAlways},
	{"bunqueue_jobs_pulled_total", "counter", "Total jobs pulled", "", refAlways},
	{"bunqueue_jobs_completed_total", "counter", "Total jobs completed", "", refAlways},
	{"bunqueue_jobs_failed_total", "counter", "Total jobs failed", "", refAlways},
	{"bunqueue_uptime_seconds", "gauge", "Server uptime in seconds", "", refAlways},
	{"bunqueue_cron_jobs_registered", "gauge", "Number of registered cron jobs", "", refAlways},
	{"bunqueue_workers_registered", "gauge", "Number of registered workers", "", refAlways},
	{"bunqueue_workers_active", "gauge", "Number of active workers", "", refAlways},
	{"bunqueue_worker_active_jobs", "gauge", "Number of jobs currently processed by workers", "", refAlways},
	{"bunqueue_worker_concurrency_slots", "gauge", "Configured worker concurrency capacity", "", refAlways},
	{"bunqueue_workers_processed_total", "counter", "Total jobs processed by workers", "", refAlways},
	{"bunqueue_workers_failed_total", "counter", "Total jobs failed by workers", "", refAlways},
	{"bunqueue_webhooks_registered", "gauge", "Number of registered webhooks", "", refAlways},
	{"bunqueue_webhooks_enabled", "gauge", "Number of enabled webhooks", "", refAlways},
	{"bunqueue_storage_degraded", "gauge", "Whether persistent storage is degraded", "", refAlways},
	{"bunqueue_storage_disk_full", "gauge", "Whether persistent storage reported a full disk", "", refAlways},
	{"bunqueue_process_heap_used_bytes", "gauge", "Process heap bytes currently used", "", refAlways},
	{"bunqueue_process_heap_total_bytes", "gauge", "Total process heap bytes", "", refAlways},
	{"bunqueue_process_resident_memory_bytes", "gauge", "Process resident memory size in bytes", "", refAlways},
	{"bunqueue_sqlite_database_size_bytes", "gauge", "SQLite database file size in bytes", "", refSQLite},
	{"bunqueue_queue_jobs_waiting", "gauge", "Number of waiting jobs per queue", "queue", refQueues},
	{"bunqueue_queue_jobs_prioritized", "gauge", "Number of prioritized jobs per queue", "queue", refQueues},
	{"bunqueue_queue_jobs_delayed", "gauge", "Number of delayed jobs per queue", "queue", refQueues},
	{"bunqueue_queue_jobs_active", "gauge", "Number of active jobs per queue", "queue", refQueues},
	{"bunqueue_queue_jobs_dlq", "gauge", "Number of DLQ jobs per queue", "queue", refQueues},
	{"bunqueue_build_info", "gauge", "Build and runtime identity", "bun_version,version", refAlways},
	{"process_cpu_seconds_total", "counter", "Total process CPU time in seconds", "", refAlways},
	{"process_start_time_seconds", "gauge", "Start time of the process since the Unix epoch in seconds", "", refAlways},
	{"process_resident_memory_bytes", "gauge", "Resident memory size in bytes", "", refAlways},
	{"process_heap_bytes", "gauge", "Process heap size in bytes", "", refAlways},
	{"bunqueue_connections", "gauge", "Current server connections by bounded transport", "transport", refAlways},
	{"bunqueue_queue_metrics_exported", "gauge", "Queue names included in labelled Prometheus series", "", refAlways},
	{"bunqueue_queue_metrics_omitted", "gauge", "Queue names omitted by the Prometheus cardinality limit", "", refAlways},
	{"bunqueue_backup_enabled", "gauge", "Whether scheduled S3 backup is enabled", "", refAlways},
	{"bunqueue_backup_scheduler_running", "gauge", "Whether the scheduled S3 backup timer is running", "", refAlways},
	{"bunqueue_backup_in_progress", "gauge", "Whether an S3 backup is in progress", "", refAlways},
	{"bunqueue_backup_interval_seconds", "gauge", "Configured S3 backup interval in seconds", "", refAlways},
	{"bunqueue_backup_retention", "gauge", "Configured number of S3 backups to retain", "", refAlways},
	{"bunqueue_backup_attempts_total", "counter", "S3 backup attempts started", "", refAlways},
	{"bunqueue_backup_successes_total", "counter", "Successful S3 backup attempts", "", refAlways},
	{"bunqueue_backup_failures_total", "counter", "Failed S3 backup attempts", "", refAlways},
	{"bunqueue_backup_overlap_rejections_total", "counter", "S3 backup requests rejected because another backup was active", "", refAlways},
	{"bunqueue_backup_consecutive_failures", "gauge", "Consecutive failed S3 backup attempts", "", refAlways},
	{"bunqueue_backup_last_success_timestamp_seconds", "gauge", "Unix timestamp of the last successful S3 backup, or zero", "", refAlways},
	{"bunqueue_backup_last_failure_timestamp_seconds", "gauge", "Unix timestamp of the last failed S3 backup, or zero", "", refAlways},
	{"bunqueue_backup_last_duration_seconds", "gauge", "Duration of the last S3 backup attempt", "", refAlways},
	{"bunqueue_backup_last_size_bytes", "gauge", "Compressed size of the last successful S3 backup", "", refAlways},
	{"bunqueue_push_duration_seconds", "histogram", "Push operation latency in seconds", "", refAlways},
	{"bunqueue_pull_duration_seconds", "histogram", "Pull operation latency in seconds", "", refAlways},
	{"bunqueue_ack_duration_seconds", "histogram", "Ack operation latency in seconds", "", refAlways},
}

// checkReference checks an exposition text against refFamilies: each
// family that should be there is, with the reference's type, HELP and
// labels, in the reference's order; each that should not is absent. It
// returns the families.
func checkReference(t *testing.T, text string, sqlite, queues bool) map[string]*promFamily {
	t.Helper()
	if len(refFamilies) != 56 {
		t.Fatalf("the spec lists %d families; the reference has 56", len(refFamilies))
	}
	fams := parseProm(t, text)
	checkPromConventions(t, fams)
	var want []string
	for _, r := range refFamilies {
		present := r.when == refAlways || r.when == refSQLite && sqlite || r.when == refQueues && queues
		f := fams[r.name]
		if !present {
			if f != nil {
				t.Errorf("%s is there; the reference has it only %s", r.name, map[refCond]string{refSQLite: "in SQLite mode", refQueues: "with a labelled queue"}[r.when])
			}
			continue
		}
		want = append(want, r.name)
		if f == nil {
			t.Errorf("no family %s", r.name)
			continue
		}
		if f.typ != r.typ {
			t.Errorf("%s: type %s, the reference's is %s", r.name, f.typ, r.typ)
		}
		if f.help != r.help {
			t.Errorf("%s: HELP %q, the reference's is %q", r.name, f.help, r.help)
		}
		for _, s := range f.samples {
			if got := promLabelNames(s.labels); got != r.labels {
				t.Errorf("%s: sample labelled {%s}, the reference labels it {%s}", s.name, s.labels, r.labels)
			}
		}
	}
	// The reference's families in its order; queued's own may come
	// between them.
	var got []string
	for _, name := range promOrder(text) {
		if slices.ContainsFunc(refFamilies, func(r refFamily) bool { return r.name == name }) {
			got = append(got, name)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("the reference's families come in this order:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The fixed samples: the build's identity, connections by transport.
	if f := fams["bunqueue_build_info"]; f != nil {
		if len(f.samples) != 1 || f.samples[0].labels != `bun_version="unknown",version="`+compatVersion+`"` || f.samples[0].value != 1 {
			t.Errorf("bunqueue_build_info: %+v", f.samples)
		}
	}
	if f := fams["bunqueue_connections"]; f != nil {
		var transports []string
		for _, s := range f.samples {
			transports = append(transports, s.labels)
		}
		if strings.Join(transports, " ") != `transport="tcp" transport="websocket" transport="sse"` {
			t.Errorf("bunqueue_connections samples: %v", transports)
		}
	}
	return fams
}

// promCmd asks a server for its exposition text with the Prometheus
// command.
func promCmd(t *testing.T, c *tclient) string {
	t.Helper()
	return str(t, sub(t, c.ok(M{"cmd": "Prometheus"}), "data"), "metrics")
}

// TestPromReferenceFamilies: in memory mode, every family of the
// reference is there, as it has it and in its order; without queues the
// per-queue ones are absent (no HELP or TYPE either), with queues they
// are there; the text begins and ends as the reference's.
func TestPromReferenceFamilies(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := dial(t, ts.addr)
	text := promCmd(t, c)
	if !strings.HasPrefix(text, "# HELP bunqueue_jobs_waiting Number of jobs waiting in queue\n# TYPE bunqueue_jobs_waiting gauge\nbunqueue_jobs_waiting 0\n\n") {
		t.Errorf("the text begins %.120q", text)
	}
	fams := checkReference(t, text, false, false)
	for _, name := range []string{"bunqueue_queue_metrics_exported", "bunqueue_queue_metrics_omitted", "bunqueue_backup_enabled",
		"bunqueue_backup_interval_seconds", "bunqueue_backup_retention", "bunqueue_backup_attempts_total", "bunqueue_backup_last_size_bytes"} {
		if v := promValue(t, fams, name, ""); v != 0 {
			t.Errorf("%s = %v on a fresh memory server", name, v)
		}
	}
	// queued's own per-queue counters follow the same rule.
	if fams["bunqueue_queue_jobs_pushed_total"] != nil {
		t.Errorf("per-queue counters without queues")
	}
	if fams["bunqueue_sqlite_wal_size_bytes"] != nil {
		t.Errorf("an SQLite figure in memory mode")
	}
	if v := promValue(t, fams, "process_start_time_seconds", ""); v <= 0 || v > float64(time.Now().Unix())+1 {
		t.Errorf("process_start_time_seconds %v", v)
	}
	if v := promValue(t, fams, "bunqueue_process_heap_total_bytes", ""); v <= 0 || v != promValue(t, fams, "process_heap_bytes", "") {
		t.Errorf("heap total %v, process_heap_bytes %v: want the same, above 0", v, promValue(t, fams, "process_heap_bytes", ""))
	}
	if v := promValue(t, fams, "bunqueue_process_resident_memory_bytes", ""); v <= 0 {
		t.Errorf("resident memory %v (Linux has /proc)", v)
	}
	if f := fams["bunqueue_queued_build_info"]; f == nil || len(f.samples) != 1 ||
		!strings.HasPrefix(f.samples[0].labels, `version="`+version+`",go_version="go`) || f.samples[0].value != 1 {
		t.Errorf("bunqueue_queued_build_info: %+v", f)
	}

	c.ok(M{"cmd": "PUSH", "queue": "a", "data": 1})
	c.ok(M{"cmd": "PUSH", "queue": "b", "data": 1, "priority": 3})
	fams = checkReference(t, promCmd(t, c), false, true)
	if got := promValue(t, fams, "bunqueue_queue_jobs_prioritized", `queue="b"`); got != 1 {
		t.Errorf("b prioritized %v", got)
	}
	if f := fams["bunqueue_queue_jobs_waiting"]; len(f.samples) != 2 || f.samples[0].labels != `queue="a"` || f.samples[1].labels != `queue="b"` {
		t.Errorf("per-queue samples, in the queues' order: %+v", f.samples)
	}
	if got := promValue(t, fams, "bunqueue_queue_jobs_pushed_total", `queue="a"`); got != 1 {
		t.Errorf("a pushed %v", got)
	}
}

// TestPromConnections: bunqueue_connections counts each transport's
// clients.
func TestPromConnections(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := dial(t, ts.addr)
	dial(t, ts.addr)
	sse := dialSSE(t, ts.http, "/events")
	sse.mustNext()
	dialWS(t, ts.http, "/ws")
	eventually(t, 10*time.Second, "the clients counted", func() (bool, string) {
		fams := parseProm(t, promCmd(t, c))
		got := [3]float64{promValue(t, fams, "bunqueue_connections", `transport="tcp"`),
			promValue(t, fams, "bunqueue_connections", `transport="websocket"`), promValue(t, fams, "bunqueue_connections", `transport="sse"`)}
		return got == [3]float64{2, 1, 1}, fmt.Sprint("tcp, websocket, sse: ", got)
	})
}

// TestPromReferenceFamiliesSQLite: in SQLite mode the database's size is
// there too, in the reference's place.
func TestPromReferenceFamiliesSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "p.db")
	tcp, _, stop := startSQLiteServer(t, path, "")
	defer stop()
	c := dial(t, tcp)
	checkReference(t, promCmd(t, c), true, false)
	c.ok(M{"cmd": "PUSH", "queue": "s", "data": 1, "durable": true})
	fams := checkReference(t, promCmd(t, c), true, true)
	if got := promValue(t, fams, "bunqueue_sqlite_database_size_bytes", ""); got <= 0 {
		t.Errorf("database size %v", got)
	}
	if fams["bunqueue_sqlite_wal_size_bytes"] == nil {
		t.Errorf("no write-ahead log size")
	}
}

// TestPromReferenceFamiliesPG: in PostgreSQL mode the families are the
// same (no SQLite size), and the job figures are the namespace's: a
// broker exports the jobs and schedules another broker made.
func TestPromReferenceFamiliesPG(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	a := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{})
	b := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{})
	ca, cb := dial(t, a.addr), dial(t, b.addr)
	checkReference(t, promCmd(t, cb), false, false)
	ca.ok(M{"cmd": "PUSH", "queue": "pgq", "data": 1})
	ca.ok(M{"cmd": "PUSH", "queue": "pgq", "data": 2, "priority": 5})
	ca.ok(M{"cmd": "PUSH", "queue": "pgq", "data": 3, "delay": 600000})
	ca.ok(M{"cmd": "Cron", "name": "nightly", "queue": "pgq", "data": M{}, "schedule": "0 3 * * *"})
	fams := checkReference(t, promCmd(t, cb), false, true)
	for _, tc := range []struct {
		name, labels string
		want         float64
	}{
		{"bunqueue_jobs_waiting", "", 1}, {"bunqueue_jobs_prioritized", "", 1}, {"bunqueue_jobs_delayed", "", 1},
		{"bunqueue_queue_jobs_waiting", `queue="pgq"`, 1}, {"bunqueue_queue_jobs_delayed", `queue="pgq"`, 1},
		{"bunqueue_cron_jobs_registered", "", 1},
		// The counters are each broker's: b pushed nothing.
		{"bunqueue_jobs_pushed_total", "", 0},
	} {
		if got := promValue(t, fams, tc.name, tc.labels); got != tc.want {
			t.Errorf("broker b: %s{%s} = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if got := promValue(t, parseProm(t, promCmd(t, ca)), "bunqueue_push_duration_seconds_count", ""); got != 3 {
		t.Errorf("broker a's push histogram counts %v, want 3 (observed in PostgreSQL mode too)", got)
	}
}

// TestProtoPrometheus: the figures follow what the server did.
func TestProtoPrometheus(t *testing.T) {
	t.Parallel()
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
	c.ok(M{"cmd": "PULL", "queue": "empty"}) // delivers nothing
	c.ok(M{"cmd": "AddWebhook", "url": "https://hooks.example.com/x", "events": []any{}})

	fams := checkReference(t, promCmd(t, c), false, true)
	for _, tc := range []struct {
		name, labels string
		want         float64
	}{
		// pa keeps its three priority-0 jobs (the priority-5 one was
		// pulled first); pc's retried job waits out its backoff (1 s or
		// more), so it is delayed, as pb's is.
		{"bunqueue_jobs_waiting", "", 3},
		{"bunqueue_jobs_prioritized", "", 0},
		{"bunqueue_jobs_delayed", "", 2},
		{"bunqueue_jobs_pushed_total", "", 6},
		{"bunqueue_jobs_pulled_total", "", 2},
		{"bunqueue_jobs_completed_total", "", 1},
		{"bunqueue_jobs_retried_total", "", 1},
		{"bunqueue_queue_jobs_waiting", `queue="pa"`, 3},
		{"bunqueue_queue_jobs_prioritized", `queue="pa"`, 0},
		{"bunqueue_queue_jobs_delayed", `queue="pb"`, 1},
		{"bunqueue_queue_jobs_pushed_total", `queue="pa"`, 4},
		{"bunqueue_queue_jobs_completed_total", `queue="pa"`, 1},
		{"bunqueue_queue_jobs_retried_total", `queue="pc"`, 1},
		{"bunqueue_queue_metrics_exported", "", 3},
		{"bunqueue_queue_metrics_omitted", "", 0},
		{"bunqueue_webhooks_registered", "", 1},
		{"bunqueue_connections", `transport="tcp"`, 1},
		{"bunqueue_push_duration_seconds_count", "", 6},
		{"bunqueue_ack_duration_seconds_count", "", 1},
		{"bunqueue_job_processing_seconds_count", "", 1},
		// Three pulls: the two that delivered a job are in the pull
		// latency, as the reference's; all three in the service time.
		{"bunqueue_pull_duration_seconds_count", "", 2},
		{"bunqueue_pull_service_seconds_count", "", 3},
		{"bunqueue_job_wait_seconds_count", "", 2}, // first pulls only
	} {
		if got := promValue(t, fams, tc.name, tc.labels); got != tc.want {
			t.Errorf("%s{%s} = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	for _, name := range []string{"bunqueue_goroutines", "bunqueue_go_memory_sys_bytes", "bunqueue_uptime_seconds"} {
		if fams[name] == nil || fams[name].typ != "gauge" {
			t.Errorf("%s missing or not a gauge", name)
		}
	}
	if got := promValue(t, fams, "process_cpu_seconds_total", ""); got <= 0 {
		t.Errorf("process_cpu_seconds_total %v", got)
	}
}

// TestPromNoQueuedNames: no family keeps the names queued had before it
// took the reference's.
func TestPromNoQueuedNames(t *testing.T) {
	t.Parallel()
	ls := newLocalServer(t)
	ls.ok(M{"cmd": "PUSH", "queue": "q", "data": 1})
	for _, name := range promOrder(string(ls.srv.prometheusText(t.Context()))) {
		if strings.HasPrefix(name, "queued_") {
			t.Errorf("%s keeps queued's old prefix", name)
		}
	}
}

// TestPromWorkerMetrics: the worker figures are the registry's, with the
// reference's meaning: active jobs over every registered worker,
// concurrency over the active ones (seen in the last 30 s), processed and
// failed as the workers report them, kept after a worker goes.
func TestPromWorkerMetrics(t *testing.T) {
	t.Parallel()
	ls := newLocalServer(t)
	figures := func() map[string]float64 {
		fams := parseProm(t, string(ls.srv.prometheusText(t.Context())))
		out := map[string]float64{}
		for _, n := range []string{"bunqueue_workers_registered", "bunqueue_workers_active", "bunqueue_worker_active_jobs",
			"bunqueue_worker_concurrency_slots", "bunqueue_workers_processed_total", "bunqueue_workers_failed_total"} {
			out[strings.TrimPrefix(n, "bunqueue_")] = promValue(t, fams, n, "")
		}
		return out
	}
	check := func(what string, want map[string]float64) {
		t.Helper()
		if got := figures(); !equalMaps(got, want) {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	check("no workers", map[string]float64{"workers_registered": 0, "workers_active": 0, "worker_active_jobs": 0,
		"worker_concurrency_slots": 0, "workers_processed_total": 0, "workers_failed_total": 0})
	ls.ok(M{"cmd": "RegisterWorker", "name": "w1", "queues": []any{"q"}, "workerId": "w1", "concurrency": 4})
	ls.ok(M{"cmd": "RegisterWorker", "name": "w2", "queues": []any{"q"}, "workerId": "w2", "concurrency": 2})
	ls.ok(M{"cmd": "Heartbeat", "id": "w1", "activeJobs": 3, "processed": 10, "failed": 1})
	ls.ok(M{"cmd": "Heartbeat", "id": "w2", "activeJobs": 1, "processed": 5, "failed": 2})
	check("two workers", map[string]float64{"workers_registered": 2, "workers_active": 2, "worker_active_jobs": 4,
		"worker_concurrency_slots": 6, "workers_processed_total": 15, "workers_failed_total": 3})
	// 40 s later w2 heartbeats and w1 does not: w1 is no longer active,
	// its slots no longer counted, its jobs still.
	ls.now += 40000
	ls.ok(M{"cmd": "Heartbeat", "id": "w2", "activeJobs": 0, "processed": 7})
	check("w1 stale", map[string]float64{"workers_registered": 2, "workers_active": 1, "worker_active_jobs": 3,
		"worker_concurrency_slots": 2, "workers_processed_total": 17, "workers_failed_total": 3})
	ls.ok(M{"cmd": "UnregisterWorker", "workerId": "w1"})
	check("w1 gone", map[string]float64{"workers_registered": 1, "workers_active": 1, "worker_active_jobs": 0,
		"worker_concurrency_slots": 2, "workers_processed_total": 17, "workers_failed_total": 3})
}

func equalMaps(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestPromBackupMetrics: the backup figures are the backup service's:
// zeros without one; the schedule's settings; attempts, successes and
// failures counted, with the last of each's time, duration and size.
func TestPromBackupMetrics(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	live := filepath.Join(dir, "live.db")
	b, st, _ := openTestStore(t, live)
	defer st.Close()
	defer b.Close()
	pushN(t, b, st, "bk", 200)
	srv := memServer(b, nil, quietLog())
	backup := func() map[string]float64 {
		fams := parseProm(t, string(srv.prometheusText(t.Context())))
		out := map[string]float64{}
		for _, r := range refFamilies {
			if n, ok := strings.CutPrefix(r.name, "bunqueue_backup_"); ok {
				out[n] = promValue(t, fams, r.name, "")
			}
		}
		return out
	}
	for k, v := range backup() {
		if v != 0 {
			t.Errorf("without a backup service: %s = %v", k, v)
		}
	}

	fake := newFakeS3("bk")
	ts := httptest.NewServer(fake)
	defer ts.Close()
	bk, _ := testBackups(t, st, live, ts.URL, "bk", 3, 0) // on demand only
	srv.bk = bk
	m := backup()
	if m["enabled"] != 0 || m["scheduler_running"] != 0 || m["interval_seconds"] != 0 || m["retention"] != 3 || m["attempts_total"] != 0 {
		t.Errorf("on-demand service before a backup: %v", m)
	}
	before := float64(time.Now().UnixMilli()) / 1000
	if _, err := bk.BackupNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	m = backup()
	if m["attempts_total"] != 1 || m["successes_total"] != 1 || m["failures_total"] != 0 || m["consecutive_failures"] != 0 ||
		m["last_success_timestamp_seconds"] < before || m["last_failure_timestamp_seconds"] != 0 ||
		m["last_duration_seconds"] <= 0 || m["last_size_bytes"] <= 0 || m["in_progress"] != 0 || m["overlap_rejections_total"] != 0 {
		t.Errorf("after a backup: %v", m)
	}
	size := m["last_size_bytes"]
	fake.failWhen(func(r *http.Request) bool { return r.Method == "PUT" })
	for range 2 {
		if _, err := bk.BackupNow(t.Context()); err == nil {
			t.Fatal("a backup succeeded with every upload failing")
		}
	}
	m = backup()
	if m["attempts_total"] != 3 || m["successes_total"] != 1 || m["failures_total"] != 2 || m["consecutive_failures"] != 2 ||
		m["last_failure_timestamp_seconds"] < m["last_success_timestamp_seconds"] || m["last_duration_seconds"] <= 0 || m["last_size_bytes"] != size {
		t.Errorf("after two failures: %v", m)
	}
	fake.failWhen(nil)
	if _, err := bk.BackupNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	m = backup()
	if m["successes_total"] != 2 || m["failures_total"] != 2 || m["consecutive_failures"] != 0 || m["last_failure_timestamp_seconds"] == 0 {
		t.Errorf("after recovering (the last failure's time stays): %v", m)
	}
	bk.Close()

	// A schedule: enabled, its timer running until Close. (Its first
	// backup is an hour away: the bucket has a recent one.)
	sched, _ := testBackups(t, st, live, ts.URL, "bk", 5, time.Hour)
	srv.bk = sched
	sched.Start()
	m = backup()
	if m["enabled"] != 1 || m["scheduler_running"] != 1 || m["interval_seconds"] != 3600 || m["retention"] != 5 {
		t.Errorf("scheduled service: %v", m)
	}
	sched.Close()
	if m = backup(); m["scheduler_running"] != 0 || m["enabled"] != 1 {
		t.Errorf("after Close: %v", m)
	}
}

// TestPromQueueLimit: --metrics-max-queues (METRICS_MAX_QUEUES) bounds
// the queues given labelled series: the first made keep theirs and the
// rest are counted as omitted; 0 gives none, and no per-queue family.
func TestPromQueueLimit(t *testing.T) {
	t.Parallel()
	ls := newLocalServer(t)
	for i := range 5 {
		ls.ok(M{"cmd": "PUSH", "queue": "q" + strconv.Itoa(i), "data": i})
	}
	for _, tc := range []struct{ limit, exported int }{{100, 5}, {3, 3}, {5, 5}, {0, 0}} {
		ls.srv.promMaxQueues = tc.limit
		text := string(ls.srv.prometheusText(t.Context()))
		fams := checkReference(t, text, false, tc.exported > 0)
		if got := promValue(t, fams, "bunqueue_queue_metrics_exported", ""); got != float64(tc.exported) {
			t.Errorf("limit %d: exported %v", tc.limit, got)
		}
		if got := promValue(t, fams, "bunqueue_queue_metrics_omitted", ""); got != float64(5-tc.exported) {
			t.Errorf("limit %d: omitted %v", tc.limit, got)
		}
		for _, name := range []string{"bunqueue_queue_jobs_waiting", "bunqueue_queue_jobs_dlq", "bunqueue_queue_jobs_pushed_total"} {
			f := fams[name]
			if tc.exported == 0 {
				if f != nil {
					t.Errorf("limit 0: %s is there", name)
				}
				continue
			}
			if f == nil || len(f.samples) != tc.exported || f.samples[0].labels != `queue="q0"` ||
				f.samples[tc.exported-1].labels != `queue="q`+strconv.Itoa(tc.exported-1)+`"` {
				t.Errorf("limit %d: %s samples %+v", tc.limit, name, f)
			}
		}
	}
}

// TestPromMetricsFlags: --metrics-max-queues and --metrics-auth, from the
// command line or the environment, reach the server; a negative limit is
// refused at start.
//
// Serial: it sets environment variables (t.Setenv).
func TestPromMetricsFlags(t *testing.T) {
	t.Setenv("METRICS_MAX_QUEUES", "")
	t.Setenv("METRICS_AUTH", "")
	fs, c := serverFlags(io.Discard)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if *c.metricsMaxQueues != 100 || !*c.metricsAuth {
		t.Errorf("defaults: max queues %d, auth %v", *c.metricsMaxQueues, *c.metricsAuth)
	}
	t.Setenv("METRICS_MAX_QUEUES", "7")
	t.Setenv("METRICS_AUTH", "false")
	fs, c = serverFlags(io.Discard)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if *c.metricsMaxQueues != 7 || *c.metricsAuth {
		t.Errorf("from the environment: max queues %d, auth %v", *c.metricsMaxQueues, *c.metricsAuth)
	}
	fs, c = serverFlags(io.Discard)
	if err := fs.Parse([]string{"--metrics-max-queues", "2", "--metrics-auth=true"}); err != nil {
		t.Fatal(err)
	}
	if *c.metricsMaxQueues != 2 || !*c.metricsAuth {
		t.Errorf("flags over the environment: max queues %d, auth %v", *c.metricsMaxQueues, *c.metricsAuth)
	}

	two := 2
	ts := startServer(t, &config{metricsMaxQueues: &two})
	cl := dial(t, ts.addr)
	for _, q := range []string{"x", "y", "z"} {
		cl.ok(M{"cmd": "PUSH", "queue": q, "data": 1})
	}
	fams := parseProm(t, promCmd(t, cl))
	if promValue(t, fams, "bunqueue_queue_metrics_exported", "") != 2 || promValue(t, fams, "bunqueue_queue_metrics_omitted", "") != 1 {
		t.Errorf("--metrics-max-queues 2 with 3 queues: exported %v, omitted %v",
			promValue(t, fams, "bunqueue_queue_metrics_exported", ""), promValue(t, fams, "bunqueue_queue_metrics_omitted", ""))
	}

	neg := -1
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := runServer(ctx, &config{host: "127.0.0.1", memory: true, httpPort: -1, metricsMaxQueues: &neg}, quietLog(), nil)
	if err == nil || !strings.Contains(err.Error(), "--metrics-max-queues -1") {
		t.Errorf("a negative limit: %v", err)
	}
}

func TestPromLabelEscaping(t *testing.T) {
	t.Parallel()
	if got := promLabel("a\\b\"c\nd"); got != `"a\\b\"c\nd"` {
		t.Fatalf("%s", got)
	}
}

// httpGet fetches route with an optional bearer token.
func httpGet(t *testing.T, addr, route, token string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+route, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// Read into a builder sized by Content-Length: io.ReadAll's growing
	// and the string copy after it made three fresh buffers of each big
	// answer, each costly under the race detector.
	var b strings.Builder
	if resp.ContentLength > 0 {
		b.Grow(int(resp.ContentLength))
	}
	io.Copy(&b, resp.Body)
	return resp, b.String()
}

// TestHTTPMetrics: GET /prometheus serves the exposition, under the
// bearer token when tokens are set; GET /metrics answers the reference's
// JSON, whatever the client accepts, under the token too.
func TestHTTPMetrics(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "m.db")
	tcp, httpAddr, stop := startSQLiteServer(t, path, "tok")
	defer stop()
	c := dial(t, tcp)
	c.ok(M{"cmd": "Auth", "token": "tok"})
	c.ok(M{"cmd": "PUSH", "queue": "h", "data": 1, "durable": true})
	for _, route := range []string{"/metrics", "/prometheus"} {
		for _, tok := range []string{"", "wrong"} {
			if resp, _ := httpGet(t, httpAddr, route, tok); resp.StatusCode != 401 {
				t.Errorf("%s with token %q: %d", route, tok, resp.StatusCode)
			}
		}
	}
	resp, body := httpGet(t, httpAddr, "/prometheus", "tok")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("/prometheus: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	fams := checkReference(t, body, true, true)
	if got := promValue(t, fams, "bunqueue_queue_jobs_waiting", `queue="h"`); got != 1 {
		t.Errorf("waiting %v", got)
	}
	if got := promValue(t, fams, "bunqueue_storage_degraded", ""); got != 0 {
		t.Errorf("storage degraded %v", got)
	}

	for _, accept := range []string{"", "text/plain", "application/json", "application/openmetrics-text; version=1.0.0"} {
		req, _ := http.NewRequest("GET", "http://"+httpAddr+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer tok")
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			OK      bool             `json:"ok"`
			Metrics map[string]int64 `json:"metrics"`
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		want := map[string]int64{"totalPushed": 1, "totalPulled": 0, "totalCompleted": 0, "totalFailed": 0}
		if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") ||
			!got.OK || len(got.Metrics) != 4 || got.Metrics["totalPushed"] != want["totalPushed"] ||
			got.Metrics["totalPulled"] != 0 || got.Metrics["totalCompleted"] != 0 || got.Metrics["totalFailed"] != 0 {
			t.Errorf("/metrics with Accept %q: %d %s %+v %v", accept, resp.StatusCode, resp.Header.Get("Content-Type"), got, err)
		}
	}
}

// TestHTTPMetricsAuthOff: with --metrics-auth=false, /prometheus is open
// to a scraper without a token, as the reference leaves it; every other
// route, /metrics included, still wants the token.
func TestHTTPMetricsAuthOff(t *testing.T) {
	t.Parallel()
	off := false
	ts := startServerHTTP(t, &config{authTokens: "tok", metricsAuth: &off})
	resp, body := httpGet(t, ts.http, "/prometheus", "")
	if resp.StatusCode != 200 {
		t.Fatalf("/prometheus without a token: %d %s", resp.StatusCode, body)
	}
	checkReference(t, body, false, false)
	for _, route := range []string{"/metrics", "/stats", "/queues"} {
		if resp, _ := httpGet(t, ts.http, route, ""); resp.StatusCode != 401 {
			t.Errorf("%s without a token: %d", route, resp.StatusCode)
		}
	}
	if resp, _ := httpGet(t, ts.http, "/prometheus", "tok"); resp.StatusCode != 200 {
		t.Errorf("/prometheus with the token: %d", resp.StatusCode)
	}
	// The TCP command is a command like the others: Auth first.
	c := dial(t, ts.addr)
	if a := c.call(M{"cmd": "Prometheus"}); a["ok"] != false {
		t.Errorf("Prometheus before Auth: %v", a)
	}

	on := true
	ts = startServerHTTP(t, &config{authTokens: "tok", metricsAuth: &on})
	if resp, _ := httpGet(t, ts.http, "/prometheus", ""); resp.StatusCode != 401 {
		t.Errorf("--metrics-auth=true, /prometheus without a token: %d", resp.StatusCode)
	}
	if resp, _ := httpGet(t, ts.http, "/prometheus", "tok"); resp.StatusCode != 200 {
		t.Errorf("--metrics-auth=true, /prometheus with the token: %d", resp.StatusCode)
	}
}

// TestPromtool runs Prometheus's own checker on the exposition text of a
// server that has seen some work (queues, failures, latencies, a queue
// name that needs escaping, workers, live clients). promtool is Debian's
// prometheus package; without it the test is skipped, except in CI.
func TestPromtool(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		needService(t, "promtool not installed", "apt-get install -y prometheus")
	}
	ts := startServerHTTP(t, nil)
	c := dial(t, ts.addr)
	c.ok(M{"cmd": "RegisterWorker", "name": "w", "queues": []any{"emails"}, "concurrency": 2})
	for _, q := range []string{"emails", "queue.with-dots:and_colons", "reports"} {
		for i := range 5 {
			c.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": i, "maxAttempts": 1})
		}
		j := c.ok(map[string]any{"cmd": "PULL", "queue": q})["job"].(map[string]any)
		c.ok(map[string]any{"cmd": "ACK", "id": j["id"]})
		j = c.ok(map[string]any{"cmd": "PULL", "queue": q})["job"].(map[string]any)
		c.ok(map[string]any{"cmd": "FAIL", "id": j["id"], "error": "x"})
	}
	res, err := http.Get("http://" + ts.http + "/prometheus")
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
