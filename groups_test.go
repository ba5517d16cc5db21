package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func pushJSON(t testing.TB, b *MemEngine, queue string, fields ...map[string]any) []PushResult {
	t.Helper()
	jobs := make([]*Job, len(fields))
	for i, f := range fields {
		jobs[i] = mustJob(t, queue, f)
	}
	return b.pushJobs(queue, jobs, nil)
}

// pullNames claims one job at a time and returns their names.
func pullNames(b *MemEngine, queue string, n int, o *groupPull) []string {
	var out []string
	s := b.shardOf(queue)
	for i := 0; i < n; i++ {
		s.mu.Lock()
		q := s.queues[queue]
		jobs, _ := s.claim(q, 1, PullOpts{Group: o}, b.now(), nil, nil)
		s.mu.Unlock()
		if len(jobs) == 0 {
			break
		}
		out = append(out, jobs[0].Name)
	}
	return out
}

func TestGroupRoundRobin(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	for _, g := range []string{"A", "B", "C"} {
		for i := 1; i <= 3; i++ {
			pushJSON(t, b, "g", map[string]any{"name": fmt.Sprint(g, i), "data": 1, "groupId": g})
		}
	}
	got := pullNames(b, "g", 20, nil)
	want := []string{"A1", "B1", "C1", "A2", "B2", "C2", "A3", "B3", "C3"}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestGroupOrderingRules(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	push := func(name, group string, prio int64, lifo bool) {
		f := map[string]any{"name": name, "data": 1, "priority": prio, "lifo": lifo}
		if group != "" {
			f["groupId"] = group
		}
		pushJSON(t, b, "o", f)
	}
	// The reference's verified mixed order: U2p3 U1 U3 A1 B2p1 A3p0 B1p9 A4lifo A2p5.
	push("U1", "", 0, false)
	push("A1", "A", 0, false)
	push("U2p3", "", 3, false)
	push("B1p9", "B", 9, false)
	push("A2p5", "A", 5, false)
	push("B2p1", "B", 1, false)
	push("A3p0", "A", 0, false)
	push("U3", "", 0, false)
	push("A4lifo", "A", 0, true)
	got := pullNames(b, "o", 20, nil)
	want := []string{"U2p3", "U1", "U3", "A1", "B2p1", "A3p0", "B1p9", "A4lifo", "A2p5"}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// A group joining while others rotate enters at the end of the round.
func TestGroupJoinsEndOfRound(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	for _, n := range []string{"A1", "A2", "A3", "B1", "B2", "B3"} {
		pushJSON(t, b, "j", map[string]any{"name": n, "data": 1, "groupId": n[:1]})
	}
	got := pullNames(b, "j", 1, nil)
	pushJSON(t, b, "j", map[string]any{"name": "C1", "data": 1, "groupId": "C"})
	got = append(got, pullNames(b, "j", 10, nil)...)
	want := []string{"A1", "B1", "A2", "C1", "B2", "A3", "B3"}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestGroupLimitsAndPause(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	for _, n := range []string{"A1", "A2", "B1", "B2", "C1"} {
		pushJSON(t, b, "l", map[string]any{"name": n, "data": 1, "groupId": n[:1]})
	}
	// concurrency 1 per group: one of each, then nothing until one ends.
	got := pullNames(b, "l", 10, &groupPull{concurrency: 1})
	if !slices.Equal(got, []string{"A1", "B1", "C1"}) {
		t.Fatalf("with concurrency 1: %v", got)
	}
	// A pull without the option is not bound by it.
	if got := pullNames(b, "l", 1, nil); !slices.Equal(got, []string{"A2"}) {
		t.Fatalf("plain pull: %v", got)
	}
	b2 := NewMemEngine(1, nil)
	defer b2.Close()
	for _, n := range []string{"A1", "A2", "B1", "B2"} {
		pushJSON(t, b2, "p", map[string]any{"name": n, "data": 1, "groupId": n[:1]})
	}
	b2.withQueue("p", false, func(s *Shard, q *Queue, now int64) {
		g := q.groups["A"]
		g.paused = true
		q.ringRemove(g)
	})
	if got := pullNames(b2, "p", 10, nil); !slices.Equal(got, []string{"B1", "B2"}) {
		t.Fatalf("paused group A: %v", got)
	}
	b2.withQueue("p", false, func(s *Shard, q *Queue, now int64) {
		g := q.groups["A"]
		g.paused = false
		q.ringAdd(g)
	})
	if got := pullNames(b2, "p", 10, nil); !slices.Equal(got, []string{"A1", "A2"}) {
		t.Fatalf("resumed group A: %v", got)
	}
	// A window of 1 per hour lets one job per group through.
	b3 := NewMemEngine(1, nil)
	defer b3.Close()
	for _, n := range []string{"A1", "A2", "B1", "B2"} {
		pushJSON(t, b3, "w", map[string]any{"name": n, "data": 1, "groupId": n[:1]})
	}
	if got := pullNames(b3, "w", 10, &groupPull{limit: &groupLimit{max: 1, duration: 3600000}}); !slices.Equal(got, []string{"A1", "B1"}) {
		t.Fatalf("rate window: %v", got)
	}
}

func TestGroupMaxSizeRefusesWholeBatch(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	pushJSON(t, b, "m", map[string]any{"data": 1, "groupId": "G", "groupMaxSize": int64(3)})
	res := pushJSON(t, b, "m",
		map[string]any{"data": 2, "groupId": "G", "groupMaxSize": int64(3)},
		map[string]any{"data": 3, "groupId": "G", "groupMaxSize": int64(3)},
		map[string]any{"data": 4, "groupId": "G", "groupMaxSize": int64(3)})
	if len(res) != 1 || res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "Group G has reached its maximum size of 3") {
		t.Fatalf("overflowing batch: %+v", res)
	}
	if c := b.counts("m"); c.Waiting != 1 {
		t.Fatalf("a refused batch left %d jobs", c.Waiting-1)
	}
	if res := pushJSON(t, b, "m", map[string]any{"data": 2, "groupId": "G", "groupMaxSize": int64(3)}); res[0].Err != nil {
		t.Fatal("a batch that fits was refused")
	}
}

// BenchmarkPullManyGroups: claiming from a queue with many groups costs
// a ring step and a heap pop, however many groups there are. The queue is
// filled before timing with enough jobs for every claim.
func BenchmarkPullManyGroups(b *testing.B) {
	for _, groups := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("groups=%d", groups), func(b *testing.B) {
			br := NewMemEngine(1, nil)
			defer br.Close()
			perGroup := b.N/groups + 1
			for g := 0; g < groups; g++ {
				jobs := make([]*Job, perGroup)
				for k := range jobs {
					jobs[k] = mustJob(b, "bench", map[string]any{"data": 1, "groupId": "g" + itoa(int64(g))})
				}
				br.pushJobs("bench", jobs, nil)
			}
			s := br.shardOf("bench")
			q := s.queues["bench"]
			o := PullOpts{}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s.mu.Lock()
				if jobs, _ := s.claim(q, 1, o, 1, nil, nil); len(jobs) != 1 {
					b.Fatal("nothing to claim")
				}
				s.mu.Unlock()
			}
		})
	}
}
