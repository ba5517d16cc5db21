package main

// Release on disconnect in PostgreSQL mode, as in the other modes: the
// jobs a connection pulled and still holds when it drops go back to their
// queue at once, without costing an attempt, unless their lock was renewed
// (a worker that renewed is trusted to be alive on another connection
// until its lock runs out, and the lease reaper takes over from there).
// Which connection holds what is this broker's own knowledge: another
// broker's connections never hold a job this broker handed out.

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// pgHold is one claim: its token (empty when the pull named no owner) and
// its start, which tells two owner-less claims of a job apart; for a lock,
// when its lease was written, until when and for how long (pg_renew.go),
// and the renewals answered without a write since the last one.
type pgHold struct {
	c       *conn
	token   string
	started int64
	leaseAt int64
	expires int64
	ttl     int64
	elided  int32
}

type pgHolds struct {
	mu sync.Mutex
	m  map[string]pgHold // job id -> the connection that pulled it
	// gone holds the locks of claims lately finished through this broker
	// (job id -> token), in two generations of at most pgGoneMax: a
	// renewal of one is refused without asking the database (pg_renew.go).
	gone, goneOld map[string]string
}

// pgGoneMax bounds a generation of pgHolds.gone.
const pgGoneMax = 8192

// hold records jobs pulled through c (tokens[i] is jobs[i]'s, when owned).
func (p *PG) hold(c *conn, jobs []*Job, tokens []string) {
	if c == nil || len(jobs) == 0 {
		return
	}
	h := &p.holds
	h.mu.Lock()
	if h.m == nil {
		h.m = make(map[string]pgHold)
	}
	for i, j := range jobs {
		tok := ""
		if i < len(tokens) {
			tok = tokens[i]
		}
		hd := pgHold{c: c, token: tok, started: j.StartedAt()}
		if l := j.run().lease; l != nil && tok != "" && l.Token == tok {
			hd.leaseAt, hd.expires, hd.ttl = l.CreatedAt, l.ExpiresAt, l.TTL
		}
		h.m[j.ID()] = hd
	}
	h.mu.Unlock()
}

// holdFor records a pull's jobs against the connection that pulled them,
// unless the pull asked to be detached from it.
func (p *PG) holdFor(o PullOpts, jobs []*Job, tokens []string) {
	if o.Conn != nil && !o.Detach {
		p.hold(o.Conn, jobs, tokens)
	}
}

// unhold forgets jobs that were finished through this broker, and keeps
// their locks' tokens a while as gone: a token once finished never holds
// its job again (a job run again gets a new one).
func (p *PG) unhold(ids ...string) {
	h := &p.holds
	h.mu.Lock()
	for _, id := range ids {
		if hd, ok := h.m[id]; ok && hd.token != "" {
			if len(h.gone) >= pgGoneMax || h.gone == nil {
				h.goneOld, h.gone = h.gone, make(map[string]string, 64)
			}
			h.gone[id] = hd.token
		}
		delete(h.m, id)
	}
	h.mu.Unlock()
}

// Release puts back what c held, once c has closed.
func (p *PG) Release(ctx context.Context, c *conn) {
	h := &p.holds
	h.mu.Lock()
	var ids []string
	claims := map[string]pgHold{}
	for id, hd := range h.m {
		if hd.c == c {
			ids = append(ids, id)
			claims[id] = hd
			delete(h.m, id)
		}
	}
	h.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.releaseJobs(ctx, ids, claims); err != nil {
		// The leases run out and the reaper takes the jobs back.
		p.log.Warn("jobs of a closed connection left to their lease expiry", "jobs", len(ids), "err", err)
	}
}

// unclaim puts back jobs a pull claimed but cannot answer with (pullKeeps).
func (p *PG) unclaim(jobs []*Job, tokens []string) {
	ids := make([]string, len(jobs))
	claims := make(map[string]pgHold, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID()
		hd := pgHold{started: j.StartedAt()}
		if i < len(tokens) {
			hd.token = tokens[i]
		}
		claims[j.ID()] = hd
	}
	// As long as any operation: the jobs here are the large ones (an
	// answer could not carry them), and releasing reads their rows, which
	// took over 10 s under the race detector on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), pgOpTimeout)
	defer cancel()
	if err := p.releaseJobs(ctx, ids, claims); err != nil {
		p.log.Warn("jobs claimed past an answer's size left to their lease expiry", "jobs", len(ids), "err", err)
	}
}

func (p *PG) releaseJobs(ctx context.Context, ids []string, claims map[string]pgHold) error {
	now := p.now()
	tx, err := p.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	locked, err := p.lockRows(ctx, tx, ids)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	held := make([]*Job, 0, len(locked))
	for _, l := range locked {
		held = append(held, l.j)
	}
	renewals, err := p.leaseRenewals(ctx, tx, held)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	var back []*Job
	queues := map[string]bool{}
	for _, id := range ids {
		l, hd := locked[id], claims[id]
		if l == nil || l.j.state != StateActive || l.j.StartedAt() != hd.started || hd.token != "" && l.token != hd.token {
			continue // finished, or claimed again, meanwhile
		}
		j := l.j
		if renewals[id] > 0 || hd.elided > 0 {
			continue // trusted to be alive elsewhere until its lock runs out
		}
		j.setLease(nil)
		j.setStartedAt(0)
		j.setHeartbeat(now)
		j.state = j.readyState()
		back = append(back, j)
		queues[j.Queue] = true
	}
	if len(back) == 0 {
		return nil
	}
	if err := p.saveJobs(ctx, tx, back, nil); err != nil {
		return err
	}
	for q := range queues {
		if err := p.notify(ctx, tx, q); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}
