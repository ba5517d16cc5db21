package main

// The dashboard in a real browser: headless Chromium, driven through
// chromedriver's W3C WebDriver API (plain HTTP and JSON), loads the page of
// a running queued; a job pushed over the wire protocol must appear in the
// page within two seconds, and a click on it must show its data. The test
// saves a screenshot and logs where.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const browserInstall = "apt-get install -y chromium chromium-driver"

// wd is a WebDriver session.
type wd struct {
	t    *testing.T
	base string // http://127.0.0.1:port
	sess string
}

// call sends one WebDriver command and returns its value.
func (d *wd) call(method, path string, body any) (json.RawMessage, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	// Paths are the session's own once there is one, but for /status.
	url := d.base + path
	if d.sess != "" && path != "/status" {
		url = d.base + "/session/" + d.sess + path
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var out struct {
		Value json.RawMessage `json:"value"`
	}
	raw, _ := io.ReadAll(res.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, raw)
	}
	if res.StatusCode != 200 {
		var e struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		json.Unmarshal(out.Value, &e)
		return nil, &wdError{Code: e.Error, Msg: e.Message}
	}
	return out.Value, nil
}

type wdError struct{ Code, Msg string }

func (e *wdError) Error() string { return e.Code + ": " + firstLine(e.Msg) }

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

func (d *wd) must(method, path string, body any) json.RawMessage {
	d.t.Helper()
	v, err := d.call(method, path, body)
	if err != nil {
		d.t.Fatalf("webdriver %s %s: %v", method, path, err)
	}
	return v
}

// find returns the id of the first element matching a CSS selector, or ""
// when there is none yet.
func (d *wd) find(css string) (string, error) {
	v, err := d.call("POST", "/element", map[string]string{"using": "css selector", "value": css})
	if err != nil {
		var we *wdError
		if ok := asWD(err, &we); ok && we.Code == "no such element" {
			return "", nil
		}
		return "", err
	}
	var el map[string]string
	json.Unmarshal(v, &el)
	for _, id := range el {
		return id, nil
	}
	return "", fmt.Errorf("element reference missing in %s", v)
}

func asWD(err error, target **wdError) bool {
	we, ok := err.(*wdError)
	if ok {
		*target = we
	}
	return ok
}

// waitFor polls until fn is true or within has passed.
func (d *wd) waitFor(within time.Duration, what string, fn func() (bool, error)) time.Duration {
	d.t.Helper()
	start := time.Now()
	for {
		ok, err := fn()
		if err != nil {
			d.t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > within {
			d.t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (d *wd) text(el string) string {
	v, err := d.call("GET", "/element/"+el+"/text", nil)
	if err != nil {
		return ""
	}
	var s string
	json.Unmarshal(v, &s)
	return s
}

func (d *wd) script(src string) string {
	d.t.Helper()
	v := d.must("POST", "/execute/sync", map[string]any{"script": src, "args": []any{}})
	var s string
	json.Unmarshal(v, &s)
	return s
}

// startBrowser starts chromedriver and a headless Chromium session with
// extra command-line arguments, ended when the test is; it skips the test
// where they are not installed, but in CI.
func startBrowser(t *testing.T, extraArgs ...string) *wd {
	t.Helper()
	chromium, err1 := exec.LookPath("chromium")
	driver, err2 := exec.LookPath("chromedriver")
	if err1 != nil || err2 != nil {
		needService(t, "chromium or chromedriver not installed", browserInstall)
	}
	port := freePort(t)
	profile := t.TempDir() // made before the cleanup below, so removed after it
	cmd := exec.Command(driver, fmt.Sprintf("--port=%d", port))
	// A process group of its own: the browser chromedriver starts is in
	// it, and goes with it even if the session cannot be ended cleanly.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	d := &wd{t: t, base: fmt.Sprintf("http://127.0.0.1:%d", port)}
	t.Cleanup(func() {
		if d.sess != "" {
			// Quits the browser.
			if _, err := d.call("DELETE", "", nil); err != nil {
				t.Logf("ending the WebDriver session: %v", err)
			}
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	d.waitFor(15*time.Second, "chromedriver to start", func() (bool, error) {
		v, err := d.call("GET", "/status", nil)
		if err != nil {
			return false, nil
		}
		var st struct{ Ready bool }
		json.Unmarshal(v, &st)
		return st.Ready, nil
	})

	started := time.Now()
	v := d.must("POST", "/session", map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName": "chrome",
		"goog:chromeOptions": map[string]any{
			"binary": chromium,
			// As the machine notes have it: without the background
			// networking flags Chromium tries hosts this network refuses.
			"args": append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
				"--disable-background-networking", "--disable-component-update", "--disable-sync",
				"--disable-dev-shm-usage", "--window-size=1440,1000", "--user-data-dir=" + profile}, extraArgs...),
		},
	}}})
	var sess struct {
		SessionID string `json:"sessionId"`
	}
	json.Unmarshal(v, &sess)
	if sess.SessionID == "" {
		t.Fatalf("no session in %s", v)
	}
	d.sess = sess.SessionID
	t.Logf("browser session started in %v", time.Since(started).Round(time.Millisecond))
	return d
}

// TestDashboardBrowser needs chromium and chromedriver (Debian packages
// chromium and chromium-driver); without them it is skipped, except in CI.
func TestDashboardBrowser(t *testing.T) {
	t.Parallel()
	d := startBrowser(t)
	ts := startServerHTTP(t, nil)

	d.must("POST", "/url", map[string]string{"url": "http://" + ts.http + "/"})
	// The page is live once its event stream is open.
	d.waitFor(10*time.Second, "the dashboard's event stream", func() (bool, error) {
		return d.script(`return document.getElementById('live').className`) == "live on", nil
	})

	marker := fmt.Sprintf("browser-%d", time.Now().UnixNano())
	c := dial(t, ts.addr)
	id := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "browser", "name": "greet",
		"data": map[string]any{"marker": marker, "to": "ada@example.com"}}), "id")
	pushed := time.Now()
	sel := fmt.Sprintf(`#feed li[data-job-id="%s"]`, id)
	var el string
	d.waitFor(2*time.Second, "the pushed job to appear in the page", func() (bool, error) {
		var err error
		el, err = d.find(sel)
		return el != "", err
	})
	t.Logf("job %s appeared in the page %v after its push was answered", id, time.Since(pushed).Round(time.Millisecond))

	// The queue shows up in the table too.
	d.waitFor(3*time.Second, "the queue's row", func() (bool, error) {
		row, err := d.find(`#queues tr[data-queue="browser"]`)
		return row != "", err
	})

	d.must("POST", "/element/"+el+"/click", map[string]any{})
	d.waitFor(3*time.Second, "the job's data in the drawer", func() (bool, error) {
		data, err := d.find("#jd-data")
		if err != nil || data == "" {
			return false, err
		}
		return strings.Contains(d.text(data), marker), nil
	})
	if txt := d.script(`return document.getElementById('jd-id').textContent`); txt != id {
		t.Fatalf("the drawer shows job %q, want %q", txt, id)
	}
	// Wait for the drawer's slide-in to finish before the picture.
	d.waitFor(3*time.Second, "the drawer's slide-in finished", func() (bool, error) {
		return d.script(`const d = document.getElementById('drawer');
			return String(d.classList.contains('open') && d.getAnimations().length === 0 && getComputedStyle(d).transform === 'none')`) == "true", nil
	})

	png := d.must("GET", "/screenshot", nil)
	var b64 string
	json.Unmarshal(png, &b64)
	img, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(img) < 1000 {
		t.Fatalf("screenshot: %v (%d bytes)", err, len(img))
	}
	path := os.Getenv("QUEUED_SCREENSHOT")
	if path == "" {
		path = filepath.Join(os.TempDir(), "queued-dashboard.png")
	}
	if err := os.WriteFile(path, img, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot saved: %s", path)
	if errs := d.script(`return (window.__errors || []).join('\n')`); errs != "" {
		t.Errorf("the page reported errors:\n%s", errs)
	}

	// A server with tokens: the page asks for one, then goes live with it
	// (its event stream sends the token too).
	tok := startServerHTTP(t, &config{authTokens: "s3cret"})
	d.must("POST", "/url", map[string]string{"url": "http://" + tok.http + "/"})
	var input string
	d.waitFor(5*time.Second, "the token dialog", func() (bool, error) {
		if d.script(`return document.getElementById('token-dialog').className`) != "modal" {
			return false, nil
		}
		var err error
		input, err = d.find("#token-input")
		return input != "", err
	})
	if d.script(`return document.getElementById('live').className`) == "live on" {
		t.Fatal("the page went live without a token")
	}
	d.must("POST", "/element/"+input+"/value", map[string]string{"text": "s3cret"})
	btn, err := d.find("#token-form button[type=submit]")
	if err != nil || btn == "" {
		t.Fatalf("the dialog's button: %v", err)
	}
	d.must("POST", "/element/"+btn+"/click", map[string]any{})
	d.waitFor(5*time.Second, "the page to go live with the token", func() (bool, error) {
		return d.script(`return document.getElementById('live').className`) == "live on", nil
	})
	tc := dial(t, tok.addr)
	tc.ok(map[string]any{"cmd": "Auth", "token": "s3cret"})
	tid := str(t, tc.ok(map[string]any{"cmd": "PUSH", "queue": "guarded", "data": 1}), "id")
	d.waitFor(2*time.Second, "a job in the page of a server with tokens", func() (bool, error) {
		el, err := d.find(fmt.Sprintf(`#feed li[data-job-id="%s"]`, tid))
		return el != "", err
	})
	if errs := d.script(`return (window.__errors || []).join('\n')`); errs != "" {
		t.Errorf("the page reported errors:\n%s", errs)
	}
}
