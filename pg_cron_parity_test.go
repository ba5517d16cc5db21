package main

// Cron schedules and repeatable jobs through the protocol: PostgreSQL mode
// answers as memory mode, step by step (answersAsMemory,
// pg_control_test.go).

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// cronScript drives the cron commands and PUSH's repeat option through two
// connections (a and b): schedules refused (bad timing, expression, zone,
// limits, and jobOptions whose job cannot be made), made, read, listed,
// replaced and deleted, then run on the clock: at once, to their run
// limit, with and without preventOverlap, on a seconds pattern, skipped
// for want of a worker; and the bookkeeping the protocol shows after the
// runs (executions, next run, the jobs pushed). Runs fire on wall-clock
// time: a step waits on what the server shows, never for a set time, and
// the intervals are short. Every answer is recorded, normalised as
// moveScript's are; a time is recorded as what it means (a next run an
// interval after the last, on the second, at 06:30 in its zone).
func cronScript(t *testing.T, a, b *tclient) []string {
	t.Helper()
	cron := func(name, queue string, more M) M {
		m := M{"cmd": "Cron", "name": name, "queue": queue}
		for k, v := range more {
			m[k] = v
		}
		return m
	}
	// Views of an answer.
	var addedAt float64 // the next run a Cron answered, for what follows
	noted := func(ans map[string]any, _ time.Time) {
		if c, ok := ans["cron"].(map[string]any); ok {
			addedAt = toFloat(c["nextRun"])
		}
	}
	// The next run an interval after the one the last Cron answered.
	stepped := func(ans map[string]any, _ time.Time) {
		if c, ok := ans["cron"].(map[string]any); ok {
			c["nextRunAfterAdd"] = toFloat(c["nextRun"]) - addedAt
		}
	}
	// The next run about an hour after the request (the clocks of the
	// test and of the engine may differ by a little).
	inAnHour := func(ans map[string]any, sent time.Time) {
		if c, ok := ans["cron"].(map[string]any); ok {
			d := toFloat(c["nextRun"]) - float64(sent.UnixMilli())
			c["nextRunInAnHour"] = math.Abs(d-3600000) < 60000
		}
	}
	// The next run as a wall-clock time in the schedule's zone, without
	// the year.
	strOf := func(v any) string { x, _ := v.(string); return x }
	local := func(ans map[string]any, _ time.Time) {
		c, ok := ans["cron"].(map[string]any)
		if !ok {
			return
		}
		tz, _ := c["timezone"].(string)
		loc, err := time.LoadLocation(tz)
		if err != nil {
			c["nextRunLocal"] = err.Error()
			return
		}
		layout := "01-02 15:04:05"
		if strings.Contains(strOf(c["schedule"]), "* * 1") {
			layout = "Mon 15:04:05" // any Monday: the weekday and the time are the schedule's
		}
		c["nextRunLocal"] = time.UnixMilli(int64(toFloat(c["nextRun"]))).In(loc).Format(layout)
	}
	onSecond := func(ans map[string]any, _ time.Time) {
		if c, ok := ans["cron"].(map[string]any); ok {
			c["nextRunOnTheSecond"] = math.Mod(toFloat(c["nextRun"]), 1000) == 0
		}
	}
	// The ids of the jobs a schedule or a repeat makes are new ones.
	anon := func(ans map[string]any, _ time.Time) {
		if j, ok := ans["job"].(map[string]any); ok {
			j["id"] = "~"
		}
		if _, ok := ans["id"].(string); ok {
			ans["id"] = "~"
		}
	}
	// The queues in name order: the runs above made theirs in the order
	// the clock fired them.
	sorted := func(ans map[string]any, _ time.Time) {
		if qs, ok := ans["queues"].([]any); ok {
			slices.SortFunc(qs, func(x, y any) int { return strings.Compare(strOf(x), strOf(y)) })
		}
	}
	gone := &stepHow{until: func(ans map[string]any) bool { return ans["ok"] == false }}
	ran := func(n float64) *stepHow {
		return &stepHow{until: func(ans map[string]any) bool {
			c, ok := ans["cron"].(map[string]any)
			return ok && toFloat(c["executions"]) >= n
		}}
	}
	// A schedule that skipped its run at once: its next run has moved on.
	movedOn := &stepHow{until: func(ans map[string]any) bool {
		c, ok := ans["cron"].(map[string]any)
		return ok && toFloat(c["nextRun"]) > addedAt
	}, view: stepped}
	counted := func(state string, n float64) *stepHow {
		return &stepHow{until: func(ans map[string]any) bool {
			c, ok := ans["counts"].(map[string]any)
			return ok && toFloat(c[state]) >= n
		}}
	}
	// A long poll for a repeatable job's next run.
	pulled := func(queue string) M { return M{"cmd": "PULL", "queue": queue, "timeout": 10000} }

	steps := []scriptStep{
		{a, M{"cmd": "CronList"}, nil},
		// Refused, each naming its fault; nothing is made.
		{a, cron("", "cq", M{"repeatEvery": 1000}), nil},
		{b, cron("c", "cq", M{}), nil},
		{a, cron("c", "cq", M{"repeatEvery": 0}), nil},
		{b, cron("c", "cq", M{"repeatEvery": 1.5}), nil},
		{a, cron("c", "cq", M{"repeatEvery": "often"}), nil},
		{b, cron("c", "cq", M{"repeatEvery": int64(maxDelayMs + 1)}), nil},
		{a, cron("c", "cq", M{"schedule": "every day at noon"}), nil},
		{b, cron("c", "cq", M{"schedule": "0 0 30 2 *"}), nil},
		{a, cron("c", "cq", M{"schedule": "* * * * *", "timezone": "Mars/Olympus_Mons"}), nil},
		{b, cron("c", "cq", M{"repeatEvery": 1000, "priority": int64(maxPriority + 1)}), nil},
		{a, cron("c", "cq", M{"repeatEvery": 1000, "jobOptions": 7}), nil},
		// jobOptions whose job cannot be made: refused at once, as PUSH
		// would refuse the job at every run.
		{b, cron("c", "cq", M{"repeatEvery": 1000, "jobOptions": M{"delay": 1e300}}), nil},
		{a, cron("c", "cq", M{"repeatEvery": 1000, "jobOptions": M{"attempts": 0}}), nil},
		{b, cron("c", "cq", M{"repeatEvery": 1000, "jobOptions": M{"backoff": M{"type": "linear", "delay": 5}}}), nil},
		{a, cron(strings.Repeat("n", maxCronName+1), "cq", M{"repeatEvery": 1000}), nil},
		{b, cron("c", "cq", M{"repeatEvery": 1000, "data": strings.Repeat("d", maxCronDataBytes)}), nil},
		{a, M{"cmd": "Cron", "name": "c", "repeatEvery": 1000}, nil},
		{b, M{"cmd": "CronGet", "name": "c"}, nil},
		{a, M{"cmd": "CronDelete", "name": "c"}, nil},
		{b, M{"cmd": "CronList"}, nil},

		// Made, read, listed, replaced and deleted; none runs meanwhile.
		{a, cron("yearly", "cq-y", M{"schedule": "0 0 1 1 *", "timezone": "Europe/Rome", "jobName": "tick",
			"data": M{"x": 1}, "priority": 5, "maxLimit": 10}), &stepHow{view: local}},
		{b, cron("hourly", "cq-h", M{"repeatEvery": 3600000, "data": M{"h": 1}}), &stepHow{view: inAnHour}},
		{a, cron("legacy", "cq-l", M{"repeatEvery": 3600000, "data": M{"name": "from-data", "v": 1}}), &stepHow{view: inAnHour}},
		{b, M{"cmd": "CronGet", "name": "yearly"}, &stepHow{view: local}},
		{a, M{"cmd": "CronList"}, nil},
		{b, cron("yearly", "cq-y", M{"schedule": "30 6 * * 1", "timezone": "America/New_York", "maxLimit": 0}), &stepHow{view: local}},
		{a, M{"cmd": "CronList"}, nil},
		{b, M{"cmd": "CronDelete", "name": "hourly"}, nil},
		{a, M{"cmd": "CronDelete", "name": "hourly"}, nil},
		{b, M{"cmd": "CronGet", "name": "hourly"}, nil},
		{a, M{"cmd": "CronList"}, nil},
		{b, M{"cmd": "CronDelete", "name": "legacy"}, nil},
		{a, M{"cmd": "CronDelete", "name": "yearly"}, nil},

		// A schedule that runs at once, then an hour on: one run, its
		// job as jobOptions say, the next run an interval after the
		// first; replaced, it keeps its executions and does not run at
		// once again.
		{a, cron("now", "cq-now", M{"immediately": true, "repeatEvery": 3600000, "data": M{"i": 1}, "priority": 3,
			"jobOptions": M{"attempts": 2, "removeOnComplete": true, "jobId": "ignored", "lifo": true}}), &stepHow{view: noted}},
		{b, M{"cmd": "CronGet", "name": "now"}, &stepHow{until: ran(1).until, view: stepped}},
		{a, M{"cmd": "GetJobCounts", "queue": "cq-now"}, counted("prioritized", 1)},
		{b, M{"cmd": "PULL", "queue": "cq-now"}, &stepHow{view: anon}},
		{a, M{"cmd": "ACK", "id": "$last", "result": "ran"}, &stepHow{view: anon}},
		{b, M{"cmd": "GetJobCounts", "queue": "cq-now"}, nil},
		{a, cron("now", "cq-now", M{"immediately": true, "repeatEvery": 3600000}), &stepHow{view: inAnHour}},
		{b, M{"cmd": "CronList"}, nil},
		{a, M{"cmd": "CronDelete", "name": "now"}, nil},

		// skipIfNoWorker: with no worker the run is skipped, not counted,
		// and the next one an interval on; with a worker on the queue
		// (through both connections: each broker knows its own) it runs.
		{a, cron("idle", "cq-i", M{"immediately": true, "repeatEvery": 3600000, "skipIfNoWorker": true}), &stepHow{view: noted}},
		{b, M{"cmd": "CronGet", "name": "idle"}, movedOn},
		{a, M{"cmd": "GetJobCounts", "queue": "cq-i"}, nil},
		{a, M{"cmd": "RegisterWorker", "name": "wa", "workerId": "wa", "queues": []any{"cq-w"}}, nil},
		{b, M{"cmd": "RegisterWorker", "name": "wb", "workerId": "wb", "queues": []any{"cq-w"}}, nil},
		{a, cron("busy", "cq-w", M{"immediately": true, "repeatEvery": 3600000, "skipIfNoWorker": true}), &stepHow{view: noted}},
		{b, M{"cmd": "CronGet", "name": "busy"}, &stepHow{until: ran(1).until, view: stepped}},
		{a, M{"cmd": "GetJobCounts", "queue": "cq-w"}, counted("waiting", 1)},
		{b, M{"cmd": "CronDelete", "name": "idle"}, nil},
		{a, M{"cmd": "CronDelete", "name": "busy"}, nil},

		// PUSH's repeat option refused.
		{a, M{"cmd": "PUSH", "queue": "cq-rep", "data": M{"r": 1}, "jobId": "r1", "repeat": M{"every": 100, "limit": 2}}, nil},
		{b, M{"cmd": "PUSH", "queue": "cq-rep", "data": M{"r": 1}, "repeat": M{"every": 100, "pattern": "* * * * *"}}, nil},
		{a, M{"cmd": "PUSH", "queue": "cq-rep", "data": M{"r": 1}, "repeat": M{"pattern": "soon"}}, nil},
		{b, M{"cmd": "PUSH", "queue": "cq-rep", "data": M{"r": 1}, "repeat": M{"every": -5}}, nil},
		{a, M{"cmd": "PUSH", "queue": "cq-base", "data": M{"b": 1}, "jobId": "base"}, nil},
		{b, M{"cmd": "PUSH", "queue": "cq-rep", "data": M{"r": 1}, "repeat": M{"every": 1000}, "dependsOn": []any{"base"}}, nil},

		// Runs on the clock, started together so that their waits
		// overlap: a run limit (three runs 150 ms apart, then the
		// schedule is gone, each run having pushed its job); the same
		// with preventOverlap, the default (a run whose last job still
		// waits pushes none: three runs, one job); a pattern with
		// seconds (on the second, twice); and PUSH's repeat option, every
		// second twice and on a pattern with seconds twice, the next run
		// pushed, delayed, when the last completes.
		{a, cron("three", "cq-3", M{"repeatEvery": 150, "maxLimit": 3, "preventOverlap": false}), nil},
		{b, cron("overlap", "cq-o", M{"repeatEvery": 150, "maxLimit": 3}), nil},
		{a, cron("seconds", "cq-s", M{"schedule": "* * * * * *", "maxLimit": 2, "preventOverlap": false}), &stepHow{view: onSecond}},
		{b, M{"cmd": "PUSH", "queue": "cq-rep", "data": M{"r": 1}, "repeat": M{"every": 1000, "limit": 2}}, &stepHow{view: anon}},
		{a, M{"cmd": "PUSH", "queue": "cq-rep2", "data": M{"r": 2}, "repeat": M{"pattern": "* * * * * *", "limit": 2}}, &stepHow{view: anon}},
		{b, pulled("cq-rep"), &stepHow{view: anon}},
		{a, M{"cmd": "ACK", "id": "$last", "result": 1}, &stepHow{view: anon}},
		{b, M{"cmd": "GetJobCounts", "queue": "cq-rep"}, nil},
		{a, M{"cmd": "CronGet", "name": "three"}, gone},
		{b, M{"cmd": "GetJobCounts", "queue": "cq-3"}, counted("waiting", 3)},
		{b, M{"cmd": "CronGet", "name": "overlap"}, gone},
		{a, M{"cmd": "GetJobCounts", "queue": "cq-o"}, counted("waiting", 1)},
		{b, M{"cmd": "PULL", "queue": "cq-o"}, &stepHow{view: anon}},
		{a, pulled("cq-rep2"), &stepHow{view: anon}},
		{b, M{"cmd": "ACK", "id": "$last"}, &stepHow{view: anon}},
		{a, pulled("cq-rep"), &stepHow{view: anon}},
		{b, M{"cmd": "ACK", "id": "$last", "result": 2}, &stepHow{view: anon}},
		{a, M{"cmd": "GetJobCounts", "queue": "cq-rep"}, nil},
		{b, M{"cmd": "CronGet", "name": "seconds"}, gone},
		{a, M{"cmd": "GetJobCounts", "queue": "cq-s"}, counted("waiting", 2)},
		{b, pulled("cq-rep2"), &stepHow{view: anon}},
		{a, M{"cmd": "ACK", "id": "$last"}, &stepHow{view: anon}},
		{b, M{"cmd": "GetJobCounts", "queue": "cq-rep2"}, nil},
		{a, M{"cmd": "CronList"}, nil},
		{a, M{"cmd": "ListQueues"}, &stepHow{view: sorted}},
	}
	return runSteps(t, steps)
}

// TestPGCronAnswerAsMemory: cron schedules and repeatable jobs through two
// brokers of one namespace answer as through one memory-mode server,
// field for field.
func TestPGCronAnswerAsMemory(t *testing.T) {
	t.Parallel()
	answersAsMemory(t, cronScript)
}
