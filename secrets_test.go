package main

// Secrets never printed: tokens and database passwords given through the
// environment stay out of help, usage after a mistyped flag, errors and
// logs.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	testToken   = "tok-Zq81xVv3secret"
	testPGPass  = "pgPW-r7Kx93secret"
	testS3Key   = "s3-Hn47Wq2secret"
	testCLITok  = "cli-Ut55Lm9secret"
	testHookPas = "hookPW-8Hs2secret"
)

// setSecretEnv puts a secret in every variable the binary reads one from.
func setSecretEnv(t *testing.T) {
	t.Setenv("AUTH_TOKENS", testToken+",second-"+testToken)
	t.Setenv("BUNQUEUE_POSTGRES_URL", "postgres://queued:"+testPGPass+"@db.internal:5432/jobs?sslmode=disable")
	t.Setenv("S3_SECRET_ACCESS_KEY", testS3Key)
	t.Setenv("S3_SESSION_TOKEN", testS3Key+"-session")
	t.Setenv("QUEUED_TOKEN", testCLITok)
	t.Setenv("QUEUED_HTTP_URL", "http://admin:"+testHookPas+"@127.0.0.1:6790")
}

func noSecrets(t *testing.T, what, text string) {
	t.Helper()
	for _, s := range []string{testToken, testPGPass, testS3Key, testCLITok, testHookPas} {
		if strings.Contains(text, s) {
			t.Errorf("%s shows a secret (%s):\n%s", what, s, text)
		}
	}
}

// TestSecretsNotInHelp: help and the usage a mistyped flag prints list
// every flag's default, and defaults come from the environment.
//
// Serial: it sets environment variables (t.Setenv).
func TestSecretsNotInHelp(t *testing.T) {
	setSecretEnv(t)
	for _, args := range [][]string{{"help", "serve"}, {"serve", "--help"}, {"serve", "--no-such-flag"}, {"--no-such-flag"},
		{"help", "migrate"}, {"migrate", "--bad"}, {"help", "backup"}, {"backup", "--bad"}, {"backups", "list", "--bad"},
		{"restore", "--bad"}, {"help"}} {
		code, out, errOut := runCLI(t, args...)
		noSecrets(t, strings.Join(args, " "), out+errOut)
		if len(args) == 2 && args[0] == "help" && args[1] == "serve" {
			// What is shown instead: that the value is set, and the
			// database URL with its password masked.
			for _, want := range []string{"set from AUTH_TOKENS, not shown", "postgres://queued:xxxxx@db.internal:5432/jobs",
				"set from S3_SECRET_ACCESS_KEY, not shown", "-allowed-hosts"} {
				if !strings.Contains(out, want) {
					t.Errorf("help serve: no %q in\n%s", want, out)
				}
			}
			if code != 0 {
				t.Errorf("help serve: exit %d", code)
			}
		}
	}
	// The binary as systemd runs it: a mistyped flag, the secrets in its
	// environment.
	cmd := exec.Command(queuedBinary(t), "serve", "--tpc-port", "1")
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "flag provided but not defined") {
		t.Fatalf("binary with a bad flag: %s", out)
	}
	noSecrets(t, "the binary's usage", string(out))
}

func TestSecretsRedactDSN(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:pw@h:5432/db":                   "postgres://u:xxxxx@h:5432/db",
		"postgresql://u@h/db":                         "postgresql://u@h/db",
		"postgres://h/db?password=pw&sslmode=require": "postgres://h/db?password=xxxxx&sslmode=require",
		"postgres://u:p%40ss@h/db":                    "postgres://u:xxxxx@h/db",
		"host=h user=u password=pw dbname=d":          "host=h user=u password=xxxxx dbname=d",
		"host=h password='p w\\'x' dbname=d":          "host=h password=xxxxx dbname=d",
		"postgres://u:pw@h:notaport/db":               "postgres://u:xxxxx@h:notaport/db",
		"postgres://u:pw@h/db?sslpassword=k&x=1":      "postgres://u:xxxxx@h/db?sslpassword=xxxxx&x=1",
		"":                                            "",
	} {
		if got := redactDSN(in); got != want {
			t.Errorf("redactDSN(%q) = %q, want %q", in, got, want)
		}
	}
	dsn := "postgres://u:p%40ss%2Fword@h/db"
	msg := "cannot connect to " + dsn + " with p@ss/word, p%40ss%2Fword"
	if got := redactIn(msg, dsn); strings.Contains(got, "ss/word") || strings.Contains(got, "ss%2Fword") {
		t.Errorf("redactIn: %q", got)
	}
	if got := redactURL("https://hook:" + testHookPas + "@example.com/x"); strings.Contains(got, testHookPas) || !strings.Contains(got, "example.com/x") {
		t.Errorf("redactURL: %q", got)
	}
}

// TestSecretsPGConnectError: a PostgreSQL URL with a password that
// cannot be reached; the error and the log name the database but not the
// password, from the server and from queued migrate.
func TestSecretsPGConnectError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now
	for _, url := range []string{
		fmt.Sprintf("postgres://queued:%s@127.0.0.1:%d/test?connect_timeout=5", testPGPass, port),
		fmt.Sprintf("host=127.0.0.1 port=%d user=queued password=%s dbname=test connect_timeout=5", port, testPGPass),
		fmt.Sprintf("postgres://queued:%s@127.0.0.1:notaport/test", testPGPass),
	} {
		// The start tries again for a while (its warnings name the
		// failure too), then gives up.
		c := &config{host: "127.0.0.1", httpPort: -1, pgURL: url, pgNamespace: "default", pgStartWait: 1200}
		var logBuf bytes.Buffer
		log, _ := newLogger(&lockedWriter{mu: &sync.Mutex{}, w: &logBuf}, "debug", "text")
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		err := runServer(ctx, c, log, nil)
		cancel()
		if err == nil {
			t.Fatalf("%s: the server started", redactDSN(url))
		}
		noSecrets(t, "runServer's error", err.Error())
		noSecrets(t, "the server's log", logBuf.String())
		if !strings.Contains(url, "notaport") && !strings.Contains(logBuf.String(), "trying again") {
			t.Errorf("%s: the start did not try again:\n%s", redactDSN(url), logBuf.String())
		}

		// Through the command line, as an operator sees it.
		code, out, errOut := runCLI(t, "serve", "--tcp-port", "0", "--http-port", "-1", "--postgres-url", url, "--postgres-start-wait", "1000")
		if code == 0 {
			t.Fatalf("serve with %s: exit 0", redactDSN(url))
		}
		noSecrets(t, "queued serve", out+errOut)
		if !strings.Contains(errOut, "postgres") {
			t.Errorf("queued serve: the error does not say what failed:\n%s", errOut)
		}

		db := filepath.Join(t.TempDir(), "m.db")
		st, err := OpenSQLite(db, "normal", quietLog())
		if err != nil {
			t.Fatal(err)
		}
		st.Close()
		code, out, errOut = runCLI(t, "migrate", "--from", db, "--postgres-url", url)
		if code == 0 {
			t.Fatalf("migrate to %s: exit 0", redactDSN(url))
		}
		noSecrets(t, "queued migrate", out+errOut)
	}
}

// TestCLIDoctorWithTokens: against a server with tokens, queued doctor
// sends its token to /health and shows the details; without one it says
// they were withheld (and the Ping fails: exit 1).
func TestCLIDoctorWithTokens(t *testing.T) {
	t.Parallel()
	g := cliServer(t, &config{authTokens: "s3cret"})
	out, _ := cli(t, g, 0, "doctor", "--token", "s3cret")
	for _, want := range []string{"storage", "memory", "dlq", "0 dead-lettered jobs", "All checks passed."} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor with the token: missing %q in\n%s", want, out)
		}
	}
	out, _ = cli(t, g, 1, "doctor")
	if !strings.Contains(out, "details") || !strings.Contains(out, "only with its token") || strings.Contains(out, "dead-lettered") {
		t.Errorf("doctor without the token:\n%s", out)
	}
}
