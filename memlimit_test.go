//go:build linux

package main

// The memory budget for jobs (memlimit.go): pushes refused past it while
// the rest goes on, accepted again once workers made room, and a data
// file that needs more refused at start.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The budget's decisions, without a process: pushes go in until the
// estimate reaches memHigh, are refused (naming the budget) until it is
// under memLow, and a file's jobs are weighed at start.
func TestMemLimitDecides(t *testing.T) {
	t.Parallel()
	var m *memLimit
	if err := m.admit(1 << 40); err != nil {
		t.Fatalf("no budget refused a push: %v", err)
	}
	m = newMemLimit(100<<20, true, nil)
	m.live.Store(10 << 20)
	if err := m.admit(60 << 20); err != nil {
		t.Fatalf("a push under the budget: %v", err)
	}
	if err := m.admit(11 << 20); err != nil {
		t.Fatalf("the push that reaches the budget is taken: %v", err)
	}
	err := m.admit(1)
	if err == nil || !strings.Contains(err.Error(), "100 MiB") || !strings.Contains(err.Error(), "--max-memory") {
		t.Fatalf("past the budget: %v, want a refusal naming --max-memory and 100 MiB", err)
	}
	if m.refused.Load() != 1 || m.spells.Load() != 1 {
		t.Fatalf("refused %d, spells %d", m.refused.Load(), m.spells.Load())
	}
	// A collection found 75 MiB live: still over memLow, still refused.
	m.live.Store(75 << 20)
	m.admitted.Store(0)
	m.decide()
	if m.admit(1) == nil {
		t.Fatal("accepted again above memLow")
	}
	m.live.Store(60 << 20)
	m.decide()
	if err := m.admit(1); err != nil {
		t.Fatalf("under memLow: %v", err)
	}
	if err := m.fitsAtStart(1000, 50<<20); err != nil {
		t.Fatalf("a file that fits: %v", err)
	}
	err = m.fitsAtStart(100000, 200<<20)
	if err == nil || !strings.Contains(err.Error(), "100000 jobs") || !strings.Contains(err.Error(), "--max-memory") {
		t.Fatalf("a file that does not fit: %v", err)
	}
}

// maxMemoryRSSBound is what the process may reach with --max-memory 512MiB.
const maxMemoryRSSBound = 600 * mib

// With --max-memory 512MiB, a producer pushing as fast as it can while a
// slower worker drains: the server's resident memory stays under the
// bound, refused pushes say why, a restart in the middle loads what was
// stored within the same bound, the worker drains to empty, and pushes
// are accepted again.
//
// Serial: its bound is a server's peak resident memory, which a busy machine raises.
func TestMaxMemoryRefusesPushes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queued.db")
	flags := []string{"--data-path", path, "--max-memory", "512MiB"}
	srv := startBinary(t, flags...)
	rss := watchRSS(t, srv.cmd.Process.Pid)
	c := dial(t, srv.addr())
	data := strings.Repeat("x", 32<<10)
	batch := make([]any, 20)
	for i := range batch {
		batch[i] = M{"name": "j", "data": data, "removeOnComplete": true}
	}
	pushb := func(c *tclient) (ok bool, err error) {
		a := c.call(M{"cmd": "PUSHB", "queue": "mem", "jobs": batch})
		if a["ok"] == true {
			return true, nil
		}
		msg, _ := a["error"].(string)
		if !strings.Contains(msg, "--max-memory") || !strings.Contains(msg, "512 MiB") {
			return false, fmt.Errorf("push refused with %q, want the memory budget named", msg)
		}
		return false, nil
	}
	// A worker far slower than the producer.
	var worked atomic.Int64
	stopWork := make(chan struct{})
	var wg sync.WaitGroup
	work := func(addr string, pause time.Duration) {
		defer wg.Done()
		w := dial(t, addr)
		for {
			select {
			case <-stopWork:
				return
			case <-time.After(pause):
			}
			a := w.call(M{"cmd": "PULLB", "queue": "mem", "count": 20, "owner": "w"})
			jobs, _ := a["jobs"].([]any)
			if len(jobs) == 0 {
				continue
			}
			ids := make([]any, len(jobs))
			for i, j := range jobs {
				ids[i] = j.(map[string]any)["id"]
			}
			w.ok(M{"cmd": "ACKB", "ids": ids, "tokens": a["tokens"]})
			worked.Add(int64(len(jobs)))
		}
	}
	// The worker starts at the first refusal: on a loaded machine a
	// producer slowed to the disk's pace was no faster than the worker, and
	// the budget was never reached (CI, once).
	var accepted, refused int
	deadline := time.Now().Add(3 * time.Minute)
	for refused < 50 {
		ok, err := pushb(c)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			accepted++
		} else {
			if refused == 0 {
				wg.Add(1)
				go work(srv.addr(), 20*time.Millisecond)
			}
			refused++
		}
		if time.Now().After(deadline) {
			t.Fatalf("no push refused within 3 minutes: %d batches of 20 jobs of 32 KiB accepted", accepted)
		}
	}
	close(stopWork)
	wg.Wait()
	counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "mem"}), "counts")
	stored := int(num(t, counts["waiting"]) + num(t, counts["active"]))
	peak := rss.end()
	t.Logf("--max-memory 512MiB: %d batches accepted, %d refused, %d jobs worked meanwhile, %d left; peak resident %.0f MiB",
		accepted, refused, worked.Load(), stored, float64(peak)/mib)
	if peak > maxMemoryRSSBound {
		t.Errorf("peak resident memory %.0f MiB, over %d MiB", float64(peak)/mib, maxMemoryRSSBound/mib)
	}
	if !strings.Contains(srv.output(), "memory budget reached") {
		t.Errorf("the server did not log that pushes are refused:\n%.2000s", srv.output())
	}

	// A restart in the middle loads what was stored, within the bound.
	srv.stop(t)
	srv = startBinary(t, flags...)
	_, hwm := procMem(t, srv.cmd.Process.Pid)
	c = dial(t, srv.addr())
	counts = sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "mem"}), "counts")
	if got := int(num(t, counts["waiting"])); got != stored {
		t.Errorf("after the restart %d jobs waiting, want the %d stored", got, stored)
	}
	t.Logf("restarted with %d jobs: peak resident %.0f MiB", stored, float64(hwm)/mib)
	if hwm > maxMemoryRSSBound {
		t.Errorf("the restart peaked at %.0f MiB resident, over %d MiB", float64(hwm)/mib, maxMemoryRSSBound/mib)
	}

	// The worker drains it all; pushes are taken again.
	stopWork = make(chan struct{})
	wg.Add(1)
	go work(srv.addr(), 0)
	eventually(t, 120*time.Second, "the worker drains the queue", func() (bool, string) {
		counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "mem"}), "counts")
		return num(t, counts["waiting"])+num(t, counts["active"]) == 0, fmt.Sprint(counts)
	})
	close(stopWork)
	wg.Wait()
	eventually(t, 60*time.Second, "pushes accepted again", func() (bool, string) {
		ok, err := pushb(c)
		if err != nil {
			t.Fatal(err)
		}
		return ok, "still refused"
	})

}

// A data file whose jobs need more than --max-memory is refused at start,
// saying how much it needs, rather than loaded until the OOM killer ends
// the process.
//
// Serial: its bound is a server's peak resident memory, which a busy machine raises.
func TestMaxMemoryRefusesLargeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queued.db")
	srv := startBinary(t, "--data-path", path)
	c := dial(t, srv.addr())
	data := strings.Repeat("x", 256<<10)
	for range 20 {
		jobs := make([]any, 20)
		for i := range jobs {
			jobs[i] = M{"name": "j", "data": data}
		}
		c.ok(M{"cmd": "PUSHB", "queue": "big", "jobs": jobs})
	}
	srv.stop(t)
	// 400 jobs of 256 KiB: about 100 MiB.
	out, code := runBinaryOnce(t, queuedBinary(t), "--data-path", path, "--max-memory", "64MiB", "--host", "127.0.0.1", "--tcp-port", "0", "--http-port", "0")
	if code == 0 || !strings.Contains(out, "400 jobs") || !strings.Contains(out, "--max-memory") {
		t.Fatalf("start with a file too big for --max-memory 64MiB: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the data file: %v", err)
	}
}

// runBinaryOnce runs `queued serve args...` until it exits (within a
// minute) and answers its output and exit status.
func runBinaryOnce(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"serve"}, args...)...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("queued serve: %v\n%s", err, out)
	return "", 0
}

// updateFloodBytes is the binary data each Update of the flood sets.
const updateFloodBytes = 9_900_000

// maxMemoryUpdatesRSSBound is what the process may reach with
// --max-memory 256MiB while Updates are refused.
const maxMemoryUpdatesRSSBound = 600 * mib

// With --max-memory 256MiB, 150 Updates of small jobs to 9.9 MB of binary
// data: they are let in until the estimate reaches 80% of the budget and
// refused from there, naming the budget, the process staying under 600
// MiB resident; pulls, ACKs and reads go on meanwhile. Before, all 150
// were accepted: 1.49 GB of job data, 1,448 MiB resident. In PostgreSQL
// mode the data goes to the database: 30 Updates are taken while the
// process's own heap is under the mark, and it stays under the bound.
//
// Serial: its bound is a server's peak resident memory, which a busy machine raises.
func TestMaxMemoryRefusesUpdates(t *testing.T) {
	for _, mode := range []string{"memory", "sqlite", "postgres"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			flags := []string{"--max-memory", "256MiB"}
			switch mode {
			case "memory":
				flags = append(flags, "--memory")
			case "sqlite":
				flags = append(flags, "--data-path", filepath.Join(t.TempDir(), "queued.db"))
			case "postgres":
				flags = append(flags, "--postgres-url", testPGURL(), "--postgres-namespace", pgTestNamespace(t))
			}
			srv := startBinary(t, flags...)
			c := dial(t, srv.addr())
			// 60 of 9.9 MB: more than twice the budget.
			n := 60
			if mode == "postgres" {
				// Each Update is a 9.9 MB row written (76 s for 150 on the
				// 2-core machine); 30 pass 297 MB through the process.
				n = 30
			}
			ids := make([]string, n)
			for i := range ids {
				ids[i] = push(t, c, "upd", nil)
			}
			data := make([]byte, updateFloodBytes)
			accepted, refused := 0, 0
			for _, id := range ids {
				a := c.call(M{"cmd": "Update", "id": id, "data": data})
				if a["ok"] == true {
					accepted++
					continue
				}
				msg, _ := a["error"].(string)
				if !strings.Contains(msg, "--max-memory") || !strings.Contains(msg, "256 MiB (268435456 bytes)") {
					t.Fatalf("Update %d refused with %q, want the memory budget named", accepted+refused, msg)
				}
				refused++
			}
			_, peak := procMem(t, srv.cmd.Process.Pid)
			if mode == "postgres" {
				t.Logf("postgres mode, --max-memory 256MiB: %d Updates to %d bytes accepted, %d refused; peak resident %.0f MiB",
					accepted, updateFloodBytes, refused, float64(peak)/mib)
				if peak > maxMemoryUpdatesRSSBound {
					t.Errorf("peak resident memory %.0f MiB, over %d MiB", float64(peak)/mib, maxMemoryUpdatesRSSBound/mib)
				}
				return
			}
			from := regexp.MustCompile(`memory budget reached.*live_heap_mb=(\d+)`).FindStringSubmatch(srv.output())
			if from == nil {
				t.Fatalf("the server did not log that it refuses:\n%.2000s", srv.output())
			}
			t.Logf("%s mode, --max-memory 256MiB: %d Updates to %d bytes accepted (%.0f MB of data), %d refused, from an estimated live heap of %s MiB (80%%: %d MiB); peak resident %.0f MiB",
				mode, accepted, updateFloodBytes, float64(accepted*updateFloodBytes)/1e6, refused, from[1], (256<<20)/100*memHigh>>20, float64(peak)/mib)
			if refused == 0 || int64(accepted)*updateFloodBytes > 256<<20 {
				t.Errorf("%d Updates of %d bytes accepted under a 256 MiB budget, %d refused", accepted, updateFloodBytes, refused)
			}
			if peak > maxMemoryUpdatesRSSBound {
				t.Errorf("peak resident memory %.0f MiB, over %d MiB", float64(peak)/mib, maxMemoryUpdatesRSSBound/mib)
			}
			// Pulls, ACKs and reads go on while Updates are refused.
			id, tok := pullOwned(t, c, "upd", M{"timeout": 0})
			c.ok(M{"cmd": "ACK", "id": id, "token": tok, "removeOnComplete": true})
			if st := state(t, c, ids[len(ids)-1]); st != "waiting" {
				t.Errorf("a job left waiting reads as %s", st)
			}
		})
	}
}
