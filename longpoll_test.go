package main

// Waiting for a long poll or a WaitJob to be parked, instead of sleeping
// and assuming it is.
//
// A long poll's own server counts it (bunqueue_pulls_waiting) once its
// waiter is registered, and a test waits on that figure
// (awaitPullsWaiting), in this process or another: other tests' servers
// do not move it. WaitJob has no such figure, so for it the in-process
// tests read this process's goroutines: a wait is parked when a goroutine
// is blocked in the select of the function that waits for it (its waiter
// registered under the shard lock before). A test counts before and
// after, which another test's wait starting or ending in between throws
// off. Some tests of servers in a process of their own send a Ping after
// the poll on the same connection instead (pollWaiting).

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The function a parked WaitJob blocks in, in memory mode.
const parkedWaitJob = "(*MemEngine).WaitJob.func"

// allStacks is every goroutine's stack in this process, one per entry,
// whole however many there are.
func allStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// parkedIn counts the goroutines of this process blocked in a select
// directly in a function of this package whose name, in a stack trace
// (the package's path, a dot, then fn), starts with fn.
func parkedIn(fn string) int {
	count := 0
	for _, g := range allStacks() {
		lines := strings.Split(g, "\n")
		if len(lines) == 0 || !strings.Contains(lines[0], "[select") {
			continue
		}
		// The first frame that is not the runtime's is the one that
		// selects.
		for _, l := range lines[1:] {
			if l == "" || l[0] == '\t' || strings.HasPrefix(l, "runtime.") {
				continue
			}
			if strings.Contains(l, "."+fn) {
				count++
			}
			break
		}
	}
	return count
}

// blockedIn counts the goroutines of this process in the given state
// ("IO wait", say) with fn among their frames.
func blockedIn(state, fn string) int {
	count := 0
	for _, g := range allStacks() {
		head, rest, _ := strings.Cut(g, "\n")
		if strings.Contains(head, "["+state) && strings.Contains(rest, fn) {
			count++
		}
	}
	return count
}

// awaitParked waits until at least n goroutines are parked in fn, within a
// deadline far above what a loaded machine needs.
func awaitParked(t testing.TB, fn string, n int) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("%d long polls parked in %s", n, fn), func() (bool, string) {
		got := parkedIn(fn)
		return got >= n, fmt.Sprintf("%d parked (if none ever is, was %s renamed?)", got, fn)
	})
}

// awaitPullsWaiting waits until the server at addr counts n long polls
// waiting for a job, as its Prometheus command reports them. The count
// goes up once the poll's waiter is registered (under the shard lock in
// memory mode), so a job pushed or a shutdown after it reaches the poll.
func awaitPullsWaiting(t *testing.T, addr string, n int) {
	t.Helper()
	c := dial(t, addr)
	eventually(t, 20*time.Second, fmt.Sprintf("%d long polls waiting", n), func() (bool, string) {
		text := str(t, sub(t, c.ok(map[string]any{"cmd": "Prometheus"}), "data"), "metrics")
		v := promValue(t, parseProm(t, text), "bunqueue_pulls_waiting", "")
		return v == float64(n), fmt.Sprint(v, " waiting")
	})
}

// pollWaiting is what a test can know of a long poll sent on c to a
// server in a process of its own: a Ping sent behind it on the same
// connection is answered, so the server has read the poll and handed it
// to a goroutine of its own that waits (in memory mode, after a first
// look found nothing to claim). Whether that goroutine has registered its
// waiter yet is not shown, so what the test does next must have the same
// answer either way (a job pushed now is handed out by the poll's next
// look or by the wake-up). awaitPullsWaiting waits for the waiter itself.
func pollWaiting(t testing.TB, c *tclient) {
	t.Helper()
	c.ok(map[string]any{"cmd": "Ping"})
}
