package main

// Store is where the broker's state is kept beyond memory. The broker calls
// it on every state change, under the shard lock that guards the change, so
// implementations must only record what changed and return at once: the
// writing happens elsewhere (see the SQLite write buffer). In memory mode
// the broker has no store.
type Store interface {
	// JobChanged records a job's current state (admitted, claimed,
	// retried, completed, dead-lettered...).
	JobChanged(j *Job)
	// JobRemoved records that a job is gone for good.
	JobRemoved(j *Job)
	// QueueChanged records a queue's settings (paused, limits).
	QueueChanged(q *Queue)
	// QueueRemoved records that a queue was obliterated.
	QueueRemoved(name string)
	// Sync returns once everything recorded so far is durable.
	Sync() error
	Close() error
}

func (b *Broker) queueChanged(q *Queue) {
	if b.store != nil {
		b.store.QueueChanged(q)
	}
}

func (b *Broker) queueRemoved(name string) {
	if b.store != nil {
		b.store.QueueRemoved(name)
	}
}

// syncDurable makes pushes marked durable durable before they are answered.
func (b *Broker) syncDurable(jobs []*Job) error {
	if b.store == nil {
		return nil
	}
	for _, j := range jobs {
		if j.Durable {
			return b.store.Sync()
		}
	}
	return nil
}
