package main

// Rules both engines follow in flows: what UpdateParent does to a child
// and its parent, and what a child's failure does to its parent.

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
