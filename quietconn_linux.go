package main

// Quiet sockets: the protocol's connections and PostgreSQL mode's
// connections to the database read and write their sockets with raw
// system calls, which the Go runtime does not hear of.
//
// Why: every read or write through net.Conn tells the runtime it enters
// a system call, and the first one after the process was idle wakes the
// runtime's monitor thread (sysmon) from its deep sleep; it then polls
// every 20 µs for a millisecond before it sleeps again. At a steady 1,000
// jobs a second the server goes idle and wakes thousands of times a
// second, and those wake-ups were 40% of its CPU: the official client at
// 1,000 jobs/s cost 0.19-0.21 ms of server CPU a job in memory mode, 0.12
// with quiet sockets (SQLite 0.23-0.29 -> 0.14-0.15, PostgreSQL 0.19 ->
// 0.12, docs/performance.md).
//
// The sockets are non-blocking (the runtime's poller waits for them), so
// a raw read or write never blocks its thread: it returns at once with
// data, with EAGAIN (then the poller waits, deadlines and Close apply as
// for any net.Conn), or with an error. So nothing may call File() on
// one (it makes the socket blocking: a raw read would then hold its
// thread and its processor, with GOMAXPROCS 1 the whole process).
// Built with the race detector, connections stay standard: its model of
// I/O as synchronization lives in the syscall package's wrappers, which
// raw calls bypass.

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// quietConn is a stream socket read and written with raw system calls.
type quietConn struct {
	net.Conn
	rc syscall.RawConn
	// A read's and a write's state, and the callbacks RawConn runs, made
	// once with the connection: a callback closing over its call's
	// variables put four objects on the heap a call, a fifth of what a
	// job cost the server in allocations under a steady load. Each is
	// taken under its mutex for the whole call, as the socket's own read
	// or write lock is inside RawConn.
	rmu, wmu sync.Mutex
	rd, wr   quietOp
}

// quietOp is one direction's call in progress: the bytes, what was done,
// and the error number the system call gave.
type quietOp struct {
	p     []byte
	done  int
	errno syscall.Errno
	stuck bool // a write that wrote nothing
	fn    func(fd uintptr) bool
}

// quietSocket makes a TCP or Unix stream socket quiet; any other connection
// (TLS on top of one, a pipe) is returned as it is.
func quietSocket(nc net.Conn) net.Conn {
	if raceEnabled {
		return nc
	}
	return newQuietConn(nc)
}

// newQuietConn is quietSocket under the race detector too (for tests).
func newQuietConn(nc net.Conn) net.Conn {
	switch nc.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return nc
	}
	rc, err := nc.(syscall.Conn).SyscallConn()
	if err != nil {
		return nc
	}
	q := &quietConn{Conn: nc, rc: rc}
	q.rd.fn = q.rd.read
	q.wr.fn = q.wr.write
	return q
}

// socketOf is the socket under nc: under TLS, and under quiet.
func socketOf(nc net.Conn) net.Conn {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	if q, ok := nc.(*quietConn); ok {
		return q.Conn
	}
	return nc
}

func (c *quietConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	op := &c.rd
	op.p, op.done, op.errno = p, 0, 0
	err := c.rc.Read(op.fn)
	n, errno := op.done, op.errno
	op.p = nil // the caller's buffer is not kept
	c.rmu.Unlock()
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, c.opError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// read is a read's callback: true once the system call has answered
// (bytes, end of stream or an error), false to have the poller wait.
func (op *quietOp) read(fd uintptr) bool {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&op.p[0])), uintptr(len(op.p)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false // not ready: the poller waits
		}
		op.done, op.errno = int(r), e
		return true
	}
}

// Write writes all of p, or fails, as net.Conn's Write does: within one
// RawConn.Write, which holds the socket's write lock throughout, so that
// two writers' bytes never mix, and waits for the poller whenever the
// socket's buffer is full.
func (c *quietConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	op := &c.wr
	op.p, op.done, op.errno, op.stuck = p, 0, 0, false
	err := c.rc.Write(op.fn)
	done, errno, stuck := op.done, op.errno, op.stuck
	op.p = nil
	c.wmu.Unlock()
	if err != nil {
		return done, err
	}
	if errno != 0 {
		return done, c.opError("write", errno)
	}
	if stuck {
		return done, io.ErrUnexpectedEOF
	}
	return done, nil
}

// write is a write's callback: true once all is written or the system
// call failed, false to have the poller wait for room.
func (op *quietOp) write(fd uintptr) bool {
	for op.done < len(op.p) {
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&op.p[op.done])), uintptr(len(op.p)-op.done))
		switch e {
		case 0:
			if r == 0 {
				op.stuck = true // as internal/poll: never on a stream socket
				return true
			}
			op.done += int(r)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false // full: the poller waits, then this is called again
		default:
			op.errno = e
			return true
		}
	}
	return true
}

// opError is the error net.Conn gives for a failed call, so that callers
// see the same shapes (errors.Is(err, syscall.ECONNRESET), net.Error).
func (c *quietConn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(),
		Err: os.NewSyscallError(op, errno)}
}
