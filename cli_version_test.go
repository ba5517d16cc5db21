package main

// queued names its own version wherever it shows one (/health, the
// dashboard's header, queued version, queued doctor), and keeps beside it
// the bunqueue version it answers for, which the official CLI's doctor
// compares with its own (TestCompat/*/http runs that doctor).

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestHTTPHealthVersionFields(t *testing.T) {
	t.Parallel()
	if version == compatVersion {
		t.Fatal("queued's version equals the bunqueue version it answers for: these tests cannot tell them apart")
	}
	ts := startServerHTTP(t, nil)
	h := newHC(t, ts).ok("GET", "/health", nil)
	if h["queuedVersion"] != version {
		t.Errorf("/health queuedVersion %v, want queued's own %q", h["queuedVersion"], version)
	}
	// What the official doctor compares with its own VERSION.
	if h["version"] != compatVersion || h["bunqueueVersion"] != compatVersion {
		t.Errorf("/health version %v, bunqueueVersion %v, want %q", h["version"], h["bunqueueVersion"], compatVersion)
	}
	if jnum(t, h["protocolVersion"]) != protocolVersion {
		t.Errorf("/health protocolVersion %v", h["protocolVersion"])
	}

	// With tokens, a caller without one learns only whether it is up.
	tok := startServerHTTP(t, &config{authTokens: "s3cret"})
	c := newHC(t, tok)
	if m := c.obj("GET", "/health", nil, 200); len(m) != 2 || m["status"] != "healthy" {
		t.Errorf("/health without the token: %v", m)
	}
	c.token = "s3cret"
	if m := c.ok("GET", "/health", nil); m["queuedVersion"] != version {
		t.Errorf("/health with the token: queuedVersion %v", m["queuedVersion"])
	}
}

// queued version asks a live server over HTTP and prints queued's version
// for both sides, not the bunqueue version the server answers for.
func TestVersionCLILive(t *testing.T) {
	t.Parallel()
	g := cliServer(t, nil)
	out, _ := cli(t, g, 0, "version")
	if !strings.Contains(out, "Client: queued "+version+" (bunqueue protocol 3, compatible with bunqueue "+compatVersion+")") ||
		!strings.Contains(out, "Server: queued "+version+" at http://127.0.0.1:") {
		t.Errorf("version: %q", out)
	}
	if strings.Contains(out, "Server: "+compatVersion) || strings.Contains(out, "Server: queued "+compatVersion) {
		t.Errorf("version names the server by the bunqueue version: %q", out)
	}
	// The global options before the word, and --json.
	code, out, errOut := runCLI(t, append(append([]string{}, g...), "version", "--json")...)
	var doc struct {
		Client, Server map[string]any
	}
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil {
		t.Fatalf("version --json: exit %d, %q %q", code, out, errOut)
	}
	if doc.Server["name"] != "queued" || doc.Server["version"] != version || doc.Server["reachable"] != true ||
		doc.Server["compatibleWith"] != "bunqueue "+compatVersion || doc.Client["version"] != version {
		t.Errorf("version --json: %s", out)
	}

	// A server with tokens shows its version to holders of one only.
	g = cliServer(t, &config{authTokens: "s3cret"})
	out, _ = cli(t, g, 0, "version")
	if !strings.Contains(out, "shows its version only with its token") {
		t.Errorf("version without the token: %q", out)
	}
	out, _ = cli(t, g, 0, "version", "--token", "s3cret")
	if !strings.Contains(out, "Server: queued "+version+" at") {
		t.Errorf("version with the token: %q", out)
	}
	if code, _, errOut := runCLI(t, "version", "extra"); code != 2 || !strings.Contains(errOut, `unexpected argument "extra"`) {
		t.Errorf("version extra: exit %d, %q", code, errOut)
	}
}

// doctorVersion runs queued doctor --json and returns its version check.
func doctorVersion(t *testing.T, g []string) map[string]any {
	t.Helper()
	_, out, errOut := runCLI(t, append(append([]string{}, g...), "doctor", "--json")...)
	var doc struct{ Checks []map[string]any }
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("doctor --json: %q %q", out, errOut)
	}
	for _, c := range doc.Checks {
		if c["name"] == "version" {
			return c
		}
	}
	t.Fatalf("doctor --json has no version check: %s", out)
	return nil
}

// queued doctor against queued of the same version has nothing to say
// about versions; against another queued or the reference it warns.
func TestDoctorVersion(t *testing.T) {
	t.Parallel()
	g := cliServer(t, nil)
	c := doctorVersion(t, g)
	if c["ok"] != true || c["warning"] == true || c["detail"] != "server and this client are both queued "+version {
		t.Errorf("doctor against this queued: %v", c)
	}
	out, _ := cli(t, g, 0, "doctor")
	if strings.Contains(out, "warn") || !strings.Contains(out, "All checks passed.") {
		t.Errorf("doctor against this queued warns:\n%s", out)
	}

	// Fake servers answering /health on PORT+1 as the reference and as
	// another queued would.
	for _, tc := range []struct {
		health string
		want   string
	}{
		{`{"ok":true,"status":"healthy","version":"` + compatVersion + `"}`, "server bunqueue " + compatVersion + ", this client queued " + version},
		{`{"ok":true,"status":"healthy","version":"` + compatVersion + `","queuedVersion":"0.0.9"}`, "server queued 0.0.9, this client queued " + version},
	} {
		port := fakeHealth(t, tc.health)
		c := doctorVersion(t, []string{"-H", "127.0.0.1", "-p", strconv.Itoa(port - 1)})
		if c["ok"] != true || c["warning"] != true || !strings.HasPrefix(c["detail"].(string), tc.want) {
			t.Errorf("doctor against %s: %v, want a warning %q", tc.health, c, tc.want)
		}
	}
}

// fakeHealth serves doc at /health on a port whose predecessor is free
// too (queued doctor looks for HTTP on the TCP port plus one) and returns
// the HTTP port.
func fakeHealth(t *testing.T, doc string) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		p := freePortPair(t)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		if err != nil {
			continue
		}
		srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(doc))
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		return p + 1
	}
	t.Fatal("no two free ports in a row")
	return 0
}

// The dashboard's header shows queued's version, read from /health.
func TestVersionDashboardHeader(t *testing.T) {
	t.Parallel()
	d := startBrowser(t)
	ts := startServerHTTP(t, nil)
	d.must("POST", "/url", map[string]string{"url": "http://" + ts.http + "/"})
	var meta string
	d.waitFor(15*time.Second, "the header's version", func() (bool, error) {
		meta = d.script(`return document.getElementById('meta').textContent`)
		return meta != "", nil
	})
	if !strings.HasPrefix(meta, "v"+version+" ·") || strings.Contains(meta, compatVersion) {
		t.Errorf("dashboard header %q, want queued's version v%s", meta, version)
	}
}
