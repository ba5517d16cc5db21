package main

// Rules both engines follow for groups: how many queued jobs a group with
// a maximum size takes.

import "errors"

// groupRoom is the check itself; queued tells a group's queued jobs.
func groupRoom(jobs []*Job, queued func(group string) int) error {
	var added map[string]int
	for _, j := range jobs {
		if j.cold().GroupID == "" || len(j.cold().DependsOn) > 0 {
			continue
		}
		have := added[j.cold().GroupID] + queued(j.cold().GroupID)
		if j.cold().groupMax > 0 && int64(have) >= j.cold().groupMax {
			return errGroupFull(j)
		}
		if added == nil {
			added = map[string]int{}
		}
		added[j.cold().GroupID]++
	}
	return nil
}

// errGroupFull refuses job j: its group holds its maximum size.
func errGroupFull(j *Job) error {
	return errors.New("Group " + j.cold().GroupID + " has reached its maximum size of " + itoa(j.cold().groupMax))
}
