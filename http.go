package main

// The HTTP side: the health endpoint that load balancers and operators
// probe, Prometheus metrics, and backups.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func newHTTPHandler(b *Broker, srv *Server, bk *BackupService) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		t := b.totals()
		st := b.storageState()
		storage := map[string]any{"driver": st.Driver, "ok": st.Err == nil, "backlog": st.Backlog}
		if st.Location != "" {
			storage["path"] = st.Location
		}
		status, code := "healthy", http.StatusOK
		if st.Err != nil {
			// Reads are still served; new jobs are refused until writes work.
			status = "degraded"
			storage["error"] = st.Err.Error()
			storage["diskFull"] = isDiskFull(st.Err)
			storage["since"] = st.Since.UnixMilli()
		}
		resp := map[string]any{
			"ok":      st.Err == nil,
			"status":  status,
			"storage": storage,
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
		}
		if bk != nil {
			resp["backup"] = bk.health()
		}
		writeJSON(w, code, resp)
	})
	// An S3 backup now (see backup.go).
	mux.HandleFunc("POST /backup/s3", bk.serveBackupNow(srv))
	// Prometheus scrapes; under the same bearer token as the protocol
	// when tokens are set, since the text names every queue.
	metrics := func(w http.ResponseWriter, r *http.Request) {
		if !srv.httpAuthorized(r) {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"ok": false, "error": "missing or invalid bearer token"})
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(srv.prometheusText())
	}
	mux.HandleFunc("GET /metrics", metrics)
	mux.HandleFunc("GET /prometheus", metrics)
	// A consistent copy of the live database, streamed to the caller.
	mux.HandleFunc("GET /backup", func(w http.ResponseWriter, r *http.Request) {
		if !srv.httpAuthorized(r) {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"ok": false, "error": "missing or invalid bearer token"})
			return
		}
		bk, ok := b.store.(interface {
			Backup(ctx context.Context, dst string) error
		})
		if !ok {
			writeJSON(w, http.StatusConflict, map[string]any{"ok": false, "error": "backup needs SQLite storage; this server keeps its data in memory"})
			return
		}
		dir, err := os.MkdirTemp("", "queued-backup")
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false, "error": err.Error()})
			return
		}
		defer os.RemoveAll(dir)
		tmp := filepath.Join(dir, "backup.db")
		if err := bk.Backup(r.Context(), tmp); err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false, "error": err.Error()})
			return
		}
		f, err := os.Open(tmp)
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false, "error": err.Error()})
			return
		}
		defer f.Close()
		fi, _ := f.Stat()
		w.Header().Set("Content-Type", "application/vnd.sqlite3")
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		w.Header().Set("Content-Disposition", `attachment; filename="queued-backup.db"`)
		io.Copy(w, f)
	})
	return mux
}

// httpAuthorized checks the bearer token when tokens are configured.
func (s *Server) httpAuthorized(r *http.Request) bool {
	if !s.authRequired() {
		return true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && s.checkToken(tok)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func newHTTPServer(addr string, h http.Handler) *http.Server {
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, MaxHeaderBytes: 64 << 10}
}
