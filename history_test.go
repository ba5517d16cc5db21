package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// ackAll pulls and acknowledges every job of queue, each with the
// result {"r": its id}.
func ackAll(t *testing.T, c *tclient, queue string) {
	t.Helper()
	for {
		a := c.ok(map[string]any{"cmd": "PULLB", "queue": queue, "count": 500, "owner": "w"})
		jobs := list(t, a, "jobs")
		if len(jobs) == 0 {
			return
		}
		ids, results := make([]any, len(jobs)), make([]any, len(jobs))
		for i, j := range jobs {
			ids[i] = j.(map[string]any)["id"]
			results[i] = map[string]any{"r": ids[i]}
		}
		c.ok(map[string]any{"cmd": "ACKB", "ids": ids, "tokens": a["tokens"], "results": results})
	}
}

// checkHistory: every completed job of ids (pushed in that order, one
// millisecond or more apart in batches) is found by id with its state and
// result, counted, and listed in order, from either end.
func checkHistory(t *testing.T, c *tclient, queue string, ids []string) {
	t.Helper()
	counts := sub(t, c.ok(map[string]any{"cmd": "GetJobCounts", "queue": queue}), "counts")
	if got := num(t, counts["completed"]); int(got) != len(ids) {
		t.Fatalf("%d completed counted, want %d", int(got), len(ids))
	}
	for _, id := range []string{ids[0], ids[len(ids)/2], ids[len(ids)-1]} {
		if st := str(t, c.ok(map[string]any{"cmd": "GetState", "id": id}), "state"); st != "completed" {
			t.Fatalf("job %s: state %q, want completed", id, st)
		}
		res := c.ok(map[string]any{"cmd": "GetResult", "id": id})["result"]
		if r, _ := res.(map[string]any); r == nil || r["r"] != id {
			t.Fatalf("job %s: result %v, want {r: %s}", id, res, id)
		}
		job := sub(t, c.ok(map[string]any{"cmd": "GetJob", "id": id}), "job")
		if job["id"] != id {
			t.Fatalf("GetJob %s answered %v", id, job["id"])
		}
		w := c.ok(map[string]any{"cmd": "WaitJob", "id": id, "timeout": 1000})
		if r, _ := w["result"].(map[string]any); w["completed"] != true || r["r"] != id {
			t.Fatalf("WaitJob %s answered %v", id, w)
		}
	}
	page := func(offset, limit int, asc bool) []string {
		jobs := list(t, c.ok(map[string]any{"cmd": "GetJobs", "queue": queue, "state": "completed", "offset": offset, "limit": limit, "asc": asc}), "jobs")
		out := make([]string, len(jobs))
		for i, j := range jobs {
			out[i] = j.(map[string]any)["id"].(string)
		}
		return out
	}
	// The ids were made in push order (UUIDv7s, a batch in the same
	// millisecond ordered by their sequence), so the listing's order by
	// creation time then id is push order.
	if got := page(0, 5, true); !slices.Equal(got, ids[:5]) {
		t.Fatalf("oldest five listed %v, want %v", got, ids[:5])
	}
	n := len(ids)
	if got := page(n-5, 5, false); !slices.Equal(got, reversed(ids[:5])) {
		t.Fatalf("the last page, newest first, listed %v, want %v", got, reversed(ids[:5]))
	}
	if got := page(0, 3, false); !slices.Equal(got, reversed(ids[n-3:])) {
		t.Fatalf("the newest three listed %v, want %v", got, reversed(ids[n-3:]))
	}
	if got := page(n/2, 4, true); !slices.Equal(got, ids[n/2:n/2+4]) {
		t.Fatalf("a middle page listed %v, want %v", got, ids[n/2:n/2+4])
	}
}

// historyAcrossRestart pushes n jobs to queue in batches, completes them,
// and checks the history before and after a restart of the server (started
// with flags); it answers a client of the restarted server and the ids.
func historyAcrossRestart(t *testing.T, flags []string, queue string, n, batch int) (*tclient, []string) {
	t.Helper()
	srv := startBinary(t, flags...)
	c := dial(t, srv.addr())
	ids := pushMany(t, []*tclient{c}, queue, n, batch)
	ackAll(t, c, queue)
	checkHistory(t, c, queue, ids)
	c.close()
	srv.stop(t)
	srv = startBinary(t, flags...)
	c = dial(t, srv.addr())
	checkHistory(t, c, queue, ids)
	return c, ids
}

func reversed(s []string) []string {
	out := slices.Clone(s)
	slices.Reverse(out)
	return out
}

// TestCompletedHistorySQLite: past --max-completed-jobs, completed jobs
// leave memory and stay on disk: found by id with their results, counted,
// listed, after a restart too; Clean takes the oldest first and Obliterate
// takes them all.
func TestCompletedHistorySQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "history.db")
	c, ids := historyAcrossRestart(t, []string{"--data-path", path, "--max-completed-jobs", "100"}, "hist", 1000, 100)

	cleaned := list(t, c.ok(map[string]any{"cmd": "Clean", "queue": "hist", "grace": 0, "state": "completed", "limit": 150}), "ids")
	got := make([]string, len(cleaned))
	for i, id := range cleaned {
		got[i] = id.(string)
	}
	slices.Sort(got)
	want := slices.Clone(ids[:150])
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("Clean removed %d jobs, not the 150 oldest", len(got))
	}
	checkHistory(t, c, "hist", ids[150:])
	if st := str(t, c.ok(map[string]any{"cmd": "GetState", "id": ids[0]}), "state"); st != "unknown" {
		t.Fatalf("a cleaned job reads %q", st)
	}
	c.ok(map[string]any{"cmd": "Obliterate", "queue": "hist"})
	counts := sub(t, c.ok(map[string]any{"cmd": "GetJobCounts", "queue": "hist"}), "counts")
	if num(t, counts["completed"]) != 0 {
		t.Fatalf("after Obliterate: %v", counts)
	}
	if st := str(t, c.ok(map[string]any{"cmd": "GetState", "id": ids[300]}), "state"); st != "unknown" {
		t.Fatalf("an obliterated job reads %q", st)
	}
}

// TestCompletedRetention: --completed-retention-ms deletes the completed
// jobs older than that, from memory and from disk, and announces how many.
func TestCompletedRetention(t *testing.T) {
	t.Parallel()
	sq, err := OpenSQLite(filepath.Join(t.TempDir(), "r.db"), "normal", quietLog())
	if err != nil {
		t.Fatal(err)
	}
	sq.Start()
	b := NewMemEngine(2, sq)
	t.Cleanup(func() { b.Close(); sq.Close() })
	var clock atomic.Int64
	clock.Store(nowMs() + 60_000) // ahead of the jobs' own times, which are real
	b.now = clock.Load
	b.maxDone, b.retention = 150, 15_000
	removed := tapCompletedRemoved(b.Broker)
	ctx := context.Background()
	// Three rounds of 100 completions, 10 s apart: past the memory's 150,
	// the oldest are on disk.
	var rounds [3][]string
	for i := range rounds {
		if rounds[i] = completeAll(t, b, "ret", 100); len(rounds[i]) != 100 {
			t.Fatalf("round %d completed %d jobs", i, len(rounds[i]))
		}
		clock.Add(10_000)
	}
	eventually(t, callTimeout, "the oldest completions retired", func() (bool, string) {
		return b.doneTotal.Load() <= 150, fmt.Sprint(b.doneTotal.Load(), " in memory")
	})
	// The trimmer may be inside a batch of evictions still (the count
	// falls as it goes): it holds that shard's lock until it is done.
	for _, s := range b.shards {
		s.with(func() {})
	}
	// Now the first two rounds are older than 15 s, the third is not.
	n, err := b.retainOnce(ctx)
	if err != nil || n != 200 {
		t.Fatalf("retainOnce: %d removed, %v; want the 200 of the first two rounds", n, err)
	}
	if c, _ := b.Counts(ctx, "ret"); c.Completed != 100 {
		t.Fatalf("%d completed left, want 100", c.Completed)
	}
	for i, round := range rounds {
		for _, id := range []string{round[0], round[99]} {
			v, err := b.ReadJob(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if gone := v.Job == nil; gone != (i < 2) {
				t.Fatalf("round %d: job %s gone: %v", i, id, gone)
			}
		}
	}
	select {
	case n := <-removed:
		if n != `{"count":200}` {
			t.Fatalf("cleanup:completed-removed %s, want a count of 200", n)
		}
	case <-time.After(callTimeout):
		t.Fatal("no cleanup:completed-removed")
	}
}

// TestCompletedHistory60k: the run. 60,000 jobs complete with
// results, past the default cache of 50,000; the oldest is then found
// completed with its result, counted and listed, before and after a
// restart, in SQLite and in PostgreSQL mode.
func TestCompletedHistory60k(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"sqlite", "postgres"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			historyAcrossRestart(t, storageFlags(t, mode), "sixty", 60000, 1000)
		})
	}
}

// TestPGCompletedRetentionAge: with --completed-retention-ms, completed
// jobs older than that go, whichever broker completed them, and
// cleanup:completed-removed says how many; newer ones stay.
func TestPGCompletedRetentionAge(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	// Long enough that a job just completed is still there when asked
	// next, on a busy machine: with 1.5 s, and the fresh job looked at
	// after fifty others, a CI run (2026-12-06) found it gone already.
	keep := int64(3000)
	brk := startPGInProcess(t, testPGURL(), ns, nil, pgOptions{retention: &keep})
	c := dial(t, brk.addr)
	removed := tapCompletedRemoved(brk.b)
	old := pushMany(t, []*tclient{c}, "age", 50, 50)
	ackAll(t, c, "age")
	eventually(t, 30*time.Second, "the completed jobs past 3 s deleted", func() (bool, string) {
		st := state(t, c, old[0])
		return st == "unknown", st
	})
	fresh := pushMany(t, []*tclient{c}, "age", 10, 10)
	ackAll(t, c, "age")
	if st := state(t, c, fresh[0]); st != "completed" {
		t.Fatalf("a job completed just now is %s", st)
	}
	for _, id := range old {
		if st := state(t, c, id); st != "unknown" {
			t.Fatalf("job %s, completed past the retention, is %s", id, st)
		}
	}
	select {
	case n := <-removed:
		if n != `{"count":50}` {
			t.Fatalf("cleanup:completed-removed %s, want a count of 50", n)
		}
	case <-time.After(callTimeout):
		t.Fatal("no cleanup:completed-removed")
	}
}

// tapCompletedRemoved hands over the data of each cleanup:completed-removed
// notice b announces.
func tapCompletedRemoved(b *Broker) chan string {
	ch := make(chan string, 16)
	b.addNoticeTap(NoticeTap{wants: func() bool { return true }, take: func(n *Notice) {
		if n.Name != "cleanup:completed-removed" {
			return
		}
		select {
		case ch <- string(n.Data):
		default:
		}
	}})
	return ch
}

// TestMeasureCompletedHistory measures what a million completed jobs cost
// in SQLite mode: the file, the server's memory, a lookup of the oldest,
// and a restart. A measurement, not a check: it runs when asked,
// QUEUED_MEASURE=1 go test -count=1 -run TestMeasureCompletedHistory -v .
func TestMeasureCompletedHistory(t *testing.T) {
	t.Parallel()
	if os.Getenv("QUEUED_MEASURE") != "1" {
		t.Skip("a measurement; QUEUED_MEASURE=1 runs it")
	}
	const n = 1_000_000
	path := filepath.Join(t.TempDir(), "million.db")
	srv := startBinary(t, "--data-path", path)
	c := dial(t, srv.addr())
	start := time.Now()
	var first string
	for done := 0; done < n; done += 10000 {
		ids := pushMany(t, []*tclient{c}, "m", 10000, 1000)
		if first == "" {
			first = ids[0]
		}
		ackAll(t, c, "m")
	}
	t.Logf("%d jobs pushed and completed with results in %v", n, time.Since(start))
	rss, peak := procMem(t, srv.cmd.Process.Pid)
	t.Logf("server: %d MiB resident, %d MiB at peak", rss>>20, peak>>20)
	at := time.Now()
	checkState := func() {
		if st := str(t, c.ok(map[string]any{"cmd": "GetState", "id": first}), "state"); st != "completed" {
			t.Fatalf("the oldest reads %q", st)
		}
	}
	checkState()
	t.Logf("the oldest found in %v", time.Since(at))
	c.close()
	srv.stop(t)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("data file: %d MiB, %d bytes a job", fi.Size()>>20, fi.Size()/n)
	at = time.Now()
	srv = startBinary(t, "--data-path", path)
	t.Logf("restart: serving after %v", time.Since(at))
	c = dial(t, srv.addr())
	checkState()
	rss, _ = procMem(t, srv.cmd.Process.Pid)
	t.Logf("after the restart: %d MiB resident", rss>>20)
}
