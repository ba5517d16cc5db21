package main

// Job groups (BullMQ-Pro style): within a queue, ungrouped jobs are served
// first; then groups take turns, round-robin. Each group has its own heap
// (lower priority number first, then admission order), and the groups with
// ready jobs form a ring with a cursor, so a claim costs O(1) to pick the
// group plus O(log n) in its heap, however many groups there are. Groups
// that a pull's own limits make ineligible are stepped over.

import (
	"container/heap"
	"context"
	"errors"
	"math"
)

// maxGroupSettings bounds the groups of a queue that carry settings
// (paused, a concurrency or rate limit of their own, a RateLimitGroup
// hold): those a client can make without pushing a job, and that stay
// until they are removed.
const maxGroupSettings = 10000

var errTooManyGroupSettings = tooMany("the groups of a queue that are paused or have a concurrency, rate limit or hold of their own are", maxGroupSettings)

// Group is one group of a queue.
type Group struct {
	id     string
	ready  *Heap4
	queued int // ready and delayed jobs: what groupMaxSize counts
	active int

	paused      bool
	manualUntil int64 // RateLimitGroup: ineligible until then

	concOverride int64       // SetGroupConcurrency (0: none)
	rateOverride *groupLimit // SetGroupRateLimit
	window       groupWindow // rate window of pulls with a limit

	prev, next *Group // the ring of groups with ready jobs
	inRing     bool

	counted   bool // counted in its queue's nGroupSettings
	lingering bool // in its shard's lingering heap
}

type groupLimit struct{ max, duration int64 }

type groupWindow struct {
	start, count  int64
	max, duration int64
}

// groupPull is a pull's group option.
type groupPull struct {
	concurrency int64       // 0: not asked
	limit       *groupLimit // nil: not asked
	affinity    *string     // a group only, or (empty pointer) ungrouped only
	affinitySet bool
}

func (q *Queue) group(id string) *Group {
	g := q.groups[id]
	if g == nil {
		if q.groups == nil {
			q.groups = make(map[string]*Group)
		}
		g = &Group{id: id, ready: newHeap(heapPlace)}
		q.groups[id] = g
		q.groupsPeak = max(q.groupsPeak, len(q.groups))
	}
	return g
}

// ---------------------------------------------------------------------------
// Forgetting groups
//
// A group lives in its queue's map while something is left of it: queued
// or active jobs, a setting, or a rate window or RateLimitGroup hold still
// running (forgotten sooner, a job pushed to the group again would start
// afresh, past the limit). Without this every groupId ever pushed would
// keep its group for the life of the server. Nothing else holds a group
// across operations: the ring only holds groups with ready jobs, and jobs
// name their group by id. A group held only by time waits in the shard's
// lingering heap, and the shard timer forgets it when its time is up.

// hasSettings says whether g carries something a client set on it.
func (g *Group) hasSettings(now int64) bool {
	return g.paused || g.concOverride > 0 || g.rateOverride != nil || now < g.manualUntil
}

// heldUntil is when the last of g's rate window and hold ends.
func (g *Group) heldUntil() int64 {
	t := g.manualUntil
	if w := g.window; w.count > 0 && w.start+w.duration > t {
		t = w.start + w.duration
	}
	return t
}

// countSettings keeps q.nGroupSettings in step with g.
func (q *Queue) countSettings(g *Group, now int64) {
	if has := g.hasSettings(now); has != g.counted {
		g.counted = has
		if has {
			q.nGroupSettings++
		} else {
			q.nGroupSettings--
		}
	}
}

// settingsRoom says whether g may take a setting: it has one already, or
// the queue has room for one more group with settings.
func (q *Queue) settingsRoom(g *Group, now int64) error {
	if g != nil {
		q.countSettings(g, now)
		if g.counted {
			return nil
		}
	}
	if q.nGroupSettings >= maxGroupSettings {
		return errTooManyGroupSettings
	}
	return nil
}

// tidyGroup forgets g if nothing is left of it, or has the shard timer
// look again when only its window or hold keeps it. It runs wherever a job
// leaves a group or a setting is cleared; s.mu is held.
func (s *Shard) tidyGroup(q *Queue, g *Group, now int64) {
	if q.groups[g.id] != g {
		return // forgotten already, or of a queue since obliterated
	}
	q.countSettings(g, now)
	if g.queued > 0 || g.active > 0 || g.inRing || g.ready.Len() > 0 {
		return
	}
	if g.paused || g.concOverride > 0 || g.rateOverride != nil {
		return // kept until the setting is removed
	}
	if until := g.heldUntil(); until > now {
		if !g.lingering {
			g.lingering = true
			heap.Push(&s.lingering, lingerEnt{at: until, queue: q.name, g: g})
			s.armFor(until, now)
		}
		return
	}
	delete(q.groups, g.id)
	// Maps keep their size when emptied: a queue that had many groups
	// at once gets a map its size when down to a quarter of its peak.
	switch n := len(q.groups); {
	case n == 0:
		q.groups, q.groupsPeak = nil, 0
	case q.groupsPeak > 1024 && n < q.groupsPeak/4:
		m := make(map[string]*Group, n)
		for id, x := range q.groups {
			m[id] = x
		}
		q.groups, q.groupsPeak = m, n
	}
}

// forgetLingering looks again at the groups whose window or hold is over.
func (s *Shard) forgetLingering(now int64) {
	for len(s.lingering) > 0 && s.lingering[0].at <= now {
		e := heap.Pop(&s.lingering).(lingerEnt)
		e.g.lingering = false
		if q := s.queues[e.queue]; q != nil {
			s.tidyGroup(q, e.g, now)
		}
	}
}

// lingerEnt is a group kept only by its rate window or hold, until at.
type lingerEnt struct {
	at    int64
	queue string
	g     *Group
}

// lingerHeap orders lingering groups by when to look at them again.
type lingerHeap []lingerEnt

func (h lingerHeap) Len() int           { return len(h) }
func (h lingerHeap) Less(i, k int) bool { return h[i].at < h[k].at }
func (h lingerHeap) Swap(i, k int)      { h[i], h[k] = h[k], h[i] }
func (h *lingerHeap) Push(x any)        { *h = append(*h, x.(lingerEnt)) }
func (h *lingerHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = lingerEnt{}
	*h = old[:len(old)-1]
	if len(*h) == 0 {
		*h = nil
	}
	return e
}

// ringAdd puts a group with ready jobs into the rotation, just before the
// cursor: the end of the current round.
func (q *Queue) ringAdd(g *Group) {
	if g.inRing || g.paused || g.ready.Len() == 0 {
		return
	}
	g.inRing = true
	q.ringLen++
	if q.cursor == nil {
		g.prev, g.next = g, g
		q.cursor = g
		return
	}
	c := q.cursor
	g.prev, g.next = c.prev, c
	c.prev.next = g
	c.prev = g
}

func (q *Queue) ringRemove(g *Group) {
	if !g.inRing {
		return
	}
	g.inRing = false
	q.ringLen--
	if q.ringLen == 0 {
		q.cursor = nil
	} else {
		g.prev.next = g.next
		g.next.prev = g.prev
		if q.cursor == g {
			q.cursor = g.next
		}
	}
	g.prev, g.next = nil, nil
}

// groupRoom checks a batch against the groups' maxSize: each grouped job
// with a maxSize needs the group's queued jobs, with those of the batch
// before it, under that size.
func (q *Queue) groupRoom(jobs []*Job) error {
	return groupRoom(jobs, func(id string) int {
		if g := q.groups[id]; g != nil {
			return g.queued
		}
		return 0
	})
}

// groupKeys orders a group's heap: lower priority number first, then
// admission order. (LIFO does not apply inside a group.)
func groupKeys(j *Job) (int64, int64, int64) { return -j.Priority, j.seq, 0 }

// eligible says whether a pull with options o may take from g now.
func (g *Group) eligible(o *groupPull, now int64) bool {
	if g.paused || now < g.manualUntil {
		return false
	}
	if o == nil {
		return true
	}
	if o.concurrency > 0 {
		limit := o.concurrency
		if g.concOverride > 0 {
			limit = g.concOverride
		}
		if int64(g.active) >= limit {
			return false
		}
	}
	if o.limit != nil {
		l := *o.limit
		if g.rateOverride != nil {
			l = *g.rateOverride
		}
		w := &g.window
		if w.max != l.max || w.duration != l.duration || now >= w.start+w.duration {
			return true // a new window starts when the job is taken
		}
		if w.count >= w.max {
			return false
		}
	}
	return true
}

// took counts a job taken from g under the pull's options.
func (g *Group) took(o *groupPull, now int64) {
	g.active++
	if o == nil || o.limit == nil {
		return
	}
	l := *o.limit
	if g.rateOverride != nil {
		l = *g.rateOverride
	}
	w := &g.window
	if w.max != l.max || w.duration != l.duration || now >= w.start+w.duration {
		*w = groupWindow{start: now, max: l.max, duration: l.duration}
	}
	w.count++
}

// windowWait is how long until a group held back by its window opens.
func (g *Group) windowWait(now int64) int64 {
	if w := &g.window; w.count >= w.max && w.max > 0 {
		return max(w.start+w.duration-now, 1)
	}
	if now < g.manualUntil {
		return g.manualUntil - now
	}
	return math.MaxInt64
}

// pickReady takes the next job to claim: ungrouped first, then the groups
// in turn from the cursor. It returns nil when nothing may be taken.
func (s *Shard) pickReady(q *Queue, o *groupPull, now int64) *Job {
	grouped := q.ringLen > 0
	if o != nil && o.affinitySet && len(q.groups) > 0 {
		if o.affinity == nil {
			return q.ready.Pop()
		}
		g := q.groups[*o.affinity]
		if g == nil || g.ready.Len() == 0 || !g.eligible(o, now) {
			return nil
		}
		return s.takeFromGroup(q, g, o, now)
	}
	if j := q.ready.Pop(); j != nil || !grouped {
		return j
	}
	g := q.cursor
	for k := 0; k < q.ringLen; k++ {
		if g.eligible(o, now) {
			return s.takeFromGroup(q, g, o, now)
		}
		g = g.next
	}
	return nil
}

func (s *Shard) takeFromGroup(q *Queue, g *Group, o *groupPull, now int64) *Job {
	j := g.ready.Pop()
	g.queued--
	g.took(o, now)
	j.groupActive = true
	if g.inRing {
		q.cursor = g.next
		if g.ready.Len() == 0 {
			q.ringRemove(g)
		}
	}
	return j
}

// groupWait is how long a pull held back only by group limits should sleep
// before trying again.
func (q *Queue) groupWait(now int64) int64 {
	w := int64(math.MaxInt64)
	for g := q.cursor; g != nil; {
		w = min(w, g.windowWait(now))
		if g = g.next; g == q.cursor {
			break
		}
	}
	return w
}

// groupReleased: a job of the group stopped being active.
func (s *Shard) groupReleased(q *Queue, j *Job) {
	if !j.groupActive {
		return
	}
	j.groupActive = false
	if g := q.groups[j.cold().GroupID]; g != nil && g.active > 0 {
		g.active--
		s.tidyGroup(q, g, s.b.now())
	}
}

// ---------------------------------------------------------------------------
// Reading the pull option

func readGroupPull(m Map) (*groupPull, error) {
	raw := m.Get("group")
	if raw == nil {
		return nil, nil
	}
	gm, err := ParseMap(raw, nil)
	if err != nil || raw[0] == 0xc0 {
		return nil, errors.New("group must be an object")
	}
	o := &groupPull{}
	if a := gm.Get("affinity"); a != nil {
		o.affinitySet = true
		if a[0] != 0xc0 {
			s, err := a.Str()
			if err != nil {
				return nil, errors.New("group.affinity must be a string or null")
			}
			o.affinity = &s
		}
	} else {
		for _, f := range gm.Fields {
			if string(f.Key) == "affinity" && len(f.Val) > 0 && f.Val[0] == 0xc0 {
				o.affinitySet = true
			}
		}
	}
	if gm.Has("concurrency") {
		v, err := positiveSafeInt(gm, "concurrency")
		if err != nil {
			return nil, errors.New("group.concurrency must be a positive safe integer")
		}
		o.concurrency = v
	}
	if lr := gm.Get("limit"); lr != nil {
		lm, err := ParseMap(lr, nil)
		if err != nil {
			return nil, errors.New("group.limit must be an object")
		}
		mx, err := positiveSafeInt(lm, "max")
		if err != nil {
			return nil, errors.New("group.limit.max must be a positive safe integer")
		}
		d, err := positiveSafeInt(lm, "duration")
		if err != nil {
			return nil, errors.New("group.limit.duration must be a positive safe integer")
		}
		o.limit = &groupLimit{max: mx, duration: d}
	}
	return o, nil
}

func positiveSafeInt(m Map, key string) (int64, error) {
	f, ok, err := m.Num(key)
	if err != nil || !ok || f != math.Trunc(f) || f < 1 || f > 9007199254740991 {
		return 0, errors.New(key + " must be a positive safe integer")
	}
	return int64(f), nil
}

// ---------------------------------------------------------------------------
// The memory engine's group operations (GroupEngine)

// withGroup runs fn on a queue's group under its shard lock (g nil when
// there is none). create is for the operations that set something on the
// group: they make the queue and the group when missing, within the
// queue's room for groups with settings, and write the queue through.
// After fn the group is forgotten if nothing is left of it.
func (b *MemEngine) withGroup(queue, group string, create bool, fn func(s *Shard, q *Queue, g *Group, now int64)) error {
	var refused error
	err := b.withQueue(queue, create, func(s *Shard, q *Queue, now int64) {
		var g *Group
		if q != nil {
			g = q.groups[group]
		}
		if create {
			if refused = q.settingsRoom(g, now); refused != nil {
				return
			}
			if g == nil {
				g = q.group(group)
			}
		}
		fn(s, q, g, now)
		if g != nil {
			s.tidyGroup(q, g, now)
		}
		if q != nil && create {
			b.queueChanged(q)
		}
	})
	if err != nil {
		return err
	}
	return refused
}

// readGroup runs fn to read a group under its shard lock (g nil: the
// group does not exist).
func (b *MemEngine) readGroup(queue, group string, fn func(g *Group, now int64)) {
	b.withGroup(queue, group, false, func(s *Shard, q *Queue, g *Group, now int64) { fn(g, now) })
}

func (b *MemEngine) GroupJobsCount(_ context.Context, queue, group string) (int64, error) {
	var n int64
	b.readGroup(queue, group, func(g *Group, now int64) {
		if g != nil {
			n = int64(g.queued)
		}
	})
	return n, nil
}

func (b *MemEngine) GroupsJobsCount(_ context.Context, queue string) (int64, error) {
	var n int64
	b.withQueue(queue, false, func(s *Shard, q *Queue, now int64) {
		if q != nil {
			for _, g := range q.groups {
				n += int64(g.queued)
			}
		}
	})
	return n, nil
}

func (b *MemEngine) GroupActiveCount(_ context.Context, queue, group string) (int64, error) {
	var n int64
	b.readGroup(queue, group, func(g *Group, now int64) {
		if g != nil {
			n = int64(g.active)
		}
	})
	return n, nil
}

func (b *MemEngine) SetGroupRateLimit(_ context.Context, queue, group string, l groupLimit) error {
	return b.withGroup(queue, group, true, func(s *Shard, q *Queue, g *Group, now int64) {
		g.rateOverride = &l
		g.window = groupWindow{}
		q.wakeAll()
	})
}

func (b *MemEngine) GroupRateLimit(_ context.Context, queue, group string) (*groupLimit, error) {
	var l *groupLimit
	b.readGroup(queue, group, func(g *Group, now int64) {
		if g != nil && g.rateOverride != nil {
			c := *g.rateOverride
			l = &c
		}
	})
	return l, nil
}

func (b *MemEngine) RemoveGroupRateLimit(_ context.Context, queue, group string) (bool, error) {
	removed := false
	b.withGroup(queue, group, false, func(s *Shard, q *Queue, g *Group, now int64) {
		if g != nil && g.rateOverride != nil {
			g.rateOverride, g.window, removed = nil, groupWindow{}, true
			q.wakeAll()
			b.queueChanged(q)
		}
	})
	return removed, nil
}

// rateTTL is what GetGroupRateLimitTtl answers for a group: how long it
// is held back (by RateLimitGroup or a full window), 0 when a pull of
// maxJobs would still fit, -2 when nothing holds it.
func (g *Group) rateTTL(now int64, maxJobs float64, hasMax bool) int64 {
	w := g.window
	switch {
	case now < g.manualUntil:
		return g.manualUntil - now
	case w.max == 0 || now >= w.start+w.duration:
		return -2
	case hasMax && float64(w.count) < maxJobs:
		return 0
	}
	return w.start + w.duration - now
}

func (b *MemEngine) GroupRateLimitTTL(_ context.Context, queue, group string, maxJobs float64, hasMax bool) (int64, error) {
	ttl := int64(-2)
	b.readGroup(queue, group, func(g *Group, now int64) {
		if g != nil {
			ttl = g.rateTTL(now, maxJobs, hasMax)
		}
	})
	return ttl, nil
}

func (b *MemEngine) SetGroupConcurrency(_ context.Context, queue, group string, c int64) error {
	return b.withGroup(queue, group, true, func(s *Shard, q *Queue, g *Group, now int64) {
		g.concOverride = c
		q.wakeAll()
	})
}

func (b *MemEngine) GroupConcurrency(_ context.Context, queue, group string) (int64, error) {
	var c int64
	b.readGroup(queue, group, func(g *Group, now int64) {
		if g != nil {
			c = g.concOverride
		}
	})
	return c, nil
}

func (b *MemEngine) RemoveGroupConcurrency(_ context.Context, queue, group string) (bool, error) {
	removed := false
	b.withGroup(queue, group, false, func(s *Shard, q *Queue, g *Group, now int64) {
		if g != nil && g.concOverride != 0 {
			g.concOverride, removed = 0, true
			q.wakeAll()
			b.queueChanged(q)
		}
	})
	return removed, nil
}

func (b *MemEngine) SetGroupPaused(_ context.Context, queue, group string, paused bool) (bool, error) {
	if !paused {
		return b.resumeGroup(queue, group), nil
	}
	changed := false
	err := b.withGroup(queue, group, true, func(s *Shard, q *Queue, g *Group, now int64) {
		if !g.paused {
			g.paused, changed = true, true
			q.ringRemove(g)
		}
	})
	return changed, err
}

// resumeGroup resumes a paused group, back to its turn in the ring.
func (b *MemEngine) resumeGroup(queue, group string) bool {
	changed := false
	b.withGroup(queue, group, false, func(s *Shard, q *Queue, g *Group, now int64) {
		if g != nil && g.paused {
			g.paused, changed = false, true
			q.ringAdd(g)
			q.wakeAll()
			b.queueChanged(q)
		}
	})
	return changed
}

func (b *MemEngine) IsGroupPaused(_ context.Context, queue, group string) (bool, error) {
	paused := false
	b.readGroup(queue, group, func(g *Group, now int64) { paused = g != nil && g.paused })
	return paused, nil
}

// RateLimitGroup's hold is not persisted, as in the reference.
func (b *MemEngine) RateLimitGroup(_ context.Context, queue, group string, d int64) error {
	return b.withGroup(queue, group, true, func(s *Shard, q *Queue, g *Group, now int64) {
		g.manualUntil = now + d
	})
}
