package main

// The server's configuration: its flags, each with the environment
// variables that set it (the reference's names where it has one), and
// the checks of what they say together.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

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
	// pgStartWait: ms a starting broker tries again while its database
	// cannot be reached (pg_start.go); 0 gives up at the first failure.
	pgStartWait int
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
	fs.IntVar(&c.pgStartWait, "postgres-start-wait", envInt([]string{"QUEUED_POSTGRES_START_WAIT_MS"}, int(pgStartWait/time.Millisecond)),
		"PostgreSQL mode: ms a starting broker tries again while the database cannot be reached (0: it exits at the first failure) [QUEUED_POSTGRES_START_WAIT_MS]")
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

// checkServeFlags checks the flags whose values depend on each other, or
// whose range the flag package cannot say.
func checkServeFlags(c *config) error {
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if c.maxConns < 1 {
		return errors.New("--max-connections must be at least 1")
	}
	if err := checkMCPAnswer(int64(c.mcpMaxAnswer), "--mcp-max-answer-bytes"); err != nil {
		return err
	}
	if c.shards != 0 && (c.shards < 1 || c.shards > 64 || c.shards&(c.shards-1) != 0) {
		return errors.New("--shards must be a power of two from 1 to 64")
	}
	return nil
}
