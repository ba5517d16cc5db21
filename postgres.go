package main

// PostgreSQL mode: several brokers share one database, and the database
// decides who owns a job. No broker keeps job state of its own: a claim is
// an UPDATE of rows taken with FOR UPDATE SKIP LOCKED, and it hands each
// job a fresh lease token; an ACK or FAIL applies only while the job still
// carries that token, so a broker whose lease ran out (and whose job was
// reclaimed by another) cannot complete it. Any live broker reclaims
// expired leases. Pushes NOTIFY the other brokers so that their waiting
// pulls wake at once; a pull also looks again on a timer, in case the
// listening connection is down.
//
// Each deployment lives in its own schema (the namespace), so several
// share one database. The schema is created, and migrated forward, by the
// first broker under an advisory lock.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Job rows keep the job's record (as in SQLite) plus the columns claims
// and leases are decided on.
const (
	pgQueued   = 1 // waiting, prioritized or delayed: told apart by run_at and priority
	pgActive   = 4
	pgDone     = 5
	pgDLQ      = 6
	pgChildren = 7
)

var pgMigrations = []string{
	`CREATE TABLE {s}.jobs (
		id            TEXT PRIMARY KEY,
		queue         TEXT NOT NULL,
		state         SMALLINT NOT NULL,
		priority      BIGINT NOT NULL,
		sort_key      BIGINT NOT NULL,
		seq           BIGSERIAL,
		run_at        BIGINT NOT NULL,
		created_at    BIGINT NOT NULL,
		done_at       BIGINT,
		unique_key    TEXT,
		lease_token   TEXT,
		lease_owner   TEXT,
		lease_broker  TEXT,
		lease_expires BIGINT,
		lease_ttl     BIGINT,
		timeout_at    BIGINT,
		record        BYTEA NOT NULL,
		result        BYTEA
	);
	CREATE INDEX jobs_claim ON {s}.jobs (queue, priority DESC, sort_key, seq) WHERE state = 1;
	CREATE INDEX jobs_lease ON {s}.jobs (lease_expires) WHERE state = 4;
	CREATE INDEX jobs_queue_state ON {s}.jobs (queue, state);
	CREATE UNIQUE INDEX jobs_unique ON {s}.jobs (queue, unique_key) WHERE unique_key IS NOT NULL AND state IN (1, 4, 7);
	CREATE TABLE {s}.queues (
		name     TEXT PRIMARY KEY,
		created  BIGSERIAL,
		paused   BOOLEAN NOT NULL DEFAULT false,
		settings BYTEA
	);
	CREATE TABLE {s}.job_logs (
		job_id TEXT PRIMARY KEY,
		logs   BYTEA NOT NULL
	);`,
	// Version 2: cron schedules, and the limits on claiming a queue.
	`CREATE TABLE {s}.crons (
		name     TEXT PRIMARY KEY,
		created  BIGSERIAL,
		next_run BIGINT NOT NULL,
		record   BYTEA NOT NULL
	);
	CREATE INDEX crons_due ON {s}.crons (next_run);
	ALTER TABLE {s}.queues
		ADD COLUMN rate_max      DOUBLE PRECISION,
		ADD COLUMN rate_duration BIGINT,
		ADD COLUMN rate_tokens   DOUBLE PRECISION,
		ADD COLUMN rate_at       BIGINT,
		ADD COLUMN rate_expires  BIGINT,
		ADD COLUMN rate_consumed BIGINT,
		ADD COLUMN conc_limit    BIGINT;`,
	`-- MIGRATION groups
	-- Job groups: a job's group, each group's state (pause, limits, its
	-- rate window, its turn), and a queue flag that keeps claims on
	-- queues without groups on their plain path. A dedup key's expiry.
	ALTER TABLE {s}.jobs
		ADD COLUMN group_id       TEXT,
		ADD COLUMN unique_expires BIGINT;
	CREATE INDEX jobs_group_claim ON {s}.jobs (queue, group_id, priority, seq) WHERE state = 1 AND group_id IS NOT NULL;
	CREATE INDEX jobs_group_active ON {s}.jobs (queue, group_id) WHERE state = 4 AND group_id IS NOT NULL;
	ALTER TABLE {s}.queues ADD COLUMN grouped BOOLEAN NOT NULL DEFAULT false;
	CREATE SEQUENCE {s}.group_turns;
	CREATE TABLE {s}.groups (
		queue         TEXT NOT NULL,
		group_id      TEXT NOT NULL,
		created       BIGSERIAL,
		served        BIGINT NOT NULL,
		paused        BOOLEAN NOT NULL DEFAULT false,
		manual_until  BIGINT NOT NULL DEFAULT 0,
		conc_limit    BIGINT,
		rate_max      BIGINT,
		rate_duration BIGINT,
		win_start     BIGINT NOT NULL DEFAULT 0,
		win_count     BIGINT NOT NULL DEFAULT 0,
		win_max       BIGINT NOT NULL DEFAULT 0,
		win_duration  BIGINT NOT NULL DEFAULT 0,
		PRIMARY KEY (queue, group_id)
	);`,
	`-- MIGRATION flows
	-- Dependencies not yet met: job_id waits for dep_id. A job that others
	-- wait for is marked (waited), so that completing any other job costs
	-- nothing more than it did.
	ALTER TABLE {s}.jobs ADD COLUMN waited BOOLEAN NOT NULL DEFAULT false;
	CREATE TABLE {s}.deps (
		dep_id TEXT NOT NULL,
		job_id TEXT NOT NULL,
		PRIMARY KEY (dep_id, job_id)
	);
	CREATE INDEX deps_job ON {s}.deps (job_id);`,
	`-- MIGRATION moves
	-- A queue's stall and DLQ policy (NULL: the default; dlq_max_age -1:
	-- entries never expire). A job row's lease_ttl is, without a lock, how
	-- long it may go without a heartbeat (NULL: stall detection is off).
	-- A DLQ row's dlq_at orders the DLQ, and dlq_due is when its entry
	-- expires or is retried automatically.
	ALTER TABLE {s}.queues
		ADD COLUMN stall_enabled      BOOLEAN,
		ADD COLUMN stall_interval     BIGINT,
		ADD COLUMN stall_max          INTEGER,
		ADD COLUMN stall_grace        BIGINT,
		ADD COLUMN dlq_auto_retry     BOOLEAN,
		ADD COLUMN dlq_retry_interval BIGINT,
		ADD COLUMN dlq_max_retries    INTEGER,
		ADD COLUMN dlq_max_age        BIGINT,
		ADD COLUMN dlq_max_entries    INTEGER;
	ALTER TABLE {s}.jobs
		ADD COLUMN lease_renewals INTEGER NOT NULL DEFAULT 0,
		ADD COLUMN dlq_at         BIGINT,
		ADD COLUMN dlq_due        BIGINT;
	CREATE INDEX jobs_dlq ON {s}.jobs (queue, dlq_at, seq) WHERE state = 6;
	CREATE INDEX jobs_dlq_due ON {s}.jobs (dlq_due) WHERE state = 6;`,
	`-- MIGRATION retention
	-- Completed jobs in completion order, for their retention; and the
	-- chores one broker of the namespace does at a time, each with when
	-- it is next due (the database's time, ms).
	CREATE INDEX jobs_done ON {s}.jobs (done_at, seq) WHERE state = 5;
	CREATE TABLE {s}.chores (
		name TEXT PRIMARY KEY,
		due  BIGINT NOT NULL
	);
	INSERT INTO {s}.chores (name, due) VALUES ('retain', 0);`,
	`-- MIGRATION group reaping
	-- Group rows are deleted once nothing is left of them (pg_group_reap.go):
	-- no job row in the group, whatever its state (the claim and active
	-- indexes cover states 1 and 4, this one the rest), and no settings,
	-- which groups_settings finds for their count limit.
	CREATE INDEX jobs_group_rest ON {s}.jobs (queue, group_id) WHERE group_id IS NOT NULL AND state IN (5, 6, 7);
	CREATE INDEX groups_settings ON {s}.groups (queue)
		WHERE paused OR conc_limit IS NOT NULL OR rate_max IS NOT NULL OR manual_until > 0;
	INSERT INTO {s}.chores (name, due) VALUES ('groups', 0);`,
	`-- MIGRATION byte-order keys
	-- The text columns that index keys are made of compare byte by byte
	-- (COLLATE "C"), as Go strings do in the other modes. Under the
	-- database's collation (C.UTF-8 here, en_US.UTF-8 on many hosts) each
	-- comparison in a B-tree went through strcoll: a fifth of the
	-- database's time in a drain went to keeping and searching the job id,
	-- queue and group keys, and the change made drains 14% faster.
	-- Columns compared with one another change together (a comparison
	-- of two collations is an error).
	ALTER TABLE {s}.jobs ALTER COLUMN id TYPE text COLLATE "C", ALTER COLUMN queue TYPE text COLLATE "C",
		ALTER COLUMN group_id TYPE text COLLATE "C", ALTER COLUMN unique_key TYPE text COLLATE "C";
	ALTER TABLE {s}.deps ALTER COLUMN dep_id TYPE text COLLATE "C", ALTER COLUMN job_id TYPE text COLLATE "C";
	ALTER TABLE {s}.job_logs ALTER COLUMN job_id TYPE text COLLATE "C";
	ALTER TABLE {s}.queues ALTER COLUMN name TYPE text COLLATE "C";
	ALTER TABLE {s}.groups ALTER COLUMN queue TYPE text COLLATE "C", ALTER COLUMN group_id TYPE text COLLATE "C";
	ALTER TABLE {s}.crons ALTER COLUMN name TYPE text COLLATE "C";`,
	`-- MIGRATION claims and completions in columns
	-- A claim writes a row's state, started_at and lease columns, and the
	-- completion of a plain job its state, done_at and result: not the
	-- job's record, which is now the job as last written in full (body)
	-- and which the state columns bring up to date when the row is read
	-- (pgOverlay). Rewriting the record at both steps was most of what a
	-- drain cost the database and the server. plain marks the jobs whose
	-- completion touches no other row: no parent, no repeat, not removed
	-- when completed, as the record last written says.
	-- The record's column is renamed so that a broker of an older version
	-- still running on the namespace, which would take a claimed row's
	-- record for the whole job, fails (its statements name record) rather
	-- than misreading it, until it is restarted with this version.
	ALTER TABLE {s}.jobs RENAME COLUMN record TO body;
	ALTER TABLE {s}.jobs ADD COLUMN started_at BIGINT, ADD COLUMN plain BOOLEAN NOT NULL DEFAULT false;`,
	`-- MIGRATION indexes by state
	-- No index over every row but the key: an UPDATE that changes a row's state
	-- enters the new version in every index whose predicate it meets, so
	-- the (queue, state) index cost each job three entries (pushed,
	-- claimed, completed), a third of the entries a job made, for the
	-- counts alone: without it a drain cost the database a tenth less CPU.
	-- Each state's rows are found by queue in that state's own index:
	-- waiting in jobs_claim, failed in jobs_dlq, and now active in
	-- jobs_lease (the queue second: the reaper reads it by expiry, a
	-- queue's count scans the active rows, which the workers bound),
	-- completed in jobs_done (by queue: the retention walks the queues)
	-- and waiting for children in jobs_children. A query over all of a
	-- queue's rows names each state (pgAnyState).
	DROP INDEX IF EXISTS {s}.jobs_queue_state;
	DROP INDEX IF EXISTS {s}.jobs_lease;
	CREATE INDEX jobs_lease ON {s}.jobs (lease_expires, queue) WHERE state = 4;
	DROP INDEX IF EXISTS {s}.jobs_done;
	CREATE INDEX jobs_done ON {s}.jobs (queue, done_at, seq) WHERE state = 5;
	DROP INDEX IF EXISTS {s}.jobs_children;
	CREATE INDEX jobs_children ON {s}.jobs (queue) WHERE state = 7;`,
	pgEnqueueMigration(),
	`-- MIGRATION statistics
	-- The chore of keeping the jobs table's statistics up with its size
	-- (pg_analyze.go).
	INSERT INTO {s}.chores (name, due) VALUES ('analyze', 0);`,
	pgHandlersMigration,
	pgEnqueueLeanMigration(),
	pgSetAsideMigration,
	pgDataMigration,
}

// pgAnyState is the condition of a row in any state, written as one arm
// for each state's index, so that the planner reads a queue's rows from
// those indexes (there is no index over every row).
const pgAnyState = `(state = {queued} OR state = {active} OR state = {done} OR state = {dlq} OR state = {children})`

// PG is the PostgreSQL engine of one broker.
type PG struct {
	pool *pgxpool.Pool
	url  string
	// connCfg is the pool's connection settings, for the LISTEN
	// connection, which lives outside the pool.
	connCfg *pgx.ConnConfig
	schema  string // quoted schema name
	chName  string // LISTEN/NOTIFY channel for wake-ups
	evName  string // LISTEN/NOTIFY channel for events (pg_events.go)
	// inboxName is the channel of transactional pushes (pg_enqueue.go).
	inboxName string
	inboxKick chan struct{}
	// statsWatch brings the statistics chore forward (pg_analyze.go).
	statsWatch pgStatsWatch
	broker     string // this broker's session id, written on its leases
	log        *slog.Logger
	b          *Broker // for what stays per broker: workers, subscribers, taps

	jobWaits pgJobWaits // WaitJob callers (pg_query.go)

	claimMu    sync.Mutex
	claimLanes pgClaimLanes // claims waiting for their round, by queue (claim)
	claimsRun  atomic.Int64 // claim rounds that went to the database
	acksRun    atomic.Int64 // ACK rounds that went to the database
	handed     atomic.Int64 // jobs pushes handed to sleeping pulls (pg_handoff.go)
	ackMu      sync.Mutex
	acks       pgRounds[*pgAckReq] // ACKs waiting for their round (ack)
	ackArrived chan struct{}       // poked by each ACK while a round gathers
	wmu        sync.Mutex
	waiters    map[string][]*pgWaiter
	drained    map[string]*pgDrained // queues a claim found empty, by queue (pg_wait.go)

	stop chan struct{}
	// stopCtx ends at Close: the background rounds run under it, so that
	// Close does not wait out a round stuck on the database (pgEvery).
	stopCtx    context.Context
	stopCancel context.CancelFunc
	sqlr       *strings.Replacer // PG.sql's
	sqlKept    sync.Map          // template -> statement, PG.sql's
	sqlKeptN   atomic.Int64      // statements kept
	wg         sync.WaitGroup
	// loops are the background loops' intervals, in the order every
	// started them (each starts pgLoopStagger after the one before).
	loops   []time.Duration
	loopsAt time.Time // when the first loop started

	ev    pgEvents                // pg_events.go
	peers pgPeers                 // pg_peers.go
	push  [pgPushLanes]pgPushLane // pg_pushbuf.go
	holds pgHolds                 // pg_release.go

	downMu    sync.Mutex
	down      error // the database is unreachable (for /health)
	downSince time.Time

	// listening is closed once the first LISTEN is in place and the other
	// brokers listening answered this one's hello, or did not within
	// pgHelloWait (pg_peers.go).
	listening chan struct{}
	listened  sync.Once

	clock pgClock // the database's clock (pg_clock.go)
	// cronNext is when the next schedule falls due, as last read (pg_cron.go).
	cronNext pgCronNext
	// keepCompleted bounds the namespace's completed jobs (0: no bound),
	// and retention (when set) deletes those older (pg_retain.go).
	keepCompleted int
	retention     *int64
}

// pgOptions are an engine's settings beyond the URL and namespace; the
// zero value is the default (tests lower the retention).
type pgOptions struct {
	keepCompleted int           // completed jobs kept; 0: all (tests bound them)
	retention     *int64        // completed jobs older than this many ms go; nil: none
	session       *pgSession    // nil: defaultPGSession
	helloWait     time.Duration // 0: pgHelloWait (pg_peers.go)
}

// pgNamespace turns a namespace into a schema name: queued_<ns>, of
// lower-case letters, digits and underscores.
func pgNamespace(ns string) (string, error) {
	if ns == "" {
		ns = "default"
	}
	for _, c := range ns {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c >= 'A' && c <= 'Z') {
			return "", fmt.Errorf("postgres namespace %q: use letters, digits and underscores", ns)
		}
	}
	if len(ns) > 50 {
		return "", fmt.Errorf("postgres namespace %q: at most 50 characters", ns)
	}
	return "queued_" + strings.ToLower(ns), nil
}

// OpenPG connects, creates or migrates the namespace's schema, and starts
// the listener and the lease reaper.
func OpenPG(ctx context.Context, url, namespace string, b *Broker, log *slog.Logger) (*PG, error) {
	return openPG(ctx, url, namespace, b, log, pgOptions{})
}

func openPG(ctx context.Context, url, namespace string, b *Broker, log *slog.Logger, o pgOptions) (*PG, error) {
	session := defaultPGSession
	if o.session != nil {
		session = *o.session
	}
	if err := refuseBunqueueTables(ctx, url, namespace); err != nil {
		return nil, err
	}
	p, err := connectPG(ctx, url, namespace, b, log, session)
	if err != nil {
		return nil, err
	}
	p.keepCompleted, p.retention = o.keepCompleted, o.retention
	// The broker's own clock, from here on only to tell how far off it is.
	p.clock.local = b.now
	if err := p.readClock(ctx); p.clock.cur.Load() == nil {
		p.pool.Close()
		p.stopCancel()
		return nil, err
	} else if err != nil {
		p.log.Warn("database clock", "err", err)
	}
	// The broker is told of this engine only now that it opened: a start
	// that failed is tried again with a new one (openPGWaiting), and the
	// failed one must not be left hearing the broker's events.
	b.storage = p.storageState
	b.addTap(p.jobWaits.tap)
	// Notices go to the other brokers when there are any: alone, a broker
	// builds none for want of a listener of its own.
	b.addNoticeTap(NoticeTap{wants: p.forwarding, take: p.forwardNotice})
	p.peers.key, p.peers.quiet, p.peers.helloWait = peerKey(p.schema), pgPeerQuiet, pgHelloWait
	if o.helloWait > 0 {
		p.peers.helloWait = o.helloWait
	}
	p.wg.Go(p.listen)
	p.wg.Go(p.forwarder)
	p.every(pgPeerCheck, nil, p.peerRound)
	p.every(250*time.Millisecond, nil, p.reapRound)
	p.every(pgCronTick, nil, p.cronRound)
	p.every(pgClockEvery, p.clock.kick, func(ctx context.Context) { p.readClock(ctx) })
	p.every(pgRetainEvery, nil, p.retainRound)
	p.statsWatch.kick = make(chan struct{}, 1)
	p.statsWatch.young.Store(true) // until the first look says otherwise
	p.every(pgRetainEvery, p.statsWatch.kick, p.analyzeRounds())
	p.every(pgInboxEvery, p.inboxKick, p.inboxRound)
	if !strings.Contains(url, "pool_min_conns=") {
		p.wg.Go(p.warmPool)
	}
	// Serve only once this broker hears the others: an event or wake-up
	// another broker sends before the LISTEN is in place is lost to this
	// one (a subscriber that connected at once missed the first events).
	select {
	case <-p.listening:
	case <-ctx.Done():
		p.log.Warn("serving before listening to the other brokers: their events may be missed until the listener connects", "err", ctx.Err())
	}
	return p, nil
}

// connectPG connects and brings the namespace's schema up to date, without
// starting a broker's loops (queued migrate writes through it).
func connectPG(ctx context.Context, url, namespace string, b *Broker, log *slog.Logger, session pgSession) (*PG, error) {
	schema, err := pgNamespace(namespace)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres url: %w", redactPG(err, url))
	}
	if session.poolSize > 0 {
		// At least pgMinPool: the broker's own loops (reaper, cron,
		// clock, retention, events) take connections beside requests.
		cfg.MaxConns = int32(min(max(session.poolSize, pgMinPool), 1000))
	} else if !strings.Contains(url, "pool_max_conns=") {
		// pgxpool's default (the CPUs, at least 4) starves a broker's
		// rounds of pushes, claims and ACKs; a URL that names its pool
		// size keeps it.
		cfg.MaxConns = max(cfg.MaxConns, 16)
	}
	pgSessionParams(cfg.ConnConfig, session, namespace)
	wakers := &pgWakers{}
	cfg.BeforeClose = wakers.closed
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", redactPG(err, url))
	}
	p := &PG{pool: pool, url: url, connCfg: cfg.ConnConfig.Copy(), schema: pgx.Identifier{schema}.Sanitize(), chName: schema + "_wake",
		evName: schema + "_events", inboxName: schema + "_inbox", inboxKick: make(chan struct{}, 1), ackArrived: make(chan struct{}, 1), ev: pgEvents{kick: make(chan struct{}, 1), wakers: wakers}, broker: brokerIDPrefix(session.brokerID) + newID(), log: log, b: b, waiters: map[string][]*pgWaiter{}, stop: make(chan struct{}),
		clock: pgClock{kick: make(chan struct{}, 1)}, listening: make(chan struct{})}
	p.stopCtx, p.stopCancel = context.WithCancel(context.Background())
	p.sqlr = sqlReplacer(p.schema)
	if err := p.migrate(ctx, schema); err != nil {
		pool.Close()
		p.stopCancel()
		return nil, err
	}
	return p, nil
}

// pgSession is what every session of the engine runs with, beyond the
// URL's own parameters.
type pgSession struct {
	// The database's limits on a session, in ms (0: none), as the
	// reference's BUNQUEUE_POSTGRES_*_TIMEOUT_MS set them: a statement's
	// run, a lock's wait, and a transaction left open with nothing sent.
	// The last is what frees the locks of a broker that vanished in the
	// middle of a transaction (a partition, a killed VM): the database
	// cannot tell such a peer from a slow one, and its TCP keepalive
	// takes two hours by default.
	statementTimeout, lockTimeout, idleTxTimeout int
	// poolSize caps the broker's connections (BUNQUEUE_POSTGRES_POOL_SIZE),
	// from pgMinPool up; 0: a URL's pool_max_conns, else at least 16.
	poolSize int
	// brokerID names the broker (BUNQUEUE_BROKER_ID): in pg_stat_activity
	// and at the head of its own id, which stays unique.
	brokerID string
	// tracer sees every statement the sessions send (tests count them).
	tracer pgx.QueryTracer
}

// brokerIDPrefix heads a broker's own id with the name it was given, if
// any: two brokers given the same name still tell their events apart.
func brokerIDPrefix(name string) string {
	if name == "" {
		return ""
	}
	return name + "/"
}

// pgMinPool is the fewest connections a broker's pool is given.
const pgMinPool = 8

// defaultPGSession are the reference's defaults. No statement of the
// engine runs for seconds, nor waits seconds on a lock but behind a
// transaction that has stalled; a transaction of the engine is never idle
// longer than a round trip.
var defaultPGSession = pgSession{statementTimeout: 30000, lockTimeout: 5000, idleTxTimeout: 30000}

// pgSessionParams sets what every session of the engine runs with, with
// the URL's own choice kept where it makes one. JIT off: the planner's
// cost estimate of the grouped claim's recursive CTE passes
// jit_above_cost even on a tiny table, and compiling it took ~330 ms per
// claim (inlining, optimization and emission) for a query that runs in
// well under a millisecond; no query of a job queue runs long enough to
// win that back. Generic plans: the statements are prepared once a
// session, and PostgreSQL otherwise plans the writes that take their rows
// from arrays (unnest) again at every execution, as their generic plan's
// guess of 100 rows an array looks dearer than a custom plan's; that
// planning was a third of the database's time for an ACK or a claim's
// UPDATE at a steady rate (0.3-0.4 ms a bind). Every statement of the
// engine reaches its rows through an index whatever its arguments.
// application_name names the namespace in pg_stat_activity.
func pgSessionParams(cfg *pgx.ConnConfig, s pgSession, namespace string) {
	set := func(k, v string) {
		if _, ok := cfg.RuntimeParams[k]; !ok {
			cfg.RuntimeParams[k] = v
		}
	}
	set("jit", "off")
	set("plan_cache_mode", "force_generic_plan")
	set("statement_timeout", strconv.Itoa(s.statementTimeout))
	set("lock_timeout", strconv.Itoa(s.lockTimeout))
	set("idle_in_transaction_session_timeout", strconv.Itoa(s.idleTxTimeout))
	set("application_name", pgAppName(namespace, s.brokerID))
	set("tcp_keepalives_idle", strconv.Itoa(int(pgKeepAlive.Idle.Seconds())))
	set("tcp_keepalives_interval", strconv.Itoa(int(pgKeepAlive.Interval.Seconds())))
	set("tcp_keepalives_count", strconv.Itoa(pgKeepAlive.Count))
	cfg.DialFunc = pgDial
	if s.tracer != nil {
		cfg.Tracer = s.tracer
	}
}

// pgAppName is the sessions' application_name: queued and the namespace,
// within PostgreSQL's 63 bytes.
func pgAppName(namespace, brokerID string) string {
	name := "queued " + cmp.Or(namespace, "default")
	if brokerID != "" {
		name += " " + brokerID
	}
	return name[:min(len(name), 63)]
}

// redactPG keeps a password in the URL out of an error message (see
// secrets.go); an error without one keeps its chain, and one with one is
// a redactedErr, which still unwraps to it.
func redactPG(err error, url string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if cfg, perr := pgconn.ParseConfig(url); perr == nil && cfg.Password != "" {
		msg = strings.ReplaceAll(msg, cfg.Password, maskedPassword)
	}
	if red := redactIn(msg, url); red != err.Error() {
		return &redactedErr{msg: red, err: err}
	}
	return err
}

// sql fills a statement's placeholders: {s}, the namespace's schema, and
// the row states by name ({queued}, {active}, {done}, {dlq}, {children}:
// the pg* constants above), so that no statement spells a state as a
// bare number.
//
// Statements are mostly constants, filled again on every call: a claim's
// took 3% of the broker's CPU at a steady 300 jobs/s in the replacer. The
// filled ones are kept, up to pgSQLKept of them (a statement built from
// its arguments is filled each time once they are all taken).
func (p *PG) sql(q string) string {
	if s, ok := p.sqlKept.Load(q); ok {
		return s.(string)
	}
	s := p.sqlr.Replace(q)
	if p.sqlKeptN.Add(1) <= pgSQLKept {
		p.sqlKept.Store(q, s)
	}
	return s
}

// pgSQLKept bounds the filled statements PG.sql keeps.
const pgSQLKept = 1024

// sqlReplacer is PG.sql's replacer for a schema.
func sqlReplacer(schema string) *strings.Replacer {
	n := func(v int) string { return strconv.Itoa(v) }
	return strings.NewReplacer("{s}", schema, "{queued}", n(pgQueued), "{active}", n(pgActive), "{done}", n(pgDone),
		"{dlq}", n(pgDLQ), "{children}", n(pgChildren), "{setaside}", n(pgSetAside))
}

// pgMigrateTimeout bounds the migration of an existing namespace's schema.
const pgMigrateTimeout = 30 * time.Minute

func (p *PG) migrate(ctx context.Context, schema string) error {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: %w", redactPG(err, p.url))
	}
	defer conn.Release()
	// One broker migrates at a time; the others wait for it.
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, "queued-migrate:"+schema); err != nil {
		return fmt.Errorf("postgres: take the migration lock: %w", err)
	}
	defer conn.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtext($1))`, "queued-migrate:"+schema)
	if _, err := conn.Exec(ctx, p.sql(`CREATE SCHEMA IF NOT EXISTS {s}; CREATE TABLE IF NOT EXISTS {s}.schema_version (version INTEGER NOT NULL)`)); err != nil {
		return fmt.Errorf("postgres: create schema %s: %w", schema, err)
	}
	var v int
	err = conn.QueryRow(ctx, p.sql(`SELECT version FROM {s}.schema_version`)).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := conn.Exec(ctx, p.sql(`INSERT INTO {s}.schema_version(version) VALUES (0)`)); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("postgres: read schema version: %w", err)
	}
	if v > len(pgMigrations) {
		return fmt.Errorf("postgres namespace %s has schema version %d, newer than this queued knows (%d); use a newer queued", schema, v, len(pgMigrations))
	}
	if v < len(pgMigrations) && v > 0 {
		// An older schema with its jobs: a migration may build indexes over
		// the whole table, which can take longer than a start's deadline
		// and a statement's limit. It has its own bound, and is still
		// cancelled when the start is (a stop).
		p.log.Info("migrating the namespace's schema", "namespace", schema, "from", v, "to", len(pgMigrations))
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pgMigrateTimeout)
		defer cancel()
		stop := context.AfterFunc(ctx, func() {
			if errors.Is(ctx.Err(), context.Canceled) {
				cancel()
			}
		})
		defer stop()
		ctx = mctx
	}
	for ; v < len(pgMigrations); v++ {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = 0`); err != nil {
			tx.Rollback(ctx)
			return fmt.Errorf("postgres: migration to schema version %d: %w", v+1, err)
		}
		// {inbox} is the channel the transactional pushes notify (pg_enqueue.go).
		if _, err := tx.Exec(ctx, strings.ReplaceAll(p.sql(pgMigrations[v]), "{inbox}", p.inboxName)); err != nil {
			tx.Rollback(ctx)
			return fmt.Errorf("postgres: migration to schema version %d: %w", v+1, err)
		}
		if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.schema_version SET version = $1`), v+1); err != nil {
			tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("postgres: migration to schema version %d: %w", v+1, err)
		}
	}
	return nil
}

// Close stops the listener and the reaper and closes the pool.
func (p *PG) Close() {
	select {
	case <-p.stop:
		return
	default:
	}
	close(p.stop)
	p.stopCancel()
	p.peers.mu.Lock()
	p.endHelloWait()
	p.peers.mu.Unlock()
	p.wg.Wait()
	// The pool waits for every connection to be closed, and pgx closes a
	// connection whose statement was cancelled (the background rounds' at
	// Close) by reading until the database hangs up, for up to 15 s: over
	// TLS, a write cut short leaves the database waiting for the rest, and
	// it never hangs up. A stop must not wait on that: what is left is
	// closed with the process.
	closed := make(chan struct{})
	go func() {
		p.pool.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(pgCloseWait):
		p.log.Warn("PostgreSQL connections still closing; left to close with the process", "waited", pgCloseWait)
	}
}

// pgCloseWait bounds how long Close waits for the pool's connections.
const pgCloseWait = 3 * time.Second

// setDown records whether the background work (the listener, the reaper,
// cron) reaches the database; nil: it does again.
func (p *PG) setDown(err error) {
	p.downMu.Lock()
	defer p.downMu.Unlock()
	if err != nil && p.down == nil {
		p.log.Error("postgres unreachable", "err", redactPG(err, p.url))
		p.downSince = time.Now()
	} else if err == nil && p.down != nil {
		p.log.Info("postgres reachable again", "after", time.Since(p.downSince).Round(time.Millisecond).String())
	}
	if err != nil {
		err = redactPG(err, p.url)
	}
	p.down = err
}

// Down reports a lost database.
func (p *PG) Down() error {
	p.downMu.Lock()
	defer p.downMu.Unlock()
	return p.down
}

// storageState is what StorageStatus and /health report in PostgreSQL
// mode: degraded while the database cannot be reached.
func (p *PG) storageState() StorageState {
	p.downMu.Lock()
	defer p.downMu.Unlock()
	st := StorageState{Driver: "postgres", Location: strings.Trim(p.schema, `"`)}
	if p.down != nil {
		st.Err, st.Since = pgErr(p.down), p.downSince
	}
	return st
}

// ---------------------------------------------------------------------------
// Wake-ups

// listen keeps a connection LISTENing and wakes local pulls on pushes from
// any broker. When the connection drops it reconnects, with backoff; pulls
// then rely on their own timers.
func (p *PG) listen() {
	var backoff time.Duration
	for lost := false; ; lost = true {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-p.stop:
			case <-ctx.Done():
			}
			cancel()
		}()
		up, err := p.listenOnce(ctx, lost)
		cancel()
		select {
		case <-p.stop:
			return
		default:
		}
		p.setDown(err)
		backoff = listenBackoff(backoff, up)
		select {
		case <-p.stop:
			return
		case <-time.After(backoff):
		}
	}
}

// listenBackoff is the wait before the listener's next connection: it
// doubles, up to 5 s, while the database stays away or drops the
// listener soon after it is in place (a database in a crash loop), and
// starts again at 100 ms once a listener had served for listenSteady
// (before, an outage long after an earlier one waited 5 s before its
// first try). up is how long the last listener served.
func listenBackoff(last, up time.Duration) time.Duration {
	if up >= listenSteady || last <= 0 {
		return 100 * time.Millisecond
	}
	return min(last*2, 5*time.Second)
}

// listenSteady is how long a listener must have served for its loss to
// be a new outage rather than the same one going on.
const listenSteady = 5 * time.Second

// listenOnce listens until the connection fails; up is how long it served
// (0: it never got as far as serving).
func (p *PG) listenOnce(ctx context.Context, again bool) (up time.Duration, err error) {
	conn, err := pgx.ConnectConfig(ctx, p.connCfg.Copy())
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	for _, ch := range []string{p.chName, p.evName, p.inboxName} {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return 0, err
		}
	}
	if again {
		p.log.Info("postgres wake-ups listening again")
	}
	// A notification may have been missed while not listening. Woken
	// before the broker is announced as serving (holdPresence), so that
	// this wake-up does not come to the pulls of a broker that has just
	// opened at a moment of its own.
	p.ev.wakers.forget()
	p.wakeAll()
	p.kickInbox()
	defer p.lostPresence()
	if err := p.holdPresence(ctx, conn); err != nil {
		return 0, err
	}
	p.setDown(nil)
	serving := time.Now()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return time.Since(serving), err
		}
		switch {
		case n.Channel == p.evName:
			p.received(n.Payload)
		case n.Channel == p.inboxName:
			p.kickInbox()
		case p.ev.wakers.own(n.PID):
			// This broker's own wake-up, come back: its pulls were woken
			// when it was sent (wakeEverywhere).
		default:
			p.wake(n.Payload)
		}
	}
}

// notify wakes the pulls waiting on queue, on every broker, once tx has
// committed. In a transaction from p.begin the wake is sent after the
// commit, batched with others (pg_events.go): PostgreSQL serializes the
// commits of transactions that NOTIFY, fsync and all, so a NOTIFY inside
// every push would cap pushes at one commit at a time.
func (p *PG) notify(ctx context.Context, q pgx.Tx, queue string) error {
	if t, ok := q.(*pgTx); ok {
		if !slices.Contains(t.wakes, queue) {
			t.wakes = append(t.wakes, queue)
		}
		return nil
	}
	// Only queued migrate, which serves no pulls, comes here: a broker
	// skips the wake-ups of its own pool connections (pgWakers), so one
	// sent here would not wake its own pulls.
	_, err := q.Exec(ctx, `SELECT pg_notify($1, $2)`, p.chName, queue)
	return err
}

// pgTx is a transaction whose wake-ups go out after it commits.
type pgTx struct {
	pgx.Tx
	p     *PG
	wakes []string
}

// begin starts a transaction whose notify calls wait for its commit.
func (p *PG) begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := p.beginLazy(ctx)
	if err != nil {
		return nil, err
	}
	return &pgTx{Tx: tx, p: p}, nil
}

func (t *pgTx) Commit(ctx context.Context) error {
	if err := t.Tx.Commit(ctx); err != nil {
		return err
	}
	if len(t.wakes) > 0 {
		t.p.wakeEverywhere(t.wakes, nil)
	}
	return nil
}

// txJobs runs query (which locks job rows and returns their records) in a
// transaction and hands the decoded jobs to fn, then commits. A row whose
// record cannot be read is set aside and the query run again in a new
// transaction (pg_unreadable.go): fn runs once, over rows it can read.
func (p *PG) txJobs(ctx context.Context, query string, args []any, fn func(tx pgx.Tx, jobs []*Job) error) error {
	var tx pgx.Tx
	var jobs []*Job
	err := p.pastUnreadable(ctx, func() (err error) {
		tx, jobs, err = p.beginScan(ctx, query, args)
		return err
	})
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	if len(jobs) == 0 {
		return tx.Commit(ctx)
	}
	if err := fn(tx, jobs); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// beginScan begins a transaction and runs query in it, for txJobs; after
// an error the transaction is rolled back.
func (p *PG) beginScan(ctx context.Context, query string, args []any) (pgx.Tx, []*Job, error) {
	tx, err := p.begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	var jobs []*Job
	br, err := sendPlanned(ctx, tx, query, args...)
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err != nil {
			br.Close()
		} else {
			jobs, err = scanJobs(rows)
			err = errors.Join(err, br.Close())
		}
	}
	if err != nil {
		tx.Rollback(context.Background())
		return nil, nil, err
	}
	return tx, jobs, nil
}

// pgFailJob applies a failed attempt to a job taken from a row: retry with
// backoff, or the end (the DLQ, or removal, which the caller handles).
// It returns false when the job is to be removed.
func pgFailJob(j *Job, f failure, dlq DLQConfig, now int64) bool {
	j.setLease(nil)
	retry, reason := failedAttempt(j, f, now)
	if retry {
		j.state = StateDelayed
		return true
	}
	if j.cold().RemoveOnFail || f.removeOnFail {
		return false
	}
	pgDeadLetter(j, reason, f.err, f.hasErr, dlq, now)
	return true
}

// pgDeadLetter moves a job taken from a row to the DLQ under its queue's
// policy; the caller saves it and trims the DLQ (pgTrimDLQ).
func pgDeadLetter(j *Job, reason, err string, hasErr bool, cfg DLQConfig, now int64) {
	// An entry on a job that is not in the DLQ was kept by an auto-retry
	// (a retry by hand drops it): it carries on.
	kept := j.dlq != nil && j.state != StateFailed
	j.state = StateFailed
	j.warm().failErr, j.warm().hasFail = err, hasErr
	j.setLease(nil)
	j.dlq = dlqEntry(j.dlq, kept, cfg, reason, err, hasErr, now)
	// Announced by the first event told of it once committed (PG.emit).
	j.dlqNew = true
}

// pgErr names the database in an error that reaches a client.
func pgErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("storage error (postgres): %w", err)
}

// pgRefusedOr is a refusal as it is, anything else as the database's.
func pgRefusedOr(err error) error {
	var rf pgRefused
	if errors.As(err, &rf) {
		return rf.error
	}
	return pgErr(err)
}

// pgOpTimeout bounds one engine operation's database work.
const pgOpTimeout = 30 * time.Second

// opCtx bounds one engine operation's database work: by the caller's
// context (the connection's) and by pgOpTimeout.
func (p *PG) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, pgOpTimeout)
}

// inTx runs fn in a transaction, committed when fn returns nil and rolled
// back otherwise. fn's error comes back as it is; failing to begin or to
// commit is a storage error. Wake-ups fn sends go out after the commit
// (pgTx). Wrap it in pgRetry when the transaction may deadlock.
func (p *PG) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := p.begin(ctx)
	if err != nil {
		return pgErr(err)
	}
	defer tx.Rollback(context.Background())
	if err := fn(tx); err != nil {
		return err
	}
	return pgErr(tx.Commit(ctx))
}

// closing reports that the engine is stopping.
func (p *PG) closing() bool { return isClosed(p.stop) }

// isClosed reports whether ch, a channel only ever closed, is.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
