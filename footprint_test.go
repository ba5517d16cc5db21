package main

import (
	"fmt"
	"os"
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
		br := NewBroker(0, nil)
		for i := 0; i < n; i += 1000 {
			jobs := make([]*Job, min(1000, n-i))
			for k := range jobs {
				jobs[k] = mustJob(b, "footprint", map[string]any{"name": "job",
					"data": map[string]any{"i": int64(i + k), "s": "some payload text"}})
			}
			br.pushJobs("footprint", jobs, nil)
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
