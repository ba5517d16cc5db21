package main

// queued migrate (cli_migrate.go): a SQLite deployment moves into a
// PostgreSQL namespace in one command. This file is the copy. The data file must not be live: a running server holds its
// lock (datalock.go), and the migration takes that lock for itself while it
// reads, so no server starts on the file meanwhile.
//
// What moves is what a restart on the file would bring back: jobs in every
// state (an active job's worker is gone, so it waits again with its
// attempts kept), completed jobs' results, the dead-letter queue, logs,
// cron schedules (a run missed while stopped is skipped or kept as the
// schedule says, as at a restart), queue settings and policies, group
// settings, the dependencies jobs still wait for, and dedup keys (whose
// ttl starts again, as at a restart). Everything is
// written in one transaction, with the namespace's tables locked, and the
// counts read back inside it must match those read from SQLite before it
// commits: a migration that fails leaves the namespace as it was.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

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
	before   queueCounts         // as stored
	expected queueCounts         // as they will be in PostgreSQL
	requeued int                 // active jobs that wait again
	done     map[string]bool     // the file's jobs by id: completed or not
	firstSeq map[string]int64    // a queue's oldest job, for the queue order
	groups   map[string][]string // a queue's groups, as they came
	waiters  []string            // with deps: waiters[i] waits for deps[i]
	deps     []string
	released int // jobs whose dependencies all completed: they run
	bad      int // unreadable records
	queues   map[string]*Queue
	crons    []CronSchedule
	ended    []string // schedules that had used up their runs
	logs     int
	orphans  int // log lines of jobs not in the file
	webhooks int
	handlers []*HandlerSpec
}

// migrateJob turns a job read from SQLite into the job PostgreSQL mode
// keeps, as a restart would (restoreQueued, restoreDead, finishRestore):
// an active job's worker is gone, so it waits again with its attempts
// kept; a job waiting for others waits for those of them still in the
// file and not completed (one gone completed and was removed), and runs
// when there are none. It answers those it waits for.
func migrateJob(j *Job, now int64, done map[string]bool) []string {
	switch j.state {
	case StateActive, StateWaiting, StatePrioritized, StateDelayed:
		if j.state == StateActive {
			j.setStartedAt(0)
		}
		j.state = j.queuedState(now)
	case StateFailed:
		j.ensureDLQEntry()
	case StateWaitingChildren:
		var waits []string
		for _, d := range j.cold().DependsOn {
			if completed, ok := done[d]; ok && !completed && !slices.Contains(waits, d) {
				waits = append(waits, d)
			}
		}
		if len(waits) == 0 && len(j.cold().DependsOn) > 0 {
			pgRelease(j, now)
		}
		return waits
	}
	return nil
}

// pgMigrateCols are the job columns a migration fills; pgMigrateRow gives
// their values. The lease columns stay empty: no job is active after a
// migration. waited is set with the deps rows (addDeps).
var pgMigrateCols = []string{"id", "queue", "state", "priority", "sort_key", "run_at", "created_at", "done_at",
	"unique_key", "unique_expires", "group_id", "dlq_at", "dlq_due", "body", "result", "plain"}

// pgMigrateRow maps a job (already through migrateJob) to its row in the
// jobs table, as saveJobs and insertJobs write one. A column added to the
// jobs table is filled here too.
func pgMigrateRow(j *Job, result []byte, now int64) []any {
	var doneAt *int64
	if j.DoneAt() != 0 {
		doneAt = ptr(j.DoneAt())
	}
	var uk *string
	var uexp *int64
	if j.cold().UniqueKey != "" && j.state != StateCompleted && j.state != StateFailed {
		uk, uexp = ptr(j.cold().UniqueKey), dedupExpiry(j, now)
	}
	var group *string
	if j.cold().GroupID != "" {
		group = ptr(j.cold().GroupID)
	}
	var dlqAt, dlqDue *int64
	if j.state == StateFailed && j.dlq != nil {
		dlqAt, dlqDue = ptr(j.dlq.EnteredAt), pgDLQDue(j.dlq)
	}
	if j.state != StateCompleted {
		result = nil
	}
	var e Enc
	encodeRecord(&e, j)
	return []any{j.ID(), j.Queue, pgState(j.state), j.Priority, sortKey(j), pgRunAt(j, now), j.CreatedAt, doneAt, uk, uexp,
		group, dlqAt, dlqDue, e.B, result, pgPlainDone(j)}
}

// sqliteJobs walks the data file's jobs in admission order.
func sqliteJobs(ctx context.Context, sq *SQLiteStore, fn func(j *Job, result []byte) error) (bad int, err error) {
	// The rows of a big deletion the server had not finished are not jobs.
	dead, _, err := deadSeqs(ctx, sq)
	if err != nil {
		return 0, err
	}
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
		if isDead(dead, j.seq) {
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

// readSQLite takes stock of the data file: the counts, and what the jobs
// will be in PostgreSQL mode.
func readSQLite(ctx context.Context, sq *SQLiteStore, now int64) (*sqliteSource, error) {
	src := &sqliteSource{before: queueCounts{}, expected: queueCounts{}, done: map[string]bool{},
		firstSeq: map[string]int64{}, groups: map[string][]string{}, queues: map[string]*Queue{}}
	// The groups of each queue, as they came: from its jobs, then from its
	// settings.
	seenGroup := map[[2]string]bool{}
	if err := src.readJobs(ctx, sq, now, seenGroup); err != nil {
		return nil, err
	}
	if err := src.readQueues(ctx, sq, seenGroup); err != nil {
		return nil, err
	}
	if err := src.readCrons(ctx, sq, now); err != nil {
		return nil, err
	}
	if err := src.countLogs(ctx, sq); err != nil {
		return nil, err
	}
	if err := sq.db.QueryRowContext(ctx, `SELECT count(*) FROM webhooks`).Scan(&src.webhooks); err != nil {
		return nil, fmt.Errorf("read webhooks: %w", err)
	}
	handlers, err := sq.LoadHandlers(ctx)
	if err != nil {
		return nil, err
	}
	src.handlers = handlers
	return src, nil
}

// readJobs counts the jobs as stored and as they will be, and finds the
// dependencies still to wait for.
func (src *sqliteSource) readJobs(ctx context.Context, sq *SQLiteStore, now int64, seenGroup map[[2]string]bool) error {
	var seq int64
	// Jobs waiting for others are decided once every job's state is known.
	var waiting []*Job
	bad, err := sqliteJobs(ctx, sq, func(j *Job, _ []byte) error {
		seq++
		src.before.add(j.Queue, j.stateAt(now))
		src.done[j.ID()] = j.state == StateCompleted
		if _, ok := src.firstSeq[j.Queue]; !ok {
			src.firstSeq[j.Queue] = seq
		}
		if g := j.cold().GroupID; g != "" && !seenGroup[[2]string{j.Queue, g}] {
			seenGroup[[2]string{j.Queue, g}] = true
			src.groups[j.Queue] = append(src.groups[j.Queue], g)
		}
		switch j.state {
		case StateWaitingChildren:
			waiting = append(waiting, j)
			return nil
		case StateActive:
			src.requeued++
		}
		migrateJob(j, now, nil)
		src.expected.add(j.Queue, j.stateAt(now))
		return nil
	})
	if err != nil {
		return err
	}
	src.bad = bad
	for _, j := range waiting {
		waits := migrateJob(j, now, src.done)
		for _, d := range waits {
			src.waiters, src.deps = append(src.waiters, j.ID()), append(src.deps, d)
		}
		if j.state != StateWaitingChildren {
			src.released++
		}
		src.expected.add(j.Queue, j.stateAt(now))
	}
	return nil
}

// readQueues reads the queues' settings, and the groups that have
// settings and no jobs.
func (src *sqliteSource) readQueues(ctx context.Context, sq *SQLiteStore, seenGroup map[[2]string]bool) error {
	rows, err := sq.db.QueryContext(ctx, `SELECT name, settings FROM queues`)
	if err != nil {
		return fmt.Errorf("read queues: %w", err)
	}
	for rows.Next() {
		var name string
		var settings []byte
		if err := rows.Scan(&name, &settings); err != nil {
			rows.Close()
			return fmt.Errorf("read queues: %w", err)
		}
		q := &Queue{name: name, stall: defaultStall, dlqCfg: defaultDLQ}
		if err := decodeQueueSettings(q, settings); err != nil {
			rows.Close()
			return fmt.Errorf("queue %s: settings unreadable: %w", name, err)
		}
		src.queues[name] = q
		// Groups with settings and no jobs keep them, as at a restart.
		for _, g := range slices.Sorted(maps.Keys(q.groups)) {
			if !seenGroup[[2]string{name, g}] {
				seenGroup[[2]string{name, g}] = true
				src.groups[name] = append(src.groups[name], g)
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read queues: %w", err)
	}
	return nil
}

// readCrons reads the cron schedules, as a restart would recover them;
// those that have used up their runs are left out.
func (src *sqliteSource) readCrons(ctx context.Context, sq *SQLiteStore, now int64) error {
	rows, err := sq.db.QueryContext(ctx, `SELECT record FROM crons`)
	if err != nil {
		return fmt.Errorf("read cron schedules: %w", err)
	}
	for rows.Next() {
		var rec []byte
		if err := rows.Scan(&rec); err != nil {
			rows.Close()
			return fmt.Errorf("read cron schedules: %w", err)
		}
		s, err := decodeCronRecord(rec)
		if err != nil {
			rows.Close()
			return fmt.Errorf("cron schedule unreadable: %w", err)
		}
		ended, _, err := s.recover(now)
		if err != nil {
			rows.Close()
			return fmt.Errorf("cron schedule %q: %w", s.Name, err)
		}
		if ended {
			src.ended = append(src.ended, s.Name)
			continue
		}
		src.crons = append(src.crons, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read cron schedules: %w", err)
	}
	slices.SortFunc(src.crons, func(a, b CronSchedule) int { return strings.Compare(a.Name, b.Name) })
	return nil
}

// countLogs counts the jobs' logs, and those of jobs no longer in the file.
func (src *sqliteSource) countLogs(ctx context.Context, sq *SQLiteStore) error {
	rows, err := sq.db.QueryContext(ctx, `SELECT job_id FROM job_logs`)
	if err != nil {
		return fmt.Errorf("read logs: %w", err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fmt.Errorf("read logs: %w", err)
		}
		if _, ok := src.done[id]; ok {
			src.logs++
		} else {
			src.orphans++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read logs: %w", err)
	}
	return nil
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

// pgReadBack is the namespace as read back inside the migration's
// transaction.
type pgReadBack struct {
	counts queueCounts
	order  []string
	logs   int
	crons  int
	deps   int // dependencies not yet met
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
	if err := tx.QueryRow(ctx, p.sql(`SELECT (SELECT count(*) FROM {s}.job_logs), (SELECT count(*) FROM {s}.crons),
		(SELECT count(*) FROM {s}.deps)`)).Scan(&rb.logs, &rb.crons, &rb.deps); err != nil {
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
	if _, err := tx.Exec(ctx, p.sql(`LOCK TABLE {s}.jobs, {s}.queues, {s}.crons, {s}.job_logs, {s}.deps, {s}.groups IN EXCLUSIVE MODE`)); err != nil {
		return nil, fmt.Errorf("lock the namespace's tables: %w", err)
	}
	prior, existingCrons, err := p.loadPrior(ctx, tx, appendTo, now)
	if err != nil {
		return nil, err
	}
	// Queues first, in the order they came, so that ListQueues keeps it.
	if err := p.loadQueues(ctx, tx, src, now); err != nil {
		return nil, err
	}
	if err := p.loadJobs(ctx, tx, sq, src, schema, now); err != nil {
		return nil, err
	}
	// Every job is in: the dependencies can be marked on their rows.
	if err := p.addDeps(ctx, tx, src.waiters, src.deps, false); err != nil {
		return nil, err
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
	// The URL handlers, which every broker of the namespace then runs; a
	// queue's handler already there is replaced.
	for _, h := range src.handlers {
		if err := p.saveHandlerTx(ctx, tx, h); err != nil {
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

// loadPrior reads what the namespace holds before the migration, and the
// names of its schedules; a namespace with jobs or schedules is refused
// unless appendTo.
func (p *PG) loadPrior(ctx context.Context, tx pgx.Tx, appendTo bool, now int64) (*pgReadBack, map[string]bool, error) {
	prior, err := p.readBack(ctx, tx, now)
	if err != nil {
		return nil, nil, err
	}
	var held int
	for _, c := range prior.counts {
		held += jobTotal(c)
	}
	if (held > 0 || prior.crons > 0) && !appendTo {
		return nil, nil, fmt.Errorf("namespace already holds %d jobs and %d cron schedules; --append adds to them", held, prior.crons)
	}
	existingCrons := map[string]bool{}
	if prior.crons > 0 {
		rows, err := tx.Query(ctx, p.sql(`SELECT name FROM {s}.crons`))
		if err != nil {
			return nil, nil, fmt.Errorf("read schedules: %w", err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, nil, fmt.Errorf("read schedules: %w", err)
		}
		for _, n := range names {
			existingCrons[n] = true
		}
	}
	return prior, existingCrons, nil
}

// loadQueues writes the queues' rows with their settings and policies,
// and their groups.
func (p *PG) loadQueues(ctx context.Context, tx pgx.Tx, src *sqliteSource, now int64) error {
	for _, name := range src.queueOrder() {
		r := src.queueRow(name)
		var rmax, rtok *float64
		var rdur, rat, rexp, rcons *int64
		if b := r.rate; b != nil {
			// The bucket starts full, as after a restart; its ttl holds.
			rmax, rdur, rtok, rat, rexp, rcons = ptr(b.max), ptr(b.duration), ptr(b.max), ptr(now), ptr(b.expires), ptr(int64(0))
		}
		var settings []byte
		// NULL policy columns are the defaults.
		var pol pgSettings
		if q := src.queues[name]; q != nil {
			settings = encodeQueueSettings(q)
			if q.stall != defaultStall {
				pol.setStall(q.stall)
			}
			if q.dlqCfg != defaultDLQ {
				pol.setDLQ(q.dlqCfg)
			}
		}
		_, err := tx.Exec(ctx, p.sql(`INSERT INTO {s}.queues AS q (name, paused, settings, rate_max, rate_duration, rate_tokens,
				rate_at, rate_expires, rate_consumed, conc_limit, grouped, stall_enabled, stall_interval, stall_grace,
				stall_max, dlq_auto_retry, dlq_retry_interval, dlq_max_age, dlq_max_retries, dlq_max_entries)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)
			ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, settings = EXCLUDED.settings,
				rate_max = EXCLUDED.rate_max, rate_duration = EXCLUDED.rate_duration, rate_tokens = EXCLUDED.rate_tokens,
				rate_at = EXCLUDED.rate_at, rate_expires = EXCLUDED.rate_expires, rate_consumed = EXCLUDED.rate_consumed,
				conc_limit = EXCLUDED.conc_limit, grouped = q.grouped OR EXCLUDED.grouped,
				stall_enabled = EXCLUDED.stall_enabled, stall_interval = EXCLUDED.stall_interval,
				stall_grace = EXCLUDED.stall_grace, stall_max = EXCLUDED.stall_max,
				dlq_auto_retry = EXCLUDED.dlq_auto_retry, dlq_retry_interval = EXCLUDED.dlq_retry_interval,
				dlq_max_age = EXCLUDED.dlq_max_age, dlq_max_retries = EXCLUDED.dlq_max_retries,
				dlq_max_entries = EXCLUDED.dlq_max_entries`),
			name, r.paused, settings, rmax, rdur, rtok, rat, rexp, rcons, r.conc, len(src.groups[name]) > 0,
			pol.stallEnabled, pol.stallInterval, pol.stallGrace, pol.stallMax,
			pol.dlqAuto, pol.dlqInterval, pol.dlqMaxAge, pol.dlqMaxRetries, pol.dlqMaxEntries)
		if err != nil {
			return fmt.Errorf("queue %s: %w", name, err)
		}
		if err := p.loadGroups(ctx, tx, name, src); err != nil {
			return err
		}
	}
	return nil
}

// loadJobs copies the jobs, streamed from the file in admission order: the
// rows' sequence numbers keep FIFO order among jobs of one priority and
// run time.
func (p *PG) loadJobs(ctx context.Context, tx pgx.Tx, sq *SQLiteStore, src *sqliteSource, schema string, now int64) error {
	jobs := make(chan []any, 256)
	readErr := make(chan error, 1)
	rctx, stopRead := context.WithCancel(ctx)
	defer stopRead()
	go func() {
		defer close(jobs)
		_, err := sqliteJobs(rctx, sq, func(j *Job, res []byte) error {
			migrateJob(j, now, src.done)
			select {
			case jobs <- pgMigrateRow(j, res, now):
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
		return fmt.Errorf("copy jobs: %w", err)
	}
	if n != int64(len(src.done)) {
		return fmt.Errorf("copied %d jobs, the file has %d", n, len(src.done))
	}
	return nil
}

// loadGroups makes the rows of a queue's groups, which take their turns in
// the order they came, with the settings the file kept for them (pause,
// concurrency and rate overrides; a RateLimitGroup hold and the rate
// windows are not kept, as at a restart).
func (p *PG) loadGroups(ctx context.Context, tx pgx.Tx, queue string, src *sqliteSource) error {
	ids := src.groups[queue]
	if len(ids) == 0 {
		return nil
	}
	n := len(ids)
	paused := make([]bool, n)
	conc, rmax, rdur := make([]*int64, n), make([]*int64, n), make([]*int64, n)
	if q := src.queues[queue]; q != nil {
		for i, id := range ids {
			g := q.groups[id]
			if g == nil {
				continue
			}
			paused[i] = g.paused
			if g.concOverride > 0 {
				conc[i] = ptr(g.concOverride)
			}
			if r := g.rateOverride; r != nil {
				rmax[i], rdur[i] = ptr(r.max), ptr(r.duration)
			}
		}
	}
	_, err := tx.Exec(ctx, p.sql(`INSERT INTO {s}.groups (queue, group_id, served, paused, conc_limit, rate_max, rate_duration)
		SELECT $1, u.g, nextval('{s}.group_turns'), u.paused, u.conc, u.rmax, u.rdur
		FROM unnest($2::text[], $3::boolean[], $4::bigint[], $5::bigint[], $6::bigint[]) WITH ORDINALITY AS u(g, paused, conc, rmax, rdur, ord)
		ORDER BY u.ord
		ON CONFLICT (queue, group_id) DO UPDATE SET paused = EXCLUDED.paused, conc_limit = EXCLUDED.conc_limit,
			rate_max = EXCLUDED.rate_max, rate_duration = EXCLUDED.rate_duration`), queue, ids, paused, conc, rmax, rdur)
	if err != nil {
		return fmt.Errorf("groups of %s: %w", queue, err)
	}
	return nil
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
			if _, ok := src.done[id]; ok {
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
	if want := prior.deps + len(src.waiters); after.deps != want {
		diffs = append(diffs, fmt.Sprintf("dependencies: %d, expected %d", after.deps, want))
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
