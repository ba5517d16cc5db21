package main

// The Prometheus exposition: the Prometheus command answers it as
// {data:{metrics:text}}, and GET /metrics (or /prometheus) serves the same
// text. Names carry the queued_ prefix and follow Prometheus' conventions:
// base units (seconds, bytes), counters end in _total, every metric has
// HELP and TYPE lines. Blocks are separated by an empty line, as the
// reference separates them.

import (
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// maxPromQueues bounds the queues given labelled series, as the
// reference bounds them, so that a client inventing queue names cannot
// blow up a scraper's cardinality.
const maxPromQueues = 100

// queueSnap is one queue's counts at a moment.
type queueSnap struct {
	name                                             string
	created                                          int64
	waiting, prioritized, delayed, active, dlq, done int
	paused                                           bool
}

// queueSnaps lists the listed queues in the order they were created.
func (b *Broker) queueSnaps() []queueSnap {
	var out []queueSnap
	now := b.now()
	for _, s := range b.shards {
		s.with(func() {
			s.promote(now)
			for _, q := range s.queues {
				if !q.listed {
					continue
				}
				out = append(out, queueSnap{name: q.name, created: q.created, waiting: q.ready.Len() - q.nPrio,
					prioritized: q.nPrio, delayed: q.nDelayed, active: q.nActive, dlq: len(q.dlq), done: q.nDone, paused: q.paused})
			}
		})
	}
	slices.SortFunc(out, func(a, b queueSnap) int { return cmpInt(a.created, b.created) })
	return out
}

// promText builds the exposition text.
type promText struct{ b []byte }

func (p *promText) head(name, typ, help string) {
	if len(p.b) > 0 {
		p.b = append(p.b, '\n')
	}
	p.b = append(p.b, "# HELP "...)
	p.b = append(p.b, name...)
	p.b = append(p.b, ' ')
	p.b = append(p.b, help...)
	p.b = append(p.b, "\n# TYPE "...)
	p.b = append(p.b, name...)
	p.b = append(p.b, ' ')
	p.b = append(p.b, typ...)
	p.b = append(p.b, '\n')
}

func (p *promText) sample(name, labels string, v float64) {
	p.b = append(p.b, name...)
	if labels != "" {
		p.b = append(p.b, '{')
		p.b = append(p.b, labels...)
		p.b = append(p.b, '}')
	}
	p.b = append(p.b, ' ')
	p.b = appendPromFloat(p.b, v)
	p.b = append(p.b, '\n')
}

func (p *promText) one(name, typ, help string, v float64) {
	p.head(name, typ, help)
	p.sample(name, "", v)
}

func (p *promText) histogram(name, help string, s HistSnap) {
	p.head(name, "histogram", help)
	for i, c := range s.Cumulative {
		le := "+Inf"
		if i < len(s.Bounds) {
			le = string(appendPromFloat(nil, s.Bounds[i]))
		}
		p.sample(name+"_bucket", `le="`+le+`"`, float64(c))
	}
	p.sample(name+"_sum", "", s.Sum)
	p.sample(name+"_count", "", float64(s.Count))
}

// appendPromFloat writes plain decimals (1796016490.758, not 1.79e+09),
// which read better and parse the same.
func appendPromFloat(b []byte, v float64) []byte {
	if math.Abs(v) < 1e21 {
		return strconv.AppendFloat(b, v, 'f', -1, 64)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// promLabel quotes a label value: backslash, newline and double quote are
// escaped.
func promLabel(v string) string {
	if !strings.ContainsAny(v, "\\\n\"") {
		return `"` + v + `"`
	}
	r := strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
	return `"` + r.Replace(v) + `"`
}

// residentBytes reads the resident set size from /proc; ok is false where
// there is no /proc.
func residentBytes() (int64, bool) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, false
	}
	return pages * int64(os.Getpagesize()), true
}

func b01(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// prometheusText renders every metric, in blocks: the jobs, the queues'
// labelled series, the clients, webhooks, storage, the process, and the
// latency histograms.
func (srv *Server) prometheusText() []byte {
	p := &promText{b: make([]byte, 0, 16<<10)}
	now := srv.b.now()
	srv.promJobs(p, srv.b.totals())
	srv.promQueues(p, srv.b.queueSnaps())
	srv.promClients(p, now)
	srv.promWebhooks(p)
	srv.promStorage(p)
	srv.promProcess(p, now)
	srv.promLatencies(p)
	return p.b
}

// promJobs writes the jobs of every queue by state, and the broker's job
// counters.
func (srv *Server) promJobs(p *promText, t Totals) {
	b := srv.b
	p.one("queued_jobs_waiting", "gauge", "Jobs waiting to be pulled, priority 0, in every queue", float64(t.Waiting))
	p.one("queued_jobs_prioritized", "gauge", "Jobs waiting to be pulled with a priority above 0", float64(t.Prioritized))
	p.one("queued_jobs_delayed", "gauge", "Jobs waiting for their run time", float64(t.Delayed))
	p.one("queued_jobs_active", "gauge", "Jobs being processed", float64(t.Active))
	p.one("queued_jobs_dlq", "gauge", "Jobs in the dead-letter queues", float64(t.DLQ))
	p.one("queued_jobs_completed", "gauge", "Completed jobs retained", float64(t.Completed))
	p.one("queued_jobs_pushed_total", "counter", "Jobs pushed", float64(b.stats.pushed.Load()))
	p.one("queued_jobs_pulled_total", "counter", "Jobs handed to workers", float64(b.stats.pulled.Load()))
	p.one("queued_jobs_completed_total", "counter", "Jobs completed", float64(b.stats.completed.Load()))
	p.one("queued_jobs_failed_total", "counter", "Jobs that failed for good (dead-lettered or removed)", float64(b.stats.failed.Load()))
	p.one("queued_jobs_retried_total", "counter", "Failed attempts given another attempt", float64(srv.mx.totalRetried()))
}

// promQueues writes the per-queue series of the first maxPromQueues
// queues, and how many queues were given them and how many left out.
func (srv *Server) promQueues(p *promText, qs []queueSnap) {
	shown := qs[:min(len(qs), maxPromQueues)]
	if len(shown) > 0 {
		labels := make([]string, len(shown))
		for i, q := range shown {
			labels[i] = "queue=" + promLabel(q.name)
		}
		promQueueGauges(p, shown, labels)
		srv.promQueueCounters(p, shown, labels)
	}
	p.one("queued_queue_metrics_exported", "gauge", "Queues given labelled series", float64(len(shown)))
	p.one("queued_queue_metrics_omitted", "gauge", "Queues left out of the labelled series by the cardinality limit", float64(len(qs)-len(shown)))
}

// promQueueGauges writes each queue's jobs by state; labels[i] is
// shown[i]'s label.
func promQueueGauges(p *promText, shown []queueSnap, labels []string) {
	gauges := []struct {
		name, help string
		v          func(q *queueSnap) int
	}{
		{"queued_queue_jobs_waiting", "Jobs waiting to be pulled, priority 0, per queue", func(q *queueSnap) int { return q.waiting }},
		{"queued_queue_jobs_prioritized", "Jobs waiting with a priority above 0, per queue", func(q *queueSnap) int { return q.prioritized }},
		{"queued_queue_jobs_delayed", "Jobs waiting for their run time, per queue", func(q *queueSnap) int { return q.delayed }},
		{"queued_queue_jobs_active", "Jobs being processed, per queue", func(q *queueSnap) int { return q.active }},
		{"queued_queue_jobs_dlq", "Jobs in the dead-letter queue, per queue", func(q *queueSnap) int { return q.dlq }},
	}
	for _, g := range gauges {
		p.head(g.name, "gauge", g.help)
		for i := range shown {
			p.sample(g.name, labels[i], float64(g.v(&shown[i])))
		}
	}
}

// promQueueCounters writes each queue's job counters; labels[i] is
// shown[i]'s label.
func (srv *Server) promQueueCounters(p *promText, shown []queueSnap, labels []string) {
	counts := make([]queueCounters, len(shown))
	for i, q := range shown {
		counts[i] = srv.mx.counters(q.name)
	}
	counters := []struct {
		name, help string
		v          func(c *queueCounters) int64
	}{
		{"queued_queue_jobs_pushed_total", "Jobs pushed, per queue", func(c *queueCounters) int64 { return c.pushed }},
		{"queued_queue_jobs_pulled_total", "Jobs handed to workers, per queue", func(c *queueCounters) int64 { return c.pulled }},
		{"queued_queue_jobs_completed_total", "Jobs completed, per queue", func(c *queueCounters) int64 { return c.completed }},
		{"queued_queue_jobs_failed_total", "Jobs that failed for good, per queue", func(c *queueCounters) int64 { return c.failed }},
		{"queued_queue_jobs_retried_total", "Failed attempts given another attempt, per queue", func(c *queueCounters) int64 { return c.retried }},
	}
	for _, c := range counters {
		p.head(c.name, "counter", c.help)
		for i := range shown {
			p.sample(c.name, labels[i], float64(c.v(&counts[i])))
		}
	}
}

// promClients writes the connections, cron schedules and workers.
func (srv *Server) promClients(p *promText, now int64) {
	b := srv.b
	p.one("queued_connections", "gauge", "Open client connections", float64(srv.nconns.Load()))
	workers, _, _ := b.workers.list()
	active := 0
	for i := range workers {
		if now-workers[i].LastSeen < workerTimeoutMs {
			active++
		}
	}
	p.one("queued_cron_jobs_registered", "gauge", "Registered cron schedules", float64(b.cron.Len()))
	p.one("queued_workers_registered", "gauge", "Registered workers", float64(len(workers)))
	p.one("queued_workers_active", "gauge", "Workers seen in the last 30 seconds", float64(active))
}

// promWebhooks writes the webhooks and their deliveries: all 0 when the
// server has no webhook sender.
func (srv *Server) promWebhooks(p *promText) {
	var hooks, hooksOn, hooksOpen, hooksPending int
	var delivered, failed, dropped int64
	if h := srv.hooks; h != nil {
		hooks, hooksOn = h.counts()
		hooksOpen, hooksPending = h.lineStats()
		delivered, failed, dropped = h.delivered.Load(), h.failed.Load(), h.dropped.Load()
	}
	p.one("queued_webhooks_registered", "gauge", "Registered webhooks", float64(hooks))
	p.one("queued_webhooks_enabled", "gauge", "Enabled webhooks", float64(hooksOn))
	p.one("queued_webhook_circuits_open", "gauge", "Webhooks whose receiver failed repeatedly: deliveries held, probed with backoff", float64(hooksOpen))
	p.one("queued_webhook_deliveries_pending", "gauge", "Webhook deliveries waiting in the backlogs or in flight", float64(hooksPending))
	p.head("queued_webhook_deliveries_total", "counter",
		"Webhook deliveries by result: delivered (2xx), failed (every attempt failed), dropped (the webhook's backlog full)")
	p.sample("queued_webhook_deliveries_total", `result="delivered"`, float64(delivered))
	p.sample("queued_webhook_deliveries_total", `result="failed"`, float64(failed))
	p.sample("queued_webhook_deliveries_total", `result="dropped"`, float64(dropped))
}

// promStorage writes the storage's health and backlog, and in SQLite mode
// the sizes of the database file and its write-ahead log.
func (srv *Server) promStorage(p *promText) {
	st := srv.b.storageState()
	p.one("queued_storage_degraded", "gauge", "Whether storage writes are failing (1) or not (0)", b01(st.Err != nil))
	p.one("queued_storage_disk_full", "gauge", "Whether storage reported a full disk (1) or not (0)", b01(isDiskFull(st.Err)))
	p.one("queued_storage_pending_changes", "gauge", "Changes recorded but not yet written to storage", float64(st.Backlog))
	p.one("queued_storage_dropped_changes_total", "counter",
		"Changes storage could never write (a row the database refuses), left out so that the rest is written", float64(st.Dropped))
	if st.Driver == "sqlite" && st.Location != "" {
		if fi, err := os.Stat(st.Location); err == nil {
			p.one("queued_sqlite_database_size_bytes", "gauge", "Size of the SQLite database file", float64(fi.Size()))
		}
		var wal int64
		if fi, err := os.Stat(st.Location + "-wal"); err == nil {
			wal = fi.Size()
		}
		p.one("queued_sqlite_wal_size_bytes", "gauge", "Size of the SQLite write-ahead log", float64(wal))
	}
}

// promProcess writes the process's memory, goroutines, uptime and build.
func (srv *Server) promProcess(p *promText, now int64) {
	b := srv.b
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if rss, ok := residentBytes(); ok {
		p.one("queued_process_resident_memory_bytes", "gauge", "Resident memory of the process", float64(rss))
	}
	p.one("queued_go_heap_alloc_bytes", "gauge", "Bytes of allocated Go heap objects", float64(ms.HeapAlloc))
	p.one("queued_go_memory_sys_bytes", "gauge", "Bytes of memory the Go runtime obtained from the system", float64(ms.Sys))
	p.one("queued_goroutines", "gauge", "Goroutines that exist", float64(runtime.NumGoroutine()))
	p.one("queued_uptime_seconds", "gauge", "Time since the server started", float64((now-b.started)/1000))
	p.one("queued_start_time_seconds", "gauge", "Unix time the server started", float64(b.started)/1000)
	p.head("queued_build_info", "gauge", "Build identity; the value is always 1")
	p.sample("queued_build_info", "version="+promLabel(version)+",compat_version="+promLabel(compatVersion)+
		",go_version="+promLabel(runtime.Version()), 1)
}

// promLatencies writes the latency histograms.
func (srv *Server) promLatencies(p *promText) {
	lat := &srv.b.lat
	p.histogram("queued_push_duration_seconds", "Time to admit a PUSH or PUSHB", lat.push.Snapshot())
	p.histogram("queued_pull_duration_seconds", "Time to answer a PULL or PULLB, long-poll wait included", lat.pull.Snapshot())
	p.histogram("queued_pull_service_seconds", "Time the server spent answering a PULL or PULLB, long-poll wait excluded", lat.pullService.Snapshot())
	p.histogram("queued_ack_duration_seconds", "Time to apply an ACK or ACKB", lat.ack.Snapshot())
	p.histogram("queued_job_wait_seconds", "Time from a job's push to its first pull", lat.wait.Snapshot())
	p.histogram("queued_job_processing_seconds", "Time from a job's pull to its completion", lat.proc.Snapshot())
}
