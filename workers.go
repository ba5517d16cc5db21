package main

// The worker registry: RegisterWorker, Heartbeat, UnregisterWorker and
// ListWorkers. A worker belongs to the connection that registered it and
// goes away with it.

import (
	"slices"
	"sync"
)

const workerTimeoutMs = 30000

type worker struct {
	ID          string
	Name        string
	Queues      []string
	Concurrency int64
	Hostname    string
	PID         int64
	Registered  int64
	LastSeen    int64
	Active      int64
	Processed   int64
	Failed      int64
	conn        *conn
	order       int64
}

type Workers struct {
	mu    sync.Mutex
	m     map[string]*worker
	order int64
	// Running totals: the reference keeps counts of workers that have
	// since gone, so ListWorkers' stats do too.
	totalProcessed, totalFailed int64
}

func newWorkers() *Workers { return &Workers{m: make(map[string]*worker)} }

func (ws *Workers) register(w *worker) *worker {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if old := ws.m[w.ID]; old != nil {
		old.Queues = w.Queues
		old.Concurrency = w.Concurrency
		old.LastSeen = w.LastSeen
		if w.Hostname != "unknown" {
			old.Hostname = w.Hostname
		}
		if w.PID != 0 {
			old.PID = w.PID
		}
		cp := *old
		return &cp
	}
	ws.order++
	w.order = ws.order
	ws.m[w.ID] = w
	cp := *w
	return &cp
}

func (ws *Workers) unregister(id string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if _, ok := ws.m[id]; !ok {
		return false
	}
	delete(ws.m, id)
	return true
}

// heartbeat records a worker's figures; each given figure replaces the old.
func (ws *Workers) heartbeat(id string, now int64, active, processed, failed *int64) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.m[id]
	if w == nil {
		return false
	}
	w.LastSeen = now
	if active != nil {
		w.Active = *active
	}
	if processed != nil {
		ws.totalProcessed += *processed - w.Processed
		w.Processed = *processed
	}
	if failed != nil {
		ws.totalFailed += *failed - w.Failed
		w.Failed = *failed
	}
	return true
}

func (ws *Workers) dropConn(c *conn) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for id, w := range ws.m {
		if w.conn == c {
			delete(ws.m, id)
		}
	}
}

// list returns copies in registration order.
func (ws *Workers) list() ([]worker, int64, int64) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	out := make([]worker, 0, len(ws.m))
	for _, w := range ws.m {
		out = append(out, *w)
	}
	slices.SortFunc(out, func(a, b worker) int { return int(a.order - b.order) })
	return out, ws.totalProcessed, ws.totalFailed
}

func (ws *Workers) count() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.m)
}

func encodeWorker(e *Enc, w *worker, idKey string, now int64, withUptime bool) {
	n := 13
	if withUptime {
		n++
	}
	e.MapHead(n)
	e.Str(idKey)
	e.Str(w.ID)
	e.Str("name")
	e.Str(w.Name)
	e.Str("queues")
	strArray(e, w.Queues)
	e.Str("concurrency")
	e.Int(w.Concurrency)
	e.Str("hostname")
	e.Str(w.Hostname)
	e.Str("pid")
	e.Int(w.PID)
	e.Str("status")
	if now-w.LastSeen < workerTimeoutMs {
		e.Str("active")
	} else {
		e.Str("stale")
	}
	e.Str("registeredAt")
	e.Int(w.Registered)
	e.Str("lastSeen")
	e.Int(w.LastSeen)
	e.Str("activeJobs")
	e.Int(w.Active)
	e.Str("processedJobs")
	e.Int(w.Processed)
	e.Str("failedJobs")
	e.Int(w.Failed)
	e.Str("currentJob")
	e.Nil()
	if withUptime {
		e.Str("uptime")
		e.Int(now - w.Registered)
	}
}
