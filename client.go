package main

// A wire-protocol client for the command line and the load generator (the
// server never uses it). One connection carries many requests at once:
// each gets its own reqId and its answer is matched back by it, since the
// server may answer out of order. Callers on any number of goroutines
// append their frames to a shared buffer that a writer goroutine sends, so
// a pipelining caller gets many frames per write(2), as the server does
// for its answers.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ClientConfig says how to reach a server.
type ClientConfig struct {
	Addr        string      // host:port of the wire protocol
	Token       string      // sent with Auth right after connecting, when set
	TLS         *tls.Config // nil: plain TCP
	DialTimeout time.Duration
	// OnEvent receives frames that carry no reqId (event subscriptions);
	// it runs on the reader goroutine and must not block. Nil drops them.
	OnEvent func(body []byte)
}

// ServerError is an answer with ok:false: the server understood the
// request and refused it.
type ServerError struct {
	Cmd string
	Msg string
}

func (e *ServerError) Error() string { return e.Msg }

// Client is one connection to a server. It is safe for concurrent use.
type Client struct {
	cfg ClientConfig
	nc  net.Conn

	wmu    sync.Mutex
	wbuf   []byte
	wspare []byte
	wkick  chan struct{}
	werr   error

	pmu     sync.Mutex
	pending map[uint64]chan []byte
	seq     atomic.Uint64

	answered  bool          // a frame has arrived; the reader's own
	done      chan struct{} // closed when the reader has stopped
	rerr      error         // why the reader stopped; read after done
	wdone     chan struct{}
	closing   atomic.Bool
	closeOnce sync.Once
}

const defaultDialTimeout = 5 * time.Second

// reqIDPrefix starts every reqId this client makes; the number after it is
// the pending-table key.
const reqIDPrefix = "q"

// Dial connects, completes the TLS handshake when configured and
// authenticates when a token is given. ctx bounds all of that.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = defaultDialTimeout
	}
	d := net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.Addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if cfg.TLS != nil {
		tcfg := cfg.TLS
		if tcfg.ServerName == "" && !tcfg.InsecureSkipVerify {
			tcfg = tcfg.Clone()
			host, _, _ := net.SplitHostPort(cfg.Addr)
			tcfg.ServerName = host
		}
		tc := tls.Client(nc, tcfg)
		hctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("TLS handshake with %s: %w%s", cfg.Addr, err, tlsHint(err))
		}
		nc = tc
	}
	c := &Client{cfg: cfg, nc: nc, pending: make(map[uint64]chan []byte),
		wkick: make(chan struct{}, 1), done: make(chan struct{}), wdone: make(chan struct{})}
	go c.readLoop()
	go c.writeLoop()
	if cfg.Token != "" {
		if _, err := c.Call(ctx, map[string]any{"cmd": "Auth", "token": cfg.Token}); err != nil {
			c.Close()
			return nil, fmt.Errorf("authentication failed: %w", err)
		}
	}
	return c, nil
}

// tlsHint explains the usual cause of a handshake that fails on its first
// bytes: the server is not speaking TLS at all.
func tlsHint(err error) string {
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) {
		return " (is the server running without TLS? drop --tls)"
	}
	return ""
}

// Close ends the connection; calls still waiting fail.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		c.nc.Close()
		<-c.done
		c.wmu.Lock()
		close(c.wkick)
		c.wmu.Unlock()
		<-c.wdone
	})
	return nil
}

// Err reports why the connection ended, once it has.
func (c *Client) Err() error {
	select {
	case <-c.done:
		return c.rerr
	default:
		return nil
	}
}

func (c *Client) readLoop() {
	defer close(c.done)
	br := bufio.NewReaderSize(c.nc, 64<<10)
	var fields []Field
	for {
		body, err := ReadFrame(br, nil)
		if err != nil {
			var fe *FrameSizeError
			switch {
			case errors.As(err, &fe):
				// A plain client reading a TLS server's alert sees its record
				// header as an absurd frame length.
				err = fmt.Errorf("reading from %s: %w (is the server running with TLS? try --tls)", c.cfg.Addr, err)
			case c.closing.Load():
				err = errors.New("connection closed")
			case !c.answered && c.cfg.TLS == nil && errors.Is(err, io.EOF):
				// A TLS server drops a client whose first bytes are not a
				// handshake, without a word.
				err = fmt.Errorf("%s closed the connection without answering (is the server running with TLS? try --tls)", c.cfg.Addr)
			default:
				err = fmt.Errorf("connection to %s lost: %w", c.cfg.Addr, err)
			}
			c.fail(err)
			return
		}
		c.answered = true
		m, err := ParseMap(body, fields)
		fields = m.Fields[:0]
		if err != nil {
			c.fail(fmt.Errorf("undecodable answer from %s: %w", c.cfg.Addr, err))
			return
		}
		id, isStr, _ := m.Str("reqId")
		n, perr := strconv.ParseUint(strings.TrimPrefix(id, reqIDPrefix), 10, 64)
		if !isStr || !strings.HasPrefix(id, reqIDPrefix) || perr != nil {
			if c.cfg.OnEvent != nil {
				c.cfg.OnEvent(body)
			}
			continue
		}
		c.pmu.Lock()
		ch := c.pending[n]
		delete(c.pending, n)
		c.pmu.Unlock()
		// An answer nobody waits for belongs to a call that gave up.
		if ch != nil {
			ch <- body
		}
	}
}

// fail records why the connection ended and closes it; waiting calls see
// done and report the error.
func (c *Client) fail(err error) {
	c.rerr = err
	c.nc.Close()
}

// writeLoop writes what callers have queued, all of it in one write.
func (c *Client) writeLoop() {
	defer close(c.wdone)
	for range c.wkick {
		// Yield first. One read can bring answers for several callers;
		// the reader readies them one after another, and each sends its
		// next request at once. The first one's kick makes this goroutine
		// the next to run on that processor, ahead of the callers readied
		// after it, so without the yield it wrote each request on its own.
		// Through queued bench steady, memory mode, the bench's writes fell
		// from 3.0 to 2.0 a job at 10,000 jobs/s; at 20,000/s its CPU fell
		// by a tenth and the jobs' p99 from 13-307 ms to 8.5-19 ms
		// (docs/performance.md); bench push of 100,000 single PUSHes on 4
		// connections went from 1.09-1.15 s to 0.76-0.79 s.
		runtime.Gosched()
		c.wmu.Lock()
		out := c.wbuf
		if len(out) == 0 {
			c.wmu.Unlock()
			continue
		}
		// The two buffers trade places: callers fill one while the other
		// is on its way out.
		c.wbuf, c.wspare = c.wspare[:0], nil
		c.wmu.Unlock()
		c.nc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		_, err := c.nc.Write(out)
		c.wmu.Lock()
		if cap(out) <= 4<<20 {
			c.wspare = out[:0]
		}
		if err != nil && c.werr == nil {
			c.werr = err
		}
		c.wmu.Unlock()
		if err != nil {
			c.nc.Close()
		}
	}
}

// Send writes one request and waits for its answer, returned as the raw
// MessagePack body. fields writes the request's fields other than cmd and
// reqId and returns how many it wrote. An ok:false answer is not an error
// here (see AnswerError); a transport failure or ctx ending is.
func (c *Client) Send(ctx context.Context, cmd string, fields func(e *Enc) int) ([]byte, error) {
	n := c.seq.Add(1)
	ch := make(chan []byte, 1)
	c.pmu.Lock()
	c.pending[n] = ch
	c.pmu.Unlock()

	c.wmu.Lock()
	if c.werr != nil || c.closing.Load() {
		err := c.werr
		c.wmu.Unlock()
		c.forget(n)
		if err == nil {
			err = errors.New("connection closed")
		}
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	e := Enc{B: c.wbuf}
	at := e.BeginFrame()
	mp := e.OpenMap()
	e.Str("cmd")
	e.Str(cmd)
	k := 2
	if fields != nil {
		k += fields(&e)
	}
	e.Str("reqId")
	var idb [24]byte
	e.Str(string(strconv.AppendUint(append(idb[:0], reqIDPrefix...), n, 10)))
	e.CloseMap(mp, k)
	e.EndFrame(at)
	c.wbuf = e.B
	select {
	case c.wkick <- struct{}{}:
	default:
	}
	c.wmu.Unlock()

	select {
	case body := <-ch:
		return body, nil
	case <-c.done:
		select {
		case body := <-ch:
			return body, nil
		default:
		}
		return nil, fmt.Errorf("%s: %w", cmd, c.rerr)
	case <-ctx.Done():
		c.forget(n)
		return nil, fmt.Errorf("%s: no answer from %s: %w", cmd, c.cfg.Addr, ctx.Err())
	}
}

func (c *Client) forget(n uint64) {
	c.pmu.Lock()
	delete(c.pending, n)
	c.pmu.Unlock()
}

// AnswerError returns a *ServerError when body is an ok:false answer.
func AnswerError(cmd string, body []byte) error {
	m, err := ParseMap(body, nil)
	if err != nil {
		return fmt.Errorf("%s: undecodable answer: %w", cmd, err)
	}
	ok, _, _ := m.Bool("ok")
	if ok {
		return nil
	}
	msg, _, _ := m.Str("error")
	if msg == "" {
		msg = "request refused without a reason"
	}
	return &ServerError{Cmd: cmd, Msg: msg}
}

// Call sends a request given as a map (its "cmd" is required) and returns
// the decoded answer. An ok:false answer comes back as the map and a
// *ServerError.
func (c *Client) Call(ctx context.Context, req map[string]any) (map[string]any, error) {
	cmd, _ := req["cmd"].(string)
	if cmd == "" {
		return nil, errors.New("request without a cmd")
	}
	var encErr error
	body, err := c.Send(ctx, cmd, func(e *Enc) int {
		n := 0
		for k, v := range req {
			if k == "cmd" || k == "reqId" {
				continue
			}
			mark := len(e.B)
			e.Str(k)
			if err := e.Any(v); err != nil {
				e.B = e.B[:mark]
				encErr = fmt.Errorf("field %s: %w", k, err)
				continue
			}
			n++
		}
		return n
	})
	if err != nil {
		return nil, err
	}
	if encErr != nil {
		return nil, fmt.Errorf("%s: %w", cmd, encErr)
	}
	v, err := Decode(body)
	if err != nil {
		return nil, fmt.Errorf("%s: undecodable answer: %w", cmd, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: answer is not a map", cmd)
	}
	if m["ok"] != true {
		msg, _ := m["error"].(string)
		if msg == "" {
			msg = "request refused without a reason"
		}
		return m, &ServerError{Cmd: cmd, Msg: msg}
	}
	return m, nil
}

// clientTLS builds the client side of TLS from the command-line options:
// verify against the system roots, or against caFile when given; noVerify
// turns verification off and must be asked for by name. It returns nil
// when TLS is not wanted.
func clientTLS(enabled bool, caFile string, noVerify bool) (*tls.Config, error) {
	if !enabled && caFile == "" && !noVerify {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("reading the CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	if noVerify {
		cfg.InsecureSkipVerify = true
	}
	return cfg, nil
}
