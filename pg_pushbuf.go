package main

// Group commit for pushes in PostgreSQL mode. Written one by one, each
// push is a transaction of its own: a few round trips and a WAL flush for
// one row, while the connection that sent it waits. Instead a push is
// queued in arrival order and answered once written; a writer per lane
// (queues are spread over the lanes by name) takes everything queued and
// writes it as one multi-row INSERT per queue in one transaction. Under
// load a commit carries many jobs; an idle broker writes a lone push at
// once. One writer per lane keeps the jobs of a queue in the order they
// arrived, so pipelined pushes stay FIFO.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// pgPushLanes is how many transactions of pushes may be in flight at
	// once (each holds a pool connection).
	pgPushLanes = 4
	// pgPushMaxJobs bounds the jobs of one transaction (a request's jobs
	// are never split).
	pgPushMaxJobs = 2000
	// pgCopyMin is the batch from which bare jobs go in with COPY rather
	// than one INSERT: COPY costs three more round trips (BEGIN and the
	// queue's row, the COPY's start, COMMIT), and saves more than that on
	// a large batch, where the INSERT spent its time taking apart one
	// array per column and inserting row by row.
	pgCopyMin = 300
)

type pgPushReq struct {
	at    time.Time // when it came
	queue string
	jobs  []*Job
	ids   []string
	made  int // jobs of the request created (the others were there)
	err   error
	done  chan struct{}
}

type pgPushLane struct {
	mu                   sync.Mutex
	pgRounds[*pgPushReq] // one writer per lane
	// arrived is poked by each push while the writer gathers (gather).
	arrived chan struct{}
	// pace tells a stream of pushes, for which batches wait for company
	// (pg_linger.go).
	pace pgPace
}

// pgPlain reports a job that can share a transaction with other requests:
// nothing about it can fail one request without the others.
func pgPlain(j *Job) bool {
	return len(j.cold().DependsOn) == 0 && j.cold().ParentID == "" && j.cold().Repeat == nil && j.cold().GroupID == "" &&
		j.cold().DedupTTL == none && !j.cold().DedupExtend && !j.cold().DedupReplace && j.cold().DebounceID == ""
}

// pushAsync queues plain jobs to be written, and answers a Pushed whose
// Wait gives, once they are, their ids (or those of the live jobs holding
// their custom ids or unique keys).
//
// The push latency is the time to the commit, as the client waits for it.
func (p *PG) pushAsync(queue string, jobs []*Job) Pushed {
	began := time.Now()
	req := &pgPushReq{at: began, queue: queue, jobs: jobs, done: make(chan struct{})}
	lane := &p.push[fnv1a(queue)%pgPushLanes]
	lane.mu.Lock()
	lane.pace.came++
	start := lane.add(req, 1)
	if lane.arrived == nil {
		lane.arrived = make(chan struct{}, 1)
	}
	arrived := lane.arrived
	lane.mu.Unlock()
	if start {
		go p.pushWriter(lane)
	} else {
		select {
		case arrived <- struct{}{}:
		default:
		}
	}
	return Pushed{Wait: func() ([]string, int, error) {
		<-req.done
		p.b.lat.push.since(began)
		if req.err != nil {
			return nil, 0, pgPushErr(req.err)
		}
		return req.ids, req.made, nil
	}}
}

// pushWriter writes the lane's batches until none is pending.
func (p *PG) pushWriter(lane *pgPushLane) {
	var took time.Duration // the last batch's write
	for answered := 0; ; {
		lane.gather(answered, took)
		lane.mu.Lock()
		batch, _, ok := lane.next(pgPushMaxJobs, pushJobCount)
		came := lane.pace.came
		lane.mu.Unlock()
		if !ok {
			return
		}
		began := time.Now()
		p.insertBatch(batch)
		answered, took = len(batch), time.Since(began)
		lane.mu.Lock()
		lane.pace.wrote(batch, lane.pace.came-came, began)
		lane.mu.Unlock()
	}
}

func pushJobCount(r *pgPushReq) int { return len(r.jobs) }

// admitRound admits the jobs of one queue's requests in a round, hands
// each to row (the insert's way of writing it), and gives each request its
// ids and res the jobs made. It reports whether any job is ready to pull.
func admitRound(reqs []*pgPushReq, now int64, res *pgInserted, row func(*Job)) (ready bool) {
	for _, r := range reqs {
		for _, j := range r.jobs {
			pgAdmit(j, now)
			ready = ready || j.state == StateWaiting || j.state == StatePrioritized
			row(j)
			r.ids = append(r.ids, j.ID())
			res.made = append(res.made, j)
		}
	}
	return ready
}

// pgPushGather bounds how long a writer waits for the pushes of the
// clients it has just answered before it writes the next batch.
const pgPushGather = 2 * time.Millisecond

// gather waits until the clients the last batch answered have sent their
// next pushes, or a batch is full: at most as long as that batch took to
// write (its commit, a WAL flush, is what waiting saves), and never more
// than pgPushGather. (Under a stream of pushes the lane waits longer for
// company instead: pg_linger.go.) Without it a few clients pushing one job at a time
// fall into step with the writer: while one half waits for its commit the
// other half queues, and each commit carries half of them; with it, one
// commit carries all of them. A client that does not come back costs the
// others at most that wait; a lone client costs nothing, as its push ends
// the wait.
func (l *pgPushLane) gather(answered int, took time.Duration) {
	if answered == 0 {
		return
	}
	l.mu.Lock()
	target := len(l.pending) + answered
	if mode := l.pace.mode(); mode != pgPaceAnswers {
		oldest := time.Now()
		if len(l.pending) > 0 {
			oldest = l.pending[0].at
		}
		if mode == pgPaceGatherers {
			target = -1 // what they send grows with the wait
		}
		l.mu.Unlock()
		l.linger(oldest.Add(pgPushLinger), target)
		return
	}
	l.mu.Unlock()
	waitForCompany(min(took, pgPushGather), l.arrived, nil, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		n, jobs := len(l.pending), 0
		for _, r := range l.pending {
			if jobs += len(r.jobs); jobs >= pgPushMaxJobs {
				break
			}
		}
		return n >= target || jobs >= pgPushMaxJobs
	})
}

// insertBatch writes the jobs of several requests in one transaction, one
// INSERT per queue, in the order they came.
func (p *PG) insertBatch(batch []*pgPushReq) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var order []string
	byQueue := make(map[string][]*pgPushReq)
	for _, r := range batch {
		if _, ok := byQueue[r.queue]; !ok {
			order = append(order, r.queue)
		}
		byQueue[r.queue] = append(byQueue[r.queue], r)
	}
	done := make(map[string]pgInserted, len(order))
	// Queues refused for --max-queues: their requests are answered so,
	// and the others are written.
	refused := make(map[string]error)
	var err error
	if pgBare(batch) {
		if pgJobsIn(batch) >= pgCopyMin {
			err = p.insertCopy(ctx, order, byQueue, done, refused)
		} else {
			var hands []*pgHand
			hands, err = p.insertBare(ctx, order, byQueue, done, refused)
			// Settled once the pushed events are told, below.
			defer func() {
				for _, h := range hands {
					p.settleHand(h)
				}
			}()
		}
	} else {
		err = p.insertPlain(ctx, batch, order, byQueue, done, refused)
	}
	if err == nil {
		for _, q := range order {
			if refused[q] == nil {
				p.inserted(q, done[q])
				countMade(byQueue[q], done[q].made)
			}
		}
	}
	for _, r := range batch {
		switch {
		case err != nil:
			r.ids, r.err = nil, pgErr(err)
		case refused[r.queue] != nil:
			r.ids, r.err = nil, refused[r.queue]
		}
		close(r.done)
	}
}

// countMade tells each request of a queue how many of its jobs were made.
func countMade(reqs []*pgPushReq, made []*Job) {
	set := make(map[*Job]struct{}, len(made))
	for _, j := range made {
		set[j] = struct{}{}
	}
	for _, r := range reqs {
		for _, j := range r.jobs {
			if _, ok := set[j]; ok {
				r.made++
			}
		}
	}
}

// pgBare reports a batch of jobs without custom ids or unique keys: their
// ids are new, so nothing can conflict and every one is made.
func pgBare(batch []*pgPushReq) bool {
	for _, r := range batch {
		for _, j := range r.jobs {
			if j.cold().CustomID != "" || j.cold().UniqueKey != "" {
				return false
			}
		}
	}
	return true
}

// insertBare writes bare jobs in one round trip: the statements go as one
// pipeline, which PostgreSQL runs as one implicit transaction, instead of
// BEGIN, the statements and COMMIT each waiting for the one before. The
// ready jobs of a queue on which pulls of this broker sleep are handed to
// them in the same transaction (pg_handoff.go): the hands answered are to
// be settled once the pushed events are told, whatever the error.
func (p *PG) insertBare(ctx context.Context, order []string, byQueue map[string][]*pgPushReq, done map[string]pgInserted, refused map[string]error) ([]*pgHand, error) {
	now := p.now()
	b := &pgx.Batch{}
	var wake []string
	var made []int // parallel to wake
	jobs := make([]int64, len(order))
	hands := make([]*pgHand, len(order))
	var held []*pgHand
	// Leases are written on the database's time, as a claim's are: none
	// is handed while the broker's clock is not known to be near it
	// (asked once a batch, and only when a pull could be handed jobs).
	var clockErr error
	clockAsked := false
	clockOK := func() bool {
		if !clockAsked {
			clockAsked, clockErr = true, p.clockReady(ctx)
		}
		return clockErr == nil
	}
	for i, q := range order {
		var rows pgRows
		var res pgInserted
		ready := admitRound(byQueue[q], now, &res, func(j *Job) { rows.add(j, nil, now) })
		jobs[i] = int64(len(rows.ids))
		b.Queue(p.sql(pgRegisterBareSQL), q, int64(p.b.maxQueues), p.evName, p.createdPayload(q))
		done[q] = res
		var h *pgHand
		if ready {
			h = p.reserveHand(q, readyOf(res.made), now, clockOK)
		}
		if h != nil {
			hands[i] = h
			held = append(held, h)
			b.Queue(p.sql(pgInsertHandSQL), h.insertArgs(&rows, q, p.broker)...)
		} else {
			b.Queue(p.sql(pgInsertBareSQL), rows.args(q)...)
		}
		if ready {
			wake = append(wake, q)
			made = append(made, len(rows.ids))
		}
	}
	br := p.pool.SendBatch(ctx, b)
	for i, q := range order {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return held, fmt.Errorf("register queue %s: %w", q, err)
		}
		inserted, err := insertedBy(br, hands[i])
		if err != nil {
			br.Close()
			return held, err
		}
		// A hand is done only once the whole pipeline committed: an
		// error in a later queue's statements rolls this one back too.
		if inserted == 0 && jobs[i] > 0 {
			// No row for the queue: one more was past the limit. (Or,
			// as rare, obliterated between the two statements: the push
			// is refused all the same, and may be sent again.)
			refused[q] = errTooManyQueues(p.b.maxQueues)
			if k := slices.Index(wake, q); k >= 0 {
				wake, made = slices.Delete(wake, k, k+1), slices.Delete(made, k, k+1)
			}
		}
	}
	if err := br.Close(); err != nil {
		return held, fmt.Errorf("insert jobs: %w", err)
	}
	for _, h := range held {
		h.done = h.took
	}
	wake, made = unhanded(hands, wake, made)
	if len(wake) > 0 {
		p.wakeEverywhere(wake, made)
	}
	return held, nil
}

// insertedBy reads a queue's insert from br: the rows it made (and,
// through h when it hands jobs, whether it handed them).
func insertedBy(br pgx.BatchResults, h *pgHand) (int64, error) {
	if h != nil {
		return h.read(br)
	}
	tag, err := br.Exec()
	if err != nil {
		return 0, fmt.Errorf("insert jobs: %w", err)
	}
	return tag.RowsAffected(), nil
}

// pgJobsIn counts the jobs of a batch.
func pgJobsIn(batch []*pgPushReq) int {
	n := 0
	for _, r := range batch {
		n += len(r.jobs)
	}
	return n
}

// pgCopyCols are the columns COPY fills for a bare job; the others keep
// their defaults (no unique key, no group, no lease).
var pgCopyCols = []string{"id", "queue", "state", "priority", "sort_key", "run_at", "created_at", "body", "plain", "data"}

// insertCopy writes bare jobs with COPY, in one transaction: each queue's
// row is made (or refused for --max-queues) before its jobs are copied,
// and a refused queue's jobs are not.
func (p *PG) insertCopy(ctx context.Context, order []string, byQueue map[string][]*pgPushReq, done map[string]pgInserted, refused map[string]error) error {
	now := p.now()
	tx, err := p.beginLazy(ctx)
	if err != nil {
		return fmt.Errorf("insert jobs: %w", err)
	}
	defer tx.Rollback(context.Background())
	table := pgx.Identifier{strings.Trim(p.schema, `"`), "jobs"}
	var wake []string
	var made []int // parallel to wake
	for _, q := range order {
		var there bool
		if err := tx.QueryRow(ctx, p.sql(pgRegisterCopySQL), q, int64(p.b.maxQueues), p.evName, p.createdPayload(q)).Scan(&there); err != nil {
			return fmt.Errorf("register queue %s: %w", q, err)
		}
		if !there {
			refused[q] = errTooManyQueues(p.b.maxQueues)
			continue
		}
		var rows [][]any
		var res pgInserted
		var arena pgArena
		ready := admitRound(byQueue[q], now, &res, func(j *Job) {
			rec, data, _ := arena.record(j) // a new row has no data column to keep
			rows = append(rows, []any{j.ID(), q, pgState(j.state), j.Priority, sortKey(j), pgRunAt(j, now), j.CreatedAt, rec, pgPlainDone(j), data})
		})
		if _, err := tx.CopyFrom(ctx, table, pgCopyCols, pgx.CopyFromRows(rows)); err != nil {
			return fmt.Errorf("insert jobs: copy: %w", err)
		}
		done[q] = res
		if ready {
			wake = append(wake, q)
			made = append(made, len(rows))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("insert jobs: %w", err)
	}
	if len(wake) > 0 {
		p.wakeEverywhere(wake, made)
	}
	return nil
}

// insertPlain writes plain jobs in one transaction through insertJobs.
func (p *PG) insertPlain(ctx context.Context, batch []*pgPushReq, order []string, byQueue map[string][]*pgPushReq, done map[string]pgInserted, refused map[string]error) error {
	var tl []timelineMark
	for _, r := range batch {
		for _, j := range r.jobs {
			tl = append(tl, j.timelineMark())
		}
	}
	// Two brokers inserting the same unique keys in another order may
	// deadlock; PostgreSQL aborts one, which runs again.
	return pgRetry(ctx, func() error {
		i := 0
		for _, r := range batch {
			for _, j := range r.jobs {
				j.timelineBack(tl[i])
				i++
			}
		}
		tx, err := p.begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.Background())
		clear(refused)
		for _, q := range order {
			reqs := byQueue[q]
			var jobs []*Job
			for _, r := range reqs {
				jobs = append(jobs, r.jobs...)
			}
			// Plain jobs are refused only for a queue past --max-queues
			// (nothing of it is left in tx); any other error is the
			// database's.
			res, err := p.insertJobs(ctx, tx, q, jobs)
			var rf pgRefused
			if errors.As(err, &rf) {
				refused[q] = rf.error
				continue
			}
			if err != nil {
				return err
			}
			ids := res.ids
			for _, r := range reqs {
				r.ids, ids = ids[:len(r.jobs):len(r.jobs)], ids[len(r.jobs):]
			}
			done[q] = res
		}
		return tx.Commit(ctx)
	})
}
