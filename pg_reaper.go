package main

// Expired leases in PostgreSQL mode, reclaimed by whichever broker sees
// them first: jobs whose lease ran out, that stopped sending heartbeats,
// or that ran past their timeout, judged by the database's time.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"
)

// reapRound is one round of the reaper (every 250 ms).
func (p *PG) reapRound(ctx context.Context) {
	if !p.clockHolds(ctx, true) {
		// Leases are judged by the database's time, or not at all.
		return
	}
	if err := p.reapOnce(ctx); err == nil {
		p.setDown(nil)
	} else if ctx.Err() == nil {
		p.setDown(err)
	}
}

// reapOnce puts back jobs whose lease ran out, or that stopped sending
// heartbeats, as the queue's stall policy says: it costs them an attempt
// and a stall; past their attempts or their stalls they go to the DLQ, as
// in memory mode. A job past its timeout fails as a timeout. Then it
// expires and auto-retries DLQ entries whose time came.
func (p *PG) reapOnce(ctx context.Context) error {
	leases, dlq, err := p.reapDue(ctx)
	if err != nil {
		return fmt.Errorf("look for expired leases and due DLQ entries: %w", err)
	}
	if leases {
		if err := p.reapLeases(ctx); err != nil {
			return fmt.Errorf("reclaim expired leases: %w", err)
		}
	}
	if dlq {
		if err := p.reapDLQ(ctx); err != nil {
			return fmt.Errorf("DLQ expiry and auto-retry: %w", err)
		}
	}
	return nil
}

// pgReapDueSQL tells whether a lease ran out or a DLQ entry is due, by
// the rows the reaper's scans would lock.
const pgReapDueSQL = `SELECT EXISTS (SELECT 1 FROM {s}.jobs WHERE state = {active} AND lease_expires < $1),
	EXISTS (SELECT 1 FROM {s}.jobs WHERE state = {dlq} AND dlq_due <= $1)`

// reapDue looks, in one round trip, for what the reaper's two
// transactions would find. Mostly there is nothing: an idle broker's
// reaper took its database six round trips four times a second, and
// takes one now. Its scans walk their index in order (sendPlanned).
func (p *PG) reapDue(ctx context.Context) (leases, dlq bool, err error) {
	br, err := sendPlanned(ctx, p.pool, p.sql(pgReapDueSQL), p.now())
	if err != nil {
		return false, false, err
	}
	err = br.QueryRow().Scan(&leases, &dlq)
	return leases, dlq, errors.Join(err, br.Close())
}

// pgReapSQL locks the active rows whose lease ran out, oldest first, a
// batch at a time; a row another reaper holds is left to it.
const pgReapSQL = `SELECT ` + pgJobCols + ` FROM {s}.jobs WHERE state = {active} AND lease_expires < $1
		ORDER BY lease_expires LIMIT 500 FOR UPDATE SKIP LOCKED`

// reapLeases reclaims one batch of expired leases: it decides each job's
// fate, writes the rows, and once committed tells of what it did.
func (p *PG) reapLeases(ctx context.Context) error {
	r := &leaseReap{now: p.now(), fl: &pgFlowTx{}, queues: map[string]bool{}, dlqs: map[string]bool{}}
	err := p.txJobs(ctx, p.sql(pgReapSQL), []any{r.now}, func(tx pgx.Tx, jobs []*Job) error {
		leased, err := p.leaseRenewals(ctx, tx, jobs)
		if err != nil {
			return err
		}
		if r.set, err = p.settingsOf(ctx, tx, jobs); err != nil {
			return err
		}
		for _, j := range jobs {
			renewals, owned := leased[j.ID()]
			r.decide(j, renewals, owned)
		}
		return p.saveReaped(ctx, tx, r)
	})
	if err != nil {
		return err
	}
	p.b.stats.failed.Add(int64(r.failed))
	for _, e := range r.evs {
		p.emit(e.j.Queue, e.t, e.j, r.now, e.a)
	}
	for _, n := range r.notes {
		p.b.announce(n)
	}
	r.fl.after(p, r.now)
	return nil
}

// leaseReap is one pass of reapLeases: what it decided for the jobs it
// took, to be written in its transaction and told of after the commit.
type leaseReap struct {
	now int64
	set map[string]*pgSettings // the jobs' queues' settings
	fl  *pgFlowTx

	keep      []*Job          // rows saved as the jobs now are
	unwatched []*Job          // saved unchanged but for their deadline
	remove    []string        // rows deleted
	queues    map[string]bool // queues with jobs put back: woken
	dlqs      map[string]bool // queues with jobs dead-lettered: trimmed
	// gaveUp are the jobs failed for good, with their error: a child's
	// failure acts on its parent (pg_flows.go).
	gaveUp []reapedJob
	evs    []reapEvent
	notes  []*note // catalogue notices, after the events
	failed int
}

type reapedJob struct {
	j   *Job
	err string
}

type reapEvent struct {
	j *Job
	t evType
	a evArgs
}

func (r *leaseReap) event(j *Job, t evType, a evArgs) {
	r.evs = append(r.evs, reapEvent{j, t, a})
}

// decide settles one job whose lease ran out: renewals and owned are its
// lock's, when it holds one.
func (r *leaseReap) decide(j *Job, renewals int32, owned bool) {
	stall, dlq := r.set[j.Queue].stallConfig(), r.set[j.Queue].dlqConfig()
	timedOut := timedOut(j, r.now)
	if !owned && !stall.Enabled && !timedOut {
		// Stall detection was turned off since the claim.
		r.unwatched = append(r.unwatched, j)
		return
	}
	r.queues[j.Queue] = true
	switch {
	case timedOut:
		r.timedOut(j, dlq)
	case isCronJob(j):
		// A cron job is not run late: its next run comes anyway.
		r.remove = append(r.remove, j.ID())
	case owned:
		r.lockLapsed(j, stall, dlq, renewals)
	default:
		r.stalled(j, stall, dlq)
	}
	if timedOut || j.state == StateFailed {
		r.failed++
	}
	if j.state == StateFailed {
		r.dlqs[j.Queue] = true
	}
}

// timedOut fails a job past its timeout: a retry, or its end.
func (r *leaseReap) timedOut(j *Job, dlq DLQConfig) {
	f := timeoutFailure()
	if pgFailJob(j, f, dlq, r.now) {
		r.keep = append(r.keep, j)
	} else {
		r.remove = append(r.remove, j.ID())
	}
	r.event(j, evFailed, evArgs{err: f.err, hasErr: true, terminal: j.state != StateDelayed, hasTerminal: true})
	if j.state == StateDelayed {
		r.event(j, evRetried, evArgs{prev: "failed"})
	} else {
		r.gaveUp = append(r.gaveUp, reapedJob{j, f.err})
	}
	r.notes = append(r.notes, noticeQueueJob("job:timeout", j.Queue, j.ID()).int("timeout", j.cold().Timeout))
}

// lockLapsed puts back a job whose lock ran out, or dead-letters it past
// its renewals or stalls.
func (r *leaseReap) lockLapsed(j *Job, stall StallConfig, dlq DLQConfig, renewals int32) {
	if reason, msg, evMsg := lockLapsed(j, stall, renewals, r.now); reason != "" {
		pgDeadLetter(j, reason, msg, true, dlq, r.now)
		r.event(j, evStalled, evArgs{stallCount: j.cold().Stalls, action: "move_to_dlq"})
		r.event(j, evFailed, evArgs{err: evMsg, hasErr: true, noData: true})
		r.gaveUp = append(r.gaveUp, reapedJob{j, evMsg})
	} else {
		j.state = j.readyState()
		r.event(j, evStalled, evArgs{})
	}
	r.notes = append(r.notes, noticeLockExpired(j.Queue, j.ID(), renewals))
	r.keep = append(r.keep, j)
}

// stalled retries a job without a lock that stopped sending heartbeats,
// or dead-letters it past its stalls.
func (r *leaseReap) stalled(j *Job, stall StallConfig, dlq DLQConfig) {
	if reason, msg := stallLapsed(j, stall, r.now); reason != "" {
		pgDeadLetter(j, reason, msg, true, dlq, r.now)
		r.event(j, evStalled, evArgs{stallCount: j.cold().Stalls, action: "move_to_dlq"})
		r.gaveUp = append(r.gaveUp, reapedJob{j, msg})
	} else {
		pgEnqueue(j, r.now)
		r.event(j, evStalled, evArgs{stallCount: j.cold().Stalls, action: "retry"})
	}
	r.keep = append(r.keep, j)
}

// saveReaped writes what a pass decided, within its transaction: the
// rows, the DLQs' trims, the parents of the jobs that gave up, and the
// wake-ups.
func (p *PG) saveReaped(ctx context.Context, tx pgx.Tx, r *leaseReap) error {
	// saveJobs gives an unwatched job the deadline its queue's policy
	// gives now.
	if save := append(r.keep, r.unwatched...); len(save) > 0 {
		if err := p.saveJobs(ctx, tx, save, nil); err != nil {
			return err
		}
	}
	if len(r.remove) > 0 {
		if err := p.deleteIDs(ctx, tx, r.remove); err != nil {
			return err
		}
	}
	// In name order, so that two reapers take the trim locks in turn.
	for _, q := range slices.Sorted(maps.Keys(r.dlqs)) {
		if err := p.trimDLQ(ctx, tx, q, r.set[q].dlqConfig()); err != nil {
			return err
		}
	}
	for _, g := range r.gaveUp {
		if g.j.cold().ParentID != "" {
			if err := p.childFailed(ctx, tx, r.fl, g.j, g.err, r.now); err != nil {
				return err
			}
		}
	}
	for q := range r.queues {
		if err := p.notify(ctx, tx, q); err != nil {
			return err
		}
	}
	return nil
}
