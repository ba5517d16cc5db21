package main

import (
	"slices"
	"testing"
)

// TestPGRounds: lanes start up to their number, a round is the oldest
// requests that fit (a larger one alone), and a lane stops when none is
// left.
func TestPGRounds(t *testing.T) {
	t.Parallel()
	var q pgRounds[int]
	size := func(n int) int { return n }
	var started []bool
	for _, n := range []int{400, 500, 300, 2000, 10} {
		started = append(started, q.add(n, 2))
	}
	if !slices.Equal(started, []bool{true, true, false, false, false}) || q.running != 2 {
		t.Fatalf("lanes started %v, running %d; want the first two", started, q.running)
	}
	for _, want := range [][]int{{400, 500}, {300}, {2000}, {10}} {
		round, total, ok := q.next(1000, size)
		if !ok || !slices.Equal(round, want) || total != sumInts(want) {
			t.Fatalf("round %v (total %d, ok %v), want %v", round, total, ok, want)
		}
	}
	if _, _, ok := q.next(1000, size); ok || q.running != 1 {
		t.Fatalf("an empty queue gave a round, or its lane did not stop (running %d)", q.running)
	}
	if !q.add(1, 2) {
		t.Fatal("with a lane free, a new request did not start one")
	}
}

func sumInts(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}
