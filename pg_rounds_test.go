package main

import (
	"slices"
	"testing"
	"time"
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

// TestPGRoundsSmall: with addSmall, requests that come while a round is
// in flight wait for the next round rather than start a second lane,
// until those waiting ask for more than small, or the round in flight has
// run past pgRoundSlow: the claim lanes of a stream of single pulls
// (pgClaimSmall) and the ACK lanes (pgAckSmall).
func TestPGRoundsSmall(t *testing.T) {
	t.Parallel()
	var q pgRounds[int]
	size := func(n int) int { return n }
	if !q.addSmall(1, 2, 64, size) {
		t.Fatal("with no lane at work, a request did not start one")
	}
	if _, _, ok := q.next(1000, size); !ok {
		t.Fatal("no round for the first request")
	}
	for i := range 20 {
		if q.addSmall(1, 2, 64, size) {
			t.Fatalf("single request %d started a second lane behind a round just taken", i)
		}
	}
	if !q.addSmall(50, 2, 64, size) || q.running != 2 {
		t.Fatalf("requests for 70 did not start the second lane (running %d)", q.running)
	}
	if q.addSmall(100, 2, 64, size) {
		t.Fatal("a third lane started past the number of lanes")
	}
	round, total, ok := q.next(1000, size)
	if !ok || len(round) != 22 || total != 170 {
		t.Fatalf("the next round took %d requests for %d jobs, want all 22 waiting for 170", len(round), total)
	}

	var slow pgRounds[int]
	slow.addSmall(1, 2, 64, size)
	slow.next(1000, size)
	slow.began = time.Now().Add(-2 * pgRoundSlow)
	if !slow.addSmall(1, 2, 64, size) {
		t.Fatal("behind a round running past pgRoundSlow, a request did not start a second lane")
	}
}
