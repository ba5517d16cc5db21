package main

// What the tests need from outside Go: PostgreSQL, the compat packages
// (bun, the official client, s3rver), Chromium with chromedriver,
// promtool. On a developer's machine a test whose service is missing is
// skipped with the command that provides it, so `go test ./...` passes on
// a fresh clone; under CI=true it fails instead, so CI never passes by
// skipping.

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// serverEnv makes this test binary run queued's main instead of the tests
// (queuedBinary): TestMain sets it for the processes the tests start.
const serverEnv = "QUEUED_TEST_RUN_SERVER"

// fuzzing reports whether the test binary's arguments make it a fuzzing
// coordinator (go test -fuzz) or one of its workers.
func fuzzing(args []string) bool {
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "test.fuzz" || name == "test.fuzzworker" {
			return true
		}
	}
	return false
}

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	// The tests' own process: a serve command a test runs in it shares its
	// runtime with every other test (procs.go).
	procsTuning = false
	// Inherited by every process a test starts; only this binary reads it.
	// Not when fuzzing: the fuzzing workers are this binary too, started
	// by the coordinator with its environment, and would run the server
	// instead of fuzzing (every fuzz target "terminated without fuzzing").
	if !fuzzing(os.Args[1:]) {
		os.Setenv(serverEnv, "1")
	}
	// The PostgreSQL brokers the tests start, in this process and as
	// servers, open at most pgMinPool connections each, not 16: the
	// parallel tests share one database and its max_connections (100 by
	// default). On a slower machine they overlap longer, and a CI run
	// (2026-12-06) had brokers refused with "too many clients already".
	// A test that asks for a pool size (settings_test.go) still gets it.
	if _, set := os.LookupEnv("BUNQUEUE_POSTGRES_POOL_SIZE"); !set {
		os.Setenv("BUNQUEUE_POSTGRES_POOL_SIZE", strconv.Itoa(pgMinPool))
	}
	if defaultPGSession.poolSize == 0 {
		defaultPGSession.poolSize = pgMinPool
	}
	// A race-enabled process sleeps a second before it exits, for races
	// in goroutines still running then; a server the tests stop has ended
	// its goroutines by then (every loop stops on shutdown), and the
	// suite stops hundreds of them: minutes of sleeping.
	if g := os.Getenv("GORACE"); !strings.Contains(g, "atexit_sleep_ms") {
		os.Setenv("GORACE", strings.TrimSpace(g+" atexit_sleep_ms=50"))
	}
	// Twice as many parallel tests as cores, unless -parallel says: most
	// of them wait on servers, databases, browsers and timers more than
	// they compute, and with one per core the two cores of CI sat idle a
	// third of the time (the suite took 331 s; 224 s with twice as many).
	// Not when fuzzing, where -parallel is the number of fuzzing workers.
	if !fuzzing(os.Args[1:]) {
		flag.Parse()
		given := false
		flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
		if !given {
			flag.Set("test.parallel", strconv.Itoa(2*runtime.GOMAXPROCS(0)))
		}
	}
	frameCheck = checkFrameBody
	code := m.Run()
	if testPGAdmin.pool != nil {
		testPGAdmin.pool.Close()
	}
	if releasePath != "" {
		os.RemoveAll(filepath.Dir(releasePath))
	}
	if bad := malformedFrames(); bad != "" {
		os.Stderr.WriteString(bad)
		code = 1
	}
	// The defaults every job without a cold part reads are shared: a write
	// through cold() instead of warm() would change every such job.
	if !noCold.isDefault() {
		os.Stderr.WriteString("noCold, the shared defaults of the jobs' cold fields, was written to\n")
		code = 1
	}
	os.Exit(code)
}

// needService skips the test (fails it under CI=true) because what is
// missing, naming how to provide it.
func needService(t testing.TB, missing, provide string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s, required under CI=true: %s", missing, provide)
	}
	t.Skipf("%s; to run this test: %s", missing, provide)
}

// pgProvide says how to get the PostgreSQL the tests use.
const pgProvide = "PostgreSQL at 127.0.0.1:5432, user postgres, trust auth, database test " +
	"(on Debian: apt-get install -y postgresql && pg_ctlcluster $(ls /etc/postgresql) main start, " +
	"then see README's Test it for trust auth and createdb), or another server named by QUEUED_TEST_POSTGRES_URL"

var (
	pgReachOnce sync.Once
	pgReachErr  error
)

// needPG skips the test (fails it under CI=true) when the test database
// cannot be reached. It connects once per test process: a suite without
// PostgreSQL skips every PostgreSQL test at once instead of waiting on
// each.
func needPG(t testing.TB) string {
	t.Helper()
	pgReachOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pgReachErr = pgAdminExec(ctx, "SELECT 1")
	})
	if pgReachErr != nil {
		u := testPGURL()
		needService(t, redactIn("PostgreSQL at "+u+" is not reachable ("+pgReachErr.Error()+")", u), pgProvide)
	}
	return testPGURL()
}

// TestFuzzingLeavesServersOut: a fuzzing run is told apart from an
// ordinary one, so that its workers fuzz rather than serve.
func TestFuzzingLeavesServersOut(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"-test.fuzz=^FuzzParseMap$", "-test.fuzztime=10m", "-test.run=^$"}, true},
		{[]string{"-test.fuzzworker", "-test.fuzzcachedir=/tmp/x"}, true},
		{[]string{"--test.fuzz", "FuzzReadFrame"}, true},
		{[]string{"-test.run=TestX", "-test.fuzzcachedir=/tmp/x", "-test.fuzztime=10s"}, false},
		{nil, false},
	} {
		if got := fuzzing(c.args); got != c.want {
			t.Errorf("fuzzing(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}
