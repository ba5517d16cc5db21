package main

// PostgreSQL mode against the real database at 127.0.0.1:5432 (or
// QUEUED_TEST_POSTGRES_URL): brokers as subprocesses sharing one
// namespace, each test in a namespace of its own, dropped at the end.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// testPGURL is the test database. Without TLS: the URL without sslmode
// gives "prefer", and the Debian server has TLS on, so every connection
// the suite opens (some 1,900 a run) paid a handshake and every statement
// its encryption; PostgreSQL's TLS libraries alone took 2% of the run's CPU.
func testPGURL() string {
	if u := os.Getenv("QUEUED_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// testPGAdmin is one small pool for the suite's own statements on the
// test database (a namespace's drop at a test's end): a PostgreSQL
// session costs its server tens of milliseconds of CPU to start on a
// 2-core machine, and a connection per test's cleanup added hundreds.
var testPGAdmin struct {
	once sync.Once
	pool *pgxpool.Pool
	err  error
}

// pgAdminExec runs one statement on the test database through
// testPGAdmin.
func pgAdminExec(ctx context.Context, sql string) error {
	testPGAdmin.once.Do(func() {
		cfg, err := pgxpool.ParseConfig(testPGURL())
		if err != nil {
			testPGAdmin.err = err
			return
		}
		cfg.MaxConns = 4
		testPGAdmin.pool, testPGAdmin.err = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if testPGAdmin.err != nil {
		return testPGAdmin.err
	}
	_, err := testPGAdmin.pool.Exec(ctx, sql)
	return err
}

// pgTestNamespace makes a fresh namespace and drops its schema when the
// test ends. Without the database the test is skipped, and fails under
// CI=true (needPG). The PostgreSQL tests run in parallel with each other
// (t.Parallel, -parallel of them at a time): each has a namespace and
// servers of its own, and they mostly wait on timers and the database.
func pgTestNamespace(t *testing.T) string {
	t.Helper()
	needPG(t)
	var b [4]byte
	rand.Read(b[:])
	ns := "t" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pgAdminExec(ctx, "DROP SCHEMA IF EXISTS queued_"+ns+" CASCADE")
	})
	return ns
}

// pgTestConn connects to the test database for a test's own queries,
// with a context that ends with the test (within 30 s).
func pgTestConn(t *testing.T) (context.Context, *pgx.Conn) {
	t.Helper()
	return pgTestConnWithin(t, 30*time.Second)
}

// pgTestConnWithin is pgTestConn whose context ends after d.
func pgTestConnWithin(t *testing.T, d time.Duration) (context.Context, *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	conn, err := pgx.Connect(ctx, testPGURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return ctx, conn
}

func startPGBroker(t *testing.T, ns string) *serverProc {
	t.Helper()
	return startBinary(t, "--postgres-url", testPGURL(), "--postgres-namespace", ns)
}

// pushMany pushes n jobs through the given clients in turn, in batches.
func pushMany(t *testing.T, clients []*tclient, queue string, n, batch int) []string {
	t.Helper()
	var ids []string
	for i := 0; len(ids) < n; i++ {
		k := min(batch, n-len(ids))
		jobs := make([]any, k)
		for x := range jobs {
			jobs[x] = map[string]any{"name": "j", "data": map[string]any{"n": len(ids) + x}}
		}
		a := clients[i%len(clients)].ok(map[string]any{"cmd": "PUSHB", "queue": queue, "jobs": jobs})
		for _, id := range list(t, a, "ids") {
			ids = append(ids, id.(string))
		}
	}
	return ids
}

// ackLedger counts, per job, the ACKs the brokers accepted, and the ACKs
// whose answer never came (their broker died with the answer in flight).
type ackLedger struct {
	mu       sync.Mutex
	accepted map[string]int
	unknown  map[string]bool
	total    atomic.Int64
}

// pgWorker pulls and acknowledges through one broker until stop closes or
// its connection dies.
func pgWorker(c *tclient, queue, owner string, led *ackLedger, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		a, err := c.do(map[string]any{"cmd": "PULLB", "queue": queue, "count": 50, "owner": owner,
			"lockTtl": 3000, "timeout": 300}, 20*time.Second)
		if err != nil || a["ok"] != true {
			return
		}
		jobs, _ := a["jobs"].([]any)
		toks, _ := a["tokens"].([]any)
		if len(jobs) == 0 {
			continue
		}
		ids := make([]any, len(jobs))
		for i, j := range jobs {
			ids[i] = j.(map[string]any)["id"]
		}
		r, err := c.do(map[string]any{"cmd": "ACKB", "ids": ids, "tokens": toks}, 20*time.Second)
		led.mu.Lock()
		if err != nil {
			for _, id := range ids {
				led.unknown[id.(string)] = true
			}
			led.mu.Unlock()
			return
		}
		ignored := map[int]bool{}
		if d, ok := r["data"].(map[string]any); ok {
			list, _ := d["ignoredIndices"].([]any)
			for _, x := range list {
				ignored[int(toFloat(x))] = true
			}
		}
		for i, id := range ids {
			if !ignored[i] && r["ok"] == true {
				led.accepted[id.(string)]++
				led.total.Add(1)
			}
		}
		led.mu.Unlock()
	}
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case uint64:
		return float64(x)
	case float64:
		return x
	case int:
		return float64(x)
	}
	return -1
}

// TestPGThreeBrokersExactlyOnce runs 20,000 jobs through three brokers with
// workers on each, kills one broker with SIGKILL mid-run, and requires
// every job completed, none twice.
func TestPGThreeBrokersExactlyOnce(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	brokers := []*serverProc{startPGBroker(t, ns), startPGBroker(t, ns), startPGBroker(t, ns)}
	admin := make([]*tclient, 3)
	for i, b := range brokers {
		admin[i] = dial(t, b.addr())
	}
	// 5,000 jobs show what 20,000 did (a kill a quarter of the way
	// through, every job acknowledged exactly once) in a quarter of the
	// time: 1,250 ACKs before the kill, leases held through the dead
	// broker, thousands of claims racing across the other two.
	const total = 5000
	const queue = "exactly-once"
	ids := pushMany(t, admin, queue, total, 500)
	if len(ids) != total {
		t.Fatalf("pushed %d jobs, want %d", len(ids), total)
	}
	led := &ackLedger{accepted: map[string]int{}, unknown: map[string]bool{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, b := range brokers {
		for w := 0; w < 2; w++ {
			c := dial(t, b.addr())
			wg.Add(1)
			go func() {
				defer wg.Done()
				pgWorker(c, queue, fmt.Sprintf("w%d.%d", i, w), led, stop)
			}()
		}
	}
	// Kill the second broker a quarter of the way through.
	eventually(t, 60*time.Second, "a quarter of the jobs acknowledged", func() (bool, string) {
		n := led.total.Load()
		return n >= total/4, fmt.Sprint(n, " acknowledged")
	})
	// Leases held through broker 2 when it dies: these jobs must come back
	// through the other brokers once the leases run out.
	held := dial(t, brokers[1].addr())
	hp := held.ok(map[string]any{"cmd": "PULLB", "queue": queue, "count": 100, "owner": "doomed", "lockTtl": 2000})
	heldIDs := list(t, hp, "jobs")
	if len(heldIDs) == 0 {
		t.Fatal("nothing left to hold through broker 2")
	}
	brokers[1].kill9(t)
	t.Logf("broker 2 killed after %d ACKs, holding %d leases", led.total.Load(), len(heldIDs))
	eventually(t, 120*time.Second, "every job completed", func() (bool, string) {
		a := admin[0].ok(map[string]any{"cmd": "GetJobCounts", "queue": queue})
		c := sub(t, a, "counts")
		return num(t, c["completed"]) == total, fmt.Sprint(c)
	})
	close(stop)
	wg.Wait()

	led.mu.Lock()
	defer led.mu.Unlock()
	twice, none := 0, 0
	for _, id := range ids {
		switch n := led.accepted[id]; {
		case n > 1:
			twice++
		case n == 0 && !led.unknown[id]:
			none++
		}
	}
	for _, j := range heldIDs {
		if id := j.(map[string]any)["id"].(string); led.accepted[id] != 1 {
			t.Fatalf("job %s, leased through the killed broker, acknowledged %d times", id, led.accepted[id])
		}
	}
	if twice > 0 || none > 0 {
		t.Fatalf("%d jobs acknowledged twice, %d never (of %d; %d answers lost with the killed broker)",
			twice, none, total, len(led.unknown))
	}
	a := admin[2].ok(map[string]any{"cmd": "GetJobCounts", "queue": queue})
	c := sub(t, a, "counts")
	for _, st := range []string{"waiting", "active", "delayed", "failed", "prioritized"} {
		if num(t, c[st]) != 0 {
			t.Fatalf("counts after the run: %v", c)
		}
	}
	t.Logf("%d ACKs accepted, %d in flight at the kill", led.total.Load(), len(led.unknown))
}

// TestPGLeaseFence: once a lease runs out and another worker holds the
// job, the first worker's ACK and FAIL are refused; the second's applies,
// once.
func TestPGLeaseFence(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	a, b := startPGBroker(t, ns), startPGBroker(t, ns)
	ca, cb := dial(t, a.addr()), dial(t, b.addr())
	id := str(t, ca.ok(map[string]any{"cmd": "PUSH", "queue": "fence", "data": 1, "maxAttempts": 5}), "id")
	p1 := ca.ok(map[string]any{"cmd": "PULL", "queue": "fence", "owner": "w1", "lockTtl": 300})
	tok1 := str(t, p1, "token")
	// Broker B reclaims the expired lease and hands the job out again.
	var tok2 string
	eventually(t, 10*time.Second, "job delivered again through broker B", func() (bool, string) {
		p2 := cb.ok(map[string]any{"cmd": "PULL", "queue": "fence", "owner": "w2", "lockTtl": 30000})
		if j, ok := p2["job"].(map[string]any); ok && j["id"] == id {
			tok2 = str(t, p2, "token")
			return true, ""
		}
		return false, "not yet"
	})
	if msg := ca.fail(map[string]any{"cmd": "ACK", "id": id, "token": tok1}); !strings.Contains(msg, "Invalid or expired lock token") {
		t.Fatalf("stale ACK: %q", msg)
	}
	if msg := ca.fail(map[string]any{"cmd": "FAIL", "id": id, "token": tok1, "error": "late"}); !strings.Contains(msg, "Invalid or expired lock token") {
		t.Fatalf("stale FAIL: %q", msg)
	}
	if msg := cb.fail(map[string]any{"cmd": "ACK", "id": id}); !strings.Contains(msg, "Lock token required") {
		t.Fatalf("ACK without a token: %q", msg)
	}
	cb.ok(map[string]any{"cmd": "ACK", "id": id, "token": tok2, "result": "r2"})
	// The same ACK again came too late: already finalized, not an error.
	again := cb.ok(map[string]any{"cmd": "ACK", "id": id, "token": tok2})
	if d := sub(t, again, "data"); d["applied"] != false || d["reason"] != "already-finalized" {
		t.Fatalf("repeated ACK: %v", again)
	}
	ca.fail(map[string]any{"cmd": "ACK", "id": id, "token": tok1})
	j := sub(t, ca.ok(map[string]any{"cmd": "GetJob", "id": id}), "job")
	if j["state"] != "completed" || j["returnvalue"] != "r2" || num(t, j["attempts"]) != 1 {
		t.Fatalf("job after the fenced run: state %v, result %v, attempts %v", j["state"], j["returnvalue"], j["attempts"])
	}
}

// TestPGPauseAndWakeAcrossBrokers: a pause set through one broker holds on
// the others, and a resume or push through one wakes a long poll on
// another.
func TestPGPauseAndWakeAcrossBrokers(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ps := []*serverProc{startPGBroker(t, ns), startPGBroker(t, ns), startPGBroker(t, ns)}
	c := []*tclient{dial(t, ps[0].addr()), dial(t, ps[1].addr()), dial(t, ps[2].addr())}
	c[0].ok(map[string]any{"cmd": "PUSH", "queue": "p", "data": 1})
	c[0].ok(map[string]any{"cmd": "Pause", "queue": "p"})
	if a := c[1].ok(map[string]any{"cmd": "IsPaused", "queue": "p"}); a["paused"] != true {
		t.Fatalf("IsPaused through another broker: %v", a)
	}
	if a := c[2].ok(map[string]any{"cmd": "PULL", "queue": "p"}); a["job"] != nil {
		t.Fatalf("pulled from a paused queue through another broker: %v", a)
	}
	counts := sub(t, c[2].ok(map[string]any{"cmd": "GetJobCounts", "queue": "p"}), "counts")
	if num(t, counts["paused"]) != 1 || num(t, counts["waiting"]) != 0 {
		t.Fatalf("counts of a paused queue: %v", counts)
	}
	// A long poll on broker 2 is answered when broker 3 resumes.
	id, ch := c[1].send(map[string]any{"cmd": "PULL", "queue": "p", "timeout": 20000})
	pollWaiting(t, c[1])
	start := time.Now()
	c[2].ok(map[string]any{"cmd": "Resume", "queue": "p"})
	a := c[1].await(id, ch, 25*time.Second)
	if j, ok := a["job"].(map[string]any); !ok || j["data"] != int64(1) && toFloat(j["data"]) != 1 {
		t.Fatalf("long poll after resume: %v", a)
	}
	t.Logf("resume through broker 3 woke a poll on broker 2 in %v", time.Since(start))
	// And a push through broker 1 wakes a poll on broker 3.
	id, ch = c[2].send(map[string]any{"cmd": "PULL", "queue": "p", "timeout": 20000})
	pollWaiting(t, c[2])
	start = time.Now()
	pushed := str(t, c[0].ok(map[string]any{"cmd": "PUSH", "queue": "p", "data": 2}), "id")
	a = c[2].await(id, ch, 25*time.Second)
	if j, ok := a["job"].(map[string]any); !ok || j["id"] != pushed {
		t.Fatalf("long poll after a push elsewhere: %v", a)
	}
	t.Logf("push through broker 1 woke a poll on broker 3 in %v", time.Since(start))
}

// TestPGSharedState: custom ids, unique keys, priorities, delays, retries,
// the DLQ and queries behave the same through any broker.
func TestPGSharedState(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	a, b := startPGBroker(t, ns), startPGBroker(t, ns)
	ca, cb := dial(t, a.addr()), dial(t, b.addr())
	q := "shared"
	id1 := str(t, ca.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 1, "jobId": "order-1"}), "id")
	id2 := str(t, cb.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 2, "jobId": "order-1"}), "id")
	if id1 != "order-1" || id2 != "order-1" {
		t.Fatalf("custom id through two brokers: %q, %q", id1, id2)
	}
	u1 := str(t, ca.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 3, "uniqueKey": "k"}), "id")
	u2 := str(t, cb.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 4, "uniqueKey": "k"}), "id")
	if u1 != u2 {
		t.Fatalf("unique key held through another broker: %q then %q", u1, u2)
	}
	hi := str(t, cb.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 5, "priority": 10}), "id")
	later := str(t, cb.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 6, "delay": 60000}), "id")
	if st := ca.ok(map[string]any{"cmd": "GetState", "id": later})["state"]; st != "delayed" {
		t.Fatalf("delayed job state %v", st)
	}
	if st := ca.ok(map[string]any{"cmd": "GetState", "id": hi})["state"]; st != "prioritized" {
		t.Fatalf("prioritized job state %v", st)
	}
	// Claims go by priority, then FIFO.
	order := []string{}
	for i := 0; i < 3; i++ {
		p := ca.ok(map[string]any{"cmd": "PULL", "queue": q})
		j := p["job"].(map[string]any)
		order = append(order, j["id"].(string))
		if j["id"] == id1 {
			// Fails for good: one attempt only left after this? No: it
			// retries with backoff, so fail it unrecoverably.
			cb.ok(map[string]any{"cmd": "FAIL", "id": id1, "error": "boom", "unrecoverable": true})
		} else {
			cb.ok(map[string]any{"cmd": "ACK", "id": j["id"], "result": map[string]any{"ok": true}})
		}
	}
	if order[0] != hi || order[1] != id1 || order[2] != u1 {
		t.Fatalf("claim order %v, want %v", order, []string{hi, id1, u1})
	}
	if p := ca.ok(map[string]any{"cmd": "PULL", "queue": q}); p["job"] != nil {
		t.Fatalf("the delayed job was handed out early: %v", p)
	}
	dlq := cb.ok(map[string]any{"cmd": "Dlq", "queue": q})
	if l := list(t, dlq, "jobs"); len(l) != 1 || l[0].(map[string]any)["id"] != id1 {
		t.Fatalf("DLQ: %v", dlq)
	}
	// The finished holder of a custom id gives it up to a new job.
	if id := str(t, cb.ok(map[string]any{"cmd": "PUSH", "queue": q, "data": 7, "jobId": "order-1"}), "id"); id != "order-1" {
		t.Fatalf("custom id reuse: %q", id)
	}
	if n := num(t, ca.ok(map[string]any{"cmd": "PurgeDlq", "queue": q})["count"]); n != 0 {
		t.Fatalf("PurgeDlq after the id was reused: %v", n)
	}
	res := ca.ok(map[string]any{"cmd": "GetResult", "id": u1})
	if r, ok := res["result"].(map[string]any); !ok || r["ok"] != true {
		t.Fatalf("result through the other broker: %v", res)
	}
	counts := sub(t, ca.ok(map[string]any{"cmd": "GetJobCounts", "queue": q}), "counts")
	if num(t, counts["completed"]) != 2 || num(t, counts["delayed"]) != 1 || num(t, counts["waiting"]) != 1 {
		t.Fatalf("counts: %v", counts)
	}
	queues := list(t, cb.ok(map[string]any{"cmd": "ListQueues"}), "queues")
	if len(queues) != 1 || queues[0] != q {
		t.Fatalf("ListQueues: %v", queues)
	}
	if n := num(t, cb.ok(map[string]any{"cmd": "Drain", "queue": q})["count"]); n != 2 {
		t.Fatalf("Drain removed %v jobs, want 2", n)
	}
}

// TestPGSchemaNewerRefused: a broker leaves alone a namespace migrated by
// a newer queued.
func TestPGSchemaNewerRefused(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	b := NewBroker()
	defer b.Close()
	p, err := OpenPG(ctx, testPGURL(), ns, b, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.pool.Exec(ctx, `UPDATE queued_`+ns+`.schema_version SET version = 99`); err != nil {
		t.Fatal(err)
	}
	p.Close()
	_, err = OpenPG(ctx, testPGURL(), ns, b, log)
	if err == nil || !strings.Contains(err.Error(), "newer than this queued knows") {
		t.Fatalf("opening a newer schema: %v", err)
	}
}

// TestPGStorageFlags: PostgreSQL and SQLite are not both asked for.
//
// Serial: it sets environment variables (t.Setenv).
func TestPGStorageFlags(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"serve", "--postgres-url", testPGURL(), "--data-path", "/tmp/x.db"}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "choose one storage") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	// A data path from the environment is only SQLite's default (see
	// TestSystemdUnit*), but --data-path or --memory on the command line
	// beside a URL from the environment is still a contradiction.
	t.Setenv("BUNQUEUE_POSTGRES_URL", testPGURL())
	t.Setenv("DATA_PATH", filepath.Join(t.TempDir(), "env.db"))
	for _, flags := range [][]string{{"--data-path", "/tmp/x.db"}, {"--memory"}} {
		errb.Reset()
		code = run(append([]string{"serve"}, flags...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), "choose one storage") {
			t.Fatalf("%v with BUNQUEUE_POSTGRES_URL: exit %d: %s", flags, code, errb.String())
		}
	}
	t.Setenv("BUNQUEUE_POSTGRES_URL", "")
	t.Setenv("BUNQUEUE_STORAGE_DRIVER", "postgres")
	errb.Reset()
	code = run([]string{"serve"}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "needs a URL") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}

// TestPGRateLimitAcrossBrokers: a rate limit set through one broker holds
// for workers pulling through all three together.
func TestPGRateLimitAcrossBrokers(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ps := []*serverProc{startPGBroker(t, ns), startPGBroker(t, ns), startPGBroker(t, ns)}
	admin := dial(t, ps[0].addr())
	const q, rate = "limited", 20
	pushMany(t, []*tclient{admin}, q, 400, 200)
	// Timed from before the limit is set: its bucket starts full then.
	start := time.Now()
	admin.ok(map[string]any{"cmd": "RateLimit", "queue": q, "limit": rate})
	var pulled atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range ps {
		workLoop(t, p.addr(), map[string]any{"cmd": "PULLB", "queue": q, "count": 10, "timeout": 200}, stop, &wg,
			func(c *tclient, a map[string]any) {
				jobs, _ := a["jobs"].([]any)
				pulled.Add(int64(len(jobs)))
			})
	}
	// The bucket's first tokens are taken, however slow the machine; then
	// the brokers pull on until they have had two seconds' refill too
	// (sooner, were the limit not held, which the check below tells).
	eventually(t, 30*time.Second, "the full bucket pulled", func() (bool, string) {
		n := pulled.Load()
		return n >= rate, fmt.Sprint(n, " pulled")
	})
	eventually(t, 30*time.Second, "two seconds' refill pulled", func() (bool, string) {
		n := pulled.Load()
		return n >= 3*rate, fmt.Sprint(n, " pulled")
	})
	close(stop)
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	n := pulled.Load()
	// The bucket starts full (rate tokens) and refills at rate per second.
	limit := int64(rate + rate*elapsed + 1)
	if n > limit || n < rate {
		t.Fatalf("%d jobs pulled through three brokers in %.1fs under a limit of %d/s (at most %d)", n, elapsed, rate, limit)
	}
	lim := sub(t, sub(t, admin.ok(map[string]any{"cmd": "GetQueueLimits", "queue": q}), "data"), "limits")
	if rl := sub(t, lim, "rateLimit"); num(t, rl["max"]) != rate {
		t.Fatalf("GetQueueLimits: %v", lim)
	}
	t.Logf("%d jobs in %.2fs through three brokers at a limit of %d/s", n, elapsed, rate)
}

// TestPGConcurrencyAcrossBrokers: a concurrency limit counts the jobs
// active through every broker.
func TestPGConcurrencyAcrossBrokers(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	a, b := startPGBroker(t, ns), startPGBroker(t, ns)
	ca, cb := dial(t, a.addr()), dial(t, b.addr())
	pushMany(t, []*tclient{ca}, "conc", 10, 10)
	ca.ok(map[string]any{"cmd": "SetConcurrency", "queue": "conc", "limit": 3})
	got := len(list(t, ca.ok(map[string]any{"cmd": "PULLB", "queue": "conc", "count": 2}), "jobs"))
	got2 := list(t, cb.ok(map[string]any{"cmd": "PULLB", "queue": "conc", "count": 5}), "jobs")
	if got != 2 || len(got2) != 1 {
		t.Fatalf("claims under a limit of 3: %d through A, %d through B", got, len(got2))
	}
	lim := sub(t, sub(t, cb.ok(map[string]any{"cmd": "GetQueueLimits", "queue": "conc"}), "data"), "limits")
	if lim["maxed"] != true || num(t, lim["concurrencyLimit"]) != 3 {
		t.Fatalf("GetQueueLimits: %v", lim)
	}
	// A long poll through A is answered when B completes its job.
	id, ch := ca.send(map[string]any{"cmd": "PULL", "queue": "conc", "timeout": 10000})
	pollWaiting(t, ca)
	cb.ok(map[string]any{"cmd": "ACK", "id": got2[0].(map[string]any)["id"]})
	if r := ca.await(id, ch, 15*time.Second); r["job"] == nil {
		t.Fatalf("no job after a slot freed: %v", r)
	}
	cb.ok(map[string]any{"cmd": "ClearConcurrency", "queue": "conc"})
	if n := len(list(t, cb.ok(map[string]any{"cmd": "PULLB", "queue": "conc", "count": 10}), "jobs")); n != 6 {
		t.Fatalf("after the limit was cleared: %d jobs", n)
	}
}

// TestPGCronOncePerTick: with three brokers up, a schedule fires once per
// run: five runs make five jobs, each for a tick of its own.
func TestPGCronOncePerTick(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ps := []*serverProc{startPGBroker(t, ns), startPGBroker(t, ns), startPGBroker(t, ns)}
	c := dial(t, ps[1].addr())
	const every = 300
	added := c.ok(map[string]any{"cmd": "Cron", "name": "tick", "queue": "ticks", "data": map[string]any{"x": 1},
		"repeatEvery": every, "maxLimit": 5, "preventOverlap": false})
	phase := num(t, sub(t, added, "cron")["nextRun"])
	if l := list(t, dial(t, ps[2].addr()).ok(map[string]any{"cmd": "CronList"}), "crons"); len(l) != 1 {
		t.Fatalf("CronList through another broker: %v", l)
	}
	eventually(t, 15*time.Second, "the schedule ended after five runs", func() (bool, string) {
		a := c.call(map[string]any{"cmd": "CronGet", "name": "tick"})
		return a["ok"] == false, fmt.Sprint(a)
	})
	time.Sleep(500 * time.Millisecond)
	jobs := list(t, c.ok(map[string]any{"cmd": "GetJobs", "queue": "ticks", "limit": 100}), "jobs")
	if len(jobs) != 5 {
		t.Fatalf("%d jobs from five runs with three brokers", len(jobs))
	}
	// A run fired twice (by two brokers) makes two jobs for one tick.
	// How far apart two jobs are proves nothing: a run made late on a
	// busy machine can be followed by the next, on time, a few ms later.
	// But a run sets the next at the first tick of the schedule's phase
	// after the moment it fired, however late, so the runs of a schedule
	// fired once per tick are made in distinct intervals of the phase
	// (phase + k*every to phase + (k+1)*every), in increasing order. Two
	// jobs in one interval are one tick fired twice.
	var ats []float64
	for _, j := range jobs {
		ats = append(ats, num(t, j.(map[string]any)["createdAt"]))
	}
	slices.Sort(ats)
	prev := -1.0
	for i, at := range ats {
		k := math.Floor((at - phase) / every)
		if k <= prev {
			t.Fatalf("runs %d and %d made in the same interval of the schedule (created at %v, first run due at %v, every %d ms)",
				i, i+1, ats, phase, every)
		}
		prev = k
	}
}

// TestPGClaimReadsTheIndex: a claim on a queue filled at once, after
// autovacuum's statistics were taken without it, reads the claim index in
// order rather than sorting every ready row (which made a drain 5x
// slower).
func TestPGClaimReadsTheIndex(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	b := startPGBroker(t, ns)
	c := dial(t, b.addr())
	jobs := make([]any, 1000)
	for i := range jobs {
		jobs[i] = M{"name": "j", "data": M{"i": i}}
	}
	push := func(queue string) {
		for range 20 {
			c.ok(M{"cmd": "PUSHB", "queue": queue, "jobs": jobs})
		}
	}
	ctx, conn := pgTestConn(t)
	push("before")
	if _, err := conn.Exec(ctx, "ANALYZE queued_"+ns+".jobs"); err != nil {
		t.Fatal(err)
	}
	push("plan")
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, pgClaimPlan); err != nil {
		t.Fatal(err)
	}
	var sorts, jit string
	if err := tx.QueryRow(ctx, "SELECT current_setting('enable_sort'), current_setting('jit')").Scan(&sorts, &jit); err != nil || sorts != "off" || jit != "off" {
		t.Fatalf("in the claim's transaction: enable_sort %s, jit %s (%v)", sorts, jit, err)
	}
	q := sqlReplacer("queued_" + ns).Replace(pgClaimSQL)
	text := planText(t, tx, "EXPLAIN "+q, "plan", time.Now().UnixMilli(), 100)
	if !strings.Contains(text, "Index Scan using jobs_claim") || strings.Contains(text, "Sort") {
		t.Fatalf("claim plan on 20,000 fresh rows:\n%s", text)
	}
}

// TestPGKeysCompareByBytes: the text columns of the indexes compare byte
// by byte, and a namespace written before that (schema version 7: its
// columns under the database's collation, the record in a column named
// record, no state columns) keeps its jobs, claims them and answers them
// once migrated.
func TestPGKeysCompareByBytes(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	schema := "queued_" + ns
	b := startPGBroker(t, ns)
	c := dial(t, b.addr())
	ids := []string{}
	for _, q := range []string{"b", "a", "B"} {
		a := c.ok(M{"cmd": "PUSH", "queue": q, "name": "k", "data": M{"q": q}})
		ids = append(ids, a["id"].(string))
	}
	c.close()
	b.stop(t)

	ctx, conn := pgTestConn(t)
	collations := func() map[string]string {
		rows, err := conn.Query(ctx, `SELECT table_name || '.' || column_name, COALESCE(collation_name, '')
			FROM information_schema.columns WHERE table_schema = $1 AND data_type = 'text'
			AND column_name IN ('id', 'queue', 'group_id', 'unique_key', 'dep_id', 'job_id', 'name')`, schema)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for rows.Next() {
			var col, coll string
			if err := rows.Scan(&col, &coll); err != nil {
				t.Fatal(err)
			}
			out[col] = coll
		}
		return out
	}
	got := collations()
	for _, col := range []string{"jobs.id", "jobs.queue", "jobs.group_id", "jobs.unique_key", "deps.dep_id", "deps.job_id",
		"job_logs.job_id", "queues.name", "groups.queue", "groups.group_id", "crons.name"} {
		if got[col] != "C" {
			t.Errorf("%s: collation %q, want C", col, got[col])
		}
	}

	// Back to version 7, as an older queued left it.
	if _, err := conn.Exec(ctx, `DROP INDEX `+schema+`.jobs_children;
		DROP INDEX `+schema+`.jobs_lease;
		CREATE INDEX jobs_lease ON `+schema+`.jobs (lease_expires) WHERE state = 4;
		DROP INDEX `+schema+`.jobs_done;
		CREATE INDEX jobs_done ON `+schema+`.jobs (done_at, seq) WHERE state = 5;
		CREATE INDEX jobs_queue_state ON `+schema+`.jobs (queue, state);
		ALTER TABLE `+schema+`.jobs ALTER COLUMN id TYPE text COLLATE "default",
			ALTER COLUMN queue TYPE text COLLATE "default", ALTER COLUMN group_id TYPE text COLLATE "default",
			ALTER COLUMN unique_key TYPE text COLLATE "default";
		ALTER TABLE `+schema+`.deps ALTER COLUMN dep_id TYPE text COLLATE "default", ALTER COLUMN job_id TYPE text COLLATE "default";
		ALTER TABLE `+schema+`.job_logs ALTER COLUMN job_id TYPE text COLLATE "default";
		ALTER TABLE `+schema+`.queues ALTER COLUMN name TYPE text COLLATE "default";
		ALTER TABLE `+schema+`.groups ALTER COLUMN queue TYPE text COLLATE "default", ALTER COLUMN group_id TYPE text COLLATE "default";
		ALTER TABLE `+schema+`.crons ALTER COLUMN name TYPE text COLLATE "default";
		ALTER TABLE `+schema+`.jobs RENAME COLUMN body TO record;
		ALTER TABLE `+schema+`.jobs DROP COLUMN started_at, DROP COLUMN plain;
		DROP TABLE `+schema+`.inbox;
		DELETE FROM `+schema+`.chores WHERE name = 'analyze';
		DROP TABLE `+schema+`.handlers;
		DROP INDEX `+schema+`.jobs_set_aside;
		ALTER TABLE `+schema+`.jobs DROP COLUMN data;
		DROP FUNCTION `+schema+`.push, `+schema+`.push_many, `+schema+`.push_one, `+schema+`.push_num, `+schema+`.push_str, `+schema+`.push_bound;
		UPDATE `+schema+`.schema_version SET version = 7`); err != nil {
		t.Fatal(err)
	}
	if got := collations()["jobs.id"]; got == "C" {
		t.Fatal("the downgrade left jobs.id in C")
	}
	b = startPGBroker(t, ns)
	c = dial(t, b.addr())
	defer c.close()
	if got := collations(); got["jobs.id"] != "C" || got["queues.name"] != "C" || got["deps.job_id"] != "C" {
		t.Fatalf("after the migration: %v", got)
	}
	var v int
	if err := conn.QueryRow(ctx, `SELECT version FROM `+schema+`.schema_version`).Scan(&v); err != nil || v != len(pgMigrations) {
		t.Fatalf("schema version %d (%v), want %d", v, err, len(pgMigrations))
	}
	for i, q := range []string{"b", "a", "B"} {
		j := c.ok(M{"cmd": "PULL", "queue": q})["job"].(map[string]any)
		if j["id"] != ids[i] {
			t.Fatalf("queue %s: pulled %v, want %s", q, j["id"], ids[i])
		}
		c.ok(M{"cmd": "ACK", "id": ids[i]})
		if st := c.ok(M{"cmd": "GetState", "id": ids[i]}); st["state"] != "completed" {
			t.Fatalf("job %s after ACK: %v", ids[i], st)
		}
	}
}

// TestPGQueueReadsUseIndexes: there is no index over every job row (a
// row's state changes enter each new version in every index whose
// predicate it meets), so each read of a queue's jobs must find them in
// the indexes of their states. With sequential scans priced out, a plan
// that still scans the table is one no index serves: counts, listings,
// deletions and retention, for every state they name.
func TestPGQueueReadsUseIndexes(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ctx := context.Background()
	p, _ := openTestPG(t, ctx, ns, pgOptions{})
	stmts := map[string][]any{
		pgCountsSQL:                  {"q", int64(1)},
		pgDeleteJobsSQL(pgAnyState):  {"q"},
		pgActiveCountSQL:             {"q"},
		pgRetainBatchSQL:             {int64(1), int64(2), 1000, "q"},
		pgRetainNthSQL:               {100},
		pgDoneQueuesSQL:              {int64(1), int64(2)},
		pgDeleteJobsSQL("state = 1"): {"q"},
	}
	for _, state := range []int{pgQueued, pgActive} {
		stmts[pgGroupJobsSQL(int16(state))] = []any{"q", ""}
	}
	for _, st := range []string{"", "waiting", "delayed", "active", "completed", "failed", "waiting-children"} {
		where := jobsWhere(jobsQuery{want: []string{st}}, false)
		if st == "" {
			where = jobsWhere(jobsQuery{}, false)
		}
		stmts[`SELECT id`+pgJobsPageFrom(where, "ASC")+` OFFSET 0 LIMIT 10`] = []any{"q", int64(1)}
	}
	stmts[`SELECT id`+pgJobsPageFrom(jobsWhere(jobsQuery{want: []string{"waiting", "completed", "failed"}}, false), "DESC")] = []any{"q", int64(1)}
	for _, where := range pgCleanWhere {
		stmts[`SELECT id FROM {s}.jobs WHERE queue = $1 AND `+where+` LIMIT $3 FOR UPDATE SKIP LOCKED`] = []any{"q", int64(1), 10}
	}
	for sql, args := range stmts {
		tx, err := p.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN "+p.sql(sql), args...)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		tx.Rollback(ctx)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		plan := strings.Join(lines, "\n")
		if strings.Contains(plan, "Seq Scan on jobs") {
			t.Errorf("no index serves\n%s\nplan:\n%s", sql, plan)
		}
	}
}

// planText runs an EXPLAIN on q and answers its plan as text.
func planText(t *testing.T, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, explain string, args ...any) string {
	t.Helper()
	rows, err := q.Query(context.Background(), explain, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
