package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openTestStore(t *testing.T, path string) (*Broker, *SQLiteStore, RecoveryStats) {
	t.Helper()
	st, err := OpenSQLite(path, "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	b := NewBroker(2, st)
	rs, err := st.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	st.Start()
	return b, st, rs
}

func mustJob(t *testing.T, queue string, fields map[string]any) *Job {
	t.Helper()
	var e Enc
	if err := e.Any(fields); err != nil {
		t.Fatal(err)
	}
	m, err := ParseMap(e.B, nil)
	if err != nil {
		t.Fatal(err)
	}
	j, err := parseJob(m, queue, "jobId", nowMs())
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// claimN pulls n jobs with an owner, the way PULLB does.
func claimN(b *Broker, queue string, n int) ([]*Job, []string) {
	s := b.shardOf(queue)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[queue]
	if q == nil {
		return nil, nil
	}
	return s.claim(q, n, PullOpts{Owner: "w", TTL: 30000}, b.now(), nil, nil)
}

// TestSQLiteRestart writes every kind of state, restarts on the same file
// and finds each of them again.
func TestSQLiteRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	b, st, rs := openTestStore(t, path)
	if rs.Waiting+rs.Completed+rs.Failed != 0 {
		t.Fatalf("a new database recovered %+v", rs)
	}
	var jobs []*Job
	for i := 0; i < 500; i++ {
		jobs = append(jobs, mustJob(t, "work", map[string]any{"name": "w", "data": map[string]any{"i": int64(i)}, "maxAttempts": int64(1)}))
	}
	jobs = append(jobs, mustJob(t, "work", map[string]any{"data": "later", "delay": int64(3600000), "jobId": "delayed-1"}))
	b.Push("work", jobs)
	claimed, tokens := claimN(b, "work", 300)
	if len(claimed) != 300 {
		t.Fatalf("claimed %d", len(claimed))
	}
	b.Push("work", []*Job{mustJob(t, "work", map[string]any{"data": "prio", "priority": int64(7), "uniqueKey": "uk"})})
	// 200 complete with a result, 50 fail for good, 50 stay active.
	for i := 0; i < 200; i++ {
		if _, err := b.Ack(AckItem{ID: claimed[i].ID, Token: tokens[i], Result: Raw{0xa2, 0x6f, 0x6b}, HasResult: true}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 200; i < 250; i++ {
		if _, err := b.Fail(claimed[i].ID, tokens[i], failure{err: "bad", hasErr: true}); err != nil {
			t.Fatal(err)
		}
	}
	b.withQueue("work", true, func(s *Shard, q *Queue, now int64) {
		q.paused = true
		b.queueChanged(q)
	})
	b.lmu.Lock()
	b.logs.Put(claimed[0].ID, []LogEntry{{At: 1, Level: "info", Message: Raw{0xa1, 0x78}}})
	b.logsChanged(claimed[0].ID, []LogEntry{{At: 1, Level: "info", Message: Raw{0xa1, 0x78}}})
	b.lmu.Unlock()
	before := b.counts("work")
	b.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	b2, st2, rs := openTestStore(t, path)
	defer st2.Close()
	defer b2.Close()
	if rs.Completed != 200 || rs.Failed != 50 || rs.Active != 50 || rs.Delayed != 1 || rs.Waiting != 201 || rs.Queues != 1 || rs.Logs != 1 {
		t.Fatalf("recovered %+v", rs)
	}
	after := b2.counts("work")
	// The 50 active jobs wait again; the queue is still paused.
	if after.Completed != before.Completed || after.Failed != before.Failed || after.Delayed != 1 ||
		after.Paused != before.Paused+50 || after.Active != 0 {
		t.Fatalf("counts before %+v after %+v", before, after)
	}
	j, s := b2.lockJob(claimed[0].ID)
	if j == nil || j.state != StateCompleted {
		t.Fatal("completed job not recovered")
	}
	s.mu.Unlock()
	if r, ok := b2.getResult(claimed[0].ID); !ok || string(r) != string(Raw{0xa2, 0x6f, 0x6b}) {
		t.Fatalf("result not recovered: %x", r)
	}
	j, s = b2.lockJob(claimed[260].ID)
	if j.state != StateWaiting || j.Attempts != 0 || j.StartedAt != 0 {
		t.Fatalf("active job recovered as %v attempts %d", j.state, j.Attempts)
	}
	s.mu.Unlock()
	j, s = b2.lockJob(claimed[220].ID)
	if j.state != StateFailed || j.dlq == nil || j.dlq.Reason != "max_attempts_exceeded" || j.failErr != "bad" {
		t.Fatalf("dead-lettered job recovered as %v %+v", j.state, j.dlq)
	}
	s.mu.Unlock()
	if j := b2.idxGet("delayed-1"); j == nil || j.CustomID != "delayed-1" {
		t.Fatal("custom id not recovered")
	}
	// The unique key is held again: a duplicate returns the holder.
	res := b2.Push("work", []*Job{mustJob(t, "work", map[string]any{"data": 1, "uniqueKey": "uk"})})
	if !res[0].Dup {
		t.Fatal("unique key not recovered")
	}
	b2.lmu.Lock()
	logs, _ := b2.logs.Peek(claimed[0].ID)
	b2.lmu.Unlock()
	if len(logs) != 1 || logs[0].Level != "info" {
		t.Fatalf("logs %+v", logs)
	}
	// New jobs keep FIFO order after the recovered ones.
	b2.withQueue("work", true, func(s *Shard, q *Queue, now int64) { q.paused = false })
	first, _ := claimN(b2, "work", 1)
	if len(first) != 1 || first[0].Priority != 7 {
		t.Fatalf("first job after restart: %+v", first)
	}
}

// TestSQLiteDurableSync: Sync returns only once the change is on disk,
// visible to a second connection.
func TestSQLiteDurableSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	b, st, _ := openTestStore(t, path)
	defer st.Close()
	defer b.Close()
	j := mustJob(t, "d", map[string]any{"data": 1, "durable": true})
	b.Push("d", []*Job{j})
	if err := b.syncDurable([]*Job{j}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := st.db.QueryRow(`SELECT count(*) FROM jobs WHERE id = ?`, j.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("durable job not in the database after Sync: %d %v", n, err)
	}
}

func TestSQLiteOpenErrors(t *testing.T) {
	dir := t.TempDir()
	// A path whose folder cannot be made: a file stands in the way.
	block := filepath.Join(dir, "file")
	os.WriteFile(block, []byte("x"), 0o644)
	_, err := OpenSQLite(filepath.Join(block, "q.db"), "normal", quietLog())
	if err == nil || !strings.Contains(err.Error(), block) {
		t.Fatalf("unopenable path: %v", err)
	}
	// A file that is not a database.
	junk := filepath.Join(dir, "junk.db")
	os.WriteFile(junk, []byte(strings.Repeat("not a database ", 100)), 0o644)
	if _, err := OpenSQLite(junk, "normal", quietLog()); err == nil || !strings.Contains(err.Error(), junk) {
		t.Fatalf("junk file: %v", err)
	}
	// A schema newer than this build.
	newer := filepath.Join(dir, "newer.db")
	st, err := OpenSQLite(newer, "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	st.db.Exec(`UPDATE schema_version SET version = 99`)
	st.Close()
	if _, err := OpenSQLite(newer, "normal", quietLog()); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("newer schema: %v", err)
	}
	if _, err := OpenSQLite(filepath.Join(dir, "x.db"), "sometimes", quietLog()); err == nil {
		t.Fatal("bad --sync accepted")
	}
}

// TestSQLiteBackup copies a live database and restarts from the copy.
func TestSQLiteBackup(t *testing.T) {
	dir := t.TempDir()
	b, st, _ := openTestStore(t, filepath.Join(dir, "q.db"))
	var jobs []*Job
	for i := 0; i < 1000; i++ {
		jobs = append(jobs, mustJob(t, "bk", map[string]any{"data": int64(i)}))
	}
	b.Push("bk", jobs)
	if err := st.Sync(); err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(dir, "copy.db")
	if err := st.Backup(t.Context(), copyPath); err != nil {
		t.Fatal(err)
	}
	if err := st.Backup(t.Context(), copyPath); err == nil {
		t.Fatal("backup overwrote an existing file")
	}
	b.Close()
	st.Close()
	b2, st2, rs := openTestStore(t, copyPath)
	defer st2.Close()
	defer b2.Close()
	if rs.Waiting != 1000 || b2.counts("bk").Waiting != 1000 {
		t.Fatalf("restored from backup: %+v", rs)
	}
}
