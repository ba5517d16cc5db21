package main

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"unsafe"
)

// TestJobTableAgreesWithMap drives a jobTable and a map with the same
// random puts, gets and deletes and requires the same answers. Tags are
// drawn from a few values, so that long runs of collisions, wrap-around
// at the table's end and the shifting of entries after a deletion are
// what the table mostly does.
func TestJobTableAgreesWithMap(t *testing.T) {
	t.Parallel() // pure computation: it needs only a core
	for _, tags := range []uint32{1, 3, 17, 1 << 20} {
		rng := rand.New(rand.NewPCG(uint64(tags), 7))
		var tb jobTable
		want := map[string]*Job{}
		tagOf := func(id string) uint32 { return uint32(fnv1a(id))%tags + 1 }
		jobs := make([]*Job, 1000)
		for i := range jobs {
			jobs[i] = withID(&Job{}, "id-"+strconv.Itoa(i))
		}
		for step := 0; step < 40000; step++ {
			j := jobs[rng.IntN(len(jobs))]
			tag := tagOf(j.ID())
			switch rng.IntN(3) {
			case 0:
				old := tb.put(j, j.key(), tag)
				if w := want[j.ID()]; old != w {
					t.Fatalf("tags %d step %d: put %s returned %p, want %p", tags, step, j.ID(), old, w)
				}
				if want[j.ID()] == nil {
					want[j.ID()] = j
				}
			case 1:
				if got := tb.get(j.key(), tag); got != want[j.ID()] {
					t.Fatalf("tags %d step %d: get %s = %p, want %p", tags, step, j.ID(), got, want[j.ID()])
				}
			case 2:
				// A different job with the same id must not remove it.
				if rng.IntN(4) == 0 {
					tb.del(withID(&Job{}, j.ID()), tag)
				} else {
					tb.del(j, tag)
					delete(want, j.ID())
				}
			}
			if tb.n != len(want) {
				t.Fatalf("tags %d step %d: %d entries, want %d", tags, step, tb.n, len(want))
			}
		}
		for id, j := range want {
			if got := tb.get(keyOf(id), tagOf(id)); got != j {
				t.Fatalf("tags %d: %s lost at the end", tags, id)
			}
		}
	}
}

// TestJobTableGrowsAndShrinks: a table filled with a hundred thousand
// jobs finds each, and emptied again gives most of its slots back.
func TestJobTableGrowsAndShrinks(t *testing.T) {
	t.Parallel()
	var tb jobTable
	jobs := make([]*Job, 100000)
	for i := range jobs {
		jobs[i] = withID(&Job{}, newID())
		_, tag := idxHash(jobs[i].key())
		if old := tb.put(jobs[i], jobs[i].key(), tag); old != nil {
			t.Fatalf("put %d found %s", i, old.ID())
		}
	}
	if tb.n*4 > len(tb.tags)*3 || tb.n*8 < len(tb.tags)*3 {
		t.Fatalf("%d entries in %d slots: load outside 3/8..3/4", tb.n, len(tb.tags))
	}
	for _, j := range jobs {
		_, tag := idxHash(j.key())
		if tb.get(j.key(), tag) != j {
			t.Fatalf("%s not found", j.ID())
		}
	}
	big := len(tb.tags)
	for _, j := range jobs[:99000] {
		_, tag := idxHash(j.key())
		tb.del(j, tag)
	}
	if len(tb.tags) >= big/8 {
		t.Fatalf("after emptying, %d slots of %d remain for %d entries", len(tb.tags), big, tb.n)
	}
	for _, j := range jobs[99000:] {
		_, tag := idxHash(j.key())
		if tb.get(j.key(), tag) != j {
			t.Fatalf("%s lost by the shrink", j.ID())
		}
	}
	var r jobTable
	r.reserve(1000)
	size := len(r.tags)
	for i := 0; i < 1000; i++ {
		j := withID(&Job{}, strconv.Itoa(i))
		_, tag := idxHash(j.key())
		r.put(j, j.key(), tag)
	}
	if len(r.tags) != size {
		t.Fatalf("a table reserved for 1000 grew from %d to %d slots", size, len(r.tags))
	}
}

// TestIdxPartSize: a partition is one cache line.
func TestIdxPartSize(t *testing.T) {
	t.Parallel()
	if n := unsafe.Sizeof(idxPart{}); n != 64 {
		t.Fatalf("an index partition is %d bytes, want 64", n)
	}
}

// BenchmarkIndex looks up and replaces jobs in an index of a million,
// through the broker's index and, for comparison, a map of the kind it
// replaced (go test -run '^$' -bench Index).
func BenchmarkIndex(b *testing.B) {
	const n = 1000000
	jobs := make([]*Job, n)
	for i := range jobs {
		jobs[i] = withID(&Job{}, newID())
	}
	b.Run("index", func(b *testing.B) {
		br := &MemEngine{}
		for _, j := range jobs {
			br.idxPut(j)
		}
		b.ResetTimer()
		for i := range b.N {
			j := jobs[(i*7919)%n]
			if br.idxGet(j.ID()) != j {
				b.Fatal("lost")
			}
			br.idxDel(j)
			br.idxPut(j)
		}
	})
	b.Run("map", func(b *testing.B) {
		var parts [idxParts]struct {
			mu sync.Mutex
			m  map[string]*Job
		}
		for i := range parts {
			parts[i].m = map[string]*Job{}
		}
		part := func(id string) int { return int(fnv1a(id) & (idxParts - 1)) }
		for _, j := range jobs {
			parts[part(j.ID())].m[j.ID()] = j
		}
		b.ResetTimer()
		for i := range b.N {
			j := jobs[(i*7919)%n]
			p := &parts[part(j.ID())]
			p.mu.Lock()
			if p.m[j.ID()] != j {
				b.Fatal("lost")
			}
			p.mu.Unlock()
			p.mu.Lock()
			delete(p.m, j.ID())
			p.mu.Unlock()
			p.mu.Lock()
			p.m[j.ID()] = j
			p.mu.Unlock()
		}
	})
}
