package main

// Handlers of Stats and the dashboard commands (DashboardOverview,
// DashboardQueues, DashboardQueue), with the reference's shapes, and of
// CompactMemory. The job figures are the engine's (DashboardEngine:
// dashboard.go, pg_dashboard.go); throughput, latency, memory, workers and
// connections are this broker's, in both modes.

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
)

func cmdStats(r *Req) error {
	t, err := r.eng.Totals(r.ctx())
	if err != nil {
		return err
	}
	b := r.b
	now := b.now()
	push, pull := statRates.sample(now, b.stats.pushed.Load(), b.stats.pulled.Load())
	e := r.field("stats")
	e.MapHead(9)
	for _, kv := range []struct {
		k string
		v int64
	}{{"waiting", int64(t.Waiting)}, {"active", int64(t.Active)}, {"delayed", int64(t.Delayed)},
		{"dlq", int64(t.DLQ)}, {"completed", int64(t.Completed)}, {"failed", b.stats.failed.Load()},
		{"uptime", now - b.started}} {
		e.Str(kv.k)
		e.Int(kv.v)
	}
	e.Str("pushPerSec")
	e.Num(push)
	e.Str("pullPerSec")
	e.Num(pull)
	return nil
}

func cmdDashboardOverview(r *Req) error {
	o, err := r.eng.DashboardOverview(r.ctx())
	if err != nil {
		return err
	}
	o.sizes.clients, o.sizes.clientJobs = r.c.srv.heldJobs()
	writeDashboardOverview(r, o)
	return nil
}

func cmdDashboardQueues(r *Req) error {
	qs, err := r.eng.DashboardQueues(r.ctx())
	if err != nil {
		return err
	}
	writeDashboardQueues(r, qs)
	return nil
}

func cmdDashboardQueue(r *Req) error {
	a, err := readDashboardQueue(r)
	if err != nil {
		return err
	}
	d, err := fetch(r, func(ctx context.Context) (dashQueue, error) {
		d, err := r.eng.DashboardQueue(ctx, a)
		d.dlq = fitPreview(d, r.c.answerLimit())
		return d, err
	}, dashQueueBytes)
	if err != nil {
		return err
	}
	writeDashboardQueue(r, a, d)
	return nil
}

// CompactMemory compacts the engine's structures and returns freed memory
// to the system.
func cmdCompactMemory(r *Req) error {
	if err := r.eng.CompactMemory(r.ctx()); err != nil {
		return err
	}
	r.b.announce(newNote("memory:compacted"))
	debug.FreeOSMemory()
	return r.okID()
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

// ---------------------------------------------------------------------------
// DashboardOverview's answer

// writeDashboardOverview answers DashboardOverview from the engine's
// figures; the rest is this broker's.
func writeDashboardOverview(r *Req, o dashOverview) {
	b := r.b
	now := b.now()
	e := r.field("data")
	e.MapHead(9)
	e.Str("stats")
	overviewStats(e, b, o.totals, now)
	e.Str("throughput")
	e.MapHead(4)
	rates := b.rates.current()
	for i, k := range []string{"pushPerSec", "pullPerSec", "completePerSec", "failPerSec"} {
		e.Str(k)
		e.Num(rates[i])
	}
	e.Str("latency")
	overviewLatency(e, b)
	e.Str("memory")
	overviewMemory(e)
	e.Str("collections")
	encodeCollections(e, o.sizes, o.totals)
	e.Str("workers")
	overviewWorkers(e, b, now)
	e.Str("crons")
	overviewCrons(e, o.crons)
	e.Str("storage")
	encodeStorageStatus(e, b.storageState())
	e.Str("timestamp")
	e.Int(now)
}

// overviewStats writes the job figures with this broker's counters.
func overviewStats(e *Enc, b *Broker, t Totals, now int64) {
	e.MapHead(10)
	for _, kv := range []struct {
		k string
		v int64
	}{{"waiting", int64(t.Waiting)}, {"active", int64(t.Active)}, {"delayed", int64(t.Delayed)},
		{"completed", int64(t.Completed)}, {"dlq", int64(t.DLQ)}, {"totalPushed", b.stats.pushed.Load()},
		{"totalPulled", b.stats.pulled.Load()}, {"totalCompleted", b.stats.completed.Load()},
		{"totalFailed", b.stats.failed.Load()}, {"uptime", now - b.started}} {
		e.Str(kv.k)
		e.Int(kv.v)
	}
}

// overviewLatency writes this broker's push, pull and ack latencies.
func overviewLatency(e *Enc, b *Broker) {
	push, pull, ack := b.lat.push.Snapshot(), b.lat.pull.Snapshot(), b.lat.ack.Snapshot()
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
}

// overviewMemory writes the process's memory in MiB.
func overviewMemory(e *Enc) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, ok := residentBytes()
	if !ok {
		rss = int64(ms.Sys)
	}
	mb := func(n float64) float64 { return math.Round(n / 1024 / 1024) }
	e.MapHead(3)
	e.Str("heapUsed")
	e.Num(mb(float64(ms.HeapAlloc)))
	e.Str("heapTotal")
	e.Num(mb(float64(ms.HeapSys)))
	e.Str("rss")
	e.Num(mb(float64(rss)))
}

// overviewWorkers writes this broker's registered workers.
func overviewWorkers(e *Enc, b *Broker, now int64) {
	workers, _, _ := b.workers.list()
	active := 0
	for i := range workers {
		if b.workers.alive(workers[i].LastSeen, now) {
			active++
		}
	}
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
}

// overviewCrons writes the cron schedules as the overview lists them.
func overviewCrons(e *Enc, crons []CronSchedule) {
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

// ---------------------------------------------------------------------------
// DashboardQueues' and DashboardQueue's answers

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

// writeDashboardQueue answers DashboardQueue: the engine's figures, with
// this broker's completed and failed totals for the queue.
func writeDashboardQueue(r *Req, a dashQueueArgs, d dashQueue) {
	queue, c := a.queue, d.counts
	totals := r.c.srv.mx.counters(queue)
	m := r.field("data").BeginMap()
	m.Key("name").Str(queue)
	e := m.Key("counts")
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
	m.Key("paused").Bool(d.paused)
	encodePriorityCounts(m.Key("priorityCounts"), d.prioKeys, d.perPrio)
	m.Key("dlqPreview").ArrayHead(len(d.dlq))
	for _, j := range d.dlq {
		e.MapHead(4)
		e.Str("id")
		e.Str(j.ID())
		e.Str("data")
		e.Raw(j.Data)
		e.Str("attempts")
		e.Int(int64(j.Attempts))
		e.Str("createdAt")
		e.Int(j.CreatedAt)
	}
	m.Key("timestamp").Int(d.at)
	if a.withJobs {
		dashJobLists(m.Key("jobs"), d)
	}
	m.End()
}

// dashJobLists writes DashboardQueue's job lists. A paused queue's ready
// jobs are listed as paused, not waiting.
func dashJobLists(e *Enc, d dashQueue) {
	waitingList, pausedList := d.ready, []*Job(nil)
	if d.paused {
		waitingList, pausedList = nil, d.ready
	}
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
			e.Str(j.ID())
			e.Str("priority")
			e.Int(j.Priority)
			e.Str("createdAt")
			e.Int(j.CreatedAt)
			e.Str("runAt")
			e.Int(j.RunAt)
			e.Str("attempts")
			e.Int(int64(j.Attempts))
			e.Str("progress")
			if j.cold().Progress == nil {
				e.Int(0)
			} else {
				e.Raw(j.cold().Progress)
			}
		}
	}
}
