package main

// The compatibility suite: each compat/*.test.ts script drives a freshly
// started queued binary through the official bunqueue client (run with bun)
// and exits non-zero when something a bunqueue user relies on does not hold.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// queuedBinary is the server the end-to-end tests start: the release
// build, as users run it (buildRelease). Under the race detector the
// end-to-end servers were this test binary, race-built, and spent two
// thirds of the suite's CPU (437 of 693 CPU-s, the test process 256):
// the race detector now watches the in-process servers that every
// command's tests start, and the official client's compat run in memory
// mode against a race-built server (testBinary).
func queuedBinary(t *testing.T) string {
	t.Helper()
	if !raceEnabled {
		return testBinary(t) // already a release build
	}
	return buildRelease(t)
}

var (
	releaseOnce sync.Once
	releasePath string
	releaseErr  error
)

// buildRelease builds the server once per test process without the race
// detector, as the static release binary is built (the README, and CI
// just before the tests: the build cache holds every package of it).
func buildRelease(t *testing.T) string {
	t.Helper()
	releaseOnce.Do(func() {
		dir, err := os.MkdirTemp("", "queued-release")
		if err != nil {
			releaseErr = err
			return
		}
		releasePath = filepath.Join(dir, "queued")
		cmd := exec.Command("go", "build", "-o", releasePath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			releaseErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if releaseErr != nil {
		t.Fatal(releaseErr)
	}
	return releasePath
}

// testBinary is this test binary, which runs queued's main instead of
// the tests when started with serverEnv set (TestMain); race-built when
// the tests are.
func testBinary(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("the test binary, to run as the server: %v", err)
	}
	return exe
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// serverProc is a queued process started for a test.
type serverProc struct {
	cmd      *exec.Cmd
	tcpPort  int
	httpPort int
	log      *bytes.Buffer
	mu       *sync.Mutex
	done     chan struct{}
}

// startBinary runs the binary on free ports with extra flags and waits
// until it listens.
func startBinary(t *testing.T, extra ...string) *serverProc {
	t.Helper()
	return startBinaryAt(t, []string{queuedBinary(t)}, extra...)
}

// runBinaryEnv runs the release binary with args, its environment the
// test process's with env added (a later "K=V" overrides an earlier K),
// and answers its exit code.
func runBinaryEnv(t *testing.T, env, args []string, stdout, stderr io.Writer) int {
	t.Helper()
	cmd := exec.Command(queuedBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return 0
}

// startedRE reads the ports a server listens on from its "queued started"
// log line.
var startedRE = regexp.MustCompile(`msg="queued started" tcp=\S*:(\d+)\b(?:.* http=\S*:(\d+)\b)?`)

// startBinaryAt is startBinary with a command of the caller's choice: a
// binary, or a wrapper whose last word is the binary. The TCP port is the
// kernel's choice (--tcp-port 0), read back from the server's log: a port
// picked by the test and bound later can be taken in between by another
// process on a busy machine, and a script then talks to that process. The
// HTTP port cannot be 0 on the command line, so a server that finds its
// HTTP port taken is started again on another.
func startBinaryAt(t *testing.T, argv []string, extra ...string) *serverProc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p, taken := tryStartBinary(t, argv, extra)
		if p != nil {
			return p
		}
		if attempt == 3 {
			t.Fatalf("server could not bind its ports in 3 attempts:\n%s", taken)
		}
	}
}

// tryStartBinary starts the server once; it returns nil and the server's
// output when a port was taken.
func tryStartBinary(t *testing.T, argv, extra []string) (*serverProc, string) {
	t.Helper()
	httpPort := freePort(t)
	// No drain at a stop (graceful_stop.go) unless a test asks for one: a test
	// that leaves jobs active would wait out the 30 s.
	args := append([]string{"serve", "--host", "127.0.0.1", "--tcp-port", "0",
		"--http-port", fmt.Sprint(httpPort), "--log-level", "info", "--shutdown-timeout", "0"}, extra...)
	cmd := exec.Command(argv[0], append(argv[1:], args...)...)
	p := &serverProc{cmd: cmd, log: &bytes.Buffer{}, mu: &sync.Mutex{}, done: make(chan struct{})}
	cmd.Stdout = &lockedWriter{p.mu, p.log}
	cmd.Stderr = &lockedWriter{p.mu, p.log}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	started, portTaken := false, ""
	t.Cleanup(func() {
		if !started && portTaken == "" {
			p.cmd.Process.Kill() // it did not start in time
			<-p.done
		}
	})
	eventually(t, 30*time.Second, "the server's start line", func() (bool, string) {
		if m := startedRE.FindStringSubmatch(p.output()); m != nil {
			p.tcpPort, _ = strconv.Atoi(m[1])
			p.httpPort, _ = strconv.Atoi(m[2]) // 0 with HTTP off
			started = true
			return true, ""
		}
		select {
		case <-p.done:
			if out := p.output(); strings.Contains(out, "address already in use") {
				portTaken = out
				return true, ""
			}
			t.Fatalf("server exited at start:\n%s", p.output())
		default:
		}
		return false, p.output()
	})
	if portTaken != "" {
		return nil, portTaken
	}
	t.Cleanup(func() { p.stop(t) })
	return p, ""
}

func (p *serverProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// stop asks the server to shut down (SIGTERM) and checks that it does so
// cleanly: a graceful shutdown is part of what is tested.
func (p *serverProc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(os.Interrupt)
	// A hang, not a speed, is what this deadline catches. Under the race
	// detector SQLite (C translated to Go, every pointer checked) writes
	// the last flush ten to twenty times slower: a test whose jobs are
	// tens of MB took over 10 s to stop on a busy machine.
	limit := 10 * time.Second
	if raceEnabled {
		limit = 60 * time.Second
	}
	select {
	case <-p.done:
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("server exited with %d:\n%s", code, p.output())
		}
	case <-time.After(limit):
		// SIGQUIT makes the Go runtime print every goroutine's stack, which
		// shows what the shutdown waits on.
		p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		t.Errorf("server did not stop within %v of SIGINT:\n%s", limit, p.output())
	}
	if raceEnabled && strings.Contains(p.output(), "WARNING: DATA RACE") {
		t.Errorf("data race in the server:\n%s", p.output())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// compatDir returns the compat folder when its packages are installed.
func compatDir(t *testing.T) (string, string) {
	t.Helper()
	dir, _ := filepath.Abs("compat")
	bun := filepath.Join(dir, "node_modules", ".bin", "bun")
	if _, err := os.Stat(bun); err != nil {
		needService(t, "compat packages (bun, the official bunqueue client) not installed", "(cd compat && npm ci)")
	}
	return dir, bun
}

// scriptFlags reads the server flags a script asks for on its first line:
// `// queued: --flag value ...`.
func scriptFlags(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "// queued:"); ok {
			return strings.Fields(rest)
		}
	}
	return nil
}

// compatSlowFirst are the scripts that take longest (schedules and limits
// run for seconds of wall time), started first so that none of them is
// left to run alone at the end.
var compatSlowFirst = []string{"cron", "limits", "timing", "crash", "groups", "events", "control", "dedup"}

func TestCompat(t *testing.T) {
	t.Parallel()
	dir, bun := compatDir(t)
	scripts, _ := filepath.Glob(filepath.Join(dir, "*.test.ts"))
	if len(scripts) < 10 {
		t.Fatalf("only %d compat scripts found", len(scripts))
	}
	// Every script runs against both local storage engines and against a
	// broker in PostgreSQL mode.
	type run struct{ mode, name, script string }
	var runs []run
	for _, mode := range []string{"memory", "sqlite", "postgres"} {
		for _, script := range scripts {
			runs = append(runs, run{mode, strings.TrimSuffix(filepath.Base(script), ".test.ts"), script})
		}
	}
	rank := func(name string) int {
		if i := slices.Index(compatSlowFirst, name); i >= 0 {
			return i
		}
		return len(compatSlowFirst)
	}
	sort.SliceStable(runs, func(i, j int) bool { return rank(runs[i].name) < rank(runs[j].name) })
	// The scripts mostly wait (on timers, schedules, the server): a whole
	// run used a third of a core at two at a time. So they run more at a
	// time than -parallel (GOMAXPROCS by default) would let parallel
	// subtests: subtests started from several goroutines at once, which
	// t.Run allows. Each script's checks hold on a busy machine.
	n := min(max(3*runtime.GOMAXPROCS(0), 4), 8)
	next := make(chan run)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range next {
				t.Run(r.mode+"/"+r.name, func(t *testing.T) {
					// The official client against a race-built server, in
					// one mode: the end-to-end servers are release builds.
					bin := queuedBinary(t)
					if r.mode == "memory" {
						bin = testBinary(t)
					}
					runScript(t, dir, bun, bin, r.script, storageFlags(t, r.mode))
				})
			}
		}()
	}
	for _, r := range runs {
		next <- r
	}
	close(next)
	wg.Wait()
}

// storageFlags selects an engine for a test server.
func storageFlags(t *testing.T, mode string) []string {
	switch mode {
	case "memory":
		return []string{"--memory"}
	case "postgres":
		return []string{"--postgres-url", testPGURL(), "--postgres-namespace", pgTestNamespace(t)}
	}
	return []string{"--data-path", filepath.Join(t.TempDir(), "queued.db")}
}

// runScript starts a server (binary bin) for the script and runs it.
func runScript(t *testing.T, dir, bun, bin, script string, extra []string) {
	srv := startBinaryAt(t, []string{bin}, append(scriptFlags(script), extra...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bun, "run", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), fmt.Sprintf("QUEUED_PORT=%d", srv.tcpPort), fmt.Sprintf("QUEUED_HTTP_PORT=%d", srv.httpPort),
		"QUEUED_BIN="+queuedBinary(t))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s failed: %v\n--- script output\n%s\n--- server log\n%s", filepath.Base(script), err, out, srv.output())
	}
	t.Logf("%s", bytes.TrimSpace(out))
}
