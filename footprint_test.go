package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"testing"
)

// BenchmarkWaitingJobBytes measures what a waiting job costs the memory
// engine: the heap in use after pushing n jobs (data {i, s} of about 40
// bytes, as the official client's addBulk sends them) and a forced GC,
// per job.
//
//	go test -run '^$' -bench WaitingJobBytes -benchtime 1x
//
// QUEUED_FOOTPRINT_JOBS sets n (1,000,000 by default); with
// QUEUED_FOOTPRINT_PROFILE=FILE a heap profile is written for
// `go tool pprof -sample_index=inuse_space -top FILE`.
func BenchmarkWaitingJobBytes(b *testing.B) {
	n := 1000000
	if v := os.Getenv("QUEUED_FOOTPRINT_JOBS"); v != "" {
		fmt.Sscan(v, &n)
	}
	for range b.N {
		before := heapInUse()
		br := NewMemEngine(0, nil)
		for i := 0; i < n; i += 1000 {
			br.pushJobs("footprint", footprintBatch(b, i, min(1000, n-i)), nil)
		}
		after := heapInUse()
		if c := br.counts("footprint"); c.Waiting != n {
			b.Fatalf("%d waiting, want %d", c.Waiting, n)
		}
		b.ReportMetric(float64(after-before)/float64(n), "B/job")
		b.ReportMetric(float64(after-before)/(1<<20), "MiB")
		if path := os.Getenv("QUEUED_FOOTPRINT_PROFILE"); path != "" {
			f, err := os.Create(path)
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.WriteHeapProfile(f); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
		runtime.KeepAlive(br)
		br.Close()
	}
}

// BenchmarkRecovery measures a start on a SQLite file holding n waiting
// jobs (as BenchmarkWaitingJobBytes pushes them): the time Load takes
// to rebuild the broker, and the heap it leaves in use, per job.
//
//	go test -run '^$' -bench Recovery -benchtime 3x
//
// QUEUED_FOOTPRINT_JOBS sets n (1,000,000 by default). The file is built
// once per run, through the store's own writer; QUEUED_RECOVERY_DB=PATH
// keeps it at PATH between runs (built there when missing).
func BenchmarkRecovery(b *testing.B) {
	n := 1000000
	if v := os.Getenv("QUEUED_FOOTPRINT_JOBS"); v != "" {
		fmt.Sscan(v, &n)
	}
	path := os.Getenv("QUEUED_RECOVERY_DB")
	if path == "" {
		path = filepath.Join(b.TempDir(), "q.db")
	}
	if _, err := os.Stat(path); err != nil {
		buildRecoveryFile(b, path, n)
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		runtime.GC()
		before := heapInUse()
		st, err := OpenSQLite(path, "normal", quietLog())
		if err != nil {
			b.Fatal(err)
		}
		br := NewMemEngine(0, st)
		b.StartTimer()
		rs, err := st.Load(br)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		if rs.Waiting != n {
			b.Fatalf("%d waiting recovered, want %d", rs.Waiting, n)
		}
		b.ReportMetric(float64(heapInUse()-before)/float64(n), "B/job")
		b.ReportMetric(float64(rs.Took.Milliseconds()), "ms/load")
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapSys)/(1<<20), "MiB-heap-sys")
		br.Close()
		st.Close()
		b.StartTimer()
	}
}

// buildRecoveryFile writes n waiting jobs to a new SQLite file at path.
func buildRecoveryFile(b *testing.B, path string, n int) {
	b.Helper()
	br, st, _ := openTestStore(b, path)
	for i := 0; i < n; i += 1000 {
		br.pushJobs("footprint", footprintBatch(b, i, min(1000, n-i)), nil)
	}
	if err := st.Sync(); err != nil {
		b.Fatal(err)
	}
	br.Close()
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
}

// footprintBatch parses n jobs from i on as a PUSHB carries them.
func footprintBatch(b *testing.B, i, n int) []*Job {
	b.Helper()
	list := make([]any, n)
	for k := range list {
		list[k] = map[string]any{"name": "job", "data": map[string]any{"i": int64(i + k), "s": "some payload text"}}
	}
	var e Enc
	if err := e.Any(list); err != nil {
		b.Fatal(err)
	}
	items, err := Raw(e.B).Array()
	if err != nil {
		b.Fatal(err)
	}
	jobs, err := parseJobBatch(items, "footprint", nowMs())
	if err != nil {
		b.Fatal(err)
	}
	return jobs
}
