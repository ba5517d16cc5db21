package main

// Backups to S3-compatible storage: a consistent snapshot of the live
// database (SQLite's VACUUM INTO, through the store's Backup), gzipped,
// uploaded under a time-stamped key with SHA-256 checksums in the object's
// metadata; on a schedule and on demand; the newest N kept; listed and
// restored from the command line (cli_backup.go).
//
// A backup runs on its own goroutine and only reads the database (the
// snapshot is a read transaction, and WAL mode lets the writer go on), so
// a slow or failing upload never holds up the queue. A failed scheduled
// backup is tried again with backoff; failures show in /health and the log.

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	backupKeyPrefix  = "queued-"
	backupKeySuffix  = ".db.gz"
	backupTimeLayout = "20060102T150405.000Z" // sorts as it reads
	// bunqueue's default when S3_BACKUP_ENABLED is set without an interval.
	defaultBackupInterval = 6 * time.Hour
)

// ---------------------------------------------------------------------------
// Settings

// s3Settings are the flags shared by the server and the backup commands.
// Each falls back to the environment variables the reference server reads
// (S3_*) and then to the usual AWS ones.
type s3Settings struct {
	bucket, prefix, endpoint, region, addressing string
	accessKey                                    string
	secretKey, sessionToken                      secret
}

// backupSettings adds the server's schedule.
type backupSettings struct {
	s3Settings
	interval time.Duration
	keep     int
}

// secretFlag keeps a credential out of `queued help`, which prints each
// flag's default (here: what the environment holds).
type secretFlag struct{ p *secret }

func (f secretFlag) String() string     { return "" }
func (f secretFlag) Set(s string) error { *f.p = secret(s); return nil }

// intervalFlag takes a Go duration ("6h", "90s") or, as S3_BACKUP_INTERVAL
// does in the reference, a number of milliseconds.
type intervalFlag struct{ p *time.Duration }

func (f intervalFlag) String() string {
	if f.p == nil || *f.p == 0 {
		return ""
	}
	return f.p.String()
}

func (f intervalFlag) Set(s string) error {
	d, err := parseInterval(s)
	if err != nil {
		return err
	}
	*f.p = d
	return nil
}

func parseInterval(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		if ms < 0 {
			return 0, fmt.Errorf("interval %q is negative", s)
		}
		return time.Duration(ms) * time.Millisecond, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("interval %q: want a duration such as 6h or 30m, or milliseconds", s)
	}
	return d, nil
}

func addS3Flags(fs *flag.FlagSet, s *s3Settings) {
	fs.StringVar(&s.bucket, "s3-bucket", envOr([]string{"S3_BUCKET", "AWS_BUCKET"}, ""), "S3 bucket for backups; setting it turns S3 backups on [S3_BUCKET, AWS_BUCKET]")
	fs.StringVar(&s.prefix, "s3-prefix", envOr([]string{"S3_BACKUP_PREFIX"}, "backups/"), "key prefix of the backups in the bucket [S3_BACKUP_PREFIX]")
	fs.StringVar(&s.endpoint, "s3-endpoint", envOr([]string{"S3_ENDPOINT", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}, ""),
		"S3-compatible service URL, e.g. http://minio:9000 or https://ACCOUNT.r2.cloudflarestorage.com (empty: AWS) [S3_ENDPOINT, AWS_ENDPOINT, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]")
	fs.StringVar(&s.region, "s3-region", envOr([]string{"S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"}, "us-east-1"),
		"bucket region (R2: auto) [S3_REGION, AWS_REGION, AWS_DEFAULT_REGION]")
	addressing := "auto"
	if v, ok := os.LookupEnv("S3_VIRTUAL_HOSTED_STYLE"); ok && v != "" {
		addressing = "path"
		if v == "1" || strings.EqualFold(v, "true") {
			addressing = "virtual"
		}
	}
	fs.StringVar(&s.addressing, "s3-addressing", addressing,
		"auto, path (https://host/bucket/key) or virtual (https://bucket.host/key); auto is virtual on AWS, path elsewhere [S3_VIRTUAL_HOSTED_STYLE=1|0]")
	fs.StringVar(&s.accessKey, "s3-access-key", envOr([]string{"S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"}, ""), "access key id [S3_ACCESS_KEY_ID, AWS_ACCESS_KEY_ID]")
	s.secretKey = secret(envOr([]string{"S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"}, ""))
	fs.Var(secretFlag{&s.secretKey}, "s3-secret-key", "secret access `key`; prefer the environment, which ps does not show [S3_SECRET_ACCESS_KEY, AWS_SECRET_ACCESS_KEY]"+
		fromEnvNote([]string{"S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"}))
	s.sessionToken = secret(envOr([]string{"S3_SESSION_TOKEN", "AWS_SESSION_TOKEN"}, ""))
	fs.Var(secretFlag{&s.sessionToken}, "s3-session-token", "session `token` of temporary credentials [S3_SESSION_TOKEN, AWS_SESSION_TOKEN]"+
		fromEnvNote([]string{"S3_SESSION_TOKEN", "AWS_SESSION_TOKEN"}))
}

// addBackupFlags adds the S3 flags and the schedule to the server's flags.
func addBackupFlags(fs *flag.FlagSet, b *backupSettings) {
	addS3Flags(fs, &b.s3Settings)
	if v := envOr([]string{"S3_BACKUP_INTERVAL"}, ""); v != "" {
		b.interval, _ = parseInterval(v)
	} else if v := envOr([]string{"S3_BACKUP_ENABLED"}, ""); v == "1" || strings.EqualFold(v, "true") {
		b.interval = defaultBackupInterval
	}
	fs.Var(intervalFlag{&b.interval}, "backup-interval",
		"upload a backup to S3 every `interval`, e.g. 6h (0: only on demand) [S3_BACKUP_INTERVAL in ms; S3_BACKUP_ENABLED=1 means 6h]")
	fs.IntVar(&b.keep, "backup-keep", envInt([]string{"S3_BACKUP_RETENTION"}, 7), "backups kept in S3, the newest; older ones are deleted (0: keep all) [S3_BACKUP_RETENTION]")
}

// client makes the S3 client these settings describe.
func (s *s3Settings) client(log *slog.Logger) (*S3Client, error) {
	return NewS3Client(S3Config{Endpoint: s.endpoint, Region: s.region, Bucket: s.bucket, Addressing: s.addressing,
		Creds: s3Credentials{AccessKeyID: s.accessKey, Secret: s.secretKey, SessionToken: s.sessionToken}}, nil, log)
}

// ---------------------------------------------------------------------------
// Keys

func backupKey(prefix string, t time.Time) string {
	return prefix + backupKeyPrefix + t.UTC().Format(backupTimeLayout) + backupKeySuffix
}

// backupTime reads the time back from a key this package wrote directly
// under prefix; other keys are not backups of ours and are never deleted.
func backupTime(prefix, key string) (time.Time, bool) {
	name, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return time.Time{}, false
	}
	name, ok = strings.CutPrefix(name, backupKeyPrefix)
	if !ok {
		return time.Time{}, false
	}
	name, ok = strings.CutSuffix(name, backupKeySuffix)
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(backupTimeLayout, name)
	return t, err == nil
}

// backupEntry is one backup found in the bucket.
type backupEntry struct {
	Key   string
	Taken time.Time
	Size  int64
}

// listBackups returns the backups under prefix, newest first.
func listBackups(ctx context.Context, c *S3Client, prefix string) ([]backupEntry, error) {
	objs, err := c.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("listing s3://%s/%s: %w", c.bucket, prefix, err)
	}
	var out []backupEntry
	for _, o := range objs {
		if t, ok := backupTime(prefix, o.Key); ok {
			out = append(out, backupEntry{Key: o.Key, Taken: t, Size: o.Size})
		}
	}
	slices.SortFunc(out, func(a, b backupEntry) int { return b.Taken.Compare(a.Taken) })
	return out, nil
}

// ---------------------------------------------------------------------------
// The service

type backupSource interface {
	Backup(ctx context.Context, dst string) error
}

// backupResult describes one uploaded backup.
type backupResult struct {
	Key      string
	At       time.Time
	Bytes    int64 // uploaded, compressed
	DBBytes  int64 // the database
	SHA256   string
	Took     time.Duration
	Snapshot time.Duration // of Took, making the consistent copy
	Compress time.Duration // of Took, gzip and checksums
	Upload   time.Duration // of Took, sending it
}

func (r backupResult) JSON() map[string]any {
	return map[string]any{"key": r.Key, "at": r.At.UnixMilli(), "bytes": r.Bytes, "dbBytes": r.DBBytes,
		"sha256": r.SHA256, "tookMs": r.Took.Milliseconds(), "snapshotMs": r.Snapshot.Milliseconds(), "compressMs": r.Compress.Milliseconds(),
		"uploadMs": r.Upload.Milliseconds()}
}

// BackupService takes backups of one database to one bucket.
type BackupService struct {
	log *slog.Logger
	// announce tells the live streams of each backup (storage:backup-*;
	// Broker.announce, set once the broker is made).
	announce func(*note)
	src      backupSource
	workDir  string // snapshots are made beside the database, not in a RAM-backed /tmp
	s3       *S3Client
	prefix   string
	interval time.Duration
	keep     int
	retryMin time.Duration // first pause after a failed scheduled backup
	retryMax time.Duration
	now      func() time.Time

	slot   chan struct{} // one backup at a time
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the schedule stops; nil if never started
	closed sync.Once

	mu         sync.Mutex
	running    bool
	scheduling bool // the schedule's goroutine runs
	last       *backupResult
	lastErr    string
	errAt      time.Time
	failures   int // consecutive
	next       time.Time
	pruneErr   string
	lastKeyAt  time.Time // keys are unique: two backups in one millisecond get two
	// Since the start, for Prometheus (the reference's backup telemetry):
	// attempts begun, and how they ended. failures above is only the
	// current run of failures; failed counts them all.
	attempts, succeeded, failed int64
	okAt                        time.Time     // when the last successful backup ended
	lastTook                    time.Duration // the last attempt's, failed or not (res.Took is a success's only)
}

// noSQLiteBackup says why a server without a SQLite file has nothing to
// back up, and what backs up its data instead.
func noSQLiteBackup(pgMode bool) string {
	if pgMode {
		return "this server keeps its data in PostgreSQL: back up the namespace's schema with pg_dump (pg_dump --schema=queued_<namespace>)"
	}
	return "this server keeps its data in memory (--memory)"
}

// newBackupService returns nil when no bucket is configured.
func newBackupService(cfg *backupSettings, src backupSource, dataPath string, log *slog.Logger) (*BackupService, error) {
	if cfg.bucket == "" {
		if cfg.interval > 0 {
			return nil, errors.New("--backup-interval needs a bucket: set --s3-bucket (S3_BUCKET)")
		}
		return nil, nil
	}
	if src == nil {
		return nil, errors.New("S3 backups need SQLite storage; " + noSQLiteBackup(false))
	}
	if cfg.interval > 0 && cfg.interval < time.Second {
		return nil, fmt.Errorf("--backup-interval %s is too short", cfg.interval)
	}
	if cfg.keep < 0 {
		return nil, errors.New("--backup-keep must be 0 (keep all) or more")
	}
	if cfg.prefix != "" && !strings.HasSuffix(cfg.prefix, "/") {
		cfg.prefix += "/"
	}
	c, err := cfg.client(log)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &BackupService{log: log, src: src, workDir: filepath.Dir(dataPath), s3: c, prefix: cfg.prefix,
		interval: cfg.interval, keep: cfg.keep, retryMin: 10 * time.Second, retryMax: 5 * time.Minute, now: time.Now,
		slot: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
	s.removeLeftovers()
	return s, nil
}

func (s *BackupService) target() string { return "s3://" + s.s3.bucket + "/" + s.prefix }

// removeLeftovers deletes the work folders of backups a killed process
// left behind; only this package makes folders with that name.
func (s *BackupService) removeLeftovers() {
	old, _ := filepath.Glob(filepath.Join(s.workDir, ".queued-backup-*"))
	for _, p := range old {
		if err := os.RemoveAll(p); err == nil {
			s.log.Info("removed the work folder of an interrupted backup", "path", p)
		}
	}
}

// Start runs the schedule, when there is one, until Close.
func (s *BackupService) Start() {
	s.log.Info("S3 backups on", "target", s.target(), "interval", s.interval.String(), "keep", s.keep,
		"endpoint", s.s3.base.Host, "path_style", s.s3.pathStyle)
	if s.interval <= 0 {
		return
	}
	s.done = make(chan struct{})
	s.mu.Lock()
	s.scheduling = true
	s.mu.Unlock()
	go s.schedule()
}

// Close stops the schedule and waits for a backup in progress to give up;
// the server closes the database after this.
func (s *BackupService) Close() {
	s.closed.Do(func() {
		s.cancel()
		if s.done != nil {
			<-s.done
		}
		s.slot <- struct{}{} // taken for good: no backup starts after Close
	})
}

func (s *BackupService) schedule() {
	defer close(s.done)
	defer func() {
		s.mu.Lock()
		s.scheduling = false
		s.mu.Unlock()
	}()
	next := s.firstRun()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		s.mu.Lock()
		s.next = next
		s.mu.Unlock()
		timer.Reset(max(time.Until(next), 0))
		select {
		case <-s.ctx.Done():
			return
		case <-timer.C:
		}
		_, err := s.BackupNow(s.ctx)
		if s.ctx.Err() != nil {
			return
		}
		if err == nil {
			next = s.now().Add(s.interval)
			continue
		}
		s.mu.Lock()
		n := max(s.failures, 1) // an on-demand backup may have succeeded since
		s.mu.Unlock()
		wait := s.retryMin << min(n-1, 20)
		wait = min(wait, s.retryMax, s.interval)
		s.log.Warn("backup will be tried again", "in", wait.String(), "failures", n)
		next = s.now().Add(wait)
	}
}

// firstRun picks up the schedule where the bucket says it was: a server
// restarted more often than its interval still backs up, and one that was
// just backed up does not upload again at once.
func (s *BackupService) firstRun() time.Time {
	now := s.now()
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	list, err := listBackups(ctx, s.s3, s.prefix)
	if err != nil {
		s.log.Warn("cannot list existing backups; backing up now", "target", s.target(), "err", err)
		return now
	}
	if len(list) == 0 {
		return now
	}
	if due := list[0].Taken.Add(s.interval); due.After(now) {
		return due
	}
	return now
}

// tell announces a backup's progress to the live streams, when the server
// has them.
func (s *BackupService) tell(n *note) {
	if s.announce != nil {
		s.announce(n)
	}
}

// BackupNow takes one backup, waiting for one in progress to finish first.
func (s *BackupService) BackupNow(ctx context.Context) (backupResult, error) {
	select {
	case s.slot <- struct{}{}:
	case <-ctx.Done():
		return backupResult{}, ctx.Err()
	case <-s.ctx.Done():
		return backupResult{}, errors.New("server is shutting down")
	}
	defer func() { <-s.slot }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel) // shutdown ends an on-demand backup too
	defer stop()

	s.mu.Lock()
	s.running = true
	s.attempts++
	s.mu.Unlock()
	s.tell(newNote("storage:backup-started").str("bucket", s.s3.bucket))
	t0 := time.Now()
	res, err := s.backupOnce(ctx)
	took := time.Since(t0)
	if err != nil {
		s.tell(newNote("storage:backup-failed").str("bucket", s.s3.bucket).str("error", err.Error()))
	} else {
		s.tell(newNote("storage:backup-completed").str("bucket", s.s3.bucket).str("key", res.Key))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running = false
	s.lastTook = took
	if err != nil {
		if s.ctx.Err() != nil {
			err = fmt.Errorf("backup cancelled by shutdown: %w", err)
		}
		s.failures++
		s.failed++
		s.lastErr, s.errAt = err.Error(), s.now()
		s.log.Error("backup failed", "target", s.target(), "failures", s.failures, "err", err)
		return res, err
	}
	if s.failures > 0 {
		s.log.Info("backups recovered", "after_failures", s.failures)
	}
	s.failures, s.lastErr = 0, ""
	s.succeeded++
	s.okAt = s.now()
	s.last = &res
	s.log.Info("backup uploaded", "key", res.Key, "bytes", res.Bytes, "db_bytes", res.DBBytes,
		"took", res.Took.Round(time.Millisecond).String(), "snapshot", res.Snapshot.Round(time.Millisecond).String(),
		"compress", res.Compress.Round(time.Millisecond).String(), "upload", res.Upload.Round(time.Millisecond).String())
	return res, nil
}

func (s *BackupService) backupOnce(ctx context.Context) (backupResult, error) {
	start, t0 := s.now(), time.Now() // s.now is the clock of keys; durations are measured
	s.mu.Lock()
	keyAt := start.Truncate(time.Millisecond)
	if !keyAt.After(s.lastKeyAt) {
		keyAt = s.lastKeyAt.Add(time.Millisecond)
	}
	s.lastKeyAt = keyAt
	s.mu.Unlock()
	res := backupResult{At: start, Key: backupKey(s.prefix, keyAt)}
	dir, err := os.MkdirTemp(s.workDir, ".queued-backup-")
	if err != nil {
		return res, fmt.Errorf("backup work folder: %w", err)
	}
	defer os.RemoveAll(dir)
	snap := filepath.Join(dir, "queued.db")
	if err := s.src.Backup(ctx, snap); err != nil {
		return res, fmt.Errorf("snapshot: %w", err)
	}
	res.Snapshot = time.Since(t0)
	gz := snap + ".gz"
	var dbSum string
	res.DBBytes, dbSum, res.Bytes, res.SHA256, err = compressFile(snap, gz)
	if err != nil {
		return res, err
	}
	os.Remove(snap) // the disk holds one copy at a time
	res.Compress = time.Since(t0) - res.Snapshot
	meta := map[string]string{"Sha256": res.SHA256, "Db-Sha256": dbSum, "Db-Bytes": strconv.FormatInt(res.DBBytes, 10),
		"Queued-Version": version}
	up := time.Now()
	if err := s.s3.UploadFile(ctx, res.Key, gz, meta); err != nil {
		return res, fmt.Errorf("upload: %w", err)
	}
	res.Upload = time.Since(up)
	res.Took = time.Since(t0)
	s.prune(ctx)
	return res, nil
}

// compressFile gzips src into dst and returns both sizes and SHA-256s.
func compressFile(src, dst string) (rawN int64, rawSum string, gzN int64, gzSum string, err error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, "", 0, "", fmt.Errorf("compress: %w", err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return 0, "", 0, "", fmt.Errorf("compress: %w", err)
	}
	defer out.Close()
	rawH, gzH := sha256.New(), sha256.New()
	cw := &countWriter{w: io.MultiWriter(out, gzH)}
	// The fastest level: on a 1,000,000-job database it takes 0.9 s where
	// the default takes 2.3 s, for 13% more bytes (24.5 MB against 21.7 MB
	// from 275 MB). The CPU is shared with the queue; the bytes are cheap.
	zw, _ := gzip.NewWriterLevel(cw, gzip.BestSpeed)
	zw.Name = "queued.db"
	if rawN, err = io.Copy(zw, io.TeeReader(in, rawH)); err != nil {
		return 0, "", 0, "", fmt.Errorf("compress: %w", err)
	}
	if err := zw.Close(); err != nil {
		return 0, "", 0, "", fmt.Errorf("compress: %w", err)
	}
	if err := out.Close(); err != nil {
		return 0, "", 0, "", fmt.Errorf("compress: %w", err)
	}
	return rawN, hex.EncodeToString(rawH.Sum(nil)), cw.n, hex.EncodeToString(gzH.Sum(nil)), nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// prune deletes our backups beyond the newest keep. A failure here does
// not fail the backup that was just made; it is logged and shown in
// /health, and the next backup tries again.
func (s *BackupService) prune(ctx context.Context) {
	if s.keep <= 0 {
		return
	}
	err := func() error {
		list, err := listBackups(ctx, s.s3, s.prefix)
		if err != nil {
			return err
		}
		if len(list) <= s.keep {
			return nil
		}
		for _, b := range list[s.keep:] {
			if err := s.s3.DeleteObject(ctx, b.Key); err != nil {
				return fmt.Errorf("deleting old backup %s: %w", b.Key, err)
			}
			s.log.Info("old backup deleted", "key", b.Key, "keep", s.keep)
		}
		return nil
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.pruneErr = err.Error()
		s.log.Warn("retention: old backups not deleted", "err", err)
	} else {
		s.pruneErr = ""
	}
}

// health is the backup section of /health.
func (s *BackupService) health() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := map[string]any{"target": s.target(), "ok": s.failures == 0, "running": s.running,
		"intervalMs": s.interval.Milliseconds(), "keep": s.keep, "failures": s.failures}
	if s.last != nil {
		h["last"] = s.last.JSON()
	}
	if s.lastErr != "" {
		h["lastError"], h["lastErrorAt"] = s.lastErr, s.errAt.UnixMilli()
	}
	if s.pruneErr != "" {
		h["retentionError"] = s.pruneErr
	}
	if !s.next.IsZero() {
		h["nextAt"] = s.next.UnixMilli()
	}
	return h
}

// backupMetrics are the figures of the reference's backup telemetry, as
// Prometheus exports them.
type backupMetrics struct {
	enabled, schedulerRunning, inProgress bool
	interval                              time.Duration
	retention                             int
	attempts, successes, failures         int64
	// overlapRejections stays 0: the reference refuses a backup asked for
	// while one runs, BackupNow waits for it to end and then takes its own.
	overlapRejections        int64
	consecutiveFailures      int
	lastSuccess, lastFailure time.Time // zero: never
	lastDuration             time.Duration
	lastSizeBytes            int64 // compressed, of the last success
}

// metrics reads the backup figures; a nil service (no bucket configured)
// has all of them at zero, as the reference reports a server without a
// backup manager.
func (s *BackupService) metrics() backupMetrics {
	if s == nil {
		return backupMetrics{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := backupMetrics{enabled: s.interval > 0, schedulerRunning: s.scheduling, inProgress: s.running,
		interval: s.interval, retention: s.keep, attempts: s.attempts, successes: s.succeeded, failures: s.failed,
		consecutiveFailures: s.failures, lastSuccess: s.okAt, lastFailure: s.errAt, lastDuration: s.lastTook}
	if s.last != nil {
		m.lastSizeBytes = s.last.Bytes
	}
	return m
}

// serveBackupNow is POST /backup/s3: a backup now, answered when uploaded.
// s may be nil (no bucket configured).
func (s *BackupService) serveBackupNow(srv *Server) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !srv.httpAuthorized(r) {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"ok": false, "error": "missing or invalid bearer token"})
			return
		}
		if s == nil {
			writeJSON(w, http.StatusConflict, map[string]any{"ok": false, "error": "S3 backups are not configured: start queued with --s3-bucket (S3_BUCKET) and credentials"})
			return
		}
		// A client that hangs up does not cancel the backup it asked for
		// (nor count as a failure); shutdown still does.
		res, err := s.BackupNow(context.WithoutCancel(r.Context()))
		if err != nil {
			writeJSON(w, http.StatusBadGateway, map[string]any{"ok": false, "error": err.Error()})
			return
		}
		out := res.JSON()
		out["ok"] = true
		out["url"] = "s3://" + s.s3.bucket + "/" + res.Key
		writeJSON(w, http.StatusOK, out)
	}
}

// ---------------------------------------------------------------------------
// Restore

// restoreReport says what a restore wrote.
type restoreReport struct {
	Key     string
	Bytes   int64 // downloaded
	DBBytes int64
	Jobs    int64
}

// restoreBackup downloads s3://bucket/key into dst, which must not exist:
// restoring over a database in use (or over anything) is refused. The
// object's SHA-256 and the database's are checked against the metadata
// written at backup time, and SQLite checks the file, before it is moved
// into place. A key that is empty or ends in '/' means the newest backup
// under that prefix.
func restoreBackup(ctx context.Context, c *S3Client, key, dst string) (restoreReport, error) {
	rep := restoreReport{Key: key}
	for _, p := range []string{dst, dst + "-wal", dst + "-shm", dst + "-journal"} {
		if _, err := os.Lstat(p); err == nil {
			return rep, fmt.Errorf("%s exists; restore into a new path (a server may be using it, and a restore never overwrites)", p)
		}
	}
	if key == "" || strings.HasSuffix(key, "/") {
		list, err := listBackups(ctx, c, key)
		if err != nil {
			return rep, err
		}
		if len(list) == 0 {
			return rep, fmt.Errorf("no backups under s3://%s/%s", c.bucket, key)
		}
		key = list[0].Key
		rep.Key = key
	}
	dir := filepath.Dir(dst)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return rep, fmt.Errorf("restore target folder: %w", err)
	}
	tmpPath, err := fetchBackup(ctx, c, key, dir, &rep)
	if tmpPath != "" {
		defer os.Remove(tmpPath)
	}
	if err != nil {
		return rep, err
	}
	if rep.Jobs, err = checkDatabase(ctx, tmpPath); err != nil {
		return rep, fmt.Errorf("s3://%s/%s: %w; nothing restored", c.bucket, key, err)
	}
	// A link fails if dst appeared meanwhile: never overwrite.
	if err := os.Link(tmpPath, dst); err != nil {
		return rep, fmt.Errorf("restore: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return rep, nil
}

// fetchBackup downloads s3://bucket/key, unzipped, into a new temporary
// file in dir, and checks the object's and the database's SHA-256 against
// the metadata written at backup time. It answers the file's path (the
// caller removes it) once the file is made, and counts the bytes in rep.
func fetchBackup(ctx context.Context, c *S3Client, key, dir string, rep *restoreReport) (string, error) {
	body, hdr, err := c.GetObject(ctx, key)
	if err != nil {
		return "", fmt.Errorf("downloading the backup: %w", err)
	}
	defer body.Close()
	wantGz, wantDB := hdr.Get("X-Amz-Meta-Sha256"), hdr.Get("X-Amz-Meta-Db-Sha256")
	if len(wantGz) != 64 || len(wantDB) != 64 {
		return "", fmt.Errorf("s3://%s/%s has no checksum metadata; it is not a backup made by queued", c.bucket, key)
	}
	tmp, err := os.CreateTemp(dir, ".queued-restore-*")
	if err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	tmpPath := tmp.Name()
	gzH, dbH := sha256.New(), sha256.New()
	cr := &countReader{r: io.TeeReader(body, gzH)}
	zr, err := gzip.NewReader(cr)
	if err != nil {
		tmp.Close()
		return tmpPath, fmt.Errorf("s3://%s/%s is not gzip data: %w", c.bucket, key, err)
	}
	rep.DBBytes, err = io.Copy(io.MultiWriter(tmp, dbH), zr)
	// The rest of the object (anything after the gzip stream, or all that
	// follows a damaged block) goes through the checksum too, so that a
	// damaged object is reported as such rather than as bad gzip data.
	_, derr := io.Copy(io.Discard, cr)
	mismatch := derr == nil && hex.EncodeToString(gzH.Sum(nil)) != wantGz
	if err == nil {
		err = derr
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	rep.Bytes = cr.n
	if mismatch {
		return tmpPath, fmt.Errorf("s3://%s/%s: checksum mismatch (object sha256 %x, recorded %s): the object is damaged; nothing restored",
			c.bucket, key, gzH.Sum(nil), wantGz)
	}
	if err != nil {
		return tmpPath, fmt.Errorf("downloading s3://%s/%s: %w", c.bucket, key, err)
	}
	if got := hex.EncodeToString(dbH.Sum(nil)); got != wantDB {
		return tmpPath, fmt.Errorf("s3://%s/%s: database checksum mismatch (%s, recorded %s); nothing restored", c.bucket, key, got, wantDB)
	}
	return tmpPath, nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

// checkDatabase asks SQLite to check a restored file and counts its jobs.
func checkDatabase(ctx context.Context, path string) (int64, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var res string
	if err := db.QueryRowContext(ctx, `PRAGMA quick_check`).Scan(&res); err != nil {
		return 0, fmt.Errorf("not a readable SQLite database: %w", err)
	}
	if res != "ok" {
		return 0, fmt.Errorf("SQLite integrity check: %s", res)
	}
	var n int64
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM jobs`).Scan(&n); err != nil {
		return 0, fmt.Errorf("not a queued database: %w", err)
	}
	return n, nil
}
