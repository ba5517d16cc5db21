package main

// A claim round in one round trip. A round (pg_claim.go) was a
// transaction of two: BEGIN, the queue's limits, the plan settings and
// the locking SELECT, then the UPDATE writing the leases and COMMIT. Once
// a backlog forms under a steady stream every job goes through a round,
// and a round carried some two jobs: its second trip, its second
// statement and their wake-ups were a third of the round's cost, and the
// wait for them held each worker's next pull back.
//
// Here, when every pull of the round has an owner (its lease comes from
// the pull, not from the queue's stall settings), the lease tokens are
// made before the round, one for each job it may take, and the claim
// locks the rows and writes their leases in one statement (pgTakeSQL),
// sent with the limits and the plan settings as one batch: one implicit
// transaction, committed at its end. The rules the statement cannot see
// are applied after it, in a statement of their own, before any pull has
// its job:
//   - a job's own timeout (in its record): its timeout_at, and its lease
//     ending no later;
//   - a job whose TTL ran out while it waited: removed, as a claim drops
//     it, and handed to no pull.
//
// A job dropped so takes its place in the round: its pull gets one job
// fewer. Should that statement fail, or the take's answer not be read,
// the round fails and its jobs go back to waiting at once, by their
// tokens (takeBack): no pull was given them. A queue with limits or groups
// claims nothing here (the statement checks, as pgClaimFastSQL does):
// the round then claims as before, and the queue is remembered as
// limited.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// pgTakeSQL claims up to $3 ready jobs of no group of queue $1 at $2 and
// makes them active in claim order, the job of rank k with the lease of
// row k of $5-$7 (token, owner, ttl), written by broker $4. It answers
// each job's rank and its row as the claim found it (pgJobCols), which
// activate's work in hand starts from. The queue's limits are checked as
// in pgClaimFastSQL: a limited queue's jobs are left to a round in a
// transaction.
const pgTakeSQL = `WITH c AS MATERIALIZED (
		SELECT s.*, row_number() OVER (ORDER BY priority DESC, sort_key, seq) AS rank
		FROM (SELECT priority, sort_key, seq, ` + pgJobCols + ` FROM {s}.jobs
			WHERE queue = $1 AND state = {queued} AND run_at <= $2 AND group_id IS NULL
				AND NOT EXISTS (SELECT 1 FROM {s}.queues q WHERE q.name = $1
					AND (q.paused OR q.grouped OR q.rate_max IS NOT NULL OR q.conc_limit IS NOT NULL))
			ORDER BY priority DESC, sort_key, seq LIMIT $3 FOR UPDATE SKIP LOCKED) AS s)
	UPDATE {s}.jobs AS j SET state = {active}, started_at = $2, result = NULL,
		lease_token = t.tok, lease_owner = t.owner, lease_broker = $4, lease_expires = $2 + t.ttl,
		lease_ttl = t.ttl, timeout_at = NULL, lease_renewals = 0
		FROM c, unnest($5::text[], $6::text[], $7::bigint[]) WITH ORDINALITY AS t(tok, owner, ttl, rank)
		WHERE j.id = c.id AND t.rank = c.rank
		RETURNING c.rank, c.id, c.body, c.state, c.started_at, c.done_at, c.data`

// pgTakeBackSQL puts back what a take claimed ($1: its tokens) when the
// broker could not hand it out (its answer unread, a record it could not
// decode, the statement after it failed): no pull was given those tokens.
// The row's record is as the claim found it, so only the columns the take
// wrote go back.
const pgTakeBackSQL = `UPDATE {s}.jobs SET state = {queued}, started_at = NULL, lease_token = NULL, lease_owner = NULL,
		lease_broker = NULL, lease_expires = NULL, lease_ttl = NULL, timeout_at = NULL
		WHERE lease_token = ANY($1) AND state = {active} AND lease_renewals = 0`

// pgTakeAfterSQL applies to taken jobs what pgTakeSQL could not: the
// timeouts ($1 ids, $2 tokens, $3 when they end) and the removal of jobs
// whose TTL ran out ($4 ids, $5 tokens); each only while the row still
// holds the lease the take wrote.
const pgTakeAfterSQL = `WITH t AS (
		UPDATE {s}.jobs AS j SET timeout_at = u.at, lease_expires = LEAST(j.lease_expires, u.at)
		FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(id, tok, at)
		WHERE j.id = u.id AND j.lease_token = u.tok AND j.state = {active})
	DELETE FROM {s}.jobs AS j USING unnest($4::text[], $5::text[]) AS u(id, tok)
		WHERE j.id = u.id AND j.lease_token = u.tok AND j.state = {active}`

// pgClaimLanes are a broker's claim lanes, and the queues whose last
// round found limits or groups (their rounds go to a transaction at
// once).
type pgClaimLanes struct {
	lanes   map[string]*pgClaimLane
	limited map[string]bool
	taken   atomic.Int64 // rounds claimed in one round trip
}

// pgMaxLimited bounds the queues remembered as limited; past it they are
// all forgotten, which costs a round trip each, never a job.
const pgMaxLimited = 4096

// takes reports whether a round of reqs on queue may claim in one round
// trip: every pull has an owner, and the queue was not limited last time.
func (p *PG) takes(queue string, reqs []*pgClaimReq) bool {
	for _, r := range reqs {
		if r.o.Owner == "" || r.o.Group != nil {
			return false
		}
	}
	p.claimMu.Lock()
	defer p.claimMu.Unlock()
	return !p.claimLanes.limited[queue]
}

// setLimited remembers whether queue has limits or groups.
func (p *PG) setLimited(queue string, limited bool) {
	p.claimMu.Lock()
	defer p.claimMu.Unlock()
	l := &p.claimLanes
	switch {
	case !limited:
		delete(l.limited, queue)
	case l.limited == nil || len(l.limited) >= pgMaxLimited:
		l.limited = map[string]bool{queue: true}
	default:
		l.limited[queue] = true
	}
}

// take is a round claimed in one round trip (see the file's comment); ok
// is false when the queue turned out to have limits or groups, and the
// round must claim in a transaction.
func (p *PG) take(ctx context.Context, queue string, reqs []*pgClaimReq, now int64) (c pgClaimed, ok bool, err error) {
	n := claimAsked(reqs)
	toks, owners, ttls := make([]string, n), make([]string, n), make([]int64, n)
	of := make([]int, n)
	k := 0
	for i, r := range reqs {
		ttl := lockTTL(r.o)
		for range r.n {
			toks[k], owners[k], ttls[k], of[k] = newID(), r.o.Owner, ttl, i
			k++
		}
	}
	b := &pgx.Batch{}
	b.Queue(p.sql(pgClaimFirstSQL), queue)
	b.Queue(pgClaimPlan)
	b.Queue(p.sql(pgTakeSQL), queue, now, n, p.broker, toks, owners, ttls)
	br := p.pool.SendBatch(ctx, b)
	lim, jobs, ranks, err := readTake(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("claim: %w", cerr)
	}
	if err != nil {
		p.takeBack(queue, toks)
		return pgClaimed{}, false, err
	}
	// The limits were read by a statement before the take's: limits set
	// or cleared between the two leave the jobs the take did claim (under
	// none) to be handed out, never dropped.
	if len(jobs) == 0 && (lim.paused || lim.limited() || lim.grouped) {
		p.setLimited(queue, true)
		return pgClaimed{}, false, nil
	}
	p.claimLanes.taken.Add(1)
	c.fast = true
	if len(jobs) == 0 {
		next, ready, err := p.nextDueOrReady(ctx, p.pool, queue, now)
		c.next, c.exhausted = next, !ready
		return c, true, err
	}
	var after pgTakeAfter
	for i, j := range jobs {
		slot := ranks[i] - 1
		if ttlExpired(j, now) {
			after.gone(j, toks[slot])
			c.expired = append(c.expired, j)
			continue
		}
		takeJob(j, now, pullLease(reqs[of[slot]].o, toks[slot], now))
		if at, ok := timeoutAtFrom(j, now); ok {
			after.timeout(j, toks[slot], at)
		}
		c.jobs = append(c.jobs, j)
		c.tokens = append(c.tokens, toks[slot])
		c.of = append(c.of, of[slot])
	}
	if err := after.write(ctx, p); err != nil {
		p.takeBack(queue, toks)
		return pgClaimed{}, true, err
	}
	return c, true, nil
}

// takeBack puts back the jobs a take claimed with toks, and wakes the
// queue's pulls for them. Its own deadline: the round's may be what ran
// out.
func (p *PG) takeBack(queue string, toks []string) {
	ctx, cancel := context.WithTimeout(context.Background(), pgOpTimeout)
	defer cancel()
	if _, err := p.pool.Exec(ctx, p.sql(pgTakeBackSQL), toks); err != nil {
		p.log.Warn("jobs claimed but not handed out left to their leases' end", "queue", queue, "err", err)
		return
	}
	p.wake(queue)
}

// readTake reads take's batch: the queue's limits, then the jobs taken
// in claim order with their ranks (1 up, the row of the lease each got).
func readTake(br pgx.BatchResults) (pgLimits, []*Job, []int, error) {
	var l pgLimits
	var s pgSettings
	err := scanClaimFirst(br.QueryRow(), &l, &s)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		l = pgLimits{}
	case err != nil:
		return l, nil, nil, fmt.Errorf("read the limits: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return l, nil, nil, fmt.Errorf("claim: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return l, nil, nil, fmt.Errorf("claim: %w", err)
	}
	defer rows.Close()
	type taken struct {
		rank int
		j    *Job
	}
	var got []taken
	var last recLast
	var r pgRow
	var rank int64
	dest := append([]any{&rank}, r.dest()...)
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return l, nil, nil, fmt.Errorf("claim: %w", err)
		}
		j, err := r.job(&last)
		if err != nil {
			return l, nil, nil, fmt.Errorf("claim: %w", err)
		}
		got = append(got, taken{int(rank), j})
	}
	if err := rows.Err(); err != nil {
		return l, nil, nil, fmt.Errorf("claim: %w", err)
	}
	// An UPDATE answers its rows in no set order.
	slices.SortFunc(got, func(a, b taken) int { return a.rank - b.rank })
	jobs, ranks := make([]*Job, len(got)), make([]int, len(got))
	for i, t := range got {
		jobs[i], ranks[i] = t.j, t.rank
	}
	return l, jobs, ranks, nil
}

// pgTakeAfter is what pgTakeAfterSQL writes for a take.
type pgTakeAfter struct {
	ids, toks         []string
	ats               []int64
	goneIDs, goneToks []string
}

func (a *pgTakeAfter) timeout(j *Job, tok string, at int64) {
	a.ids, a.toks, a.ats = append(a.ids, j.ID()), append(a.toks, tok), append(a.ats, at)
}

func (a *pgTakeAfter) gone(j *Job, tok string) {
	a.goneIDs, a.goneToks = append(a.goneIDs, j.ID()), append(a.goneToks, tok)
}

// write runs pgTakeAfterSQL when there is anything to write.
func (a *pgTakeAfter) write(ctx context.Context, p *PG) error {
	if len(a.ids) == 0 && len(a.goneIDs) == 0 {
		return nil
	}
	_, err := p.pool.Exec(ctx, p.sql(pgTakeAfterSQL), pgtype.FlatArray[string](a.ids), pgtype.FlatArray[string](a.toks),
		pgtype.FlatArray[int64](a.ats), pgtype.FlatArray[string](a.goneIDs), pgtype.FlatArray[string](a.goneToks))
	if err != nil {
		return fmt.Errorf("claim: timeouts and expired jobs: %w", err)
	}
	return nil
}
