package main

// Listening under pressure: how many connections the server takes by
// default, and how a listener rides out failed accepts.
//
// accept(2) fails for reasons that pass: the process is out of
// descriptors (EMFILE) or the system is (ENFILE), the kernel is out of
// buffers (ENOBUFS, ENOMEM), or a client gave up before its connection
// was taken (ECONNABORTED). None of them is a reason to stop serving the
// connections the server has; the listener waits a little (longer while
// the failures go on) and tries again.

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	minAcceptBackoff = 5 * time.Millisecond
	maxAcceptBackoff = time.Second
	acceptLogEvery   = 10 * time.Second
	// defaultMaxConnsCap bounds the default connection limit on a machine
	// whose file limit is very high: past it, memory rather than
	// descriptors runs out. --max-connections goes further.
	defaultMaxConnsCap = 65536
)

// defaultMaxConnections derives the connection limit from the process's
// open-file limit: the limit less a reserve for everything else the server
// opens (its listeners, the database and its journal, backups, HTTP and
// WebSocket clients, connections being refused), so that the connection
// limit is met before the file limit. 20,000 files give 17,872
// connections; 1,024 give 794.
func defaultMaxConnections(nofile uint64) int {
	if nofile < 512 {
		return int(nofile / 2)
	}
	n := nofile - 128 - nofile/10
	return int(min(n, defaultMaxConnsCap))
}

// fileLimit is the process's open-file limit (the Go runtime has raised
// the soft limit to the hard one at start).
func fileLimit() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur == 0 {
		return 1024
	}
	return lim.Cur
}

// acceptBackoff paces a listener's retries after failed accepts, with a
// log line now and then rather than one a failure.
type acceptBackoff struct {
	log     *slog.Logger
	name    string
	done    <-chan struct{} // ends a pause early (the listener is closing)
	delay   time.Duration
	lastLog time.Time
	quiet   int // failures since the last line
}

// failed waits before the next accept: from minAcceptBackoff, doubling
// while the failures go on, up to maxAcceptBackoff.
func (a *acceptBackoff) failed(err error) {
	a.delay = min(max(2*a.delay, minAcceptBackoff), maxAcceptBackoff)
	a.quiet++
	if now := time.Now(); now.Sub(a.lastLog) >= acceptLogEvery {
		a.log.Warn("accept failed; retrying", "listener", a.name, "err", err,
			"retry_in", a.delay.String(), "failures", a.quiet)
		a.lastLog, a.quiet = now, 0
	}
	t := time.NewTimer(a.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-a.done:
	}
}

// ok resets the pause after an accept that worked.
func (a *acceptBackoff) ok() { a.delay = 0 }

// retryListener is a listener whose Accept retries failed accepts until
// one works or the listener is closed. net/http's server retries only the
// errors it deems temporary and stops on any other (ENOBUFS, ENOMEM); the
// HTTP port goes through this.
type retryListener struct {
	net.Listener
	bo    acceptBackoff
	done  chan struct{}
	close sync.Once

	// max bounds the connections held at once (0: no bound); past it a
	// connection is given refusal and closed, from a goroutine of its own
	// (at most maxRefusing at once, the rest closed without a word).
	max      int
	open     atomic.Int64
	refusing atomic.Int32
	refuse   func(nc net.Conn)
	refused  rateLog
}

// heldConn is a connection counted against its listener's bound until it
// is closed (by the server, or by whoever hijacked it).
type heldConn struct {
	net.Conn
	l    *retryListener
	once sync.Once
}

func (c *heldConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

func newRetryListener(ln net.Listener, name string, log *slog.Logger) *retryListener {
	l := &retryListener{Listener: ln, done: make(chan struct{})}
	l.bo = acceptBackoff{log: log, name: name, done: l.done}
	return l
}

func (l *retryListener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err == nil {
			l.bo.ok()
			if l.max <= 0 {
				return nc, nil
			}
			if l.open.Load() >= int64(l.max) {
				l.turnAway(nc)
				continue
			}
			l.open.Add(1)
			return &heldConn{Conn: nc, l: l}, nil
		}
		select {
		case <-l.done:
			return nil, err
		default:
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		l.bo.failed(err)
	}
}

// turnAway tells a connection past the bound why it is closed, within
// refuseWithin, without holding up the accept loop.
func (l *retryListener) turnAway(nc net.Conn) {
	if n := l.refused.hit(); n > 0 {
		l.bo.log.Warn("connection limit reached; refusing connections", "listener", l.bo.name, "max_connections", l.max, "refused", n)
	}
	if l.refuse == nil || l.refusing.Add(1) > maxRefusing {
		if l.refuse != nil {
			l.refusing.Add(-1)
		}
		nc.Close()
		return
	}
	go func() {
		defer l.refusing.Add(-1)
		nc.SetDeadline(time.Now().Add(refuseWithin))
		l.refuse(nc)
		nc.Close()
	}()
}

func (l *retryListener) Close() error {
	l.close.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// listenAt listens on the Unix socket path when one is given (a socket
// file left by a server that died is replaced; any other file is not),
// else on the TCP address.
func listenAt(path, addr string) (net.Listener, error) {
	if path == "" {
		return net.Listen("tcp", addr)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another server listens there", path)
		}
		os.Remove(path)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return net.Listen("unix", path)
}

// quietListener accepts quiet sockets (quietconn_linux.go), for a
// listener that wraps their connections (TLS).
type quietListener struct{ net.Listener }

func (l quietListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return quietSocket(nc), nil
}
