package main

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestCronMissedRunCounts: a due run whose job cannot be made (a schedule
// that came from storage with jobOptions PUSH refuses: Cron refuses them
// when it is added) is spent and counted as an execution, in both
// engines, as the reference counts it; no job is made.
func TestCronMissedRunCounts(t *testing.T) {
	t.Parallel()
	var e Enc
	e.MapHead(1)
	e.Str("timeout")
	e.Str("soon")
	bad := Raw(e.B)
	run := func(t *testing.T, eng Engine) {
		ctx := context.Background()
		s := CronSchedule{Name: "bad", Queue: "missed", JobName: "j", RepeatEvery: 50, JobOptions: bad}
		if _, err := eng.AddCron(ctx, s); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "two missed runs counted", func() (bool, string) {
			got, err := eng.GetCron(ctx, "bad")
			return err == nil && got.Executions >= 2, fmt.Sprint(got.Executions, " executions, ", err)
		})
		c, err := eng.Counts(ctx, "missed")
		if err != nil || c != (JobCounts{}) {
			t.Fatalf("jobs made by runs that could not make one: %+v %v", c, err)
		}
	}
	t.Run("memory", func(t *testing.T) {
		b := NewMemEngine(1, nil)
		defer b.Close()
		run(t, b)
	})
	t.Run("postgres", func(t *testing.T) {
		p := startPGInProcess(t, testPGURL(), pgTestNamespace(t), nil, pgOptions{})
		run(t, p.pg)
	})
}

// TestCronAfterRun: the bookkeeping after a due run, the same in both
// engines: a skipped run is not counted, a run is whether or not it made
// its job, and the schedule ends at its limit.
func TestCronAfterRun(t *testing.T) {
	t.Parallel()
	s := CronSchedule{Name: "n", Queue: "q", RepeatEvery: 1000, MaxLimit: 2, NextRun: 5000}
	if why := s.afterRun(false, 5000); why != "" || s.Executions != 0 || s.NextRun != 6000 {
		t.Fatalf("skipped: %q %d %d", why, s.Executions, s.NextRun)
	}
	if why := s.afterRun(true, 6000); why != "" || s.Executions != 1 || s.NextRun != 7000 {
		t.Fatalf("ran: %q %d %d", why, s.Executions, s.NextRun)
	}
	if why := s.afterRun(true, 7000); why != "maxLimit reached" || s.Executions != 2 {
		t.Fatalf("at its limit: %q %d", why, s.Executions)
	}
}
