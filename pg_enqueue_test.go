package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's "pgx" driver
)

// enqueueTx runs fn in a transaction of the application's (conn), and
// commits it when commit is true, else rolls it back.
func enqueueTx(t *testing.T, ctx context.Context, conn *pgx.Conn, commit bool, fn func(tx pgx.Tx)) {
	t.Helper()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fn(tx)
	if commit {
		err = tx.Commit(ctx)
	} else {
		err = tx.Rollback(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// enqueueBroker makes a namespace with a broker on it and answers the
// namespace, a client of the broker and the application's connection.
func enqueueBroker(t *testing.T) (string, *tclient, context.Context, *pgx.Conn) {
	t.Helper()
	ns := pgTestNamespace(t)
	srv := startPGBroker(t, ns)
	// Long enough for the refusals' forty cases and pushes of 10 MB on a
	// loaded machine (30 s once ran out).
	ctx, conn := pgTestConnWithin(t, 2*time.Minute)
	return ns, dial(t, srv.addr()), ctx, conn
}

// sqlPush calls the namespace's push function in tx and answers the id.
func sqlPush(t *testing.T, ctx context.Context, tx pgx.Tx, ns, queue, name, data, options string) string {
	t.Helper()
	var id string
	if err := tx.QueryRow(ctx, `SELECT queued_`+ns+`.push($1, $2, $3::jsonb, $4::jsonb)`, queue, name, data, options).Scan(&id); err != nil {
		t.Fatalf("push(%s, %s, %s): %v", queue, data, options, err)
	}
	return id
}

// A job pushed with the SQL function inside the application's
// transaction: gone with a rollback; not there for a pull before the
// commit and pulled right after it, with the id the function answered,
// its name, data and options; a custom id or unique key pushed again
// while its job is unfinished answers that job; push_many answers its
// jobs' ids in order.
func TestPGEnqueueInTransaction(t *testing.T) {
	t.Parallel()
	ns, c, ctx, conn := enqueueBroker(t)
	q := "in-tx"

	enqueueTx(t, ctx, conn, false, func(tx pgx.Tx) {
		sqlPush(t, ctx, tx, ns, q, "gone", `{"a": 0}`, `{}`)
	})
	var id string
	enqueueTx(t, ctx, conn, true, func(tx pgx.Tx) {
		id = sqlPush(t, ctx, tx, ns, q, "welcome", `{"user": 42}`, `{"priority": 7, "maxAttempts": 5}`)
		// Before the commit no pull sees it.
		if a := c.ok(M{"cmd": "PULL", "queue": q, "timeout": 300}); a["job"] != nil {
			t.Fatalf("a pull before the commit took %v", a["job"])
		}
	})
	// A new id is a UUIDv7 of now, as a broker gives one.
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$`).MatchString(id) {
		t.Fatalf("push() made the id %q, not a UUIDv7", id)
	}
	if ms, _ := strconv.ParseInt(strings.ReplaceAll(id, "-", "")[:12], 16, 64); time.Since(time.UnixMilli(ms)).Abs() > time.Minute {
		t.Errorf("the id %s holds the time %v", id, time.UnixMilli(ms))
	}
	a := c.ok(M{"cmd": "PULL", "queue": q, "owner": "w", "timeout": 10000})
	job, _ := a["job"].(M)
	if job == nil || job["id"] != id || job["name"] != "welcome" || num(t, job["priority"]) != 7 || num(t, job["maxAttempts"]) != 5 ||
		jsonOf(t, job["data"]) != `{"user":42}` {
		t.Fatalf("pulled after the commit: %v, want job %s", a, id)
	}
	c.ok(M{"cmd": "ACK", "id": id, "token": a["token"]})
	if n := countsOf(t, c, q); num(t, n["completed"]) != 1 || num(t, n["waiting"]) != 0 {
		t.Fatalf("counts after the rolled back push and the committed one: %v", n)
	}

	// The same custom id, and the same unique key, while the job waits.
	var first, again, keyed, keyedAgain string
	enqueueTx(t, ctx, conn, true, func(tx pgx.Tx) {
		first = sqlPush(t, ctx, tx, ns, q, "c", `1`, `{"jobId": "order-1"}`)
		again = sqlPush(t, ctx, tx, ns, q, "c", `2`, `{"jobId": "order-1"}`)
		keyed = sqlPush(t, ctx, tx, ns, q, "k", `3`, `{"uniqueKey": "k-1"}`)
	})
	enqueueTx(t, ctx, conn, true, func(tx pgx.Tx) {
		waitState(t, c, "order-1", "waiting", 10*time.Second)
		waitState(t, c, keyed, "waiting", 10*time.Second)
		if id := sqlPush(t, ctx, tx, ns, q, "c", `4`, `{"jobId": "order-1"}`); id != "order-1" {
			t.Errorf("a third push of custom id order-1 answered %s", id)
		}
		keyedAgain = sqlPush(t, ctx, tx, ns, q, "k", `5`, `{"uniqueKey": "k-1"}`)
	})
	if first != "order-1" || again != "order-1" || keyedAgain != keyed {
		t.Fatalf("custom id pushed twice: %s, %s; unique key twice: %s, %s", first, again, keyed, keyedAgain)
	}
	if n := countsOf(t, c, q); num(t, n["waiting"]) != 2 {
		t.Fatalf("after pushes of one custom id and one unique key, several times each: %v", n)
	}
	if d := sub(t, c.ok(M{"cmd": "GetJob", "id": "order-1"}), "job")["data"]; jsonOf(t, d) != "1" {
		t.Fatalf("the job of custom id order-1 holds %v, want the first push's data", d)
	}

	// push_many.
	var ids []string
	enqueueTx(t, ctx, conn, true, func(tx pgx.Tx) {
		if err := tx.QueryRow(ctx, `SELECT queued_`+ns+`.push_many($1, $2::jsonb)`, "many",
			`[{"name": "a", "data": 1}, {"name": "b", "data": 2, "options": {"delay": 0}}, {"name": "c"}]`).Scan(&ids); err != nil {
			t.Fatal(err)
		}
	})
	if len(ids) != 3 {
		t.Fatalf("push_many answered %v", ids)
	}
	for i, want := range ids {
		got, tok := pullOwned(t, c, "many", M{"timeout": 10000})
		if got != want {
			t.Fatalf("pull %d of push_many's jobs: %s, want %s (ids %v)", i, got, want, ids)
		}
		c.ok(M{"cmd": "ACK", "id": got, "token": tok})
	}
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM queued_`+ns+`.inbox`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("the inbox holds %d rows once every job is in (%v)", left, err)
	}

	// A request the broker refuses all the same (written here past the
	// function's checks) keeps its row with the reason; the rows around
	// it go in.
	enqueueTx(t, ctx, conn, true, func(tx pgx.Tx) {
		for i, req := range []string{`{"name": "ok", "data": 1}`, `{"name": "bad", "priority": "x"}`, `{"name": "ok", "data": 2}`} {
			if _, err := tx.Exec(ctx, `INSERT INTO queued_`+ns+`.inbox (id, queue, at, size, request) VALUES ($1, 'raw', (extract(epoch FROM clock_timestamp()) * 1000)::bigint, 0, $2::jsonb)`,
				fmt.Sprintf("raw-%d", i), req); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.Exec(ctx, `SELECT pg_notify('queued_`+ns+`_inbox', 'raw')`); err != nil {
			t.Fatal(err)
		}
	})
	for _, id := range []string{"raw-0", "raw-2"} {
		waitState(t, c, id, "waiting", 10*time.Second)
	}
	var refusal string
	if err := conn.QueryRow(ctx, `SELECT id || ': ' || error FROM queued_`+ns+`.inbox`).Scan(&refusal); err != nil || refusal != "raw-1: priority must be a number" {
		t.Fatalf("the refused request's row: %q (%v)", refusal, err)
	}
}

// Every option the function checks is refused with PUSH's own words,
// prefixed "queued push: "; the options a transaction cannot take are
// refused naming them; nothing is written.
func TestPGEnqueueRefusals(t *testing.T) {
	t.Parallel()
	ns, c, ctx, conn := enqueueBroker(t)
	for _, tc := range []struct {
		options string
		want    string // "": PUSH's answer to the same fields
	}{
		{`{"priority": "high"}`, ""},
		{`{"priority": 1.5}`, ""},
		{`{"priority": 1000001}`, ""},
		{`{"priority": -1000001}`, ""},
		{`{"delay": -1}`, ""},
		{`{"delay": 31536000001}`, ""},
		{`{"delay": 1e400}`, "delay must be a finite number"},
		{`{"timeout": 86400001}`, ""},
		{`{"maxAttempts": 0}`, ""},
		{`{"maxAttempts": 1001}`, ""},
		{`{"maxAttempts": 2.5}`, ""},
		{`{"backoff": -1}`, ""},
		{`{"backoff": {"type": "linear", "delay": 10}}`, ""},
		{`{"backoff": {"type": "fixed"}}`, ""},
		{`{"backoff": {"type": "fixed", "delay": 86400001}}`, ""},
		{`{"backoff": {"type": "fixed", "delay": 1, "maxDelay": -1}}`, ""},
		{`{"ttl": -5}`, ""},
		{`{"groupId": ""}`, ""},
		{`{"groupId": 7}`, ""},
		{`{"groupId": "` + strings.Repeat("g", 257) + `"}`, ""},
		{`{"groupId": "g", "priority": -1}`, ""},
		{`{"jobId": 7}`, ""},
		{`{"uniqueKey": "` + strings.Repeat("k", 1025) + `"}`, ""},
		{`{"tags": "x"}`, ""},
		{`{"tags": ["` + strings.Repeat("t", 1025) + `"]}`, ""},
		{`{"groupId": null}`, ""},
		{`{"stallTimeout": "x"}`, ""},
		{`{"keepLogs": 1e16}`, ""},
		{`{"sizeLimit": -1e16}`, ""},
		{`{"stackTraceLimit": true}`, ""},
		{`{"timestamp": "now"}`, ""},
		{`{"tags": ["a", 2]}`, ""},
		{`{"groupId": "g", "priority": "x"}`, ""},
		{`{"groupId": "g", "priority": 0.5}`, ""},
		{`{"groupId": "g", "priority": 2097152}`, ""},
		{`{"dependsOn": ["a"]}`, "option dependsOn is not taken in a transaction; push that job over the wire"},
		{`{"parentId": "p"}`, "option parentId is not taken in a transaction; push that job over the wire"},
		{`{"repeat": {"every": 1000}}`, "option repeat is not taken in a transaction; push that job over the wire"},
		{`{"dedup": {"id": "d"}}`, "option dedup is not taken in a transaction; push that job over the wire"},
		{`{"nope": 1}`, "unknown option nope"},
		{`[]`, "options must be a JSON object"},
	} {
		want := tc.want
		if want == "" {
			var fields map[string]any
			if err := json.Unmarshal([]byte(tc.options), &fields); err != nil {
				t.Fatal(err)
			}
			fields["cmd"], fields["queue"], fields["data"] = "PUSH", "refused", 1
			want = c.fail(fields)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var id string
		err = tx.QueryRow(ctx, `SELECT queued_`+ns+`.push('refused', 'n', '1', $1::jsonb)`, tc.options).Scan(&id)
		tx.Rollback(ctx)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Message != "queued push: "+want {
			t.Errorf("push with %s: %v, want %q", tc.options, err, "queued push: "+want)
		}
	}
	for _, q := range []string{"", "bad queue", strings.Repeat("q", 257)} {
		want := "queued push: " + c.fail(M{"cmd": "PUSH", "queue": q, "data": 1})
		_, err := conn.Exec(ctx, `SELECT queued_`+ns+`.push($1, 'n', '1', '{}')`, q)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Message != want {
			t.Errorf("push to queue %q: %v, want %q", q, err, want)
		}
	}
	// Data whose MessagePack passes 10 MB while its JSON text does not:
	// refused here, not by the broker after the commit.
	floats := "[" + strings.Repeat("0.5,", 1_500_000) + "0.5]"
	if _, err := conn.Exec(ctx, `SELECT queued_`+ns+`.push('refused', 'n', $1::jsonb, '{}')`, floats); err == nil ||
		!strings.Contains(err.Error(), "Job data too large (max 10MB)") {
		t.Errorf("push of 1.5 million doubles (6 MB of JSON, 13.5 MB of MessagePack): %v", err)
	}
	var big strings.Builder
	big.WriteString(`"`)
	big.WriteString(strings.Repeat("x", maxDataBytes))
	big.WriteString(`"`)
	if _, err := conn.Exec(ctx, `SELECT queued_`+ns+`.push('refused', 'n', $1::jsonb, '{}')`, big.String()); err == nil ||
		!strings.Contains(err.Error(), "Job data too large (max 10MB)") {
		t.Errorf("push of data over 10 MB: %v", err)
	}
	if _, err := conn.Exec(ctx, `SELECT queued_`+ns+`.push_many('refused', '[{"name": "a"}, {"name": "b", "options": {"delay": -1}}]')`); err == nil ||
		!strings.Contains(err.Error(), "queued push: jobs[1]: delay must be at least 0") {
		t.Errorf("push_many with a bad second job: %v", err)
	}
	var rows int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM queued_`+ns+`.inbox`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("the inbox holds %d rows after refusals (%v)", rows, err)
	}
}

// A job pushed while no broker runs is served once one starts; a role
// granted only what docs/postgresql.md says may push and may not read
// the jobs.
func TestPGEnqueueWithoutBroker(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	schema := "queued_" + ns
	first := startPGBroker(t, ns) // makes the namespace
	first.stop(t)
	ctx, conn := pgTestConn(t)
	role := "enqueue_" + ns
	for _, sql := range []string{
		`CREATE ROLE ` + role + ` NOLOGIN`,
		`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + role,
		`GRANT EXECUTE ON FUNCTION ` + schema + `.push(text, text, jsonb, jsonb), ` + schema + `.push_many(text, jsonb) TO ` + role,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, testPGURL()); err == nil {
			c.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
			c.Exec(ctx, `DROP ROLE IF EXISTS `+role)
			c.Close(ctx)
		}
	})
	var id string
	enqueueTx(t, ctx, conn, true, func(tx pgx.Tx) {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+role); err != nil {
			t.Fatal(err)
		}
		id = sqlPush(t, ctx, tx, ns, "later", "n", `{"v": 1}`, `{}`)
	})
	enqueueTx(t, ctx, conn, false, func(tx pgx.Tx) {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+role); err != nil {
			t.Fatal(err)
		}
		_, err := tx.Exec(ctx, `SELECT count(*) FROM `+schema+`.jobs`)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Fatalf("the enqueue role read the jobs table: %v", err)
		}
	})
	// push_one runs as the role that calls it (push() calls it as the
	// owner): the enqueue role may not call it past push()'s checks.
	enqueueTx(t, ctx, conn, false, func(tx pgx.Tx) {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+role); err != nil {
			t.Fatal(err)
		}
		_, err := tx.Exec(ctx, `SELECT `+schema+`.push_one('later', 'n', '{}', '{}', '')`)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Fatalf("the enqueue role called push_one: %v", err)
		}
	})
	srv := startPGBroker(t, ns)
	c := dial(t, srv.addr())
	got, _ := pullOwned(t, c, "later", M{"timeout": 10000})
	if got != id {
		t.Fatalf("pulled %s, want %s, pushed while no broker ran", got, id)
	}
}

// TestMeasurePGEnqueueInTx measures transactional pushes as riverbench's
// inserttx workload measures River's InsertTx: 8 goroutines, each in a
// loop of application transactions that insert a row of their own and
// push one job, for 10 s; a broker runs, moving the jobs in. It reports
// the pushes a second and how long the broker took to move them all.
// QUEUED_MEASURE=1 runs it (docs/postgresql.md).
//
// Serial: a measurement, which other tests on the same cores would change.
func TestMeasurePGEnqueueInTx(t *testing.T) {
	if os.Getenv("QUEUED_MEASURE") != "1" {
		t.Skip("a measurement; QUEUED_MEASURE=1 runs it")
	}
	ns := pgTestNamespace(t)
	srv := startPGBroker(t, ns)
	c := dial(t, srv.addr())
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testPGURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE queued_`+ns+`.app_rows (n int)`); err != nil {
		t.Fatal(err)
	}
	push := `SELECT queued_` + ns + `.push('bench', 'n', '{"num": 1}', '{}')`
	if os.Getenv("QUEUED_MEASURE_NO_BROKER") == "1" {
		// The function's own cost, as riverbench measures InsertTx with
		// no River client working.
		srv.stop(t)
	}
	var pushed, failed atomic.Int64
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	began := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for dctx.Err() == nil {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO queued_`+ns+`.app_rows (n) VALUES (1)`); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, push)
					return err
				})
				if err != nil {
					failed.Add(1)
					continue
				}
				pushed.Add(1)
			}
		})
	}
	wg.Wait()
	took := time.Since(began)
	n := pushed.Load()
	if os.Getenv("QUEUED_MEASURE_NO_BROKER") == "1" {
		t.Logf("transactional pushes, 8 goroutines, no broker: %d in %v, %.0f a second, %d failed",
			pushed.Load(), took.Round(time.Millisecond), float64(pushed.Load())/took.Seconds(), failed.Load())
		return
	}
	eventually(t, 5*time.Minute, "every job moved in", func() (bool, string) {
		w := num(t, countsOf(t, c, "bench")["waiting"])
		return w >= float64(n), fmt.Sprint(w, " of ", n)
	})
	t.Logf("transactional pushes, 8 goroutines: %d in %v, %.0f a second, %d failed; all in jobs %v after the start",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(), failed.Load(), time.Since(began).Round(time.Millisecond))
}

// The Node example of docs/postgresql.md, run with node-postgres under
// bun (compat/enqueue-tx.ts): its committed order's job is pulled with
// its data and options, its rolled back one left nothing.
func TestPGEnqueueFromNode(t *testing.T) {
	t.Parallel()
	dir, bun := compatDir(t)
	ns, c, ctx, conn := enqueueBroker(t)
	cmd := exec.Command(bun, "run", "enqueue-tx.ts")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "QUEUED_PG_URL="+testPGURL(), "QUEUED_NS="+ns)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bun run enqueue-tx.ts: %v\n%s", err, out)
	}
	checkOrderJob(t, c, ctx, conn, ns, out)
}

// TestPGEnqueueFromPython runs the Python (psycopg 3) example of
// docs/postgresql.md, compat/enqueue-tx.py, as TestPGEnqueueFromNode runs
// the Node one.
func TestPGEnqueueFromPython(t *testing.T) {
	t.Parallel()
	python := ""
	// Debian's package installs psycopg for Debian's Python, which may
	// not be the first python3 on the PATH.
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(py, "-c", "import psycopg").Run() == nil {
			python = py
			break
		}
	}
	if python == "" {
		needService(t, "psycopg 3 (Python) not installed", "apt-get install -y python3-psycopg")
	}
	ns, c, ctx, conn := enqueueBroker(t)
	dir, _ := filepath.Abs("compat")
	cmd := exec.Command(python, "enqueue-tx.py")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "QUEUED_PG_URL="+testPGURL(), "QUEUED_NS="+ns)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s enqueue-tx.py: %v\n%s", python, err, out)
	}
	checkOrderJob(t, c, ctx, conn, ns, out)
}

// checkOrderJob checks what an example left: the job whose id it printed
// (out) pulled with its name, data and options, the committed order's row
// only, and no job for the order rolled back.
func checkOrderJob(t *testing.T, c *tclient, ctx context.Context, conn *pgx.Conn, ns string, out []byte) {
	t.Helper()
	id := strings.TrimSpace(string(out))
	a := c.ok(M{"cmd": "PULL", "queue": "emails", "owner": "w", "timeout": 10000})
	job, _ := a["job"].(M)
	if job == nil || job["id"] != id || job["name"] != "receipt" || jsonOf(t, job["data"]) != `{"order":42}` || num(t, job["maxAttempts"]) != 5 {
		t.Fatalf("pulled %v, want the job %q the script printed", a, id)
	}
	var orders string
	if err := conn.QueryRow(ctx, `SELECT string_agg(id::text, ',') FROM queued_`+ns+`.orders`).Scan(&orders); err != nil || orders != "42" {
		t.Fatalf("orders written: %q (%v), want the committed one only", orders, err)
	}
	if n := countsOf(t, c, "emails"); num(t, n["waiting"]) != 0 {
		t.Fatalf("after the pull, the rolled back order's job is there: %v", n)
	}
}

// TestPGEnqueueDatabaseSQL: the same through database/sql, with pgx's
// driver (docs/postgresql.md's example): the row and the job commit
// together, and a rolled back transaction leaves neither.
func TestPGEnqueueDatabaseSQL(t *testing.T) {
	t.Parallel()
	ns, c, ctx, _ := enqueueBroker(t)
	db, err := sql.Open("pgx", testPGURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE queued_`+ns+`.orders (id int PRIMARY KEY, total numeric)`); err != nil {
		t.Fatal(err)
	}
	order := func(id int, commit bool) string {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO queued_`+ns+`.orders (id, total) VALUES ($1, $2)`, id, 99.5); err != nil {
			t.Fatal(err)
		}
		var jobID string
		if err := tx.QueryRowContext(ctx, `SELECT queued_`+ns+`.push($1, $2, $3::jsonb, $4::jsonb)`,
			"emails", "receipt", fmt.Sprintf(`{"order": %d}`, id), `{"maxAttempts": 5}`).Scan(&jobID); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		return jobID
	}
	order(41, false)
	id := order(42, true)
	a := c.ok(M{"cmd": "PULL", "queue": "emails", "owner": "w", "timeout": 10000})
	job, _ := a["job"].(M)
	if job == nil || job["id"] != id || jsonOf(t, job["data"]) != `{"order":42}` || num(t, job["maxAttempts"]) != 5 {
		t.Fatalf("pulled %v, want job %s of order 42", a, id)
	}
	var orders int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM queued_`+ns+`.orders`).Scan(&orders); err != nil || orders != 1 {
		t.Fatalf("%d orders (%v), want the committed one", orders, err)
	}
	if n := countsOf(t, c, "emails"); num(t, n["waiting"])+num(t, n["active"]) != 1 {
		t.Fatalf("counts %v: the rolled back push left a job", n)
	}
}
