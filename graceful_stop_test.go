package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestGracefulDrain: a worker (the official client) runs a 4 s job, and a
// second waits; the server gets SIGTERM 1.5 s into the first. It hands out
// nothing more, lets the first finish and its ACK land, then stops; started
// again on the same port, it hands the second out to the worker, which has
// reconnected by itself. Each job runs once. In PostgreSQL mode another
// broker of the namespace keeps serving meanwhile.
func TestGracefulDrain(t *testing.T) {
	t.Parallel()
	dir, bun := compatDir(t)
	for _, mode := range []string{"sqlite", "postgres"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			flags := storageFlags(t, mode)
			var other *serverProc
			if mode == "postgres" {
				other = startBinary(t, flags...)
			}
			srv := startBinary(t, append(flags, "--shutdown-timeout", "30000")...)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bun, "run", "drain.ts", "drain-"+mode)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), fmt.Sprintf("QUEUED_PORT=%d", srv.tcpPort))
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			lines := make(chan string, 16)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
			}()
			next := func(what string) string {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("the script ended before %s\n--- server log\n%s", what, srv.output())
					}
					return l
				case <-time.After(60 * time.Second):
					t.Fatalf("no %s within 60 s\n--- server log\n%s", what, srv.output())
				}
				return ""
			}
			first := strings.Fields(next("the first job's start"))
			time.Sleep(1500 * time.Millisecond) // the scenario: 1.5 s into the job
			stopAt := time.Now()
			srv.cmd.Process.Signal(syscall.SIGTERM)
			if other != nil {
				// The other broker serves on.
				c := dial(t, other.addr())
				c.ok(map[string]any{"cmd": "GetJobCounts", "queue": "drain-" + mode})
			}
			select {
			case <-srv.done:
			case <-time.After(30 * time.Second):
				t.Fatalf("the server did not stop within 30 s of SIGTERM\n%s", srv.output())
			}
			took := time.Since(stopAt)
			if code := srv.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(srv.output(), "drained") {
				t.Fatalf("exit %d; the log does not say it drained:\n%s", code, srv.output())
			}
			t.Logf("stopped %v after SIGTERM, once the running job finished", took.Round(10*time.Millisecond))
			restartAt := time.Now().UnixMilli()
			srv = startBinary(t, append(flags, "--tcp-port", strconv.Itoa(srv.tcpPort))...)
			second := strings.Fields(next("the second job's start"))
			if len(first) != 3 || len(second) != 3 || first[1] == second[1] {
				t.Fatalf("starts: %q, then %q", first, second)
			}
			if at, _ := strconv.ParseInt(second[2], 10, 64); at < restartAt {
				t.Fatalf("the second job started at %d, before the restart at %d", at, restartAt)
			}
			done, ok := strings.CutPrefix(next("both jobs done"), "done ")
			var runs map[string]int
			if !ok || json.Unmarshal([]byte(done), &runs) != nil {
				t.Fatalf("the script answered %q", done)
			}
			for id, n := range runs {
				if n != 1 {
					t.Fatalf("job %s ran %d times: %v", id, n, runs)
				}
			}
		})
	}
}

// TestDrainSecondSignal: a second signal ends the drain at once, with the
// job still running; the log says so.
func TestDrainSecondSignal(t *testing.T) {
	t.Parallel()
	srv := startBinary(t, "--memory", "--shutdown-timeout", "60000")
	c := dial(t, srv.addr())
	c.ok(map[string]any{"cmd": "PUSH", "queue": "held", "data": 1})
	if job := c.ok(map[string]any{"cmd": "PULL", "queue": "held", "owner": "w"})["job"]; job == nil {
		t.Fatal("nothing pulled")
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	eventually(t, 20*time.Second, "the drain under way", func() (bool, string) {
		return strings.Contains(srv.output(), "draining: waiting for running jobs"), srv.output()
	})
	// Handed out nothing more meanwhile.
	c.ok(map[string]any{"cmd": "PUSH", "queue": "held", "data": 2})
	if job := c.ok(map[string]any{"cmd": "PULL", "queue": "held", "owner": "w"})["job"]; job != nil {
		t.Fatalf("a draining server handed out %v", job)
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-srv.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("a second SIGTERM did not end the drain\n%s", srv.output())
	}
	if !strings.Contains(srv.output(), "second signal: stopping now") {
		t.Fatalf("the log does not say why it stopped:\n%s", srv.output())
	}
}
