package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openTestStore(t testing.TB, path string) (*MemEngine, *SQLiteStore, RecoveryStats) {
	t.Helper()
	b, st, rs := openHeld(t, path, 0)
	st.Start()
	return b, st, rs
}

// openHeld opens a store and loads a broker from it without starting the
// writer: the test flushes by hand (flushByHand). A purgeMin other than 0
// replaces the removals from which a flush writes a tombstone.
func openHeld(t testing.TB, path string, purgeMin int) (*MemEngine, *SQLiteStore, RecoveryStats) {
	t.Helper()
	st, err := OpenSQLite(path, "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	if purgeMin > 0 {
		st.purgeMin = purgeMin
	}
	b := NewMemEngine(2, st)
	rs, err := st.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	return b, st, rs
}

// flushByHand does what the writer does once: takes what is pending and
// writes it.
func flushByHand(t testing.TB, st *SQLiteStore) {
	t.Helper()
	bt, _, _ := st.takePending()
	if err := st.flush(bt); err != nil {
		t.Fatal(err)
	}
}

// closeTestStore stops a broker and closes its store.
func closeTestStore(t testing.TB, b *MemEngine, st *SQLiteStore) {
	t.Helper()
	b.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

func mustJob(t testing.TB, queue string, fields map[string]any) *Job {
	t.Helper()
	return mustJobAt(t, queue, fields, nowMs())
}

// mustJobAt is mustJob made at now.
func mustJobAt(t testing.TB, queue string, fields map[string]any, now int64) *Job {
	t.Helper()
	var e Enc
	if err := e.Any(fields); err != nil {
		t.Fatal(err)
	}
	m, err := ParseMap(e.B, nil)
	if err != nil {
		t.Fatal(err)
	}
	j, err := parseJob(m, queue, "jobId", now)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// claimN pulls n jobs with an owner, the way PULLB does.
func claimN(b *MemEngine, queue string, n int) ([]*Job, []string) {
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
	t.Parallel()
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
	b.pushJobs("work", jobs, nil)
	claimed, tokens := claimN(b, "work", 300)
	if len(claimed) != 300 {
		t.Fatalf("claimed %d", len(claimed))
	}
	b.pushJobs("work", []*Job{mustJob(t, "work", map[string]any{"data": "prio", "priority": int64(7), "uniqueKey": "uk"})}, nil)
	// 200 complete with a result, 50 fail for good, 50 stay active.
	for i := 0; i < 200; i++ {
		if _, err := b.ackOne(AckItem{ID: claimed[i].ID(), Token: tokens[i], Result: Raw{0xa2, 0x6f, 0x6b}, HasResult: true}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 200; i < 250; i++ {
		if _, err := b.Fail(context.Background(), claimed[i].ID(), tokens[i], failure{err: "bad", hasErr: true}); err != nil {
			t.Fatal(err)
		}
	}
	b.withQueue("work", true, func(s *Shard, q *Queue, now int64) {
		q.paused = true
		b.queueChanged(q)
	})
	b.lmu.Lock()
	b.logs.Put(claimed[0].ID(), []LogEntry{{At: 1, Level: "info", Message: Raw{0xa1, 0x78}}})
	b.logsChanged(claimed[0].ID(), []LogEntry{{At: 1, Level: "info", Message: Raw{0xa1, 0x78}}})
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
	j, s := b2.lockJob(claimed[0].ID())
	if j == nil || j.state != StateCompleted {
		t.Fatal("completed job not recovered")
	}
	s.mu.Unlock()
	if r, ok := b2.getResult(claimed[0].key()); !ok || string(r) != string(Raw{0xa2, 0x6f, 0x6b}) {
		t.Fatalf("result not recovered: %x", r)
	}
	j, s = b2.lockJob(claimed[260].ID())
	if j.state != StateWaiting || j.Attempts != 0 || j.StartedAt() != 0 {
		t.Fatalf("active job recovered as %v attempts %d", j.state, j.Attempts)
	}
	s.mu.Unlock()
	j, s = b2.lockJob(claimed[220].ID())
	if j.state != StateFailed || j.dlq == nil || j.dlq.Reason != "max_attempts_exceeded" || j.cold().failErr != "bad" {
		t.Fatalf("dead-lettered job recovered as %v %+v", j.state, j.dlq)
	}
	s.mu.Unlock()
	if j := b2.idxGet("delayed-1"); j == nil || j.cold().CustomID != "delayed-1" {
		t.Fatal("custom id not recovered")
	}
	// The unique key is held again: a duplicate returns the holder.
	res := b2.pushJobs("work", []*Job{mustJob(t, "work", map[string]any{"data": 1, "uniqueKey": "uk"})}, nil)
	if !res[0].Dup {
		t.Fatal("unique key not recovered")
	}
	b2.lmu.Lock()
	logs, _ := b2.logs.Peek(claimed[0].ID())
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
	t.Parallel()
	path := filepath.Join(t.TempDir(), "q.db")
	b, st, _ := openTestStore(t, path)
	defer st.Close()
	defer b.Close()
	j := mustJob(t, "d", map[string]any{"data": 1, "durable": true})
	b.pushJobs("d", []*Job{j}, nil)
	if err := b.syncDurable([]*Job{j}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := st.db.QueryRow(`SELECT count(*) FROM jobs WHERE seq = ?`, j.seq).Scan(&n); err != nil || n != 1 {
		t.Fatalf("durable job not in the database after Sync: %d %v", n, err)
	}
}

func TestSQLiteOpenErrors(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
	dir := t.TempDir()
	b, st, _ := openTestStore(t, filepath.Join(dir, "q.db"))
	var jobs []*Job
	for i := 0; i < 1000; i++ {
		jobs = append(jobs, mustJob(t, "bk", map[string]any{"data": int64(i)}))
	}
	b.pushJobs("bk", jobs, nil)
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

// TestSQLiteDiskFull: when the database cannot grow (a page limit stands in
// for a full disk), the failure is reported, new jobs are refused with a
// clear error, reads go on, and what was committed is intact.
func TestSQLiteDiskFull(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "full.db")
	st, err := openSQLite(path, "normal", quietLog(), "&_pragma=max_page_count(64)")
	if err != nil {
		t.Fatal(err)
	}
	b := NewMemEngine(2, st)
	if _, err := st.Load(b); err != nil {
		t.Fatal(err)
	}
	st.Start()
	payload := strings.Repeat("x", 2000)
	confirmed, pushed := 0, 0
	var refused error
	for i := 0; i < 1000 && refused == nil; i++ {
		if refused = b.admit(); refused != nil {
			break
		}
		jobs := make([]*Job, 10)
		for k := range jobs {
			jobs[k] = mustJob(t, "full", map[string]any{"data": payload})
		}
		b.pushJobs("full", jobs, nil)
		pushed += len(jobs)
		if err := st.Sync(); err == nil {
			confirmed = pushed
		}
	}
	if refused == nil || !strings.Contains(refused.Error(), "storage unavailable") {
		t.Fatalf("pushes were not refused on a full disk: %v", refused)
	}
	since, backlog, serr := st.Status()
	if !isDiskFull(serr) || since.IsZero() || backlog == 0 {
		t.Fatalf("status: err=%v since=%v backlog=%d", serr, since, backlog)
	}
	if c := b.counts("full"); c.Waiting != pushed {
		t.Fatalf("reads: %d waiting, pushed %d", c.Waiting, pushed)
	}
	b.Close()
	if err := st.Close(); err == nil || !strings.Contains(err.Error(), "unwritten") {
		t.Fatalf("close on a full disk: %v", err)
	}
	b2, st2, rs := openTestStore(t, path)
	defer st2.Close()
	defer b2.Close()
	// Each flush is one transaction: what is there decodes, and it is at
	// least what was confirmed, at most one push batch more.
	if rs.Waiting < confirmed || rs.Waiting > confirmed+10 {
		t.Fatalf("recovered %d jobs; %d were confirmed on disk", rs.Waiting, confirmed)
	}
	t.Logf("pushed %d, confirmed %d, recovered %d; refusal: %v", pushed, confirmed, rs.Waiting, refused)
}

// startSQLiteServer runs the whole server in-process on a SQLite file.
func startSQLiteServer(t *testing.T, path string, tokens string) (tcp, httpAddr string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	c := &config{host: "127.0.0.1", dataPath: path, syncMode: "normal", authTokens: tokens}
	go func() {
		done <- runServer(ctx, c, quietLog(), func(a, h net.Addr) { ready <- [2]string{a.String(), h.String()} })
	}()
	select {
	case a := <-ready:
		return a[0], a[1], func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		}
	case err := <-done:
		t.Fatalf("server did not start: %v", err)
	}
	return "", "", nil
}

// TestSQLiteBackupCommand takes a backup of a running server with the
// command line, restores from it, and finds every job.
func TestSQLiteBackupCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tcp, httpAddr, stop := startSQLiteServer(t, filepath.Join(dir, "live.db"), "tok")
	defer stop()
	c := dial(t, tcp)
	c.ok(map[string]any{"cmd": "Auth", "token": "tok"})
	var ids []any
	for i := 0; i < 5; i++ {
		jobs := make([]any, 200)
		for k := range jobs {
			jobs[k] = map[string]any{"name": "b", "data": i*200 + k}
		}
		ids = append(ids, list(t, c.ok(map[string]any{"cmd": "PUSHB", "queue": "bk", "jobs": jobs}), "ids")...)
	}
	// The backup is consistent with what was committed; make it all so.
	c.ok(map[string]any{"cmd": "PUSH", "queue": "bk", "data": "last", "durable": true})
	out := filepath.Join(dir, "copy.db")
	var so, se strings.Builder
	if code := run([]string{"backup", "--out", out, "--url", "http://" + httpAddr}, &so, &se); code == 0 {
		t.Fatal("backup without the token succeeded")
	}
	if code := run([]string{"backup", "--out", out, "--url", "http://" + httpAddr, "--token", "tok"}, &so, &se); code != 0 {
		t.Fatalf("backup failed: %s", se.String())
	}
	if code := run([]string{"backup", "--out", out, "--url", "http://" + httpAddr, "--token", "tok"}, &so, &se); code == 0 {
		t.Fatal("backup overwrote an existing file")
	}
	b, st, rs := openTestStore(t, out)
	defer st.Close()
	defer b.Close()
	if rs.Waiting != len(ids)+1 {
		t.Fatalf("restored %d jobs from the backup, want %d", rs.Waiting, len(ids)+1)
	}
	for _, id := range ids {
		if b.idxGet(id.(string)) == nil {
			t.Fatalf("job %s missing from the backup", id)
		}
	}
}

// A server in memory has nothing to back up, and says so.
func TestBackupNeedsSQLite(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	h := newHTTPHandler(b, memServer(b, nil, quietLog()), nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/backup", nil))
	if rec.Code != 409 || !strings.Contains(rec.Body.String(), "memory") {
		t.Fatalf("backup in memory: %d %s", rec.Code, rec.Body.String())
	}
}

// BenchmarkStoreWrite: pushes through the SQLite store, until committed.
func BenchmarkStoreWrite(b *testing.B) {
	benchStore(b, 0, nil)
}

// BenchmarkStoreLifecycle: jobs pushed, claimed and completed with a
// result through the SQLite store, with a history of 5,000 completed jobs
// in memory so that older ones retire to disk, as under a steady load;
// until committed. What SQLite mode adds to each job.
func BenchmarkStoreLifecycle(b *testing.B) {
	benchStore(b, 5000, func(br *MemEngine, queue string) {
		claimed, tokens := claimN(br, queue, 1000)
		for k, j := range claimed {
			if _, err := br.ackOne(AckItem{ID: j.ID(), Token: tokens[k], Result: Raw{0xa2, 0x6f, 0x6b}, HasResult: true}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchStore pushes b.N jobs through a new SQLite store, a thousand at a
// time, each thousand followed by then (if given); maxDone bounds the
// completed jobs kept in memory (0: the default). Timed until everything
// is committed.
func benchStore(b *testing.B, maxDone int64, then func(br *MemEngine, queue string)) {
	st, err := OpenSQLite(filepath.Join(b.TempDir(), "b.db"), "normal", quietLog())
	if err != nil {
		b.Fatal(err)
	}
	br := NewMemEngine(0, st)
	br.SetCompletedLimits(maxDone, -1)
	st.Start()
	data := map[string]any{"to": "someone@example.com", "n": int64(1)}
	b.ResetTimer()
	for i := 0; i < b.N; i += 1000 {
		jobs := make([]*Job, 1000)
		for k := range jobs {
			jobs[k] = mustJob(b, "w", map[string]any{"name": "j", "data": data})
		}
		br.admit()
		br.pushJobs("w", jobs, nil)
		if then != nil {
			then(br, "w")
		}
	}
	st.Sync()
	b.StopTimer()
	br.Close()
	st.Close()
}

// TestSQLitePoisonedRowDropped: a change SQLite refuses (here a row over a
// lowered length limit on the writer's connection, as a value over
// SQLITE_MAX_LENGTH would be) is left out with an error log naming the job
// (never its data) and a metric; everything else in its batch and after it
// is written, pushes go on being taken, and a restart finds the good jobs.
func TestSQLitePoisonedRowDropped(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "poison.db")
	var logBuf syncBuffer
	st, err := OpenSQLite(path, "normal", slog.New(slog.NewTextHandler(&logBuf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sqlite.Limit(st.wconn, sqlite3.SQLITE_LIMIT_LENGTH, 32<<10); err != nil {
		t.Fatal(err)
	}
	b := NewMemEngine(2, st)
	if _, err := st.Load(b); err != nil {
		t.Fatal(err)
	}
	st.Start()
	secret := "SECRET-" + strings.Repeat("p", 100<<10)
	var jobs []*Job
	for i := 0; i < 300; i++ {
		jobs = append(jobs, mustJob(t, "good", map[string]any{"name": "g", "data": int64(i)}))
	}
	poison := mustJob(t, "good", map[string]any{"name": "p", "data": secret})
	jobs = append(jobs[:150], append([]*Job{poison}, jobs[150:]...)...)
	// Held, so that the pushes, the logs and the durable wait go to the
	// disk in one flush: left to the 10 ms timer, a busy machine could
	// flush them in two, or before the wait, and the wait would see one
	// drop or none.
	st.Hold()
	b.pushJobs("good", jobs, nil)
	// A job's logs over the limit too, and a good job's logs within it.
	b.lmu.Lock()
	b.logsChanged(jobs[0].ID(), []LogEntry{{At: 1, Level: "info", Message: Raw(mustEnc(t, secret))}})
	b.logsChanged(jobs[1].ID(), []LogEntry{{At: 1, Level: "info", Message: Raw(mustEnc(t, "fine"))}})
	b.lmu.Unlock()
	synced := make(chan error, 1)
	go func() { synced <- st.Sync() }()
	eventually(t, 10*time.Second, "the durable wait registered", func() (bool, string) {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.barriers) == 1, fmt.Sprint(len(st.barriers), " waiting")
	})
	st.Release()
	if err := <-synced; err == nil || !strings.Contains(err.Error(), "2 changes could not be written") {
		t.Fatalf("a durable wait over the poisoned flush: %v", err)
	}
	if err := b.admit(); err != nil {
		t.Fatalf("pushes refused after a poisoned row: %v", err)
	}
	for i := 0; i < 100; i++ {
		b.pushJobs("good", []*Job{mustJob(t, "good", map[string]any{"name": "after", "data": int64(i)})}, nil)
	}
	if err := st.Sync(); err != nil {
		t.Fatalf("writes after the poisoned row: %v", err)
	}
	if _, _, serr := st.Status(); serr != nil || st.Dropped() != 2 {
		t.Fatalf("status %v, %d changes dropped, want none failing and 2 dropped", serr, st.Dropped())
	}
	srv := memServer(b, nil, quietLog())
	if text := string(srv.prometheusText(t.Context())); !strings.Contains(text, "\nbunqueue_storage_dropped_changes_total 2\n") {
		t.Fatalf("the metric does not count the dropped changes:\n%s", text)
	}
	logged := logBuf.String()
	if !strings.Contains(logged, "job_id="+poison.ID()) || !strings.Contains(logged, "job_id="+jobs[0].ID()) || strings.Contains(logged, "SECRET") {
		t.Fatalf("the log must name the dropped changes' jobs and never their data:\n%.2000s", logged)
	}
	b.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	b2, st2, rs := openTestStore(t, path)
	defer st2.Close()
	defer b2.Close()
	if rs.Waiting != 400 || b2.idxGet(poison.ID()) != nil || b2.idxGet(jobs[299].ID()) == nil {
		t.Fatalf("recovered %d waiting jobs (want the 400 good ones), poisoned job there: %v", rs.Waiting, b2.idxGet(poison.ID()) != nil)
	}
	b2.lmu.Lock()
	_, bad := b2.logs.Peek(jobs[0].ID())
	good, _ := b2.logs.Peek(jobs[1].ID())
	b2.lmu.Unlock()
	if bad || len(good) != 1 {
		t.Fatalf("logs after the restart: poisoned ones there %v, good ones %v", bad, good)
	}
}

// TestTransientWriteErrors: a full disk or a busy database is retried,
// never taken for a change at fault (which would drop it).
func TestTransientWriteErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err       error
		transient bool
	}{
		{errors.New("database or disk is full"), true},
		{fmt.Errorf("commit: %w", context.DeadlineExceeded), true},
		{errors.New("write jobs: string or blob too big"), true}, // not SQLite's typed error: kept
	} {
		if got := transientWriteErr(c.err); got != c.transient {
			t.Errorf("%v: transient %v, want %v", c.err, got, c.transient)
		}
	}
	// SQLite's own errors, by code, from a real connection.
	path := filepath.Join(t.TempDir(), "codes.db")
	st, err := OpenSQLite(path, "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	st.db.ExecContext(ctx, `CREATE TABLE u (k INTEGER PRIMARY KEY)`)
	st.db.ExecContext(ctx, `INSERT INTO u VALUES (1)`)
	_, dup := st.db.ExecContext(ctx, `INSERT INTO u VALUES (1)`)
	if dup == nil || transientWriteErr(dup) {
		t.Fatalf("a constraint violation (%v) must be taken for the change's fault", dup)
	}
	tx, err := st.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO u VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	_, busy := other.ExecContext(ctx, `INSERT INTO u VALUES (3)`)
	if busy == nil || !transientWriteErr(busy) {
		t.Fatalf("a busy database (%v) must be retried", busy)
	}
}

func mustEnc(t *testing.T, v any) []byte {
	t.Helper()
	var e Enc
	if err := e.Any(v); err != nil {
		t.Fatal(err)
	}
	return e.B
}

// TestSQLiteRestartFailedWithoutDLQEntry: a dead-lettered job whose
// record has no dead-letter entry (as records written before entries
// were kept) is recovered into the DLQ; sorting the dead-lettered jobs
// read its missing entry and panicked.
func TestSQLiteRestartFailedWithoutDLQEntry(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "q.db")
	b, st, _ := openTestStore(t, path)
	var ids []string
	for i := range 3 {
		j := mustJob(t, "q", map[string]any{"name": "n", "data": int64(i)})
		b.pushJobs("q", []*Job{j}, nil)
		ids = append(ids, j.ID())
	}
	for i, id := range ids {
		j := b.idxGet(id)
		s := b.shardOf("q")
		s.mu.Lock()
		j.state, j.dlq = StateFailed, nil
		j.setDoneAt(int64(1000 + i))
		s.mu.Unlock()
		st.JobChanged(j, nil)
	}
	if err := st.Sync(); err != nil {
		t.Fatal(err)
	}
	b.Close()
	st.Close()
	b2, st2, rs := openTestStore(t, path)
	defer st2.Close()
	defer b2.Close()
	if rs.Failed != 3 {
		t.Fatalf("recovered %+v, want 3 dead-lettered", rs)
	}
	for _, id := range ids {
		if j := b2.idxGet(id); j == nil || j.dlq == nil || j.dlq.Reason != "unknown" {
			t.Fatalf("job %s not back in the DLQ with an entry: %+v", id, j)
		}
	}
}

// TestSQLiteUnwrittenRemoval: a job pushed, pulled and completed with
// removeOnComplete before any flush took it costs no write at all; one a
// flush took (or that was read from the file) is deleted as before.
func TestSQLiteUnwrittenRemoval(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "q.db")
	b, st, _ := openHeld(t, path, 0)
	flush := func() { flushByHand(t, st) }
	pending := func() int {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.n
	}
	b.pushJobs("q", []*Job{mustJob(t, "q", map[string]any{"data": 1, "removeOnComplete": true})}, nil)
	js, toks := claimN(b, "q", 1)
	if _, err := b.ackOne(AckItem{ID: js[0].ID(), Token: toks[0]}); err != nil {
		t.Fatal(err)
	}
	if n := pending(); n != 0 {
		t.Fatalf("%d changes pending for a job that came and went within a flush's window", n)
	}

	// Written, then removed: the removal is a change.
	b.pushJobs("q", []*Job{mustJob(t, "q", map[string]any{"data": 2, "removeOnComplete": true, "jobId": "w"})}, nil)
	flush()
	if n := rowCount(t, st.db, "jobs"); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
	js, toks = claimN(b, "q", 1)
	if _, err := b.ackOne(AckItem{ID: js[0].ID(), Token: toks[0]}); err != nil {
		t.Fatal(err)
	}
	flush()
	if n := rowCount(t, st.db, "jobs"); n != 0 {
		t.Fatalf("%d rows once the written job completed with removeOnComplete, want 0", n)
	}

	// Read back from the file, then removed.
	b.pushJobs("q", []*Job{mustJob(t, "q", map[string]any{"data": 3, "removeOnComplete": true})}, nil)
	flush()
	closeTestStore(t, b, st)
	b, st, _ = openTestStore(t, path)
	defer st.Close()
	defer b.Close()
	js, toks = claimN(b, "q", 1)
	if len(js) != 1 {
		t.Fatalf("claimed %d after the restart", len(js))
	}
	if _, err := b.ackOne(AckItem{ID: js[0].ID(), Token: toks[0]}); err != nil {
		t.Fatal(err)
	}
	if err := st.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := rowCount(t, st.db, "jobs"); n != 0 {
		t.Fatalf("%d rows once the job read back completed with removeOnComplete, want 0", n)
	}
}

// TestSQLiteSeqPastFile: after a start, new jobs are numbered past every
// row of the file, those memory does not hold included (found by review:
// the rows of retired history above the jobs read back were overwritten
// by new pushes, and that history was lost).
func TestSQLiteSeqPastFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "q.db")
	b, st, _ := openTestStore(t, path)
	pushN(t, b, st, "q", 5)
	closeTestStore(t, b, st)
	// The highest row marked as completed history, as retirement does.
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	var top int64
	if err := db.QueryRow(`SELECT max(seq) FROM jobs`).Scan(&top); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE jobs SET id = 'old', queue = 'q', created_at = 1, done_at = 2 WHERE seq = ?`, top); err != nil {
		t.Fatal(err)
	}
	db.Close()
	b, st, _ = openTestStore(t, path)
	defer st.Close()
	defer b.Close()
	j := mustJob(t, "q", map[string]any{"data": "new"})
	b.pushJobs("q", []*Job{j}, nil)
	if j.seq <= top {
		t.Fatalf("a new job got number %d, at or under the file's highest %d", j.seq, top)
	}
}

// TestSQLiteLoadStages: a start reads rows, decodes them and restores the
// jobs in three stages. Batches cut by count and by bytes (jobs of 300 KB
// among small ones), unreadable records and completed jobs' results all
// come through: every readable job back, in its order, with its data, and
// the unreadable ones counted.
func TestSQLiteLoadStages(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "q.db")
	b, st, _ := openTestStore(t, path)
	big := strings.Repeat("x", 300<<10)
	const n = 1500
	var jobs []*Job
	for i := range n {
		data := map[string]any{"i": int64(i)}
		if i%97 == 0 {
			data["big"] = big
		}
		jobs = append(jobs, mustJob(t, "work", map[string]any{"name": "w", "data": data}))
	}
	b.pushJobs("work", jobs, nil)
	claimed, tokens := claimN(b, "work", 10)
	for i := range claimed {
		if _, err := b.ackOne(AckItem{ID: claimed[i].ID(), Token: tokens[i], Result: Raw{0xa1, byte('a' + i)}, HasResult: true}); err != nil {
			t.Fatal(err)
		}
	}
	closeTestStore(t, b, st)

	// Two records made unreadable: one among the waiting, one completed.
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE jobs SET record = x'0102' WHERE seq IN (?, ?)`, jobs[700].seq, claimed[3].seq); err != nil {
		t.Fatal(err)
	}
	db.Close()

	st2, err := OpenSQLite(path, "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	b2 := NewMemEngine(2, st2)
	defer closeTestStore(t, b2, st2)
	rs, err := st2.Load(b2)
	if err == nil || !strings.Contains(err.Error(), "2 job records could not be read") {
		t.Fatalf("load: %v", err)
	}
	if rs.Completed != 9 || rs.Waiting != n-10-1 {
		t.Fatalf("recovered %+v", rs)
	}
	for i, c := range claimed {
		r, ok := b2.getResult(c.key())
		if i == 3 {
			if ok {
				t.Fatal("an unreadable completed job has a result")
			}
			continue
		}
		if !ok || string(r) != string(Raw{0xa1, byte('a' + i)}) {
			t.Fatalf("job %d: result %x", i, r)
		}
	}
	got, _ := claimN(b2, "work", n)
	if len(got) != n-10-1 {
		t.Fatalf("claimed %d after the start", len(got))
	}
	k := 10
	for _, j := range got {
		if k == 700 {
			k++ // the unreadable one
		}
		want := jobs[k]
		if j.ID() != want.ID() || !bytes.Equal(j.Data, want.Data) {
			t.Fatalf("job %d came back as %s (%d bytes of data), want %s (%d)", k, j.ID(), len(j.Data), want.ID(), len(want.Data))
		}
		k++
	}
}

// TestSQLiteThrottleWokenByRemoval: a client waiting on the backlog
// (Throttle) is let go when the removal of a job no flush took brings the
// backlog under its bound; no flush may come to tell it (here none can:
// the writer is not running).
func TestSQLiteThrottleWokenByRemoval(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "q.db")
	b, st, _ := openHeld(t, path, 0)
	defer closeTestStore(t, b, st)
	st.mu.Lock()
	st.limit = 3
	st.mu.Unlock()
	jobs := []*Job{mustJob(t, "q", map[string]any{"data": 1}), mustJob(t, "q", map[string]any{"data": 2}), mustJob(t, "q", map[string]any{"data": 3})}
	b.pushJobs("q", jobs, nil)
	done := make(chan struct{})
	go func() {
		st.Throttle()
		close(done)
	}()
	// Wait until the client waits (its goroutine parked in waitRoom).
	eventually(t, 10*time.Second, "the client waiting on a full backlog", func() (bool, string) {
		buf := make([]byte, 1<<20)
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*SQLiteStore).waitRoom"), "not in waitRoom"
	})
	st.JobRemoved(jobs[0])
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a client waiting on the backlog was not let go when a removal made room")
	}
}

// TestSQLitePageSize: a new file is made with 16 KB pages in WAL mode (the
// page size must be set before WAL mode fixes it); a file made with 4 KB
// pages keeps them, and its jobs come back and new ones are written.
func TestSQLitePageSize(t *testing.T) {
	t.Parallel()
	pragmas := func(path string) (pageSize int, mode string) {
		t.Helper()
		db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.QueryRow(`PRAGMA page_size`).Scan(&pageSize); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil {
			t.Fatal(err)
		}
		return pageSize, mode
	}
	// The writer checkpoints at 4 MB of WAL whatever the page size.
	checkpointPages := func(st *SQLiteStore) int64 {
		t.Helper()
		var n int64
		if err := st.wconn.QueryRowContext(context.Background(), `PRAGMA wal_autocheckpoint`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	dir := t.TempDir()
	fresh := filepath.Join(dir, "new.db")
	b, st, _ := openTestStore(t, fresh)
	if n := checkpointPages(st); n != walCheckpointBytes/sqlitePageSize {
		t.Fatalf("a new file is checkpointed every %d pages, want %d", n, walCheckpointBytes/sqlitePageSize)
	}
	b.pushJobs("ps", []*Job{mustJob(t, "ps", map[string]any{"data": 1})}, nil)
	closeTestStore(t, b, st)
	if size, mode := pragmas(fresh); size != sqlitePageSize || mode != "wal" {
		t.Fatalf("new file: page size %d, journal mode %q; want %d, wal", size, mode, sqlitePageSize)
	}

	old := filepath.Join(dir, "old.db")
	db, err := sql.Open("sqlite", "file:"+old+"?_pragma=page_size(4096)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE other (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	b, st, _ = openTestStore(t, old)
	jobs := make([]*Job, 500)
	for i := range jobs {
		jobs[i] = mustJob(t, "ps", map[string]any{"data": i})
	}
	b.pushJobs("ps", jobs, nil)
	closeTestStore(t, b, st)
	b, st, rs := openTestStore(t, old)
	defer closeTestStore(t, b, st)
	if n := checkpointPages(st); n != walCheckpointBytes/4096 {
		t.Fatalf("a 4 KB-page file is checkpointed every %d pages, want %d", n, walCheckpointBytes/4096)
	}
	if rs.Waiting != len(jobs) {
		t.Fatalf("a 4 KB-page file gave back %d jobs of %d", rs.Waiting, len(jobs))
	}
	if size, _ := pragmas(old); size != 4096 {
		t.Fatalf("a 4 KB-page file has %d-byte pages after queued opened it", size)
	}
}
