package main

// Handlers of the HTTP handlers' commands (queued's own, for its MCP
// tools): set, remove, list. Handlers belong to this broker (urlworker.go).

import (
	"encoding/json"
	"errors"
	"fmt"
)

// handlers answers the broker's handler registry.
func (r *Req) handlers() (*Handlers, error) {
	if r.c.srv.handlers == nil {
		return nil, errors.New("HTTP handlers are not available on this server")
	}
	return r.c.srv.handlers, nil
}

func cmdHandlerSet(r *Req) error {
	h, err := r.handlers()
	if err != nil {
		return err
	}
	var s HandlerSpec
	for _, f := range []struct {
		key string
		dst *string
	}{{"queue", &s.Queue}, {"url", &s.URL}, {"method", &s.Method}} {
		if *f.dst, _, err = r.m.Str(f.key); err != nil {
			return err
		}
	}
	if hdrs, ok, err := r.m.Map("headers"); err != nil {
		return errors.New("headers must be an object of strings")
	} else if ok {
		// The limits are checkHandler's, as for every other way in.
		for _, f := range hdrs.Fields {
			v, err := f.Val.Str()
			if err != nil {
				return fmt.Errorf("header %.64q must be a string", f.Key)
			}
			s.Headers = append(s.Headers, [2]string{string(f.Key), v})
		}
	}
	if body := r.m.Get("body"); !absent(body) {
		s.Body = json.RawMessage(rawJSON(body))
	}
	if s.TimeoutMs, _, err = r.m.Int("timeoutMs"); err != nil {
		return err
	}
	return h.Set(s)
}

func cmdHandlerRemove(r *Req) error {
	h, err := r.handlers()
	if err != nil {
		return err
	}
	queue, _, err := r.m.Str("queue")
	if err != nil {
		return err
	}
	removed, err := h.Remove(queue)
	if err != nil {
		return err
	}
	r.field("removed").Bool(removed)
	return nil
}

func cmdHandlerList(r *Req) error {
	h, err := r.handlers()
	if err != nil {
		return err
	}
	list := h.List()
	// Up to 100 handlers with their bodies and headers: megabytes, so the
	// answer reserves its room first, as every large answer does.
	var size int64
	for _, st := range list {
		size += st.spec.size()
	}
	if err := r.room(size); err != nil {
		return err
	}
	e := r.field("handlers")
	e.ArrayHead(len(list))
	for _, st := range list {
		m := e.BeginMap()
		m.Key("queue").Str(st.spec.Queue)
		hd := m.Key("handler").BeginMap()
		hd.Key("url").Str(st.spec.URL)
		hd.Key("method").Str(st.spec.Method)
		if len(st.spec.Headers) > 0 {
			hm := hd.Key("headers").BeginMap()
			for _, kv := range st.spec.Headers {
				hm.Key(kv[0]).Str(kv[1])
			}
			hm.End()
		}
		if st.spec.Body != nil {
			raw, err := jsonToMsgpack(st.spec.Body)
			if err != nil {
				return err
			}
			hd.Key("body").Raw(raw)
		}
		if st.spec.TimeoutMs > 0 {
			hd.Key("timeoutMs").Int(st.spec.TimeoutMs)
		}
		hd.End()
		m.Key("active").Bool(st.active)
		m.End()
	}
	return nil
}
