package main

// The reference's HTTP routes, read from the reference package's route
// files, and a reference server to send them to (http_parity_test.go).
//
// The reference has no route table: its routes are hand-written if-chains
// over a few regular forms (a path regex constant and `xMatch && method
// === 'M'`, an exact `path === '/p' && method === 'M'`, a tuple table of
// [regex, method, command], nested method tests under `if (xMatch) {`,
// and, before the router, probes that answer any method). The forms are
// few and regular enough that a handful of regular expressions recover
// them all; a change of form in a new reference version shows up as fewer
// routes than the test expects, not as a comparison that passes on nothing.

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// refRoute is one route of the reference.
type refRoute struct {
	// method is the method the route is bound to; anyMethod routes answer
	// every method and have "" here.
	method    string
	anyMethod bool
	// path has its parameters as :name (named after the segment before
	// them); prefix routes match path + anything.
	path   string
	prefix bool
	file   string
}

// key is the route as the accepted differences and the docs name it.
func (r refRoute) key() string {
	m := r.method
	if r.anyMethod {
		m = "ANY"
	}
	p := r.path
	if r.prefix {
		p += "*"
	}
	return m + " " + p
}

// refRouteFiles are the reference's route files, relative to its
// dist/infrastructure/server, in its order of matching.
var refRouteFiles = []string{
	"http.js",
	"httpRouter.js",
	"httpRouteJobs.js",
	"http-routes/jobManagement.js",
	"http-routes/jobAdvanced.js",
	"httpRouteQueues.js",
	"http-routes/queueJobs.js",
	"httpRouteQueueConfig.js",
	"httpRouteResources.js",
}

var (
	reRegexConst  = regexp.MustCompile(`(?m)^const (RE_[A-Z_]+) = /\^(.*)\$/;$`)
	reMatchBind   = regexp.MustCompile(`const (\w+) = path\.match\((RE_[A-Z_]+)\);`)
	reMatchMethod = regexp.MustCompile(`if \((\w+Match) && method === '([A-Z]+)'\)`)
	reMatchBlock  = regexp.MustCompile(`^(\s*)if \((\w+Match)\) \{$`)
	reNestedMeth  = regexp.MustCompile(`if \(method === '([A-Z]+)'\)`)
	reExactPath   = regexp.MustCompile(`path === '([^']+)' && (?:req\.)?method === '([A-Z]+)'`)
	reTuple       = regexp.MustCompile(`\[(RE_[A-Z_]+), '([A-Z]+)', '(\w+)'\]`)
	reAnyMethod   = regexp.MustCompile(`if \(path === '([^']+)'(?: \|\| path(?: === '([^']+)'|\.startsWith\('([^']+)'\)))?\) \{`)
	reQueueFilter = regexp.MustCompile(`path\.startsWith\('(/\w+/queues/)'\)`)
	reOptions     = regexp.MustCompile(`if \(req\.method === 'OPTIONS'\)`)
)

// refParamName names a path parameter after the segments before it.
func refParamName(before []string) string {
	if len(before) >= 2 && before[len(before)-2] == "jobs" && before[len(before)-1] == "custom" {
		return "customId"
	}
	if len(before) == 0 {
		return "param"
	}
	switch before[len(before)-1] {
	case "queues":
		return "queue"
	case "crons":
		return "name"
	case "jobs", "webhooks", "workers":
		return "id"
	}
	return "param"
}

// refRegexPath turns a route regex's body (`\/jobs\/([^/]+)\/ack`) into
// a path (/jobs/:id/ack).
func refRegexPath(body string) (string, error) {
	segs := strings.Split(strings.TrimPrefix(strings.ReplaceAll(body, `\/`, "/"), "/"), "/")
	// The capture group holds a slash of its own ([^/]+), which the split
	// cut in two: join it back.
	var out []string
	for i := 0; i < len(segs); i++ {
		s := segs[i]
		if s == "([^" && i+1 < len(segs) && segs[i+1] == "]+)" {
			out = append(out, ":"+refParamName(out))
			i++
			continue
		}
		if strings.ContainsAny(s, `()[]\^$*+?|{}`) {
			return "", fmt.Errorf("route regex %q has a form this parser does not know", body)
		}
		out = append(out, s)
	}
	return "/" + strings.Join(out, "/"), nil
}

// parseRefRoutes reads the reference's routes from its route files.
func parseRefRoutes(serverDir string) ([]refRoute, error) {
	var routes []refRoute
	seen := map[string]bool{}
	add := func(r refRoute) {
		if !seen[r.key()] {
			seen[r.key()] = true
			routes = append(routes, r)
		}
	}
	for _, f := range refRouteFiles {
		src, err := os.ReadFile(filepath.Join(serverDir, f))
		if err != nil {
			return nil, err
		}
		text := string(src)
		regexes := map[string]string{}
		for _, m := range reRegexConst.FindAllStringSubmatch(text, -1) {
			p, err := refRegexPath(m[2])
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			regexes[m[1]] = p
		}
		binds := map[string]string{}
		for _, m := range reMatchBind.FindAllStringSubmatch(text, -1) {
			p, ok := regexes[m[2]]
			if !ok {
				return nil, fmt.Errorf("%s: %s matches %s, which is not defined in the file", f, m[1], m[2])
			}
			binds[m[1]] = p
		}
		lines := strings.Split(text, "\n")
		for i := 0; i < len(lines); i++ {
			ln := lines[i]
			if f == "http.js" {
				if reOptions.MatchString(ln) {
					add(refRoute{method: "OPTIONS", anyMethod: false, path: "/*", prefix: false, file: f})
				}
				if m := reAnyMethod.FindStringSubmatch(ln); m != nil && !strings.Contains(ln, "method") {
					add(refRoute{anyMethod: true, path: m[1], file: f})
					if m[2] != "" {
						add(refRoute{anyMethod: true, path: m[2], file: f})
					}
					if m[3] != "" {
						add(refRoute{anyMethod: true, path: m[3], prefix: true, file: f})
					}
				}
				if m := reQueueFilter.FindStringSubmatch(ln); m != nil {
					add(refRoute{anyMethod: true, path: m[1] + ":queue", file: f})
				}
			}
			for _, m := range reExactPath.FindAllStringSubmatch(ln, -1) {
				add(refRoute{method: m[2], path: m[1], file: f})
			}
			for _, m := range reMatchMethod.FindAllStringSubmatch(ln, -1) {
				p, ok := binds[m[1]]
				if !ok {
					return nil, fmt.Errorf("%s:%d: %s is not bound to a route regex", f, i+1, m[1])
				}
				add(refRoute{method: m[2], path: p, file: f})
			}
			for _, m := range reTuple.FindAllStringSubmatch(ln, -1) {
				p, ok := regexes[m[1]]
				if !ok {
					return nil, fmt.Errorf("%s:%d: %s is not defined", f, i+1, m[1])
				}
				add(refRoute{method: m[2], path: p, file: f})
			}
			if m := reMatchBlock.FindStringSubmatch(ln); m != nil {
				p, ok := binds[m[2]]
				if !ok {
					return nil, fmt.Errorf("%s:%d: %s is not bound to a route regex", f, i+1, m[2])
				}
				end := m[1] + "}"
				for j := i + 1; j < len(lines) && strings.TrimRight(lines[j], " ") != end; j++ {
					if n := reNestedMeth.FindStringSubmatch(lines[j]); n != nil {
						add(refRoute{method: n[1], path: p, file: f})
					}
				}
			}
		}
	}
	return routes, nil
}

// refServerDir is the reference's server folder, when the compat packages
// are installed.
func refServerDir(t *testing.T) (dir, bun string) {
	t.Helper()
	compat, bun := compatDir(t)
	return filepath.Join(compat, "node_modules", "bunqueue", "dist", "infrastructure", "server"), bun
}

// refServer is a reference server (`bunqueue start`, in memory) started
// for a test.
type refServer struct {
	cmd  *exec.Cmd
	http string // host:port
	tcp  string
	mu   sync.Mutex
	log  bytes.Buffer
	done chan struct{}
}

func (s *refServer) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.Write(b)
}

func (s *refServer) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// startRefServer runs the reference server on loopback, on ports the
// kernel picks (TCP_PORT=0 HTTP_PORT=0; the server does not print them,
// so they are read from the process's listening sockets), with extra
// environment variables (AUTH_TOKENS=...).
func startRefServer(t *testing.T, env ...string) *refServer {
	t.Helper()
	compat, bun := compatDir(t)
	cli := filepath.Join(compat, "node_modules", "bunqueue", "dist", "cli", "index.js")
	cmd := exec.Command(bun, cli, "start", "--host", "127.0.0.1")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), append([]string{"TCP_PORT=0", "HTTP_PORT=0", "NO_COLOR=1"}, env...)...)
	s := &refServer{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = s, s
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-s.done
		}
	})
	eventually(t, 30*time.Second, "the reference server listening", func() (bool, string) {
		select {
		case <-s.done:
			t.Fatalf("the reference server exited at start:\n%s", s.output())
		default:
		}
		ports := listeningPorts(cmd.Process.Pid)
		if len(ports) >= 2 {
			// Which is which: the HTTP one answers /healthz.
			for _, p := range ports {
				addr := "127.0.0.1:" + strconv.Itoa(p)
				if httpAnswers(addr) {
					s.http = addr
				} else {
					s.tcp = addr
				}
			}
		}
		return s.http != "" && s.tcp != "", s.output()
	})
	return s
}

func httpAnswers(addr string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	res, err := c.Get("http://" + addr + "/healthz")
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// listeningPorts are the TCP ports a process listens on: its socket
// inodes (/proc/PID/fd) looked up in the kernel's table of listening
// sockets (/proc/net/tcp, state 0A).
func listeningPorts(pid int) []int {
	inodes := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var ports []int
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, _ := os.ReadFile(table)
		for _, ln := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(ln)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] {
				continue
			}
			// The local address is HEXIP:HEXPORT.
			i := strings.LastIndexByte(f[1], ':')
			if p, err := strconv.ParseInt(f[1][i+1:], 16, 32); err == nil {
				ports = append(ports, int(p))
			}
		}
	}
	return ports
}

// TestRouteJSParseInt: query integers as JavaScript's parseInt(s, 10)
// reads them.
func TestRouteJSParseInt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in string
		n  int64
		ok bool
	}{
		{"5000", 5000, true}, {"5000ms", 5000, true}, {"  42", 42, true}, {"\t-7x", -7, true}, {"+3", 3, true},
		{"2.9", 2, true}, {"1e3", 1, true}, {"0x10", 0, true}, {"", 0, false}, {"x", 0, false}, {"-", 0, false},
		{" ", 0, false}, {"- 1", 0, false}, {"99999999999999999999999", 1 << 53, true},
	} {
		if n, ok := jsParseInt(tc.in); n != tc.n || ok != tc.ok {
			t.Errorf("jsParseInt(%q) = %d, %v; want %d, %v", tc.in, n, ok, tc.n, tc.ok)
		}
	}
}
