package main

import (
	"strings"
	"testing"
)

// TestFinishFence walks the fence an ACK or FAIL passes (finishFence) with
// the facts each engine has. The two engines give the same answers but
// where their knowledge differs, and in the one difference the reference
// has on purpose: a finish, with its token, of a finished job.
func TestFinishFence(t *testing.T) {
	t.Parallel()
	retired := retiredSet{"old": true}
	mem := func(state State, attempts int32, lease string) finishFacts {
		f := finishFacts{id: "j", found: state != 0, state: state, attempts: attempts, retired: retired}
		if lease != "" && state == StateActive {
			f.leaseOwned, f.leaseToken = true, lease
		}
		return f
	}
	pg := func(state State, attempts int32, token string, owned bool) finishFacts {
		return finishFacts{id: "j", found: state != 0, state: state, attempts: attempts, leaseOwned: owned,
			leaseToken: token, lastToken: token, keepsLastToken: true, finishedAgainIsFinalized: true}
	}
	const applied, final = "applied", "finalized"
	cases := []struct {
		what  string
		f     finishFacts
		token string
		fail  bool
		want  string // applied, finalized, or the start of the error
	}{
		{"memory: active, its token", mem(StateActive, 0, "t1"), "t1", false, applied},
		{"memory: active, no token", mem(StateActive, 0, "t1"), "", false, "Lock token required"},
		{"memory: active, another token", mem(StateActive, 0, "t1"), "t0", true, "Invalid or expired"},
		{"memory: active again, a token a timeout ended", mem(StateActive, 1, "t1"), "old", false, final},
		{"memory: active without a lock", mem(StateActive, 0, ""), "", false, applied},
		{"memory: not found", mem(0, 0, ""), "t1", false, "Job not found"},
		{"memory: not found, a token a timeout ended", mem(0, 0, ""), "old", true, final},
		{"memory: back in the queue, ACK keeps the work", mem(StateWaiting, 1, ""), "t1", false, applied},
		{"memory: back in the queue, FAIL was counted", mem(StateDelayed, 1, ""), "t1", true, final},
		{"memory: never ran", mem(StateWaiting, 0, ""), "t1", false, "Job not found"},
		{"memory: never ran, FAIL", mem(StateWaiting, 0, ""), "", true, "Job not found"},
		{"memory: completed, ACK again", mem(StateCompleted, 1, ""), "t1", false, "Job not found"},
		{"memory: completed, timed-out token", mem(StateCompleted, 1, ""), "old", false, final},
		{"pg: active, its token", pg(StateActive, 0, "t1", true), "t1", false, applied},
		{"pg: active, no token", pg(StateActive, 0, "t1", true), "", true, "Lock token required"},
		{"pg: active, an older token", pg(StateActive, 1, "t1", true), "t0", false, "Invalid or expired"},
		{"pg: active, no owner", pg(StateActive, 0, "t1", false), "x", false, applied},
		{"pg: not found", pg(0, 0, "", false), "t1", false, "Job not found"},
		{"pg: back in the queue, ACK with the last token", pg(StateWaiting, 1, "t1", false), "t1", false, applied},
		{"pg: back in the queue, ACK without a token", pg(StatePrioritized, 1, "t1", false), "", false, applied},
		{"pg: back in the queue, ACK with another token", pg(StateWaiting, 1, "t1", false), "t0", false, "Job not found"},
		{"pg: back in the queue, FAIL with the last token", pg(StateDelayed, 1, "t1", false), "t1", true, final},
		{"pg: completed, ACK again with its token", pg(StateCompleted, 1, "t1", false), "t1", false, final},
		{"pg: failed, FAIL again with its token", pg(StateFailed, 3, "t1", false), "t1", true, final},
		{"pg: completed, another token", pg(StateCompleted, 1, "t1", false), "t0", false, "Job not found"},
		{"pg: waiting for children", pg(StateWaitingChildren, 0, "", false), "", false, "Job not found"},
	}
	for _, c := range cases {
		c.f.token = c.token
		out, err := finishFence(c.f, c.fail)
		got := applied
		switch {
		case err != nil:
			got = err.Error()
		case out == AlreadyFinalized:
			got = final
		}
		if !strings.HasPrefix(got, c.want) {
			t.Errorf("%s: %q, want %q", c.what, got, c.want)
		}
		if err != nil && out != Applied {
			t.Errorf("%s: an error with outcome %d", c.what, out)
		}
	}
}

// retiredSet is a memory engine's set of tokens a timeout ended.
type retiredSet map[string]bool

func (r retiredSet) isRetired(tok string) bool { return r[tok] }

// TestFinishFenceAllocates: the fence an ACK passes in memory mode, on its
// usual path (an active job, its token), allocates nothing.
//
// Serial: it counts allocations (AllocsPerRun).
func TestFinishFenceAllocates(t *testing.T) {
	b := NewMemEngine(1, nil)
	defer b.Close()
	j := &Job{state: StateActive}
	j.setID("01a24693-e6f6-7000-99db-2c32c368d007")
	j.setLease(&Lease{Token: "tok"})
	id := j.ID()
	if n := testing.AllocsPerRun(100, func() {
		if out, err := finishFence(b.finishFacts(id, "tok", j), false); out != Applied || err != nil {
			t.Fatal(out, err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per ACK's fence", n)
	}
}
