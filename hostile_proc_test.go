//go:build linux

package main

// Hostile clients against the real binary. Connection counts, descriptors
// and resident memory belong to a process, so these tests run the server
// as a subprocess and read its figures from /proc: 10,000 idle
// connections, a flood past the process's file limit, and 500
// unauthenticated connections announcing 64 MiB frames.

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// procMem reads a process's resident memory and its peak, in bytes.
func procMem(t *testing.T, pid int) (rss, peak int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the server's memory figures: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	return rss, peak
}

// openFiles counts a process's open descriptors.
func openFiles(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// setFileLimit lowers a running process's open-file limit (prlimit(2)),
// so that the server starts as usual and meets the limit afterwards.
func setFileLimit(pid int, n uint64) error {
	lim := syscall.Rlimit{Cur: n, Max: n}
	_, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), uintptr(syscall.RLIMIT_NOFILE),
		uintptr(unsafe.Pointer(&lim)), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

const mib = 1 << 20

// rawPing sends a Ping on a bare connection and reads its answer.
func rawPing(nc net.Conn, br *bufio.Reader, id string) error {
	nc.SetDeadline(time.Now().Add(callTimeout))
	defer nc.SetDeadline(time.Time{})
	if _, err := nc.Write(frame(M{"cmd": "Ping", "reqId": id})); err != nil {
		return err
	}
	body, err := ReadFrame(br, nil)
	if err != nil {
		return err
	}
	v, err := Decode(body)
	if err != nil {
		return err
	}
	if m, _ := v.(map[string]any); m["ok"] != true || m["reqId"] != id {
		return fmt.Errorf("Ping answered %v", v)
	}
	return nil
}

// activeConnections asks the server how many TCP connections it holds.
func activeConnections(t *testing.T, c *tclient) int {
	t.Helper()
	return int(num(t, sub(t, c.ok(M{"cmd": "Metrics"}), "metrics")["activeConnections"]))
}

// exercise runs a little of everything on c: the server does work, not
// only answers Ping.
func exercise(t *testing.T, c *tclient, queue string) {
	t.Helper()
	for i := 0; i < 20; i++ {
		push(t, c, queue, nil)
	}
	a := c.ok(M{"cmd": "PULLB", "queue": queue, "count": 20, "owner": "w"})
	jobs := list(t, a, "jobs")
	ids := make([]any, len(jobs))
	for i, j := range jobs {
		ids[i] = j.(map[string]any)["id"]
	}
	if len(ids) != 20 {
		t.Fatalf("pulled %d jobs of 20", len(ids))
	}
	c.ok(M{"cmd": "ACKB", "ids": ids, "tokens": a["tokens"]})
}

// 10,000 connections that each sent one command and then idle are held;
// the server keeps answering a working client, and its resident memory
// stays under idleRSSBound. (Each connection held a 64 KiB read buffer and
// a 4 KiB answer buffer for its whole life: 10,000 cost 390 MB resident,
// measured before the change.)
func TestHostileTenThousandIdleConnections(t *testing.T) {
	t.Parallel()
	const n = 10000
	const idleRSSBound = 128 * mib
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < n+1000 {
		t.Fatalf("the test holds %d client connections and needs an open-file limit above %d (have %d: raise it with ulimit -n)", n, n+1000, lim.Cur)
	}
	srv := startBinary(t, "--memory")
	pid := srv.cmd.Process.Pid
	base, _ := procMem(t, pid)

	conns := make([]net.Conn, n)
	t.Cleanup(func() {
		for _, nc := range conns {
			if nc != nil {
				nc.Close()
			}
		}
	})
	// A few dozen dialers, not one goroutine a connection: the test binary
	// may run with the race detector.
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || failed.Load() != nil {
					return
				}
				nc, err := net.DialTimeout("tcp", srv.addr(), callTimeout)
				if err != nil {
					failed.Store(fmt.Errorf("dial %d: %w", i, err))
					return
				}
				conns[i] = nc
				if err := rawPing(nc, bufio.NewReaderSize(nc, 64), "p"+strconv.Itoa(i)); err != nil {
					failed.Store(fmt.Errorf("connection %d: %w", i, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatal(err)
	}

	c := dial(t, srv.addr())
	eventually(t, 30*time.Second, "the server counts every connection", func() (bool, string) {
		got := activeConnections(t, c)
		return got >= n, fmt.Sprintf("%d connections", got)
	})
	exercise(t, c, "busy")
	rss, peak := procMem(t, pid)
	files := openFiles(pid)
	heap := num(t, sub(t, c.ok(M{"cmd": "Metrics"}), "metrics")["memoryUsageMb"])
	t.Logf("%d idle connections held: server resident %.1f MiB (%.1f MiB before them, peak %.1f MiB), %.1f KiB a connection, Go heap %.1f MiB, %d open files",
		n, float64(rss)/mib, float64(base)/mib, float64(peak)/mib, float64(rss-base)/1024/n, heap, files)
	if rss > idleRSSBound {
		t.Errorf("server resident memory with %d idle connections is %.1f MiB, over the bound of %d MiB", n, float64(rss)/mib, idleRSSBound/mib)
	}
	// The idle connections still work.
	for _, i := range []int{0, n / 3, n / 2, n - 1} {
		if err := rawPing(conns[i], bufio.NewReaderSize(conns[i], 64), "again"); err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
	}
	exercise(t, c, "busy")
}

// A flood of connections past the process's open-file limit: accept(2)
// fails with EMFILE, the server backs off and keeps serving the
// connections it has, does not exit, and accepts again once the flood
// ends. (It exited on the first EMFILE: "accept4: too many open files".)
func TestHostileFileLimitFlood(t *testing.T) {
	t.Parallel()
	// The limit on connections is well above the file limit, so that the
	// flood meets the file limit rather than the connection limit.
	srv := startBinary(t, "--memory", "--max-connections", "100000")
	pid := srv.cmd.Process.Pid
	c := dial(t, srv.addr())
	kept := push(t, c, "kept", nil)

	const limit = 64
	if err := setFileLimit(pid, limit); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	const flood = 400
	var held []net.Conn
	defer func() {
		for _, nc := range held {
			nc.Close()
		}
	}()
	refused := 0
	for i := 0; i < flood; i++ {
		nc, err := net.DialTimeout("tcp", srv.addr(), time.Second)
		if err != nil {
			refused++
			continue
		}
		held = append(held, nc)
		if i%50 == 0 {
			// The connected client is answered throughout.
			c.ok(M{"cmd": "Ping"})
		}
	}
	// Past the limit for a while: the server backs off and stays up.
	eventually(t, 20*time.Second, "the server meets its file limit", func() (bool, string) {
		return strings.Contains(srv.output(), "too many open files"), "no EMFILE logged yet"
	})
	exercise(t, c, "during-flood")
	select {
	case <-srv.done:
		t.Fatalf("the server exited during the flood:\n%s", srv.output())
	default:
	}
	files := openFiles(pid)
	backoffLines := strings.Count(srv.output(), "accept failed")
	t.Logf("flood of %d connections (%d refused by the kernel) against a file limit of %d: the server holds %d files, logged %d backoff lines",
		flood, refused, limit, files, backoffLines)
	if backoffLines == 0 || backoffLines > 5 {
		t.Errorf("%d accept backoff lines logged; want at least one, rate-limited:\n%s", backoffLines, srv.output())
	}

	for _, nc := range held {
		nc.Close()
	}
	held = nil
	// New connections are accepted again once descriptors are free.
	eventually(t, 30*time.Second, "a new connection is served after the flood", func() (bool, string) {
		nc, err := net.DialTimeout("tcp", srv.addr(), time.Second)
		if err != nil {
			return false, err.Error()
		}
		defer nc.Close()
		if err := rawPing(nc, bufio.NewReader(nc), "after"); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	c2 := dial(t, srv.addr())
	if st := state(t, c2, kept); st != "waiting" {
		t.Fatalf("job pushed before the flood is %q after it", st)
	}
	// The HTTP listener came through too.
	eventually(t, 20*time.Second, "HTTP answers after the flood", func() (bool, string) {
		hc := &http.Client{Timeout: 2 * time.Second}
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/health", srv.httpPort))
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
}

// With its open-file limit low from the start, the server's default
// connection limit is derived from it: a flood is answered with the
// limit's error, not with EMFILE.
func TestHostileDefaultConnectionLimit(t *testing.T) {
	t.Parallel()
	const files = 256
	want := defaultMaxConnections(files)
	srv := startBinaryAt(t, []string{"/bin/sh", "-c", `ulimit -n 256 && exec "$0" "$@"`, queuedBinary(t)}, "--memory")
	c := dial(t, srv.addr())
	var held []net.Conn
	defer func() {
		for _, nc := range held {
			nc.Close()
		}
	}()
	for i := 0; i < want+20; i++ {
		nc, err := net.DialTimeout("tcp", srv.addr(), callTimeout)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		held = append(held, nc)
	}
	// The connections past the limit are told so and closed.
	wantMsg := fmt.Sprintf("Too many connections: the server accepts at most %d (--max-connections)", want)
	told := 0
	for _, nc := range held[want-1:] {
		nc.SetReadDeadline(time.Now().Add(callTimeout))
		body, err := ReadFrame(bufio.NewReader(nc), nil)
		if err != nil {
			continue // one of the accepted ones
		}
		v, _ := Decode(body)
		if m, _ := v.(map[string]any); m["ok"] == false && strings.HasPrefix(fmt.Sprint(m["error"]), wantMsg) {
			told++
		} else {
			t.Fatalf("a connection past the limit got %v, want %q", v, wantMsg)
		}
	}
	if told < 20 {
		t.Fatalf("%d connections past the limit of %d were told so, want at least 20", told, want)
	}
	if strings.Contains(srv.output(), "too many open files") {
		t.Errorf("the server met its file limit under its default connection limit:\n%s", srv.output())
	}
	c.ok(M{"cmd": "Ping"})
	t.Logf("file limit %d: connection limit %d; %d connections past it told so", files, want, told)
}

// 500 unauthenticated connections each announce a 64 MiB frame and try
// to send it. Each is refused on the header, and the server's resident
// memory stays under unauthRSSBound; an authenticated client is answered
// meanwhile and afterwards. (Each such frame was read in full: before the
// change, 20 connections already took the server past 1.2 GiB.)
func TestHostileUnauthenticatedHugeFrames(t *testing.T) {
	t.Parallel()
	const n = 500
	const unauthRSSBound = 64 * mib
	srv := startBinary(t, "--memory", "--auth-tokens", "sesame")
	pid := srv.cmd.Process.Pid
	c := dial(t, srv.addr())
	c.ok(M{"cmd": "Auth", "token": "sesame"})
	base, _ := procMem(t, pid)

	var over atomic.Bool // stop the flood once the bound is passed
	var peakSeen atomic.Int64
	var refusedMsg, writeEnded, tooMuch atomic.Int64
	chunk := make([]byte, 256<<10)
	var next atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(60 * time.Second)
	for w := 0; w < 50; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !over.Load() && time.Now().Before(deadline) {
				if next.Add(1) > n {
					return
				}
				nc, err := net.DialTimeout("tcp", srv.addr(), callTimeout)
				if err != nil {
					continue
				}
				nc.SetDeadline(time.Now().Add(20 * time.Second))
				got := make(chan string, 1)
				go func() {
					body, err := ReadFrame(bufio.NewReader(nc), nil)
					if err != nil {
						got <- ""
						return
					}
					v, _ := Decode(body)
					m, _ := v.(map[string]any)
					s, _ := m["error"].(string)
					got <- s
				}()
				nc.Write([]byte{0x04, 0, 0, 0}) // 64 MiB announced
				sent := 0
				for sent < MaxFrame && !over.Load() {
					k, err := nc.Write(chunk)
					sent += k
					if err != nil {
						writeEnded.Add(1)
						break
					}
				}
				if sent >= MaxFrame {
					tooMuch.Add(1) // the server read the whole body
				}
				if s := <-got; strings.Contains(s, "65536") {
					refusedMsg.Add(1)
				}
				nc.Close()
				rss, _ := procMem(t, pid)
				if rss > peakSeen.Load() {
					peakSeen.Store(rss)
				}
				if rss > unauthRSSBound {
					over.Store(true)
				}
			}
		}()
	}
	// The authenticated client is answered during the flood.
	for i := 0; ; i++ {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(200 * time.Millisecond):
			c.ok(M{"cmd": "Ping"})
			continue
		}
		break
	}
	_, peak := procMem(t, pid)
	t.Logf("%d unauthenticated 64 MiB frame headers: server resident %.1f MiB before, highest seen %.1f MiB, peak (VmHWM) %.1f MiB; %d told the 64 KiB limit, %d writes cut off, %d bodies sent whole",
		n, float64(base)/mib, float64(peakSeen.Load())/mib, float64(peak)/mib, refusedMsg.Load(), writeEnded.Load(), tooMuch.Load())
	if over.Load() || peak > unauthRSSBound {
		t.Fatalf("server resident memory reached %.1f MiB (peak %.1f MiB), over the bound of %d MiB", float64(peakSeen.Load())/mib, float64(peak)/mib, unauthRSSBound/mib)
	}
	if tooMuch.Load() > 0 {
		t.Errorf("%d connections sent a whole 64 MiB body before Auth", tooMuch.Load())
	}
	if int(next.Load()) < n {
		t.Fatalf("only %d of %d connections made within the deadline", next.Load(), n)
	}
	exercise(t, c, "after-flood")
}
