package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLogFormatJSON: LOG_FORMAT=json, as the reference reads it, makes
// every log line one JSON object, from the start line to the stop.
func TestLogFormatJSON(t *testing.T) {
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

// TestHealthcheckCommand: queued healthcheck exits 0 for a server that
// answers healthy, and 1 for one that does not answer, answers otherwise,
// or redirects; it prints nothing of the answer.
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
