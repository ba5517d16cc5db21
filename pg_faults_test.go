package main

// PostgreSQL faults under load: the brokers reach the database through a
// proxy that resets connections and blackholes traffic on a schedule
// while a producer pushes and workers pull and acknowledge through both
// brokers. Counted per job: every acknowledged push completes, no job has
// two applied ACKs (ACKs answered ok under two different lease tokens),
// and no session is left idle in a transaction once the faults end.

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// faultProxy forwards TCP connections to PostgreSQL and breaks them on
// command. reset closes every connection at once (both sides, as a
// peer's RST: the database rolls back what was open). partition holds
// every byte in flight both ways and stalls new connections, as a
// network that stops delivering; heal ends it by closing every
// connection, or with leaveDB only the brokers' sides: then the
// database's stay open, as after a real partition the database does not
// learn that its peer has gone (only a timeout of its own ends those
// sessions).
type faultProxy struct {
	t      *testing.T
	target string
	ln     net.Listener

	mu      sync.Mutex
	links   map[*proxyLink]bool
	gate    chan struct{} // closed while traffic flows
	orphans []net.Conn    // database sides a heal left open
	// leaveDB: heal leaves the database's sides open, as a partition the
	// database does not notice; otherwise they close too (the fault
	// tests under load share the database, and its connections, with
	// the other tests).
	leaveDB bool
	wg      sync.WaitGroup
	closed  bool
}

type proxyLink struct {
	down, up net.Conn
	dead     atomic.Bool // cut by reset or heal: its pipes stop
}

// newFaultProxy forwards to the test database.
func newFaultProxy(t *testing.T) *faultProxy {
	t.Helper()
	u, err := url.Parse(testPGURL())
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	close(open)
	p := &faultProxy{t: t, target: target, ln: ln, links: map[*proxyLink]bool{}, gate: open}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.link(c)
	}
}

// link connects c to the database once traffic flows: a connection
// opened during a partition goes through when it heals, as a SYN sent
// again would.
func (p *faultProxy) link(c net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	<-gate
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	l := &proxyLink{down: c, up: up}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.links[l] = true
	p.mu.Unlock()
	p.wg.Add(2)
	go p.pipe(l, up, c)
	go p.pipe(l, c, up)
}

// pipe copies src to dst, holding what it read while traffic is stopped.
func (p *faultProxy) pipe(l *proxyLink, dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			<-gate
			if l.dead.Load() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			break
		}
	}
	if l.dead.Load() {
		return
	}
	l.down.Close()
	l.up.Close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// reset closes every connection, both sides, with an RST.
func (p *faultProxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.dead.Store(true)
		for _, c := range []net.Conn{l.down, l.up} {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
			c.Close()
		}
	}
	p.links = map[*proxyLink]bool{}
}

// partition stops all traffic until heal.
func (p *faultProxy) partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = make(chan struct{})
}

// heal closes the brokers' side of every connection (the database's stay
// open) and lets traffic flow again.
func (p *faultProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.dead.Store(true)
		l.down.Close()
		if p.leaveDB {
			p.orphans = append(p.orphans, l.up)
		} else {
			l.up.Close()
		}
	}
	p.links = map[*proxyLink]bool{}
	close(p.gate)
}

func (p *faultProxy) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.ln.Close()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
	for l := range p.links {
		l.dead.Store(true)
		l.down.Close()
		l.up.Close()
	}
	for _, c := range p.orphans {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// url is the test database's URL through the proxy, with a small pool:
// the fault tests share the database with the others, within its
// max_connections.
func (p *faultProxy) url() string {
	u, err := url.Parse(testPGURL())
	if err != nil {
		p.t.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	q := u.Query()
	q.Set("pool_max_conns", "4")
	u.RawQuery = q.Encode()
	return u.String()
}

// faultLedger is what the clients saw, per job.
type faultLedger struct {
	mu      sync.Mutex
	start   time.Time
	pushed  map[string]bool              // pushes answered ok
	applied map[string]map[string]string // job -> token -> how its ACK was answered ok
	trace   map[string][]string          // job -> what happened to it, for a failure's report
	unknown int                          // ACKs with no answer or an error
	redeliv int                          // claims of a job claimed before
	claimed map[string]int
}

func newFaultLedger() *faultLedger {
	return &faultLedger{start: time.Now(), pushed: map[string]bool{}, applied: map[string]map[string]string{},
		trace: map[string][]string{}, claimed: map[string]int{}}
}

func (l *faultLedger) note(id, format string, args ...any) {
	l.trace[id] = append(l.trace[id], fmt.Sprintf("%7.3fs ", time.Since(l.start).Seconds())+fmt.Sprintf(format, args...))
}

// faultProducer pushes jobs f-0..f-(n-1) with custom ids, each until a
// broker acknowledges it, trying the brokers in turn. A push whose answer
// was lost may have been written, and its job even worked and completed
// since: before pushing again, the producer looks the id up, as
// docs/postgresql.md tells a client to (a push of a completed job's
// custom id makes a new job, as in the reference).
func faultProducer(l *faultLedger, clients []*tclient, queue string, n int) {
	k := 0
	deadline := time.Now().Add(3 * time.Minute)
	for i := range n {
		id := fmt.Sprintf("f-%d", i)
		uncertain := false
		for time.Now().Before(deadline) {
			c := clients[k%len(clients)]
			k++
			if uncertain {
				a, err := c.do(map[string]any{"cmd": "GetJob", "id": id}, 3*time.Second)
				notFound := err == nil && a["ok"] == false && a["error"] == errJobNotFound.Error()
				if !notFound && (err != nil || a["ok"] != true) {
					retryPause()
					continue
				}
				if !notFound {
					l.mu.Lock()
					l.pushed[id] = true
					l.note(id, "found through %s after a push with no answer", c.peer())
					l.mu.Unlock()
					break
				}
			}
			a, err := c.do(map[string]any{"cmd": "PUSH", "queue": queue, "jobId": id, "data": map[string]any{"i": i}}, 3*time.Second)
			l.mu.Lock()
			if err == nil && a["ok"] == true {
				l.pushed[id] = true
				l.note(id, "pushed through %s", c.peer())
				l.mu.Unlock()
				break
			}
			uncertain = true
			l.note(id, "push through %s failed: %v %v", c.peer(), err, a["error"])
			l.mu.Unlock()
			retryPause()
		}
	}
}

// faultWorker pulls one job at a time with a 4 s lease and acknowledges
// it with its token, going on through errors, until stop.
func faultWorker(l *faultLedger, c *tclient, queue, owner string, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		a, err := c.do(map[string]any{"cmd": "PULL", "queue": queue, "owner": owner, "lockTtl": 4000, "timeout": 300}, 5*time.Second)
		if err != nil || a["ok"] != true {
			retryPause()
			continue
		}
		job, _ := a["job"].(map[string]any)
		if job == nil {
			continue
		}
		id, _ := job["id"].(string)
		token, _ := a["token"].(string)
		l.mu.Lock()
		if l.claimed[id] > 0 {
			l.redeliv++
		}
		l.claimed[id]++
		l.note(id, "claimed through %s by %s, token %s", c.peer(), owner, token)
		l.mu.Unlock()
		r, err := c.do(map[string]any{"cmd": "ACK", "id": id, "token": token}, 5*time.Second)
		l.mu.Lock()
		switch {
		case err != nil:
			l.unknown++
			l.note(id, "ACK token %s through %s: %v", token, c.peer(), err)
		case r["ok"] != true:
			l.unknown++
			l.note(id, "ACK token %s through %s refused: %v", token, c.peer(), r["error"])
		default:
			if l.applied[id] == nil {
				l.applied[id] = map[string]string{}
			}
			l.applied[id][token] = c.peer()
			l.note(id, "ACK token %s through %s applied", token, c.peer())
		}
		l.mu.Unlock()
	}
}

// faultLoad is the fault tests' load: a producer pushing jobs with
// custom ids through every broker in turn, and four workers pulling and
// ACKing with 4 s leases through the brokers in turn.
type faultLoad struct {
	l         *faultLedger
	producers []*tclient    // a connection to each broker, the producer's
	pushed    chan struct{} // closed once every push is acknowledged
	halt      func()        // stops the workers and waits for them; again, nothing
}

// startFaultLoad starts the load on queue q; the workers stop at the
// test's end at the latest.
func startFaultLoad(t *testing.T, brokers []*serverProc, q string, jobs int) *faultLoad {
	t.Helper()
	load := &faultLoad{l: newFaultLedger(), pushed: make(chan struct{})}
	for _, b := range brokers {
		load.producers = append(load.producers, dial(t, b.addr()))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	load.halt = func() { once.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(load.halt)
	for i := range 4 {
		c := dial(t, brokers[i%len(brokers)].addr())
		wg.Go(func() { faultWorker(load.l, c, q, fmt.Sprint("w", i), stop) })
	}
	go func() {
		defer close(load.pushed)
		faultProducer(load.l, load.producers, q, jobs)
	}()
	return load
}

// noDoubleAck fails the test for each job whose ACKs were answered ok
// under more than one lease token, with its trace, and answers how many
// there were; l.mu is held.
func (l *faultLedger) noDoubleAck(t *testing.T) int {
	t.Helper()
	var twice []string
	for id, toks := range l.applied {
		if len(toks) > 1 {
			twice = append(twice, id)
		}
	}
	sort.Strings(twice)
	for _, id := range twice {
		t.Errorf("job %s: ACKs answered ok under %d tokens:\n  %s", id, len(l.applied[id]), strings.Join(l.trace[id], "\n  "))
	}
	return len(twice)
}

// faultStep is one fault at an offset from the start.
type faultStep struct {
	at time.Duration
	do func()
}

// runFaults drives the load through brokers while steps run, then waits
// until every acknowledged push is completed and checks the ledger.
func runFaults(t *testing.T, dbURL, ns string, brokers []*serverProc, steps []faultStep, jobs int) {
	t.Helper()
	const q = "faults"
	load := startFaultLoad(t, brokers, q, jobs)
	l, pushed := load.l, load.pushed
	var admins []*tclient
	for _, s := range steps {
		time.Sleep(time.Until(l.start.Add(s.at)))
		s.do()
	}
	select {
	case <-pushed:
	case <-time.After(2 * time.Minute):
		t.Fatal("the producer did not finish within 2 minutes of the faults")
	}
	for _, b := range brokers {
		admins = append(admins, dial(t, b.addr()))
	}
	eventually(t, 90*time.Second, "every acknowledged push completed", func() (bool, string) {
		c, err := admins[0].do(map[string]any{"cmd": "GetJobCounts", "queue": q}, 5*time.Second)
		if err != nil || c["ok"] != true {
			return false, fmt.Sprint(c, err)
		}
		counts, _ := c["counts"].(map[string]any)
		return toFloat(counts["completed"]) >= float64(jobs), fmt.Sprint(counts)
	})
	load.halt()
	// The database's sides of connections a partition cut stay open (as
	// after a real one); those cut inside a transaction are ended by the
	// sessions' idle transaction timeout, and their locks freed.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	idleInTx := func() (int, string) {
		var n int
		var what string
		err := conn.QueryRow(ctx, `SELECT count(*), coalesce(string_agg(left(query, 80), ' | '), '') FROM pg_stat_activity
			WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, pgAppName(ns, "")).Scan(&n, &what)
		if err != nil {
			t.Fatal(err)
		}
		return n, what
	}
	n, what := idleInTx()
	t.Logf("sessions idle in a transaction once the jobs are done: %d %s", n, what)
	eventually(t, 20*time.Second, "no session idle in a transaction", func() (bool, string) {
		n, what := idleInTx()
		return n == 0, fmt.Sprint(n, " ", what)
	})

	l.mu.Lock()
	defer l.mu.Unlock()
	twice := l.noDoubleAck(t)
	if len(l.pushed) != jobs {
		t.Errorf("%d of %d pushes acknowledged", len(l.pushed), jobs)
	}
	counts := countsOf(t, admins[0], q)
	if n := toFloat(counts["completed"]); n != float64(jobs) {
		t.Errorf("%v jobs completed, %d pushed: %v", n, jobs, counts)
	}
	t.Logf("%d jobs: %d claims redelivered, %d ACKs unanswered or refused, %d double", jobs, l.redeliv, l.unknown, twice)
	for i, b := range brokers {
		select {
		case <-b.done:
			t.Fatalf("broker %d exited:\n%s", i, b.output())
		default:
		}
	}
}

// TestPGFaultsBothBrokers: both brokers reach the database through the
// proxy, which resets and partitions them on a schedule.
func TestPGFaultsBothBrokers(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	px := newFaultProxy(t)
	args := []string{"--postgres-url", px.url(), "--postgres-namespace", ns, "--postgres-idle-transaction-timeout", "3000"}
	a, b := startBinary(t, args...), startBinary(t, args...)
	runFaults(t, testPGURL(), ns, []*serverProc{a, b}, []faultStep{
		{2 * time.Second, px.reset},
		{4 * time.Second, px.partition},
		{8 * time.Second, px.heal},
		{10 * time.Second, px.reset},
		{12 * time.Second, px.partition},
		{14 * time.Second, px.heal},
	}, 3000)
}

// TestPGFaultsOneBroker: one broker is cut off while the other, straight
// to the database, works on.
func TestPGFaultsOneBroker(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	px := newFaultProxy(t)
	a := startBinary(t, "--postgres-url", px.url(), "--postgres-namespace", ns, "--postgres-idle-transaction-timeout", "3000")
	b := startPGBroker(t, ns)
	runFaults(t, testPGURL(), ns, []*serverProc{a, b}, []faultStep{
		{3 * time.Second, px.partition},
		{9 * time.Second, px.heal},
		{11 * time.Second, px.reset},
	}, 3000)
}

// TestPGLatePushFreesNoCustomID: a push written late (its broker's
// connection broke, the client pushed again elsewhere, and the job was
// made, worked and completed meanwhile) answers the completed job rather
// than make it again; a push that comes after the completion makes a new
// job, as the reference does. Found by TestPGFaultsOneBroker: a job
// completed twice, both ACKs applied.
func TestPGLatePushFreesNoCustomID(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	c := dial(t, startPGBroker(t, ns).addr())
	b := NewBroker()
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := OpenPG(ctx, testPGURL(), ns, b, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	const q = "late"
	came := p.now() // the late push reaches its broker (a completion in the same ms frees nothing either)
	c.ok(M{"cmd": "PUSH", "queue": q, "jobId": "x", "data": 1})
	a := c.ok(M{"cmd": "PULL", "queue": q, "owner": "w"})
	c.ok(M{"cmd": "ACK", "id": "x", "token": a["token"]})
	push := func(at int64) ([]string, int) {
		t.Helper()
		j := mustJob(t, q, map[string]any{"jobId": "x", "data": 2})
		j.warm().arrived = at
		ids, made, err := p.Push(ctx, q, []*Job{j}, false).Wait()
		if err != nil {
			t.Fatal(err)
		}
		return ids, made
	}
	if ids, made := push(came); made != 0 || len(ids) != 1 || ids[0] != "x" {
		t.Fatalf("late push: ids %v, made %d; want the completed job's id, none made", ids, made)
	}
	if st := c.ok(M{"cmd": "GetState", "id": "x"}); st["state"] != "completed" {
		t.Fatalf("after the late push: %v", st)
	}
	if ids, made := push(p.now()); made != 1 || len(ids) != 1 || ids[0] != "x" {
		t.Fatalf("push after the completion: ids %v, made %d; want a new job x", ids, made)
	}
	if st := c.ok(M{"cmd": "GetState", "id": "x"}); st["state"] != "waiting" {
		t.Fatalf("after a push that came after the completion: %v", st)
	}
}

// TestPGPartitionFreesLocks: a broker cut off in the middle of a
// transaction holding a job's row lock. The database cannot tell it from
// a slow peer; its session ends after the idle transaction timeout, and
// the lock with it. The sessions carry the namespace's name and the
// keepalive settings.
func TestPGPartitionFreesLocks(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	px := newFaultProxy(t)
	px.leaveDB = true
	b := NewBroker()
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	session := defaultPGSession
	session.idleTxTimeout = 1500
	p, err := openPG(ctx, px.url(), ns, b, quietLog(), pgOptions{session: &session})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ids, _, err := p.Push(ctx, "locks", []*Job{mustJob(t, "locks", map[string]any{"data": 1})}, false).Wait()
	if err != nil {
		t.Fatal(err)
	}
	var keepIdle, app string
	if err := p.pool.QueryRow(ctx, `SELECT current_setting('tcp_keepalives_idle'), current_setting('application_name')`).Scan(&keepIdle, &app); err != nil {
		t.Fatal(err)
	}
	if keepIdle != "10" || app != "queued "+ns {
		t.Fatalf("session: tcp_keepalives_idle %s, application_name %q", keepIdle, app)
	}

	tx, err := p.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET priority = 1 WHERE id = $1`), ids[0]); err != nil {
		t.Fatal(err)
	}
	px.partition()
	px.heal() // the broker's side closed; the database's left open
	tx.Rollback(context.Background())

	_, conn := pgTestConn(t)
	held := func() (bool, string) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%'`,
			pgAppName(ns, "")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0, fmt.Sprint(n, " sessions idle in a transaction")
	}
	if h, what := held(); !h {
		t.Fatalf("the cut transaction's session is not seen: %s", what)
	}
	began := time.Now()
	eventually(t, 20*time.Second, "the cut session ended", func() (bool, string) {
		h, what := held()
		return !h, what
	})
	t.Logf("the cut transaction's session ended %v after the cut (timeout 1.5 s)", time.Since(began).Round(time.Millisecond))
	if _, err := conn.Exec(ctx, `SET lock_timeout = '2s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT 1 FROM queued_`+ns+`.jobs WHERE id = $1 FOR UPDATE`, ids[0]); err != nil {
		t.Fatalf("the job's row is still locked: %v", err)
	}
}

// privatePG is a PostgreSQL server of the test's own, which it may
// restart: the shared one serves the other tests meanwhile.
type privatePG struct {
	t         *testing.T
	bin, data string
	opts, log string
	url       string
}

// pgServerBin is the directory of the newest PostgreSQL server programs
// installed (/usr/lib/postgresql/<version>/bin); without them the test is
// skipped, and fails under CI=true.
func pgServerBin(t *testing.T) string {
	t.Helper()
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_basebackup")
	best, bestVersion := "", -1.0
	for _, f := range found {
		dir := filepath.Dir(f)
		v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64) // 9.6 before 15
		if err != nil || v <= bestVersion {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			best, bestVersion = dir, v
		}
	}
	if best == "" {
		needService(t, "PostgreSQL's server programs (initdb, pg_ctl, pg_basebackup in /usr/lib/postgresql/<version>/bin) are not installed",
			"apt-get install -y postgresql")
	}
	return best
}

// chownPostgres gives dir to the postgres user when the test runs as
// root, which PostgreSQL's programs refuse to run as.
func chownPostgres(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		needService(t, "running as root with no postgres user to run a private PostgreSQL as", "apt-get install -y postgresql")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
}

// startPrivatePG makes a cluster in a temporary directory and starts it on
// a free port (as the postgres user when the test runs as root, which
// PostgreSQL refuses to run as).
func startPrivatePG(t *testing.T) *privatePG {
	t.Helper()
	needPG(t)
	bin := pgServerBin(t)
	dir, err := os.MkdirTemp("", "queued-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	pg := &privatePG{t: t, bin: bin, data: filepath.Join(dir, "data"), log: filepath.Join(dir, "log")}
	chownPostgres(t, dir)
	port := freePort(t)
	pg.opts = fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200", port, dir)
	pg.run("initdb", "-D", pg.data, "-A", "trust", "-U", "postgres", "--no-sync")
	pg.run("pg_ctl", "-D", pg.data, "-o", pg.opts, "-w", "-t", "60", "-l", pg.log, "start")
	t.Cleanup(func() { pg.run("pg_ctl", "-D", pg.data, "-m", "immediate", "-w", "stop") })
	pg.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", port)
	return pg
}

// run runs one of PostgreSQL's programs and fails the test when it fails.
func (pg *privatePG) run(prog string, args ...string) {
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(pg.bin, prog)}, args...)...)
	} else {
		cmd = exec.Command(filepath.Join(pg.bin, prog), args...)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		pg.t.Errorf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
}

// restart stops the server (its sessions end, open transactions roll
// back) and starts it again.
func (pg *privatePG) restart() {
	// The log keeps the server's output off pg_ctl's, which the test
	// reads to its end.
	pg.run("pg_ctl", "-D", pg.data, "-m", "fast", "-w", "-t", "60", "-o", pg.opts, "-l", pg.log, "restart")
}

// TestPGFaultsDatabaseRestart: the database restarts twice under load.
func TestPGFaultsDatabaseRestart(t *testing.T) {
	t.Parallel()
	pg := startPrivatePG(t)
	args := []string{"--postgres-url", pg.url + "?pool_max_conns=4", "--postgres-namespace", "restart"}
	a, b := startBinary(t, args...), startBinary(t, args...)
	runFaults(t, pg.url, "restart", []*serverProc{a, b}, []faultStep{
		{3 * time.Second, pg.restart},
		{9 * time.Second, pg.restart},
	}, 3000)
}

// TestPGCloseBounded: a stop does not wait on a connection the pool
// cannot get back. pgx closes a connection whose statement was cancelled
// by reading until the database hangs up, for up to 15 s, and over TLS a
// write cut short leaves the database waiting for the rest: a graceful
// stop took past 10 s in CI. A connection held out of the pool stands for
// it here: the pool's own Close would wait for it for ever.
func TestPGCloseBounded(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	b := NewBroker()
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := OpenPG(ctx, testPGURL(), ns, b, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	held, err := p.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(pgCloseWait + 20*time.Second):
		t.Fatalf("Close still waiting %v after it was called, with a connection out of the pool", pgCloseWait+20*time.Second)
	}
	held.Release()
}
