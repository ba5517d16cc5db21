package main

// A graceful stop. On SIGTERM or SIGINT the server drains before it
// stops: it hands out no more jobs (pulls answer empty, long polls end),
// while the workers it is talking to keep finishing theirs (ACK, FAIL,
// progress, logs and heartbeats are answered as always) and pushes are
// taken; once none of the jobs it handed out is still active, or after
// --shutdown-timeout (SHUTDOWN_TIMEOUT_MS, 30 s as in the reference), it
// stops as before, writing what is pending. A second signal stops it at
// once. The reference does the same (shutdownCoordinator.js): a restart
// then lets running jobs finish instead of running them again.

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// drainState tells the pull path that the server is draining.
type drainState struct {
	once sync.Once
	ctx  context.Context
	stop context.CancelFunc
	// polls counts the long polls hooked on ctx (pullCtx) whose stop has
	// not run: each is held by ctx until then.
	polls atomic.Int64
}

func newDrainState() *drainState {
	ctx, stop := context.WithCancel(context.Background())
	return &drainState{ctx: ctx, stop: stop}
}

// begin starts draining; long polls end.
func (d *drainState) begin() { d.once.Do(d.stop) }

// on says whether the server is draining.
func (d *drainState) on() bool { return d.ctx.Err() != nil }

// pullCtx is ctx, ended too when the drain begins.
func (d *drainState) pullCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(d.ctx, cancel)
	d.polls.Add(1)
	// Called once by its poll, on every path (cmdPull).
	return ctx, func() {
		stop()
		cancel()
		d.polls.Add(-1)
	}
}

// drainEvery is how often a drain looks at what is left, and says so.
const drainEvery = 250 * time.Millisecond

// drain waits for the jobs this broker handed out to finish, up to
// timeout, and answers how many were left.
func (s *serverRun) drain(timeout time.Duration) int {
	if timeout <= 0 {
		return s.srv.eng.HandedOut(context.Background())
	}
	again := make(chan os.Signal, 1)
	signal.Notify(again, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(again)
	s.b.drain.begin()
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(drainEvery)
	defer t.Stop()
	lastSaid := time.Time{}
	for {
		n := s.srv.eng.HandedOut(context.Background())
		if n == 0 {
			s.log.Info("drained: no job handed out is still running")
			return 0
		}
		left := time.Until(deadline)
		if left <= 0 {
			s.log.Warn("shutdown timeout: stopping with jobs still running; they wait again after the restart",
				"active", n, "timeout", timeout)
			return n
		}
		if time.Since(lastSaid) >= 5*time.Second {
			lastSaid = time.Now()
			s.log.Info("draining: waiting for running jobs to finish; no new ones handed out", "active", n,
				"left", left.Round(time.Second))
			if err := sdNotify(fmt.Sprintf("STATUS=draining: %d jobs still running, %s left", n, left.Round(time.Second))); err != nil {
				s.log.Warn("systemd status", "err", err)
			}
		}
		select {
		case sig := <-again:
			s.log.Warn("second signal: stopping now", "signal", sig.String(), "active", n)
			return n
		case <-t.C:
		}
	}
}

// HandedOut counts the active jobs: in memory and SQLite mode every active
// job was handed out by this server.
func (b *MemEngine) HandedOut(context.Context) int {
	n := 0
	for _, s := range b.shards {
		s.with(func() {
			for _, q := range s.queues {
				n += q.nActive
			}
		})
	}
	return n
}

// HandedOut counts the jobs pulled through this broker's connections and
// not yet finished through it (pg_release.go keeps them, to put back on a
// disconnect).
func (p *PG) HandedOut(context.Context) int {
	p.holds.mu.Lock()
	defer p.holds.mu.Unlock()
	return len(p.holds.m)
}
