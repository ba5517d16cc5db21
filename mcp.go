package main

// The Model Context Protocol server: the reference's bunqueue-mcp tools,
// resources and prompts, for AI agents, with no runtime beside this
// binary. `queued mcp` serves it over stdio to a server reached over the
// wire protocol (cli_mcp.go); the server serves it itself over HTTP at
// /mcp (mcp_http.go). This file is JSON-RPC 2.0 and the MCP methods,
// written by hand as the MessagePack codec is; the tools are in
// mcp_tools.go, the resources and prompts in mcp_prompts.go.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// mcpVersions are the protocol versions served, newest first: those the
// current MCP SDK client offers. A client asking for another gets the
// newest, and decides whether it can go on.
var mcpVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05", "2024-10-07"}

// Bounds on what an MCP client can make this side hold or wait for.
const (
	// mcpMaxMessage is the largest JSON-RPC message read (a line on
	// stdio, a body over HTTP).
	mcpMaxMessage = 4 << 20
	// mcpMaxPending is how many requests of one stdio session run at
	// once; past it a request is refused at once, and the reader goes on
	// (cancellations and pings must always get through).
	mcpMaxPending = 16
	// mcpCallTimeout bounds one tool call, resource read or prompt, the
	// longest waits of the tools (30 s) included.
	mcpCallTimeout = 60 * time.Second
)

// JSON-RPC error codes.
const (
	rpcParseError     = -32700
	rpcInvalidRequest = -32600
	rpcMethodNotFound = -32601
	rpcInvalidParams  = -32602
	rpcInternalError  = -32603
	// Server errors, in the range JSON-RPC leaves to implementations.
	rpcTooManyRequests = -32000 // past mcpMaxPending requests in flight
	rpcAnswerTooBig    = -32001 // an answer over --mcp-max-answer-bytes
)

// mcpSend sends one command to a queued server and answers its raw
// MessagePack answer; fields writes the command's fields besides cmd and
// returns how many it wrote. An ok:false answer is an answer, not an
// error, as the reference's client gives it to its tools.
type mcpSend func(ctx context.Context, cmd string, fields func(e *Enc) int) ([]byte, error)

// mcpSendHeld is mcpSend for a server that keeps the answer counted in
// its answer budget while a tool reads it: release (nil when nothing is
// held) gives it back, once the MCP answer made of it is built.
type mcpSendHeld func(ctx context.Context, cmd string, fields func(e *Enc) int) (answer []byte, release func(), err error)

// mcpServer serves MCP over any transport; its tools reach queued through
// send.
type mcpServer struct {
	send    mcpSendHeld
	version string
	log     *slog.Logger
	// maxAnswer caps one answer, as written (--mcp-max-answer-bytes).
	maxAnswer int64
	// answers, when set, is the server's answer budget: an answer is held
	// in it from the moment it is built until the transport has written
	// it (and frees it then). Over HTTP; stdio has none.
	answers *answerBudget
}

func newMCPServer(send mcpSend, log *slog.Logger) *mcpServer {
	return newMCPServerHeld(func(ctx context.Context, cmd string, fields func(e *Enc) int) ([]byte, func(), error) {
		b, err := send(ctx, cmd, fields)
		return b, nil, err
	}, log)
}

func newMCPServerHeld(send mcpSendHeld, log *slog.Logger) *mcpServer {
	return &mcpServer{send: send, version: version, log: log, maxAnswer: defaultMCPAnswer}
}

// mcpSession is one client's conversation: its negotiated version and the
// requests it has running, which notifications/cancelled can end.
type mcpSession struct {
	srv      *mcpServer
	mu       sync.Mutex
	version  string
	inflight map[string]context.CancelFunc
}

func (s *mcpServer) session() *mcpSession {
	return &mcpSession{srv: s, inflight: make(map[string]context.CancelFunc)}
}

// rpcIn is a JSON-RPC message from the client: a request (with an id), a
// notification (without), or an answer to a request of ours (we send
// none, so those are dropped).
type rpcIn struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

// rpcError is a JSON-RPC error answer.
type rpcError struct {
	code int
	msg  string
}

func (e *rpcError) Error() string { return e.msg }

func rpcErr(code int, format string, args ...any) *rpcError {
	return &rpcError{code: code, msg: fmt.Sprintf(format, args...)}
}

// handle answers one JSON-RPC message; nil when it needs no answer (a
// notification). malformed: the message itself was refused (not JSON, not
// one JSON-RPC 2.0 message), which HTTP answers with 400 as the MCP SDK
// does. ctx ends the request's work (the transport's). With an answer
// budget, the answer is held in it: the transport frees it once written
// (len of the answer).
func (s *mcpSession) handle(ctx context.Context, msg []byte) (ans []byte, malformed bool) {
	in, ans, isRequest := s.parse(msg)
	malformed = ans != nil
	if ans == nil && isRequest {
		var release func()
		ans, release = s.serve(ctx, in)
		defer release()
	}
	if ans != nil && s.srv.answers != nil {
		s.srv.answers.hold(int64(len(ans)))
	}
	return ans, malformed
}

// parse reads one JSON-RPC message. A request to serve comes back as in,
// with isRequest; a notification is taken at once (nothing comes back);
// a malformed message comes back answered (ans).
func (s *mcpSession) parse(msg []byte) (in rpcIn, ans []byte, isRequest bool) {
	msg = bytes.TrimSpace(msg)
	if len(msg) > 0 && msg[0] == '[' {
		return in, rpcAnswer(nil, nil, rpcErr(rpcInvalidRequest, "batches are not accepted: send one JSON-RPC message at a time")), false
	}
	if err := json.Unmarshal(msg, &in); err != nil {
		return in, rpcAnswer(nil, nil, rpcErr(rpcParseError, "Parse error: %v", err)), false
	}
	if len(in.ID) > mcpMaxID {
		return in, rpcAnswer(nil, nil, rpcErr(rpcInvalidRequest, "Invalid Request: an id is limited to %d bytes", mcpMaxID)), false
	}
	isRequest = len(in.ID) > 0 && !bytes.Equal(in.ID, []byte("null"))
	if in.JSONRPC != "2.0" || (in.Method == "" && isRequest) {
		return in, rpcAnswer(in.ID, nil, rpcErr(rpcInvalidRequest, "Invalid Request: expected a JSON-RPC 2.0 message with a method")), false
	}
	if in.Method == "" {
		return in, nil, false // an answer to a request of ours: we send none
	}
	if len(in.ID) > 0 && in.ID[0] != '"' && (in.ID[0] < '0' || in.ID[0] > '9') && in.ID[0] != '-' {
		return in, rpcAnswer(nil, nil, rpcErr(rpcInvalidRequest, "Invalid Request: an id is a string or a number")), false
	}
	if !isRequest {
		s.notified(in.Method, in.Params)
		return in, nil, false
	}
	return in, nil, true
}

// begin registers a request under way, so that a cancellation naming its
// id ends it, and returns its context and end, which unregisters it. A
// request whose id is already under way is refused (ans): a cancellation
// could not tell the two apart. The stdio reader begins a request before
// it hands it to a goroutine, so a cancellation read right after it finds
// it.
func (s *mcpSession) begin(ctx context.Context, in rpcIn) (rctx context.Context, end func(), ans []byte) {
	ctx, cancel := context.WithTimeout(ctx, mcpCallTimeout)
	key := string(in.ID)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.inflight[key]; dup {
		cancel()
		return nil, nil, rpcAnswer(in.ID, nil, rpcErr(rpcInvalidRequest,
			"Invalid Request: a request with id %s is already under way; ids must be unique among the requests in flight", key))
	}
	s.inflight[key] = cancel
	return ctx, func() {
		cancel()
		s.mu.Lock()
		delete(s.inflight, key)
		s.mu.Unlock()
	}, nil
}

// serve runs one request and answers it, within the answer's cap. The
// wire answers its tool read stay held (release gives them back) until
// the caller has counted the answer made of them.
func (s *mcpSession) serve(ctx context.Context, in rpcIn) (ans []byte, release func()) {
	ctx, end, ans := s.begin(ctx, in)
	if ans != nil {
		return ans, func() {}
	}
	defer end()
	return s.run(ctx, in)
}

// run serves a request begun (begin), and answers it.
func (s *mcpSession) run(ctx context.Context, in rpcIn) (ans []byte, release func()) {
	max := s.srv.maxAnswer
	// The envelope around a tool's text, and a line's newline on stdio.
	env := len(rpcAnswer(in.ID, []byte(`{"content":[{"type":"text","text":""}],"isError":true}`), nil)) + 1
	b := &mcpBackend{held: s.srv.send, fit: newMCPFit(max, env)}
	result, err := s.call(ctx, b, in.Method, in.Params)
	ans = rpcAnswer(in.ID, result, err)
	if int64(len(ans))+1 > max {
		// A tool's answer was measured as it was built; whatever still
		// passes the cap is refused, naming it.
		msg := errMCPTooBig(max)
		if in.Method == "tools/call" {
			ans = rpcAnswer(in.ID, toolResult(mcpResult{text: errorText(msg), isError: true}), nil)
		} else {
			ans = rpcAnswer(in.ID, nil, rpcErr(rpcAnswerTooBig, "%s", msg))
		}
	}
	return ans, b.release
}

// notified takes a notification: a cancellation ends the request it
// names; the others (initialized, roots changed, ...) need nothing.
func (s *mcpSession) notified(method string, params json.RawMessage) {
	if method != "notifications/cancelled" {
		return
	}
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil {
		return
	}
	s.mu.Lock()
	cancel := s.inflight[string(p.RequestID)]
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// call runs one request's method.
func (s *mcpSession) call(ctx context.Context, b *mcpBackend, method string, params json.RawMessage) (result []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.srv.log.Error("MCP request panic", "method", method, "panic", p)
			result, err = nil, rpcErr(rpcInternalError, "Internal error")
		}
	}()
	switch method {
	case "initialize":
		return s.initialize(params)
	case "ping":
		return []byte("{}"), nil
	case "tools/list":
		return mcpToolList(), nil
	case "tools/call":
		return s.srv.callTool(ctx, b, params)
	case "resources/list":
		return mcpResourceList(), nil
	case "resources/templates/list":
		return []byte(`{"resourceTemplates":[]}`), nil
	case "resources/read":
		return s.srv.readResource(ctx, b, params)
	case "prompts/list":
		return mcpPromptList(), nil
	case "prompts/get":
		return s.srv.getPrompt(ctx, b, params)
	}
	return nil, rpcErr(rpcMethodNotFound, "Method not found: %s", method)
}

// initialize agrees on a protocol version: the client's when served, else
// the newest.
func (s *mcpSession) initialize(params json.RawMessage) ([]byte, error) {
	var p struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if err := json.Unmarshal(params, &p); err != nil || p.ProtocolVersion == "" {
		return nil, rpcErr(rpcInvalidParams, "Invalid params: initialize needs a protocolVersion")
	}
	v := mcpVersions[0]
	if slices.Contains(mcpVersions, p.ProtocolVersion) {
		v = p.ProtocolVersion
	}
	s.mu.Lock()
	s.version = v
	s.mu.Unlock()
	o := newJSONObj().
		str("protocolVersion", v).
		json("capabilities", []byte(`{"tools":{"listChanged":true},"resources":{"listChanged":true},"prompts":{"listChanged":true}}`)).
		json("serverInfo", newJSONObj().str("name", "queued-mcp").str("version", s.srv.version).close()).
		str("instructions", "Manage the queues of a queued (bunqueue protocol) server: jobs, queues, flows, cron schedules, the dead-letter queue, limits, workers, webhooks and HTTP handlers.")
	return o.close(), nil
}

// rpcAnswer frames a JSON-RPC answer: the result, or the error.
func rpcAnswer(id json.RawMessage, result []byte, err error) []byte {
	if len(id) == 0 {
		id = []byte("null")
	}
	o := newJSONObj().json("jsonrpc", []byte(`"2.0"`)).json("id", id)
	if err != nil {
		var re *rpcError
		if !errors.As(err, &re) {
			re = rpcErr(rpcInternalError, "%v", err)
		}
		o.json("error", newJSONObj().num("code", float64(re.code)).str("message", re.msg).close())
	} else {
		o.json("result", result)
	}
	return o.close()
}

// ---------------------------------------------------------------------------
// JSON written in order

// jsonArr writes a JSON array of values that are JSON already.
func jsonArr(items [][]byte) []byte {
	b := []byte{'['}
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, it...)
	}
	return append(b, ']')
}

func jsonStr(s string) []byte { return appendJSONString(nil, []byte(s)) }

// pretty indents JSON as JSON.stringify(v, null, 2) does.
func pretty(b []byte) []byte {
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") != nil {
		return b
	}
	return out.Bytes()
}
