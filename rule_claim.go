package main

// Rules both engines follow when a pull takes a job: a job whose TTL ran
// out while it waited is dropped instead (ttlExpired), a pull with an
// owner holds its job under a lock of the TTL it asked for, 30 s when it
// asked for none (lockTTL, pullLease), and taking the job makes it
// active in hand (takeJob). The memory engine's claim, PostgreSQL's claim
// rounds, its one-trip claims (pg_take.go) and its hand-offs to sleeping
// pulls (pg_handoff.go) all go through them.

// ttlExpired says whether j's TTL ran out while it waited, at now.
func ttlExpired(j *Job, now int64) bool {
	t := j.cold().TTL
	return t != none && t > 0 && now > j.CreatedAt+t
}

// lockTTL is the lock, in ms, a pull with options o holds its jobs under.
func lockTTL(o PullOpts) int64 {
	if o.TTL > 0 {
		return o.TTL
	}
	return defaultLockTTL
}

// pullLease is the lease of token a pull with options o takes at now;
// nil for a pull with no owner.
func pullLease(o PullOpts, token string, now int64) *Lease {
	if o.Owner == "" {
		return nil
	}
	ttl := lockTTL(o)
	return &Lease{Token: token, Owner: o.Owner, CreatedAt: now, ExpiresAt: now + ttl, TTL: ttl}
}

// takeJob makes j active at now in hand, held under l (nil: no lease).
func takeJob(j *Job, now int64, l *Lease) {
	j.state = StateActive
	j.setStartedAt(now)
	j.setHeartbeat(now)
	j.addTimeline(TimelineEntry{State: StateActive, At: now})
	j.setLease(l)
}
