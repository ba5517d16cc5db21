package main

// `queued mcp`: the MCP server over stdio, for an agent that starts it as
// a subprocess, talking to a queued (or bunqueue) server over the wire
// protocol. Configured as the reference's bunqueue-mcp in its TCP mode
// (BUNQUEUE_HOST, BUNQUEUE_PORT, BUNQUEUE_TOKEN) or with the CLI's global
// options (-H, -p, --token, --tls...). Messages are JSON-RPC, one per
// line; the log goes to stderr.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// runMCP is `queued mcp`.
func runMCP(args []string, stdout, stderr io.Writer) int {
	o, rest, err := parseGlobal(args)
	if err != nil {
		fmt.Fprintln(stderr, "queued:", err)
		return 2
	}
	if o.help {
		return printHelp("mcp", stdout, stderr)
	}
	maxAnswer, rest, err := mcpAnswerOption(rest)
	if err != nil {
		return cliFail(o, stderr, err, 2)
	}
	if len(rest) > 0 {
		return cliFail(o, stderr, usagef("mcp: unexpected argument %q (see queued help mcp)", rest[0]), 2)
	}
	// The reference's MCP server reads BUNQUEUE_PORT, which the CLI does
	// not: honoured unless -p said otherwise.
	if p := os.Getenv("BUNQUEUE_PORT"); p != "" && !o.portSet {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return cliFail(o, stderr, fmt.Errorf("BUNQUEUE_PORT=%q is not a port", p), 2)
		}
		o.port = n
	}
	if m := os.Getenv("BUNQUEUE_MODE"); m != "" && m != "tcp" {
		fmt.Fprintf(stderr, "queued mcp: BUNQUEUE_MODE=%s ignored: queued mcp always talks to a server (tcp mode)\n", m)
	}
	cfg, err := o.clientConfig()
	if err != nil {
		return cliFail(o, stderr, err, 2)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	link := &mcpLink{cfg: cfg}
	defer link.close()
	// A first connection tells at once whether the server is there; the
	// agent still gets its tools when it is not, and each call tries again.
	if err := link.connect(ctx); err != nil {
		log.Warn("queued mcp: server not reachable yet; each tool call will try again", "addr", cfg.Addr, "err", err)
	}
	log.Info("queued MCP server started", "transport", "stdio", "server", cfg.Addr, "version", version)
	srv := newMCPServer(link.send, log)
	srv.maxAnswer = maxAnswer
	if err := serveMCPStdio(ctx, srv, os.Stdin, stdout); err != nil {
		log.Error("queued mcp", "err", err)
		return 1
	}
	return 0
}

// mcpAnswerOption reads --mcp-max-answer-bytes out of the words after
// mcp (QUEUED_MCP_MAX_ANSWER_BYTES, else the default, when absent).
func mcpAnswerOption(args []string) (int64, []string, error) {
	v, set := os.Getenv("QUEUED_MCP_MAX_ANSWER_BYTES"), false
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--mcp-max-answer-bytes":
			if i+1 >= len(args) {
				return 0, nil, usagef("--mcp-max-answer-bytes needs a value")
			}
			v, set = args[i+1], true
			i++
		case strings.HasPrefix(a, "--mcp-max-answer-bytes="):
			v, set = a[len("--mcp-max-answer-bytes="):], true
		default:
			rest = append(rest, a)
		}
	}
	if v == "" {
		if set {
			return 0, nil, usagef("--mcp-max-answer-bytes needs a value")
		}
		return defaultMCPAnswer, rest, nil
	}
	what := "--mcp-max-answer-bytes"
	if !set {
		what = "QUEUED_MCP_MAX_ANSWER_BYTES"
	}
	n, err := parseByteSize(v)
	if err != nil {
		return 0, nil, usagef("%s=%q is not a size: %v", what, v, err)
	}
	if err := checkMCPAnswer(n, what); err != nil {
		return 0, nil, usagef("%v", err)
	}
	return n, rest, nil
}

// mcpLink is the connection to the server, made again when it breaks (the
// server restarted): a tool call is never refused for a connection that
// could be made now.
type mcpLink struct {
	cfg ClientConfig
	mu  sync.Mutex
	c   *Client
}

func (l *mcpLink) connect(ctx context.Context) error {
	_, err := l.client(ctx)
	return err
}

func (l *mcpLink) client(ctx context.Context) (*Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c != nil && l.c.Err() == nil {
		return l.c, nil
	}
	if l.c != nil {
		l.c.Close()
		l.c = nil
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := Dial(dctx, l.cfg)
	if err != nil {
		return nil, err
	}
	l.c = c
	return c, nil
}

func (l *mcpLink) send(ctx context.Context, cmd string, fields func(e *Enc) int) ([]byte, error) {
	c, err := l.client(ctx)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the queue server at %s: %w", l.cfg.Addr, err)
	}
	return c.Send(ctx, cmd, fields)
}

func (l *mcpLink) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c != nil {
		l.c.Close()
	}
}

// errLineTooLong is a message past mcpMaxMessage.
var errLineTooLong = errors.New("line too long")

// serveMCPStdio reads JSON-RPC messages, one per line, until in ends or
// ctx does, and writes each answer on a line of its own (one writer at a
// time). Up to mcpMaxPending requests run at once, answers coming out of
// order as JSON-RPC allows; one more is refused at once, and the reader
// goes on: a notifications/cancelled, a ping or a malformed message is
// taken as it comes, whatever is running (a ping waited 60 s behind 40
// long waits when the reader waited for a turn).
func serveMCPStdio(ctx context.Context, srv *mcpServer, in io.Reader, out io.Writer) error {
	st := &stdioServer{ctx: ctx, sess: srv.session(), out: out, slots: make(chan struct{}, mcpMaxPending)}
	// The reader may outlive this function, blocked reading in until it
	// ends (the process's standard input, with the process); past this
	// point it starts nothing and writes nothing.
	defer st.stop()
	readErr := make(chan error, 1)
	go func() { readErr <- st.read(bufio.NewReaderSize(in, 64<<10)) }()
	select {
	case <-ctx.Done():
		return nil
	case err := <-readErr:
		if err == io.EOF {
			err = nil
		}
		return err
	}
}

// stdioServer is one `queued mcp` session over stdio: its reader, the
// requests it runs (up to mcpMaxPending at once, slots) and its writer.
type stdioServer struct {
	ctx   context.Context
	sess  *mcpSession
	out   io.Writer
	slots chan struct{}

	wmu  sync.Mutex
	done bool // serveMCPStdio has returned: nothing more is written

	// running: the requests under way; stopped once serveMCPStdio ends,
	// after which none starts (a WaitGroup takes no Add once waited on).
	mu      sync.Mutex
	running sync.WaitGroup
	stopped bool
}

// write writes one answer on a line of its own, one writer at a time.
func (st *stdioServer) write(b []byte) {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	if !st.done {
		st.out.Write(append(b, '\n'))
	}
}

// stop starts no more requests, waits for those under way, and writes
// nothing more.
func (st *stdioServer) stop() {
	st.mu.Lock()
	st.stopped = true
	st.mu.Unlock()
	st.running.Wait()
	st.wmu.Lock()
	st.done = true
	st.wmu.Unlock()
}

// start runs a request in a goroutine of its own, its slot taken; false
// once stopped.
func (st *stdioServer) start(in rpcIn) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.stopped {
		return false
	}
	// Registered here, in the reader, before the next message is read: a
	// cancellation that follows at once finds the request.
	rctx, end, refused := st.sess.begin(st.ctx, in)
	if refused != nil {
		<-st.slots
		st.write(refused)
		return true
	}
	st.running.Go(func() {
		defer func() { <-st.slots }()
		ans, release := st.sess.run(rctx, in)
		end()
		st.write(ans)
		release()
	})
	return true
}

// read takes messages until the input ends (its error) or the session
// stops (nil).
func (st *stdioServer) read(r *bufio.Reader) error {
	for {
		line, err := readMessage(r)
		if errors.Is(err, errLineTooLong) {
			st.write(rpcAnswer(nil, nil, rpcErr(rpcParseError, "Parse error: a message is limited to %d bytes", mcpMaxMessage)))
			continue
		}
		if len(bytes.TrimSpace(line)) > 0 && !st.take(line) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// take answers or starts one message; false once the session stopped.
func (st *stdioServer) take(line []byte) bool {
	in, ans, isRequest := st.sess.parse(line)
	switch {
	case ans != nil:
		st.write(ans)
	case !isRequest:
		// a notification, taken by parse
	case in.Method == "ping":
		ans, release := st.sess.serve(st.ctx, in)
		st.write(ans)
		release()
	default:
		select {
		case st.slots <- struct{}{}:
			if !st.start(in) {
				<-st.slots
				return false
			}
		default:
			st.write(rpcAnswer(in.ID, nil, rpcErr(rpcTooManyRequests,
				"Too many requests in flight: a session runs at most %d at once; wait for an answer, or cancel a request (notifications/cancelled)", mcpMaxPending)))
		}
	}
	return true
}

// readMessage reads one line of at most mcpMaxMessage bytes besides its
// newline; a longer one is read through and refused.
func readMessage(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		// The message's bytes, not its line's end, count to the limit.
		n := len(chunk)
		if err == nil {
			n-- // the newline
		}
		if len(line)+n > mcpMaxMessage {
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
			if err != nil && err != io.EOF {
				return nil, err
			}
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return line, err
	}
}
