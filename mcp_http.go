package main

// MCP served by the server itself, at /mcp, in the Streamable HTTP
// transport: a POST carries one JSON-RPC message and is answered with one
// JSON document (requests) or 202 (notifications). The transport is
// stateless: nothing is kept between requests (a session's only state,
// its negotiated version, is the client's to send in MCP-Protocol-Version),
// so any broker of a PostgreSQL namespace can answer any request. Behind
// the HTTP API's guards: its bearer token, its browser origin checks, its
// rate limit. The tools run their commands through the same dispatch as a
// TCP connection (a virtual connection per command).

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// addMCPRoutes serves /mcp. GET (a stream for messages the server starts)
// and DELETE (ending a session) are refused with 405, as the transport
// allows a server with neither. maxAnswer caps an answer
// (--mcp-max-answer-bytes; 0: the default).
//
// What a tool reads stays counted in the server's answer budget until its
// answer is built (localSendHeld), and the answer until it is written: a
// client that does not read its answers holds its share of the budget
// like any other, and no unaccounted copy of a big wire answer is made.
func (a *httpAPI) addMCPRoutes(maxAnswer int64) {
	srv := newMCPServerHeld(a.srv.localSendHeld, a.srv.log)
	if maxAnswer > 0 {
		srv.maxAnswer = maxAnswer
	}
	srv.answers = a.srv.answers
	a.handle("POST", "/mcp", 0, func(w http.ResponseWriter, r *http.Request, _ []string) { a.serveMCP(srv, w, r) })
}

func (a *httpAPI) serveMCP(srv *mcpServer, w http.ResponseWriter, r *http.Request) {
	if v := r.Header.Get("MCP-Protocol-Version"); v != "" && !slices.Contains(mcpVersions, v) {
		writeJSON(w, http.StatusBadRequest, map[string]any{"ok": false,
			"error": "unsupported MCP-Protocol-Version " + strconv.Quote(v)})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, mcpMaxMessage))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]any{"ok": false,
				"error": "an MCP message is limited to " + strconv.Itoa(mcpMaxMessage) + " bytes"})
			return
		}
		writeJSON(w, http.StatusBadRequest, map[string]any{"ok": false, "error": "reading the request body: " + err.Error()})
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(a.ctx, cancel)()
	ans, malformed := srv.session().handle(ctx, body)
	if ans == nil {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	// Held in the budget by handle, until written (or given up).
	defer srv.answers.free(int64(len(ans)))
	// A tool may have waited (wait_for_job, a pull): the write's deadline,
	// set when the request came, starts now.
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(httpWriteTimeout))
	w.Header().Set("Content-Type", "application/json")
	if malformed {
		w.WriteHeader(http.StatusBadRequest)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	w.Write(ans)
}
