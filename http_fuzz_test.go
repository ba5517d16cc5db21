package main

// FuzzHTTPJSONBridge drives the path by which an HTTP request becomes a
// protocol command: a JSON body turned into MessagePack (jsonToMsgpack),
// read as a map, picked apart by a route into a command, run through the
// command table on a virtual connection, and the command's answer rendered
// back as JSON. Whatever the route, path segment and body, the server must
// not panic and must answer well-formed JSON: an object with a boolean
// "ok" (a bare array for the few routes the reference answers so).
//
//	go test -run '^$' -fuzz FuzzHTTPJSONBridge -fuzztime 60s
//
// Crashers found are kept under testdata/fuzz/FuzzHTTPJSONBridge.

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// bridgeRoutes are the routes the fuzzer picks from: every route but those
// that stream (live events), wait on purpose for seconds, or only run the
// garbage collector.
func bridgeRoutes(a *httpAPI) []route {
	var out []route
	for _, r := range a.routes {
		p := strings.Join(r.pattern, "/")
		if strings.HasPrefix(p, "events") || strings.HasPrefix(p, "ws") || p == "gc" || p == "heapstats" {
			continue
		}
		out = append(out, r)
	}
	return out
}

func FuzzHTTPJSONBridge(f *testing.F) {
	// Real bodies of the routes, as clients send them, and some that are
	// not.
	for _, body := range []string{
		`{"name":"welcome","data":{"to":"a@example.com","n":3,"nested":{"list":[1,"two",null]}},"priority":5,"delay":100}`,
		`{"data":{"x":1},"jobId":"custom-1","maxAttempts":3,"backoff":1000,"tags":["a","b"],"uniqueKey":"u","removeOnComplete":true}`,
		`{"jobs":[{"name":"a","data":1},{"data":{"b":2},"priority":1},{"name":7}]}`,
		`{"ids":["1","2"],"results":[{"ok":true},null],"tokens":["t1","t2"]}`,
		`{"ids":["1"],"tokens":["t"],"durations":[30000]}`,
		`{"result":{"sent":true},"token":"abc"}`,
		`{"error":"boom","stack":"Error: boom\n  at x","unrecoverable":true}`,
		`{"progress":50,"message":"half"}`,
		`{"data":{"replaced":true}}`,
		`{"priority":10,"lifo":true}`,
		`{"delay":5000,"token":"t"}`,
		`{"message":"line","level":"warn"}`,
		`{"count":10,"timeout":0,"owner":"w1","lockTtl":30000}`,
		`{"grace":0,"state":"completed","limit":100}`,
		`{"limit":10,"duration":1000}`,
		`{"concurrency":4}`,
		`{"config":{"stallInterval":30000,"maxStalls":3}}`,
		`{"maxAutoRetries":3,"autoRetry":true}`,
		`{"name":"nightly","queue":"reports","schedule":"0 3 * * *","data":{"full":true},"timezone":"Europe/Rome"}`,
		`{"name":"tick","queue":"q","repeatEvery":1000,"maxLimit":2,"jobOptions":{"priority":1}}`,
		`{"url":"https://example.com/hook","events":["job:completed","job:failed"],"queue":"q","secret":"s"}`,
		`{"enabled":false}`,
		`{"name":"w","queues":["a","b"],"concurrency":2,"hostname":"h","pid":1}`,
		`{"activeJobs":1,"processed":2,"failed":0}`,
		`{"timeout":0}`,
		`{"jobId":"x"}`,
		``, ` `, `{}`, `[]`, `"str"`, `null`, `12`, `{"a":1,"a":2}`, `{"data":1e400}`, `{"data":-0}`,
		`{"data":"\ud800"}`, `{"priority":"high"}`, `{"delay":-1}`, `{"maxAttempts":9007199254740993}`,
		`{"data":` + strings.Repeat(`[`, 200) + strings.Repeat(`]`, 200) + `}`,
		`{"jobs":{"not":"an array"}}`, `{"ids":"1"}`, `{` + `"k":` + `"` + strings.Repeat("x", 3000) + `"}`,
		`{"x":1}{"y":2}`, `{"x":}`, "\xff\xfe", `{"data":{"\u0000":1}}`,
	} {
		for _, route := range []uint16{0, 7, 23, 31, 42, 55} {
			f.Add(route, "q1", []byte(body))
		}
	}
	// /mcp, wherever it is in the table: JSON-RPC in and out.
	mb := NewMemEngine(1, nil)
	ma := newHTTPAPI(mb.Broker, memServer(mb, nil, quietLog()), nil, httpConfig{})
	mcpRoutes := bridgeRoutes(ma)
	ma.Close()
	mb.Close()
	seeded := false
	for i, r := range mcpRoutes {
		if r.pattern[0] == "mcp" {
			seeded = true
			for _, body := range []string{`0`, `[]`, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
				`{"jsonrpc":"2.0","method":"notifications/initialized"}`, `[{"jsonrpc":"2.0","id":2,"method":"ping"}]`} {
				f.Add(uint16(i), "", []byte(body))
			}
		}
	}
	if !seeded {
		f.Fatal("no /mcp route among the bridge's routes")
	}
	f.Add(uint16(3), "", []byte(`{}`))
	f.Add(uint16(9), "%zz", []byte(`{}`))
	f.Add(uint16(11), "a/b", []byte(`{"data":1}`))
	f.Add(uint16(13), strings.Repeat("q", 300), []byte(`{"data":1}`))

	f.Fuzz(func(t *testing.T, pick uint16, seg string, body []byte) {
		// The bridge alone: JSON in, MessagePack, JSON out.
		if mp, err := jsonToMsgpack(body); err == nil {
			out, err := appendJSON(nil, mp)
			if err != nil || !json.Valid(out) {
				t.Fatalf("JSON %q became MessagePack that renders as %q (%v)", body, out, err)
			}
		}

		b := NewMemEngine(1, nil)
		defer b.Close()
		srv := memServer(b, nil, quietLog())
		a := newHTTPAPI(b.Broker, srv, nil, httpConfig{})
		defer a.Close()
		routes := bridgeRoutes(a)
		rt := routes[int(pick)%len(routes)]
		path := ""
		for _, s := range rt.pattern {
			if strings.HasPrefix(s, ":") {
				s = url.PathEscape(seg)
			}
			path += "/" + s
		}
		target := path
		if rt.method == "GET" {
			target += "?timeout=0&limit=3&offset=1&state=waiting"
		}
		// Commands that wait (a long-poll pull, WaitJob) end with the
		// request: give each a short life.
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		req := httptest.NewRequest(rt.method, "http://127.0.0.1"+target, bytes.NewReader(body)).WithContext(ctx)
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, req)

		if rec.Code == http.StatusInternalServerError {
			t.Fatalf("%s %s %q: 500 %s", rt.method, target, body, rec.Body.Bytes())
		}
		if rt.pattern[0] == "mcp" {
			checkMCPReply(t, rec, body)
			return
		}
		if !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
			if strings.Join(rt.pattern, "/") == "" || rt.pattern[0] == "ui" || rt.pattern[0] == "prometheus" ||
				rt.pattern[0] == "healthz" || rt.pattern[0] == "live" {
				return // the dashboard's files, probes and metrics text
			}
			t.Fatalf("%s %s: content type %q", rt.method, target, rec.Header().Get("Content-Type"))
		}
		raw := rec.Body.Bytes()
		if !json.Valid(raw) {
			t.Fatalf("%s %s %q: invalid JSON answer %q", rt.method, target, body, raw)
		}
		var v any
		json.Unmarshal(raw, &v)
		switch doc := v.(type) {
		case []any: // /queues/summary
		case map[string]any:
			if _, ok := doc["ok"].(bool); !ok && ctx.Err() == nil {
				t.Fatalf("%s %s %q: answer without ok: %s", rt.method, target, body, raw)
			}
		default:
			t.Fatalf("%s %s %q: answer is not an object: %s", rt.method, target, body, raw)
		}
	})
}

// checkMCPReply checks an answer of /mcp (mcp_http.go): nothing, with
// 202, to notifications alone; else JSON-RPC 2.0, one object or a batch
// of them, each with a result or an error; or the route's own refusal
// ({ok:false}, for a body too large or a protocol version it does not
// speak).
func checkMCPReply(t *testing.T, rec *httptest.ResponseRecorder, body []byte) {
	t.Helper()
	raw := rec.Body.Bytes()
	if rec.Code == http.StatusAccepted && len(raw) == 0 {
		return
	}
	if !json.Valid(raw) {
		t.Fatalf("POST /mcp %q: %d, invalid JSON answer %q", body, rec.Code, raw)
	}
	var v any
	json.Unmarshal(raw, &v)
	msgs, ok := v.([]any)
	if !ok {
		msgs = []any{v}
	}
	for _, m := range msgs {
		doc, _ := m.(map[string]any)
		if doc["ok"] == false && len(msgs) == 1 && rec.Code >= 400 {
			continue
		}
		_, hasResult := doc["result"]
		_, hasError := doc["error"].(map[string]any)
		if doc["jsonrpc"] != "2.0" || hasResult == hasError {
			t.Fatalf("POST /mcp %q: %d, not a JSON-RPC answer: %s", body, rec.Code, raw)
		}
	}
}
