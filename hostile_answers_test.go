//go:build linux

package main

// Clients that ask for big answers and never read them, against the real
// binary (resident memory belongs to a process): 150 TCP connections, 60
// HTTP requests and 60 WebSockets each asking for a 9.9 MB job. Before the
// answer budget the server held every answer: 9.5 GB resident, and another
// client's Ping took 2.4 s.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// floodBounds are what the flood may cost: the server's peak resident
// memory and a well-behaved client's slowest Ping meanwhile.
const (
	floodRSSBound  = 600 * mib
	floodPingBound = 250 * time.Millisecond
	floodPingMax   = 500 * time.Millisecond
	floodJobBytes  = 9_900_000
)

// TestHostileUnreadAnswers floods a server with clients that ask for a
// big job and never read, in every storage mode.
//
// Serial: it bounds an honest client's pings beside the flood (p99 250 ms),
// which other tests on the same cores would change.
func TestHostileUnreadAnswers(t *testing.T) {
	for _, mode := range []string{"memory", "sqlite", "postgres"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			unreadAnswersFlood(t, storageFlags(t, mode))
		})
	}
}

// rssWatch samples a process's resident memory until stopped.
type rssWatch struct {
	pid  int
	peak atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func watchRSS(t *testing.T, pid int) *rssWatch {
	w := &rssWatch{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if rss, ok := readRSS(pid); ok && rss > w.peak.Load() {
				w.peak.Store(rss)
			}
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *rssWatch) end() int64 {
	close(w.stop)
	<-w.done
	return w.peak.Load()
}

// pingWatch pings on its own connection until stopped and keeps how long
// each answer took.
type pingWatch struct {
	mu   sync.Mutex
	took []time.Duration
	err  error
	stop chan struct{}
	done chan struct{}
}

func watchPing(t *testing.T, addr string) *pingWatch {
	nc, err := net.DialTimeout("tcp", addr, callTimeout)
	if err != nil {
		t.Fatal(err)
	}
	w := &pingWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer nc.Close()
		br := bufio.NewReader(nc)
		for i := 0; ; i++ {
			start := time.Now()
			err := rawPing(nc, br, fmt.Sprintf("ping-%d", i))
			w.mu.Lock()
			w.took = append(w.took, time.Since(start))
			w.err = err
			w.mu.Unlock()
			if err != nil {
				return
			}
			select {
			case <-w.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return w
}

// end stops the pings and answers their count, the 99th percentile and
// the slowest.
func (w *pingWatch) end(t *testing.T) (n int, p99, slowest time.Duration) {
	close(w.stop)
	<-w.done
	if w.err != nil {
		t.Errorf("the well-behaved client's Ping failed during the flood: %v", w.err)
	}
	took := slices.Clone(w.took)
	slices.Sort(took)
	if len(took) == 0 {
		t.Fatal("no Ping answered")
	}
	return len(took), took[len(took)*99/100], took[len(took)-1]
}

func readRSS(pid int) (int64, bool) {
	var rss int64
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fmt.Sscan(rest, &rss)
			return rss << 10, true
		}
	}
	return 0, false
}

// unreadAnswersFlood runs the flood against a server started with flags.
func unreadAnswersFlood(t *testing.T, flags []string) {
	srv := startBinary(t, flags...)
	pid := srv.cmd.Process.Pid
	c := dial(t, srv.addr())
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "big", "data": strings.Repeat("x", floodJobBytes)}), "id")
	base, _ := readRSS(pid)

	rss := watchRSS(t, pid)
	ping := watchPing(t, srv.addr())
	httpAddr := fmt.Sprintf("127.0.0.1:%d", srv.httpPort)

	var mu sync.Mutex
	var socks []net.Conn
	keep := func(nc net.Conn) {
		mu.Lock()
		socks = append(socks, nc)
		mu.Unlock()
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, nc := range socks {
			nc.Close()
		}
	})
	getJob := frame(M{"cmd": "GetJob", "id": id})
	wsGet := wsFrameBytes(true, 0, 0x1, []byte(`{"cmd":"GetJob","id":"`+id+`"}`), true)
	var wg sync.WaitGroup
	var failed atomic.Value
	// The clients arrive a few milliseconds apart, not all in the same
	// instant: what is measured is what their unread answers cost, not a
	// storm of connections (which --max-connections bounds).
	pace := time.NewTicker(3 * time.Millisecond)
	defer pace.Stop()
	open := func(n int, f func() error) {
		for i := 0; i < n; i++ {
			<-pace.C
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := f(); err != nil {
					failed.Store(err)
				}
			}()
		}
	}
	// Each sends its requests and never reads again.
	open(150, func() error {
		nc, err := net.DialTimeout("tcp", srv.addr(), callTimeout)
		if err != nil {
			return err
		}
		keep(nc)
		_, err = nc.Write(append(append([]byte{}, getJob...), getJob...))
		return err
	})
	open(60, func() error {
		nc, err := net.DialTimeout("tcp", httpAddr, callTimeout)
		if err != nil {
			return err
		}
		keep(nc)
		_, err = fmt.Fprintf(nc, "GET /jobs/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", id)
		return err
	})
	open(60, func() error {
		nc, err := net.DialTimeout("tcp", httpAddr, callTimeout)
		if err != nil {
			return err
		}
		keep(nc)
		nc.SetDeadline(time.Now().Add(callTimeout))
		if _, err := nc.Write([]byte(wsRequest("/ws"))); err != nil {
			return err
		}
		// The handshake's answer is read, up to its blank line; nothing after.
		br := bufio.NewReaderSize(nc, 16)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return fmt.Errorf("websocket handshake: %w", err)
			}
			if line == "\r\n" {
				break
			}
		}
		nc.SetDeadline(time.Time{})
		_, err = nc.Write(append(append(append([]byte{}, wsGet...), wsGet...), wsGet...))
		return err
	})
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatalf("opening the flood: %v", err)
	}
	// The flood stands until the server has dealt with it: answered what
	// its budget holds and refused, after their wait for room, at least
	// as many answers again as there are TCP clients.
	eventually(t, 2*time.Minute, "answers refused for want of room", func() (bool, string) {
		n := scrapeOne(t, httpAddr, "bunqueue_answers_refused_total")
		return n >= 150, fmt.Sprint(n, " refused")
	})
	n, p99, slowest := ping.end(t)
	peak := rss.end()
	t.Logf("flood of 150 TCP + 60 HTTP + 60 WebSocket clients not reading a %.1f MB job: server resident %.0f MiB before, peak %.0f MiB; %d Pings, 99th percentile %v, slowest %v",
		float64(floodJobBytes)/1e6, float64(base)/mib, float64(peak)/mib, n, p99.Round(time.Millisecond/10), slowest.Round(time.Millisecond/10))
	if peak > floodRSSBound {
		t.Errorf("peak resident memory %.0f MiB, over the bound of %d MiB", float64(peak)/mib, floodRSSBound/mib)
	}
	// The Pings answer throughout, and 99 in 100 within floodPingBound
	// (on this machine the slowest too: 18-21 ms in memory mode, under
	// 60 ms with SQLite, 70-100 ms in PostgreSQL mode, where the database
	// shares the two cores; with the three modes side by side on a slow
	// day, 137 ms with SQLite: 100 ms was too close). The slowest is held
	// to a looser bound, which a busy machine's hiccup does not reach but
	// a server that makes its clients wait behind the flood does (2.4 s
	// before the budget).
	if p99 > floodPingBound {
		t.Errorf("99th percentile Ping %v during the flood, over %v", p99, floodPingBound)
	}
	if slowest > floodPingMax {
		t.Errorf("slowest Ping %v during the flood, over %v", slowest, floodPingMax)
	}
	// The flood's clients go, and the server lets go of their
	// connections, before it is stopped: its stop is checked on its own
	// (serverProc.stop), not with hundreds of connections still ending.
	mu.Lock()
	for _, nc := range socks {
		nc.Close()
	}
	mu.Unlock()
	eventually(t, time.Minute, "the flood's connections gone from the server", func() (bool, string) {
		_, body := httpGet(t, httpAddr, "/prometheus", "")
		var tcp, ws float64
		for _, line := range strings.Split(body, "\n") {
			if rest, ok := strings.CutPrefix(line, `bunqueue_connections{transport="tcp"} `); ok {
				fmt.Sscan(rest, &tcp)
			}
			if rest, ok := strings.CutPrefix(line, `bunqueue_connections{transport="websocket"} `); ok {
				fmt.Sscan(rest, &ws)
			}
		}
		// The Ping watcher's and this test's own client stay.
		return tcp <= 2 && ws == 0, fmt.Sprintf("%.0f TCP, %.0f WebSocket", tcp, ws)
	})
}

// scrapeOne reads one unlabelled sample from the HTTP side's /prometheus.
func scrapeOne(t *testing.T, httpAddr, name string) float64 {
	t.Helper()
	_, body := httpGet(t, httpAddr, "/prometheus", "")
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	t.Fatalf("%s not in /prometheus", name)
	return 0
}

// A connection whose unread answers pass --max-write-queue-bytes is
// closed, its jobs go back, and the figure counts it. Its answers here
// are long polls answered as jobs arrive: the reader stays free to take
// more, so only the share stops them piling up.
func TestUnreadAnswersCloseConnection(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{maxWriteQueue: 1 << 20})
	nc, err := net.DialTimeout("tcp", ts.addr, callTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetReadBuffer(16 << 10)
	for i := range 4 {
		if _, err := nc.Write(frame(M{"cmd": "PULLB", "queue": "q", "count": 1, "timeout": 30000, "owner": "w", "reqId": fmt.Sprint("p", i)})); err != nil {
			t.Fatal(err)
		}
	}
	c := dial(t, ts.addr)
	eventually(t, 10*time.Second, "the long polls parked", func() (bool, string) {
		n := scrapeOne(t, ts.http, "bunqueue_pulls_waiting")
		return n == 4, fmt.Sprint(n, " waiting")
	})
	for range 4 {
		bigJob(t, c, "q", 4<<20, 3)
	}
	eventually(t, 20*time.Second, "the connection closed for not reading", func() (bool, string) {
		n := scrapeOne(t, ts.http, "bunqueue_connections_unread_closed_total")
		return n == 1, fmt.Sprint(n, " closed")
	})
	// Its jobs went back to waiting: another worker gets all four.
	got := 0
	eventually(t, 20*time.Second, "the jobs back", func() (bool, string) {
		a := c.ok(M{"cmd": "PULLB", "queue": "q", "count": 4})
		got += len(list(t, a, "jobs"))
		return got == 4, fmt.Sprint(got, " pulled")
	})
}

// The HTTP port holds --max-http-connections at once: one more is
// answered 503 with the limit named, and closed; once one closes, the
// next is served.
func TestHTTPConnectionBound(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{maxHTTPConns: 4})
	var held []net.Conn
	for range 4 {
		nc, err := net.DialTimeout("tcp", ts.http, callTimeout)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, nc)
		// Served: the connection counts.
		fmt.Fprintf(nc, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("connection within the bound: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	resp, body := rawHTTPGet(t, ts.http, "/health")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "at most 4 (--max-http-connections)") {
		t.Fatalf("one past the bound: %d %s", resp.StatusCode, body)
	}
	held[0].Close()
	eventually(t, 10*time.Second, "a connection served once one closed", func() (bool, string) {
		resp, body := rawHTTPGet(t, ts.http, "/health")
		return resp.StatusCode == 200, fmt.Sprint(resp.StatusCode, " ", body)
	})
	for _, nc := range held[1:] {
		nc.Close()
	}
}

// rawHTTPGet makes one request on a connection of its own.
func rawHTTPGet(t *testing.T, addr, path string) (*http.Response, string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, callTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(callTimeout))
	fmt.Fprintf(nc, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// A WebSocket client that does not read its answers is closed (1008)
// before another big answer is built for it, and what its answers held is
// given back.
func TestWSUnreadAnswersClosed(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := dial(t, ts.addr)
	id := bigJob(t, c, "q", 6<<20, 3)
	ws := dialWS(t, ts.http, "/ws")
	ws.slowReader()
	get := []byte(`{"cmd":"GetJob","id":"` + id + `","reqId":"g"}`)
	for range 3 {
		ws.write(wsFrameBytes(true, 0, 0x1, get, true))
	}
	eventually(t, 20*time.Second, "the client closed for not reading", func() (bool, string) {
		n := scrapeOne(t, ts.http, "bunqueue_connections_unread_closed_total")
		return n == 1, fmt.Sprint(n, " closed")
	})
	ws.nc.Close()
	eventually(t, 20*time.Second, "its answers given back", func() (bool, string) {
		n := scrapeOne(t, ts.http, "bunqueue_answer_bytes")
		return n == 0, fmt.Sprint(n, " bytes held")
	})
}

// jsonFloodRSS bounds the server's peak resident memory while clients that
// never read ask for a 9.9 MB job of binary data (40 MB as JSON), with an
// answer budget of 128 MiB: the job, the budget's answers as MessagePack
// (JSON is rendered as it is written, a piece at a time) and the
// runtime's headroom over what is live. Before, the JSON of each answer
// was held whole and not counted: 20 HTTP clients took 1,242-1,306 MB,
// 60 WebSocket clients 788 MB.
const jsonFloodRSS = 350 * mib

// Clients that never read a big binary job's JSON, over HTTP (20 requests)
// and WebSocket (60 sockets), in every storage mode: the server holds what
// its answer budget lets it, and takes room back from those that sit on it
// while others wait.
//
// Serial: its bound is a server's peak resident memory, which a busy machine raises.
func TestHostileUnreadJSONAnswers(t *testing.T) {
	for _, mode := range []string{"memory", "sqlite", "postgres"} {
		for _, transport := range []string{"http", "websocket"} {
			t.Run(mode+"/"+transport, func(t *testing.T) {
				t.Parallel()
				flags := append(storageFlags(t, mode), "--max-answer-bytes", "128MiB")
				srv := startBinary(t, flags...)
				c := dial(t, srv.addr())
				id := str(t, c.ok(M{"cmd": "PUSH", "queue": "big", "data": binaryData(floodJobBytes)}), "id")
				unreadJSONFlood(t, srv, fmt.Sprintf("127.0.0.1:%d", srv.httpPort), id, transport)
			})
		}
	}
}

// unreadJSONFlood opens the clients of one transport, each asking for the
// job and reading nothing after, until the server has dealt with them,
// and holds the server's peak resident memory to jsonFloodRSS.
func unreadJSONFlood(t *testing.T, srv *serverProc, httpAddr, id, transport string) {
	pid := srv.cmd.Process.Pid
	reclaimed := scrapeOne(t, httpAddr, "bunqueue_answers_reclaimed_total")
	refused := scrapeOne(t, httpAddr, "bunqueue_answers_refused_total")
	base, _ := readRSS(pid)
	rss := watchRSS(t, pid)
	var socks []net.Conn
	defer func() {
		for _, nc := range socks {
			nc.Close()
		}
	}()
	n := 20
	if transport == "websocket" {
		n = 60
	}
	for range n {
		nc, err := net.DialTimeout("tcp", httpAddr, callTimeout)
		if err != nil {
			t.Fatal(err)
		}
		socks = append(socks, nc)
		if transport == "http" {
			fmt.Fprintf(nc, "GET /jobs/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", id)
			continue
		}
		nc.SetDeadline(time.Now().Add(callTimeout))
		if _, err := nc.Write([]byte(wsRequest("/ws"))); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReaderSize(nc, 16)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("websocket handshake: %v", err)
			}
			if line == "\r\n" {
				break
			}
		}
		nc.SetDeadline(time.Time{})
		nc.Write(wsFrameBytes(true, 0, 0x1, []byte(`{"cmd":"GetJob","id":"`+id+`"}`), true))
	}
	// The budget filled (128 MiB: a dozen answers of the job) and the
	// others waited: room was taken back from clients sitting on it (or,
	// on a machine too busy to see them stall in time, the answers were
	// refused after their wait); then no answer waits any more.
	var r, f float64
	eventually(t, 2*time.Minute, "the flood dealt with", func() (bool, string) {
		r = scrapeOne(t, httpAddr, "bunqueue_answers_reclaimed_total") - reclaimed
		f = scrapeOne(t, httpAddr, "bunqueue_answers_refused_total") - refused
		w := scrapeOne(t, httpAddr, "bunqueue_answer_waiting")
		return r+f > 0 && w == 0, fmt.Sprintf("%.0f reclaimed, %.0f refused, %.0f waiting", r, f, w)
	})
	peak := rss.end()
	t.Logf("%d %s clients not reading a %.1f MB binary job: resident %.0f MiB before, peak %.0f MiB; %.0f connections closed for sitting on the budget, %.0f answers refused",
		n, transport, float64(floodJobBytes)/1e6, float64(base)/mib, float64(peak)/mib, r, f)
	if peak > jsonFloodRSS {
		t.Errorf("%s: peak resident memory %.0f MiB, over %d MiB", transport, float64(peak)/mib, jsonFloodRSS/mib)
	}
}

// An honest client's big answer gets its turn within seconds beside 40
// clients that ask for the same 9.9 MB job again and again and never read:
// their connections fill the budget (32 MiB), and the honest one, from
// another address, is next in turn once the budget takes room back from
// those sitting on it. Before, it was refused "Server busy" for 1 to 55 s.
//
// Serial: it times an honest answer beside a flood.
func TestFairTurnsHonestAnswer(t *testing.T) {
	srv := startBinary(t, "--memory", "--max-answer-bytes", "32MiB")
	c := dial(t, srv.addr())
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "big", "data": binaryData(floodJobBytes)}), "id")
	httpAddr := fmt.Sprintf("127.0.0.1:%d", srv.httpPort)
	getJob := frame(M{"cmd": "GetJob", "id": id})
	for range 40 {
		nc, err := net.DialTimeout("tcp", srv.addr(), callTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.Write(bytes.Repeat(getJob, 8))
	}
	eventually(t, time.Minute, "answers waiting for room", func() (bool, string) {
		n := scrapeOne(t, httpAddr, "bunqueue_answer_waiting")
		return n > 0, fmt.Sprint(n, " waiting")
	})
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: callTimeout}
	nc, err := d.Dial("tcp", srv.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	start := time.Now()
	if _, err := nc.Write(frame(M{"cmd": "GetJob", "id": id, "reqId": "honest"})); err != nil {
		t.Fatal(err)
	}
	ans, err := readAnswer(nc, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if ans["ok"] != true {
		t.Fatalf("the honest GetJob was refused after %v: %v", took, ans["error"])
	}
	t.Logf("the honest 9.9 MB GetJob beside 40 clients not reading: answered in %v", took.Round(time.Millisecond))
}
