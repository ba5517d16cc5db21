package main

import (
	"crypto/rand"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Job states as the wire names them.
type State uint8

const (
	StateNone State = iota
	StateWaiting
	StatePrioritized // waiting, with priority > 0
	StateDelayed
	StateActive
	StateCompleted
	StateFailed // in the dead-letter queue
	StateWaitingChildren
)

func (s State) String() string {
	switch s {
	case StateWaiting:
		return "waiting"
	case StatePrioritized:
		return "prioritized"
	case StateDelayed:
		return "delayed"
	case StateActive:
		return "active"
	case StateCompleted:
		return "completed"
	case StateFailed:
		return "failed"
	case StateWaitingChildren:
		return "waiting-children"
	}
	return "unknown"
}

// stateNamed is parseState for bytes, without making a string of them.
func stateNamed(b []byte) (State, bool) {
	for st := StateWaiting; st <= StateWaitingChildren; st++ {
		if st.String() == string(b) {
			return st, true
		}
	}
	return StateNone, false
}

// Defaults the reference applies to every job.
const (
	defaultMaxAttempts     = 3
	defaultBackoff         = 1000
	defaultStackTraceLimit = 10
	defaultLockTTL         = 30000
	maxBackoffDelay        = 3600000
	maxTimelineEntries     = 20
)

// none marks an absent optional integer (null on the wire).
const none = int64(-1 << 62)

// Backoff is the object form of a job's backoff option.
type Backoff struct {
	Exponential bool
	Delay       int64
	MaxDelay    int64 // none when unset
}

// TimelineEntry is one step of a job's history.
type TimelineEntry struct {
	At      int64
	Error   string
	Attempt int32 // 0 = absent
	State   State // a byte, not its name: an entry is 32 bytes, not 48
	HasErr  bool
}

// Lease is the lock a worker holds on an active job.
type Lease struct {
	Token     string
	Owner     string
	CreatedAt int64
	ExpiresAt int64
	TTL       int64
	Renewals  int32
}

// Job is the broker's record of one job. All fields are guarded by the lock
// of the shard that owns the job's queue.
type Job struct {
	// id is the job's id, read through ID() and set through setID (jobid.go).
	id        [16]byte
	Queue     string
	Name      string
	Data      Raw
	Priority  int64
	CreatedAt int64
	RunAt     int64
	// c holds what most jobs leave unset (jobCold): read through
	// cold(), written through warm().
	c *jobCold

	// Broker bookkeeping, never on the wire. The fields are ordered by
	// size, so that a Job is 160 bytes and fits that size class.
	seq      int64
	rt       *jobRun // what a job that has run needs; nil until then
	dlq      *DLQEntry
	hgen     [heapKinds]uint32
	dgen     uint32 // generation of the job's entry in the completed list
	Attempts int32  // a wire field, here beside dgen to fill its word

	// Flows (flows.go). pending counts dependencies not yet completed;
	// the two flags pair a completion with late dependency registrations
	// across shards without a shared lock on the completion path.
	pending int32
	flow    atomic.Uint32 // flowDep | flowDone

	state State
	// tl0, when set, is the first timeline entry's state, its time the
	// job's CreatedAt: nearly every job starts so, and a waiting job's one
	// entry then costs no 32-byte array of its own.
	tl0         State
	inHeap      [heapKinds]bool
	concSlot    bool // holds one of its queue's concurrency slots
	groupActive bool // counted in its group's active jobs
	dlqNew      bool // PostgreSQL mode: dead-lettered, dlq:added not yet announced
}

// jobRun is what only a job that has run (or moved on from its first
// state) needs: its lease, the connection that pulled it, when it must be
// looked at again, its start, completion and heartbeat times and its
// timeline past the first entry. A job that never ran (most of a
// backlog) carries one nil pointer instead of these 72 bytes, which puts
// a Job two size classes lower (160 bytes, not 208); a job that ran costs
// the same as with the fields in Job. Once made it stays, so that no path
// that ends a claim has to agree on when to let it go.
type jobRun struct {
	lease    *Lease
	owner    *conn // connection that pulled it, for release on disconnect
	deadline int64 // when the active job must be looked at again

	// Wire fields, read and written through the methods of the same
	// names (StartedAt, setStartedAt, ...).
	startedAt int64 // 0 = null
	doneAt    int64 // completedAt; 0 = null
	heartbeat int64
	// timeline is the job's history after its first entry when tl0 holds
	// that entry (see timeline); read it through Timeline(), timelineLen()
	// and lastTimelineState(), add to it through addTimeline.
	timeline []TimelineEntry
}

func (j *Job) StartedAt() int64 { return j.run().startedAt }
func (j *Job) DoneAt() int64    { return j.run().doneAt }

func (j *Job) Timeline() []TimelineEntry { return j.run().timeline }

// The setters make no part to clear a field a job lacks, as setLease.
func (j *Job) setStartedAt(v int64) {
	if v != 0 || j.rt != nil {
		j.running().startedAt = v
	}
}

func (j *Job) setDoneAt(v int64) {
	if v != 0 || j.rt != nil {
		j.running().doneAt = v
	}
}

// A job that never ran has its creation time as its last heartbeat (the
// reference sets it so at a push): it takes no run part to say so.
func (j *Job) Heartbeat() int64 {
	if j.rt == nil {
		return j.CreatedAt
	}
	return j.rt.heartbeat
}

func (j *Job) setHeartbeat(v int64) {
	if j.rt != nil || v != j.CreatedAt {
		j.running().heartbeat = v
	}
}

func (j *Job) setTimeline(t []TimelineEntry) {
	if t != nil || j.rt != nil {
		j.running().timeline = t
	}
}

// noRun is what a job never claimed reads (no lease, no owner); never
// written, as noCold.
var noRun jobRun

// run is the job's claim part for reading, as cold is its cold part.
func (j *Job) run() *jobRun {
	if j.rt == nil {
		return &noRun
	}
	return j.rt
}

// running is the job's claim part for writing, made the first time.
func (j *Job) running() *jobRun {
	if j.rt == nil {
		j.rt = &jobRun{heartbeat: j.CreatedAt} // as Heartbeat read it
	}
	return j.rt
}

// setLease and setOwner make no claim part to clear a field it lacks:
// a PostgreSQL job read for an ACK is cleared that way every time.
func (j *Job) setLease(l *Lease) {
	if l != nil || j.rt != nil {
		j.running().lease = l
	}
}

func (j *Job) setOwner(c *conn) {
	if c != nil || j.rt != nil {
		j.running().owner = c
	}
}

// The flow flags (Job.flow): someone registered as waiting for the job,
// and the job completed. One word, so that the handshake in flows.go is
// one atomic operation per side.
const (
	flowDep  = 1
	flowDone = 2
)

func (j *Job) markDepWaited()  { j.flow.Or(flowDep) }
func (j *Job) depWaited() bool { return j.flow.Load()&flowDep != 0 }
func (j *Job) markDone()       { j.flow.Or(flowDone) }
func (j *Job) isDone() bool    { return j.flow.Load()&flowDone != 0 }

// jobCold is the part of a job most jobs never set: flows, dedup,
// groups, progress, failures, the options' rarer settings. A job without
// any of it carries a nil pointer, not some 400 bytes of zeros: a
// million waiting jobs are a few hundred megabytes the smaller.
type jobCold struct {
	// The options every job has and few set, at their defaults in noCold.
	MaxAttempts int32
	Backoff     int64 // the retry delay, ms, whichever form the option came in
	TTL         int64 // none = null
	Timeout     int64

	BackoffObj                                                   *Backoff // the option given as an object; nil when a number
	UniqueKey                                                    string
	CustomID                                                     string
	DependsOn                                                    []string
	ParentID                                                     string
	Children                                                     []string
	ChildDone                                                    int32
	Tags                                                         []string
	GroupID                                                      string
	Progress                                                     Raw // a number or an object; nil reads as 0
	ProgressMsg                                                  string
	HasProgressMsg                                               bool
	Stack                                                        []string
	Repeat                                                       Raw
	Durable                                                      bool
	StallTimeout                                                 int64
	Stalls                                                       int32
	StackTraceLimit                                              int32
	KeepLogs                                                     int64
	SizeLimit                                                    int64
	Lifo                                                         bool
	RemoveOnComplete                                             bool
	RemoveOnFail                                                 bool
	FailParent, RemoveDepOnFail, ContinueParent, IgnoreDepOnFail bool
	DedupTTL                                                     int64
	DedupExtend, DedupReplace                                    bool
	DebounceID                                                   string
	DebounceTTL                                                  int64
	groupMax                                                     int64 // groupMaxSize asked at push (admission only)
	// arrived is the engine's time a push with a custom id reached the
	// broker (admission only): in PostgreSQL mode a push may be written
	// late, and it frees no custom id whose job finished after it came.
	arrived int64
	rawID   string // the job's id when it is not a canonical UUID (jobid.go)
	// pgData is the data as read from its row's data column (PostgreSQL
	// mode, pg_data.go): while the job's data is this very slice, a write
	// of the row leaves the column alone.
	pgData      Raw
	failErr     string
	hasFail     bool
	history     []AttemptRec
	waiters     []chan waitOutcome // WaitJob callers
	childValues []childKV          // results of children, by "queue:id"
	failedKids  []childKV          // continueParentOnFailure records (string values)
	ignoredKids []childKV          // ignoreDependencyOnFailure records
}

// noCold is what a job without cold fields reads: the defaults. It is
// never written: writes go through warm, which gives the job its own.
var noCold = jobCold{MaxAttempts: defaultMaxAttempts, Backoff: defaultBackoff, TTL: none, Timeout: none, StallTimeout: none, StackTraceLimit: defaultStackTraceLimit, KeepLogs: none, SizeLimit: none,
	DedupTTL: none, DebounceTTL: none}

// cold is the job's cold part for reading (the defaults when it has none).
func (j *Job) cold() *jobCold {
	if j.c == nil {
		return &noCold
	}
	return j.c
}

// warm is the job's cold part for writing, made from the defaults the
// first time.
func (j *Job) warm() *jobCold {
	if j.c == nil {
		c := coldPool.Get().(*jobCold)
		*c = noCold
		j.c = c
	}
	return j.c
}

// coldPool recycles the cold parts that parsing and decoding filled with
// nothing but defaults (settle): a plain job costs no garbage for them.
var coldPool = sync.Pool{New: func() any { return new(jobCold) }}

// settle gives back a cold part that holds only defaults, after a parse
// or a decode that wrote every field. Nothing may point into it: the
// callers took no pointers they keep.
func (j *Job) settle() {
	if j.c != nil && j.c.isDefault() {
		*j.c = jobCold{}
		coldPool.Put(j.c)
		j.c = nil
	}
}

// isDefault reports whether c holds only noCold's values (every slice,
// pointer and Raw nil). TestColdIsDefaultCoversEveryField keeps it whole.
func (c *jobCold) isDefault() bool {
	d := &noCold
	return c.MaxAttempts == d.MaxAttempts && c.Backoff == d.Backoff && c.TTL == d.TTL && c.Timeout == d.Timeout && c.BackoffObj == nil && c.UniqueKey == "" && c.CustomID == "" && c.DependsOn == nil &&
		c.ParentID == "" && c.Children == nil && c.ChildDone == 0 && c.Tags == nil && c.GroupID == "" &&
		c.Progress == nil && c.ProgressMsg == "" && !c.HasProgressMsg && c.Stack == nil && c.Repeat == nil &&
		!c.Durable && c.StallTimeout == d.StallTimeout && c.Stalls == 0 && c.StackTraceLimit == d.StackTraceLimit &&
		c.KeepLogs == d.KeepLogs && c.SizeLimit == d.SizeLimit && !c.Lifo && !c.RemoveOnComplete && !c.RemoveOnFail &&
		!c.FailParent && !c.RemoveDepOnFail && !c.ContinueParent && !c.IgnoreDepOnFail &&
		c.DedupTTL == d.DedupTTL && !c.DedupExtend && !c.DedupReplace && c.DebounceID == "" &&
		c.DebounceTTL == d.DebounceTTL && c.groupMax == 0 && c.arrived == 0 && c.rawID == "" && c.failErr == "" && !c.hasFail &&
		c.history == nil && c.waiters == nil && c.childValues == nil && c.failedKids == nil && c.ignoredKids == nil &&
		c.pgData == nil
}

func (j *Job) addTimeline(e TimelineEntry) {
	n := len(j.Timeline())
	switch {
	case n == 0 && j.tl0 == StateNone && j.impliable(e):
		j.tl0 = e.State // the first entry, implied
	case n+j.implied() >= maxTimelineEntries:
	case n == 0 && j.tl0 != StateNone:
		// Most jobs go on to active and completed: room for both at once.
		j.setTimeline(append(make([]TimelineEntry, 0, 2), e))
	case n == 1 && cap(j.Timeline()) == 1:
		// The same when the first entry is kept (it had another time).
		j.setTimeline(append(make([]TimelineEntry, 0, 3), j.Timeline()[0], e))
	default:
		j.setTimeline(append(j.Timeline(), e))
	}
}

// addFirstEntry adds the timeline entry of a job's admission, in the
// state it was given. A new job's entry carries its creation time, as the
// reference's does (a batch is parsed a moment before it is admitted).
func (j *Job) addFirstEntry(now int64) {
	at := now
	if j.timelineLen() == 0 && j.CreatedAt > 0 && j.CreatedAt <= now {
		at = j.CreatedAt
	}
	j.addTimeline(TimelineEntry{State: j.state, At: at})
}

// impliable reports whether e, as the job's first timeline entry, can be
// held by tl0: a known state at the job's creation, no error, no attempt.
func (j *Job) impliable(e TimelineEntry) bool {
	return e.State != StateNone && e.At == j.CreatedAt && !e.HasErr && e.Attempt == 0
}

// implied is 1 when the first timeline entry is held by tl0.
func (j *Job) implied() int {
	if j.tl0 != StateNone {
		return 1
	}
	return 0
}

// timelineLen is the number of entries in the job's timeline.
func (j *Job) timelineLen() int { return len(j.Timeline()) + j.implied() }

// lastTimelineState is the state of the timeline's last entry; StateNone
// when it is empty.
func (j *Job) lastTimelineState() State {
	if n := len(j.Timeline()); n > 0 {
		return j.Timeline()[n-1].State
	}
	return j.tl0
}

// resetTimeline empties the timeline.
func (j *Job) resetTimeline() { j.setTimeline(nil); j.tl0 = StateNone }

// timelineMark is where a timeline stood, for timelineBack.
type timelineMark struct {
	n   int
	tl0 State
}

func (j *Job) timelineMark() timelineMark { return timelineMark{len(j.Timeline()), j.tl0} }

// timelineBack takes the timeline back to a mark: what was added since
// (by a transaction that was rolled back) is dropped.
func (j *Job) timelineBack(m timelineMark) { j.setTimeline(j.Timeline()[:m.n]); j.tl0 = m.tl0 }

// readyState is the state of a queued job that is not delayed.
func (j *Job) readyState() State {
	if j.Priority > 0 {
		return StatePrioritized
	}
	return StateWaiting
}

// ---------------------------------------------------------------------------
// Wire encoding. The key order is the reference's, so that captures compare.

// What encodeJob appends after the job's own 47 fields.
const (
	jobPlain     = iota // PULL, PULLB, DLQ entries
	jobWithRead         // GetJobByCustomId: returnvalue, failedReason
	jobWithState        // GetJob, GetJobs: state, returnvalue, failedReason
)

// encodeJob writes j as the map the protocol carries, straight into e.
//
// state is the label written in jobWithState mode; rv is the job's result
// for the read modes (nil when it has none). The parts below write the
// job's 47 keys in the reference's order; n must stay their sum.
func encodeJob(e *Enc, j *Job, mode int, state string, rv Raw) {
	n := 47
	switch mode {
	case jobWithRead:
		n += 2
	case jobWithState:
		n += 3
	}
	e.MapHead(n)
	// The parts are few on purpose: each is a call on the PULL path.
	encodeJobCore(e, j)    // 11 keys
	encodeJobState(e, j)   // 11
	encodeJobOptions(e, j) // 24
	e.Str("timeline")      // 1
	encodeTimeline(e, j)
	if mode == jobWithState {
		e.Str("state")
		e.Str(state)
	}
	if mode != jobPlain {
		encodeJobResult(e, j, rv)
	}
}

// encodeJobCore writes who the job is, its times, attempts and backoff.
func encodeJobCore(e *Enc, j *Job) {
	e.Str("id")
	e.JobID(j)
	e.Str("queue")
	e.Str(j.Queue)
	e.Str("name")
	e.Str(j.Name)
	e.Str("data")
	e.Raw(j.Data)
	e.Str("createdAt")
	e.Int(j.CreatedAt)
	e.Str("runAt")
	e.Int(j.RunAt)
	e.Str("startedAt")
	optTime(e, j.StartedAt())
	e.Str("completedAt")
	optTime(e, j.DoneAt())
	e.Str("attempts")
	e.Int(int64(j.Attempts))
	e.Str("backoff")
	e.Int(j.cold().Backoff)
	// The object form of the backoff option; nil when the job was given a
	// plain number.
	e.Str("backoffConfig")
	if j.cold().BackoffObj == nil {
		e.Nil()
	} else {
		k := 2
		if j.cold().BackoffObj.MaxDelay != none {
			k = 3
		}
		e.MapHead(k)
		e.Str("type")
		if j.cold().BackoffObj.Exponential {
			e.Str("exponential")
		} else {
			e.Str("fixed")
		}
		e.Str("delay")
		e.Int(j.cold().BackoffObj.Delay)
		if k == 3 {
			e.Str("maxDelay")
			e.Int(j.cold().BackoffObj.MaxDelay)
		}
	}
}

// encodeJobState writes where the job stands: its dependencies, children
// and tags, then what a running job reports (progress, stack trace,
// heartbeat, stalls, with repeat and durable where the reference puts
// them).
func encodeJobState(e *Enc, j *Job) {
	e.Str("dependsOn")
	strArray(e, j.cold().DependsOn)
	e.Str("childrenIds")
	strArray(e, j.cold().Children)
	e.Str("childrenCompleted")
	e.Int(int64(j.cold().ChildDone))
	e.Str("tags")
	strArray(e, j.cold().Tags)
	e.Str("progress")
	if j.cold().Progress == nil {
		e.Int(0)
	} else {
		e.Raw(j.cold().Progress)
	}
	e.Str("progressMessage")
	optStr(e, j.cold().ProgressMsg, j.cold().HasProgressMsg)
	e.Str("stacktrace")
	if j.cold().Stack == nil {
		e.Nil()
	} else {
		strArray(e, j.cold().Stack)
	}
	e.Str("repeat")
	e.Raw(j.cold().Repeat)
	e.Str("durable")
	e.Bool(j.cold().Durable)
	e.Str("lastHeartbeat")
	e.Int(j.Heartbeat())
	e.Str("stallCount")
	e.Int(int64(j.cold().Stalls))
}

// encodeJobOptions writes the push options: ordering, retries, limits, the
// ids the job was given, what its failure does to its parent, and its
// dedup and debounce settings.
func encodeJobOptions(e *Enc, j *Job) {
	e.Str("priority")
	e.Int(j.Priority)
	e.Str("lifo")
	e.Bool(j.cold().Lifo)
	e.Str("maxAttempts")
	e.Int(int64(j.cold().MaxAttempts))
	e.Str("removeOnComplete")
	e.Bool(j.cold().RemoveOnComplete)
	e.Str("removeOnFail")
	e.Bool(j.cold().RemoveOnFail)
	e.Str("ttl")
	optInt(e, j.cold().TTL)
	e.Str("timeout")
	optInt(e, j.cold().Timeout)
	e.Str("uniqueKey")
	optStr(e, j.cold().UniqueKey, j.cold().UniqueKey != "")
	e.Str("customId")
	optStr(e, j.cold().CustomID, j.cold().CustomID != "")
	e.Str("parentId")
	optStr(e, j.cold().ParentID, j.cold().ParentID != "")
	e.Str("groupId")
	optStr(e, j.cold().GroupID, j.cold().GroupID != "")
	e.Str("stallTimeout")
	optInt(e, j.cold().StallTimeout)
	e.Str("stackTraceLimit")
	e.Int(int64(j.cold().StackTraceLimit))
	e.Str("keepLogs")
	optInt(e, j.cold().KeepLogs)
	e.Str("sizeLimit")
	optInt(e, j.cold().SizeLimit)
	e.Str("failParentOnFailure")
	e.Bool(j.cold().FailParent)
	e.Str("removeDependencyOnFailure")
	e.Bool(j.cold().RemoveDepOnFail)
	e.Str("continueParentOnFailure")
	e.Bool(j.cold().ContinueParent)
	e.Str("ignoreDependencyOnFailure")
	e.Bool(j.cold().IgnoreDepOnFail)
	e.Str("deduplicationTtl")
	optInt(e, j.cold().DedupTTL)
	e.Str("deduplicationExtend")
	e.Bool(j.cold().DedupExtend)
	e.Str("deduplicationReplace")
	e.Bool(j.cold().DedupReplace)
	e.Str("debounceId")
	optStr(e, j.cold().DebounceID, j.cold().DebounceID != "")
	e.Str("debounceTtl")
	optInt(e, j.cold().DebounceTTL)
}

// encodeTimeline writes the job's history as an array of maps, with error
// and attempt only where present.
func encodeTimeline(e *Enc, j *Job) {
	e.ArrayHead(j.timelineLen())
	if j.tl0 != StateNone {
		e.MapHead(2)
		e.Str("state")
		e.Str(j.tl0.String())
		e.Str("timestamp")
		e.Int(j.CreatedAt)
	}
	for i := range j.Timeline() {
		t := &j.Timeline()[i]
		k := 2
		if t.HasErr {
			k++
		}
		if t.Attempt > 0 {
			k++
		}
		e.MapHead(k)
		e.Str("state")
		e.Str(t.State.String())
		e.Str("timestamp")
		e.Int(t.At)
		if t.HasErr {
			e.Str("error")
			e.Str(t.Error)
		}
		if t.Attempt > 0 {
			e.Str("attempt")
			e.Int(int64(t.Attempt))
		}
	}
}

// encodeJobResult writes what the read modes add: the job's result and
// its failure, undefined when it has none.
func encodeJobResult(e *Enc, j *Job, rv Raw) {
	e.Str("returnvalue")
	if rv != nil {
		e.Raw(rv)
	} else {
		e.Undefined()
	}
	e.Str("failedReason")
	if r, ok := j.failedReason(); ok {
		e.Str(r)
	} else {
		e.Undefined()
	}
}

// stateAt reports the state a reader sees: a delayed job whose time has come
// reads as waiting even before the timer has moved it.
func (j *Job) stateAt(now int64) State {
	if j.state == StateDelayed && j.RunAt <= now {
		return j.readyState()
	}
	return j.state
}

// failedReason is the error of the last failure on the timeline.
func (j *Job) failedReason() (string, bool) {
	if j.cold().hasFail {
		return j.cold().failErr, true
	}
	for i := len(j.Timeline()) - 1; i >= 0; i-- {
		if j.Timeline()[i].State == StateFailed && j.Timeline()[i].HasErr {
			return j.Timeline()[i].Error, true
		}
	}
	return "", false
}

func optTime(e *Enc, t int64) {
	if t == 0 {
		e.Nil()
	} else {
		e.Int(t)
	}
}

func optInt(e *Enc, v int64) {
	if v == none {
		e.Nil()
	} else {
		e.Int(v)
	}
}

func optStr(e *Enc, s string, ok bool) {
	if ok {
		e.Str(s)
	} else {
		e.Nil()
	}
}

func strArray(e *Enc, a []string) {
	e.ArrayHead(len(a))
	for _, s := range a {
		e.Str(s)
	}
}

// ---------------------------------------------------------------------------
// Ids: UUIDv7, monotonic within the process, as the reference makes them.

type idGen struct {
	mu   sync.Mutex
	last uint64 // ms<<12 | counter, the time-ordered half
	rnd  [4096]byte
	pos  int
}

var ids idGen

func nowMs() int64 { return time.Now().UnixMilli() }

// newID returns a UUIDv7 string, for the ids that are not a job's (a
// job keeps its id as 16 bytes, see jobid.go).
func newID() string { return string(appendUUID(nil, newUUID())) }

// newUUID returns a UUIDv7. The 12-bit rand_a field counts within a
// millisecond so that ids sort in creation order.
func newUUID() (u [16]byte) {
	ids.mu.Lock()
	ms := uint64(time.Now().UnixMilli())
	t := ms << 12
	if t <= ids.last {
		t = ids.last + 1 // same millisecond (or clock stepped back): count on
	}
	ids.last = t
	if ids.pos+8 > len(ids.rnd) || ids.pos == 0 {
		if _, err := rand.Read(ids.rnd[:]); err != nil {
			// crypto/rand does not fail on supported platforms; a repeated
			// buffer would still give unique ids through the counter.
			ids.pos = 0
		}
		ids.pos = 8
	}
	r := binary.BigEndian.Uint64(ids.rnd[ids.pos-8:])
	ids.pos += 8
	ids.mu.Unlock()

	ms48 := t >> 12
	ctr := t & 0xfff
	u[0] = byte(ms48 >> 40)
	u[1] = byte(ms48 >> 32)
	u[2] = byte(ms48 >> 24)
	u[3] = byte(ms48 >> 16)
	u[4] = byte(ms48 >> 8)
	u[5] = byte(ms48)
	u[6] = 0x70 | byte(ctr>>8)
	u[7] = byte(ctr)
	binary.BigEndian.PutUint64(u[8:], r)
	u[8] = 0x80 | (u[8] & 0x3f)
	return u
}

// readCopy copies what readers of a job see (its wire fields, its state
// and failure), taken under the job's shard lock, so that the copy can
// be read once the lock is let go. Slices that may change in place are
// copied too.
// TestReadCopyHasEveryField keeps the list whole.
func (j *Job) readCopy() *Job {
	cp := &Job{
		id: j.id, Queue: j.Queue, Name: j.Name, Data: j.Data, Priority: j.Priority,
		CreatedAt: j.CreatedAt, RunAt: j.RunAt, Attempts: j.Attempts,
		state: j.state, tl0: j.tl0, seq: j.seq,
	}
	if j.rt != nil {
		// The run part's wire fields; the claim itself stays with the job.
		cp.rt = &jobRun{startedAt: j.rt.startedAt, doneAt: j.rt.doneAt, heartbeat: j.rt.heartbeat,
			timeline: slices.Clone(j.rt.timeline)}
	}
	if j.c != nil {
		c := *j.c
		c.DependsOn, c.Children = slices.Clone(c.DependsOn), slices.Clone(c.Children)
		c.Tags, c.Stack = slices.Clone(c.Tags), slices.Clone(c.Stack)
		// What readers do not see stays with the job.
		c.groupMax, c.history, c.waiters = 0, nil, nil
		c.childValues, c.failedKids, c.ignoredKids = nil, nil, nil
		cp.c = &c
	}
	return cp
}
