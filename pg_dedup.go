package main

// Deduplication in PostgreSQL mode. A job row holds its unique key (the
// unique_key column, under a unique index over live jobs) until the job
// finishes, the key is removed, a replacing job takes it, or its dedup
// ttl (unique_expires) runs out. Pushes of a key take a transaction-scoped
// advisory lock on it first, so the brokers apply the policies (ttl,
// extend, replace) to one key one push after another; the unique index
// stays the last word.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// dedupExpiry is when a job's hold on its key lapses (nil: when it
// finishes).
func dedupExpiry(j *Job, now int64) *int64 {
	if j.cold().DedupTTL != none && j.cold().DedupTTL > 0 {
		return ptr(now + j.cold().DedupTTL)
	}
	return nil
}

// dedupPlan is what the dedup policies make of a batch.
type dedupPlan struct {
	dup     map[int]string // by index: not created, the holder's id answered
	dropped map[int]bool   // by index: replaced by a later job of the batch
	expires map[int]*int64 // by index: the key's expiry for a created job
	events  []string       // holders told of as duplicated
	extends []string       // holders whose hold a push extended
	upto    int            // jobs from here on are not taken (refused below)
	refused error
}

// dedupTx applies the jobs' dedup policies against the keys' holders, in
// the batch's order, within tx. A job whose custom id a live job holds is
// that job's duplicate before anything else, as in memory mode: its key
// is left alone.
func (p *PG) dedupTx(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job, now int64) (dedupPlan, error) {
	plan := dedupPlan{dup: map[int]string{}, dropped: map[int]bool{}, expires: map[int]*int64{}, upto: len(jobs)}
	keys, custom := plan.keysOf(jobs, now)
	if len(keys) == 0 {
		return plan, nil
	}
	live, err := p.liveCustomIDs(ctx, tx, custom)
	if err != nil {
		return plan, err
	}
	if err := p.lockUniqueKeys(ctx, tx, queue, keys, now); err != nil {
		return plan, err
	}
	held, err := p.uniqueKeyHolders(ctx, tx, queue, keys)
	if err != nil {
		return plan, err
	}
	w := plan.apply(jobs, live, held, now)
	return plan, p.writeDedup(ctx, tx, w)
}

// keysOf answers the batch's unique keys and the custom ids of the jobs
// with one, and sets each such job's key expiry.
func (plan *dedupPlan) keysOf(jobs []*Job, now int64) (keys, custom []string) {
	for i, j := range jobs {
		if j.cold().UniqueKey != "" {
			keys = append(keys, j.cold().UniqueKey)
			plan.expires[i] = dedupExpiry(j, now)
			if j.cold().CustomID != "" {
				custom = append(custom, j.cold().CustomID)
			}
		}
	}
	return keys, custom
}

// liveCustomIDs answers which of the custom ids a job row holds.
func (p *PG) liveCustomIDs(ctx context.Context, tx pgx.Tx, custom []string) (map[string]bool, error) {
	live := map[string]bool{}
	if len(custom) == 0 {
		return live, nil
	}
	rows, err := tx.Query(ctx, p.sql(`SELECT id FROM {s}.jobs WHERE id = ANY($1)`), custom)
	if err != nil {
		return nil, fmt.Errorf("find live custom ids: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("find live custom ids: %w", err)
	}
	for _, id := range ids {
		live[id] = true
	}
	return live, nil
}

// lockUniqueKeys makes tx the one push of the keys at a time across the
// brokers, then releases the keys whose ttl ran out. Locks are taken in
// hash order so that two batches never wait on each other.
func (p *PG) lockUniqueKeys(ctx context.Context, tx pgx.Tx, queue string, keys []string, now int64) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(h) FROM (SELECT DISTINCT hashtextextended($1 || chr(1) || $2 || chr(1) || k, 0) AS h
		FROM unnest($3::text[]) AS k ORDER BY 1) AS s`, p.schema, queue, keys); err != nil {
		return fmt.Errorf("lock unique keys: %w", err)
	}
	if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET unique_key = NULL, unique_expires = NULL
		WHERE queue = $1 AND unique_key = ANY($2) AND state IN ({queued}, {active}, {children}) AND unique_expires <= $3`), queue, keys, now); err != nil {
		return fmt.Errorf("release lapsed unique keys: %w", err)
	}
	return nil
}

// keyHolder is the job that holds a unique key: a row, or a job of the
// batch that takes the key.
type keyHolder struct {
	id         string
	state      State
	idx        int  // in the batch, or -1: a row
	dependents bool // live jobs wait for it (pg_flows.go)
}

// uniqueKeyHolders locks and answers, by key, the rows that hold keys.
func (p *PG) uniqueKeyHolders(ctx context.Context, tx pgx.Tx, queue string, keys []string) (map[string]*keyHolder, error) {
	rows, err := tx.Query(ctx, p.sql(`SELECT unique_key, id, state,
			waited AND EXISTS (SELECT 1 FROM {s}.deps WHERE dep_id = jobs.id)
		FROM {s}.jobs WHERE queue = $1 AND unique_key = ANY($2) AND state IN ({queued}, {active}, {children}) FOR UPDATE`), queue, keys)
	if err != nil {
		return nil, fmt.Errorf("find unique key holders: %w", err)
	}
	held := map[string]*keyHolder{}
	for rows.Next() {
		var k, id string
		var st int16
		var deps bool
		if err := rows.Scan(&k, &id, &st, &deps); err != nil {
			rows.Close()
			return nil, err
		}
		held[k] = &keyHolder{id: id, state: pgRowState(st), idx: -1, dependents: deps}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("find unique key holders: %w", err)
	}
	return held, nil
}

// dedupWrites are the changes to holders' rows the policies made.
type dedupWrites struct {
	remove  []string         // replaced holders removed
	release []string         // replaced holders that keep their row, not their key
	extend  map[string]int64 // by holder: its key's new expiry
}

// apply runs the jobs' policies, in the batch's order, against the keys'
// holders (held, which the jobs that take a key join), and answers what
// is to be written to the holders' rows. A refusal ends the batch there.
func (plan *dedupPlan) apply(jobs []*Job, live map[string]bool, held map[string]*keyHolder, now int64) dedupWrites {
	w := dedupWrites{extend: map[string]int64{}}
	for i, j := range jobs {
		if j.cold().UniqueKey == "" || live[j.cold().CustomID] {
			continue
		}
		h := held[j.cold().UniqueKey]
		if h == nil {
			held[j.cold().UniqueKey] = &keyHolder{id: j.ID(), state: StateWaiting, idx: i}
			continue
		}
		act, removeHolder, refused := dedupPolicy(j, h.state)
		switch act {
		case dedupReplace:
			switch {
			case h.idx >= 0:
				plan.dropped[h.idx] = true
			case removeHolder && h.dependents:
				// As in memory mode: the jobs waiting on it would be left
				// waiting for a job that is gone.
				plan.upto = i
				plan.refused = errDependedOn(h.id)
				return w
			case removeHolder:
				w.remove = append(w.remove, h.id)
			default:
				w.release = append(w.release, h.id)
			}
			held[j.cold().UniqueKey] = &keyHolder{id: j.ID(), state: StateWaiting, idx: i}
			continue
		case dedupExtend:
			exp := now + j.cold().DedupTTL
			if h.idx >= 0 {
				plan.expires[h.idx] = &exp
			} else {
				w.extend[h.id] = exp
			}
			plan.extends = append(plan.extends, h.id)
			if refused != nil {
				plan.upto, plan.refused = i, refused
				return w
			}
		default:
			plan.events = append(plan.events, h.id)
		}
		plan.dup[i] = h.id
	}
	return w
}

// writeDedup writes the policies' changes to the holders' rows.
func (p *PG) writeDedup(ctx context.Context, tx pgx.Tx, w dedupWrites) error {
	if len(w.remove) > 0 {
		if _, err := tx.Exec(ctx, p.sql(`WITH gone AS (DELETE FROM {s}.jobs WHERE id = ANY($1) RETURNING id)
			DELETE FROM {s}.job_logs WHERE job_id IN (SELECT id FROM gone)`), w.remove); err != nil {
			return fmt.Errorf("remove replaced jobs: %w", err)
		}
	}
	if len(w.release) > 0 {
		if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET unique_key = NULL, unique_expires = NULL WHERE id = ANY($1)`), w.release); err != nil {
			return fmt.Errorf("hand over unique keys: %w", err)
		}
	}
	if len(w.extend) > 0 {
		ids := make([]string, 0, len(w.extend))
		exps := make([]int64, 0, len(w.extend))
		for id, e := range w.extend {
			ids, exps = append(ids, id), append(exps, e)
		}
		if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs AS j SET unique_expires = u.exp
			FROM unnest($1::text[], $2::bigint[]) AS u(id, exp) WHERE j.id = u.id`), ids, exps); err != nil {
			return fmt.Errorf("extend unique keys: %w", err)
		}
	}
	return nil
}

// pgRowState is the state a live row's state column stands for, as far as
// the dedup policies tell them apart.
func pgRowState(st int16) State {
	switch st {
	case pgActive:
		return StateActive
	case pgChildren:
		return StateWaitingChildren
	}
	return StateWaiting
}

// heldSQL is the condition of a row that holds its key, with now as
// parameter n.
func heldSQL(n string) string {
	return `state IN ({queued}, {active}, {children}) AND (unique_expires IS NULL OR unique_expires > ` + n + `)`
}

// ---------------------------------------------------------------------------
// The PostgreSQL engine's dedup key operations (DedupEngine), as dedup.go
// answers them in memory.

func (p *PG) DedupJobID(ctx context.Context, queue, key string) (string, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var id string
	err := p.pool.QueryRow(ctx, p.sql(`SELECT COALESCE((SELECT id FROM {s}.jobs WHERE queue = $1 AND unique_key = $2 AND `+heldSQL("$3")+`), '')`),
		queue, key, p.now()).Scan(&id)
	if err != nil {
		return "", pgErr(fmt.Errorf("find the holder of %q: %w", key, err))
	}
	return id, nil
}

func (p *PG) RemoveDedupKey(ctx context.Context, queue, key string) (bool, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	tag, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.jobs SET unique_key = NULL, unique_expires = NULL
		WHERE queue = $1 AND unique_key = $2 AND `+heldSQL("$3")), queue, key, p.now())
	if err != nil {
		return false, pgErr(fmt.Errorf("remove unique key %q: %w", key, err))
	}
	return tag.RowsAffected() > 0, nil
}

func (p *PG) RemoveJobDedupKey(ctx context.Context, id string) (bool, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	tag, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.jobs SET unique_key = NULL, unique_expires = NULL
		WHERE id = $1 AND unique_key IS NOT NULL AND `+heldSQL("$2")), id, p.now())
	if err != nil {
		return false, pgErr(fmt.Errorf("remove the unique key of %s: %w", id, err))
	}
	return tag.RowsAffected() > 0, nil
}
