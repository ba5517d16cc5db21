package main

// Pushes under a steady stream wait a moment for company. A commit costs
// the database about as much whatever it carries (0.1-0.3 ms of CPU on
// the machine of docs/performance.md for the statements of a small batch
// and its WAL flush): written as they came, the pushes of a steady 1,000
// jobs/s through the official client went some 1.5 jobs to a commit, and
// the database spent 0.59 ms of CPU a job. When the lane is under a
// stream, the oldest push of a batch now waits up to pgPushLinger for
// others: each commit carries some 5 jobs, the jobs are handed to the
// waiting pulls in fewer statements (pg_handoff.go), and their ACKs come
// in larger rounds. The database's CPU a job fell to 0.23 ms, at some
// 4 ms more latency.
//
// Waiting only pays when more pushes come meanwhile whatever the lane
// does. It does not for a client that waits for each answer before it
// sends again (a script's await in a loop, a fixed-size batch after
// batch): each push would take pgPushLinger longer, and no more would
// come. So the writer tells, from the batches it writes:
//
//   - pushes that came while a batch was being written come on their own
//     (an application adding jobs as they come, a client that pipelines):
//     the next batch waits up to pgPushLinger from its oldest push, or
//     until as many have come as the last batch answered;
//   - requests of a few jobs to a queue whose sizes change from one to
//     the next are a client gathering what came while its last push was
//     answered, as the official client's add() does (it sends what it
//     gathered as soon as the answer comes): the batch waits the whole
//     pgPushLinger, since the longer it waits, the more the client
//     gathers.
//
// Pipelining clients are answered before they linger long (as many came
// back as were answered), and clients that wait for each answer never
// make a score: those batches go at once, as before (gather). Not told
// apart: two such clients on one queue that send different fixed sizes
// look like a client gathering, and wait.

import "time"

// pgPushLinger is how long the oldest push of a batch may wait for
// company under a stream. Past 5 ms the official client sends what it
// gathered without waiting for the answer.
const pgPushLinger = 4 * time.Millisecond

// pgPaceMode is how a lane's batches wait.
type pgPaceMode int

const (
	pgPaceAnswers   pgPaceMode = iota // for the clients just answered (gather)
	pgPaceStream                      // up to pgPushLinger, or as many as answered
	pgPaceGatherers                   // pgPushLinger
)

// pgPace scores what a lane's batches show of its clients, the scores
// fading by a quarter a batch and forgotten after 100 ms with none. The
// lane's lock guards it.
type pgPace struct {
	came    int     // pushes queued, ever
	stream  float64 // pushes that came while a batch was written
	gathers float64 // requests of a few jobs, their sizes changing
	// sizes are the jobs of each queue's last request written (the lanes
	// are shared by queues: one client's sizes are told apart from
	// another's on another queue); at most pgPaceQueues are kept.
	sizes map[string]int
	at    time.Time
}

// pgPaceQueues bounds pgPace.sizes.
const pgPaceQueues = 64

// wrote scores a batch written from began, while came pushes came.
func (p *pgPace) wrote(batch []*pgPushReq, came int, began time.Time) {
	if began.Sub(p.at) > 100*time.Millisecond {
		p.stream, p.gathers = 0, 0
	}
	if p.sizes == nil || len(p.sizes) > pgPaceQueues {
		p.sizes = make(map[string]int)
	}
	g := 0
	for _, r := range batch {
		n := len(r.jobs)
		if last := p.sizes[r.queue]; n <= 16 && last > 0 && n != last {
			g++
		}
		if n > 16 {
			n = 0
		}
		p.sizes[r.queue] = n
	}
	p.stream = p.stream*0.75 + float64(came)
	p.gathers = p.gathers*0.75 + float64(g)
	p.at = time.Now()
}

// mode is how the lane's next batch waits.
func (p *pgPace) mode() pgPaceMode {
	switch {
	case p.gathers >= 0.5:
		return pgPaceGatherers
	case p.stream >= 0.5:
		return pgPaceStream
	}
	return pgPaceAnswers
}

// linger waits until until, until target pushes are queued (-1: no
// target), or until the pushes queued fill a batch.
func (l *pgPushLane) linger(until time.Time, target int) {
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	for {
		l.mu.Lock()
		n, jobs := len(l.pending), 0
		for _, r := range l.pending {
			if jobs += len(r.jobs); jobs >= pgPushMaxJobs {
				break
			}
		}
		l.mu.Unlock()
		if jobs >= pgPushMaxJobs || target >= 0 && n >= target {
			return
		}
		select {
		case <-l.arrived:
		case <-t.C:
			return
		}
	}
}
