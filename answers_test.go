package main

// The answer budget and the frame limit on answers (answers.go).

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// jobAtLimits is a job with every list and string at its limit, and data
// of n bytes.
func jobAtLimits(n int) *Job {
	j := withID(&Job{Queue: strings.Repeat("q", maxQueueName), Name: strings.Repeat("n", 200),
		Data: encodeString(strings.Repeat("d", n))}, strings.Repeat("i", maxKeyBytes))
	c := j.warm()
	c.CustomID = j.ID()
	c.UniqueKey = strings.Repeat("u", maxKeyBytes)
	c.ParentID = strings.Repeat("p", maxKeyBytes)
	c.GroupID = strings.Repeat("g", maxGroupID)
	c.DebounceID = strings.Repeat("b", maxKeyBytes)
	for range maxTags {
		c.Tags = append(c.Tags, "")
	}
	for range maxDeps {
		c.DependsOn = append(c.DependsOn, "")
		c.Children = append(c.Children, "")
	}
	for range maxStackLines {
		c.Stack = append(c.Stack, "")
	}
	c.Progress = encodeString(strings.Repeat("r", 1000))
	c.ProgressMsg, c.HasProgressMsg = strings.Repeat("m", 1000), true
	for i := range maxTimelineEntries {
		j.setTimeline(append(j.Timeline(), TimelineEntry{State: StateFailed, At: int64(i) * 1e12, HasErr: true,
			Error: strings.Repeat("e", 100), Attempt: int32(i + 1)}))
	}
	return j
}

func encodeString(s string) Raw {
	var e Enc
	e.Str(s)
	return Raw(e.B)
}

// jobWireBound is never less than what encodeJob writes, in every mode,
// and a job without a result never passes maxJobWire.
func TestJobWireBound(t *testing.T) {
	result := encodeString(strings.Repeat("r", 5000))
	for _, j := range []*Job{
		withID(&Job{Queue: "q", Name: "n", Data: Raw{0xc0}}, "a"),
		withID(&Job{Queue: "q", Name: "n", Data: encodeString(strings.Repeat("x", 9_900_000))}, "b"),
		jobAtLimits(0),
		jobAtLimits(maxDataBytes),
	} {
		for _, mode := range []int{jobPlain, jobWithRead, jobWithState} {
			for _, rv := range []Raw{nil, result} {
				var e Enc
				encodeJob(&e, j, mode, "waiting-children", rv)
				if bound := jobWireBound(j, rv); int64(len(e.B)) > bound {
					t.Errorf("job %.8s mode %d: encoded %d bytes, bound %d", j.ID(), mode, len(e.B), bound)
				}
			}
		}
		if b := jobWireBound(j, nil); b > maxJobWire && j.size() <= maxJobBytes {
			t.Errorf("job %.8s: bound %d over maxJobWire %d", j.ID(), b, maxJobWire)
		}
	}
	if answerCap-maxJobWire < 4*maxJobWire {
		t.Errorf("a pull of big jobs would carry few: answerCap %d, maxJobWire %d", answerCap, maxJobWire)
	}
}

// pullKeeps and the memory engine's claim stop at the same job.
func TestPullKeeps(t *testing.T) {
	big := withID(&Job{Queue: "q", Data: encodeString(strings.Repeat("x", 9_900_000))}, "b")
	jobs := make([]*Job, 12)
	for i := range jobs {
		jobs[i] = big
	}
	keep := pullKeeps(jobs)
	if keep < 1 || keep >= len(jobs) {
		t.Fatalf("pullKeeps kept %d of %d jobs of 9.9 MB", keep, len(jobs))
	}
	if got := int64(keep) * jobWireBound(big, nil); got > answerCap {
		t.Fatalf("%d jobs kept: %d bytes, over answerCap %d", keep, got, answerCap)
	}
	small := withID(&Job{Queue: "q", Data: Raw{0xc0}}, "s")
	if n := pullKeeps([]*Job{small, small, small}); n != 3 {
		t.Fatalf("pullKeeps kept %d of 3 small jobs", n)
	}
}

// A reservation waits its turn, is granted in order as room is freed,
// and is refused, naming the budget, when none comes in time; a free that
// makes no room for the first in line wakes nobody.
func TestAnswerBudgetReserve(t *testing.T) {
	a := newAnswerBudget(100, 0)
	a.wait = 5 * time.Second
	ctx := context.Background()
	if err := a.reserve(ctx, 80); err != nil {
		t.Fatal(err)
	}
	// Larger than the whole budget: granted when nothing else is held.
	done := make(chan string, 3)
	var wg sync.WaitGroup
	start := func(name string, n int64) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.reserve(ctx, n); err != nil {
				done <- name + ": " + err.Error()
				return
			}
			done <- name
		}()
		eventually(t, 5*time.Second, name+" queued", func() (bool, string) {
			a.mu.Lock()
			defer a.mu.Unlock()
			for _, w := range a.queue {
				if w.n == n {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d waiting", len(a.queue))
		})
	}
	start("first", 50)
	start("second", 10)
	// 10 bytes fit, but the second waits behind the first.
	a.hold(5)
	a.free(5)
	select {
	case got := <-done:
		t.Fatalf("%s granted while the budget had no room for the first in line", got)
	default:
	}
	a.free(30) // 50 held: the first (50) fits, the second not after it
	if got := <-done; got != "first" {
		t.Fatalf("granted %q, want the first in line", got)
	}
	a.free(10)
	if got := <-done; got != "second" {
		t.Fatalf("granted %q, want the second", got)
	}
	if u := a.used.Load(); u != 100 {
		t.Fatalf("%d bytes held, want 100", u)
	}
	a.free(100)
	if err := a.reserve(ctx, 500); err != nil {
		t.Fatalf("an answer larger than the budget, alone: %v", err)
	}
	a.wait = 50 * time.Millisecond
	err := a.reserve(ctx, 10)
	if err == nil || !strings.HasPrefix(err.Error(), busyPrefix) || !strings.Contains(err.Error(), "100 bytes") {
		t.Fatalf("refusal %v: want %q naming the budget", err, busyPrefix)
	}
	if a.refused.Load() != 1 || a.waiting.Load() != 0 {
		t.Fatalf("refused %d, waiting %d", a.refused.Load(), a.waiting.Load())
	}
	cctx, cancel := context.WithCancel(ctx)
	a.wait = time.Minute
	go cancel()
	if err := a.reserve(cctx, 10); err == nil {
		t.Fatal("a reservation whose connection closed was granted")
	}
	a.free(500)
	wg.Wait()
	if u := a.used.Load(); u != 0 {
		t.Fatalf("%d bytes still held", u)
	}
}

// bigJob pushes a job of n bytes of data and returns its id.
func bigJob(t *testing.T, c *tclient, queue string, n, attempts int) string {
	t.Helper()
	return str(t, c.ok(M{"cmd": "PUSH", "queue": queue, "data": strings.Repeat("x", n), "maxAttempts": attempts}), "id")
}

// No answer is larger than the frame limit: a page of big jobs, a pull of
// them and the DLQ are cut to what one frame carries, and what is left is
// there for the next page or pull. In every storage mode.
func TestAnswersCutToFrameLimit(t *testing.T) {
	for _, mode := range []string{"memory", "sqlite", "postgres"} {
		t.Run(mode, func(t *testing.T) {
			srv := startBinary(t, storageFlags(t, mode)...)
			c := dial(t, srv.addr())
			const n, size = 8, 9_900_000
			ids := map[string]bool{}
			for range n {
				ids[bigJob(t, c, "big", size, 1)] = true
			}
			// GetJobs pages.
			seen := map[string]bool{}
			for offset := 0; len(seen) < n; {
				jobs := list(t, c.ok(M{"cmd": "GetJobs", "queue": "big", "limit": 100, "offset": offset}), "jobs")
				if len(jobs) == 0 || len(jobs)*size > MaxFrame {
					t.Fatalf("GetJobs at offset %d answered %d jobs of %d bytes", offset, len(jobs), size)
				}
				if offset == 0 && len(jobs) == n {
					t.Fatalf("GetJobs answered all %d jobs of %d bytes in one frame", n, size)
				}
				for _, j := range jobs {
					seen[str(t, j.(map[string]any), "id")] = true
				}
				offset += len(jobs)
			}
			// PULLB: what one answer cannot carry stays waiting.
			var pulled []any
			var tokens []any
			for len(pulled) < n {
				a := c.ok(M{"cmd": "PULLB", "queue": "big", "count": n, "owner": "w"})
				jobs := list(t, a, "jobs")
				if len(jobs) == 0 || len(jobs)*size > MaxFrame {
					t.Fatalf("PULLB answered %d jobs of %d bytes", len(jobs), size)
				}
				if len(pulled) == 0 && len(jobs) == n {
					t.Fatalf("PULLB answered all %d jobs of %d bytes in one frame", n, size)
				}
				counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "big"}), "counts")
				if w := num(t, counts["waiting"]); int(w) != n-len(pulled)-len(jobs) {
					t.Fatalf("after a PULLB of %d: %v waiting, want %d", len(jobs), w, n-len(pulled)-len(jobs))
				}
				for _, j := range jobs {
					id := str(t, j.(map[string]any), "id")
					if !ids[id] {
						t.Fatalf("PULLB answered %s twice or unknown", id)
					}
					delete(ids, id)
					pulled = append(pulled, id)
				}
				tokens = append(tokens, list(t, a, "tokens")...)
			}
			// Each fails for good: the DLQ holds them all, its answer what
			// fits.
			for i, id := range pulled {
				c.ok(M{"cmd": "FAIL", "id": id, "token": tokens[i], "error": "no"})
			}
			eventually(t, 30*time.Second, "every job in the DLQ", func() (bool, string) {
				st := sub(t, sub(t, c.ok(M{"cmd": "GetDlqStats", "queue": "big"}), "data"), "stats")
				return num(t, st["total"]) == n, fmt.Sprint(st)
			})
			a := c.ok(M{"cmd": "Dlq", "queue": "big"})
			if jobs := list(t, a, "jobs"); len(jobs) == 0 || len(jobs) == n || 2*len(jobs)*size > MaxFrame {
				t.Fatalf("Dlq answered %d entries of %d bytes (twice each)", len(jobs), size)
			}
			c.ok(M{"cmd": "Ping"})
		})
	}
}
