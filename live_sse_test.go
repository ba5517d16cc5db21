package main

// Tests for live_sse.go. The client reads the stream over a raw connection and
// parses it by the rules of the WHATWG event stream format, independently
// of the server's formatter.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// The test client

// sseTestEvent is one dispatched block: the fields seen up to a blank line.
type sseTestEvent struct {
	id, event, data, retry string
	hasID, hasData         bool
	comments               []string
}

type sseClient struct {
	t    testing.TB
	nc   net.Conn
	resp *http.Response
	br   *bufio.Reader
}

// dialSSE sends a GET for path with the given extra header lines and reads
// the answer's header.
func dialSSE(t testing.TB, addr, path string, headers ...string) *sseClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return sseHandshake(t, nc, path, headers...)
}

func sseHandshake(t testing.TB, nc net.Conn, path string, headers ...string) *sseClient {
	t.Helper()
	req := "GET " + path + " HTTP/1.1\r\nHost: test\r\nAccept: text/event-stream\r\n"
	for _, h := range headers {
		req += h + "\r\n"
	}
	nc.SetDeadline(time.Now().Add(wsTestTimeout))
	if _, err := io.WriteString(nc, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	hr, _ := http.NewRequest("GET", path, nil)
	resp, err := http.ReadResponse(bufio.NewReader(nc), hr)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return &sseClient{t: t, nc: nc, resp: resp, br: bufio.NewReader(resp.Body)}
}

// next parses up to the next blank line. Lines here end in LF only: the
// server never writes CR.
func (c *sseClient) next() (sseTestEvent, error) {
	c.nc.SetReadDeadline(time.Now().Add(wsTestTimeout))
	var ev sseTestEvent
	var data []string
	seen := false
	for {
		line, err := c.br.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			if !seen {
				continue
			}
			ev.data = strings.Join(data, "\n")
			return ev, nil
		}
		seen = true
		if rest, ok := strings.CutPrefix(line, ":"); ok {
			ev.comments = append(ev.comments, rest)
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			ev.id, ev.hasID = value, true
		case "event":
			ev.event = value
		case "data":
			data, ev.hasData = append(data, value), true
		case "retry":
			ev.retry = value
		default:
			return ev, fmt.Errorf("unknown field in %q", line)
		}
	}
}

func (c *sseClient) mustNext() sseTestEvent {
	c.t.Helper()
	ev, err := c.next()
	if err != nil {
		c.t.Fatalf("reading the stream: %v", err)
	}
	return ev
}

// nextData returns the next event that carries data, skipping heartbeats
// and the retry line.
func (c *sseClient) nextData() sseTestEvent {
	c.t.Helper()
	for {
		if ev := c.mustNext(); ev.hasData {
			return ev
		}
	}
}

// expectEnd reads what is left and checks that the server ended the
// stream, cleanly or by closing the connection.
func (c *sseClient) expectEnd() {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(wsTestTimeout))
	_, err := io.Copy(io.Discard, c.br)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !isConnReset(err) {
		c.t.Fatalf("the stream did not end: %v", err)
	}
}

// ---------------------------------------------------------------------------
// A server that hands its streams to the test

type sseHarness struct {
	addr    string
	streams chan *sseStream
	ends    chan error
}

func startSSEServer(t testing.TB, opts sseOptions, configure func(*http.Server)) *sseHarness {
	h := &sseHarness{streams: make(chan *sseStream, 16), ends: make(chan error, 16)}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, err := startSSE(w, r, opts)
		if err != nil {
			h.ends <- err
			return
		}
		h.streams <- st
		h.ends <- st.Run()
	}))
	if configure != nil {
		configure(ts.Config)
	}
	ts.Start()
	t.Cleanup(ts.Close)
	h.addr = ts.Listener.Addr().String()
	return h
}

func (h *sseHarness) stream(t testing.TB) *sseStream {
	t.Helper()
	select {
	case s := <-h.streams:
		return s
	case <-time.After(wsTestTimeout):
		t.Fatal("no stream on the server")
		return nil
	}
}

func (h *sseHarness) end(t testing.TB) error {
	t.Helper()
	select {
	case err := <-h.ends:
		return err
	case <-time.After(wsTestTimeout):
		t.Fatal("the stream's handler did not return")
		return nil
	}
}

// ---------------------------------------------------------------------------
// Tests

func TestSSEFormat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ev   sseEvent
		want string
	}{
		{sseEvent{ID: "7", Event: "job:completed", Data: []byte(`{"jobId":"1"}`)},
			"id: 7\nevent: job:completed\ndata: {\"jobId\":\"1\"}\n\n"},
		{sseEvent{Data: []byte("a\nb\r\nc\rd")}, "data: a\ndata: b\ndata: c\ndata: d\n\n"},
		{sseEvent{Data: []byte("trailing\n")}, "data: trailing\ndata: \n\n"},
		{sseEvent{Data: []byte("\r\n\r\n")}, "data: \ndata: \ndata: \n\n"},
		{sseEvent{Event: "x"}, "event: x\ndata: \n\n"},
		// A value cannot smuggle in a field of its own.
		{sseEvent{ID: "1\ndata: forged", Event: "a\r\nid: 9", Data: []byte("d")},
			"id: 1data: forged\nevent: aid: 9\ndata: d\n\n"},
		{sseEvent{ID: "nul\x00"}, "id: nul\ndata: \n\n"},
	} {
		if got := string(appendSSE(nil, tc.ev)); got != tc.want {
			t.Errorf("appendSSE(%+v) =\n%q, want\n%q", tc.ev, got, tc.want)
		}
	}
}

func TestSSEStream(t *testing.T) {
	t.Parallel()
	h := startSSEServer(t, sseOptions{Heartbeat: 40 * time.Millisecond}, nil)
	c := dialSSE(t, h.addr, "/events", "Last-Event-ID: 41")
	if c.resp.StatusCode != 200 {
		t.Fatalf("status %s", c.resp.Status)
	}
	for k, v := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"} {
		if got := c.resp.Header.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	st := h.stream(t)
	if st.LastEventID() != "41" {
		t.Errorf("LastEventID %q", st.LastEventID())
	}
	if ev := c.mustNext(); ev.retry != "3000" {
		t.Errorf("first block %+v, want retry: 3000", ev)
	}
	multi := "{\n  \"pretty\": true\r\n}\n"
	st.Send(sseEvent{ID: "42", Event: "job:pushed", Data: []byte(`{"jobId":"a"}`)})
	st.Send(sseEvent{Data: []byte(multi)})
	if ev := c.nextData(); ev.id != "42" || ev.event != "job:pushed" || ev.data != `{"jobId":"a"}` {
		t.Errorf("event %+v", ev)
	}
	if ev := c.nextData(); ev.data != strings.ReplaceAll(multi, "\r\n", "\n") || ev.hasID || ev.event != "" {
		t.Errorf("multi-line event %+v", ev)
	}
	// Heartbeats keep coming while nothing else does.
	beats := 0
	for start := time.Now(); beats < 3; {
		ev := c.mustNext()
		if len(ev.comments) != 1 || ev.comments[0] != "heartbeat" || ev.hasData {
			t.Fatalf("expected a heartbeat, got %+v", ev)
		}
		beats++
		if time.Since(start) > 5*time.Second {
			t.Fatal("heartbeats too slow")
		}
	}
	c.nc.Close()
	if err := h.end(t); err != nil {
		t.Errorf("Run after the client left: %v", err)
	}
	if st.Send(sseEvent{Data: []byte("late")}) {
		t.Error("Send succeeded after the stream ended")
	}
}

func TestSSENoLastEventID(t *testing.T) {
	t.Parallel()
	h := startSSEServer(t, sseOptions{Retry: -1}, nil)
	c := dialSSE(t, h.addr, "/events")
	st := h.stream(t)
	if st.LastEventID() != "" {
		t.Errorf("LastEventID %q", st.LastEventID())
	}
	st.Send(sseEvent{Data: []byte("first")})
	if ev := c.mustNext(); ev.retry != "" || ev.data != "first" {
		t.Errorf("with Retry < 0, the first block is %+v", ev)
	}
}

// TestSSEOutlivesReadTimeout: the server's ReadTimeout is for reading
// requests; it must not end a stream that lasts longer.
func TestSSEOutlivesReadTimeout(t *testing.T) {
	t.Parallel()
	h := startSSEServer(t, sseOptions{Heartbeat: 50 * time.Millisecond}, func(s *http.Server) {
		s.ReadTimeout = 100 * time.Millisecond
	})
	c := dialSSE(t, h.addr, "/events")
	st := h.stream(t)
	for start := time.Now(); time.Since(start) < 600*time.Millisecond; {
		c.mustNext()
	}
	st.Send(sseEvent{Data: []byte("still here")})
	if ev := c.nextData(); ev.data != "still here" {
		t.Fatalf("got %+v", ev)
	}
}

func TestSSEClose(t *testing.T) {
	t.Parallel()
	h := startSSEServer(t, sseOptions{}, nil)
	c := dialSSE(t, h.addr, "/events")
	st := h.stream(t)
	for i := range 3 {
		st.Send(sseEvent{ID: fmt.Sprint(i), Data: []byte("before close")})
	}
	st.Close()
	if st.Send(sseEvent{Data: []byte("after close")}) {
		t.Error("Send succeeded after Close")
	}
	for i := range 3 {
		if ev := c.nextData(); ev.id != fmt.Sprint(i) {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	c.expectEnd()
	if err := h.end(t); err != nil {
		t.Errorf("Run after Close: %v", err)
	}
}

// TestSSESlowConsumer: a client that does not read fills its socket and
// then its queue; Send never blocks, and the stream is ended.
func TestSSESlowConsumer(t *testing.T) {
	t.Parallel()
	h := startSSEServer(t, sseOptions{SendQueue: 64, SendQueueBytes: 256 << 10, CloseTimeout: 300 * time.Millisecond}, nil)
	nc, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetReadBuffer(16 << 10)
	c := sseHandshake(t, nc, "/events")
	st := h.stream(t)
	payload := []byte(strings.Repeat("x", 16<<10))
	start := time.Now()
	var slowest time.Duration
	sent := 0
	for ; sent < 100000; sent++ {
		t0 := time.Now()
		ok := st.Send(sseEvent{Data: payload})
		slowest = max(slowest, time.Since(t0))
		if !ok {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Logf("%d events queued before the drop, in %v; slowest Send %v", sent, time.Since(start), slowest)
	if sent == 100000 {
		t.Fatal("the queue never filled")
	}
	if slowest > time.Second {
		t.Errorf("a Send took %v", slowest)
	}
	// The handler returns even though the client still does not read.
	if err := h.end(t); err != nil {
		t.Logf("Run: %v", err)
	}
	nc.(*net.TCPConn).SetReadBuffer(4 << 20)
	c.expectEnd()
}

// TestSSEReadyBeforeHeaders: what startSSEThen's ready registers is in
// place before the client sees the stream open. (The hub registered a
// stream after its headers: an event right after a client connected could
// miss it, and TestLiveCatalogCommands waited for it forever.)
func TestSSEReadyBeforeHeaders(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, err := startSSEThen(w, r, sseOptions{}, func(s *sseStream) {
			s.Send(sseEvent{Event: "registered", Data: []byte("{}")})
			<-release
		})
		if err != nil {
			return
		}
		st.Run()
	}))
	defer ts.Close()
	nc, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := io.WriteString(nc, "GET /events HTTP/1.1\r\nHost: test\r\nAccept: text/event-stream\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var b [1]byte
	if n, err := nc.Read(b[:]); n > 0 || err == nil {
		t.Fatal("the stream's headers came before ready returned")
	}
	close(release)
	hr, _ := http.NewRequest("GET", "/events", nil)
	nc.SetReadDeadline(time.Now().Add(wsTestTimeout))
	resp, err := http.ReadResponse(bufio.NewReader(nc), hr)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("answer: %v %v", resp, err)
	}
	c := &sseClient{t: t, nc: nc, resp: resp, br: bufio.NewReader(resp.Body)}
	if ev := c.nextData(); ev.event != "registered" {
		t.Fatalf("first event %+v", ev)
	}
}
