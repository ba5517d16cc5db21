package main

import (
	"testing"
	"time"
)

// TestPGPaceTellsStreams: the push lanes' batches wait for company only
// under a stream: pushes that come while a batch is written, or clients
// sending a few jobs at a time in sizes that change (the official
// client's add()). A client that waits for each answer, one job or a
// fixed batch at a time, never makes its pushes wait; and a pause of
// 100 ms forgets a stream.
func TestPGPaceTellsStreams(t *testing.T) {
	t.Parallel()
	batch := func(sizes ...int) []*pgPushReq {
		var b []*pgPushReq
		for _, n := range sizes {
			b = append(b, &pgPushReq{jobs: make([]*Job, n)})
		}
		return b
	}
	now := time.Now()
	var one, fixed, gathering, stream pgPace
	for i := range 20 {
		at := now.Add(time.Duration(i) * time.Millisecond)
		one.wrote(batch(1), 0, at)
		fixed.wrote(batch(10), 0, at)
		gathering.wrote(batch(1+i%3), 0, at)
		stream.wrote(batch(1), 1, at)
	}
	for name, c := range map[string]struct {
		p    *pgPace
		want pgPaceMode
	}{
		"one job at a time": {&one, pgPaceAnswers}, "a fixed batch at a time": {&fixed, pgPaceAnswers},
		"a few jobs in changing sizes": {&gathering, pgPaceGatherers}, "pushes coming meanwhile": {&stream, pgPaceStream},
	} {
		if got := c.p.mode(); got != c.want {
			t.Errorf("%s: mode %d, want %d", name, got, c.want)
		}
	}
	stream.at = now.Add(-time.Second)
	stream.wrote(batch(1), 0, now)
	if got := stream.mode(); got != pgPaceAnswers {
		t.Errorf("a stream after a pause: mode %d, want %d", got, pgPaceAnswers)
	}
	var two pgPace
	for i := range 20 {
		at := now.Add(time.Duration(i) * time.Millisecond)
		two.wrote([]*pgPushReq{{queue: "a", jobs: make([]*Job, 1)}}, 0, at)
		two.wrote([]*pgPushReq{{queue: "b", jobs: make([]*Job, 10)}}, 0, at)
	}
	if got := two.mode(); got != pgPaceAnswers {
		t.Errorf("two clients on two queues, each a fixed size at a time: mode %d, want %d", got, pgPaceAnswers)
	}
	var big pgPace
	for i := range 20 {
		big.wrote(batch(100+i), 0, now)
	}
	if got := big.mode(); got != pgPaceAnswers {
		t.Errorf("batches of 100 and more, their sizes changing: mode %d, want %d", got, pgPaceAnswers)
	}
}
