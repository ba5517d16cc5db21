package main

// The HTTP side: the probes load balancers ask, the reference's REST API
// (http_routes.go), live events over SSE and WebSocket (live.go),
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
	"net/netip"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
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
	// allowedHosts are the names browsers may reach the server by when
	// there are no tokens, besides those hostAllowed always takes
	// (--allowed-hosts); listenHost is --host.
	allowedHosts []string
	listenHost   string
	// dataPath is the SQLite file: GET /backup makes its copies beside
	// it (backup_download.go) with dataFile, the SQLite store (nil in
	// memory and PostgreSQL mode).
	dataPath string
	dataFile fileCopier
	// live, when set, serves /events and /ws.
	live *live
	// metricsOpen leaves GET /prometheus open when tokens are set
	// (--metrics-auth=false).
	metricsOpen bool
	// mcpMaxAnswer caps one answer of /mcp (--mcp-max-answer-bytes).
	mcpMaxAnswer int64
}

type httpAPI struct {
	b      *Broker
	srv    *Server
	bk     *BackupService
	live   *live
	cors   []string
	routes []route

	// hosts are the names and domains (".example.com") hostAllowed takes
	// besides loopback names and IP addresses; anyHost turns the check off.
	hosts   []string
	anyHost bool

	dataPath   string
	dataFile   fileCopier
	backupBusy atomic.Bool // one GET /backup at a time

	// metricsOpen: GET /prometheus needs no token (--metrics-auth=false).
	metricsOpen bool

	// ctx ends at shutdown, and with it every command an HTTP request is
	// waiting on (long-poll pulls, WaitJob).
	ctx    context.Context
	cancel context.CancelFunc
}

// route is one path pattern and method. Segments starting with ':' match
// any one segment, which is passed, unescaped, to the handler. The method
// anyMethod matches every method: the probes, which the reference answers
// whatever the method (a load balancer's health check may be set to POST
// or HEAD).
type route struct {
	method  string
	pattern []string
	open    bool // answered without a token: probes and the dashboard's files
	stream  bool // routeStream
	// effects: the route changes something (every method but GET, and the
	// GETs marked routeEffects), so a page of another origin may not call
	// it (originAllowed), whatever its method.
	effects bool
	h       func(w http.ResponseWriter, r *http.Request, p []string)
}

// routeFlags say how a route is guarded.
type routeFlags uint8

const (
	routeOpen    routeFlags = 1 << iota // no token needed
	routeEffects                        // a GET that changes something
	// routeStream: the route writes for as long as it lasts, with its
	// own deadlines (event streams, WebSockets, the backup download);
	// the others answer within httpWriteTimeout.
	routeStream
)

// anyMethod is the method of a route that answers every method.
const anyMethod = "*"

func newHTTPAPI(b *Broker, srv *Server, bk *BackupService, cfg httpConfig) *httpAPI {
	a := &httpAPI{b: b, srv: srv, bk: bk, live: cfg.live, cors: cfg.corsOrigins, dataPath: cfg.dataPath, dataFile: cfg.dataFile, metricsOpen: cfg.metricsOpen}
	a.setHosts(cfg)
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.addProbeRoutes()
	a.addRESTRoutes()
	a.addUIRoutes()
	a.addMCPRoutes(cfg.mcpMaxAnswer)
	if a.live != nil {
		// The hub checks the handshake's origin too; the route table's
		// check comes first and is the same one.
		a.live.checkOrigin = a.originAllowed
		a.handle("GET", "/events", routeStream, func(w http.ResponseWriter, r *http.Request, _ []string) { a.live.serveSSE(w, r, "") })
		a.handle("GET", "/events/queues/:queue", routeStream, func(w http.ResponseWriter, r *http.Request, p []string) { a.live.serveSSE(w, r, p[0]) })
		// A WebSocket carries commands: it has effects.
		a.handle("GET", "/ws", routeEffects|routeStream, func(w http.ResponseWriter, r *http.Request, _ []string) { a.live.serveWS(w, r, "") })
		a.handle("GET", "/ws/queues/:queue", routeEffects|routeStream, func(w http.ResponseWriter, r *http.Request, p []string) { a.live.serveWS(w, r, p[0]) })
	}
	return a
}

// Close ends the commands HTTP requests are waiting on.
func (a *httpAPI) Close() { a.cancel() }

func (a *httpAPI) handle(method, pattern string, f routeFlags, h func(w http.ResponseWriter, r *http.Request, p []string)) {
	// A probe answering any method reads and changes nothing, whatever
	// the method.
	reads := method == http.MethodGet || method == anyMethod
	a.routes = append(a.routes, route{method: method, pattern: strings.Split(strings.Trim(pattern, "/"), "/"),
		open: f&routeOpen != 0, effects: !reads || f&routeEffects != 0, stream: f&routeStream != 0, h: h})
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
		if r.method == method || r.method == anyMethod {
			return r, ps, nil
		}
		if !slices.Contains(allow, r.method) {
			allow = append(allow, r.method)
		}
	}
	return nil, nil, allow
}

func (a *httpAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.srv.frames.Add(1) // a request, as memReturn counts them
	procsRequest()
	a.setCORS(w, r)
	if !a.srv.authRequired() && fromBrowser(r) && !a.originConfigured(r.Header.Get("Origin")) && !a.hostAllowed(r.Host) {
		writeJSON(w, http.StatusForbidden, map[string]any{"ok": false, "error": a.hostRefusal(r.Host)})
		return
	}
	if r.Method == http.MethodOptions {
		preflight(w) // a browser's, before any token is shown
		return
	}
	raw := strings.Split(strings.Trim(r.URL.EscapedPath(), "/"), "/")
	// Checked once: the limiter counts requests with a valid token apart
	// from those without (see reqlimit.go), and the routes below need it.
	authorized := a.srv.httpAuthorized(r)
	if !a.withinLimit(w, r, raw[0], authorized) {
		return
	}
	segs, err := unescapeSegments(raw)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"ok": false, "error": "malformed path: " + err.Error()})
		return
	}
	rt, params, allow := a.match(r.Method, segs)
	if rt == nil && !authorized {
		// With tokens, a caller without one learns nothing of the routes,
		// as in the reference, which checks the token before it routes.
		a.srv.b.announce(newNote("auth:failed").str("transport", "http"))
		writeJSON(w, http.StatusUnauthorized, map[string]any{"ok": false, "error": "Unauthorized"})
		return
	}
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
	if !rt.open && !authorized {
		a.srv.b.announce(newNote("auth:failed").str("transport", "http"))
		writeJSON(w, http.StatusUnauthorized, map[string]any{"ok": false, "error": "Unauthorized"})
		return
	}
	if rt.effects && !a.originAllowed(r) {
		// Any page a browser has open can send a form POST here, or load
		// an image from a GET route; only the server's own pages and the
		// configured origins may change state.
		writeJSON(w, http.StatusForbidden, map[string]any{"ok": false, "error": originRefusal(r)})
		return
	}
	if !rt.stream {
		// A client that does not read its answer lets go of it after
		// httpWriteTimeout. The deadline stays on the connection, which
		// may carry a stream next: it is cleared after.
		rc := http.NewResponseController(w)
		rc.SetWriteDeadline(time.Now().Add(httpWriteTimeout))
		defer rc.SetWriteDeadline(time.Time{})
		// At shutdown an answer stuck on a client that does not read
		// gives up at once, so that the server's Shutdown does not wait
		// out its deadline.
		defer context.AfterFunc(a.ctx, func() { rc.SetWriteDeadline(time.Now()) })()
		ra := &restAnswer{ResponseWriter: w, budget: a.srv.answers}
		defer ra.done()
		w = ra
		r = r.WithContext(context.WithValue(r.Context(), restAnswerKey{}, ra))
	}
	rt.h(w, r, params)
}

// preflight answers a browser's CORS preflight (OPTIONS).
func preflight(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS")
	h.Set("Access-Control-Allow-Headers", "Content-Type, Authorization, Last-Event-ID")
	h.Set("Access-Control-Max-Age", "86400")
	w.WriteHeader(http.StatusNoContent)
}

// withinLimit counts the request against the request limiter (not the
// routes it exempts, first the path's first segment) and, past the
// limit, answers 429 and announces it: false.
func (a *httpAPI) withinLimit(w http.ResponseWriter, r *http.Request, first string, authorized bool) bool {
	l := a.srv.reqLimit
	if l == nil || limitExempt[first] {
		return true
	}
	client, ok := l.allowHTTP(r, authorized)
	if !ok {
		a.srv.b.announce(newNote("ratelimit:hit").str("clientId", clientName(client)))
		writeJSON(w, http.StatusTooManyRequests, map[string]any{"ok": false, "error": "Rate limit exceeded"})
	}
	return ok
}

// unescapeSegments reads a path's segments, each %-unescaped.
func unescapeSegments(raw []string) ([]string, error) {
	segs := make([]string, len(raw))
	for i, s := range raw {
		u, err := url.PathUnescape(s)
		if err != nil {
			return nil, err
		}
		segs[i] = u
	}
	return segs, nil
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

// ---------------------------------------------------------------------------
// Browsers: who may act, and by which host name
//
// A page a browser has open can send requests to any address, the
// server's included: a form POST, an image whose src is a GET route, a
// WebSocket. Two guards keep such pages out:
//
//   - Origin. A route with effects (every method but GET, and the GETs
//     marked routeEffects: a pull, a backup, a WebSocket) answers a
//     browser only when the page asking is the server's own or one of
//     --cors-origins. The page is known by its Origin header; a browser
//     leaves Origin out of a plain GET (an image, a link), and then
//     Sec-Fetch-Site says where the request comes from (same-origin, or
//     none for an address typed by the user, are fine; same-site and
//     cross-site are not), and for browsers older than Sec-Fetch-Site,
//     the Referer does.
//
//   - Host, without tokens. DNS rebinding makes a page of evil.example
//     the server's own origin: its name is pointed at the server's
//     address once the page has loaded, so its requests carry
//     Origin: http://evil.example:6790 and Host: evil.example:6790, and
//     the origin check passes. So, when the server has no tokens, a
//     browser's request is answered only when its Host is a loopback name
//     (localhost, *.localhost), an IP address, the --host name, the host of
//     a --cors-origins origin, or a name of --allowed-hosts. A request from
//     a --cors-origins page is a cross-origin one, not a rebound one, and
//     is not held to the list. With tokens the check is not needed: the
//     rebound page has no token.
//
// A request is a browser's when it carries any header browsers add and
// pages cannot remove: Origin, Sec-Fetch-* (every current browser sends
// them), a Referer, or a User-Agent starting with "Mozilla/" (every
// browser's). curl, scripts and client libraries send none of these, so
// they may use any name the server answers to; a browser that reaches the
// dashboard by a name not on the list gets a 403 naming --allowed-hosts.

// fromBrowser reports whether a request carries a browser's headers.
func fromBrowser(r *http.Request) bool {
	h := r.Header
	for _, k := range []string{"Origin", "Sec-Fetch-Site", "Sec-Fetch-Mode", "Sec-Fetch-Dest", "Referer"} {
		if h.Get(k) != "" {
			return true
		}
	}
	return strings.HasPrefix(h.Get("User-Agent"), "Mozilla/")
}

// originConfigured reports whether an origin is one of --cors-origins.
func (a *httpAPI) originConfigured(o string) bool {
	return o != "" && o != "null" && (slices.Contains(a.cors, "*") || slices.Contains(a.cors, o))
}

// sameOrigin reports whether an origin (or a Referer) names the host the
// request was sent to.
func sameOrigin(o string, r *http.Request) bool {
	u, err := url.Parse(o)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

// originAllowed reports whether a request may use a route with effects:
// see the comment above.
func (a *httpAPI) originAllowed(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" {
		// "null" (a sandboxed frame, a file: page) is never allowed.
		return a.originConfigured(o) || (o != "null" && sameOrigin(o, r))
	}
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none":
		return true
	case "":
	default: // same-site, cross-site: an image or a link of another page
		return false
	}
	if ref := r.Header.Get("Referer"); ref != "" {
		u, err := url.Parse(ref)
		if err != nil {
			return false
		}
		return a.originConfigured(u.Scheme+"://"+u.Host) || sameOrigin(ref, r)
	}
	return true
}

// originRefusal says why originAllowed refused a request.
func originRefusal(r *http.Request) string {
	from := r.Header.Get("Origin")
	if from == "" {
		if s := r.Header.Get("Sec-Fetch-Site"); s != "" {
			from = "a " + s + " page (Sec-Fetch-Site: " + s + ")"
		} else {
			from = "the page " + r.Header.Get("Referer")
		}
	}
	return "cross-origin request from " + from + " refused: this route changes state; allow the origin with --cors-origins (CORS_ALLOW_ORIGIN)"
}

// setHosts makes the host list from the configuration.
func (a *httpAPI) setHosts(cfg httpConfig) {
	add := func(h string) {
		h = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
		if h == "*" {
			a.anyHost = true
		} else if h != "" && h != "." && !slices.Contains(a.hosts, h) {
			a.hosts = append(a.hosts, h)
		}
	}
	for _, h := range cfg.allowedHosts {
		add(h)
	}
	add(cfg.listenHost)
	for _, o := range cfg.corsOrigins {
		if u, err := url.Parse(o); err == nil && u.Hostname() != "" {
			add(u.Hostname())
		}
	}
}

// hostName is the name of a Host header without its port, lower-case.
func hostName(host string) string {
	h := host
	if strings.HasPrefix(h, "[") {
		if i := strings.IndexByte(h, ']'); i > 0 {
			h = h[1:i]
		}
	} else if strings.Count(h, ":") == 1 {
		h, _, _ = strings.Cut(h, ":")
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// hostAllowed reports whether a browser may reach the server by this Host
// header: see the comment above.
func (a *httpAPI) hostAllowed(host string) bool {
	if host == "" || a.anyHost {
		// No Host: HTTP/1.0, never a browser's.
		return true
	}
	h := hostName(host)
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	for _, e := range a.hosts {
		if h == e || strings.HasPrefix(e, ".") && (h == e[1:] || strings.HasSuffix(h, e)) {
			return true
		}
	}
	return false
}

func (a *httpAPI) hostRefusal(host string) string {
	h := hostName(host)
	return "host " + strconv.Quote(h) + " is not allowed: without --auth-tokens, browsers may reach this server only by " +
		"a loopback name, an IP address, the --host name, a --cors-origins host or a name of --allowed-hosts " +
		"(QUEUED_ALLOWED_HOSTS); to reach it by this name, add " + h + " to --allowed-hosts"
}

// ---------------------------------------------------------------------------
// Probes, metrics, backups

func (a *httpAPI) addProbeRoutes() {
	b, srv := a.b, a.srv
	a.handle(anyMethod, "/health", routeOpen, a.serveHealth)
	ok := func(w http.ResponseWriter, r *http.Request, _ []string) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "OK")
	}
	a.handle(anyMethod, "/healthz", routeOpen, ok)
	a.handle(anyMethod, "/live", routeOpen, ok)
	a.handle(anyMethod, "/ready", routeOpen, func(w http.ResponseWriter, r *http.Request, _ []string) {
		st := b.storageState()
		if st.Err == nil {
			writeJSON(w, http.StatusOK, map[string]any{"ok": true, "ready": true})
			return
		}
		// The error's text (a path, a database host) is for those with
		// the token, as in /health.
		msg := storageErrorSummary(st.Err)
		if srv.httpAuthorized(r) {
			msg = st.Err.Error()
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ok": false, "ready": false,
			"storage": map[string]any{"diskFull": isDiskFull(st.Err), "error": msg, "since": st.Since.UnixMilli()}})
	})

	// Prometheus scrapes /prometheus, as it scrapes the reference. With
	// tokens it needs one unless --metrics-auth=false, which leaves it
	// open as the reference does by default: a bunqueue deployment's
	// scraper may have no token.
	var promFlags routeFlags
	if a.metricsOpen {
		promFlags = routeOpen
	}
	a.handle("GET", "/prometheus", promFlags, func(w http.ResponseWriter, r *http.Request, _ []string) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(srv.prometheusText(r.Context()))
	})
	// /metrics is the reference's small JSON object, whatever the client
	// accepts: clients written for the reference read it.
	a.handle("GET", "/metrics", 0, func(w http.ResponseWriter, r *http.Request, _ []string) {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "metrics": map[string]any{
			"totalPushed": b.stats.pushed.Load(), "totalPulled": b.stats.pulled.Load(),
			"totalCompleted": b.stats.completed.Load(), "totalFailed": b.stats.failed.Load()}})
	})

	// A consistent copy of the live database, streamed to the caller
	// (backup_download.go): a copy on disk, so a route with effects.
	a.handle("GET", "/backup", routeEffects|routeStream, a.serveBackupDownload)
	// An S3 backup now (see backup.go).
	backupNow := a.bk.serveBackupNow(srv)
	a.handle("POST", "/backup/s3", 0, func(w http.ResponseWriter, r *http.Request, _ []string) { backupNow(w, r) })
}

// serveHealth is GET /health, open to all. Who may see what:
//
//   - With tokens, a request without a valid one learns only whether the
//     server is up: {ok, status}, and the status code (200, or 503 while
//     storage is degraded). That is all a load balancer or the official
//     CLI's healthcheck reads.
//   - With a valid token, or when the server has no tokens (then every
//     route is open, the data itself included), the whole document: the
//     reference's fields, which the official CLI's doctor reads (version,
//     uptime, queues, connections, memory), and queued's details (storage
//     driver, file or schema, the storage error's text, workers, dropped
//     live events, the S3 backups' bucket and last error).
func (a *httpAPI) serveHealth(w http.ResponseWriter, r *http.Request, _ []string) {
	b, srv := a.b, a.srv
	st := b.storageState()
	status, code := "healthy", http.StatusOK
	if st.Err != nil {
		// Reads are still served, but new jobs are refused until writes
		// work: 503, as the reference answers, takes the server out of
		// a load balancer's rotation.
		status, code = "degraded", http.StatusServiceUnavailable
	}
	if !srv.httpAuthorized(r) {
		writeJSON(w, code, map[string]any{"ok": st.Err == nil, "status": status})
		return
	}
	storage := map[string]any{"driver": st.Driver, "ok": st.Err == nil, "backlog": st.Backlog}
	if st.Location != "" {
		storage["path"] = st.Location
	}
	if st.Err != nil {
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
		// version is the one the official CLI's doctor compares with its
		// own, and counts as an issue when they differ: the bunqueue
		// version queued answers for, as Hello does. queued's own
		// version is queuedVersion; bunqueueVersion names the first
		// for readers of this document.
		"version":         compatVersion,
		"queuedVersion":   version,
		"bunqueueVersion": compatVersion,
		"protocolVersion": protocolVersion,
		"uptime":          (b.now() - b.started) / 1000,
		"queues":          a.healthQueues(r),
		"connections":     map[string]any{"tcp": srv.nconns.Load(), "ws": ws, "sse": sse},
		"memory":          memoryMB(false),
		"workers":         b.workers.count(),
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
}

// healthQueues is /health's job figures, the engine's (the database's in
// PostgreSQL mode, as /stats). A probe must answer while the database
// does not, and soon: the figures wait at most healthFiguresTimeout, and
// without them queues says why instead.
func (a *httpAPI) healthQueues(r *http.Request) map[string]any {
	ctx, cancel := context.WithTimeout(r.Context(), healthFiguresTimeout)
	defer cancel()
	t, err := a.srv.eng.Totals(ctx)
	if err != nil {
		return map[string]any{"error": "job figures unavailable: " + err.Error()}
	}
	return map[string]any{
		"count":       t.Queues,
		"waiting":     t.Waiting,
		"prioritized": t.Prioritized,
		"delayed":     t.Delayed,
		"active":      t.Active,
		"completed":   t.Completed,
		"dlq":         t.DLQ,
	}
}

// healthFiguresTimeout bounds the database's share of a /health answer:
// well under the few seconds a load balancer's check waits.
const healthFiguresTimeout = 2 * time.Second

// storageErrorSummary is what an unauthenticated caller learns of a
// storage error: its kind, not its text.
func storageErrorSummary(err error) string {
	if isDiskFull(err) {
		return "disk full"
	}
	return "storage writes are failing"
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

// httpAuthorized checks the token when tokens are configured: sent as
// "Authorization: Bearer <token>", or, as the reference also takes it,
// the bare token (which is no weaker: the token itself must match).
func (s *Server) httpAuthorized(r *http.Request) bool {
	if !s.authRequired() {
		return true
	}
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		tok = h
	}
	return tok != "" && s.checkToken(tok)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := jsonMarshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"ok":false,"error":"Internal server error"}`)
	}
	writeJSONBytes(w, code, b)
}

func newHTTPServer(addr string, h http.Handler) *http.Server {
	// No WriteTimeout: event streams and long polls last as long as they
	// need; each write of theirs has its own deadline.
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, MaxHeaderBytes: 64 << 10}
}
