package main

// The live-event catalogue: the reference's dashboard events (queue:*,
// dlq:*, cron:*, worker:*, config:*, ...) besides the job lifecycle
// events of events.go. A notice is one such event: a name and a JSON
// object. Whatever causes one (a command, a background loop, either
// engine) announces it on the broker; the live side (live.go) sends it to
// WebSocket subscribers whose patterns match and to every SSE stream,
// whatever queue a stream follows, as the reference does; in PostgreSQL
// mode the engine forwards it to the other brokers (pg_events.go), so a
// subscriber on any broker hears it once.
//
// The constructors below are the catalogue's shapes, each written once:
// the reference's field names, and its conditions (a Drain that removed
// nothing announces nothing) are the callers'. docs/http-api.md lists
// every event, what fires it, and the few the reference has that queued
// never fires.

import (
	"sync"
	"sync/atomic"
)

// wsValidPatterns are the event names and patterns Subscribe accepts, the
// reference's list.
var wsValidPatterns = map[string]bool{}

func init() {
	for _, p := range []string{"*",
		"job:pushed", "job:active", "job:completed", "job:failed", "job:removed", "job:promoted", "job:progress",
		"job:delayed", "job:stalled", "job:retried", "job:discarded", "job:priority-changed", "job:data-updated",
		"job:delay-changed", "job:timeout", "job:lock-expired", "job:deduplicated", "job:waiting-children",
		"job:dependencies-resolved", "job:moved-to-delayed", "job:expired", "job:*",
		"queue:created", "queue:removed", "queue:paused", "queue:resumed", "queue:drained", "queue:cleaned",
		"queue:obliterated", "queue:counts", "queue:idle", "queue:threshold", "queue:*",
		"dlq:added", "dlq:retried", "dlq:retry-all", "dlq:purged", "dlq:auto-retried", "dlq:expired", "dlq:*",
		"flow:completed", "flow:failed", "flow:*",
		"cron:created", "cron:updated", "cron:deleted", "cron:fired", "cron:missed", "cron:skipped", "cron:*",
		"worker:connected", "worker:disconnected", "worker:heartbeat", "worker:idle", "worker:removed-stale",
		"worker:overloaded", "worker:error", "worker:*",
		"ratelimit:set", "ratelimit:cleared", "ratelimit:hit", "ratelimit:rejected",
		"concurrency:set", "concurrency:cleared", "concurrency:rejected", "ratelimit:*", "concurrency:*",
		"webhook:added", "webhook:removed", "webhook:fired", "webhook:failed", "webhook:enabled", "webhook:disabled", "webhook:*",
		"batch:pushed", "batch:pulled", "batch:*", "client:connected", "client:disconnected", "client:*",
		"auth:failed", "auth:*", "cleanup:orphans-removed", "cleanup:stale-deps-removed", "cleanup:*",
		"health:status", "health:*", "stats:snapshot", "stats:*",
		"storage:status", "storage:backup-started", "storage:backup-completed", "storage:backup-failed",
		"storage:size-warning", "storage:*",
		"server:started", "server:shutdown", "server:recovered", "server:memory-warning", "server:*",
		"memory:compacted", "memory:*", "config:stall-changed", "config:dlq-changed", "config:*"} {
		wsValidPatterns[p] = true
	}
}

// offCatalogue are the names the reference announces that Subscribe does
// not take by name (a pattern such as flow:* or * takes them).
var offCatalogue = map[string]bool{"flow:pushed": true, "cleanup:completed-removed": true}

// Notice is one catalogue event as taps see it.
type Notice struct {
	Name string
	At   int64
	Data []byte // a JSON object
	// remote: announced on another broker and forwarded here. (What each
	// broker works out for itself, the monitor's notices, goes straight to
	// its own subscribers: live.local.)
	remote bool
}

// NoticeTap receives notices. It may run under a shard lock: it only
// queues. wants reports whether it would take one now, so that a broker
// nobody listens to builds none.
type NoticeTap struct {
	wants func() bool
	take  func(n *Notice)
}

type noticeTaps struct {
	list atomic.Pointer[[]NoticeTap]

	// refused is when each queue last announced a pull its limit held
	// back (refusalDue).
	rmu     sync.Mutex
	refused map[string]int64
}

// refusalDue says whether a pull held back by queue's rate or
// concurrency limit is to be announced now: once a second per queue at
// most. A waiting pull looks again every few milliseconds (in PostgreSQL
// mode every 50 ms, each look a query); the reference announces every
// look. Asked before the announcement is built (and, in PostgreSQL mode,
// before the query that says whether a job was held back).
func (b *Broker) refusalDue(queue string, now int64) bool {
	if !b.hearing() {
		return false
	}
	t := &b.notices
	t.rmu.Lock()
	defer t.rmu.Unlock()
	if now-t.refused[queue] < 1000 {
		return false
	}
	if t.refused == nil || len(t.refused) >= maxRefusalQueues {
		t.refused = map[string]int64{} // forgetting only lets one more through
	}
	t.refused[queue] = now
	return true
}

// maxRefusalQueues bounds refusalDue's memory: --max-queues' default.
const maxRefusalQueues = defaultMaxQueues

// addNoticeTap registers a tap; taps are few and registered at start.
func (b *Broker) addNoticeTap(t NoticeTap) {
	b.tapMu.Lock()
	defer b.tapMu.Unlock()
	var list []NoticeTap
	if cur := b.notices.list.Load(); cur != nil {
		list = append(list, *cur...)
	}
	list = append(list, t)
	b.notices.list.Store(&list)
}

// hearing says whether a notice announced now would reach anyone; callers
// on hot paths (every PUSHB, every PULLB) ask before building one.
func (b *Broker) hearing() bool {
	taps := b.notices.list.Load()
	if taps == nil {
		return false
	}
	for _, t := range *taps {
		if t.wants() {
			return true
		}
	}
	return false
}

// announce hands a notice to the taps that want it.
func (b *Broker) announce(n *note) {
	if n == nil {
		return
	}
	b.deliverNotice(&Notice{Name: n.name, At: b.now(), Data: n.o.close()})
}

func (b *Broker) deliverNotice(n *Notice) {
	taps := b.notices.list.Load()
	if taps == nil {
		return
	}
	for _, t := range *taps {
		if t.wants() {
			t.take(n)
		}
	}
}

// note is a notice being built.
type note struct {
	name string
	o    jsonObj
}

func newNote(name string) *note {
	n := &note{name: name}
	n.o.open()
	return n
}

// The field writers take a nil note (a notice its condition ruled out)
// and leave it nil.

func (n *note) str(k, v string) *note {
	if n != nil {
		n.o.str(k, v)
	}
	return n
}

func (n *note) int(k string, v int64) *note {
	if n != nil {
		n.o.int(k, v)
	}
	return n
}

func (n *note) num(k string, v float64) *note {
	if n != nil {
		n.o.num(k, v)
	}
	return n
}

// raw writes a MessagePack value as sent (undefined left out).
func (n *note) raw(k string, v Raw) *note {
	if n != nil {
		n.o.raw(k, v)
	}
	return n
}

// json writes a value already in JSON.
func (n *note) json(k string, v []byte) *note {
	if n != nil {
		n.o.json(k, v)
	}
	return n
}

func (n *note) strs(k string, v []string) *note {
	b := []byte{'['}
	for i, s := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, []byte(s))
	}
	return n.json(k, append(b, ']'))
}

// ---------------------------------------------------------------------------
// The catalogue's shapes

// noticeQueue is the shape of queue:created, queue:paused, queue:resumed,
// queue:obliterated, queue:removed, ratelimit:cleared, concurrency:cleared,
// ratelimit:rejected and concurrency:rejected.
func noticeQueue(name, queue string) *note { return newNote(name).str("queue", queue) }

// noticeQueueCount is the shape of queue:drained, dlq:retry-all,
// dlq:purged, dlq:auto-retried, dlq:expired and batch:pulled; like the
// reference, nothing is announced when nothing was counted.
func noticeQueueCount(name, queue string, count int64) *note {
	if count <= 0 {
		return nil
	}
	return noticeQueue(name, queue).int("count", count)
}

// noticeJob is the shape of the job notices made by a command (the id as
// the command named it, no queue): job:promoted, job:discarded,
// job:data-updated.
func noticeJob(name, id string) *note { return newNote(name).str("jobId", id) }

// noticeMove is what a successful move by hand announces, with the
// reference's fields ("as sent": the command's own values).
func noticeMove(kind MoveKind, id string, m Map) *note {
	switch kind {
	case MovePromote:
		return noticeJob("job:promoted", id)
	case MoveDiscard:
		return noticeJob("job:discarded", id)
	case MoveUpdate:
		return noticeJob("job:data-updated", id)
	case MoveChangePriority:
		return noticeJob("job:priority-changed", id).raw("newPriority", m.Get("priority"))
	case MoveChangeDelay:
		return noticeJob("job:delay-changed", id).raw("newDelay", m.Get("delay"))
	case MoveToDelayed:
		return noticeJob("job:moved-to-delayed", id).raw("delay", m.Get("delay"))
	}
	return nil
}

// noticeQueueJob is the shape of job notices a queue's own work makes:
// dlq:added (with reason), job:dependencies-resolved, job:lock-expired
// (with renewalCount), job:timeout (with timeout), job:expired.
func noticeQueueJob(name, queue, id string) *note {
	return newNote(name).str("queue", queue).str("jobId", id)
}

func noticeDLQAdded(queue, id, reason string) *note {
	return noticeQueueJob("dlq:added", queue, id).str("reason", reason)
}

func noticeWorker(name, id string) *note { return newNote(name).str("workerId", id) }

func noticeWebhook(name, id string) *note { return newNote(name).str("webhookId", id) }

func noticeClient(name, clientID string) *note {
	return newNote(name).str("clientId", clientID).str("transport", "tcp")
}

// noticeStallConfig is config:stall-changed: the queue and the settings
// the command made (as read, numbers as numbers; none without a config).
// It is written from what was read, not from the client's bytes, which
// may carry anything else besides.
func noticeStallConfig(queue string, p stallPatch, ok bool) *note {
	n := noticeQueue("config:stall-changed", queue)
	if !ok {
		return n
	}
	o := jsonObj{}
	o.open()
	if p.hasEnabled {
		o.boolean("enabled", p.enabled)
	}
	for _, f := range []struct {
		k string
		v *float64
	}{{"stallInterval", p.interval}, {"gracePeriod", p.grace}, {"maxStalls", p.maxStall}} {
		if f.v != nil {
			o.num(f.k, *f.v)
		}
	}
	return n.json("config", o.close())
}

// noticeDLQConfig is config:dlq-changed, as noticeStallConfig.
func noticeDLQConfig(queue string, p dlqPatch, ok bool) *note {
	n := noticeQueue("config:dlq-changed", queue)
	if !ok {
		return n
	}
	o := jsonObj{}
	o.open()
	if p.autoRetry != nil {
		o.boolean("autoRetry", *p.autoRetry)
	}
	for _, f := range []struct {
		k string
		v *int64
	}{{"autoRetryInterval", p.interval}, {"maxAutoRetries", p.maxRetries}, {"maxAge", p.maxAge}, {"maxEntries", p.maxEntries}} {
		if f.v != nil {
			o.int(f.k, *f.v)
		}
	}
	if p.noMaxAge {
		o.json("maxAge", []byte("null"))
	}
	return n.json("config", o.close())
}

// noticeCron is cron:created or cron:updated: the schedule as it now is.
func noticeCron(s *CronSchedule) *note {
	name := "cron:created"
	if s.replaced {
		name = "cron:updated"
	}
	n := newNote(name).str("name", s.Name).str("queue", s.Queue)
	if s.Schedule != "" {
		n.str("pattern", s.Schedule)
	} else {
		n.int("every", s.RepeatEvery)
	}
	return n.int("nextRun", s.NextRun)
}

// noticeCronRun is cron:fired (a run's job pushed), cron:skipped (with
// reason) and cron:missed (with error).
func noticeCronRun(name string, s *CronSchedule) *note {
	return newNote(name).str("name", s.Name).str("queue", s.Queue)
}

// noticeFlowPushed is flow:pushed: how many jobs a flow made, in how many
// queues.
func noticeFlowPushed(jobs []*Job) *note {
	queues := map[string]struct{}{}
	for _, j := range jobs {
		queues[j.Queue] = struct{}{}
	}
	return newNote("flow:pushed").int("jobs", int64(len(jobs))).int("queues", int64(len(queues)))
}

// noticeFlowFailed is flow:failed: a child of parent failed for good
// (queue is the child's when it is dead-lettered, the parent's when its
// policy fails the parent); def is the error when the failure had none.
func noticeFlowFailed(parent, child, queue, err, def string) *note {
	if err == "" {
		err = def
	}
	return newNote("flow:failed").str("parentJobId", parent).str("failedChildId", child).
		str("queue", queue).str("error", err)
}

// noticeFlowCompleted is flow:completed: the last child of parent
// completed (queue is the parent's).
func noticeFlowCompleted(parent, queue string, children int) *note {
	return newNote("flow:completed").str("parentJobId", parent).str("queue", queue).int("childrenCount", int64(children))
}

func noticeLockExpired(queue, id string, renewals int32) *note {
	return noticeQueueJob("job:lock-expired", queue, id).int("renewalCount", int64(renewals))
}

// noticeExpired is job:expired: a job whose ttl ran out while it waited,
// dropped when a pull came to it.
func noticeExpired(queue string, j *Job, now int64) *note {
	return noticeQueueJob("job:expired", queue, j.ID()).int("ttl", j.cold().TTL).int("age", now-j.CreatedAt)
}

// noticeDeduplicated is job:deduplicated: a push whose unique key a live
// job holds (id), under the default strategy or extending the hold.
func noticeDeduplicated(queue, id, strategy string) *note {
	return noticeQueueJob("job:deduplicated", queue, id).str("strategy", strategy)
}

// noticeWaitingChildren is job:waiting-children as the reference
// announces a job admitted to wait for its dependencies.
func noticeWaitingChildren(queue string, j *Job) *note {
	return newNote("job:waiting-children").str("jobId", j.ID()).str("queue", queue).strs("dependsOn", j.cold().DependsOn)
}

// noticeResolved is what a job released by its last dependency announces:
// flow:completed for a flow's parent, job:dependencies-resolved for a job
// that named others in dependsOn.
func noticeResolved(j *Job) *note {
	if len(j.cold().Children) > 0 {
		return noticeFlowCompleted(j.ID(), j.Queue, len(j.cold().Children))
	}
	return newNote("job:dependencies-resolved").str("jobId", j.ID()).str("queue", j.Queue)
}

// cronOutcome is what a run's push announces: cron:fired, or cron:missed
// with the push's error. (A run whose unique key a live job holds, with
// preventOverlap, is fired as the reference fires it: the push was made.)
func cronOutcome(s *CronSchedule, err error) *note {
	if err != nil {
		return noticeCronRun("cron:missed", s).str("error", err.Error())
	}
	return noticeCronRun("cron:fired", s)
}
