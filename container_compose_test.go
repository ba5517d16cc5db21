package main

// The compose file of docs/container.md ("Two brokers on PostgreSQL, with
// compose"), run as written with Debian's docker-compose, but for three
// rewrites: queued's image is the one built here, the host ports are free
// ones on 127.0.0.1, and, when postgres:<tag> is neither on the machine
// nor pullable (no Docker Hub), the postgres service runs a stand-in built
// here from the host's Debian PostgreSQL: what the compose file uses of
// the official image (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, the
// data in /var/lib/postgresql/data, pg_isready, port 5432 with password
// authentication), on an empty base, so that nothing comes from a registry.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// composeProvide says how to get the compose command line the test runs.
const composeProvide = "apt-get install -y docker-compose"

// TestComposeTwoBrokers runs docs/container.md's compose file: PostgreSQL
// and two brokers on one namespace. A job pushed through broker A is
// pulled and acknowledged through broker B; then `docker-compose stop
// broker-a` drains A (a clean stop, exit 0) while B goes on serving, the
// job A had taken in included.
func TestComposeTwoBrokers(t *testing.T) {
	t.Parallel()
	if err := exec.Command("docker", "info").Run(); err != nil {
		needService(t, "no Docker daemon", "apt-get install -y docker.io && dockerd &")
	}
	if _, err := exec.LookPath("docker-compose"); err != nil {
		needService(t, "no docker-compose", composeProvide)
	}
	start := time.Now()
	doc := composeFromDocs(t)
	pgWant := regexp.MustCompile(`image: (postgres:\S+)`).FindStringSubmatch(doc)
	if pgWant == nil {
		t.Fatal("docs/container.md's compose file has no postgres image")
	}
	// The postgres image is made ready while queued's is built.
	pgc := make(chan composeImage, 1)
	go func() { pgc <- composePostgresImage(pgWant[1]) }()
	tag := composeQueuedImage(t)
	pg := <-pgc
	if errors.Is(pg.err, errNoPGServer) {
		needService(t, pg.err.Error(), "apt-get install -y postgresql")
	}
	if pg.err != nil {
		t.Fatal(pg.err)
	}
	t.Logf("images ready in %v; postgres: %s", time.Since(start).Round(time.Millisecond), pg.how)
	token := regexp.MustCompile(`AUTH_TOKENS: (\S+)`).FindStringSubmatch(doc)
	if token == nil {
		t.Fatal("docs/container.md's compose file sets no AUTH_TOKENS")
	}
	p := startCompose(t, composeForTest(t, doc, tag, pgWant[1], pg.image))
	t.Logf("compose up in %v", time.Since(start).Round(time.Millisecond))
	a, b := p.broker("broker-a", token[1]), p.broker("broker-b", token[1])
	composeRoundTrip(t, a, b, "compose-a-to-b")
	// A job waiting when A stops is B's to hand out.
	left := push(t, a, "compose-left", M{"data": M{"pushed": "through broker A"}})

	stopped := time.Now()
	p.run("stop", "broker-a")
	t.Logf("docker-compose stop broker-a took %v", time.Since(stopped).Round(time.Millisecond))
	idA := p.run("ps", "-q", "broker-a")
	if st := docker(t, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", idA); st != "exited 0" {
		t.Fatalf("broker A after docker-compose stop: %s, want exited 0", st)
	}
	if logs := p.run("logs", "--no-color", "broker-a"); !strings.Contains(logs, `"msg":"stopped"`) {
		t.Fatalf("broker A's log shows no clean stop:\n%s", logs)
	}
	composeAck(t, b, "compose-left", left)
	composeRoundTrip(t, b, b, "compose-b-alone")
	idB := p.run("ps", "-q", "broker-b")
	eventually(t, 60*time.Second, "docker to report broker B healthy", func() (bool, string) {
		st := docker(t, "inspect", "--format", "{{.State.Health.Status}}", idB)
		return st == "healthy", st
	})
	t.Logf("done in %v", time.Since(start).Round(time.Millisecond))
}

// composeFromDocs answers the YAML block of docs/container.md's compose
// section.
func composeFromDocs(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("docs/container.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Two brokers on PostgreSQL, with compose\n")
	if !ok {
		t.Fatal(`docs/container.md has no "Two brokers on PostgreSQL, with compose" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("docs/container.md's compose section has no yaml block")
	}
	block, _, ok = strings.Cut(block, "```")
	if !ok {
		t.Fatal("docs/container.md's compose yaml block does not end")
	}
	return block
}

// composeForTest writes the compose file with queued's image the one
// built for the test, postgres's image pg (pgWant itself when it is
// there), and every published port an ephemeral one on 127.0.0.1, and
// answers its path.
func composeForTest(t *testing.T, doc, queuedTag, pgWant, pg string) string {
	t.Helper()
	replace := func(old, repl string) {
		if n := strings.Count(doc, old); n != 1 {
			t.Fatalf("docs/container.md's compose file has %q %d times, want once: the test rewrites it", old, n)
		}
		doc = strings.Replace(doc, old, repl, 1)
	}
	replace("image: "+pgWant, "image: "+pg)
	replace("image: queued:latest", "image: "+queuedTag)
	ports := regexp.MustCompile(`"\d+:(\d+)"`)
	if n := len(ports.FindAllString(doc, -1)); n != 4 {
		t.Fatalf("docs/container.md's compose file publishes %d ports, want 4 (two per broker)", n)
	}
	doc = ports.ReplaceAllString(doc, `"127.0.0.1::$1"`)
	path := filepath.Join(t.TempDir(), "compose.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// composeQueuedImage builds queued's image for the test, as
// TestContainerImage does, and removes it at the end.
func composeQueuedImage(t *testing.T) string {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	tag := "queued-compose-" + hex.EncodeToString(b[:]) + ":test"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "container/build", tag)
	build.Env = append(os.Environ(), "QUEUED_BINARY="+buildRelease(t))
	out, err := build.CombinedOutput()
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", tag).Run() })
	if err != nil {
		t.Fatalf("container/build: %v\n%s", err, out)
	}
	return tag
}

// composeProject is a docker-compose project the test started.
type composeProject struct {
	t    *testing.T
	name string
	file string
}

// startCompose brings the project of compose file up under a name of its
// own, and takes it down with its volumes at the end (showing its logs
// first when the test failed).
func startCompose(t *testing.T, file string) *composeProject {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	p := &composeProject{t: t, name: "queuedcompose" + hex.EncodeToString(b[:]), file: file}
	t.Cleanup(func() {
		if out, err := p.try("down", "-v", "--remove-orphans"); err != nil {
			t.Errorf("docker-compose down -v: %v\n%s", err, out)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := p.try("logs", "--no-color")
			t.Logf("docker-compose logs:\n%s", out)
		}
	})
	p.run("up", "-d")
	return p
}

// try runs docker-compose on the project and answers its output.
func (p *composeProject) try(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	full := append([]string{"--ansi", "never", "-p", p.name, "-f", p.file}, args...)
	out, err := exec.CommandContext(ctx, "docker-compose", full...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// run is try that fails the test when docker-compose does.
func (p *composeProject) run(args ...string) string {
	p.t.Helper()
	out, err := p.try(args...)
	if err != nil {
		p.t.Fatalf("docker-compose %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// broker waits until service's /health says healthy, and answers a wire
// protocol client authenticated with token.
func (p *composeProject) broker(service, token string) *tclient {
	t := p.t
	t.Helper()
	wire, web := p.run("port", service, "6789"), p.run("port", service, "6790")
	client := &http.Client{Timeout: 5 * time.Second}
	eventually(t, 60*time.Second, service+"'s /health healthy", func() (bool, string) {
		req, err := http.NewRequest("GET", "http://"+web+"/health", nil)
		if err != nil {
			return false, err.Error()
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var h struct{ Status string }
		err = json.NewDecoder(resp.Body).Decode(&h)
		return err == nil && resp.StatusCode == 200 && h.Status == "healthy", fmt.Sprint(resp.Status, " ", h.Status, " ", err)
	})
	c := dial(t, wire)
	c.ok(M{"cmd": "Auth", "token": token})
	return c
}

// composeRoundTrip pushes a job through from, pulls and acknowledges it
// through to, and waits until from sees it completed.
func composeRoundTrip(t *testing.T, from, to *tclient, queue string) {
	t.Helper()
	id := push(t, from, queue, M{"data": M{"via": "compose"}})
	composeAck(t, to, queue, id)
	waitState(t, from, id, "completed", 10*time.Second)
}

// composeAck pulls job id from queue through c (waiting for it up to
// 20 s) and acknowledges it.
func composeAck(t *testing.T, c *tclient, queue, id string) {
	t.Helper()
	a := c.okWithin(M{"cmd": "PULL", "queue": queue, "owner": "compose-test", "timeout": 20000}, 30*time.Second)
	j, ok := a["job"].(M)
	if !ok || j["id"] != id {
		t.Fatalf("PULL %s: want job %s, got %v", queue, id, a)
	}
	c.ok(M{"cmd": "ACK", "id": id, "token": str(t, a, "token"), "result": M{"done": true}})
	waitState(t, c, id, "completed", 10*time.Second)
}

// composeImage is the postgres image the compose file will run, or why
// there is none.
type composeImage struct {
	image, how string
	err        error
}

// errNoPGServer: the host has no PostgreSQL server to build a stand-in from.
var errNoPGServer = errors.New("postgres image neither present nor pullable, and no PostgreSQL server in /usr/lib/postgresql to build a stand-in from")

// composePostgresImage answers want (postgres:17) when Docker has it or
// can pull it, else the stand-in built from the host's PostgreSQL. It
// runs beside the test's goroutine: errors are answered, not raised.
func composePostgresImage(want string) composeImage {
	if exec.Command("docker", "image", "inspect", want).Run() == nil {
		return composeImage{image: want, how: want + ", present"}
	}
	// A registry out of reach without a DNS failure (a firewall that
	// drops) would hold the pull for minutes; a pull not done in 45 s
	// falls back to the stand-in.
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", "pull", "-q", want).CombinedOutput()
	if err == nil {
		return composeImage{image: want, how: want + ", pulled"}
	}
	why := strings.TrimSpace(string(out))
	image, how, err := pgStandIn()
	return composeImage{image: image, how: how + ", standing in for " + want + " (docker pull: " + why + ")", err: err}
}

// standInInputs are the files of the repository the stand-in is built
// from, besides the host's PostgreSQL.
var standInInputs = []string{"testdata/postgres-standin/Dockerfile", "testdata/postgres-standin/entrypoint.go"}

// pgStandIn answers the stand-in for the official postgres image, tagged
// queued-test-postgres:<the host's PostgreSQL major version>: the image
// built before when its label says it was built from the same files,
// else one built now (and the stale one removed).
func pgStandIn() (image, how string, err error) {
	servers, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(servers) == 0 {
		return "", "", errNoPGServer
	}
	major := func(path string) int {
		n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
		return n
	}
	sort.Slice(servers, func(i, j int) bool { return major(servers[i]) < major(servers[j]) })
	bin := filepath.Dir(servers[len(servers)-1])
	ver := filepath.Base(filepath.Dir(bin))
	tree, err := newStandInTree(ver)
	if err != nil {
		return "", "", err
	}
	sum, err := tree.sum()
	if err != nil {
		return "", "", err
	}
	image = "queued-test-postgres:" + ver
	old, _ := cmdOut(time.Minute, "docker", "image", "inspect", "--format", `{{.Id}} {{index .Config.Labels "queued.test.inputs"}}`, image)
	oldID, label, _ := strings.Cut(old, " ")
	if label == sum {
		return image, "stand-in " + image + " (Debian's PostgreSQL " + ver + ", built before from the same files)", nil
	}
	start := time.Now()
	if err := tree.build(bin, image, sum); err != nil {
		return "", "", err
	}
	if oldID != "" {
		exec.Command("docker", "rmi", oldID).Run() // stale; refused while a container uses it
	}
	return image, fmt.Sprintf("stand-in %s (Debian's PostgreSQL %s, built in %v)", image, ver, time.Since(start).Round(time.Millisecond)), nil
}

// cmdOut runs a command and answers its output, trimmed.
func cmdOut(within time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// standInTree is what the stand-in holds of the host.
type standInTree struct {
	files map[string]string // path in the image: the host's file (links followed)
	links map[string]string // path in the image: the link's target
}

// newStandInTree gathers the server's binaries (postgres, initdb,
// pg_isready), its modules but the JIT (plpgsql, the text search
// dictionaries...), its share folder, the time zones, /bin/sh (initdb
// runs the server through popen, that is through the shell), and every
// shared library those need, with the dynamic loader, at their own paths.
func newStandInTree(ver string) (*standInTree, error) {
	tr := &standInTree{files: map[string]string{}, links: map[string]string{}}
	root := "/usr/lib/postgresql/" + ver
	elves := []string{root + "/bin/postgres", root + "/bin/initdb", root + "/bin/pg_isready", "/bin/sh"}
	modules, err := filepath.Glob(root + "/lib/*.so")
	if err != nil {
		return nil, err
	}
	for _, m := range modules {
		if !strings.HasPrefix(filepath.Base(m), "llvmjit") {
			elves = append(elves, m)
		}
	}
	for _, dir := range []string{"/usr/share/postgresql/" + ver, "/usr/share/zoneinfo"} {
		if err := tr.addDir(dir); err != nil {
			return nil, err
		}
	}
	out, err := cmdOut(time.Minute, "ldd", elves...)
	if err != nil {
		return nil, err
	}
	for _, e := range elves {
		tr.files[e] = e
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case strings.Contains(line, "not found"):
			return nil, fmt.Errorf("ldd: a library is missing: %s", line)
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			tr.files[f[2]] = f[2]
		case len(f) == 2 && strings.HasPrefix(f[0], "/") && strings.HasPrefix(f[1], "("):
			tr.files[f[0]] = f[0] // the dynamic loader
		}
	}
	return tr, nil
}

// addDir adds the files and links under dir.
func (tr *standInTree) addDir(dir string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			tr.links[path] = target
			return err
		case d.Type().IsRegular():
			tr.files[path] = path
		}
		return nil
	})
}

// sum answers a digest of what the image is built from: the repository's
// inputs, and the path, size and time of every file taken from the host.
func (tr *standInTree) sum() (string, error) {
	h := sha256.New()
	for _, in := range standInInputs {
		b, err := os.ReadFile(in)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n%s", in, len(b), b)
	}
	for _, p := range sortedKeys(tr.files) {
		st, err := os.Stat(tr.files[p])
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "f %s %d %d\n", p, st.Size(), st.ModTime().UnixNano())
	}
	for _, p := range sortedKeys(tr.links) {
		fmt.Fprintf(h, "l %s %s\n", p, tr.links[p])
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// build puts the tree, the users, the folders the server writes and the
// entrypoint in a build context, and builds the image from it, labelled
// with sum.
func (tr *standInTree) build(bin, image, sum string) error {
	dir, err := os.MkdirTemp("", "queued-pg-standin")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "root")
	for _, p := range sortedKeys(tr.files) {
		if err := copyFileTo(tr.files[p], root+p); err != nil {
			return err
		}
	}
	for _, p := range sortedKeys(tr.links) {
		if err := os.MkdirAll(filepath.Dir(root+p), 0o755); err != nil {
			return err
		}
		if err := os.Symlink(tr.links[p], root+p); err != nil {
			return err
		}
	}
	if err := standInSkeleton(dir); err != nil {
		return err
	}
	if _, err := cmdOut(3*time.Minute, "go", "build", "-trimpath", "-o", filepath.Join(root, "entrypoint"), standInInputs[1]); err != nil {
		return err
	}
	if err := copyFileTo(standInInputs[0], filepath.Join(dir, "Dockerfile")); err != nil {
		return err
	}
	_, err = cmdOut(5*time.Minute, "docker", "build", "-q", "--build-arg", "PGBIN="+bin,
		"--label", "queued.test.inputs="+sum, "-t", image, dir)
	return err
}

// standInSkeleton writes the stand-in's users (postgres is 999, as in the
// official image: initdb and a single-user backend look their user up),
// /tmp, and the folders owned by the server's user (the Dockerfile's
// second COPY): the data folder and the socket's.
func standInSkeleton(dir string) error {
	files := map[string]string{
		"root/etc/passwd": "root:x:0:0:root:/root:/sbin/nologin\npostgres:x:999:999:PostgreSQL:/var/lib/postgresql:/sbin/nologin\n",
		"root/etc/group":  "root:x:0:\npostgres:x:999:\n",
	}
	for name, content := range files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	for name, mode := range map[string]fs.FileMode{"root/tmp": 0o777 | fs.ModeSticky,
		"owned/var/lib/postgresql/data": 0o700, "owned/var/run/postgresql": 0o2775} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(path, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(path, mode); err != nil {
			return err
		}
	}
	return nil
}

// copyFileTo copies src (a link followed) to dst, with its permissions,
// making dst's folder.
func copyFileTo(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, st.Mode().Perm())
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
