package main

// Flows and dependencies through the protocol: PostgreSQL mode answers as
// memory mode, step by step (pg_control_test.go's answersAsMemory), with
// the parity scripts' step runner (runSteps), which pg_cron_parity_test.go
// uses too.

import (
	"fmt"
	"testing"
	"time"
)

// scriptStep is one step of a parity script: a request through one of the
// script's two connections, and how its answer is waited for and recorded
// (nil: as it comes).
type scriptStep struct {
	c   *tclient
	req map[string]any
	how *stepHow
}

// stepHow: a step with until is sent again until its answer satisfies it
// (what an engine does after a child's ACK may come a moment later: the
// memory engine's flow goroutine; a schedule runs on the clock), for up to
// stepPatience, and its last answer is recorded either way: an engine that
// never gets there shows as a differing answer, not a hang. view changes
// the answer before it is recorded (sent: when the request was sent): it
// blanks what differs from run to run, or records what a time means
// rather than the time.
type stepHow struct {
	until func(ans map[string]any) bool
	view  func(ans map[string]any, sent time.Time)
}

// stepPatience bounds a step's waiting for its answer: far above what
// either engine needs on a loaded machine.
const stepPatience = 20 * time.Second

// runSteps sends the steps in order and records every answer (answerLine).
// A request value "$id" is the lease token of the job id as the last PULL
// of it answered; "$last" is the id of the job the last PULL answered.
func runSteps(t *testing.T, steps []scriptStep) []string {
	t.Helper()
	toks := map[string]string{}
	last := ""
	var out []string
	for i, s := range steps {
		req := map[string]any{}
		for k, v := range s.req {
			if str, ok := v.(string); ok && str == "$last" {
				v = last
			} else if ok && len(str) > 1 && str[0] == '$' {
				v = toks[str[1:]]
			}
			req[k] = v
		}
		deadline := time.Now().Add(stepPatience)
		var ans map[string]any
		var sent time.Time
		for {
			r := map[string]any{}
			for k, v := range req {
				r[k] = v
			}
			sent = time.Now()
			ans = s.c.call(r)
			if s.how == nil || s.how.until == nil || s.how.until(ans) || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if j, ok := ans["job"].(map[string]any); ok && s.req["cmd"] == "PULL" {
			last = fmt.Sprint(j["id"])
			if tk, ok := ans["token"].(string); ok {
				toks[last] = tk
			}
		}
		if s.how != nil && s.how.view != nil {
			s.how.view(ans, sent)
		}
		out = append(out, answerLine(t, i, s.req["cmd"], ans))
	}
	return out
}

// stateIs waits on GetState until the job has reached state.
func stateIs(state string) *stepHow {
	return &stepHow{until: func(a map[string]any) bool { return a["state"] == state }}
}

// flowOf is a PUSHF of a parent in queue pq with children in queue cq, as
// the official FlowProducer writes it. Each kid is the child's id and the
// options of its input (a failure policy, maxAttempts).
func flowOf(parent, pq, cq string, kids ...M) M {
	var jobs []any
	ids := make([]any, len(kids))
	for i, k := range kids {
		id := k["id"].(string)
		ids[i] = id
		in := M{"name": "child", "parentId": parent, "data": M{"k": id, "__parentId": parent, "__parentQueue": pq}}
		for o, v := range k {
			if o != "id" {
				in[o] = v
			}
		}
		jobs = append(jobs, M{"id": id, "queue": cq, "input": in})
	}
	jobs = append(jobs, M{"id": parent, "queue": pq, "input": M{
		"name": "parent", "dependsOn": ids, "childrenIds": ids,
		"data": M{"p": parent, "__childrenIds": ids},
	}})
	return M{"cmd": "PUSHF", "jobs": jobs}
}

// flowScript drives flows end to end through two connections (a and b):
// flows pushed with children, jobs pushed with dependencies and with a
// parent, children completed and failed under each failure policy, the
// parents' reads of their children, and the commands that change a flow
// in their allowed and refused cases. Every answer is recorded,
// normalised as moveScript's are.
func flowScript(t *testing.T, a, b *tclient) []string {
	t.Helper()
	// A flow pushed whole, refusals first: nothing of a refused flow is
	// admitted.
	bad := flowOf("P1", "fp", "fc1", M{"id": "c1"}, M{"id": "c2"})
	bad["jobs"].([]any)[2].(M)["input"].(M)["dependsOn"] = []any{"c1", "c2", "ghost"}
	cyc := M{"cmd": "PUSHF", "jobs": []any{
		M{"id": "y1", "queue": "fp", "input": M{"data": M{}, "dependsOn": []any{"y2"}}},
		M{"id": "y2", "queue": "fp", "input": M{"data": M{}, "dependsOn": []any{"y1"}}},
	}}
	orphanPolicy := M{"cmd": "PUSHF", "jobs": []any{M{"id": "o1", "queue": "fp", "input": M{"data": M{}, "failParentOnFailure": true}}}}
	twoPolicies := flowOf("P9", "fp", "fc9", M{"id": "t1", "failParentOnFailure": true, "ignoreDependencyOnFailure": true})

	steps := []scriptStep{
		{a, bad, nil},
		{b, cyc, nil},
		{a, orphanPolicy, nil},
		{b, twoPolicies, nil},
		{a, M{"cmd": "GetState", "id": "c1"}, nil},
		// 5: a parent with two children; the children complete and the
		// parent runs with their values.
		{a, flowOf("P1", "fp", "fc1", M{"id": "c1"}, M{"id": "c2"}), nil},
		{b, flowOf("P1", "fp", "fc1", M{"id": "c3"}), nil},
		{b, M{"cmd": "GetState", "id": "P1"}, nil},
		{b, M{"cmd": "GetState", "id": "c1"}, nil},
		{a, M{"cmd": "GetJob", "id": "P1"}, nil},
		{a, M{"cmd": "GetJob", "id": "c2"}, nil},
		{b, M{"cmd": "GetJobCounts", "queue": "fp"}, nil},
		{b, M{"cmd": "GetJobCounts", "queue": "fc1"}, nil},
		{a, M{"cmd": "GetChildrenValues", "id": "P1"}, nil},
		{a, M{"cmd": "PULL", "queue": "fp", "timeout": 0}, nil},
		{b, M{"cmd": "PULL", "queue": "fc1", "owner": "w1", "lockTtl": 30000}, nil}, // c1
		{a, M{"cmd": "ACK", "id": "c1", "token": "$c1", "result": M{"v": 1}}, nil},
		{b, M{"cmd": "GetChildrenValues", "id": "P1"}, nil},
		{a, M{"cmd": "GetState", "id": "P1"}, nil},
		{b, M{"cmd": "PULL", "queue": "fc1"}, nil}, // c2, no lock
		{a, M{"cmd": "ACK", "id": "c2", "result": "two"}, nil},
		{b, M{"cmd": "GetState", "id": "P1"}, stateIs("waiting")},
		{a, M{"cmd": "GetChildrenValues", "id": "P1"}, nil},
		{a, M{"cmd": "GetJob", "id": "P1"}, nil},
		{b, M{"cmd": "GetJobCounts", "queue": "fp"}, nil},
		{b, M{"cmd": "GetJobCounts", "queue": "fc1"}, nil},
		{a, M{"cmd": "PULL", "queue": "fp", "owner": "w1", "lockTtl": 30000}, nil}, // P1
		{b, M{"cmd": "GetChildrenValues", "id": "P1"}, nil},
		{a, M{"cmd": "ACK", "id": "P1", "token": "$P1", "result": "parent done"}, nil},
		{b, M{"cmd": "GetJob", "id": "P1"}, nil},
		{a, M{"cmd": "GetChildrenValues", "id": "P1"}, nil},
		{a, M{"cmd": "GetFailedChildrenValues", "id": "P1"}, nil},
		{a, M{"cmd": "GetIgnoredChildrenFailures", "id": "P1"}, nil},
		{b, M{"cmd": "GetChildrenValues", "id": "nope"}, nil},
		{b, flowOf("P1", "fp", "fc1", M{"id": "c4"}), nil},

		// 35: dependencies through PUSH: on a job to come, on a finished
		// one, on none that exists, on itself.
		{a, M{"cmd": "PUSH", "queue": "fd", "data": M{"n": 1}, "jobId": "d1"}, nil},
		{b, M{"cmd": "PUSH", "queue": "fd", "data": M{"n": 2}, "jobId": "d2", "dependsOn": []any{"d1"}}, nil},
		{a, M{"cmd": "PUSH", "queue": "fd", "data": M{"n": 3}, "jobId": "d3", "dependsOn": []any{"ghost"}}, nil},
		{b, M{"cmd": "PUSH", "queue": "fd", "data": M{"n": 4}, "jobId": "d4", "dependsOn": []any{"d4"}}, nil},
		{a, M{"cmd": "PUSH", "queue": "fd2", "data": M{"n": 5}, "jobId": "d5", "dependsOn": []any{"P1"}}, nil},
		{b, M{"cmd": "PUSH", "queue": "fd", "data": M{"n": 6}, "jobId": "d6", "dependsOn": []any{"d1", "d2"}}, nil},
		{a, M{"cmd": "PUSHB", "queue": "fd3", "jobs": []any{
			M{"name": "j", "data": M{"n": 7}, "customId": "d7", "dependsOn": []any{"d8"}},
			M{"name": "j", "data": M{"n": 8}, "customId": "d8"},
		}}, nil},
		{b, M{"cmd": "PUSHB", "queue": "fd", "jobs": []any{
			M{"name": "j", "data": M{"n": 9}, "customId": "d9", "dependsOn": []any{"ghost"}},
		}}, nil},
		{a, M{"cmd": "GetState", "id": "d2"}, nil},
		{a, M{"cmd": "GetState", "id": "d3"}, nil},
		{b, M{"cmd": "GetState", "id": "d5"}, nil},
		{b, M{"cmd": "GetState", "id": "d6"}, nil},
		{a, M{"cmd": "GetState", "id": "d7"}, nil},
		{a, M{"cmd": "GetJobCounts", "queue": "fd"}, nil},
		{b, M{"cmd": "GetJob", "id": "d6"}, nil},
		{a, M{"cmd": "PULL", "queue": "fd"}, nil}, // d1
		{b, M{"cmd": "ACK", "id": "d1", "result": 1}, nil},
		{a, M{"cmd": "GetState", "id": "d2"}, stateIs("waiting")},
		{b, M{"cmd": "GetState", "id": "d6"}, nil},
		{b, M{"cmd": "PULL", "queue": "fd3"}, nil}, // d8
		{a, M{"cmd": "ACK", "id": "d8"}, nil},
		{b, M{"cmd": "GetState", "id": "d7"}, stateIs("waiting")},
		{a, M{"cmd": "PULL", "queue": "fd"}, nil}, // d2
		{b, M{"cmd": "ACK", "id": "d2", "result": 2}, nil},
		{a, M{"cmd": "GetState", "id": "d6"}, stateIs("waiting")},
		{a, M{"cmd": "GetChildrenValues", "id": "d6"}, nil},
		{b, M{"cmd": "GetJobCounts", "queue": "fd"}, nil},
		{a, M{"cmd": "GetJob", "id": "d6"}, nil},

		// 63: a child linked by PUSH to a parent already there, the
		// refusals of such a link, and RemoveChildDependency.
		{a, M{"cmd": "PUSH", "queue": "fp", "data": M{"p": "P2"}, "jobId": "P2"}, nil},
		{b, M{"cmd": "PUSH", "queue": "fc2", "jobId": "k1", "parentId": "P2", "data": M{"k": "k1", "__parentId": "P2", "__parentQueue": "fp"}}, nil},
		{a, M{"cmd": "PUSH", "queue": "fc2", "jobId": "k2", "parentId": "P2", "data": M{"k": "k2", "__parentId": "P2", "__parentQueue": "other"}}, nil},
		{b, M{"cmd": "PUSH", "queue": "fc2", "jobId": "k3", "parentId": "nope", "data": M{"k": "k3", "__parentId": "nope", "__parentQueue": "fp"}}, nil},
		{a, M{"cmd": "PUSH", "queue": "fc2", "jobId": "k4", "parentId": "P1", "data": M{"k": "k4", "__parentId": "P1", "__parentQueue": "fp"}}, nil},
		{b, M{"cmd": "PUSH", "queue": "fc2", "jobId": "k5", "parentId": "k5", "data": M{"k": "k5", "__parentId": "k5", "__parentQueue": "fc2"}}, nil},
		{a, M{"cmd": "GetState", "id": "P2"}, nil},
		{a, M{"cmd": "GetJob", "id": "P2"}, nil},
		{b, M{"cmd": "GetJob", "id": "k1"}, nil},
		{b, M{"cmd": "RemoveChildDependency", "id": "nope"}, nil},
		{a, M{"cmd": "RemoveChildDependency", "id": "d1"}, nil},
		{a, M{"cmd": "RemoveChildDependency", "id": "c1"}, nil},
		{b, M{"cmd": "RemoveChildDependency", "id": "k1"}, nil},
		{a, M{"cmd": "GetState", "id": "P2"}, stateIs("waiting")},
		{a, M{"cmd": "RemoveChildDependency", "id": "k1"}, nil},
		{b, M{"cmd": "GetJob", "id": "k1"}, nil},
		{b, M{"cmd": "GetJob", "id": "P2"}, nil},

		// 80: MoveToWaitingChildren parks only an active job, with its
		// token; UpdateParent links a child to it and its guards refuse.
		{a, M{"cmd": "MoveToWaitingChildren", "id": "nope"}, nil},
		{a, M{"cmd": "MoveToWaitingChildren", "id": "P2"}, nil},
		{b, M{"cmd": "PULL", "queue": "fp", "owner": "w2", "lockTtl": 30000}, nil}, // P2
		{a, M{"cmd": "MoveToWaitingChildren", "id": "P2", "token": "wrong"}, nil},
		{a, M{"cmd": "MoveToWaitingChildren", "id": "P2", "token": "$P2"}, nil},
		{b, M{"cmd": "MoveToWaitingChildren", "id": "P2", "token": "$P2"}, nil},
		{b, M{"cmd": "GetState", "id": "P2"}, nil},
		{a, M{"cmd": "ACK", "id": "P2", "token": "$P2"}, nil},
		{a, M{"cmd": "UpdateParent", "childId": "P2", "parentId": "P2"}, nil},
		{b, M{"cmd": "UpdateParent", "childId": "nope", "parentId": "P2"}, nil},
		{a, M{"cmd": "UpdateParent", "childId": "k1", "parentId": "nope"}, nil},
		{b, M{"cmd": "UpdateParent", "childId": "c1", "parentId": "P2"}, nil},
		{a, M{"cmd": "UpdateParent", "childId": "k1", "parentId": "P1"}, nil},
		{b, M{"cmd": "UpdateParent", "childId": "k1", "parentId": "P2"}, nil},
		{a, M{"cmd": "GetJob", "id": "P2"}, nil},
		{a, M{"cmd": "UpdateParent", "childId": "d2", "parentId": "P2"}, nil},
		{b, M{"cmd": "GetJob", "id": "P2"}, nil},
		{b, M{"cmd": "GetState", "id": "P2"}, nil},
		{a, M{"cmd": "PULL", "queue": "fc2"}, nil}, // k1
		{b, M{"cmd": "ACK", "id": "k1", "result": "k1 done"}, nil},
		{a, M{"cmd": "GetState", "id": "P2"}, stateIs("waiting")},
		{a, M{"cmd": "GetChildrenValues", "id": "P2"}, nil},
		{b, M{"cmd": "GetJob", "id": "P2"}, nil},
		{b, M{"cmd": "UpdateParent", "childId": "d6", "parentId": "P2"}, nil},
		{a, M{"cmd": "GetJob", "id": "d6"}, nil},

		// 105: failParentOnFailure: the child's failure fails the parent.
		{a, flowOf("PF", "fp3", "fc3", M{"id": "f1", "failParentOnFailure": true, "maxAttempts": 1}, M{"id": "f2"}), nil},
		{b, M{"cmd": "PULL", "queue": "fc3", "owner": "w3", "lockTtl": 30000}, nil}, // f1
		{a, M{"cmd": "FAIL", "id": "f1", "token": "$f1", "error": "boom"}, nil},
		{b, M{"cmd": "GetState", "id": "PF"}, stateIs("failed")},
		{a, M{"cmd": "GetJob", "id": "PF"}, nil},
		{a, M{"cmd": "GetState", "id": "f2"}, nil},
		{b, M{"cmd": "GetFailedChildrenValues", "id": "PF"}, nil},
		{b, M{"cmd": "GetJobCounts", "queue": "fp3"}, nil},
		{a, M{"cmd": "GetJobCounts", "queue": "fc3"}, nil},
		{b, M{"cmd": "RemoveChildDependency", "id": "f2"}, nil},
		{a, M{"cmd": "PULL", "queue": "fc3"}, nil}, // f2
		{b, M{"cmd": "ACK", "id": "f2", "result": "late"}, nil},
		{a, M{"cmd": "GetChildrenValues", "id": "PF"}, nil},
		{b, M{"cmd": "Dlq", "queue": "fp3"}, nil},

		// 119: ignoreDependencyOnFailure: the parent goes on without the
		// child and keeps its error.
		{a, flowOf("PI", "fp4", "fc4", M{"id": "i1", "ignoreDependencyOnFailure": true, "maxAttempts": 1}, M{"id": "i2"}), nil},
		{b, M{"cmd": "PULL", "queue": "fc4"}, nil}, // i1
		{a, M{"cmd": "FAIL", "id": "i1", "error": "ignored"}, nil},
		{b, M{"cmd": "GetIgnoredChildrenFailures", "id": "PI"}, nil},
		{b, M{"cmd": "GetJob", "id": "PI"}, nil},
		{a, M{"cmd": "GetState", "id": "PI"}, nil},
		{a, M{"cmd": "PULL", "queue": "fc4"}, nil}, // i2
		{b, M{"cmd": "ACK", "id": "i2", "result": "i2"}, nil},
		{b, M{"cmd": "GetState", "id": "PI"}, stateIs("waiting")},
		{a, M{"cmd": "PULL", "queue": "fp4"}, nil}, // PI
		{b, M{"cmd": "GetIgnoredChildrenFailures", "id": "PI"}, nil},
		{a, M{"cmd": "GetChildrenValues", "id": "PI"}, nil},
		{a, M{"cmd": "ACK", "id": "PI"}, nil},
		{b, M{"cmd": "GetIgnoredChildrenFailures", "id": "PI"}, nil},
		{b, M{"cmd": "GetJob", "id": "PI"}, nil},

		// 134: removeDependencyOnFailure: the parent runs without the child
		// and keeps no record of it.
		{a, flowOf("PR", "fp5", "fc5", M{"id": "r1", "removeDependencyOnFailure": true, "maxAttempts": 1}), nil},
		{b, M{"cmd": "PULL", "queue": "fc5"}, nil}, // r1
		{a, M{"cmd": "FAIL", "id": "r1", "error": "removed"}, nil},
		{b, M{"cmd": "GetState", "id": "PR"}, stateIs("waiting")},
		{a, M{"cmd": "GetIgnoredChildrenFailures", "id": "PR"}, nil},
		{a, M{"cmd": "GetFailedChildrenValues", "id": "PR"}, nil},
		{b, M{"cmd": "GetJob", "id": "PR"}, nil},
		{b, M{"cmd": "GetJob", "id": "r1"}, nil},

		// 142: continueParentOnFailure: the parent runs at once, its other
		// child still to come, and sees the failure.
		{a, flowOf("PC", "fp6", "fc6", M{"id": "x1", "continueParentOnFailure": true, "maxAttempts": 1}, M{"id": "x2"}), nil},
		{b, M{"cmd": "PULL", "queue": "fc6"}, nil}, // x1
		{a, M{"cmd": "FAIL", "id": "x1", "error": "went on"}, nil},
		{b, M{"cmd": "GetState", "id": "PC"}, stateIs("waiting")},
		{a, M{"cmd": "GetFailedChildrenValues", "id": "PC"}, nil},
		{a, M{"cmd": "GetJob", "id": "PC"}, nil},
		{b, M{"cmd": "GetState", "id": "x2"}, nil},
		{b, M{"cmd": "RemoveChildDependency", "id": "x2"}, nil},

		// 150: no policy: a child failed for good leaves its parent
		// waiting; a retried one does not count as failed.
		{a, flowOf("PN", "fp7", "fc7", M{"id": "n1", "maxAttempts": 1}, M{"id": "n2", "maxAttempts": 2, "backoff": 600000}), nil},
		{b, M{"cmd": "PULL", "queue": "fc7"}, nil}, // n1
		{a, M{"cmd": "FAIL", "id": "n1", "error": "dead"}, nil},
		{b, M{"cmd": "PULL", "queue": "fc7"}, nil}, // n2
		{a, M{"cmd": "FAIL", "id": "n2", "error": "again later"}, nil},
		{b, M{"cmd": "GetChildrenValues", "id": "PN"}, nil},
		{b, M{"cmd": "GetState", "id": "PN"}, nil},
		{a, M{"cmd": "GetState", "id": "n1"}, nil},
		{a, M{"cmd": "GetState", "id": "n2"}, nil},
		{b, M{"cmd": "GetFailedChildrenValues", "id": "PN"}, nil},
		{a, M{"cmd": "RemoveChildDependency", "id": "n1"}, nil},
		{b, M{"cmd": "RemoveChildDependency", "id": "n2"}, nil},
		{b, M{"cmd": "GetState", "id": "PN"}, nil},
		{a, M{"cmd": "GetJob", "id": "PN"}, nil},
		{a, M{"cmd": "GetJobCounts", "queue": "fc7"}, nil},

		// 165: RemoveUnprocessedChildren removes the children still to
		// run; the parent stays as it was.
		{b, flowOf("PU", "fp8", "fc8", M{"id": "u1"}, M{"id": "u2"}, M{"id": "u3"}), nil},
		{a, M{"cmd": "PULL", "queue": "fc8"}, nil}, // u1
		{b, M{"cmd": "RemoveUnprocessedChildren", "id": "PU"}, nil},
		{a, M{"cmd": "GetState", "id": "u2"}, nil},
		{a, M{"cmd": "GetState", "id": "u1"}, nil},
		{b, M{"cmd": "ACK", "id": "u1", "result": "u1"}, nil},
		{b, M{"cmd": "GetChildrenValues", "id": "PU"}, nil},
		{b, M{"cmd": "GetState", "id": "PU"}, nil},
		{a, M{"cmd": "GetJobCounts", "queue": "fc8"}, nil},
		{a, M{"cmd": "RemoveUnprocessedChildren", "id": "nope"}, nil},

		// 175: three levels: values go up a level at a time, and a failure
		// that fails its parent fails the parent's parent in turn.
		{b, nested("R1", "L1", M{}), nil},
		{a, M{"cmd": "GetState", "id": "R1-m"}, nil},
		{a, M{"cmd": "PULL", "queue": "fl"}, nil}, // L1
		{b, M{"cmd": "ACK", "id": "L1", "result": "leaf"}, nil},
		{b, M{"cmd": "GetState", "id": "R1-m"}, stateIs("waiting")},
		{a, M{"cmd": "GetState", "id": "R1"}, nil},
		{a, M{"cmd": "PULL", "queue": "fm"}, nil}, // R1-m
		{b, M{"cmd": "GetChildrenValues", "id": "R1-m"}, nil},
		{b, M{"cmd": "ACK", "id": "R1-m", "result": M{"mid": "leaf"}}, nil},
		{a, M{"cmd": "GetState", "id": "R1"}, stateIs("waiting")},
		{a, M{"cmd": "GetChildrenValues", "id": "R1"}, nil},
		{b, nested("R2", "L2", M{"failParentOnFailure": true, "maxAttempts": 1}), nil},
		{a, M{"cmd": "PULL", "queue": "fl"}, nil}, // L2
		{b, M{"cmd": "FAIL", "id": "L2", "error": "deep"}, nil},
		{a, M{"cmd": "GetState", "id": "R2"}, stateIs("failed")},
		{b, M{"cmd": "GetState", "id": "R2-m"}, nil},
		{b, M{"cmd": "GetJob", "id": "R2"}, nil},
		{a, M{"cmd": "GetJob", "id": "R2-m"}, nil},
		{a, M{"cmd": "GetJobCounts", "queue": "fr"}, nil},
		{b, M{"cmd": "GetJobCounts", "queue": "fm"}, nil},
		{a, M{"cmd": "ListQueues"}, nil},
	}
	return runSteps(t, steps)
}

// nested is a PUSHF of three levels: root in queue fr, its child root-m
// in fm (which fails its parent when it fails), and leaf in fl with the
// options leafOpts, root-m's child.
func nested(root, leaf string, leafOpts M) M {
	mid := root + "-m"
	leafIn := M{"name": "leaf", "parentId": mid, "data": M{"l": leaf, "__parentId": mid, "__parentQueue": "fm"}}
	for k, v := range leafOpts {
		leafIn[k] = v
	}
	return M{"cmd": "PUSHF", "jobs": []any{
		M{"id": leaf, "queue": "fl", "input": leafIn},
		M{"id": mid, "queue": "fm", "input": M{"name": "mid", "parentId": root, "failParentOnFailure": true, "maxAttempts": 1,
			"dependsOn": []any{leaf}, "childrenIds": []any{leaf},
			"data": M{"m": mid, "__parentId": root, "__parentQueue": "fr", "__childrenIds": []any{leaf}}}},
		M{"id": root, "queue": "fr", "input": M{"name": "root", "dependsOn": []any{mid}, "childrenIds": []any{mid},
			"data": M{"r": root, "__childrenIds": []any{mid}}}},
	}}
}

// TestPGFlowsAnswerAsMemory: flows and dependencies through two brokers of
// one namespace answer as through one memory-mode server, field for
// field.
func TestPGFlowsAnswerAsMemory(t *testing.T) {
	t.Parallel()
	answersAsMemory(t, flowScript)
}
