package main

// Handlers of queue control: pause, drain, obliterate, list. The work is
// the engine's (QueueEngine: queue.go, pg_queue.go).

func cmdPause(r *Req) error  { return pauseCmd(r, true) }
func cmdResume(r *Req) error { return pauseCmd(r, false) }

func pauseCmd(r *Req, paused bool) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	if err := r.eng.SetPaused(r.ctx(), name, paused); err != nil {
		return err
	}
	if paused {
		r.b.announce(noticeQueue("queue:paused", name))
	} else {
		r.b.announce(noticeQueue("queue:resumed", name))
	}
	return r.okID()
}

func cmdIsPaused(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	paused, err := r.eng.IsPaused(r.ctx(), name)
	if err != nil {
		return err
	}
	r.field("paused").Bool(paused)
	return nil
}

func cmdDrain(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	n, err := r.eng.Drain(r.ctx(), name)
	if err != nil {
		return err
	}
	r.b.announce(noticeQueueCount("queue:drained", name, n))
	r.field("count").Int(n)
	return nil
}

func cmdObliterate(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	if err := r.eng.Obliterate(r.ctx(), name); err != nil {
		return err
	}
	r.c.srv.mx.dropQueue(name)
	r.b.announce(noticeQueue("queue:obliterated", name))
	r.b.announce(noticeQueue("queue:removed", name))
	return r.okID()
}

func cmdListQueues(r *Req) error {
	names, err := r.eng.ListQueues(r.ctx())
	if err != nil {
		return err
	}
	strArray(r.field("queues"), names)
	return nil
}
