package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestMCPCostBound holds mcpCost to the renderer: for values of every
// kind, what a value takes in an MCP answer (appendJSON, indented at a
// depth as pretty indents it, escaped as the text content escapes it) is
// never more than the bound worked out from its MessagePack.
func TestMCPCostBound(t *testing.T) {
	t.Parallel()
	values := []any{
		nil, true, false, 0, -32, 127, 128, -129, 65536, math.MaxInt32 + 1, -1 << 40, uint64(math.MaxUint64),
		math.Pi, -1.7976931348623157e308, 5e-324, float32(1.5),
		"", "plain", "quote\" and \\ backslash", "\x00\x01\x1f control", "new\nline\ttab\r", "é ü 漢字 🙂", "\u2028\u2029", string([]byte{0xff, 0xfe, 'a'}),
		[]byte{}, []byte{0, 1, 255, 100}, bytes.Repeat([]byte{255}, 1000),
		[]any{}, []any{1, "a", []any{[]any{[]any{}}}}, map[string]any{}, map[string]any{"k": map[string]any{"deep": []any{1, 2, 3}}, "": "\""},
	}
	// Nested: each level indented further (2,047 values in 10 levels).
	var deep any = 1
	for range 10 {
		deep = []any{deep, map[string]any{"x": deep}}
	}
	values = append(values, deep)
	for i, v := range values {
		var e Enc
		if err := e.Any(v); err != nil {
			t.Fatal(err)
		}
		got, err := appendJSON(nil, e.B)
		if err != nil {
			t.Fatalf("value %d: %v", i, err)
		}
		for d := 0; d <= 6; d++ {
			cost, err := mcpCost(e.B, d, math.MaxInt64)
			if err != nil {
				t.Fatalf("value %d: %v", i, err)
			}
			var ind bytes.Buffer
			if err := json.Indent(&ind, got, strings.Repeat("  ", d), "  "); err != nil {
				t.Fatalf("value %d: %v", i, err)
			}
			if real := escapedLen(ind.Bytes()); real > cost {
				t.Errorf("value %d (%.40q) at depth %d takes %d bytes, over its bound %d", i, got, d, real, cost)
			}
			// escapedLen is appendJSONString's length.
			if n := int64(len(appendJSONString(nil, ind.Bytes())) - 2); n != escapedLen(ind.Bytes()) {
				t.Errorf("value %d: escapedLen %d, appendJSONString wrote %d", i, escapedLen(ind.Bytes()), n)
			}
		}
	}
	// A key that is not a string is rendered as its text.
	var e Enc
	e.MapHead(2)
	e.Any([]any{"a\"b", 1.5})
	e.Any("v")
	e.Int(7)
	e.Any([]byte{1, 2})
	got, _ := appendJSON(nil, e.B)
	var ind bytes.Buffer
	json.Indent(&ind, got, "", "  ")
	if cost, _ := mcpCost(e.B, 0, math.MaxInt64); escapedLen(ind.Bytes()) > cost {
		t.Errorf("non-string keys: %d bytes, over the bound %d", escapedLen(ind.Bytes()), cost)
	}
	// Over the limit: the walk stops and says so; malformed: an error.
	if cost, _ := mcpCost(e.B, 0, 10); cost <= 10 {
		t.Errorf("a bound past the limit answered %d", cost)
	}
	if _, err := mcpCost([]byte{0xc4, 10, 1}, 0, 1<<20); err == nil {
		t.Error("a truncated binary was measured")
	}
}

// mcpPost sends one JSON-RPC message to /mcp and answers the body.
func mcpPost(t *testing.T, httpAddr, msg string) []byte {
	t.Helper()
	res, err := http.Post("http://"+httpAddr+"/mcp", "application/json", strings.NewReader(msg))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// toolCall is a tools/call message.
func toolCall(id, name, args string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"` + name + `","arguments":` + args + `}}`
}

// toolAnswer reads a tools/call answer's text, as JSON into v.
func toolAnswer(t *testing.T, ans []byte, v any) (isError bool) {
	t.Helper()
	r := decodeRPC(t, ans)
	if r.Error != nil {
		t.Fatalf("JSON-RPC error %d %s", r.Error.Code, r.Error.Message)
	}
	var res struct {
		Content []struct{ Text string } `json:"content"`
		IsError bool                    `json:"isError"`
	}
	if err := json.Unmarshal(r.Result, &res); err != nil || len(res.Content) != 1 {
		t.Fatalf("result %.300s", r.Result)
	}
	if v != nil {
		if err := json.Unmarshal([]byte(res.Content[0].Text), v); err != nil {
			t.Fatalf("text %.300s: %v", res.Content[0].Text, err)
		}
	}
	return res.IsError
}

type jobsPage struct {
	Count int `json:"count"`
	Jobs  []struct {
		ID   string          `json:"id"`
		Data json.RawMessage `json:"data"`
	} `json:"jobs"`
	Omitted int    `json:"omitted"`
	Note    string `json:"note"`
}

// TestMCPGetJobsBigData: get_jobs over jobs of big binary data answers
// within the cap (1 MiB): the binary data shown as its type and length,
// the page cut where the next job would not fit, with a note saying how
// many were left out and where to go on; following the note pages through
// every job once. Before, the answer was the data as indented numbers,
// escaped again: 10 to 14 times the data.
func TestMCPGetJobsBigData(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := dial(t, ts.addr)
	const bins, strs = 4, 40
	want := map[string]bool{}
	for range bins {
		want[str(t, c.ok(M{"cmd": "PUSH", "queue": "big", "data": bytes.Repeat([]byte{7}, 2_000_000)}), "id")] = true
	}
	// Shown in full (40,000 bytes of JSON each), and 40 of them pass the cap.
	for i := range strs {
		want[str(t, c.ok(M{"cmd": "PUSH", "queue": "big", "data": M{"i": i, "s": strings.Repeat("x", 40_000)}}), "id")] = true
	}
	seen := map[string]bool{}
	start, pages := 0, 0
	for start < bins+strs {
		ans := mcpPost(t, ts.http, toolCall("1", "bunqueue_get_jobs", fmt.Sprintf(`{"queue":"big","start":%d,"end":%d}`, start, bins+strs)))
		if len(ans)+1 > defaultMCPAnswer {
			t.Fatalf("an answer of %d bytes, over the cap of %d", len(ans), defaultMCPAnswer)
		}
		var p jobsPage
		if toolAnswer(t, ans, &p) {
			t.Fatalf("get_jobs refused: %s", ans)
		}
		if p.Count != len(p.Jobs) || p.Count == 0 {
			t.Fatalf("count %d, %d jobs", p.Count, len(p.Jobs))
		}
		left := bins + strs - start - p.Count
		if left > 0 {
			if p.Omitted != left || !strings.Contains(p.Note, fmt.Sprintf("start=%d", start+p.Count)) || !strings.Contains(p.Note, "--mcp-max-answer-bytes") {
				t.Fatalf("a cut page: omitted %d (want %d), note %q", p.Omitted, left, p.Note)
			}
		} else if p.Omitted != 0 || p.Note != "" {
			t.Fatalf("a whole page with a note: %d %q", p.Omitted, p.Note)
		}
		for _, j := range p.Jobs {
			if seen[j.ID] || !want[j.ID] {
				t.Fatalf("job %s shown twice or unknown", j.ID)
			}
			seen[j.ID] = true
			if bytes.HasPrefix(j.Data, []byte(`"[not shown`)) {
				if !bytes.Contains(j.Data, []byte("binary of 2,000,000 bytes")) {
					t.Errorf("a summary %s", j.Data)
				}
			} else if !bytes.Contains(j.Data, []byte(`"s": "xxx`)) {
				t.Errorf("data shown %.100s", j.Data)
			}
		}
		start += p.Count
		pages++
	}
	if len(seen) != bins+strs || pages < 2 {
		t.Fatalf("%d jobs in %d pages", len(seen), pages)
	}
	// A small job's answer is as it was: its data rendered.
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "small", "data": M{"k": []any{1, 2}}}), "id")
	var job struct{ Data json.RawMessage }
	toolAnswer(t, mcpPost(t, ts.http, toolCall("2", "bunqueue_get_job", `{"jobId":"`+id+`"}`)), &job)
	var compact bytes.Buffer
	json.Compact(&compact, job.Data)
	if compact.String() != `{"k":[1,2]}` {
		t.Errorf("a small job's data: %s", job.Data)
	}
}

// TestMCPAnswerCap: the least cap (--mcp-max-answer-bytes 64KiB) holds
// and leaves room for the tool list; a pull shows every job it took (past
// what fits in full, with their values summarised); an answer that cannot
// fit even so is refused, naming the limit and its value.
func TestMCPAnswerCap(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{mcpMaxAnswer: minMCPAnswer})
	if ans := mcpPost(t, ts.http, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); decodeRPC(t, ans).Error != nil || len(ans) > minMCPAnswer {
		t.Fatalf("tools/list under the least cap: %.300s", ans)
	}
	c := dial(t, ts.addr)
	// Each shown in full (3.6 KB of a 4 KiB value's room), 20 more than fit.
	for i := range 20 {
		c.ok(M{"cmd": "PUSH", "queue": "p", "data": M{"i": i, "s": strings.Repeat("y", 3600)}})
	}
	ans := mcpPost(t, ts.http, toolCall("1", "bunqueue_pull_job_batch", `{"queue":"p","count":20}`))
	var p jobsPage
	if toolAnswer(t, ans, &p) || p.Count != 20 || len(ans)+1 > minMCPAnswer {
		t.Fatalf("a pull of 20: %d jobs in %d bytes: %.300s", p.Count, len(ans), ans)
	}
	summarised := 0
	for _, j := range p.Jobs {
		if bytes.HasPrefix(j.Data, []byte(`"[not shown`)) {
			summarised++
		} else if summarised > 0 {
			t.Errorf("a job shown in full after a summarised one: the first ones are shown")
		}
	}
	if summarised == 0 || summarised == 20 {
		t.Errorf("%d of 20 pulled jobs summarised, want some", summarised)
	}
	// 400 jobs taken cannot be shown in 64 KiB, even summarised.
	for i := range 400 {
		c.ok(M{"cmd": "PUSH", "queue": "p2", "data": M{"i": i}})
	}
	ans = mcpPost(t, ts.http, toolCall("2", "bunqueue_pull_job_batch", `{"queue":"p2","count":400}`))
	var refusal struct{ Error string }
	if !toolAnswer(t, ans, &refusal) || !strings.Contains(refusal.Error, "limited to 64 KiB (65536 bytes) (--mcp-max-answer-bytes)") ||
		!strings.Contains(refusal.Error, "the 400 jobs taken were given back") {
		t.Errorf("a pull past the cap: %.300s", ans)
	}
	// Given back, not left active for no one: all 400 wait, and the
	// next pull has them, none counted as an attempt. Before, they stayed
	// active until their leases ran out.
	counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "p2"}), "counts")
	if num(t, counts["waiting"]) != 400 || num(t, counts["active"]) != 0 {
		t.Fatalf("after the refused pull: %v", counts)
	}
	jobs := list(t, c.ok(M{"cmd": "PULLB", "queue": "p2", "count": 400}), "jobs")
	if len(jobs) != 400 {
		t.Fatalf("pulled again: %d of 400", len(jobs))
	}
	for _, j := range jobs {
		if a := num(t, j.(M)["attempts"]); a != 0 {
			t.Fatalf("a job given back has attempts %v", a)
		}
	}
}

// TestMCPAnswerOption: `queued mcp` takes the cap from its option or the
// environment, within its range.
//
// Serial: it sets environment variables (t.Setenv).
func TestMCPAnswerOption(t *testing.T) {
	t.Setenv("QUEUED_MCP_MAX_ANSWER_BYTES", "")
	for _, c := range []struct {
		args []string
		env  string
		want int64
		err  string
	}{
		{nil, "", defaultMCPAnswer, ""},
		{[]string{"--mcp-max-answer-bytes", "64KiB"}, "", 64 << 10, ""},
		{[]string{"--mcp-max-answer-bytes", "64MiB"}, "", 64 << 20, ""},
		{[]string{"--mcp-max-answer-bytes=2MiB"}, "128KiB", 2 << 20, ""},
		{nil, "128KiB", 128 << 10, ""},
		{[]string{"--mcp-max-answer-bytes", "16KiB"}, "", 0, "--mcp-max-answer-bytes must be from 64 KiB"},
		{nil, "100GiB", 0, "QUEUED_MCP_MAX_ANSWER_BYTES must be from"},
		{[]string{"--mcp-max-answer-bytes"}, "", 0, "needs a value"},
	} {
		t.Setenv("QUEUED_MCP_MAX_ANSWER_BYTES", c.env)
		n, rest, err := mcpAnswerOption(c.args)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v %q: %v, want %q", c.args, c.env, err, c.err)
			}
			continue
		}
		if err != nil || n != c.want || len(rest) != 0 {
			t.Errorf("%v %q: %d %v %v, want %d", c.args, c.env, n, rest, err, c.want)
		}
	}
}

// stdioMCP is `queued mcp`'s loop on pipes; its answers are read as they
// come, into answers.
type stdioMCP struct {
	t       *testing.T
	in      *io.PipeWriter
	answers chan []byte
	stop    context.CancelFunc
	done    chan error
}

func startStdioMCP(t *testing.T, srv *mcpServer) *stdioMCP {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	s := &stdioMCP{t: t, in: inW, answers: make(chan []byte, 1024), stop: cancel, done: make(chan error, 1)}
	go func() {
		s.done <- serveMCPStdio(ctx, srv, inR, outW)
		outW.Close()
	}()
	go func() {
		br := bufio.NewReaderSize(outR, 1<<20)
		for {
			line, err := br.ReadBytes('\n')
			if err != nil {
				close(s.answers)
				return
			}
			select {
			case s.answers <- line:
			default: // the test no longer reads
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		inW.Close()
		select {
		case <-s.done:
		case <-time.After(time.Minute):
			t.Error("queued mcp's loop did not end")
		}
	})
	return s
}

func (s *stdioMCP) send(msg string) {
	s.t.Helper()
	if _, err := io.WriteString(s.in, msg+"\n"); err != nil {
		s.t.Fatal(err)
	}
}

// next reads the next answer.
func (s *stdioMCP) next() rpc {
	s.t.Helper()
	line, ok := <-s.answers
	if !ok {
		s.t.Fatal("queued mcp's output ended")
	}
	return decodeRPC(s.t, line)
}

// TestMCPStdioKeepsReading: `queued mcp` goes on reading while its
// requests wait. 40 waits for a job that never finishes: 16 run, the 24
// others are refused at once naming the limit; a ping is answered while
// the 16 still wait (it waited 60 s behind them before: the reader waited
// for a turn); a cancellation ends one of them, and its place is taken
// again. Nothing here waits on time: the waits last 30 s, and every
// answer checked comes before any of them could end on its own.
func TestMCPStdioKeepsReading(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "never", "data": M{}}), "id")
	s := startStdioMCP(t, mcpOver(t, ts.addr))
	for i := range 40 {
		s.send(toolCall(fmt.Sprintf(`"w%d"`, i), "bunqueue_wait_for_job", `{"jobId":"`+id+`","timeoutMs":30000}`))
	}
	refused := map[string]bool{}
	for len(refused) < 40-mcpMaxPending {
		r := s.next()
		if r.Error == nil || r.Error.Code != rpcTooManyRequests || !strings.Contains(r.Error.Message, fmt.Sprintf("at most %d at once", mcpMaxPending)) {
			t.Fatalf("while 16 wait: answer %s %+v, want a refusal", r.ID, r.Error)
		}
		refused[string(r.ID)] = true
	}
	// The first 16 run: the reader took them in order.
	for i := range mcpMaxPending {
		if refused[fmt.Sprintf(`"w%d"`, i)] {
			t.Fatalf("w%d refused, one of the first 16", i)
		}
	}
	s.send(`{"jsonrpc":"2.0","id":"ping","method":"ping"}`)
	if r := s.next(); string(r.ID) != `"ping"` || string(r.Result) != "{}" {
		t.Fatalf("the ping's answer: %s %s %+v", r.ID, r.Result, r.Error)
	}
	// One more is refused at once.
	s.send(toolCall(`"more"`, "bunqueue_wait_for_job", `{"jobId":"`+id+`","timeoutMs":30000}`))
	if r := s.next(); string(r.ID) != `"more"` || r.Error == nil || r.Error.Code != rpcTooManyRequests {
		t.Fatalf("one past 16: %s %+v", r.ID, r.Error)
	}
	s.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"w3"}}`)
	if r := s.next(); string(r.ID) != `"w3"` || !bytes.Contains(r.Result, []byte(`"isError":true`)) {
		t.Fatalf("the cancelled wait's answer: %s %s %+v", r.ID, r.Result, r.Error)
	}
	// Its place is free again once its goroutine is gone: a request is
	// eventually taken (its answer comes at once: the queue's count).
	eventually(t, 20*time.Second, "a request taken in the cancelled one's place", func() (bool, string) {
		s.send(toolCall(`"count"`, "bunqueue_count_jobs", `{"queue":"never"}`))
		r := s.next()
		if string(r.ID) != `"count"` {
			t.Fatalf("answer %s while counting", r.ID)
		}
		return r.Error == nil, fmt.Sprintf("%+v", r.Error)
	})
}

// TestMCPStdioCancelAtOnce: a cancellation written right behind its
// request, in the same write, ends it: the reader registers a request
// before it reads the next message. Before, the request was registered by
// the goroutine that ran it, and a cancellation read first was lost (the
// wait then ran its 30 s). A second request with the id of one under way
// is refused, naming the rule: a cancellation could not tell them apart.
func TestMCPStdioCancelAtOnce(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "never", "data": M{}}), "id")
	s := startStdioMCP(t, mcpOver(t, ts.addr))
	wait := toolCall(`"w"`, "bunqueue_wait_for_job", `{"jobId":"`+id+`","timeoutMs":30000}`)
	for i := range 20 {
		s.send(wait + "\n" + `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"w"}}`)
		if r := s.next(); string(r.ID) != `"w"` || !bytes.Contains(r.Result, []byte(`"isError":true`)) {
			t.Fatalf("try %d: the cancelled wait's answer: %s %s %+v", i, r.ID, r.Result, r.Error)
		}
	}
	s.send(wait)
	s.send(toolCall(`"w"`, "bunqueue_count_jobs", `{"queue":"never"}`))
	if r := s.next(); string(r.ID) != `"w"` || r.Error == nil || r.Error.Code != rpcInvalidRequest ||
		!strings.Contains(r.Error.Message, "already under way") {
		t.Fatalf("a second request with the id of one under way: %s %s %+v", r.ID, r.Result, r.Error)
	}
	s.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"w"}}`)
	if r := s.next(); string(r.ID) != `"w"` || !bytes.Contains(r.Result, []byte(`"isError":true`)) {
		t.Fatalf("the first, cancelled: %s %s %+v", r.ID, r.Result, r.Error)
	}
}

// TestMCPWaitForJobTimesOut: a wait that runs out of time answers
// completed:false; a job that completed, completed:true. Before (as in
// the reference's MCP server, which reads the wire answer's ok), a wait
// that timed out answered completed:true.
func TestMCPWaitForJobTimesOut(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, nil)
	c := dial(t, ts.addr)
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "w", "data": M{}}), "id")
	var got struct {
		JobID     string
		Completed bool
	}
	if toolAnswer(t, mcpPost(t, ts.http, toolCall("1", "bunqueue_wait_for_job", `{"jobId":"`+id+`","timeoutMs":100}`)), &got) ||
		got.JobID != id || got.Completed {
		t.Fatalf("a wait that ran out of time: %+v", got)
	}
	pulled := sub(t, c.ok(M{"cmd": "PULL", "queue": "w"}), "job")
	c.ok(M{"cmd": "ACK", "id": str(t, pulled, "id")})
	if toolAnswer(t, mcpPost(t, ts.http, toolCall("2", "bunqueue_wait_for_job", `{"jobId":"`+id+`","timeoutMs":100}`)), &got) ||
		!got.Completed {
		t.Fatalf("a wait for a completed job: %+v", got)
	}
}

// TestReadMessageLimit: a message of exactly mcpMaxMessage bytes is read,
// its newline not counted (it was refused before); one byte more is not,
// and the next message is read whole.
func TestReadMessageLimit(t *testing.T) {
	t.Parallel()
	exact := bytes.Repeat([]byte("x"), mcpMaxMessage)
	var in bytes.Buffer
	in.Write(exact)
	in.WriteString("\n")
	in.Write(exact)
	in.WriteString("y\nnext\nlast")
	r := bufio.NewReaderSize(&in, 64<<10)
	if line, err := readMessage(r); err != nil || !bytes.Equal(bytes.TrimSuffix(line, []byte("\n")), exact) {
		t.Fatalf("a message of %d bytes: %d bytes read, %v", mcpMaxMessage, len(line), err)
	}
	if _, err := readMessage(r); !errors.Is(err, errLineTooLong) {
		t.Fatalf("a message of %d bytes: %v, want errLineTooLong", mcpMaxMessage+1, err)
	}
	if line, err := readMessage(r); err != nil || string(line) != "next\n" {
		t.Fatalf("the next message: %q %v", line, err)
	}
	if line, err := readMessage(r); err != io.EOF || string(line) != "last" {
		t.Fatalf("the last, without a newline: %q %v", line, err)
	}
}

// TestLocalSendHeld: what localSendHeld answers stays counted in the
// answer budget, every byte of it, until release, for an answer given at
// once (GetJob of a 1 MB job) and for one given later (a long-poll PULL
// answered when the job comes). Before, the room was given back as the
// answer was returned, and a copy of it made besides.
func TestLocalSendHeld(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	s := memServer(b, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	// sendErr may run in any goroutine; send, which fails the test, only
	// in the test's own.
	sendErr := func(cmd string, kv ...any) ([]byte, func(), error) {
		var fields Enc
		for i := 0; i < len(kv); i += 2 {
			fields.Str(kv[i].(string))
			if err := fields.Any(kv[i+1]); err != nil {
				return nil, nil, err
			}
		}
		return s.localSendHeld(ctx, cmd, func(e *Enc) int {
			e.B = append(e.B, fields.B...)
			return len(kv) / 2
		})
	}
	send := func(cmd string, kv ...any) ([]byte, func()) {
		t.Helper()
		ans, release, err := sendErr(cmd, kv...)
		if err != nil {
			t.Fatal(err)
		}
		return ans, release
	}
	push := func(q string, n int) {
		ans, release := send("PUSH", "queue", q, "data", bytes.Repeat([]byte{1}, n))
		if m, _ := ParseMap(ans, nil); !answerOK(m) {
			t.Fatalf("PUSH: %x", ans[:min(len(ans), 80)])
		}
		release()
	}
	push("q", 1<<20)
	if n := s.answers.used.Load(); n != 0 {
		t.Fatalf("%d bytes held after the push's release", n)
	}
	ans, release := send("GetJobs", "queue", "q", "offset", 0, "limit", 10)
	if m, _ := ParseMap(ans, nil); !answerOK(m) {
		t.Fatal("GetJobs refused")
	}
	if held := s.answers.used.Load(); held < int64(len(ans)) {
		t.Errorf("%d bytes held for an answer of %d", held, len(ans))
	}
	release()
	if n := s.answers.used.Load(); n != 0 {
		t.Errorf("%d bytes held after release", n)
	}

	// Given later: the pull waits, the job comes, its answer is counted
	// until release.
	got := make(chan func(), 1)
	failed := make(chan error, 1)
	var pulled []byte
	go func() {
		ans, release, err := sendErr("PULL", "queue", "later", "timeout", 20000)
		if err != nil {
			failed <- err
			return
		}
		pulled = ans
		got <- release
	}()
	eventually(t, 10*time.Second, "the pull waiting", func() (bool, string) {
		n := b.pullsWaiting.Load()
		return n == 1, fmt.Sprint(n, " waiting")
	})
	push("later", 1<<20)
	select {
	case release = <-got:
	case err := <-failed:
		t.Fatal(err)
	}
	if held := s.answers.used.Load(); held < int64(len(pulled)) || len(pulled) < 1<<20 {
		t.Errorf("%d bytes held for a pull's answer of %d", held, len(pulled))
	}
	release()
	if n := s.answers.used.Load(); n != 0 {
		t.Errorf("%d bytes held after the pull's release", n)
	}
}
