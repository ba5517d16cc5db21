package main

// Limits, stall and DLQ policy, and the DLQ commands: PostgreSQL mode
// answers as memory mode, step by step.

import (
	"math"
	"testing"
	"time"
)

// policyScript drives the policy and DLQ commands through two connections
// (a and b) and records every answer, normalised as moveScript's are.
func policyScript(t *testing.T, a, b *tclient) []string {
	t.Helper()
	q := "policy"
	steps := []struct {
		c   *tclient
		req map[string]any
	}{
		{a, M{"cmd": "GetQueueLimits", "queue": q}},
		{a, M{"cmd": "GetStallConfig", "queue": q}},
		{a, M{"cmd": "GetDlqConfig", "queue": q}},
		{a, M{"cmd": "GetDlqStats", "queue": q}},
		{a, M{"cmd": "Dlq", "queue": q}},
		{b, M{"cmd": "RateLimit", "queue": q, "limit": 5, "duration": 1000}},
		{b, M{"cmd": "RateLimit", "queue": q, "limit": "x"}},
		{b, M{"cmd": "RateLimit", "queue": q}},
		// Times out of PUSH's range are refused, naming the limit (issue 25).
		{b, M{"cmd": "RateLimit", "queue": q, "limit": 9, "duration": int64(math.MaxInt64)}},
		{a, M{"cmd": "RateLimit", "queue": q, "limit": 9, "ttl": int64(math.MaxInt64)}},
		{b, M{"cmd": "RateLimit", "queue": q, "limit": 9, "ttl": -1}},
		{a, M{"cmd": "SetStallConfig", "queue": q, "config": M{"enabled": false, "stallInterval": 1e300}}},
		{b, M{"cmd": "SetStallConfig", "queue": q, "config": M{"gracePeriod": int64(maxDelayMs + 1)}}},
		{a, M{"cmd": "GetStallConfig", "queue": q}},
		{a, M{"cmd": "SetConcurrency", "queue": q, "limit": 2}},
		{a, M{"cmd": "SetConcurrency", "queue": q}},
		{b, M{"cmd": "GetQueueLimits", "queue": q}},
		{b, M{"cmd": "GetQueueLimits", "queue": q, "maxJobs": 3}},
		{a, M{"cmd": "SetStallConfig", "queue": q, "config": M{"enabled": false, "gracePeriod": -5, "maxStalls": "x"}}},
		{b, M{"cmd": "GetStallConfig", "queue": q}},
		{a, M{"cmd": "SetStallConfig", "queue": q}},
		{a, M{"cmd": "SetDlqConfig", "queue": q, "config": M{"maxAutoRetries": 1e12, "autoRetry": "yes", "maxEntries": 10, "maxAge": 3600000.7}}},
		{b, M{"cmd": "GetDlqConfig", "queue": q}},
		{a, M{"cmd": "PUSH", "queue": q, "data": 1, "jobId": "d1", "maxAttempts": 1}},
		{a, M{"cmd": "PUSH", "queue": q, "data": 2, "jobId": "d2", "maxAttempts": 1}},
		{a, M{"cmd": "PUSH", "queue": q, "data": 3, "jobId": "d3", "maxAttempts": 1}},
		{b, M{"cmd": "PULL", "queue": q}},
		{b, M{"cmd": "PULL", "queue": q}},
		{a, M{"cmd": "GetQueueLimits", "queue": q}},
		{b, M{"cmd": "FAIL", "id": "d1", "error": "one"}},
		{b, M{"cmd": "FAIL", "id": "d2", "error": "two"}},
		{a, M{"cmd": "ClearConcurrency", "queue": q}},
		{a, M{"cmd": "RateLimitClear", "queue": q}},
		{b, M{"cmd": "GetQueueLimits", "queue": q}},
		{b, M{"cmd": "PULL", "queue": q}},
		{b, M{"cmd": "FAIL", "id": "d3"}},
		{a, M{"cmd": "Dlq", "queue": q}},
		{a, M{"cmd": "Dlq", "queue": q, "count": 2}},
		{b, M{"cmd": "Dlq", "queue": q, "filter": M{"offset": 1, "limit": 1}}},
		{b, M{"cmd": "Dlq", "queue": q, "filter": M{"retriable": true}, "count": 1}},
		{b, M{"cmd": "Dlq", "queue": q, "filter": M{"reason": "timeout"}}},
		{a, M{"cmd": "Dlq", "queue": q, "filter": "x"}},
		{a, M{"cmd": "GetDlqStats", "queue": q}},
		// A job named is retried whatever count says.
		{b, M{"cmd": "RetryDlq", "queue": q, "jobId": "d1", "count": 0}},
		{a, M{"cmd": "GetState", "id": "d1"}},
		{b, M{"cmd": "RetryDlq", "queue": q, "jobId": "nope"}},
		{b, M{"cmd": "RetryDlq", "queue": q, "count": 1}},
		{a, M{"cmd": "GetState", "id": "d2"}},
		{a, M{"cmd": "RemoveDlqJob", "queue": q, "jobId": "d3"}},
		{b, M{"cmd": "RemoveDlqJob", "queue": q, "jobId": "d3"}},
		{a, M{"cmd": "PULL", "queue": q}},
		{a, M{"cmd": "FAIL", "id": "d1", "error": "again"}},
		// d2 went back to waiting a few steps ago; d1 goes back now. A
		// pull takes the one that went back first, unless both did in
		// the same millisecond (then push order decides, and d1 was
		// pushed first): how fast the engine got here would decide, so
		// the next pull is made to find them in different milliseconds.
		{nil, M{"cmd": "pause"}},
		{b, M{"cmd": "RetryDlq", "queue": q, "filter": M{"newerThan": 1}}},
		{a, M{"cmd": "PULL", "queue": q}},
		{a, M{"cmd": "FAIL", "id": "d2", "error": "again"}},
		{b, M{"cmd": "PurgeDlq", "queue": q}},
		{b, M{"cmd": "PurgeDlq", "queue": q}},
		{a, M{"cmd": "GetDlqStats", "queue": q}},
		{a, M{"cmd": "GetJobCounts", "queue": q}},
		{b, M{"cmd": "PurgeDlq", "queue": "none"}},
		{b, M{"cmd": "RetryDlq", "queue": "none"}},
		{b, M{"cmd": "RemoveDlqJob", "queue": "none", "jobId": "d1"}},
		{b, M{"cmd": "ClearConcurrency", "queue": "none"}},
		{b, M{"cmd": "RateLimitClear", "queue": "none"}},
		// A rate limit may be any finite number: in PostgreSQL mode a
		// bucket of 1e300 tokens made a negative LIMIT, and every pull of
		// the queue failed with the database's error (FuzzCommandsPG).
		{b, M{"cmd": "RateLimit", "queue": "huge", "limit": 1e300, "duration": 1000}},
		{a, M{"cmd": "PUSH", "queue": "huge", "data": 1, "jobId": "h1"}},
		{b, M{"cmd": "PULL", "queue": "huge", "timeout": 0}},
		{b, M{"cmd": "ACK", "id": "h1"}},
		{a, M{"cmd": "SetStallConfig", "queue": "quiet", "config": M{"enabled": true}}},
		{a, M{"cmd": "SetStallConfig", "queue": "loud", "config": M{"enabled": false}}},
		{a, M{"cmd": "ListQueues"}},
	}
	var out []string
	for i, s := range steps {
		if s.c == nil {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		out = append(out, answerLine(t, i, s.req["cmd"], s.c.call(s.req)))
	}
	return out
}

// TestPGPolicyAnswersAsMemory: the policy and DLQ commands through two
// brokers of one namespace answer as through one memory-mode server,
// field for field.
func TestPGPolicyAnswersAsMemory(t *testing.T) {
	t.Parallel()
	answersAsMemory(t, policyScript)
}

// TestStatsFailedCountsJobs: Stats' failed total counts jobs that failed
// for good, not attempts that will be retried, in memory and PostgreSQL
// mode alike (PostgreSQL mode counted every attempt).
func TestStatsFailedCountsJobs(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, addr string) {
		c := dial(t, addr)
		fail := func(attempts int) {
			c.ok(M{"cmd": "PUSH", "queue": "sf", "name": "j", "data": M{}, "maxAttempts": attempts, "backoff": 60000})
			j := sub(t, c.ok(M{"cmd": "PULL", "queue": "sf", "timeout": 0}), "job")
			c.ok(M{"cmd": "FAIL", "id": j["id"], "error": "boom"})
		}
		failed := func() float64 { return num(t, sub(t, c.ok(M{"cmd": "Stats"}), "stats")["failed"]) }
		fail(3)
		if n := failed(); n != 0 {
			t.Fatalf("after a retried attempt: failed %v, want 0", n)
		}
		fail(1)
		if n := failed(); n != 1 {
			t.Fatalf("after a job failed for good: failed %v, want 1", n)
		}
	}
	t.Run("memory", func(t *testing.T) { check(t, startBinary(t, "--memory").addr()) })
	t.Run("postgres", func(t *testing.T) { check(t, startPGBroker(t, pgTestNamespace(t)).addr()) })
}
