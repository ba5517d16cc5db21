package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer collects log output written from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testBackups makes a backup service of store st to bucket on endpoint,
// with short pauses.
func testBackups(t *testing.T, src backupSource, dataPath, endpoint, bucket string, keep int, interval time.Duration) (*BackupService, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	cfg := &backupSettings{s3Settings: s3Settings{bucket: bucket, prefix: "backups", endpoint: endpoint, region: "us-east-1",
		addressing: "auto", accessKey: "AKTEST", secretKey: "test-secret-value"}, keep: keep, interval: interval}
	bk, err := newBackupService(cfg, src, dataPath, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	bk.s3.retryBase = time.Millisecond
	bk.retryMin, bk.retryMax = 20*time.Millisecond, 100*time.Millisecond
	return bk, logs
}

func pushN(t *testing.T, b *MemEngine, st *SQLiteStore, queue string, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i += 500 {
		jobs := make([]*Job, min(500, n-i))
		for k := range jobs {
			jobs[k] = mustJob(t, queue, map[string]any{"data": map[string]any{"n": int64(i + k), "to": "someone@example.com"}})
			ids = append(ids, jobs[k].ID())
		}
		b.pushJobs(queue, jobs, nil)
	}
	if err := st.Sync(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestBackupRestoreRoundTrip: backups of a live store go up with their
// checksums, the newest N stay, and a restore into a new path finds every
// job; a restore never overwrites, and a damaged object is refused.
func TestBackupRestoreRoundTrip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	live := filepath.Join(dir, "live.db")
	b, st, _ := openTestStore(t, live)
	defer st.Close()
	defer b.Close()
	fake := newFakeS3("bk")
	ts := httptest.NewServer(fake)
	defer ts.Close()
	bk, logs := testBackups(t, st, live, ts.URL, "bk", 2, 0)
	defer bk.Close()
	// Someone else's object under the prefix is not ours to delete.
	bk.s3.PutObject(t.Context(), "backups/README.txt", bytesPayload([]byte("notes")), nil)

	ids := pushN(t, b, st, "rt", 1500)
	var results []backupResult
	for i := range 3 {
		if i > 0 {
			ids = append(ids, pushN(t, b, st, "rt", 10)...) // each backup differs
		}
		res, err := bk.BackupNow(t.Context())
		if err != nil {
			t.Fatalf("backup %d: %v\n%s", i, err, logs)
		}
		results = append(results, res)
	}
	keys := fake.keys()
	want := []string{"backups/README.txt", results[1].Key, results[2].Key}
	if strings.Join(keys, " ") != strings.Join(want, " ") {
		t.Fatalf("bucket holds %v, want %v (keep 2)", keys, want)
	}
	if !regexp.MustCompile(`^backups/queued-\d{8}T\d{6}\.\d{3}Z\.db\.gz$`).MatchString(results[2].Key) {
		t.Fatalf("key %q", results[2].Key)
	}
	meta := fake.meta(results[2].Key)
	if meta.Get("X-Amz-Meta-Sha256") != results[2].SHA256 || meta.Get("X-Amz-Meta-Db-Sha256") == "" || meta.Get("X-Amz-Meta-Queued-Version") != version {
		t.Fatalf("metadata %v", meta)
	}
	if gz := fake.object(results[2].Key); int64(len(gz)) != results[2].Bytes || hexSHA256(gz) != results[2].SHA256 || results[2].Bytes >= results[2].DBBytes {
		t.Fatalf("object %d bytes, result %+v", len(gz), results[2])
	}
	h := bk.health()
	if h["ok"] != true || h["failures"] != 0 || h["last"].(map[string]any)["key"] != results[2].Key {
		t.Fatalf("health %v", h)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".queued-backup-*")); len(left) != 0 {
		t.Fatalf("work folders left: %v", left)
	}

	// Restore the newest (a prefix picks it) into a new path.
	restored := filepath.Join(dir, "restored", "q.db")
	rep, err := restoreBackup(t.Context(), bk.s3, "backups/", restored)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Key != results[2].Key || rep.Jobs != 1520 || rep.Bytes != results[2].Bytes {
		t.Fatalf("restore report %+v", rep)
	}
	// Never over an existing file, the live one included.
	for _, p := range []string{restored, live} {
		before, _ := os.ReadFile(p)
		if _, err := restoreBackup(t.Context(), bk.s3, results[1].Key, p); err == nil || !strings.Contains(err.Error(), "exists") {
			t.Fatalf("restore over %s: %v", p, err)
		}
		if after, _ := os.ReadFile(p); !bytes.Equal(before, after) {
			t.Fatalf("%s changed", p)
		}
	}
	// A damaged object or one without checksums is refused, leaving nothing.
	fake.corrupt(results[1].Key)
	bad := filepath.Join(dir, "bad.db")
	if _, err := restoreBackup(t.Context(), bk.s3, results[1].Key, bad); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("corrupt backup: %v", err)
	}
	if _, err := restoreBackup(t.Context(), bk.s3, "backups/README.txt", bad); err == nil || !strings.Contains(err.Error(), "no checksum") {
		t.Fatalf("foreign object: %v", err)
	}
	if _, err := restoreBackup(t.Context(), bk.s3, "backups/nope.db.gz", bad); !isS3NotFound(err) {
		t.Fatalf("missing key: %v", err)
	}
	for _, pat := range []string{"bad.db*", ".queued-restore-*", "restored/.queued-restore-*"} {
		if left, _ := filepath.Glob(filepath.Join(dir, pat)); len(left) != 0 {
			t.Fatalf("a refused restore left %v", left)
		}
	}

	// The restored file starts a broker with every job.
	b2, st2, rs := openTestStore(t, restored)
	defer st2.Close()
	defer b2.Close()
	if rs.Waiting != len(ids) {
		t.Fatalf("restored %d waiting jobs, want %d", rs.Waiting, len(ids))
	}
	for _, id := range ids {
		if b2.idxGet(id) == nil {
			t.Fatalf("job %s missing after restore", id)
		}
	}
}

// TestBackupFailuresDoNotBlockTheQueue: while uploads hang the queue takes
// and commits jobs as usual; failed uploads are retried with backoff and
// reported in the health section and the log, and recover; shutdown does
// not wait for a hung upload.
func TestBackupFailuresDoNotBlockTheQueue(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	live := filepath.Join(dir, "live.db")
	b, st, _ := openTestStore(t, live)
	defer st.Close()
	defer b.Close()
	pushN(t, b, st, "f", 2000)
	fake := newFakeS3("bk")
	ts := httptest.NewServer(fake)
	defer ts.Close()
	fake.failWhen(func(r *http.Request) bool { return r.Method == "PUT" })
	bk, logs := testBackups(t, st, live, ts.URL, "bk", 3, time.Hour)
	bk.Start()
	eventually(t, 10*time.Second, "failures reported", func() (bool, string) {
		h := bk.health()
		return h["failures"].(int) >= 3, fmt.Sprint(h)
	})
	h := bk.health()
	if h["ok"] != false || !strings.Contains(fmt.Sprint(h["lastError"]), "InternalError") || h["nextAt"] == nil {
		t.Fatalf("health while failing: %v", h)
	}
	if !strings.Contains(logs.String(), "backup failed") || !strings.Contains(logs.String(), "backup will be tried again") {
		t.Fatalf("log:\n%s", logs)
	}
	fake.failWhen(nil)
	eventually(t, 10*time.Second, "recovery", func() (bool, string) {
		h := bk.health()
		return h["ok"] == true && h["last"] != nil, fmt.Sprint(h)
	})
	if !strings.Contains(logs.String(), "backups recovered") {
		t.Fatalf("log:\n%s", logs)
	}
	// Now an upload that hangs: the queue goes on.
	hold := make(chan struct{})
	fake.mu.Lock()
	fake.hold = hold
	fake.mu.Unlock()
	done := make(chan error, 1)
	go func() { _, err := bk.BackupNow(context.Background()); done <- err }()
	eventually(t, 10*time.Second, "upload in flight", func() (bool, string) {
		return fake.requests() > 0 && bk.health()["running"] == true, fmt.Sprint(bk.health())
	})
	// Held up by the upload, the pushes and Close would wait until the
	// test lets it go (never): the bounds are far above what they take
	// (~0.2 s), so that a busy machine does not fail them.
	began := time.Now()
	pushN(t, b, st, "f", 2000)
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("2000 pushes took %s during a hung upload", took)
	}
	// Shutdown abandons it.
	began = time.Now()
	bk.Close()
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("Close took %s", took)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "shutting down") && !strings.Contains(err.Error(), "cancel") {
		t.Fatalf("hung backup at shutdown: %v", err)
	}
	close(hold)
	if _, err := bk.BackupNow(t.Context()); err == nil {
		t.Fatal("a backup started after Close")
	}
}

// The schedule resumes from the newest backup in the bucket.
func TestBackupScheduleResumes(t *testing.T) {
	t.Parallel()
	fake := newFakeS3("bk")
	ts := httptest.NewServer(fake)
	defer ts.Close()
	bk, _ := testBackups(t, &SQLiteStore{}, filepath.Join(t.TempDir(), "x.db"), ts.URL, "bk", 0, time.Hour)
	defer bk.Close()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	bk.now = func() time.Time { return now }
	if got := bk.firstRun(); !got.Equal(now) {
		t.Fatalf("empty bucket: first backup at %v, want now", got)
	}
	bk.s3.PutObject(t.Context(), backupKey("backups/", now.Add(-2*time.Hour)), bytesPayload(nil), nil)
	if got := bk.firstRun(); !got.Equal(now) {
		t.Fatalf("overdue: first backup at %v, want now", got)
	}
	bk.s3.PutObject(t.Context(), backupKey("backups/", now.Add(-10*time.Minute)), bytesPayload(nil), nil)
	if got := bk.firstRun(); !got.Equal(now.Add(50 * time.Minute)) {
		t.Fatalf("recent backup: first backup at %v, want in 50m", got)
	}
	if _, ok := backupTime("backups/", "backups/sub/"+backupKey("", now)); ok {
		t.Fatal("a key in a sub-folder was taken for one of ours")
	}
}

// Flags, the reference's environment variables and the usual AWS ones.
//
// Serial: it sets environment variables (t.Setenv).
func TestBackupSettings(t *testing.T) {
	parse := func(args ...string) *config {
		t.Helper()
		fs, c := serverFlags(io.Discard)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, k := range []string{"S3_BUCKET", "S3_BACKUP_INTERVAL", "S3_BACKUP_ENABLED", "S3_BACKUP_RETENTION", "S3_BACKUP_PREFIX",
		"S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION",
		"S3_VIRTUAL_HOSTED_STYLE", "S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY",
		"S3_SESSION_TOKEN", "AWS_SESSION_TOKEN"} {
		t.Setenv(k, "")
	}
	c := parse()
	if c.backup.bucket != "" || c.backup.interval != 0 || c.backup.keep != 7 || c.backup.prefix != "backups/" || c.backup.region != "us-east-1" {
		t.Fatalf("defaults: %+v", c.backup)
	}
	t.Setenv("S3_BUCKET", "envb")
	t.Setenv("S3_BACKUP_ENABLED", "1")
	t.Setenv("AWS_DEFAULT_REGION", "eu-central-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "env-secret-value-9")
	t.Setenv("AWS_SESSION_TOKEN", "env-token-value-9")
	t.Setenv("AWS_ENDPOINT_URL", "http://minio:9000")
	t.Setenv("S3_VIRTUAL_HOSTED_STYLE", "0")
	c = parse()
	if c.backup.bucket != "envb" || c.backup.interval != 6*time.Hour || c.backup.region != "eu-central-1" || c.backup.accessKey != "AKENV" ||
		c.backup.secretKey != "env-secret-value-9" || c.backup.sessionToken != "env-token-value-9" ||
		c.backup.endpoint != "http://minio:9000" || c.backup.addressing != "path" {
		t.Fatalf("from the environment: %+v", c.backup)
	}
	t.Setenv("S3_BACKUP_INTERVAL", "60000") // milliseconds, as the reference reads it
	t.Setenv("S3_REGION", "auto")
	t.Setenv("S3_ENDPOINT", "https://acct.r2.cloudflarestorage.com")
	if c = parse(); c.backup.interval != time.Minute || c.backup.region != "auto" || c.backup.endpoint != "https://acct.r2.cloudflarestorage.com" {
		t.Fatalf("reference variables first: %+v", c.backup)
	}
	c = parse("--backup-interval", "90s", "--s3-bucket", "flagb", "--s3-secret-key", "flag-secret", "--backup-keep", "3", "--s3-addressing", "virtual")
	if c.backup.interval != 90*time.Second || c.backup.bucket != "flagb" || c.backup.secretKey != "flag-secret" || c.backup.keep != 3 || c.backup.addressing != "virtual" {
		t.Fatalf("flags win: %+v", c.backup)
	}
	if fs, _ := serverFlags(io.Discard); fs.Parse([]string{"--backup-interval", "soon"}) == nil {
		t.Fatal("bad interval accepted")
	}
	// The help text does not show what the environment holds.
	fs, _ := serverFlags(io.Discard)
	var help bytes.Buffer
	fs.SetOutput(&help)
	fs.PrintDefaults()
	if strings.Contains(help.String(), "env-secret-value-9") || strings.Contains(help.String(), "env-token-value-9") ||
		!strings.Contains(help.String(), "-s3-secret-key") {
		t.Fatalf("help:\n%s", help.String())
	}

	// What cannot work is refused at start.
	bad := []struct {
		s    backupSettings
		src  backupSource
		want string
	}{
		{backupSettings{interval: time.Hour}, &SQLiteStore{}, "needs a bucket"},
		{backupSettings{s3Settings: s3Settings{bucket: "b", accessKey: "a", secretKey: "s"}}, nil, "memory"},
		{backupSettings{s3Settings: s3Settings{bucket: "b"}}, &SQLiteStore{}, "credentials missing"},
		{backupSettings{s3Settings: s3Settings{bucket: "b", accessKey: "a", secretKey: "s"}, keep: -1}, &SQLiteStore{}, "backup-keep"},
	}
	for _, c := range bad {
		if _, err := newBackupService(&c.s, c.src, "x.db", quietLog()); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.s, err, c.want)
		}
	}
	if bk, err := newBackupService(&backupSettings{}, nil, "x.db", quietLog()); bk != nil || err != nil {
		t.Fatalf("no bucket, no backups: %v %v", bk, err)
	}
	if err := runServer(t.Context(), &config{memory: true, backup: backupSettings{s3Settings: s3Settings{bucket: "b", accessKey: "a", secretKey: "s"}}},
		quietLog(), nil); err == nil || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("S3 backups in memory mode: %v", err)
	}
}

// POST /backup/s3 and the health section, in-process.
func TestBackupHTTP(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	srv := memServer(b, []string{"tok"}, quietLog())
	h := newHTTPHandler(b, srv, nil)
	do := func(h http.Handler, method, path, token string) (int, map[string]any) {
		req := httptest.NewRequest(method, path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var m map[string]any
		json.Unmarshal(rec.Body.Bytes(), &m)
		return rec.Code, m
	}
	if code, _ := do(h, "POST", "/backup/s3", ""); code != 401 {
		t.Fatalf("without the token: %d", code)
	}
	if code, m := do(h, "POST", "/backup/s3", "tok"); code != 409 || !strings.Contains(fmt.Sprint(m["error"]), "not configured") {
		t.Fatalf("not configured: %d %v", code, m)
	}
	if _, m := do(h, "GET", "/health", ""); m["backup"] != nil {
		t.Fatalf("health without backups: %v", m)
	}

	dir := t.TempDir()
	live := filepath.Join(dir, "live.db")
	b2, st, _ := openTestStore(t, live)
	defer st.Close()
	defer b2.Close()
	pushN(t, b2, st, "h", 100)
	fake := newFakeS3("bk")
	ts := httptest.NewServer(fake)
	defer ts.Close()
	bk, _ := testBackups(t, st, live, ts.URL, "bk", 0, 0)
	defer bk.Close()
	h = newHTTPHandler(b2, memServer(b2, []string{"tok"}, quietLog()), bk)
	code, m := do(h, "POST", "/backup/s3", "tok")
	if code != 200 || m["ok"] != true || !strings.HasPrefix(fmt.Sprint(m["url"]), "s3://bk/backups/queued-") {
		t.Fatalf("backup: %d %v", code, m)
	}
	// The backup section is a detail: with tokens, for their holders.
	if _, hm := do(h, "GET", "/health", ""); hm["backup"] != nil || hm["status"] != "healthy" {
		t.Fatalf("health without the token: %v", hm)
	}
	_, hm := do(h, "GET", "/health", "tok")
	sec, _ := hm["backup"].(map[string]any)
	if sec == nil || sec["ok"] != true || sec["target"] != "s3://bk/backups/" || sec["last"].(map[string]any)["key"] == nil {
		t.Fatalf("health: %v", hm)
	}
	// A client that hangs up mid-backup does not cancel it.
	hold := make(chan struct{})
	fake.mu.Lock()
	fake.hold = hold
	fake.mu.Unlock()
	ctx, hangUp := context.WithCancel(context.Background())
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		req := httptest.NewRequestWithContext(ctx, "POST", "/backup/s3", nil)
		req.Header.Set("Authorization", "Bearer tok")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	first := bk.health()["last"].(map[string]any)["key"]
	eventually(t, 10*time.Second, "upload in flight", func() (bool, string) { return bk.health()["running"] == true, "" })
	hangUp()
	time.Sleep(50 * time.Millisecond)
	close(hold)
	<-answered
	if h := bk.health(); h["ok"] != true || h["last"].(map[string]any)["key"] == first {
		t.Fatalf("backup after the client hung up: %v", h)
	}
	fake.mu.Lock()
	fake.hold = nil
	fake.mu.Unlock()

	fake.failWhen(func(*http.Request) bool { return true })
	if code, m := do(h, "POST", "/backup/s3", "tok"); code != 502 || !strings.Contains(fmt.Sprint(m["error"]), "InternalError") {
		t.Fatalf("failing upload: %d %v", code, m)
	}
	if _, hm := do(h, "GET", "/health", "tok"); hm["backup"].(map[string]any)["ok"] != false || hm["status"] != "healthy" {
		// A failed backup is reported in its section; it does not take the
		// server out of a load balancer.
		t.Fatalf("health after a failure: %v", hm)
	}
}

// ---------------------------------------------------------------------------
// End to end, against s3rver (which checks signatures)

// TestBackupS3rverEndToEnd runs the binary with S3 settings from the
// environment, backs up from the command line, lists, restores into a new
// path, starts a server on the restored file and finds every job. A server
// with a wrong secret fails visibly, without showing it.
//
// The servers and the commands run as the release binary with the S3
// settings in their environment, not the test process's (which the other
// tests share).
func TestBackupS3rverEndToEnd(t *testing.T) {
	t.Parallel()
	ep := startS3rver(t, "e2e", "sched")
	dir := t.TempDir()
	env := []string{"AWS_ACCESS_KEY_ID=S3RVER", "AWS_SECRET_ACCESS_KEY=S3RVER", "AWS_REGION=us-east-1", "AWS_ENDPOINT_URL=" + ep}
	for _, k := range []string{"S3_BUCKET", "S3_BACKUP_INTERVAL", "S3_BACKUP_ENABLED", "S3_BACKUP_PREFIX", "S3_ENDPOINT", "S3_ACCESS_KEY_ID",
		"S3_SECRET_ACCESS_KEY", "S3_REGION", "S3_VIRTUAL_HOSTED_STYLE", "S3_SESSION_TOKEN", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"} {
		env = append(env, k+"=")
	}
	startBinary := func(t *testing.T, extra ...string) *serverProc {
		return startBinaryAt(t, append(append([]string{"env"}, env...), queuedBinary(t)), extra...)
	}
	run := func(args []string, stdout, stderr io.Writer) int {
		return runBinaryEnv(t, env, args, stdout, stderr)
	}
	httpPort := freePort(t)
	live := filepath.Join(dir, "live.db")
	srv := startBinary(t, "--data-path", live, "--http-port", fmt.Sprint(httpPort), "--s3-bucket", "e2e", "--backup-keep", "2", "--auth-tokens", "tok")
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)

	c := dial(t, srv.addr())
	c.ok(map[string]any{"cmd": "Auth", "token": "tok"})
	var waiting []string
	for i := 0; i < 4; i++ {
		jobs := make([]any, 250)
		for k := range jobs {
			jobs[k] = map[string]any{"name": "e2e", "data": map[string]any{"n": i*250 + k}}
		}
		for _, id := range list(t, c.ok(map[string]any{"cmd": "PUSHB", "queue": "e2e", "jobs": jobs}), "ids") {
			waiting = append(waiting, id.(string))
		}
	}
	jobs := make([]any, 100)
	for k := range jobs {
		jobs[k] = map[string]any{"name": "done", "data": k}
	}
	c.ok(map[string]any{"cmd": "PUSHB", "queue": "e2e-done", "jobs": jobs})
	var completed []string
	for id := range drainAll(t, c, "e2e-done") {
		completed = append(completed, id)
	}
	// The snapshot holds what was committed: make it all so.
	last := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "e2e", "data": "last", "durable": true}), "id")
	waiting = append(waiting, last)

	var out, errOut strings.Builder
	if code := run([]string{"backup", "--s3", "--url", base}, &out, &errOut); code == 0 {
		t.Fatal("backup without the token succeeded")
	}
	var urls []string
	for i := 0; i < 3; i++ {
		out.Reset()
		errOut.Reset()
		began := time.Now()
		if code := run([]string{"backup", "--s3", "--url", base, "--token", "tok"}, &out, &errOut); code != 0 {
			t.Fatalf("backup --s3: %s\n%s", errOut.String(), srv.output())
		}
		u := regexp.MustCompile(`s3://e2e/backups/queued-\S+\.db\.gz`).FindString(out.String())
		if u == "" {
			t.Fatalf("backup output: %s", out.String())
		}
		urls = append(urls, u)
		t.Logf("%s (%s)", strings.TrimSpace(out.String()), time.Since(began).Round(time.Millisecond))
	}

	// Listed: the newest two (keep 2).
	out.Reset()
	if code := run([]string{"backups", "list", "--s3-bucket", "e2e"}, &out, &errOut); code != 0 {
		t.Fatalf("backups list: %s", errOut.String())
	}
	listed := regexp.MustCompile(`s3://\S+`).FindAllString(out.String(), -1)
	if strings.Join(listed, " ") != urls[2]+" "+urls[1] {
		t.Fatalf("backups list shows %v, want the newest two of %v:\n%s", listed, urls, out.String())
	}

	// The health section (a detail: the server has tokens).
	hreq, _ := http.NewRequest("GET", base+"/health", nil)
	hreq.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	var health map[string]any
	json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	sec, _ := health["backup"].(map[string]any)
	if sec == nil || sec["ok"] != true || "s3://e2e/"+fmt.Sprint(sec["last"].(map[string]any)["key"]) != urls[2] {
		t.Fatalf("health: %v", health)
	}

	// Restore into a new path; never over an existing or live file.
	restored := filepath.Join(dir, "elsewhere", "restored.db")
	out.Reset()
	if code := run([]string{"restore", "--from", urls[2], "--data-path", restored}, &out, &errOut); code != 0 {
		t.Fatalf("restore: %s", errOut.String())
	}
	if !strings.Contains(out.String(), fmt.Sprintf("%d jobs, checksums verified", len(waiting)+len(completed))) {
		t.Fatalf("restore output: %s", out.String())
	}
	for _, p := range []string{restored, live} {
		errOut.Reset()
		if code := run([]string{"restore", "--from", urls[1], "--data-path", p}, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "exists") {
			t.Fatalf("restore over %s: %d %s", p, code, errOut.String())
		}
	}

	// A server on the restored file has every job, in its state.
	srv2 := startBinary(t, "--data-path", restored)
	c2 := dial(t, srv2.addr())
	found, states := existing(t, c2, waiting)
	if found != len(waiting) || states["waiting"] != len(waiting) {
		t.Fatalf("restored server: %d of %d waiting jobs found: %v", found, len(waiting), states)
	}
	found, states = existing(t, c2, completed)
	if found != len(completed) || states["completed"] != len(completed) {
		t.Fatalf("restored server: %d of %d completed jobs found: %v", found, len(completed), states)
	}

	// Scheduled backups, the newest two kept.
	httpPort3 := freePort(t)
	srv3 := startBinary(t, "--data-path", filepath.Join(dir, "sched.db"), "--http-port", fmt.Sprint(httpPort3),
		"--s3-bucket", "sched", "--s3-prefix", "nightly/", "--backup-interval", "1s", "--backup-keep", "2")
	eventually(t, 30*time.Second, "scheduled backups", func() (bool, string) {
		return strings.Count(srv3.output(), "backup uploaded") >= 4, srv3.output()
	})
	out.Reset()
	run([]string{"backups", "list", "--s3-bucket", "sched", "--s3-prefix", "nightly/"}, &out, &errOut)
	if n := len(regexp.MustCompile(`s3://sched/nightly/queued-`).FindAllString(out.String(), -1)); n != 2 {
		t.Fatalf("%d scheduled backups kept, want 2:\n%s", n, out.String())
	}

	// A wrong secret: the backup fails visibly, and the secret shows nowhere.
	const wrongSecret = "WRONG-secret-0123456789"
	env = append(env, "AWS_SECRET_ACCESS_KEY="+wrongSecret)
	httpPort4 := freePort(t)
	srv4 := startBinary(t, "--data-path", filepath.Join(dir, "wrong.db"), "--http-port", fmt.Sprint(httpPort4), "--s3-bucket", "e2e")
	errOut.Reset()
	if code := run([]string{"backup", "--s3", "--url", fmt.Sprintf("http://127.0.0.1:%d", httpPort4)}, &out, &errOut); code == 0 ||
		!strings.Contains(errOut.String(), "SignatureDoesNotMatch") {
		t.Fatalf("backup with a wrong secret: %d %s", code, errOut.String())
	}
	resp, err = http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", httpPort4))
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(hb), `"ok":false`) || !strings.Contains(string(hb), "SignatureDoesNotMatch") {
		t.Fatalf("health with a wrong secret: %s", hb)
	}
	errOut.Reset()
	if code := run([]string{"backups", "list", "--s3-bucket", "e2e"}, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "SignatureDoesNotMatch") {
		t.Fatalf("list with a wrong secret: %d %s", code, errOut.String())
	}
	srv4.stop(t)
	if !strings.Contains(srv4.output(), "backup failed") {
		t.Fatalf("no failure in the log:\n%s", srv4.output())
	}
	for what, text := range map[string]string{"server log": srv4.output(), "health": string(hb), "command output": errOut.String() + out.String()} {
		if strings.Contains(text, wrongSecret) {
			t.Fatalf("the secret appears in the %s:\n%s", what, text)
		}
	}
}

// BenchmarkBackupS3 measures one backup of a database of waiting jobs
// (QUEUED_BACKUP_JOBS, 100,000 by default) to s3rver, and how pushes fare
// while it runs:
// go test -run '^$' -bench BackupS3 -benchtime 1x
func BenchmarkBackupS3(b *testing.B) {
	n := 100000
	if v := os.Getenv("QUEUED_BACKUP_JOBS"); v != "" {
		fmt.Sscan(v, &n)
	}
	ep := startS3rver(b, "bench")
	dir := b.TempDir()
	path := filepath.Join(dir, "bench.db")
	st, err := OpenSQLite(path, "normal", quietLog())
	if err != nil {
		b.Fatal(err)
	}
	br := NewMemEngine(0, st)
	st.Start()
	defer st.Close()
	defer br.Close()
	data := map[string]any{"to": "someone@example.com", "template": "welcome", "n": int64(1)}
	for i := 0; i < n; i += 1000 {
		jobs := make([]*Job, min(1000, n-i))
		for k := range jobs {
			jobs[k] = mustJob(b, "bench", map[string]any{"name": "email", "data": data})
		}
		br.pushJobs("bench", jobs, nil)
	}
	if err := st.Sync(); err != nil {
		b.Fatal(err)
	}
	cfg := &backupSettings{s3Settings: s3Settings{bucket: "bench", prefix: "b/", endpoint: ep, region: "us-east-1",
		accessKey: s3rverCreds.AccessKeyID, secretKey: s3rverCreds.Secret}}
	bk, err := newBackupService(cfg, st, path, quietLog())
	if err != nil {
		b.Fatal(err)
	}
	defer bk.Close()
	// 100 jobs pushed and committed, timed; the worst of a run.
	pushBatch := func() time.Duration {
		jobs := make([]*Job, 100)
		for k := range jobs {
			jobs[k] = mustJob(b, "live", map[string]any{"name": "email", "data": data})
		}
		t0 := time.Now()
		br.pushJobs("live", jobs, nil)
		st.Sync()
		return time.Since(t0)
	}
	var idle time.Duration
	for range 100 {
		idle = max(idle, pushBatch())
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		done := make(chan struct{})
		var during time.Duration
		batches := 0
		go func() {
			defer close(done)
			for bk.health()["running"] != true {
				time.Sleep(time.Millisecond)
			}
			for bk.health()["running"] == true {
				during = max(during, pushBatch())
				batches++
			}
		}()
		res, err := bk.BackupNow(context.Background())
		<-done
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(res.DBBytes)/1e6, "MB-db")
		b.ReportMetric(float64(res.Bytes)/1e6, "MB-gz")
		b.ReportMetric(res.Snapshot.Seconds(), "s-snapshot")
		b.ReportMetric(res.Compress.Seconds(), "s-gzip")
		b.ReportMetric(res.Upload.Seconds(), "s-upload")
		b.ReportMetric(float64(during.Milliseconds()), "ms-worst-push-during")
		b.ReportMetric(float64(idle.Milliseconds()), "ms-worst-push-idle")
		b.Logf("%d jobs: %.1f MB of database, %.1f MB uploaded, in %s (snapshot %s, gzip %s, upload %s); meanwhile %d batches of 100 jobs pushed and committed, the slowest in %s (idle: %s)",
			n, float64(res.DBBytes)/1e6, float64(res.Bytes)/1e6, res.Took.Round(time.Millisecond), res.Snapshot.Round(time.Millisecond),
			res.Compress.Round(time.Millisecond), res.Upload.Round(time.Millisecond), batches, during, idle)
	}
}

// TestBackupInPostgresMode: a PostgreSQL-mode broker has no SQLite file to
// copy, and says what backs its data up instead (it used to say that it
// kept its data in memory).
func TestBackupInPostgresMode(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	err := runServer(t.Context(), &config{pgURL: testPGURL(), pgNamespace: ns,
		backup: backupSettings{s3Settings: s3Settings{bucket: "b", accessKey: "a", secretKey: "s"}}}, quietLog(), nil)
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL") || !strings.Contains(err.Error(), "pg_dump") || strings.Contains(err.Error(), "memory") {
		t.Fatalf("S3 backups in PostgreSQL mode: %v", err)
	}
	p := startPGBroker(t, ns)
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/backup", p.httpPort))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "pg_dump") || strings.Contains(string(body), "memory") {
		t.Fatalf("GET /backup in PostgreSQL mode: %d %s", resp.StatusCode, body)
	}
}

// A backup announces itself to the live streams: started, then completed
// with its key, or failed with the error.
func TestBackupNotices(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	live := filepath.Join(dir, "live.db")
	b, st, _ := openTestStore(t, live)
	defer st.Close()
	defer b.Close()
	pushN(t, b, st, "n", 10)
	fake := newFakeS3("bk")
	ts := httptest.NewServer(fake)
	defer ts.Close()
	bk, _ := testBackups(t, st, live, ts.URL, "bk", 3, time.Hour)
	var mu sync.Mutex
	var got []string
	bk.announce = func(n *note) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, n.name+" "+string(n.o.close()))
	}
	res, err := bk.BackupNow(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	fake.failWhen(func(r *http.Request) bool { return r.Method == "PUT" })
	if _, err := bk.BackupNow(t.Context()); err == nil {
		t.Fatal("a backup to a failing bucket succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{`storage:backup-started {"bucket":"bk"}`, `storage:backup-completed {"bucket":"bk","key":` + strconv.Quote(res.Key) + `}`,
		`storage:backup-started {"bucket":"bk"}`}
	if len(got) != 4 || !slices.Equal(got[:3], want) || !strings.HasPrefix(got[3], `storage:backup-failed {"bucket":"bk","error":"`) {
		t.Fatalf("notices:\n%s", strings.Join(got, "\n"))
	}
}
