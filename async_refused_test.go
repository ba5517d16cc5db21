package main

// A connection may have maxAsyncPerConn commands waiting. A long poll or
// a WaitJob past that is refused, and must leave nothing behind: the
// engine registers a WaitJob's waiter before the handler learns that the
// wait cannot be taken, and a long poll's hook on the graceful stop is
// made before it too. Left behind, each refused request held memory until
// its job finished or the server stopped, however many a client sent.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// fillWaits sends maxAsyncPerConn requests made by req on one connection
// of the server at addr, none of which is answered soon, waits until
// count shows them all waiting, then sends 20 more and checks that each
// is refused for the limit.
func fillWaits(t *testing.T, addr string, req func() M, count func() int) {
	t.Helper()
	w := dial(t, addr)
	for range maxAsyncPerConn {
		w.send(req())
	}
	// Within the long polls' own timeout (maxPullTimeout), past which
	// they would end.
	eventually(t, 30*time.Second, "every request waiting", func() (bool, string) {
		n := count()
		return n == maxAsyncPerConn, fmt.Sprintf("%d waiting, want %d", n, maxAsyncPerConn)
	})
	for i := range 20 {
		a, err := w.do(req(), 30*time.Second)
		if err != nil || a["ok"] != false || !strings.Contains(fmt.Sprint(a["error"]), "too many waiting commands") {
			t.Fatalf("request %d past the limit: %v %v, want it refused", i, a, err)
		}
	}
}

// memJobWaiters counts the WaitJob waiters b holds for a job.
func memJobWaiters(b *MemEngine) func(id string) int {
	return func(id string) int {
		n := 0
		b.withJob(id, func(j *Job, _ *Shard) { n = len(j.cold().waiters) })
		return n
	}
}

// A connection filled with WaitJobs on a job that will not finish soon
// refuses more, and the job keeps one waiter per waiting WaitJob.
func TestRefusedWaitJobLeavesNoWaiter(t *testing.T) {
	t.Parallel()
	m := startMemInProcess(t)
	waiters := memJobWaiters(m.b)
	c := dial(t, m.addr)
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "later", "data": 1, "delay": 3_600_000}), "id")
	fillWaits(t, m.addr, func() M { return M{"cmd": "WaitJob", "id": id, "timeout": 600_000} },
		func() int { return waiters(id) })
	if n := waiters(id); n != maxAsyncPerConn {
		t.Fatalf("the job has %d waiters after 20 WaitJobs were refused, want %d: the refused stay registered", n, maxAsyncPerConn)
	}
}

// The handler's clean-up of a refused WaitJob relies on each engine
// taking a wait's waiter off when the wait runs on an ended context.
// PostgreSQL mode is checked on the engine alone: 1,024 waiting WaitJobs
// each look at their job's row every 50 ms, some 20,000 queries a second,
// which on a loaded machine outlasted the test's bounds.
func checkWaitOnEndedContext(t *testing.T, eng Engine, addr string, waiters func(id string) int) {
	t.Helper()
	c := dial(t, addr)
	id := str(t, c.ok(M{"cmd": "PUSH", "queue": "later", "data": 1, "delay": 3_600_000}), "id")
	done, wait, err := eng.WaitJob(context.Background(), id, time.Minute)
	if err != nil || done != nil || wait == nil {
		t.Fatalf("WaitJob on a delayed job: %v %v %v, want a wait", done, wait != nil, err)
	}
	if n := waiters(id); n != 1 {
		t.Fatalf("%d waiters registered, want 1", n)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if _, finished, err := wait(ended); finished || err != nil {
		t.Fatalf("a wait on an ended context: finished %v, %v", finished, err)
	}
	if n := waiters(id); n != 0 {
		t.Fatalf("%d waiters left after the wait ended, want none", n)
	}
}

func TestWaitOnEndedContextLeavesNoWaiter(t *testing.T) {
	t.Parallel()
	m := startMemInProcess(t)
	checkWaitOnEndedContext(t, m.b, m.addr, memJobWaiters(m.b))
}

func TestPGWaitOnEndedContextLeavesNoWaiter(t *testing.T) {
	t.Parallel()
	p := startPGInProcess(t, testPGURL(), pgTestNamespace(t), nil, pgOptions{})
	checkWaitOnEndedContext(t, p.pg, p.addr, func(id string) int {
		p.pg.jobWaits.mu.Lock()
		defer p.pg.jobWaits.mu.Unlock()
		return len(p.pg.jobWaits.m[id])
	})
}

// A refused long poll leaves no hook on the graceful stop: the hooks
// counted are the waiting polls'.
func TestRefusedLongPollLeavesNoDrainHook(t *testing.T) {
	t.Parallel()
	m := startMemInProcess(t)
	fillWaits(t, m.addr, func() M { return M{"cmd": "PULL", "queue": "empty", "timeout": maxPullTimeout} },
		func() int { return int(m.b.pullsWaiting.Load()) })
	if n := m.b.drain.polls.Load(); n != maxAsyncPerConn {
		t.Fatalf("%d long polls hooked on the graceful stop after 20 were refused, want %d", n, maxAsyncPerConn)
	}
}
