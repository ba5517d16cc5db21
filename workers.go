package main

// The worker registry: RegisterWorker, Heartbeat, UnregisterWorker and
// ListWorkers. A worker belongs to the connection that registered it and
// goes away with it. One registered without a connection (over HTTP, whose
// request ends at once) goes away once it has not been heard from for
// workerExpireMs, as the reference removes stale workers; and the registry
// holds at most maxWorkers.

import (
	"errors"
	"slices"
	"sync"
)

const (
	// workerTimeoutMs is --worker-timeout's default (WORKER_TIMEOUT_MS):
	// a worker not heard from for that long is stale, and after three
	// times that it is removed, as the reference waits.
	workerTimeoutMs = 30000
	maxWorkers      = 10000
	// maxWorkerQueues bounds the queues one worker names.
	maxWorkerQueues = 1000
)

var errTooManyWorkers = tooMany("registered workers are", maxWorkers)

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
	now   func() int64
	swept int64 // when expired workers were last looked for
	// Running totals: the reference keeps counts of workers that have
	// since gone, so ListWorkers' stats do too.
	totalProcessed, totalFailed int64
	// announce tells of a worker removed for staleness (Broker.announce;
	// it only queues, so it may run under mu).
	announce func(*note)
	// timeout: a worker not heard from for this long (ms) is stale.
	timeout int64
}

func newWorkers(now func() int64) *Workers {
	return &Workers{m: make(map[string]*worker), now: now, timeout: workerTimeoutMs}
}

// alive says whether a worker last seen at lastSeen is live at now.
func (ws *Workers) alive(lastSeen, now int64) bool { return now-lastSeen < ws.timeout }

// expire removes the workers without a connection not heard from for
// three times the timeout; at most once a second unless forced. ws.mu is
// held.
func (ws *Workers) expire(force bool) {
	now := ws.now()
	if !force && now-ws.swept < 1000 {
		return
	}
	ws.swept = now
	for id, w := range ws.m {
		if w.conn == nil && now-w.LastSeen > 3*ws.timeout {
			delete(ws.m, id)
			if ws.announce != nil {
				ws.announce(noticeWorker("worker:removed-stale", id).str("name", w.Name))
			}
		}
	}
}

// checkWorker applies the limits of a worker's fields.
func checkWorker(w *worker) error {
	for _, f := range []struct{ name, val string }{{"workerId", w.ID}, {"name", w.Name}, {"hostname", w.Hostname}} {
		if len(f.val) > maxKeyBytes {
			return tooBig("a worker's "+f.name+" is", maxKeyBytes)
		}
	}
	if len(w.Queues) > maxWorkerQueues {
		return tooMany("the queues of a worker are", maxWorkerQueues)
	}
	for _, q := range w.Queues {
		if len(q) > maxQueueName {
			return errors.New("a worker's queue names are limited to 256 bytes")
		}
	}
	return nil
}

// register adds w, or updates the worker of the same id; a new one is
// refused when the registry is full.
func (ws *Workers) register(w *worker) (*worker, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.expire(false)
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
		return &cp, nil
	}
	if len(ws.m) >= maxWorkers {
		if ws.expire(true); len(ws.m) >= maxWorkers {
			return nil, errTooManyWorkers
		}
	}
	ws.order++
	w.order = ws.order
	ws.m[w.ID] = w
	cp := *w
	return &cp, nil
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

// dropConn removes the workers c registered and returns them.
func (ws *Workers) dropConn(c *conn) []*worker {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var gone []*worker
	for id, w := range ws.m {
		if w.conn == c {
			delete(ws.m, id)
			gone = append(gone, w)
		}
	}
	return gone
}

// list returns copies in registration order.
func (ws *Workers) list() ([]worker, int64, int64) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.expire(false)
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
	ws.expire(false)
	return len(ws.m)
}

func encodeWorker(e *Enc, w *worker, idKey string, now int64, alive, withUptime bool) {
	m := e.BeginMap()
	m.Key(idKey).Str(w.ID)
	m.Key("name").Str(w.Name)
	strArray(m.Key("queues"), w.Queues)
	m.Key("concurrency").Int(w.Concurrency)
	m.Key("hostname").Str(w.Hostname)
	m.Key("pid").Int(w.PID)
	status := "stale"
	if alive {
		status = "active"
	}
	m.Key("status").Str(status)
	m.Key("registeredAt").Int(w.Registered)
	m.Key("lastSeen").Int(w.LastSeen)
	m.Key("activeJobs").Int(w.Active)
	m.Key("processedJobs").Int(w.Processed)
	m.Key("failedJobs").Int(w.Failed)
	m.Key("currentJob").Nil()
	if withUptime {
		m.Key("uptime").Int(now - w.Registered)
	}
	m.End()
}

// serves reports whether a registered worker takes jobs from queue.
func (ws *Workers) serves(queue string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, w := range ws.m {
		for _, q := range w.Queues {
			if q == queue {
				return true
			}
		}
	}
	return false
}
