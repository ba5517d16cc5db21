package main

// Handlers of this broker's figures: Metrics, TrimEvents, Prometheus.
// The counters are the broker's own (metrics.go, prometheus.go); what they
// read from storage goes through the engine.

// cmdMetrics answers the global figures, or with a queue or a type the
// per-minute series of one queue.

import (
	"errors"
	"runtime"
)

func cmdMetrics(r *Req) error {
	if r.m.Get("queue") != nil || r.m.Get("type") != nil {
		return queueMetricsAnswer(r)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	push, pull, ack := r.b.lat.push.Snapshot(), r.b.lat.pull.Snapshot(), r.b.lat.ack.Snapshot()
	e := r.field("metrics")
	e.MapHead(9)
	e.Str("totalPushed")
	e.Int(r.b.stats.pushed.Load())
	e.Str("totalPulled")
	e.Int(r.b.stats.pulled.Load())
	e.Str("totalCompleted")
	e.Int(r.b.stats.completed.Load())
	e.Str("totalFailed")
	e.Int(r.b.stats.failed.Load())
	e.Str("avgLatencyMs")
	e.Num(round2((push.MeanMs() + pull.MeanMs()) / 2))
	e.Str("avgProcessingMs")
	e.Num(round2(ack.MeanMs()))
	e.Str("memoryUsageMb")
	e.Num(float64(ms.HeapAlloc) / 1024 / 1024)
	e.Str("sqliteSizeMb")
	e.Int(0)
	e.Str("activeConnections")
	e.Int(r.c.srv.nconns.Load())
	return nil
}

func queueMetricsAnswer(r *Req) error {
	queue, err := r.m.Get("queue").Str()
	if err != nil {
		return errors.New("Metrics queue is required")
	}
	if err := validQueueName(queue, true); err != nil {
		return err
	}
	typ, _, _ := r.m.Str("type")
	if typ != "completed" && typ != "failed" {
		return errors.New("Metrics type must be 'completed' or 'failed'")
	}
	start, ok := safeUintArg(r.m, "start", 0, false)
	if !ok {
		return errors.New("start must be a non-negative safe integer")
	}
	end, ok := safeUintArg(r.m, "end", -1, true)
	if !ok {
		return errors.New("end must be a non-negative safe integer")
	}

	s := r.c.srv.mx.series(queue, typ == "failed")

	// The series runs newest first, from the newest bucket down to the
	// oldest kept; data is its [start, end] slice.
	n := int64(len(s.counts))
	hi := n
	if end != -1 {
		hi = min(n, end+1)
	}
	lo := min(start, n)
	if lo > hi {
		lo = hi
	}
	e := r.field("data")
	e.MapHead(3)
	e.Str("meta")
	e.MapHead(3)
	e.Str("count")
	e.Int(s.total)
	e.Str("prevTS")
	e.Int(s.prevTS)
	e.Str("prevCount")
	e.Int(s.prevCount)
	e.Str("data")
	e.ArrayHead(int(hi - lo))
	for i := lo; i < hi; i++ {
		e.Int(int64(s.counts[n-1-i]))
	}
	e.Str("count")
	e.Int(n)
	return nil
}

func cmdTrimEvents(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	maxLen, ok := safeUintArg(r.m, "maxLength", -1, false)
	if !ok || maxLen < 0 {
		return errors.New("maxLength must be a non-negative safe integer")
	}
	removed := r.c.srv.mx.trimEvents(queue, maxLen)
	e := r.field("data")
	e.MapHead(1)
	e.Str("removed")
	e.Int(removed)
	return nil
}

func cmdPrometheus(r *Req) error {
	e := r.field("data")
	e.MapHead(1)
	e.Str("metrics")
	e.Str(string(r.c.srv.prometheusText(r.ctx())))
	return nil
}
