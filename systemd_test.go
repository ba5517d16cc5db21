package main

// queued.service as systemd runs it: its ExecStart= line with the
// environment systemd builds from the unit's Environment= lines and its
// env file, so that the storage the unit chooses is the one a server
// started by systemd would use (see docs/systemd.md).

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// unitService is what the test needs of a unit's [Service] section.
type unitService struct {
	typ          string
	environment  []string // Environment= assignments, in order
	envFiles     []string // EnvironmentFile= paths; a leading "-" marks one optional
	execStart    []string
	stateDirs    []string
	stateDirMode string
}

// readUnit parses the [Service] section of a unit file: key=value lines,
// comments, and backslash continuations, as systemd reads them.
func readUnit(t *testing.T, path string) unitService {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var u unitService
	section, pending := "", ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if pending != "" {
			line, pending = pending+" "+line, ""
		}
		if strings.HasSuffix(line, `\`) {
			pending = strings.TrimSuffix(line, `\`)
			continue
		}
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if strings.HasPrefix(line, "[") {
			section = line
			continue
		}
		if section != "[Service]" {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: not a key=value line: %q", path, line)
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		switch key {
		case "Type":
			u.typ = value
		case "Environment":
			u.environment = append(u.environment, unitWords(t, value)...)
		case "EnvironmentFile":
			u.envFiles = append(u.envFiles, value)
		case "ExecStart":
			if strings.ContainsAny(value[:1], "-@:+!") {
				t.Fatalf("ExecStart= with a prefix the test does not model: %q", value)
			}
			u.execStart = unitWords(t, value)
		case "StateDirectory":
			u.stateDirs = append(u.stateDirs, strings.Fields(value)...)
		case "StateDirectoryMode":
			u.stateDirMode = value
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// unitWords splits a unit value into words: blanks separate them, double
// quotes group them. Anything more (single quotes, escapes) fails the test
// rather than being read wrong.
func unitWords(t *testing.T, s string) []string {
	t.Helper()
	if strings.ContainsAny(s, `'\`) {
		t.Fatalf("unit value with quoting the test does not model: %q", s)
	}
	var words []string
	var cur strings.Builder
	quoted, in := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, in = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quote in %q", s)
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// specifiers replaces the unit specifiers the test knows (%S, the state
// root, and %%); any other one fails the test.
func specifiers(t *testing.T, s, stateRoot string) string {
	t.Helper()
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 == len(s) {
			t.Fatalf("a lone %% ends %q", s)
		}
		i++
		switch s[i] {
		case 'S':
			b.WriteString(stateRoot)
		case '%':
			b.WriteByte('%')
		default:
			t.Fatalf("specifier %%%c in %q: teach the test what systemd puts there", s[i], s)
		}
	}
	return b.String()
}

// readEnvFile reads an EnvironmentFile as systemd does for the lines an
// operator writes: KEY=VALUE, blank lines and # or ; comments, a value in
// quotes taken without them.
func readEnvFile(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: not KEY=VALUE: %q", path, line)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		out = append(out, strings.TrimSpace(k)+"="+v)
	}
	return out
}

// unitRun is a server started from queued.service.
type unitRun struct {
	httpPort int
	mu       sync.Mutex
	buf      bytes.Buffer
	done     chan struct{}
}

func (r *unitRun) logs() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

// startFromUnit starts queued as systemd would from queued.service, with
// the given lines as the contents of its env file (nil: no env file,
// which the unit allows). stateRoot stands for %S. It returns once the
// server has sent READY=1, as systemd waits for with Type=notify.
func startFromUnit(t *testing.T, stateRoot string, envFile []string) *unitRun {
	t.Helper()
	u := readUnit(t, "queued.service")
	if u.typ != "notify" {
		t.Fatalf("Type=%s: the unit is expected to be Type=notify", u.typ)
	}
	if len(u.execStart) == 0 {
		t.Fatal("queued.service has no ExecStart=")
	}
	// systemd makes the state directories before the start.
	mode := os.FileMode(0o755)
	if u.stateDirMode != "" {
		m, err := strconv.ParseUint(u.stateDirMode, 8, 32)
		if err != nil {
			t.Fatalf("StateDirectoryMode=%s: %v", u.stateDirMode, err)
		}
		mode = os.FileMode(m)
	}
	for _, d := range u.stateDirs {
		if err := os.MkdirAll(filepath.Join(stateRoot, d), mode); err != nil {
			t.Fatal(err)
		}
	}
	// The environment systemd gives a system service: a fixed PATH, then
	// Environment=, then the env files, whose variables override
	// Environment= whatever the order of the lines.
	env := map[string]string{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	var order []string
	set := func(kv string) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("not an assignment: %q", kv)
		}
		if _, seen := env[k]; !seen {
			order = append(order, k)
		}
		env[k] = v
	}
	for _, kv := range u.environment {
		set(specifiers(t, kv, stateRoot))
	}
	if len(u.envFiles) != 1 {
		t.Fatalf("EnvironmentFile= lines: %q; the test models one", u.envFiles)
	}
	if !strings.HasPrefix(u.envFiles[0], "-") && envFile == nil {
		t.Fatalf("EnvironmentFile=%s is required: the unit would not start without it", u.envFiles[0])
	}
	if envFile != nil {
		path := filepath.Join(t.TempDir(), "queued.env")
		if err := os.WriteFile(path, []byte(strings.Join(envFile, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, kv := range readEnvFile(t, path) {
			set(kv)
		}
	}
	sock := filepath.Join(t.TempDir(), "notify.sock")
	notify := listenNotify(t, sock)
	set("NOTIFY_SOCKET=" + sock)

	argv := make([]string, len(u.execStart))
	for i, w := range u.execStart {
		argv[i] = specifiers(t, w, stateRoot)
	}
	if filepath.Base(argv[0]) != "queued" {
		t.Fatalf("ExecStart= runs %s, not queued", argv[0])
	}
	argv[0] = queuedBinary(t)
	cmd := exec.Command(argv[0], argv[1:]...)
	for _, k := range order {
		cmd.Env = append(cmd.Env, k+"="+env[k])
	}
	// The server is this test binary (see TestMain): these two are what
	// makes it one, not part of what systemd would pass.
	cmd.Env = append(cmd.Env, serverEnv+"=1", "GORACE="+os.Getenv("GORACE"))
	r := &unitRun{done: make(chan struct{})}
	cmd.Stdout = &lockedWriter{&r.mu, &r.buf}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-r.done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-r.done
			t.Errorf("the server did not stop within 15s of SIGINT:\n%s", r.logs())
		}
	})
	ready := make(chan string, 1)
	go func() {
		buf := make([]byte, 4096)
		notify.SetReadDeadline(time.Now().Add(60 * time.Second))
		n, err := notify.Read(buf)
		if err != nil {
			ready <- "error: " + err.Error()
			return
		}
		ready <- string(buf[:n])
	}()
	select {
	case msg := <-ready:
		if !strings.HasPrefix(msg, "READY=1") {
			t.Fatalf("notification %q instead of READY=1; logs:\n%s", msg, r.logs())
		}
	case <-r.done:
		t.Fatalf("the server exited at start (systemd would report the unit failed):\n%s", r.logs())
	}
	r.httpPort, _ = strconv.Atoi(env["HTTP_PORT"])
	return r
}

// storage reads the storage section of /health.
func (r *unitRun) storage(t *testing.T) map[string]any {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/health", r.httpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	st, _ := doc["storage"].(map[string]any)
	if st == nil {
		t.Fatalf("/health without storage: %v", doc)
	}
	return st
}

// loopback is the part of the env file every case needs here: loopback
// only, on free ports (an operator's env file may set the same).
func loopback(t *testing.T) []string {
	return []string{"HOST=127.0.0.1", fmt.Sprintf("TCP_PORT=%d", freePort(t)), fmt.Sprintf("HTTP_PORT=%d", freePort(t))}
}

// TestSystemdUnitSQLiteDefault: with nothing in the env file about
// storage, the unit's own default puts SQLite in its state directory.
func TestSystemdUnitSQLiteDefault(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	r := startFromUnit(t, root, loopback(t))
	want := filepath.Join(root, "queued", "queued.db")
	st := r.storage(t)
	if st["driver"] != "sqlite" || st["path"] != want {
		t.Fatalf("storage %v, want sqlite at %s", st, want)
	}
	if _, err := os.Stat(want); err != nil {
		t.Fatalf("no database in the state directory: %v", err)
	}
}

// TestSystemdUnitDataPathFromEnvFile: DATA_PATH in the env file is the
// file used, not the unit's default.
func TestSystemdUnitDataPathFromEnvFile(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	want := filepath.Join(t.TempDir(), "elsewhere", "jobs.db")
	r := startFromUnit(t, root, append(loopback(t), "# the operator's choice", "DATA_PATH="+want))
	st := r.storage(t)
	if st["driver"] != "sqlite" || st["path"] != want {
		t.Fatalf("storage %v, want sqlite at %s", st, want)
	}
	if _, err := os.Stat(filepath.Join(root, "queued", "queued.db")); err == nil {
		t.Fatal("the unit's default database was made although the env file names another")
	}
}

// TestSystemdUnitPostgresFromEnvFile: BUNQUEUE_POSTGRES_URL in the env
// file alone turns PostgreSQL mode on, although the unit sets DATA_PATH.
func TestSystemdUnitPostgresFromEnvFile(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	root := t.TempDir()
	r := startFromUnit(t, root, append(loopback(t),
		`BUNQUEUE_POSTGRES_URL="`+testPGURL()+`"`, "BUNQUEUE_POSTGRES_NAMESPACE="+ns))
	st := r.storage(t)
	if st["driver"] != "postgres" || st["path"] != "queued_"+ns {
		t.Fatalf("storage %v, want postgres in schema queued_%s", st, ns)
	}
	if _, err := os.Stat(filepath.Join(root, "queued", "queued.db")); err == nil {
		t.Fatal("a SQLite file was made in PostgreSQL mode")
	}
	if !strings.Contains(r.logs(), "data path from the environment is not used") {
		t.Errorf("the log does not say DATA_PATH is not used:\n%s", r.logs())
	}
}
