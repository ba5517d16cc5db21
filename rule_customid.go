package main

// Which jobs GetJobByCustomId finds, in both engines.

// customIDFinds says whether GetJobByCustomId finds j, the job holding
// the custom id (nil: none). The reference's engines differ here and
// queued follows each: its memory engine (SQLite mode is that engine
// with a file) forgets a custom id when its job completes or fails for
// good; its PostgreSQL engine finds every job its table holds, finished
// ones too. keepsFinished is the engine's side of that difference.
func customIDFinds(j *Job, keepsFinished bool) bool {
	if j == nil || j.cold().CustomID == "" {
		return false
	}
	return keepsFinished || j.state != StateCompleted && j.state != StateFailed
}
