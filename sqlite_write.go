package main

// SQLite's write path: the writer goroutine that commits the pending set
// as one transaction, and what keeps it from wedging on a change SQLite
// refuses.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// writer commits the pending set, one transaction at a time, until the
// store is closed and everything is written.
func (s *SQLiteStore) writer() {
	defer close(s.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var retry time.Duration // pause after a failed flush, growing to 5 s
	for {
		if !s.awaitFlush(timer) {
			s.purgeSome()
			continue
		}
		if s.purgeOwed() {
			// Under a load that never lets the writer idle, deletions
			// still go on, a step between flushes.
			s.purgeSome()
		}
		if retry > 0 {
			time.Sleep(retry)
		}
		bt, bars, closed := s.takePending()
		began := time.Now()
		n := bt.len()
		if len(bt.dels) >= s.purgeMin {
			// Written as one tombstone: they would make the write rate
			// (and with it the backlog allowed) look far higher than it is.
			n -= len(bt.dels)
		}
		bt, dropped, err := s.writeOut(bt)
		took := time.Since(began)
		var barErr error
		retry, barErr = s.settle(bt, n, took, dropped, err, retry)
		if err == nil && dropped == 0 {
			s.retiredWritten(bt)
		}
		for _, b := range bars {
			b <- barErr
		}
		// At shutdown, stop once everything is written, or after a few
		// failed attempts (Close reports what could not be written).
		if closed && (err == nil || retry >= 800*time.Millisecond) {
			return
		}
	}
}

// awaitFlush waits for a reason to flush (true): enough changes, a
// durable push waiting, the oldest change 10 ms old, or shutdown. Meanwhile
// it returns false when there are removed jobs' rows to delete
// (sqlite_purge.go): the writer deletes some and asks again.
func (s *SQLiteStore) awaitFlush(timer *time.Timer) bool {
	for {
		s.mu.Lock()
		n, first, closed, bars, at := s.n, s.first, s.closed, len(s.barriers), s.flushAt()
		s.mu.Unlock()
		if closed || bars > 0 || n >= at {
			return true
		}
		now := time.Now()
		wait := time.Duration(-1)
		if n > 0 {
			// The oldest change's deadline comes before deletions.
			if wait = flushInterval - now.Sub(first); wait <= 0 {
				return true
			}
		}
		if len(s.purging) > 0 {
			if !now.Before(s.purgeRetry) {
				return false
			}
			// Deletions paused after a failure resume on their own.
			if w := s.purgeRetry.Sub(now); wait < 0 || w < wait {
				wait = w
			}
		}
		if wait >= 0 {
			timer.Reset(wait)
		}
		select {
		case <-s.kick:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// takePending takes the pending set as a batch, once no Hold is in force,
// with the durable pushes waiting on it; closed says the store is closing.
func (s *SQLiteStore) takePending() (bt *writeBatch, bars []chan error, closed bool) {
	s.mu.Lock()
	for s.holds > 0 {
		s.unheld.Wait()
	}
	bt = &writeBatch{jobs: s.jobs, dels: s.dels, queues: s.queues, logs: s.logs, crons: s.crons}
	s.taken = max(s.taken, s.noted)
	bars = s.barriers
	s.crons = map[string][]byte{}
	// Sized as the last batch was, up to a bound: a steady load fills
	// one about as full as the last, and a map grown from empty rehashes
	// all along the way.
	s.jobs = make(map[int64]*pendingJob, min(len(bt.jobs), 4096))
	s.queues, s.logs, s.barriers = map[string][]byte{}, map[string][]LogEntry{}, nil
	s.dels = nil
	s.n = 0
	closed = s.closed
	s.mu.Unlock()
	return bt, bars, closed
}

// writeOut flushes a batch. A change SQLite refuses (a row over its size
// limit, say) must not hold up every other: the rest is written in smaller
// transactions, leaving out only what cannot be written (dropped of them).
// On error, the batch returned is what was not written.
func (s *SQLiteStore) writeOut(bt *writeBatch) (*writeBatch, int, error) {
	err := s.flush(bt)
	var dropped int
	if err != nil && !transientWriteErr(err) {
		bt, dropped, err = s.isolate(bt, err)
	}
	return bt, dropped, err
}

// settle records how a flush of n changes went, under s.mu: the write
// rate it showed, or the failure (what was not written goes back to be
// tried again after the pause it returns). barErr is what the durable
// pushes waiting on the flush are told.
func (s *SQLiteStore) settle(bt *writeBatch, n int, took time.Duration, dropped int, err error, retry time.Duration) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && dropped == 0 && n >= rateBatch && took > 0 {
		r := float64(n) / took.Seconds()
		if s.rate == 0 {
			s.rate = r
		} else {
			s.rate = 0.7*s.rate + 0.3*r
		}
		s.limit = min(max(int(s.rate*backlogTarget.Seconds()), minBacklog), maxBacklog)
	}
	if err != nil {
		// What was not written (the transaction rolled back): put the
		// changes back under any newer ones and try again.
		s.putBack(bt)
		if s.err == nil {
			s.errSince = time.Now()
			s.log.Error("storage write failed; retrying", "path", s.path, "err", err, "pending", s.n)
		}
		s.err = err
		retry = min(max(retry*2, 100*time.Millisecond), 5*time.Second)
	} else {
		if s.err != nil {
			s.log.Info("storage writes recovered", "path", s.path)
		}
		s.err = nil
		retry = 0
	}
	barErr := err
	if barErr == nil && dropped > 0 {
		// A durable push waiting on this flush may have been among what
		// was left out: it is not told it is on disk.
		barErr = fmt.Errorf("%d changes could not be written and were dropped (see the server log)", dropped)
	}
	s.room.Broadcast()
	return retry, barErr
}

// flush writes one batch as one transaction.
func (s *SQLiteStore) flush(bt *writeBatch) error {
	if bt.len() == 0 {
		return nil
	}
	bt.purge = nil
	if err := s.writeTx(func(ctx context.Context) error { return s.writeChanges(ctx, bt) }); err != nil {
		return err
	}
	// The tombstones are on disk: their rows are deleted from now on.
	for _, p := range bt.purge {
		s.purging = append(s.purging, p)
		s.purgeLeft.Add(int64(len(p.seqs)))
	}
	return nil
}

// writeTx runs fn in one transaction on the writer's connection, driven
// with BEGIN/COMMIT rather than through database/sql's Tx, which would
// prepare every cached statement again for each transaction.
func (s *SQLiteStore) writeTx(fn func(ctx context.Context) error) error {
	ctx := context.Background()
	if _, err := s.wconn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return err
	}
	if err := fn(ctx); err != nil {
		s.wconn.ExecContext(ctx, "ROLLBACK")
		return err
	}
	if _, err := s.wconn.ExecContext(ctx, "COMMIT"); err != nil {
		s.wconn.ExecContext(ctx, "ROLLBACK")
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// writeChanges writes a batch's changes inside flush's transaction: jobs
// and their results, queue settings, cron schedules, then job logs.
func (s *SQLiteStore) writeChanges(ctx context.Context, bt *writeBatch) error {
	if err := s.writeJobs(ctx, bt); err != nil {
		return err
	}
	if err := s.writeNamed(ctx, bt.queues, "queue",
		`DELETE FROM queues WHERE name = ?`,
		`INSERT INTO queues(name, settings) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET settings=excluded.settings`); err != nil {
		return err
	}
	if err := s.writeNamed(ctx, bt.crons, "cron",
		`DELETE FROM crons WHERE name = ?`,
		`INSERT INTO crons(name, record) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET record=excluded.record`); err != nil {
		return err
	}
	return s.writeLogs(ctx, bt.logs)
}

// writeJobs writes or deletes job records, and their results, in
// multi-row statements.
func (s *SQLiteStore) writeJobs(ctx context.Context, bt *writeBatch) error {
	jobs := bt.jobs
	// Written in the order of their rows: new jobs are then appended to
	// the table's B-tree and every other row is reached as its neighbour
	// was, where the map's order split a page and sought from the root
	// for each.
	seqs := s.seqBuf[:0]
	// Sized once: growing these by appending was most of what a flush
	// allocated.
	nUp, nRes := 0, 0
	for seq, p := range jobs {
		seqs = append(seqs, seq)
		switch {
		case p.record == nil:
			// Only retired (writeRetired): the row is there.
		case p.result != nil:
			nUp++
			nRes++
		default:
			nUp++
		}
	}
	up := make([]any, 0, 2*nUp)
	resUp := make([]any, 0, 2*nRes)
	var retired []any // completed jobs leaving memory (history.go)
	slices.Sort(seqs)
	s.seqBuf = seqs
	for _, seq := range seqs {
		p := jobs[seq]
		if p.retire != nil {
			r := p.retire
			retired = append(retired, seq, r.id, r.queue, r.created, r.doneAt)
		}
		if p.record == nil {
			continue
		}
		up = append(up, seq, p.record)
		if p.result != nil {
			resUp = append(resUp, seq, p.result)
		}
	}
	if err := s.execChunks(ctx, "jobs-up", up, 2, func(n int) string {
		return "INSERT OR REPLACE INTO jobs(seq, record) VALUES " + placeholders(n, 2)
	}); err != nil {
		return fmt.Errorf("write jobs: %w", err)
	}
	if err := s.execChunks(ctx, "results-up", resUp, 2, func(n int) string {
		return "INSERT OR REPLACE INTO results(seq, result) VALUES " + placeholders(n, 2)
	}); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	if len(bt.dels) >= s.purgeMin {
		// A big deletion: a tombstone now, the rows in the background.
		if err := s.writePurge(ctx, bt, bt.dels); err != nil {
			return err
		}
	} else if err := s.deleteSeqs(ctx, bt.dels); err != nil {
		return fmt.Errorf("delete jobs: %w", err)
	}
	if err := s.writeRetired(ctx, retired); err != nil {
		return fmt.Errorf("mark completed history: %w", err)
	}
	return nil
}

// writeNamed writes the records of m, keyed by name (queue settings or
// cron schedules), one statement each: they are few. A nil record is a
// deletion. what names the kind in an error.
func (s *SQLiteStore) writeNamed(ctx context.Context, m map[string][]byte, what, del, upsert string) error {
	for name, b := range m {
		var err error
		if b == nil {
			_, err = s.wconn.ExecContext(ctx, del, name)
		} else {
			_, err = s.wconn.ExecContext(ctx, upsert, name, b)
		}
		if err != nil {
			return fmt.Errorf("write %s %s: %w", what, name, err)
		}
	}
	return nil
}

// writeLogs writes or deletes (a nil list) jobs' logs.
func (s *SQLiteStore) writeLogs(ctx context.Context, logs map[string][]LogEntry) error {
	var logUp, logDel []any
	for id, l := range logs {
		if l == nil {
			logDel = append(logDel, id)
		} else {
			logUp = append(logUp, id, encodeLogs(l))
		}
	}
	if err := s.execChunks(ctx, "logs-up", logUp, 2, func(n int) string {
		return "INSERT INTO job_logs(job_id, logs) VALUES " + placeholders(n, 2) + " ON CONFLICT(job_id) DO UPDATE SET logs=excluded.logs"
	}); err != nil {
		return fmt.Errorf("write logs: %w", err)
	}
	if err := s.execChunks(ctx, "logs-del", logDel, 1, func(n int) string {
		return "DELETE FROM job_logs WHERE job_id IN " + placeholders(1, n)
	}); err != nil {
		return fmt.Errorf("delete logs: %w", err)
	}
	return nil
}

// execChunks runs a multi-row statement over args in chunks of up to
// rowsPerStmt rows, reusing prepared statements by row count.
func (s *SQLiteStore) execChunks(ctx context.Context, kind string, args []any, width int, build func(rows int) string) error {
	for len(args) > 0 {
		rows := min(len(args)/width, rowsPerStmt)
		key := kind + ":" + itoa(int64(rows))
		st := s.stmts[key]
		if st == nil {
			var err error
			if st, err = s.wconn.PrepareContext(ctx, build(rows)); err != nil {
				return err
			}
			s.stmts[key] = st
		}
		if _, err := st.ExecContext(ctx, args[:rows*width]...); err != nil {
			return err
		}
		args = args[rows*width:]
	}
	return nil
}

// ---------------------------------------------------------------------------
// A writer that never wedges

// writeBatch is one flush's changes, each the latest of its key.
type writeBatch struct {
	// purge are the tombstones the batch's flush wrote (sqlite_purge.go).
	purge []purgeList
	jobs  map[int64]*pendingJob
	// dels are the jobs whose rows are to be deleted, by number. A job
	// may also have a change in jobs (one put back after a failed flush,
	// older than its removal): deletions are written after changes.
	dels   []int64
	queues map[string][]byte     // nil value: delete
	logs   map[string][]LogEntry // nil value: delete
	crons  map[string][]byte     // nil value: delete
}

func newWriteBatch() *writeBatch {
	return &writeBatch{jobs: map[int64]*pendingJob{}, queues: map[string][]byte{}, logs: map[string][]LogEntry{}, crons: map[string][]byte{}}
}

func (bt *writeBatch) len() int {
	if bt == nil {
		return 0
	}
	return len(bt.jobs) + len(bt.dels) + len(bt.queues) + len(bt.logs) + len(bt.crons)
}

// halves splits the batch in two of about the same number of changes.
func (bt *writeBatch) halves() (*writeBatch, *writeBatch) {
	a, b := newWriteBatch(), newWriteBatch()
	half, i := bt.len()/2, 0
	pick := func() *writeBatch {
		i++
		if i <= half {
			return a
		}
		return b
	}
	for k, v := range bt.jobs {
		pick().jobs[k] = v
	}
	for _, seq := range bt.dels {
		h := pick()
		h.dels = append(h.dels, seq)
	}
	for k, v := range bt.queues {
		pick().queues[k] = v
	}
	for k, v := range bt.logs {
		pick().logs[k] = v
	}
	for k, v := range bt.crons {
		pick().crons[k] = v
	}
	return a, b
}

// merge adds o's changes to bt (o's are taken where both have a key).
func (bt *writeBatch) merge(o *writeBatch) *writeBatch {
	if bt == nil {
		return o
	}
	if o == nil {
		return bt
	}
	maps.Copy(bt.jobs, o.jobs)
	bt.dels = append(bt.dels, o.dels...)
	maps.Copy(bt.queues, o.queues)
	maps.Copy(bt.logs, o.logs)
	maps.Copy(bt.crons, o.crons)
	return bt
}

// putBack returns unwritten changes to the pending set, under any newer
// change of the same key. s.mu is held.
func (s *SQLiteStore) putBack(bt *writeBatch) {
	if bt == nil {
		return
	}
	for id, p := range bt.jobs {
		n, newer := s.jobs[id]
		switch {
		case !newer:
			s.jobs[id] = p
			s.n++
		case n.record == nil && p.record != nil:
			// The newer change only retires the job (history.go): the
			// record it retires is the one that was not written.
			n.record, n.result = p.record, p.result
		}
	}
	// A removal is never followed by another change of the job, so it
	// can go back as it is.
	s.dels = append(s.dels, bt.dels...)
	s.n += len(bt.dels)
	for k, v := range bt.queues {
		if _, newer := s.queues[k]; !newer {
			s.queues[k] = v
			s.n++
		}
	}
	for k, v := range bt.crons {
		if _, newer := s.crons[k]; !newer {
			s.crons[k] = v
			s.n++
		}
	}
	for k, v := range bt.logs {
		if _, newer := s.logs[k]; !newer {
			s.logs[k] = v
			s.n++
		}
	}
	if s.n > 0 && s.first.IsZero() {
		s.first = time.Now()
	}
}

// transientWriteErr says whether a failed write may succeed as it is when
// tried again (the database busy or locked, the disk full or failing, no
// memory): such changes are kept and retried, never dropped. Only an error
// SQLite gives about a change itself (too big, a constraint, a type)
// makes the writer look for the change at fault.
func transientWriteErr(err error) bool {
	if isDiskFull(err) {
		return true
	}
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return true // not SQLite's word on the data: the connection, a context
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_RANGE:
		return false
	}
	return true
}

// isolate writes what it can of a batch that failed with cause, in halves
// down to single changes; a single change that fails for a reason of its
// own is dropped, logged and counted. It returns what is left unwritten
// because of a transient error (with that error), and how many changes
// were dropped.
func (s *SQLiteStore) isolate(bt *writeBatch, cause error) (*writeBatch, int, error) {
	if bt.len() <= 1 {
		s.drop(bt, cause)
		return nil, bt.len(), nil
	}
	x, y := bt.halves()
	dropped := 0
	for i, half := range []*writeBatch{x, y} {
		err := s.flush(half)
		if err == nil {
			continue
		}
		var left *writeBatch
		var n int
		if transientWriteErr(err) {
			left = half
		} else {
			left, n, err = s.isolate(half, err)
			dropped += n
		}
		if err != nil {
			if i == 0 {
				left = left.merge(y)
			}
			return left, dropped, err
		}
	}
	return nil, dropped, nil
}

// drop leaves out one change that cannot be written, saying which (never
// its data) in the log and in the dropped-changes metric.
func (s *SQLiteStore) drop(bt *writeBatch, cause error) {
	for seq, p := range bt.jobs {
		s.log.Error("storage: a change cannot be written and is dropped", "change", "job record", "job_id", jobIDOfRecord(p.record),
			"seq", seq, "bytes", len(p.record)+len(p.result), "err", cause)
	}
	for _, seq := range bt.dels {
		s.log.Error("storage: a change cannot be written and is dropped", "change", "job removal", "seq", seq, "err", cause)
	}
	for name, v := range bt.queues {
		s.log.Error("storage: a change cannot be written and is dropped", "change", "queue settings", "queue", name, "bytes", len(v), "err", cause)
	}
	for id, l := range bt.logs {
		s.log.Error("storage: a change cannot be written and is dropped", "change", "job logs", "job_id", id, "entries", len(l), "err", cause)
	}
	for name, v := range bt.crons {
		s.log.Error("storage: a change cannot be written and is dropped", "change", "cron schedule", "cron", name, "bytes", len(v), "err", cause)
	}
	s.dropped.Add(uint64(bt.len()))
}

// Dropped counts the changes left out because they could not be written.
func (s *SQLiteStore) Dropped() uint64 { return s.dropped.Load() }

// jobIDOfRecord reads the job id out of an encoded record, for the log.
func jobIDOfRecord(rec []byte) string {
	if len(rec) == 0 {
		return ""
	}
	j, err := decodeRecord(rec)
	if err != nil {
		return "(unreadable)"
	}
	return j.ID()
}

func placeholders(rows, width int) string {
	one := "(" + strings.TrimSuffix(strings.Repeat("?,", width), ",") + ")"
	return strings.TrimSuffix(strings.Repeat(one+",", rows), ",")
}
