package main

// The PostgreSQL engine's reads (ReadEngine), as query.go answers them in
// memory.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ReadJobByCustomID reads the job holding a custom id, finished or not:
// this engine, as the reference's PostgreSQL engine, finds every job its
// table holds (a custom id is its job's id here).
func (p *PG) ReadJobByCustomID(ctx context.Context, id string) (JobView, error) {
	v, err := p.ReadJob(ctx, id)
	if err != nil || !customIDFinds(v.Job, true) {
		return noJob, err
	}
	return v, nil
}

func (p *PG) ReadJob(ctx context.Context, id string) (JobView, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	if wantsReadRoom(ctx) {
		// The answer's room is reserved before a big job is brought into
		// memory: its size comes first, from lengths PostgreSQL knows
		// without reading the values. The read holds more than the
		// answer while it lasts (pgReadBytes); the rest goes back once
		// the answer's size is known (fetch).
		var n int64
		err := p.pool.QueryRow(ctx, p.sql(`SELECT octet_length(body) + coalesce(octet_length(data), 0) + coalesce(octet_length(result), 0) FROM {s}.jobs WHERE id = $1`), id).Scan(&n)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return noJob, nil
		case err != nil:
			return noJob, pgErr(fmt.Errorf("read job %s: %w", id, err))
		}
		if err := reserveRead(ctx, pgReadBytes(n+4096, n), n+4096); err != nil {
			return noJob, err
		}
	}
	j, res, err := p.getJob(ctx, id)
	if err != nil {
		return noJob, err
	}
	if j == nil {
		return noJob, nil
	}
	v := JobView{Job: j, State: j.stateAt(p.now()).String()}
	if j.state == StateCompleted {
		v.Result = res
	}
	return v, nil
}

// pgReadBytes is what reading rows of total bytes, the largest of
// maxRow, and answering them holds at most: the driver's buffer for a row
// (a power of two, at most twice the largest; one row at a time), the jobs
// decoded from them, and the answer.
func pgReadBytes(total, maxRow int64) int64 { return 2*maxRow + total + total }

func (p *PG) Counts(ctx context.Context, queue string) (JobCounts, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	c, _, err := p.countsTx(ctx, p.pool, queue, p.now())
	return c, err
}

func (p *PG) CountsPerPriority(ctx context.Context, queue string) (map[int64]int, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.countsPerPriority(ctx, p.pool, queue)
}

// ---------------------------------------------------------------------------
// GetJobs

// pgStateWhere is the row condition of a wire state name ($2 is now).
var pgStateWhere = map[string]string{
	"waiting":          "(state = {queued} AND run_at <= $2 AND priority <= 0)",
	"prioritized":      "(state = {queued} AND run_at <= $2 AND priority > 0)",
	"delayed":          "(state = {queued} AND run_at > $2)",
	"paused":           "(state = {queued} AND run_at <= $2)",
	"active":           "state = {active}",
	"completed":        "state = {done}",
	"failed":           "state = {dlq}",
	"waiting-children": "state = {children}",
}

// jobsWhere is the row condition of a's state filter. A paused queue's
// ready jobs are listed as paused when states are named, as in memory.
func jobsWhere(a jobsQuery, paused bool) string {
	if len(a.want) == 0 {
		return pgAnyState
	}
	where := "false"
	for _, st := range a.want {
		c, ok := pgStateWhere[st]
		if !ok || (st == "paused" && !paused) {
			continue
		}
		if paused && (st == "waiting" || st == "prioritized") {
			continue
		}
		where += " OR " + c
	}
	return where
}

func (p *PG) Jobs(ctx context.Context, queue string, a jobsQuery) ([]JobView, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var paused bool
	if err := p.pool.QueryRow(ctx, p.sql(`SELECT COALESCE((SELECT paused FROM {s}.queues WHERE name = $1), false)`), queue).Scan(&paused); err != nil {
		return nil, pgErr(fmt.Errorf("list jobs of %s: %w", queue, err))
	}
	var jobs []*Job
	err := p.pastUnreadable(ctx, func() (err error) {
		jobs, err = p.jobsPage(ctx, queue, a, jobsWhere(a, paused))
		return err
	})
	if err != nil {
		return nil, err
	}
	results, err := p.results(ctx, jobs)
	if err != nil {
		return nil, err
	}
	now := p.now()
	out := make([]JobView, len(jobs))
	for i, j := range jobs {
		st := j.stateAt(now)
		label := st.String()
		if paused && len(a.want) > 0 && (st == StateWaiting || st == StatePrioritized) {
			label = "paused"
		}
		out[i] = JobView{Job: j, State: label, Result: results[j.ID()]}
	}
	return out, nil
}

// pgJobsPageFrom is the FROM clause of a page of queue $1's jobs matching
// where ($2 is now), in creation order (ASC or DESC).
func pgJobsPageFrom(where, order string) string {
	return ` FROM {s}.jobs WHERE queue = $1 AND $2::bigint IS NOT NULL AND (` + where + `) ORDER BY created_at ` + order + `, id ` + order
}

// jobsPage reads the page of a queue's jobs matching where, sliced as
// JavaScript's slice(offset, offset+limit) would (in the database when
// both are not negative).
func (p *PG) jobsPage(ctx context.Context, queue string, a jobsQuery, where string) ([]*Job, error) {
	order := "ASC"
	if !a.asc {
		order = "DESC"
	}
	from := pgJobsPageFrom(where, order)
	q := `SELECT ` + pgJobCols + from
	args := []any{queue, p.now()}
	sliced := false
	if a.offset >= 0 && a.limit >= 0 {
		q += ` OFFSET $3 LIMIT $4`
		args = append(args, a.offset, a.limit)
		sliced = true
		if a.maxBytes > 0 && wantsReadRoom(ctx) {
			limit, err := p.pageRoom(ctx, from, args, a.maxBytes)
			if err != nil {
				return nil, err
			}
			args[3] = limit
		}
	}
	rows, err := p.pool.Query(ctx, p.sql(q), args...)
	if err != nil {
		return nil, pgErr(fmt.Errorf("list jobs: %w", err))
	}
	var jobs []*Job
	if sliced && a.maxBytes > 0 {
		// A page of big jobs stops where its answer would be too big to
		// send, rather than bringing the rest into memory.
		fit := answerBytes{max: a.maxBytes}
		jobs, err = scanJobsWhile(rows, func(j *Job) bool { return fit.fits(jobWireBound(j, nil)) })
	} else {
		jobs, err = scanJobs(rows)
	}
	if err != nil {
		return nil, pgErr(fmt.Errorf("list jobs: %w", err))
	}
	if !sliced {
		lo, hi := jsSlice(len(jobs), a.offset, a.offset+a.limit)
		jobs = jobs[lo:hi]
	}
	return jobs, nil
}

// pageRoom reserves the room of a page of jobs before they are read, as
// ReadJob does for one: it reads the sizes of the page's rows, and answers
// how many of them fit in maxBytes (at least one).
func (p *PG) pageRoom(ctx context.Context, from string, args []any, maxBytes int64) (int64, error) {
	rows, err := p.pool.Query(ctx, p.sql(`SELECT octet_length(body) + coalesce(octet_length(data), 0) + coalesce(octet_length(result), 0)`+from+` OFFSET $3 LIMIT $4`), args...)
	if err != nil {
		return 0, pgErr(fmt.Errorf("list jobs: %w", err))
	}
	fit := answerBytes{max: maxBytes}
	var n, maxRow int64
	for rows.Next() {
		var size int64
		if err := rows.Scan(&size); err != nil {
			rows.Close()
			return 0, pgErr(fmt.Errorf("list jobs: %w", err))
		}
		if !fit.fits(size + 4096) {
			break
		}
		n++
		maxRow = max(maxRow, size)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, pgErr(fmt.Errorf("list jobs: %w", err))
	}
	if err := reserveRead(ctx, pgReadBytes(fit.used, maxRow), fit.used); err != nil {
		return 0, err
	}
	return max(n, 1), nil
}

// results are the results of the completed ones of jobs, by id.
func (p *PG) results(ctx context.Context, jobs []*Job) (map[string]Raw, error) {
	var ids []string
	for _, j := range jobs {
		if j.state == StateCompleted {
			ids = append(ids, j.ID())
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := p.pool.Query(ctx, p.sql(`SELECT id, result FROM {s}.jobs WHERE id = ANY($1) AND result IS NOT NULL`), ids)
	if err != nil {
		return nil, pgErr(fmt.Errorf("read results: %w", err))
	}
	defer rows.Close()
	results := map[string]Raw{}
	for rows.Next() {
		var id string
		var res []byte
		if err := rows.Scan(&id, &res); err != nil {
			return nil, pgErr(fmt.Errorf("read results: %w", err))
		}
		results[id] = res
	}
	return results, pgErr(rows.Err())
}

// ---------------------------------------------------------------------------
// Progress and logs

func (p *PG) SetProgress(ctx context.Context, u progressSet) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var j *Job
	var ev evArgs
	var now int64
	err := p.inTx(ctx, func(tx pgx.Tx) error {
		locked, err := p.lockRows(ctx, tx, []string{u.id})
		if err != nil {
			return pgErr(fmt.Errorf("lock job %s: %w", u.id, err))
		}
		l := locked[u.id]
		if l == nil {
			return errJobNotFound
		}
		j, now = l.j, p.now()
		if ev, err = u.apply(j, now); err != nil {
			return err
		}
		return pgErr(p.saveRecord(ctx, tx, j))
	})
	if err != nil {
		return err
	}
	p.emit(j.Queue, evProgress, j, now, ev)
	return nil
}

func (p *PG) AddLog(ctx context.Context, id string, e LogEntry) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	e.At = p.now()
	return p.inTx(ctx, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, p.sql(`SELECT EXISTS (SELECT 1 FROM {s}.jobs WHERE id = $1 FOR KEY SHARE)`), id).Scan(&exists); err != nil {
			return pgErr(fmt.Errorf("add a log to %s: %w", id, err))
		}
		if !exists {
			return errJobNotFound
		}
		logs, err := p.readLogs(ctx, tx, id, true)
		if err != nil {
			return err
		}
		return p.writeLogs(ctx, tx, id, appendLog(logs, e))
	})
}

func (p *PG) Logs(ctx context.Context, id string) ([]LogEntry, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.readLogs(ctx, p.pool, id, false)
}

func (p *PG) ClearLogs(ctx context.Context, id string, keep int64) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	return p.inTx(ctx, func(tx pgx.Tx) error {
		logs, err := p.readLogs(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if keep <= 0 {
			logs = nil
		} else if len(logs) > int(keep) {
			logs = logs[len(logs)-int(keep):]
		}
		return p.writeLogs(ctx, tx, id, logs)
	})
}

// readLogs reads a job's logs through q, locking their row when lock.
func (p *PG) readLogs(ctx context.Context, q pgQuerier, id string, lock bool) ([]LogEntry, error) {
	sql := `SELECT logs FROM {s}.job_logs WHERE job_id = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	var b []byte
	err := q.QueryRow(ctx, p.sql(sql), id).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, pgErr(fmt.Errorf("read logs of %s: %w", id, err))
	}
	logs, err := decodeLogs(b)
	if err != nil {
		return nil, pgErr(fmt.Errorf("logs of %s: %w", id, err))
	}
	return logs, nil
}

// writeLogs replaces a job's logs (none: removes their row).
func (p *PG) writeLogs(ctx context.Context, tx pgx.Tx, id string, logs []LogEntry) error {
	var err error
	if len(logs) == 0 {
		_, err = tx.Exec(ctx, p.sql(`DELETE FROM {s}.job_logs WHERE job_id = $1`), id)
	} else {
		_, err = tx.Exec(ctx, p.sql(`INSERT INTO {s}.job_logs (job_id, logs) VALUES ($1, $2)
			ON CONFLICT (job_id) DO UPDATE SET logs = EXCLUDED.logs`), id, encodeLogs(logs))
	}
	if err != nil {
		return pgErr(fmt.Errorf("write logs of %s: %w", id, err))
	}
	return nil
}

// ---------------------------------------------------------------------------
// WaitJob

// pgWaitPoll is how often WaitJob looks at a job it waits on.
const pgWaitPoll = 50 * time.Millisecond

// outcome says how job id finished (nil: it has not).
func (p *PG) outcome(ctx context.Context, id string) (*waitOutcome, error) {
	j, res, err := p.getJob(ctx, id)
	if err != nil {
		return nil, err
	}
	if j == nil {
		return nil, errJobNotFound
	}
	switch j.state {
	case StateCompleted:
		return &waitOutcome{completed: true, result: res, hasResult: res != nil}, nil
	case StateFailed:
		return &waitOutcome{err: j.cold().failErr}, nil
	}
	return nil, nil
}

// pgGoneGrace is how long WaitJob, having found its job's row gone,
// waits for the event that says how the job ended before taking it as
// removed: the event of a job finished on another broker comes through
// NOTIFY, after the commit that deleted the row (removeOnComplete).
const pgGoneGrace = 2 * time.Second

// pgJobWaits are this broker's WaitJob callers, by job id. A job's final
// event wakes them, whichever broker finished it (the other brokers'
// events arrive through pg_events.go), so that a job completed with
// removeOnComplete answers with its result though its row is gone, and a
// removed one answers as removed. The row is still looked at every
// pgWaitPoll, for an event that never came (the database was away).
type pgJobWaits struct {
	mu sync.Mutex
	m  map[string][]chan waitOutcome
}

func (w *pgJobWaits) add(id string) chan waitOutcome {
	ch := make(chan waitOutcome, 1)
	w.mu.Lock()
	if w.m == nil {
		w.m = map[string][]chan waitOutcome{}
	}
	w.m[id] = append(w.m[id], ch)
	w.mu.Unlock()
	return ch
}

func (w *pgJobWaits) drop(id string, ch chan waitOutcome) {
	locked(&w.mu, func() { dropListed(w.m, id, ch) })
}

// tap is the broker tap that wakes waiters; it runs under a shard lock
// and only hands the outcome over.
func (w *pgJobWaits) tap(ev *Event) {
	var o waitOutcome
	switch {
	case ev.Type == evCompleted:
		o = waitOutcome{completed: true, result: ev.Args.data, hasResult: !ev.Args.undefData && ev.Args.data != nil}
	case ev.Type == evFailed && ev.Args.terminal:
		o = waitOutcome{err: ev.Args.err}
	case ev.Type == evRemoved:
		o = waitOutcome{err: "Job was removed"}
	default:
		return
	}
	id := ev.ID()
	w.mu.Lock()
	list := w.m[id]
	delete(w.m, id)
	w.mu.Unlock()
	for _, ch := range list {
		ch <- o
	}
}

// WaitJob answers at once for a job that has finished; otherwise it waits
// for the job's final event, looking at its row every pgWaitPoll too.
func (p *PG) WaitJob(ctx context.Context, id string, timeout time.Duration) (*waitOutcome, jobWait, error) {
	// Registered before the look, so that an event in between is not
	// missed.
	ch := p.jobWaits.add(id)
	octx, cancel := p.opCtx(ctx)
	o, err := p.outcome(octx, id)
	cancel()
	if err != nil || o != nil {
		p.jobWaits.drop(id, ch)
		return o, nil, err
	}
	return nil, func(ctx context.Context) (waitOutcome, bool, error) {
		defer p.jobWaits.drop(id, ch)
		deadline := time.Now().Add(timeout)
		t := time.NewTicker(pgWaitPoll)
		defer t.Stop()
		var goneAt time.Time
		for time.Now().Before(deadline) {
			select {
			case ev := <-ch:
				return p.settle(ctx, id, ev), true, nil
			case <-t.C:
			case <-ctx.Done():
				return waitOutcome{}, false, nil
			case <-p.stop:
				return waitOutcome{}, false, nil
			}
			if !goneAt.IsZero() {
				if time.Since(goneAt) > pgGoneGrace {
					return waitOutcome{err: "Job was removed"}, true, nil
				}
				continue
			}
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			o, err := p.outcome(lctx, id)
			cancel()
			switch {
			case err == errJobNotFound:
				goneAt = time.Now()
			case err != nil:
				return waitOutcome{}, false, err
			case o != nil:
				return *o, true, nil
			}
		}
		return waitOutcome{}, false, nil
	}, nil
}

// settle prefers the row to the event that woke a waiter: an event from
// another broker may have been forwarded without its result (too large
// for a NOTIFY).
func (p *PG) settle(ctx context.Context, id string, ev waitOutcome) waitOutcome {
	if !ev.completed || ev.hasResult {
		return ev
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if o, err := p.outcome(lctx, id); err == nil && o != nil {
		return *o
	}
	return ev
}

// countsPerPriority counts a queue's waiting and delayed jobs by priority.
func (p *PG) countsPerPriority(ctx context.Context, q pgQuerier, queue string) (map[int64]int, error) {
	rows, err := q.Query(ctx, p.sql(`SELECT priority, count(*) FROM {s}.jobs WHERE queue = $1 AND state = {queued} GROUP BY priority`), queue)
	if err != nil {
		return nil, pgErr(fmt.Errorf("count jobs by priority: %w", err))
	}
	defer rows.Close()
	per := map[int64]int{}
	for rows.Next() {
		var prio, n int64
		if err := rows.Scan(&prio, &n); err != nil {
			return nil, pgErr(err)
		}
		per[prio] = int(n)
	}
	return per, pgErr(rows.Err())
}

// getJob reads one job and its result; nil when there is none.
func (p *PG) getJob(ctx context.Context, id string) (*Job, Raw, error) {
	// Rows() rather than QueryRow: the record is decoded while the driver
	// holds it (pgRow).
	rows, err := p.pool.Query(ctx, p.sql(`SELECT `+pgJobCols+`, result FROM {s}.jobs WHERE id = $1`), id)
	if err != nil {
		return nil, nil, pgErr(fmt.Errorf("read job %s: %w", id, err))
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, nil, pgErr(fmt.Errorf("read job %s: %w", id, err))
		}
		return nil, nil, nil
	}
	var r pgRow
	var res []byte
	if err := rows.Scan(append(r.dest(), &res)...); err != nil {
		return nil, nil, pgErr(fmt.Errorf("read job %s: %w", id, err))
	}
	j, err := r.job(&recLast{})
	if u, ok := errors.AsType[pgUnreadable](err); ok {
		rows.Close()
		if _, serr := p.setAsideRow(ctx, p.pool, u); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, nil, pgErr(fmt.Errorf("job %s: its record cannot be read, and its row is set aside (state %d): %w", id, pgSetAside, err))
	}
	if err != nil {
		return nil, nil, pgErr(fmt.Errorf("job record %s: %w", id, err))
	}
	return j, Raw(res), nil
}

// pgCountCols counts job rows by wire state, in the order of pgDest; now
// is the placeholder of the current time (it tells delayed from waiting).
func pgCountCols(now string) string {
	return strings.ReplaceAll(`count(*) FILTER (WHERE state = {queued} AND run_at <= $now AND priority <= 0),
			count(*) FILTER (WHERE state = {queued} AND run_at <= $now AND priority > 0),
			count(*) FILTER (WHERE state = {queued} AND run_at > $now),
			count(*) FILTER (WHERE state = {active}),
			count(*) FILTER (WHERE state = {done}),
			count(*) FILTER (WHERE state = {dlq}),
			count(*) FILTER (WHERE state = {children})`, "$now", now)
}

// pgDest are the scan targets of pgCountCols.
func (c *JobCounts) pgDest() []any {
	return []any{&c.Waiting, &c.Prioritized, &c.Delayed, &c.Active, &c.Completed, &c.Failed, &c.WaitingChildren}
}

// pgCountsSQL counts a queue's jobs ($1) by state, in the order of
// pgDest, with whether the queue is paused; $2 is now. Each state is
// counted from its own index (pgAnyState).
const pgCountsSQL = `SELECT w.waiting, w.prioritized, w.delayed,
		(SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = {active}),
		(SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = {done}),
		(SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = {dlq}),
		(SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = {children}),
		COALESCE((SELECT paused FROM {s}.queues WHERE name = $1), false)
	FROM (SELECT count(*) FILTER (WHERE run_at <= $2 AND priority <= 0) AS waiting,
			count(*) FILTER (WHERE run_at <= $2 AND priority > 0) AS prioritized,
			count(*) FILTER (WHERE run_at > $2) AS delayed
		FROM {s}.jobs WHERE queue = $1 AND state = {queued}) AS w`

// countsTx counts a queue's jobs by state through q (Counts, the
// dashboard), with whether the queue is paused.
func (p *PG) countsTx(ctx context.Context, q pgQuerier, queue string, now int64) (JobCounts, bool, error) {
	var c JobCounts
	var paused bool
	err := q.QueryRow(ctx, p.sql(pgCountsSQL), queue, now).Scan(append(c.pgDest(), &paused)...)
	if err != nil {
		return c, false, pgErr(fmt.Errorf("count jobs: %w", err))
	}
	if paused {
		c.Paused = c.Waiting + c.Prioritized
		c.Waiting, c.Prioritized = 0, 0
	}
	return c, paused, nil
}
