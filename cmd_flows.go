package main

// Handlers of flows and dependencies: PUSHF, the parent's reads of its
// children, and the commands that change a flow. The work is the
// engine's (FlowEngine: flows.go, pg_flows.go).

import (
	"context"
	"errors"
	"slices"
	"strings"
)

func cmdPushFlow(r *Req) error {
	jobs, err := flowJobs(r.m, r.eng.Now())
	if err != nil {
		return err
	}
	admitted, err := r.eng.PushFlow(r.ctx(), jobs)
	if err != nil {
		return err
	}
	r.b.announce(noticeFlowPushed(admitted))
	e := r.field("data")
	e.MapHead(1)
	e.Str("jobs")
	e.ArrayHead(len(admitted))
	for _, j := range admitted {
		encodeJob(e, j, jobPlain, "", nil)
	}
	return nil
}

func cmdGetChildrenValues(r *Req) error {
	id, _, err := r.m.Key("id")
	if err != nil {
		return err
	}
	vals, err := fetch(r, func(ctx context.Context) ([]childKV, error) { return r.eng.ChildrenValues(ctx, id) }, kvsBytes)
	if err != nil {
		return err
	}
	e := r.field("data")
	e.MapHead(1)
	e.Str("values")
	encodeKVs(e, vals)
	return nil
}

func cmdGetFailedChildrenValues(r *Req) error {
	id, _, err := r.m.Key("id")
	if err != nil {
		return err
	}
	vals, err := fetch(r, func(ctx context.Context) ([]childKV, error) { return r.eng.FailedChildren(ctx, id) }, kvsBytes)
	if err != nil {
		return err
	}
	encodeKVs(r.field("values"), vals)
	return nil
}

func cmdGetIgnoredChildrenFailures(r *Req) error {
	id, _, err := r.m.Key("id")
	if err != nil {
		return err
	}
	vals, err := fetch(r, func(ctx context.Context) ([]childKV, error) { return r.eng.IgnoredChildren(ctx, id) }, kvsBytes)
	if err != nil {
		return err
	}
	encodeKVs(r.field("values"), vals)
	return nil
}

// encodeKVs writes a parent's records of its children, by "queue:id".
func encodeKVs(e *Enc, vals []childKV) {
	e.MapHead(len(vals))
	for _, kv := range vals {
		e.Str(kv.key)
		e.Raw(kv.val)
	}
}

func cmdRemoveChildDependency(r *Req) error {
	id, _, err := r.m.Key("id")
	if err != nil {
		return err
	}
	removed, err := r.eng.RemoveChildDependency(r.ctx(), id)
	if err != nil {
		return err
	}
	r.field("removed").Bool(removed)
	return nil
}

func cmdRemoveUnprocessedChildren(r *Req) error {
	id, _, err := r.m.Key("id")
	if err != nil {
		return err
	}
	if err := r.eng.RemoveUnprocessedChildren(r.ctx(), id); err != nil {
		return err
	}
	return r.okID()
}

func cmdMoveToWaitingChildren(r *Req) error {
	tok, err := tokenArg(r.m)
	if err != nil {
		return err
	}
	id, _, err := r.m.Key("id")
	if err != nil {
		return err
	}
	if err := r.eng.MoveToWaitingChildren(r.ctx(), id, tok); err != nil {
		return err
	}
	e := r.field("data")
	e.MapHead(1)
	e.Str("moved")
	e.Bool(true)
	return nil
}

func cmdUpdateParent(r *Req) error {
	cid, _, err := r.m.Key("childId")
	if err != nil {
		return err
	}
	pid, _, err := r.m.Key("parentId")
	if err != nil {
		return err
	}
	if cid == pid {
		return errors.New("A flow job cannot be its own parent")
	}
	if err := r.eng.UpdateParent(r.ctx(), cid, pid); err != nil {
		return err
	}
	return r.okID()
}

// ---------------------------------------------------------------------------
// Reading PUSHF

// flowJobs reads and validates a PUSHF request, its jobs stamped with now.
// Checks and messages follow the reference's order.
func flowJobs(m Map, now int64) ([]flowJob, error) {
	items, ok, err := m.Array("jobs")
	if err != nil || !ok {
		return nil, errors.New("flow jobs must be an array")
	}
	if len(items) > 10000 {
		return nil, errors.New("flow exceeds the 10000 job limit")
	}
	out := make([]flowJob, 0, len(items))
	seen := map[string]bool{}
	total := 0
	for i, it := range items {
		f, err := flowJobAt(i, it, seen, now)
		if err != nil {
			return nil, err
		}
		total += len(f.job.Data)
		if total > 64<<20 {
			return nil, errors.New("flow data is too large (max 64MB per atomic batch)")
		}
		out = append(out, f)
	}
	return out, flowTopology(out)
}

// flowJobAt reads the flow's job i; seen holds the ids read before it.
func flowJobAt(i int, it Raw, seen map[string]bool, now int64) (flowJob, error) {
	fm, err := ParseMap(it, nil)
	if err != nil {
		return flowJob{}, errors.New("flow jobs[" + itoa(int64(i)) + "] must be an object")
	}
	id, idOK, err := fm.Key("id")
	if err != nil || !idOK {
		return flowJob{}, errors.New("flow job id must be a string")
	}
	if id == "" || len(id) > 1024 || !validUTF8(id) {
		return flowJob{}, errors.New("flow job id is invalid or is not well-formed Unicode")
	}
	if strings.Contains(id, ":") {
		return flowJob{}, errors.New("flow job id cannot contain a colon")
	}
	if seen[id] {
		return flowJob{}, errors.New("duplicate flow job id: " + id)
	}
	seen[id] = true
	queue, _, err := fm.Str("queue")
	if err != nil || validQueueName(queue, true) != nil {
		return flowJob{}, errors.New("invalid flow queue: " + queue)
	}
	in, ok, err := fm.Map("input")
	if err != nil || !ok {
		return flowJob{}, errors.New("flow job input is invalid: " + id)
	}
	if err := flowInputAllowed(in, id); err != nil {
		return flowJob{}, err
	}
	j, err := parseJob(in, queue, "", now)
	if err != nil {
		return flowJob{}, err
	}
	j.setID(id)
	if cid, ok, _ := in.Str("customId"); ok {
		j.warm().CustomID = cid
	}
	return flowJob{job: j, queue: queue}, flowPolicyAllowed(j)
}

// flowInputAllowed refuses the options a job of an atomic flow may not
// have, and data that is not an object.
func flowInputAllowed(in Map, id string) error {
	if cid, ok, _ := in.Str("customId"); ok && cid != "" && cid != id {
		return errors.New("custom id does not match planned id: " + id)
	}
	switch {
	case in.Has("repeat"):
		return errors.New("repeat is not supported inside an atomic flow")
	case in.Has("uniqueKey"), in.Has("dedup"):
		return errors.New("deduplication is not supported inside an atomic flow")
	case in.Has("debounceId"), in.Has("debounceTtl"):
		return errors.New("debounce is not supported inside an atomic flow")
	}
	if d := in.Get("data"); d == nil || (d[0] < 0x80 || d[0] > 0x8f) && d[0] != 0xde && d[0] != 0xdf {
		return errors.New("flow job data must be an object")
	}
	return nil
}

// flowPolicyAllowed checks a flow job's failure policy: at most one, and
// only for a child.
func flowPolicyAllowed(j *Job) error {
	policies := 0
	for _, on := range []bool{j.cold().FailParent, j.cold().ContinueParent, j.cold().IgnoreDepOnFail, j.cold().RemoveDepOnFail} {
		if on {
			policies++
		}
	}
	if policies > 1 {
		return errors.New("flow failure policies are mutually exclusive")
	}
	if policies == 1 && j.cold().ParentID == "" {
		return errors.New("a flow failure policy requires a parent")
	}
	return nil
}

// flowTopology checks the edges of a flow: every dependency and child in
// the batch, parent links reciprocal, no cycle.
func flowTopology(jobs []flowJob) error {
	byID := make(map[string]*Job, len(jobs))
	for _, f := range jobs {
		byID[f.job.ID()] = f.job
	}
	for _, f := range jobs {
		j := f.job
		if hasDup(j.cold().DependsOn) {
			return errors.New("duplicate dependency in flow job: " + j.ID())
		}
		if hasDup(j.cold().Children) {
			return errors.New("duplicate child in flow job: " + j.ID())
		}
		for _, d := range j.cold().DependsOn {
			if byID[d] == nil {
				return errors.New("flow dependency not found: " + d)
			}
			if d == j.ID() {
				return errors.New("flow job cannot depend on itself: " + j.ID())
			}
		}
		for _, c := range j.cold().Children {
			if !slices.Contains(j.cold().DependsOn, c) {
				return errors.New("flow child is missing from dependencies: " + c)
			}
			cj := byID[c]
			if cj == nil {
				return errors.New("flow child not found: " + c)
			}
			if cj.cold().ParentID != j.ID() {
				return errors.New("flow child " + c + " does not point back to parent " + j.ID())
			}
		}
		if j.cold().ParentID != "" {
			p := byID[j.cold().ParentID]
			if p == nil {
				return errors.New("flow parent not found: " + j.cold().ParentID)
			}
			if !slices.Contains(p.cold().Children, j.ID()) {
				return errors.New("flow parent " + j.cold().ParentID + " does not own child " + j.ID())
			}
		}
	}
	return flowAcyclic(jobs)
}

// flowAcyclic refuses a flow whose dependencies make a cycle (Kahn's
// algorithm over the dependency edges).
func flowAcyclic(jobs []flowJob) error {
	indeg := make(map[string]int, len(jobs))
	next := map[string][]string{}
	for _, f := range jobs {
		indeg[f.job.ID()] += 0
		for _, d := range f.job.cold().DependsOn {
			indeg[f.job.ID()]++
			next[d] = append(next[d], f.job.ID())
		}
	}
	var ready []string
	for id, n := range indeg {
		if n == 0 {
			ready = append(ready, id)
		}
	}
	seen := 0
	for len(ready) > 0 {
		id := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		seen++
		for _, n := range next[id] {
			if indeg[n]--; indeg[n] == 0 {
				ready = append(ready, n)
			}
		}
	}
	if seen != len(jobs) {
		return errors.New("flow contains a dependency cycle")
	}
	return nil
}

func hasDup(a []string) bool {
	seen := make(map[string]bool, len(a))
	for _, s := range a {
		if seen[s] {
			return true
		}
		seen[s] = true
	}
	return false
}
