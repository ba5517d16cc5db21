package main

// Flows and dependencies. A job with dependsOn waits in waiting-children
// until every dependency has completed; a flow (PUSHF) admits a tree of
// such jobs, across queues, all or nothing.
//
// Dependencies cross shards, so nothing here holds two shard locks except
// PUSHF, which locks the shards it admits into in ascending order. A
// completion notes itself in the dependency registry (depMu) and leaves the
// rest to one flow goroutine that takes each dependent's shard lock in
// turn: a parent is promoted a moment after its last child completes,
// never under the child's lock.
//
// This is the memory engine's side of FlowEngine (engine.go); the handlers
// are in cmd_flows.go, the PostgreSQL engine's side in pg_flows.go.

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

type childKV struct {
	key string
	val Raw // a result, or (failed/ignored) the error as a string
}

// flowItem is work for the flow goroutine.
type flowItem struct {
	kind    uint8 // flowResolve, flowChildValue, flowPolicy
	dep     string
	waiters []*Job
	// child value and policy
	parentID, key string
	val           Raw
	mode          uint8
	err           string
	childID       string
}

const (
	flowResolve = iota
	flowChildValue
	flowPolicy
)

const (
	policyFail = iota + 1
	policyContinue
	policyIgnore
	policyRemove
)

// flowState is the broker's side of flows.
type flowState struct {
	depMu  sync.Mutex
	deps   map[string][]*Job // dependency id -> jobs waiting for it
	proofs *LRU[string, struct{}]

	fmu   sync.Mutex
	fq    []flowItem
	fbusy int // items taken from fq and not yet applied (under fmu)
	fkick chan struct{}
	fstop chan struct{}
	fdone chan struct{}
}

const maxProofs = 50000

func (b *MemEngine) startFlows() {
	b.deps = map[string][]*Job{}
	b.proofs = NewLRU[string, struct{}](maxProofs, nil)
	b.fkick, b.fstop, b.fdone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go b.flowWorker()
}

func (b *MemEngine) stopFlows() {
	select {
	case <-b.fstop:
	default:
		close(b.fstop)
		<-b.fdone
	}
}

func (b *MemEngine) flowPost(it flowItem) {
	locked(&b.fmu, func() {
		b.fq = append(b.fq, it)
	})
	select {
	case b.fkick <- struct{}{}:
	default:
	}
}

func (b *MemEngine) flowWorker() {
	defer close(b.fdone)
	for {
		select {
		case <-b.fstop:
			return
		case <-b.fkick:
		}
		for {
			var items []flowItem
			locked(&b.fmu, func() { items, b.fq = b.fq, nil; b.fbusy = len(items) })
			if len(items) == 0 {
				break
			}
			for i := range items {
				b.flowApply(&items[i])
			}
			locked(&b.fmu, func() { b.fbusy = 0 })
		}
	}
}

// flowSettle waits until the flow goroutine has nothing queued and has
// applied what it took (a child's value read right after its ACK is
// there); tests and shutdown use it.
func (b *MemEngine) flowSettle() {
	for {
		var n int
		locked(&b.fmu, func() { n = len(b.fq) + b.fbusy })
		if n == 0 {
			return
		}
		select {
		case b.fkick <- struct{}{}:
		default:
		}
		time.Sleep(time.Millisecond)
	}
}

func (b *MemEngine) flowApply(it *flowItem) {
	switch it.kind {
	case flowResolve:
		for _, w := range it.waiters {
			s := b.shardOf(w.Queue)
			s.with(func() {
				if w.state != StateWaitingChildren || b.idxHolder(w) != w {
					return
				}
				if w.pending > 0 {
					w.pending--
				}
				if w.pending == 0 {
					s.releaseWaiting(s.queues[w.Queue], w, b.now(), false)
					b.announce(noticeResolved(w))
				}
			})
		}
	case flowChildValue:
		b.withJob(it.parentID, func(p *Job, _ *Shard) {
			if slices.Contains(p.cold().Children, it.childID) {
				// Weighed, never refused: it comes from the child's ACK
				// (memlimit.go, admitRequest).
				b.mem.took(int64(len(it.key) + len(it.val)))
				p.warm().childValues = setKV(p.cold().childValues, it.key, it.val)
				b.persist(p)
			}
		})
	case flowPolicy:
		b.applyPolicy(it)
	}
}

func setKV(list []childKV, key string, val Raw) []childKV {
	for i := range list {
		if list[i].key == key {
			list[i].val = val
			return list
		}
	}
	return append(list, childKV{key: key, val: val})
}

// releaseWaiting moves a job out of waiting-children to run. event says
// whether a `waiting` event is sent (the reference sends one when a policy
// releases a parent, none when its children complete).
func (s *Shard) releaseWaiting(q *Queue, j *Job, now int64, event bool) {
	q.delWC(j)
	j.pending = 0
	s.enqueue(q, j, now)
	j.addTimeline(TimelineEntry{State: j.state, At: now})
	if event {
		s.emit(q, evWaiting, j, now, evArgs{prev: "waiting-children"})
	}
	s.b.persist(j)
}

// ---------------------------------------------------------------------------
// Registering and resolving dependencies

// depsExist checks that every dependency is a job we know (or knew to have
// completed). batch holds jobs being admitted together.
func (b *MemEngine) depsExist(j *Job, batch map[string]*Job) error {
	for _, d := range j.cold().DependsOn {
		known := d != j.ID() && (batch[d] != nil || b.idxGet(d) != nil)
		if !known && d != j.ID() {
			locked(&b.depMu, func() { _, known = b.proofs.Peek(d) })
		}
		if err := dependencyRefusal(j, d, known); err != nil {
			return err
		}
	}
	return nil
}

// registerDeps records j as waiting for its unfinished dependencies and
// returns how many there are.
func (b *MemEngine) registerDeps(j *Job, batch map[string]*Job) int32 {
	var n int32
	b.depMu.Lock()
	defer b.depMu.Unlock()
	for _, d := range j.cold().DependsOn {
		n += b.registerOneLocked(j, d, batch)
	}
	return n
}

func (b *MemEngine) registerOne(w *Job, dep string) int32 {
	b.depMu.Lock()
	defer b.depMu.Unlock()
	return b.registerOneLocked(w, dep, nil)
}

// registerOneLocked: w waits for dep unless dep already completed. The
// two flags make a completion racing with the registration land on exactly
// one side (see completedDeps): the completion sets its flowDone bit then
// reads flowDep; the registration sets flowDep then reads flowDone.
func (b *MemEngine) registerOneLocked(w *Job, d string, batch map[string]*Job) int32 {
	if _, ok := b.proofs.Peek(d); ok {
		return 0
	}
	dj := batch[d]
	if dj == nil {
		dj = b.idxGet(d)
	}
	if dj == nil {
		return 0 // completed and gone
	}
	dj.markDepWaited()
	if dj.isDone() {
		return 0
	}
	b.deps[d] = append(b.deps[d], w)
	return 1
}

// completedDeps runs when j completes (under its shard lock): its waiters
// are handed to the flow goroutine, and its result to its parent.
func (s *Shard) completedDeps(j *Job, result Raw, removed bool) {
	b := s.b
	j.markDone()
	if j.cold().ParentID != "" && result != nil {
		b.flowPost(flowItem{kind: flowChildValue, parentID: j.cold().ParentID, childID: j.ID(), key: j.Queue + ":" + j.ID(), val: result})
	}
	if !j.depWaited() && !removed {
		return
	}
	var waiters []*Job
	locked(&b.depMu, func() {
		waiters = b.deps[j.ID()]
		delete(b.deps, j.ID())
		if removed || j.depWaited() {
			b.proofs.Put(j.ID(), struct{}{})
		}
	})
	if len(waiters) > 0 {
		b.flowPost(flowItem{kind: flowResolve, dep: j.ID(), waiters: waiters})
	}
}

// unregisterDep forgets that w waits for dep.
func (b *MemEngine) unregisterDep(dep string, w *Job) {
	locked(&b.depMu, func() { dropListed(b.deps, dep, w) })
}

// ---------------------------------------------------------------------------
// Child failure policies

// childFailed runs when a job fails for good: a child with a policy acts on
// its parent, through the flow goroutine.
func (s *Shard) childFailed(j *Job, err string) {
	if it, ok := childPolicy(j, err); ok {
		s.b.flowPost(it)
	}
}

// policyRecord applies a child's policy to its parent's record (what both
// engines keep of it) and answers the error a failed parent gets: the
// engines move the parent themselves.
func policyRecord(p *Job, it *flowItem, now int64) string {
	switch it.mode {
	case policyFail:
		msg := "Child job " + it.childID + " failed: " + it.err
		p.warm().history = append(p.cold().history, AttemptRec{Attempt: p.Attempts, StartedAt: p.StartedAt(), FailedAt: now, Reason: "unknown", Error: msg, HasErr: true})
		return msg
	case policyContinue:
		p.warm().failedKids = setKV(p.cold().failedKids, it.key, strRaw(it.err))
		p.warm().DependsOn = []string{}
	case policyIgnore, policyRemove:
		if it.mode == policyIgnore {
			p.warm().ignoredKids = setKV(p.cold().ignoredKids, it.key, strRaw(it.err))
		}
		p.warm().DependsOn = slices.DeleteFunc(slices.Clone(p.cold().DependsOn), func(d string) bool { return d == it.childID })
	}
	return ""
}

func (b *MemEngine) applyPolicy(it *flowItem) {
	p, s := b.lockJob(it.parentID)
	if p == nil {
		return
	}
	defer s.mu.Unlock()
	if !isQueued(p.state) {
		return // a running or finished parent is left alone
	}
	q := s.queues[p.Queue]
	now := b.now()
	if it.mode != policyRemove {
		// The record the parent keeps of the child's failure (its error,
		// in an attempt or a child record): weighed, never refused, as
		// the FAIL that made it (memlimit.go, admitRequest).
		b.mem.took(int64(len(it.key)+len(it.childID)+len(it.err)) + 64)
	}
	switch it.mode {
	case policyFail:
		b.unwaitAll(p)
		if p.state == StateWaitingChildren {
			q.delWC(p)
		} else {
			s.unqueue(q, p)
		}
		s.releaseUnique(q, p)
		msg := policyRecord(p, it, now)
		b.announce(noticeFlowFailed(p.ID(), it.childID, p.Queue, it.err, "Child job failed"))
		s.toDLQ(q, p, "unknown", msg, true, now)
		p.warm().failErr, p.warm().hasFail = "", false // GetJob's failedReason comes from the timeline
		s.emit(q, evFailed, p, now, evArgs{err: msg, hasErr: true})
		s.b.stats.failed.Add(1)
	case policyContinue:
		b.unwaitAll(p)
		policyRecord(p, it, now)
		if p.state == StateWaitingChildren {
			p.RunAt = now
			s.releaseWaiting(q, p, now, true)
		}
		b.persist(p)
	case policyIgnore, policyRemove:
		b.unregisterDep(it.childID, p)
		policyRecord(p, it, now)
		if p.state == StateWaitingChildren {
			if p.pending > 0 {
				p.pending--
			}
			if p.pending == 0 {
				p.RunAt = now
				s.releaseWaiting(q, p, now, true)
			}
		}
		b.persist(p)
	}
}

// unwaitAll forgets every dependency registration of w.
func (b *MemEngine) unwaitAll(w *Job) {
	for _, d := range w.cold().DependsOn {
		b.unregisterDep(d, w)
	}
	w.pending = 0
}

func strRaw(s string) Raw {
	var e Enc
	e.Str(s)
	return e.B
}

// ---------------------------------------------------------------------------
// PUSHF: a flow, all or nothing

// flowJob is one job of a PUSHF, as flowJobs (cmd_flows.go) reads it.
type flowJob struct {
	job   *Job
	queue string
}

// PushFlow admits a flow (read by flowJobs) all or nothing and answers its
// jobs as they stand once it is written: copies, safe to read unlocked.
func (b *MemEngine) PushFlow(_ context.Context, jobs []flowJob) ([]*Job, error) {
	if err := b.admit(); err != nil {
		return nil, err
	}
	if err := b.admitFlow(jobs); err != nil {
		return nil, err
	}
	if b.store != nil && len(jobs) > 0 {
		if err := b.store.Sync(); err != nil {
			return nil, errors.New("durable write failed: " + err.Error())
		}
	}
	out := make([]*Job, len(jobs))
	for i, f := range jobs {
		if !b.withJob(f.job.ID(), func(j *Job, _ *Shard) { out[i] = j.readCopy() }) {
			// Already gone (completed with removeOnComplete, say): the
			// answer is the admitted job as it was.
			out[i] = f.job.readCopy()
		}
	}
	return out, nil
}

// admitFlow admits a validated flow. It locks every shard the flow
// touches, in ascending order, so that nothing is admitted unless all of
// it is.
func (b *MemEngine) admitFlow(jobs []flowJob) error {
	var idxs []int
	for _, f := range jobs {
		k := int(fnv1a(f.queue) & b.mask)
		if !slices.Contains(idxs, k) {
			idxs = append(idxs, k)
		}
	}
	slices.Sort(idxs)
	for _, k := range idxs {
		b.shards[k].mu.Lock()
	}
	defer func() {
		for _, k := range idxs {
			b.shards[k].mu.Unlock()
		}
	}()
	if err := b.flowRoom(jobs); err != nil {
		return err
	}
	if b.store != nil {
		// One transaction for the whole flow.
		b.store.Hold()
		defer b.store.Release()
	}
	now := b.now()
	batch := make(map[string]*Job, len(jobs))
	for _, f := range jobs {
		batch[f.job.ID()] = f.job
	}
	for _, f := range jobs {
		j := f.job
		s := b.shardOf(j.Queue)
		q := s.queue(j.Queue)
		q.listed = true
		j.seq = b.seq.Add(1)
		b.idxPut(j)
		j.pending = b.registerDeps(j, batch)
		s.placeNew(q, j, now)
		b.stats.pushed.Add(1)
		s.emit(q, evPushed, j, now, evArgs{})
		b.persist(j)
	}
	return nil
}

// flowRoom refuses a flow (whose shards the caller holds) that reuses a
// known id, overflows a group's maxSize or makes queues past the limit.
func (b *MemEngine) flowRoom(jobs []flowJob) error {
	groupCount := map[[2]string]int{}
	for _, f := range jobs {
		j := f.job
		if b.idxHolder(j) != nil {
			return errFlowJobExists(j.ID())
		}
		var proven bool
		locked(&b.depMu, func() { _, proven = b.proofs.Peek(j.ID()) })
		if proven {
			return errFlowJobExists(j.ID())
		}
		if j.cold().GroupID != "" && j.cold().groupMax > 0 && len(j.cold().DependsOn) == 0 {
			s := b.shardOf(j.Queue)
			key := [2]string{j.Queue, j.cold().GroupID}
			have := groupCount[key]
			if q := s.queues[j.Queue]; q != nil && q.groups[j.cold().GroupID] != nil {
				have += q.groups[j.cold().GroupID].queued
			}
			if int64(have) >= j.cold().groupMax {
				return errGroupFull(j)
			}
			groupCount[key]++
		}
	}
	var newQueues []string
	for _, f := range jobs {
		if b.shardOf(f.job.Queue).queues[f.job.Queue] == nil && !slices.Contains(newQueues, f.job.Queue) {
			newQueues = append(newQueues, f.job.Queue)
		}
	}
	return b.queueRoom(len(newQueues))
}

// placeNew puts a newly admitted job where it starts: waiting for its
// dependencies, or in its queue.
func (s *Shard) placeNew(q *Queue, j *Job, now int64) {
	if j.pending > 0 {
		j.state = StateWaitingChildren
		q.addWC(j)
	} else {
		s.enqueue(q, j, now)
	}
	j.addFirstEntry(now)
}

// ---------------------------------------------------------------------------
// Linking a child to an existing parent (PUSH with parent metadata, and
// UpdateParent)

// parentLink reads the parent a pushed job declares in its data, as the
// official client writes it: {__parentId, __parentQueue} matching parentId.
func parentLink(j *Job) (pid, pqueue string, ok bool) {
	if j.cold().ParentID == "" {
		return "", "", false
	}
	m, err := ParseMap(j.Data, nil)
	if err != nil {
		return "", "", false
	}
	id, _, _ := m.Str("__parentId")
	q, _, _ := m.Str("__parentQueue")
	if id != j.cold().ParentID || q == "" {
		return "", "", false
	}
	return id, q, true
}

// checkLinkable validates a parent before a child is pushed to it.
func (b *MemEngine) checkLinkable(pid, pqueue, childID string) error {
	if pid == childID {
		return linkable(nil, pid, pqueue, childID)
	}
	p, s := b.lockJob(pid)
	if p != nil {
		defer s.mu.Unlock()
	}
	return linkable(p, pid, pqueue, childID)
}

// linkChild makes parent pid wait for child (already admitted).
// linkChild makes the parent pid wait for the child: false when the parent
// can no longer take it (gone, or out of the queue since UpdateParent
// looked), true when it did, or had it already.
func (b *MemEngine) linkChild(pid string, child *Job) bool {
	p, s := b.lockJob(pid)
	if p == nil {
		return false
	}
	defer s.mu.Unlock()
	if slices.Contains(p.cold().Children, child.ID()) {
		return true
	}
	if !isQueued(p.state) {
		return false
	}
	q := s.queues[p.Queue]
	now := b.now()
	addChild(p, child.ID())
	if n := b.registerOne(p, child.ID()); n > 0 {
		if p.state != StateWaitingChildren {
			s.unqueue(q, p)
			p.state = StateWaitingChildren
			q.addWC(p)
			p.pending = 0
		}
		p.pending++
		markWaitingChildren(p, now)
	}
	b.persist(p)
	return true
}

// addChild records a new child of p (and its dependency on it).
func addChild(p *Job, cid string) {
	p.warm().Children = append(slices.Clone(p.cold().Children), cid)
	p.warm().DependsOn = append(slices.Clone(p.cold().DependsOn), cid)
	p.Data = setDataKey(p.Data, "__childrenIds", stringsRaw(p.cold().Children))
}

// dropChild forgets a child of p (and its dependency on it).
func dropChild(p *Job, cid string) {
	p.warm().Children = slices.DeleteFunc(slices.Clone(p.cold().Children), func(x string) bool { return x == cid })
	p.warm().DependsOn = slices.DeleteFunc(slices.Clone(p.cold().DependsOn), func(x string) bool { return x == cid })
	if len(p.cold().Children) == 0 {
		p.Data = setDataKey(p.Data, "__childrenIds", nil)
	} else {
		p.Data = setDataKey(p.Data, "__childrenIds", stringsRaw(p.cold().Children))
	}
}

// setParent tells a child its parent, in its record and its data, as the
// official client reads it.
func setParent(c *Job, pid, pqueue string) {
	c.warm().ParentID = pid
	if pid == "" {
		c.Data = setDataKey(setDataKey(c.Data, "__parentId", nil), "__parentQueue", nil)
		return
	}
	c.Data = setDataKey(setDataKey(c.Data, "__parentId", strRaw(pid)), "__parentQueue", strRaw(pqueue))
}

// markWaitingChildren notes on the timeline that p waits for children,
// once.
func markWaitingChildren(p *Job, now int64) {
	if p.lastTimelineState() != StateWaitingChildren {
		p.addTimeline(TimelineEntry{State: StateWaitingChildren, At: now})
	}
}

func stringsRaw(a []string) Raw {
	var e Enc
	strArray(&e, a)
	return e.B
}

// setDataKey sets (or with nil, removes) one key of a map value.
func setDataKey(data Raw, key string, val Raw) Raw {
	m, err := ParseMap(data, nil)
	if err != nil {
		return data
	}
	var e Enc
	n := 0
	for _, f := range m.Fields {
		if string(f.Key) != key {
			n++
		}
	}
	if val != nil {
		n++
	}
	e.MapHead(n)
	for _, f := range m.Fields {
		if string(f.Key) == key {
			continue
		}
		e.Str(string(f.Key))
		e.Raw(f.Val)
	}
	if val != nil {
		e.Str(key)
		e.Raw(val)
	}
	return e.B
}

// ---------------------------------------------------------------------------
// Reading and changing a flow

// Now is the broker's clock in ms.
func (b *MemEngine) Now() int64 { return b.now() }

func (b *MemEngine) ChildrenValues(_ context.Context, id string) ([]childKV, error) {
	return b.childRecords(id, childValuesOf), nil
}

func (b *MemEngine) FailedChildren(_ context.Context, id string) ([]childKV, error) {
	return b.childRecords(id, failedKidsOf), nil
}

func (b *MemEngine) IgnoredChildren(_ context.Context, id string) ([]childKV, error) {
	return b.childRecords(id, ignoredKidsOf), nil
}

// childRecords reads the records pick chooses of job id, once the flow
// goroutine has applied what it was told (a child's value read right
// after its ACK is there).
func (b *MemEngine) childRecords(id string, pick func(j *Job) []childKV) []childKV {
	b.flowSettle()
	var vals []childKV
	b.withJob(id, func(j *Job, _ *Shard) { vals = pick(j) })
	return vals
}

// childValuesOf, failedKidsOf and ignoredKidsOf copy a parent's records of
// its children, both engines' way. The failed and ignored ones only a
// parent yet to finish (still to run, or running) answers.
func childValuesOf(j *Job) []childKV { return slices.Clone(j.cold().childValues) }
func failedKidsOf(j *Job) []childKV  { return unfinishedRecords(j, j.cold().failedKids) }
func ignoredKidsOf(j *Job) []childKV { return unfinishedRecords(j, j.cold().ignoredKids) }

func unfinishedRecords(j *Job, kvs []childKV) []childKV {
	if isQueued(j.state) || j.state == StateActive {
		return slices.Clone(kvs)
	}
	return nil
}

func (b *MemEngine) RemoveChildDependency(_ context.Context, cid string) (bool, error) {
	var pid string
	var onward bool
	var err error
	found := b.withJob(cid, func(c *Job, _ *Shard) {
		pid = c.cold().ParentID
		onward, err = childDependency(cid, c)
	})
	if !found {
		onward, err = childDependency(cid, nil)
	}
	if !onward || err != nil {
		return false, err
	}
	removed := false
	b.withJob(pid, func(p *Job, ps *Shard) {
		if !parentWaitsFor(p, cid) {
			return
		}
		q := ps.queues[p.Queue]
		now := b.now()
		b.unregisterDep(cid, p)
		dropChild(p, cid)
		if p.pending > 0 {
			p.pending--
		}
		if p.pending == 0 {
			p.RunAt = now
			ps.releaseWaiting(q, p, now, true)
		}
		b.persist(p)
		removed = true
	})
	if removed {
		b.withJob(cid, func(c *Job, _ *Shard) {
			setParent(c, "", "")
			b.persist(c)
		})
	}
	return removed, nil
}

func (b *MemEngine) RemoveUnprocessedChildren(_ context.Context, id string) error {
	var kids []string
	b.withJob(id, func(p *Job, _ *Shard) { kids = slices.Clone(p.cold().Children) })
	for _, c := range kids {
		b.withJob(c, func(j *Job, s *Shard) {
			if !isQueued(j.state) {
				return
			}
			q := s.queues[j.Queue]
			now := b.now()
			s.unqueue(q, j)
			s.releaseUnique(q, j)
			s.forget(j)
			s.emit(q, evRemoved, j, now, evArgs{prev: "waiting"})
		})
	}
	return nil
}

func (b *MemEngine) MoveToWaitingChildren(_ context.Context, id, token string) error {
	j, s := b.lockJob(id)
	if j == nil {
		return parkable(nil, token)
	}
	defer s.mu.Unlock()
	now := b.now()
	s.promote(now)
	q := s.queues[j.Queue]
	if err := parkable(j, token); err != nil {
		return err
	}
	if err := s.takeActive(q, j, token); err != nil {
		return err
	}
	// Parked until a child is linked to it; it does not check for
	// children of its own, as in the reference.
	j.state = StateWaitingChildren
	q.addWC(j)
	j.pending = 0
	j.addTimeline(TimelineEntry{State: StateWaitingChildren, At: now})
	s.emit(q, evWaitingChildren, j, now, evArgs{prev: "active"})
	b.persist(j)
	return nil
}

func (b *MemEngine) UpdateParent(_ context.Context, cid, pid string) error {
	var child, parent *Job
	b.withJob(cid, func(c *Job, _ *Shard) { child = c.readCopy() })
	b.withJob(pid, func(p *Job, _ *Shard) { parent = p.readCopy() })
	plan, err := planParentLink(cid, pid, child, parent)
	if err != nil {
		return err
	}
	// The child learns its parent (a backpatch when already declared),
	// then the parent takes it; one that has left the queue meanwhile
	// refuses, and the child is as it was.
	var oldParent string
	var oldData Raw
	b.withJob(cid, func(c *Job, _ *Shard) {
		oldParent, oldData = c.cold().ParentID, c.Data
		setParent(c, pid, parent.Queue)
		b.persist(c)
	})
	switch {
	case plan.record:
		b.withJob(pid, func(p *Job, _ *Shard) {
			p.warm().Children = append(slices.Clone(p.cold().Children), cid)
			p.warm().DependsOn = append(slices.Clone(p.cold().DependsOn), cid)
			b.persist(p)
		})
	case plan.wait:
		if !b.linkChild(pid, withID(&Job{}, cid)) {
			b.withJob(cid, func(c *Job, _ *Shard) {
				c.warm().ParentID, c.Data = oldParent, oldData
				c.settle()
				b.persist(c)
			})
			return errNotLinkable(pid)
		}
	}
	if plan.failed {
		b.withJob(cid, func(c *Job, cs *Shard) { cs.childFailed(c, c.cold().failErr) })
	}
	return nil
}
