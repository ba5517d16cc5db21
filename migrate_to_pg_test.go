package main

// queued migrate against real processes: a SQLite server fills its data
// file through the protocol, is killed and stopped, the migration runs as a
// subprocess into a fresh namespace of the real PostgreSQL, and brokers in
// PostgreSQL mode then serve what it moved.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// execMigrate runs `queued migrate args...` with extra environment
// variables and answers its output and exit status.
func execMigrate(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(queuedBinary(t), append([]string{"migrate"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("queued migrate: %v", err)
		}
		code = ee.ExitCode()
	}
	return string(out), code
}

// pgJobCount counts a namespace's job rows, straight from the database.
func pgJobCount(t *testing.T, ns string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testPGURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, "SELECT count(*) FROM queued_"+ns+".jobs").Scan(&n)
	if err != nil && strings.Contains(err.Error(), "does not exist") {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func countsOf(t *testing.T, c *tclient, queue string) map[string]any {
	t.Helper()
	return sub(t, c.ok(map[string]any{"cmd": "GetJobCounts", "queue": queue}), "counts")
}

// TestMigrateSQLiteToPostgres moves jobs in every state PostgreSQL mode
// runs, logs, a cron schedule and queue settings, and has two brokers
// serve them.
func TestMigrateSQLiteToPostgres(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	path := filepath.Join(t.TempDir(), "queued.db")
	srv := startBinary(t, "--data-path", path)
	c := dial(t, srv.addr())
	const q = "mig"
	waiting := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": map[string]any{"k": "w"}, "jobId": "custom-w"}), "id")
	prio := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": "p", "priority": 5}), "id")
	// Retried once, then taken again: active with one attempt counted.
	active := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "act", "data": "a", "backoff": 1, "maxAttempts": 5}), "id")
	a1 := c.ok(map[string]any{"cmd": "PULL", "queue": "act", "owner": "w0"})
	c.ok(map[string]any{"cmd": "FAIL", "id": active, "token": a1["token"], "error": "first try"})
	eventually(t, 10*time.Second, "the retried job taken again", func() (bool, string) {
		a := c.ok(map[string]any{"cmd": "PULL", "queue": "act", "owner": "w0", "lockTtl": 600000})
		j, _ := a["job"].(map[string]any)
		return j != nil && j["id"] == active, fmt.Sprint(a)
	})
	done := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "fin", "data": "c"}), "id")
	c.ok(map[string]any{"cmd": "PULL", "queue": "fin"})
	c.ok(map[string]any{"cmd": "ACK", "id": done, "result": map[string]any{"done": true}})
	dead := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "fin", "data": "f", "maxAttempts": 1}), "id")
	c.ok(map[string]any{"cmd": "PULL", "queue": "fin"})
	c.ok(map[string]any{"cmd": "FAIL", "id": dead, "error": "broken"})
	c.ok(map[string]any{"cmd": "AddLog", "id": waiting, "message": "hello from sqlite"})
	for i := 0; i < 2; i++ {
		c.ok(map[string]any{"cmd": "PUSH", "queue": "held", "data": i})
	}
	c.ok(map[string]any{"cmd": "Pause", "queue": "held"})
	c.ok(map[string]any{"cmd": "SetConcurrency", "queue": "lim", "limit": 5})
	c.ok(map[string]any{"cmd": "RateLimit", "queue": "lim", "limit": 50})
	c.ok(map[string]any{"cmd": "Cron", "name": "tick", "queue": "ticks", "data": "t", "repeatEvery": 1000, "preventOverlap": false})
	c.ok(map[string]any{"cmd": "HandlerSet", "queue": "hooked", "url": "https://example.com/hook", "method": "POST"})
	// Long enough to be still ahead once the file has moved.
	delayed := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": "d", "delay": 12000}), "id")
	// A durable push is answered once everything before it is on disk.
	last := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": "last", "durable": true}), "id")
	srv.kill9(t)

	// Started again on the file it left (its lock went with it), and
	// while it runs the file is refused.
	srv2 := startBinary(t, "--data-path", path)
	c2 := dial(t, srv2.addr())
	out, code := execMigrate(t, nil, "--from", path, "--postgres-url", testPGURL(), "--postgres-namespace", ns)
	if code != 1 || !strings.Contains(out, "in use by a running queued server") {
		t.Fatalf("migrating a live file: exit %d\n%s", code, out)
	}
	if n := pgJobCount(t, ns); n != 0 {
		t.Fatalf("a refused migration left %d jobs", n)
	}
	// A second server on the same file is refused too.
	second := exec.Command(queuedBinary(t), "serve", "--host", "127.0.0.1", "--tcp-port", fmt.Sprint(freePort(t)),
		"--http-port", "-1", "--data-path", path)
	if o, err := second.CombinedOutput(); err == nil || !strings.Contains(string(o), "in use by a running queued server") {
		t.Fatalf("a second server on a live file: %v\n%s", err, o)
	}
	before := map[string]map[string]any{}
	for _, name := range []string{q, "act", "fin", "held", "lim"} {
		before[name] = countsOf(t, c2, name)
	}
	// The restarted server has the active job waiting again, as the
	// migration will; the file still says active.
	if n := num(t, before["act"]["waiting"]); n != 1 {
		t.Fatalf("counts after the restart: %v", before["act"])
	}
	runAt := num(t, sub(t, c2.ok(map[string]any{"cmd": "GetJob", "id": delayed}), "job")["runAt"])
	srv2.stop(t)

	out, code = execMigrate(t, nil, "--from", path, "--postgres-url", testPGURL(), "--postgres-namespace", ns)
	t.Logf("queued migrate:\n%s", out)
	if code != 0 || !strings.Contains(out, "the counts match") || !strings.Contains(out, "1 active jobs wait again") {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}

	b1, b2 := startPGBroker(t, ns), startPGBroker(t, ns)
	p1, p2 := dial(t, b1.addr()), dial(t, b2.addr())
	if st := str(t, p1.ok(map[string]any{"cmd": "GetState", "id": delayed}), "state"); st != "delayed" {
		t.Fatalf("the delayed job is %s after the migration (the test ran too slowly to check its time)", st)
	}
	for name, want := range before {
		got := countsOf(t, p2, name)
		for _, st := range []string{"waiting", "prioritized", "delayed", "active", "completed", "failed", "paused", "waiting-children"} {
			if num(t, got[st]) != num(t, want[st]) {
				t.Fatalf("queue %s: counts in PostgreSQL mode %v, on SQLite %v", name, got, want)
			}
		}
	}

	// The waiting jobs are served, the prioritized first; ACKs apply once.
	pulled := p1.ok(map[string]any{"cmd": "PULLB", "queue": q, "count": 10, "owner": "pg"})
	jobs := list(t, pulled, "jobs")
	var ids []any
	for _, j := range jobs {
		ids = append(ids, j.(map[string]any)["id"])
	}
	if len(ids) != 3 || ids[0] != prio || ids[1] != waiting || ids[2] != last {
		t.Fatalf("pulled %v, want %v", ids, []string{prio, waiting, last})
	}
	if d := jobs[1].(map[string]any)["data"].(map[string]any); d["k"] != "w" {
		t.Fatalf("data of the migrated job: %v", d)
	}
	ack := p2.ok(map[string]any{"cmd": "ACKB", "ids": ids, "tokens": pulled["tokens"]})
	if d, ok := ack["data"].(map[string]any); ok && len(d["ignoredIndices"].([]any)) > 0 {
		t.Fatalf("ACKB through the other broker: %v", ack)
	}
	if st := str(t, p1.ok(map[string]any{"cmd": "GetState", "id": waiting}), "state"); st != "completed" {
		t.Fatalf("the migrated waiting job after its ACK: %s", st)
	}
	// The job that was active waits again, its attempt kept.
	a := p2.ok(map[string]any{"cmd": "PULL", "queue": "act", "owner": "pg"})
	if j := a["job"].(map[string]any); j["id"] != active || num(t, j["attempts"]) != 1 {
		t.Fatalf("the job that was active: %v", j)
	}
	p2.ok(map[string]any{"cmd": "ACK", "id": active, "token": a["token"]})
	// The delayed job runs at its time, not before.
	id, ch := p2.send(map[string]any{"cmd": "PULL", "queue": q, "owner": "pg", "timeout": 30000})
	a = p2.await(id, ch, 40*time.Second)
	if j := a["job"].(map[string]any); j["id"] != delayed || float64(time.Now().UnixMilli()) < runAt {
		t.Fatalf("the delayed job (due at %v) pulled at %d: %v", runAt, time.Now().UnixMilli(), j)
	}
	p1.ok(map[string]any{"cmd": "ACK", "id": delayed, "token": a["token"]})
	// The completed job kept its result, the waiting job its log line.
	if r := p1.ok(map[string]any{"cmd": "GetResult", "id": done})["result"].(map[string]any); r["done"] != true {
		t.Fatalf("result of the completed job: %v", r)
	}
	logs := list(t, sub(t, p2.ok(map[string]any{"cmd": "GetLogs", "id": waiting}), "data"), "logs")
	if len(logs) != 1 || logs[0].(map[string]any)["message"] != "hello from sqlite" {
		t.Fatalf("logs: %v", logs)
	}
	// The dead-letter entry is there, and retried it runs.
	dl := list(t, p1.ok(map[string]any{"cmd": "Dlq", "queue": "fin"}), "jobs")
	if len(dl) != 1 || dl[0].(map[string]any)["id"] != dead {
		t.Fatalf("DLQ: %v", dl)
	}
	if n := num(t, p2.ok(map[string]any{"cmd": "RetryDlq", "queue": "fin"})["count"]); n != 1 {
		t.Fatalf("RetryDlq retried %v", n)
	}
	a = p1.ok(map[string]any{"cmd": "PULL", "queue": "fin", "owner": "pg"})
	if j, _ := a["job"].(map[string]any); j == nil || j["id"] != dead {
		t.Fatalf("after RetryDlq: %v", j)
	}
	p1.ok(map[string]any{"cmd": "ACK", "id": dead, "token": a["token"]})
	// The paused queue stays paused through both brokers.
	if p := p2.ok(map[string]any{"cmd": "IsPaused", "queue": "held"}); p["paused"] != true {
		t.Fatalf("IsPaused: %v", p)
	}
	if a := p1.ok(map[string]any{"cmd": "PULL", "queue": "held"}); a["job"] != nil {
		t.Fatalf("pulled from the paused queue: %v", a)
	}
	// The limits came along.
	lim := sub(t, sub(t, p1.ok(map[string]any{"cmd": "GetQueueLimits", "queue": "lim"}), "data"), "limits")
	if num(t, lim["concurrencyLimit"]) != 5 || num(t, sub(t, lim, "rateLimit")["max"]) != 50 {
		t.Fatalf("limits: %v", lim)
	}
	// The schedule fires through the brokers.
	if l := list(t, p2.ok(map[string]any{"cmd": "CronList"}), "crons"); len(l) != 1 || l[0].(map[string]any)["name"] != "tick" {
		t.Fatalf("CronList: %v", l)
	}
	// The URL handler is the namespace's: both brokers run it.
	for _, b := range []*tclient{p1, p2} {
		if l := list(t, b.ok(map[string]any{"cmd": "HandlerList"}), "handlers"); len(l) != 1 || l[0].(map[string]any)["queue"] != "hooked" {
			t.Fatalf("HandlerList: %v", l)
		}
	}
	ticks := num(t, countsOf(t, p1, "ticks")["waiting"])
	eventually(t, 15*time.Second, "the migrated schedule fired", func() (bool, string) {
		n := num(t, countsOf(t, p2, "ticks")["waiting"])
		return n >= ticks+2, fmt.Sprint(n, " ticks, ", ticks, " at the migration")
	})
	for _, name := range []string{q, "act"} {
		c := countsOf(t, p1, name)
		if num(t, c["completed"]) != num(t, before[name]["waiting"])+num(t, before[name]["prioritized"])+num(t, before[name]["delayed"])+num(t, before[name]["active"]) {
			t.Fatalf("queue %s at the end: %v (before: %v)", name, c, before[name])
		}
	}
}

// pushFile fills a data file through a SQLite server, then stops it.
func pushFile(t *testing.T, path string, fill func(c *tclient)) {
	t.Helper()
	srv := startBinary(t, "--data-path", path)
	fill(dial(t, srv.addr()))
	srv.stop(t)
}

// TestMigrateTargetAndRefusals: a namespace that holds jobs is refused
// unless --append, and a job id already there fails the whole migration;
// each refusal leaves the namespace as it was. The environment names the
// storage as for the server.
func TestMigrateTargetAndRefusals(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	dir := t.TempDir()
	one, two := filepath.Join(dir, "one.db"), filepath.Join(dir, "two.db")
	pushFile(t, one, func(c *tclient) {
		pushMany(t, []*tclient{c}, "a", 2, 2)
	})
	pushFile(t, two, func(c *tclient) {
		pushMany(t, []*tclient{c}, "a", 3, 3)
		pushMany(t, []*tclient{c}, "b", 1, 1)
		c.ok(map[string]any{"cmd": "Cron", "name": "nightly", "queue": "b", "data": 1, "schedule": "0 3 * * *"})
	})
	env := []string{"BUNQUEUE_POSTGRES_URL=" + testPGURL(), "BUNQUEUE_POSTGRES_NAMESPACE=" + ns}

	out, code := execMigrate(t, append(env, "DATA_PATH="+one))
	if code != 0 {
		t.Fatalf("migrate from DATA_PATH: exit %d\n%s", code, out)
	}
	out, code = execMigrate(t, env, "--from", two)
	if code != 1 || !strings.Contains(out, "already holds 2 jobs") {
		t.Fatalf("into a namespace with jobs: exit %d\n%s", code, out)
	}
	if n := pgJobCount(t, ns); n != 2 {
		t.Fatalf("after a refused migration: %d jobs, want 2", n)
	}
	out, code = execMigrate(t, env, "--from", two, "--append")
	t.Logf("--append:\n%s", out)
	if code != 0 || !strings.Contains(out, "the counts match") {
		t.Fatalf("--append: exit %d\n%s", code, out)
	}
	out, code = execMigrate(t, env, "--from", one, "--append")
	if code != 1 || !strings.Contains(out, "nothing migrated") || !strings.Contains(out, "duplicate key") {
		t.Fatalf("the same jobs again: exit %d\n%s", code, out)
	}
	if n := pgJobCount(t, ns); n != 6 {
		t.Fatalf("after a failed append: %d jobs, want 6", n)
	}
	b := startPGBroker(t, ns)
	c := dial(t, b.addr())
	if n := num(t, countsOf(t, c, "a")["waiting"]); n != 5 {
		t.Fatalf("queue a: %v waiting, want 5", n)
	}
	if n := num(t, countsOf(t, c, "b")["waiting"]); n != 1 {
		t.Fatalf("queue b: %v waiting, want 1", n)
	}
	if l := list(t, c.ok(map[string]any{"cmd": "CronList"}), "crons"); len(l) != 1 {
		t.Fatalf("CronList: %v", l)
	}
	// A namespace that stores something other than what was written (a
	// trigger here) fails the read-back check, and nothing is committed.
	skewed := pgTestNamespace(t)
	ctx := context.Background()
	p, err := connectPG(ctx, testPGURL(), skewed, nil, quietLog(), defaultPGSession)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.pool.Exec(ctx, p.sql(`CREATE FUNCTION {s}.skew() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN NEW.state := 5; RETURN NEW; END $$;
		CREATE TRIGGER skew BEFORE INSERT ON {s}.jobs FOR EACH ROW WHEN (NEW.queue = 'b') EXECUTE FUNCTION {s}.skew()`))
	p.Close()
	if err != nil {
		t.Fatal(err)
	}
	out, code = execMigrate(t, nil, "--from", two, "--postgres-url", testPGURL(), "--postgres-namespace", skewed)
	if code != 1 || !strings.Contains(out, "read back differs") || !strings.Contains(out, "queue b") {
		t.Fatalf("a namespace that changes what it is given: exit %d\n%s", code, out)
	}
	if n := pgJobCount(t, skewed); n != 0 {
		t.Fatalf("a migration whose counts differed left %d jobs", n)
	}
	if out, code := execMigrate(t, nil, "--from", one); code != 2 || !strings.Contains(out, "--postgres-url") {
		t.Fatalf("without a URL: exit %d\n%s", code, out)
	}
	if out, code := execMigrate(t, env, "--from", filepath.Join(dir, "none.db")); code != 1 || !strings.Contains(out, "no SQLite data file") {
		t.Fatalf("a missing file: exit %d\n%s", code, out)
	}
}

// TestMigrateFlowsGroupsPolicies: what a SQLite server held of flows,
// dependencies, groups, dedup ttls and queue policies runs after the
// migration on two PostgreSQL brokers as it would have after a restart.
func TestMigrateFlowsGroupsPolicies(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	path := filepath.Join(t.TempDir(), "queued.db")
	srv := startBinary(t, "--data-path", path)
	c := dial(t, srv.addr())

	// A parent waiting on three children, one of them done.
	c.ok(flowFrame("P", "parents", "kids", []string{"k1", "k2", "k3"}))
	a := c.ok(map[string]any{"cmd": "PULL", "queue": "kids", "owner": "w", "lockTtl": 60000})
	if sub(t, a, "job")["id"] != "k1" {
		t.Fatalf("pulled %v, want k1", a["job"])
	}
	c.ok(map[string]any{"cmd": "ACK", "id": "k1", "token": a["token"], "result": map[string]any{"from": "k1"}})
	// A dependsOn chain.
	c.ok(map[string]any{"cmd": "PUSH", "queue": "chain", "jobId": "a", "data": "a"})
	c.ok(map[string]any{"cmd": "PUSH", "queue": "chain", "jobId": "b", "data": "b", "dependsOn": []any{"a"}})
	c.ok(map[string]any{"cmd": "PUSH", "queue": "chain", "jobId": "c", "data": "c", "dependsOn": []any{"b"}})
	// Groups: one paused, one limited to one job at a time, one free.
	const perGroup = 6
	c.ok(map[string]any{"cmd": "PauseGroup", "queue": "grp", "groupId": "held"})
	c.ok(map[string]any{"cmd": "SetGroupConcurrency", "queue": "grp", "groupId": "solo", "concurrency": 1})
	for _, g := range []string{"held", "solo", "free"} {
		jobs := make([]any, perGroup)
		for k := range jobs {
			jobs[k] = map[string]any{"name": g, "data": k, "groupId": g}
		}
		c.ok(map[string]any{"cmd": "PUSHB", "queue": "grp", "jobs": jobs})
	}
	// A dedup key with a ttl.
	const ttl = 8000
	held := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "dd", "data": 1, "uniqueKey": "K", "dedup": map[string]any{"ttl": ttl}}), "id")
	// Stall and DLQ policy, with two entries in the DLQ at its bound.
	c.ok(map[string]any{"cmd": "SetStallConfig", "queue": "pol", "config": map[string]any{"maxStalls": 1, "stallInterval": 400, "gracePeriod": 0}})
	c.ok(map[string]any{"cmd": "SetDlqConfig", "queue": "pol", "config": map[string]any{"maxEntries": 2}})
	var dead []string
	for range 2 {
		id := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "pol", "data": 1, "maxAttempts": 1}), "id")
		c.ok(map[string]any{"cmd": "PULL", "queue": "pol"})
		c.ok(map[string]any{"cmd": "FAIL", "id": id, "error": "boom"})
		dead = append(dead, id)
	}
	// y waits for x; x's row goes as if x had completed and been removed
	// by a server that died before it released y.
	c.ok(map[string]any{"cmd": "PUSH", "queue": "gone", "jobId": "x", "data": "x"})
	c.ok(map[string]any{"cmd": "PUSH", "queue": "gone", "jobId": "y", "data": "y", "dependsOn": []any{"x"}})
	srv.stop(t)
	restarted := filepath.Join(t.TempDir(), "restarted.db")
	dropJob(t, path, "x", restarted)
	// What a restart on the file makes of it, to compare.
	srv = startBinary(t, "--data-path", restarted)
	c = dial(t, srv.addr())
	if st := stateOf(t, c, "y"); st != "waiting" {
		t.Fatalf("y after a restart on the file: %s", st)
	}
	srv.stop(t)

	migrated := time.Now()
	out, code := execMigrate(t, nil, "--from", path, "--postgres-url", testPGURL(), "--postgres-namespace", ns)
	t.Logf("queued migrate:\n%s", out)
	if code != 0 || !strings.Contains(out, "the counts match") || !strings.Contains(out, "3 groups, 4 dependencies not yet met") {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, "1 jobs whose dependencies all completed run") {
		t.Fatalf("the migration does not say y runs:\n%s", out)
	}
	if strings.Contains(out, "not acted on") {
		t.Fatalf("the migration says settings are not acted on:\n%s", out)
	}
	p1, p2 := dial(t, startPGBroker(t, ns).addr()), dial(t, startPGBroker(t, ns).addr())

	// The dedup key is still held, until its ttl runs out from the
	// migration, as from a restart.
	if id := str(t, p1.ok(map[string]any{"cmd": "PUSH", "queue": "dd", "data": 2, "uniqueKey": "K", "dedup": map[string]any{"ttl": ttl}}), "id"); id != held {
		t.Fatalf("a push of the held key made %s, want the holder %s", id, held)
	}

	if st := stateOf(t, p2, "y"); st != "waiting" {
		t.Fatalf("y after the migration: %s, after a restart: waiting", st)
	}

	// The flow: the parent waits for k2 and k3 only; their ACKs through
	// two brokers at once release it once, with all three results.
	if st := stateOf(t, p2, "P"); st != "waiting-children" {
		t.Fatalf("parent after the migration: %s", st)
	}
	toks := map[string]any{}
	for _, cl := range []*tclient{p1, p2} {
		a := cl.ok(map[string]any{"cmd": "PULL", "queue": "kids", "owner": "w", "lockTtl": 60000})
		toks[str(t, sub(t, a, "job"), "id")] = a["token"]
	}
	if len(toks) != 2 || toks["k2"] == nil || toks["k3"] == nil {
		t.Fatalf("pulled %v, want k2 and k3", toks)
	}
	if st := stateOf(t, p1, "P"); st != "waiting-children" {
		t.Fatalf("parent with two children running: %s", st)
	}
	atOnce(t, []shot{
		{p1, map[string]any{"cmd": "ACK", "id": "k2", "token": toks["k2"], "result": map[string]any{"from": "k2"}}},
		{p2, map[string]any{"cmd": "ACK", "id": "k3", "token": toks["k3"], "result": map[string]any{"from": "k3"}}},
	})
	if st := stateOf(t, p2, "P"); st != "waiting" {
		t.Fatalf("parent after its last children: %s", st)
	}
	releasedOnce(t, sub(t, p1.ok(map[string]any{"cmd": "GetJob", "id": "P"}), "job"))
	vals := settle(t, p2, "P")
	for _, k := range []string{"k1", "k2", "k3"} {
		if v, _ := vals["kids:"+k].(map[string]any); v == nil || v["from"] != k {
			t.Fatalf("GetChildrenValues: %v", vals)
		}
	}
	if len(vals) != 3 {
		t.Fatalf("GetChildrenValues: %d values: %v", len(vals), vals)
	}
	pa := p1.ok(map[string]any{"cmd": "PULL", "queue": "parents", "owner": "w"})
	if sub(t, pa, "job")["id"] != "P" {
		t.Fatalf("pulled %v, want P", pa["job"])
	}
	p2.ok(map[string]any{"cmd": "ACK", "id": "P", "token": pa["token"]})

	// The chain runs link by link, whichever broker acknowledges.
	for i, id := range []string{"a", "b", "c"} {
		cl := []*tclient{p1, p2}[i%2]
		a := cl.ok(map[string]any{"cmd": "PULLB", "queue": "chain", "count": 5, "owner": "w"})
		if js := list(t, a, "jobs"); len(js) != 1 || js[0].(map[string]any)["id"] != id {
			t.Fatalf("chain step %d: pulled %v, want only %s", i, js, id)
		}
		[]*tclient{p2, p1}[i%2].ok(map[string]any{"cmd": "ACKB", "ids": []any{id}, "tokens": a["tokens"]})
	}
	if n := num(t, countsOf(t, p1, "chain")["completed"]); n != 3 {
		t.Fatalf("chain: %v completed", n)
	}

	// Groups: the paused one stays paused; the limited one never has two
	// jobs out at once with four workers on two brokers asking for up to 3.
	if a := p2.ok(map[string]any{"cmd": "IsGroupPaused", "queue": "grp", "groupId": "held"}); sub(t, a, "data")["paused"] != true {
		t.Fatalf("IsGroupPaused: %v", a)
	}
	if a := p1.ok(map[string]any{"cmd": "GetGroupConcurrency", "queue": "grp", "groupId": "solo"}); num(t, sub(t, a, "data")["concurrency"]) != 1 {
		t.Fatalf("GetGroupConcurrency: %v", a)
	}
	l := runGroupWorkers(t, []*tclient{p1, p2}, "grp", map[string]any{"concurrency": 3}, 5, 15*time.Millisecond, 2*perGroup)
	t.Logf("groups after the migration: peak %v, done %v", l.peak, l.done)
	if l.peak["solo"] != 1 || l.done["solo"] != perGroup {
		t.Fatalf("group solo (concurrency 1): peak %d, %d done", l.peak["solo"], l.done["solo"])
	}
	if l.peak["free"] < 2 || l.peak["free"] > 3 || l.done["free"] != perGroup {
		t.Fatalf("group free (concurrency 3): peak %d, %d done", l.peak["free"], l.done["free"])
	}
	if l.done["held"] != 0 {
		t.Fatalf("%d jobs of the paused group ran", l.done["held"])
	}
	if a := p1.ok(map[string]any{"cmd": "GetGroupJobsCount", "queue": "grp", "groupId": "held"}); num(t, sub(t, a, "data")["count"]) != perGroup {
		t.Fatalf("GetGroupJobsCount of the paused group: %v", a)
	}
	p2.ok(map[string]any{"cmd": "ResumeGroup", "queue": "grp", "groupId": "held"})
	if js := list(t, p1.ok(map[string]any{"cmd": "PULLB", "queue": "grp", "count": 10}), "jobs"); len(js) != perGroup {
		t.Fatalf("after ResumeGroup: pulled %d, want %d", len(js), perGroup)
	}

	// The queue's policies read back through a broker, and apply: a job
	// without a lock stalls once and goes to the DLQ, which keeps 2.
	st := sub(t, p1.ok(map[string]any{"cmd": "GetStallConfig", "queue": "pol"}), "config")
	if num(t, st["maxStalls"]) != 1 || num(t, st["stallInterval"]) != 400 || num(t, st["gracePeriod"]) != 0 || st["enabled"] != true {
		t.Fatalf("GetStallConfig: %v", st)
	}
	dc := sub(t, p2.ok(map[string]any{"cmd": "GetDlqConfig", "queue": "pol"}), "config")
	if num(t, dc["maxEntries"]) != 2 {
		t.Fatalf("GetDlqConfig: %v", dc)
	}
	stalled := str(t, p2.ok(map[string]any{"cmd": "PUSH", "queue": "pol", "data": 1, "maxAttempts": 5}), "id")
	if a := p1.ok(map[string]any{"cmd": "PULL", "queue": "pol"}); sub(t, a, "job")["id"] != stalled {
		t.Fatalf("pulled %v, want %s", a["job"], stalled)
	}
	eventually(t, 15*time.Second, "the stalled job in the DLQ", func() (bool, string) {
		s := stateOf(t, p2, stalled)
		return s == "failed", s
	})
	var got []string
	for _, j := range list(t, p1.ok(map[string]any{"cmd": "Dlq", "queue": "pol"}), "jobs") {
		got = append(got, str(t, j.(map[string]any), "id"))
	}
	if want := []string{dead[1], stalled}; !slices.Equal(got, want) {
		t.Fatalf("DLQ bounded at 2 after the stall: %v, want %v", got, want)
	}

	// The dedup ttl ran out at its time, not before.
	var fresh string
	eventually(t, 30*time.Second, "the dedup key free", func() (bool, string) {
		fresh = str(t, p2.ok(map[string]any{"cmd": "PUSH", "queue": "dd", "data": 3, "uniqueKey": "K", "dedup": map[string]any{"ttl": ttl}}), "id")
		return fresh != held, fresh
	})
	if since := time.Since(migrated); since < ttl*time.Millisecond {
		t.Fatalf("the dedup key was free %v after the migration began, its ttl is %d ms", since, ttl)
	}
	if n := num(t, countsOf(t, p1, "dd")["waiting"]); n != 2 {
		t.Fatalf("queue dd: %v waiting, want the holder and the new job", n)
	}
}

// dropJob deletes job id's row from a stopped server's data file, after
// saving a copy of the result at saveAs.
func dropJob(t *testing.T, path, id, saveAs string) {
	t.Helper()
	sq, err := OpenSQLite(path, "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	rows, err := sq.db.Query(`SELECT seq, record FROM jobs`)
	if err != nil {
		t.Fatal(err)
	}
	var seq int64 = -1
	for rows.Next() {
		var s int64
		var rec []byte
		if err := rows.Scan(&s, &rec); err != nil {
			t.Fatal(err)
		}
		if j, err := decodeRecord(rec); err == nil && j.ID() == id {
			seq = s
		}
	}
	rows.Close()
	if seq < 0 {
		t.Fatalf("no job %s in %s", id, path)
	}
	if _, err := sq.db.Exec(`DELETE FROM jobs WHERE seq = ?`, seq); err != nil {
		t.Fatal(err)
	}
	if _, err := sq.db.Exec(`VACUUM INTO ?`, saveAs); err != nil {
		t.Fatal(err)
	}
}
