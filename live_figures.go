package main

// The live side's figures, read from storage through the engine, so that
// they are the database's in PostgreSQL mode: the reference's periodic
// snapshots (stats:snapshot every 5 s, health:status every 10 s,
// storage:status every 30 s), queue:counts for the queues events touched,
// and the monitor's notices every 10 s (queue:idle, queue:threshold,
// worker:overloaded, server:memory-warning, storage:size-warning). They
// run on a goroutine of their own: a slow database delays the figures,
// never the events.
//
// The monitor's thresholds are the reference's environment variables:
// QUEUE_IDLE_THRESHOLD_MS (30000; 0 or less: off), QUEUE_SIZE_THRESHOLD,
// WORKER_OVERLOAD_THRESHOLD_MS (30000), MEMORY_WARNING_MB and
// STORAGE_WARNING_MB (0: off). Every broker works its notices out for
// itself, so in PostgreSQL mode each tells its own subscribers.

import (
	"context"
	"os"
	"strconv"
	"time"
)

const (
	liveMonitorEvery = 10 * time.Second
	// liveFigureTimeout bounds a figure's storage reads; a tick that
	// cannot read is skipped, as the reference skips a snapshot that
	// throws.
	liveFigureTimeout = 5 * time.Second
)

func (l *live) figures() {
	stats := time.NewTicker(l.every.stats)
	health := time.NewTicker(l.every.health)
	storage := time.NewTicker(l.every.storage)
	monitor := time.NewTicker(l.every.monitor)
	defer stats.Stop()
	defer health.Stop()
	defer storage.Stop()
	defer monitor.Stop()
	var lastDrops uint64
	for {
		select {
		case <-l.ctx.Done():
			return
		case qs := <-l.countsReq:
			l.publishCounts(qs)
		case <-stats.C:
			if n := l.dropped.Load(); n != lastDrops {
				l.log.Warn("live events dropped: subscribers were sent fewer events than happened",
					"dropped", n-lastDrops, "dropped_total", n)
				lastDrops = n
			}
			if l.hub.Subscribers() > 0 {
				l.figure("stats:snapshot", l.statsSnapshot)
			}
		case <-health.C:
			if l.hub.Subscribers() > 0 {
				l.figure("health:status", func(context.Context) ([]byte, error) { return l.healthSnapshot(), nil })
			}
		case <-storage.C:
			if l.hub.Subscribers() > 0 {
				l.figure("storage:status", l.storageSnapshot)
			}
		case <-monitor.C:
			// Stale workers go whether anyone listens or not.
			l.b.workers.count()
			if l.hub.Subscribers() > 0 {
				l.monitorOnce()
			}
		}
	}
}

// figure publishes one snapshot, unless storage could not be read.
func (l *live) figure(name string, read func(context.Context) ([]byte, error)) {
	ctx, cancel := context.WithTimeout(l.ctx, liveFigureTimeout)
	defer cancel()
	data, err := read(ctx)
	if err != nil {
		l.log.Debug("live figure skipped", "event", name, "err", err)
		return
	}
	l.system(name, data)
}

// publishCounts sends queue:counts for each of queues that still exists.
func (l *live) publishCounts(queues map[string]struct{}) {
	ctx, cancel := context.WithTimeout(l.ctx, liveFigureTimeout)
	defer cancel()
	for q := range queues {
		c, err := l.srv.eng.Counts(ctx, q)
		if err != nil {
			l.log.Debug("queue:counts skipped", "queue", q, "err", err)
			return
		}
		if c == (JobCounts{}) {
			continue // gone, or never had a job
		}
		o := jsonObj{}
		o.open()
		o.str("queue", q)
		// A paused queue's ready jobs are still waiting, as the
		// reference counts them.
		o.int("waiting", int64(c.Waiting+c.Paused))
		o.int("prioritized", int64(c.Prioritized))
		o.int("active", int64(c.Active))
		o.int("completed", int64(c.Completed))
		o.int("failed", int64(c.Failed))
		o.int("delayed", int64(c.Delayed))
		l.system("queue:counts", o.close())
	}
}

func (l *live) statsSnapshot(ctx context.Context) ([]byte, error) {
	b := l.b
	ov, err := l.srv.eng.DashboardOverview(ctx)
	if err != nil {
		return nil, err
	}
	queues, err := l.srv.eng.DashboardQueues(ctx)
	if err != nil {
		return nil, err
	}
	now := b.now()
	t := ov.totals
	rates := b.rates.current()
	o := jsonObj{}
	o.open()
	o.int("waiting", int64(t.Waiting))
	o.int("active", int64(t.Active))
	o.int("delayed", int64(t.Delayed))
	o.int("completed", int64(t.Completed))
	o.int("dlq", int64(t.DLQ))
	o.int("totalPushed", b.stats.pushed.Load())
	o.int("totalCompleted", b.stats.completed.Load())
	o.int("totalFailed", b.stats.failed.Load())
	o.num("pushPerSec", rates[0])
	o.num("pullPerSec", rates[1])
	o.int("uptime", now-b.started)
	qs := jsonObj{}
	qs.open()
	for _, q := range queues {
		x := jsonObj{}
		x.open()
		x.int("waiting", int64(q.waiting))
		x.int("active", int64(q.active))
		x.int("delayed", int64(q.delayed))
		x.int("dlq", int64(q.dlq))
		x.boolean("paused", q.paused)
		qs.json(q.name, x.close())
	}
	o.json("queues", qs.close())
	workers, _, _ := b.workers.list()
	active := 0
	for i := range workers {
		if b.workers.alive(workers[i].LastSeen, now) {
			active++
		}
	}
	w := jsonObj{}
	w.open()
	w.int("total", int64(len(workers)))
	w.int("active", int64(active))
	o.json("workers", w.close())
	o.int("cronJobs", int64(len(ov.crons)))
	return o.close(), nil
}

// healthSnapshot counts both transports' connections in one event (the
// reference sends each transport its own count).
func (l *live) healthSnapshot() []byte {
	st := l.b.storageState()
	mem := memoryMB(false)
	ws, sse := l.hub.Counts()
	o := jsonObj{}
	o.open()
	o.boolean("ok", st.Err == nil)
	o.int("uptime", (l.b.now()-l.b.started)/1000)
	m := jsonObj{}
	m.open()
	m.int("rss", mem["rss"].(int64))
	m.int("heapUsed", mem["heapUsed"].(int64))
	o.json("memory", m.close())
	c := jsonObj{}
	c.open()
	c.int("ws", int64(ws))
	c.int("sse", int64(sse))
	o.json("connections", c.close())
	return o.close()
}

func (l *live) storageSnapshot(ctx context.Context) ([]byte, error) {
	ov, err := l.srv.eng.DashboardOverview(ctx)
	if err != nil {
		return nil, err
	}
	sizes := ov.sizes
	sizes.clients, sizes.clientJobs = l.srv.heldJobs()
	var e Enc
	encodeCollections(&e, sizes, ov.totals)
	coll, _ := appendJSON(nil, e.B)
	o := jsonObj{}
	o.open()
	o.json("collections", coll)
	o.boolean("diskFull", isDiskFull(l.b.storageState().Err))
	return o.close(), nil
}

// ---------------------------------------------------------------------------
// The monitor

// liveMonitor is what the monitor remembers between its rounds.
type liveMonitor struct {
	idleMs, overloadMs   int64
	sizeThreshold        int64
	memoryMB, storageMB  int64
	idleSince            map[string]int64 // queue -> when it was first seen idle
	overSize             map[string]bool  // queue -> announced over the size threshold
	overloadedSince      map[string]int64 // worker -> when it was first seen full
	memoryWarn, diskWarn bool             // announced, not yet back under 90%
}

func newLiveMonitor() liveMonitor {
	return liveMonitor{
		idleMs:        envInt64("QUEUE_IDLE_THRESHOLD_MS", 30000),
		overloadMs:    envInt64("WORKER_OVERLOAD_THRESHOLD_MS", 30000),
		sizeThreshold: envInt64("QUEUE_SIZE_THRESHOLD", 0),
		memoryMB:      envInt64("MEMORY_WARNING_MB", 0),
		storageMB:     envInt64("STORAGE_WARNING_MB", 0),
		idleSince:     map[string]int64{}, overSize: map[string]bool{}, overloadedSince: map[string]int64{},
	}
}

// envInt64 reads a whole number from the environment (def when unset or
// not a number).
func envInt64(key string, def int64) int64 {
	if v, err := strconv.ParseInt(os.Getenv(key), 10, 64); err == nil {
		return v
	}
	return def
}

// monitorOnce is one round of the monitor.
func (l *live) monitorOnce() {
	ctx, cancel := context.WithTimeout(l.ctx, liveFigureTimeout)
	defer cancel()
	now := l.b.now()
	m := &l.mon
	if queues, err := l.srv.eng.DashboardQueues(ctx); err == nil {
		seen := map[string]bool{}
		for _, q := range queues {
			seen[q.name] = true
			l.monitorQueue(m, q, now)
		}
		for q := range m.idleSince {
			if !seen[q] {
				delete(m.idleSince, q)
				delete(m.overSize, q)
			}
		}
	}
	l.monitorWorkers(m, now)
	l.monitorMemory(m)
	l.monitorStorage(m)
}

// monitorQueue: queue:idle once a queue has had nothing ready and nothing
// active for the idle threshold (again each threshold after); and
// queue:threshold once its ready jobs reach QUEUE_SIZE_THRESHOLD (again
// after they fell under it).
func (l *live) monitorQueue(m *liveMonitor, q queueSnap, now int64) {
	ready := int64(q.waiting + q.prioritized)
	if m.idleMs > 0 {
		if ready > 0 || q.active > 0 {
			delete(m.idleSince, q.name)
		} else if since, ok := m.idleSince[q.name]; !ok {
			m.idleSince[q.name] = now
		} else if now-since >= m.idleMs {
			l.local(noticeQueue("queue:idle", q.name).int("idleSeconds", (now-since)/1000))
			m.idleSince[q.name] = now
		}
	}
	if m.sizeThreshold > 0 {
		switch {
		case ready >= m.sizeThreshold && !m.overSize[q.name]:
			m.overSize[q.name] = true
			l.local(noticeQueue("queue:threshold", q.name).int("size", ready).int("threshold", m.sizeThreshold))
		case ready < m.sizeThreshold:
			delete(m.overSize, q.name)
		}
	}
}

// monitorWorkers: worker:overloaded once a worker has reported as many
// active jobs as its concurrency for the overload threshold (again each
// threshold after).
func (l *live) monitorWorkers(m *liveMonitor, now int64) {
	workers, _, _ := l.b.workers.list()
	seen := map[string]bool{}
	for _, w := range workers {
		seen[w.ID] = true
		if w.Concurrency <= 0 || w.Active < w.Concurrency {
			delete(m.overloadedSince, w.ID)
			continue
		}
		since, ok := m.overloadedSince[w.ID]
		if !ok {
			m.overloadedSince[w.ID] = now
			continue
		}
		if now-since >= m.overloadMs {
			l.local(noticeWorker("worker:overloaded", w.ID).str("name", w.Name).int("activeJobs", w.Active).
				int("concurrency", w.Concurrency).int("overloadedSeconds", (now-since)/1000))
			m.overloadedSince[w.ID] = now
		}
	}
	for id := range m.overloadedSince {
		if !seen[id] {
			delete(m.overloadedSince, id)
		}
	}
}

// monitorMemory: server:memory-warning once the heap in use reaches
// MEMORY_WARNING_MB (again after it fell under 90% of it).
func (l *live) monitorMemory(m *liveMonitor) {
	if m.memoryMB <= 0 {
		return
	}
	mem := memoryMB(false)
	heap, rss := mem["heapUsed"].(int64), mem["rss"].(int64)
	switch {
	case heap >= m.memoryMB && !m.memoryWarn:
		m.memoryWarn = true
		l.local(newNote("server:memory-warning").int("heapUsedMB", heap).int("thresholdMB", m.memoryMB).int("rssMB", rss))
	case heap*10 < m.memoryMB*9:
		m.memoryWarn = false
	}
}

// monitorStorage: storage:size-warning once the SQLite file reaches
// STORAGE_WARNING_MB (again after it fell under 90% of it).
func (l *live) monitorStorage(m *liveMonitor) {
	st := l.b.storageState()
	if m.storageMB <= 0 || st.Driver != "sqlite" || st.Location == "" {
		return
	}
	fi, err := os.Stat(st.Location)
	if err != nil {
		return
	}
	mb := fi.Size() >> 20
	switch {
	case mb >= m.storageMB && !m.diskWarn:
		m.diskWarn = true
		l.local(newNote("storage:size-warning").int("sizeMB", mb).int("thresholdMB", m.storageMB))
	case mb*10 < m.storageMB*9:
		m.diskWarn = false
	}
}

// local publishes a notice this broker worked out for itself.
func (l *live) local(n *note) {
	l.systemAt(n.name, l.b.now(), n.o.close())
}
