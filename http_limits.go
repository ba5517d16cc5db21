package main

// What bounds the HTTP side's answers and connections, as answers.go and
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
