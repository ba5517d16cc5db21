package main

// Waiting pulls in PostgreSQL mode: the pulls of this broker waiting on a
// queue, the wake-ups that send them to claim, and what the broker knows
// of a queue's emptiness.
//
// A pull that may wait first claims, and when the claim finds nothing it
// waits for a wake-up (a push or a release on any broker, pg_events.go) or
// for the next delayed job. At a steady rate that first claim nearly always
// finds nothing: a worker asks again as soon as it has its job, before the
// next push. Measured with the official client at 200 jobs/s: 2.8 claim
// transactions a job, 1.9 of them empty.
//
// So a claim that finds no ready job at all (none to take, and none
// locked by another transaction either) leaves a mark, and from then on
// the broker counts: jobs its own pushes made, jobs its claims took.
// While the two agree, a pull that comes waits at once instead of
// claiming. The mark is gone at any
// other wake-up of the queue (a release, a retry, a promotion, another
// broker's push: the writes waiting pulls already rely on), when the
// queue's next delayed job comes due, and pgRecheck after the claim that
// made it, the bound a waiting pull already has on its sleep.
//
// Only a queue without limits or groups is marked: there a job becomes
// ready only by the writes that wake, while a concurrency slot freed by an
// ACK does not wake.

import (
	"math"
	"time"
)

// pgDrained is a queue's mark and its counts.
type pgDrained struct {
	other  uint64 // wake-ups other than this broker's pushes
	pushed uint64 // jobs this broker's pushes made
	set    bool   // the mark holds
	// unseen is how many jobs may be ready since the mark: pushed after
	// the claim that made it began, less those claimed since.
	unseen int64
	at     time.Time // when the claim that made the mark began
	next   int64     // when the queue's next delayed job comes due (0: none)
	// asking is how many jobs the claim rounds in flight ask for: up to
	// as many unseen jobs are theirs to take.
	asking int64
}

// pgClaimMark is what a claim round saw of the queue's counts as it began.
type pgClaimMark struct {
	d      *pgDrained
	n      int64 // the jobs the round asks for
	other  uint64
	pushed uint64
	began  time.Time
}

// pgMaxDrained bounds the marks a broker keeps (one per queue claimed
// from); past it they are all dropped, which costs claims, never a job.
const pgMaxDrained = 4096

// woken counts a wake-up of the queue: made jobs pushed by this broker,
// or, with made < 0, anything else, which ends the mark. Called with wmu
// held; d may be nil.
func (d *pgDrained) woken(made int) {
	switch {
	case d == nil:
	case made < 0:
		d.other++
		d.set = false
	default:
		d.pushed += uint64(made)
		d.unseen += int64(made)
	}
}

// claimBegins is called before a claim round's transaction, for n jobs.
func (p *PG) claimBegins(queue string, n int) pgClaimMark {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	d := p.drained[queue]
	if d == nil {
		if len(p.drained) >= pgMaxDrained {
			clear(p.drained)
		}
		if p.drained == nil {
			p.drained = map[string]*pgDrained{}
		}
		d = &pgDrained{}
		p.drained[queue] = d
	}
	d.asking += int64(n)
	return pgClaimMark{d: d, n: int64(n), other: d.other, pushed: d.pushed, began: time.Now()}
}

// claimEnds is called after a claim round: ok when it ran, fast when the
// queue has no limits or groups. It counts what a fast claim took and,
// when the claim found no ready job at all (exhausted), makes the mark;
// next is the queue's next delayed job (0: none). The jobs pushed while
// the claim ran may not have been seen by it: the mark counts them as
// ready, and when no claim in flight asks for them a waiting pull is
// woken to. A round that began before the mark's claim may take a job
// the mark never counted, so only later rounds count against it. A
// wake-up of another kind during the claim leaves no mark, and a round
// that failed ends the mark: the rows it held go back with no wake-up.
func (p *PG) claimEnds(queue string, m pgClaimMark, ok, fast bool, took int, exhausted bool, next int64) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	d := m.d
	d.asking -= m.n
	switch {
	case !ok:
		d.woken(-1)
	case fast:
		if d.set && !m.began.Before(d.at) {
			d.unseen = max(d.unseen-int64(took), 0)
		}
		if exhausted && d.other == m.other {
			d.set, d.at, d.next = true, m.began, next
			d.unseen = int64(d.pushed - m.pushed)
		}
	}
	if d.set && d.unseen > d.asking {
		p.wakeSome(queue, 1)
	}
}

// knownEmpty reports a queue with no ready job by its mark at now (the
// broker's clock, in ms), and when its next delayed job comes due.
func (p *PG) knownEmpty(queue string, now int64) (bool, int64) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	d := p.drained[queue]
	if d == nil || !d.set || d.unseen > d.asking || time.Since(d.at) >= pgRecheck || (d.next > 0 && now >= d.next) {
		return false, 0
	}
	return true, d.next
}

// pgWaiter is a pull of this broker waiting on a queue: woken through ch,
// or handed jobs by a push (pg_handoff.go) while it sleeps. The fields
// but ch are under wmu, but jobs and tokens, which are the pull's once
// handed is closed.
type pgWaiter struct {
	ch       chan struct{}
	n        int           // the jobs the pull asks for
	o        PullOpts      // how it leases them
	sleeping bool          // it waits for a wake-up, not claiming
	reserved bool          // a push is handing it jobs: it waits for handed
	handed   chan struct{} // closed once the push's transaction settled
	jobs     []*Job
	tokens   []string
}

func (p *PG) addWaiter(queue string, n int, o PullOpts) *pgWaiter {
	w := &pgWaiter{ch: make(chan struct{}, 1), n: n, o: o, handed: make(chan struct{})}
	p.wmu.Lock()
	p.waiters[queue] = append(p.waiters[queue], w)
	p.wmu.Unlock()
	p.b.pullsWaiting.Add(1)
	return w
}

// dropWaiter takes a pull off the queue's waiters. A wake-up it was given
// and did not take goes to another waiter (wakePushed gives each to one).
func (p *PG) dropWaiter(queue string, w *pgWaiter) {
	p.b.pullsWaiting.Add(-1)
	p.wmu.Lock()
	defer p.wmu.Unlock()
	list := p.waiters[queue]
	for i, x := range list {
		if x == w {
			p.waiters[queue] = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(p.waiters[queue]) == 0 {
		delete(p.waiters, queue)
	}
	select {
	case <-w.ch:
		p.wakeSome(queue, 1)
	default:
	}
}

// wake tells the queue's pulls that jobs may be ready: every pull waiting
// on it looks.
func (p *PG) wake(queue string) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.drained[queue].woken(-1)
	p.wakeSome(queue, math.MaxInt)
}

// wakePushed wakes as many of the queue's waiting pulls as this broker's
// push made jobs, not all of them: every woken pull claims, and with 20
// waiting, 20 claims went to the database for one job, 19 of them finding
// nothing.
func (p *PG) wakePushed(queue string, made int) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.drained[queue].woken(made)
	p.wakeSome(queue, made)
}

// wakeSome wakes up to n of the queue's pulls that have no wake-up
// waiting already, first come first. Called with wmu held.
func (p *PG) wakeSome(queue string, n int) {
	for _, w := range p.waiters[queue] {
		if n == 0 {
			return
		}
		select {
		case w.ch <- struct{}{}:
			n--
		default:
		}
	}
}

// wakeAll wakes every waiting pull of every queue: the listener is back,
// and a wake-up may have been missed while it was not.
func (p *PG) wakeAll() {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	for _, d := range p.drained {
		d.woken(-1)
	}
	for q := range p.waiters {
		p.wakeSome(q, math.MaxInt)
	}
}
