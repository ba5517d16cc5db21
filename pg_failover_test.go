package main

// Failover: the database's primary dies under load and its synchronous
// standby is promoted. The brokers reach PostgreSQL through a two-host
// URL with target_session_attrs=read-write, as docs/postgresql.md tells
// (Failover), and go on with the new primary without a restart.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgPair is a PostgreSQL primary of the test's own and a standby that
// streams from it synchronously, each on a free port of 127.0.0.1, in one
// temporary directory.
type pgPair struct {
	t                *testing.T
	primary, standby *privatePG
	ports            [2]int
	killed           bool // the primary: nothing left to stop
}

// failoverStandby is the standby's application_name, which the
// primary's synchronous_standby_names names.
const failoverStandby = "queued_standby"

// startPGPair makes the primary, starts it, copies it with pg_basebackup
// into the standby and starts that, and waits until the primary counts
// the standby as synchronous. PostgreSQL refuses to run as root: as root
// the programs run as the postgres user (privatePG.run), in a directory
// it owns. fsync is off on both, for speed: it matters when a machine
// loses power, and here only the primary's processes die, the machine
// (its page cache) goes on. synchronous_commit is on, so a commit is
// answered once the standby has the transaction.
func startPGPair(t *testing.T) *pgPair {
	t.Helper()
	bin := pgServerBin(t)
	dir, err := os.MkdirTemp("", "queued-failover-")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgPair{t: t}
	node := func(name string) *privatePG {
		return &privatePG{t: t, bin: bin, data: filepath.Join(dir, name), log: filepath.Join(dir, name+".log")}
	}
	p.primary, p.standby = node("primary"), node("standby")
	t.Cleanup(func() {
		if t.Failed() {
			for _, pg := range []*privatePG{p.primary, p.standby} {
				b, _ := os.ReadFile(pg.log)
				t.Logf("%s, its end:\n%s", pg.log, b[max(0, len(b)-4000):])
			}
		}
		os.RemoveAll(dir)
	})
	chownPostgres(t, dir)
	// Dynamic shared memory in files of the data directory, which go
	// with it: the primary is killed, and segments in /dev/shm would
	// outlive it.
	common := fmt.Sprintf("-k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100 -c dynamic_shared_memory_type=mmap", dir)
	p.primary.run("initdb", "-D", p.primary.data, "-A", "trust", "-U", "postgres", "--no-sync")
	// On the primary's command line, not in its files: pg_basebackup
	// copies the files, and a promoted standby that named a standby of
	// its own in synchronous_standby_names would wait for it at every
	// commit. Each port is taken just before its server starts.
	p.ports[0] = freePort(t)
	p.primary.opts = fmt.Sprintf("-p %d %s -c synchronous_commit=on -c synchronous_standby_names=%s",
		p.ports[0], common, failoverStandby)
	p.start(p.primary)
	p.primary.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(p.ports[0]), "-U", "postgres",
		"-D", p.standby.data, "-R", "-c", "fast", "--no-sync")
	// pg_ctl runs the server through the shell: the quotes hold the
	// conninfo together. -R above wrote standby.signal.
	p.ports[1] = freePort(t)
	p.standby.opts = fmt.Sprintf("-p %d %s -c primary_conninfo='host=127.0.0.1 port=%d user=postgres application_name=%s'",
		p.ports[1], common, p.ports[0], failoverStandby)
	p.start(p.standby)
	p.waitSync()
	return p
}

// start starts one server and stops it (immediate mode) when the test
// ends, unless it was killed.
func (p *pgPair) start(pg *privatePG) {
	p.t.Helper()
	if p.t.Failed() {
		p.t.FailNow() // what came before (initdb, pg_basebackup) failed
	}
	p.t.Cleanup(func() {
		if pg != p.primary || !p.killed {
			pg.run("pg_ctl", "-D", pg.data, "-m", "immediate", "-w", "stop")
		}
	})
	pg.run("pg_ctl", "-D", pg.data, "-o", pg.opts, "-w", "-t", "60", "-l", pg.log, "start")
	if p.t.Failed() {
		p.t.FailNow()
	}
}

// waitSync waits until the primary streams to the standby synchronously.
func (p *pgPair) waitSync() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", p.ports[0]))
	if err != nil {
		p.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	eventually(p.t, 30*time.Second, "the standby synchronous", func() (bool, string) {
		var state string
		err := conn.QueryRow(ctx, `SELECT coalesce(max(sync_state), 'not connected') FROM pg_stat_replication
			WHERE application_name = $1 AND state = 'streaming'`, failoverStandby).Scan(&state)
		if err != nil {
			p.t.Fatal(err)
		}
		return state == "sync", state
	})
}

// url names both servers, the one that takes writes to be chosen.
func (p *pgPair) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?target_session_attrs=read-write", p.ports[0], p.ports[1])
}

// killPrimary kills every process of the primary with SIGKILL, as when
// its machine dies: the postmaster is stopped first (SIGSTOP), so that it
// neither starts a backend nor sees its children die (it would kill and
// restart them), then its children and it are killed. Killing the
// postmaster alone would leave its backends to notice within moments
// (each is in a process group of its own).
func (p *pgPair) killPrimary() {
	p.t.Helper()
	b, err := os.ReadFile(filepath.Join(p.primary.data, "postmaster.pid"))
	if err != nil {
		p.t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 1 {
		p.t.Fatalf("postmaster.pid: %q", b)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		p.t.Fatalf("kill -STOP %d: %v", pid, err)
	}
	procs := append(childrenOf(pid), pid)
	for _, c := range procs {
		syscall.Kill(c, syscall.SIGKILL)
	}
	p.killed = true
	// A postmaster killed leaves its System V segment (line 7 of
	// postmaster.pid: key and id), which a clean stop removes: removed
	// here, once no process of the server is attached.
	if lines := strings.Split(string(b), "\n"); len(lines) > 6 {
		if f := strings.Fields(lines[6]); len(f) == 2 {
			if id, err := strconv.Atoi(f[1]); err == nil {
				p.t.Cleanup(func() { syscall.Syscall(syscall.SYS_SHMCTL, uintptr(id), 0 /* IPC_RMID */, 0) })
			}
		}
	}
	p.t.Logf("killed the primary's %d processes", len(procs))
}

// childrenOf lists the processes whose parent is pid (from /proc).
func childrenOf(pid int) []int {
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // ended meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			if c, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// promote makes the standby the primary and waits until it takes writes.
func (p *pgPair) promote() {
	p.t.Helper()
	p.standby.run("pg_ctl", "-D", p.standby.data, "-w", "-t", "60", "promote")
	if p.t.Failed() {
		p.t.FailNow()
	}
}

// TestPGFailover: two brokers on a primary with a synchronous standby,
// through the two-host URL. A producer pushes 6,000 jobs with custom ids
// through both (retrying each until a broker acknowledges it, looking it
// up first, as faultProducer does) and four workers pull and ACK through
// both with 4 s leases. After 1,000 pushes, every process of the primary
// is killed with SIGKILL; once each broker has refused a push, and 4 s
// after the kill, the standby is promoted and the load goes on. Then: every acknowledged push
// is found by its custom id and completed, no job has ACKs answered ok
// under two lease tokens, the completed count is the pushes', and both brokers
// push, pull and ACK without a restart. How long they took to come back
// is logged (docs/postgresql.md, Failover, quotes it).
func TestPGFailover(t *testing.T) {
	t.Parallel()
	p := startPGPair(t)
	args := []string{"--postgres-url", p.url(), "--postgres-namespace", "failover"}
	brokers := []*serverProc{startBinary(t, args...), startBinary(t, args...)}
	const q, jobs = "failover", 6000
	load := startFaultLoad(t, brokers, q, jobs)
	l, producers, pushed, halt := load.l, load.producers, load.pushed, load.halt
	// The rest, pushed after the promotion, goes faster: the new primary
	// has no standby to wait for.
	eventually(t, 90*time.Second, "1,000 pushes acknowledged, 500 jobs ACKed", func() (bool, string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.pushed) >= 1000 && len(l.applied) >= 500, fmt.Sprint(len(l.pushed), " pushed, ", len(l.applied), " ACKed")
	})
	l.mu.Lock()
	before := len(l.pushed)
	l.mu.Unlock()
	if before >= jobs {
		t.Fatalf("all %d pushes were acknowledged before the kill: the primary would not die under load", jobs)
	}
	began := time.Now()
	failover(t, p, brokers, 4*time.Second)
	promoted := time.Now()
	select {
	case <-pushed:
	case <-time.After(2 * time.Minute):
		t.Fatal("the producer did not finish within 2 minutes of the promotion")
	}
	t.Logf("%d pushes acknowledged %v after the start, before the kill; the rest until %v after the promotion",
		before, began.Sub(l.start).Round(time.Millisecond), time.Since(promoted).Round(time.Millisecond))
	failoverCheck(t, l, producers, q, jobs)
	halt()
	for i, b := range brokers {
		serveThrough(t, b, i)
		select {
		case <-b.done:
			t.Fatalf("broker %d exited:\n%s", i, b.output())
		default:
		}
	}
}

// failover kills the primary and keeps it dead for outage (a failover
// manager takes seconds to decide), checking meanwhile that each broker
// answers a push with an error and says degraded on /health; then it
// promotes the standby and waits until each broker pushes again, is
// healthy and has its wake-up listener back, logging how long each took.
func failover(t *testing.T, p *pgPair, brokers []*serverProc, outage time.Duration) {
	t.Helper()
	var probes []*tclient
	for _, b := range brokers {
		probes = append(probes, dial(t, b.addr()))
	}
	push := func(c *tclient) (map[string]any, error) {
		return c.do(M{"cmd": "PUSH", "queue": "probe", "data": 1}, 10*time.Second)
	}
	// The listeners' reconnections so far: only one after the kill counts.
	const relisten = "postgres wake-ups listening again"
	before := make([]int, len(brokers))
	for i, b := range brokers {
		before[i] = strings.Count(b.output(), relisten)
	}
	p.killPrimary()
	killed := time.Now()
	for i, c := range probes {
		eventually(t, 20*time.Second, fmt.Sprint("broker ", i, " refuses a push"), func() (bool, string) {
			a, err := push(c)
			return err != nil || a["ok"] != true, fmt.Sprint(a)
		})
		eventually(t, 20*time.Second, fmt.Sprint("broker ", i, "'s /health degraded"), func() (bool, string) {
			code, doc := health(t, brokers[i].httpPort)
			return code == 503 && doc["status"] == "degraded", fmt.Sprint(code, doc)
		})
	}
	refused := time.Since(killed)
	time.Sleep(time.Until(killed.Add(outage)))
	p.promote()
	promoted := time.Now()
	back := failoverBack(t, brokers, probes, promoted, push, func(i int) bool {
		return strings.Count(brokers[i].output(), relisten) > before[i]
	})
	t.Logf("primary killed; both brokers refusing pushes and degraded %v later; standby promoted %v after the kill; "+
		"after the promotion, pushes through the brokers again %v, /health healthy %v, wake-up listeners back %v",
		refused.Round(time.Millisecond), promoted.Sub(killed).Round(time.Millisecond), back[0], back[1], back[2])
}

// failoverBack waits until each broker pushes again, says healthy and
// has its wake-up listener back (relistened: broker i logged a new
// connection since the kill), and answers when each was seen, after the
// promotion.
func failoverBack(t *testing.T, brokers []*serverProc, probes []*tclient, promoted time.Time,
	push func(*tclient) (map[string]any, error), relistened func(i int) bool) [3][]time.Duration {
	t.Helper()
	var back [3][]time.Duration
	for k := range back {
		back[k] = make([]time.Duration, len(brokers))
	}
	eventually(t, 30*time.Second, "both brokers back after the promotion", func() (bool, string) {
		var missing []string
		for i, b := range brokers {
			if back[0][i] == 0 {
				if a, err := push(probes[i]); err == nil && a["ok"] == true {
					back[0][i] = time.Since(promoted).Round(time.Millisecond)
				} else {
					missing = append(missing, fmt.Sprint("broker ", i, " push: ", err, a["error"]))
				}
			}
			if back[1][i] == 0 {
				if code, doc := health(t, b.httpPort); code == 200 && doc["status"] == "healthy" {
					back[1][i] = time.Since(promoted).Round(time.Millisecond)
				} else {
					missing = append(missing, fmt.Sprint("broker ", i, " /health: ", code, doc))
				}
			}
			if back[2][i] == 0 {
				if relistened(i) {
					back[2][i] = time.Since(promoted).Round(time.Millisecond)
				} else {
					missing = append(missing, fmt.Sprint("broker ", i, ": no wake-ups listening again in the log"))
				}
			}
		}
		return len(missing) == 0, strings.Join(missing, "; ")
	})
	return back
}

// failoverCheck waits until every acknowledged push has completed, then
// looks each up by its custom id (through both brokers in turn) and
// reads the ledger: each push acknowledged, each job completed, none
// with ACKs answered ok under two lease tokens.
func failoverCheck(t *testing.T, l *faultLedger, clients []*tclient, q string, jobs int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var counts map[string]any
	for {
		counts = countsOf(t, clients[0], q)
		if toFloat(counts["completed"]) >= float64(jobs) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pushed) != jobs {
		t.Errorf("%d of %d pushes acknowledged", len(l.pushed), jobs)
	}
	type lookup struct {
		id            string
		c             *tclient
		byCustom, st  string
		byCh, stateCh chan map[string]any
	}
	var ls []*lookup
	for i := range jobs {
		lk := &lookup{id: fmt.Sprintf("f-%d", i), c: clients[i%len(clients)]}
		lk.byCustom, lk.byCh = lk.c.send(M{"cmd": "GetJobByCustomId", "customId": lk.id})
		lk.st, lk.stateCh = lk.c.send(M{"cmd": "GetState", "id": lk.id})
		ls = append(ls, lk)
	}
	bad := 0
	for _, lk := range ls {
		a := lk.c.await(lk.byCustom, lk.byCh, 30*time.Second)
		s := lk.c.await(lk.st, lk.stateCh, 30*time.Second)
		job, _ := a["job"].(map[string]any)
		if l.pushed[lk.id] && (a["ok"] != true || job["id"] != lk.id || s["state"] != "completed") {
			if bad++; bad <= 20 {
				t.Errorf("acknowledged push %s: by custom id %v, state %v:\n  %s", lk.id, a, s, strings.Join(l.trace[lk.id], "\n  "))
			}
		}
	}
	failed, found := 0, 0
	for _, tr := range l.trace {
		for _, e := range tr {
			if strings.Contains(e, "push through") && strings.Contains(e, " failed: ") {
				failed++
			}
			if strings.Contains(e, "after a push with no answer") {
				found++
			}
		}
	}
	twice := l.noDoubleAck(t)
	if toFloat(counts["completed"]) != float64(jobs) {
		t.Errorf("%v jobs completed, %d pushed: %v", counts["completed"], jobs, counts)
	}
	t.Logf("%d jobs: %d pushes failed (%d of their jobs then found by the lookup), %d acknowledged pushes not completed, "+
		"%d claims redelivered, %d ACKs unanswered or refused, %d double", jobs, failed, found, bad, l.redeliv, l.unknown, twice)
}

// serveThrough pushes, pulls and acknowledges a job through one broker.
func serveThrough(t *testing.T, b *serverProc, i int) {
	t.Helper()
	c := dial(t, b.addr())
	q := fmt.Sprint("after-", i)
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": q, "jobId": q, "data": i}), "id")
	a := c.ok(M{"cmd": "PULL", "queue": q, "owner": "after", "timeout": 5000})
	if job, _ := a["job"].(map[string]any); job == nil || job["id"] != id {
		t.Fatalf("broker %d: pulled %v after the failover, want %s", i, a, id)
	}
	c.ok(M{"cmd": "ACK", "id": id, "token": a["token"]})
	if st := c.ok(M{"cmd": "GetState", "id": id}); st["state"] != "completed" {
		t.Fatalf("broker %d: after its ACK: %v", i, st)
	}
}
