package main

// The client subcommands: the exact request each one sends (against a
// recording fake server), then each one against a live queued: output,
// exit codes, and bad input refused before anything is sent.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// runCLI runs the binary's entry point in-process.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var so, se bytes.Buffer
	code = run(args, &so, &se)
	return code, so.String(), se.String()
}

// recorder is a fake server that records every request and answers each
// with ok:true (or with the answer set for its command).
type recorder struct {
	ln      net.Listener
	mu      sync.Mutex
	reqs    []map[string]any
	answers map[string]map[string]any
	wg      sync.WaitGroup
	conns   []net.Conn
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln, answers: map[string]map[string]any{}}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns = append(r.conns, nc)
			r.mu.Unlock()
			r.wg.Add(1)
			go r.serve(nc)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *recorder) serve(nc net.Conn) {
	defer r.wg.Done()
	br := bufio.NewReader(nc)
	for {
		body, err := ReadFrame(br, nil)
		if err != nil {
			return
		}
		v, err := Decode(body)
		if err != nil {
			return
		}
		m := v.(map[string]any)
		ans := map[string]any{"ok": true}
		r.mu.Lock()
		r.reqs = append(r.reqs, m)
		for k, v := range r.answers[fmt.Sprint(m["cmd"])] {
			ans[k] = v
		}
		r.mu.Unlock()
		ans["reqId"] = m["reqId"]
		if _, err := nc.Write(frame(ans)); err != nil {
			return
		}
	}
}

func (r *recorder) port() string {
	return strconv.Itoa(r.ln.Addr().(*net.TCPAddr).Port)
}

// take returns the requests recorded so far and forgets them.
func (r *recorder) take() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reqs
	r.reqs = nil
	for _, m := range out {
		delete(m, "reqId")
	}
	return out
}

// Every subcommand sends what the reference CLI sends, field for field.
func TestCLIWireRequests(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	rec.answers["GetState"] = map[string]any{"state": "waiting"}
	rec.answers["WaitJob"] = map[string]any{"completed": true}
	g := []string{"-H", "127.0.0.1", "-p", rec.port()}
	for _, tc := range []struct {
		args []string
		want map[string]any
	}{
		{[]string{"push", "q", `{"a":1}`}, map[string]any{"cmd": "PUSH", "queue": "q", "name": "default", "data": map[string]any{"a": int64(1)}}},
		{[]string{"push", "q", "-5", "-P", "3", "-d", "10", "--max-attempts", "2", "--backoff", "50", "--ttl", "9000",
			"--timeout", "100", "-u", "uk", "--job-id", "cid", "--depends-on", "a,b", "--tags", "x,y", "-g", "grp",
			"--lifo", "--remove-on-complete", "--remove-on-fail"},
			map[string]any{"cmd": "PUSH", "queue": "q", "name": "default", "data": int64(-5), "priority": int64(3),
				"delay": int64(10), "maxAttempts": int64(2), "backoff": int64(50), "ttl": int64(9000), "timeout": int64(100),
				"uniqueKey": "uk", "jobId": "cid", "dependsOn": []any{"a", "b"}, "tags": []any{"x", "y"}, "groupId": "grp",
				"lifo": true, "removeOnComplete": true, "removeOnFail": true}},
		{[]string{"push", "q", "1.5", "--priority=-2"}, map[string]any{"cmd": "PUSH", "queue": "q", "name": "default", "data": 1.5, "priority": int64(-2)}},
		{[]string{"pull", "q"}, map[string]any{"cmd": "PULL", "queue": "q", "detach": true}},
		{[]string{"pull", "q", "-t", "250"}, map[string]any{"cmd": "PULL", "queue": "q", "detach": true, "timeout": int64(250)}},
		{[]string{"ack", "J", "--result", `{"r":[1,"x"]}`}, map[string]any{"cmd": "ACK", "id": "J", "result": map[string]any{"r": []any{int64(1), "x"}}}},
		{[]string{"ack", "J"}, map[string]any{"cmd": "ACK", "id": "J"}},
		// FAIL is followed by GetJob, whose answer says where the job went.
		{[]string{"fail", "J", "-e", "boom"}, map[string]any{"cmd": "FAIL", "id": "J", "error": "boom"}},
		{[]string{"job", "get", "J"}, map[string]any{"cmd": "GetJob", "id": "J"}},
		{[]string{"job", "state", "J"}, map[string]any{"cmd": "GetState", "id": "J"}},
		{[]string{"job", "result", "J"}, map[string]any{"cmd": "GetResult", "id": "J"}},
		{[]string{"job", "cancel", "J"}, map[string]any{"cmd": "Cancel", "id": "J"}},
		{[]string{"job", "progress", "J", "40", "-m", "half"}, map[string]any{"cmd": "Progress", "id": "J", "progress": int64(40), "message": "half"}},
		{[]string{"job", "update", "J", `{"b":2}`}, map[string]any{"cmd": "Update", "id": "J", "data": map[string]any{"b": int64(2)}}},
		{[]string{"job", "priority", "J", "9"}, map[string]any{"cmd": "ChangePriority", "id": "J", "priority": int64(9)}},
		{[]string{"job", "promote", "J"}, map[string]any{"cmd": "Promote", "id": "J"}},
		{[]string{"job", "delay", "J", "5000"}, map[string]any{"cmd": "MoveToDelayed", "id": "J", "delay": int64(5000)}},
		{[]string{"job", "discard", "J"}, map[string]any{"cmd": "Discard", "id": "J"}},
		{[]string{"job", "logs", "J"}, map[string]any{"cmd": "GetLogs", "id": "J"}},
		{[]string{"job", "log", "J", "hello there"}, map[string]any{"cmd": "AddLog", "id": "J", "message": "hello there", "level": "info"}},
		{[]string{"job", "log", "J", "careful", "-l", "warn"}, map[string]any{"cmd": "AddLog", "id": "J", "message": "careful", "level": "warn"}},
		{[]string{"job", "wait", "J", "-t", "100"}, map[string]any{"cmd": "WaitJob", "id": "J", "timeout": int64(100)}},
		{[]string{"queue", "list"}, map[string]any{"cmd": "ListQueues"}},
		{[]string{"queue", "pause", "q"}, map[string]any{"cmd": "Pause", "queue": "q"}},
		{[]string{"queue", "resume", "q"}, map[string]any{"cmd": "Resume", "queue": "q"}},
		{[]string{"queue", "drain", "q"}, map[string]any{"cmd": "Drain", "queue": "q"}},
		{[]string{"queue", "obliterate", "q"}, map[string]any{"cmd": "Obliterate", "queue": "q"}},
		{[]string{"queue", "clean", "q", "--grace", "1000", "-s", "completed", "-l", "5"}, map[string]any{"cmd": "Clean", "queue": "q", "grace": int64(1000), "state": "completed", "limit": int64(5)}},
		// Without --state, completed: the protocol's default is waiting.
		{[]string{"queue", "clean", "q", "--grace", "0"}, map[string]any{"cmd": "Clean", "queue": "q", "grace": int64(0), "state": "completed"}},
		{[]string{"queue", "clean", "q", "-g", "5", "-s", "waiting"}, map[string]any{"cmd": "Clean", "queue": "q", "grace": int64(5), "state": "waiting"}},
		{[]string{"queue", "count", "q"}, map[string]any{"cmd": "Count", "queue": "q"}},
		{[]string{"queue", "jobs", "q", "--state", "waiting", "--limit", "10", "--offset", "2"}, map[string]any{"cmd": "GetJobs", "queue": "q", "state": "waiting", "limit": int64(10), "offset": int64(2)}},
		{[]string{"queue", "paused", "q"}, map[string]any{"cmd": "IsPaused", "queue": "q"}},
		{[]string{"rate-limit", "set", "q", "50"}, map[string]any{"cmd": "RateLimit", "queue": "q", "limit": int64(50)}},
		{[]string{"rate-limit", "clear", "q"}, map[string]any{"cmd": "RateLimitClear", "queue": "q"}},
		{[]string{"concurrency", "set", "q", "4"}, map[string]any{"cmd": "SetConcurrency", "queue": "q", "limit": int64(4)}},
		{[]string{"concurrency", "clear", "q"}, map[string]any{"cmd": "ClearConcurrency", "queue": "q"}},
		{[]string{"dlq", "list", "q", "-c", "3"}, map[string]any{"cmd": "Dlq", "queue": "q", "count": int64(3)}},
		{[]string{"dlq", "retry", "q", "--id", "J"}, map[string]any{"cmd": "RetryDlq", "queue": "q", "jobId": "J"}},
		{[]string{"dlq", "retry", "q"}, map[string]any{"cmd": "RetryDlq", "queue": "q"}},
		{[]string{"dlq", "purge", "q"}, map[string]any{"cmd": "PurgeDlq", "queue": "q"}},
		{[]string{"cron", "list"}, map[string]any{"cmd": "CronList"}},
		{[]string{"cron", "add", "nightly", "-q", "q", "-d", `{"k":true}`, "-s", "0 3 * * *", "-P", "2", "--max-limit", "0", "-z", "UTC"},
			map[string]any{"cmd": "Cron", "name": "nightly", "queue": "q", "data": map[string]any{"k": true}, "schedule": "0 3 * * *", "priority": int64(2), "timezone": "UTC"}},
		{[]string{"cron", "add", "tick", "-q", "q", "-d", "{}", "-e", "60000", "--max-limit", "10"},
			map[string]any{"cmd": "Cron", "name": "tick", "queue": "q", "data": map[string]any{}, "repeatEvery": int64(60000), "maxLimit": int64(10)}},
		{[]string{"cron", "delete", "nightly"}, map[string]any{"cmd": "CronDelete", "name": "nightly"}},
		{[]string{"worker", "list"}, map[string]any{"cmd": "ListWorkers"}},
		{[]string{"worker", "register", "w1", "-q", "a,b"}, map[string]any{"cmd": "RegisterWorker", "name": "w1", "queues": []any{"a", "b"}}},
		{[]string{"worker", "unregister", "W"}, map[string]any{"cmd": "UnregisterWorker", "workerId": "W"}},
		{[]string{"webhook", "list"}, map[string]any{"cmd": "ListWebhooks"}},
		{[]string{"webhook", "add", "https://example.com/h", "-e", "job.completed,job.failed", "-q", "q", "-s", "sec"},
			map[string]any{"cmd": "AddWebhook", "url": "https://example.com/h", "events": []any{"job.completed", "job.failed"}, "queue": "q", "secret": "sec"}},
		{[]string{"webhook", "remove", "H"}, map[string]any{"cmd": "RemoveWebhook", "webhookId": "H"}},
		{[]string{"stats"}, map[string]any{"cmd": "Stats"}},
		{[]string{"health"}, map[string]any{"cmd": "Stats"}},
		{[]string{"metrics"}, map[string]any{"cmd": "Prometheus"}},
		{[]string{"ping"}, map[string]any{"cmd": "Ping"}},
	} {
		code, _, errOut := runCLI(t, append(append([]string{}, tc.args...), g...)...)
		if code != 0 {
			t.Errorf("%v: exit %d: %s", tc.args, code, errOut)
			continue
		}
		got := rec.take()
		if tc.want["cmd"] == "FAIL" && len(got) == 2 && reflect.DeepEqual(got[1], map[string]any{"cmd": "GetJob", "id": tc.want["id"]}) {
			got = got[:1]
		}
		if len(got) != 1 || !reflect.DeepEqual(got[0], tc.want) {
			t.Errorf("%v sent\n  %#v\nwant\n  %#v", tc.args, got, tc.want)
		}
	}
}

// Bad input exits 2 with a message naming the problem, and nothing is sent.
func TestCLIBadInput(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	g := []string{"-H", "127.0.0.1", "-p", rec.port()}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"push"}, "missing required argument: queue"},
		{[]string{"push", "q"}, "missing required argument: data"},
		{[]string{"push", "q", "{bad"}, "invalid JSON for data"},
		{[]string{"push", "q", "1", "--priority", "high"}, "invalid number for priority"},
		{[]string{"push", "q", "1", "--delay", "-1"}, "delay must be >= 0"},
		{[]string{"push", "q", "1", "--max-attempts", "0"}, "max-attempts must be >= 1"},
		{[]string{"push", "q", "1", "--timeout", "0"}, "timeout must be > 0"},
		{[]string{"push", "q", "1", "--bogus"}, "unknown option --bogus"},
		{[]string{"push", "q", "1", "2"}, "unexpected argument"},
		{[]string{"push", "q", "1", "--priority"}, "needs a value"},
		{[]string{"pull"}, "missing required argument: queue"},
		{[]string{"ack"}, "missing required argument: id"},
		{[]string{"ack", "J", "--result", "{"}, "invalid JSON for result"},
		{[]string{"job"}, "missing subcommand"},
		{[]string{"job", "frob", "J"}, "unknown subcommand"},
		{[]string{"job", "get"}, "missing required argument: id"},
		{[]string{"job", "progress", "J", "101"}, "between 0 and 100"},
		{[]string{"job", "priority", "J", "x"}, "invalid number for priority"},
		{[]string{"job", "delay", "J", "-5"}, "delay must be"},
		{[]string{"job", "log", "J", "m", "--level", "loud"}, "invalid log level"},
		{[]string{"job", "wait", "J", "--timeout", "-1"}, "must be >= 0"},
		{[]string{"queue", "clean", "q"}, "--grace is required"},
		{[]string{"queue", "jobs", "q", "--state", "lost"}, "invalid state"},
		{[]string{"queue", "jobs", "q", "--limit", "0"}, "limit must be > 0"},
		{[]string{"queue", "pause"}, "missing required argument: queue"},
		{[]string{"rate-limit", "set", "q", "0"}, "positive number"},
		{[]string{"rate-limit", "reset", "q"}, "unknown subcommand"},
		{[]string{"concurrency", "set", "q"}, "missing required argument: limit"},
		{[]string{"dlq", "list"}, "missing required argument: queue"},
		{[]string{"cron", "add", "n", "-d", "{}", "-e", "5"}, "--queue (-q) is required"},
		{[]string{"cron", "add", "n", "-q", "q", "-e", "5"}, "--data (-d) is required"},
		{[]string{"cron", "add", "n", "-q", "q", "-d", "{}"}, "--schedule (-s) or --every (-e)"},
		{[]string{"cron", "add", "n", "-q", "q", "-d", "{}", "-e", "0"}, "positive interval"},
		{[]string{"worker", "register", "w"}, "--queues (-q) is required"},
		{[]string{"webhook", "add", "https://x.example/h"}, "--events (-e) is required"},
		{[]string{"webhook", "add", "https://x.example/h", "-e", "job.exploded"}, "invalid event"},
		{[]string{"webhook", "add", "ftp://x.example/h", "-e", "job.failed"}, "http or https"},
		{[]string{"webhook", "add", "not a url", "-e", "job.failed"}, "invalid URL"},
		{[]string{"stats", "extra"}, "unexpected argument"},
		{[]string{"ping", "--port", "99999"}, "invalid port"},
	} {
		code, out, errOut := runCLI(t, append(append([]string{}, tc.args...), g...)...)
		if code != 2 || !strings.Contains(errOut, tc.msg) || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.msg)
		}
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("bad input sent requests: %v", got)
	}
	if code, _, errOut := runCLI(t, "frobnicate"); code != 2 || !strings.Contains(errOut, "unknown command") {
		t.Errorf("unknown command: exit %d, %s", code, errOut)
	}
}

// cliServer starts queued in memory on ports P and P+1 (the CLI finds the
// HTTP port as the TCP port plus one) and returns the global options.
// freePortPair answers a port p such that p and p+1 were free a moment
// ago (the CLI finds the HTTP port at the TCP port + 1), from below the
// kernel's ephemeral range. The port after one the kernel gave to a
// listener is most likely one its outgoing connections use (Linux gives
// those ports of the other parity), and the suite's thousands of client
// connections hold theirs for a minute after they close: a CI run found
// p+1 taken 20 times in a row, then failed. Here only another test
// picking the same pair, or a service of the machine, can take it; the
// caller retries.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 100 {
		p := 20000 + 2*rand.IntN(6000)
		l1, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		l1.Close()
		if err != nil {
			continue
		}
		l2.Close()
		return p
	}
	t.Fatal("no free pair of ports from 20000 to 32000")
	return 0
}

func cliServer(t *testing.T, c *config) []string {
	t.Helper()
	if c == nil {
		c = &config{}
	}
	c.host = "127.0.0.1"
	c.memory = c.dataPath == ""
	for try := 0; ; try++ {
		p := freePortPair(t)
		c.tcpPort, c.httpPort = p, p+1
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		ready := make(chan struct{})
		go func() {
			done <- runServer(ctx, c, slog.New(slog.NewTextHandler(io.Discard, nil)), func(_, _ net.Addr) { close(ready) })
		}()
		select {
		case <-ready:
		case err := <-done:
			cancel()
			if try < 20 {
				continue
			}
			t.Fatalf("runServer: %v", err)
		}
		t.Cleanup(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Error("runServer did not return within 15s")
			}
		})
		return []string{"-H", "127.0.0.1", "-p", strconv.Itoa(p)}
	}
}

var uuidRe = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// cli runs a command against the live server and requires exit code want.
func cli(t *testing.T, g []string, want int, args ...string) (stdout, stderr string) {
	t.Helper()
	code, out, errOut := runCLI(t, append(append([]string{}, args...), g...)...)
	if code != want {
		t.Fatalf("queued %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out, errOut)
	}
	return out, errOut
}

func TestCLIJobLifecycle(t *testing.T) {
	t.Parallel()
	g := cliServer(t, nil)
	out, _ := cli(t, g, 0, "push", "emails", `{"to":"a@example.com"}`, "--priority", "5", "--tags", "x,y")
	id := uuidRe.FindString(out)
	if !strings.HasPrefix(out, "Job created: ") || id == "" {
		t.Fatalf("push output: %q", out)
	}
	out, _ = cli(t, g, 0, "push", "emails", `[1,2]`, "--json")
	var pushed map[string]any
	if err := json.Unmarshal([]byte(out), &pushed); err != nil || len(pushed) != 1 || !uuidRe.MatchString(fmt.Sprint(pushed["id"])) {
		t.Fatalf("push --json: %q (%v)", out, err)
	}
	id2 := pushed["id"].(string)

	out, _ = cli(t, g, 0, "job", "get", id)
	for _, want := range []string{"Job:", id, "Queue:", "emails", "State:", "prioritized", "Priority:", "5",
		"Attempts:", "0/3", `{"to":"a@example.com"}`, "Tags:", "x,y", "Created:"} {
		if !strings.Contains(out, want) {
			t.Errorf("job get: missing %q in\n%s", want, out)
		}
	}
	out, _ = cli(t, g, 0, "job", "state", id)
	if out != "State: prioritized\n" {
		t.Errorf("job state: %q", out)
	}
	out, _ = cli(t, g, 0, "job", "state", id, "--json")
	if !strings.Contains(out, `"state": "prioritized"`) || strings.Contains(out, "reqId") {
		t.Errorf("job state --json: %q", out)
	}
	_, errOut := cli(t, g, 1, "job", "state", "no-such-job")
	if !strings.Contains(errOut, "Job not found") {
		t.Errorf("job state of a missing job: %q", errOut)
	}
	_, errOut = cli(t, g, 1, "job", "get", "no-such-job")
	if !strings.Contains(errOut, "GetJob failed: Job not found") {
		t.Errorf("job get of a missing job: %q", errOut)
	}

	// The higher priority comes first; it stays active after the command
	// exits (detach), so ack works from another connection.
	out, _ = cli(t, g, 0, "pull", "emails")
	if !strings.Contains(out, id) || !strings.Contains(out, "Started:") {
		t.Fatalf("pull: %q", out)
	}
	if out, _ := cli(t, g, 0, "job", "state", id); out != "State: active\n" {
		t.Fatalf("after pull: %q", out)
	}
	cli(t, g, 0, "job", "progress", id, "50", "-m", "halfway")
	cli(t, g, 0, "job", "log", id, "sending", "--level", "warn")
	out, _ = cli(t, g, 0, "job", "logs", id)
	if !strings.Contains(out, "TIME") || !strings.Contains(out, "WARN") || !strings.Contains(out, "sending") {
		t.Errorf("job logs: %q", out)
	}
	out, _ = cli(t, g, 0, "ack", id, "--result", `{"sent":true}`)
	if out != "Job "+id+" completed\n" {
		t.Errorf("ack: %q", out)
	}
	out, _ = cli(t, g, 0, "job", "result", id)
	if !strings.Contains(out, `"sent": true`) {
		t.Errorf("job result: %q", out)
	}
	out, _ = cli(t, g, 0, "job", "wait", id, "-t", "1000")
	if !strings.Contains(out, "completed") || !strings.Contains(out, `"sent": true`) {
		t.Errorf("job wait on a completed job: %q", out)
	}
	// A wait that runs out of time is a failure for scripts.
	_, errOut = cli(t, g, 1, "job", "wait", id2, "--timeout", "50")
	if !strings.Contains(errOut, "not completed within the timeout") {
		t.Errorf("job wait timeout: %q", errOut)
	}
	out, _ = cli(t, g, 0, "job", "result", id2)
	if !strings.Contains(out, "No result") {
		t.Errorf("job result before completion: %q", out)
	}

	// pull -t is the timeout; an empty queue is not an error.
	start := time.Now()
	out, _ = cli(t, g, 0, "pull", "empty-queue", "-t", "200")
	if !strings.Contains(out, "No job available") || time.Since(start) < 150*time.Millisecond {
		t.Errorf("pull with timeout on an empty queue: %q after %v", out, time.Since(start))
	}
	// ack of a job that is not active says what failed.
	_, errOut = cli(t, g, 1, "ack", "no-such-job")
	if !strings.Contains(errOut, "ACK failed:") {
		t.Errorf("ack of a missing job: %q", errOut)
	}
}

func TestCLIFailAndDLQ(t *testing.T) {
	t.Parallel()
	g := cliServer(t, nil)
	out, _ := cli(t, g, 0, "push", "work", `{"n":1}`, "--max-attempts", "1")
	id := uuidRe.FindString(out)
	cli(t, g, 0, "pull", "work")
	out, _ = cli(t, g, 0, "fail", id, "--error", "disk on fire")
	if !strings.Contains(out, "Job "+id+" failed for good (attempt 1 of 1): moved to the dead-letter queue of work") {
		t.Errorf("fail: %q", out)
	}
	out, _ = cli(t, g, 0, "dlq", "list", "work")
	for _, want := range []string{"ID", "ERROR", id, "disk on fire", "1/1", "ago"} {
		if !strings.Contains(out, want) && !(want == "ago" && strings.Contains(out, "just now")) {
			t.Errorf("dlq list: missing %q in\n%s", want, out)
		}
	}
	out, _ = cli(t, g, 0, "dlq", "retry", "work", "--id", id)
	if !strings.Contains(out, "Retried 1 jobs") {
		t.Errorf("dlq retry: %q", out)
	}
	out, _ = cli(t, g, 0, "dlq", "list", "work")
	if !strings.Contains(out, "is empty") {
		t.Errorf("dlq list after retry: %q", out)
	}
	cli(t, g, 0, "pull", "work")
	cli(t, g, 0, "fail", id)
	out, _ = cli(t, g, 0, "dlq", "purge", "work")
	if !strings.Contains(out, "Purged 1 jobs") {
		t.Errorf("dlq purge: %q", out)
	}
}

func TestCLIQueues(t *testing.T) {
	t.Parallel()
	g := cliServer(t, nil)
	out, _ := cli(t, g, 0, "queue", "list")
	if out != "No queues\n" {
		t.Errorf("queue list on a new server: %q", out)
	}
	for i := range 3 {
		cli(t, g, 0, "push", "alpha", strconv.Itoa(i))
	}
	cli(t, g, 0, "push", "beta", `"x"`, "--delay", "60000")
	out, _ = cli(t, g, 0, "queue", "list")
	if out != "QUEUE\nalpha\nbeta\n" {
		t.Errorf("queue list: %q", out)
	}
	out, _ = cli(t, g, 0, "queue", "count", "alpha")
	if out != "Count: 3\n" {
		t.Errorf("queue count: %q", out)
	}
	out, _ = cli(t, g, 0, "queue", "jobs", "alpha", "--limit", "2")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[0], "STATE") {
		t.Fatalf("queue jobs --limit 2: %q", out)
	}
	// Columns line up: each header starts where its cells start.
	col := strings.Index(lines[0], "STATE")
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l[col:], "waiting") {
			t.Errorf("queue jobs: column STATE not aligned in %q", l)
		}
	}
	out, _ = cli(t, g, 0, "queue", "jobs", "beta", "--state", "delayed")
	if !strings.Contains(out, "delayed") {
		t.Errorf("queue jobs --state delayed: %q", out)
	}
	out, _ = cli(t, g, 0, "queue", "paused", "alpha")
	if out != "Queue alpha is active\n" {
		t.Errorf("queue paused: %q", out)
	}
	cli(t, g, 0, "queue", "pause", "alpha")
	out, _ = cli(t, g, 0, "queue", "paused", "alpha")
	if out != "Queue alpha is paused\n" {
		t.Errorf("queue paused after pause: %q", out)
	}
	out, _ = cli(t, g, 0, "pull", "alpha")
	if !strings.Contains(out, "No job available") {
		t.Errorf("pull from a paused queue: %q", out)
	}
	cli(t, g, 0, "queue", "resume", "alpha")
	out, _ = cli(t, g, 0, "queue", "drain", "alpha")
	if out != "Drained alpha: 3 waiting jobs removed\n" {
		t.Errorf("queue drain: %q", out)
	}
	out, _ = cli(t, g, 0, "queue", "obliterate", "beta")
	if out != "Queue beta obliterated\n" {
		t.Errorf("queue obliterate: %q", out)
	}
	out, _ = cli(t, g, 0, "queue", "count", "beta", "--json")
	if !strings.Contains(out, `"count": 0`) {
		t.Errorf("count after obliterate: %q", out)
	}
}

// Commands queued does not have yet go out as the reference sends them;
// the server's refusal is shown and the exit code is 1.
// TestCLIControlCommands drives the job, limit, cron and webhook
// subcommands against a live server: what the server refuses is shown with
// exit 1, what it does is reported with exit 0.
func TestCLIControlCommands(t *testing.T) {
	t.Parallel()
	g := cliServer(t, nil)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"job", "cancel", "J"}, "Cancel failed: Job not found"},
		{[]string{"job", "update", "J", "{}"}, "Update failed: Job not found"},
		{[]string{"job", "priority", "J", "3"}, "ChangePriority failed: Job not found"},
		{[]string{"job", "promote", "J"}, "Promote failed: Job not found"},
		{[]string{"job", "delay", "J", "10"}, "MoveToDelayed failed: Job not found"},
		{[]string{"job", "discard", "J"}, "Discard failed: Job not found"},
	} {
		if _, errOut := cli(t, g, 1, tc.args...); !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: stderr %q, want %q", tc.args, errOut, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"queue", "clean", "q", "--grace", "0"}, "Cleaned q: 0 completed jobs older than 0ms removed"},
		{[]string{"rate-limit", "set", "q", "5"}, "Rate limit of q set to 5 jobs/s"},
		{[]string{"rate-limit", "clear", "q"}, ""},
		{[]string{"concurrency", "set", "q", "2"}, "Concurrency of q limited to 2 active jobs"},
		{[]string{"concurrency", "clear", "q"}, ""},
		{[]string{"cron", "add", "c", "-q", "q", "-d", "{}", "-e", "60000"}, "Cron scheduled: c"},
		{[]string{"cron", "list"}, "every 1m"},
		{[]string{"cron", "delete", "c"}, "Cron c deleted"},
	} {
		if out, _ := cli(t, g, 0, tc.args...); !strings.Contains(out, tc.want) {
			t.Errorf("%v: stdout %q, want %q", tc.args, out, tc.want)
		}
	}
	// A promoted job moves: the CLI's request reached the server.
	out, _ := cli(t, g, 0, "push", "q", "{}", "--delay", "60000", "--json")
	var pushed map[string]any
	if err := json.Unmarshal([]byte(out), &pushed); err != nil || pushed["id"] == nil {
		t.Fatalf("push --json: %q", out)
	}
	id := fmt.Sprint(pushed["id"])
	cli(t, g, 0, "job", "promote", id)
	if out, _ := cli(t, g, 0, "job", "state", id); !strings.Contains(out, "waiting") {
		t.Errorf("state after promote: %q", out)
	}
	// Webhooks: add, list, remove.
	out, _ = cli(t, g, 0, "webhook", "add", "http://h.example/x", "-e", "job.failed", "--json")
	var added map[string]any
	if err := json.Unmarshal([]byte(out), &added); err != nil {
		t.Fatalf("webhook add --json: %q", out)
	}
	wid := fmt.Sprint(added["data"].(map[string]any)["webhookId"])
	if out, _ := cli(t, g, 0, "webhook", "list"); !strings.Contains(out, wid) || !strings.Contains(out, "http://h.example/x") ||
		!strings.Contains(out, "CIRCUIT") || !strings.Contains(out, "closed") {
		t.Errorf("webhook list: %q", out)
	}
	cli(t, g, 0, "webhook", "remove", wid)
	if out, _ := cli(t, g, 0, "webhook", "list"); strings.Contains(out, wid) {
		t.Errorf("webhook list after remove: %q", out)
	}
	// --json errors are JSON too.
	_, errOut := cli(t, g, 1, "job", "cancel", "J", "--json")
	var doc map[string]any
	if err := json.Unmarshal([]byte(errOut), &doc); err != nil || doc["ok"] != false ||
		!strings.Contains(fmt.Sprint(doc["error"]), "Job not found") {
		t.Errorf("--json error: %q", errOut)
	}
}

func TestCLIMonitoring(t *testing.T) {
	t.Parallel()
	g := cliServer(t, nil)
	cli(t, g, 0, "push", "m", "1")
	out, _ := cli(t, g, 0, "ping")
	if !strings.HasPrefix(out, "PONG from 127.0.0.1:") {
		t.Errorf("ping: %q", out)
	}
	out, _ = cli(t, g, 0, "stats")
	for _, want := range []string{"Waiting:", "1", "Active:", "DLQ:", "Uptime:"} {
		if !strings.Contains(out, want) {
			t.Errorf("stats: missing %q in\n%s", want, out)
		}
	}
	out, _ = cli(t, g, 0, "stats", "--json")
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil || st["stats"] == nil {
		t.Errorf("stats --json: %q", out)
	}
	out, _ = cli(t, g, 0, "health")
	if !strings.HasPrefix(out, "Healthy: 127.0.0.1:") || !strings.Contains(out, "1 waiting") {
		t.Errorf("health: %q", out)
	}
	// metrics shows the server's Prometheus text.
	out, _ = cli(t, g, 0, "metrics")
	if !strings.Contains(out, "bunqueue_jobs_pushed_total 1") || !strings.Contains(out, `bunqueue_queue_jobs_waiting{queue="m"} 1`) {
		t.Errorf("metrics: %q", out)
	}
	out, _ = cli(t, g, 0, "version")
	if !strings.Contains(out, "Client: queued "+version) || !strings.Contains(out, "Server: queued "+version+" at") {
		t.Errorf("version: %q", out)
	}
	out, _ = cli(t, g, 0, "doctor")
	for _, want := range []string{"CHECK", "http", "status", "storage", "dlq", "tcp", "All checks passed."} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor: missing %q in\n%s", want, out)
		}
	}
	// A job in the DLQ is an issue.
	out, _ = cli(t, g, 0, "push", "m", "2", "--max-attempts", "1")
	id := uuidRe.FindString(out)
	cli(t, g, 0, "pull", "m")
	cli(t, g, 0, "pull", "m")
	cli(t, g, 0, "fail", id)
	out, _ = cli(t, g, 1, "doctor", "--json")
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil || doc["ok"] != false || doc["issues"] != 1.0 {
		t.Errorf("doctor --json with a dead-lettered job: %q", out)
	}
	out, _ = cli(t, g, 0, "worker", "list")
	if out != "No workers registered\n" {
		t.Errorf("worker list: %q", out)
	}
	out, errOut := cli(t, g, 0, "worker", "register", "w1", "-q", "m,n")
	if !strings.HasPrefix(out, "Worker registered: ") || !strings.Contains(errOut, "Warning") {
		t.Errorf("worker register: %q %q", out, errOut)
	}
	_, errOut = cli(t, g, 1, "worker", "unregister", "no-such-worker")
	if !strings.Contains(errOut, "Worker not found") {
		t.Errorf("worker unregister: %q", errOut)
	}
}

func TestCLIWorkerListTable(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	c.ok(map[string]any{"cmd": "RegisterWorker", "name": "mailer", "queues": []any{"emails", "sms"}, "concurrency": 4})
	_, port, _ := net.SplitHostPort(ts.addr)
	out, _ := cli(t, []string{"-H", "127.0.0.1", "-p", port}, 0, "worker", "list")
	if !strings.Contains(out, "NAME") || !strings.Contains(out, "mailer") || !strings.Contains(out, "emails,sms") ||
		!strings.Contains(out, "just now") {
		t.Errorf("worker list: %q", out)
	}
}

// Serial: it sets environment variables (t.Setenv).
func TestCLIAuthAndConnection(t *testing.T) {
	ts := startServer(t, &config{authTokens: "s3cret"})
	_, port, _ := net.SplitHostPort(ts.addr)
	g := []string{"-H", "127.0.0.1", "-p", port}
	_, errOut := cli(t, g, 1, "ping")
	if !strings.Contains(errOut, "Not authenticated") {
		t.Errorf("ping without a token: %q", errOut)
	}
	_, errOut = cli(t, g, 1, "ping", "--token", "wrong")
	if !strings.Contains(errOut, "authentication failed: Invalid token") {
		t.Errorf("ping with a wrong token: %q", errOut)
	}
	cli(t, g, 0, "ping", "-t", "s3cret")
	cli(t, g, 0, "--token=s3cret", "queue", "list")
	t.Setenv("BQ_TOKEN", "s3cret")
	cli(t, g, 0, "ping")
	// After pull, -t is the timeout; the token comes from the environment.
	cli(t, g, 0, "pull", "q", "-t", "10")

	// Nobody listening: exit 1 with the address.
	closed := strconv.Itoa(freePort(t))
	_, errOut = cli(t, []string{"-H", "127.0.0.1", "-p", closed}, 1, "ping")
	if !strings.Contains(errOut, "connect to 127.0.0.1:"+closed) {
		t.Errorf("ping with nobody listening: %q", errOut)
	}
}

func TestCLIHelp(t *testing.T) {
	t.Parallel()
	code, out, _ := runCLI(t, "help")
	if code != 0 || !strings.Contains(out, "push <queue> <data>") || !strings.Contains(out, "--tls-no-verify") {
		t.Errorf("help: %d %q", code, out)
	}
	code, out2, _ := runCLI(t, "--help")
	if code != 0 || out2 != out {
		t.Errorf("--help differs from help")
	}
	for _, cmd := range []string{"push", "pull", "ack", "fail", "job", "queue", "rate-limit", "concurrency", "dlq",
		"cron", "worker", "webhook", "stats", "metrics", "health", "ping", "version", "doctor"} {
		code, a, _ := runCLI(t, "help", cmd)
		code2, b, _ := runCLI(t, cmd, "--help")
		if code != 0 || code2 != 0 || a != b || !strings.Contains(a, "Usage: queued "+cmd) {
			t.Errorf("help %s: exit %d/%d, %q vs %q", cmd, code, code2, a, b)
		}
	}
	code, out, _ = runCLI(t, "job", "wait", "--help")
	if code != 0 || !strings.Contains(out, "wait <id>") {
		t.Errorf("job wait --help: %q", out)
	}
	for _, cmd := range []string{"bench", "backup", "serve"} {
		if code, out, _ := runCLI(t, "help", cmd); code != 0 || !strings.Contains(out, "Usage") {
			t.Errorf("help %s: %d %q", cmd, code, out)
		}
	}
	if code, _, errOut := runCLI(t, "help", "nosuch"); code != 2 || !strings.Contains(errOut, "no help") {
		t.Errorf("help nosuch: %d %q", code, errOut)
	}
	if code, out, _ := runCLI(t, "--version"); code != 0 || !strings.Contains(out, version) {
		t.Errorf("--version: %d %q", code, out)
	}
}

func TestCLIHelpers(t *testing.T) {
	t.Parallel()
	for ms, want := range map[float64]string{0: "0ms", 850: "850ms", 12000: "12s", 250000: "4m 10s",
		7500000: "2h 5m", 3*86400000 + 4*3600000: "3d 4h", 3600000: "1h"} {
		if got := humanMs(ms); got != want {
			t.Errorf("humanMs(%v) = %q, want %q", ms, got, want)
		}
	}
	o, rest, err := parseGlobal([]string{"job", "wait", "J", "-t", "5", "--json", "-H", "h", "--port=7"})
	if err != nil || !o.json || o.host != "h" || o.port != 7 || strings.Join(rest, " ") != "job wait J -t 5" {
		t.Errorf("parseGlobal: %+v %v %v", o, rest, err)
	}
	if got := serverArgs([]string{"-p", "7000", "-H", "::1", "--port=1"}); strings.Join(got, " ") != "--tcp-port 7000 --host ::1 --tcp-port=1" {
		t.Errorf("serverArgs: %v", got)
	}
}

// `queued serve` (and `start`) take the client's spelling of the server's
// address (-p, --port, -H) as `queued` alone does; `serve --port` was
// refused as an unknown flag.
func TestServeTakesClientAddressFlags(t *testing.T) {
	t.Parallel()
	for _, sub := range []string{"serve", "start"} {
		var out, errb bytes.Buffer
		code := run([]string{sub, "--memory", "--port", "notaport"}, &out, &errb)
		if code != 2 || strings.Contains(errb.String(), "not defined") || !strings.Contains(errb.String(), "tcp-port") {
			t.Errorf("%s --port notaport: exit %d, %q", sub, code, errb.String())
		}
	}
}
