package main

// A push hands its jobs to the pulls waiting for them. Under a steady
// stream the workers mostly wait: a push committed, woke a pull, and the
// pull claimed the job in a transaction of its own (its queue's limits
// read, the row locked, its lease written, a commit), before the worker
// had it. Here a push of ready jobs to a queue on which pulls of this
// broker sleep inserts them active, with their leases, and the pulls get
// the jobs once it commits: one transaction a job less, and a claim's
// statements; and one version of each row, not two. The claim's rules
// hold in the statement (pgInsertHandSQL): nothing is handed on a paused
// queue, a queue with limits or groups, or while an older job of the
// queue is ready (another broker's push, a job come due, a release),
// which keeps the claim order; the jobs are then inserted as any others,
// and the pulls woken to claim as before.
//
// Only a pull that sleeps, with an owner (a lease: the lease columns need
// no stall settings) and no group, is handed jobs. When the push has more
// ready jobs than the sleeping pulls take, they are handed the oldest and
// the rest are written waiting, after them in claim order, for the next
// pulls to claim: at 1,500 jobs/s through bench steady a push in four
// found too few pulls asleep, and handing such a push none (as at first)
// took some 60% more claim rounds. A pull handed jobs is taken off the
// queue's waiters at once, so no wake-up goes to it, and takes what it is
// handed once the push's transaction has settled, whatever woke it
// meanwhile.

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// pgInsertHandSQL is pgInsertBareSQL (pg_insert.go) for a push that
// hands its ready jobs to the sleeping pulls: those given a lease ($14 to
// $18, by row) are inserted active with it, started at the push's time
// ($19) by this broker ($20), when the queue may hand them; otherwise, as
// every other row, as admitted. One statement, and one version of the
// row, where an INSERT and then an UPDATE writing the lease were two. It
// answers, for each row made, whether it was made active. The queue may
// not hand jobs when paused, limited or grouped, or while an older job of
// it is ready (the statement does not see its own rows).
const pgInsertHandSQL = `INSERT INTO {s}.jobs (id, queue, state, priority, sort_key, run_at, created_at, unique_key, unique_expires,
			group_id, body, plain, data, started_at, lease_token, lease_owner, lease_broker, lease_expires, lease_ttl, timeout_at)
		SELECT u.id, $1, CASE WHEN h.ok AND u.tok IS NOT NULL THEN {active} ELSE u.state END, u.prio, u.key, u.run_at, u.created,
			u.uk, u.uexp, NULLIF(u.grp, ''), u.rec, u.plain, u.dat,
			CASE WHEN h.ok AND u.tok IS NOT NULL THEN $19::bigint END, CASE WHEN h.ok THEN u.tok END,
			CASE WHEN h.ok THEN u.owner END, CASE WHEN h.ok AND u.tok IS NOT NULL THEN $20::text END,
			CASE WHEN h.ok THEN u.exp END, CASE WHEN h.ok THEN u.ttl END, CASE WHEN h.ok THEN u.tout END
		FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::text[], $8::bytea[], $9::bigint[],
				$10::text[], $11::smallint[], $12::boolean[], $13::bytea[], $14::text[], $15::text[], $16::bigint[], $17::bigint[], $18::bigint[])
			WITH ORDINALITY AS u(id, prio, key, run_at, created, uk, rec, uexp, grp, state, plain, dat, tok, owner, exp, ttl, tout, ord),
			(SELECT NOT EXISTS (SELECT 1 FROM {s}.queues q WHERE q.name = $1
					AND (q.paused OR q.grouped OR q.rate_max IS NOT NULL OR q.conc_limit IS NOT NULL))
				AND NOT EXISTS (SELECT 1 FROM {s}.jobs o WHERE o.queue = $1 AND o.state = {queued}
					AND o.run_at <= $19 AND o.group_id IS NULL) AS ok) h
		WHERE EXISTS (SELECT 1 FROM {s}.queues WHERE name = $1)
		ORDER BY u.ord
		ON CONFLICT DO NOTHING RETURNING state = {active}`

// pgHand is what a push hands to the sleeping pulls of a queue: jobs[i]
// to pulls[of[i]], with the lease tokens[i] of ttls[i] ms.
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

// reserveHand takes the sleeping pulls of queue that jobs (ready jobs of
// one push, in claim order) need, and answers the hand of as many of the
// jobs, from the first, as they take; nil when no pull sleeps there.
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
	if room == 0 {
		return nil
	}
	// The oldest, as many as the pulls take: the rest are written
	// waiting, after the handed ones in claim order.
	jobs = jobs[:min(room, len(jobs))]
	h := &pgHand{queue: queue, pulls: pulls, jobs: jobs, now: now}
	k := 0
	for i, w := range pulls {
		w.reserved = true
		for take := 0; take < w.n && k < len(jobs); take++ {
			h.of = append(h.of, i)
			h.tokens = append(h.tokens, newID())
			h.ttls = append(h.ttls, lockTTL(w.o))
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

// insertArgs are pgInsertHandSQL's parameters for rows, the rows of
// the push whose ready jobs h hands.
func (h *pgHand) insertArgs(rows *pgRows, queue, broker string) []any {
	n := len(rows.ids)
	r := pgSavedRows{toks: make([]*string, n), owners: make([]*string, n), exps: make([]*int64, n),
		ttls: make([]*int64, n), touts: make([]*int64, n)}
	at := make(map[string]int, len(h.jobs))
	for i, j := range h.jobs {
		at[j.ID()] = i
	}
	for k, id := range rows.ids {
		i, ok := at[id]
		if !ok {
			continue
		}
		j := h.jobs[i]
		r.toks[k], r.owners[k], r.ttls[k] = &h.tokens[i], ptr(h.pulls[h.of[i]].o.Owner), &h.ttls[i]
		r.exps[k] = ptr(h.now + h.ttls[i])
		if t, ok := timeoutAtFrom(j, h.now); ok {
			r.exps[k] = ptr(min(*r.exps[k], t))
			r.touts[k] = ptr(t)
		}
	}
	return append(rows.args(queue), pgtype.FlatArray[*string](r.toks), pgtype.FlatArray[*string](r.owners),
		pgtype.FlatArray[*int64](r.exps), pgtype.FlatArray[*int64](r.ttls), pgtype.FlatArray[*int64](r.touts), h.now, broker)
}

// settle gives each pull its jobs, made active as the rows were, once the
// push's transaction committed with them handed (done); otherwise the
// pulls go back to claiming. The jobs' pushed events have been told.
func (p *PG) settleHand(h *pgHand) {
	if h.done {
		for i, j := range h.jobs {
			w := h.pulls[h.of[i]]
			takeJob(j, h.now, pullLease(w.o, h.tokens[i], h.now))
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

// readyOf are the jobs of made a pull may take now (not delayed), in
// claim order: by their sort key (their run time: a client's timestamp
// option may set it back), the push's order among equals, as the rows'
// seq has it. None when their priorities differ, when one is LIFO, or
// when one has a TTL (a claim checks it, and drops a job whose TTL ran
// out): those are claimed as before. A hand of part of them takes them
// from the first, so the order is what keeps the claim's.
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
	slices.SortStableFunc(ready, func(a, b *Job) int { return cmp.Compare(sortKey(a), sortKey(b)) })
	return ready
}

// read reads pgInsertHandSQL's answer from br: how many rows it made,
// and whether it made the handed ones active (all of them or none).
func (h *pgHand) read(br pgx.BatchResults) (made int64, err error) {
	rows, err := br.Query()
	active := 0
	for err == nil && rows.Next() {
		var on bool
		if err = rows.Scan(&on); err == nil {
			made++
			if on {
				active++
			}
		}
	}
	if rows != nil {
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		return 0, fmt.Errorf("insert jobs: %w", err)
	}
	h.took = active == len(h.jobs)
	return made, nil
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
