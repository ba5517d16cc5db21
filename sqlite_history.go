package main

// Completed history on disk (SQLite mode), the store's side: completed
// jobs past the memory's cache (history.go) keep their rows. A retired
// job's row is marked with its id, queue, creation and completion times,
// in columns only retired rows fill, each under a partial index that
// holds retired rows alone, so that the write path of every other job
// pays nothing for them. Reads and deletions of retired rows run on
// connections of their own, beside the writer.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// retireInfo is what marks a retired job's row.
type retireInfo struct {
	id, queue       string
	created, doneAt int64
}

// retiredRef names a retired job that was deleted.
type retiredRef struct {
	id, queue string
}

// JobRetired records that j leaves memory and its row stays, as history;
// it is called under the job's shard lock, like JobChanged.
func (s *SQLiteStore) JobRetired(j *Job) {
	r := &retireInfo{id: j.ID(), queue: j.Queue, created: j.CreatedAt, doneAt: j.DoneAt()}
	s.mu.Lock()
	s.pendingOf(j.seq).retire = r
	s.retiring[r.id] = j.seq
	s.mu.Unlock()
}

// retiredWritten forgets the pending retirements a flush wrote.
func (s *SQLiteStore) retiredWritten(bt *writeBatch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for seq, p := range bt.jobs {
		if p.retire != nil && s.retiring[p.retire.id] == seq {
			delete(s.retiring, p.retire.id)
		}
	}
}

// writeRetired marks the retired rows of a batch, after its records: args
// are (seq, id, queue, created, doneAt) for each, as writeJobs gathers them.
func (s *SQLiteStore) writeRetired(ctx context.Context, args []any) error {
	return s.execChunks(ctx, "jobs-retire", args, 5, func(n int) string {
		return "UPDATE jobs SET id = v.column2, queue = v.column3, created_at = v.column4, done_at = v.column5 FROM (VALUES " +
			placeholders(n, 5) + ") AS v WHERE jobs.seq = v.column1"
	})
}

// Retired reads the latest retired job of that id, with its result; nil
// when there is none. A retirement not yet written (its completion may be
// in the flush under way) is waited for.
func (s *SQLiteStore) Retired(ctx context.Context, id string) (*Job, Raw, error) {
	s.mu.Lock()
	seq, pending := s.retiring[id]
	s.mu.Unlock()
	var row *sql.Row
	if pending {
		if err := s.Sync(); err != nil {
			return nil, nil, err
		}
		row = s.db.QueryRowContext(ctx, `SELECT j.seq, j.record, r.result FROM jobs j LEFT JOIN results r ON r.seq = j.seq WHERE j.seq = ?`, seq)
	} else {
		row = s.db.QueryRowContext(ctx, `SELECT j.seq, j.record, r.result FROM jobs j LEFT JOIN results r ON r.seq = j.seq
			WHERE j.id = ? ORDER BY j.seq DESC LIMIT 1`, id)
	}
	var rec, res []byte
	if err := row.Scan(&seq, &rec, &res); errors.Is(err, sql.ErrNoRows) {
		return nil, nil, nil
	} else if err != nil {
		return nil, nil, fmt.Errorf("read completed job %s: %w", id, err)
	}
	j, err := decodeRecord(rec)
	if err != nil {
		return nil, nil, fmt.Errorf("completed job %s: %w", id, err)
	}
	j.seq = seq // the row it is kept in (revive)
	return j, Raw(res), nil
}

// ResultOf reads a completed job's result from disk (the memory's results
// cache no longer holds it). One not found may be in the flush under way:
// it is waited for, and looked for again.
func (s *SQLiteStore) ResultOf(ctx context.Context, seq int64) (Raw, error) {
	for try := 0; ; try++ {
		s.mu.Lock()
		if p := s.jobs[seq]; p != nil && p.result != nil {
			r := clone(Raw(p.result))
			s.mu.Unlock()
			return r, nil
		}
		s.mu.Unlock()
		var res []byte
		err := s.db.QueryRowContext(ctx, `SELECT result FROM results WHERE seq = ?`, seq).Scan(&res)
		switch {
		case err == nil:
			return Raw(res), nil
		case !errors.Is(err, sql.ErrNoRows):
			return nil, fmt.Errorf("read a result: %w", err)
		case try == 1:
			return nil, nil
		}
		if err := s.Sync(); err != nil {
			return nil, err
		}
	}
}

// RetiredCounts counts the retired jobs of each queue.
func (s *SQLiteStore) RetiredCounts(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT queue, count(*) FROM jobs WHERE id IS NOT NULL GROUP BY queue`)
	if err != nil {
		return nil, fmt.Errorf("count completed history: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var q string
		var n int
		if err := rows.Scan(&q, &n); err != nil {
			return nil, err
		}
		out[q] = n
	}
	return out, rows.Err()
}

// RetiredPage reads the first k retired jobs of a queue in GetJobs' order
// (by creation time, then id, ascending or descending), with their
// results.
func (s *SQLiteStore) RetiredPage(ctx context.Context, queue string, k int, asc bool) ([]*Job, map[*Job]Raw, error) {
	if err := s.Sync(); err != nil {
		return nil, nil, err
	}
	dir := "DESC"
	if asc {
		dir = "ASC"
	}
	rows, err := s.db.QueryContext(ctx, `SELECT j.seq, j.record, r.result FROM jobs j LEFT JOIN results r ON r.seq = j.seq
		WHERE j.id IS NOT NULL AND j.queue = ? ORDER BY j.created_at `+dir+`, j.id `+dir+` LIMIT ?`, queue, k)
	if err != nil {
		return nil, nil, fmt.Errorf("list completed history: %w", err)
	}
	defer rows.Close()
	var out []*Job
	results := map[*Job]Raw{}
	for rows.Next() {
		var seq int64
		var rec, res []byte
		if err := rows.Scan(&seq, &rec, &res); err != nil {
			return nil, nil, err
		}
		j, err := decodeRecord(rec)
		if err != nil {
			return nil, nil, fmt.Errorf("completed history: %w", err)
		}
		j.seq = seq
		out = append(out, j)
		results[j] = Raw(res)
	}
	return out, results, rows.Err()
}

// DeleteRetired deletes up to limit retired jobs completed at or before
// doneBefore, oldest first (of one queue, or of all for ""), with their
// results and logs, and names them. Pending retirements are written first,
// so that none of them is missed and written back after.
func (s *SQLiteStore) DeleteRetired(ctx context.Context, queue string, doneBefore int64, limit int) ([]retiredRef, error) {
	if err := s.Sync(); err != nil {
		return nil, err
	}
	q := `SELECT seq, id, queue FROM jobs WHERE id IS NOT NULL AND done_at <= ? ORDER BY done_at, seq LIMIT ?`
	args := []any{doneBefore, limit}
	if queue != "" {
		q = `SELECT seq, id, queue FROM jobs WHERE id IS NOT NULL AND queue = ? AND done_at <= ? ORDER BY done_at, seq LIMIT ?`
		args = []any{queue, doneBefore, limit}
	}
	return s.deleteRetired(ctx, q, args...)
}

// deleteRetired deletes the rows the query selects (seq, id, queue), in one
// transaction.
func (s *SQLiteStore) deleteRetired(ctx context.Context, query string, args ...any) ([]retiredRef, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("delete completed history: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("delete completed history: %w", err)
	}
	var seqs, ids []any
	var out []retiredRef
	for rows.Next() {
		var seq int64
		var r retiredRef
		if err := rows.Scan(&seq, &r.id, &r.queue); err != nil {
			rows.Close()
			return nil, err
		}
		seqs, ids = append(seqs, seq), append(ids, r.id)
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, nil
	}
	for i := 0; i < len(seqs); i += rowsPerStmt {
		end := min(i+rowsPerStmt, len(seqs))
		in := strings.TrimSuffix(strings.Repeat("?,", end-i), ",")
		for _, stmt := range []struct {
			sql  string
			args []any
		}{{"DELETE FROM jobs WHERE seq IN (" + in + ")", seqs[i:end]}, {"DELETE FROM results WHERE seq IN (" + in + ")", seqs[i:end]},
			{"DELETE FROM job_logs WHERE job_id IN (" + in + ")", ids[i:end]}} {
			if _, err := tx.ExecContext(ctx, stmt.sql, stmt.args...); err != nil {
				return nil, fmt.Errorf("delete completed history: %w", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("delete completed history: %w", err)
	}
	return out, nil
}
