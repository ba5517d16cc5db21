package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// handlersSeen is a broker's HandlerList as "queue key" lines, key the
// handler's X-Key header.
func handlersSeen(t *testing.T, c *tclient) string {
	t.Helper()
	var out []string
	for _, h := range c.ok(M{"cmd": "HandlerList"})["handlers"].([]any) {
		m := h.(map[string]any)
		key := ""
		if hd, ok := m["handler"].(map[string]any)["headers"].(map[string]any); ok {
			key = fmt.Sprint(hd["X-Key"])
		}
		out = append(out, fmt.Sprint(m["queue"], " ", key))
	}
	return strings.Join(out, ",")
}

// waitHandlers waits until the broker lists want.
func waitHandlers(t *testing.T, c *tclient, want, who string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := handlersSeen(t, c)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s lists handlers %q, want %q", who, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPGHandlersShared: in PostgreSQL mode a URL handler is the
// namespace's. Registered through broker A, broker B runs it (A stopped,
// B's push is worked with A's headers); it survives A's restart; changed
// through B, A calls with the change; removed through B, A stops it.
// Before, a handler lived in the memory of the broker that registered it.
func TestPGHandlersShared(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	calls := make(chan string, 16)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		calls <- r.Header.Get("X-Key") + " " + string(b)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"worked":true}`)
	}))
	defer receiver.Close()
	args := []string{"--postgres-url", testPGURL(), "--postgres-namespace", ns, "--webhook-allow-private"}
	a, b := startBinary(t, args...), startBinary(t, args...)
	defer b.stop(t)
	ca, cb := dial(t, a.addr()), dial(t, b.addr())
	ca.ok(M{"cmd": "HandlerSet", "queue": "hq", "url": receiver.URL, "method": "PUT", "headers": M{"X-Key": "k1"}, "timeoutMs": 5000})
	waitHandlers(t, cb, "hq k1", "broker B")
	ca.close()
	a.stop(t)

	work := func(c *tclient, n int, want string) {
		t.Helper()
		id := c.ok(M{"cmd": "PUSH", "queue": "hq", "data": M{"n": n}})["id"].(string)
		if got := c.ok(M{"cmd": "WaitJob", "id": id, "timeout": 20000}); got["completed"] != true {
			t.Fatalf("job %d was not completed by the handler: %v", n, got)
		}
		select {
		case got := <-calls:
			if got != want {
				t.Errorf("call %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the receiver was not called")
		}
	}
	work(cb, 1, `k1 {"n":1}`)

	a = startBinary(t, args...)
	defer a.stop(t)
	ca = dial(t, a.addr())
	if got := handlersSeen(t, ca); got != "hq k1" {
		t.Fatalf("after a restart broker A lists %q", got)
	}
	cb.ok(M{"cmd": "HandlerSet", "queue": "hq", "url": receiver.URL, "method": "PUT", "headers": M{"X-Key": "k2"}, "timeoutMs": 5000})
	waitHandlers(t, ca, "hq k2", "broker A")
	work(ca, 2, `k2 {"n":2}`)

	if got := cb.ok(M{"cmd": "HandlerRemove", "queue": "hq"}); got["removed"] != true {
		t.Fatalf("remove: %v", got)
	}
	waitHandlers(t, ca, "", "broker A")
	if got := ca.ok(M{"cmd": "HandlerRemove", "queue": "hq"}); got["removed"] != false {
		t.Errorf("a second remove: %v", got)
	}
}

// TestPGHandlerLimit: the namespace holds at most maxHandlers, counted in
// the table: two brokers registering at once, 60 handlers each, store
// 100 between them, and each refusal names the limit. A full namespace
// still takes a change to a handler it has.
func TestPGHandlerLimit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := pgTestNamespace(t)
	p, _ := openTestPG(t, ctx, ns, pgOptions{})
	other, _ := openTestPG(t, ctx, ns, pgOptions{})
	var refused atomic.Int32
	var wg sync.WaitGroup
	for b, broker := range []*PG{p, other} {
		wg.Go(func() {
			for i := range 60 {
				err := broker.SaveHandler(&HandlerSpec{Queue: fmt.Sprint("q", b, "-", i), URL: "http://example.com/", Method: "POST"})
				switch {
				case err != nil && strings.Contains(err.Error(), fmt.Sprint("at most ", maxHandlers)):
					refused.Add(1)
				case err != nil:
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if n := refused.Load(); n != 120-maxHandlers {
		t.Fatalf("%d of 120 registrations refused, want %d", n, 120-maxHandlers)
	}
	list, err := p.LoadHandlers(ctx)
	if err != nil || len(list) != maxHandlers {
		t.Fatalf("%d handlers stored (%v)", len(list), err)
	}
	q := list[7].Queue
	if err := p.SaveHandler(&HandlerSpec{Queue: q, URL: "http://example.com/other", Method: "PUT"}); err != nil {
		t.Fatalf("changing a handler of a full namespace: %v", err)
	}
	list, err = p.LoadHandlers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != maxHandlers || list[len(list)-1].Queue != q || list[len(list)-1].Method != "PUT" {
		t.Errorf("%d handlers, the last %+v: a handler set again goes last", len(list), list[len(list)-1])
	}
	if gone, err := other.DeleteHandler(q); err != nil || !gone {
		t.Errorf("delete: %v %v", gone, err)
	}
	if gone, err := p.DeleteHandler(q); err != nil || gone {
		t.Errorf("delete again: %v %v", gone, err)
	}
}
