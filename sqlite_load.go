package main

// Recovery: at start, a data file is loaded back into the memory engine
// (SQLiteStore.Load), its jobs in three stages that share the two cores.

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"
)

// RecoveryStats says what a start found in the database.
type RecoveryStats struct {
	Waiting, Delayed, Active, Completed, Failed, Logs, Queues, Crons int
	Took                                                             time.Duration
}

// Load rebuilds the broker's state from the database. It runs before the
// server accepts connections.
func (s *SQLiteStore) Load(b *MemEngine) (RecoveryStats, error) {
	start := time.Now()
	// Nothing runs beside a recovery, and what it allocates is nearly all
	// kept: a collector running meanwhile would mark the growing heap
	// again and again, most of the time a restart took (5 of 10 s for a
	// million jobs). So it is held off until the end, within a memory
	// limit (holdGC), and what the recovery threw away is then given
	// back to the system in the background, while the server starts.
	holdGC()
	defer releaseGC()

	var st RecoveryStats
	ctx := context.Background()
	if err := s.loadQueues(ctx, b, &st); err != nil {
		return st, err
	}
	// Numbers are never given twice: the highest on file may be a row
	// that memory does not hold (completed history, an unreadable record),
	// and a new job given it would overwrite that row.
	var top sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT max(seq) FROM jobs`).Scan(&top); err != nil {
		return st, fmt.Errorf("read jobs: %w", err)
	}
	b.seqAtLeast(top.Int64)
	// The rows of big deletions not yet carried out are dead: skipped
	// here, deleted by the writer once it starts.
	dead, lists, err := deadSeqs(ctx, s)
	if err != nil {
		return st, err
	}
	s.purging = lists
	s.purgeLeft.Store(int64(len(dead)))
	if len(dead) > 0 {
		// A dead row keeps its number until it is deleted: a new job
		// given it would be deleted with it.
		b.seqAtLeast(dead[len(dead)-1])
	}
	bad, err := s.loadJobs(ctx, b, &st, dead)
	if err != nil {
		return st, err
	}
	if err := b.restoreHistory(ctx); err != nil {
		return st, err
	}
	if err := s.loadCrons(ctx, b, &st); err != nil {
		return st, err
	}
	if err := s.loadLogs(ctx, b, &st); err != nil {
		return st, err
	}
	b.finishRestore()
	s.mu.Lock()
	s.taken = b.seq.Load() // every row on file has a number up to this
	s.mu.Unlock()
	st.Took = time.Since(start)
	if bad > 0 {
		return st, fmt.Errorf("%d job records could not be read", bad)
	}
	return st, nil
}

// loadQueues restores the queues' settings; unreadable ones are left at
// their defaults.
func (s *SQLiteStore) loadQueues(ctx context.Context, b *MemEngine, st *RecoveryStats) error {
	rows, err := s.db.QueryContext(ctx, `SELECT name, settings FROM queues`)
	if err != nil {
		return fmt.Errorf("read queues: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var settings []byte
		if err := rows.Scan(&name, &settings); err != nil {
			return err
		}
		if err := b.restoreQueue(name, settings); err != nil {
			s.log.Warn("queue settings unreadable, using defaults", "queue", name, "err", err)
		}
		st.Queues++
	}
	return nil
}

// loadJobs restores the jobs: queued ones as they are read, completed and
// failed ones after, in the order they finished (completed by DoneAt,
// failed by when they entered the DLQ). Records that cannot be decoded are
// skipped and counted in bad.
//
// A restart of a million jobs is downtime, so the work runs in three
// stages on their own goroutines, so that two cores share it:
// readJobRows steps through the rows and copies them into reused buffers
// (rawBatch), decodeJobRows decodes them, and restoreJobs puts the jobs
// back into the index and the shards, a batch at a time. The decoding
// had been on the reading goroutine, which then took three quarters of
// the time alone. The index is sized from a count first (countJobs), so
// that it never grows (and rehashes) on the way.
func (s *SQLiteStore) loadJobs(ctx context.Context, b *MemEngine, st *RecoveryStats, purged []int64) (bad int, err error) {
	// The rows of a big deletion not yet carried out are passed over by
	// their numbers, without reading them, when they lie in a few runs
	// (a queue's jobs, pushed together): 1.5M of them took 2.6 s to read
	// past at a start.
	spans := liveSpans(purged)
	if len(spans) > 1 {
		purged = nil // the spans leave the dead rows out: no row to check
	}
	n, withResults, err := s.countJobs(ctx, b, spans)
	if err != nil {
		return 0, err
	}
	b.idxReserve(n)
	raws, free := make(chan *rawBatch, 4), make(chan *rawBatch, 6)
	for range cap(free) {
		free <- &rawBatch{}
	}
	batches := make(chan []loadedJob, 4)
	// readErr and bad are written before their stage's channel closes,
	// and read once restoreJobs has seen the last batch: after both.
	var readErr error
	go func() {
		defer close(raws)
		readErr = s.readJobRows(ctx, spans, purged, withResults, raws, free)
	}()
	go func() {
		defer close(batches)
		bad = s.decodeJobRows(raws, free, batches)
	}()
	done, dead := restoreJobs(b, st, batches)
	if readErr != nil {
		return bad, readErr
	}
	restoreFinished(b, done, dead)
	return bad, nil
}

// countJobs counts the rows loadJobs will read, refuses a file the memory
// budget cannot hold before anything is loaded (rather than loading until
// the OOM killer ends it), and says whether any completed job has a
// result to join.
func (s *SQLiteStore) countJobs(ctx context.Context, b *MemEngine, spans [][2]int64) (n int, withResults bool, err error) {
	var size, results int64
	for _, sp := range spans {
		var k int
		var sz int64
		if err := s.db.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(length(record)), 0) FROM jobs WHERE id IS NULL AND seq BETWEEN ? AND ?`,
			sp[0], sp[1]).Scan(&k, &sz); err != nil {
			return 0, false, fmt.Errorf("count jobs: %w", err)
		}
		n, size = n+k, size+sz
	}
	var resultRows int64
	if err := s.db.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(length(result)), 0) FROM results`).Scan(&resultRows, &results); err != nil {
		return 0, false, fmt.Errorf("count results: %w", err)
	}
	if err := b.mem.fitsAtStart(int64(n), size+results); err != nil {
		return 0, false, err
	}
	return n, resultRows > 0, nil
}

// readJobRows is loadJobs' first stage: it steps through the rows of each
// span and sends them to raws in buffers taken from free, passing over
// the rows of a big deletion not yet carried out (purged).
func (s *SQLiteStore) readJobRows(ctx context.Context, spans [][2]int64, purged []int64, withResults bool,
	raws chan<- *rawBatch, free <-chan *rawBatch) error {
	rb := <-free
	var rec, res sql.RawBytes // outside the loop: Scan's pointers escape
	var seq int64
	// Completed history past the memory's cache stays on disk. Without
	// results (nothing completed is kept) the join is left out: a lookup
	// per row for nothing.
	q := `SELECT j.seq, j.record, r.result FROM jobs j LEFT JOIN results r ON r.seq = j.seq
		WHERE j.id IS NULL AND j.seq BETWEEN ? AND ?`
	if !withResults {
		q = `SELECT seq, record, NULL FROM jobs WHERE id IS NULL AND seq BETWEEN ? AND ?`
	}
	read := func(sp [2]int64) error {
		rows, err := s.db.QueryContext(ctx, q, sp[0], sp[1])
		if err != nil {
			return fmt.Errorf("read jobs: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := rows.Scan(&seq, &rec, &res); err != nil {
				return err
			}
			if isDead(purged, seq) {
				continue // a big deletion's row, not yet deleted
			}
			rb.add(rec, res)
			if len(rb.rows) == loadBatch || len(rb.buf) >= loadBatchBytes {
				raws <- rb
				rb = <-free
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read jobs: %w", err)
		}
		return nil
	}
	for _, sp := range spans {
		if err := read(sp); err != nil {
			return err
		}
	}
	if len(rb.rows) > 0 {
		raws <- rb
	}
	return nil
}

// decodeJobRows is loadJobs' second stage: it decodes each row of raws
// into a job (with its result, if it completed), gives the buffer back to
// free, and sends the batch on; it answers how many records it could not
// read (the first five logged).
func (s *SQLiteStore) decodeJobRows(raws <-chan *rawBatch, free chan<- *rawBatch, batches chan<- []loadedJob) (bad int) {
	var last recLast
	for rb := range raws {
		batch := make([]loadedJob, 0, len(rb.rows))
		for _, r := range rb.rows {
			j, err := last.decode(rb.buf[r.rec:r.res])
			if err != nil {
				bad++
				if bad <= 5 {
					s.log.Error("job record unreadable, skipped", "err", err)
				}
				continue
			}
			var result Raw
			if r.hasRes && j.state == StateCompleted {
				result = clone(Raw(rb.buf[r.res:r.end]))
			}
			batch = append(batch, loadedJob{j, result})
		}
		rb.reset()
		free <- rb
		batches <- batch
	}
	return bad
}

// restoreJobs is loadJobs' last stage: queued jobs go back into the
// shards as they come; completed and failed ones are answered, for
// restoreFinished once all are read.
func restoreJobs(b *MemEngine, st *RecoveryStats, batches <-chan []loadedJob) (done, dead []loadedJob) {
	for batch := range batches {
		for _, lj := range batch {
			switch j := lj.j; j.state {
			case StateCompleted:
				done = append(done, lj)
				st.Completed++
			case StateFailed:
				j.ensureDLQEntry() // before the sort below reads it
				dead = append(dead, lj)
				st.Failed++
			default:
				switch j.state {
				case StateActive:
					st.Active++
				case StateDelayed:
					st.Delayed++
				default:
					st.Waiting++
				}
				b.restoreQueued(j)
			}
		}
	}
	return done, dead
}

// restoreFinished puts completed and failed jobs back in the order they
// finished (completed by DoneAt, failed by when they entered the DLQ).
func restoreFinished(b *MemEngine, done, dead []loadedJob) {
	slices.SortFunc(done, func(x, y loadedJob) int { return cmpInt(x.j.DoneAt(), y.j.DoneAt()) })
	slices.SortFunc(dead, func(x, y loadedJob) int { return cmpInt(x.j.dlq.EnteredAt, y.j.dlq.EnteredAt) })
	for _, lj := range done {
		b.restoreDone(lj.j, lj.result)
	}
	for _, lj := range dead {
		b.restoreDead(lj.j)
	}
}

// loadBatch is how many rows a batch of loadJobs' stages holds at most.
const loadBatch = 512

// loadBatchBytes ends a batch of rows early when their bytes reach it:
// the load's buffers stay a few megabytes whatever the jobs hold.
const loadBatchBytes = 1 << 20

// rawBatch is rows read for loadJobs' decoding stage: their records and
// results copied end to end into one buffer, reused batch after batch.
type rawBatch struct {
	buf  []byte
	rows []rawRow
}

// rawRow is one row of a rawBatch: its record is buf[rec:res], its result
// buf[res:end].
type rawRow struct {
	rec, res, end int
	hasRes        bool
}

func (rb *rawBatch) add(rec, res []byte) {
	r := rawRow{rec: len(rb.buf), hasRes: res != nil}
	rb.buf = append(rb.buf, rec...)
	r.res = len(rb.buf)
	rb.buf = append(rb.buf, res...)
	r.end = len(rb.buf)
	rb.rows = append(rb.rows, r)
}

// reset empties the batch for the next rows; a buffer a few big jobs
// grew is let go rather than kept for the rest of the load.
func (rb *rawBatch) reset() {
	if cap(rb.buf) > 2*loadBatchBytes {
		rb.buf = nil
	}
	rb.buf, rb.rows = rb.buf[:0], rb.rows[:0]
}

// loadedJob is a job read back, with its result when it completed.
type loadedJob struct {
	j      *Job
	result Raw
}

// loadCrons restores the cron schedules; unreadable ones are skipped.
func (s *SQLiteStore) loadCrons(ctx context.Context, b *MemEngine, st *RecoveryStats) error {
	rows, err := s.db.QueryContext(ctx, `SELECT record FROM crons`)
	if err != nil {
		return fmt.Errorf("read cron schedules: %w", err)
	}
	var crons []CronSchedule
	for rows.Next() {
		var rec []byte
		if err := rows.Scan(&rec); err != nil {
			rows.Close()
			return err
		}
		c, err := decodeCronRecord(rec)
		if err != nil {
			s.log.Error("cron schedule unreadable, skipped", "err", err)
			continue
		}
		crons = append(crons, c)
	}
	rows.Close()
	if err := b.cron.Restore(crons); err != nil {
		s.log.Error("cron schedules", "err", err)
	}
	st.Crons = len(crons)
	return nil
}

// loadLogs restores jobs' logs; unreadable ones are left out.
func (s *SQLiteStore) loadLogs(ctx context.Context, b *MemEngine, st *RecoveryStats) error {
	rows, err := s.db.QueryContext(ctx, `SELECT job_id, logs FROM job_logs`)
	if err != nil {
		return fmt.Errorf("read logs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var blob []byte
		if err := rows.Scan(&id, &blob); err != nil {
			return err
		}
		if logs, err := decodeLogs(blob); err == nil {
			b.restoreLogs(id, logs)
			st.Logs++
		}
	}
	return nil
}
