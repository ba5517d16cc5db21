package main

// Handlers of a queue's limits and stall policy: rate limit, concurrency
// limit, stall detection. The work is the engine's (PolicyEngine:
// limits.go, pg_limits.go, pg_dlq.go).

import "errors"

func cmdRateLimit(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	l, err := readRateLimit(r.m)
	if err != nil {
		return err
	}
	if err := r.eng.SetRateLimit(r.ctx(), name, l); err != nil {
		return err
	}
	r.b.announce(noticeQueue("ratelimit:set", name).num("max", l.Max).
		raw("duration", r.m.Get("duration")).raw("ttl", r.m.Get("ttl")))
	return r.okID()
}

// readRateLimit reads RateLimit's limit, duration and ttl. The duration
// and ttl are times, in PUSH's range for one: the ttl is added to now,
// and a sum past int64's end would wrap around to a limit already gone.
func readRateLimit(m Map) (RateLimit, error) {
	limit, ok, err := finiteArg(m, "limit")
	if err != nil || !ok {
		return RateLimit{}, errors.New("limit must be a finite number")
	}
	dur, _, err := numField(m, "duration", "duration", delayRule)
	if err != nil {
		return RateLimit{}, err
	}
	ttl, _, err := numField(m, "ttl", "ttl", delayRule)
	if err != nil {
		return RateLimit{}, err
	}
	return RateLimit{Max: limit, Duration: int64(dur), TTL: int64(ttl)}, nil
}

func cmdRateLimitClear(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	if err := r.eng.ClearRateLimit(r.ctx(), name); err != nil {
		return err
	}
	r.b.announce(noticeQueue("ratelimit:cleared", name))
	return r.okID()
}

func cmdSetConcurrency(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	limit, ok, err := finiteArg(r.m, "limit")
	if err != nil || !ok {
		return errors.New("limit must be a finite number")
	}
	if err := r.eng.SetConcurrency(r.ctx(), name, int64(limit)); err != nil {
		return err
	}
	r.b.announce(noticeQueue("concurrency:set", name).num("concurrency", limit))
	return r.okID()
}

func cmdClearConcurrency(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	if err := r.eng.ClearConcurrency(r.ctx(), name); err != nil {
		return err
	}
	r.b.announce(noticeQueue("concurrency:cleared", name))
	return r.okID()
}

func cmdGetQueueLimits(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	maxJobs, hasMax, err := r.m.Num("maxJobs")
	if err != nil {
		return err
	}
	l, err := r.eng.QueueLimits(r.ctx(), name)
	if err != nil {
		return err
	}
	writeQueueLimits(r, l, maxJobs, hasMax)
	return nil
}

// writeQueueLimits answers GetQueueLimits. maxJobs (when given) asks
// whether the bucket has room for that many: its ttl is then 0.
func writeQueueLimits(r *Req, l QueueLimits, maxJobs float64, hasMax bool) {
	e := r.field("data")
	e.MapHead(1)
	e.Str("limits")
	e.MapHead(4)
	e.Str("rateLimit")
	ttl := int64(-2)
	if rate := l.Rate; rate == nil {
		e.Nil()
	} else {
		e.MapHead(2)
		e.Str("max")
		e.Num(rate.max)
		e.Str("duration")
		e.Int(rate.duration)
		switch {
		case rate.expires != 0:
			ttl = max(0, rate.expires-l.At)
		case hasMax && float64(rate.consumed) < maxJobs:
			ttl = 0
		default:
			ttl = rate.waitMs(l.At)
		}
	}
	e.Str("rateLimitTtl")
	e.Int(ttl)
	e.Str("concurrencyLimit")
	if l.Concurrency == nil {
		e.Nil()
	} else {
		e.Int(*l.Concurrency)
	}
	e.Str("maxed")
	e.Bool(l.Maxed)
}

func cmdSetStallConfig(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	patch, ok, err := readStallPatch(r.m)
	if err != nil {
		return err
	}
	if ok {
		if err := r.eng.SetStallConfig(r.ctx(), name, patch); err != nil {
			return err
		}
	}
	r.b.announce(noticeStallConfig(name, patch, ok))
	return r.okID()
}

// readStallPatch reads SetStallConfig's config (ok: there is one).
// Settings that are not finite numbers are ignored, as the reference
// ignores them. The interval and grace period are times, added to a job's
// last heartbeat or start: one out of PUSH's range for a time is refused,
// naming it, rather than left to wrap around to a deadline in the past.
func readStallPatch(m Map) (p stallPatch, ok bool, err error) {
	cfg, ok, err := m.Map("config")
	if err != nil || !ok {
		return p, false, err
	}
	if p.enabled, p.hasEnabled, err = cfg.Bool("enabled"); err != nil {
		return p, false, &FieldError{Field: "config.enabled", Msg: "must be a boolean"}
	}
	for _, f := range []struct {
		key    string
		dst    **float64
		isTime bool
	}{{"stallInterval", &p.interval, true}, {"gracePeriod", &p.grace, true}, {"maxStalls", &p.maxStall, false}} {
		if v, ok, err := finiteArg(cfg, f.key); err == nil && ok {
			if f.isTime {
				if err := delayRule.check("config."+f.key, v); err != nil {
					return p, false, err
				}
			}
			*f.dst = &v
		}
	}
	return p, true, nil
}

func cmdGetStallConfig(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	c, err := r.eng.GetStallConfig(r.ctx(), name)
	if err != nil {
		return err
	}
	e := r.field("config")
	e.MapHead(4)
	e.Str("enabled")
	e.Bool(c.Enabled)
	e.Str("stallInterval")
	e.Int(c.StallInterval)
	e.Str("maxStalls")
	e.Int(int64(c.MaxStalls))
	e.Str("gracePeriod")
	e.Int(c.GracePeriod)
	return nil
}
