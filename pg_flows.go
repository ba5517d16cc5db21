package main

// Flows, dependencies and repeatable jobs in PostgreSQL mode.
//
// A dependency not yet met is a row of the deps table (the job waits for
// the dependency), and the dependency's own row is marked waited. A job
// with such rows sits in state 7 (waiting-children), which no claim
// looks at. A job's deps rows change only under its row lock. The
// transaction that completes a waited job locks the jobs that wait on it,
// deletes its deps rows, and releases those with no rows left: two
// children of one parent completing at once through two brokers both lock
// the parent, and the second to get it sees the first's row gone, so the
// parent is released once. Completing a job that is neither
// waited on, nor a child, nor repeatable costs nothing more than before:
// the ACK decides from the row it has already locked.
//
// A push that names dependencies locks their rows first, so that a
// dependency completing meanwhile lands on one side of the push: either
// the push sees it completed, or its completion sees the mark.

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// pgFlowEvent is an event to tell once the transaction commits.
type pgFlowEvent struct {
	j *Job
	t evType
	a evArgs
}

// pgFlowTx gathers what flow work in one transaction leaves to do after
// the commit.
type pgFlowTx struct {
	events []pgFlowEvent
	notes  []*note           // catalogue notices (live_catalog.go)
	pushed map[string][]*Job // repeat successors, by queue
	failed int               // parents failed by a child's policy
}

func (f *pgFlowTx) after(p *PG, now int64) {
	if f == nil {
		return
	}
	p.b.stats.failed.Add(int64(f.failed))
	for q, made := range f.pushed {
		p.pushed(q, made)
	}
	for _, n := range f.notes {
		p.b.announce(n)
	}
	for _, e := range f.events {
		p.emit(e.j.Queue, e.t, e.j, now, e.a)
	}
}

// ---------------------------------------------------------------------------
// Push

// pgPushPlan is what a push's checks found: the dependencies each job
// still waits for, and the parents children link to.
type pgPushPlan struct {
	waits   map[*Job][]string
	parents map[string]*pgLocked
	links   map[*Job]string // child -> parent id
}

// pushChecks validates the flow options of jobs about to be pushed, in the
// memory engine's order (dependencies, repeat, parent), locking the rows
// of dependencies and parents. batch holds jobs of the same push others
// may depend on, by id. It answers nil when no job has flow options.
func (p *PG) pushChecks(ctx context.Context, tx pgx.Tx, jobs []*Job, batch map[string]*Job) (*pgPushPlan, error) {
	var lock []string
	for _, j := range jobs {
		for _, d := range j.cold().DependsOn {
			if batch[d] == nil && d != j.ID() {
				lock = append(lock, d)
			}
		}
		if pid, _, ok := parentLink(j); ok && pid != j.ID() {
			lock = append(lock, pid)
		}
	}
	var rows map[string]*pgLocked
	if len(lock) > 0 {
		var err error
		if rows, err = p.lockRows(ctx, tx, lock); err != nil {
			return nil, pgErr(fmt.Errorf("lock dependencies: %w", err))
		}
	}
	var plan *pgPushPlan
	for i, j := range jobs {
		var waits []string
		for _, d := range j.cold().DependsOn {
			l := rows[d]
			if err := dependencyRefusal(j, d, d != j.ID() && (batch[d] != nil || l != nil)); err != nil {
				return nil, &jobErr{i, err}
			}
			if batch[d] != nil || l.j.state != StateCompleted {
				waits = append(waits, d)
			}
		}
		if err := validateRepeat(j); err != nil {
			return nil, &jobErr{i, err}
		}
		pid, pq, linked := parentLink(j)
		if linked {
			var par *Job
			if l := rows[pid]; l != nil {
				par = l.j
			}
			if err := linkable(par, pid, pq, j.ID()); err != nil {
				return nil, &jobErr{i, err}
			}
		}
		if len(waits) == 0 && !linked {
			continue
		}
		if plan == nil {
			plan = &pgPushPlan{waits: map[*Job][]string{}, parents: rows, links: map[*Job]string{}}
		}
		j.pending = int32(len(waits))
		if len(waits) > 0 {
			plan.waits[j] = waits
		}
		if linked {
			plan.links[j] = pid
		}
	}
	return plan, nil
}

// admitted records, for the jobs a push made, the dependencies they wait
// for and their links to parents.
func (p *PG) admitted(ctx context.Context, tx pgx.Tx, plan *pgPushPlan, made []*Job) error {
	if plan == nil || len(made) == 0 {
		return nil
	}
	var waiters, deps []string
	var linked []*Job
	for _, j := range made {
		for _, d := range plan.waits[j] {
			waiters, deps = append(waiters, j.ID()), append(deps, d)
		}
		if plan.links[j] != "" {
			linked = append(linked, j)
		}
	}
	if err := p.addDeps(ctx, tx, waiters, deps, true); err != nil {
		return err
	}
	now := p.now()
	var parents []*Job
	for _, c := range linked {
		par := plan.parents[plan.links[c]].j
		if !isQueued(par.state) || slices.Contains(par.cold().Children, c.ID()) {
			continue
		}
		if err := p.linkChild(ctx, tx, par, c, now); err != nil {
			return err
		}
		if !slices.Contains(parents, par) {
			parents = append(parents, par)
		}
	}
	if len(parents) > 0 {
		return p.saveJobs(ctx, tx, parents, nil)
	}
	return nil
}

// addDeps records that each waiters[i] waits for deps[i], and marks the
// dependencies. fresh says the waiters are new jobs: an earlier job with
// the same (custom) id may have left rows, which go.
func (p *PG) addDeps(ctx context.Context, tx pgx.Tx, waiters, deps []string, fresh bool) error {
	if len(waiters) == 0 {
		return nil
	}
	stale := `SELECT 1`
	if fresh {
		stale = `DELETE FROM {s}.deps WHERE job_id = ANY($1) AND NOT (job_id, dep_id) IN
			(SELECT * FROM unnest($1::text[], $2::text[]))`
	}
	_, err := tx.Exec(ctx, p.sql(`WITH stale AS (`+stale+`)
		INSERT INTO {s}.deps (job_id, dep_id) SELECT * FROM unnest($1::text[], $2::text[]) ON CONFLICT DO NOTHING`),
		waiters, deps)
	if err != nil {
		return pgErr(fmt.Errorf("record dependencies: %w", err))
	}
	if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs SET waited = true WHERE id = ANY($1) AND NOT waited`), deps); err != nil {
		return pgErr(fmt.Errorf("mark dependencies: %w", err))
	}
	return nil
}

// linkChild makes the locked parent par wait for child c, as the memory
// engine's linkChild does; the caller saves par.
func (p *PG) linkChild(ctx context.Context, tx pgx.Tx, par, c *Job, now int64) error {
	addChild(par, c.ID())
	if c.state == StateCompleted {
		return nil
	}
	if err := p.addDeps(ctx, tx, []string{par.ID()}, []string{c.ID()}, false); err != nil {
		return err
	}
	par.state = StateWaitingChildren
	markWaitingChildren(par, now)
	return nil
}

// pushJobs adds jobs to a queue in one transaction with their flow
// options, and answers their ids. batch holds jobs of the push others of
// it may depend on, by id.
func (p *PG) pushJobs(ctx context.Context, queue string, jobs []*Job, batch map[string]*Job) (ids []string, made int, err error) {
	tl := make([]timelineMark, len(jobs))
	for i, j := range jobs {
		tl[i] = j.timelineMark()
	}
	err = pgRetry(ctx, func() error {
		// A run that was rolled back left its entries on the timelines.
		for i, j := range jobs {
			j.timelineBack(tl[i])
			j.pending = 0
		}
		ids, made, err = p.pushOnce(ctx, queue, jobs, batch)
		return err
	})
	return ids, made, err
}

func (p *PG) pushOnce(ctx context.Context, queue string, jobs []*Job, batch map[string]*Job) ([]string, int, error) {
	tx, err := p.begin(ctx)
	if err != nil {
		return nil, 0, pgErr(err)
	}
	defer tx.Rollback(context.Background())
	plan, err := p.pushChecks(ctx, tx, jobs, batch)
	if err != nil {
		return nil, 0, err
	}
	res, err := p.insertJobs(ctx, tx, queue, jobs)
	if err != nil {
		return nil, 0, pgErr(err)
	}
	if err := p.admitted(ctx, tx, plan, res.made); err != nil {
		return nil, 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, 0, pgErr(err)
	}
	p.inserted(queue, res)
	if res.refused != nil {
		// Those before the refused job stay, as in memory mode.
		return nil, 0, pgRefused{res.refused}
	}
	return res.ids, len(res.made), nil
}

// ---------------------------------------------------------------------------
// Completion

// pgDoneJob is a job an ACK completed that flows care about.
type pgDoneJob struct {
	j      *Job
	result Raw // nil: none
	waited bool
}

// completed does, inside an ACK's transaction, what completing jobs means
// for flows: waiting jobs whose last dependency this was are released, a
// child's result goes to its parent, a repeatable job's successor is
// pushed. inHand are the jobs the ACK has locked (they are used rather
// than read again); those in saving the ACK saves itself.
func (p *PG) completed(ctx context.Context, tx pgx.Tx, done []pgDoneJob, inHand map[string]*pgLocked, saving map[string]bool, now int64) (*pgFlowTx, error) {
	f := &pgFlowTx{}
	var waitedOn []string
	var want []string
	for _, d := range done {
		if d.waited {
			waitedOn = append(waitedOn, d.j.ID())
		}
		if d.j.cold().ParentID != "" && d.result != nil {
			want = append(want, d.j.cold().ParentID)
		}
	}
	var waiting []string
	if len(waitedOn) > 0 {
		// No one adds a dependency on these jobs meanwhile: that takes
		// their rows, which this ACK holds.
		rows, err := tx.Query(ctx, p.sql(`SELECT job_id FROM {s}.deps WHERE dep_id = ANY($1)`), waitedOn)
		if err != nil {
			return nil, fmt.Errorf("find dependent jobs: %w", err)
		}
		if waiting, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return nil, fmt.Errorf("find dependent jobs: %w", err)
		}
		want = append(want, waiting...)
	}
	if len(want) == 0 {
		return f, nil
	}
	// The dependents' rows are taken before their deps rows are touched,
	// as everything else that changes a job's deps rows does: a child
	// failing with a policy deletes its parent's rows under the parent's
	// lock, and would otherwise wait for this ACK while it waits for the
	// parent.
	jobs, err := p.lockMore(ctx, tx, want, inHand)
	if err != nil {
		return nil, err
	}
	if len(waitedOn) > 0 {
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.deps WHERE dep_id = ANY($1)`), waitedOn); err != nil {
			return nil, fmt.Errorf("resolve dependencies: %w", err)
		}
	}
	changed := map[*Job]bool{}
	for _, d := range done {
		par := jobs[d.j.cold().ParentID]
		if d.j.cold().ParentID == "" || d.result == nil || par == nil || !slices.Contains(par.cold().Children, d.j.ID()) {
			continue
		}
		par.warm().childValues = setKV(par.cold().childValues, d.j.Queue+":"+d.j.ID(), d.result)
		changed[par] = true
	}
	if len(waiting) > 0 {
		// Every change to a job's deps rows is made under its lock: what
		// is left is what it still waits for.
		rows, err := tx.Query(ctx, p.sql(`SELECT DISTINCT job_id FROM {s}.deps WHERE job_id = ANY($1)`), waiting)
		if err != nil {
			return nil, fmt.Errorf("count dependencies: %w", err)
		}
		still, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("count dependencies: %w", err)
		}
		for _, id := range waiting {
			w := jobs[id]
			if w == nil || w.state != StateWaitingChildren || slices.Contains(still, id) {
				continue
			}
			pgRelease(w, now)
			changed[w] = true
			f.notes = append(f.notes, noticeResolved(w))
			if err := p.notify(ctx, tx, w.Queue); err != nil {
				return nil, err
			}
		}
	}
	return f, p.saveChanged(ctx, tx, changed, saving)
}

// repeated pushes the next runs of repeatable jobs an ACK completed, once
// their rows are saved (a successor may take over their unique key).
func (p *PG) repeated(ctx context.Context, tx pgx.Tx, f *pgFlowTx, done []pgDoneJob, now int64) error {
	for _, d := range done {
		if d.j.cold().Repeat == nil {
			continue
		}
		n := repeatSuccessor(d.j, now)
		if n == nil {
			continue
		}
		_, made, err := p.insertTx(ctx, tx, d.j.Queue, []*Job{n})
		if err != nil {
			return fmt.Errorf("push the next run of %s: %w", d.j.ID(), err)
		}
		// Waiting pulls learn when it comes due.
		if err := p.notify(ctx, tx, d.j.Queue); err != nil {
			return err
		}
		if f.pushed == nil {
			f.pushed = map[string][]*Job{}
		}
		f.pushed[d.j.Queue] = append(f.pushed[d.j.Queue], made...)
	}
	return nil
}

// pgRelease moves a job out of waiting-children to run, as the memory
// engine's releaseWaiting does.
func pgRelease(j *Job, now int64) {
	j.pending = 0
	j.state = j.queuedState(now)
	j.addTimeline(TimelineEntry{State: j.state, At: now})
}

// lockMore locks the rows of ids not already in hand and answers every
// one of them by id.
func (p *PG) lockMore(ctx context.Context, tx pgx.Tx, ids []string, inHand map[string]*pgLocked) (map[string]*Job, error) {
	out := map[string]*Job{}
	var more []string
	for _, id := range ids {
		if l := inHand[id]; l != nil {
			out[id] = l.j
		} else {
			more = append(more, id)
		}
	}
	if len(more) > 0 {
		locked, err := p.lockRows(ctx, tx, more)
		if err != nil {
			return nil, fmt.Errorf("lock dependent jobs: %w", err)
		}
		for id, l := range locked {
			out[id] = l.j
		}
	}
	return out, nil
}

func (p *PG) saveChanged(ctx context.Context, tx pgx.Tx, changed map[*Job]bool, saving map[string]bool) error {
	var save []*Job
	for j := range changed {
		if !saving[j.ID()] {
			save = append(save, j)
		}
	}
	if len(save) == 0 {
		return nil
	}
	slices.SortFunc(save, func(a, b *Job) int { return cmpStr(a.ID(), b.ID()) })
	return p.saveFlow(ctx, tx, save)
}

// saveFlow saves jobs whose flow records changed. An active job's lease
// lives in its row's columns, which heartbeats move on and its record does
// not follow: only its record is written, so that the lease stays as it is.
func (p *PG) saveFlow(ctx context.Context, tx pgx.Tx, jobs []*Job) error {
	var rest []*Job
	var ids []string
	var recs, datas [][]byte
	var plain, keeps []bool
	for _, j := range jobs {
		if j.state != StateActive {
			rest = append(rest, j)
			continue
		}
		rec, data, keep := pgRecord(j)
		ids, recs, plain = append(ids, j.ID()), append(recs, rec), append(plain, pgPlainDone(j))
		datas, keeps = append(datas, data), append(keeps, keep)
	}
	if len(ids) > 0 {
		// plain with the record: a running job given a parent here is no
		// longer completed by the ACK that touches its row only.
		if _, err := tx.Exec(ctx, p.sql(`UPDATE {s}.jobs AS j SET body = u.rec, plain = u.plain,
			data = CASE WHEN u.keepd THEN j.data ELSE u.dat END
			FROM unnest($1::text[], $2::bytea[], $3::boolean[], $4::bytea[], $5::boolean[]) AS u(id, rec, plain, dat, keepd)
			WHERE j.id = u.id`), ids, recs, plain, datas, keeps); err != nil {
			return fmt.Errorf("save active jobs' records: %w", err)
		}
	}
	if len(rest) > 0 {
		return p.saveJobs(ctx, tx, rest, nil)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Child failure policies

// childFailed applies, inside the transaction that failed j for good, the
// policy j has towards its parent. A parent failed by it may pass its own
// failure up in turn.
func (p *PG) childFailed(ctx context.Context, tx pgx.Tx, f *pgFlowTx, j *Job, err string, now int64) error {
	for depth := 0; depth < 1000; depth++ {
		it, ok := childPolicy(j, err)
		if !ok {
			return nil
		}
		locked, lerr := p.lockRows(ctx, tx, []string{it.parentID})
		if lerr != nil {
			return fmt.Errorf("lock the parent of %s: %w", j.ID(), lerr)
		}
		l := locked[it.parentID]
		if l == nil || !isQueued(l.j.state) {
			return nil // a running or finished parent is left alone
		}
		par := l.j
		switch it.mode {
		case policyFail:
			if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.deps WHERE job_id = $1`), par.ID()); err != nil {
				return fmt.Errorf("fail parent %s: %w", par.ID(), err)
			}
			msg := policyRecord(par, &it, now)
			f.notes = append(f.notes, noticeFlowFailed(par.ID(), it.childID, par.Queue, it.err, "Child job failed"))
			set, serr := p.settings(ctx, tx, []string{par.Queue})
			if serr != nil {
				return serr
			}
			dlq := set[par.Queue].dlqConfig()
			pgDeadLetter(par, "unknown", msg, true, dlq, now)
			par.warm().failErr, par.warm().hasFail = "", false // GetJob's failedReason comes from the timeline
			f.events = append(f.events, pgFlowEvent{par, evFailed, evArgs{err: msg, hasErr: true}})
			f.failed++
			if err := p.saveJobs(ctx, tx, []*Job{par}, nil); err != nil {
				return err
			}
			if err := p.trimDLQ(ctx, tx, par.Queue, dlq); err != nil {
				return err
			}
			// The parent is dead-lettered: its own policy acts on its parent.
			j, err = par, msg
			continue
		case policyContinue:
			if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.deps WHERE job_id = $1`), par.ID()); err != nil {
				return fmt.Errorf("continue parent %s: %w", par.ID(), err)
			}
			policyRecord(par, &it, now)
		case policyIgnore, policyRemove:
			if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.deps WHERE job_id = $1 AND dep_id = $2`), par.ID(), it.childID); err != nil {
				return fmt.Errorf("drop a dependency of %s: %w", par.ID(), err)
			}
			policyRecord(par, &it, now)
		}
		if par.state == StateWaitingChildren {
			var left bool
			if err := tx.QueryRow(ctx, p.sql(`SELECT EXISTS (SELECT 1 FROM {s}.deps WHERE job_id = $1)`), par.ID()).Scan(&left); err != nil {
				return fmt.Errorf("count dependencies of %s: %w", par.ID(), err)
			}
			if !left {
				if err := p.releaseWaiting(ctx, tx, f, par, now); err != nil {
					return err
				}
			}
		}
		return p.saveJobs(ctx, tx, []*Job{par}, nil)
	}
	return nil
}

// releaseWaiting releases a parent by hand or by policy: it runs now, and
// a waiting event says so (none is sent when its children complete, as
// with the reference).
func (p *PG) releaseWaiting(ctx context.Context, tx pgx.Tx, f *pgFlowTx, par *Job, now int64) error {
	par.RunAt = now
	pgRelease(par, now)
	f.events = append(f.events, pgFlowEvent{par, evWaiting, evArgs{prev: "waiting-children"}})
	return p.notify(ctx, tx, par.Queue)
}

// ---------------------------------------------------------------------------
// Flow operations (FlowEngine), as flows.go answers them in memory

// Now is the database's clock in ms.
func (p *PG) Now() int64 { return p.now() }

// flowTx runs fn in a transaction, again when it deadlocks, and tells the
// events fn gathered once it commits. fn's errors come back as they are:
// refusals, or storage errors already marked so (pgErr).
func (p *PG) flowTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx, f *pgFlowTx, now int64) error) error {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var f *pgFlowTx
	var now int64
	err := pgRetry(ctx, func() error {
		f, now = &pgFlowTx{}, p.now()
		return p.inTx(ctx, func(tx pgx.Tx) error { return fn(ctx, tx, f, now) })
	})
	if err != nil {
		return err
	}
	f.after(p, now)
	return nil
}

func (p *PG) PushFlow(ctx context.Context, jobs []flowJob) ([]*Job, error) {
	ids := make([]string, len(jobs))
	var queues []string
	byQueue := map[string][]*Job{}
	var waiters, deps []string
	for i, f := range jobs {
		ids[i] = f.job.ID()
		if byQueue[f.queue] == nil {
			queues = append(queues, f.queue)
		}
		byQueue[f.queue] = append(byQueue[f.queue], f.job)
		// Every dependency is in the flow, admitted with it.
		f.job.pending = int32(len(f.job.cold().DependsOn))
		for _, d := range f.job.cold().DependsOn {
			waiters, deps = append(waiters, f.job.ID()), append(deps, d)
		}
	}
	tl := make([]timelineMark, len(jobs))
	for i, f := range jobs {
		tl[i] = f.job.timelineMark()
	}
	err := p.flowTx(ctx, func(ctx context.Context, tx pgx.Tx, f *pgFlowTx, now int64) error {
		// A run that was rolled back left its entries on the timelines.
		for i, fj := range jobs {
			fj.job.timelineBack(tl[i])
		}
		if err := p.flowIDsFree(ctx, tx, ids); err != nil {
			return err
		}
		f.pushed = map[string][]*Job{}
		for _, q := range queues {
			made, err := p.insertFlow(ctx, tx, q, byQueue[q])
			if err != nil {
				return err
			}
			f.pushed[q] = made
		}
		return p.addDeps(ctx, tx, waiters, deps, true)
	})
	if err != nil {
		return nil, err
	}
	out := make([]*Job, len(jobs))
	for i, f := range jobs {
		out[i] = f.job
	}
	return out, nil
}

// flowIDsFree refuses a flow one of whose ids a job already has.
func (p *PG) flowIDsFree(ctx context.Context, tx pgx.Tx, ids []string) error {
	rows, err := tx.Query(ctx, p.sql(`SELECT id FROM {s}.jobs WHERE id = ANY($1)`), ids)
	if err != nil {
		return pgErr(fmt.Errorf("look up flow ids: %w", err))
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return pgErr(fmt.Errorf("look up flow ids: %w", err))
	}
	taken := make(map[string]bool, len(have))
	for _, id := range have {
		taken[id] = true
	}
	for _, id := range ids {
		if taken[id] {
			return errFlowJobExists(id)
		}
	}
	return nil
}

// insertFlow inserts a flow's jobs of one queue and answers them, all of
// them or a refusal.
func (p *PG) insertFlow(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job) ([]*Job, error) {
	_, made, err := p.insertTx(ctx, tx, queue, jobs)
	if err != nil {
		// A queue past --max-queues, a group full, or the database.
		return nil, pgRefusedOr(err)
	}
	if len(made) != len(jobs) {
		// Another push took one of the ids meanwhile.
		in := make(map[*Job]bool, len(made))
		for _, j := range made {
			in[j] = true
		}
		for _, j := range jobs {
			if !in[j] {
				return nil, errFlowJobExists(j.ID())
			}
		}
	}
	return made, nil
}

func (p *PG) ChildrenValues(ctx context.Context, id string) ([]childKV, error) {
	return p.childRecords(ctx, id, childValuesOf)
}

func (p *PG) FailedChildren(ctx context.Context, id string) ([]childKV, error) {
	return p.childRecords(ctx, id, failedKidsOf)
}

func (p *PG) IgnoredChildren(ctx context.Context, id string) ([]childKV, error) {
	return p.childRecords(ctx, id, ignoredKidsOf)
}

// childRecords reads the records pick chooses of job id; none when there
// is no such job.
func (p *PG) childRecords(ctx context.Context, id string, pick func(j *Job) []childKV) ([]childKV, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	j, _, err := p.getJob(ctx, id)
	if err != nil || j == nil {
		return nil, err
	}
	return pick(j), nil
}

// lockOne locks one job row. When there is none it answers missing (nil
// when the caller handles it).
func (p *PG) lockOne(ctx context.Context, tx pgx.Tx, id string, missing error) (*Job, error) {
	locked, err := p.lockRows(ctx, tx, []string{id})
	if err != nil {
		return nil, pgErr(fmt.Errorf("lock job %s: %w", id, err))
	}
	if l := locked[id]; l != nil {
		return l.j, nil
	}
	return nil, missing
}

func (p *PG) MoveToWaitingChildren(ctx context.Context, id, token string) error {
	return p.flowTx(ctx, func(ctx context.Context, tx pgx.Tx, f *pgFlowTx, now int64) error {
		j, err := p.lockOne(ctx, tx, id, nil)
		if err != nil {
			return err
		}
		if err := parkable(j, token); err != nil {
			return err
		}
		// Parked until a child is linked to it; it does not check for
		// children of its own, as in the reference.
		j.setLease(nil)
		j.setStartedAt(0)
		j.state = StateWaitingChildren
		j.addTimeline(TimelineEntry{State: StateWaitingChildren, At: now})
		f.events = append(f.events, pgFlowEvent{j, evWaitingChildren, evArgs{prev: "active"}})
		return pgErr(p.saveJobs(ctx, tx, []*Job{j}, nil))
	})
}

func (p *PG) UpdateParent(ctx context.Context, cid, pid string) error {
	return p.flowTx(ctx, func(ctx context.Context, tx pgx.Tx, f *pgFlowTx, now int64) error {
		// The child first, then the parent: the order an ACK takes them in.
		// A row not found is planParentLink's to refuse, in its order.
		c, err := p.lockOne(ctx, tx, cid, nil)
		if err != nil {
			return err
		}
		var par *Job
		if c != nil {
			if par, err = p.lockOne(ctx, tx, pid, nil); err != nil {
				return err
			}
		}
		plan, err := planParentLink(cid, pid, c, par)
		if err != nil {
			return err
		}
		setParent(c, pid, par.Queue)
		save := []*Job{c}
		switch {
		case plan.record:
			par.warm().Children = append(slices.Clone(par.cold().Children), cid)
			par.warm().DependsOn = append(slices.Clone(par.cold().DependsOn), cid)
			save = append(save, par)
		case plan.wait:
			if err := p.linkChild(ctx, tx, par, c, now); err != nil {
				return err // already a storage error
			}
			save = append(save, par)
		}
		if err := p.saveFlow(ctx, tx, save); err != nil {
			return pgErr(err)
		}
		if plan.failed {
			return pgErr(p.childFailed(ctx, tx, f, c, c.cold().failErr, now))
		}
		return nil
	})
}

func (p *PG) RemoveChildDependency(ctx context.Context, cid string) (bool, error) {
	removed := false
	err := p.flowTx(ctx, func(ctx context.Context, tx pgx.Tx, f *pgFlowTx, now int64) error {
		removed = false
		c, err := p.lockOne(ctx, tx, cid, nil)
		if err != nil {
			return err
		}
		if onward, err := childDependency(cid, c); !onward || err != nil {
			return err
		}
		pid := c.cold().ParentID
		par, err := p.lockOne(ctx, tx, pid, nil)
		if err != nil || !parentWaitsFor(par, cid) {
			return err
		}
		var left bool
		if err := tx.QueryRow(ctx, p.sql(`WITH gone AS (DELETE FROM {s}.deps WHERE job_id = $1 AND dep_id = $2)
			SELECT EXISTS (SELECT 1 FROM {s}.deps WHERE job_id = $1 AND dep_id <> $2)`), pid, cid).Scan(&left); err != nil {
			return pgErr(fmt.Errorf("drop the dependency of %s on %s: %w", pid, cid, err))
		}
		dropChild(par, cid)
		if !left {
			if err := p.releaseWaiting(ctx, tx, f, par, now); err != nil {
				return pgErr(err)
			}
		}
		setParent(c, "", "")
		removed = true
		save := []*Job{c, par}
		slices.SortFunc(save, func(a, b *Job) int { return cmpStr(a.ID(), b.ID()) })
		return pgErr(p.saveFlow(ctx, tx, save))
	})
	return removed, err
}

func (p *PG) RemoveUnprocessedChildren(ctx context.Context, id string) error {
	return p.flowTx(ctx, func(ctx context.Context, tx pgx.Tx, f *pgFlowTx, now int64) error {
		par, _, err := p.getJob(ctx, id)
		if err != nil || par == nil || len(par.cold().Children) == 0 {
			return err
		}
		locked, err := p.lockRows(ctx, tx, par.cold().Children)
		if err != nil {
			return pgErr(fmt.Errorf("lock the children of %s: %w", id, err))
		}
		var gone []string
		for _, c := range par.cold().Children {
			if l := locked[c]; l != nil && isQueued(l.j.state) {
				gone = append(gone, c)
				f.events = append(f.events, pgFlowEvent{l.j, evRemoved, evArgs{prev: "waiting"}})
			}
		}
		if len(gone) == 0 {
			return nil
		}
		_, err = tx.Exec(ctx, p.sql(`WITH j AS (DELETE FROM {s}.jobs WHERE id = ANY($1)),
			l AS (DELETE FROM {s}.job_logs WHERE job_id = ANY($1))
			DELETE FROM {s}.deps WHERE job_id = ANY($1)`), gone)
		if err != nil {
			return pgErr(fmt.Errorf("remove the children of %s: %w", id, err))
		}
		return nil
	})
}

// ---------------------------------------------------------------------------
// Deadlocks
