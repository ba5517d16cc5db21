package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestDashboardOverviewShape(t *testing.T) {
	t.Parallel()
	ls := newLocalServer(t)
	ls.ok(M{"cmd": "RegisterWorker", "name": "w1", "queues": []any{"o"}, "workerId": "wk-1"})
	for i := 0; i < 3; i++ {
		ls.ok(M{"cmd": "PUSH", "queue": "o", "data": i})
	}
	ls.ok(M{"cmd": "PUSH", "queue": "o", "data": "later", "delay": 5000})
	// Two jobs active under locks (pulled with an owner).
	ls.ok(M{"cmd": "PULL", "queue": "o", "owner": "w1"})
	ls.ok(M{"cmd": "PULL", "queue": "o", "owner": "w1"})
	ls.now += 1500

	body := ls.raw(M{"cmd": "DashboardOverview"})
	if got, want := keys(t, body, "data"), []string{"stats", "throughput", "latency", "memory", "collections", "workers",
		"crons", "storage", "timestamp"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("data keys %v", got)
	}
	for path, want := range map[string][]string{
		"stats":       {"waiting", "active", "delayed", "completed", "dlq", "totalPushed", "totalPulled", "totalCompleted", "totalFailed", "uptime"},
		"throughput":  {"pushPerSec", "pullPerSec", "completePerSec", "failPerSec"},
		"latency":     {"averages", "percentiles"},
		"memory":      {"heapUsed", "heapTotal", "rss"},
		"workers":     {"total", "active", "list"},
		"storage":     {"diskFull", "error", "since"},
		"collections": {"jobIndex", "completedJobs", "jobResults", "jobLogs", "customIdMap", "jobLocks", "clientJobs", "clientJobsTotal", "pendingDepChecks", "stalledCandidates", "processingTotal", "queuedTotal", "waitingDepsTotal", "temporalIndexTotal", "delayedHeapTotal"},
	} {
		if got := keys(t, body, "data", path); !reflect.DeepEqual(got, want) {
			t.Errorf("%s keys %v, want %v", path, got, want)
		}
	}
	d := sub(t, ls.ok(M{"cmd": "DashboardOverview"}), "data")
	st := sub(t, d, "stats")
	for k, want := range map[string]float64{"waiting": 1, "active": 2, "delayed": 1, "completed": 0, "dlq": 0,
		"totalPushed": 4, "totalPulled": 2, "totalCompleted": 0, "totalFailed": 0, "uptime": 1500} {
		if num(t, st[k]) != want {
			t.Errorf("stats.%s = %v, want %v", k, st[k], want)
		}
	}
	lat := sub(t, d, "latency")
	if got := keys(t, body, "data", "latency", "percentiles"); !reflect.DeepEqual(got, []string{"push", "pull", "ack"}) {
		t.Errorf("percentiles keys %v", got)
	}
	pp := sub(t, sub(t, lat, "percentiles"), "push")
	if num(t, pp["p50"]) <= 0 || num(t, pp["p99"]) < num(t, pp["p50"]) {
		t.Errorf("push percentiles after 4 pushes: %v", pp)
	}
	col := sub(t, d, "collections")
	for k, want := range map[string]float64{"jobIndex": 4, "jobLocks": 2, "processingTotal": 2, "queuedTotal": 2, "delayedHeapTotal": 1} {
		if num(t, col[k]) != want {
			t.Errorf("collections.%s = %v, want %v", k, col[k], want)
		}
	}
	w := sub(t, d, "workers")
	wl := list(t, w, "list")
	if num(t, w["total"]) != 1 || len(wl) != 1 {
		t.Fatalf("workers: %v", w)
	}
	if got := keys(t, body, "data", "workers"); !reflect.DeepEqual(got, []string{"total", "active", "list"}) {
		t.Errorf("workers keys %v", got)
	}
	entry := wl[0].(map[string]any)
	if entry["id"] != "wk-1" || entry["name"] != "w1" || len(entry) != 7 || !reflect.DeepEqual(entry["queues"], []any{"o"}) {
		t.Errorf("worker entry: %v", entry)
	}
	if c := list(t, d, "crons"); len(c) != 0 {
		t.Errorf("crons: %v", c)
	}
	if s := sub(t, d, "storage"); s["diskFull"] != false || s["error"] != nil || s["since"] != nil {
		t.Errorf("storage: %v", s)
	}
	if num(t, d["timestamp"]) != float64(ls.now) {
		t.Errorf("timestamp %v", d["timestamp"])
	}
}

func TestDashboardQueues(t *testing.T) {
	t.Parallel()
	ls := newLocalServer(t)
	ls.ok(M{"cmd": "PUSH", "queue": "z-first", "data": 1})
	ls.ok(M{"cmd": "PUSH", "queue": "a-second", "data": 1, "priority": 3})
	ls.ok(M{"cmd": "PUSH", "queue": "a-second", "data": 2})
	ls.ok(M{"cmd": "PUSH", "queue": "a-second", "data": 3, "delay": 1000})
	ls.ok(M{"cmd": "Pause", "queue": "a-second"})
	body := ls.raw(M{"cmd": "DashboardQueues"})
	if got := keys(t, body, "data"); !reflect.DeepEqual(got, []string{"queues", "timestamp"}) {
		t.Fatalf("keys %v", got)
	}
	d := sub(t, ls.ok(M{"cmd": "DashboardQueues"}), "data")
	qs := list(t, d, "queues")
	if len(qs) != 2 {
		t.Fatalf("queues: %v", qs)
	}
	first, second := qs[0].(map[string]any), qs[1].(map[string]any)
	if first["name"] != "z-first" || second["name"] != "a-second" {
		t.Fatalf("not in creation order: %v", qs)
	}
	want := map[string]any{"name": "a-second", "waiting": int64(1), "prioritized": int64(1), "delayed": int64(1),
		"active": int64(0), "dlq": int64(0), "paused": true}
	for k, v := range want {
		if second[k] != v && !(isNum(v) && num(t, second[k]) == num(t, v)) {
			t.Errorf("%s = %v, want %v", k, second[k], v)
		}
	}
	if len(second) != 7 {
		t.Errorf("entry keys: %v", second)
	}
}

func TestDashboardQueue(t *testing.T) {
	t.Parallel()
	ls := newLocalServer(t)
	if got := ls.call(M{"cmd": "DashboardQueue"}); got["ok"] != false || got["error"] != "Queue name is required" {
		t.Fatalf("no queue: %v", got)
	}
	// An unknown queue: all zeros.
	d := sub(t, ls.ok(M{"cmd": "DashboardQueue", "queue": "nobody"}), "data")
	if d["name"] != "nobody" || d["paused"] != false || len(list(t, d, "dlqPreview")) != 0 || len(sub(t, d, "priorityCounts")) != 0 {
		t.Fatalf("unknown queue: %v", d)
	}
	if _, ok := d["jobs"]; ok {
		t.Fatalf("jobs without includeJobs: %v", d)
	}

	const q = "dq"
	for i := 0; i < 4; i++ {
		ls.ok(M{"cmd": "PUSH", "queue": q, "data": i, "priority": i % 2})
	}
	ls.ok(M{"cmd": "PUSH", "queue": q, "data": "later", "delay": 60000})
	// One completed, one failed for good (into the DLQ), one active.
	id := sub(t, ls.ok(M{"cmd": "PULL", "queue": q}), "job")["id"]
	ls.ok(M{"cmd": "ACK", "id": id})
	ls.ok(M{"cmd": "PUSH", "queue": q, "data": M{"bad": true}, "maxAttempts": 1, "priority": 9})
	failed := sub(t, ls.ok(M{"cmd": "PULL", "queue": q}), "job")["id"]
	ls.ok(M{"cmd": "FAIL", "id": failed, "error": "x"})
	active := sub(t, ls.ok(M{"cmd": "PULL", "queue": q}), "job")["id"]
	ls.ok(M{"cmd": "Progress", "id": active, "progress": 40})

	body := ls.raw(M{"cmd": "DashboardQueue", "queue": q, "includeJobs": true, "jobsLimit": 1})
	if got := keys(t, body, "data"); !reflect.DeepEqual(got, []string{"name", "counts", "paused", "priorityCounts", "dlqPreview", "timestamp", "jobs"}) {
		t.Fatalf("keys %v", got)
	}
	if got := keys(t, body, "data", "counts"); !reflect.DeepEqual(got, []string{"waiting", "prioritized", "delayed", "active",
		"completed", "failed", "waiting-children", "totalCompleted", "totalFailed", "paused"}) {
		t.Fatalf("counts keys %v", got)
	}
	if got := keys(t, body, "data", "jobs"); !reflect.DeepEqual(got, []string{"waiting", "active", "delayed", "paused"}) {
		t.Fatalf("jobs keys %v", got)
	}
	d = sub(t, ls.ok(M{"cmd": "DashboardQueue", "queue": q, "includeJobs": true, "jobsLimit": 1}), "data")
	c := sub(t, d, "counts")
	for k, want := range map[string]float64{"waiting": 2, "prioritized": 0, "delayed": 1, "active": 1, "completed": 1,
		"failed": 1, "waiting-children": 0, "totalCompleted": 1, "totalFailed": 1, "paused": 0} {
		if num(t, c[k]) != want {
			t.Errorf("counts.%s = %v, want %v", k, c[k], want)
		}
	}
	if pc := sub(t, d, "priorityCounts"); len(pc) != 1 || num(t, pc["0"]) != 3 {
		t.Errorf("priorityCounts %v", pc)
	}
	dlq := list(t, d, "dlqPreview")
	if len(dlq) != 1 {
		t.Fatalf("dlqPreview %v", dlq)
	}
	if e := dlq[0].(map[string]any); e["id"] != failed || !reflect.DeepEqual(e["data"], map[string]any{"bad": true}) ||
		num(t, e["attempts"]) != 1 || !isNum(e["createdAt"]) || len(e) != 4 {
		t.Errorf("dlq entry %v", e)
	}
	jobs := sub(t, d, "jobs")
	for _, k := range []string{"waiting", "active", "delayed"} {
		if l := list(t, jobs, k); len(l) != 1 {
			t.Errorf("jobs.%s: %v (limit 1)", k, l)
		}
	}
	if l := list(t, jobs, "paused"); len(l) != 0 {
		t.Errorf("jobs.paused of a running queue: %v", l)
	}
	a := list(t, jobs, "active")[0].(map[string]any)
	if a["id"] != active || num(t, a["progress"]) != 40 || len(a) != 6 {
		t.Errorf("active entry %v", a)
	}
	// The waiting list is in pull order: the next job out comes first.
	next := list(t, jobs, "waiting")[0].(map[string]any)["id"]

	// Paused: ready jobs count and list as paused.
	ls.ok(M{"cmd": "Pause", "queue": q})
	d = sub(t, ls.ok(M{"cmd": "DashboardQueue", "queue": q, "includeJobs": true, "jobsLimit": 500}), "data")
	c = sub(t, d, "counts")
	if num(t, c["waiting"]) != 0 || num(t, c["prioritized"]) != 0 || num(t, c["paused"]) != 2 || d["paused"] != true {
		t.Errorf("paused counts %v", c)
	}
	jobs = sub(t, d, "jobs")
	if len(list(t, jobs, "waiting")) != 0 || len(list(t, jobs, "paused")) != 2 {
		t.Errorf("paused lists: %v", jobs)
	}
	ls.ok(M{"cmd": "Resume", "queue": q})
	if got := sub(t, ls.ok(M{"cmd": "PULL", "queue": q}), "job")["id"]; got != next {
		t.Errorf("first waiting job listed %v, but PULL gave %v", next, got)
	}
}

func TestFirstK(t *testing.T) {
	t.Parallel()
	var all []*Job
	for i := 0; i < 100; i++ {
		all = append(all, &Job{RunAt: int64((i * 37) % 100), seq: int64(i)})
	}
	each := func(yield func(*Job)) {
		for _, j := range all {
			yield(j)
		}
	}
	got := firstK(5, each, func(a, b *Job) bool { return a.RunAt < b.RunAt })
	for i, j := range got {
		if j.RunAt != int64(i) {
			t.Fatalf("firstK: %d-th has RunAt %d", i, j.RunAt)
		}
	}
	if len(firstK(0, each, func(a, b *Job) bool { return false })) != 0 {
		t.Fatal("k = 0")
	}
}

func TestCompactMemory(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	for i := 0; i < 50; i++ {
		c.ok(M{"cmd": "PUSH", "queue": "cm", "data": i})
	}
	for i := 0; i < 40; i++ {
		id := sub(t, c.ok(M{"cmd": "PULL", "queue": "cm"}), "job")["id"]
		c.ok(M{"cmd": "ACK", "id": id})
	}
	a := c.ok(M{"cmd": "CompactMemory"})
	wantUndefined(t, "CompactMemory id", a["id"])
	counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "cm"}), "counts")
	if num(t, counts["waiting"]) != 10 || num(t, counts["completed"]) != 40 {
		t.Fatalf("after CompactMemory: %v", counts)
	}
	for i := 0; i < 10; i++ {
		if j := c.ok(M{"cmd": "PULL", "queue": "cm"})["job"]; j == nil {
			t.Fatalf("job %d lost by CompactMemory", i)
		}
	}
}

// Over TCP: the overview counts connections holding jobs.
func TestProtoDashboardOverviewClients(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	w := dial(t, ts.addr)
	c.ok(M{"cmd": "PUSH", "queue": "oc", "data": 1})
	c.ok(M{"cmd": "PUSH", "queue": "oc", "data": 2})
	w.ok(M{"cmd": "PULLB", "queue": "oc", "count": 2})
	col := sub(t, sub(t, c.ok(M{"cmd": "DashboardOverview"}), "data"), "collections")
	if num(t, col["clientJobs"]) != 1 || num(t, col["clientJobsTotal"]) != 2 {
		t.Fatalf("collections: %v", col)
	}
}

// TestDashboardBrowserFirstPaint: a page opened on a server that has been
// under load draws ten minutes of throughput at its first paint, and its
// rate cards are the server's current rates, not 0.00 until the page has
// watched for a while. The server's sampler is made fast, on a clock that
// says rateEvery passes between samples, so the ten minutes take a second
// or two. The test saves a screenshot (QUEUED_SCREENSHOT_LOAD, or
// queued-dashboard-load.png in the temporary directory).
func TestDashboardBrowserFirstPaint(t *testing.T) {
	t.Parallel()
	d := startBrowser(t)
	clock := newStepClock(rateEvery.Milliseconds())
	// reads counts the sampler's readings of the clock: one a sample, one
	// sample after another.
	var reads atomic.Int64
	ts := startServerHTTP(t, &config{rateEvery: 20 * time.Millisecond, rateNow: func() int64 {
		at := clock.now()
		reads.Add(1)
		return at
	}})
	samples := func(n int64, what string) {
		t.Helper()
		from := reads.Load()
		eventually(t, 10*time.Second, what, func() (bool, string) {
			r := reads.Load()
			return r >= from+n, fmt.Sprint(r-from, " samples")
		})
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	// Producers push batches; workers pull, acknowledge, and fail one job
	// in ten (for good: one attempt). A batch every 10 and 20 ms: every
	// 20 ms sample sees pushes, and the load costs the suite a tenth of
	// what batches every millisecond did.
	for w := 0; w < 2; w++ {
		pc, wc := dial(t, ts.addr), dial(t, ts.addr)
		wg.Add(2)
		go func() {
			defer wg.Done()
			jobs := make([]any, 20)
			for i := range jobs {
				jobs[i] = map[string]any{"name": "mail", "data": i, "maxAttempts": 1}
			}
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(w+1) * 10 * time.Millisecond):
				}
				if _, err := pc.do(map[string]any{"cmd": "PUSHB", "queue": fmt.Sprintf("load-%d", w), "jobs": jobs}, callTimeout); err != nil {
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				a, err := wc.do(map[string]any{"cmd": "PULLB", "queue": fmt.Sprintf("load-%d", w), "count": 20, "timeout": 200}, callTimeout)
				if err != nil {
					return
				}
				jobs, _ := a["jobs"].([]any)
				var ids []any
				for i, j := range jobs {
					id := j.(map[string]any)["id"]
					if (n+i)%10 == 0 {
						wc.do(map[string]any{"cmd": "FAIL", "id": id, "error": "mailbox full"}, callTimeout)
					} else {
						ids = append(ids, id)
					}
				}
				if len(ids) > 0 {
					wc.do(map[string]any{"cmd": "ACKB", "ids": ids}, callTimeout)
				}
			}
		}()
	}
	base := "http://" + ts.http
	// Ten minutes of history with pushes in its last interval; then the
	// clock stands still, and so do the history and the current rates,
	// which the page must show as they are.
	var want float64
	eventually(t, 30*time.Second, "ten minutes of history, pushes in the last interval", func() (bool, string) {
		clock.step.Store(rateEvery.Milliseconds())
		samples(5, "five samples, each rateEvery on")
		clock.step.Store(0)
		// A sample that read the clock before the stop is in: the
		// sampler has read it twice more since.
		samples(3, "a sample taken before the stop recorded")
		h, d := getHistory(t, base)
		want = num(t, sub(t, d, "throughput")["pushPerSec"])
		return len(h.At) == rateSlots && want > 0, fmt.Sprintf("%d intervals, %v pushes/s", len(h.At), want)
	})

	d.must("POST", "/url", map[string]string{"url": base + "/"})
	card := func(label string) string {
		return d.script(`for (const c of document.querySelectorAll('#cards .card')) {
			if (c.querySelector('.label').textContent === ` + strconv.Quote(label) + `) return c.querySelector('.value').textContent;
		} return '';`)
	}
	// The cards of the first paint: read as soon as they are there (the
	// page refreshes every 2 s).
	var pushed string
	d.waitFor(10*time.Second, "the first paint's cards", func() (bool, error) {
		pushed = card("Pushed /s")
		return pushed != "", nil
	})
	// As the page rounds: whole numbers from 100, tenths from 10.
	tol := 0.005
	if want >= 100 {
		tol = 0.5
	} else if want >= 10 {
		tol = 0.05
	}
	if v, err := strconv.ParseFloat(strings.ReplaceAll(pushed, ",", ""), 64); err != nil || math.Abs(v-want) > tol+1e-9 {
		t.Errorf("the Pushed /s card reads %q at first paint, want the server's %v", pushed, want)
	}
	if v := card("Pull p95 (service)"); !strings.HasSuffix(v, " ms") {
		t.Errorf("the pull card reads %q", v)
	}
	d.waitFor(10*time.Second, "the chart's first drawing", func() (bool, error) {
		return d.script(`return document.getElementById('chart').dataset.firstPoints || ''`) != "", nil
	})
	first := d.script(`const c = document.getElementById('chart').dataset; return c.firstPoints + ' ' + c.firstSpanMs`)
	var points, span int
	fmt.Sscan(first, &points, &span)
	if points != rateSlots || span < 590_000 {
		t.Errorf("the first drawing had %d points over %d ms, want %d over ten minutes", points, span, rateSlots)
	}
	t.Logf("first paint: %d points over %d ms; pushed/s %s (the server's %v)", points, span, pushed, want)

	// The feed and the queue table have something to show in the picture.
	d.waitFor(10*time.Second, "events in the feed, both queues in the table", func() (bool, error) {
		n := d.script(`return document.querySelectorAll('#feed li').length + ' ' + document.querySelectorAll('#queues tr').length`)
		var feed, rows int
		fmt.Sscan(n, &feed, &rows)
		return feed >= 20 && rows >= 2, nil
	})
	saveScreenshot(t, d, "QUEUED_SCREENSHOT_LOAD", "queued-dashboard-load.png")
	if errs := d.script(`return (window.__errors || []).join('\n')`); errs != "" {
		t.Errorf("the page reported errors:\n%s", errs)
	}
}

// saveScreenshot writes the browser's screenshot to $env, or to name in
// the temporary directory, and logs where.
func saveScreenshot(t *testing.T, d *wd, env, name string) {
	t.Helper()
	png := d.must("GET", "/screenshot", nil)
	var b64 string
	json.Unmarshal(png, &b64)
	img, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(img) < 1000 {
		t.Fatalf("screenshot: %v (%d bytes)", err, len(img))
	}
	path := os.Getenv(env)
	if path == "" {
		path = filepath.Join(os.TempDir(), name)
	}
	if err := os.WriteFile(path, img, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot saved: %s", path)
}

// TestDashboardBrowserDates: every date the page shows is in one format,
// 2026-12-01 04:05:06 (local time, 24-hour), whatever the browser's
// locale (here en-US, whose own format is 12/1/2026, 4:05:06 AM); times
// of today may leave the date out, and relative times stay relative.
func TestDashboardBrowserDates(t *testing.T) {
	t.Parallel()
	d := startBrowser(t, "--lang=en-US")
	ts := startServerHTTP(t, nil)
	c := dial(t, ts.addr)
	push(t, c, "dates", M{"delay": 3_600_000})
	id := push(t, c, "dates", nil)
	got := sub(t, c.ok(M{"cmd": "PULL", "queue": "dates"}), "job")
	if got["id"] != id {
		t.Fatalf("pulled %v, want %s", got["id"], id)
	}
	c.ok(M{"cmd": "AddLog", "id": id, "message": "sent"})
	c.ok(M{"cmd": "ACK", "id": id})

	d.must("POST", "/url", map[string]string{"url": "http://" + ts.http + "/#queue=dates&tab=delayed&job=" + id})
	d.waitFor(10*time.Second, "the job's drawer and the delayed jobs", func() (bool, error) {
		return d.script(`return document.querySelector('#jd-body .timeline .when') && document.querySelector('#qd-body td[title]') ? 'y' : ''`) == "y", nil
	})
	d.waitFor(10*time.Second, "the page's event stream", func() (bool, error) {
		return d.script(`return document.getElementById('live').className`) == "live on", nil
	})
	push(t, c, "dates", nil)
	d.waitFor(5*time.Second, "an event in the feed", func() (bool, error) {
		return d.script(`return document.querySelector('#feed li .t') ? 'y' : ''`) == "y", nil
	})

	// Every date shown, as [where, text].
	raw := d.script(`const out = [];
		const add = (where, s) => out.push([where, s]);
		document.querySelectorAll('#jd-body dl.kv dt').forEach((dt) => {
			if (['Created', 'Started', 'Finished', 'Runs at'].includes(dt.textContent)) add('drawer ' + dt.textContent, dt.nextElementSibling.textContent);
		});
		document.querySelectorAll('#jd-body .when').forEach((e) => { add('drawer time', e.textContent.trim()); if (e.title) add('drawer time title', e.title); });
		document.querySelectorAll('#qd-body td[title]').forEach((e) => { if (/^\d|^[A-Z]/.test(e.title) && !e.classList.contains('mono')) add('delayed tab title', e.title); });
		document.querySelectorAll('#feed li .t').forEach((e) => { add('feed', e.textContent); add('feed title', e.title); });
		return JSON.stringify(out);`)
	var shown [][2]string
	if err := json.Unmarshal([]byte(raw), &shown); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	full := `\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}`
	formats := map[string]*regexp.Regexp{
		// "2026-12-01 04:05:06 (3s ago)"
		"drawer":  regexp.MustCompile(`^` + full + ` \((\d+[smhd] ago|in \d+[smhd])\)$`),
		"time":    regexp.MustCompile(`^(` + full + `|\d{2}:\d{2}:\d{2})$`),
		"title":   regexp.MustCompile(`^` + full + `$`),
		"feed":    regexp.MustCompile(`^(` + full + `|\d{2}:\d{2}:\d{2})$`),
		"delayed": regexp.MustCompile(`^` + full + `$`),
	}
	seen := map[string]int{}
	for _, s := range shown {
		where, text := s[0], s[1]
		var re *regexp.Regexp
		switch {
		case strings.HasSuffix(where, "title"):
			re = formats["title"]
		case where == "drawer time":
			re = formats["time"]
		case strings.HasPrefix(where, "drawer"):
			re = formats["drawer"]
		case where == "feed":
			re = formats["feed"]
		default:
			re = formats["delayed"]
		}
		seen[strings.Fields(where)[0]]++
		if !re.MatchString(text) {
			t.Errorf("%s shows %q, not in the page's one date format", where, text)
		}
	}
	for _, where := range []string{"drawer", "delayed", "feed"} {
		if seen[where] == 0 {
			t.Errorf("no date found in the %s: %v", where, shown)
		}
	}
	t.Logf("%d dates checked: %v", len(shown), shown)
	if errs := d.script(`return (window.__errors || []).join('\n')`); errs != "" {
		t.Errorf("the page reported errors:\n%s", errs)
	}
}
