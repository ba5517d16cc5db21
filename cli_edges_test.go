package main

// The command line's rough edges: global options before any command word,
// every command listed and helpable, short errors for a mistyped server
// flag, --http-port 0 and -1, queued backup's address and token, and what
// pull, fail and queue clean tell and do.

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Global options may stand before the command word of every command, not
// only before the client commands': `queued -p P help push` was `unknown
// command "help"`.
func TestCLIGlobalOptionsBeforeCommand(t *testing.T) {
	t.Parallel()
	g := cliServer(t, &config{dataPath: filepath.Join(t.TempDir(), "q.db"), syncMode: "normal"})
	before := func(args ...string) []string { return append(append([]string{}, g...), args...) }

	code, out, errOut := runCLI(t, before("help", "push")...)
	want, _ := cli(t, nil, 0, "help", "push")
	if code != 0 || out != want {
		t.Errorf("-H -p help push: exit %d, %q %q", code, out, errOut)
	}
	if code, out, _ := runCLI(t, before("help")...); code != 0 || !strings.Contains(out, "Global options") {
		t.Errorf("-H -p help: exit %d, %q", code, out)
	}
	// And after help's word.
	if code, out, _ := runCLI(t, "help", "-p", "7000", "pull"); code != 0 || !strings.HasPrefix(out, "Usage: queued pull") {
		t.Errorf("help -p 7000 pull: exit %d, %q", code, out)
	}
	if code, out, _ := runCLI(t, before("version")...); code != 0 || !strings.Contains(out, "Server: queued "+version) {
		t.Errorf("-H -p version: exit %d, %q", code, out)
	}
	if code, out, _ := runCLI(t, before("doctor")...); code != 0 || !strings.Contains(out, "All checks passed.") {
		t.Errorf("-H -p doctor: exit %d, %q", code, out)
	}
	file := filepath.Join(t.TempDir(), "b.db")
	if code, out, errOut := runCLI(t, before("backup", "--out", file)...); code != 0 || !strings.Contains(out, "backup written to "+file) {
		t.Errorf("-H -p backup --out: exit %d, %q %q", code, out, errOut)
	}
	if code, out, _ := runCLI(t, before("bench", "--help")...); code != 0 || !strings.HasPrefix(out, "Usage: queued bench") {
		t.Errorf("-H -p bench --help: exit %d, %q", code, out)
	}
	if code, out, _ := runCLI(t, "-p", "7000", "serve", "--help"); code != 0 || !strings.Contains(out, "-http-port") {
		t.Errorf("-p 7000 serve --help: exit %d, %q", code, out)
	}
	// A tool that talks to no queued server refuses the option by name.
	if code, _, errOut := runCLI(t, before("migrate", "--from", "x.db")...); code != 2 || !strings.Contains(errOut, "-H") {
		t.Errorf("-H -p migrate: exit %d, %q", code, errOut)
	}
	// A host named like a command is still a host.
	if code, _, errOut := runCLI(t, "-H", "help", "-p", "1", "ping"); code != 1 || !strings.Contains(errOut, "help:1") {
		t.Errorf("-H help -p 1 ping: exit %d, %q", code, errOut)
	}
}

// Every command of the dispatch tables has help, and queued help lists
// each; each word queued help lists at the head of a line is a command.
func TestCLIHelpCoversEveryCommand(t *testing.T) {
	t.Parallel()
	var words []string
	for _, c := range clientCommands {
		words = append(words, c.name)
	}
	for w := range toolCommands {
		words = append(words, w)
	}
	slices.Sort(words)
	_, main, _ := runCLI(t, "help")
	for _, w := range words {
		if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(w) + `( |$)`).MatchString(main) {
			t.Errorf("queued help does not list %q", w)
		}
		code, out, errOut := runCLI(t, "help", w)
		if code != 0 || !strings.Contains(strings.ToLower(out), "usage") && w != "help" {
			t.Errorf("queued help %s: exit %d, %q %q", w, code, out, errOut)
		}
		if w != "help" && strings.Contains(out, "Global options (anywhere") {
			t.Errorf("queued help %s prints the main help", w)
		}
	}
	// The other way: the command sections name commands that exist.
	sections := main[strings.Index(main, "\nServer:\n"):strings.Index(main, "\nGlobal options")]
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z][a-z-]*)`).FindAllStringSubmatch(sections, -1) {
		if !slices.Contains(words, m[1]) {
			t.Errorf("queued help lists %q, which is no command", m[1])
		}
	}
	for _, w := range []string{"backups", "restore"} {
		if code, out, _ := runCLI(t, w, "--help"); code != 0 {
			t.Errorf("queued %s --help: exit %d, %q", w, code, out)
		}
	}
}

// A mistyped server flag: the error and where to look, not the ~60 lines
// of every flag.
func TestServeBadFlagShortError(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"serve", "--bogus"}, {"--bogus"}, {"start", "--tcp-port", "x"},
		{"serve", "--memory", "stray"}, {"-p", "6789", "--bogus"}} {
		code, out, errOut := runCLI(t, args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 2 || out != "" || len(lines) != 2 || !strings.Contains(lines[1], "queued help serve") {
			t.Errorf("queued %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out, errOut)
		}
	}
	if _, _, errOut := runCLI(t, "serve", "--bogus"); !strings.HasPrefix(errOut, "queued: flag provided but not defined: -bogus\n") {
		t.Errorf("serve --bogus: %q", errOut)
	}
}

// --http-port 0 and -1 both turn the HTTP port off, as its help says.
func TestServeHTTPPortOff(t *testing.T) {
	t.Parallel()
	_, help, _ := runCLI(t, "help", "serve")
	if !strings.Contains(help, "0 or -1 turns it off") {
		t.Errorf("help serve does not say how to turn HTTP off:\n%s", help)
	}
	started := func(p *serverProc) string {
		eventually(t, 20*time.Second, "the start line", func() (bool, string) {
			return strings.Contains(p.output(), "queued started"), p.output()
		})
		return p.output()
	}
	for _, off := range []string{"0", "-1"} {
		p := startBinary(t, "--memory", "--http-port", off)
		if log := started(p); strings.Contains(log, " http=") {
			t.Errorf("--http-port %s: HTTP is on:\n%s", off, log)
		}
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(p.httpPort), time.Second); err == nil {
			c.Close()
			t.Errorf("--http-port %s: something answers on %d", off, p.httpPort)
		}
	}
	p := startBinary(t, "--memory")
	if log := started(p); !strings.Contains(log, " http=127.0.0.1:"+strconv.Itoa(p.httpPort)) {
		t.Errorf("HTTP not on its port:\n%s", log)
	}
}

// queued backup takes the server's address as every command does (-H and
// -p, the TCP port, HTTP being the next), --http-port when HTTP is
// elsewhere, --url as before; the token from --token, BQ_TOKEN, then
// QUEUED_TOKEN.
//
// Serial: it sets environment variables (t.Setenv).
func TestBackupCLIAddressAndToken(t *testing.T) {
	t.Setenv("BQ_TOKEN", "")
	t.Setenv("BUNQUEUE_TOKEN", "")
	t.Setenv("QUEUED_TOKEN", "")
	t.Setenv("QUEUED_HTTP_URL", "")
	g := cliServer(t, &config{dataPath: filepath.Join(t.TempDir(), "q.db"), syncMode: "normal", authTokens: "tok"})
	port, _ := strconv.Atoi(g[3])
	dir := t.TempDir()
	n := 0
	backup := func(want int, args ...string) (string, string) {
		t.Helper()
		n++
		file := filepath.Join(dir, "b"+strconv.Itoa(n)+".db")
		var code int
		var out, errOut string
		// The server sends one download at a time, and may still be
		// removing the previous one's copy: a 429 is asked again.
		eventually(t, 20*time.Second, "a backup not refused 429", func() (bool, string) {
			code, out, errOut = runCLI(t, append([]string{"backup", "--out", file}, args...)...)
			return !strings.Contains(errOut, "429"), errOut
		})
		if code != want {
			t.Errorf("backup %v: exit %d, want %d: %q %q", args, code, want, out, errOut)
		}
		if want == 0 {
			if b, err := os.ReadFile(file); err != nil || !strings.HasPrefix(string(b), "SQLite format 3\x00") {
				t.Errorf("backup %v: %v", args, err)
			}
		}
		return out, errOut
	}
	backup(0, "-H", "127.0.0.1", "-p", g[3], "--token", "tok")
	backup(0, "--host=127.0.0.1", "--port="+g[3], "-t", "tok")
	backup(0, "--url", "http://127.0.0.1:"+strconv.Itoa(port+1), "--token", "tok")
	// -p names a port with nothing on it; --http-port wins.
	backup(0, "-H", "127.0.0.1", "-p", "1", "--http-port", strconv.Itoa(port+1), "--token", "tok")
	if _, errOut := backup(2, "--url", "http://127.0.0.1:1", "-p", g[3]); !strings.Contains(errOut, "not both") {
		t.Errorf("--url with -p: %q", errOut)
	}
	if _, errOut := backup(1, "-H", "127.0.0.1", "-p", g[3]); !strings.Contains(errOut, "401") {
		t.Errorf("without a token: %q", errOut)
	}
	t.Setenv("QUEUED_TOKEN", "tok")
	backup(0, "-H", "127.0.0.1", "-p", g[3])
	t.Setenv("BQ_TOKEN", "wrong")
	if _, errOut := backup(1, "-H", "127.0.0.1", "-p", g[3]); !strings.Contains(errOut, "401") {
		t.Errorf("BQ_TOKEN is read before QUEUED_TOKEN: %q", errOut)
	}
	t.Setenv("BQ_TOKEN", "tok")
	t.Setenv("QUEUED_TOKEN", "")
	backup(0, "-H", "127.0.0.1", "-p", g[3])
	// The older variable for the address still works without -H/-p.
	t.Setenv("QUEUED_HTTP_URL", "http://127.0.0.1:"+strconv.Itoa(port+1))
	backup(0)

	_, help, _ := runCLI(t, "help", "backup")
	for _, want := range []string{"-H, --host", "-p, --port", "PORT+1", "--http-port", "--url", "BQ_TOKEN", "QUEUED_TOKEN"} {
		if !strings.Contains(help, want) {
			t.Errorf("help backup: no %q in\n%s", want, help)
		}
	}
}

// A job taken by queued pull holds no lock: the queue's stall detection
// takes it back, an attempt used, as pull's help says, with the figure the
// server uses by default.
func TestCLIPullStallTakesBack(t *testing.T) {
	t.Parallel()
	g := cliServer(t, nil)
	c := dial(t, "127.0.0.1:"+g[3])
	cfg := c.ok(map[string]any{"cmd": "GetStallConfig", "queue": "fresh"})
	interval, _ := numOf(cfg["config"].(map[string]any)["stallInterval"])
	_, help, _ := runCLI(t, "help", "pull")
	if !strings.Contains(help, "stall interval ("+humanMs(interval)+" unless") || !strings.Contains(help, "queued ack <id>") ||
		!strings.Contains(help, "queued fail <id>") || strings.Contains(help, "stays active after this command exits, so") &&
		!strings.Contains(help, "but not for ever") {
		t.Errorf("help pull (the default stall interval is %s):\n%s", humanMs(interval), help)
	}
	if _, main, _ := runCLI(t, "help"); !strings.Contains(main, "ack or fail it within "+humanMs(interval)) {
		t.Errorf("queued help does not give pull's time")
	}

	c.ok(map[string]any{"cmd": "SetStallConfig", "queue": "st", "config": map[string]any{"stallInterval": 300, "gracePeriod": 0}})
	out, _ := cli(t, g, 0, "push", "st", "{}")
	id := uuidRe.FindString(out)
	cli(t, g, 0, "pull", "st")
	eventually(t, 20*time.Second, "the pulled job back from active after its 300ms stall interval", func() (bool, string) {
		out, _ = cli(t, g, 0, "job", "state", id)
		return out != "State: active\n", out
	})
	if out != "State: delayed\n" && out != "State: waiting\n" {
		t.Errorf("after the stall interval: %q, want it back in its queue", out)
	}
	j := c.ok(map[string]any{"cmd": "GetJob", "id": id})["job"].(map[string]any)
	if n, _ := numOf(j["attempts"]); n != 1 {
		t.Errorf("attempts after the stall: %v, want 1", j["attempts"])
	}
}

// queued fail says what became of the job: retried, dead-lettered on its
// last attempt, or removed; it said "it is retried" in every case.
func TestCLIFailSaysWhatHappened(t *testing.T) {
	t.Parallel()
	g := cliServer(t, nil)
	out, _ := cli(t, g, 0, "push", "f", "{}", "--max-attempts", "2", "--backoff", "60000")
	id := uuidRe.FindString(out)
	cli(t, g, 0, "pull", "f")
	out, _ = cli(t, g, 0, "fail", id, "-e", "first")
	if !regexp.MustCompile(`^Job ` + id + ` failed \(attempt 1 of 2\); it will be retried in [1-9][0-9a-z ]*\n$`).MatchString(out) {
		t.Errorf("first fail: %q", out)
	}
	if st, _ := cli(t, g, 0, "job", "state", id); st != "State: delayed\n" {
		t.Errorf("after the first fail: %q", st)
	}
	cli(t, g, 0, "job", "promote", id)
	cli(t, g, 0, "pull", "f")
	out, _ = cli(t, g, 0, "fail", id, "-e", "second")
	if out != "Job "+id+" failed for good (attempt 2 of 2): moved to the dead-letter queue of f (queued dlq list f)\n" {
		t.Errorf("last fail: %q", out)
	}
	if dl, _ := cli(t, g, 0, "dlq", "list", "f"); !strings.Contains(dl, id) {
		t.Errorf("dlq list after the last fail: %q", dl)
	}

	out, _ = cli(t, g, 0, "push", "f", "{}", "--max-attempts", "1", "--remove-on-fail")
	id = uuidRe.FindString(out)
	cli(t, g, 0, "pull", "f")
	out, _ = cli(t, g, 0, "fail", id)
	if !strings.HasPrefix(out, "Job "+id+" failed and was removed") {
		t.Errorf("fail with remove-on-fail: %q", out)
	}
	// --json stays the server's answer.
	out, _ = cli(t, g, 0, "push", "f", "{}")
	id = uuidRe.FindString(out)
	cli(t, g, 0, "pull", "f")
	if out, _ = cli(t, g, 0, "fail", id, "--json"); strings.Contains(out, "attempt") || !strings.Contains(out, `"ok": true`) {
		t.Errorf("fail --json: %q", out)
	}
}

// queue clean without --state removes completed jobs only; waiting jobs
// go only when asked for (it removed a waiting job).
func TestCLICleanDefaultKeepsWaiting(t *testing.T) {
	t.Parallel()
	g := cliServer(t, nil)
	out, _ := cli(t, g, 0, "push", "cl", `"done"`)
	done := uuidRe.FindString(out)
	if out, _ = cli(t, g, 0, "pull", "cl"); !strings.Contains(out, done) {
		t.Fatalf("pull: %q", out)
	}
	cli(t, g, 0, "ack", done)
	out, _ = cli(t, g, 0, "push", "cl", `"waits"`)
	waiting := uuidRe.FindString(out)
	clockPast(t, nowMs, nowMs()+1) // older than a grace of 0 by a clear margin
	out, _ = cli(t, g, 0, "queue", "clean", "cl", "--grace", "0")
	if !strings.HasPrefix(out, "Cleaned cl: ") || !strings.Contains(out, " completed jobs older than 0ms removed") {
		t.Errorf("clean: %q", out)
	}
	if st, _ := cli(t, g, 0, "job", "state", waiting); st != "State: waiting\n" {
		t.Errorf("the waiting job after a clean without --state: %q", st)
	}
	if _, errOut := cli(t, g, 1, "job", "state", done); !strings.Contains(errOut, "Job not found") {
		t.Errorf("the completed job after clean: %q", errOut)
	}
	out, _ = cli(t, g, 0, "queue", "clean", "cl", "--grace", "0", "--state", "waiting")
	if out != "Cleaned cl: 1 waiting and delayed jobs older than 0ms removed\n" {
		t.Errorf("clean --state waiting: %q", out)
	}
	_, help, _ := runCLI(t, "help", "queue")
	if !strings.Contains(help, "completed (the default)") || !strings.Contains(help, "only when asked for") {
		t.Errorf("help queue does not give clean's default:\n%s", help)
	}
}

// TestServeRefusesBadEnv: a number or yes/no variable that is neither is
// refused, naming it, as its flag would be (TCP_PORT=abc used to start on
// 6789 without a word); the flag on the command line wins over it.
//
// Serial: it sets environment variables (t.Setenv).
func TestServeRefusesBadEnv(t *testing.T) {
	for _, c := range []struct{ key, val, want string }{
		{"TCP_PORT", "abc", `TCP_PORT="abc" is not a whole number (it sets --tcp-port)`},
		{"HTTP_PORT", "xyz", `HTTP_PORT="xyz" is not a whole number (it sets --http-port)`},
		{"QUEUED_WEBHOOK_ALLOW_PRIVATE", "bogus", `QUEUED_WEBHOOK_ALLOW_PRIVATE="bogus" is neither yes nor no`},
		{"S3_BACKUP_RETENTION", "seven", `S3_BACKUP_RETENTION="seven" is not a whole number (it sets --backup-keep)`},
	} {
		t.Run(c.key, func(t *testing.T) {
			t.Setenv(c.key, c.val)
			var out, errb bytes.Buffer
			if code := run([]string{"serve", "--memory"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), c.want) {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
		})
	}
	t.Setenv("TCP_PORT", "abc")
	fs, _ := serverFlags(io.Discard)
	if err := fs.Parse([]string{"--tcp-port", "0"}); err != nil {
		t.Fatal(err)
	}
	if err := checkFlagEnv(fs); err != nil {
		t.Fatalf("--tcp-port given, TCP_PORT is not read: %v", err)
	}
}
