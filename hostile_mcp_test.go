//go:build linux

package main

// MCP over HTTP against the real binary, with the settings
// (--max-memory 512MiB --max-answer-bytes 32MiB): get_jobs over jobs of
// 9.9 MB of binary data (what a JavaScript Buffer becomes). Before the
// answers were sized, two such jobs gave one answer of 277 MB and a peak
// of 981 MB resident; six took the server to 5.2 GB, and ten callers that
// did not read their answers to 18.5 GB.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

const mcpBinJobBytes = 9_900_000

// mcpRSSBounds are the peak resident memory bounds, for one caller and
// for ten, in bytes: the (under 300 MB and 400 MB), in every mode.
// What a server must hold: its own 20-30 MB;
// the jobs (79 MB in memory mode; SQLite's page cache besides); one wire
// answer of a get_jobs over six jobs (60 MB, held in the answer budget
// until the MCP answer is built: larger than the 32 MiB budget, it is let
// in only when nothing else is held, so one at a time) and the
// collector's slack over what is live, which the budget takes back as
// each such answer is let go (answerBudget.collect). Measured on the 2-core machine: one caller
// over six jobs 178-230 MB in memory mode, 195-225 MB with SQLite,
// 210-221 MB with PostgreSQL; ten callers 167-219 MB in memory mode,
// 195-296 MB with SQLite (its cache grows with the reads). Left 70 MB or
// more for a busier machine's later collections.
//
// In PostgreSQL mode a read reserves what it holds while it lasts (the
// driver's buffer for a row, the jobs decoded, the answer: pgReadBytes),
// so one page is read at a time here too. Ten callers had peaked at
// 400-525 MB: the driver's pool kept the context a connection was made
// for, and with it the answer of the request that made it (fetch no
// longer lets a context reach the request); now 223 MB.
var mcpRSSBounds = map[string]struct{ one, ten float64 }{
	"memory":   {300e6, 400e6},
	"sqlite":   {300e6, 400e6},
	"postgres": {300e6, 400e6},
}

// Serial: its bound is a server's peak resident memory, which a busy machine raises.
func TestHostileMCPAnswers(t *testing.T) {
	// Not beside other tests: its bound is the peak resident memory of a
	// server whose collector must keep up (420 MB against 400 when run
	// four at a time).
	for _, mode := range []string{"memory", "sqlite", "postgres"} {
		t.Run(mode, func(t *testing.T) { mcpBigBinaryJobs(t, []string{queuedBinary(t)}, mode) })
	}
}

// mcpBigBinaryJobs runs the calls against the server binary argv.
func mcpBigBinaryJobs(t *testing.T, argv []string, mode string) {
	bounds := mcpRSSBounds[mode]
	srv := startBinaryAt(t, argv, append(storageFlags(t, mode),
		"--max-memory", "512MiB", "--max-answer-bytes", "32MiB")...)
	pid := srv.cmd.Process.Pid
	httpAddr := fmt.Sprintf("127.0.0.1:%d", srv.httpPort)
	c := dial(t, srv.addr())
	data := bytes.Repeat([]byte{0xab}, mcpBinJobBytes)
	for _, q := range []struct {
		name string
		n    int
	}{{"two", 2}, {"six", 6}} {
		for range q.n {
			c.ok(M{"cmd": "PUSH", "queue": q.name, "data": data})
		}
	}
	data = nil
	// What the pushes left is given back first: the figures are what
	// the MCP calls cost.
	c.ok(M{"cmd": "CompactMemory"})
	base, _ := readRSS(pid)
	getJobs := func(q string) string {
		return toolCall("1", "bunqueue_get_jobs", `{"queue":"`+q+`"}`)
	}

	// One caller, over two jobs and over six.
	for _, q := range []struct {
		name string
		n    int
	}{{"two", 2}, {"six", 6}} {
		rss := watchRSS(t, pid)
		ans := mcpPost(t, httpAddr, getJobs(q.name))
		peak := rss.end()
		var p jobsPage
		if toolAnswer(t, ans, &p) || p.Count != q.n || len(ans) > defaultMCPAnswer {
			t.Fatalf("get_jobs over %d jobs: %d jobs in %d bytes: %.300s", q.n, p.Count, len(ans), ans)
		}
		for _, j := range p.Jobs {
			if !strings.Contains(string(j.Data), "binary of 9,900,000 bytes") {
				t.Errorf("data %.200s, want it summarised", j.Data)
			}
		}
		t.Logf("%s: get_jobs over %d jobs of %.1f MB binary: an answer of %d bytes; resident %.0f MB before, peak %.0f MB",
			mode, q.n, mcpBinJobBytes/1e6, len(ans), float64(base)/1e6, float64(peak)/1e6)
		if float64(peak) > bounds.one {
			t.Errorf("peak resident memory %.0f MB, over %.0f MB", float64(peak)/1e6, bounds.one/1e6)
		}
	}

	// Ten callers that send their request and do not read: each has its
	// answer waiting in its socket once the server has built it (seen
	// with MSG_PEEK, which takes nothing).
	rss := watchRSS(t, pid)
	body := getJobs("six")
	var socks []net.Conn
	defer func() {
		for _, nc := range socks {
			nc.Close()
		}
	}()
	for range 10 {
		nc, err := net.DialTimeout("tcp", httpAddr, callTimeout)
		if err != nil {
			t.Fatal(err)
		}
		nc.(*net.TCPConn).SetReadBuffer(4 << 10)
		socks = append(socks, nc)
		fmt.Fprintf(nc, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	eventually(t, 3*time.Minute, "every caller's answer waiting in its socket", func() (bool, string) {
		n := 0
		for _, nc := range socks {
			if peeked(t, nc) {
				n++
			}
		}
		return n == len(socks), fmt.Sprint(n, " answered")
	})
	peak := rss.end()
	// What they were answered: read now.
	busy := 0
	for _, nc := range socks {
		nc.SetReadDeadline(time.Now().Add(callTimeout))
		res, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var p jobsPage
		var refusal struct{ Error string }
		if toolAnswer(t, b, nil) {
			// The budget had no room within its wait: refused, naming it.
			toolAnswer(t, b, &refusal)
			if !strings.Contains(refusal.Error, "--max-answer-bytes") {
				t.Errorf("a caller's refusal: %s", b)
			}
			busy++
			continue
		}
		if toolAnswer(t, b, &p); p.Count != 6 {
			t.Errorf("a caller's answer: %.300s", b)
		}
	}
	if busy == len(socks) {
		t.Errorf("all %d callers refused", busy)
	}
	t.Logf("%s: 10 callers not reading get_jobs over 6 jobs: %d answered, %d refused for want of room; peak %.0f MB",
		mode, len(socks)-busy, busy, float64(peak)/1e6)
	if float64(peak) > bounds.ten {
		t.Errorf("peak resident memory %.0f MB with ten callers, over %.0f MB", float64(peak)/1e6, bounds.ten/1e6)
	}
}

// peeked says whether bytes wait in nc's socket, without reading them.
func peeked(t *testing.T, nc net.Conn) bool {
	rc, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var buf [1]byte
	rc.Read(func(fd uintptr) bool {
		n, _, _ = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	})
	return n > 0
}
