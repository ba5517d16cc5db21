package main

// The jobs table's statistics kept up with its size. The engine's
// sessions plan each statement once (plan_cache_mode =
// force_generic_plan, postgres.go), on the statistics of that moment, and
// keep the plan until the table's statistics change. A namespace starts
// with an empty table: planned then, the writes that take their rows from
// arrays (a claim's leases, an ACK) join them to the jobs with a hash over
// a scan of the whole table, which the planner thinks is empty, and kept
// doing so as the table grew. With autovacuum off (as on the machine the
// figures of docs/performance.md come from) nothing ever planned them
// again: at 1,000 jobs a second each claim's UPDATE read every row, 1.7 ms
// a call after 10 seconds, and the database saturated. With autovacuum on,
// its ANALYZE comes within a minute or so.
//
// So one broker of the namespace (the chore's) looks every pgRetainEvery
// at the table's size against what its statistics say, and runs ANALYZE
// when the table has no statistics and is no longer tiny, or has grown or
// shrunk twofold since: a few ANALYZEs over a table's growth, none while
// its size holds. Its new statistics make every session plan again.
// While the table is young (under pgYoungPages) and the broker pushes, it
// looks as often as every pgYoungLook instead: those plans scan the table
// until it has some 80 pages, and at 3,000 jobs a second a new namespace's
// table went from 8 to 600 pages before the first look at 2 s, its claims
// and ACKs each scanning all of it meanwhile; the backlog this left took
// three more seconds to drain (p99 200-360 ms where a warm table gave
// 17 ms).
//
// It analyzes the id column only. That records the table's size, which
// is what these plans were missing, and costs little; a full ANALYZE took
// 355 ms on a table of 150,000 jobs (their bodies sampled), and its
// column statistics, taken mid-load, made other plans worse: with every
// sampled job ready, the look for the next delayed job went from 1 to 37
// ms a call, and a bulk drain ran at 11,000 jobs/s instead of 17,000.

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// pgAnalyzePages is the size, in pages, from which a table without
// statistics is analyzed: below it the planner's guess for an unknown
// table (ten pages) is near enough.
const pgAnalyzePages = 8

// pgStaleStats reports whether a table of pages pages whose statistics say
// relpages (and reltuples, negative when it was never analyzed) should be
// analyzed again.
func pgStaleStats(pages, relpages int64, reltuples float64) bool {
	if reltuples < 0 {
		return pages >= pgAnalyzePages
	}
	return pages >= pgAnalyzePages && (pages > 2*relpages || 2*pages < relpages)
}

const (
	// pgYoungPages is the size, in pages, under which the table is young:
	// its statistics are looked at as often as every pgYoungLook while
	// this broker pushes (pgStatsWatch).
	pgYoungPages = 256
	pgYoungLook  = 200 * time.Millisecond
)

// pgStatsWatch brings the statistics chore's look forward while the
// table is young and this broker pushes: each committed push nudges it
// (pushed). An idle broker, or one whose table is not young, looks every
// pgRetainEvery only, as a small namespace would otherwise be looked at
// five times a second for ever.
type pgStatsWatch struct {
	young atomic.Bool
	kick  chan struct{} // made before the broker serves
}

// nudge asks for a look, if the table is young.
func (w *pgStatsWatch) nudge() {
	if w.young.Load() {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// analyzeRounds makes the statistics chore's round, run every
// pgRetainEvery and at each nudge: it looks when pgAnalyzeLookDue says
// so.
func (p *PG) analyzeRounds() func(context.Context) {
	pages, last := int64(0), time.Time{}
	return func(context.Context) {
		if !pgAnalyzeLookDue(pages, time.Since(last)) {
			return
		}
		last = time.Now()
		var err error
		if pages, err = p.analyzeOnce(); err != nil {
			// Looked at again in pgRetainEvery, so warned of at most as often.
			pages = pgYoungPages
			if !p.closing() {
				p.log.Warn("keeping the jobs table's statistics", "err", err)
			}
		}
		p.statsWatch.young.Store(pages < pgYoungPages)
	}
}

// pgAnalyzeLookDue reports whether the table, pages pages at the last
// look, since ago, is looked at again: after pgYoungLook while it is
// young (the round runs then at a nudge), after pgRetainEvery when not.
func pgAnalyzeLookDue(pages int64, since time.Duration) bool {
	return (pages < pgYoungPages && since >= pgYoungLook) || since >= pgRetainEvery
}

// analyzeOnce analyzes the jobs table if its statistics are stale and the
// chore is this broker's, and answers the table's size in pages.
func (p *PG) analyzeOnce() (int64, error) {
	ctx, cancel := context.WithTimeout(p.stopCtx, 30*time.Second)
	defer cancel()
	stale, pages, relpages, err := p.jobsStatsStale(ctx)
	if err != nil || !stale {
		return pages, err
	}
	hold := pgRetainEvery
	if pages < pgYoungPages {
		hold = pgYoungLook
	}
	mine, err := p.takeChore(ctx, "analyze", hold)
	if err != nil || !mine {
		return pages, err
	}
	if _, err := p.pool.Exec(ctx, p.sql(`ANALYZE {s}.jobs (id)`)); err != nil {
		return pages, fmt.Errorf("analyze the jobs table: %w", err)
	}
	if _, _, after, err := p.jobsStatsStale(ctx); err != nil || (after == relpages && relpages != pages) {
		// PostgreSQL skips, with a warning only, a table the role may
		// not analyze (not its owner): its statistics did not move, and
		// it is looked at again much later, not at every round.
		if err == nil {
			err = p.holdChore(ctx, "analyze", pgAnalyzeBackoff)
			p.log.Warn("the jobs table's statistics did not change after ANALYZE: is the brokers' role its owner?",
				"next_try", pgAnalyzeBackoff)
		}
		return pages, err
	}
	p.log.Debug("jobs table analyzed", "pages", pages, "had", relpages)
	return pages, nil
}

// pgAnalyzeBackoff is how long the chore waits after an ANALYZE that
// changed nothing.
const pgAnalyzeBackoff = 10 * time.Minute

// jobsStatsStale reads the jobs table's size and statistics.
func (p *PG) jobsStatsStale(ctx context.Context) (stale bool, pages, relpages int64, _ error) {
	var reltuples float64
	if err := p.pool.QueryRow(ctx, p.sql(`SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint,
		c.relpages, c.reltuples FROM pg_class c WHERE c.oid = '{s}.jobs'::regclass`)).Scan(&pages, &relpages, &reltuples); err != nil {
		return false, 0, 0, fmt.Errorf("read the jobs table's statistics: %w", err)
	}
	return pgStaleStats(pages, relpages, reltuples), pages, relpages, nil
}
