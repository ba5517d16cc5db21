package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// hookReq is one request a test receiver got.
type hookReq struct {
	method, event, ts, sig, ctype string
	body                          []byte
	at                            time.Time
}

// receiver is a webhook endpoint that records what it gets and answers
// with status.
func receiver(t *testing.T, status int) (*httptest.Server, chan hookReq) {
	t.Helper()
	ch := make(chan hookReq, 256)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ch <- hookReq{method: r.Method, event: r.Header.Get("X-Webhook-Event"), ts: r.Header.Get("X-Webhook-Timestamp"),
			sig: r.Header.Get("X-Webhook-Signature"), ctype: r.Header.Get("Content-Type"), body: body, at: time.Now()}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv, ch
}

// collect waits for n requests.
func collect(t *testing.T, ch chan hookReq, n int, within time.Duration) []hookReq {
	t.Helper()
	var out []hookReq
	deadline := time.After(within)
	for len(out) < n {
		select {
		case r := <-ch:
			out = append(out, r)
		case <-deadline:
			t.Fatalf("got %d webhook requests within %v, want %d", len(out), within, n)
		}
	}
	return out
}

// quiet checks that no request arrives for a while.
func quiet(t *testing.T, ch chan hookReq, d time.Duration) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("unexpected webhook request: %s %s", r.event, r.body)
	case <-time.After(d):
	}
}

func jsonBody(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return m
}

func hmacHex(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

func webhookList(t *testing.T, c *tclient) []map[string]any {
	t.Helper()
	d := sub(t, c.ok(M{"cmd": "ListWebhooks"}), "data")
	var out []map[string]any
	for _, w := range list(t, d, "webhooks") {
		out = append(out, w.(map[string]any))
	}
	return out
}

// Every event type reaches a receiver, signed when a secret is set, with
// the reference's headers and bodies.
func TestProtoWebhookDelivery(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{webhookAllowPrivate: true})
	c := dial(t, ts.addr)
	recv, got := receiver(t, 200)
	plainRecv, plainGot := receiver(t, 204)
	const secret = "s3cr3t"

	a := sub(t, c.ok(M{"cmd": "AddWebhook", "url": recv.URL + "/hook", "secret": secret, "queue": "wh",
		"events": []any{"job.pushed", "job.started", "job.completed", "job.failed", "job.progress"}}), "data")
	id := str(t, a, "webhookId")
	if len(id) != 36 || a["url"] != recv.URL+"/hook" || a["queue"] != "wh" || !isNum(a["createdAt"]) ||
		!reflect.DeepEqual(a["events"], []any{"job.pushed", "job.started", "job.completed", "job.failed", "job.progress"}) {
		t.Fatalf("AddWebhook answer: %v", a)
	}
	if _, ok := a["secret"]; ok || len(a) != 5 {
		t.Fatalf("AddWebhook answer has other keys: %v", a)
	}
	// No secret, every queue, completions only.
	plain := sub(t, c.ok(M{"cmd": "AddWebhook", "url": plainRecv.URL, "events": []any{"job.completed"}}), "data")
	if plain["queue"] != nil {
		t.Fatalf("queue of a webhook for every queue: %v", plain["queue"])
	}

	jobID := c.ok(M{"cmd": "PUSH", "queue": "wh", "data": M{"x": 1}})["id"]
	c.ok(M{"cmd": "PULL", "queue": "wh"})
	c.ok(M{"cmd": "Progress", "id": jobID, "progress": 50, "message": "half"})
	c.ok(M{"cmd": "ACK", "id": jobID, "result": M{"ok": true}})
	failID := c.ok(M{"cmd": "PUSH", "queue": "wh", "data": "d", "maxAttempts": 1})["id"]
	c.ok(M{"cmd": "PULL", "queue": "wh"})
	c.ok(M{"cmd": "FAIL", "id": failID, "error": "boom"})
	// Another queue: only the every-queue webhook hears of it.
	otherID := c.ok(M{"cmd": "PUSH", "queue": "other", "data": 2})["id"]
	c.ok(M{"cmd": "PULL", "queue": "other"})
	c.ok(M{"cmd": "ACK", "id": otherID})

	// pushed, started, progress, completed for the first job; pushed,
	// started, failed for the second. Senders run in parallel: any order.
	reqs := collect(t, got, 7, 10*time.Second)
	byEvent := map[string][]map[string]any{}
	for _, r := range reqs {
		if r.method != "POST" || r.ctype != "application/json" {
			t.Errorf("%s %s, content type %q", r.method, r.event, r.ctype)
		}
		if want := hmacHex(secret, r.body); !hmac.Equal([]byte(r.sig), []byte(want)) {
			t.Errorf("%s: signature %q, want %q (HMAC-SHA256 of the body)", r.event, r.sig, want)
		}
		b := jsonBody(t, r.body)
		if b["event"] != r.event {
			t.Errorf("header event %q, body event %v", r.event, b["event"])
		}
		if ts, _ := b["timestamp"].(float64); r.ts == "" || r.ts != strconv.FormatInt(int64(ts), 10) {
			t.Errorf("%s: header timestamp %q, body %v", r.event, r.ts, b["timestamp"])
		}
		if b["queue"] != "wh" {
			t.Errorf("%s: queue %v", r.event, b["queue"])
		}
		byEvent[r.event] = append(byEvent[r.event], b)
	}
	if len(byEvent["job.pushed"]) != 2 || len(byEvent["job.started"]) != 2 || len(byEvent["job.progress"]) != 1 ||
		len(byEvent["job.completed"]) != 1 || len(byEvent["job.failed"]) != 1 {
		t.Fatalf("events: %v", byEvent)
	}
	for _, b := range append(byEvent["job.pushed"], byEvent["job.started"]...) {
		if len(b) != 4 {
			t.Errorf("%v carries more than event, timestamp, jobId, queue", b)
		}
	}
	if b := byEvent["job.completed"][0]; b["jobId"] != jobID || !reflect.DeepEqual(b["data"], map[string]any{"ok": true}) {
		t.Errorf("completed: %v", b)
	}
	if b := byEvent["job.progress"][0]; b["jobId"] != jobID || b["progress"] != 50.0 || len(b) != 5 {
		t.Errorf("progress: %v", b)
	}
	if b := byEvent["job.failed"][0]; b["jobId"] != failID || b["data"] != "d" || b["error"] != "boom" || len(b) != 6 {
		t.Errorf("failed: %v", b)
	}
	// The unsigned every-queue webhook got both completions.
	preqs := collect(t, plainGot, 2, 10*time.Second)
	seen := map[any]bool{}
	for _, r := range preqs {
		if r.sig != "" || r.event != "job.completed" {
			t.Errorf("plain webhook: event %q signature %q", r.event, r.sig)
		}
		b := jsonBody(t, r.body)
		seen[b["jobId"]] = true
		if _, has := b["data"]; b["jobId"] == otherID && has {
			t.Errorf("a completion without a result carries data: %v", b)
		}
	}
	if !seen[jobID] || !seen[otherID] {
		t.Errorf("plain webhook saw %v", seen)
	}
	// The figures.
	eventually(t, 5*time.Second, "success counts", func() (bool, string) {
		l := webhookList(t, c)
		return len(l) == 2 && num(t, l[0]["successCount"]) == 7 && num(t, l[1]["successCount"]) == 2, ""
	})
	l := webhookList(t, c)
	w := l[0]
	if w["id"] != id || w["enabled"] != true || num(t, w["failureCount"]) != 0 || !isNum(w["lastTriggered"]) || len(w) != 12 {
		t.Errorf("ListWebhooks entry: %v", w)
	}
	// The reference's nine fields, then the circuit, the deliveries
	// waiting and those dropped.
	for _, k := range []string{"id", "url", "events", "queue", "createdAt", "lastTriggered", "successCount", "failureCount", "enabled"} {
		if _, ok := w[k]; !ok {
			t.Errorf("ListWebhooks entry without %s: %v", k, w)
		}
	}
	if w["circuit"] != "closed" || num(t, w["pending"]) != 0 || num(t, w["droppedCount"]) != 0 {
		t.Errorf("ListWebhooks delivery state: %v", w)
	}
	stats := sub(t, sub(t, c.ok(M{"cmd": "ListWebhooks"}), "data"), "stats")
	if num(t, stats["total"]) != 2 || num(t, stats["enabled"]) != 2 {
		t.Errorf("stats: %v", stats)
	}
}

// A disabled webhook is not called; enabling it again resumes delivery;
// removing it ends it.
func TestProtoWebhookEnableRemove(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{webhookAllowPrivate: true})
	c := dial(t, ts.addr)
	offRecv, offGot := receiver(t, 200)
	ctlRecv, ctlGot := receiver(t, 200)
	off := str(t, sub(t, c.ok(M{"cmd": "AddWebhook", "url": offRecv.URL, "events": []any{"job.pushed"}}), "data"), "webhookId")
	c.ok(M{"cmd": "AddWebhook", "url": ctlRecv.URL, "events": []any{"job.pushed"}})

	a := c.ok(M{"cmd": "SetWebhookEnabled", "id": off, "enabled": false})
	wantUndefined(t, "SetWebhookEnabled id", a["id"])
	if got := c.fail(M{"cmd": "SetWebhookEnabled", "id": "nope", "enabled": true}); got != "Webhook not found" {
		t.Fatalf("unknown id: %q", got)
	}
	c.ok(M{"cmd": "PUSH", "queue": "q", "data": 1})
	collect(t, ctlGot, 1, 5*time.Second) // the enabled one was called...
	quiet(t, offGot, 300*time.Millisecond)
	l := webhookList(t, c)
	if l[0]["enabled"] != false || num(t, l[0]["successCount"]) != 0 {
		t.Fatalf("disabled webhook: %v", l[0])
	}
	if st := sub(t, sub(t, c.ok(M{"cmd": "ListWebhooks"}), "data"), "stats"); num(t, st["enabled"]) != 1 {
		t.Fatalf("stats: %v", st)
	}

	c.ok(M{"cmd": "SetWebhookEnabled", "id": off, "enabled": true})
	c.ok(M{"cmd": "PUSH", "queue": "q", "data": 2})
	collect(t, offGot, 1, 5*time.Second)
	collect(t, ctlGot, 1, 5*time.Second)

	if got := c.fail(M{"cmd": "RemoveWebhook", "webhookId": "nope"}); got != "Webhook not found" {
		t.Fatalf("remove unknown: %q", got)
	}
	if d := sub(t, c.ok(M{"cmd": "RemoveWebhook", "webhookId": off}), "data"); d["removed"] != true {
		t.Fatalf("remove: %v", d)
	}
	c.ok(M{"cmd": "PUSH", "queue": "q", "data": 3})
	collect(t, ctlGot, 1, 5*time.Second)
	quiet(t, offGot, 300*time.Millisecond)
	if l := webhookList(t, c); len(l) != 1 {
		t.Fatalf("after remove: %v", l)
	}
	if got := c.fail(M{"cmd": "SetWebhookEnabled", "id": off, "enabled": true}); got != "Webhook not found" {
		t.Fatalf("enable removed: %q", got)
	}
}

// A receiver that answers 500 gets three attempts, 1 s then 2 s apart,
// and the webhook's failure is counted once.
func TestProtoWebhookRetries(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{webhookAllowPrivate: true})
	c := dial(t, ts.addr)
	recv, got := receiver(t, 500)
	c.ok(M{"cmd": "AddWebhook", "url": recv.URL, "events": []any{"job.pushed"}, "secret": "k"})
	c.ok(M{"cmd": "PUSH", "queue": "r", "data": 1})
	reqs := collect(t, got, 3, 10*time.Second)
	for _, r := range reqs[1:] {
		if string(r.body) != string(reqs[0].body) || r.sig != reqs[0].sig || r.ts != reqs[0].ts {
			t.Errorf("a retry is not the same request: %s vs %s", r.body, reqs[0].body)
		}
	}
	g1, g2 := reqs[1].at.Sub(reqs[0].at), reqs[2].at.Sub(reqs[1].at)
	if g1 < 900*time.Millisecond || g1 > 1900*time.Millisecond || g2 < 1900*time.Millisecond || g2 > 2900*time.Millisecond {
		t.Errorf("gaps between attempts %v, %v; want about 1 s then 2 s", g1, g2)
	}
	eventually(t, 10*time.Second, "failure counted", func() (bool, string) {
		w := webhookList(t, c)[0]
		return num(t, w["failureCount"]) == 1, ""
	})
	w := webhookList(t, c)[0]
	if num(t, w["successCount"]) != 0 || w["lastTriggered"] != nil {
		t.Errorf("after failing: %v", w)
	}
	quiet(t, got, 500*time.Millisecond) // no fourth attempt
}

// Without --webhook-allow-private, inside addresses are refused when the
// webhook is added, with the reference's messages.
func TestProtoWebhookRefusals(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	ev := []any{"job.completed"}
	for _, tc := range []struct {
		url  any
		want string
	}{
		{nil, "Webhook URL is required"},
		{"", "Webhook URL is required"},
		{"https://example.com/" + strings.Repeat("a", 2030), "Webhook URL too long (max 2048 characters)"},
		{"not a url", "Invalid URL format"},
		{"ftp://example.com/", "Webhook URL must use http or https protocol"},
		{"http://localhost:8080/", "Webhook URL cannot point to localhost"},
		{"http://api.localhost/", "Webhook URL cannot point to localhost"},
		{"http://127.0.0.1/", "Webhook URL cannot point to localhost"},
		{"http://127.1/", "Webhook URL cannot point to localhost"},
		{"http://2130706433/", "Webhook URL cannot point to localhost"},
		{"http://[::1]/", "Webhook URL cannot point to localhost"},
		{"http://127.0.0.2/", "Webhook URL cannot point to loopback IP"},
		{"http://[::ffff:127.0.0.1]/", "Webhook URL cannot point to loopback IP"},
		{"http://10.0.0.1/", "Webhook URL cannot point to private IP"},
		{"http://192.168.1.10/", "Webhook URL cannot point to private IP"},
		{"http://169.254.169.254/latest/meta-data/", "Webhook URL cannot point to link-local IP"},
		{"http://metadata.google.internal/", "Webhook URL cannot point to cloud metadata endpoints"},
		{"http://[fd12::1]/", "Webhook URL cannot point to private (ULA) IP"},
	} {
		got := c.fail(M{"cmd": "AddWebhook", "url": tc.url, "events": ev})
		if got != tc.want {
			t.Errorf("%v: %q, want %q", tc.url, got, tc.want)
		}
	}
	// Events are checked after the URL.
	got := c.fail(M{"cmd": "AddWebhook", "url": "https://hooks.example.com/x", "events": []any{"job.pushed", "nope", 5}})
	if want := "Invalid webhook event(s): nope, 5. Valid: job.pushed, job.started, job.completed, job.failed, job.progress"; got != want {
		t.Errorf("events: %q", got)
	}
	if got := c.fail(M{"cmd": "AddWebhook", "url": "http://10.0.0.1/", "events": []any{"nope"}}); got != "Webhook URL cannot point to private IP" {
		t.Errorf("URL before events: %q", got)
	}
	// A public URL with no events is accepted, as the reference accepts it.
	d := sub(t, c.ok(M{"cmd": "AddWebhook", "url": "https://hooks.example.com/x", "events": []any{}}), "data")
	if ev, ok := d["events"].([]any); !ok || len(ev) != 0 {
		t.Errorf("events: %v", d["events"])
	}
	if l := webhookList(t, c); len(l) != 1 {
		t.Errorf("refused webhooks were registered: %v", l)
	}
}

func TestWebhookURLCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, want string }{
		{"http://LOCALHOST/", "localhost"},
		{"http://localhost./", "localhost"},
		{"http://0x7f000001/", "localhost"},
		{"http://0x7f.1/", "localhost"},
		{"http://0177.0.0.1/", "localhost"},
		{"http://127.0.0.1./", "localhost"},
		{"http://127.0.1/", "localhost"},
		{"http://127.0.2/", "loopback IP"},
		{"http://017700000002/", "loopback IP"},
		{"http://[::ffff:7f00:1]/", "loopback IP"},
		{"http://[::127.0.0.1]/", "loopback IP"},
		{"http://[::ffff:10.1.2.3]:8080/", "private IP"},
		{"http://[::]/", "unspecified IP"},
		{"http://0.0.0.0/", "unspecified IP"},
		{"http://0/", "unspecified IP"},
		{"http://[fe80::1]/", "link-local IP"},
		{"http://[febf::1]/", "link-local IP"},
		{"http://[fc00::1]/", "private (ULA) IP"},
		{"http://172.16.0.1/", "private IP"},
		{"http://172.31.255.255/", "private IP"},
		{"http://10.1/", "private IP"},
		{"http://user:pw@192.168.0.1:9000/x", "private IP"},
		{"http://169.254.1.1/", "link-local IP"},
		{"http://foo.internal/", "cloud metadata endpoints"},
		{"http://100.64.0.1/", "shared (CGNAT) address"},
		{"http://198.18.0.1/", "benchmarking address"},
	} {
		err := checkWebhookURL(tc.url, false)
		if err == nil || err.Error() != "Webhook URL cannot point to "+tc.want {
			t.Errorf("%s: %v, want ... %s", tc.url, err, tc.want)
		}
		// The operator's flag lets them all through.
		if err := checkWebhookURL(tc.url, true); err != nil {
			t.Errorf("%s with private allowed: %v", tc.url, err)
		}
	}
	for _, u := range []string{"http://172.32.0.1/", "http://100.128.0.1/", "http://198.20.0.1/", "https://example.com:8443/a?b=c",
		"http://[2606:4700::1111]/", "http://1.2.3.4/", "http://8.8.8.8.example.com/", "http://0x1.example/"} {
		if err := checkWebhookURL(u, false); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	// Hosts that end in a number but are no IPv4 address make the URL
	// invalid, as WHATWG's parser says; so do a port out of range, a zone,
	// and a URL without a host.
	for _, u := range []string{"http://1.2.3.256/", "http://1.2.3.4.5/", "http://08/", "http://0x100000000/",
		"http://256.1.1.1/", "http://example.com:99999/", "http://[fe80::1%25eth0]/", "http://", "http:example.com",
		"http://%31%32%37.0.0.1/", "//example.com/"} {
		if err := checkWebhookURL(u, false); err == nil || err.Error() != "Invalid URL format" {
			t.Errorf("%s: %v, want Invalid URL format", u, err)
		}
	}
}

// The connection-time check, called as the dialer calls it.
func TestWebhookDialGuard(t *testing.T) {
	t.Parallel()
	for addr, why := range map[string]string{
		"127.0.0.1:80":                "loopback",
		"127.9.9.9:80":                "loopback",
		"[::1]:443":                   "loopback",
		"[::ffff:127.0.0.1]:80":       "loopback",
		"[::7f00:1]:80":               "loopback",
		"10.0.0.1:80":                 "private",
		"172.20.1.1:80":               "private",
		"192.168.0.1:80":              "private",
		"[fd00::1]:80":                "private (ULA)",
		"169.254.1.1:80":              "link-local",
		"[fe80::1%eth0]:80":           "link-local",
		"0.0.0.0:80":                  "unspecified",
		"[::]:80":                     "unspecified",
		"0.1.2.3:80":                  "unspecified",
		"169.254.169.254:80":          "cloud metadata",
		"[::ffff:169.254.169.254]:80": "cloud metadata",
		"100.100.100.200:80":          "cloud metadata",
		"[fd00:ec2::254]:80":          "cloud metadata",
		"100.64.0.1:80":               "shared (CGNAT)",
	} {
		err := guardDial("tcp", addr, nil)
		if !errors.Is(err, errBlockedAddr) || !strings.Contains(err.Error(), "is a "+why+" address") {
			t.Errorf("%s: %v, want a refusal as %s", addr, err, why)
		}
	}
	for _, addr := range []string{"93.184.216.34:443", "[2606:4700::1111]:443", "100.128.0.1:80", "172.32.0.1:80"} {
		if err := guardDial("tcp", addr, nil); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
}

// A name that resolves to an inside address at delivery time (DNS
// rebinding) passes the registration check, and is refused when the
// connection is made; with private addresses allowed it is delivered.
func TestWebhookRebindingRefusedAtDial(t *testing.T) {
	t.Parallel()
	recv, got := receiver(t, 200)
	port := recv.Listener.Addr().(*net.TCPAddr).Port
	rebinding := func(ctx context.Context, host string) ([]netip.Addr, error) {
		if host == "hooks.rebind.test" {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	hookURL := "http://hooks.rebind.test:" + itoa(int64(port)) + "/in"
	if err := checkWebhookURL(hookURL, false); err != nil {
		t.Fatalf("the name looks public: %v", err)
	}

	for _, allow := range []bool{false, true} {
		ls := newLocalServer(t)
		h, err := newWebhooks(ls.b.Broker, webhookOptions{allowPrivate: allow, lookup: rebinding, retryDelay: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		ls.srv.hooks = h

		// The dial path itself: resolved through the given resolver, and
		// refused (or not) on the resolved address.
		conn, err := h.dialContext(context.Background(), "tcp", "hooks.rebind.test:"+itoa(int64(port)))
		if allow {
			if err != nil {
				t.Fatalf("allowed dial: %v", err)
			}
			conn.Close()
		} else if !errors.Is(err, errBlockedAddr) {
			t.Fatalf("dial to a name resolving to 127.0.0.1: %v, want a refusal", err)
		}

		ls.ok(M{"cmd": "AddWebhook", "url": hookURL, "events": []any{"job.pushed"}})
		ls.ok(M{"cmd": "PUSH", "queue": "q", "data": 1})
		if allow {
			r := collect(t, got, 1, 5*time.Second)[0]
			if b := jsonBody(t, r.body); b["event"] != "job.pushed" {
				t.Fatalf("delivered: %v", b)
			}
		} else {
			eventually(t, 5*time.Second, "failure after three refused attempts", func() (bool, string) {
				h.mu.Lock()
				defer h.mu.Unlock()
				return h.list[0].failure == 1, ""
			})
			quiet(t, got, 100*time.Millisecond)
		}
	}
	// Literal addresses go through the same check.
	ls := newLocalServer(t)
	h, err := newWebhooks(ls.b.Broker, webhookOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.dialContext(context.Background(), "tcp", recv.Listener.Addr().String()); !errors.Is(err, errBlockedAddr) {
		t.Fatalf("dial to %s: %v", recv.Listener.Addr(), err)
	}
	// And so does a request through the client, whatever the URL says.
	u, _ := url.Parse(recv.URL)
	if err := h.post(u.String(), "job.pushed", 1, []byte("{}"), ""); !errors.Is(err, errBlockedAddr) {
		t.Fatalf("post to %s: %v", u, err)
	}
	quiet(t, got, 50*time.Millisecond)
}

// A full delivery queue drops deliveries and counts them; the command
// that emitted the events is not held up.
func TestWebhookQueueFullDrops(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var hits atomic.Int64
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		<-release
	}))
	defer slow.Close()
	defer close(release)
	ls := newLocalServer(t)
	h, err := newWebhooks(ls.b.Broker, webhookOptions{allowPrivate: true, queueLen: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ls.srv.hooks = h
	ls.ok(M{"cmd": "AddWebhook", "url": slow.URL, "events": []any{"job.pushed"}})
	start := time.Now()
	for i := 0; i < 50; i++ {
		ls.ok(M{"cmd": "PUSH", "queue": "q", "data": i})
	}
	// Held up by the stuck receiver they would wait until the test ends;
	// the bound is far above what they take, for a busy machine.
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("50 pushes took %v with a stuck receiver", d)
	}
	// At most the senders plus the queue's two slots hold deliveries.
	if n := h.dropped.Load(); n < 50-webhookSenders-2 {
		t.Errorf("dropped %d, want at least %d", n, 50-webhookSenders-2)
	}
}

// Webhooks survive a restart on SQLite: definitions, order, secret and
// enabled state; removal too.
func TestSQLiteWebhooksPersist(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "hooks.db")
	tcp, _, stop := startSQLiteServer(t, path, "")
	c := dial(t, tcp)
	a := sub(t, c.ok(M{"cmd": "AddWebhook", "url": "https://a.example.com/h", "events": []any{"job.completed", "job.failed"},
		"queue": "emails", "secret": "sec"}), "data")
	b := sub(t, c.ok(M{"cmd": "AddWebhook", "url": "https://b.example.com/h", "events": []any{}}), "data")
	d := sub(t, c.ok(M{"cmd": "AddWebhook", "url": "https://c.example.com/h", "events": []any{"job.pushed"}}), "data")
	c.ok(M{"cmd": "SetWebhookEnabled", "id": b["webhookId"], "enabled": false})
	before := webhookList(t, c)
	c.close()
	stop()

	tcp, _, stop = startSQLiteServer(t, path, "")
	c = dial(t, tcp)
	after := webhookList(t, c)
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("after a restart:\n%v\nwant\n%v", after, before)
	}
	if after[0]["id"] != a["webhookId"] || after[1]["enabled"] != false || after[2]["id"] != d["webhookId"] {
		t.Fatalf("order or state: %v", after)
	}
	c.ok(M{"cmd": "RemoveWebhook", "webhookId": a["webhookId"]})
	c.close()
	stop()

	st, err := OpenSQLite(path, "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	stored, err := st.LoadWebhooks()
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 2 || stored[0].ID != b["webhookId"] || stored[0].Enabled || stored[1].ID != d["webhookId"] ||
		stored[1].Secret != "" || stored[1].Queue != "" || !reflect.DeepEqual(stored[1].Events, []string{"job.pushed"}) {
		t.Fatalf("stored after removal: %+v %+v", stored[0], stored[1])
	}
}

// The secret is kept on disk: a reloaded webhook still signs.
func TestSQLiteWebhookSecretReloaded(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sec.db")
	st, err := OpenSQLite(path, "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	w := &Webhook{ID: newID(), URL: "https://x.example/h", Events: []string{"job.pushed"}, Queue: "q", Secret: "k",
		CreatedAt: 42, Enabled: true}
	if err := st.SaveWebhook(w); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st, err = OpenSQLite(path, "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := st.LoadWebhooks()
	if err != nil || len(got) != 1 {
		t.Fatalf("%v %v", got, err)
	}
	if g := got[0]; g.ID != w.ID || g.URL != w.URL || g.Secret != "k" || g.Queue != "q" || g.CreatedAt != 42 || !g.Enabled {
		t.Fatalf("reloaded %+v", g)
	}
}

// The flag, and the environment variable behind it; the command line wins.
//
// Serial: it sets environment variables (t.Setenv).
func TestWebhookAllowPrivateFlag(t *testing.T) {
	parse := func(args ...string) bool {
		fs, c := serverFlags(io.Discard)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return c.webhookAllowPrivate
	}
	if parse() {
		t.Fatal("on by default")
	}
	if !parse("--webhook-allow-private") {
		t.Fatal("flag ignored")
	}
	t.Setenv("QUEUED_WEBHOOK_ALLOW_PRIVATE", "true")
	if !parse() {
		t.Fatal("environment ignored")
	}
	if parse("--webhook-allow-private=false") {
		t.Fatal("the command line must win over the environment")
	}
	t.Setenv("QUEUED_WEBHOOK_ALLOW_PRIVATE", "0")
	if parse() {
		t.Fatal("0 read as on")
	}
}

// A database written before webhooks existed (schema version 1) gains the
// table on open and keeps its jobs.
func TestSQLiteWebhooksMigration(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "old.db")
	st, err := OpenSQLite(path, "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.db.Exec(`DROP INDEX jobs_retired_id; DROP INDEX jobs_retired_list; DROP INDEX jobs_retired_done;
		DROP INDEX jobs_retired_queue_done; ALTER TABLE jobs DROP COLUMN id; ALTER TABLE jobs DROP COLUMN queue;
		ALTER TABLE jobs DROP COLUMN created_at; ALTER TABLE jobs DROP COLUMN done_at;
		DROP TABLE webhooks; DROP TABLE crons; DROP TABLE handlers; DROP TABLE purges; UPDATE schema_version SET version = 1;
		INSERT INTO queues(name, settings) VALUES ('kept', x'80')`); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st, err = OpenSQLite(path, "normal", quietLog())
	if err != nil {
		t.Fatalf("open a version-1 database: %v", err)
	}
	defer st.Close()
	var v, queues int
	st.db.QueryRow(`SELECT version FROM schema_version`).Scan(&v)
	st.db.QueryRow(`SELECT count(*) FROM queues`).Scan(&queues)
	if v != len(migrations) || queues != 1 {
		t.Fatalf("schema version %d, queues %d", v, queues)
	}
	if err := st.SaveWebhook(&Webhook{ID: "w", URL: "https://x.example", Events: []string{}, Enabled: true}); err != nil {
		t.Fatal(err)
	}
}
