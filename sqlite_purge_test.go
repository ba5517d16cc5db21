package main

import (
	"database/sql"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestSeqsRoundTrip(t *testing.T) {
	t.Parallel()
	for _, seqs := range [][]int64{nil, {0}, {1}, {1, 2, 3}, {5, 5, 9}, {1, 1 << 40, 1<<62 - 1}} {
		got, err := decodeSeqs(encodeSeqs(seqs))
		if err != nil {
			t.Fatalf("%v: %v", seqs, err)
		}
		if !slices.Equal(got, seqs) && len(got)+len(seqs) > 0 {
			t.Fatalf("%v came back as %v", seqs, got)
		}
	}
	// Gaps that add up past the largest int64 (found by review: they
	// read as an unsorted list).
	big := binary.AppendUvarint(nil, 3)
	for range 3 {
		big = binary.AppendUvarint(big, 1<<62)
	}
	for _, bad := range [][]byte{nil, {5, 1}, {1, 0x80}, {1, 1, 1}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, big} {
		if seqs, err := decodeSeqs(bad); err == nil {
			t.Fatalf("%x read as %v", bad, seqs)
		}
	}
}

// FuzzDecodeSeqs: a tombstone read from a damaged file is refused or read
// as a sorted list no longer than its bytes; it never panics.
func FuzzDecodeSeqs(f *testing.F) {
	f.Add(encodeSeqs([]int64{1, 2, 3, 1000}))
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		seqs, err := decodeSeqs(b)
		if err != nil {
			return
		}
		if len(seqs) > len(b) {
			t.Fatalf("%d seqs from %d bytes", len(seqs), len(b))
		}
		if !slices.IsSorted(seqs) {
			t.Fatalf("not sorted: %v", seqs)
		}
	})
}

// TestSQLitePurge follows a big deletion through its steps, with the
// writer driven by hand: the flush that carries it writes a tombstone and
// leaves the rows; a start on the file skips the rows the tombstone names
// (the job an active worker holds is not among them), and the writer then
// deletes them and the tombstone.
func TestSQLitePurge(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "q.db")
	b, st, _ := openTestStore(t, path)
	// The drained jobs have the highest numbers: the numbers of dead rows
	// must not be given again before the rows are deleted.
	pushN(t, b, st, "kept", 20)
	pushN(t, b, st, "gone", 300)
	closeTestStore(t, b, st)

	// The drain's changes, flushed by hand with the writer not started.
	b, st, _ = openHeld(t, path, 50)
	held, _ := claimN(b, "gone", 1)
	if len(held) != 1 {
		t.Fatalf("claimed %d", len(held))
	}
	var drained int
	b.withQueue("gone", false, func(s *Shard, q *Queue, now int64) { drained = s.drain(q) })
	if drained != 299 {
		t.Fatalf("drained %d, want 299", drained)
	}
	flushByHand(t, st)
	if n := rowCount(t, st.db, "purges"); n != 1 {
		t.Fatalf("%d tombstones after the flush, want 1", n)
	}
	if n := rowCount(t, st.db, "jobs"); n != 320 {
		t.Fatalf("%d job rows after the flush, want the 320 still there", n)
	}
	if len(st.purging) != 1 || len(st.purging[0].seqs) != 299 || st.Purging() != 299 {
		t.Fatalf("the writer holds %d lists (%d rows) to delete, want one of 299", len(st.purging), st.Purging())
	}
	closeTestStore(t, b, st)

	// As after a kill in the middle of the deletion. Jobs pushed before
	// the writer starts, more than a flush's worth: their rows are written
	// before the deletion goes on.
	b, st, rs := openHeld(t, path, 0)
	if rs.Waiting+rs.Active != 21 {
		t.Fatalf("recovered %+v, want the 20 kept and the one held", rs)
	}
	if c := b.counts("gone"); c.Waiting+c.Active != 1 {
		t.Fatalf("the drained queue came back with %+v, want the held job alone", c)
	}
	if !b.withJob(held[0].ID(), func(j *Job, _ *Shard) {}) {
		t.Fatalf("the held job %s is gone", held[0].ID())
	}
	later := make([]*Job, 2*flushOps)
	for i := range later {
		later[i] = mustJob(t, "gone", map[string]any{"data": int64(i)})
	}
	b.pushJobs("gone", later, nil)
	st.Start()
	if err := st.Sync(); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the rows deleted", func() (bool, string) {
		return st.Purging() == 0 && rowCount(t, st.db, "purges") == 0, fmt.Sprint(st.Purging(), " rows to delete")
	})
	if n := rowCount(t, st.db, "jobs"); n != 21+2*flushOps {
		t.Fatalf("%d job rows once the deletion ended, want %d (20 kept, 1 held, %d pushed after the start)", n, 21+2*flushOps, 2*flushOps)
	}
	closeTestStore(t, b, st)
	b, st, _ = openTestStore(t, path)
	defer st.Close()
	defer b.Close()
	if c := b.counts("gone"); c.Waiting+c.Active != 1+2*flushOps {
		t.Fatalf("the drained queue holds %+v after a second start, want the held job and the %d pushed later", c, 2*flushOps)
	}
}

// TestAwaitFlushWithPurges: background deletions never hold back a change
// past its 10 ms (found by review: while rows were left to delete, a lone
// change waited for all of them, 580 ms for 150,000), and a pause after a
// failed step never leaves the writer waiting for a kick that may not come.
func TestAwaitFlushWithPurges(t *testing.T) {
	t.Parallel()
	st, err := OpenSQLite(filepath.Join(t.TempDir(), "q.db"), "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	st.purging = []purgeList{{id: 1, seqs: []int64{1}}}
	pend := func(age time.Duration) {
		st.mu.Lock()
		st.n, st.first = 1, time.Now().Add(-age)
		st.mu.Unlock()
	}
	pend(2 * flushInterval)
	if !st.awaitFlush(timer) {
		t.Fatal("a deletion step went before a change past its deadline")
	}
	pend(-time.Hour) // a deadline far off, whatever the machine's pace
	if st.awaitFlush(timer) {
		t.Fatal("a change before its deadline was flushed though deletions wait")
	}
	// Paused deletions, a change pending, no kick: the change's deadline
	// or the end of the pause ends the wait, whichever comes first; a
	// pause longer than the test never ends it.
	for _, pause := range []time.Duration{time.Microsecond, time.Millisecond, time.Hour} {
		st.purgeRetry = time.Now().Add(pause)
		pend(0)
		done := make(chan bool, 1)
		go func() { done <- st.awaitFlush(timer) }()
		select {
		case flush := <-done:
			if pause == time.Hour && !flush {
				t.Fatalf("pause %v: a deletion step though deletions are paused", pause)
			}
		case <-time.After(time.Minute):
			t.Fatalf("pause %v: awaitFlush still waiting after a minute", pause)
		}
	}
}

func rowCount(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(fmt.Sprintf("SELECT count(*) FROM %s", table)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCrashBigRemovals: a queue obliterated, drained or cleaned of more
// jobs than a flush deletes row by row is gone for good once the answer
// came: a kill -9 right after it brings none back (it brought 5.67M back
// when the deletion was one long transaction), and the restarted server
// finishes deleting the rows.
func TestCrashBigRemovals(t *testing.T) {
	t.Parallel()
	const n = purgeMin + 5000
	for _, op := range []map[string]any{
		{"cmd": "Obliterate", "queue": "big"},
		{"cmd": "Drain", "queue": "big"},
		{"cmd": "Clean", "queue": "big", "grace": 0, "state": "waiting", "limit": 2 * n},
	} {
		t.Run(op["cmd"].(string), func(t *testing.T) {
			t.Parallel()
			path, srv := crashServer(t)
			c := dial(t, srv.addr())
			pushMany(t, []*tclient{c}, "big", n, 1000)
			pushMany(t, []*tclient{c}, "small", 5, 5)
			c.ok(op)
			srv.kill9(t)

			srv = startBinary(t, "--data-path", path)
			c = dial(t, srv.addr())
			if got := countsOf(t, c, "big"); num(t, got["waiting"]) != 0 {
				t.Fatalf("after %s and a kill: %v", op["cmd"], got)
			}
			if got := countsOf(t, c, "small"); num(t, got["waiting"]) != 5 {
				t.Fatalf("the other queue: %v", got)
			}
			db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(10000)")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			eventually(t, 2*time.Minute, "the rows and their tombstones deleted", func() (bool, string) {
				jobs, purges := rowCount(t, db, "jobs"), rowCount(t, db, "purges")
				return purges == 0 && jobs <= 5, fmt.Sprintf("%d rows and %d tombstones left", jobs, purges)
			})
			srv.stop(t)
		})
	}
}

// BenchmarkObliterateBig: how long Obliterate holds its shard's lock over
// 200,000 waiting jobs in SQLite mode (the writer idle: what the store
// records, not what it writes).
func BenchmarkObliterateBig(bm *testing.B) {
	const n = 200000
	b, st, _ := openHeld(bm, filepath.Join(bm.TempDir(), "q.db"), 0)
	defer closeTestStore(bm, b, st)
	jobs := make([]*Job, n)
	for i := 0; bm.Loop(); i++ {
		bm.StopTimer()
		for k := range jobs {
			jobs[k] = mustJob(bm, "big", map[string]any{"data": int64(k)})
		}
		b.pushJobs("big", jobs, nil)
		st.takePending() // as a flush would: the jobs have rows
		bm.StartTimer()
		b.withQueue("big", false, func(s *Shard, q *Queue, now int64) { s.obliterate(q) })
		bm.StopTimer()
		st.takePending()
		bm.StartTimer()
	}
}

func TestLiveSpans(t *testing.T) {
	t.Parallel()
	const lo, hi = math.MinInt64, math.MaxInt64
	whole := [][2]int64{{lo, hi}}
	many := make([]int64, 0, 200)
	for i := range int64(200) {
		many = append(many, 2*i+1) // 200 runs of one
	}
	for _, c := range []struct {
		dead []int64
		want [][2]int64
	}{
		{nil, whole},
		{[]int64{5}, [][2]int64{{lo, 4}, {6, hi}}},
		{[]int64{22, 23, 24, 25}, [][2]int64{{lo, 21}, {26, hi}}},
		{[]int64{1, 2, 7, 9, 9, 10}, [][2]int64{{lo, 0}, {3, 6}, {8, 8}, {11, hi}}},
		{[]int64{3, hi}, whole},
		{many, whole},
	} {
		if got := liveSpans(c.dead); !slices.Equal(got, c.want) {
			t.Errorf("liveSpans(%v) = %v, want %v", c.dead, got, c.want)
		}
	}
}

// TestSQLitePurgeInterleaved: dead rows spread among live ones (two
// queues pushed in turn, one drained) are read past one by one at a
// start, and none comes back.
func TestSQLitePurgeInterleaved(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "q.db")
	b, st, _ := openTestStore(t, path)
	for i := range 300 {
		q := []string{"gone", "kept"}[i%2]
		b.pushJobs(q, []*Job{mustJob(t, q, map[string]any{"data": int64(i)})}, nil)
	}
	closeTestStore(t, b, st)
	b, st, _ = openHeld(t, path, 50)
	b.withQueue("gone", false, func(s *Shard, q *Queue, now int64) { s.drain(q) })
	flushByHand(t, st)
	closeTestStore(t, b, st)
	b, st, rs := openHeld(t, path, 0)
	defer closeTestStore(t, b, st)
	if rs.Waiting != 150 || b.counts("gone").Waiting != 0 || b.counts("kept").Waiting != 150 {
		t.Fatalf("recovered %+v: gone %+v, kept %+v", rs, b.counts("gone"), b.counts("kept"))
	}
	if n := rowCount(t, st.db, "jobs"); n != 300 {
		t.Fatalf("%d rows before the writer started, want the 300", n)
	}
}
