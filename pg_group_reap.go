package main

// Forgetting group rows in PostgreSQL mode. A push makes a row for each
// group it names (its turn, its rate window); without this, every groupId
// ever pushed would keep its row for good. One broker at a time (the
// "groups" chore, taken as retention takes its own, pg_retain.go) walks
// the groups table in key order, in batches, and deletes the rows with
// nothing left: no job row in the group, whatever its state (a completed
// or failed job can come back, by RetryCompleted or RetryDlq, and finds
// its group's row), no setting, no hold or rate window still running
// (forgotten sooner, a job pushed to the group again would start afresh,
// past its limit). A pass reads each row once.
//
// A delete must not race a push that brings a group its first job: the
// push finds the row there and leaves it as it is, and its job would have
// no row (no claim could take it) if the row went meanwhile. Every push of
// grouped jobs locks its queue's row before it looks at the groups, until
// it commits (pgRegisterGroupedSQL), and every group command that sets
// something holds a key-share lock on it (groupRoom). The reaper deletes a
// queue's rows under that queue row's FOR UPDATE lock, in a statement that
// starts once it holds it: it sees every job and setting those committed,
// and none can start meanwhile. Other paths only move rows that exist
// between states, which the reaper sees in any state. Group rows of a
// queue without a queue row (group commands of older versions made them)
// are left alone: nothing to lock pushes out with.

import (
	"context"
	"fmt"
	"time"
)

const (
	// pgGroupsEvery is how often the namespace's group rows are walked
	// (by one broker).
	pgGroupsEvery = 30 * time.Second
	// pgGroupsBatch is how many group rows one statement looks at.
	pgGroupsBatch = 1000
)

// pgGroupIdle is the condition of a group row with nothing left at $3
// (the time): no setting, hold or running window, and no job row.
const pgGroupIdle = `(NOT g.paused AND g.conc_limit IS NULL AND g.rate_max IS NULL AND g.manual_until <= $3
	AND (g.win_count = 0 OR g.win_start + g.win_duration <= $3)
	AND NOT EXISTS (SELECT 1 FROM {s}.jobs WHERE queue = g.queue AND group_id = g.group_id AND state = {queued})
	AND NOT EXISTS (SELECT 1 FROM {s}.jobs WHERE queue = g.queue AND group_id = g.group_id AND state = {active})
	AND NOT EXISTS (SELECT 1 FROM {s}.jobs WHERE queue = g.queue AND group_id = g.group_id AND state IN ({done}, {dlq}, {children})))`

// reapGroupsOnce walks the group rows if the chore is this broker's, and
// answers how many went.
func (p *PG) reapGroupsOnce() (int, error) {
	ctx, cancel := context.WithTimeout(p.stopCtx, 10*time.Second)
	mine, err := p.takeChore(ctx, "groups", pgGroupsEvery)
	cancel()
	if err != nil || !mine {
		return 0, err
	}
	return p.reapGroups()
}

// reapGroups deletes every group row with nothing left, in batches, and
// answers how many went.
func (p *PG) reapGroups() (int, error) {
	removed := 0
	var afterQueue, afterGroup string
	for !p.closing() {
		found, n, lastQueue, lastGroup, err := p.reapGroupBatch(afterQueue, afterGroup)
		removed += n
		if err != nil {
			return removed, err
		}
		if found < pgGroupsBatch {
			break
		}
		afterQueue, afterGroup = lastQueue, lastGroup
		ctx, cancel := context.WithTimeout(p.stopCtx, 10*time.Second)
		err = p.holdChore(ctx, "groups", pgGroupsEvery)
		cancel()
		if err != nil {
			return removed, fmt.Errorf("hold chore groups: %w", err)
		}
	}
	if removed > 0 {
		p.log.Debug("group rows forgotten", "removed", removed)
	}
	return removed, nil
}

// reapGroupBatch reads the next pgGroupsBatch group rows after (queue,
// group) in key order (an index walk, whatever the planner knows of the
// table) and deletes those idle, still idle under their queue's lock. It
// answers how many it read, how many went, and the last read.
func (p *PG) reapGroupBatch(afterQueue, afterGroup string) (found, removed int, lastQueue, lastGroup string, err error) {
	ctx, cancel := context.WithTimeout(p.stopCtx, 10*time.Second)
	defer cancel()
	rows, err := p.pool.Query(ctx, p.sql(`SELECT g.queue, g.group_id, `+pgGroupIdle+` FROM {s}.groups AS g
		WHERE (g.queue, g.group_id) > ($1, $2) ORDER BY g.queue, g.group_id LIMIT $4`),
		afterQueue, afterGroup, p.now(), pgGroupsBatch)
	if err != nil {
		return 0, 0, "", "", fmt.Errorf("read groups: %w", err)
	}
	var order []string
	byQueue := map[string][]string{}
	for rows.Next() {
		var idle bool
		if err := rows.Scan(&lastQueue, &lastGroup, &idle); err != nil {
			rows.Close()
			return 0, 0, "", "", fmt.Errorf("read groups: %w", err)
		}
		found++
		if !idle {
			continue
		}
		if _, ok := byQueue[lastQueue]; !ok {
			order = append(order, lastQueue)
		}
		byQueue[lastQueue] = append(byQueue[lastQueue], lastGroup)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, "", "", fmt.Errorf("read groups: %w", err)
	}
	for _, q := range order {
		n, err := p.reapQueueGroups(ctx, q, byQueue[q])
		removed += n
		if err != nil {
			return found, removed, lastQueue, lastGroup, err
		}
	}
	return found, removed, lastQueue, lastGroup, nil
}

// reapQueueGroups deletes those of a queue's groups that are idle, under
// the queue row's lock.
func (p *PG) reapQueueGroups(ctx context.Context, queue string, groups []string) (int, error) {
	tx, err := p.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.Background())
	tag, err := tx.Exec(ctx, p.sql(`SELECT 1 FROM {s}.queues WHERE name = $1 FOR UPDATE`), queue)
	if err != nil {
		return 0, fmt.Errorf("lock queue %s: %w", queue, err)
	}
	if tag.RowsAffected() == 0 {
		return 0, nil
	}
	// A statement of its own, after the lock: its snapshot has what the
	// pushes and group commands that held the queue committed.
	tag, err = tx.Exec(ctx, p.sql(`DELETE FROM {s}.groups AS g WHERE g.queue = $1 AND g.group_id = ANY($2) AND `+pgGroupIdle),
		queue, groups, p.now())
	if err != nil {
		return 0, fmt.Errorf("delete idle groups of %s: %w", queue, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}
