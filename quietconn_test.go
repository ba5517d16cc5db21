//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// quietPair is a connected TCP pair: the accepted end quiet, the dialed
// end standard.
func quietPair(t *testing.T) (q net.Conn, peer *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	q = newQuietConn(a)
	if _, ok := q.(*quietConn); !ok {
		t.Fatalf("a TCP connection was not made quiet: %T", q)
	}
	t.Cleanup(func() { q.Close(); d.Close() })
	return q, d.(*net.TCPConn)
}

// TestQuietConnCarriesBytes: what a quiet socket writes arrives whole,
// past many times the socket buffers while the peer reads slowly (writes
// that find the buffer full wait for the poller), and what the peer
// writes is read whole, then io.EOF when it closes.
func TestQuietConnCarriesBytes(t *testing.T) {
	t.Parallel()
	q, peer := quietPair(t)
	out := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB
	got := make(chan []byte, 1)
	go func() {
		var b bytes.Buffer
		buf := make([]byte, 1000)
		for b.Len() < len(out) {
			n, err := peer.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		got <- b.Bytes()
	}()
	if n, err := q.Write(out); err != nil || n != len(out) {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if b := <-got; !bytes.Equal(b, out) {
		t.Fatalf("the peer read %d bytes, not the %d written, or other ones", len(b), len(out))
	}

	in := []byte("a request frame and then the end")
	go func() {
		peer.Write(in)
		peer.CloseWrite()
	}()
	all, err := io.ReadAll(q)
	if err != nil || !bytes.Equal(all, in) {
		t.Fatalf("ReadAll: %q, %v", all, err)
	}
	if n, err := q.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Fatalf("Read after the end: %d, %v; want 0, io.EOF", n, err)
	}
	if n, err := q.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read of nothing: %d, %v", n, err)
	}
}

// TestQuietConnWritersDoNotMix: two writers of buffers larger than the
// socket's take turns by whole buffers, as with a standard connection
// (each Write holds the write lock until all of it is written).
func TestQuietConnWritersDoNotMix(t *testing.T) {
	t.Parallel()
	q, peer := quietPair(t)
	const size = 4 << 20
	errs := make(chan error, 2)
	for _, b := range []byte{'a', 'b'} {
		go func() {
			_, err := q.Write(bytes.Repeat([]byte{b}, size))
			errs <- err
		}()
	}
	got := make([]byte, 2*size)
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	first, second := got[:size], got[size:]
	if bytes.Count(first, first[:1]) != size || bytes.Count(second, second[:1]) != size || first[0] == second[0] {
		t.Fatalf("the two writers' bytes mixed: the first half has %d of %q, the second %d of %q",
			bytes.Count(first, first[:1]), first[0], bytes.Count(second, second[:1]), second[0])
	}
}

// TestQuietConnErrors: deadlines, Close and a peer's reset end a quiet
// socket's calls with the errors a standard one gives.
func TestQuietConnErrors(t *testing.T) {
	t.Parallel()
	q, _ := quietPair(t)
	q.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := q.Read(make([]byte, 10))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read past its deadline: %v", err)
	}
	q.SetReadDeadline(time.Time{})

	// Close while a Read waits.
	res := make(chan error, 1)
	go func() {
		_, err := q.Read(make([]byte, 10))
		res <- err
	}()
	// Whether the Read has begun to wait or not, Close ends it with
	// ErrClosed.
	q.Close()
	if err := <-res; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read ended by Close: %v", err)
	}

	// A peer that resets.
	q2, peer2 := quietPair(t)
	peer2.SetLinger(0)
	peer2.Close()
	_, err = q2.Read(make([]byte, 10))
	var oe *net.OpError
	if !errors.Is(err, syscall.ECONNRESET) || !errors.As(err, &oe) || oe.Op != "read" {
		t.Fatalf("Read from a reset peer: %v (%T)", err, err)
	}
	// Writes to a connection the peer reset fail, and do not end the
	// process (SIGPIPE).
	var werr error
	for i := 0; i < 100 && werr == nil; i++ {
		_, werr = q2.Write([]byte("x"))
	}
	if werr == nil || !errors.As(werr, &oe) || oe.Op != "write" {
		t.Fatalf("Write to a reset peer: %v", werr)
	}
}

// TestQuietConnUnixAndOthers: Unix stream sockets are made quiet too;
// other connections are left as they are; socketOf finds the socket
// under a quiet connection.
func TestQuietConnUnixAndOthers(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	q := newQuietConn(a)
	defer q.Close()
	if _, ok := q.(*quietConn); !ok {
		t.Fatalf("a Unix connection was not made quiet: %T", q)
	}
	if socketOf(q) != a {
		t.Fatal("socketOf did not find the socket under the quiet connection")
	}
	if b, err := io.ReadAll(q); err != nil || string(b) != "hello" {
		t.Fatalf("ReadAll: %q, %v", b, err)
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if newQuietConn(p1) != p1 {
		t.Fatal("a pipe was wrapped")
	}
}

// TestQuietConnUnderTLS: TLS runs on a quiet socket (main.go's TLS
// listener takes quiet ones): a handshake and a request each way.
func TestQuietConnUnderTLS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	certFile, keyFile := ca.issue(t, 1)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	q, peer := quietPair(t)
	srv := tls.Server(q, &tls.Config{Certificates: []tls.Certificate{cert}})
	cli := tls.Client(peer, &tls.Config{RootCAs: ca.pool(), ServerName: "localhost"})
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 4)
		if _, err := io.ReadFull(srv, buf); err != nil {
			done <- err
			return
		}
		_, err := srv.Write(append(buf, '!'))
		done <- err
	}()
	if _, err := cli.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(cli, got); err != nil || string(got) != "ping!" {
		t.Fatalf("answer %q, %v", got, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if socketOf(srv) != q.(*quietConn).Conn {
		t.Fatal("socketOf did not find the socket under TLS and quiet")
	}
}

// TestServerSocketsQuiet: the server's connections and PostgreSQL mode's
// dials are quiet, except under the race detector (quietconn_linux.go).
func TestServerSocketsQuiet(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(2, nil)
	t.Cleanup(b.Close)
	srv := memServer(b, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c, err := dialClient(t, ClientConfig{Addr: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(context.Background(), map[string]any{"cmd": "Ping"}); err != nil {
		t.Fatal(err)
	}
	// The connection was answered, so the server holds it.
	srv.mu.Lock()
	var nc net.Conn
	for sc := range srv.conns {
		nc = sc.nc
	}
	srv.mu.Unlock()
	if _, ok := nc.(*quietConn); ok == raceEnabled {
		t.Fatalf("the server's connection is a %T with the race detector %v", nc, raceEnabled)
	}

	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pln.Close()
	pc, err := pgDial(context.Background(), "tcp", pln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if _, ok := pc.(*quietConn); ok == raceEnabled {
		t.Fatalf("pgDial gave a %T with the race detector %v", pc, raceEnabled)
	}
}

// TestQuietConnAllocatesNothing: a read and a write on a quiet socket
// allocate nothing. Each did four objects (the callback and what it
// set), a fifth of what a job cost the server in allocations under a
// steady load (queued bench steady, memory mode).
//
// Serial: AllocsPerRun counts the whole process's allocations.
func TestQuietConnAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	q, peer := quietPair(t)
	msg := []byte("ping")
	buf := make([]byte, 64)
	pbuf := make([]byte, 64)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := q.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, pbuf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(q, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("a write and a read on a quiet socket allocated %.1f objects, want none", allocs)
	}
}
