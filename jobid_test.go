package main

import (
	"strings"
	"testing"
)

// An id reads back exactly as it was given, whichever form it is kept
// in, and only a canonical lower-case UUID is kept as 16 bytes.
func TestJobIDForms(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		id      string
		compact bool
	}{
		{newID(), true},
		{"0190f8a2-7b3c-7def-8123-456789abcdef", true},
		{"0190F8A2-7B3C-7DEF-8123-456789ABCDEF", false}, // upper case: another id
		{"00000000-0000-0000-0000-000000000000", false}, // the nil UUID marks a text id
		{"0190f8a2-7b3c-7def-8123-456789abcde", false},
		{"0190f8a27-b3c-7def-8123-456789abcdef", false},
		{"0190f8a2-7b3c-7def-8123-456789abcdeg", false},
		{"-190f8a2-7b3c-7def-8123-456789abcdef", false},
		{"0190f8a2+7b3c-7def-8123-456789abcdef", false},
		{"order-42", false},
		{"", false},
		{strings.Repeat("x", 36), false},
	} {
		j := &Job{}
		j.setID(c.id)
		if got := j.ID(); got != c.id {
			t.Fatalf("%q read back as %q", c.id, got)
		}
		if compact := j.id != [16]byte{}; compact != c.compact {
			t.Fatalf("%q: kept as 16 bytes %v, want %v", c.id, compact, c.compact)
		}
		if c.compact && j.c != nil {
			t.Fatalf("%q: a UUID id made a cold part", c.id)
		}
		if j.idLen() != len(c.id) || string(j.appendID([]byte("x"))) != "x"+c.id {
			t.Fatalf("%q: idLen %d, appendID %q", c.id, j.idLen(), j.appendID(nil))
		}
		var e, want Enc
		e.JobID(j)
		want.Str(c.id)
		if string(e.B) != string(want.B) {
			t.Fatalf("%q: JobID wrote % x, Str % x", c.id, e.B, want.B)
		}
		if !j.hasID(c.id) || j.hasID(c.id+"x") {
			t.Fatalf("%q: hasID wrong", c.id)
		}
		k := &Job{}
		k.setIDBytes([]byte(c.id))
		if k.ID() != c.id || k.id != j.id {
			t.Fatalf("%q: setIDBytes gave %q", c.id, k.ID())
		}
		// A new id replaces the old in either direction.
		j.setID("text-id")
		j.setID(c.id)
		if j.ID() != c.id {
			t.Fatalf("%q after a text id: %q", c.id, j.ID())
		}
	}
}

// The index finds a job by its id's text in either form, and tells a
// UUID from the same digits in upper case.
func TestIndexMixedIDForms(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(0, nil)
	defer b.Close()
	lower := "0190f8a2-7b3c-7def-8123-456789abcdef"
	upper := strings.ToUpper(lower)
	jobs := []*Job{withID(&Job{}, lower), withID(&Job{}, upper), withID(&Job{}, "order-42")}
	for _, j := range jobs {
		if old := b.idxPut(j); old != nil {
			t.Fatalf("put %s: held by %s", j.ID(), old.ID())
		}
	}
	for _, j := range jobs {
		if got := b.idxGet(j.ID()); got != j {
			t.Fatalf("get %s: %v", j.ID(), got)
		}
		if b.idxHolder(j) != j {
			t.Fatalf("holder of %s", j.ID())
		}
	}
	if dup := b.idxPut(withID(&Job{}, lower)); dup != jobs[0] {
		t.Fatalf("a second job with id %s was let in", lower)
	}
	b.idxDel(jobs[0])
	if b.idxGet(lower) != nil || b.idxGet(upper) != jobs[1] {
		t.Fatal("deleting the lower-case id touched the upper-case one")
	}
}

// Whatever text a client sends as an id comes back unchanged.
func FuzzJobID(f *testing.F) {
	for _, s := range []string{newID(), "order-42", "", "00000000-0000-0000-0000-000000000000", "0190F8A2-7B3C-7DEF-8123-456789ABCDEF"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		j := &Job{}
		j.setID(s)
		if j.ID() != s || !j.hasID(s) || j.idLen() != len(s) {
			t.Fatalf("%q read back as %q", s, j.ID())
		}
		k := &Job{}
		k.setIDBytes([]byte(s))
		if k.key() != j.key() {
			t.Fatalf("%q: keys differ", s)
		}
	})
}

func BenchmarkIndexGet(b *testing.B) {
	br := NewMemEngine(0, nil)
	defer br.Close()
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = newID()
		br.idxPut(withID(&Job{}, ids[i]))
	}
	b.ResetTimer()
	for i := range b.N {
		if br.idxGet(ids[i&(len(ids)-1)]) == nil {
			b.Fatal("missing")
		}
	}
}
