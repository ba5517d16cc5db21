package main

// Big deletions in SQLite mode (an Obliterate, a Drain or a Clean of a
// million jobs) without a long write. Row by row inside the flush, 1.5M
// deletions held the writer for 16 s: every change behind them waited,
// and a kill -9 in that window brought the deleted jobs back, since the
// transaction never committed.
//
// So a flush with more than purgeMin removals writes them as one row
// instead: the sorted job sequence numbers, delta-encoded, in the purges
// table (a tombstone: a few MB for millions of jobs, committed with the
// rest of the flush). From then on the rows it names are dead: recovery
// and queued migrate skip them. The writer deletes them in the
// background, purgeStep rows at a time between flushes (a flush waits for
// at most one step), and drops the tombstone once its rows are gone. A
// stop leaves what is not deleted yet to the next start, which goes on
// with it. Sequence numbers are never reused, so a dead row is never
// written again.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

const (
	// purgeMin is the count of removals in one flush from which they are
	// written as a tombstone: above the writer's largest usual batch
	// (maxBacklog), so that ordinary traffic never takes this path.
	purgeMin = 20000
	// purgeStep is how many rows one background step deletes: a few ms.
	purgeStep = 2000
	// purgeEvery and purgeBehind: a step is taken before a flush when
	// the last was this long ago, or when this many rows are left.
	purgeEvery  = 20 * time.Millisecond
	purgeBehind = 100000
)

// purgeList is one tombstone: its row in purges, and the sequence numbers
// whose rows are still to be deleted.
type purgeList struct {
	id   int64
	seqs []int64
}

// encodeSeqs writes sorted sequence numbers as the first one and then the
// gaps, each a uvarint: adjacent jobs cost a byte each.
func encodeSeqs(seqs []int64) []byte {
	b := make([]byte, 0, len(seqs)+16)
	b = binary.AppendUvarint(b, uint64(len(seqs)))
	var prev int64
	for _, s := range seqs {
		b = binary.AppendUvarint(b, uint64(s-prev))
		prev = s
	}
	return b
}

// decodeSeqs reads what encodeSeqs wrote.
func decodeSeqs(b []byte) ([]int64, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, errors.New("bad count")
	}
	b = b[k:]
	seqs := make([]int64, 0, n)
	var prev int64
	for range n {
		d, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, errors.New("truncated")
		}
		if d > uint64(math.MaxInt64-prev) {
			return nil, errors.New("number out of range")
		}
		b = b[k:]
		prev += int64(d)
		seqs = append(seqs, prev)
	}
	if len(b) != 0 {
		return nil, errors.New("trailing bytes")
	}
	return seqs, nil
}

// writePurge records removals as a tombstone inside the flush's
// transaction; the writer deletes the rows once it commits (flush).
func (s *SQLiteStore) writePurge(ctx context.Context, bt *writeBatch, seqs []int64) error {
	slices.Sort(seqs)
	res, err := s.wconn.ExecContext(ctx, `INSERT INTO purges(seqs) VALUES (?)`, encodeSeqs(seqs))
	if err != nil {
		return fmt.Errorf("record removals: %w", err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return fmt.Errorf("record removals: %w", err)
	}
	bt.purge = append(bt.purge, purgeList{id: id, seqs: seqs})
	return nil
}

// purgeRows deletes the next rows of the first tombstone, in a
// transaction of its own, and the tombstone with its last rows. Only the
// writer calls it. An error leaves the work to a later step.
func (s *SQLiteStore) purgeRows() error {
	p := &s.purging[0]
	n := min(len(p.seqs), purgeStep)
	err := s.writeTx(func(ctx context.Context) error {
		if err := s.deleteSeqs(ctx, p.seqs[:n]); err != nil || n < len(p.seqs) {
			return err
		}
		_, err := s.wconn.ExecContext(ctx, `DELETE FROM purges WHERE id = ?`, p.id)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete removed jobs: %w", err)
	}
	if p.seqs = p.seqs[n:]; len(p.seqs) == 0 {
		s.purging = slices.Delete(s.purging, 0, 1)
	}
	s.purgeLeft.Add(-int64(n))
	return nil
}

// deleteSeqs deletes the rows (record and result) of jobs by sequence
// number, inside the caller's transaction.
func (s *SQLiteStore) deleteSeqs(ctx context.Context, seqs []int64) error {
	args := make([]any, len(seqs))
	for i, seq := range seqs {
		args[i] = seq
	}
	if err := s.execChunks(ctx, "jobs-del", args, 1, func(n int) string {
		return "DELETE FROM jobs WHERE seq IN " + placeholders(1, n)
	}); err != nil {
		return err
	}
	return s.execChunks(ctx, "results-del", args, 1, func(n int) string {
		return "DELETE FROM results WHERE seq IN " + placeholders(1, n)
	})
}

// purgeOwed says whether a step is due before the next flush.
func (s *SQLiteStore) purgeOwed() bool {
	return len(s.purging) > 0 && (time.Since(s.purgeLast) > purgeEvery || s.purgeLeft.Load() > purgeBehind)
}

// purgeSome runs one background deletion step; the writer calls it
// when it would otherwise wait, and between flushes when one is owed.
// After a failed step it waits a second before the next.
func (s *SQLiteStore) purgeSome() {
	if len(s.purging) == 0 || time.Now().Before(s.purgeRetry) {
		return
	}
	s.purgeLast = time.Now()
	if err := s.purgeRows(); err != nil {
		s.log.Warn("storage: deleting removed jobs' rows failed; trying again", "path", s.path, "err", err)
		s.purgeRetry = time.Now().Add(time.Second)
	}
}

// deadSeqs reads the tombstones: the sequence numbers whose rows are dead,
// sorted, and the lists as the writer goes on with them. A tombstone that
// cannot be read is reported: its rows cannot be told apart.
func deadSeqs(ctx context.Context, s *SQLiteStore) ([]int64, []purgeList, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, seqs FROM purges ORDER BY id`)
	if err != nil {
		return nil, nil, fmt.Errorf("read removals: %w", err)
	}
	defer rows.Close()
	var lists []purgeList
	for rows.Next() {
		var id int64
		var b []byte
		if err := rows.Scan(&id, &b); err != nil {
			return nil, nil, fmt.Errorf("read removals: %w", err)
		}
		seqs, err := decodeSeqs(b)
		if err != nil {
			return nil, nil, fmt.Errorf("the list of removed jobs %d is unreadable (%w): the jobs it names cannot be told apart. "+
				"To start anyway, with those jobs back, delete it: sqlite3 %s 'DELETE FROM purges WHERE id = %d'", id, err, s.path, id)
		}
		lists = append(lists, purgeList{id: id, seqs: seqs})
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read removals: %w", err)
	}
	switch len(lists) {
	case 0:
		return nil, nil, nil
	case 1:
		return lists[0].seqs, lists, nil // read only: shared
	}
	var all []int64
	for _, l := range lists {
		all = append(all, l.seqs...)
	}
	slices.Sort(all)
	return all, lists, nil
}

// maxSpans bounds how many ranges a start reads the jobs in; dead rows
// in more runs than that are read past one by one (isDead).
const maxSpans = 64

// liveSpans are the ranges of job numbers to read at a start, around the
// runs of dead numbers (sorted) when they are few: whole.
func liveSpans(dead []int64) [][2]int64 {
	all := [][2]int64{{math.MinInt64, math.MaxInt64}}
	if len(dead) == 0 {
		return all
	}
	var spans [][2]int64
	lo := int64(math.MinInt64)
	for i := 0; i < len(dead); {
		k := i
		for k+1 < len(dead) && dead[k+1] <= dead[k]+1 {
			k++
		}
		if dead[i] > lo {
			spans = append(spans, [2]int64{lo, dead[i] - 1})
		}
		if len(spans) > maxSpans || dead[k] == math.MaxInt64 {
			return all
		}
		lo = dead[k] + 1
		i = k + 1
	}
	return append(spans, [2]int64{lo, math.MaxInt64})
}

// isDead says whether seq is among dead (sorted).
func isDead(dead []int64, seq int64) bool {
	if len(dead) == 0 {
		return false
	}
	_, found := slices.BinarySearch(dead, seq)
	return found
}

// Purging reports how many rows of removed jobs are still to be deleted
// in the background.
func (s *SQLiteStore) Purging() int64 { return s.purgeLeft.Load() }
