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
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// holdGC and releaseGC bracket a recovery: the collector is held off
// between them, and the memory the recovery threw away is given back in
// the background after. Holds nest (tests recover several stores at
// once); the setting in force before the first is restored after the
// last.
var gcHolds struct {
	sync.Mutex
	n       int
	percent int
}

func holdGC() {
	gcHolds.Lock()
	defer gcHolds.Unlock()
	if gcHolds.n == 0 {
		gcHolds.percent = debug.SetGCPercent(-1)
	}
	gcHolds.n++
}

func releaseGC() {
	gcHolds.Lock()
	defer gcHolds.Unlock()
	if gcHolds.n--; gcHolds.n == 0 {
		debug.SetGCPercent(gcHolds.percent)
		go debug.FreeOSMemory()
	}
}

const (
	memReturnEvery   = 5 * time.Second
	memReturnMinFree = 64 << 20
)

type memReturn struct {
	every    time.Duration
	minFree  uint64
	activity func() int64  // grows while the broker works
	free     func() uint64 // heap memory a collection would give back
	release  func()
	stop     chan struct{}
	done     chan struct{}
}

// startMemReturn starts the loop for b; Stop ends it.
func startMemReturn(b *Broker) *memReturn {
	m := &memReturn{
		every:   memReturnEvery,
		minFree: memReturnMinFree,
		activity: func() int64 {
			return b.stats.pushed.Load() + b.stats.pulled.Load() + b.stats.completed.Load() + b.stats.failed.Load()
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
// count is still last and enough is free, and returns the count now.
func (m *memReturn) check(last int64) int64 {
	now := m.activity()
	if now == last && m.free() >= m.minFree {
		m.release()
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
// back: the heap memory held (objects, garbage among them, and free
// spans not yet returned) less what the last collection found live.
// Garbage left by a burst counts: nothing collects it while the server
// is idle, since nothing allocates.
func heapReclaimable() uint64 {
	s := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(s)
	var v [4]uint64
	for i := range s {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		v[i] = s[i].Value.Uint64()
	}
	held, live := v[0]+v[1]+v[2], v[3]
	if held < live {
		return 0
	}
	return held - live
}
