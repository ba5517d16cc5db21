package main

// The HTTP side: the probes load balancers ask, the reference's REST API
// (httproutes.go), live events over SSE and WebSocket (live.go),
// Prometheus metrics, backups, and the dashboard (ui.go).
//
// A REST route that the reference answers with a protocol command runs
// that command through the same command table as TCP, on a connection of
// its own that ends with the request, and answers with the command's own
// answer rendered as JSON: the two transports cannot drift apart.

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxHTTPBody bounds a request body: the protocol's frame limit, so that
// a job that can be pushed over TCP can be pushed over HTTP. (A variable
// for tests.)
var maxHTTPBody int64 = MaxFrame

// httpConfig is what the HTTP side needs besides the broker.
type httpConfig struct {
	// corsOrigins are the origins whose pages may call the API from a
	// browser; "*" is any. None: only the server's own pages (the
	// dashboard) may.
	corsOrigins []string
	// live, when set, serves /events and /ws.
	live *live
}

type httpAPI struct {
	b      *Broker
	srv    *Server
	bk     *BackupService
	live   *live
	cors   []string
	routes []route

	// ctx ends at shutdown, and with it every command an HTTP request is
	// waiting on (long-poll pulls, WaitJob).
	ctx    context.Context
	cancel context.CancelFunc
}

// route is one path pattern and method. Segments starting with ':' match
// any one segment, which is passed, unescaped, to the handler.
type route struct {
	method  string
	pattern []string
	open    bool // answered without a token: probes and the dashboard's files
	h       func(w http.ResponseWriter, r *http.Request, p []string)
}

func newHTTPHandler(b *Broker, srv *Server, bk *BackupService) http.Handler {
	return newHTTPAPI(b, srv, bk, httpConfig{})
}

func newHTTPAPI(b *Broker, srv *Server, bk *BackupService, cfg httpConfig) *httpAPI {
	a := &httpAPI{b: b, srv: srv, bk: bk, live: cfg.live, cors: cfg.corsOrigins}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.addProbeRoutes()
	a.addRESTRoutes()
	a.addUIRoutes()
	if a.live != nil {
		a.live.checkOrigin = a.originAllowed
		a.handle("GET", "/events", false, func(w http.ResponseWriter, r *http.Request, _ []string) { a.live.serveSSE(w, r, "") })
		a.handle("GET", "/events/queues/:queue", false, func(w http.ResponseWriter, r *http.Request, p []string) { a.live.serveSSE(w, r, p[0]) })
		a.handle("GET", "/ws", false, func(w http.ResponseWriter, r *http.Request, _ []string) { a.live.serveWS(w, r, "") })
		a.handle("GET", "/ws/queues/:queue", false, func(w http.ResponseWriter, r *http.Request, p []string) { a.live.serveWS(w, r, p[0]) })
	}
	return a
}

// Close ends the commands HTTP requests are waiting on.
func (a *httpAPI) Close() { a.cancel() }

func (a *httpAPI) handle(method, pattern string, open bool, h func(w http.ResponseWriter, r *http.Request, p []string)) {
	a.routes = append(a.routes, route{method: method, pattern: strings.Split(strings.Trim(pattern, "/"), "/"), open: open, h: h})
}

// match finds the first route for the path and method, in the order they
// were added (so /jobs/custom/:id wins over /jobs/:id/state, as in the
// reference). allow lists the methods of the routes the path matched.
func (a *httpAPI) match(method string, segs []string) (rt *route, params []string, allow []string) {
	if method == http.MethodHead {
		method = http.MethodGet
	}
	for i := range a.routes {
		r := &a.routes[i]
		if len(r.pattern) != len(segs) {
			continue
		}
		var ps []string
		ok := true
		for k, s := range r.pattern {
			if strings.HasPrefix(s, ":") {
				if segs[k] == "" {
					ok = false
					break
				}
				ps = append(ps, segs[k])
			} else if s != segs[k] {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		if r.method == method {
			return r, ps, nil
		}
		if !slices.Contains(allow, r.method) {
			allow = append(allow, r.method)
		}
	}
	return nil, nil, allow
}

func (a *httpAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.setCORS(w, r)
	if r.Method == http.MethodOptions {
		// A browser's preflight, before any token is shown.
		h := w.Header()
		h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS")
		h.Set("Access-Control-Allow-Headers", "Content-Type, Authorization, Last-Event-ID")
		h.Set("Access-Control-Max-Age", "86400")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	raw := strings.Split(strings.Trim(r.URL.EscapedPath(), "/"), "/")
	segs := make([]string, len(raw))
	for i, s := range raw {
		u, err := url.PathUnescape(s)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]any{"ok": false, "error": "malformed path: " + err.Error()})
			return
		}
		segs[i] = u
	}
	rt, params, allow := a.match(r.Method, segs)
	if rt == nil {
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeJSON(w, http.StatusMethodNotAllowed, map[string]any{"ok": false,
				"error": "method " + r.Method + " not allowed here; use " + strings.Join(allow, " or ")})
			return
		}
		writeJSON(w, http.StatusNotFound, map[string]any{"ok": false, "error": "Not found"})
		return
	}
	if !rt.open && !a.srv.httpAuthorized(r) {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"ok": false, "error": "Unauthorized"})
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && !a.originAllowed(r) {
		// Any page a browser has open can send a form POST here; only the
		// server's own pages and the configured origins may change state.
		writeJSON(w, http.StatusForbidden, map[string]any{"ok": false,
			"error": "cross-origin request from " + r.Header.Get("Origin") + " refused; allow the origin with --cors-origins (CORS_ALLOW_ORIGIN)"})
		return
	}
	rt.h(w, r, params)
}

// setCORS lets the configured origins read answers from a browser. With
// several origins, the one asking is named (a header listing them all is
// one browsers refuse).
func (a *httpAPI) setCORS(w http.ResponseWriter, r *http.Request) {
	if len(a.cors) == 0 {
		return
	}
	if slices.Contains(a.cors, "*") {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		return
	}
	w.Header().Add("Vary", "Origin")
	if o := r.Header.Get("Origin"); o != "" && slices.Contains(a.cors, o) {
		w.Header().Set("Access-Control-Allow-Origin", o)
	}
}

// originAllowed reports whether a request may act: no Origin (not a
// browser, or a same-origin GET), the server's own origin, or a configured
// one.
func (a *httpAPI) originAllowed(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || slices.Contains(a.cors, "*") || slices.Contains(a.cors, o) {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

// ---------------------------------------------------------------------------
// Probes, metrics, backups

func (a *httpAPI) addProbeRoutes() {
	b, srv := a.b, a.srv
	a.handle("GET", "/health", true, func(w http.ResponseWriter, r *http.Request, _ []string) {
		t := b.totals()
		st := b.storageState()
		storage := map[string]any{"driver": st.Driver, "ok": st.Err == nil, "backlog": st.Backlog}
		if st.Location != "" {
			storage["path"] = st.Location
		}
		status, code := "healthy", http.StatusOK
		if st.Err != nil {
			// Reads are still served, but new jobs are refused until writes
			// work: 503, as the reference answers, takes the server out of
			// a load balancer's rotation.
			status, code = "degraded", http.StatusServiceUnavailable
			storage["error"] = st.Err.Error()
			storage["diskFull"] = isDiskFull(st.Err)
			storage["since"] = st.Since.UnixMilli()
		}
		ws, sse := 0, 0
		if a.live != nil {
			ws, sse = a.live.hub.Counts()
		}
		resp := map[string]any{
			"ok":      st.Err == nil,
			"status":  status,
			"storage": storage,
			// The version bunqueue's own tools compare with theirs, as Hello
			// answers it; queued's own beside it.
			"version":       compatVersion,
			"queuedVersion": version,
			"uptime":        (b.now() - b.started) / 1000,
			"queues": map[string]any{
				"count":       t.Queues,
				"waiting":     t.Waiting,
				"prioritized": t.Prioritized,
				"delayed":     t.Delayed,
				"active":      t.Active,
				"completed":   t.Completed,
				"dlq":         t.DLQ,
			},
			"connections": map[string]any{"tcp": srv.nconns.Load(), "ws": ws, "sse": sse},
			"memory":      memoryMB(false),
			"workers":     b.workers.count(),
		}
		if a.live != nil {
			// Events the live subscribers did not get: they were not
			// keeping up, or the renderer was not.
			resp["events"] = map[string]any{"dropped": a.live.hub.Drops() + a.live.dropped.Load()}
		}
		if a.bk != nil {
			resp["backup"] = a.bk.health()
		}
		writeJSON(w, code, resp)
	})
	ok := func(w http.ResponseWriter, r *http.Request, _ []string) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "OK")
	}
	a.handle("GET", "/healthz", true, ok)
	a.handle("GET", "/live", true, ok)
	a.handle("GET", "/ready", true, func(w http.ResponseWriter, r *http.Request, _ []string) {
		st := b.storageState()
		if st.Err == nil {
			writeJSON(w, http.StatusOK, map[string]any{"ok": true, "ready": true})
			return
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ok": false, "ready": false,
			"storage": map[string]any{"diskFull": isDiskFull(st.Err), "error": st.Err.Error(), "since": st.Since.UnixMilli()}})
	})

	// Prometheus scrapes /metrics and /prometheus. The reference answers
	// /metrics with a small JSON object; a client that asks for JSON gets
	// that, anything else (a scraper, curl) the exposition text.
	prom := func(w http.ResponseWriter, r *http.Request, _ []string) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(srv.prometheusText())
	}
	a.handle("GET", "/prometheus", false, prom)
	a.handle("GET", "/metrics", false, func(w http.ResponseWriter, r *http.Request, p []string) {
		if !wantsJSON(r) {
			prom(w, r, p)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "metrics": map[string]any{
			"totalPushed": b.stats.pushed.Load(), "totalPulled": b.stats.pulled.Load(),
			"totalCompleted": b.stats.completed.Load(), "totalFailed": b.stats.failed.Load()}})
	})

	// A consistent copy of the live database, streamed to the caller.
	a.handle("GET", "/backup", false, func(w http.ResponseWriter, r *http.Request, _ []string) {
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
	// An S3 backup now (see backup.go).
	backupNow := a.bk.serveBackupNow(srv)
	a.handle("POST", "/backup/s3", false, func(w http.ResponseWriter, r *http.Request, _ []string) { backupNow(w, r) })
}

// wantsJSON reports whether the client asked for JSON by name.
func wantsJSON(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(strings.TrimSpace(mt), "application/json") {
				return true
			}
		}
	}
	return false
}

// memoryMB is the process's memory in MiB, rounded, under the names the
// reference reports Node's figures with: heapUsed and heapTotal are Go's
// heap in use and reserved, rss the resident set.
func memoryMB(extra bool) map[string]any {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, ok := residentBytes()
	if !ok {
		rss = int64(ms.Sys)
	}
	mb := func(n uint64) int64 { return int64((n + 512<<10) >> 20) }
	m := map[string]any{"heapUsed": mb(ms.HeapAlloc), "heapTotal": mb(ms.HeapSys), "rss": mb(uint64(rss))}
	if extra {
		// Node's external and arrayBuffers have no Go counterpart: memory
		// outside the heap is the runtime's own (stacks, metadata).
		m["external"] = mb(ms.StackSys + ms.MSpanSys + ms.MCacheSys + ms.OtherSys)
		m["arrayBuffers"] = 0
	}
	return m
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
	b, err := jsonMarshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"ok":false,"error":"Internal server error"}`)
	}
	writeJSONBytes(w, code, b)
}

func writeJSONBytes(w http.ResponseWriter, code int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

func newHTTPServer(addr string, h http.Handler) *http.Server {
	// No WriteTimeout: event streams and long polls last as long as they
	// need; each write of theirs has its own deadline.
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, MaxHeaderBytes: 64 << 10}
}
