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

// config is the server's configuration after flags and environment.
type config struct {
	host       string
	tcpPort    int
	httpPort   int
	authTokens string
	logLevel   string
	logFormat  string
	shards     int
	maxQueues  int
	// Completed history (history.go): jobs held in memory (0: the
	// default), and how long completed jobs are kept in ms (nil or
	// negative: for ever).
	maxCompletedJobs   int
	completedRetention *int
	// shutdownTimeout bounds a graceful stop's wait for running jobs,
	// in ms (graceful_stop.go); 0 stops at once.
	shutdownTimeout int
	// tcpIdleTimeout: ms an incomplete frame may make no progress before
	// its connection is closed (the reference's TCP_IDLE_TIMEOUT_MS);
	// 0: the default.
	tcpIdleTimeout int
	// Unix sockets to listen on instead of the TCP and HTTP ports.
	tcpSocket, httpSocket string
	// The per-client request limiter (reqlimit.go): requests a client may
	// send within the window (0: no limit); the peers whose forwarding
	// headers name the client; the clients each of its tables counts (0:
	// maxLimitClients; tests set fewer).
	rateLimitMax, rateLimitWindow int
	trustedProxies                string
	trustedProxyHeader            string
	rateLimitClients              int
	// statsInterval: ms between statistics lines in the log (0: none).
	statsInterval int
	// workerTimeout: ms before a silent worker is stale (0: the default).
	workerTimeout int
	// Webhook deliveries: attempts, and the delay before the second (0:
	// the defaults).
	webhookRetries, webhookRetryDelay int
	dataPath                          string
	memory                            bool
	syncMode                          string
	backup                            backupSettings
	// corsOrigins: the origins whose pages may use the HTTP API from a
	// browser, comma-separated; "*" is any.
	corsOrigins string
	// allowedHosts: names browsers may use to reach the HTTP port when
	// there are no tokens (see hostAllowed in http.go).
	allowedHosts string

	pgURL       string // PostgreSQL mode when set
	pgNamespace string
	pgSession   pgSession
	explicitDB  bool // --data-path was given on the command line

	// metricsAuth (--metrics-auth) says whether /prometheus needs the
	// bearer token when tokens are set; metricsMaxQueues bounds the queues
	// given labelled Prometheus series. Both are pointers so that nil, in
	// a config made in code (as the tests make them), means the flag's
	// default: the token needed, 100 queues.
	metricsAuth      *bool
	metricsMaxQueues *int

	webhookAllowPrivate bool
	tlsCert             string
	tlsKey              string
	// maxConns bounds the TCP connections held at once; 0 derives it from
	// the open-file limit.
	maxConns int
	// maxHTTPConns bounds the HTTP port's connections; 0 derives it from
	// maxConns.
	maxHTTPConns int
	// maxAnswerBytes is the server-wide budget of answers not yet written,
	// maxWriteQueue one connection's share of it (0: no share), maxMemory
	// the memory budget for jobs (0: none). See answer_budget.go, memlimit.go.
	maxAnswerBytes, maxWriteQueue, maxMemory byteSize
	// mcpMaxAnswer caps one MCP answer of /mcp (0: the default).
	mcpMaxAnswer byteSize
	// liveEvery shortens the live events' periodic figures (tests).
	liveEvery liveIntervals
	// authTimeout, handshakeTimeout and stallTimeout replace the
	// connection deadlines when set (tests).
	authTimeout, handshakeTimeout, stallTimeout time.Duration
	// rateEvery and rateNow replace the throughput sampler's period and
	// clock when set (tests: ten minutes of history without the wait).
	rateEvery time.Duration
	rateNow   func() int64
}

func envOr(keys []string, def string) string {
	for _, k := range keys {
		if v, ok := os.LookupEnv(k); ok && v != "" {
			return v
		}
	}
	return def
}

func envInt(keys []string, def int) int {
	v := envOr(keys, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return def
	}
	return n
}

// checkFlagEnv refuses a number or yes/no flag whose default came from an
// environment variable that is not one (TCP_PORT=abc), as the flag itself
// would be refused; envInt and envBool fall back to the default rather
// than fail where the variable is read. A flag given on the command line
// wins, so its variable is not looked at. A flag's variables are the ones
// its usage names in brackets.
func checkFlagEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if given[f.Name] || !ok {
			return
		}
		open, close := strings.LastIndex(f.Usage, "["), strings.LastIndex(f.Usage, "]")
		if open < 0 || close < open {
			return
		}
		for _, key := range strings.Split(f.Usage[open+1:close], ",") {
			key = strings.TrimSpace(key)
			v, set := os.LookupEnv(key)
			if !set || v == "" {
				continue
			}
			switch g.Get().(type) {
			case int:
				if _, err := strconv.Atoi(v); err != nil {
					errs = append(errs, fmt.Errorf("%s=%q is not a whole number (it sets --%s)", key, v, f.Name))
				}
			case byteSize:
				if _, err := parseByteSize(v); err != nil {
					errs = append(errs, fmt.Errorf("%s=%q is not a size (it sets --%s): %w", key, v, f.Name, err))
				}
			case bool:
				if _, ok := yesNo(v); !ok {
					errs = append(errs, fmt.Errorf("%s=%q is neither yes nor no (1, true, yes, on; 0, false, no, off; it sets --%s)", key, v, f.Name))
				}
			}
			return // the first variable set is the one used
		}
	})
	return errors.Join(errs...)
}

// yesNo reads a yes/no value: 1, true, yes and on are yes; 0, false, no
// and off are no; ok is false for anything else.
func yesNo(v string) (yes, ok bool) {
	switch strings.ToLower(v) {
	case "1", "true", "yes", "on":
		return true, true
	case "0", "false", "no", "off":
		return false, true
	}
	return false, false
}

// envBool reads a yes/no variable whose default is no.
func envBool(key string) bool {
	yes, _ := yesNo(envOr([]string{key}, ""))
	return yes
}

// envIsNo reads a yes/no variable whose default is yes: it says no.
func envIsNo(key string) bool {
	yes, ok := yesNo(envOr([]string{key}, ""))
	return ok && !yes
}

// The environment variables naming the storage, read by the server and by
// queued migrate alike.
var (
	dataPathEnv    = []string{"DATA_PATH", "BUNQUEUE_DATA_PATH", "BQ_DATA_PATH", "SQLITE_PATH"}
	pgNamespaceEnv = []string{"BUNQUEUE_POSTGRES_NAMESPACE"}
)

const defaultDataPath = "./data/queued.db"

// pgURLFromEnv is the PostgreSQL URL the environment gives: its own
// variable, or DATABASE_URL when the storage driver is postgres.
func pgURLFromEnv() string {
	u := envOr([]string{"BUNQUEUE_POSTGRES_URL", "QUEUED_POSTGRES_URL"}, "")
	if u == "" && strings.EqualFold(envOr([]string{"BUNQUEUE_STORAGE_DRIVER"}, ""), "postgres") {
		u = envOr([]string{"DATABASE_URL"}, "")
	}
	return u
}

func serverFlags(stderr io.Writer) (*flag.FlagSet, *config) {
	c := &config{}
	fs := flag.NewFlagSet("queued", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.host, "host", envOr([]string{"HOST"}, "0.0.0.0"), "address to listen on [HOST]")
	fs.IntVar(&c.tcpPort, "tcp-port", envInt([]string{"TCP_PORT"}, 6789), "TCP port of the wire protocol [TCP_PORT]")
	fs.IntVar(&c.httpPort, "http-port", envInt([]string{"HTTP_PORT"}, 6790),
		"HTTP port: the dashboard, the HTTP API, live events, metrics; 0 or -1 turns it off [HTTP_PORT]")
	// Secrets: their values, from the environment or not, are never
	// printed (secrets.go).
	c.authTokens = envOr([]string{"AUTH_TOKENS"}, "")
	fs.Var(hiddenFlag{&c.authTokens}, "auth-tokens", "comma-separated `tokens` clients must present [AUTH_TOKENS]"+fromEnvNote([]string{"AUTH_TOKENS"}))
	fs.StringVar(&c.logLevel, "log-level", envOr([]string{"LOG_LEVEL"}, "info"), "debug, info, warn or error [LOG_LEVEL]")
	fs.StringVar(&c.logFormat, "log-format", envOr([]string{"LOG_FORMAT"}, "text"), "text, or json: one JSON object a line [LOG_FORMAT]")
	fs.IntVar(&c.shards, "shards", envInt([]string{"QUEUED_SHARDS"}, 0), "shard count, a power of two (0: from the CPU count) [QUEUED_SHARDS]")
	fs.IntVar(&c.maxQueues, "max-queues", envInt([]string{"QUEUED_MAX_QUEUES"}, defaultMaxQueues),
		"queues that may exist at once (0: no limit); a push naming one more is refused [QUEUED_MAX_QUEUES]")
	fs.IntVar(&c.maxCompletedJobs, "max-completed-jobs", envInt([]string{"BUNQUEUE_MAX_COMPLETED_JOBS", "MAX_COMPLETED_JOBS"}, maxCompleted),
		"completed jobs held in memory (0: the default); older ones stay on disk in SQLite mode, and are forgotten in memory mode [BUNQUEUE_MAX_COMPLETED_JOBS, MAX_COMPLETED_JOBS]")
	c.completedRetention = new(int)
	fs.IntVar(c.completedRetention, "completed-retention-ms", envInt([]string{"BUNQUEUE_COMPLETED_RETENTION_MS", "COMPLETED_RETENTION_MS"}, -1),
		"delete completed jobs this many ms after they completed (-1: keep them) [BUNQUEUE_COMPLETED_RETENTION_MS, COMPLETED_RETENTION_MS]")
	fs.IntVar(&c.tcpIdleTimeout, "tcp-idle-timeout", envInt([]string{"TCP_IDLE_TIMEOUT_MS"}, int(defaultStallTimeout.Milliseconds())),
		"ms a connection's incomplete frame may make no progress before the connection is closed [TCP_IDLE_TIMEOUT_MS]")
	fs.StringVar(&c.tcpSocket, "tcp-socket", envOr([]string{"TCP_SOCKET_PATH"}, ""),
		"a Unix socket `path` to serve the wire protocol on, instead of --tcp-port [TCP_SOCKET_PATH]")
	fs.StringVar(&c.httpSocket, "http-socket", envOr([]string{"HTTP_SOCKET_PATH"}, ""),
		"a Unix socket `path` to serve HTTP on, instead of --http-port [HTTP_SOCKET_PATH]")
	fs.IntVar(&c.rateLimitMax, "rate-limit-max-requests", envInt([]string{"RATE_LIMIT_MAX_REQUESTS"}, 0),
		"requests a client (a TCP connection, an HTTP client's address) may send within --rate-limit-window; past it they are refused, HTTP 429 (0: no limit) [RATE_LIMIT_MAX_REQUESTS]")
	fs.IntVar(&c.rateLimitWindow, "rate-limit-window", envInt([]string{"RATE_LIMIT_WINDOW_MS"}, 60000),
		"ms of the request limiter's sliding window [RATE_LIMIT_WINDOW_MS]")
	fs.StringVar(&c.trustedProxies, "trusted-proxies", envOr([]string{"QUEUED_TRUSTED_PROXIES"}, ""),
		"proxies whose forwarding header (--trusted-proxy-header) names an HTTP client to the request limiter: comma-separated `addresses` and CIDRs, unix for peers of --http-socket (none: a client is the address it connects from) [QUEUED_TRUSTED_PROXIES]")
	fs.StringVar(&c.trustedProxyHeader, "trusted-proxy-header", envOr([]string{"QUEUED_TRUSTED_PROXY_HEADER"}, "x-forwarded-for"),
		"the `header` --trusted-proxies set to name their client, the only one read: x-forwarded-for (read from the right) or x-real-ip [QUEUED_TRUSTED_PROXY_HEADER]")
	fs.IntVar(&c.statsInterval, "stats-interval", envInt([]string{"STATS_INTERVAL_MS"}, 300000),
		"ms between the log's queue statistics lines (0: none) [STATS_INTERVAL_MS]")
	fs.IntVar(&c.workerTimeout, "worker-timeout", envInt([]string{"WORKER_TIMEOUT_MS"}, workerTimeoutMs),
		"ms after which a worker not heard from is stale; after three times that it is removed [WORKER_TIMEOUT_MS]")
	fs.IntVar(&c.webhookRetries, "webhook-max-retries", envInt([]string{"WEBHOOK_MAX_RETRIES"}, webhookAttempts),
		"attempts to deliver a webhook event [WEBHOOK_MAX_RETRIES]")
	fs.IntVar(&c.webhookRetryDelay, "webhook-retry-delay", envInt([]string{"WEBHOOK_RETRY_DELAY_MS"}, int(webhookRetryDelay.Milliseconds())),
		"ms before a webhook's second attempt, twice that before its third, and so on [WEBHOOK_RETRY_DELAY_MS]")
	fs.IntVar(&c.shutdownTimeout, "shutdown-timeout", envInt([]string{"SHUTDOWN_TIMEOUT_MS"}, 30000),
		"ms a graceful stop waits for running jobs to finish, handing out no new ones (0: stop at once) [SHUTDOWN_TIMEOUT_MS]")
	fs.StringVar(&c.dataPath, "data-path", envOr(dataPathEnv, defaultDataPath),
		"SQLite database file [DATA_PATH, BUNQUEUE_DATA_PATH, BQ_DATA_PATH, SQLITE_PATH]")
	fs.BoolVar(&c.memory, "memory", strings.EqualFold(envOr([]string{"BUNQUEUE_STORAGE_DRIVER"}, ""), "memory"),
		"keep everything in memory, nothing on disk [BUNQUEUE_STORAGE_DRIVER=memory]")
	fs.StringVar(&c.syncMode, "sync", envOr([]string{"QUEUED_SYNC"}, "normal"),
		"SQLite durability: normal survives a process crash, full also a power loss [QUEUED_SYNC]")
	c.pgURL = pgURLFromEnv()
	fs.Var(dsnFlag{&c.pgURL}, "postgres-url",
		"PostgreSQL mode: several brokers share this database `URL` (shown with its password masked); also DATABASE_URL with BUNQUEUE_STORAGE_DRIVER=postgres [BUNQUEUE_POSTGRES_URL]")
	fs.StringVar(&c.pgNamespace, "postgres-namespace", envOr(pgNamespaceEnv, "default"),
		"schema (queued_<namespace>) that keeps this deployment apart from others in the database [BUNQUEUE_POSTGRES_NAMESPACE]")
	fs.IntVar(&c.pgSession.statementTimeout, "postgres-statement-timeout", envInt([]string{"BUNQUEUE_POSTGRES_STATEMENT_TIMEOUT_MS"}, defaultPGSession.statementTimeout),
		"PostgreSQL mode: ms a statement may run before the database cancels it (0: no limit) [BUNQUEUE_POSTGRES_STATEMENT_TIMEOUT_MS]")
	fs.IntVar(&c.pgSession.lockTimeout, "postgres-lock-timeout", envInt([]string{"BUNQUEUE_POSTGRES_LOCK_TIMEOUT_MS"}, defaultPGSession.lockTimeout),
		"PostgreSQL mode: ms a statement may wait for a lock (0: no limit) [BUNQUEUE_POSTGRES_LOCK_TIMEOUT_MS]")
	fs.IntVar(&c.pgSession.idleTxTimeout, "postgres-idle-transaction-timeout", envInt([]string{"BUNQUEUE_POSTGRES_IDLE_TRANSACTION_TIMEOUT_MS"}, defaultPGSession.idleTxTimeout),
		"PostgreSQL mode: ms a transaction may stay open with nothing sent before the database ends its session, freeing the locks of a broker gone away (0: no limit) [BUNQUEUE_POSTGRES_IDLE_TRANSACTION_TIMEOUT_MS]")
	fs.StringVar(&c.pgSession.brokerID, "broker-id", envOr([]string{"BUNQUEUE_BROKER_ID"}, ""),
		"PostgreSQL mode: a name for this broker, in its log and in pg_stat_activity's application_name (queued <namespace> <name>) [BUNQUEUE_BROKER_ID]")
	fs.IntVar(&c.pgSession.poolSize, "postgres-pool-size", envInt([]string{"BUNQUEUE_POSTGRES_POOL_SIZE"}, 0),
		"PostgreSQL mode: connections a broker may open, 8 at least (0: the URL's pool_max_conns, else 16) [BUNQUEUE_POSTGRES_POOL_SIZE]")
	fs.StringVar(&c.corsOrigins, "cors-origins", envOr([]string{"CORS_ALLOW_ORIGIN"}, ""),
		"origins whose pages may call the HTTP API, comma-separated, * for any (none: the dashboard only) [CORS_ALLOW_ORIGIN]")
	fs.StringVar(&c.allowedHosts, "allowed-hosts", envOr([]string{"QUEUED_ALLOWED_HOSTS"}, ""),
		"without --auth-tokens, the host names browsers may reach the HTTP port by besides loopback names, IP addresses, --host and the --cors-origins hosts; comma-separated, .example.com for a domain and its subdomains, * for any [QUEUED_ALLOWED_HOSTS]")
	// queued's default is the secure one: with tokens, /prometheus needs
	// one like every other route. The reference leaves it open unless
	// METRICS_AUTH=true; METRICS_AUTH=false gives a token-less scraper
	// that behaviour back.
	c.metricsAuth, c.metricsMaxQueues = new(bool), new(int)
	fs.BoolVar(c.metricsAuth, "metrics-auth", !envIsNo("METRICS_AUTH"),
		"with --auth-tokens, GET /prometheus needs the bearer token; false leaves it open to a scraper without one, as the reference does by default [METRICS_AUTH]")
	fs.IntVar(c.metricsMaxQueues, "metrics-max-queues", envInt([]string{"METRICS_MAX_QUEUES"}, defaultPromMaxQueues),
		"queues given labelled Prometheus series, the first made; the others are counted in bunqueue_queue_metrics_omitted (0: none) [METRICS_MAX_QUEUES]")
	addBackupFlags(fs, &c.backup)
	fs.BoolVar(&c.webhookAllowPrivate, "webhook-allow-private", envBool("QUEUED_WEBHOOK_ALLOW_PRIVATE"),
		"let webhooks reach loopback, private, link-local and metadata addresses [QUEUED_WEBHOOK_ALLOW_PRIVATE]")
	fs.StringVar(&c.tlsCert, "tls-cert", envOr([]string{"TLS_CERT_FILE"}, ""),
		"PEM certificate: TLS on the TCP port, HTTPS on the HTTP port; reread on SIGHUP [TLS_CERT_FILE]")
	fs.StringVar(&c.tlsKey, "tls-key", envOr([]string{"TLS_KEY_FILE"}, ""), "PEM private key of --tls-cert [TLS_KEY_FILE]")
	fs.IntVar(&c.maxConns, "max-connections", envInt([]string{"QUEUED_MAX_CONNECTIONS"}, defaultMaxConnections(fileLimit())),
		"most TCP connections at once, more are told so and closed; the default follows the open-file limit [QUEUED_MAX_CONNECTIONS]")
	fs.IntVar(&c.maxHTTPConns, "max-http-connections", envInt([]string{"QUEUED_MAX_HTTP_CONNECTIONS"}, 0),
		"most HTTP connections at once (WebSockets and event streams count), more are answered 503 and closed; 0: a quarter of --max-connections, at least 64 and at most 4096 [QUEUED_MAX_HTTP_CONNECTIONS]")
	c.maxAnswerBytes = envSize([]string{"QUEUED_MAX_ANSWER_BYTES"}, defaultAnswerBudget())
	fs.Var(&c.maxAnswerBytes, "max-answer-bytes",
		"answers built and not yet read by clients, all connections together; a big answer waits for room, then is refused; the default is a 64th of the memory, from 32MiB to 128MiB [QUEUED_MAX_ANSWER_BYTES]")
	c.maxWriteQueue = envSize([]string{"TCP_MAX_WRITE_QUEUE_BYTES"}, defaultWriteQueueBytes)
	fs.Var(&c.maxWriteQueue, "max-write-queue-bytes",
		"answers one connection has not read; past it the connection is closed (0: no bound of its own) [TCP_MAX_WRITE_QUEUE_BYTES]")
	c.mcpMaxAnswer = envSize([]string{"QUEUED_MCP_MAX_ANSWER_BYTES"}, defaultMCPAnswer)
	fs.Var(&c.mcpMaxAnswer, "mcp-max-answer-bytes",
		"one answer of /mcp to an AI agent, as written: lists are cut to fit, with a note, and values past a sixteenth of it are shown as their type and length; 64KiB to 64MiB [QUEUED_MCP_MAX_ANSWER_BYTES]")
	c.maxMemory = envSize([]string{"QUEUED_MAX_MEMORY"}, defaultMaxMemory())
	fs.Var(&c.maxMemory, "max-memory",
		"memory budget for jobs: past 80% of it pushes and every other command that grows job memory are refused until workers make room, and a data file that needs more is refused at start; the default is three quarters of the memory (0: no budget) [QUEUED_MAX_MEMORY]")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	return fs, c
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
	if (c.tlsCert == "") != (c.tlsKey == "") {
		fmt.Fprintln(stderr, "queued: --tls-cert and --tls-key go together")
		return 2
	}
	if c.maxConns < 1 {
		fmt.Fprintln(stderr, "queued: --max-connections must be at least 1")
		return 2
	}
	if err := checkMCPAnswer(int64(c.mcpMaxAnswer), "--mcp-max-answer-bytes"); err != nil {
		fmt.Fprintln(stderr, "queued:", err)
		return 2
	}
	if c.shards != 0 && (c.shards < 1 || c.shards > 64 || c.shards&(c.shards-1) != 0) {
		fmt.Fprintln(stderr, "queued: --shards must be a power of two from 1 to 64")
		return 2
	}
	if path := os.Getenv("QUEUED_CPUPROFILE"); path != "" {
		// A developer's aid: profile the whole run, written at shutdown.
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(stderr, "queued: QUEUED_CPUPROFILE:", err)
			return 2
		}
		pprof.StartCPUProfile(f)
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if path := os.Getenv("QUEUED_TRACE"); path != "" {
		// The execution trace (go tool trace): scheduling, collections.
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(stderr, "queued: QUEUED_TRACE:", err)
			return 2
		}
		trace.Start(f)
		defer func() { trace.Stop(); f.Close() }()
	}
	if path := os.Getenv("QUEUED_MEMPROFILE"); path != "" {
		// The same for allocations (go tool pprof -sample_index=alloc_space).
		defer func() {
			if f, err := os.Create(path); err == nil {
				pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := runServer(ctx, c, log, nil); err != nil {
		log.Error("server stopped", "err", err)
		return 1
	}
	return 0
}

// runServer starts the broker and its listeners and blocks until ctx ends,
// then shuts down gracefully. ready, when given, receives the bound
// addresses (tests listen on port 0).
func runServer(ctx context.Context, c *config, log *slog.Logger, ready func(tcp, http net.Addr)) error {
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

// startBroker makes the broker and, in SQLite mode, recovers it from the
// data file and starts the file's writer.
func (s *serverRun) startBroker() error {
	c, log := s.c, s.log
	b := NewBroker(c.shards, s.store)
	b.maxQueues = c.maxQueues
	if c.workerTimeout > 0 {
		b.workers.timeout = int64(c.workerTimeout)
	}
	// Jobs live in this process but in PostgreSQL mode.
	b.mem = newMemLimit(int64(c.maxMemory), c.pgURL == "", log)
	b.mem.setRuntimeLimit()
	b.fitCaches()
	if c.rateEvery > 0 {
		now := c.rateNow
		if now == nil {
			now = nowMs
		}
		b.rates.restart(c.rateEvery, now)
	}
	b.log = log
	if c.pgURL == "" {
		// In PostgreSQL mode completed jobs live in the database (pg_retain.go).
		retention := int64(-1)
		if c.completedRetention != nil {
			retention = int64(*c.completedRetention)
		}
		b.SetCompletedLimits(int64(c.maxCompletedJobs), retention)
	}
	s.b = b
	if s.bk != nil {
		s.bk.announce = b.announce
	}
	if s.sq == nil {
		return nil
	}
	st, err := s.sq.Load(b)
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
	srv := NewServer(b, splitTokens(c.authTokens), log)
	srv.trusted = s.trusted
	srv.reqLimit = newReqLimiter(c.rateLimitMax, time.Duration(c.rateLimitWindow)*time.Millisecond, nowMs)
	if srv.reqLimit != nil {
		srv.reqLimit.trust = s.trusted
		if c.rateLimitClients > 0 {
			srv.reqLimit.setClients(c.rateLimitClients)
		}
	}
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
	srv.bk = s.bk
	s.srv = srv
	if c.pgURL != "" {
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		o := pgOptions{session: &c.pgSession}
		if c.completedRetention != nil && *c.completedRetention >= 0 {
			ms := int64(*c.completedRetention)
			o.retention = &ms
		}
		pg, err := openPG(octx, c.pgURL, c.pgNamespace, b, log, o)
		cancel()
		if err != nil {
			b.Close()
			return err
		}
		srv.usePG(pg)
		b.pgStatus = pg.storageState
		s.pg = pg
	}
	hopts := webhookOptions{allowPrivate: c.webhookAllowPrivate, log: log, attempts: c.webhookRetries,
		retryDelay: time.Duration(c.webhookRetryDelay) * time.Millisecond}
	if s.sq != nil {
		hopts.store = s.sq
	}
	hooks, err := newWebhooks(b, hopts)
	if err != nil {
		b.Close()
		s.closeStore()
		return fmt.Errorf("recovery from %s: %w", c.dataPath, err)
	}
	srv.hooks = hooks
	s.hooks = hooks
	var hstore handlerStore
	if s.sq != nil {
		hstore = s.sq
	}
	handlers, err := newHandlers(srv.localSend, hooks.dialContext, hstore, c.webhookAllowPrivate, log)
	if err != nil {
		hooks.Close()
		b.Close()
		s.closeStore()
		return fmt.Errorf("recovery from %s: %w", c.dataPath, err)
	}
	srv.handlers = handlers
	s.handlers = handlers
	return nil
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
		s.b.Close()
		s.closeStore()
		return fmt.Errorf("listen on TCP %s: %w", cmp.Or(c.tcpSocket, tcpAddr), err)
	}
	s.ln, s.tcpLn = ln, ln
	if s.certs != nil {
		s.tcpLn = tls.NewListener(ln, s.certs.serverTLSConfig())
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
		s.b.Close()
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
		hcfg.dataPath = c.dataPath
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
	attrs := []any{"tcp", s.ln.Addr().String(), "shards", len(s.b.shards), "storage", s.storage,
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
		int("httpPort", int64(httpPort)).int("shards", int64(len(s.b.shards))))
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
	s.b.Close()
	s.closeStore()
	log.Info("stopped")
}
