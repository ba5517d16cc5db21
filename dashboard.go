package main

// DashboardOverview, DashboardQueues, DashboardQueue and CompactMemory,
// with the reference's shapes.

import (
	"math"
	"runtime"
	"runtime/debug"
	"slices"
)

func cmdDashboardOverview(r *Req) error {
	b, srv := r.b, r.c.srv
	t := b.totals()
	writeDashboardOverview(r, t, b.collections(srv, t), b.cron.List())
	return nil
}

// writeDashboardOverview answers DashboardOverview from the engine's
// totals, collection sizes and cron schedules; the rest is this broker's.
func writeDashboardOverview(r *Req, t Totals, coll collectionSizes, crons []CronSchedule) {
	b := r.b
	now := b.now()
	pushed, pulled, completed, failed := b.stats.pushed.Load(), b.stats.pulled.Load(), b.stats.completed.Load(), b.stats.failed.Load()
	rates := b.rates.current()

	e := r.field("data")
	e.MapHead(9)
	e.Str("stats")
	e.MapHead(10)
	for _, kv := range []struct {
		k string
		v int64
	}{{"waiting", int64(t.Waiting)}, {"active", int64(t.Active)}, {"delayed", int64(t.Delayed)},
		{"completed", int64(t.Completed)}, {"dlq", int64(t.DLQ)}, {"totalPushed", pushed}, {"totalPulled", pulled},
		{"totalCompleted", completed}, {"totalFailed", failed}, {"uptime", now - b.started}} {
		e.Str(kv.k)
		e.Int(kv.v)
	}

	e.Str("throughput")
	e.MapHead(4)
	for i, k := range []string{"pushPerSec", "pullPerSec", "completePerSec", "failPerSec"} {
		e.Str(k)
		e.Num(rates[i])
	}

	push, pull, ack := b.lat.push.Snapshot(), b.lat.pull.Snapshot(), b.lat.ack.Snapshot()
	e.Str("latency")
	e.MapHead(2)
	e.Str("averages")
	e.MapHead(3)
	e.Str("pushMs")
	e.Num(round2(push.MeanMs()))
	e.Str("pullMs")
	e.Num(round2(pull.MeanMs()))
	e.Str("ackMs")
	e.Num(round2(ack.MeanMs()))
	e.Str("percentiles")
	e.MapHead(3)
	for _, h := range []struct {
		k string
		s HistSnap
	}{{"push", push}, {"pull", pull}, {"ack", ack}} {
		e.Str(h.k)
		e.MapHead(3)
		e.Str("p50")
		e.Num(h.s.QuantileMs(0.50))
		e.Str("p95")
		e.Num(h.s.QuantileMs(0.95))
		e.Str("p99")
		e.Num(h.s.QuantileMs(0.99))
	}

	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, ok := residentBytes()
	if !ok {
		rss = int64(ms.Sys)
	}
	mb := func(n float64) float64 { return math.Round(n / 1024 / 1024) }
	e.Str("memory")
	e.MapHead(3)
	e.Str("heapUsed")
	e.Num(mb(float64(ms.HeapAlloc)))
	e.Str("heapTotal")
	e.Num(mb(float64(ms.HeapSys)))
	e.Str("rss")
	e.Num(mb(float64(rss)))

	e.Str("collections")
	encodeCollections(e, coll, t)

	workers, _, _ := b.workers.list()
	active := 0
	for i := range workers {
		if now-workers[i].LastSeen < workerTimeoutMs {
			active++
		}
	}
	e.Str("workers")
	e.MapHead(3)
	e.Str("total")
	e.Int(int64(len(workers)))
	e.Str("active")
	e.Int(int64(active))
	e.Str("list")
	e.ArrayHead(len(workers))
	for i := range workers {
		w := &workers[i]
		e.MapHead(7)
		e.Str("id")
		e.Str(w.ID)
		e.Str("name")
		e.Str(w.Name)
		e.Str("queues")
		strArray(e, w.Queues)
		e.Str("lastSeen")
		e.Int(w.LastSeen)
		e.Str("activeJobs")
		e.Int(w.Active)
		e.Str("processedJobs")
		e.Int(w.Processed)
		e.Str("failedJobs")
		e.Int(w.Failed)
	}

	e.Str("crons")
	e.ArrayHead(len(crons))
	for i := range crons {
		c := &crons[i]
		e.MapHead(6)
		e.Str("name")
		e.Str(c.Name)
		e.Str("queue")
		e.Str(c.Queue)
		e.Str("schedule")
		optStr(e, c.Schedule, c.Schedule != "")
		e.Str("repeatEvery")
		if c.RepeatEvery > 0 {
			e.Int(c.RepeatEvery)
		} else {
			e.Nil()
		}
		e.Str("nextRun")
		e.Float64(float64(c.NextRun))
		e.Str("executions")
		e.Int(c.Executions)
	}
	e.Str("storage")
	encodeStorageStatus(e, b.storageState())
	e.Str("timestamp")
	e.Int(now)
}

// encodeCollections writes the sizes of the broker's collections, under
// the names of the reference's getMemoryStats.
func encodeCollections(e *Enc, c collectionSizes, t Totals) {
	e.MapHead(15)
	for _, kv := range []struct {
		k string
		v int
	}{{"jobIndex", c.jobIndex}, {"completedJobs", t.Completed}, {"jobResults", c.results}, {"jobLogs", c.logs},
		// Custom ids live in the job index itself: there is no separate map.
		{"customIdMap", 0}, {"jobLocks", c.locks}, {"clientJobs", c.clients}, {"clientJobsTotal", c.clientJobs},
		// Dependencies are not implemented, and stalls are found by a
		// deadline timer rather than a candidate set.
		{"pendingDepChecks", 0}, {"stalledCandidates", 0},
		{"processingTotal", t.Active}, {"queuedTotal", t.Waiting + t.Prioritized + t.Delayed},
		{"waitingDepsTotal", 0}, {"temporalIndexTotal", t.Delayed}, {"delayedHeapTotal", t.Delayed}} {
		e.Str(kv.k)
		e.Int(int64(kv.v))
	}
}

// collectionSizes are the broker's internal collections, for the overview.
type collectionSizes struct {
	jobIndex, results, logs, locks, clients, clientJobs int
}

func (b *Broker) collections(srv *Server, t Totals) collectionSizes {
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
				if e.job.state == StateActive && e.job.lease != nil {
					c.locks++
				}
				return true
			})
		})
	}
	c.clients, c.clientJobs = srv.heldJobs()
	return c
}

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

func cmdDashboardQueues(r *Req) error {
	writeDashboardQueues(r, r.b.queueSnaps())
	return nil
}

func writeDashboardQueues(r *Req, qs []queueSnap) {
	e := r.field("data")
	e.MapHead(2)
	e.Str("queues")
	e.ArrayHead(len(qs))
	for i := range qs {
		q := &qs[i]
		e.MapHead(7)
		e.Str("name")
		e.Str(q.name)
		for _, kv := range []struct {
			k string
			v int
		}{{"waiting", q.waiting}, {"prioritized", q.prioritized}, {"delayed", q.delayed}, {"active", q.active}, {"dlq", q.dlq}} {
			e.Str(kv.k)
			e.Int(int64(kv.v))
		}
		e.Str("paused")
		e.Bool(q.paused)
	}
	e.Str("timestamp")
	e.Int(r.b.now())
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

func readDashboardQueue(r *Req) (dashQueueArgs, error) {
	var a dashQueueArgs
	var err error
	if a.queue, err = queueArg(r.m); err != nil {
		return a, err
	}
	a.withJobs = truthy(r.m, "includeJobs")
	limit := int64(dashJobsDefault)
	if v, ok, err := r.m.Int("jobsLimit"); err != nil {
		return a, err
	} else if ok {
		limit = v
	}
	a.limit = int(max(0, min(limit, dashJobsMax)))
	return a, nil
}

// dashQueue is what DashboardQueue shows of a queue. The job lists are
// there when asked for: ready jobs in claim order, active ones by start,
// delayed ones by run time.
type dashQueue struct {
	counts                 JobCounts
	paused                 bool
	prioKeys               []int64
	perPrio                map[int64]int
	dlq                    []*Job // the first dashDLQPreview
	ready, active, delayed []*Job
}

func cmdDashboardQueue(r *Req) error {
	a, err := readDashboardQueue(r)
	if err != nil {
		return err
	}
	queue := a.queue
	s := r.b.shardOf(queue)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := r.b.now()
	s.promote(now)
	q := s.queues[queue]
	var d dashQueue
	if q != nil {
		c := JobCounts{Waiting: q.ready.Len() - q.nPrio, Prioritized: q.nPrio, Delayed: q.nDelayed,
			Active: q.nActive, Completed: q.nDone, Failed: len(q.dlq)}
		if d.paused = q.paused; d.paused {
			c.Paused = c.Waiting + c.Prioritized
			c.Waiting, c.Prioritized = 0, 0
		}
		d.counts = c
		d.dlq = q.dlq[:min(len(q.dlq), dashDLQPreview)]
	}
	d.prioKeys, d.perPrio = s.countsPerPriority(queue)
	if a.withJobs && q != nil {
		k := a.limit
		d.ready = firstK(k, func(yield func(*Job)) {
			q.ready.Each(func(h *hent) bool { yield(h.job); return true })
		}, func(a, b *Job) bool {
			ap, at, as := readyKeys(a)
			bp, bt, bs := readyKeys(b)
			return ap > bp || ap == bp && (at < bt || at == bt && as < bs)
		})
		d.active = firstK(k, func(yield func(*Job)) {
			s.leases.Each(func(h *hent) bool {
				if h.job.Queue == queue && h.job.state == StateActive {
					yield(h.job)
				}
				return true
			})
		}, byStart)
		d.delayed = firstK(k, func(yield func(*Job)) {
			s.delayed.Each(func(h *hent) bool {
				if h.job.Queue == queue {
					yield(h.job)
				}
				return true
			})
		}, func(a, b *Job) bool { return a.RunAt < b.RunAt || a.RunAt == b.RunAt && a.seq < b.seq })
	}
	writeDashboardQueue(r, a, d, now)
	return nil
}

// byStart orders active jobs by when they started.
func byStart(a, b *Job) bool {
	return a.StartedAt < b.StartedAt || a.StartedAt == b.StartedAt && a.seq < b.seq
}

func writeDashboardQueue(r *Req, a dashQueueArgs, d dashQueue, now int64) {
	queue, c := a.queue, d.counts
	totals := r.c.srv.mx.counters(queue)
	n := 6
	if a.withJobs {
		n++
	}
	e := r.field("data")
	e.MapHead(n)
	e.Str("name")
	e.Str(queue)
	e.Str("counts")
	e.MapHead(10)
	for _, kv := range []struct {
		k string
		v int64
	}{{"waiting", int64(c.Waiting)}, {"prioritized", int64(c.Prioritized)}, {"delayed", int64(c.Delayed)},
		{"active", int64(c.Active)}, {"completed", int64(c.Completed)}, {"failed", int64(c.Failed)},
		{"waiting-children", int64(c.WaitingChildren)}, {"totalCompleted", totals.completed},
		{"totalFailed", totals.failed}, {"paused", int64(c.Paused)}} {
		e.Str(kv.k)
		e.Int(kv.v)
	}
	e.Str("paused")
	e.Bool(d.paused)
	e.Str("priorityCounts")
	encodePriorityCounts(e, d.prioKeys, d.perPrio)
	e.Str("dlqPreview")
	e.ArrayHead(len(d.dlq))
	for _, j := range d.dlq {
		e.MapHead(4)
		e.Str("id")
		e.Str(j.ID)
		e.Str("data")
		e.Raw(j.Data)
		e.Str("attempts")
		e.Int(int64(j.Attempts))
		e.Str("createdAt")
		e.Int(j.CreatedAt)
	}
	e.Str("timestamp")
	e.Int(now)
	if !a.withJobs {
		return
	}
	// A paused queue's ready jobs are listed as paused, not waiting.
	waitingList, pausedList := d.ready, []*Job(nil)
	if d.paused {
		waitingList, pausedList = nil, d.ready
	}
	e.Str("jobs")
	e.MapHead(4)
	for _, l := range []struct {
		k    string
		jobs []*Job
	}{{"waiting", waitingList}, {"active", d.active}, {"delayed", d.delayed}, {"paused", pausedList}} {
		e.Str(l.k)
		e.ArrayHead(len(l.jobs))
		for _, j := range l.jobs {
			e.MapHead(6)
			e.Str("id")
			e.Str(j.ID)
			e.Str("priority")
			e.Int(j.Priority)
			e.Str("createdAt")
			e.Int(j.CreatedAt)
			e.Str("runAt")
			e.Int(j.RunAt)
			e.Str("attempts")
			e.Int(int64(j.Attempts))
			e.Str("progress")
			if j.Progress == nil {
				e.Int(0)
			} else {
				e.Raw(j.Progress)
			}
		}
	}
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

// CompactMemory drops the stale entries the heaps and the completed list
// keep for lazy deletion, trims slices grown past their contents, and
// returns freed memory to the system.
func cmdCompactMemory(r *Req) error {
	r.b.compact()
	debug.FreeOSMemory()
	return r.okID()
}

func (b *Broker) compact() {
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
