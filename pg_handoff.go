package main

// A push hands its jobs to the pulls waiting for them. Under a steady
// stream the workers mostly wait: a push committed, woke a pull, and the
// pull claimed the job in a transaction of its own (its queue's limits
// read, the row locked, its lease written, a commit), before the worker
// had it. Here a push of ready jobs to a queue on which pulls of this
// broker sleep writes the leases in its own transaction, after the
// insert, and the pulls get the jobs once it commits: one transaction a
// job less, and a claim's statements. The claim's rules hold in the
// statement (pgHandSQL): nothing is handed on a paused queue, a queue
// with limits or groups, or while an older job of the queue is ready
// (another broker's push, a job come due, a release), which keeps the
// claim order; then the pulls are woken to claim as before.
//
// Only a pull that sleeps, with an owner (a lease: the lease columns need
// no stall settings) and no group, is handed jobs, and only when the
// sleeping pulls can take every ready job of the push (the rest would
// have to be woken for anyway). A pull handed jobs is taken off the
// queue's waiters at once, so no wake-up goes to it, and takes what it is
// handed once the push's transaction has settled, whatever woke it
// meanwhile.

import (
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// pgHandSQL is pgClaimedSQL for jobs a push hands to pulls (pg_claim.go),
// answering the rows it made active: none when the queue may not hand
// them ($9: the push's time).
var pgHandSQL = pgClaimedSQL + `
		AND NOT EXISTS (SELECT 1 FROM {s}.queues q WHERE q.name = j.queue
			AND (q.paused OR q.grouped OR q.rate_max IS NOT NULL OR q.conc_limit IS NOT NULL))
		AND NOT EXISTS (SELECT 1 FROM {s}.jobs o WHERE o.queue = j.queue AND o.state = {queued}
			AND o.run_at <= $9 AND o.group_id IS NULL AND o.id <> ALL($1::text[]))
		RETURNING j.id`

// pgHand is what a push hands to the sleeping pulls of a queue: jobs[i]
// to pulls[of[i]], with the lease tokens[i] that expires at exps[i].
type pgHand struct {
	queue  string
	pulls  []*pgWaiter
	jobs   []*Job
	of     []int
	tokens []string
	ttls   []int64
	now    int64
	took   bool // the statement made the rows active
	done   bool // and its transaction committed
}

// reserveHand takes sleeping pulls of queue that can take all of jobs
// (ready jobs of one push, in claim order), and answers the hand, or nil
// when they cannot.
func (p *PG) reserveHand(queue string, jobs []*Job, now int64, clockOK func() bool) *pgHand {
	if len(jobs) == 0 || !p.sleepersOn(queue) || !clockOK() {
		return nil
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	list := p.waiters[queue]
	var pulls []*pgWaiter
	room := 0
	for _, w := range list {
		if room >= len(jobs) {
			break
		}
		if w.sleeping && !w.reserved && len(w.ch) == 0 && w.o.Owner != "" && w.o.Group == nil && w.n > 0 {
			pulls = append(pulls, w)
			room += w.n
		}
	}
	if room < len(jobs) {
		return nil
	}
	h := &pgHand{queue: queue, pulls: pulls, jobs: jobs, now: now}
	k := 0
	for i, w := range pulls {
		w.reserved = true
		for take := 0; take < w.n && k < len(jobs); take++ {
			ttl := w.o.TTL
			if ttl <= 0 {
				ttl = defaultLockTTL
			}
			h.of = append(h.of, i)
			h.tokens = append(h.tokens, newID())
			h.ttls = append(h.ttls, ttl)
			k++
		}
	}
	// Off the waiters: no wake-up goes to them now.
	kept := list[:0:0]
	for _, w := range list {
		if !w.reserved {
			kept = append(kept, w)
		}
	}
	if len(kept) == 0 {
		delete(p.waiters, queue)
	} else {
		p.waiters[queue] = kept
	}
	return h
}

// sleepersOn reports whether a pull sleeps on queue.
func (p *PG) sleepersOn(queue string) bool {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	for _, w := range p.waiters[queue] {
		if w.sleeping {
			return true
		}
	}
	return false
}

// args are pgHandSQL's parameters.
func (h *pgHand) args(broker string) []any {
	n := len(h.jobs)
	ids := make([]string, n)
	r := pgSavedRows{toks: make([]*string, n), owners: make([]*string, n), exps: make([]*int64, n),
		ttls: make([]*int64, n), touts: make([]*int64, n)}
	for i, j := range h.jobs {
		ids[i] = j.ID()
		r.toks[i], r.owners[i], r.ttls[i] = &h.tokens[i], ptr(h.pulls[h.of[i]].o.Owner), &h.ttls[i]
		r.exps[i] = ptr(h.now + h.ttls[i])
		if at, ok := timeoutAtFrom(j, h.now); ok {
			r.exps[i] = ptr(min(*r.exps[i], at))
			r.touts[i] = ptr(at)
		}
	}
	return []any{ids, h.now, broker, pgtype.FlatArray[*string](r.toks), pgtype.FlatArray[*string](r.owners),
		pgtype.FlatArray[*int64](r.exps), pgtype.FlatArray[*int64](r.ttls), pgtype.FlatArray[*int64](r.touts), h.now}
}

// settle gives each pull its jobs, made active as the rows were, once the
// push's transaction committed with them handed (done); otherwise the
// pulls go back to claiming. The jobs' pushed events have been told.
func (p *PG) settleHand(h *pgHand) {
	if h.done {
		for i, j := range h.jobs {
			w := h.pulls[h.of[i]]
			j.state = StateActive
			j.setStartedAt(h.now)
			j.setHeartbeat(h.now)
			j.addTimeline(TimelineEntry{State: StateActive, At: h.now})
			j.setLease(&Lease{Token: h.tokens[i], Owner: w.o.Owner, CreatedAt: h.now, ExpiresAt: h.now + h.ttls[i], TTL: h.ttls[i]})
			p.b.lat.wait.ObserveMs(h.now - j.CreatedAt)
			p.emit(h.queue, evPulled, j, h.now, evArgs{})
			w.jobs = append(w.jobs, j)
			w.tokens = append(w.tokens, h.tokens[i])
		}
		p.b.stats.pulled.Add(int64(len(h.jobs)))
		p.handed.Add(int64(len(h.jobs)))
	}
	for _, w := range h.pulls {
		close(w.handed)
	}
}

// readyOf are the jobs of made a pull may take now (not delayed), which
// are then in claim order: none when their priorities differ, when one is
// LIFO (claim order is then not the push's), or when one has a TTL (a
// claim checks it, and drops a job whose TTL ran out). Those are claimed
// as before.
func readyOf(made []*Job) []*Job {
	var ready []*Job
	for _, j := range made {
		if (j.cold().TTL != none && j.cold().TTL > 0) || j.cold().Lifo || j.Priority != made[0].Priority {
			return nil
		}
		if j.state == StateWaiting || j.state == StatePrioritized {
			ready = append(ready, j)
		}
	}
	return ready
}

// read reads pgHandSQL's answer from br: the statement hands all of the
// queue's jobs or none.
func (h *pgHand) read(br pgx.BatchResults) error {
	rows, err := br.Query()
	n := 0
	for err == nil && rows.Next() {
		n++
	}
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		return fmt.Errorf("hand jobs to pulls: %w", err)
	}
	h.took = n == len(h.jobs)
	return nil
}

// unhanded takes the jobs handed by hands (by queue, parallel to the
// push's order) off the counts of the queues to wake (wake, made).
func unhanded(hands []*pgHand, wake []string, made []int) ([]string, []int) {
	for _, h := range hands {
		if h == nil || !h.done {
			continue
		}
		if k := slices.Index(wake, h.queue); k >= 0 {
			if made[k] -= len(h.jobs); made[k] <= 0 {
				wake, made = slices.Delete(wake, k, k+1), slices.Delete(made, k, k+1)
			}
		}
	}
	return wake, made
}
