package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// mcpOver is an MCP server whose tools reach the server at addr.
func mcpOver(t *testing.T, addr string) *mcpServer {
	t.Helper()
	link := &mcpLink{cfg: ClientConfig{Addr: addr}}
	t.Cleanup(link.close)
	return newMCPServer(link.send, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// rpc is a decoded JSON-RPC answer.
type rpc struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeRPC(t *testing.T, b []byte) rpc {
	t.Helper()
	var r rpc
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("answer %q is not JSON: %v", b, err)
	}
	return r
}

// toolText calls a tool and answers its text and whether it is an error.
func toolText(t *testing.T, s *mcpSession, name, args string) (string, bool) {
	t.Helper()
	ans := answerOf(s.handle(context.Background(), []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"`+name+`","arguments":`+args+`}}`)))
	r := decodeRPC(t, ans)
	if r.Error != nil {
		t.Fatalf("%s: JSON-RPC error %d %s", name, r.Error.Code, r.Error.Message)
	}
	var res struct {
		Content []struct{ Text string } `json:"content"`
		IsError bool                    `json:"isError"`
	}
	if err := json.Unmarshal(r.Result, &res); err != nil || len(res.Content) != 1 {
		t.Fatalf("%s: result %s", name, r.Result)
	}
	return res.Content[0].Text, res.IsError
}

// TestMCPProtocol: JSON-RPC as MCP clients expect it, malformed messages
// answered with the right errors, and the tools' refusals as results.
func TestMCPProtocol(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	s := mcpOver(t, ts.addr).session()
	ctx := context.Background()
	errCode := func(msg string) int {
		t.Helper()
		r := decodeRPC(t, answerOf(s.handle(ctx, []byte(msg))))
		if r.Error == nil {
			t.Fatalf("%s: answered %s, want an error", msg, r.Result)
		}
		return r.Error.Code
	}
	for msg, want := range map[string]int{
		`{"jsonrpc":"2.0","id":1,"method":`:                                                        rpcParseError,
		`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`:                                               rpcInvalidRequest,
		`{"id":1,"method":"ping"}`:                                                                 rpcInvalidRequest,
		`{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}`:                                           rpcInvalidRequest,
		`{"jsonrpc":"2.0","id":1,"method":"tools/frob"}`:                                           rpcMethodNotFound,
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`:                               rpcInvalidParams,
		`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"bunqueue://nothing"}}`: rpcInvalidParams,
		`{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"bunqueue_debug_queue"}}`: rpcInvalidParams,
	} {
		if got := errCode(msg); got != want {
			t.Errorf("%s: error %d, want %d", msg, got, want)
		}
	}
	// Versions: the client's when served, else the newest.
	for asked, want := range map[string]string{"2025-06-18": "2025-06-18", "2024-11-05": "2024-11-05", "2099-01-01": mcpVersions[0]} {
		r := decodeRPC(t, answerOf(s.handle(ctx, []byte(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"`+asked+`","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))))
		var res struct {
			ProtocolVersion string
			Capabilities    map[string]any
		}
		if err := json.Unmarshal(r.Result, &res); err != nil || res.ProtocolVersion != want || res.Capabilities["tools"] == nil {
			t.Errorf("initialize %s: %s (%v)", asked, r.Result, err)
		}
		if string(r.ID) != `"init"` {
			t.Errorf("initialize: id %s, want the request's", r.ID)
		}
	}
	if ans := answerOf(s.handle(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))); ans != nil {
		t.Errorf("a notification was answered: %s", ans)
	}
	if r := decodeRPC(t, answerOf(s.handle(ctx, []byte(`{"jsonrpc":"2.0","id":2,"method":"ping"}`)))); string(r.Result) != "{}" {
		t.Errorf("ping: %s", r.Result)
	}
	// tools/list: 73 tools, each with an object schema.
	var list struct {
		Tools []struct {
			Name        string
			InputSchema map[string]any
		}
	}
	json.Unmarshal(decodeRPC(t, answerOf(s.handle(ctx, []byte(`{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)))).Result, &list)
	if len(list.Tools) != 73 {
		t.Fatalf("tools/list: %d tools, want 73", len(list.Tools))
	}
	for _, tool := range list.Tools {
		if tool.InputSchema["type"] != "object" {
			t.Errorf("%s: input schema %v", tool.Name, tool.InputSchema)
		}
	}
	// A tool that works; refusals as results.
	if text, isErr := toolText(t, s, "bunqueue_add_job", `{"queue":"mq","name":"n","data":{"k":[1,2]}}`); isErr || !strings.Contains(text, `"jobId"`) {
		t.Errorf("add_job: %s", text)
	}
	if text, _ := toolText(t, s, "bunqueue_count_jobs", `{"queue":"mq"}`); text != `{"queue":"mq","count":1}` {
		t.Errorf("count_jobs: %s", text)
	}
	for _, c := range []struct{ tool, args, want string }{
		{"bunqueue_nothing", `{}`, "Tool bunqueue_nothing not found"},
		{"bunqueue_add_job", `{"queue":"mq","name":"n"}`, "Input validation error: Invalid arguments for tool bunqueue_add_job: data: required"},
		{"bunqueue_pull_job_batch", `{"queue":"mq","count":5000}`, "count: too big"},
		{"bunqueue_get_jobs", `{"queue":"mq","state":"lost"}`, "state: expected one of"},
		{"bunqueue_add_webhook", `{"url":"not a url","events":["job.failed"]}`, "url: invalid URL"},
		{"bunqueue_get_job", `{"jobId":"nope"}`, `{"error":"Job not found"}`},
		{"bunqueue_add_flow", `{"name":"r","queueName":"q","children":[{"name":"c","queueName":"q","data":{"__parentId":"x"}}]}`, "reserved"},
	} {
		text, isErr := toolText(t, s, c.tool, c.args)
		if !isErr || !strings.Contains(text, c.want) {
			t.Errorf("%s %s: %q (error %v), want an error with %q", c.tool, c.args, text, isErr, c.want)
		}
	}
}

// TestMCPCancel: notifications/cancelled ends the request it names, here a
// pull that would wait 30 s.
func TestMCPCancel(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	s := mcpOver(t, ts.addr).session()
	done := make(chan []byte, 1)
	go func() {
		done <- answerOf(s.handle(context.Background(), []byte(`{"jsonrpc":"2.0","id":"long","method":"tools/call","params":{"name":"bunqueue_pull_job","arguments":{"queue":"empty","timeoutMs":30000}}}`)))
	}()
	// Cancelled once it is running: the request is known by then.
	eventually(t, 20*time.Second, "the call started", func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, running := s.inflight[`"long"`]
		return running, "not in flight"
	})
	answerOf(s.handle(context.Background(), []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"long"}}`)))
	select {
	case ans := <-done:
		if !bytes.Contains(ans, []byte(`"isError":true`)) {
			t.Errorf("a cancelled call answered %s", ans)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a cancelled call still runs")
	}
}

// TestMCPStdio: messages one per line; a line past the limit is refused
// and the next ones are still answered; the end of the input ends it.
func TestMCPStdio(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	srv := mcpOver(t, ts.addr)
	var in bytes.Buffer
	in.WriteString(`{"jsonrpc":"2.0","id":1,"method":"ping"}` + "\n")
	in.WriteString(`{"jsonrpc":"2.0","id":2,"method":"ping","params":{"pad":"` + strings.Repeat("x", mcpMaxMessage) + `"}}` + "\n")
	in.WriteString("\n")
	in.WriteString(`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n")
	in.WriteString(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"bunqueue_list_queues","arguments":{}}}`)
	var out syncBuffer
	if err := serveMCPStdio(context.Background(), srv, &in, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d answers, want 3:\n%s", len(lines), out.String())
	}
	seen := map[string]bool{}
	for _, l := range lines {
		r := decodeRPC(t, []byte(l))
		switch {
		case r.Error != nil && r.Error.Code == rpcParseError && strings.Contains(r.Error.Message, "limited to"):
			seen["too long"] = true
		case string(r.ID) == "1" && string(r.Result) == "{}":
			seen["ping"] = true
		case string(r.ID) == "3" && strings.Contains(string(r.Result), "queues"):
			seen["tool"] = true
		}
	}
	if len(seen) != 3 {
		t.Errorf("answers %v:\n%s", seen, out.String())
	}
}

// TestMCPHTTP: /mcp behind the HTTP API's guards, and the transport's
// answers: JSON for a request, 202 for a notification, 405 for GET.
func TestMCPHTTP(t *testing.T) {
	t.Parallel()
	ts := startServerHTTP(t, &config{authTokens: "s3cret"})
	post := func(body string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+ts.http+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	auth := map[string]string{"Authorization": "Bearer s3cret"}
	ping := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	if code, _ := post(ping, nil); code != 401 {
		t.Errorf("without the token: %d, want 401", code)
	}
	if code, body := post(ping, auth); code != 200 || !strings.Contains(body, `"result":{}`) {
		t.Errorf("ping: %d %s", code, body)
	}
	// A body that is not one JSON-RPC message is refused with 400 and the
	// JSON-RPC error, as the MCP SDK's transport refuses it.
	for body, rpcCode := range map[string]string{
		`not json`:                 "-32700",
		`{"id":1,"method":"ping"}`: "-32600",
		`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`: "-32600",
	} {
		if code, ans := post(body, auth); code != 400 || !strings.Contains(ans, `"code":`+rpcCode) {
			t.Errorf("%s: %d %s, want 400 and the JSON-RPC error %s", body, code, ans, rpcCode)
		}
	}
	if code, _ := post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, auth); code != 202 {
		t.Errorf("a notification: %d, want 202", code)
	}
	evil := map[string]string{"Authorization": "Bearer s3cret", "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
	if code, _ := post(ping, evil); code != 403 {
		t.Errorf("from another origin's page: %d, want 403", code)
	}
	if code, _ := post(ping, map[string]string{"Authorization": "Bearer s3cret", "MCP-Protocol-Version": "1999-01-01"}); code != 400 {
		t.Errorf("an unknown protocol version: %d, want 400", code)
	}
	if code, _ := post(`{"jsonrpc":"2.0","id":1,"method":"ping","params":{"p":"`+strings.Repeat("x", mcpMaxMessage)+`"}}`, auth); code != 413 {
		t.Errorf("a message over the limit: %d, want 413", code)
	}
	if code, body := post(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"bunqueue_add_job","arguments":{"queue":"hq","name":"n","data":{}}}}`, auth); code != 200 || !strings.Contains(body, `jobId`) {
		t.Errorf("add_job over HTTP: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", "http://"+ts.http+"/mcp", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 405 {
		t.Errorf("GET /mcp: %d, want 405", res.StatusCode)
	}
}

// TestHandlersSurviveRestart: a handler registered in SQLite mode is kept
// in the data file: after a restart the server works the queue's jobs by
// calling the URL, with the registered headers, and completes each with
// the answer.
func TestHandlersSurviveRestart(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.Header.Get("X-Key")+" "+string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"worked":true}`)
	}))
	defer receiver.Close()
	path := filepath.Join(t.TempDir(), "queued.db")
	srv := startBinary(t, "--data-path", path, "--webhook-allow-private")
	c := dial(t, fmt.Sprintf("127.0.0.1:%d", srv.tcpPort))
	c.ok(M{"cmd": "HandlerSet", "queue": "hq", "url": receiver.URL + "/x", "method": "PUT", "headers": M{"X-Key": "k"}, "timeoutMs": 5000})
	if msg := c.fail(M{"cmd": "HandlerSet", "queue": "hq", "url": receiver.URL, "method": "PATCH"}); !strings.Contains(msg, "method must be") {
		t.Errorf("a PATCH handler: %q", msg)
	}
	c.close()
	srv.stop(t)

	srv = startBinary(t, "--data-path", path, "--webhook-allow-private")
	defer srv.stop(t)
	c = dial(t, fmt.Sprintf("127.0.0.1:%d", srv.tcpPort))
	list := c.ok(M{"cmd": "HandlerList"})["handlers"].([]any)
	if len(list) != 1 || list[0].(map[string]any)["queue"] != "hq" {
		t.Fatalf("handlers after the restart: %v", list)
	}
	id := c.ok(M{"cmd": "PUSH", "queue": "hq", "data": M{"n": 1}})["id"].(string)
	if a := c.ok(M{"cmd": "WaitJob", "id": id, "timeout": 20000}); a["completed"] != true {
		t.Fatalf("the handler did not complete the job: %v", a)
	}
	res := c.ok(M{"cmd": "GetResult", "id": id})["result"].(map[string]any)
	if num(t, res["status"]) != 200 || fmt.Sprint(res["body"]) != "map[worked:true]" {
		t.Errorf("result %v", res)
	}
	mu.Lock()
	if len(got) != 1 || got[0] != `PUT k {"n":1}` {
		t.Errorf("calls %q", got)
	}
	mu.Unlock()
	if a := c.ok(M{"cmd": "HandlerRemove", "queue": "hq"}); a["removed"] != true {
		t.Errorf("remove: %v", a)
	}
}

// TestHandlerAddressGuard: without --webhook-allow-private a handler may
// not call the server's own network, as a webhook may not.
func TestHandlerAddressGuard(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	for _, u := range []string{"http://127.0.0.1:9/x", "http://169.254.169.254/latest", "ftp://example.com/x", "http://" + strings.Repeat("a", 3000) + ".com"} {
		if msg := c.fail(M{"cmd": "HandlerSet", "queue": "g", "url": u, "method": "POST"}); !strings.Contains(msg, "Handler URL") && !strings.Contains(msg, "URL") {
			t.Errorf("%.40s: %q", u, msg)
		}
	}
	if list := c.ok(M{"cmd": "HandlerList"})["handlers"].([]any); len(list) != 0 {
		t.Errorf("refused handlers were kept: %v", list)
	}
}

// TestToolSchemaCheck: the schema check's own cases, recursion included.
func TestToolSchemaCheck(t *testing.T) {
	t.Parallel()
	flow := mcpToolIndex["bunqueue_add_flow"].in
	deep := `{"name":"a","queueName":"q"}`
	for range maxSchemaDepth { // past the check's bound, whatever the flow's own
		deep = `{"name":"a","queueName":"q","children":[` + deep + `]}`
	}
	for args, want := range map[string]string{
		`{"name":"r","queueName":"q"}`: "",
		`{"name":"r","queueName":"q","children":[{"name":"c","queueName":"q","children":[{"name":"g"}]}]}`: "children[0].children[0].queueName: required",
		`{"name":"r","queueName":"q","opts":{"priority":"high"}}`:                                          "opts.priority: expected a number, received string",
		deep: "nested deeper than",
	} {
		var v any
		json.Unmarshal([]byte(args), &v)
		err := flow.check(v)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%.80s: %v, want %q", args, err, want)
		}
	}
}

// FuzzMCPMessage: no message makes the session panic, and every answer is
// one JSON-RPC document.
func FuzzMCPMessage(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}`,
		`{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"bunqueue_add_flow","arguments":{"name":"r","queueName":"q","children":[{"name":"c","queueName":"q"}]}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"bunqueue_get_jobs","arguments":{"queue":"q","start":-1,"end":1e308}}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}`,
		`{"jsonrpc":"2.0","id":3,"method":"prompts/get","params":{"name":"bunqueue_incident_response","arguments":{"queue":"x"}}}`,
		`[1,2]`, `{}`, `null`, `{"jsonrpc":"2.0","id":null}`,
	} {
		f.Add([]byte(s))
	}
	// No server behind: every command fails, as a server that is down.
	down := func(ctx context.Context, cmd string, fields func(e *Enc) int) ([]byte, error) {
		var e Enc
		if fields != nil {
			fields(&e)
		}
		return nil, fmt.Errorf("%s: no server", cmd)
	}
	srv := newMCPServer(down, slog.New(slog.NewTextHandler(io.Discard, nil)))
	f.Fuzz(func(t *testing.T, msg []byte) {
		ans := answerOf(srv.session().handle(context.Background(), msg))
		if ans != nil && !json.Valid(ans) {
			t.Fatalf("answer to %q is not JSON: %q", msg, ans)
		}
	})
}

// answerOf is handle's answer, for a test that does not look at whether
// the message was refused.
func answerOf(ans []byte, _ bool) []byte { return ans }
