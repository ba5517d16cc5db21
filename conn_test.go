package main

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// writesConn is a socket that keeps what is written to it and counts the
// writes.
type writesConn struct {
	net.Conn
	mu     sync.Mutex
	writes int
	out    bytes.Buffer
}

func (w *writesConn) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	return w.out.Write(p)
}

func (w *writesConn) SetWriteDeadline(time.Time) error { return nil }

// asyncAnswers writes n answers to c at once, from a goroutine each, as a
// round's answers are, and answers the numbers the frames written carry.
func asyncAnswers(t *testing.T, c *conn, w *writesConn, n int) []int64 {
	t.Helper()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			var e Enc
			at := e.BeginFrame()
			e.MapHead(2)
			e.Str("reqId")
			e.Int(int64(i))
			e.Str("pad")
			e.Str(string(bytes.Repeat([]byte{'x'}, i)))
			e.EndFrame(at)
			c.writeFrame(e.B)
		})
	}
	close(start)
	wg.Wait() // each writer of a batch is one of its answers
	var got []int64
	r := bufio.NewReader(bytes.NewReader(w.out.Bytes()))
	for {
		body, err := ReadFrame(r, nil)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after %d whole frames: %v", len(got), err)
		}
		m, err := ParseMap(body, nil)
		if err != nil {
			t.Fatal(err)
		}
		id, _, _ := m.Int("reqId")
		got = append(got, id)
	}
	if held := c.pending.Load(); held != 0 {
		t.Fatalf("%d bytes of answers still counted as unwritten", held)
	}
	return got
}

// Answers ready at the same instant on one processor share a write; every
// one is written whole, once. Not parallel: it runs the scheduler on one
// processor, as a server on one does.
func TestAsyncAnswersShareAWrite(t *testing.T) {
	srv := memServer(NewMemEngine(1, nil), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer srv.b.Close()
	w := &writesConn{}
	c := newConn(srv, w)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	defer procsOne.Store(procsOne.Load())
	procsOne.Store(true)

	const n = 20
	got := asyncAnswers(t, c, w, n)
	seen := map[int64]bool{}
	for _, id := range got {
		if seen[id] || id < 0 || id >= n {
			t.Fatalf("answer %d written twice or unknown: %v", id, got)
		}
		seen[id] = true
	}
	if len(seen) != n {
		t.Fatalf("%d of %d answers written: %v", len(seen), n, got)
	}
	if w.writes >= n {
		t.Fatalf("%d answers took %d writes: none shared one", n, w.writes)
	}
	t.Logf("%d answers in %d writes", n, w.writes)
}
