package main

// Claiming jobs in PostgreSQL mode: the claims of one queue that wait at
// the same moment are taken in rounds, one transaction for all of them
// (pgClaimLane); a claim checks the queue's limits (pause, rate,
// concurrency) and its groups', activates the rows it took and writes
// their leases. Pull (pg_lifecycle.go) waits and retries around it. A
// round whose pulls all have a lock owner claims in one round trip
// instead (pg_take.go).

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// pgClaimed is what a claim's transaction took.
type pgClaimed struct {
	jobs   []*Job
	tokens []string // parallel to jobs: the lease's token, "" without an owner
	of     []int    // parallel to jobs: the request (of the round's) that takes it
	next   int64    // nothing claimed: when the next delayed job comes due (0: none)
	// expired are jobs dropped because their ttl ran out (job:expired);
	// refused names the limit that held back a ready job (its notice).
	expired []*Job
	refused string
	// fast: the queue has no limits or groups; exhausted: the claim found
	// no ready job, locked by others or not (pg_wait.go).
	fast, exhausted bool
}

// pgClaimReq is one pull's part of a claim round: it asks for up to n
// jobs, leased as o says.
type pgClaimReq struct {
	n      int
	o      PullOpts
	jobs   []*Job
	tokens []string
	next   int64
	err    error
	done   chan struct{}
}

// pgClaimLane is a queue's claims waiting for their round.
type pgClaimLane struct {
	pgRounds[*pgClaimReq]
}

const (
	// pgClaimMax bounds the jobs one claim round asks for (a pull's count
	// is never split across rounds).
	pgClaimMax = 1000
	// pgClaimRounds is how many rounds of a queue may be in flight at
	// once. One at a time left the database idle while each round's
	// results went back to the pulls and its commit was flushed; a second
	// skips at most the first's rows.
	pgClaimRounds = 2
	// pgClaimSmall: the second round starts only while the pulls waiting
	// ask for more jobs than this (addSmall). Single pulls of a steady
	// stream then gather behind the one round in flight, and share the
	// next: a claim's commit no longer waits for the flush (pgClaimPlan),
	// so a round is short. queued bench steady at 3,000 jobs/s (20
	// workers, PULL of one), in turn with two rounds always, three runs
	// each: the database's CPU 0.21-0.23 ms a job against 0.26-0.28,
	// 0.31-0.34 commits a job against 0.43, p99 lower in each pair. A
	// drain (PULLB of 100 on several connections) still gets its two
	// rounds: 26,000-32,600 jobs/s against 28,700-32,100, six runs each.
	pgClaimSmall = 64
)

// claim takes up to n ready jobs of a queue, skipping rows other brokers
// are claiming. With nothing to claim it answers when the next delayed job
// comes due (0: none). Its errors are ready for the client.
//
// The pulls of a queue on this broker claim in rounds, one transaction at
// a time, each round for every pull that came meanwhile (as pushes are
// group-committed, pg_pushbuf.go). Pulls claiming side by side in
// transactions of their own spent most of the database's time skipping
// one another's rows: FOR UPDATE SKIP LOCKED walks the claim index past
// every row another claim in flight has locked, so with 16 claims of 100
// in flight a claim visited up to 1,500 rows to take 100, and each paid
// for its own statements and commit. Across brokers SKIP LOCKED still
// keeps claims apart. A pull naming a group claims on its own.
func (p *PG) claim(ctx context.Context, queue string, n int, o PullOpts) ([]*Job, []string, int64, error) {
	req := &pgClaimReq{n: n, o: o, done: make(chan struct{})}
	if o.Group != nil {
		p.claimRound(ctx, queue, []*pgClaimReq{req})
		return req.jobs, req.tokens, req.next, req.err
	}
	p.claimMu.Lock()
	if p.claimLanes.lanes == nil {
		p.claimLanes.lanes = map[string]*pgClaimLane{}
	}
	lane := p.claimLanes.lanes[queue]
	if lane == nil {
		lane = &pgClaimLane{}
		p.claimLanes.lanes[queue] = lane
	}
	start := lane.addSmall(req, pgClaimRounds, pgClaimSmall, claimSize)
	p.claimMu.Unlock()
	if start {
		go p.claimRounds(queue, lane)
	}
	// The round runs on its own context: a pull whose connection went
	// away waits for it all the same, and what it claimed is held for
	// that connection and released with it (the connection waits for its
	// commands before it releases).
	<-req.done
	return req.jobs, req.tokens, req.next, req.err
}

// claimRounds runs a queue's claim rounds until no pull is waiting.
func (p *PG) claimRounds(queue string, lane *pgClaimLane) {
	for {
		p.claimMu.Lock()
		round, _, ok := lane.next(pgClaimMax, claimSize)
		if !ok && lane.running == 0 {
			delete(p.claimLanes.lanes, queue)
		}
		p.claimMu.Unlock()
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), pgOpTimeout)
		p.claimRound(ctx, queue, round)
		cancel()
	}
}

// claimRound claims for the pulls of a round in one transaction, hands
// each its jobs in the order the pulls came, and tells of what was
// claimed once committed.
func (p *PG) claimRound(ctx context.Context, queue string, reqs []*pgClaimReq) {
	defer func() {
		for _, r := range reqs {
			close(r.done)
		}
	}()
	if err := p.clockReady(ctx); err != nil {
		for _, r := range reqs {
			r.err = pgErr(err)
		}
		return
	}
	p.claimsRun.Add(1)
	var mark pgClaimMark
	if reqs[0].o.Group == nil {
		mark = p.claimBegins(queue, claimAsked(reqs))
	}
	now := p.now()
	var c pgClaimed
	err := p.pastUnreadable(ctx, func() error {
		took := false
		var err error
		if p.takes(queue, reqs) {
			c, took, err = p.take(ctx, queue, reqs, now)
			err = pgErr(err)
		}
		if !took && err == nil {
			err = p.inTx(ctx, func(tx pgx.Tx) error {
				var err error
				c, err = p.claimTx(ctx, tx, queue, reqs, now)
				return pgErr(err)
			})
		}
		return err
	})
	if mark.d != nil {
		p.claimEnds(queue, mark, err == nil, c.fast, len(c.jobs)+len(c.expired), c.exhausted, c.next)
	}
	if err != nil {
		for _, r := range reqs {
			r.err = err
		}
		return
	}
	p.b.stats.pulled.Add(int64(len(c.jobs)))
	for _, j := range c.expired {
		p.b.announce(noticeExpired(queue, j, now))
	}
	if c.refused != "" {
		p.b.announce(noticeQueue(c.refused, queue))
	}
	for i, j := range c.jobs {
		if j.Attempts == 0 {
			// As in memory mode: retries wait for their backoff, not
			// for the queue's backlog.
			p.b.lat.wait.ObserveMs(now - j.CreatedAt)
		}
		p.emit(queue, evPulled, j, now, evArgs{})
		r := reqs[c.of[i]]
		r.jobs = append(r.jobs, j)
		if r.o.Owner != "" {
			r.tokens = append(r.tokens, c.tokens[i])
		}
	}
	for _, r := range reqs {
		r.next = c.next
	}
}

func claimSize(r *pgClaimReq) int { return r.n }

// claimAsked is how many jobs the pulls of a round ask for.
func claimAsked(reqs []*pgClaimReq) int {
	n := 0
	for _, r := range reqs {
		n += r.n
	}
	return n
}

// claimTx is a claim's transaction: the queue's limits, then its ready
// jobs, grouped or not (pg_groups.go claimGrouped), made active.
func (p *PG) claimTx(ctx context.Context, tx pgx.Tx, queue string, reqs []*pgClaimReq, now int64) (pgClaimed, error) {
	n := claimAsked(reqs)
	// Only a round of one pull names a group (claim).
	group := reqs[0].o.Group
	first, err := p.claimFirst(ctx, tx, queue, n, now)
	if err != nil {
		return pgClaimed{}, err
	}
	if first.claimed {
		p.setLimited(queue, false)
		if len(first.jobs) == 0 {
			next, ready, err := p.nextDueOrReady(ctx, tx, queue, now)
			return pgClaimed{next: next, fast: true, exhausted: !ready}, err
		}
		c, err := p.activate(ctx, tx, queue, first.jobs, reqs, n, nil, first.set, now)
		c.fast = true
		return c, err
	}
	lim := first.lim
	if lim.limited() {
		// Limited: take the queue row, so that the brokers' claims count
		// against the limits one after another.
		if lim, err = p.readLimits(ctx, tx, queue, true); err != nil {
			return pgClaimed{}, err
		}
	}
	if lim.paused {
		return pgClaimed{}, nil
	}
	var rate *bucket
	if lim.limited() {
		var wait int64
		if n, wait, rate, err = p.allowance(ctx, tx, queue, lim, n, now); err != nil {
			return pgClaimed{}, err
		}
		if n == 0 {
			if !p.b.refusalDue(queue, now) {
				return pgClaimed{next: wait}, nil
			}
			refused, err := p.refusal(ctx, tx, queue, rate, now)
			return pgClaimed{next: wait, refused: refused}, err
		}
	}
	var jobs []*Job
	var wait int64
	if lim.grouped {
		jobs, wait, err = p.claimGrouped(ctx, tx, queue, n, group, now)
	} else {
		jobs, err = p.claimUngrouped(ctx, tx, queue, n, now)
	}
	if err != nil {
		return pgClaimed{}, fmt.Errorf("claim: %w", err)
	}
	if len(jobs) == 0 {
		next, err := p.nextDue(ctx, tx, queue, now, wait)
		return pgClaimed{next: next}, err
	}
	return p.activate(ctx, tx, queue, jobs, reqs, n, rate, nil, now)
}

// refusal names the limit that held a claim back (rate when its bucket
// is empty, else concurrency), as the notice the reference announces
// when a ready job was there to take; "" when none was.
func (p *PG) refusal(ctx context.Context, tx pgx.Tx, queue string, rate *bucket, now int64) (string, error) {
	var ready bool
	if err := tx.QueryRow(ctx, p.sql(`SELECT EXISTS (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND state = {queued} AND run_at <= $2)`),
		queue, now).Scan(&ready); err != nil || !ready {
		return "", err
	}
	if rate != nil && rate.tokens < 1 {
		return "ratelimit:rejected", nil
	}
	return "concurrency:rejected", nil
}

// nextDueOrReady is when the queue's next delayed job comes due (0:
// none), and whether a ready job is there all the same for a claim that
// found nothing: the claim skips the rows other transactions hold locked
// (another broker's claim, a push deduplicated against a waiting job, a
// progress update), and those may go back to waiting with no wake-up.
// Only a queue with no ready row at all, locked or not, is marked empty
// (pg_wait.go).
func (p *PG) nextDueOrReady(ctx context.Context, tx pgQuerier, queue string, now int64) (int64, bool, error) {
	var next *int64
	var ready bool
	err := tx.QueryRow(ctx, p.sql(`SELECT
			(SELECT min(run_at) FROM {s}.jobs WHERE queue = $1 AND state = {queued} AND run_at > $2),
			EXISTS (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND state = {queued} AND run_at <= $2)`),
		queue, now).Scan(&next, &ready)
	if err != nil {
		return 0, false, fmt.Errorf("claim: %w", err)
	}
	if next == nil {
		return 0, ready, nil
	}
	return *next, ready, nil
}

// nextDue is when a claim that found nothing should look again: when the
// queue's next delayed job comes due, or at wait (a group's window)
// when that is sooner (0: neither).
func (p *PG) nextDue(ctx context.Context, tx pgx.Tx, queue string, now, wait int64) (int64, error) {
	next, _, err := p.nextDueOrReady(ctx, tx, queue, now)
	if next > 0 && (wait == 0 || next < wait) {
		wait = next
	}
	return wait, err
}

// activate makes claimed jobs active, with a lease when the pull has an
// owner, and spends the queue's rate tokens on them. A job whose TTL ran
// out while it waited is dropped without an event, as in memory mode.
// set is the queue's settings when the claim read them already (nil:
// saveJobs reads them if it needs them).
func (p *PG) activate(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job, reqs []*pgClaimReq, n int, rate *bucket, set map[string]*pgSettings, now int64) (pgClaimed, error) {
	var c pgClaimed
	var expired []string
	// The jobs go to the round's pulls in claim order, each taking up to
	// its count (the limits may have allowed fewer than all asked: n).
	r, taken := 0, 0
	for _, j := range jobs {
		if ttlExpired(j, now) {
			expired = append(expired, j.ID())
			c.expired = append(c.expired, j)
			continue
		}
		if len(c.jobs) == n {
			// More rows than the limits allow: left as they were (the
			// claim asks for no more than n, so this does not happen).
			break
		}
		for taken == reqs[r].n {
			r, taken = r+1, 0
		}
		taken++
		o := reqs[r].o
		tok := ""
		if o.Owner != "" {
			tok = newID()
		}
		takeJob(j, now, pullLease(o, tok, now))
		c.jobs = append(c.jobs, j)
		c.tokens = append(c.tokens, tok)
		c.of = append(c.of, r)
	}
	if len(expired) > 0 {
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.jobs WHERE id = ANY($1)`), expired); err != nil {
			return pgClaimed{}, fmt.Errorf("drop expired jobs: %w", err)
		}
	}
	if len(c.jobs) > 0 {
		if err := p.saveClaimed(ctx, tx, c.jobs, set, now); err != nil {
			return pgClaimed{}, err
		}
		if err := p.spend(ctx, tx, queue, rate, len(c.jobs)); err != nil {
			return pgClaimed{}, err
		}
	}
	return c, nil
}

// pgClaimedSQL writes what a claim changed in job rows: their state,
// when they started and their leases, not their records (pgOverlay reads
// the claim back from started_at). As a full write would, it clears the
// result of a job run again and starts the count of lease renewals over
// for a new token.
const pgClaimedSQL = `UPDATE {s}.jobs AS j SET state = {active}, started_at = $2, result = NULL,
		lease_token = COALESCE(u.tok, j.lease_token), lease_owner = u.owner, lease_broker = $3,
		lease_expires = u.exp, lease_ttl = u.ttl, timeout_at = u.tout,
		lease_renewals = CASE WHEN u.tok IS NOT NULL AND u.tok IS DISTINCT FROM j.lease_token THEN 0 ELSE j.lease_renewals END
		FROM unnest($1::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::bigint[]) AS u(id, tok, owner, exp, ttl, tout)
		WHERE j.id = u.id`

// saveClaimed writes the rows of jobs activate made active at now; set is
// their queue's settings when the claim read them (nil: read here when a
// job without a lock needs its queue's stall policy).
func (p *PG) saveClaimed(ctx context.Context, tx pgx.Tx, jobs []*Job, set map[string]*pgSettings, now int64) error {
	if set == nil {
		var err error
		if set, err = p.unlockedSettings(ctx, tx, jobs); err != nil {
			return err
		}
	}
	n := len(jobs)
	ids := make([]string, n)
	r := pgSavedRows{toks: make([]*string, n), owners: make([]*string, n), exps: make([]*int64, n),
		ttls: make([]*int64, n), touts: make([]*int64, n)}
	for i, j := range jobs {
		ids[i] = j.ID()
		r.setLease(i, j, set[j.Queue].stallConfig())
	}
	return pgLater(ctx, tx, "postgres: save claimed jobs", p.sql(pgClaimedSQL), ids, now, p.broker,
		pgtype.FlatArray[*string](r.toks), pgtype.FlatArray[*string](r.owners), pgtype.FlatArray[*int64](r.exps),
		pgtype.FlatArray[*int64](r.ttls), pgtype.FlatArray[*int64](r.touts))
}
