package main

// Handlers of the worker registry and of StorageStatus. Stats is in
// cmd_dashboard.go.

func cmdRegisterWorker(r *Req) error {
	now := r.b.now()
	w := &worker{Concurrency: 1, Hostname: "unknown", Registered: now, LastSeen: now, conn: r.owner()}
	var err error
	if w.Name, _, err = r.m.Str("name"); err != nil {
		return err
	}
	if w.Queues, _, err = r.m.Strs("queues"); err != nil {
		return err
	}
	if w.Queues == nil {
		w.Queues = []string{}
	}
	if c, ok, err := r.m.Int("concurrency"); err != nil {
		return err
	} else if ok {
		w.Concurrency = c
	}
	id, ok, err := r.m.Str("workerId")
	if err != nil {
		return err
	}
	if !ok || id == "" {
		id = newID()
	}
	w.ID = id
	if h, ok, err := r.m.Str("hostname"); err != nil {
		return err
	} else if ok && h != "" {
		w.Hostname = h
	}
	if p, _, err := r.m.Int("pid"); err != nil {
		return err
	} else {
		w.PID = p
	}
	if t, ok, err := r.m.Int("startedAt"); err != nil {
		return err
	} else if ok && t > 0 {
		w.Registered = t
	}
	if err := checkWorker(w); err != nil {
		return err
	}
	got, err := r.b.workers.register(w)
	if err != nil {
		return err
	}
	r.b.announce(noticeWorker("worker:connected", got.ID).str("name", got.Name).strs("queues", got.Queues).
		str("hostname", got.Hostname).int("pid", got.PID))
	encodeWorker(r.field("data"), got, "workerId", now, r.b.workers.alive(got.LastSeen, now), false)
	return nil
}

func cmdUnregisterWorker(r *Req) error {
	id, _, err := r.m.Str("workerId")
	if err != nil {
		return err
	}
	if !r.b.workers.unregister(id) {
		return errWorkerNotFound
	}
	r.b.announce(noticeWorker("worker:disconnected", id))
	e := r.field("data")
	e.MapHead(1)
	e.Str("removed")
	e.Bool(true)
	return nil
}

var errWorkerNotFound = errorString("Worker not found")

type errorString string

func (e errorString) Error() string { return string(e) }

func cmdHeartbeat(r *Req) error {
	id, _, err := r.m.Key("id")
	if err != nil {
		return err
	}
	var vals [3]*int64
	for i, k := range []string{"activeJobs", "processed", "failed"} {
		v, ok, err := r.m.Int(k)
		if err != nil {
			return err
		}
		if ok {
			vals[i] = &v
		}
	}
	if !r.b.workers.heartbeat(id, r.b.now(), vals[0], vals[1], vals[2]) {
		return errWorkerNotFound
	}
	r.b.announce(noticeWorker("worker:heartbeat", id))
	e := r.field("data")
	e.MapHead(1)
	e.Str("ok")
	e.Bool(true)
	return nil
}

func cmdListWorkers(r *Req) error {
	now := r.b.now()
	list, processed, failed := r.b.workers.list()
	e := r.field("data")
	e.MapHead(2)
	e.Str("workers")
	e.ArrayHead(len(list))
	var active, activeJobs, slots int64
	for i := range list {
		w := &list[i]
		encodeWorker(e, w, "id", now, r.b.workers.alive(w.LastSeen, now), true)
		activeJobs += w.Active
		if r.b.workers.alive(w.LastSeen, now) {
			active++
			slots += w.Concurrency
		}
	}
	e.Str("stats")
	e.MapHead(6)
	e.Str("total")
	e.Int(int64(len(list)))
	e.Str("active")
	e.Int(active)
	e.Str("totalProcessed")
	e.Int(processed)
	e.Str("totalFailed")
	e.Int(failed)
	e.Str("activeJobs")
	e.Int(activeJobs)
	e.Str("concurrencySlots")
	e.Int(slots)
	return nil
}

// StorageStatus answers {diskFull, error, since} as the reference does.
func cmdStorageStatus(r *Req) error {
	encodeStorageStatus(r.field("data"), r.b.storageState())
	return nil
}

// encodeStorageStatus writes {diskFull, error, since}, shared with the
// dashboard overview.
func encodeStorageStatus(e *Enc, st StorageState) {
	e.MapHead(3)
	e.Str("diskFull")
	e.Bool(isDiskFull(st.Err))
	e.Str("error")
	if st.Err != nil {
		e.Str(st.Err.Error())
	} else {
		e.Nil()
	}
	e.Str("since")
	if st.Err != nil {
		e.Int(st.Since.UnixMilli())
	} else {
		e.Nil()
	}
}
