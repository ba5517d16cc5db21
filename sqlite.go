package main

// SQLite storage: one file, WAL mode, a write buffer with group commit.
//
// The broker reports every state change under its shard lock; the store
// encodes the job's record there and files it in a pending set keyed by job
// id, so that a job changed many times between two flushes is written once.
// One writer goroutine commits the pending set as one transaction of
// multi-row statements when 1,000 changes are pending (fewer while clients
// wait on the backlog: flushAt) or 10 ms after the first, whichever comes
// first. A push marked durable waits for the commit
// that holds it before it is answered.
//
// Guarantees: with --sync normal (the default) a committed transaction
// survives the process dying (kill -9, OOM, panic); with --sync full it also
// survives the machine losing power. An ordinary change is committed about
// 10 ms after it was answered; a durable push before it is answered.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// Changes that trigger a flush at once (or fewer, when clients wait
	// on a smaller backlog: flushAt). Under load a commit carries this
	// many: each commit writes every page it touched to the WAL again,
	// and 1,000 rather than 100 took about 7% off SQLite mode's CPU per job
	// (docs/performance.md). A change still waits at most flushInterval
	// for its flush, so what a crash can lose is as before.
	flushOps = 1000
	// rateBatch is the smallest flush that measures the write rate.
	rateBatch          = 100
	flushInterval      = 10 * time.Millisecond // the longest a change waits for a flush
	rowsPerStmt        = 100                   // rows per multi-row statement
	sqlitePageSize     = 16384                 // bytes a page, for a new file
	walCheckpointBytes = 4 << 20               // the WAL's size at which the writer checkpoints it
	// When clients change state faster than the disk takes it, they wait
	// once the backlog is what the writer commits in backlogTarget, so an
	// answered change is on disk within a few tens of ms whatever the disk
	// (it is measured, not assumed): clients slow to the disk's pace.
	backlogTarget = 40 * time.Millisecond
	minBacklog    = 256
	maxBacklog    = 16384
	schemaVersion = 6 // len(migrations)
)

// migrations[i] brings the schema from version i to i+1.
var migrations = []string{
	// A job's row is keyed by its admission sequence number, which is
	// unique for the life of the database and grows, so inserts append to
	// the table's B-tree. The record holds everything else.
	`CREATE TABLE jobs (
		seq    INTEGER PRIMARY KEY,
		record BLOB NOT NULL
	);
	CREATE TABLE results (
		seq    INTEGER PRIMARY KEY,
		result BLOB NOT NULL
	);
	CREATE TABLE queues (
		name     TEXT PRIMARY KEY,
		settings BLOB NOT NULL
	) WITHOUT ROWID;
	CREATE TABLE job_logs (
		job_id TEXT PRIMARY KEY,
		logs   BLOB NOT NULL
	) WITHOUT ROWID;`,
	// Webhooks. A rowid table, so that rowid order is registration order
	// (an upsert keeps the row's rowid). events is a JSON array of names.
	`CREATE TABLE webhooks (
		id         TEXT PRIMARY KEY,
		url        TEXT NOT NULL,
		events     TEXT NOT NULL,
		queue      TEXT,
		secret     TEXT,
		created_at INTEGER NOT NULL,
		enabled    INTEGER NOT NULL
	);`,
	// Cron schedules, with their next run and executions.
	`CREATE TABLE crons (
		name   TEXT PRIMARY KEY,
		record BLOB NOT NULL
	) WITHOUT ROWID;`,
	// Completed history (sqlite_history.go): the rows of completed jobs
	// that left the memory's cache are marked; the indexes hold those rows
	// only.
	`ALTER TABLE jobs ADD COLUMN id TEXT;
	ALTER TABLE jobs ADD COLUMN queue TEXT;
	ALTER TABLE jobs ADD COLUMN created_at INTEGER;
	ALTER TABLE jobs ADD COLUMN done_at INTEGER;
	CREATE INDEX jobs_retired_id ON jobs(id) WHERE id IS NOT NULL;
	CREATE INDEX jobs_retired_list ON jobs(queue, created_at, id) WHERE id IS NOT NULL;
	CREATE INDEX jobs_retired_done ON jobs(done_at) WHERE id IS NOT NULL;
	CREATE INDEX jobs_retired_queue_done ON jobs(queue, done_at) WHERE id IS NOT NULL;`,
	// HTTP handlers (urlworker.go), one a queue; rowid order is
	// registration order (a handler set again is deleted and inserted).
	`CREATE TABLE handlers (
		queue TEXT PRIMARY KEY,
		spec  TEXT NOT NULL
	);`,
	// Tombstones of big deletions (sqlite_purge.go): the rows of the jobs
	// a list names are dead until the writer has deleted them.
	`CREATE TABLE purges (
		id   INTEGER PRIMARY KEY,
		seqs BLOB NOT NULL
	);`,
}

// pendingJob is the latest unwritten change of one job (a removal is in
// SQLiteStore.dels instead).
type pendingJob struct {
	record []byte // nil when the change only retires the job
	result []byte // set when the job completed with a result
	retire *retireInfo
}

// SQLiteStore implements Store on one SQLite file.
type SQLiteStore struct {
	path string
	log  *slog.Logger
	db   *sql.DB

	mu       sync.Mutex
	jobs     map[int64]*pendingJob
	dels     []int64               // jobs removed, by number (written after the changes)
	queues   map[string][]byte     // nil value: delete
	logs     map[string][]LogEntry // encoded when written; nil value: delete
	crons    map[string][]byte     // nil value: delete
	n        int                   // pending changes
	first    time.Time
	barriers []chan error
	err      error // the last flush failure, nil when writes succeed
	errSince time.Time
	closed   bool
	started  bool
	holds    int        // Hold()s in progress: no flush may split them
	unheld   *sync.Cond // signalled when holds drops to zero
	limit    int        // backlog at which writers wait
	rate     float64    // changes committed per second, smoothed
	room     *sync.Cond // signalled when the backlog shrinks

	kick chan struct{}
	done chan struct{}

	// dropped counts changes that could never be written (a row SQLite
	// refuses): each was logged and left out so the rest could be written.
	dropped atomic.Uint64

	stmts  map[string]*sql.Stmt // on the writer connection
	wconn  *sql.Conn
	seqBuf []int64 // the writer's, reused by each flush (writeJobs)

	// arena is the chunk pending job records are copied into, under mu
	// (see keepRecord).
	arena []byte

	// retiring are the retirements not yet written, by job id (their
	// rows are not marked yet: Retired looks here first).
	retiring map[string]int64

	// purging are the tombstones whose rows the writer still deletes
	// (sqlite_purge.go); only the writer touches them once it runs.
	purging    []purgeList
	purgeRetry time.Time    // no step before this, after a failed one
	purgeLast  time.Time    // when the last step began
	purgeLeft  atomic.Int64 // rows still to delete, for reports
	purgeMin   int          // removals in a flush from which a tombstone is written

	// A job pushed and removed before any flush took it has no row, and
	// its removal writes nothing (with removeOnComplete, a job that lived
	// less than a flush's window costs no write at all). noted is the
	// highest job number given a pending change; taken the highest a
	// flush took, or the file may hold: a number above taken has never
	// been written. Until Load, taken admits none.
	noted, taken int64
}

// Records are encoded into a scratch buffer from recPool and copied into
// a shared chunk of arenaChunk bytes: a record a job change, each in an
// allocation of its own sized for the worst case, was a third of what
// the server allocated in SQLite mode. A chunk is not reused; it is
// freed once the records in it are written and dropped.
const (
	arenaChunk  = 64 << 10
	arenaRecMax = 4 << 10 // larger records get an allocation of their own
)

var recPool = sync.Pool{New: func() any { return &Enc{B: make([]byte, 0, 512)} }}

// keepRecord copies rec into the arena and returns the copy; s.mu is held.
func (s *SQLiteStore) keepRecord(rec []byte) []byte {
	n := len(rec)
	if n > arenaRecMax {
		return clone(Raw(rec))
	}
	if cap(s.arena)-len(s.arena) < n {
		s.arena = make([]byte, 0, arenaChunk)
	}
	at := len(s.arena)
	s.arena = append(s.arena, rec...)
	return s.arena[at : at+n : at+n]
}

// OpenSQLite opens (creating if needed) the database at path and migrates
// its schema. sync is "normal" or "full".
func OpenSQLite(path, syncMode string, log *slog.Logger) (*SQLiteStore, error) {
	return openSQLite(path, syncMode, log, "")
}

// openSQLite takes extra pragmas for tests (a page limit stands in for a
// full disk).
func openSQLite(path, syncMode string, log *slog.Logger, extra string) (*SQLiteStore, error) {
	if syncMode != "normal" && syncMode != "full" {
		return nil, fmt.Errorf("--sync %q: want normal or full", syncMode)
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("data path %s: cannot create its folder: %w", path, err)
		}
	}
	// A new file gets 16 KB pages: a flush writes its rows in their order
	// (sqlite_write.go), and with pages four times as large it touches a
	// quarter as many, each written to the WAL as one frame and checkpointed
	// once (BenchmarkStoreLifecycle: 13.3 -> 10.7 us a job). The page size
	// is fixed once WAL mode is set, so journal mode goes by the driver's
	// _journal_mode key, which it applies after every _pragma (those it
	// sorts by name, which would put journal_mode first). A file made with
	// smaller pages keeps them.
	dsn := "file:" + path + "?_pragma=page_size(" + itoa(sqlitePageSize) + ")&_journal_mode=WAL" +
		"&_pragma=synchronous(" + strings.ToUpper(syncMode) +
		")&_pragma=busy_timeout(10000)&_pragma=foreign_keys(OFF)&_pragma=temp_store(MEMORY)&_txlock=immediate" + extra
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("data path %s: %w", path, err)
	}
	db.SetMaxOpenConns(4)
	s := &SQLiteStore{path: path, log: log, db: db, jobs: map[int64]*pendingJob{}, queues: map[string][]byte{},
		logs: map[string][]LogEntry{}, crons: map[string][]byte{}, kick: make(chan struct{}, 1), done: make(chan struct{}), stmts: map[string]*sql.Stmt{},
		retiring: map[string]int64{}}
	s.room = sync.NewCond(&s.mu)
	s.unheld = sync.NewCond(&s.mu)
	s.limit = 4096
	s.purgeMin = purgeMin
	s.taken = math.MaxInt64
	if err := s.migrate(); err != nil {
		db.Close()
		return nil, fmt.Errorf("data path %s: %w", path, err)
	}
	ctx := context.Background()
	if s.wconn, err = db.Conn(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("data path %s: %w", path, err)
	}
	if err := s.checkpointAt(ctx, walCheckpointBytes); err != nil {
		s.wconn.Close()
		db.Close()
		return nil, fmt.Errorf("data path %s: %w", path, err)
	}
	return s, nil
}

// checkpointAt has the writer checkpoint the WAL once it holds about size
// bytes, whatever the file's page size (SQLite counts pages: its default
// of 1,000 was 4 MB with 4 KB pages).
func (s *SQLiteStore) checkpointAt(ctx context.Context, size int64) error {
	var pageSize int64
	if err := s.wconn.QueryRowContext(ctx, `PRAGMA page_size`).Scan(&pageSize); err != nil {
		return fmt.Errorf("read the page size: %w", err)
	}
	if pageSize <= 0 {
		return fmt.Errorf("the file reports a page size of %d bytes", pageSize)
	}
	if _, err := s.wconn.ExecContext(ctx, "PRAGMA wal_autocheckpoint = "+itoa(max(size/pageSize, 1))); err != nil {
		return fmt.Errorf("set the WAL checkpoint: %w", err)
	}
	return nil
}

func (s *SQLiteStore) migrate() error {
	ctx := context.Background()
	// A bunqueue data file is left as it is: it is read by queued migrate.
	var theirs, ours int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE name IN ('migrations', 'cron_jobs', 'job_results', 'queue_state')),
		count(*) FILTER (WHERE name = 'schema_version') FROM sqlite_master WHERE type = 'table'`).Scan(&theirs, &ours); err != nil {
		return fmt.Errorf("cannot read the database: %w", err)
	}
	if theirs == 4 && ours == 0 {
		return fmt.Errorf("%s is a bunqueue data file; queued keeps its own format. Bring its jobs across into a new file first: "+
			"queued migrate --from-bunqueue %s --data-path NEW.db, then start queued with --data-path NEW.db (docs/migrating.md)", s.path, s.path)
	}
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("cannot write to the database: %w", err)
	}
	var v int
	err := s.db.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		if _, err := s.db.ExecContext(ctx, `INSERT INTO schema_version(version) VALUES (0)`); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if v > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this queued knows (%d); use a newer queued", v, len(migrations))
	}
	for ; v < len(migrations); v++ {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration to schema version %d: %w", v+1, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE schema_version SET version = ?`, v+1); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migration to schema version %d: %w", v+1, err)
		}
	}
	return nil
}

// Start runs the writer goroutine until Close.
func (s *SQLiteStore) Start() {
	s.mu.Lock()
	s.started = true
	s.mu.Unlock()
	go s.writer()
}

// ---------------------------------------------------------------------------
// Recording changes (called under shard locks: no I/O here)

func (s *SQLiteStore) note() {
	s.n++
	if s.n == 1 {
		s.first = time.Now()
	}
	if s.n == 1 || s.n >= s.flushAt() {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// flushAt is the backlog that starts a flush at once, under s.mu: half
// the backlog at which clients wait (Throttle) when that is small, so
// that a flush is under way before they would, as at 100.
func (s *SQLiteStore) flushAt() int { return min(flushOps, s.limit/2) }

func (s *SQLiteStore) JobChanged(j *Job, result Raw) {
	e := recPool.Get().(*Enc)
	e.B = e.B[:0]
	encodeRecord(e, j)
	var res []byte
	if result != nil {
		res = clone(result)
	}
	s.mu.Lock()
	p := s.pendingOf(j.seq)
	p.record = s.keepRecord(e.B)
	if res != nil || j.state != StateCompleted {
		p.result = res
	}
	s.mu.Unlock()
	if cap(e.B) <= arenaRecMax {
		recPool.Put(e) // a big job's buffer is not kept
	}
}

func (s *SQLiteStore) JobRemoved(j *Job) {
	s.mu.Lock()
	switch p := s.jobs[j.seq]; {
	case p != nil && j.seq > s.taken && p.retire == nil:
		// Never taken by a flush: no row to delete.
		delete(s.jobs, j.seq)
		s.n--
		if s.n < s.limit {
			// Clients waiting on the backlog (Throttle) have room now;
			// no flush may come to tell them (nothing else pending).
			s.room.Broadcast()
		}
	case p != nil:
		// The removal takes the place of the change.
		delete(s.jobs, j.seq)
		s.dels = append(s.dels, j.seq)
	default:
		// A slice rather than an entry each: an Obliterate of a million
		// jobs spent half its time filing them.
		s.dels = append(s.dels, j.seq)
		s.note()
	}
	s.mu.Unlock()
}

// pendingOf is the job's pending change, made if there is none; s.mu is
// held.
func (s *SQLiteStore) pendingOf(seq int64) *pendingJob {
	p := s.jobs[seq]
	if p == nil {
		// One allocation each: changes taken from shared chunks would keep
		// the records and results of flushed ones reachable (up to a
		// chunk of big results) while a neighbour is pending.
		p = &pendingJob{}
		s.jobs[seq] = p
		s.note()
		s.noted = max(s.noted, seq)
	}
	return p
}

func (s *SQLiteStore) QueueChanged(q *Queue) {
	b := encodeQueueSettings(q)
	s.mu.Lock()
	if _, ok := s.queues[q.name]; !ok {
		s.note()
	}
	s.queues[q.name] = b
	s.mu.Unlock()
}

func (s *SQLiteStore) QueueRemoved(name string) {
	s.mu.Lock()
	if _, ok := s.queues[name]; !ok {
		s.note()
	}
	s.queues[name] = nil
	s.mu.Unlock()
}

func (s *SQLiteStore) CronChanged(c *CronSchedule) {
	b := encodeCronRecord(c)
	s.mu.Lock()
	if _, ok := s.crons[c.Name]; !ok {
		s.note()
	}
	s.crons[c.Name] = b
	s.mu.Unlock()
}

func (s *SQLiteStore) CronRemoved(name string) {
	s.mu.Lock()
	if _, ok := s.crons[name]; !ok {
		s.note()
	}
	s.crons[name] = nil
	s.mu.Unlock()
}

// LogsChanged keeps logs as they are (the broker hands over a slice it
// does not change afterwards): they are encoded once, when written, not on
// every AddLog.
func (s *SQLiteStore) LogsChanged(id string, logs []LogEntry) {
	if len(logs) == 0 {
		logs = nil
	}
	s.mu.Lock()
	if _, ok := s.logs[id]; !ok {
		s.note()
	}
	s.logs[id] = logs
	s.mu.Unlock()
}

func (s *SQLiteStore) Hold() {
	s.mu.Lock()
	s.holds++
	s.mu.Unlock()
}

func (s *SQLiteStore) Release() {
	s.mu.Lock()
	if s.holds--; s.holds == 0 {
		s.unheld.Broadcast()
	}
	s.mu.Unlock()
}

// errStoreClosed is Sync's answer once Close has begun; Close writes what
// was recorded before it.
var errStoreClosed = errors.New("storage is closed")

// Sync waits until everything recorded so far is committed.
func (s *SQLiteStore) Sync() error {
	ch := make(chan error, 1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errStoreClosed
	}
	s.barriers = append(s.barriers, ch)
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return <-ch
}

// Admit says whether new jobs may be taken: not while writes fail. Like
// Throttle it first waits for the backlog to shrink.
func (s *SQLiteStore) Admit() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waitRoom()
	if s.err != nil {
		return fmt.Errorf("storage unavailable, new jobs refused: %v", s.err)
	}
	return nil
}

// Throttle waits while the backlog is over its bound, so that a client
// faster than the disk is slowed to the disk's pace instead of the backlog
// (and with it the data a crash would lose) growing.
func (s *SQLiteStore) Throttle() {
	s.mu.Lock()
	s.waitRoom()
	s.mu.Unlock()
}

func (s *SQLiteStore) waitRoom() {
	for s.n >= s.limit && s.err == nil && !s.closed {
		s.room.Wait()
	}
}

// Status reports the last write failure, if writes are failing.
func (s *SQLiteStore) Status() (since time.Time, backlog int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errSince, s.n, s.err
}

// Describe names the storage for status reports.
func (s *SQLiteStore) Describe() (driver, path string) { return "sqlite", s.path }

// isDiskFull recognises SQLite's "database or disk is full" (SQLITE_FULL)
// and the operating system's ENOSPC.
func isDiskFull(err error) bool {
	if err == nil {
		return false
	}
	m := strings.ToLower(err.Error())
	return strings.Contains(m, "disk is full") || strings.Contains(m, "no space left") || strings.Contains(m, "sqlite_full")
}

// Close flushes what is pending and closes the database.
func (s *SQLiteStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	started := s.started
	s.room.Broadcast()
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	if started {
		<-s.done
	}
	for _, st := range s.stmts {
		st.Close()
	}
	s.wconn.Close()
	_, pending, err := s.Status()
	if cerr := s.db.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("closing %s with %d changes unwritten: %w", s.path, pending, err)
	}
	return nil
}

// Backup writes a consistent copy of the live database to dst.
func (s *SQLiteStore) Backup(ctx context.Context, dst string) error {
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("backup target %s exists", dst)
	}
	if _, err := s.db.ExecContext(ctx, `VACUUM INTO ?`, dst); err != nil {
		return fmt.Errorf("backup of %s to %s: %w", s.path, dst, err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Webhooks: few, rarely changed, so written at once rather than through
// the write buffer; AddWebhook answers once its webhook is on disk.

const webhookWriteTimeout = 15 * time.Second

func (s *SQLiteStore) SaveWebhook(w *Webhook) error {
	events, err := json.Marshal(w.Events)
	if err != nil {
		return fmt.Errorf("encode webhook events: %w", err)
	}
	var queue, secret any
	if w.Queue != "" {
		queue = w.Queue
	}
	if w.Secret != "" {
		secret = w.Secret
	}
	enabled := 0
	if w.Enabled {
		enabled = 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), webhookWriteTimeout)
	defer cancel()
	_, err = s.db.ExecContext(ctx, `INSERT INTO webhooks(id, url, events, queue, secret, created_at, enabled)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT(id) DO UPDATE SET url=excluded.url, events=excluded.events, queue=excluded.queue,
			secret=excluded.secret, created_at=excluded.created_at, enabled=excluded.enabled`,
		w.ID, w.URL, string(events), queue, secret, w.CreatedAt, enabled)
	if err != nil {
		return fmt.Errorf("save webhook %s in %s: %w", w.ID, s.path, err)
	}
	return nil
}

func (s *SQLiteStore) DeleteWebhook(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), webhookWriteTimeout)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, `DELETE FROM webhooks WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete webhook %s in %s: %w", id, s.path, err)
	}
	return nil
}

// LoadWebhooks returns the stored webhooks in registration order.
func (s *SQLiteStore) LoadWebhooks() ([]*Webhook, error) {
	rows, err := s.db.QueryContext(context.Background(),
		`SELECT id, url, events, queue, secret, created_at, enabled FROM webhooks ORDER BY rowid`)
	if err != nil {
		return nil, fmt.Errorf("read webhooks from %s: %w", s.path, err)
	}
	defer rows.Close()
	var out []*Webhook
	for rows.Next() {
		w := &Webhook{}
		var events string
		var queue, secret sql.NullString
		var enabled int
		if err := rows.Scan(&w.ID, &w.URL, &events, &queue, &secret, &w.CreatedAt, &enabled); err != nil {
			return nil, fmt.Errorf("read webhooks from %s: %w", s.path, err)
		}
		if err := json.Unmarshal([]byte(events), &w.Events); err != nil {
			return nil, fmt.Errorf("webhook %s: events unreadable: %w", w.ID, err)
		}
		if w.Events == nil {
			w.Events = []string{}
		}
		w.Queue, w.Secret, w.Enabled = queue.String, secret.String, enabled != 0
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read webhooks from %s: %w", s.path, err)
	}
	return out, nil
}
