package main

import (
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestProcsTunerDecides: the processors go down to one only after
// procsQuiet looks in a row below procsLow (a busy look starts the count
// again), and back to all at the first look past procsHigh on one.
func TestProcsTunerDecides(t *testing.T) {
	t.Parallel()
	tn := &procsTuner{all: 4, cur: 4}
	look := func(cores float64) int {
		tn.cur = tn.next(cores)
		return tn.cur
	}
	for i := range procsQuiet - 1 {
		if n := look(0.1); n != 4 {
			t.Fatalf("look %d below procsLow: %d processors, want 4", i+1, n)
		}
	}
	if n := look(procsLow + 0.1); n != 4 {
		t.Fatalf("a busy look: %d", n)
	}
	for range procsQuiet - 1 {
		look(0.1)
	}
	if n := look(0.1); n != 1 {
		t.Fatalf("after %d quiet looks in a row: %d processors, want 1", procsQuiet, n)
	}
	if n := look(procsHigh - 0.1); n != 1 {
		t.Fatalf("on one, a look under procsHigh: %d", n)
	}
	if n := look(procsHigh + 0.1); n != 4 {
		t.Fatalf("on one, a look past procsHigh: %d, want all", n)
	}
}

// TestProcsFollowTheLoad: the release binary, left alone, runs on one
// processor (its log says so at debug level), and a bulk push brings all
// of them back at once.
func TestProcsFollowTheLoad(t *testing.T) {
	t.Parallel()
	if runtime.NumCPU() < 2 {
		t.Skip("one processor: nothing to follow")
	}
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		t.Skip("GOMAXPROCS is set: the server leaves it alone")
	}
	srv := startBinary(t, "--memory", "--log-level", "debug")
	eventually(t, 60*time.Second, "the idle server on one processor", func() (bool, string) {
		return strings.Contains(srv.output(), "gomaxprocs=1"), "no gomaxprocs=1 in the log yet"
	})
	c := dial(t, srv.addr())
	jobs := make([]any, 100)
	for i := range jobs {
		jobs[i] = M{"data": M{"pad": strings.Repeat("x", 64), "i": i}}
	}
	c.ok(M{"cmd": "PUSHB", "queue": "burst", "jobs": jobs})
	// All: however many the runtime gave it at its start (a container's
	// CPU quota may make them fewer than the machine's), more than one.
	all := regexp.MustCompile(`gomaxprocs=([2-9]|[1-9][0-9]+)\b`)
	eventually(t, 30*time.Second, "all processors back after a bulk push", func() (bool, string) {
		return all.MatchString(srv.output()), "no gomaxprocs above 1 in the log yet"
	})
}
