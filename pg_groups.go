package main

// Job groups in PostgreSQL mode. Each group of a queue has a row: paused,
// held back by RateLimitGroup, its concurrency and rate overrides, the
// rate window of pulls that ask for a limit, and its turn (served: groups
// least recently served go first, which makes the round-robin of memory
// mode). A claim on a queue with groups locks the rows of the groups it
// may take from, so each group's limits are counted by one claim at a
// time whichever broker makes it; its active jobs are counted from the
// job rows. Queues that never had a grouped job keep the plain claim: the
// queue row, already read for its limits, says so.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
)

const pgGroupCols = `group_id, paused, manual_until, conc_limit, rate_max, rate_duration, win_start, win_count, win_max, win_duration`

// scanGroup rebuilds a group from its row, so that the memory engine's
// rules (eligible, took, rateTTL) decide for it.
func scanGroup(row pgx.Row) (*Group, error) {
	g := &Group{}
	var conc, rmax, rdur *int64
	err := row.Scan(&g.id, &g.paused, &g.manualUntil, &conc, &rmax, &rdur,
		&g.window.start, &g.window.count, &g.window.max, &g.window.duration)
	if err != nil {
		return nil, err
	}
	g.concOverride = deref(conc)
	if rmax != nil && rdur != nil {
		g.rateOverride = &groupLimit{max: *rmax, duration: *rdur}
	}
	return g, nil
}

// groupsTx makes the rows of the batch's groups (a new group takes its
// turn after those already there) and checks the groups' maxSize with
// their rows locked, so that pushes through several brokers cannot
// overfill a group between them. The batch is refused whole, as in
// memory mode.
func (p *PG) groupsTx(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job) error {
	var groups, capped []string
	for _, j := range jobs {
		if j.cold().GroupID == "" {
			continue
		}
		groups = append(groups, j.cold().GroupID)
		if j.cold().groupMax > 0 {
			capped = append(capped, j.cold().GroupID)
		}
	}
	if len(groups) == 0 {
		return nil
	}
	slices.Sort(groups)
	groups = slices.Compact(groups)
	if _, err := tx.Exec(ctx, p.sql(`INSERT INTO {s}.groups (queue, group_id, served)
		SELECT $1, g, nextval('{s}.group_turns') FROM unnest($2::text[]) AS g ORDER BY g ON CONFLICT DO NOTHING`), queue, groups); err != nil {
		return fmt.Errorf("register groups: %w", err)
	}
	if len(capped) == 0 {
		return nil
	}
	slices.Sort(capped)
	capped = slices.Compact(capped)
	if _, err := tx.Exec(ctx, p.sql(`SELECT 1 FROM {s}.groups WHERE queue = $1 AND group_id = ANY($2) ORDER BY group_id FOR UPDATE`),
		queue, capped); err != nil {
		return fmt.Errorf("lock groups: %w", err)
	}
	rows, err := tx.Query(ctx, p.sql(`SELECT group_id, count(*) FROM {s}.jobs WHERE queue = $1 AND state = {queued} AND group_id = ANY($2)
		GROUP BY group_id`), queue, capped)
	if err != nil {
		return fmt.Errorf("count group jobs: %w", err)
	}
	queued := map[string]int{}
	for rows.Next() {
		var g string
		var n int
		if err := rows.Scan(&g, &n); err != nil {
			rows.Close()
			return err
		}
		queued[g] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("count group jobs: %w", err)
	}
	if err := groupRoom(jobs, func(g string) int { return queued[g] }); err != nil {
		return pgRefused{err}
	}
	return nil
}

// pgReadyGroups selects the groups of queue $1 that are not paused and
// have jobs ready at $2 ($3: that group only, or any), least recently
// served first. The groups with queued jobs are found by skipping along
// the group index of the job rows, so the cost follows the groups that
// have work, not every group the queue ever had.
const pgReadyGroups = `WITH RECURSIVE queued AS (
		(SELECT group_id FROM {s}.jobs WHERE queue = $1 AND state = {queued} AND group_id IS NOT NULL ORDER BY group_id LIMIT 1)
		UNION ALL
		SELECT (SELECT j.group_id FROM {s}.jobs AS j WHERE j.queue = $1 AND j.state = {queued} AND j.group_id > q.group_id
			ORDER BY j.group_id LIMIT 1)
		FROM queued AS q WHERE q.group_id IS NOT NULL)
	SELECT ` + pgGroupCols + ` FROM {s}.groups AS g
	WHERE g.queue = $1 AND g.group_id IN (SELECT group_id FROM queued) AND NOT g.paused AND ($3 = '' OR g.group_id = $3)
		AND EXISTS (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND group_id = g.group_id AND state = {queued} AND run_at <= $2)
	ORDER BY g.served, g.created`

// pgGroupWait bounds how long a pull held back by group limits sleeps
// before it looks again (a slot frees with an ACK through any broker).
const pgGroupWait = 50

// claimGrouped takes up to n ready jobs of a queue that has groups:
// ungrouped jobs first, then the groups in turn (least recently served
// first), one job a group a round, within each group's limits. Jobs come
// back locked, in the order they are handed out. With none, wait says
// when to look again (0: when woken).
func (p *PG) claimGrouped(ctx context.Context, tx pgx.Tx, queue string, n int, o *groupPull, now int64) ([]*Job, int64, error) {
	only := ""
	var jobs []*Job
	switch {
	case o != nil && o.affinitySet && o.affinity == nil:
		jobs, err := p.claimUngrouped(ctx, tx, queue, n, now)
		return jobs, 0, err
	case o != nil && o.affinitySet:
		only = *o.affinity
	default:
		var err error
		if jobs, err = p.claimUngrouped(ctx, tx, queue, n, now); err != nil || len(jobs) == n {
			return jobs, 0, err
		}
	}
	left := n - len(jobs)
	groups, err := p.lockReadyGroups(ctx, tx, queue, now, only, left)
	if err != nil {
		return nil, 0, err
	}
	if len(groups) == 0 {
		if len(jobs) > 0 {
			return jobs, 0, nil
		}
		return p.groupsBusy(ctx, tx, queue, now, only)
	}
	ids, ready, err := p.countGroupJobs(ctx, tx, queue, now, left, groups)
	if err != nil {
		return nil, 0, err
	}
	take, turns := groupRounds(groups, ready, left, o, now)
	if len(turns) == 0 {
		if len(jobs) > 0 {
			return jobs, 0, nil
		}
		wait := int64(pgGroupWait)
		for _, g := range groups {
			wait = min(wait, g.windowWait(now))
		}
		return nil, now + wait, nil
	}
	byGroup, err := p.lockGroupJobs(ctx, tx, queue, now, ids, take)
	if err != nil {
		return nil, 0, err
	}
	jobs, last := handOutGroupJobs(jobs, byGroup, turns)
	return jobs, 0, p.saveGroupTurns(ctx, tx, queue, groups, last)
}

// lockReadyGroups locks the rows of the groups with jobs ready, least
// recently served first, as many as left jobs may come from. Locked with
// SKIP LOCKED: a group another claim is taking from is passed over, never
// waited for.
func (p *PG) lockReadyGroups(ctx context.Context, tx pgx.Tx, queue string, now int64, only string, left int) ([]*Group, error) {
	rows, err := tx.Query(ctx, p.sql(pgReadyGroups+` LIMIT $4 FOR UPDATE OF g SKIP LOCKED`), queue, now, only, 4*left+16)
	if err != nil {
		return nil, fmt.Errorf("claim groups: %w", err)
	}
	var groups []*Group
	for rows.Next() {
		g, err := scanGroup(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("claim groups: %w", err)
		}
		groups = append(groups, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim groups: %w", err)
	}
	return groups, nil
}

// groupsBusy answers a claim that found no group to lock. Ready groups
// all being claimed through other brokers: look again soon rather than
// wait for a push.
func (p *PG) groupsBusy(ctx context.Context, tx pgx.Tx, queue string, now int64, only string) ([]*Job, int64, error) {
	var busy bool
	if err := tx.QueryRow(ctx, p.sql(`SELECT EXISTS (`+pgReadyGroups+` LIMIT 1)`), queue, now, only).Scan(&busy); err != nil || !busy {
		return nil, 0, err
	}
	return nil, now + pgGroupWait, nil
}

// countGroupJobs counts, by locked group, its active jobs (into the
// group) and its ready ones up to left (ready). Counted after the rows are
// locked: no claim on these groups can commit meanwhile.
func (p *PG) countGroupJobs(ctx context.Context, tx pgx.Tx, queue string, now int64, left int, groups []*Group) (ids []string, ready []int, err error) {
	ids = make([]string, len(groups))
	for i, g := range groups {
		ids[i] = g.id
	}
	ready = make([]int, len(groups))
	rows, err := tx.Query(ctx, p.sql(`SELECT
			(SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND group_id = u.g AND state = {active}),
			(SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = $1 AND group_id = u.g AND state = {queued} AND run_at <= $2 LIMIT $3) AS r)
		FROM unnest($4::text[]) WITH ORDINALITY AS u(g, ord) ORDER BY u.ord`), queue, now, left, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("count group jobs: %w", err)
	}
	for i := 0; rows.Next(); i++ {
		var active int
		if err := rows.Scan(&active, &ready[i]); err != nil {
			rows.Close()
			return nil, nil, err
		}
		groups[i].active = active
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("count group jobs: %w", err)
	}
	return ids, ready, nil
}

// groupRounds deals up to left jobs out of the groups in rounds, one job a
// group a round, as memory mode's ring gives them, within each group's
// limits (which it charges). take is how many each group gives, turns the
// group index of each job handed out, in order.
func groupRounds(groups []*Group, ready []int, left int, o *groupPull, now int64) (take, turns []int) {
	take = make([]int, len(groups))
	for len(turns) < left {
		progressed := false
		for i, g := range groups {
			if len(turns) == left {
				break
			}
			if ready[i] == 0 || !g.eligible(o, now) {
				continue
			}
			g.took(o, now)
			ready[i]--
			take[i]++
			turns = append(turns, i)
			progressed = true
		}
		if !progressed {
			break
		}
	}
	return take, turns
}

// lockGroupJobs locks the jobs the rounds dealt, take[i] of group ids[i],
// first by priority then by age, and answers them by group.
func (p *PG) lockGroupJobs(ctx context.Context, tx pgx.Tx, queue string, now int64, ids []string, take []int) ([][]*Job, error) {
	rows, err := tx.Query(ctx, p.sql(`SELECT x.id, x.body, x.state, x.started_at, x.done_at, x.data, u.ord FROM unnest($2::text[], $3::int[]) WITH ORDINALITY AS u(g, k, ord)
		CROSS JOIN LATERAL (SELECT `+pgJobCols+` FROM {s}.jobs WHERE queue = $1 AND group_id = u.g AND state = {queued} AND run_at <= $4
			ORDER BY priority, seq LIMIT u.k FOR UPDATE SKIP LOCKED) AS x`), queue, ids, take, now)
	if err != nil {
		return nil, fmt.Errorf("claim group jobs: %w", err)
	}
	byGroup := make([][]*Job, len(ids))
	var last recLast
	for rows.Next() {
		var r pgRow
		var ord int
		if err := rows.Scan(append(r.dest(), &ord)...); err != nil {
			rows.Close()
			return nil, err
		}
		j, err := r.job(&last)
		if err != nil {
			rows.Close()
			return nil, err
		}
		byGroup[ord-1] = append(byGroup[ord-1], j)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim group jobs: %w", err)
	}
	return byGroup, nil
}

// handOutGroupJobs appends the locked jobs to jobs in round order. A
// group's turn is the place of its last job (last; -1: none), so the
// group served last goes to the back.
func handOutGroupJobs(jobs []*Job, byGroup [][]*Job, turns []int) ([]*Job, []int) {
	last := make([]int, len(byGroup))
	for i := range last {
		last[i] = -1
	}
	for t, i := range turns {
		if len(byGroup[i]) == 0 {
			continue // taken meanwhile by something other than a claim
		}
		jobs = append(jobs, byGroup[i][0])
		byGroup[i] = byGroup[i][1:]
		last[i] = t
	}
	return jobs, last
}

// saveGroupTurns writes back the groups a claim took from: their rate
// windows, and turns in the order of their last job (last: its place, -1
// for a group nothing was taken from).
func (p *PG) saveGroupTurns(ctx context.Context, tx pgx.Tx, queue string, groups []*Group, last []int) error {
	var order []int
	for i := range groups {
		if last[i] >= 0 {
			order = append(order, i)
		}
	}
	if len(order) == 0 {
		return nil
	}
	slices.SortFunc(order, func(a, b int) int { return last[a] - last[b] })
	n := len(order)
	ids := make([]string, n)
	ws, wc, wm, wd := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for k, i := range order {
		g := groups[i]
		ids[k] = g.id
		ws[k], wc[k], wm[k], wd[k] = g.window.start, g.window.count, g.window.max, g.window.duration
	}
	_, err := tx.Exec(ctx, p.sql(`WITH t AS (SELECT nextval('{s}.group_turns') AS turn, o FROM generate_series(1, $7) AS o)
		UPDATE {s}.groups AS g SET served = t.turn, win_start = u.ws, win_count = u.wc, win_max = u.wm, win_duration = u.wd
		FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[]) WITH ORDINALITY AS u(id, ws, wc, wm, wd, o)
		JOIN t ON t.o = u.o
		WHERE g.queue = $1 AND g.group_id = u.id`), queue, ids, ws, wc, wm, wd, n)
	if err != nil {
		return fmt.Errorf("save group turns: %w", err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// The PostgreSQL engine's group operations (GroupEngine), as groups.go
// answers them in memory.

// readGroup reads a group's row; nil when it has none.
func (p *PG) readGroup(ctx context.Context, queue, group string) (*Group, error) {
	g, err := scanGroup(p.pool.QueryRow(ctx, p.sql(`SELECT `+pgGroupCols+` FROM {s}.groups WHERE queue = $1 AND group_id = $2`),
		queue, group))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, pgErr(fmt.Errorf("read group %s of %s: %w", group, queue, err))
	}
	return g, nil
}

// groupRead runs fn on a group read from its row (nil: it has none), at
// the database's now.
func (p *PG) groupRead(ctx context.Context, queue, group string, fn func(g *Group, now int64)) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	g, err := p.readGroup(ctx, queue, group)
	if err != nil {
		return err
	}
	fn(g, p.now())
	return nil
}

// updateGroup sets a group's columns where cond holds ($1 queue, $2
// group, then args), making its row first when create is set, and wakes
// the queue's pulls on every broker. It says whether the row changed.
func (p *PG) updateGroup(ctx context.Context, queue, group string, create bool, set, cond string, args ...any) (bool, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var changed bool
	err := p.inTx(ctx, func(tx pgx.Tx) error {
		if create {
			if err := p.groupRoom(ctx, tx, queue, group); err != nil {
				return pgRefusedOr(err)
			}
			if _, err := tx.Exec(ctx, p.sql(`INSERT INTO {s}.groups (queue, group_id, served) VALUES ($1, $2, nextval('{s}.group_turns'))
				ON CONFLICT DO NOTHING`), queue, group); err != nil {
				return pgErr(fmt.Errorf("register group %s: %w", group, err))
			}
		}
		tag, err := tx.Exec(ctx, p.sql(`UPDATE {s}.groups SET `+set+` WHERE queue = $1 AND group_id = $2 AND (`+cond+`)`),
			append([]any{queue, group}, args...)...)
		if err != nil {
			return pgErr(fmt.Errorf("update group %s of %s: %w", group, queue, err))
		}
		if changed = tag.RowsAffected() > 0; changed {
			return pgErr(p.notify(ctx, tx, queue))
		}
		return nil
	})
	return changed, err
}

// pgGroupHasSettings is the condition of a group row with settings, as
// Group.hasSettings ($2: now); pgGroupSettingsIndexed is the predicate of
// the index that finds them (groups_settings), which a count must repeat
// for the index to serve it.
const (
	pgGroupHasSettings     = `(paused OR conc_limit IS NOT NULL OR rate_max IS NOT NULL OR manual_until > $2)`
	pgGroupSettingsIndexed = `(paused OR conc_limit IS NOT NULL OR rate_max IS NOT NULL OR manual_until > 0)`
)

// groupRoom readies a command that sets something on a group: the queue
// row made if missing (as memory mode makes the queue, within
// --max-queues) and held with a key-share lock until the command commits,
// which keeps the group reaper off the group meanwhile (pg_group_reap.go);
// and, for a group without settings yet, room for one more in the queue
// (maxGroupSettings). Commands on one queue racing through several
// brokers may pass the limit by as many as run at that instant.
func (p *PG) groupRoom(ctx context.Context, tx pgx.Tx, queue, group string) error {
	if err := p.registerQueue(ctx, tx, queue, false); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, p.sql(`SELECT 1 FROM {s}.queues WHERE name = $1 FOR KEY SHARE`), queue); err != nil {
		return fmt.Errorf("lock queue %s: %w", queue, err)
	}
	now := p.now()
	var has bool
	err := tx.QueryRow(ctx, p.sql(`SELECT `+pgGroupHasSettings+` FROM {s}.groups WHERE queue = $1 AND group_id = $3`),
		queue, now, group).Scan(&has)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read group %s of %s: %w", group, queue, err)
	}
	if has {
		return nil
	}
	var n int
	err = tx.QueryRow(ctx, p.sql(`SELECT count(*) FROM {s}.groups WHERE queue = $1 AND `+pgGroupSettingsIndexed+` AND `+pgGroupHasSettings),
		queue, now).Scan(&n)
	if err != nil {
		return fmt.Errorf("count the groups of %s: %w", queue, err)
	}
	if n >= maxGroupSettings {
		return pgRefused{errTooManyGroupSettings}
	}
	return nil
}

// pgGroupJobsSQL counts queue $1's jobs in a state, of group $2 or of all
// groups when $2 is "". The state is written into the statement, not a
// parameter: a generic plan could not match the state's partial index
// (jobs_group_claim, jobs_group_active) and would scan the table.
func pgGroupJobsSQL(state int16) string {
	return `SELECT count(*) FROM {s}.jobs WHERE queue = $1 AND state = ` + strconv.Itoa(int(state)) + `
		AND group_id IS NOT NULL AND ($2 = '' OR group_id = $2)`
}

// groupJobs counts a queue's jobs in a state: of one group, or of all
// groups when group is "".
func (p *PG) groupJobs(ctx context.Context, queue, group string, state int16) (int64, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var n int64
	err := p.pool.QueryRow(ctx, p.sql(pgGroupJobsSQL(state)), queue, group).Scan(&n)
	if err != nil {
		return 0, pgErr(fmt.Errorf("count group jobs: %w", err))
	}
	return n, nil
}

func (p *PG) GroupJobsCount(ctx context.Context, queue, group string) (int64, error) {
	return p.groupJobs(ctx, queue, group, pgQueued)
}

func (p *PG) GroupsJobsCount(ctx context.Context, queue string) (int64, error) {
	return p.groupJobs(ctx, queue, "", pgQueued)
}

func (p *PG) GroupActiveCount(ctx context.Context, queue, group string) (int64, error) {
	return p.groupJobs(ctx, queue, group, pgActive)
}

func (p *PG) SetGroupRateLimit(ctx context.Context, queue, group string, l groupLimit) error {
	_, err := p.updateGroup(ctx, queue, group, true,
		`rate_max = $3, rate_duration = $4, win_start = 0, win_count = 0, win_max = 0, win_duration = 0`, `true`, l.max, l.duration)
	return err
}

func (p *PG) GroupRateLimit(ctx context.Context, queue, group string) (*groupLimit, error) {
	var l *groupLimit
	err := p.groupRead(ctx, queue, group, func(g *Group, now int64) {
		if g != nil {
			l = g.rateOverride
		}
	})
	return l, err
}

func (p *PG) RemoveGroupRateLimit(ctx context.Context, queue, group string) (bool, error) {
	return p.updateGroup(ctx, queue, group, false,
		`rate_max = NULL, rate_duration = NULL, win_start = 0, win_count = 0, win_max = 0, win_duration = 0`, `rate_max IS NOT NULL`)
}

func (p *PG) GroupRateLimitTTL(ctx context.Context, queue, group string, maxJobs float64, hasMax bool) (int64, error) {
	ttl := int64(-2)
	err := p.groupRead(ctx, queue, group, func(g *Group, now int64) {
		if g != nil {
			ttl = g.rateTTL(now, maxJobs, hasMax)
		}
	})
	return ttl, err
}

func (p *PG) SetGroupConcurrency(ctx context.Context, queue, group string, c int64) error {
	_, err := p.updateGroup(ctx, queue, group, true, `conc_limit = $3`, `true`, c)
	return err
}

func (p *PG) GroupConcurrency(ctx context.Context, queue, group string) (int64, error) {
	var c int64
	err := p.groupRead(ctx, queue, group, func(g *Group, now int64) {
		if g != nil {
			c = g.concOverride
		}
	})
	return c, err
}

func (p *PG) RemoveGroupConcurrency(ctx context.Context, queue, group string) (bool, error) {
	return p.updateGroup(ctx, queue, group, false, `conc_limit = NULL`, `conc_limit IS NOT NULL`)
}

func (p *PG) SetGroupPaused(ctx context.Context, queue, group string, paused bool) (bool, error) {
	if paused {
		return p.updateGroup(ctx, queue, group, true, `paused = true`, `NOT paused`)
	}
	return p.updateGroup(ctx, queue, group, false, `paused = false`, `paused`)
}

func (p *PG) IsGroupPaused(ctx context.Context, queue, group string) (bool, error) {
	paused := false
	err := p.groupRead(ctx, queue, group, func(g *Group, now int64) { paused = g != nil && g.paused })
	return paused, err
}

// RateLimitGroup: unlike the reference's, the hold is on the group's row,
// so every broker keeps to it.
func (p *PG) RateLimitGroup(ctx context.Context, queue, group string, d int64) error {
	_, err := p.updateGroup(ctx, queue, group, true, `manual_until = $3`, `true`, min(p.now()+d, math.MaxInt64/2))
	return err
}
