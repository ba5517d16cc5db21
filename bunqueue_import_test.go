package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestMigrateFromBunqueue makes real bunqueue data with the reference
// server (bunqueue 2.9.5 from the compat packages), in each of its storage
// modes, and brings it into queued's, in each of queued's: what the
// official client and the HTTP API see of the data on queued (counts per
// queue and state, each job with its fields, results and logs, the DLQ,
// schedules, queue settings, unique keys) must be what they see on the
// reference restarted on its own data; then a worker finishes the
// migrated work, flows included. The source is left as it was.
func TestMigrateFromBunqueue(t *testing.T) {
	dir, bun := compatDir(t)
	for _, from := range []string{"sqlite", "postgres"} {
		t.Run("from-"+from, func(t *testing.T) {
			tmp := t.TempDir()
			ids := filepath.Join(tmp, "ids.json")
			var refArgs, refEnv, migrateFrom []string
			var srcFile string
			switch from {
			case "sqlite":
				srcFile = filepath.Join(tmp, "bunqueue.db")
				refArgs = []string{"--data-path", srcFile}
				migrateFrom = []string{"--from-bunqueue", srcFile}
			case "postgres":
				url, ns := bunqueueRefDB(t)
				refEnv = []string{"BUNQUEUE_STORAGE_DRIVER=postgres", "BUNQUEUE_POSTGRES_URL=" + url, "BUNQUEUE_POSTGRES_NAMESPACE=" + ns}
				migrateFrom = []string{"--from-bunqueue", url, "--from-namespace", ns}
			}
			// Every kind of state, one job held by a worker when the
			// reference is killed; then the reference's own view of its
			// data after a restart.
			ref := startBunqueue(t, dir, refArgs, refEnv)
			makeBunqueueData(t, dir, bun, ref, ids)
			ref.kill()
			ref = startBunqueue(t, dir, refArgs, refEnv)
			want := dataSnapshot(t, dir, bun, ref.tcp, ref.http, ids)
			ref.stop(t)

			var sum [32]byte
			if srcFile != "" {
				sum = fileSum(t, srcFile)
				refuseBunqueueFileAtStart(t, srcFile)
				refuseWhatCannotComeAcross(t, srcFile)
			} else {
				refuseBunqueueTablesAtStart(t, strings.TrimPrefix(refEnv[1], "BUNQUEUE_POSTGRES_URL="))
			}
			for _, to := range []string{"sqlite", "postgres"} {
				t.Run("to-"+to, func(t *testing.T) {
					var target []string
					switch to {
					case "sqlite":
						target = []string{"--data-path", filepath.Join(t.TempDir(), "queued.db")}
					case "postgres":
						target = []string{"--postgres-url", testPGURL(), "--postgres-namespace", pgTestNamespace(t)}
					}
					var out, errs bytes.Buffer
					if code := runMigrate(append(migrateFrom, target...), &out, &errs); code != 0 {
						t.Fatalf("queued migrate exited with %d:\n%s%s", code, out.String(), errs.String())
					}
					t.Logf("queued migrate:\n%s", out.String())
					srv := startBinary(t, target...)
					got := dataSnapshot(t, dir, bun, srv.tcpPort, srv.httpPort, ids)
					compareSnapshots(t, want, got)
					runDataScript(t, dir, bun, "finish", srv.tcpPort, srv.httpPort, ids)
				})
			}
			if srcFile != "" && fileSum(t, srcFile) != sum {
				t.Error("the bunqueue data file changed during the migrations")
			}
		})
	}
}

// compareSnapshots fails on each difference between what the client saw of
// the reference and of queued. Two things move with the clock between the
// two looks and are compared for what does not: the job that was active
// when the reference was killed (waiting or delayed by the reference's
// recovery, depending on when one looks; in its PostgreSQL mode still
// active until its lease runs out), and fractions of a millisecond
// the reference keeps in run times.
func compareSnapshots(t *testing.T, want, got map[string]any) {
	t.Helper()
	for _, s := range []map[string]any{want, got} {
		if a, ok := s["jobs"].(map[string]any)["active"].(map[string]any); ok {
			delete(a, "state")
			delete(a, "delay")
		}
		for _, counts := range []any{s["counts"], s["http"].(map[string]any)["counts"]} {
			c, _ := counts.(map[string]any)["mig-active"].(map[string]any)
			if inner, ok := c["counts"].(map[string]any); ok {
				c = inner // the HTTP API's answer wraps them
			}
			if c != nil {
				c["waiting"] = jsonNum(c["waiting"]) + jsonNum(c["delayed"]) + jsonNum(c["active"])
				c["delayed"], c["active"] = 0.0, 0.0
			}
		}
	}
	var diffs []string
	snapDiff("", roundNums(want), roundNums(got), &diffs)
	for _, d := range diffs {
		t.Error(d)
	}
	if len(diffs) == 0 {
		t.Logf("the client and the HTTP API see the migrated data as on the reference (%d jobs compared)", len(want["jobs"].(map[string]any)))
	}
}

func jsonNum(v any) float64 {
	f, _ := v.(float64)
	return f
}

// roundNums rounds every number to a whole millisecond.
func roundNums(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = roundNums(e)
		}
	case []any:
		for i, e := range x {
			x[i] = roundNums(e)
		}
	case float64:
		return math.Trunc(x)
	}
	return v
}

func snapDiff(path string, want, got any, out *[]string) {
	wm, ok1 := want.(map[string]any)
	gm, ok2 := got.(map[string]any)
	if ok1 && ok2 {
		keys := map[string]bool{}
		for k := range wm {
			keys[k] = true
		}
		for k := range gm {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			snapDiff(path+"."+k, wm[k], gm[k], out)
		}
		return
	}
	if !reflect.DeepEqual(want, got) {
		w, _ := json.Marshal(want)
		g, _ := json.Marshal(got)
		*out = append(*out, fmt.Sprintf("%s: reference %s, queued %s", path, w, g))
	}
}

// bunqueueRef is a reference server started for a test.
type bunqueueRef struct {
	cmd       *exec.Cmd
	tcp, http int
	log       *bytes.Buffer
	mu        sync.Mutex
	done      chan struct{}
}

// startBunqueue starts the reference server (`bunqueue start`) on free
// ports and waits until it answers.
func startBunqueue(t *testing.T, dir string, args, env []string) *bunqueueRef {
	t.Helper()
	bin := filepath.Join(dir, "node_modules", ".bin")
	r := &bunqueueRef{tcp: freePort(t), http: freePort(t), log: &bytes.Buffer{}, done: make(chan struct{})}
	cmd := exec.Command(filepath.Join(bin, "bunqueue"), append([]string{"start"}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), fmt.Sprintf("TCP_PORT=%d", r.tcp), fmt.Sprintf("HTTP_PORT=%d", r.http),
		"HOST=127.0.0.1", "LOG_LEVEL=warn",
		// Its PostgreSQL mode waits this long at a stop for the job the
		// killed server left active.
		"SHUTDOWN_TIMEOUT_MS=2000")
	cmd.Env = append(cmd.Env, env...)
	w := &lockedWriter{mu: &r.mu, w: r.log}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the reference server: %v", err)
	}
	r.cmd = cmd
	go func() { cmd.Wait(); close(r.done) }()
	t.Cleanup(r.kill)
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", r.tcp), time.Second)
		if err == nil {
			c.Close()
			return r
		}
		select {
		case <-r.done:
			t.Fatalf("the reference server exited at start:\n%s", r.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reference server did not listen within 60 s:\n%s", r.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *bunqueueRef) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.String()
}

// kill ends the reference at once, as a crash would.
func (r *bunqueueRef) kill() {
	select {
	case <-r.done:
		return
	default:
	}
	syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	<-r.done
}

// stop asks the reference to shut down and waits for it.
func (r *bunqueueRef) stop(t *testing.T) {
	syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(45 * time.Second):
		r.kill()
		t.Fatalf("the reference did not stop within 45 s of SIGTERM:\n%s", r.output())
	}
}

// makeBunqueueData runs the data script's make step against the reference
// and returns once the script says the data is there (it keeps one job
// active until it is ended).
func makeBunqueueData(t *testing.T, dir, bun string, ref *bunqueueRef, ids string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bun, "run", "bunqueue-data.ts", "make", ids)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), fmt.Sprintf("QUEUED_PORT=%d", ref.tcp), fmt.Sprintf("QUEUED_HTTP_PORT=%d", ref.http))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if sc.Text() == "ready" {
			return
		}
	}
	cmd.Wait()
	t.Fatalf("the data script did not finish making the data:\n%s\n--- reference log\n%s", stderr.String(), ref.output())
}

// dataSnapshot is what the data script's snapshot step prints.
func dataSnapshot(t *testing.T, dir, bun string, tcp, http int, ids string) map[string]any {
	t.Helper()
	out := runDataScript(t, dir, bun, "snapshot", tcp, http, ids)
	var snap map[string]any
	if err := json.Unmarshal(out, &snap); err != nil {
		t.Fatalf("snapshot: %v\n%s", err, out)
	}
	return snap
}

func runDataScript(t *testing.T, dir, bun, step string, tcp, http int, ids string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bun, "run", "bunqueue-data.ts", step, ids)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), fmt.Sprintf("QUEUED_PORT=%d", tcp), fmt.Sprintf("QUEUED_HTTP_PORT=%d", http))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bunqueue-data.ts %s: %v\n%s%s", step, err, out, stderr.String())
	}
	return out
}

// bunqueueRefDB is a database for the reference's PostgreSQL mode (its
// tables go in the public schema: a database of their own keeps them out
// of the tests' one) and a namespace no other run uses, emptied at the end.
func bunqueueRefDB(t *testing.T) (url, ns string) {
	t.Helper()
	needPG(t)
	ctx, conn := pgTestConn(t)
	const db = "queued_test_bunqueue"
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || (pe.Code != "42P04" && pe.Code != "23505") {
			t.Fatalf("create the reference's database: %v", err)
		}
	}
	cfg, err := pgx.ParseConfig(testPGURL())
	if err != nil {
		t.Fatal(err)
	}
	url = strings.Replace(testPGURL(), "/"+cfg.Database, "/"+db, 1)
	ns = "mig" + strings.ToLower(pgTestNamespace(t))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		rows, err := c.Query(ctx, `SELECT table_name FROM information_schema.columns WHERE column_name = 'namespace' AND table_schema = 'public' AND table_name LIKE 'bunqueue\_%'`)
		if err != nil {
			return
		}
		tables, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, tb := range tables {
			c.Exec(ctx, "DELETE FROM "+pgx.Identifier{tb}.Sanitize()+" WHERE namespace = $1", ns)
		}
	})
	return url, ns
}

// refuseBunqueueFileAtStart: queued serve on a bunqueue data file refuses,
// names the command to run, and leaves the file alone.
func refuseBunqueueFileAtStart(t *testing.T, file string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, queuedBinary(t), "serve", "--data-path", file, "--host", "127.0.0.1", "--tcp-port", "0",
		"--http-port", fmt.Sprint(freePort(t)))
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("queued serve started on a bunqueue data file:\n%s", out)
	}
	if !strings.Contains(string(out), "queued migrate --from-bunqueue "+file) {
		t.Fatalf("queued serve on a bunqueue data file did not name the migration:\n%s", out)
	}
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// refuseBunqueueTablesAtStart: queued serve on a database that holds only
// bunqueue's tables refuses and names the migration.
func refuseBunqueueTablesAtStart(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, queuedBinary(t), "serve", "--postgres-url", url, "--postgres-namespace", "never_made",
		"--host", "127.0.0.1", "--tcp-port", "0", "--http-port", fmt.Sprint(freePort(t)))
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "queued migrate --from-bunqueue") {
		t.Fatalf("queued serve on a database of bunqueue tables did not refuse, naming the migration (%v):\n%s", err, out)
	}
}

// refuseWhatCannotComeAcross: a source with a job queued cannot take, or a
// schema version it does not know, is refused with what and why, and
// nothing is written.
func refuseWhatCannotComeAcross(t *testing.T, src string) {
	t.Helper()
	for _, c := range []struct{ name, change, want string }{
		{"priority", `UPDATE jobs SET priority = 5000000 WHERE name = 'plain'`, "priority must be at most 1000000"},
		{"version", `UPDATE migrations SET version = 99`, "schema version 99; queued reads version 37"},
	} {
		dir := t.TempDir()
		bad := filepath.Join(dir, "bad.db")
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bad, b, 0o600); err != nil {
			t.Fatal(err)
		}
		db, err := sql.Open("sqlite", bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(c.change); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		db.Close()
		target := filepath.Join(dir, "queued.db")
		var out, errs bytes.Buffer
		code := runMigrate([]string{"--from-bunqueue", bad, "--data-path", target}, &out, &errs)
		if code != 1 || !strings.Contains(out.String()+errs.String(), c.want) {
			t.Errorf("%s: exit %d, want 1 and %q:\n%s%s", c.name, code, c.want, out.String(), errs.String())
		}
		if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: a refused migration left %s (%v)", c.name, target, err)
		}
		t.Logf("%s refused: %s", c.name, strings.TrimSpace(errs.String()))
	}
}
