package main

// queued migrate: a SQLite deployment moves into a PostgreSQL namespace in
// one command. The data file must not be live: a running server holds its
// lock (datalock.go), and the migration takes that lock for itself while it
// reads, so no server starts on the file meanwhile.
//
// What moves is what a restart on the file would bring back: jobs in every
// state (an active job's worker is gone, so it waits again with its
// attempts kept), completed jobs' results, the dead-letter queue, logs,
// cron schedules (a run missed while stopped is skipped or kept as the
// schedule says, as at a restart) and queue settings. Everything is
// written in one transaction, with the namespace's tables locked, and the
// counts read back inside it must match those read from SQLite before it
// commits: a migration that fails leaves the namespace as it was.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
)

const migrateUsage = `Usage: queued migrate --from FILE --postgres-url URL [--postgres-namespace NS] [--append]

Moves a SQLite deployment into a PostgreSQL namespace: jobs in every state
(active jobs wait again, with their attempts kept, as after a restart),
results, the dead-letter queue, logs, cron schedules and queue settings
(paused, rate and concurrency limits). Stop the server first: a data file
a running server holds is refused.

Everything is written in one transaction. The counts per queue and state
are printed from SQLite before and read back from PostgreSQL after; when
they differ nothing is committed and the exit status is 1.

A namespace that already holds jobs or schedules is refused, unless
--append: the jobs are then added to those there (a job id already in the
namespace fails the migration), schedules of the same name and the
settings of queues in the file are replaced by the file's.

Webhooks are not moved: in PostgreSQL mode each broker has its own.

Options:
`

// migrateOpts are queued migrate's arguments.
type migrateOpts struct {
	from, url, namespace string
	appendTo             bool
}

func cmdMigrate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("queued migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o migrateOpts
	fs.StringVar(&o.from, "from", envOr(dataPathEnv, defaultDataPath), "the SQLite data file [DATA_PATH, BUNQUEUE_DATA_PATH]")
	fs.StringVar(&o.url, "postgres-url", pgURLFromEnv(), "the PostgreSQL database [BUNQUEUE_POSTGRES_URL]")
	fs.StringVar(&o.namespace, "postgres-namespace", envOr(pgNamespaceEnv, "default"), "the namespace to fill [BUNQUEUE_POSTGRES_NAMESPACE]")
	fs.BoolVar(&o.appendTo, "append", false, "add to a namespace that already holds jobs")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), migrateUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "queued migrate: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if o.url == "" {
		fmt.Fprintln(stderr, "queued migrate: --postgres-url (or BUNQUEUE_POSTGRES_URL) is required")
		return 2
	}
	if _, err := pgNamespace(o.namespace); err != nil {
		fmt.Fprintln(stderr, "queued migrate:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := migrateSQLite(ctx, o, stdout, log); err != nil {
		fmt.Fprintln(stderr, "queued migrate:", err)
		return 1
	}
	return 0
}

// queueCounts are jobs by queue and state.
type queueCounts map[string]*JobCounts

func (qc queueCounts) of(queue string) *JobCounts {
	c := qc[queue]
	if c == nil {
		c = &JobCounts{}
		qc[queue] = c
	}
	return c
}

func (qc queueCounts) add(queue string, st State) {
	c := qc.of(queue)
	switch st {
	case StateWaiting:
		c.Waiting++
	case StatePrioritized:
		c.Prioritized++
	case StateDelayed:
		c.Delayed++
	case StateActive:
		c.Active++
	case StateCompleted:
		c.Completed++
	case StateFailed:
		c.Failed++
	case StateWaitingChildren:
		c.WaitingChildren++
	}
}

// sqliteSource is what a pass over the data file found.
type sqliteSource struct {
	before   queueCounts // as stored
	expected queueCounts // as they will be in PostgreSQL
	requeued int         // active jobs that wait again
	ids      map[string]struct{}
	firstSeq map[string]int64 // a queue's oldest job, for the queue order
	refused  map[string]int   // options PostgreSQL mode does not carry out yet, by name
	refusedE []string         // a few of the jobs refused
	bad      int              // unreadable records
	queues   map[string]*Queue
	crons    []CronSchedule
	ended    []string // schedules that had used up their runs
	logs     int
	orphans  int // log lines of jobs not in the file
	webhooks int
}

// migrateJob turns a job read from SQLite into the job PostgreSQL mode
// keeps, as a restart would (restoreQueued, restoreDead): an active job's
// worker is gone, so it waits again with its attempts kept.
func migrateJob(j *Job, now int64) {
	switch j.state {
	case StateActive, StateWaiting, StatePrioritized, StateDelayed:
		if j.state == StateActive {
			j.StartedAt = 0
		}
		if j.RunAt > now {
			j.state = StateDelayed
		} else {
			j.state = j.readyState()
		}
	case StateFailed:
		j.ensureDLQEntry()
	}
}

// pgMigrateCols are the job columns a migration fills; pgMigrateRow gives
// their values. The lease columns stay empty: no job is active after a
// migration.
var pgMigrateCols = []string{"id", "queue", "state", "priority", "sort_key", "run_at", "created_at", "done_at",
	"unique_key", "record", "result"}

// pgMigrateRow maps a job (already through migrateJob) to its row in the
// jobs table, as saveJobs writes one. A column added to the jobs table is
// filled here too.
func pgMigrateRow(j *Job, result []byte) []any {
	var doneAt *int64
	if j.DoneAt != 0 {
		doneAt = ptr(j.DoneAt)
	}
	var uk *string
	if j.UniqueKey != "" && j.state != StateCompleted && j.state != StateFailed {
		uk = ptr(j.UniqueKey)
	}
	if j.state != StateCompleted {
		result = nil
	}
	var e Enc
	encodeRecord(&e, j)
	return []any{j.ID, j.Queue, pgState(j.state), j.Priority, sortKey(j), j.RunAt, j.CreatedAt, doneAt, uk, e.B, result}
}

// sqliteJobs walks the data file's jobs in admission order.
func sqliteJobs(ctx context.Context, sq *SQLiteStore, fn func(j *Job, result []byte) error) (bad int, err error) {
	rows, err := sq.db.QueryContext(ctx, `SELECT j.record, r.result FROM jobs j LEFT JOIN results r ON r.seq = j.seq ORDER BY j.seq`)
	if err != nil {
		return 0, fmt.Errorf("read jobs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var rec, res []byte
		if err := rows.Scan(&rec, &res); err != nil {
			return bad, fmt.Errorf("read jobs: %w", err)
		}
		j, err := decodeRecord(rec)
		if err != nil {
			bad++
			continue
		}
		if err := fn(j, res); err != nil {
			return bad, err
		}
	}
	if err := rows.Err(); err != nil {
		return bad, fmt.Errorf("read jobs: %w", err)
	}
	return bad, nil
}

// migrateRefuse names the first option of j that needs state a migration
// does not write yet (dependency rows, group rows, dedup expiries): such a
// job stops the migration rather than run differently from what was asked.
func migrateRefuse(j *Job) error {
	var what string
	switch {
	case len(j.DependsOn) > 0:
		what = "dependsOn"
	case j.ParentID != "":
		what = "parent"
	case j.GroupID != "":
		what = "groupId"
	case j.DedupTTL != none || j.DedupExtend || j.DedupReplace:
		what = "deduplication with ttl, extend or replace"
	default:
		return nil
	}
	return errors.New(what + " is not available in PostgreSQL mode yet")
}

// readSQLite takes stock of the data file and checks that PostgreSQL mode
// can carry out all of it.
func readSQLite(ctx context.Context, sq *SQLiteStore, now int64) (*sqliteSource, error) {
	src := &sqliteSource{before: queueCounts{}, expected: queueCounts{}, ids: map[string]struct{}{},
		firstSeq: map[string]int64{}, refused: map[string]int{}, queues: map[string]*Queue{}}
	var seq int64
	bad, err := sqliteJobs(ctx, sq, func(j *Job, _ []byte) error {
		seq++
		src.before.add(j.Queue, j.stateAt(now))
		if j.state != StateCompleted {
			// A job that may still run must run as it was asked to.
			if err := migrateRefuse(j); err != nil {
				what := strings.TrimSuffix(err.Error(), " is not available in PostgreSQL mode yet")
				src.refused[what]++
				if len(src.refusedE) < 5 {
					src.refusedE = append(src.refusedE, j.ID+" ("+what+")")
				}
			}
		}
		if j.state == StateActive {
			src.requeued++
		}
		migrateJob(j, now)
		src.expected.add(j.Queue, j.stateAt(now))
		src.ids[j.ID] = struct{}{}
		if _, ok := src.firstSeq[j.Queue]; !ok {
			src.firstSeq[j.Queue] = seq
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	src.bad = bad

	rows, err := sq.db.QueryContext(ctx, `SELECT name, settings FROM queues`)
	if err != nil {
		return nil, fmt.Errorf("read queues: %w", err)
	}
	for rows.Next() {
		var name string
		var settings []byte
		if err := rows.Scan(&name, &settings); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read queues: %w", err)
		}
		q := &Queue{name: name, stall: defaultStall, dlqCfg: defaultDLQ}
		if err := decodeQueueSettings(q, settings); err != nil {
			rows.Close()
			return nil, fmt.Errorf("queue %s: settings unreadable: %w", name, err)
		}
		src.queues[name] = q
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read queues: %w", err)
	}

	rows, err = sq.db.QueryContext(ctx, `SELECT record FROM crons`)
	if err != nil {
		return nil, fmt.Errorf("read cron schedules: %w", err)
	}
	for rows.Next() {
		var rec []byte
		if err := rows.Scan(&rec); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read cron schedules: %w", err)
		}
		s, err := decodeCronRecord(rec)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("cron schedule unreadable: %w", err)
		}
		ended, _, err := s.recover(now)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("cron schedule %q: %w", s.Name, err)
		}
		if ended {
			src.ended = append(src.ended, s.Name)
			continue
		}
		src.crons = append(src.crons, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read cron schedules: %w", err)
	}
	slices.SortFunc(src.crons, func(a, b CronSchedule) int { return strings.Compare(a.Name, b.Name) })

	rows, err = sq.db.QueryContext(ctx, `SELECT job_id FROM job_logs`)
	if err != nil {
		return nil, fmt.Errorf("read logs: %w", err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read logs: %w", err)
		}
		if _, ok := src.ids[id]; ok {
			src.logs++
		} else {
			src.orphans++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read logs: %w", err)
	}
	if err := sq.db.QueryRowContext(ctx, `SELECT count(*) FROM webhooks`).Scan(&src.webhooks); err != nil {
		return nil, fmt.Errorf("read webhooks: %w", err)
	}
	return src, nil
}

// queueOrder lists the queues as they came: by their oldest job, then the
// queues with settings and no jobs, by name.
func (src *sqliteSource) queueOrder() []string {
	var names []string
	for q := range src.firstSeq {
		names = append(names, q)
	}
	slices.SortFunc(names, func(a, b string) int { return cmpInt(src.firstSeq[a], src.firstSeq[b]) })
	var rest []string
	for q := range src.queues {
		if _, ok := src.firstSeq[q]; !ok {
			rest = append(rest, q)
		}
	}
	sort.Strings(rest)
	return append(names, rest...)
}

// pgQueueRow is what the queues table keeps of one queue.
type pgQueueRow struct {
	paused bool
	rate   *bucket
	conc   *int64
}

func (src *sqliteSource) queueRow(name string) pgQueueRow {
	q := src.queues[name]
	if q == nil {
		return pgQueueRow{}
	}
	return pgQueueRow{paused: q.paused, rate: q.rate, conc: q.concLimit}
}

// unapplied names the settings of a queue that PostgreSQL mode keeps (in
// the queue row's settings) but does not act on yet.
func unapplied(q *Queue) []string {
	var out []string
	if q.stall != defaultStall {
		out = append(out, "stall configuration")
	}
	if q.dlqCfg != defaultDLQ {
		out = append(out, "dead-letter configuration")
	}
	if len(q.groups) > 0 {
		out = append(out, "group settings")
	}
	return out
}

func migrateSQLite(ctx context.Context, o migrateOpts, out io.Writer, log *slog.Logger) error {
	if fi, err := os.Stat(o.from); err != nil {
		return fmt.Errorf("no SQLite data file at %s: %w", o.from, err)
	} else if fi.IsDir() {
		return fmt.Errorf("%s is a folder; --from names the SQLite data file", o.from)
	}
	release, err := lockDataFile(o.from)
	if errors.Is(err, errDataFileInUse) {
		return fmt.Errorf("%w; stop it first, so that the migration copies the file's final state", err)
	}
	if err != nil {
		return err
	}
	defer release()
	sq, err := OpenSQLite(o.from, "normal", log)
	if err != nil {
		return err
	}
	// Before release (deferred above, so run after): see datalock.go.
	defer sq.Close()

	now := nowMs()
	src, err := readSQLite(ctx, sq, now)
	if err != nil {
		return fmt.Errorf("%s: %w", o.from, err)
	}
	schema, _ := pgNamespace(o.namespace)
	fmt.Fprintf(out, "Before: %s (SQLite)\n", o.from)
	printCounts(out, src.before, src.queueOrder())
	fmt.Fprintf(out, "%d logs, %d cron schedules, %d queues with settings, %d webhooks\n",
		src.logs, len(src.crons)+len(src.ended), len(src.queues), src.webhooks)
	if src.bad > 0 {
		return fmt.Errorf("%s: %d job records could not be read; nothing migrated", o.from, src.bad)
	}
	if len(src.refused) > 0 {
		var what []string
		for k, n := range src.refused {
			what = append(what, fmt.Sprintf("%s: %d", k, n))
		}
		sort.Strings(what)
		return fmt.Errorf("jobs that may still run use options PostgreSQL mode does not carry out yet (%s; for example %s); nothing migrated",
			strings.Join(what, ", "), strings.Join(src.refusedE, ", "))
	}
	if src.requeued > 0 {
		fmt.Fprintf(out, "%d active jobs wait again, with their attempts kept: their workers are gone\n", src.requeued)
	}
	if len(src.ended) > 0 {
		fmt.Fprintf(out, "cron schedules that had used up their runs are not moved: %s\n", strings.Join(src.ended, ", "))
	}
	if src.orphans > 0 {
		fmt.Fprintf(out, "%d logs of jobs no longer in the file are not moved\n", src.orphans)
	}
	if src.webhooks > 0 {
		fmt.Fprintf(out, "%d webhooks are not moved: in PostgreSQL mode each broker has its own; add them on each broker\n", src.webhooks)
	}
	for _, name := range src.queueOrder() {
		if q := src.queues[name]; q != nil {
			if u := unapplied(q); len(u) > 0 {
				fmt.Fprintf(out, "queue %s: %s kept, but not acted on in PostgreSQL mode yet\n", name, strings.Join(u, ", "))
			}
		}
	}

	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	p, err := connectPG(cctx, o.url, o.namespace, nil, log)
	cancel()
	if err != nil {
		return err
	}
	defer p.Close()
	after, err := p.load(ctx, sq, src, schema, o.appendTo, now)
	if err != nil {
		return fmt.Errorf("nothing migrated: %w", err)
	}
	fmt.Fprintf(out, "After: namespace %s (PostgreSQL, read back)\n", o.namespace)
	printCounts(out, after.counts, after.order)
	fmt.Fprintf(out, "%d logs, %d cron schedules, %d queues, %d paused\n", after.logs, after.crons, len(after.order), after.paused)
	fmt.Fprintf(out, "Migrated %s into namespace %s (schema %s); the counts match.\n", o.from, o.namespace, schema)
	return nil
}

// pgReadBack is the namespace as read back inside the migration's
// transaction.
type pgReadBack struct {
	counts queueCounts
	order  []string
	logs   int
	crons  int
	paused int
	queues map[string]pgQueueRow
}

// readBack reads the namespace's counts, queues and settings.
func (p *PG) readBack(ctx context.Context, tx pgx.Tx, now int64) (*pgReadBack, error) {
	rb := &pgReadBack{counts: queueCounts{}, queues: map[string]pgQueueRow{}}
	rows, err := tx.Query(ctx, p.sql(`SELECT queue, `+pgCountCols("$1")+` FROM {s}.jobs GROUP BY queue`), now)
	if err != nil {
		return nil, fmt.Errorf("count jobs: %w", err)
	}
	for rows.Next() {
		var q string
		var c JobCounts
		if err := rows.Scan(append([]any{&q}, c.pgDest()...)...); err != nil {
			rows.Close()
			return nil, fmt.Errorf("count jobs: %w", err)
		}
		rb.counts[q] = &c
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count jobs: %w", err)
	}
	rows, err = tx.Query(ctx, p.sql(`SELECT name, paused, rate_max, rate_duration, rate_expires, conc_limit FROM {s}.queues ORDER BY created`))
	if err != nil {
		return nil, fmt.Errorf("read queues: %w", err)
	}
	for rows.Next() {
		var name string
		var r pgQueueRow
		var rmax *float64
		var rdur, rexp *int64
		if err := rows.Scan(&name, &r.paused, &rmax, &rdur, &rexp, &r.conc); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read queues: %w", err)
		}
		if rmax != nil {
			r.rate = &bucket{max: *rmax, duration: deref(rdur), expires: deref(rexp)}
		}
		if r.paused {
			rb.paused++
		}
		rb.queues[name] = r
		rb.order = append(rb.order, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read queues: %w", err)
	}
	if err := tx.QueryRow(ctx, p.sql(`SELECT (SELECT count(*) FROM {s}.job_logs), (SELECT count(*) FROM {s}.crons)`)).
		Scan(&rb.logs, &rb.crons); err != nil {
		return nil, fmt.Errorf("count logs and schedules: %w", err)
	}
	return rb, nil
}

// load writes the data file into the namespace in one transaction and
// answers the namespace as read back; on any difference from what was
// read from SQLite it rolls back.
func (p *PG) load(ctx context.Context, sq *SQLiteStore, src *sqliteSource, schema string, appendTo bool, now int64) (*pgReadBack, error) {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.Background())
	// Brokers already on the namespace wait while it is written (reads
	// go on), so that the counts compared are the migration's own.
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '30s'`); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, p.sql(`LOCK TABLE {s}.jobs, {s}.queues, {s}.crons, {s}.job_logs IN EXCLUSIVE MODE`)); err != nil {
		return nil, fmt.Errorf("lock the namespace's tables: %w", err)
	}
	prior, err := p.readBack(ctx, tx, now)
	if err != nil {
		return nil, err
	}
	var held int
	for _, c := range prior.counts {
		held += jobTotal(c)
	}
	if (held > 0 || prior.crons > 0) && !appendTo {
		return nil, fmt.Errorf("namespace already holds %d jobs and %d cron schedules; --append adds to them", held, prior.crons)
	}
	existingCrons := map[string]bool{}
	if prior.crons > 0 {
		rows, err := tx.Query(ctx, p.sql(`SELECT name FROM {s}.crons`))
		if err != nil {
			return nil, fmt.Errorf("read schedules: %w", err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("read schedules: %w", err)
		}
		for _, n := range names {
			existingCrons[n] = true
		}
	}

	// Queues first, in the order they came, so that ListQueues keeps it.
	for _, name := range src.queueOrder() {
		r := src.queueRow(name)
		var rmax, rtok *float64
		var rdur, rat, rexp, rcons *int64
		if b := r.rate; b != nil {
			// The bucket starts full, as after a restart; its ttl holds.
			rmax, rdur, rtok, rat, rexp, rcons = ptr(b.max), ptr(b.duration), ptr(b.max), ptr(now), ptr(b.expires), ptr(int64(0))
		}
		var settings []byte
		if q := src.queues[name]; q != nil {
			settings = encodeQueueSettings(q)
		}
		_, err := tx.Exec(ctx, p.sql(`INSERT INTO {s}.queues (name, paused, settings, rate_max, rate_duration, rate_tokens,
				rate_at, rate_expires, rate_consumed, conc_limit)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
			ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, settings = EXCLUDED.settings,
				rate_max = EXCLUDED.rate_max, rate_duration = EXCLUDED.rate_duration, rate_tokens = EXCLUDED.rate_tokens,
				rate_at = EXCLUDED.rate_at, rate_expires = EXCLUDED.rate_expires, rate_consumed = EXCLUDED.rate_consumed,
				conc_limit = EXCLUDED.conc_limit`),
			name, r.paused, settings, rmax, rdur, rtok, rat, rexp, rcons, r.conc)
		if err != nil {
			return nil, fmt.Errorf("queue %s: %w", name, err)
		}
	}

	// Jobs, streamed from the file in admission order: the rows' sequence
	// numbers keep FIFO order among jobs of one priority and run time.
	jobs := make(chan []any, 256)
	readErr := make(chan error, 1)
	rctx, stopRead := context.WithCancel(ctx)
	defer stopRead()
	go func() {
		defer close(jobs)
		_, err := sqliteJobs(rctx, sq, func(j *Job, res []byte) error {
			migrateJob(j, now)
			select {
			case jobs <- pgMigrateRow(j, res):
				return nil
			case <-rctx.Done():
				return rctx.Err()
			}
		})
		readErr <- err
	}()
	n, err := tx.CopyFrom(ctx, pgx.Identifier{schema, "jobs"}, pgMigrateCols, pgx.CopyFromFunc(func() ([]any, error) {
		row, ok := <-jobs
		if !ok {
			return nil, nil
		}
		return row, nil
	}))
	stopRead()
	for range jobs {
	}
	if rerr := <-readErr; rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return nil, fmt.Errorf("copy jobs: %w", err)
	}
	if n != int64(len(src.ids)) {
		return nil, fmt.Errorf("copied %d jobs, the file has %d", n, len(src.ids))
	}

	if err := p.copyLogs(ctx, tx, sq, src, schema); err != nil {
		return nil, err
	}
	replaced := 0
	for i := range src.crons {
		if existingCrons[src.crons[i].Name] {
			replaced++
		}
		if err := p.saveCron(ctx, tx, &src.crons[i]); err != nil {
			return nil, err
		}
	}

	after, err := p.readBack(ctx, tx, now)
	if err != nil {
		return nil, err
	}
	if err := checkMigrated(src, prior, after, replaced); err != nil {
		return nil, err
	}
	for _, q := range src.queueOrder() {
		if c := src.expected[q]; c != nil && jobTotal(c) > 0 {
			if err := p.notify(ctx, tx, q); err != nil {
				return nil, err
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return after, nil
}

func (p *PG) copyLogs(ctx context.Context, tx pgx.Tx, sq *SQLiteStore, src *sqliteSource, schema string) error {
	rows, err := sq.db.QueryContext(ctx, `SELECT job_id, logs FROM job_logs ORDER BY job_id`)
	if err != nil {
		return fmt.Errorf("read logs: %w", err)
	}
	defer rows.Close()
	_, err = tx.CopyFrom(ctx, pgx.Identifier{schema, "job_logs"}, []string{"job_id", "logs"}, pgx.CopyFromFunc(func() ([]any, error) {
		for rows.Next() {
			var id string
			var logs []byte
			if err := rows.Scan(&id, &logs); err != nil {
				return nil, err
			}
			if _, ok := src.ids[id]; ok {
				return []any{id, logs}, nil
			}
		}
		return nil, rows.Err()
	}))
	if err != nil {
		return fmt.Errorf("copy logs: %w", err)
	}
	return nil
}

func (c *JobCounts) plus(o *JobCounts) {
	c.Waiting += o.Waiting
	c.Prioritized += o.Prioritized
	c.Delayed += o.Delayed
	c.Active += o.Active
	c.Completed += o.Completed
	c.Failed += o.Failed
	c.WaitingChildren += o.WaitingChildren
}

func jobTotal(c *JobCounts) int {
	return c.Waiting + c.Prioritized + c.Delayed + c.Active + c.Completed + c.Failed + c.WaitingChildren
}

// checkMigrated compares the namespace read back with what it held before
// plus what the file brought.
func checkMigrated(src *sqliteSource, prior, after *pgReadBack, replacedCrons int) error {
	var diffs []string
	queues := map[string]bool{}
	for q := range src.expected {
		queues[q] = true
	}
	for q := range prior.counts {
		queues[q] = true
	}
	for q := range after.counts {
		queues[q] = true
	}
	for q := range queues {
		want := JobCounts{}
		if c := prior.counts[q]; c != nil {
			want = *c
		}
		if c := src.expected[q]; c != nil {
			want.plus(c)
		}
		got := JobCounts{}
		if c := after.counts[q]; c != nil {
			got = *c
		}
		if got != want {
			diffs = append(diffs, fmt.Sprintf("queue %s: %+v, expected %+v", q, got, want))
		}
	}
	if want := prior.logs + src.logs; after.logs != want {
		diffs = append(diffs, fmt.Sprintf("logs: %d, expected %d", after.logs, want))
	}
	if want := prior.crons + len(src.crons) - replacedCrons; after.crons != want {
		diffs = append(diffs, fmt.Sprintf("cron schedules: %d, expected %d", after.crons, want))
	}
	for name := range src.queues {
		want, got := src.queueRow(name), after.queues[name]
		if got.paused != want.paused || (got.conc == nil) != (want.conc == nil) || (got.conc != nil && *got.conc != *want.conc) ||
			(got.rate == nil) != (want.rate == nil) || (got.rate != nil && (got.rate.max != want.rate.max || got.rate.duration != want.rate.duration)) {
			diffs = append(diffs, fmt.Sprintf("queue %s: settings differ after writing them", name))
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		return fmt.Errorf("the namespace read back differs from the file: %s", strings.Join(diffs, "; "))
	}
	return nil
}

// printCounts writes a table of jobs by queue and state, with totals.
func printCounts(w io.Writer, qc queueCounts, order []string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "QUEUE\tWAITING\tPRIORITIZED\tDELAYED\tACTIVE\tCOMPLETED\tFAILED\tWAITING-CHILDREN\tTOTAL\t")
	var sum JobCounts
	row := func(name string, c *JobCounts) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", name, c.Waiting, c.Prioritized, c.Delayed, c.Active,
			c.Completed, c.Failed, c.WaitingChildren, jobTotal(c))
	}
	seen := map[string]bool{}
	names := append([]string(nil), order...)
	var extra []string
	for q := range qc {
		if !slices.Contains(order, q) {
			extra = append(extra, q)
		}
	}
	sort.Strings(extra)
	for _, q := range append(names, extra...) {
		if seen[q] {
			continue
		}
		seen[q] = true
		c := qc[q]
		if c == nil {
			c = &JobCounts{}
		}
		row(q, c)
		sum.plus(c)
	}
	row("(all)", &sum)
	tw.Flush()
}
