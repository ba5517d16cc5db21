package main

// The HTTP side: for now the health endpoint that load balancers and
// operators probe.

import (
	"encoding/json"
	"net/http"
	"time"
)

func newHTTPHandler(b *Broker, srv *Server) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		t := b.totals()
		writeJSON(w, http.StatusOK, map[string]any{
			"ok":      true,
			"status":  "healthy",
			"version": version,
			"uptime":  (b.now() - b.started) / 1000,
			"queues": map[string]any{
				"count":       t.Queues,
				"waiting":     t.Waiting,
				"prioritized": t.Prioritized,
				"delayed":     t.Delayed,
				"active":      t.Active,
				"completed":   t.Completed,
				"dlq":         t.DLQ,
			},
			"connections": srv.nconns.Load(),
			"workers":     b.workers.count(),
		})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func newHTTPServer(addr string, h http.Handler) *http.Server {
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, MaxHeaderBytes: 64 << 10}
}
