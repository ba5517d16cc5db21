package main

// The answer budget and the frame limit on answers (answer_budget.go).

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// jobAtLimits is a job with every list and string at its limit, and data
// of n bytes.
func jobAtLimits(n int) *Job {
	j := withID(&Job{Queue: strings.Repeat("q", maxQueueName), Name: strings.Repeat("n", 200),
		Data: encodeString(strings.Repeat("d", n))}, strings.Repeat("i", maxKeyBytes))
	c := j.warm()
	c.CustomID = j.ID()
	c.UniqueKey = strings.Repeat("u", maxKeyBytes)
	c.ParentID = strings.Repeat("p", maxKeyBytes)
	c.GroupID = strings.Repeat("g", maxGroupID)
	c.DebounceID = strings.Repeat("b", maxKeyBytes)
	for range maxTags {
		c.Tags = append(c.Tags, "")
	}
	for range maxDeps {
		c.DependsOn = append(c.DependsOn, "")
		c.Children = append(c.Children, "")
	}
	for range maxStackLines {
		c.Stack = append(c.Stack, "")
	}
	c.Progress = encodeString(strings.Repeat("r", 1000))
	c.ProgressMsg, c.HasProgressMsg = strings.Repeat("m", 1000), true
	for i := range maxTimelineEntries {
		j.setTimeline(append(j.Timeline(), TimelineEntry{State: StateFailed, At: int64(i) * 1e12, HasErr: true,
			Error: strings.Repeat("e", 100), Attempt: int32(i + 1)}))
	}
	return j
}

func encodeString(s string) Raw {
	var e Enc
	e.Str(s)
	return Raw(e.B)
}

// jobWireBound is never less than what encodeJob writes, in every mode,
// and a job without a result never passes maxJobWire.
func TestJobWireBound(t *testing.T) {
	t.Parallel()
	result := encodeString(strings.Repeat("r", 5000))
	for _, j := range []*Job{
		withID(&Job{Queue: "q", Name: "n", Data: Raw{0xc0}}, "a"),
		withID(&Job{Queue: "q", Name: "n", Data: encodeString(strings.Repeat("x", 9_900_000))}, "b"),
		jobAtLimits(0),
		jobAtLimits(maxDataBytes),
	} {
		for _, mode := range []int{jobPlain, jobWithRead, jobWithState} {
			for _, rv := range []Raw{nil, result} {
				var e Enc
				encodeJob(&e, j, mode, "waiting-children", rv)
				if bound := jobWireBound(j, rv); int64(len(e.B)) > bound {
					t.Errorf("job %.8s mode %d: encoded %d bytes, bound %d", j.ID(), mode, len(e.B), bound)
				}
			}
		}
		if b := jobWireBound(j, nil); b > maxJobWire && j.size() <= maxJobBytes {
			t.Errorf("job %.8s: bound %d over maxJobWire %d", j.ID(), b, maxJobWire)
		}
	}
	if answerCap-maxJobWire < 4*maxJobWire {
		t.Errorf("a pull of big jobs would carry few: answerCap %d, maxJobWire %d", answerCap, maxJobWire)
	}
}

// pullKeeps and the memory engine's claim stop at the same job.
func TestPullKeeps(t *testing.T) {
	t.Parallel()
	big := withID(&Job{Queue: "q", Data: encodeString(strings.Repeat("x", 9_900_000))}, "b")
	jobs := make([]*Job, 12)
	for i := range jobs {
		jobs[i] = big
	}
	keep := pullKeeps(jobs, 0)
	if keep < 1 || keep >= len(jobs) {
		t.Fatalf("pullKeeps kept %d of %d jobs of 9.9 MB", keep, len(jobs))
	}
	if got := int64(keep) * jobWireBound(big, nil); got > answerCap {
		t.Fatalf("%d jobs kept: %d bytes, over answerCap %d", keep, got, answerCap)
	}
	small := withID(&Job{Queue: "q", Data: Raw{0xc0}}, "s")
	if n := pullKeeps([]*Job{small, small, small}, 0); n != 3 {
		t.Fatalf("pullKeeps kept %d of 3 small jobs", n)
	}
}

// A reservation waits its turn, is granted in order as room is freed,
// and is refused, naming the budget, when none comes in time; a free that
// makes no room for the first in line wakes nobody.
func TestAnswerBudgetReserve(t *testing.T) {
	t.Parallel()
	a := newAnswerBudget(100, 0)
	a.wait = 5 * time.Second
	ctx := context.Background()
	if err := a.reserve(ctx, 80); err != nil {
		t.Fatal(err)
	}
	// Larger than the whole budget: granted when nothing else is held.
	done := make(chan string, 3)
	var wg sync.WaitGroup
	start := func(name string, n int64) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.reserve(ctx, n); err != nil {
				done <- name + ": " + err.Error()
				return
			}
			done <- name
		}()
		eventually(t, 5*time.Second, name+" queued", func() (bool, string) {
			a.mu.Lock()
			defer a.mu.Unlock()
			for _, w := range a.queue {
				if w.n == n {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d waiting", len(a.queue))
		})
	}
	start("first", 50)
	start("second", 10)
	// 10 bytes fit, but the second waits behind the first.
	a.hold(5)
	a.free(5)
	select {
	case got := <-done:
		t.Fatalf("%s granted while the budget had no room for the first in line", got)
	default:
	}
	a.free(30) // 50 held: the first (50) fits, the second not after it
	if got := <-done; got != "first" {
		t.Fatalf("granted %q, want the first in line", got)
	}
	a.free(10)
	if got := <-done; got != "second" {
		t.Fatalf("granted %q, want the second", got)
	}
	if u := a.used.Load(); u != 100 {
		t.Fatalf("%d bytes held, want 100", u)
	}
	a.free(100)
	if err := a.reserve(ctx, 500); err != nil {
		t.Fatalf("an answer larger than the budget, alone: %v", err)
	}
	a.wait = 50 * time.Millisecond
	err := a.reserve(ctx, 10)
	if err == nil || !strings.HasPrefix(err.Error(), busyPrefix) || !strings.Contains(err.Error(), "100 bytes") {
		t.Fatalf("refusal %v: want %q naming the budget", err, busyPrefix)
	}
	if a.refused.Load() != 1 || a.waiting.Load() != 0 {
		t.Fatalf("refused %d, waiting %d", a.refused.Load(), a.waiting.Load())
	}
	cctx, cancel := context.WithCancel(ctx)
	a.wait = time.Minute
	go cancel()
	if err := a.reserve(cctx, 10); err == nil {
		t.Fatal("a reservation whose connection closed was granted")
	}
	a.free(500)
	wg.Wait()
	if u := a.used.Load(); u != 0 {
		t.Fatalf("%d bytes still held", u)
	}
}

// Turns go round the clients: with the budget full, four reservations of
// client A queued before one of client B, the room freed goes to A's
// first, then B's, then A's others, and a reservation is granted to its
// client's earliest first.
func TestAnswerTurnsByClient(t *testing.T) {
	t.Parallel()
	a := newAnswerBudget(100, 0)
	a.wait = time.Minute
	ctx := context.Background()
	if err := a.reserve(ctx, 100); err != nil {
		t.Fatal(err)
	}
	granted := make(chan string, 8)
	queued := 0
	start := func(name, client string) {
		go func() {
			if err := a.reserveFor(ctx, 60, client); err != nil {
				granted <- name + ": " + err.Error()
				return
			}
			granted <- name
		}()
		queued++
		eventually(t, 5*time.Second, name+" queued", func() (bool, string) {
			n := a.waiting.Load()
			return int(n) == queued, fmt.Sprintf("%d waiting", n)
		})
	}
	for i := 1; i <= 4; i++ {
		start(fmt.Sprintf("A%d", i), "A")
	}
	start("B1", "B")
	var order []string
	for range 5 {
		a.free(100 - a.used.Load() + 60) // room for the next one only
		order = append(order, <-granted)
	}
	if got := strings.Join(order, " "); got != "A1 B1 A2 A3 A4" {
		t.Fatalf("granted in the order %s, want A1 B1 A2 A3 A4", got)
	}
}

// A big answer's write that makes no progress while a reservation waits is
// stopped once it has stalled for the budget's stall time, and its room
// goes to the waiting one; a write that makes progress is left alone.
func TestAnswerReclaimStalled(t *testing.T) {
	t.Parallel()
	a := newAnswerBudget(100, 0)
	a.wait = time.Minute
	a.stall = time.Second
	stopped := make(chan string, 2)
	a.hold(100)
	stalled := a.writing(func() { stopped <- "stalled"; a.free(60) })
	reading := a.writing(func() { stopped <- "reading" })
	defer a.done(reading)
	// The reading one writes a little every 20 ms while the reservation
	// waits.
	waited := make(chan struct{})
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				reading.progress()
			case <-waited:
				return
			}
		}
	}()
	err := a.reserveFor(context.Background(), 60, "other")
	close(waited)
	if err != nil {
		t.Fatalf("the waiting reservation: %v", err)
	}
	if who := <-stopped; who != "stalled" {
		t.Fatalf("%s stopped", who)
	}
	select {
	case who := <-stopped:
		t.Fatalf("%s stopped too", who)
	default:
	}
	a.wmu.Lock()
	_, still := a.writers[reading]
	_, gone := a.writers[stalled]
	a.wmu.Unlock()
	if !still || gone || a.reclaimed.Load() != 1 {
		t.Fatalf("reading registered %v, stalled registered %v, reclaimed %d", still, gone, a.reclaimed.Load())
	}
}

// bigJob pushes a job of n bytes of data and returns its id. Within a
// minute, not callTimeout: in PostgreSQL mode a FAIL of a job of 9.9 MB,
// which writes its row again, once took longer than 10 s while the whole
// suite ran, and a PUSH writes as much.
func bigJob(t *testing.T, c *tclient, queue string, n, attempts int) string {
	t.Helper()
	return str(t, c.okWithin(M{"cmd": "PUSH", "queue": queue, "data": strings.Repeat("x", n), "maxAttempts": attempts}, time.Minute), "id")
}

// No answer is larger than the frame limit: a page of big jobs, a pull of
// them and the DLQ are cut to what one frame carries, and what is left is
// there for the next page or pull. In every storage mode.
func TestAnswersCutToFrameLimit(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"memory", "sqlite", "postgres"} {
		t.Run(mode, func(t *testing.T) {
			// The release build: the race detector's took 12 s to read a
			// frame of big jobs from PostgreSQL, and the answer paths are
			// checked for races in process (TestJSONAnswersInPieces,
			// TestAnswerTurnsByClient, ...).
			srv := startBinary(t, storageFlags(t, mode)...)
			c := dial(t, srv.addr())
			const n, size = 8, 9_900_000
			ids := map[string]bool{}
			for range n {
				ids[bigJob(t, c, "big", size, 1)] = true
			}
			// A frame of big jobs read from PostgreSQL takes seconds
			// under the race detector (12 s on this machine).
			const bigAnswer = time.Minute
			// GetJobs pages.
			seen := map[string]bool{}
			for offset := 0; len(seen) < n; {
				jobs := list(t, c.okWithin(M{"cmd": "GetJobs", "queue": "big", "limit": 100, "offset": offset}, bigAnswer), "jobs")
				if len(jobs) == 0 || len(jobs)*size > MaxFrame {
					t.Fatalf("GetJobs at offset %d answered %d jobs of %d bytes", offset, len(jobs), size)
				}
				if offset == 0 && len(jobs) == n {
					t.Fatalf("GetJobs answered all %d jobs of %d bytes in one frame", n, size)
				}
				for _, j := range jobs {
					seen[str(t, j.(map[string]any), "id")] = true
				}
				offset += len(jobs)
			}
			// PULLB: what one answer cannot carry stays waiting.
			var pulled []any
			var tokens []any
			for len(pulled) < n {
				a := c.okWithin(M{"cmd": "PULLB", "queue": "big", "count": n, "owner": "w"}, bigAnswer)
				jobs := list(t, a, "jobs")
				if len(jobs) == 0 || len(jobs)*size > MaxFrame {
					t.Fatalf("PULLB answered %d jobs of %d bytes", len(jobs), size)
				}
				if len(pulled) == 0 && len(jobs) == n {
					t.Fatalf("PULLB answered all %d jobs of %d bytes in one frame", n, size)
				}
				counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "big"}), "counts")
				if w := num(t, counts["waiting"]); int(w) != n-len(pulled)-len(jobs) {
					t.Fatalf("after a PULLB of %d: %v waiting, want %d", len(jobs), w, n-len(pulled)-len(jobs))
				}
				for _, j := range jobs {
					id := str(t, j.(map[string]any), "id")
					if !ids[id] {
						t.Fatalf("PULLB answered %s twice or unknown", id)
					}
					delete(ids, id)
					pulled = append(pulled, id)
				}
				tokens = append(tokens, list(t, a, "tokens")...)
			}
			// Each fails for good: the DLQ holds them all, its answer what
			// fits. In PostgreSQL mode a FAIL writes the job's row again,
			// its data with it: 0.3-0.5 s a job here alone, and once more
			// than 10 s while the whole suite ran.
			for i, id := range pulled {
				c.okWithin(M{"cmd": "FAIL", "id": id, "token": tokens[i], "error": "no"}, bigAnswer)
			}
			eventually(t, 30*time.Second, "every job in the DLQ", func() (bool, string) {
				st := sub(t, sub(t, c.ok(M{"cmd": "GetDlqStats", "queue": "big"}), "data"), "stats")
				return num(t, st["total"]) == n, fmt.Sprint(st)
			})
			a := c.okWithin(M{"cmd": "Dlq", "queue": "big"}, bigAnswer)
			if jobs := list(t, a, "jobs"); len(jobs) == 0 || len(jobs) == n || 2*len(jobs)*size > MaxFrame {
				t.Fatalf("Dlq answered %d entries of %d bytes (twice each)", len(jobs), size)
			}
			c.ok(M{"cmd": "Ping"})
		})
	}
}

// binaryData is n bytes of binary job data (a JavaScript Buffer): four
// times as long in JSON.
func binaryData(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131 + i>>8)
	}
	return b
}

// dataAsJSON is binary data as a job answer renders it: the array of its
// byte values. An answer is checked against it byte for byte: decoding
// millions of numbers with encoding/json took most of the test's time
// under the race detector.
func dataAsJSON(data []byte) []byte {
	out := append(make([]byte, 0, 4*len(data)+16), `"data":[`...)
	for i, b := range data {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendUint(out, uint64(b), 10)
	}
	return append(out, ']')
}

// hasJobData reports an answer that is JSON and carries data whole.
func hasJobData(t *testing.T, body []byte, want []byte) bool {
	t.Helper()
	if !json.Valid(body) {
		t.Fatalf("answer of %d bytes is not JSON", len(body))
	}
	return bytes.Contains(body, want)
}

// Big answers over HTTP and WebSocket, rendered to the client a piece at a
// time rather than held as JSON, arrive whole, with their exact length,
// the same as the whole rendering; lists of jobs are cut to what a JSON
// answer carries (binary data is four times as long in JSON); and an
// answer whose JSON would pass the frame limit is refused, naming it.
//
// The rendering in pieces runs in this process, under the race detector,
// with an answer of 1.2 MB (37 pieces); the answers near the frame limit,
// 20 to 72 MB of JSON each, from the release build (under the race
// detector they took 25 s of the test's 37).
func TestJSONAnswersInPieces(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	jsonAnswerWhole(t, ts.addr, ts.http, binaryData(300_000))
	srv := startBinary(t, "--memory")
	jsonAnswersToFrameLimit(t, srv.addr(), fmt.Sprintf("127.0.0.1:%d", srv.httpPort))
}

// jsonAnswerWhole pushes data and reads its job back over HTTP and
// WebSocket: the JSON is exactly as long as announced and holds the data.
func jsonAnswerWhole(t *testing.T, addr, httpAddr string, data []byte) {
	c := dial(t, addr)
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "j", "data": data}), "id")

	resp, body := httpGet(t, httpAddr, "/jobs/"+id, "")
	if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(body)) {
		t.Fatalf("GET /jobs/ID: %s, Content-Length %d, %d bytes", resp.Status, resp.ContentLength, len(body))
	}
	want := dataAsJSON(data)
	if !hasJobData(t, []byte(body), want) {
		t.Fatalf("GET /jobs/ID: data of %d bytes did not come back whole in %d bytes of JSON", len(data), len(body))
	}
	ws := dialWS(t, httpAddr, "/ws")
	ws.text(`{"cmd":"GetJob","id":"` + id + `","reqId":"r1"}`)
	msg := ws.answer("r1")
	if !hasJobData(t, []byte(msg), want) {
		t.Fatalf("WebSocket GetJob: data of %d bytes did not come back whole in %d bytes of JSON", len(data), len(msg))
	}
}

// jsonAnswersToFrameLimit: pages and pulls of big jobs cut to what a
// JSON answer carries, and a job whose JSON passes the frame limit
// refused, over HTTP and WebSocket.
func jsonAnswersToFrameLimit(t *testing.T, addr, httpAddr string) {
	c := dial(t, addr)
	ws := dialWS(t, httpAddr, "/ws")

	// Six jobs of 5 MB: over TCP a page and a pull carry several; as JSON,
	// what stays under the frame limit, 20 MB of JSON each.
	for range 6 {
		c.ok(M{"cmd": "PUSH", "queue": "list", "data": binaryData(5_000_000)})
	}
	if n := len(list(t, c.ok(M{"cmd": "GetJobs", "queue": "list", "limit": 10}), "jobs")); n != 6 {
		t.Fatalf("GetJobs over TCP answered %d of 6 jobs of 5 MB", n)
	}
	_, body := httpGet(t, httpAddr, "/queues/list/jobs/list?limit=10", "")
	var page struct {
		Jobs []json.RawMessage `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(body), &page); err != nil || len(page.Jobs) == 0 || len(page.Jobs) > 3 || len(body) > MaxFrame {
		t.Fatalf("GetJobs over HTTP: %d jobs in %d bytes of JSON (err %v)", len(page.Jobs), len(body), err)
	}
	ws.text(`{"cmd":"PULLB","queue":"list","count":6,"reqId":"r2"}`)
	msg := ws.answer("r2")
	var pulled struct {
		Jobs []json.RawMessage `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(msg), &pulled); err != nil || len(pulled.Jobs) == 0 || len(pulled.Jobs) > 3 || len(msg) > MaxFrame {
		t.Fatalf("PULLB over WebSocket: %d jobs in %d bytes of JSON (err %v): %.300s", len(pulled.Jobs), len(msg), err, msg)
	}
	counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "list"}), "counts")
	if w := num(t, counts["waiting"]); int(w) != 6-len(pulled.Jobs) {
		t.Fatalf("after a PULLB of %d: %v waiting", len(pulled.Jobs), w)
	}

	// Data whose JSON is twelve times its MessagePack: maps whose keys are
	// maps, each "[object Object]":false. 6 MB of it is 72 MB of JSON.
	var e Enc
	pairs := 3_000_000
	e.B = binary.BigEndian.AppendUint32(append(e.B, 0xdf), uint32(pairs))
	for range pairs {
		e.B = append(e.B, 0x80, 0xc2)
	}
	huge := str(t, c.ok(M{"cmd": "PUSH", "queue": "huge", "data": Raw(e.B)}), "id")
	resp, body := httpGet(t, httpAddr, "/jobs/"+huge, "")
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(body, "frame limit of 64 MiB") {
		t.Fatalf("GET /jobs/ID of 72 MB of JSON: %s %.300s", resp.Status, body)
	}
	ws.text(`{"cmd":"GetJob","id":"` + huge + `","reqId":"r3"}`)
	if msg := ws.answer("r3"); !strings.Contains(msg, "frame limit of 64 MiB") {
		t.Fatalf("WebSocket GetJob of 72 MB of JSON: %.300s", msg)
	}
}

// answer reads up to the answer carrying reqId, past the events the
// socket is sent meanwhile.
func (c *wsClient) answer(reqID string) string {
	c.t.Helper()
	for {
		_, msg := c.readData()
		if strings.Contains(msg, `"reqId":"`+reqID+`"`) {
			return msg
		}
	}
}

// TestAnswerReclaimDue: the waiters' looks for stalled writes are one
// walk per reclaimEvery however many wait, not one each: a second look
// within it finds nothing to do, the next one after it does.
func TestAnswerReclaimDue(t *testing.T) {
	t.Parallel()
	a := newAnswerBudget(100, 0)
	a.stall = time.Second
	stops := 0
	stalledWriter := func() *answerWriter {
		w := a.writing(func() { stops++ })
		w.last.Store(time.Now().Add(-time.Minute).UnixNano())
		return w
	}
	now := time.Now()
	stalledWriter()
	a.reclaimDue(now)
	if stops != 1 {
		t.Fatalf("the first look stopped %d writes, want 1", stops)
	}
	w := stalledWriter()
	defer a.done(w)
	for i := range 1000 {
		a.reclaimDue(now.Add(time.Duration(i) * time.Microsecond))
	}
	if stops != 1 {
		t.Fatalf("1,000 looks within %v stopped %d writes, want none more", reclaimEvery, stops-1)
	}
	a.reclaimDue(now.Add(reclaimEvery))
	if stops != 2 {
		t.Fatalf("the look after %v stopped %d writes, want 1", reclaimEvery, stops-1)
	}
}
