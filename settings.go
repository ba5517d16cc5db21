package main

// The reference's settings. Every environment variable the bunqueue 2.9.5
// server reads is either honoured (most through a flag's environment list,
// named between brackets in queued help serve; the monitor's thresholds
// directly, live_figures.go) or listed here with why queued does not,
// and warned of at start when it is set, so that an env file brought over
// from bunqueue says what it does. TestReferenceSettingsAccounted keeps
// this list and docs/compatibility.md whole against the reference's dist.
// Also here: the periodic statistics line (STATS_INTERVAL_MS).

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"sort"
	"time"
)

// ignoredSettings are the reference's server variables queued does not
// honour, with the reason.
var ignoredSettings = map[string]string{
	"LOCK_TIMEOUT_MS":                              "the reference's in-process lock wait; queued's shards take no such locks across requests",
	"RATE_LIMIT_CLEANUP_MS":                        "the request limiter keeps no request times to clean up: a count of 24 bytes a client, in tables of at most 100,000 clients that forget the least recently seen",
	"WORKER_CLEANUP_INTERVAL_MS":                   "queued looks for stale workers at most once a second, whenever the registry is read",
	"BUNQUEUE_POSTGRES_LEASE_DURATION_MS":          "a claim's lease is the pull's lockTtl (30 s by default), as in the other modes",
	"BUNQUEUE_POSTGRES_POLL_INTERVAL_MS":           "brokers wake on LISTEN/NOTIFY and look for expired leases every 250 ms; nothing polls on an interval",
	"BUNQUEUE_POSTGRES_MAX_CONCURRENT_OPERATIONS":  "the reference's limit on its own queries in flight; queued's are bounded by the pool (--postgres-pool-size)",
	"BUNQUEUE_POSTGRES_MAX_QUEUED_OPERATIONS":      "the reference's limit on queries waiting for a slot; queued's wait on the pool, within each request's deadline",
	"BUNQUEUE_POSTGRES_MAX_SNAPSHOT_JOBS":          "the reference loads the namespace into memory; queued reads the database per request",
	"BUNQUEUE_POSTGRES_MAX_SNAPSHOT_PAYLOAD_BYTES": "the reference loads the namespace into memory; queued reads the database per request",
	"BUNQUEUE_CLOUD_URL":                           "bunqueue Cloud, the reference's hosted dashboard service: queued does not report to it",
	"BUNQUEUE_CLOUD_API_KEY":                       "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_BUFFER_SIZE":                   "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_CIRCUIT_BREAKER_RESET_MS":      "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_CIRCUIT_BREAKER_THRESHOLD":     "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_EVENTS":                        "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_INCLUDE_JOB_DATA":              "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_INSTANCE_ID":                   "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_INSTANCE_NAME":                 "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_INTERVAL_MS":                   "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_REDACT_FIELDS":                 "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_REMOTE_COMMANDS":               "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_SIGNING_SECRET":                "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_USE_HTTP":                      "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
	"BUNQUEUE_CLOUD_USE_WEBSOCKET":                 "bunqueue Cloud (see BUNQUEUE_CLOUD_URL)",
}

// warnIgnoredSettings logs each of the reference's variables that is set
// and that queued does not honour, with why; the values are not logged
// (some are secrets).
func warnIgnoredSettings(log *slog.Logger) {
	names := make([]string, 0, len(ignoredSettings))
	for name := range ignoredSettings {
		if _, set := os.LookupEnv(name); set {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		log.Warn("a bunqueue setting queued does not honour is set; it has no effect", "name", name, "why", ignoredSettings[name])
	}
}

// statsLoop writes a statistics line every interval, as the reference
// does every STATS_INTERVAL_MS, until stop is closed.
func (s *serverRun) statsLoop(every time.Duration, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		tot, err := s.srv.eng.Totals(ctx)
		cancel()
		if err != nil {
			s.log.Warn("queue statistics", "err", err)
			continue
		}
		live, all := s.b.workers.counts()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		s.log.Info("queue statistics", "waiting", tot.Waiting+tot.Prioritized+tot.Paused, "active", tot.Active,
			"delayed", tot.Delayed, "completed", tot.Completed, "dlq", tot.DLQ, "tcp", s.srv.nconns.Load(),
			"workers_active", live, "workers", all, "heap_mb", m.HeapAlloc>>20, "sys_mb", m.Sys>>20)
	}
}

// counts answers how many registered workers are live, and how many
// there are.
func (ws *Workers) counts() (live, all int) {
	list, _, _ := ws.list()
	now := ws.now()
	for i := range list {
		if ws.alive(list[i].LastSeen, now) {
			live++
		}
	}
	return live, len(list)
}
