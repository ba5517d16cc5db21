package main

// Handlers of webhooks: add, remove, list, enable. Webhooks belong to
// this broker (webhook.go), the same in every storage mode.

import (
	"errors"
	"fmt"
	"strings"
)

func cmdAddWebhook(r *Req) error {
	h, err := r.webhooks()
	if err != nil {
		return err
	}
	rawURL := r.m.Get("url")
	if rawURL.IsNil() {
		return errors.New("Webhook URL is required")
	}
	target, err := rawURL.Str()
	if err != nil {
		return errors.New("Invalid URL format")
	}
	if err := checkWebhookURL(target, h.opts.allowPrivate); err != nil {
		return err
	}
	items, ok, err := r.m.Array("events")
	if err != nil || !ok {
		return errors.New("events must be an array of event names")
	}
	if len(items) > maxWebhookEvents {
		return fmt.Errorf("the events of a webhook are limited to %d entries (got %d)", maxWebhookEvents, len(items))
	}
	events := make([]string, len(items))
	var bad []string
	for i, it := range items {
		s, err := it.Str()
		if err != nil {
			v, _ := Decode(it)
			s = jsString(v)
		}
		events[i] = s
		if eventMask([]string{s}) == 0 || err != nil {
			if len(s) > maxWebhookEchoName {
				s = strings.ToValidUTF8(s[:maxWebhookEchoName], "") + "..."
			}
			bad = append(bad, s)
		}
	}
	if len(bad) > 0 {
		return errors.New("Invalid webhook event(s): " + strings.Join(bad, ", ") + ". Valid: " + strings.Join(webhookEvents[:], ", "))
	}
	queue, _, err := r.m.Str("queue")
	if err != nil {
		return err
	}
	if len(queue) > maxQueueName {
		// No queue has a longer name: such a webhook could never fire.
		return fmt.Errorf("the queue of a webhook is limited to %d bytes (got %d)", maxQueueName, len(queue))
	}
	secret, _, err := r.m.Str("secret")
	if err != nil {
		return err
	}
	if len(secret) > maxWebhookSecret {
		return fmt.Errorf("the secret of a webhook is limited to 1 KiB (%d bytes; got %d)", maxWebhookSecret, len(secret))
	}
	w := &Webhook{ID: newID(), URL: target, Events: events, Queue: queue, Secret: secret,
		CreatedAt: r.b.now(), Enabled: true, mask: eventMask(events)}
	if err := h.add(w); err != nil {
		return err
	}
	r.b.announce(newNote("webhook:added").str("id", w.ID).str("url", w.URL).strs("events", w.Events))
	e := r.field("data")
	e.MapHead(5)
	e.Str("webhookId")
	e.Str(w.ID)
	e.Str("url")
	e.Str(w.URL)
	e.Str("events")
	strArray(e, w.Events)
	e.Str("queue")
	optStr(e, w.Queue, w.Queue != "")
	e.Str("createdAt")
	e.Int(w.CreatedAt)
	return nil
}

func cmdRemoveWebhook(r *Req) error {
	h, err := r.webhooks()
	if err != nil {
		return err
	}
	id, _, err := r.m.Str("webhookId")
	if err != nil {
		return err
	}
	if err := h.remove(id); err != nil {
		return err
	}
	r.b.announce(newNote("webhook:removed").str("id", id))
	e := r.field("data")
	e.MapHead(1)
	e.Str("removed")
	e.Bool(true)
	return nil
}

func cmdListWebhooks(r *Req) error {
	h, err := r.webhooks()
	if err != nil {
		return err
	}
	list := h.snapshot()
	e := r.field("data")
	e.MapHead(2)
	e.Str("webhooks")
	e.ArrayHead(len(list))
	enabled := 0
	for _, w := range list {
		writeWebhook(e, w)
		if w.Enabled {
			enabled++
		}
	}
	e.Str("stats")
	e.MapHead(2)
	e.Str("total")
	e.Int(int64(len(list)))
	e.Str("enabled")
	e.Int(int64(enabled))
	return nil
}

func writeWebhook(e *Enc, w webhookView) {
	e.MapHead(12)
	e.Str("id")
	e.Str(w.ID)
	e.Str("url")
	e.Str(w.URL)
	e.Str("events")
	strArray(e, w.Events)
	e.Str("queue")
	optStr(e, w.Queue, w.Queue != "")
	e.Str("createdAt")
	e.Int(w.CreatedAt)
	e.Str("lastTriggered")
	if w.lastTriggered != 0 {
		e.Int(w.lastTriggered)
	} else {
		e.Nil()
	}
	e.Str("successCount")
	e.Int(w.success)
	e.Str("failureCount")
	e.Int(w.failure)
	e.Str("enabled")
	e.Bool(w.Enabled)
	// Beyond the reference's nine fields (its clients show only theirs):
	// the circuit, the deliveries waiting or in flight, and those dropped
	// for a full backlog.
	e.Str("circuit")
	e.Str(w.circuit.String())
	e.Str("pending")
	e.Int(int64(w.pending))
	e.Str("droppedCount")
	e.Int(w.dropped)
}

func cmdSetWebhookEnabled(r *Req) error {
	h, err := r.webhooks()
	if err != nil {
		return err
	}
	id, _, err := r.m.Key("id")
	if err != nil {
		return err
	}
	on := truthy(r.m, "enabled")
	changed, err := h.setEnabled(id, on)
	if err != nil {
		return err
	}
	if changed && on {
		r.b.announce(noticeWebhook("webhook:enabled", id))
	} else if changed {
		r.b.announce(noticeWebhook("webhook:disabled", id))
	}
	return r.okID()
}

func (r *Req) webhooks() (*Webhooks, error) {
	if h := r.c.srv.hooks; h != nil {
		return h, nil
	}
	return nil, errors.New("webhooks are not available on this server")
}
