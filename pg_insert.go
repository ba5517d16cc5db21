package main

// Inserting jobs in PostgreSQL mode: what pushes (pg_lifecycle.go,
// pg_pushbuf.go), flows (pg_flows.go) and cron (pg_cron.go) share.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// inserted tells of what a committed insertJobs did.
func (p *PG) inserted(queue string, res pgInserted) {
	p.pushed(queue, res.made)
	now := p.now()
	for _, id := range res.dups {
		p.emit(queue, evDuplicated, withID(&Job{Queue: queue}, id), now, evArgs{})
		p.b.announce(noticeDeduplicated(queue, id, "default"))
	}
	for _, id := range res.extends {
		p.b.announce(noticeDeduplicated(queue, id, "extend"))
	}
}

// pushed counts and tells of jobs inserted by a committed transaction.
func (p *PG) pushed(queue string, made []*Job) {
	p.b.stats.pushed.Add(int64(len(made)))
	p.statsWatch.nudge()
	now := p.now()
	for _, j := range made {
		p.emit(queue, evPushed, j, now, evArgs{})
		if j.pending > 0 {
			p.b.announce(noticeWaitingChildren(queue, j))
		}
	}
}

// insertTx is insert within the caller's transaction; it answers the ids
// and the jobs it made (to be told of once the transaction commits). A
// refused job is an error here (a pgRefused): the caller rolls back.
func (p *PG) insertTx(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job) ([]string, []*Job, error) {
	res, err := p.insertJobs(ctx, tx, queue, jobs)
	if err == nil && res.refused != nil {
		err = pgRefused{res.refused}
	}
	if err != nil {
		return nil, nil, err
	}
	return res.ids, res.made, nil
}

// pgAdmit gives a job being pushed its first state.
func pgAdmit(j *Job, now int64) {
	switch {
	case j.pending > 0:
		j.state = StateWaitingChildren // waits for dependencies (pg_flows.go)
	default:
		j.state = j.queuedState(now)
	}
	j.addFirstEntry(now)
}

const (
	pgInsertSQL = `INSERT INTO {s}.jobs (id, queue, state, priority, sort_key, run_at, created_at, unique_key, unique_expires, group_id, body, plain, data)
		SELECT u.id, $1, u.state, u.prio, u.key, u.run_at, u.created, u.uk, u.uexp, NULLIF(u.grp, ''), u.rec, u.plain, u.dat
		FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::text[], $8::bytea[], $9::bigint[], $10::text[], $11::smallint[], $12::boolean[],
				$13::bytea[])
			WITH ORDINALITY AS u(id, prio, key, run_at, created, uk, rec, uexp, grp, state, plain, dat, ord)
		ORDER BY u.ord
		ON CONFLICT DO NOTHING RETURNING id`
)

// pgInsertBareSQL is pgInsertSQL for a queue pgRegisterBareSQL may have
// refused: nothing is inserted when the queue has no row.
var pgInsertBareSQL = strings.Replace(pgInsertSQL, "ORDER BY u.ord",
	"WHERE EXISTS (SELECT 1 FROM {s}.queues WHERE name = $1) ORDER BY u.ord", 1)

// pgRows are new job rows, column by column, for pgInsertSQL.
type pgRows struct {
	ids, groups                  []string
	prios, keys, runAts, created []int64
	states                       []int16
	uks                          []*string
	uexps                        []*int64
	recs                         [][]byte
	plain                        []bool
	datas                        [][]byte // the data column: a big job's data (pg_data.go)
	arena                        pgArena
}

func (r *pgRows) add(j *Job, uexp *int64, now int64) {
	r.ids, r.prios, r.keys = append(r.ids, j.ID()), append(r.prios, j.Priority), append(r.keys, sortKey(j))
	r.runAts, r.created, r.states = append(r.runAts, pgRunAt(j, now)), append(r.created, j.CreatedAt), append(r.states, pgState(j.state))
	var uk *string
	if j.cold().UniqueKey != "" {
		uk = ptr(j.cold().UniqueKey)
	}
	r.uks, r.uexps, r.groups = append(r.uks, uk), append(r.uexps, uexp), append(r.groups, j.cold().GroupID)
	rec, data, _ := r.arena.record(j) // a new row has no data column to keep
	r.recs, r.datas = append(r.recs, rec), append(r.datas, data)
	r.plain = append(r.plain, pgPlainDone(j))
}

// args are pgInsertSQL's parameters (pointers and byte slices as
// pgtype.FlatArray, which pgx encodes without reflection).
func (r *pgRows) args(queue string) []any {
	return []any{queue, r.ids, r.prios, r.keys, r.runAts, r.created, pgtype.FlatArray[*string](r.uks),
		pgtype.FlatArray[[]byte](r.recs), pgtype.FlatArray[*int64](r.uexps), r.groups, r.states, r.plain,
		pgtype.FlatArray[[]byte](r.datas)}
}

// pgInserted is what insertJobs did.
type pgInserted struct {
	ids     []string // by job: its id, or the one answered for it
	made    []*Job   // created, to be told of once committed
	dups    []string // holders of unique keys to tell of as duplicated
	extends []string // holders whose key's hold a push extended
	refused error    // the job after the last of ids was refused
}

// insertJobs is insertTx with the refusal and the duplicates told apart.
func (p *PG) insertJobs(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job) (pgInserted, error) {
	var res pgInserted
	now := p.now()
	refused, err := p.admitJobs(ctx, tx, queue, jobs, now)
	if err != nil || refused != nil {
		res.refused = refused
		return res, err
	}
	if err := p.freeCustomIDs(ctx, tx, jobs, now); err != nil {
		return res, err
	}
	plan, err := p.dedupTx(ctx, tx, queue, jobs, now)
	if err != nil {
		return res, err
	}
	jobs = jobs[:plan.upto]
	res.dups, res.extends, res.refused = plan.events, plan.extends, plan.refused
	var rows pgRows
	ready := false
	for i, j := range jobs {
		if _, dup := plan.dup[i]; dup || plan.dropped[i] {
			continue
		}
		ready = ready || j.state == StateWaiting || j.state == StatePrioritized
		rows.add(j, plan.expires[i], now)
	}
	made, err := p.insertRows(ctx, tx, queue, &rows)
	if err != nil {
		return res, err
	}
	if err := p.answerInserted(ctx, tx, queue, jobs, plan, made, &res); err != nil {
		return res, err
	}
	if ready && len(res.made) > 0 {
		if err := p.notify(ctx, tx, queue); err != nil {
			return res, err
		}
	}
	return res, nil
}

// admitJobs gives the jobs their first state and registers their queue
// and groups. A queue's first grouped job turns its claims to the grouped
// path. A new queue past --max-queues is refused whole (an error, a
// pgRefused); a batch that would overfill a group is refused whole too
// (refused).
func (p *PG) admitJobs(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job, now int64) (refused, err error) {
	grouped := false
	for _, j := range jobs {
		pgAdmit(j, now)
		grouped = grouped || j.cold().GroupID != ""
	}
	if err := p.registerQueue(ctx, tx, queue, grouped); err != nil {
		return nil, err
	}
	if err := p.groupsTx(ctx, tx, queue, jobs); err != nil {
		var rf pgRefused
		if errors.As(err, &rf) {
			return rf.error, nil
		}
		return nil, err
	}
	return nil, nil
}

// freeCustomIDs deletes the finished rows that hold the jobs' custom ids,
// which a new job takes over: those that finished before the push came,
// and those set aside (pg_unreadable.go), whose job can never run.
// A push takes effect as of its arrival, however late it is written (its
// transaction may wait out a broken connection while the client, having
// had no answer, pushes again through another broker, and the job is
// made and finished meanwhile). Ordered at its arrival it met that job
// live, and a push of a live job's custom id answers that job: so does
// the late one, rather than run the job a second time.
func (p *PG) freeCustomIDs(ctx context.Context, tx pgx.Tx, jobs []*Job, now int64) error {
	var custom []string
	var arrived []int64
	for _, j := range jobs {
		if id := j.cold().CustomID; id != "" {
			custom = append(custom, id)
			arrived = append(arrived, cmp.Or(j.cold().arrived, now))
		}
	}
	if len(custom) > 0 {
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.jobs AS j USING unnest($1::text[], $2::bigint[]) AS u(id, arrived)
			WHERE j.id = u.id AND (j.state IN ({done}, {dlq}) AND COALESCE(j.done_at, 0) < u.arrived OR j.state = {setaside})`),
			custom, arrived); err != nil {
			return fmt.Errorf("free custom ids: %w", err)
		}
	}
	return nil
}

// insertRows inserts the rows and answers the ids of those created (a row
// whose id or unique key is taken is not).
func (p *PG) insertRows(ctx context.Context, tx pgx.Tx, queue string, rows *pgRows) (map[string]bool, error) {
	ins, err := tx.Query(ctx, p.sql(pgInsertSQL), rows.args(queue)...)
	if err != nil {
		return nil, fmt.Errorf("insert jobs: %w", err)
	}
	made := make(map[string]bool, len(rows.ids))
	for ins.Next() {
		var id string
		if err := ins.Scan(&id); err != nil {
			ins.Close()
			return nil, err
		}
		made[id] = true
	}
	ins.Close()
	if err := ins.Err(); err != nil {
		return nil, fmt.Errorf("insert jobs: %w", err)
	}
	return made, nil
}

// answerInserted sets, by job, the id answered for it (res.ids) and the
// jobs created (res.made), from the dedup plan and the rows made.
func (p *PG) answerInserted(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job, plan dedupPlan, made map[string]bool, res *pgInserted) error {
	res.ids = make([]string, len(jobs))
	for i, j := range jobs {
		res.ids[i] = j.ID()
		if id, dup := plan.dup[i]; dup {
			res.ids[i] = id
			continue
		}
		if made[j.ID()] && !plan.dropped[i] {
			res.made = append(res.made, j)
			made[j.ID()] = false // a second job of the batch with this id is a duplicate
			continue
		}
		if j.cold().UniqueKey != "" && j.cold().CustomID == "" && !plan.dropped[i] {
			// Held by a live job with the key: answer its id.
			err := tx.QueryRow(ctx, p.sql(`SELECT id FROM {s}.jobs WHERE queue = $1 AND unique_key = $2 AND state IN ({queued}, {active}, {children})`),
				queue, j.cold().UniqueKey).Scan(&res.ids[i])
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("find the holder of unique key %q: %w", j.cold().UniqueKey, err)
			}
		}
	}
	return nil
}
