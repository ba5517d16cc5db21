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
	fail   error // every write fails with it
	closed bool
}

func (w *writesConn) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	return nil
}

func (w *writesConn) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	if w.fail != nil {
		return 0, w.fail
	}
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
			c.writeFrame(answerFrame(i, i))
		})
	}
	close(start)
	wg.Wait() // each writer of a batch is one of its answers
	return writtenAnswers(t, c, w)
}

// answerFrame is an answer to request i, padded by pad bytes.
func answerFrame(i, pad int) []byte {
	var e Enc
	at := e.BeginFrame()
	e.MapHead(2)
	e.Str("reqId")
	e.Int(int64(i))
	e.Str("pad")
	e.Str(string(bytes.Repeat([]byte{'x'}, pad)))
	e.EndFrame(at)
	return e.B
}

// writtenAnswers reads the answers written to w, whole frames only, and
// checks that c counts none as unwritten any more.
func writtenAnswers(t *testing.T, c *conn, w *writesConn) []int64 {
	t.Helper()
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
// one is written whole, once.
// Serial: it runs the scheduler on one processor, as a server on one does.
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

// A connection queues at most combineMax bytes of answers for a shared
// write: past it, an answer waits for the socket as before, so a client
// that does not read slows its commands down instead of being queued for.
func TestQueuedAnswersAreBounded(t *testing.T) {
	t.Parallel()
	srv := memServer(NewMemEngine(1, nil), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer srv.b.Close()
	w := &writesConn{}
	c := newConn(srv, w)

	c.wmu.Lock() // a write under way that does not end: the client does not read
	first := answerFrame(0, 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.writeFrame(first)
	}()
	for queued := false; !queued; runtime.Gosched() {
		c.omu.Lock()
		queued = c.ob != nil
		c.omu.Unlock()
	}
	total, k := len(first), 1
	for ; ; k++ {
		f := answerFrame(k, 10<<10)
		n := int64(len(f))
		if !c.sending(n) {
			t.Fatal("the answer budget refused a small answer")
		}
		if !c.combine(f, n) {
			c.freeOut(n)
			if total+len(f) <= combineMax {
				t.Fatalf("answer %d refused with %d bytes queued", k, total)
			}
			break
		}
		total += len(f)
		if total > combineMax {
			t.Fatalf("%d bytes queued, past combineMax (%d)", total, combineMax)
		}
	}
	c.wmu.Unlock()
	<-done
	got := writtenAnswers(t, c, w)
	if len(got) != k {
		t.Fatalf("%d answers written, %d queued: %v", len(got), k, got)
	}
	for i, id := range got {
		if id != int64(i) {
			t.Fatalf("answers written out of order: %v", got)
		}
	}
}

// Answers whose write fails are dropped and give their place in the
// answer budget back, and the socket is closed.
func TestAnswersLostWithTheSocketFreeTheBudget(t *testing.T) {
	t.Parallel()
	srv := memServer(NewMemEngine(1, nil), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer srv.b.Close()
	w := &writesConn{fail: net.ErrClosed}
	c := newConn(srv, w)
	if got := asyncAnswers(t, c, w, 10); len(got) != 0 {
		t.Fatalf("answers read from a socket that took none: %v", got)
	}
	if w.writes == 0 || !w.closed {
		t.Fatalf("%d writes tried, socket closed: %v; want some, and closed (a failed write may end inside an answer)", w.writes, w.closed)
	}
}
