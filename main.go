// queued is a job queue server that speaks the bunqueue wire protocol.
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `Usage: queued [serve] [server flags]

Runs the server (serve is the default command; start is the same). The
other commands: queued help.

Server flags (each also read from the environment variable in brackets):
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return serve(args, stdout, stderr)
	}
	if f, ok := toolCommands[args[0]]; ok {
		return f(args[1:], stdout, stderr)
	}
	return cliMain(args, stdout, stderr)
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "json":
		// One JSON object a line, for log pipelines (the reference's
		// LOG_FORMAT=json); the journal's priority prefix would break it.
		// A duration is written as the text log writes it ("30s"), not
		// as a count of nanoseconds.
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "", "text":
	default:
		return nil, fmt.Errorf("log format %q: want text or json", format)
	}
	if toJournal(w) {
		opts = journalOptions(opts)
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

func serve(args []string, stdout, stderr io.Writer) int {
	fs, c := serverFlags(stdout)
	// A mistake gets its error and a pointer to the flags, not the whole
	// list of them after it.
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fs.Usage()
			return 0
		}
		fmt.Fprintf(stderr, "queued: %v\nThe server's flags: queued help serve\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "queued: unexpected argument %q\nThe server's flags: queued help serve; the commands: queued help\n", fs.Arg(0))
		return 2
	}
	if err := checkFlagEnv(fs); err != nil {
		fmt.Fprintf(stderr, "queued: %v\nThe server's flags: queued help serve\n", err)
		return 2
	}
	if c.httpPort <= 0 {
		// 0 and -1 both turn the HTTP port off (runServer listens on
		// any port >= 0, 0 choosing a free one, which tests use).
		c.httpPort = -1
	}
	// Only --data-path on the command line contradicts a PostgreSQL URL. A
	// data path from the environment is SQLite mode's default, and a URL
	// (flag or environment) overrides it: so queued.service can give
	// DATA_PATH a default and its env file still choose PostgreSQL.
	fs.Visit(func(f *flag.Flag) { c.explicitDB = c.explicitDB || f.Name == "data-path" })
	if c.pgURL == "" && strings.EqualFold(envOr([]string{"BUNQUEUE_STORAGE_DRIVER"}, ""), "postgres") {
		fmt.Fprintln(stderr, "queued: BUNQUEUE_STORAGE_DRIVER=postgres needs a URL: --postgres-url, BUNQUEUE_POSTGRES_URL or DATABASE_URL")
		return 2
	}
	if c.pgURL != "" && (c.explicitDB || c.memory) {
		fmt.Fprintln(stderr, "queued: choose one storage: a PostgreSQL URL and a SQLite data path (or --memory) were both given")
		return 2
	}
	log, err := newLogger(stderr, c.logLevel, c.logFormat)
	if err != nil {
		fmt.Fprintln(stderr, "queued:", err)
		return 2
	}
	if p := envOr(dataPathEnv, ""); c.pgURL != "" && p != "" {
		log.Info("PostgreSQL mode: the SQLite data path from the environment is not used", "data_path", p)
	}
	if err := checkServeFlags(c); err != nil {
		fmt.Fprintln(stderr, "queued:", err)
		return 2
	}
	stopProfiles, err := startProfiles()
	if err != nil {
		fmt.Fprintln(stderr, "queued:", err)
		return 2
	}
	defer stopProfiles()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// The process's, not a server's: servers a test runs in its own
	// process share one runtime.
	lv := procsLocal
	if c.pgURL != "" {
		lv = procsPG
	}
	procs := startProcsTuner(log, lv)
	defer procs.Close()
	if c.memory { // a PostgreSQL URL with --memory was refused above
		startGCPace()
	}
	if err := runServer(ctx, c, log, nil); err != nil {
		log.Error("server stopped", "err", err)
		return 1
	}
	return 0
}

// startProfiles starts the profiles a developer asked for in the
// environment (QUEUED_CPUPROFILE, QUEUED_TRACE, QUEUED_MEMPROFILE: the
// whole run, written at shutdown); stop writes them.
func startProfiles() (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if path := os.Getenv("QUEUED_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return stop, fmt.Errorf("QUEUED_CPUPROFILE: %w", err)
		}
		pprof.StartCPUProfile(f)
		stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
	}
	if path := os.Getenv("QUEUED_TRACE"); path != "" {
		// The execution trace (go tool trace): scheduling, collections.
		f, err := os.Create(path)
		if err != nil {
			stop()
			return func() {}, fmt.Errorf("QUEUED_TRACE: %w", err)
		}
		trace.Start(f)
		stops = append(stops, func() { trace.Stop(); f.Close() })
	}
	if path := os.Getenv("QUEUED_MEMPROFILE"); path != "" {
		// Allocations (go tool pprof -sample_index=alloc_space).
		stops = append(stops, func() {
			if f, err := os.Create(path); err == nil {
				pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		})
	}
	return stop, nil
}

// checkRun refuses settings runServer cannot run with, naming the flag.
func (c *config) checkRun() error {
	if c.maxQueues < 0 {
		return fmt.Errorf("--max-queues %d: want 0 (no limit) or a positive count", c.maxQueues)
	}
	if id := c.pgSession.brokerID; len(id) > 40 || !validNameChars(id) {
		return fmt.Errorf("--broker-id %q: at most 40 of a-z, A-Z, 0-9, _, -, . and :", id)
	}
	if c.tcpIdleTimeout < 0 {
		return fmt.Errorf("--tcp-idle-timeout %d: want a positive count of milliseconds (a stalled frame is always bounded)", c.tcpIdleTimeout)
	}
	if c.shutdownTimeout < 0 {
		return fmt.Errorf("--shutdown-timeout %d: want 0 (stop at once) or a positive count of milliseconds", c.shutdownTimeout)
	}
	if c.maxCompletedJobs < 0 {
		return fmt.Errorf("--max-completed-jobs %d: want a positive count (0: the default, %d)", c.maxCompletedJobs, maxCompleted)
	}
	if c.metricsMaxQueues != nil && *c.metricsMaxQueues < 0 {
		return fmt.Errorf("--metrics-max-queues %d: want 0 (no labelled series) or a positive count", *c.metricsMaxQueues)
	}
	for _, v := range []struct {
		flag string
		ms   int
	}{{"postgres-statement-timeout", c.pgSession.statementTimeout}, {"postgres-lock-timeout", c.pgSession.lockTimeout},
		{"postgres-idle-transaction-timeout", c.pgSession.idleTxTimeout}} {
		if v.ms < 0 {
			return fmt.Errorf("--%s %d: want 0 (no limit) or a positive count of milliseconds", v.flag, v.ms)
		}
	}
	if c.pgStartWait < 0 {
		return fmt.Errorf("--postgres-start-wait %d: want 0 (no waiting) or a positive count of milliseconds", c.pgStartWait)
	}
	return nil
}

// runServer starts the broker and its listeners and blocks until ctx ends,
// then shuts down gracefully. ready, when given, receives the bound
// addresses (tests listen on port 0).
func runServer(ctx context.Context, c *config, log *slog.Logger, ready func(tcp, http net.Addr)) error {
	if err := c.checkRun(); err != nil {
		return err
	}
	trusted, err := parseTrustedProxies(c.trustedProxies)
	if err != nil {
		return err
	}
	if err := trusted.parseProxyHeader(c.trustedProxyHeader); err != nil {
		return err
	}
	s := &serverRun{c: c, log: log, trusted: trusted}
	if err := s.loadCertificate(); err != nil {
		return err
	}
	err = s.openStorage()
	if s.unlock != nil {
		// After the database is closed: see datalock.go.
		defer s.unlock()
	}
	if err != nil {
		return err
	}
	if err := s.startBroker(); err != nil {
		return err
	}
	if err := s.startServer(ctx); err != nil {
		if ctx.Err() != nil {
			// Stopped while it waited for its database: a stop, not a
			// failure.
			log.Info("stopped before serving", "err", err)
			return nil
		}
		return err
	}
	if err := s.listen(); err != nil {
		return err
	}
	errc := s.serve()
	s.mem = startMemReturn(s.srv)
	s.b.mem.start()
	// SIGHUP rereads the certificate; without TLS it is logged and
	// ignored rather than ending the server, as it would by default.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	s.announce(ready)
	warnIgnoredSettings(log)
	if c.statsInterval > 0 {
		s.statsStop, s.statsDone = make(chan struct{}), make(chan struct{})
		go s.statsLoop(time.Duration(c.statsInterval)*time.Millisecond, s.statsStop, s.statsDone)
	}
	runErr := s.wait(ctx, errc, hup)
	if err := sdNotify("STOPPING=1"); err != nil {
		log.Warn("systemd stopping", "err", err)
	}
	if runErr == nil {
		s.drain(time.Duration(c.shutdownTimeout) * time.Millisecond)
	}
	s.shutdown(shutdownSignal(ctx))
	return runErr
}

// serverRun is a running server's parts, made in runServer's steps in
// this order; shutdown stops them in reverse.
type serverRun struct {
	c   *config
	log *slog.Logger
	// trusted is --trusted-proxies, read (and checked) before anything
	// starts.
	trusted trustedProxies

	certs    *certReloader
	sq       *SQLiteStore // SQLite mode only
	store    Store
	storage  string // how the start line names the storage
	unlock   func() // the data file's lock, SQLite mode only
	bk       *BackupService
	b        *Broker
	memEng   *MemEngine // memory and SQLite mode
	srv      *Server
	pg       *PG // PostgreSQL mode only
	hooks    *Webhooks
	handlers *Handlers
	ln       net.Listener // TCP, as bound
	tcpLn    net.Listener // TCP, with TLS when on
	hln      net.Listener // HTTP, when on
	hs       *http.Server
	lv       *live
	mem      *memReturn // gives memory back when idle (memreturn.go)
	// statsStop ends the statistics line's loop (settings.go), which
	// closes statsDone.
	statsStop, statsDone chan struct{}
	api                  *httpAPI
	// recovered is what the SQLite file held at the start.
	recovered *RecoveryStats
}

// loadCertificate reads --tls-cert and --tls-key: a bad path or pair
// stops the start, rather than failing every handshake later.
func (s *serverRun) loadCertificate() error {
	if s.c.tlsCert == "" && s.c.tlsKey == "" {
		return nil
	}
	var err error
	s.certs, err = newCertReloader(s.c.tlsCert, s.c.tlsKey)
	return err
}

// openStorage opens the SQLite data file and takes its lock (memory and
// PostgreSQL mode have no store here: PostgreSQL is opened with the
// server), then the backup service, which needs SQLite.
func (s *serverRun) openStorage() error {
	c := s.c
	s.storage = "memory"
	if c.pgURL != "" {
		s.storage = "postgres:" + c.pgNamespace
	} else if !c.memory {
		sq, err := OpenSQLite(c.dataPath, c.syncMode, s.log)
		if err != nil {
			return err
		}
		unlock, err := lockDataFile(c.dataPath)
		if err != nil {
			sq.Close()
			return err
		}
		s.sq, s.unlock = sq, unlock
		removeStaleDownloads(c.dataPath, s.log)
		s.store, s.storage = sq, "sqlite:"+c.dataPath
	}
	var src backupSource
	if s.sq != nil {
		src = s.sq
	}
	if c.pgURL != "" && c.backup.bucket != "" {
		return errors.New("S3 backups need SQLite storage; " + noSQLiteBackup(true))
	}
	bk, err := newBackupService(&c.backup, src, c.dataPath, s.log)
	if err != nil {
		if s.sq != nil {
			s.sq.Close()
		}
		return fmt.Errorf("backups: %w", err)
	}
	s.bk = bk
	return nil
}

// startBroker makes the broker and, unless in PostgreSQL mode, the memory
// engine; in SQLite mode it recovers the engine from the data file and
// starts the file's writer.
func (s *serverRun) startBroker() error {
	c, log := s.c, s.log
	b := NewBroker()
	b.maxQueues = c.maxQueues
	if c.workerTimeout > 0 {
		b.workers.timeout = int64(c.workerTimeout)
	}
	// Jobs live in this process but in PostgreSQL mode.
	b.mem = newMemLimit(int64(c.maxMemory), c.pgURL == "", log)
	b.mem.setRuntimeLimit()
	if c.rateEvery > 0 {
		now := c.rateNow
		if now == nil {
			now = nowMs
		}
		b.rates.restart(c.rateEvery, now)
	}
	b.log = log
	s.b = b
	if s.bk != nil {
		s.bk.announce = b.announce
	}
	if c.pgURL != "" {
		return nil // the engine is opened with the server (startServer)
	}
	m := newMemEngine(b, c.shards, s.store)
	m.fitCaches()
	// Completed jobs kept in memory (PostgreSQL mode keeps them in the
	// database: pg_retain.go).
	retention := int64(-1)
	if c.completedRetention != nil {
		retention = int64(*c.completedRetention)
	}
	m.SetCompletedLimits(int64(c.maxCompletedJobs), retention)
	s.memEng = m
	if s.sq == nil {
		return nil
	}
	st, err := s.sq.Load(m)
	if err != nil && st.Took == 0 {
		s.sq.Close()
		return fmt.Errorf("recovery from %s: %w", c.dataPath, err)
	}
	if err != nil {
		log.Error("recovery incomplete", "path", c.dataPath, "err", err)
	}
	s.recovered = &st
	log.Info("recovered", "path", c.dataPath, "waiting", st.Waiting, "delayed", st.Delayed,
		"active_requeued", st.Active, "completed", st.Completed, "dlq", st.Failed, "logs", st.Logs,
		"queues", st.Queues, "crons", st.Crons, "took", st.Took.Round(time.Millisecond).String())
	s.sq.Start()
	return nil
}

// closeEngine stops the memory engine, when there is one, and the broker.
func (s *serverRun) closeEngine() {
	if s.memEng != nil {
		s.memEng.Close()
	}
	s.b.Close()
}

// shardCount is the shards the start line and server:started name: the
// memory engine's, or in PostgreSQL mode the count --shards asks for.
func (s *serverRun) shardCount() int {
	if s.memEng != nil {
		return len(s.memEng.shards)
	}
	return cmp.Or(max(s.c.shards, 0), defaultShards())
}

// closeStore closes PostgreSQL and the SQLite file, whichever is open.
func (s *serverRun) closeStore() {
	if s.pg != nil {
		s.pg.Close()
	}
	if s.sq != nil {
		if err := s.sq.Close(); err != nil {
			s.log.Error("storage close", "err", err)
		}
	}
}

// startServer makes the protocol server over the broker, opens
// PostgreSQL in that mode, and starts the webhooks.
func (s *serverRun) startServer(ctx context.Context) error {
	c, log, b := s.c, s.log, s.b
	var eng Engine
	if s.memEng != nil {
		eng = s.memEng
	}
	srv := NewServer(b, eng, splitTokens(c.authTokens), log)
	srv.trusted = s.trusted
	srv.reqLimit = newReqLimiter(c.rateLimitMax, time.Duration(c.rateLimitWindow)*time.Millisecond, nowMs)
	if srv.reqLimit != nil {
		srv.reqLimit.trust = s.trusted
		if c.rateLimitClients > 0 {
			srv.reqLimit.setClients(c.rateLimitClients)
		}
	}
	c.applyLimits(srv)
	srv.bk = s.bk
	s.srv = srv
	if c.pgURL != "" {
		o := pgOptions{session: &c.pgSession}
		if c.completedRetention != nil && *c.completedRetention >= 0 {
			ms := int64(*c.completedRetention)
			o.retention = &ms
		}
		pg, err := c.openPGWaiting(ctx, b, log, o)
		if err != nil {
			s.closeEngine()
			return err
		}
		srv.usePG(pg)
		s.pg = pg
	}
	hopts := webhookOptions{allowPrivate: c.webhookAllowPrivate, log: log, attempts: c.webhookRetries,
		retryDelay: time.Duration(c.webhookRetryDelay) * time.Millisecond}
	if s.sq != nil {
		hopts.store = s.sq
	}
	hooks, err := newWebhooks(b, hopts)
	if err != nil {
		s.closeEngine()
		s.closeStore()
		return fmt.Errorf("recovery from %s: %w", c.dataPath, err)
	}
	srv.hooks = hooks
	s.hooks = hooks
	var hstore handlerStore
	switch {
	case s.sq != nil:
		hstore = s.sq
	case s.pg != nil:
		hstore = s.pg
	}
	handlers, err := newHandlers(srv.localSend, hooks.dialContext, hstore, c.webhookAllowPrivate, log)
	if err != nil {
		hooks.Close()
		s.closeEngine()
		s.closeStore()
		return fmt.Errorf("recovery from %s: %w", c.dataPath, err) // only the data file's handlers fail a start
	}
	srv.handlers = handlers
	s.handlers = handlers
	return nil
}

// applyLimits gives the server the limits the flags set; a flag at 0
// keeps the server's default.
func (c *config) applyLimits(srv *Server) {
	srv.maxConns = c.maxConns
	if srv.maxConns <= 0 {
		srv.maxConns = defaultMaxConnections(fileLimit())
	}
	if c.maxAnswerBytes > 0 {
		srv.answers.limit = int64(c.maxAnswerBytes)
	}
	srv.answers.share = int64(c.maxWriteQueue)
	if c.authTimeout > 0 {
		srv.authTimeout = c.authTimeout
	}
	if c.handshakeTimeout > 0 {
		srv.handshakeTimeout = c.handshakeTimeout
	}
	if c.stallTimeout > 0 {
		srv.stallTimeout = c.stallTimeout
	}
	if c.tcpIdleTimeout > 0 {
		srv.stallTimeout = time.Duration(c.tcpIdleTimeout) * time.Millisecond
	}
	if c.metricsMaxQueues != nil {
		srv.promMaxQueues = *c.metricsMaxQueues
	}
}

// listen binds the TCP port and, unless it is off, the HTTP port with
// the HTTP API and live events on it.
func (s *serverRun) listen() error {
	c, log := s.c, s.log
	tcpAddr := net.JoinHostPort(c.host, strconv.Itoa(c.tcpPort))
	ln, err := listenAt(c.tcpSocket, tcpAddr)
	if err != nil {
		s.handlers.Close()
		s.hooks.Close()
		s.closeEngine()
		s.closeStore()
		return fmt.Errorf("listen on TCP %s: %w", cmp.Or(c.tcpSocket, tcpAddr), err)
	}
	s.ln, s.tcpLn = ln, ln
	if s.certs != nil {
		s.tcpLn = tls.NewListener(quietListener{ln}, s.certs.serverTLSConfig())
	}
	if c.httpPort < 0 {
		return nil
	}
	httpAddr := net.JoinHostPort(c.host, strconv.Itoa(c.httpPort))
	hln, err := listenAt(c.httpSocket, httpAddr)
	if err != nil {
		ln.Close()
		s.handlers.Close()
		s.hooks.Close()
		s.closeEngine()
		s.closeStore()
		return fmt.Errorf("listen on HTTP %s: %w", cmp.Or(c.httpSocket, httpAddr), err)
	}
	rl := newRetryListener(hln, "http", log)
	rl.max = c.maxHTTPConns
	if rl.max <= 0 {
		rl.max = defaultMaxHTTPConns(s.srv.maxConns)
	}
	var tc *tls.Config
	if s.certs != nil {
		tc = s.certs.serverTLSConfig()
	}
	rl.refuse = httpRefusal(rl.max, tc)
	s.hln = rl
	s.lv = newLive(s.srv, log, c.liveEvery)
	s.srv.live = s.lv // before serving: the Prometheus figures read its clients
	hcfg := httpConfig{corsOrigins: splitTokens(c.corsOrigins), allowedHosts: splitTokens(c.allowedHosts),
		listenHost: c.host, live: s.lv, metricsOpen: c.metricsAuth != nil && !*c.metricsAuth, mcpMaxAnswer: int64(c.mcpMaxAnswer)}
	if s.sq != nil {
		hcfg.dataPath, hcfg.dataFile = c.dataPath, s.sq
	}
	s.api = newHTTPAPI(s.b, s.srv, s.bk, hcfg)
	s.hs = newHTTPServer(httpAddr, s.api)
	if s.certs != nil {
		s.hs.TLSConfig = s.certs.serverTLSConfig()
	}
	// Failed handshakes (scanners, plain HTTP on the HTTPS port) are
	// the client's problem: debug lines, not the standard logger's.
	s.hs.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	return nil
}

// serve starts serving TCP and HTTP; the channel gets the error that ends
// either.
func (s *serverRun) serve() <-chan error {
	errc := make(chan error, 2)
	go func() { errc <- s.srv.Serve(s.tcpLn) }()
	if s.hs != nil {
		go func() {
			var err error
			if s.certs != nil {
				err = s.hs.ServeTLS(s.hln, "", "")
			} else {
				err = s.hs.Serve(s.hln)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("http: %w", err)
			}
		}()
	}
	return errc
}

// portOf is a listener's TCP port; 0 for a Unix socket.
func portOf(a net.Addr) int {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.Port
	}
	return 0
}

// announce logs the start, starts the backup schedule, and tells ready
// and systemd.
func (s *serverRun) announce(ready func(tcp, http net.Addr)) {
	c, log := s.c, s.log
	attrs := []any{"tcp", s.ln.Addr().String(), "shards", s.shardCount(), "storage", s.storage,
		"auth", len(s.srv.tokens) > 0, "tls", s.certs != nil, "max_connections", s.srv.maxConns, "version", version}
	if c.webhookAllowPrivate {
		attrs = append(attrs, "webhook_allow_private", true)
	}
	if c.pgURL != "" && c.pgSession.brokerID != "" {
		attrs = append(attrs, "broker", c.pgSession.brokerID)
	}
	if s.hln != nil {
		attrs = append(attrs, "http", s.hln.Addr().String())
	}
	log.Info("queued started", attrs...)
	httpPort := -1
	if s.hln != nil {
		httpPort = portOf(s.hln.Addr())
	}
	s.b.announce(newNote("server:started").int("tcpPort", int64(portOf(s.ln.Addr()))).
		int("httpPort", int64(httpPort)).int("shards", int64(s.shardCount())))
	if st := s.recovered; st != nil {
		s.b.announce(newNote("server:recovered").int("queues", int64(st.Queues)).
			int("jobs", int64(st.Waiting+st.Delayed+st.Active+st.Completed+st.Failed)))
	}
	if s.bk != nil {
		s.bk.Start()
	}
	if ready != nil {
		var ha net.Addr
		if s.hln != nil {
			ha = s.hln.Addr()
		}
		ready(s.ln.Addr(), ha)
	}
	if err := sdNotify("READY=1\nSTATUS=serving on " + s.ln.Addr().String()); err != nil {
		log.Warn("systemd readiness", "err", err)
	}
}

// wait blocks until ctx ends or serving fails (that error is answered),
// rereading the certificate on each SIGHUP.
func (s *serverRun) wait(ctx context.Context, errc <-chan error, hup <-chan os.Signal) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-hup:
			if s.certs == nil {
				s.log.Info("SIGHUP: nothing to reload (no TLS)")
			} else if err := s.certs.reload(); err != nil {
				s.log.Error("SIGHUP: certificate not reloaded; the previous one stays in use", "err", err)
			} else {
				s.log.Info("SIGHUP: certificate reloaded", "cert", s.c.tlsCert)
			}
		}
	}
}

// shutdownSignal names the signal that ended ctx (server:shutdown's
// field), or says the server was stopped otherwise.
func shutdownSignal(ctx context.Context) string {
	// signal.NotifyContext's cause is "<the signal's name> signal received".
	switch cause := fmt.Sprint(context.Cause(ctx)); {
	case strings.HasPrefix(cause, syscall.SIGTERM.String()):
		return "SIGTERM"
	case strings.HasPrefix(cause, syscall.SIGINT.String()):
		return "SIGINT"
	}
	return "shutdown"
}

// shutdown stops everything, in the reverse order of the start.
func (s *serverRun) shutdown(signal string) {
	log := s.log
	log.Info("shutting down")
	if s.statsStop != nil {
		close(s.statsStop)
		<-s.statsDone
	}
	if s.bk != nil {
		// Before the database closes: a backup in progress is abandoned.
		s.bk.Close()
	}
	if s.hs != nil {
		// Event streams and waiting requests first: Shutdown waits for
		// every handler to return. Their subscribers hear why.
		s.lv.Shutdown(signal)
		s.lv.Close()
		s.api.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.hs.Shutdown(sctx); err != nil {
			log.Warn("http shutdown", "err", err)
		}
		cancel()
	}
	// The handlers are clients of the server: they stop first, a call in
	// flight cancelled (its job goes back by its lease).
	s.handlers.Close()
	s.srv.Close()
	s.hooks.Close()
	if s.mem != nil {
		s.mem.Stop()
	}
	s.b.mem.Stop()
	s.closeEngine()
	s.closeStore()
	log.Info("stopped")
}
