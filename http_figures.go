package main

// The HTTP routes that answer figures rather than run a command: /stats,
// /dashboard and its queue pages, POST /gc and /heapstats. The job
// figures are the engine's (DashboardEngine), so that every broker shows
// the database's in PostgreSQL mode; throughput, latency, memory and
// workers are this broker's.

import (
	"net/http"
	"runtime"
	"runtime/debug"
)

// engineOverview reads the job figures, collection sizes and schedules
// from the engine, as DashboardOverview does: in PostgreSQL mode they are
// the database's, which every broker shows alike; the in-memory broker of
// a PostgreSQL-mode server holds no jobs. The connections that hold jobs
// are this server's.
func (a *httpAPI) engineOverview(r *http.Request) (dashOverview, error) {
	o, err := a.srv.eng.DashboardOverview(r.Context())
	if err != nil {
		return o, err
	}
	o.sizes.clients, o.sizes.clientJobs = a.srv.heldJobs()
	return o, nil
}

// writeEngineError answers a route whose figures the engine could not
// read (the database is out of reach).
func writeEngineError(w http.ResponseWriter, err error) {
	writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false, "error": err.Error()})
}

// GET /stats: the engine's job figures (engineOverview), with this
// broker's counters, rates and memory.
func (a *httpAPI) serveStats(w http.ResponseWriter, r *http.Request, _ []string) {
	ov, err := a.engineOverview(r)
	if err != nil {
		writeEngineError(w, err)
		return
	}
	b := a.b
	now := b.now()
	t := ov.totals
	pushed, pulled, completed, failed := b.stats.pushed.Load(), b.stats.pulled.Load(), b.stats.completed.Load(), b.stats.failed.Load()
	rates := b.rates.current()
	crons := ov.crons
	pending := 0
	for i := range crons {
		if crons[i].MaxLimit == 0 || crons[i].Executions < crons[i].MaxLimit {
			pending++
		}
	}
	st := jsonObj{}
	st.open()
	for _, kv := range []struct {
		k string
		v int64
	}{{"waiting", int64(t.Waiting)}, {"prioritized", int64(t.Prioritized)}, {"delayed", int64(t.Delayed)},
		{"active", int64(t.Active)}, {"dlq", int64(t.DLQ)}, {"completed", int64(t.Completed)},
		{"waiting-children", int64(t.WaitingChildren)}, {"totalPushed", pushed}, {"totalPulled", pulled},
		{"totalCompleted", completed}, {"totalFailed", failed}, {"uptime", now - b.started},
		{"cronJobs", int64(len(crons))}, {"cronPending", int64(pending)}} {
		st.int(kv.k, kv.v)
	}
	for i, k := range []string{"pushPerSec", "pullPerSec", "completePerSec", "failPerSec"} {
		st.num(k, rates[i])
	}
	mem, _ := jsonMarshal(memoryMB(true))
	o := jsonObj{}
	o.open()
	o.boolean("ok", true)
	o.json("stats", st.close())
	o.json("memory", mem)
	o.json("collections", collectionsJSON(ov))
	writeJSONBytes(w, http.StatusOK, o.close())
}

// collectionsJSON is the overview's collections object.
func collectionsJSON(ov dashOverview) []byte {
	var e Enc
	encodeCollections(&e, ov.sizes, ov.totals)
	out, _ := appendJSON(nil, e.B)
	return out
}

// GET /dashboard: DashboardOverview's data, with at most 100 workers and
// 100 schedules listed, as the reference pages them over HTTP; and, for
// the dashboard page, the last ten minutes of rates (history) and the
// pull latency without the long-poll wait (pullService), since the
// reference's pull figures count the wait.
func (a *httpAPI) serveDashboard(w http.ResponseWriter, r *http.Request, _ []string) {
	ans := a.exec(r, newCmd("DashboardOverview").done())
	data, _, _ := ans.Map("data")
	// Read once: the answer may be rendered twice (writeJSONWith).
	history := a.b.rates.series().json()
	pull := latencyJSON(a.b.lat.pullService.Snapshot())
	writeJSONWith(w, http.StatusOK, func(o *jsonObj) {
		o.boolean("ok", true)
		for _, f := range data.Fields {
			switch k := string(f.Key); k {
			case "workers":
				wm, _ := ParseMap(f.Val, nil)
				list, _ := wm.Get("list").Array()
				o.object(k, func(wo *jsonObj) {
					wo.raw("total", wm.Get("total"))
					wo.raw("active", wm.Get("active"))
					wo.rawArray("list", list[:min(len(list), 100)])
					wo.boolean("truncated", len(list) > 100)
				})
			case "crons":
				// A schedule's data may be big: rendered in place, a
				// piece at a time.
				list, _ := f.Val.Array()
				o.object(k, func(co *jsonObj) {
					co.int("total", int64(len(list)))
					co.rawArray("list", list[:min(len(list), 100)])
					co.boolean("truncated", len(list) > 100)
				})
			default:
				o.raw(k, f.Val)
			}
		}
		o.json("history", history)
		o.json("pullService", pull)
	})
}

// latencyJSON is a histogram's mean and percentiles in milliseconds.
func latencyJSON(s HistSnap) []byte {
	o := jsonObj{}
	o.open()
	o.num("avgMs", round2(s.MeanMs()))
	o.num("p50", s.QuantileMs(0.50))
	o.num("p95", s.QuantileMs(0.95))
	o.num("p99", s.QuantileMs(0.99))
	return o.close()
}

// GET /dashboard/queues?limit=&offset=: a page of queues with their
// counts.
func (a *httpAPI) serveDashboardQueues(w http.ResponseWriter, r *http.Request, _ []string) {
	// As the reference parses them (jsParseInt): a limit that is not a
	// number, or 0, is the default.
	limit, _ := jsParseInt(r.URL.Query().Get("limit"))
	if limit == 0 {
		limit = 100
	}
	limit = min(max(limit, 1), 500)
	offset, _ := jsParseInt(r.URL.Query().Get("offset"))
	offset = max(offset, 0)
	// Through the command table, so that PostgreSQL mode's figures are the
	// database's.
	ans := a.exec(r, newCmd("DashboardQueues").done())
	if !answerOK(ans) {
		writeAnswer(w, ans, http.StatusInternalServerError)
		return
	}
	data, _, _ := ans.Map("data")
	qs, _, _ := data.Array("queues")
	lo, hi := pageBounds(len(qs), offset, limit, true)
	page := qs[lo:hi]
	list := []byte{'['}
	for i, raw := range page {
		if i > 0 {
			list = append(list, ',')
		}
		q, _ := ParseMap(raw, nil)
		n := func(k string) int64 { v, _, _ := q.Int(k); return v }
		name, _, _ := q.Str("name")
		paused, _, _ := q.Bool("paused")
		o := jsonObj{jsonOut: jsonOut{b: list}}
		o.open()
		o.str("name", name)
		// waiting is the jobs ready to run without a priority, as the
		// reference counts them; prioritized ones are not in it.
		o.int("waiting", n("waiting"))
		o.int("delayed", n("delayed"))
		o.int("active", n("active"))
		o.int("dlq", n("dlq"))
		o.boolean("paused", paused)
		list = o.close()
	}
	o := jsonObj{}
	o.open()
	o.boolean("ok", true)
	o.json("queues", append(list, ']'))
	o.int("total", int64(len(qs)))
	o.int("limit", limit)
	o.int("offset", offset)
	o.int("timestamp", a.b.now())
	writeJSONBytes(w, http.StatusOK, o.close())
}

// GET /dashboard/queues/:queue?includeJobs=true: DashboardQueue's data.
func (a *httpAPI) serveDashboardQueue(w http.ResponseWriter, r *http.Request, p []string) {
	if err := validQueueName(p[0], true); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"ok": false, "error": err.Error()})
		return
	}
	ans := a.exec(r, newCmd("DashboardQueue").str("queue", p[0]).
		boolean("includeJobs", r.URL.Query().Get("includeJobs") == "true").done())
	if !answerOK(ans) {
		writeAnswer(w, ans, http.StatusBadRequest)
		return
	}
	data, _, _ := ans.Map("data")
	writeJSONWith(w, http.StatusOK, func(o *jsonObj) {
		o.boolean("ok", true)
		o.fields(data)
	})
}

// POST /gc: a garbage collection and CompactMemory, with memory before and
// after.
func (a *httpAPI) serveGC(w http.ResponseWriter, r *http.Request, _ []string) {
	before := memoryMB(false)
	if err := a.srv.eng.CompactMemory(r.Context()); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ok": false, "error": err.Error()})
		return
	}
	a.b.announce(newNote("memory:compacted"))
	runtime.GC()
	debug.FreeOSMemory()
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "before": before, "after": memoryMB(false)})
}

// GET /heapstats: heap figures for chasing a leak. The reference lists
// JavaScript object types; Go's nearest is the runtime's allocation
// counts, and the object count. collections are /stats' (the engine's).
func (a *httpAPI) serveHeapStats(w http.ResponseWriter, r *http.Request, _ []string) {
	ov, err := a.engineOverview(r)
	if err != nil {
		writeEngineError(w, err)
		return
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	o := jsonObj{}
	o.open()
	o.boolean("ok", true)
	mem, _ := jsonMarshal(memoryMB(false))
	o.json("memory", mem)
	heap, _ := jsonMarshal(map[string]any{"objectCount": ms.HeapObjects, "goroutines": runtime.NumGoroutine(),
		"gcCycles": ms.NumGC, "mallocs": ms.Mallocs, "frees": ms.Frees})
	o.json("heap", heap)
	o.json("collections", collectionsJSON(ov))
	o.json("topObjectTypes", []byte("[]"))
	writeJSONBytes(w, http.StatusOK, o.close())
}
