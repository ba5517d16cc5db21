package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// addWebhooks registers n webhooks to public URLs, pipelined, and returns
// their ids.
func addWebhooks(t *testing.T, c *tclient, from, n int) []string {
	t.Helper()
	var ids []string
	for done := 0; done < n; {
		k := min(100, n-done)
		var pending []struct {
			id string
			ch chan map[string]any
		}
		for i := 0; i < k; i++ {
			id, ch := c.send(M{"cmd": "AddWebhook", "url": fmt.Sprintf("https://hooks.example.com/h/%d", from+done+i),
				"events": []any{"job.completed"}})
			pending = append(pending, struct {
				id string
				ch chan map[string]any
			}{id, ch})
		}
		for _, p := range pending {
			a := c.await(p.id, p.ch, callTimeout)
			if a["ok"] != true {
				t.Fatalf("AddWebhook %d: %v", from+done, a)
			}
			ids = append(ids, str(t, sub(t, a, "data"), "webhookId"))
		}
		done += k
	}
	return ids
}

// checkWebhookLimits fills the registry to its limit and checks the
// refusal past it, and the byte limits of a webhook's fields.
func checkWebhookLimits(t *testing.T, c *tclient) {
	t.Helper()
	// Fields: each limit refused with its value, and met exactly accepted.
	url := "https://hooks.example.com/x"
	ev := []any{"job.completed"}
	for _, tc := range []struct {
		req  M
		want string
	}{
		{M{"secret": strings.Repeat("s", maxWebhookSecret+1)}, "the secret of a webhook is limited to 1 KiB (1024 bytes; got 1025)"},
		{M{"queue": strings.Repeat("q", maxQueueName+1)}, "the queue of a webhook is limited to 256 bytes (got 257)"},
		{M{"events": make([]any, maxWebhookEvents+1)}, "the events of a webhook are limited to 64 entries (got 65)"},
		{M{"url": "https://hooks.example.com/" + strings.Repeat("é", 3000)}, "Webhook URL too long (max 2048 characters)"},
		{M{"url": "https://hooks.example.com/" + strings.Repeat("a", 1<<20)}, "Webhook URL too long (max 2048 characters)"},
		{M{"events": []any{"job.pushed", strings.Repeat("x", 1<<20)}},
			"Invalid webhook event(s): " + strings.Repeat("x", maxWebhookEchoName) + ".... Valid: job.pushed, job.started, job.completed, job.failed, job.progress"},
	} {
		req := M{"cmd": "AddWebhook", "url": url, "events": ev}
		for k, v := range tc.req {
			req[k] = v
		}
		if got := c.fail(req); got != tc.want {
			t.Errorf("%.60v: %q, want %q", tc.req, got, tc.want)
		}
	}
	longest := c.ok(M{"cmd": "AddWebhook", "url": url, "events": make([]any, 0, maxWebhookEvents),
		"secret": strings.Repeat("s", maxWebhookSecret), "queue": strings.Repeat("q", maxQueueName)})
	first := str(t, sub(t, longest, "data"), "webhookId")

	// Count: up to the limit, not one more; room again after a removal.
	addWebhooks(t, c, 1, maxWebhooks-1)
	want := "webhooks are limited to 1000 per server; remove one before adding another"
	if got := c.fail(M{"cmd": "AddWebhook", "url": url, "events": ev}); got != want {
		t.Fatalf("webhook %d: %q, want %q", maxWebhooks+1, got, want)
	}
	if st := sub(t, sub(t, c.ok(M{"cmd": "ListWebhooks"}), "data"), "stats"); num(t, st["total"]) != maxWebhooks {
		t.Fatalf("stats: %v", st)
	}
	c.ok(M{"cmd": "RemoveWebhook", "webhookId": first})
	c.ok(M{"cmd": "AddWebhook", "url": url, "events": ev})
	if got := c.fail(M{"cmd": "AddWebhook", "url": url, "events": ev}); got != want {
		t.Fatalf("after remove and add: %q", got)
	}
}

// A client cannot register webhooks without end, nor with fields of any
// size, in memory mode.
func TestWebhookLimitsMemory(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	checkWebhookLimits(t, dial(t, ts.addr))
}

// The same limits on SQLite, where webhooks are stored; after a restart
// the full registry still refuses one more.
func TestWebhookLimitsSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "limits.db")
	tcp, _, stop := startSQLiteServer(t, path, "")
	c := dial(t, tcp)
	start := time.Now()
	checkWebhookLimits(t, c)
	t.Logf("filled the registry on SQLite in %v", time.Since(start))
	c.close()
	stop()
	tcp, _, stop = startSQLiteServer(t, path, "")
	defer stop()
	c = dial(t, tcp)
	defer c.close()
	if l := webhookList(t, c); len(l) != maxWebhooks {
		t.Fatalf("%d webhooks after a restart, want %d", len(l), maxWebhooks)
	}
	if got := c.fail(M{"cmd": "AddWebhook", "url": "https://hooks.example.com/y", "events": []any{}}); !strings.HasPrefix(got, "webhooks are limited to 1000") {
		t.Fatalf("after a restart: %q", got)
	}
}

// In PostgreSQL mode webhooks are each broker's own (kept in its memory,
// reached through the same handlers): the limits hold per broker.
func TestPGWebhookLimits(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	c := dial(t, startPGBroker(t, ns).addr())
	checkWebhookLimits(t, c)
}
