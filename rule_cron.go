package main

// Rules both engines follow for a cron schedule once a due run has been
// handled.

import "errors"

// afterRun does a schedule's bookkeeping once its run due at s.NextRun
// was handled at now: a run that was not skipped counts as an execution,
// whether or not its job could be made or was let in (the reference
// counts it before pushing: a run it could not push is reported missed
// and stays counted); then the next run is set, or ended says why the
// schedule has run its course ("" while it goes on).
func (s *CronSchedule) afterRun(ran bool, now int64) (ended string) {
	if ran {
		s.Executions++
	}
	next, ok := s.following(s.NextRun, now)
	switch {
	case s.MaxLimit > 0 && s.Executions >= s.MaxLimit:
		return "maxLimit reached"
	case !ok:
		return "no run left"
	}
	s.NextRun = next
	return ""
}

var errCronNotFound = errors.New("Cron job not found")
