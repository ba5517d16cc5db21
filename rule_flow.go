package main

// Rules both engines follow in flows: which dependencies a push may wait
// for, what UpdateParent does to a child and its parent, what a child's
// failure does to its parent, and the guards of RemoveChildDependency and
// MoveToWaitingChildren.

import (
	"errors"
	"slices"
)

// parentPlan is what UpdateParent does, decided once for both engines
// from the child and the parent as they are.
type parentPlan struct {
	// record: the child completed; the parent records it among its
	// children and does not wait for it. wait: the parent waits for it.
	// Neither: the parent declared it already; only the child learns its
	// parent.
	record, wait bool
	// failed: the child failed for good; its failure reaches the parent.
	failed bool
}

// planParentLink checks UpdateParent's arguments in the reference's order
// (child nil or parent nil: not found) and answers what to do.
func planParentLink(cid, pid string, child, parent *Job) (parentPlan, error) {
	if child == nil {
		return parentPlan{}, errors.New("Child job not found: " + cid)
	}
	if owner := child.cold().ParentID; owner != "" && owner != pid && owner != "pending" {
		return parentPlan{}, errors.New("Child job " + cid + " already belongs to parent " + owner)
	}
	if parent == nil {
		return parentPlan{}, errParentNotFound(pid)
	}
	declared := slices.Contains(parent.cold().Children, cid)
	if !declared && !isQueued(parent.state) {
		return parentPlan{}, errNotLinkable(pid)
	}
	return parentPlan{record: !declared && child.state == StateCompleted, wait: !declared && child.state != StateCompleted,
		failed: child.state == StateFailed}, nil
}

// childPolicy is what a child that failed for good asks of its parent;
// false when it has no parent or no policy.
func childPolicy(j *Job, err string) (flowItem, bool) {
	if j.cold().ParentID == "" {
		return flowItem{}, false
	}
	mode := uint8(0)
	switch {
	case j.cold().FailParent:
		mode = policyFail
	case j.cold().ContinueParent:
		mode = policyContinue
	case j.cold().IgnoreDepOnFail:
		mode = policyIgnore
	case j.cold().RemoveDepOnFail:
		mode = policyRemove
	default:
		return flowItem{}, false
	}
	if err == "" {
		err = "unknown error"
	}
	return flowItem{kind: flowPolicy, parentID: j.cold().ParentID, childID: j.ID(), key: j.Queue + ":" + j.ID(), mode: mode, err: err}, true
}

// dependencyRefusal is why job j cannot be pushed waiting for job d, or
// nil: d is not j, and d is known (in the same push, or to the engine).
func dependencyRefusal(j *Job, d string, known bool) error {
	if d == j.ID() {
		return errors.New("Job cannot depend on itself: " + d)
	}
	if !known {
		return errors.New("Dependency job not found: " + d)
	}
	return nil
}

// childDependency is RemoveChildDependency's rule for the child c (nil:
// not found): refused, nothing to do (false: the child has left the
// queue, its parent no longer waits for it), or on to its parent.
func childDependency(cid string, c *Job) (bool, error) {
	if c == nil {
		return false, errors.New("Job not found: " + cid)
	}
	if c.cold().ParentID == "" {
		return false, errors.New("Job " + cid + " has no parent")
	}
	return isQueued(c.state) || c.state == StateActive, nil
}

// parentWaitsFor says whether parent p (nil: gone) still waits for child
// cid, so that RemoveChildDependency drops the dependency.
func parentWaitsFor(p *Job, cid string) bool {
	return p != nil && p.state == StateWaitingChildren && slices.Contains(p.cold().DependsOn, cid)
}

// parkable is MoveToWaitingChildren's guard: j (nil: not found) is active
// and the token holds its lease.
func parkable(j *Job, token string) error {
	if j == nil || j.state != StateActive {
		return errors.New("Job is not active")
	}
	return checkLease(j, token)
}

// linkable says whether a child may link to parent p (nil: not found),
// which it names pid in queue pqueue.
func linkable(p *Job, pid, pqueue, childID string) error {
	if pid == childID {
		return errors.New("A job cannot be its own parent")
	}
	if p == nil {
		return errParentNotFound(pid)
	}
	if !isQueued(p.state) {
		return errNotLinkable(pid)
	}
	if pqueue != "" && p.Queue != pqueue {
		return errors.New("Parent job " + pid + " belongs to queue " + p.Queue + ", not " + pqueue)
	}
	if len(p.cold().Children) >= maxDeps {
		return tooMany("children of a job are", maxDeps)
	}
	// The child's id lands in the parent's children, dependencies and data.
	if p.size()+3*int64(len(childID)+8) > maxJobBytes {
		return errJobTooBig
	}
	return nil
}

func errParentNotFound(pid string) error { return errors.New("Parent job not found: " + pid) }
func errNotLinkable(pid string) error    { return errors.New("Parent job " + pid + " is not linkable") }

// errFlowJobExists refuses a flow whose job id is in use.
func errFlowJobExists(id string) error { return errors.New("Flow job " + id + " already exists") }
