package main

// The Prometheus exposition: GET /prometheus serves it, and the Prometheus
// command answers it as {data:{metrics:text}}.
//
// queued is a drop-in replacement for the bunqueue server, so dashboards
// and alert rules written for that server must keep working: every family
// the reference exports is here with its name, type, labels and HELP text,
// in the reference's order and under its presence rules (the per-queue
// families only when a queue is labelled, the SQLite size only in SQLite
// mode, everything else always). queued's own figures carry the same
// bunqueue_ prefix and come after the reference group they belong to, so
// that the reference's families keep their relative order. The format is
// the reference's too: one empty line between families, no timestamps, a
// single final newline.

import (
	"context"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// defaultPromMaxQueues bounds the queues given labelled series unless
// --metrics-max-queues says otherwise: the reference's default, so that a
// client inventing queue names cannot blow up a scraper's cardinality.
const defaultPromMaxQueues = 100

// processStart stands for the process's start time, taken as the package
// initialises, as the reference takes its own when its module loads.
var processStart = time.Now()

// queueSnap is one queue's counts at a moment.
type queueSnap struct {
	name                                             string
	created                                          int64
	waiting, prioritized, delayed, active, dlq, done int
	paused                                           bool
}

// queueSnaps lists the listed queues in the order they were created.
func (b *MemEngine) queueSnaps() []queueSnap {
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

// cpuSeconds is the CPU time the process has used, user and system, as
// the reference's process.cpuUsage() sums them; 0 if it cannot be read.
func cpuSeconds() float64 {
	d, _ := cpuTime()
	return d.Seconds()
}

func b01(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// unixSeconds is t as Unix seconds with a fraction, 0 for the zero time
// (the reference's "or zero").
func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixMilli()) / 1000
}

// promJobsState is what the exposition reads from the engine: the jobs
// by state, each listed queue's counts, the cron schedules.
type promJobsState struct {
	totals Totals
	queues []queueSnap
	crons  int
}

// promState reads the jobs from the engine: in memory and SQLite mode the
// broker's own, in PostgreSQL mode the database's, so that every broker
// exports the namespace's figures as the reference does. A database that
// cannot be read gives zeros (bunqueue_storage_degraded says why) rather
// than a failed scrape, which would hide the other figures too.
func (srv *Server) promState(ctx context.Context) promJobsState {
	var st promJobsState
	var err error
	if st.totals, err = srv.eng.Totals(ctx); err != nil {
		srv.log.Debug("prometheus: job figures unavailable", "err", err)
	}
	if st.queues, err = srv.eng.DashboardQueues(ctx); err != nil {
		srv.log.Debug("prometheus: queue figures unavailable", "err", err)
	}
	if crons, err := srv.eng.ListCrons(ctx); err != nil {
		srv.log.Debug("prometheus: cron schedules unavailable", "err", err)
	} else {
		st.crons = len(crons)
	}
	return st
}

// prometheusText renders every metric in the reference's order: the core
// figures, the per-queue series, the operational ones, the backups, the
// latency histograms; each group followed by queued's own figures of it.
func (srv *Server) prometheusText(ctx context.Context) []byte {
	p := &promText{b: make([]byte, 0, 24<<10)}
	js := srv.promState(ctx)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	// Without /proc the resident size is 0, and its families stay (the
	// reference's are always there): a value a scraper can tell is missing.
	rss, _ := residentBytes()
	st := srv.b.storageState()

	srv.promCore(p, js, &ms, rss, st)
	srv.promCoreExtras(p, &ms, st)
	shown := js.queues[:min(len(js.queues), max(srv.promMaxQueues, 0))]
	srv.promQueues(p, shown)
	srv.promOperational(p, &ms, rss, len(shown), len(js.queues)-len(shown))
	promBackup(p, srv.bk.metrics())
	srv.promLatencies(p)
	return p.b
}

// promCore writes the reference's first block: jobs, counters, uptime,
// cron, workers, webhooks, storage, memory, and in SQLite mode the
// database file's size.
func (srv *Server) promCore(p *promText, js promJobsState, ms *runtime.MemStats, rss int64, st StorageState) {
	b := srv.b
	t := js.totals
	p.one("bunqueue_jobs_waiting", "gauge", "Number of jobs waiting in queue", float64(t.Waiting))
	p.one("bunqueue_jobs_prioritized", "gauge", "Number of prioritized jobs (priority > 0)", float64(t.Prioritized))
	p.one("bunqueue_jobs_delayed", "gauge", "Number of delayed jobs", float64(t.Delayed))
	p.one("bunqueue_jobs_active", "gauge", "Number of jobs being processed", float64(t.Active))
	p.one("bunqueue_jobs_dlq", "gauge", "Number of jobs in dead letter queue", float64(t.DLQ))
	p.one("bunqueue_jobs_completed", "gauge", "Number of completed jobs", float64(t.Completed))
	p.one("bunqueue_jobs_pushed_total", "counter", "Total jobs pushed", float64(b.stats.pushed.Load()))
	p.one("bunqueue_jobs_pulled_total", "counter", "Total jobs pulled", float64(b.stats.pulled.Load()))
	p.one("bunqueue_jobs_completed_total", "counter", "Total jobs completed", float64(b.stats.completed.Load()))
	p.one("bunqueue_jobs_failed_total", "counter", "Total jobs failed", float64(b.stats.failed.Load()))
	p.one("bunqueue_uptime_seconds", "gauge", "Server uptime in seconds", float64((b.now()-b.started)/1000))
	p.one("bunqueue_cron_jobs_registered", "gauge", "Number of registered cron jobs", float64(js.crons))

	// The workers' figures are what their clients report (RegisterWorker,
	// Heartbeat): the concurrency of the active ones (seen in the last
	// 30 s), the jobs each says it runs, and the processed and failed
	// counts, which keep those of workers since gone, as the reference's.
	workers, processed, failed := b.workers.list()
	now := b.now()
	var active, activeJobs, slots int64
	for i := range workers {
		w := &workers[i]
		activeJobs += w.Active
		if b.workers.alive(w.LastSeen, now) {
			active++
			slots += w.Concurrency
		}
	}
	p.one("bunqueue_workers_registered", "gauge", "Number of registered workers", float64(len(workers)))
	p.one("bunqueue_workers_active", "gauge", "Number of active workers", float64(active))
	p.one("bunqueue_worker_active_jobs", "gauge", "Number of jobs currently processed by workers", float64(activeJobs))
	p.one("bunqueue_worker_concurrency_slots", "gauge", "Configured worker concurrency capacity", float64(slots))
	p.one("bunqueue_workers_processed_total", "counter", "Total jobs processed by workers", float64(processed))
	p.one("bunqueue_workers_failed_total", "counter", "Total jobs failed by workers", float64(failed))

	var hooks, hooksOn int
	if srv.hooks != nil {
		hooks, hooksOn = srv.hooks.counts()
	}
	p.one("bunqueue_webhooks_registered", "gauge", "Number of registered webhooks", float64(hooks))
	p.one("bunqueue_webhooks_enabled", "gauge", "Number of enabled webhooks", float64(hooksOn))
	p.one("bunqueue_storage_degraded", "gauge", "Whether persistent storage is degraded", b01(st.Err != nil))
	p.one("bunqueue_storage_disk_full", "gauge", "Whether persistent storage reported a full disk", b01(isDiskFull(st.Err)))
	// Go's analogues of V8's heapUsed and heapTotal: the bytes of live and
	// not yet swept objects, and the heap's spans obtained from the system.
	p.one("bunqueue_process_heap_used_bytes", "gauge", "Process heap bytes currently used", float64(ms.HeapAlloc))
	p.one("bunqueue_process_heap_total_bytes", "gauge", "Total process heap bytes", float64(ms.HeapSys))
	p.one("bunqueue_process_resident_memory_bytes", "gauge", "Process resident memory size in bytes", float64(rss))
	if st.Driver == "sqlite" && st.Location != "" {
		var size int64
		if fi, err := os.Stat(st.Location); err == nil {
			size = fi.Size()
		}
		p.one("bunqueue_sqlite_database_size_bytes", "gauge", "SQLite database file size in bytes", float64(size))
	}
}

// promCoreExtras writes queued's own figures of the core block: retries,
// webhook deliveries, the storage's backlog, the write-ahead log's size,
// the Go runtime.
func (srv *Server) promCoreExtras(p *promText, ms *runtime.MemStats, st StorageState) {
	p.one("bunqueue_jobs_retried_total", "counter", "Failed attempts given another attempt", float64(srv.mx.totalRetried()))

	var hooksOpen, hooksPending int
	var delivered, failed, dropped int64
	if h := srv.hooks; h != nil {
		hooksOpen, hooksPending = h.lineStats()
		delivered, failed, dropped = h.delivered.Load(), h.failed.Load(), h.dropped.Load()
	}
	p.one("bunqueue_webhook_circuits_open", "gauge", "Webhooks whose receiver failed repeatedly: deliveries held, probed with backoff", float64(hooksOpen))
	p.one("bunqueue_webhook_deliveries_pending", "gauge", "Webhook deliveries waiting in the backlogs or in flight", float64(hooksPending))
	p.head("bunqueue_webhook_deliveries_total", "counter",
		"Webhook deliveries by result: delivered (2xx), failed (every attempt failed), dropped (the webhook's backlog full)")
	p.sample("bunqueue_webhook_deliveries_total", `result="delivered"`, float64(delivered))
	p.sample("bunqueue_webhook_deliveries_total", `result="failed"`, float64(failed))
	p.sample("bunqueue_webhook_deliveries_total", `result="dropped"`, float64(dropped))

	p.one("bunqueue_storage_pending_changes", "gauge", "Changes recorded but not yet written to storage", float64(st.Backlog))
	p.one("bunqueue_storage_dropped_changes_total", "counter",
		"Changes storage could never write (a row the database refuses), left out so that the rest is written", float64(st.Dropped))
	if st.Driver == "sqlite" && st.Location != "" {
		p.one("bunqueue_sqlite_purge_rows", "gauge",
			"Rows of removed jobs (a big Obliterate, Drain or Clean) still to be deleted in the background", float64(st.Purging))
		var wal int64
		if fi, err := os.Stat(st.Location + "-wal"); err == nil {
			wal = fi.Size()
		}
		p.one("bunqueue_sqlite_wal_size_bytes", "gauge", "Size of the SQLite write-ahead log", float64(wal))
	}
	p.one("bunqueue_go_memory_sys_bytes", "gauge", "Bytes of memory the Go runtime obtained from the system", float64(ms.Sys))
	p.one("bunqueue_goroutines", "gauge", "Goroutines that exist", float64(runtime.NumGoroutine()))
}

// promQueues writes the labelled series of the queues shown: none at all
// (no HELP, no TYPE) when there are none, as the reference.
func (srv *Server) promQueues(p *promText, shown []queueSnap) {
	if len(shown) == 0 {
		return
	}
	labels := make([]string, len(shown))
	for i, q := range shown {
		labels[i] = "queue=" + promLabel(q.name)
	}
	promQueueGauges(p, shown, labels)
	srv.promQueueCounters(p, shown, labels)
}

// promQueueGauges writes each queue's jobs by state; labels[i] is
// shown[i]'s label.
func promQueueGauges(p *promText, shown []queueSnap, labels []string) {
	gauges := []struct {
		name, help string
		v          func(q *queueSnap) int
	}{
		{"bunqueue_queue_jobs_waiting", "Number of waiting jobs per queue", func(q *queueSnap) int { return q.waiting }},
		{"bunqueue_queue_jobs_prioritized", "Number of prioritized jobs per queue", func(q *queueSnap) int { return q.prioritized }},
		{"bunqueue_queue_jobs_delayed", "Number of delayed jobs per queue", func(q *queueSnap) int { return q.delayed }},
		{"bunqueue_queue_jobs_active", "Number of active jobs per queue", func(q *queueSnap) int { return q.active }},
		{"bunqueue_queue_jobs_dlq", "Number of DLQ jobs per queue", func(q *queueSnap) int { return q.dlq }},
	}
	for _, g := range gauges {
		p.head(g.name, "gauge", g.help)
		for i := range shown {
			p.sample(g.name, labels[i], float64(g.v(&shown[i])))
		}
	}
}

// promQueueCounters writes queued's own per-queue job counters (this
// broker's, since it started); labels[i] is shown[i]'s label.
func (srv *Server) promQueueCounters(p *promText, shown []queueSnap, labels []string) {
	counts := make([]queueCounters, len(shown))
	for i, q := range shown {
		counts[i] = srv.mx.counters(q.name)
	}
	counters := []struct {
		name, help string
		v          func(c *queueCounters) int64
	}{
		{"bunqueue_queue_jobs_pushed_total", "Jobs pushed, per queue", func(c *queueCounters) int64 { return c.pushed }},
		{"bunqueue_queue_jobs_pulled_total", "Jobs handed to workers, per queue", func(c *queueCounters) int64 { return c.pulled }},
		{"bunqueue_queue_jobs_completed_total", "Jobs completed, per queue", func(c *queueCounters) int64 { return c.completed }},
		{"bunqueue_queue_jobs_failed_total", "Jobs that failed for good, per queue", func(c *queueCounters) int64 { return c.failed }},
		{"bunqueue_queue_jobs_retried_total", "Failed attempts given another attempt, per queue", func(c *queueCounters) int64 { return c.retried }},
	}
	for _, c := range counters {
		p.head(c.name, "counter", c.help)
		for i := range shown {
			p.sample(c.name, labels[i], float64(c.v(&counts[i])))
		}
	}
}

// promOperational writes the reference's operational block: the build,
// the standard process collectors (unprefixed, as Prometheus' client
// libraries name them), connections by transport, the cardinality
// limit's figures; then queued's own build.
func (srv *Server) promOperational(p *promText, ms *runtime.MemStats, rss int64, exported, omitted int) {
	// version is the bunqueue version queued answers for (as Hello and
	// /health report it): dashboards read it as the server's version.
	// queued runs under no Bun.
	p.head("bunqueue_build_info", "gauge", "Build and runtime identity")
	p.sample("bunqueue_build_info", "bun_version="+promLabel("unknown")+",version="+promLabel(compatVersion), 1)
	p.one("process_cpu_seconds_total", "counter", "Total process CPU time in seconds", cpuSeconds())
	p.one("process_start_time_seconds", "gauge", "Start time of the process since the Unix epoch in seconds", unixSeconds(processStart))
	p.one("process_resident_memory_bytes", "gauge", "Resident memory size in bytes", float64(rss))
	p.one("process_heap_bytes", "gauge", "Process heap size in bytes", float64(ms.HeapSys))

	var ws, sse int
	if srv.live != nil {
		ws, sse = srv.live.hub.Counts()
	}
	p.head("bunqueue_connections", "gauge", "Current server connections by bounded transport")
	p.sample("bunqueue_connections", `transport="tcp"`, float64(srv.nconns.Load()))
	p.sample("bunqueue_connections", `transport="websocket"`, float64(ws))
	p.sample("bunqueue_connections", `transport="sse"`, float64(sse))
	p.one("bunqueue_queue_metrics_exported", "gauge", "Queue names included in labelled Prometheus series", float64(exported))
	p.one("bunqueue_queue_metrics_omitted", "gauge", "Queue names omitted by the Prometheus cardinality limit", float64(omitted))

	p.head("bunqueue_queued_build_info", "gauge", "queued's own build: its version and the Go release it was built with; the value is always 1")
	p.sample("bunqueue_queued_build_info", "version="+promLabel(version)+",go_version="+promLabel(runtime.Version()), 1)
	srv.promBudgets(p)
}

// promBudgets writes queued's own figures of the answer budget and the
// memory budget (answer_budget.go, memlimit.go).
func (srv *Server) promBudgets(p *promText) {
	p.one("bunqueue_pulls_waiting", "gauge", "Long polls (PULL, PULLB with a timeout) waiting for a job", float64(srv.b.pullsWaiting.Load()))
	a := srv.answers
	p.one("bunqueue_answer_bytes", "gauge", "Bytes of answers built and not yet written to clients", float64(a.used.Load()))
	p.one("bunqueue_answer_budget_bytes", "gauge", "The server-wide budget of answer bytes (--max-answer-bytes)", float64(a.limit))
	p.one("bunqueue_answer_waiting", "gauge", "Answers waiting for room in the budget", float64(a.waiting.Load()))
	p.one("bunqueue_answers_refused_total", "counter", "Answers refused because the budget had no room in time", float64(a.refused.Load()))
	p.one("bunqueue_connections_unread_closed_total", "counter", "Connections closed because their unread answers passed --max-write-queue-bytes", float64(a.slow.Load()))
	p.one("bunqueue_answers_reclaimed_total", "counter", "Connections closed because a big answer of theirs made no progress while other answers waited for room", float64(a.reclaimed.Load()))
	m := srv.b.mem
	var limit, est, refused, refusing int64
	if m != nil && m.limit > 0 {
		limit, est, refused = m.limit, m.estimate(), m.refused.Load()
		if m.refusing.Load() {
			refusing = 1
		}
	}
	p.one("bunqueue_memory_budget_bytes", "gauge", "The memory budget for jobs (--max-memory); 0 when there is none", float64(limit))
	p.one("bunqueue_memory_live_bytes", "gauge", "The live heap as the memory budget counts it", float64(est))
	p.one("bunqueue_memory_pushes_refused", "gauge", "1 while pushes and the other commands that grow job memory are refused for the memory budget", float64(refusing))
	p.one("bunqueue_memory_pushes_refused_total", "counter", "Pushes and other commands that grow job memory refused for the memory budget", float64(refused))
}

// promBackup writes the reference's backup block, every family always,
// zeros without a backup service.
func promBackup(p *promText, m backupMetrics) {
	p.one("bunqueue_backup_enabled", "gauge", "Whether scheduled S3 backup is enabled", b01(m.enabled))
	p.one("bunqueue_backup_scheduler_running", "gauge", "Whether the scheduled S3 backup timer is running", b01(m.schedulerRunning))
	p.one("bunqueue_backup_in_progress", "gauge", "Whether an S3 backup is in progress", b01(m.inProgress))
	p.one("bunqueue_backup_interval_seconds", "gauge", "Configured S3 backup interval in seconds", m.interval.Seconds())
	p.one("bunqueue_backup_retention", "gauge", "Configured number of S3 backups to retain", float64(m.retention))
	p.one("bunqueue_backup_attempts_total", "counter", "S3 backup attempts started", float64(m.attempts))
	p.one("bunqueue_backup_successes_total", "counter", "Successful S3 backup attempts", float64(m.successes))
	p.one("bunqueue_backup_failures_total", "counter", "Failed S3 backup attempts", float64(m.failures))
	p.one("bunqueue_backup_overlap_rejections_total", "counter", "S3 backup requests rejected because another backup was active", float64(m.overlapRejections))
	p.one("bunqueue_backup_consecutive_failures", "gauge", "Consecutive failed S3 backup attempts", float64(m.consecutiveFailures))
	p.one("bunqueue_backup_last_success_timestamp_seconds", "gauge", "Unix timestamp of the last successful S3 backup, or zero", unixSeconds(m.lastSuccess))
	p.one("bunqueue_backup_last_failure_timestamp_seconds", "gauge", "Unix timestamp of the last failed S3 backup, or zero", unixSeconds(m.lastFailure))
	p.one("bunqueue_backup_last_duration_seconds", "gauge", "Duration of the last S3 backup attempt", m.lastDuration.Seconds())
	p.one("bunqueue_backup_last_size_bytes", "gauge", "Compressed size of the last successful S3 backup", float64(m.lastSizeBytes))
}

// promLatencies writes the reference's latency histograms, then queued's
// own. In PostgreSQL mode they count too (the reference's stay at zero
// there).
func (srv *Server) promLatencies(p *promText) {
	lat := &srv.b.lat
	p.histogram("bunqueue_push_duration_seconds", "Push operation latency in seconds", lat.push.Snapshot())
	p.histogram("bunqueue_pull_duration_seconds", "Pull operation latency in seconds", lat.pull.Snapshot())
	p.histogram("bunqueue_ack_duration_seconds", "Ack operation latency in seconds", lat.ack.Snapshot())
	p.histogram("bunqueue_pull_service_seconds", "Time the server spent answering a PULL or PULLB, long-poll wait excluded, empty pulls included", lat.pullService.Snapshot())
	p.histogram("bunqueue_job_wait_seconds", "Time from a job's push to its first pull", lat.wait.Snapshot())
	p.histogram("bunqueue_job_processing_seconds", "Time from a job's pull to its completion", lat.proc.Snapshot())
}
