package main

import (
	"cmp"
	"context"
	"slices"
	"testing"
	"time"
)

// TestPGLoopsApart: the background loops of a broker never come due
// together. Over ten seconds (a whole cycle of their intervals) no two
// loops' rounds are due within 5 ms of each other, so that an idle broker
// serves them on one or two pool connections, not one each.
func TestPGLoopsApart(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, _ := openTestPG(t, ctx, ns, pgOptions{})
	if len(p.loops) != 7 {
		t.Fatalf("%d background loops, want 7: peers, the reaper, cron, the clock, retention, ANALYZE and the inbox (docs/postgresql.md names them)", len(p.loops))
	}
	type due struct {
		at   time.Duration
		loop int
	}
	var all []due
	for i, every := range p.loops {
		for at := time.Duration(i)*pgLoopStagger + every; at <= 10*time.Second; at += every {
			all = append(all, due{at, i})
		}
	}
	slices.SortFunc(all, func(a, b due) int { return cmp.Compare(a.at, b.at) })
	for k := 1; k < len(all); k++ {
		if a, b := all[k-1], all[k]; a.loop != b.loop && b.at-a.at < 5*time.Millisecond {
			t.Fatalf("loops %d (every %v) and %d (every %v) come due %v apart, at %v", a.loop, p.loops[a.loop], b.loop, p.loops[b.loop], b.at-a.at, b.at)
		}
	}
}
