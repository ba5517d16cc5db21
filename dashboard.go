package main

// The memory engine's dashboard figures (DashboardEngine): the totals of
// Stats and the overview, each queue's counts, one queue's detail.
// pg_dashboard.go answers the same from the database. The handlers and
// the shapes of the answers are in cmd_dashboard.go.

import (
	"context"
	"slices"
)

// Totals is a snapshot of the broker's state across every queue.
type Totals struct {
	Waiting, Prioritized, Delayed, Active, DLQ, Completed, Paused int
	WaitingChildren                                               int
	Queues                                                        int
}

func (b *MemEngine) totals() Totals {
	var t Totals
	now := b.now()
	for _, s := range b.shards {
		s.with(func() {
			s.promote(now)
			for _, q := range s.queues {
				w := q.nReady - q.nPrio
				if q.paused {
					t.Paused += q.nReady
				}
				t.Waiting += w
				t.Prioritized += q.nPrio
				t.Delayed += q.nDelayed
				t.Active += q.nActive
				t.DLQ += len(q.dlq)
				t.Completed += q.nDone + q.nCold
				t.WaitingChildren += len(q.wc)
				if q.listed {
					t.Queues++
				}
			}
		})
	}
	return t
}

func (b *MemEngine) Totals(context.Context) (Totals, error) { return b.totals(), nil }

// collectionSizes are the broker's internal collections, for the overview.
type collectionSizes struct {
	jobIndex, results, logs, locks, clients, clientJobs int
}

// dashOverview is what DashboardOverview shows of storage: the job
// figures, the sizes of the collections holding them, the cron
// schedules. sizes.clients and sizes.clientJobs are left to the caller:
// connections are this broker's (Server.heldJobs).
type dashOverview struct {
	totals Totals
	sizes  collectionSizes
	crons  []CronSchedule
}

func (b *MemEngine) DashboardOverview(context.Context) (dashOverview, error) {
	return dashOverview{totals: b.totals(), sizes: b.storeSizes(), crons: b.cron.List()}, nil
}

// storeSizes counts the collections the engine keeps jobs in.
func (b *MemEngine) storeSizes() collectionSizes {
	c := collectionSizes{jobIndex: b.idxLen()}
	locked(&b.rmu, func() {
		c.results = b.results.Len()
	})
	locked(&b.lmu, func() {
		c.logs = b.logs.Len()
	})
	for _, s := range b.shards {
		s.with(func() {
			s.leases.Each(func(e *hent) bool {
				if e.job.state == StateActive && e.job.run().lease != nil {
					c.locks++
				}
				return true
			})
		})
	}
	return c
}

func (b *MemEngine) DashboardQueues(context.Context) ([]queueSnap, error) {
	return b.queueSnaps(), nil
}

const (
	dashJobsDefault = 10
	dashJobsMax     = 50
	dashDLQPreview  = 10
)

// dashQueueArgs are DashboardQueue's fields.
type dashQueueArgs struct {
	queue    string
	withJobs bool
	limit    int
}

// dashQueue is what DashboardQueue shows of a queue at one moment (at).
// The job lists are there when asked for: ready jobs in claim order,
// active ones by start, delayed ones by run time.
type dashQueue struct {
	at                     int64
	counts                 JobCounts
	paused                 bool
	prioKeys               []int64
	perPrio                map[int64]int
	dlq                    []*Job // the first dashDLQPreview
	ready, active, delayed []*Job
}

func (b *MemEngine) DashboardQueue(_ context.Context, a dashQueueArgs) (dashQueue, error) {
	s := b.shardOf(a.queue)
	s.mu.Lock()
	defer s.mu.Unlock()
	d := dashQueue{at: b.now()}
	s.promote(d.at)
	q := s.queues[a.queue]
	if q != nil {
		c := JobCounts{Waiting: q.ready.Len() - q.nPrio, Prioritized: q.nPrio, Delayed: q.nDelayed,
			Active: q.nActive, Completed: q.nDone + q.nCold, Failed: len(q.dlq)}
		if d.paused = q.paused; d.paused {
			c.Paused = c.Waiting + c.Prioritized
			c.Waiting, c.Prioritized = 0, 0
		}
		d.counts = c
		d.dlq = q.dlq[:min(len(q.dlq), dashDLQPreview)]
	}
	d.prioKeys, d.perPrio = s.countsPerPriority(a.queue)
	if a.withJobs && q != nil {
		s.dashJobs(q, a.limit, &d)
	}
	return d, nil
}

// dashJobs lists the first k of q's ready, active and delayed jobs into
// d; s.mu is held.
func (s *Shard) dashJobs(q *Queue, k int, d *dashQueue) {
	d.ready = firstK(k, func(yield func(*Job)) {
		q.ready.Each(func(h *hent) bool { yield(h.job); return true })
	}, func(a, b *Job) bool {
		ap, at, as := readyKeys(a)
		bp, bt, bs := readyKeys(b)
		return ap > bp || ap == bp && (at < bt || at == bt && as < bs)
	})
	d.active = firstK(k, func(yield func(*Job)) {
		s.leases.Each(func(h *hent) bool {
			if h.job.Queue == q.name && h.job.state == StateActive {
				yield(h.job)
			}
			return true
		})
	}, byStart)
	d.delayed = firstK(k, func(yield func(*Job)) {
		s.delayed.Each(func(h *hent) bool {
			if h.job.Queue == q.name {
				yield(h.job)
			}
			return true
		})
	}, func(a, b *Job) bool { return a.RunAt < b.RunAt || a.RunAt == b.RunAt && a.seq < b.seq })
}

// byStart orders active jobs by when they started.
func byStart(a, b *Job) bool {
	return a.StartedAt() < b.StartedAt() || a.StartedAt() == b.StartedAt() && a.seq < b.seq
}

// firstK returns the k first jobs in less order among those each yields,
// in O(n log k) with k small, so that a dashboard looking at a queue of a
// million jobs holds the shard lock for one pass, not a sort.
func firstK(k int, each func(yield func(*Job)), less func(a, b *Job) bool) []*Job {
	if k <= 0 {
		return nil
	}
	best := make([]*Job, 0, k)
	each(func(j *Job) {
		if len(best) == k && !less(j, best[k-1]) {
			return
		}
		i, _ := slices.BinarySearchFunc(best, j, func(x, y *Job) int {
			if less(x, y) {
				return -1
			}
			return 1
		})
		if len(best) == k {
			best = best[:k-1]
		}
		best = slices.Insert(best, i, j)
	})
	return best
}

// ---------------------------------------------------------------------------
// This broker's, in both modes: the connections' held jobs, and
// CompactMemory's compaction of the broker's own structures.

// heldJobs counts this server's connections that hold jobs, and the jobs.
func (srv *Server) heldJobs() (clients, jobs int) {
	var conns []*conn
	locked(&srv.mu, func() {
		conns = make([]*conn, 0, len(srv.conns))
		for cn := range srv.conns {
			conns = append(conns, cn)
		}
	})
	for _, cn := range conns {
		locked(&cn.hmu, func() {
			if n := len(cn.held); n > 0 {
				clients++
				jobs += n
			}
		})
	}
	return clients, jobs
}

// CompactMemory drops the stale entries the heaps and the completed list
// keep for lazy deletion, and trims slices grown past their contents.
func (b *MemEngine) CompactMemory(context.Context) error {
	b.compact()
	return nil
}

func (b *MemEngine) compact() {
	for _, s := range b.shards {
		s.with(func() {
			s.delayed.Rebuild()
			s.leases.Rebuild()
			for _, q := range s.queues {
				q.ready.Rebuild()
				if cap(q.dlq) > 2*len(q.dlq)+16 {
					q.dlq = slices.Clip(append([]*Job(nil), q.dlq...))
				}
				if q.unique != nil && len(q.unique) == 0 {
					q.unique = nil
				}
			}
			s.compactDoneNow()
		})
	}
}
