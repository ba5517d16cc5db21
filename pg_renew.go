package main

// Renewals of a lease written moments ago, answered without a write. The
// official Worker sends a JobHeartbeat for every batch it pulls, as soon
// as it has it: at a steady 1,000 jobs/s that was an UPDATE and a commit
// for nearly every job, the costliest statement of all (a new version of
// the row, its index entries, a WAL flush), only to move a lease's end by
// the few milliseconds since the claim wrote it. When this broker wrote
// the lock itself (it holds the claim, pg_release.go) at most
// pgRenewSlack ago, and the renewal would move its end by no more than
// that, the renewal is answered from what the broker knows and counted on
// the claim: the next renewal that is written adds it to the job's count,
// and a release on disconnect treats the job as renewed, as it would
// after a write. What is given up: a lease may end up to pgRenewSlack
// (never more than a tenth of its TTL) sooner than the renewal would have
// made it, should no later renewal come; and, as the count is written
// with the next renewal, a lease that lapses first reports one renewal
// fewer. What this broker did to the job since its claim is known here (a
// written renewal, an ACK, a FAIL, a move); what another broker did in
// that second is not: a renewal through this one then answers the lock
// as it last knew it, as a reader of an older snapshot would.

// pgRenewSlack bounds, in ms, how far a renewal answered without a write
// may leave the lease's end from where the write would have put it.
const pgRenewSlack = 1000

// renewSlack is the slack allowed a lease of ttl ms.
func renewSlack(ttl int64) int64 { return min(pgRenewSlack, ttl/10) }

// renewFresh answers the renewals of rn that need no write at now (fresh:
// their ids; a lock lately finished through this broker is not renewed,
// and needs none either), and gives back the others, each with the
// renewals answered without a write since its lock's last write (extra),
// to be added by the write. From a write on, the lock's end is the
// write's: no renewal of it goes without one (even while the write is
// under way, which may shorten the lock).
func (p *PG) renewFresh(rn renewals, now int64) (rest renewals, extra []int32, fresh []string) {
	h := &p.holds
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, id := range rn.ids {
		tok, dur := rn.tokens[i], rn.durations[i]
		hd, ok := h.m[id]
		if !ok && tok != "" && (h.gone[id] == tok || h.goneOld[id] == tok) {
			continue // finished through this broker: no longer active
		}
		mine := ok && tok != "" && hd.token == tok
		if mine && hd.ttl > 0 {
			if dur <= 0 {
				dur = hd.ttl
			}
			slack := renewSlack(hd.ttl)
			if now-hd.leaseAt <= slack && abs64(now+dur-hd.expires) <= slack {
				hd.elided++
				h.m[id] = hd
				fresh = append(fresh, id)
				continue
			}
		}
		rest.ids = append(rest.ids, id)
		rest.tokens = append(rest.tokens, tok)
		rest.durations = append(rest.durations, rn.durations[i])
		var e int32
		if mine {
			e, hd.elided, hd.ttl = hd.elided, 0, 0
			h.m[id] = hd
		}
		extra = append(extra, e)
	}
	return rest, extra, fresh
}

// renewFailed undoes renewFresh's counts when the write of the others
// failed: the renewals answered without a write are not told as done,
// and the renewals the write was to add are kept for the next one.
func (p *PG) renewFailed(rest renewals, extra []int32, fresh []string) {
	h := &p.holds
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, id := range rest.ids {
		if hd, ok := h.m[id]; ok && extra[i] > 0 && hd.token == rest.tokens[i] {
			hd.elided += extra[i]
			h.m[id] = hd
		}
	}
	for _, id := range fresh {
		if hd, ok := h.m[id]; ok && hd.elided > 0 {
			hd.elided--
			h.m[id] = hd
		}
	}
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
