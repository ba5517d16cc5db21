package main

// The throughput history behind the dashboard: a loop samples the
// broker's lifetime counters (pushed, pulled, completed, failed) every
// rateEvery into a fixed ring holding the last ten minutes, so that a page
// opened under load draws ten minutes of rates at once, and the rates the
// overview reports are those of the last interval rather than a figure
// smoothed over however often someone happened to ask.
//
// The counters are this broker's: in PostgreSQL mode each broker samples
// what it handled itself (as its latency histograms do), and the sum over
// brokers is Prometheus' job.

import (
	"math"
	"strconv"
	"sync"
	"time"
)

const (
	rateEvery = 5 * time.Second
	// rateSlots intervals of rateEvery: ten minutes. The ring holds one
	// sample more, the start of the oldest interval.
	rateSlots = 120
)

// rateSample is the counters at one moment.
type rateSample struct {
	at int64    // ms, by the history's clock
	n  [4]int64 // pushed, pulled, completed, failed
}

// rateHistory is the ring and the loop that fills it. Its memory is fixed:
// rateSlots+1 samples, whatever the load or the uptime.
type rateHistory struct {
	read func() [4]int64 // the counters, read at each sample

	mu    sync.Mutex
	ring  [rateSlots + 1]rateSample
	head  int       // where the next sample goes
	n     int       // samples held, at most len(ring)
	taken time.Time // when the newest was taken, by the monotonic clock

	// The loop: its clock and period are set before it starts and only
	// changed while it is stopped (restart), so the loop reads them
	// without a lock.
	lmu   sync.Mutex
	now   func() int64
	every time.Duration
	stop  chan struct{}
	done  chan struct{}
}

func newRateHistory(read func() [4]int64) *rateHistory {
	return &rateHistory{read: read, now: nowMs, every: rateEvery}
}

// start runs the sampling loop until close.
func (h *rateHistory) start() {
	h.lmu.Lock()
	defer h.lmu.Unlock()
	if h.stop != nil {
		return
	}
	h.stop, h.done = make(chan struct{}), make(chan struct{})
	go h.loop(h.now, h.every, h.stop, h.done)
}

func (h *rateHistory) loop(now func() int64, every time.Duration, stop, done chan struct{}) {
	defer close(done)
	// The first sample at once: the first interval ends one period later.
	h.record(now())
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			h.record(now())
		}
	}
}

// close stops the loop and waits for it to end. It is safe to call more
// than once.
func (h *rateHistory) close() {
	h.lmu.Lock()
	defer h.lmu.Unlock()
	if h.stop == nil {
		return
	}
	close(h.stop)
	<-h.done
	h.stop, h.done = nil, nil
}

// restart empties the ring and runs the loop again with another clock and
// period; tests use it to fill ten minutes of history without waiting ten
// minutes.
func (h *rateHistory) restart(every time.Duration, now func() int64) {
	h.close()
	h.mu.Lock()
	h.head, h.n = 0, 0
	h.mu.Unlock()
	h.lmu.Lock()
	h.every, h.now = every, now
	h.lmu.Unlock()
	h.start()
}

// record adds a sample of the counters taken at at. A clock that stepped
// back makes the rates across the step meaningless: the ring starts over.
func (h *rateHistory) record(at int64) {
	cur := h.read()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n > 0 {
		last := h.ring[(h.head+len(h.ring)-1)%len(h.ring)]
		if at == last.at {
			return
		}
		if at < last.at {
			h.head, h.n = 0, 0
		}
	}
	h.ring[h.head] = rateSample{at: at, n: cur}
	h.taken = time.Now()
	h.head = (h.head + 1) % len(h.ring)
	h.n = min(h.n+1, len(h.ring))
}

// rateOf is the per-second rate of each counter between two samples.
func rateOf(a, b rateSample) [4]float64 {
	var r [4]float64
	dt := float64(b.at-a.at) / 1000
	if dt <= 0 {
		return r
	}
	for i := range r {
		// The counters only grow; a negative difference would be a bug,
		// not a rate.
		r[i] = float64(max(b.n[i]-a.n[i], 0)) / dt
	}
	return r
}

// current is the rates of the last interval, rounded to hundredths; zero
// until the loop has taken two samples.
func (h *rateHistory) current() [4]float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out [4]float64
	if h.n < 2 {
		return out
	}
	l := len(h.ring)
	r := rateOf(h.ring[(h.head+l-2)%l], h.ring[(h.head+l-1)%l])
	for i := range out {
		out[i] = round2(r[i])
	}
	return out
}

// rateSeries is the history, oldest interval first: each interval's end
// and the rates over it.
type rateSeries struct {
	now    int64 // the history's clock when read
	at     []int64
	series [4][]float64
}

func (h *rateHistory) series() rateSeries {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return rateSeries{now: nowMs()}
	}
	l := len(h.ring)
	// Now by the history's clock: the newest sample's time and what has
	// passed since it was taken. Only the loop reads the clock.
	s := rateSeries{now: h.ring[(h.head+l-1)%l].at + time.Since(h.taken).Milliseconds()}
	if h.n < 2 {
		return s
	}
	first := (h.head + l - h.n) % l
	s.at = make([]int64, 0, h.n-1)
	for i := range s.series {
		s.series[i] = make([]float64, 0, h.n-1)
	}
	for k := 1; k < h.n; k++ {
		a, b := h.ring[(first+k-1)%l], h.ring[(first+k)%l]
		s.at = append(s.at, b.at)
		r := rateOf(a, b)
		for i := range r {
			s.series[i] = append(s.series[i], round2(r[i]))
		}
	}
	return s
}

// json renders the history for GET /dashboard: the clock now, each
// interval's end (ms) and the per-second rates over it, column by column.
func (s rateSeries) json() []byte {
	o := jsonObj{}
	o.open()
	o.int("now", s.now)
	at := []byte{'['}
	for i, t := range s.at {
		if i > 0 {
			at = append(at, ',')
		}
		at = strconv.AppendInt(at, t, 10)
	}
	o.json("at", append(at, ']'))
	for i, k := range []string{"pushPerSec", "pullPerSec", "completePerSec", "failPerSec"} {
		col := []byte{'['}
		for j, v := range s.series[i] {
			if j > 0 {
				col = append(col, ',')
			}
			col = appendJSONNumber(col, v)
		}
		o.json(k, append(col, ']'))
	}
	return o.close()
}

// rates turns the push and pull counters into per-second rates over the
// time since the last call, as the reference's Stats does: Stats' own
// smoothed rates, apart from the history above.
type rates struct {
	mu                 sync.Mutex
	at                 int64
	pushed, pulled     int64
	pushRate, pullRate float64
}

func (r *rates) sample(now, pushed, pulled int64) (float64, float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at != 0 && now > r.at {
		dt := float64(now-r.at) / 1000
		r.pushRate = 0.3*float64(pushed-r.pushed)/dt + 0.7*r.pushRate
		r.pullRate = 0.3*float64(pulled-r.pulled)/dt + 0.7*r.pullRate
	}
	r.at, r.pushed, r.pulled = now, pushed, pulled
	return round2(r.pushRate), round2(r.pullRate)
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

var statRates rates
