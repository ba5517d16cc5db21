package main

import "time"

// Rounds: the way PostgreSQL mode batches pushes (pg_pushbuf.go), claims
// and ACKs (pg_lifecycle.go). Requests queue up; a few goroutines (lanes) each
// take the longest run of the oldest requests that fits a round, do it in
// one transaction, and come back for more until none waits. The owner
// keeps the lock: pgRounds is only the queue and its count of lanes.

type pgRounds[R any] struct {
	pending []R
	running int       // lanes at work
	began   time.Time // when the last round was taken
}

// add queues r and reports whether the caller must start a lane (fewer
// than lanes are at work). The owner's lock is held.
func (q *pgRounds[R]) add(r R, lanes int) bool {
	q.pending = append(q.pending, r)
	if q.running < lanes {
		q.running++
		return true
	}
	return false
}

// addSmall is add for rounds that do best one at a time under a steady
// stream (ACKs, which wait for company: ackGather; claims): a second
// lane starts only for a backlog larger than small. Under a steady stream
// the requests that come while a round runs are then the next round, one
// statement and one commit for them all, rather than rounds of one
// request each side by side; a bulk load still gets its lanes.
func (q *pgRounds[R]) addSmall(r R, lanes, small int, size func(R) int) bool {
	q.pending = append(q.pending, r)
	if q.running == 0 {
		q.running++
		return true
	}
	if q.running >= lanes {
		return false
	}
	total := 0
	for _, p := range q.pending {
		total += size(p)
	}
	// A round that has run long (waiting on a row lock, say) does not
	// hold up the requests behind it: they get a lane of their own.
	if total > small || (!q.began.IsZero() && time.Since(q.began) > pgRoundSlow) {
		q.running++
		return true
	}
	return false
}

// pgRoundSlow is how long a round may run before a request that comes
// meanwhile starts another lane (addSmall).
const pgRoundSlow = 100 * time.Millisecond

// next takes the next round: the oldest requests whose sizes add up to at
// most max (the first one whatever its size, as a request is never
// split), and their total. When nothing waits, ok is false and the lane
// asking has stopped. The owner's lock is held.
func (q *pgRounds[R]) next(max int, size func(R) int) (round []R, total int, ok bool) {
	k := 0
	for k < len(q.pending) && (k == 0 || total+size(q.pending[k]) <= max) {
		total += size(q.pending[k])
		k++
	}
	if k == 0 {
		q.running--
		q.pending = nil
		return nil, 0, false
	}
	round = q.pending[:k:k]
	q.pending = q.pending[k:]
	q.began = time.Now()
	return round, total, true
}

// waitForCompany is a round's wait for the requests that keep it company
// (the push lanes' gather, ackGather): until enough holds, checked again
// at each poke of arrived, for at most d, or until stop closes (nil: no
// stop).
func waitForCompany(d time.Duration, arrived, stop <-chan struct{}, enough func() bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	for !enough() {
		select {
		case <-arrived:
		case <-t.C:
			return
		case <-stop:
			return
		}
	}
}
