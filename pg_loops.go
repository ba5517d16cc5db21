package main

// The PostgreSQL engine's background loops (the reaper, cron, the inbox of
// transactional pushes, the peer check, retention, ANALYZE, the clock):
// each runs its rounds on a ticker of its own, set apart from the others.

import (
	"context"
	"time"
)

// pgRoundTimeout bounds one round of a background loop.
const pgRoundTimeout = 10 * time.Second

// pgLoopStagger sets the background loops apart: each starts its ticker
// this long after the one started before it. Their intervals are all
// multiples of 50 ms, and started together they came due together (every
// 2 s the reaper, cron, the inbox, the peer check, retention and
// ANALYZE), each asking the pool for a connection at the same instant:
// an idle broker grew its pool to 6 sessions besides the listener. Apart,
// they take turns on one or two. The loops' offsets stay distinct modulo
// 50 ms (TestPGLoopsApart).
const pgLoopStagger = 7 * time.Millisecond

// every runs round every interval, and when kick fires (nil: never), from
// a goroutine of its own until Close; each round runs under a context
// that ends after pgRoundTimeout or at Close. The loops are started one
// after another (openPG), not side by side.
func (p *PG) every(interval time.Duration, kick <-chan struct{}, round func(ctx context.Context)) {
	if len(p.loops) == 0 {
		p.loopsAt = time.Now()
	}
	// Offsets from one instant, not from when each goroutine first runs,
	// which a busy machine can delay past the next loop's turn.
	at := p.loopsAt.Add(time.Duration(len(p.loops)) * pgLoopStagger)
	p.loops = append(p.loops, interval)
	p.wg.Go(func() {
		if d := time.Until(at); d > 0 {
			wait := time.NewTimer(d)
			select {
			case <-p.stop:
				wait.Stop()
				return
			case <-wait.C:
			}
		}
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
			case <-kick:
			}
			ctx, cancel := context.WithTimeout(p.stopCtx, pgRoundTimeout)
			round(ctx)
			cancel()
		}
	})
}
