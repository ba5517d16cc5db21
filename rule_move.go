package main

// Rules both engines follow for a job put in its queue (queuedState), and
// for a move by hand of one job (Cancel, Discard, Promote, MoveToWait,
// MoveToDelayed, ChangeDelay, ChangePriority, Update): what the command
// asked, what it does to the job in its current state, or why it is
// refused.

import "errors"

// The refusals of a move, in the reference's words.
var (
	errCannotCancel = errors.New("Job not found or cannot be cancelled")
	errNotDelayed   = errors.New("Job not found or not delayed")
	errChangeDelay  = errors.New("Job not found or cannot change delay")
	errNotInQueue   = errors.New("Job not found or not in queue")
	errCannotUpdate = errors.New("Job not found or cannot be updated")
)

// MoveKind names a move by hand of one job: one per command.
type MoveKind uint8

const (
	MoveCancel         MoveKind = iota // Cancel: a queued job goes
	MoveDiscard                        // Discard: to the DLQ
	MovePromote                        // Promote: a delayed job runs now
	MoveToWait                         // MoveToWait: back to waiting
	MoveToDelayed                      // MoveToDelayed: run after a delay
	MoveChangeDelay                    // ChangeDelay: the same, another refusal
	MoveChangePriority                 // ChangePriority
	MoveUpdate                         // Update: new data
)

// JobMove is a move by hand of one job, as its command asked for it.
type JobMove struct {
	Kind  MoveKind
	Token string       // the lease token, when the job is active
	Delay int64        // ms from now (MoveToDelayed, ChangeDelay)
	Prio  priorityArgs // ChangePriority
	Data  Raw          // Update: the job's new data
}

// notFound is the answer of a move to a job that does not exist; the
// reference gives the same to most jobs the move does not apply to.
func (m JobMove) notFound() error {
	switch m.Kind {
	case MoveCancel:
		return errCannotCancel
	case MovePromote:
		return errNotDelayed
	case MoveChangeDelay:
		return errChangeDelay
	case MoveChangePriority:
		return errNotInQueue
	case MoveUpdate:
		return errCannotUpdate
	}
	return errJobNotFound
}

// plan decides what the move does to j, whose state is current, or
// refuses it.
func (m JobMove) plan(j *Job, now int64) (moveStep, error) {
	st := j.state
	queued := st == StateWaiting || st == StatePrioritized || st == StateDelayed
	switch m.Kind {
	case MoveCancel:
		if isQueued(st) {
			return stepRemove, nil
		}
	case MoveDiscard:
		if queued || st == StateActive {
			return stepDLQ, nil
		}
	case MovePromote:
		if st == StateDelayed {
			return stepQueue, nil
		}
	case MoveToDelayed, MoveChangeDelay:
		if queued || st == StateActive {
			return stepQueue, nil
		}
		if m.Kind == MoveToDelayed {
			return stepKeep, notActive(j, now)
		}
	case MoveToWait:
		switch st {
		case StateActive, StateDelayed:
			return stepQueue, nil
		case StateFailed:
			return stepRetry, nil
		case StateWaiting, StatePrioritized:
			return stepKeep, nil
		}
		return stepKeep, errors.New("Cannot move job from state '" + st.String() + "' to waiting")
	case MoveChangePriority:
		// The new priority is one PUSH would take for this job: the
		// range depends on whether it has a group, which only the job
		// tells.
		if err := m.Prio.check(j); err != nil {
			return stepKeep, err
		}
		if queued {
			return stepQueue, nil
		}
	case MoveUpdate:
		if isQueued(st) || st == StateActive {
			return stepData, nil
		}
	}
	return stepKeep, m.notFound()
}

// place sets where a job the move queues again goes: its run time, or
// its priority.
func (m JobMove) place(j *Job, now int64) {
	switch m.Kind {
	case MoveToDelayed, MoveChangeDelay:
		j.RunAt = now + m.Delay
	case MoveChangePriority:
		m.Prio.apply(j)
	default: // Promote, MoveToWait
		j.RunAt = now
	}
}

// activeEvent is the event of a move taking an active job back to the
// queue; moves of queued jobs tell nothing, as in the reference.
func (m JobMove) activeEvent() (evType, evArgs) {
	if m.Kind == MoveToWait {
		return evWaiting, evArgs{prev: "active"}
	}
	return evDelayed, evArgs{delay: m.Delay, hasDelay: true}
}

// moveStep is what a move does to a job, in either engine.
type moveStep uint8

const (
	stepKeep   moveStep = iota // nothing: the job already is where the move puts it
	stepRemove                 // the job goes, with its logs
	stepDLQ                    // the job dead-letters, its attempt recorded
	stepQueue                  // the job queues again where JobMove.place says
	stepRetry                  // the job leaves the DLQ for waiting, as a fresh job
	stepData                   // the job's data is replaced, nothing else
)

// queuedState is the state a job put in its queue at now takes: delayed
// until its run time, then waiting (prioritized with a priority).
func (j *Job) queuedState(now int64) State {
	if j.RunAt > now {
		return StateDelayed
	}
	return j.readyState()
}

// Refusals of a read or a move of one job, in the reference's words.
var (
	errJobNotFound = errors.New("Job not found")
	errNoDLQ       = errors.New("Failed job not in DLQ")
)

// notActiveIn refuses a job that is not active but in state.
func notActiveIn(state string) error {
	return errors.New("Job is not active (current state: " + state + ")")
}
