package main

import (
	"strings"
	"testing"
)

// TestFlowGuards: the refusals both engines give for flows come from one
// place, and say what the reference says.
func TestFlowGuards(t *testing.T) {
	t.Parallel()
	j := &Job{}
	j.setID("a")
	if err := dependencyRefusal(j, "a", true); err == nil || err.Error() != "Job cannot depend on itself: a" {
		t.Errorf("self: %v", err)
	}
	if err := dependencyRefusal(j, "b", false); err == nil || err.Error() != "Dependency job not found: b" {
		t.Errorf("missing: %v", err)
	}
	if err := dependencyRefusal(j, "b", true); err != nil {
		t.Errorf("known: %v", err)
	}

	if on, err := childDependency("c", nil); on || err == nil || err.Error() != "Job not found: c" {
		t.Errorf("no child: %v %v", on, err)
	}
	c := &Job{state: StateWaiting}
	if on, err := childDependency("c", c); on || err == nil || !strings.HasSuffix(err.Error(), "has no parent") {
		t.Errorf("orphan: %v %v", on, err)
	}
	setParent(c, "p", "q")
	for st, want := range map[State]bool{StateWaiting: true, StateDelayed: true, StateActive: true, StateCompleted: false, StateFailed: false} {
		c.state = st
		if on, err := childDependency("c", c); on != want || err != nil {
			t.Errorf("child %v: %v %v, want %v", st, on, err, want)
		}
	}

	p := &Job{state: StateWaitingChildren}
	p.warm().DependsOn = []string{"c"}
	if !parentWaitsFor(p, "c") || parentWaitsFor(p, "d") || parentWaitsFor(nil, "c") {
		t.Error("parentWaitsFor")
	}
	p.state = StateWaiting
	if parentWaitsFor(p, "c") {
		t.Error("a parent no longer waiting still waits")
	}

	if err := parkable(nil, ""); err == nil || err.Error() != "Job is not active" {
		t.Errorf("park missing: %v", err)
	}
	a := &Job{state: StateActive}
	a.setID("x")
	a.setLease(&Lease{Token: "t"})
	if err := parkable(a, "u"); err == nil || !strings.HasPrefix(err.Error(), "Invalid or expired lock token") {
		t.Errorf("park with another token: %v", err)
	}
	if err := parkable(a, "t"); err != nil {
		t.Errorf("park: %v", err)
	}
}
