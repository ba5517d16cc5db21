package main

// The memory engine's reads (ReadEngine): one job, a page of a queue's
// jobs, counts, progress, logs, and waiting for a job to finish.
// pg_query.go answers the same in PostgreSQL mode.

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// noJob is the view of a job that does not exist.
var noJob = JobView{State: StateNone.String()}

// resultOf is a completed job's result while the results cache keeps it.
func (b *MemEngine) resultOf(j *Job) Raw {
	if j.state != StateCompleted {
		return nil
	}
	r, _ := b.getResult(j.key())
	return r
}

// view is the reader's view of j labelled state; s.mu is held.
func (b *MemEngine) view(j *Job, state string) JobView {
	return JobView{Job: j.readCopy(), State: state, Result: b.resultOf(j)}
}

// ReadJob reads one job, as it is now.
func (b *MemEngine) ReadJob(ctx context.Context, id string) (JobView, error) {
	v := noJob
	b.withJob(id, func(j *Job, _ *Shard) { v = b.view(j, j.stateAt(b.now()).String()) })
	return b.readHistory(ctx, id, v)
}

// ReadJobByCustomID reads the job holding a custom id while it is live:
// this engine, as the reference's memory engine, forgets a custom id once
// its job has finished.
func (b *MemEngine) ReadJobByCustomID(ctx context.Context, id string) (JobView, error) {
	v, err := b.ReadJob(ctx, id)
	if err != nil || !customIDFinds(v.Job, false) {
		return noJob, err
	}
	return v, nil
}

func (b *MemEngine) counts(queue string) JobCounts {
	s := b.shardOf(queue)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[queue]
	if q == nil {
		return JobCounts{}
	}
	s.promote(b.now())
	c := JobCounts{Waiting: q.nReady - q.nPrio, Prioritized: q.nPrio, Delayed: q.nDelayed,
		Active: q.nActive, Completed: q.nDone + q.nCold, Failed: len(q.dlq), WaitingChildren: len(q.wc)}
	if q.paused {
		c.Paused = c.Waiting + c.Prioritized
		c.Waiting, c.Prioritized = 0, 0
	}
	return c
}

func (b *MemEngine) Counts(_ context.Context, queue string) (JobCounts, error) {
	return b.counts(queue), nil
}

func (b *MemEngine) CountsPerPriority(_ context.Context, queue string) (map[int64]int, error) {
	s := b.shardOf(queue)
	var per map[int64]int
	s.with(func() { _, per = s.countsPerPriority(queue) })
	return per, nil
}

// countsPerPriority counts a queue's waiting and delayed jobs by priority,
// keys in JavaScript object order; s.mu is held.
func (s *Shard) countsPerPriority(queue string) ([]int64, map[int64]int) {
	per := map[int64]int{}
	if q := s.queues[queue]; q != nil {
		q.eachReady(func(j *Job) { per[j.Priority]++ })
		s.delayed.Each(func(e *hent) bool {
			if e.job.Queue == queue {
				per[e.job.Priority]++
			}
			return true
		})
	}
	return priorityKeys(per), per
}

// priorityKeys are per's keys in JavaScript object order: non-negative
// integer keys ascending, then the rest (here: negatives).
func priorityKeys(per map[int64]int) []int64 {
	keys := make([]int64, 0, len(per))
	for k := range per {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b int64) int {
		if (a < 0) != (b < 0) {
			if a < 0 {
				return 1
			}
			return -1
		}
		return int(a - b)
	})
	return keys
}

// ---------------------------------------------------------------------------
// GetJobs

// jobsQuery are GetJobs' fields. The state filter: absent or [] means
// every state; a single name labels every job it returns with that name,
// as the reference does.
type jobsQuery struct {
	want          []string
	single        string
	offset, limit int64
	asc           bool
	// maxBytes, when set, lets an engine stop reading jobs once their
	// answer would pass it (answer_budget.go); the handler cuts the page to it.
	maxBytes int64
}

// wants says whether the filter selects state st.
func (a jobsQuery) wants(st string) bool { return len(a.want) == 0 || slices.Contains(a.want, st) }

// Jobs is a page of a queue's jobs, labelled with their states (the
// handler applies a single state's label).
func (b *MemEngine) Jobs(ctx context.Context, queue string, a jobsQuery) ([]JobView, error) {
	s := b.shardOf(queue)
	cold, results, nCold, err := b.coldListed(ctx, s, queue, a)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.promote(b.now())
	q := s.queues[queue]
	if q == nil {
		return nil, nil
	}
	every := func(fn func(it jobItem)) {
		s.eachListed(q, a, fn)
		for _, j := range cold {
			fn(jobItem{j, "completed"})
		}
	}
	n := nCold
	s.eachListed(q, a, func(jobItem) { n++ })
	list := pageOf(every, n, a.offset, a.limit, a.asc)
	out := make([]JobView, len(list))
	for i, it := range list {
		if r, ok := results[it.j]; ok {
			out[i] = JobView{Job: it.j, State: it.label, Result: r}
			continue
		}
		out[i] = b.view(it.j, it.label)
	}
	return out, nil
}

// coldListed reads the retired jobs of a queue that can rank within a
// GetJobs page (history.go), with their results, and says how many the
// queue has.
func (b *MemEngine) coldListed(ctx context.Context, s *Shard, queue string, a jobsQuery) ([]*Job, map[*Job]Raw, int, error) {
	if b.hist == nil || !a.wants("completed") {
		return nil, nil, 0, nil
	}
	nHot, nCold := 0, 0
	s.with(func() {
		if q := s.queues[queue]; q != nil && q.nCold > 0 {
			nCold = q.nCold
			s.eachListed(q, a, func(jobItem) { nHot++ })
		}
	})
	if nCold == 0 {
		return nil, nil, 0, nil
	}
	lo, hi, k, fromFront := pageSide(nHot+nCold, a.offset, a.limit)
	if lo >= hi {
		return nil, nil, nCold, nil
	}
	// From the back, the page's last ones are the first in the other order.
	asc := a.asc == fromFront
	cold, results, err := b.hist.RetiredPage(ctx, queue, min(k, nCold), asc)
	return cold, results, nCold, err
}

// eachListed visits the jobs of q that a selects, with their labels; s.mu
// is held.
func (s *Shard) eachListed(q *Queue, a jobsQuery, fn func(it jobItem)) {
	explicit := len(a.want) > 0
	q.eachReady(func(j *Job) {
		st := j.state.String()
		switch {
		case q.paused && explicit:
			if a.wants("paused") {
				fn(jobItem{j, "paused"})
			}
		case a.wants(st):
			fn(jobItem{j, st})
		}
	})
	if a.wants("delayed") {
		s.delayed.Each(func(e *hent) bool {
			if e.job.Queue == q.name {
				fn(jobItem{e.job, "delayed"})
			}
			return true
		})
	}
	if a.wants("active") {
		s.leases.Each(func(e *hent) bool {
			if e.job.Queue == q.name && e.job.state == StateActive {
				fn(jobItem{e.job, "active"})
			}
			return true
		})
	}
	s.eachFinished(q, a, fn)
}

// eachFinished is eachListed's completed, failed and waiting-children
// jobs; s.mu is held.
func (s *Shard) eachFinished(q *Queue, a jobsQuery, fn func(it jobItem)) {
	if a.wants("completed") {
		for i := s.doneHead; i < len(s.done); i++ {
			if d := &s.done[i]; s.doneLiveEnt(d) && d.j.Queue == q.name {
				fn(jobItem{d.j, "completed"})
			}
		}
	}
	if a.wants("failed") {
		for _, j := range q.dlq {
			fn(jobItem{j, "failed"})
		}
	}
	if a.wants("waiting-children") {
		for j := range q.wc {
			fn(jobItem{j, "waiting-children"})
		}
	}
}

// jobItem is a job GetJobs lists, with the state it is listed under.
type jobItem struct {
	j     *Job
	label string
}

// pageJobs is the page GetJobs answers: the jobs every visits, ordered by
// creation time then id (descending unless asc), sliced as JavaScript's
// slice(offset, offset+limit) would slice them. Only the jobs of the page
// and those ranked on the near side of it are kept, in a bounded heap,
// so that a small page of a large queue sorts only a small page: a page
// near the end is found from the end.
func pageJobs(every func(fn func(it jobItem)), offset, limit int64, asc bool) []jobItem {
	n := 0
	every(func(jobItem) { n++ })
	return pageOf(every, n, offset, limit, asc)
}

// pageSide says where a page of n jobs lies, as JavaScript's slice gives
// it (lo, hi), and how it is found: from the front, keeping the k first,
// or from the back, keeping the k last.
func pageSide(n int, offset, limit int64) (lo, hi, k int, fromFront bool) {
	lo, hi = jsSlice(n, offset, offset+limit)
	fromFront = hi <= n-lo
	k = n - lo
	if fromFront {
		k = hi
	}
	return lo, hi, k, fromFront
}

// pageOf is pageJobs of n jobs, of which every visits at least those on
// the side the page is found from (pageSide).
func pageOf(every func(fn func(it jobItem)), n int, offset, limit int64, asc bool) []jobItem {
	lo, hi, k, fromFront := pageSide(n, offset, limit)
	if lo >= hi {
		return nil
	}
	less := func(a, b jobItem) bool {
		c := cmpInt(a.j.CreatedAt, b.j.CreatedAt)
		if c == 0 {
			c = cmpStr(a.j.ID(), b.j.ID())
		}
		if !asc {
			c = -c
		}
		return c < 0
	}
	// worse says which of two kept jobs leaves the heap first: the root is
	// the kept job farthest from the page's side.
	worse := func(a, b jobItem) bool { return less(b, a) }
	if !fromFront {
		worse = less
	}
	h := keepBest(every, k, worse)
	slices.SortFunc(h, func(a, b jobItem) int {
		switch {
		case less(a, b):
			return -1
		case less(b, a):
			return 1
		}
		return 0
	})
	if fromFront {
		return h[lo:hi]
	}
	return h[:hi-lo]
}

// keepBest keeps, of the jobs every visits, the k that worse ranks best,
// in a heap whose root is the worst kept.
func keepBest(every func(fn func(it jobItem)), k int, worse func(a, b jobItem) bool) []jobItem {
	h := make([]jobItem, 0, k)
	down := func(i int) {
		for {
			c := 2*i + 1
			if c >= len(h) {
				return
			}
			if c+1 < len(h) && worse(h[c+1], h[c]) {
				c++
			}
			if !worse(h[c], h[i]) {
				return
			}
			h[i], h[c] = h[c], h[i]
			i = c
		}
	}
	every(func(it jobItem) {
		if len(h) < k {
			h = append(h, it)
			for i := len(h) - 1; i > 0; {
				p := (i - 1) / 2
				if !worse(h[i], h[p]) {
					break
				}
				h[i], h[p] = h[p], h[i]
				i = p
			}
			return
		}
		if worse(h[0], it) {
			h[0] = it
			down(0)
		}
	})
	return h
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// jsSlice gives the bounds Array.prototype.slice(start, end) would use.
func jsSlice(n int, start, end int64) (int, int) {
	norm := func(x int64) int {
		if x < 0 {
			x += int64(n)
			if x < 0 {
				x = 0
			}
		}
		if x > int64(n) {
			x = int64(n)
		}
		return int(x)
	}
	lo, hi := norm(start), norm(end)
	if hi < lo {
		hi = lo
	}
	return lo, hi
}

// ---------------------------------------------------------------------------
// Progress

func notActive(j *Job, now int64) error { return notActiveIn(j.stateAt(now).String()) }

// progressSet is what a Progress request sets.
type progressSet struct {
	id     string
	prog   Raw
	msg    string
	msgSet bool // a string: set it (null clears it)
	msgKey bool // undefined keeps the message
}

// apply sets the progress of an active job and returns its event.
func (u progressSet) apply(j *Job, now int64) (evArgs, error) {
	if j.state != StateActive {
		return evArgs{}, notActive(j, now)
	}
	if err := u.check(j); err != nil {
		return evArgs{}, err
	}
	j.warm().Progress = u.prog
	if u.msgKey {
		j.warm().ProgressMsg, j.warm().HasProgressMsg = u.msg, u.msgSet
	}
	j.setHeartbeat(now)
	return evArgs{progress: u.prog, progMsg: j.cold().ProgressMsg, hasProgMsg: j.cold().HasProgressMsg}, nil
}

// SetProgress sets an active job's progress and tells its subscribers.
func (b *MemEngine) SetProgress(_ context.Context, u progressSet) error {
	j, s := b.lockJob(u.id)
	if j == nil {
		return errJobNotFound
	}
	defer s.mu.Unlock()
	now := b.now()
	ev, err := u.apply(j, now)
	if err != nil {
		return err
	}
	s.emit(s.queues[j.Queue], evProgress, j, now, ev)
	b.persist(j)
	return nil
}

// ---------------------------------------------------------------------------
// Logs

// AddLog adds a log line, stamped now, to a job that exists.
func (b *MemEngine) AddLog(_ context.Context, id string, e LogEntry) error {
	if b.idxGet(id) == nil {
		return errJobNotFound
	}
	e.At = b.now()
	b.lmu.Lock()
	defer b.lmu.Unlock()
	logs, _ := b.logs.Get(id)
	// A new slice each time: what the store was handed stays as it was.
	logs = appendLog(logs, e)
	b.logs.Put(id, logs)
	b.logsChanged(id, logs)
	return nil
}

// Logs are a job's logs, oldest first (none for no job).
func (b *MemEngine) Logs(_ context.Context, id string) ([]LogEntry, error) {
	b.lmu.Lock()
	defer b.lmu.Unlock()
	logs, _ := b.logs.Get(id)
	return slices.Clone(logs), nil
}

// ClearLogs drops a job's logs but its keep newest (none when keep is
// not above zero).
func (b *MemEngine) ClearLogs(_ context.Context, id string, keep int64) error {
	b.lmu.Lock()
	defer b.lmu.Unlock()
	if keep <= 0 {
		if b.logs.Delete(id) {
			b.logsChanged(id, nil)
		}
	} else if logs, ok := b.logs.Peek(id); ok && len(logs) > int(keep) {
		kept := append(logs[:0:0], logs[len(logs)-int(keep):]...)
		b.logs.Put(id, kept)
		b.logsChanged(id, kept)
	}
	return nil
}

// ---------------------------------------------------------------------------
// WaitJob

// jobWait waits for the job Engine.WaitJob looked at: until it finishes
// (true, with how), its time runs out or ctx ends (false).
type jobWait func(ctx context.Context) (waitOutcome, bool, error)

// WaitJob looks at job id. When it has finished already, done says how;
// otherwise wait waits for it, at most timeout from when wait is called.
func (b *MemEngine) WaitJob(ctx context.Context, id string, timeout time.Duration) (*waitOutcome, jobWait, error) {
	ch := make(chan waitOutcome, 1)
	var done *waitOutcome
	var j *Job
	var s *Shard
	// The waiter is registered under the same lock as the look, so that a
	// finish in between is not missed.
	if !b.withJob(id, func(jj *Job, ss *Shard) {
		j, s = jj, ss
		switch j.state {
		case StateCompleted:
			res := b.resultOf(j)
			done = &waitOutcome{completed: true, result: res, hasResult: res != nil}
		case StateFailed:
			done = &waitOutcome{err: j.cold().failErr}
		default:
			j.warm().waiters = append(j.cold().waiters, ch)
		}
	}) {
		// A job completed long ago may be in history (history.go).
		v, err := b.readHistory(ctx, id, noJob)
		if err != nil || v.Job == nil {
			return nil, nil, cmp.Or(err, errJobNotFound)
		}
		return &waitOutcome{completed: true, result: v.Result, hasResult: v.Result != nil}, nil, nil
	}
	if done != nil {
		if done.completed && done.result == nil && j.seq > 0 {
			// The results cache let it go; history has it.
			if v, err := b.readHistory(ctx, id, JobView{Job: &Job{seq: j.seq}, State: StateCompleted.String()}); err == nil {
				done.result, done.hasResult = v.Result, v.Result != nil
			}
		}
		return done, nil, nil
	}
	return nil, func(ctx context.Context) (waitOutcome, bool, error) {
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case o := <-ch:
			return o, true, nil
		case <-t.C:
		case <-ctx.Done():
		}
		s.with(func() {
			if i := slices.Index(j.cold().waiters, ch); i >= 0 {
				j.warm().waiters = slices.Delete(j.cold().waiters, i, i+1)
			}
		})
		select {
		case o := <-ch: // finished just as time ran out
			return o, true, nil
		default:
		}
		return waitOutcome{}, false, nil
	}, nil
}
