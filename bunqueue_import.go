package main

// A bunqueue deployment's data in queued's terms, for `queued migrate
// --from-bunqueue`. The readers (bunqueue_sqlite.go for the reference's
// data file, bunqueue_pg.go for its PostgreSQL tables) hand each stored
// job over as the map the reference itself rebuilds from storage (its Job
// object: rowToJob in sqliteSerializer.js, the payload column in
// PostgreSQL); from there one reading here makes our job of it, through
// PUSH's own checks, so that a job queued would refuse from a client is
// refused from a file too, with PUSH's words.
//
// What comes across is written into a new queued data file (writeSQLite);
// a PostgreSQL target is filled from that file by the SQLite-to-PostgreSQL
// migration (migrate_to_pg.go), so that each target is written one way only.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
)

// bqSource is everything read from a bunqueue deployment.
type bqSource struct {
	what     string // where it came from, for messages
	jobs     []bqJob
	logs     map[string][]LogEntry
	crons    []CronSchedule
	queues   map[string]*bqQueue
	kids     map[string][]bqKid // a parent's failed and ignored children
	before   queueCounts        // as the reference shows them
	order    []string           // queues in the order they came
	requeued int                // active jobs that wait again
	// refused holds the first maxShownRefusals things that cannot come
	// across, and why; nRefused counts them all: a file of a million bad
	// rows is refused in a report of a few lines, not a million strings.
	refused  []string
	nRefused int
	// readSteps counts the job records the SQLite reader handles in its
	// passes over the jobs and dead-letter tables (read, replaced, kept): a
	// few for each row, which a test holds it to without timing it (it was
	// n² for n entries whose jobs also had rows in the jobs table).
	readSteps int
}

// bqJob is one job read, with its result when it completed.
type bqJob struct {
	j      *Job
	result Raw
}

// bqKid is a child's failure as the parent keeps it (the reference's
// flow_failures): mode "ignore" goes to the ignored failures, the others
// to the failed children's values.
type bqKid struct {
	key, mode, err string
}

// bqQueue is a queue's settings as the reference stores them.
type bqQueue struct {
	paused     bool
	rate       *RateLimit
	conc       int64 // 0: none
	stall      stallPatch
	hasStall   bool
	dlq        dlqPatch
	hasDLQ     bool
	groupState []bqGroup
}

// bqGroup is a group's settings (the reference's group_state).
type bqGroup struct {
	id               string
	paused           bool
	conc             int64
	rateMax, rateDur int64
}

func newBQSource(what string) *bqSource {
	return &bqSource{what: what, logs: map[string][]LogEntry{}, queues: map[string]*bqQueue{},
		kids: map[string][]bqKid{}, before: queueCounts{}}
}

func (src *bqSource) queue(name string) *bqQueue {
	q := src.queues[name]
	if q == nil {
		q = &bqQueue{}
		src.queues[name] = q
		src.order = append(src.order, name)
	}
	return q
}

// maxShownRefusals is how many refusals the report lists.
const maxShownRefusals = 20

func (src *bqSource) refuse(format string, args ...any) {
	src.nRefused++
	if len(src.refused) < maxShownRefusals {
		src.refused = append(src.refused, fmt.Sprintf(format, args...))
	}
}

// addJob reads one reference job: row names the table and row it came
// from, m is its Job object, state the state the reference stored, dlq its
// dead-letter entry (failed jobs) and retry its record of failed attempts
// (jobs retrying); result is kept as stored.
func (src *bqSource) addJob(row string, m Map, state string, dlq, retry Raw, result Raw, now int64) {
	j, err := bqJobOf(m, state, now)
	if err == nil {
		err = bqAttempts(j, dlq, retry)
	}
	if err != nil {
		src.refuse("%s: %v", row, err)
		return
	}
	if j.state == StateFailed && j.dlq == nil {
		j.ensureDLQEntry()
	}
	src.queue(j.Queue)
	if j.state != StateCompleted {
		result = nil
	}
	src.jobs = append(src.jobs, bqJob{j: j, result: clone(result)})
}

// bqJobOf makes our job of the reference's Job object m.
func bqJobOf(m Map, state string, now int64) (*Job, error) {
	m = withoutNils(m)
	id, err := bqID(m.Get("id"))
	if err != nil {
		return nil, fmt.Errorf("a job's id: %w", err)
	}
	queue, _, err := m.Str("queue")
	if err == nil {
		err = validQueueName(queue, queue != "")
	}
	if err != nil {
		return nil, fmt.Errorf("job %s: queue: %w", id, err)
	}
	created, _, err := bqTime(m, "createdAt", "createdAt")
	if err != nil {
		return nil, fmt.Errorf("job %s of queue %s: %w", id, queue, err)
	}
	// PUSH's reading of the options the Job object shares with a PUSH
	// (name, data, priority, attempts, backoff, ttl, timeout, group, keys,
	// links, limits and flags), and its checks.
	j, err := parseJob(m, queue, "customId", created)
	if err != nil {
		return nil, fmt.Errorf("job %s of queue %s: %w", id, queue, err)
	}
	j.setID(id)
	j.warm().arrived = 0 // not a push that came late: see push_options.go
	if err := bqJobState(m, j); err != nil {
		return nil, fmt.Errorf("job %s of queue %s: %w", id, queue, err)
	}
	st, ok := bqStates[state]
	if !ok {
		return nil, fmt.Errorf("job %s of queue %s: state %q is not one bunqueue 2.9 stores", id, queue, state)
	}
	j.state = st
	j.settle()
	return j, nil
}

// withoutNils drops the fields set to null: the reference's objects spell
// out what a client's request leaves out.
func withoutNils(m Map) Map {
	out := Map{Fields: make([]Field, 0, len(m.Fields))}
	for _, f := range m.Fields {
		if !f.Val.IsNil() || string(f.Key) == "data" { // null data is the user's
			out.Fields = append(out.Fields, f)
		}
	}
	return out
}

// bqStates are the reference's stored states; waiting, prioritized and
// delayed are told apart again from the job's run time and priority as a
// restart does (migrateJob), so they read alike here.
var bqStates = map[string]State{
	"waiting": StateWaiting, "prioritized": StateWaiting, "delayed": StateWaiting, "paused": StateWaiting,
	"active": StateActive, "completed": StateCompleted, "failed": StateFailed,
	"waiting-children": StateWaitingChildren,
}

// bqID reads a job id: a string, or a number the reference's msgpack kept
// as one.
func bqID(r Raw) (string, error) {
	if s, err := r.Str(); err == nil && s != "" {
		return s, nil
	}
	if n, err := rawInt(r); err == nil && !r.IsNil() {
		return fmt.Sprint(n), nil
	}
	return "", errors.New("missing, or neither a string nor a number")
}

// bqTimeRule is the range of a time (ms since 1970) read from a bunqueue
// deployment: the dates a PUSH's timestamp may give, up to maxTimestamp
// (past the year 33000), far enough from int64's end that a delay added
// to one cannot wrap around. Read unchecked, a run_at of 2^63-1 became a
// runAt of -9.2e18 (the float64 past int64's end converts to its other
// end): a delayed job was waiting and handed out before every other.
var bqTimeRule = numRule{min: 0, max: maxTimestamp}

// bqTime reads the time at key, refused in PUSH's words (naming it label)
// when it is not a finite number in bqTimeRule's range.
func bqTime(m Map, key, label string) (int64, bool, error) {
	f, ok, err := m.Num(key)
	if err != nil || !ok {
		return 0, ok, err
	}
	if err := bqTimeRule.check(label, f); err != nil {
		return 0, false, err
	}
	return int64(f), true, nil
}

// bqJobState reads what a job's run left on it: its times, attempts,
// progress, stack trace, stalls, backoff object, dedup settings and
// timeline.
func bqJobState(m Map, j *Job) error {
	for _, f := range []struct {
		key string
		set func(int64)
	}{{"runAt", func(v int64) { j.RunAt = v }}, {"startedAt", j.setStartedAt}, {"completedAt", j.setDoneAt}, {"lastHeartbeat", j.setHeartbeat}} {
		v, ok, err := bqTime(m, f.key, f.key)
		if err != nil {
			return err
		}
		if ok {
			f.set(v)
		}
	}
	if a, _, err := m.Int("attempts"); err != nil {
		return err
	} else {
		j.Attempts = int32(max(0, min(a, maxAttemptCap)))
	}
	if n, _, err := m.Int("stallCount"); err != nil {
		return err
	} else if n > 0 {
		j.warm().Stalls = int32(min(n, maxAttemptCap))
	}
	if n, _, err := m.Int("childrenCompleted"); err != nil {
		return err
	} else if n > 0 {
		j.warm().ChildDone = int32(min(n, maxDeps))
	}
	if err := bqBackoff(m, j); err != nil {
		return err
	}
	if ttl, err := optNum(m, "deduplicationTtl"); err != nil {
		return err
	} else {
		j.warm().DedupTTL = ttl
	}
	j.warm().DedupExtend = truthy(m, "deduplicationExtend")
	j.warm().DedupReplace = truthy(m, "deduplicationReplace")
	if p := m.Get("progress"); !p.IsNil() {
		if f, err := p.Float(); err != nil || f != 0 {
			j.warm().Progress = clone(p)
		}
	}
	if msg, ok, err := m.Str("progressMessage"); err != nil {
		return err
	} else if ok {
		j.warm().ProgressMsg, j.warm().HasProgressMsg = msg, true
	}
	if st, _, err := m.Strs("stacktrace"); err != nil {
		return err
	} else if st != nil {
		j.warm().Stack = st
	}
	return bqTimeline(m, j)
}

// bqBackoff reads the backoff object, which the reference keeps beside the
// number (backoffConfig), with the ranges PUSH gives its backoff object.
func bqBackoff(m Map, j *Job) error {
	c, ok, err := m.Map("backoffConfig")
	if err != nil || !ok {
		return err
	}
	typ, _, _ := c.Str("type")
	d, _, err := numField(c, "delay", "backoffConfig.delay", numRule{min: 0, max: maxTimeoutMs})
	if err != nil {
		return err
	}
	b := &Backoff{Exponential: typ == "exponential", Delay: int64(d), MaxDelay: none}
	if md, ok, err := numField(c, "maxDelay", "backoffConfig.maxDelay", numRule{min: 0, max: maxDelayMs}); err != nil {
		return err
	} else if ok && md > 0 {
		b.MaxDelay = int64(md)
	}
	j.warm().BackoffObj, j.warm().Backoff = b, b.Delay
	return nil
}

// bqTimeline reads the job's timeline; steps of a state queued has no name
// for are left out.
func bqTimeline(m Map, j *Job) error {
	items, _, err := m.Array("timeline")
	if err != nil {
		return err
	}
	for _, it := range items {
		e, err := ParseMap(it, nil)
		if err != nil {
			return fmt.Errorf("timeline: %w", err)
		}
		name, _, _ := e.Str("state")
		st, ok := stateNamed([]byte(name))
		if !ok {
			continue
		}
		at, _, err := bqTime(e, "timestamp", "timeline.timestamp")
		if err != nil {
			return err
		}
		te := TimelineEntry{At: at, State: st}
		if msg, ok, _ := e.Str("error"); ok {
			te.Error, te.HasErr = msg, true
		}
		if n, ok, _ := e.Int("attempt"); ok {
			te.Attempt = int32(min(max(n, 0), maxAttemptCap))
		}
		j.addTimeline(te)
	}
	return nil
}

// bqAttempts reads the dead-letter entry of a failed job (dlq) or the
// record of failed attempts of one retrying (retry): the same shape, the
// reference's DlqEntry without or with its job.
func bqAttempts(j *Job, dlq, retry Raw) error {
	src, what := dlq, "dead-letter entry"
	if src.IsNil() {
		src, what = retry, "record of failed attempts"
	}
	if src.IsNil() {
		return nil
	}
	fail := func(err error) error {
		return fmt.Errorf("job %s of queue %s: %s: %w", j.ID(), j.Queue, what, err)
	}
	m, err := ParseMap(src, nil)
	if err != nil {
		return fail(err)
	}
	items, _, err := m.Array("attempts")
	if err != nil {
		return fail(err)
	}
	for _, it := range items {
		a, err := ParseMap(it, nil)
		if err != nil {
			return fail(fmt.Errorf("attempts: %w", err))
		}
		n, _, _ := a.Int("attempt")
		started, _, err := bqTime(a, "startedAt", "attempts.startedAt")
		if err != nil {
			return fail(err)
		}
		failed, _, err := bqTime(a, "failedAt", "attempts.failedAt")
		if err != nil {
			return fail(err)
		}
		reason, _, _ := a.Str("reason")
		msg, hasErr, _ := a.Str("error")
		j.recordAttempt(started, failed, reason, msg, hasErr)
		if h := j.cold().history; len(h) > 0 {
			h[len(h)-1].Attempt = int32(min(max(n, 0), maxAttemptCap))
		}
	}
	if dlq.IsNil() || j.state != StateFailed {
		return nil
	}
	e := &DLQEntry{}
	for _, f := range []struct {
		key string
		dst *int64
	}{{"enteredAt", &e.EnteredAt}, {"lastRetryAt", &e.LastRetryAt}, {"nextRetryAt", &e.NextRetryAt}, {"expiresAt", &e.ExpiresAt}} {
		if v, ok, err := bqTime(m, f.key, f.key); err != nil {
			return fail(err)
		} else if ok {
			*f.dst = v
		}
	}
	e.Reason, _, _ = m.Str("reason")
	e.Error, e.HasErr, _ = m.Str("error")
	if n, _, _ := m.Int("retryCount"); n > 0 {
		e.RetryCount = int32(min(n, maxAttemptCap))
	}
	if e.Reason == "" {
		e.Reason = "unknown"
	}
	j.dlq = e
	return nil
}

// policy reads one of a queue's stored policy objects (row names the table
// and row, col the column), if there is one; one it cannot read is
// refused.
func (src *bqSource) policy(row, col string, b []byte, read func(Raw) error) {
	if len(b) == 0 {
		return
	}
	if err := read(Raw(b)); err != nil {
		src.refuse("%s: %s: %v", row, col, err)
	}
}

// duration checks a queue's or group's stored time (a rate limit's
// window, a stall interval, a dead-letter retry interval or age) against
// the range the command that sets it takes, PUSH's for a delay: a value
// past int64's end would otherwise wrap around (a window of -9.2e18 ms).
// ok is whether there is a value.
func (src *bqSource) duration(row, label string, f float64, ok bool) bool {
	if !ok {
		return true
	}
	if err := delayRule.check(label, f); err != nil {
		src.refuse("%s: %v", row, err)
		return false
	}
	return true
}

// addCron reads a schedule: row names the table and row it came from, m
// is the reference's cron record (its CronJob object), read as the Cron
// command reads one, with its next run (a time, checked as one) and
// executions as stored.
func (src *bqSource) addCron(row string, m Map, nextRun float64, executions int64) {
	c, err := readCron(withoutNils(m))
	if err == nil {
		err = c.compile()
	}
	if err == nil {
		err = bqTimeRule.check("nextRun", nextRun)
	}
	if err != nil {
		src.refuse("%s: %v", row, err)
		return
	}
	c.NextRun, c.Executions = int64(nextRun), max(executions, 0)
	src.crons = append(src.crons, c)
}

// counted fills before: the jobs as the reference shows them, an active one
// (its worker gone with the server) as waiting again, as both servers do
// after a restart.
func (src *bqSource) counted(now int64) {
	done := map[string]bool{}
	for _, bj := range src.jobs {
		done[bj.j.ID()] = bj.j.state == StateCompleted
	}
	for _, bj := range src.jobs {
		if bj.j.state == StateActive {
			src.requeued++
		}
		migrateJob(bj.j, now, done)
		src.before.add(bj.j.Queue, bj.j.stateAt(now))
	}
}

// linkFlows gives each parent what its children left: the results of those
// that completed, and the failures kept of those that failed.
func (src *bqSource) linkFlows() {
	byID := make(map[string]*bqJob, len(src.jobs))
	for i := range src.jobs {
		byID[src.jobs[i].j.ID()] = &src.jobs[i]
	}
	for i := range src.jobs {
		p := src.jobs[i].j
		for _, kid := range p.cold().Children {
			if c := byID[kid]; c != nil && c.j.state == StateCompleted && c.result != nil {
				p.warm().childValues = setKV(p.cold().childValues, c.j.Queue+":"+c.j.ID(), c.result)
			}
		}
		for _, k := range src.kids[p.ID()] {
			var e Enc
			e.Str(k.err)
			if k.mode == "ignore" {
				p.warm().ignoredKids = setKV(p.cold().ignoredKids, k.key, Raw(e.B))
			} else {
				p.warm().failedKids = setKV(p.cold().failedKids, k.key, Raw(e.B))
			}
		}
		p.settle()
	}
}

// writeSQLite writes what was read into a new queued data file at path,
// all or nothing: into a file beside it first, read back and counted, then
// renamed into place. It answers the counts read back.
func (src *bqSource) writeSQLite(ctx context.Context, path string, now int64) (*sqliteSource, error) {
	if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
		return nil, fmt.Errorf("%s already exists; name a new data file (queued migrate --from-bunqueue writes a new one)", path)
	}
	tmp := path + ".migrating"
	for _, suffix := range []string{"", "-wal", "-shm"} {
		os.Remove(tmp + suffix)
	}
	cleanup := func() {
		for _, suffix := range []string{"", "-wal", "-shm"} {
			os.Remove(tmp + suffix)
		}
	}
	if err := src.fill(tmp); err != nil {
		cleanup()
		return nil, err
	}
	back, err := readBack(ctx, tmp, now)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("read back %s: %w", tmp, err)
	}
	if err := sameCounts(src.before, back.before); err != nil {
		cleanup()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		cleanup()
		return nil, fmt.Errorf("move the new data file into place: %w", err)
	}
	return back, nil
}

// fill writes the data into a new data file at path, through the store's
// own writer: queue settings through a broker's setters, as commands would
// make them; jobs, schedules and logs as records.
func (src *bqSource) fill(path string) error {
	sq, err := OpenSQLite(path, "normal", slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	sq.Start()
	b := NewMemEngine(1, sq)
	ctx := context.Background()
	var ferr error
	for _, name := range src.order {
		if err := src.queues[name].apply(ctx, b, name); err != nil {
			ferr = cmp.Or(ferr, fmt.Errorf("queue %s: %w", name, err))
		}
	}
	// Jobs in the order they were made (ids break ties, as UUIDv7s sort by
	// time): the sequence orders jobs of equal priority.
	slices.SortStableFunc(src.jobs, func(x, y bqJob) int {
		return cmp.Or(cmp.Compare(x.j.CreatedAt, y.j.CreatedAt), strings.Compare(x.j.ID(), y.j.ID()))
	})
	for i := range src.jobs {
		bj := &src.jobs[i]
		bj.j.seq = int64(i + 1)
		sq.JobChanged(bj.j, bj.result)
	}
	for i := range src.crons {
		sq.CronChanged(&src.crons[i])
	}
	for id, logs := range src.logs {
		sq.LogsChanged(id, logs)
	}
	b.Close()
	if err := sq.Sync(); err != nil {
		ferr = cmp.Or(ferr, err)
	}
	if err := sq.Close(); err != nil {
		ferr = cmp.Or(ferr, err)
	}
	return ferr
}

// apply gives the queue its settings through the broker's setters.
func (q *bqQueue) apply(ctx context.Context, b *MemEngine, name string) error {
	if q.paused {
		if err := b.SetPaused(ctx, name, true); err != nil {
			return err
		}
	}
	if q.rate != nil {
		if err := b.SetRateLimit(ctx, name, *q.rate); err != nil {
			return err
		}
	}
	if q.conc > 0 {
		if err := b.SetConcurrency(ctx, name, q.conc); err != nil {
			return err
		}
	}
	if q.hasStall {
		if err := b.SetStallConfig(ctx, name, q.stall); err != nil {
			return err
		}
	}
	if q.hasDLQ {
		if err := b.SetDLQConfig(ctx, name, q.dlq); err != nil {
			return err
		}
	}
	for _, g := range q.groupState {
		if g.paused {
			if _, err := b.SetGroupPaused(ctx, name, g.id, true); err != nil {
				return err
			}
		}
		if g.conc > 0 {
			if err := b.SetGroupConcurrency(ctx, name, g.id, g.conc); err != nil {
				return err
			}
		}
		if g.rateMax > 0 && g.rateDur > 0 {
			if err := b.SetGroupRateLimit(ctx, name, g.id, groupLimit{max: g.rateMax, duration: g.rateDur}); err != nil {
				return err
			}
		}
	}
	return nil
}

// readBack opens the new data file as the server would and counts it.
func readBack(ctx context.Context, path string, now int64) (*sqliteSource, error) {
	sq, err := OpenSQLite(path, "normal", slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	defer sq.Close()
	back, err := readSQLite(ctx, sq, now)
	if err != nil {
		return nil, err
	}
	if back.bad > 0 {
		return nil, fmt.Errorf("%d job records could not be read back", back.bad)
	}
	return back, nil
}

// sameCounts fails when two countings of the same jobs differ.
func sameCounts(want, got queueCounts) error {
	var diff []string
	for q, w := range want {
		g := got.of(q)
		if *g != *w {
			diff = append(diff, fmt.Sprintf("%s: %+v, read back %+v", q, *w, *g))
		}
	}
	for q, g := range got {
		if _, ok := want[q]; !ok && jobTotal(g) > 0 {
			diff = append(diff, fmt.Sprintf("%s: none, read back %+v", q, *g))
		}
	}
	if len(diff) > 0 {
		slices.Sort(diff)
		return fmt.Errorf("the counts read back differ from the source's; nothing migrated:\n  %s", strings.Join(diff, "\n  "))
	}
	return nil
}

// report prints what was read, and what cannot come across.
func (src *bqSource) report(out io.Writer) error {
	fmt.Fprintf(out, "Before: %s\n", src.what)
	printCounts(out, src.before, src.order)
	paused := 0
	for _, q := range src.queues {
		if q.paused {
			paused++
		}
	}
	fmt.Fprintf(out, "%d logs, %d cron schedules, %d queues, %d paused\n", len(src.logs), len(src.crons), len(src.queues), paused)
	if src.requeued > 0 {
		fmt.Fprintf(out, "%d active jobs wait again, with their attempts kept: their workers are gone\n", src.requeued)
	}
	if src.nRefused > 0 {
		fmt.Fprintf(out, "%d things cannot come across; nothing migrated:\n", src.nRefused)
		for _, r := range src.refused {
			fmt.Fprintf(out, "  %s\n", r)
		}
		if more := src.nRefused - len(src.refused); more > 0 {
			fmt.Fprintf(out, "  ... and %d more\n", more)
		}
		return fmt.Errorf("%s: %d things cannot come across (listed above); nothing migrated", src.what, src.nRefused)
	}
	return nil
}
