package main

// Giving memory back when the broker goes quiet.
//
// The Go collector lets the heap grow to twice what is live before it
// collects, and returns freed memory to the system only down to that
// goal. A server that took a million jobs in a burst and now holds them
// waiting keeps the burst's garbage room, some hundreds of megabytes it
// no longer needs, for as long as it is idle. So once nothing has
// happened for a while and the heap holds enough that a collection would
// free, it is collected and the free memory returned. Under load this never runs
// (there is activity), and after it has run there is nothing free left
// to return until the broker is busy again.

import (
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"
)

// holdGC and releaseGC bracket a recovery: the collector is held off
// between them, and the memory the recovery threw away is given back in
// the background after. Holds nest (tests recover several stores at
// once); the settings in force before the first are restored after the
// last.
//
// Held off is not unbounded: the driver copies every row it reads, so a
// recovery's garbage is about the size of the tables. Unless GOMEMLIMIT
// already bounds the process, a soft limit of three quarters of the
// memory available stands for the hold, and the collector runs if the
// heap reaches it; where that cannot be read, the collector is only
// slowed (GOGC 400), not stopped.
var gcHolds struct {
	sync.Mutex
	n       int
	percent int
	limit   int64
}

func holdGC() {
	gcHolds.Lock()
	defer gcHolds.Unlock()
	if gcHolds.n++; gcHolds.n > 1 {
		return
	}
	gcHolds.limit = debug.SetMemoryLimit(-1)
	if gcHolds.limit != math.MaxInt64 {
		gcHolds.percent = debug.SetGCPercent(-1)
		return
	}
	if avail := availableMemory(); avail > 0 {
		debug.SetMemoryLimit(int64(runtimeTotalBytes()) + avail/4*3)
		gcHolds.percent = debug.SetGCPercent(-1)
		return
	}
	gcHolds.percent = debug.SetGCPercent(400)
}

func releaseGC() {
	gcHolds.Lock()
	defer gcHolds.Unlock()
	if gcHolds.n--; gcHolds.n == 0 {
		debug.SetGCPercent(gcHolds.percent)
		debug.SetMemoryLimit(gcHolds.limit)
		go debug.FreeOSMemory()
	}
}

// availableMemory is what the system (or the cgroup the process runs
// in, when it is smaller) can still give, in bytes; 0 when unknown.
func availableMemory() int64 {
	var avail int64
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				avail = kb << 10
			}
		}
	}
	max, err1 := os.ReadFile("/sys/fs/cgroup/memory.max")
	cur, err2 := os.ReadFile("/sys/fs/cgroup/memory.current")
	if err1 == nil && err2 == nil {
		m, errm := strconv.ParseInt(strings.TrimSpace(string(max)), 10, 64) // "max" when unlimited
		c, errc := strconv.ParseInt(strings.TrimSpace(string(cur)), 10, 64)
		if errm == nil && errc == nil && m > c && (avail == 0 || m-c < avail) {
			avail = m - c
		}
	}
	return avail
}

// runtimeTotalBytes is the memory the Go runtime has mapped, what a
// memory limit is measured against.
func runtimeTotalBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

const (
	memReturnEvery   = 5 * time.Second
	memReturnMinFree = 64 << 20
)

type memReturn struct {
	every    time.Duration
	minFree  uint64
	activity func() int64  // grows while the server works
	free     func() uint64 // heap memory a collection would give back
	release  func()
	stop     chan struct{}
	done     chan struct{}
	released bool // in this quiet spell: once is enough
}

// startMemReturn starts the loop for the server; Stop ends it. Activity
// is any request (TCP or HTTP) and any job changing hands, so that a
// server busy with reads or the dashboard is not collected every few
// seconds as if idle.
func startMemReturn(srv *Server) *memReturn {
	b := srv.b
	m := &memReturn{
		every:   memReturnEvery,
		minFree: memReturnMinFree,
		activity: func() int64 {
			return srv.frames.Load() + b.stats.pushed.Load() + b.stats.pulled.Load() +
				b.stats.completed.Load() + b.stats.failed.Load()
		},
		free:    heapReclaimable,
		release: debug.FreeOSMemory,
	}
	m.start()
	return m
}

func (m *memReturn) start() {
	m.stop, m.done = make(chan struct{}), make(chan struct{})
	go m.run()
}

func (m *memReturn) run() {
	defer close(m.done)
	t := time.NewTicker(m.every)
	defer t.Stop()
	last := m.activity()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		last = m.check(last)
	}
}

// check runs at each interval: it gives memory back when the activity
// count is still last and enough is free, once per quiet spell (what a
// collection cannot give back, fragmentation in spans still in use,
// would otherwise bring a collection every interval), and returns the
// count now.
func (m *memReturn) check(last int64) int64 {
	now := m.activity()
	if now != last {
		m.released = false
		return now
	}
	if !m.released && m.free() >= m.minFree {
		m.release()
		m.released = true
	}
	return now
}

// Stop ends the loop and waits for it.
func (m *memReturn) Stop() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
}

// heapReclaimable estimates what a collection and a release would give
// back: free spans not yet returned, and the objects the last collection
// did not find live (garbage left by a burst counts: nothing collects it
// while the server is idle, since nothing allocates). Free room inside
// spans still in use does not count: no collection gives it back.
func heapReclaimable() uint64 {
	s := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(s)
	var v [3]uint64
	for i := range s {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		v[i] = s[i].Value.Uint64()
	}
	objects, free, live := v[0], v[1], v[2]
	if objects > live {
		free += objects - live
	}
	return free
}
