package main

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// budgetScenario sends every field over its limit once, through both
// engines, and records what each answer said; the job that is within its
// limits goes through the same steps untouched.
func budgetScenario(t *testing.T, cs []*tclient) map[string]any {
	c := cs[0]
	out := map[string]any{}
	big := func(n int) string { return strings.Repeat("x", n) }
	refuse := func(key, want string, m map[string]any) {
		t.Helper()
		msg := c.fail(m)
		if !strings.Contains(msg, want) {
			t.Fatalf("%s: refused with %q, want the limit named: %q", key, msg, want)
		}
		out[key] = msg
	}
	tags := make([]any, 1001)
	for i := range tags {
		tags[i] = "t"
	}
	kids := make([]any, 3000)
	for i := range kids {
		kids[i] = big(1000)
	}
	refuse("uniqueKey", "uniqueKey is limited to 1 KiB (1024 bytes)",
		map[string]any{"cmd": "PUSH", "queue": "bud", "data": 1, "uniqueKey": big(1025)})
	refuse("jobId", "jobId is limited to 1 KiB (1024 bytes)",
		map[string]any{"cmd": "PUSH", "queue": "bud", "data": 1, "jobId": big(2000)})
	// Keys kept as text, which PostgreSQL's refuses NUL and invalid UTF-8
	// in (found by FuzzCommandsPG).
	refuse("uniqueKeyText", "uniqueKey must be UTF-8 text without NUL characters",
		map[string]any{"cmd": "PUSH", "queue": "bud", "data": 1, "uniqueKey": "u\x00"})
	refuse("jobIdText", "jobId must be UTF-8 text without NUL characters",
		map[string]any{"cmd": "PUSH", "queue": "bud", "data": 1, "jobId": "j\x00"})
	refuse("dependsOnText", "each entry of dependsOn must be UTF-8 text without NUL characters",
		map[string]any{"cmd": "PUSH", "queue": "bud", "data": 1, "dependsOn": []any{"a", "b\x00"}})
	refuse("groupIdText", "groupId must be UTF-8 text",
		map[string]any{"cmd": "PUSH", "queue": "bud", "data": 1, "groupId": "g\xff"})
	refuse("tags", "tags of a job are limited to 1000",
		map[string]any{"cmd": "PUSH", "queue": "bud", "data": 1, "tags": tags})
	refuse("tag", "each entry of tags is limited to 1 KiB (1024 bytes)",
		map[string]any{"cmd": "PUSH", "queue": "bud", "data": 1, "tags": []any{big(1025)}})
	refuse("repeat", "repeat is limited to 64 KiB (65536 bytes)",
		map[string]any{"cmd": "PUSH", "queue": "bud", "data": 1, "repeat": map[string]any{"every": 1000, "pad": big(70000)}})
	// Each field within its own limit, the whole job over its cap.
	refuse("total", "a job (its data and other fields together) is limited to 12 MiB (12582912 bytes)",
		map[string]any{"cmd": "PUSHB", "queue": "bud", "jobs": []any{
			map[string]any{"name": "j", "data": 1},
			map[string]any{"name": "j", "data": big(maxDataBytes - 100), "childrenIds": kids}}})

	// A job with room for little more than its fields: Update may not
	// make it larger than the cap.
	tagsOK := make([]any, 1000)
	for i := range tagsOK {
		tagsOK[i] = big(1024)
	}
	fat := c.ok(map[string]any{"cmd": "PUSH", "queue": "bud-fat", "data": 1, "tags": tagsOK, "childrenIds": kids})["id"]
	refuse("update", "a job (its data and other fields together) is limited to 12 MiB",
		map[string]any{"cmd": "Update", "id": fat, "data": big(maxDataBytes - 100)})
	c.ok(map[string]any{"cmd": "Update", "id": fat, "data": big(1 << 20)})

	refuse("owner", "owner is limited to 1 KiB (1024 bytes)",
		map[string]any{"cmd": "PULL", "queue": "bud", "owner": big(1025), "timeout": 0})
	// Kept as text by PostgreSQL, which refuses NUL (found by FuzzCommandsPG).
	refuse("ownerText", "owner must be UTF-8 text without NUL characters",
		map[string]any{"cmd": "PULLB", "queue": "bud", "owner": "w\x00", "count": 1, "timeout": 0})

	c.ok(map[string]any{"cmd": "PUSH", "queue": "bud", "name": "ok", "data": map[string]any{"keep": true}})
	pulled := c.ok(map[string]any{"cmd": "PULL", "queue": "bud", "owner": "w", "timeout": 0})
	job := pulled["job"].(map[string]any)
	id, tok := job["id"], pulled["token"]
	refuse("progress", "progress is limited to 64 KiB (65536 bytes)",
		map[string]any{"cmd": "Progress", "id": id, "progress": map[string]any{"pad": big(70000)}})
	refuse("progressMessage", "a progress message is limited to 64 KiB (65536 bytes)",
		map[string]any{"cmd": "Progress", "id": id, "progress": 50, "message": big(70000)})
	c.ok(map[string]any{"cmd": "Progress", "id": id, "progress": 50, "message": "half"})
	refuse("failError", "a failure's error is limited to 64 KiB (65536 bytes)",
		map[string]any{"cmd": "FAIL", "id": id, "token": tok, "error": big(70000)})
	stack := make([]any, 100)
	for i := range stack {
		stack[i] = big(3000)
	}
	refuse("failStack", "a failure's stack trace is limited to 256 KiB (262144 bytes)",
		map[string]any{"cmd": "FAIL", "id": id, "token": tok, "error": "e", "stack": stack})
	refuse("logMessage", "a log message is limited to 64 KiB (65536 bytes)",
		map[string]any{"cmd": "AddLog", "id": id, "message": big(70000)})
	refuse("logLevel", "a log level is limited to 64 bytes",
		map[string]any{"cmd": "AddLog", "id": id, "message": "m", "level": big(65)})
	// An id or token no storage could keep names no job; in PostgreSQL
	// mode one in a round of ACKs failed the round's other ACKs, other
	// clients' among them (found by FuzzCommandsPG).
	refuse("ackbIdText", "ids[1] must be UTF-8 text without NUL characters",
		map[string]any{"cmd": "ACKB", "ids": []any{id, "x\x00"}, "tokens": []any{tok, "t"}})
	refuse("ackTokenText", "token must be UTF-8 text without NUL characters",
		map[string]any{"cmd": "ACK", "id": id, "token": "\xfe"})
	refuse("heartbeatTokenText", "tokens[0] must be UTF-8 text without NUL characters",
		map[string]any{"cmd": "JobHeartbeatB", "ids": []any{id}, "tokens": []any{"t\x00"}})
	refuse("getJobIdText", "id must be UTF-8 text without NUL characters",
		map[string]any{"cmd": "GetJob", "id": "\x00"})
	refuse("result", "a job's result is limited to 10 MiB (10485760 bytes)",
		map[string]any{"cmd": "ACK", "id": id, "token": tok, "result": big(maxDataBytes + 1)})
	refuse("resultBatch", "results[0]: a job's result is limited to 10 MiB (10485760 bytes)",
		map[string]any{"cmd": "ACKB", "ids": []any{id}, "tokens": []any{tok}, "results": []any{big(maxDataBytes + 1)}})

	// The byte budget of a job's logs: the oldest entries go, the count
	// of kept entries follows from the budget, not the 100-entry limit.
	for i := 0; i < 20; i++ {
		c.ok(map[string]any{"cmd": "AddLog", "id": id, "message": string(rune('a'+i)) + big(60000)})
	}
	logs := sub(t, c.ok(map[string]any{"cmd": "GetLogs", "id": id}), "data")
	kept := list(t, logs, "logs")
	out["logsKept"] = len(kept)
	out["logsCount"] = num(t, logs["count"])
	out["logsFirst"] = kept[0].(map[string]any)["message"].(string)[:1]
	if len(kept) >= 20 || len(kept) < 10 {
		t.Fatalf("%d logs kept of 20 of 60 KB each, want about 1 MiB of them", len(kept))
	}

	// Nothing of the refusals stuck: the job is still active, its progress
	// the last accepted, and it completes with a result.
	got := sub(t, c.ok(map[string]any{"cmd": "GetJob", "id": id}), "job")
	out["state"], out["progress"] = got["state"], got["progressMessage"]
	c.ok(map[string]any{"cmd": "ACK", "id": id, "token": tok, "result": map[string]any{"r": 1}})
	out["result"] = c.ok(map[string]any{"cmd": "GetResult", "id": id})["result"]
	counts := sub(t, c.ok(map[string]any{"cmd": "GetJobCounts", "queue": "bud"}), "counts")
	out["completed"], out["waiting"] = counts["completed"], counts["waiting"]
	return out
}

// TestJobFieldBudgets: every string and array of a job, its progress, a
// failure's error and stack, a result and a log line have a limit, the
// same in both engines, and each refusal names it; nothing else is lost.
func TestJobFieldBudgets(t *testing.T) {
	t.Parallel()
	got := sameAsMemory(t, budgetScenario)
	if got["state"] != "active" || got["progress"] != "half" || num(t, got["completed"]) != 1 || num(t, got["waiting"]) != 0 {
		t.Fatalf("after the refusals: %v", got)
	}
}

// TestLRUByteBudget: a cache with a byte budget evicts the least recently
// used entries while over it (never the one just put), and keeps its
// weight right through replacements and deletions.
func TestLRUByteBudget(t *testing.T) {
	t.Parallel()
	var evicted []string
	l := NewLRU[string, []byte](100, func(k string, _ []byte) { evicted = append(evicted, k) })
	l.SetBudget(1000, func(v []byte) int64 { return int64(len(v)) })
	for _, k := range []string{"a", "b", "c"} {
		l.Put(k, make([]byte, 300))
	}
	l.Get("a") // b is now the least recently used
	l.Put("d", make([]byte, 300))
	if strings.Join(evicted, ",") != "b" || l.Bytes() != 900 || l.Len() != 3 {
		t.Fatalf("evicted %v, %d bytes in %d entries", evicted, l.Bytes(), l.Len())
	}
	l.Put("a", make([]byte, 50)) // replaced: lighter
	l.Delete("c")
	if l.Bytes() != 350 {
		t.Fatalf("%d bytes after a replacement and a deletion, want 350", l.Bytes())
	}
	l.Put("e", make([]byte, 2000)) // alone over the budget: kept, the rest go
	if _, ok := l.Peek("e"); !ok || l.Len() != 1 || l.Bytes() != 2000 {
		t.Fatalf("%d entries, %d bytes after an entry over the whole budget", l.Len(), l.Bytes())
	}
}

// TestPageJobsSameAsSort: the bounded page of GetJobs is the page a full
// sort and JavaScript's slice give, for every kind of offset and limit.
func TestPageJobsSameAsSort(t *testing.T) {
	t.Parallel()
	var items []jobItem
	for i := 0; i < 500; i++ {
		// Few distinct times: the id decides among equals.
		j := withID(&Job{CreatedAt: int64(rand.IntN(40))}, newID())
		items = append(items, jobItem{j, "waiting"})
	}
	rand.Shuffle(len(items), func(a, b int) { items[a], items[b] = items[b], items[a] })
	every := func(fn func(jobItem)) {
		for _, it := range items {
			fn(it)
		}
	}
	for _, asc := range []bool{true, false} {
		sorted := slices.Clone(items)
		slices.SortFunc(sorted, func(a, b jobItem) int {
			c := cmpInt(a.j.CreatedAt, b.j.CreatedAt)
			if c == 0 {
				c = cmpStr(a.j.ID(), b.j.ID())
			}
			if !asc {
				c = -c
			}
			return c
		})
		for _, ol := range [][2]int64{{0, 10}, {0, 100}, {490, 100}, {250, 10}, {0, 0}, {0, 1000}, {-10, 20},
			{-10, 5}, {5, -3}, {-600, 700}, {600, 10}, {499, 1}, {-1, 1}, {10, -20}} {
			got := pageJobs(every, ol[0], ol[1], asc)
			lo, hi := jsSlice(len(sorted), ol[0], ol[0]+ol[1])
			want := sorted[lo:hi]
			if len(got) != len(want) {
				t.Fatalf("asc %v offset %d limit %d: %d jobs, want %d", asc, ol[0], ol[1], len(got), len(want))
			}
			for i := range want {
				if got[i].j != want[i].j {
					t.Fatalf("asc %v offset %d limit %d: job %d differs", asc, ol[0], ol[1], i)
				}
			}
		}
	}
}

// TestGetJobsSmallPageOfLargeQueue: a GetJobs page of 10 from a queue of
// 100,000 jobs keeps only its page, not a copy of the queue to sort (the
// bytes allocated while it runs say which: a copy is ~2.4 MB at least).
//
// Serial: it measures the test process's heap.
func TestGetJobsSmallPageOfLargeQueue(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	for i := 0; i < 100; i++ {
		jobs := make([]any, 1000)
		for k := range jobs {
			jobs[k] = map[string]any{"name": "j", "data": i*1000 + k}
		}
		c.ok(map[string]any{"cmd": "PUSHB", "queue": "big", "jobs": jobs})
	}
	var before, after runtime.MemStats
	page := func() []any {
		runtime.GC()
		runtime.ReadMemStats(&before)
		got := list(t, c.ok(map[string]any{"cmd": "GetJobs", "queue": "big", "state": "waiting", "limit": 10, "offset": 5}), "jobs")
		runtime.ReadMemStats(&after)
		return got
	}
	got := page()
	if len(got) != 10 || num(t, got[0].(map[string]any)["data"]) != 5 {
		t.Fatalf("page: %d jobs, first %v", len(got), got[0])
	}
	if a := after.TotalAlloc - before.TotalAlloc; a > 1<<20 {
		t.Fatalf("a page of 10 from 100,000 jobs allocated %d bytes: the queue was copied", a)
	} else {
		t.Logf("a page of 10 from 100,000 jobs allocated %d bytes", a)
	}
}

// Sizes are read as people write them, and what is not a size is refused.
func TestParseByteSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{
		"0": 0, "512": 512, "512MiB": 512 << 20, "512mib": 512 << 20, "1GiB": 1 << 30, "64KiB": 64 << 10,
		"100MB": 100e6, "2GB": 2e9, "16M": 16 << 20, " 3 GiB ": 3 << 30, "7B": 7,
	} {
		if got, err := parseByteSize(in); err != nil || got != want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1.5GiB", "12XB", "9999999999999GiB"} {
		if _, err := parseByteSize(in); err == nil {
			t.Errorf("parseByteSize(%q) took it", in)
		}
	}
	for _, n := range []int64{0, 512, 64 << 10, 512 << 20, 3 << 30, 1234567} {
		b := byteSize(n)
		if got, err := parseByteSize(b.String()); err != nil || got != n {
			t.Errorf("%d written %q reads back as %d, %v", n, b.String(), got, err)
		}
	}
}
