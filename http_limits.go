package main

// What bounds the HTTP side's answers and connections, as answer_budget.go and
// Server.Serve bound the TCP side's: a REST answer counts in the answer
// budget while it is written and has a deadline to be read by (event
// streams and WebSockets keep their own rules), and the HTTP port holds a
// bounded number of connections.

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// httpWriteTimeout is how long a client has to read a REST answer.
const httpWriteTimeout = 30 * time.Second

// defaultMaxHTTPConns derives the HTTP port's connection bound from the
// TCP port's: a quarter of it, at least 64 and at most 4,096 (WebSocket
// and event-stream clients, up to liveMaxClients each, count in it).
func defaultMaxHTTPConns(maxTCP int) int {
	return min(max(maxTCP/4, 64), 4096)
}

// restAnswer is the ResponseWriter REST routes write through: what
// writeJSONBytes writes counts in the server's answer budget until it is
// written, within httpWriteTimeout.
type restAnswer struct {
	http.ResponseWriter
	budget *answerBudget
	// reserved is the room the command answered reserved (exec), given
	// back once the answer is written.
	reserved int64
}

type restAnswerKey struct{}

// restAnswerOf is the writer of r's answer, for exec to leave the
// answer's reservation with.
func restAnswerOf(r *http.Request) *restAnswer {
	ra, _ := r.Context().Value(restAnswerKey{}).(*restAnswer)
	return ra
}

// done gives back what the answer still holds.
func (w *restAnswer) done() {
	w.budget.free(w.reserved)
	w.reserved = 0
}

// Unwrap lets http.ResponseController reach the connection (flushes,
// deadlines, the WebSocket's hijack).
func (w *restAnswer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func writeJSONBytes(w http.ResponseWriter, code int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	if hw, ok := w.(*restAnswer); ok {
		// A long poll may have waited any time: the deadline starts now.
		http.NewResponseController(w).SetWriteDeadline(time.Now().Add(httpWriteTimeout))
		n := int64(len(b) + 1)
		hw.budget.hold(n)
		defer hw.budget.free(n)
		defer hw.done()
	}
	if cap(b) > len(b) {
		w.Write(append(b, '\n'))
		return
	}
	// Not append's copy of a big answer for one byte.
	w.Write(b)
	w.Write([]byte{'\n'})
}

// dropJSON is the sink of a measure: the pieces are counted, not kept.
func dropJSON([]byte) error { return nil }

// jsonPieces are the buffers answers are rendered in (writeJSONWith).
var jsonPieces = sync.Pool{New: func() any { b := make([]byte, 0, 2*jsonPiece); return &b }}

// writeJSONWith answers with the JSON object render writes (its members;
// the braces are writeJSONWith's). A small answer is rendered once, in
// memory, and sent with its length. A larger one is never held whole,
// whatever its data (binary data is an array of numbers in JSON, four
// times its bytes): a first pass measures it, rendering into a piece that
// is emptied as it fills; an answer over the protocol's frame limit is
// refused, naming it; and a second pass renders it straight to the client
// a piece at a time, its write registered with the answer budget (a client
// that does not read it is closed while others wait for room). What the
// answer is made from (the command's answer) is held, and counted, until
// the request ends. render must write the same bytes both times: it
// renders values read before, nothing read anew.
func writeJSONWith(w http.ResponseWriter, code int, render func(o *jsonObj)) {
	buf := jsonPieces.Get().(*[]byte)
	// Rendered in memory until a piece is full; from then on, measured.
	o := jsonObj{jsonOut: jsonOut{b: (*buf)[:0], sink: dropJSON, measureOnSpill: true}}
	o.open()
	render(&o)
	o.b = append(o.b, '}')
	defer func() {
		if cap(o.b) <= 4*jsonPiece {
			*buf = o.b[:0]
			jsonPieces.Put(buf)
		}
	}()
	if o.sent == 0 {
		writeJSONBytes(w, code, o.b)
		return
	}
	size := o.size()
	if size > MaxFrame {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false,
			"error": errAnswerTooBig("the answer, as JSON,").Error()})
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.FormatInt(size+1, 10))
	w.WriteHeader(code)
	rc := http.NewResponseController(w)
	rc.SetWriteDeadline(time.Now().Add(httpWriteTimeout))
	var writer *answerWriter
	if hw, ok := w.(*restAnswer); ok {
		defer hw.done()
		writer = hw.budget.writing(func() { rc.SetWriteDeadline(time.Now()) })
		defer hw.budget.done(writer)
		held := int64(cap(o.b))
		hw.budget.hold(held)
		defer hw.budget.free(held)
	}
	o = jsonObj{jsonOut: jsonOut{b: o.b[:0], sink: func(p []byte) error {
		_, err := w.Write(p)
		writer.progress()
		return err
	}}}
	o.open()
	render(&o)
	o.b = append(o.b, '}', '\n')
	o.flush()
}

// httpRefusal answers a connection past the HTTP port's bound with 503 and
// why, over TLS when the port has it.
func httpRefusal(max int, tc *tls.Config) func(nc net.Conn) {
	body := fmt.Sprintf(`{"ok":false,"error":"Too many HTTP connections: the server holds at most %d (--max-http-connections); try again later"}`, max)
	msg := []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	return func(nc net.Conn) {
		if tc != nil {
			nc = tls.Server(nc, tc)
		}
		nc.Write(msg)
		if tc != nil {
			nc.Close()
		}
	}
}
