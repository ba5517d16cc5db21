package main

import (
	"bytes"
	"reflect"
	"slices"
	"testing"
	"unsafe"
)

// TestReadCopyHasEveryField: the copy a reader gets (Job.readCopy) has
// every wire field of the job, its state and its failure, and none of the
// slices that may change in place is shared. A field added to Job and not
// to readCopy fails here.
func TestReadCopyHasEveryField(t *testing.T) {
	t.Parallel()
	j := &Job{state: StateFailed}
	j.warm().failErr, j.warm().hasFail = "boom", true
	fill := func(v reflect.Value) {
		for i := 0; i < v.NumField(); i++ {
			f, sf := v.Field(i), v.Type().Field(i)
			if !sf.IsExported() {
				continue
			}
			switch f.Kind() {
			case reflect.String:
				f.SetString("s" + sf.Name)
			case reflect.Int64, reflect.Int32:
				f.SetInt(int64(i + 1))
			case reflect.Bool:
				f.SetBool(true)
			case reflect.Pointer:
				f.Set(reflect.New(sf.Type.Elem()))
			case reflect.Slice:
				f.Set(reflect.MakeSlice(sf.Type, 2, 2))
			default:
				t.Fatalf("field %s: kind %s not filled by this test", sf.Name, f.Kind())
			}
		}
	}
	fill(reflect.ValueOf(j).Elem())
	fill(reflect.ValueOf(j.c).Elem())
	j.setID("a text id") // kept in the cold part
	// The run part's wire fields; its claim (lease, owner) is the job's own.
	j.rt = &jobRun{startedAt: 11, doneAt: 12, heartbeat: 13, timeline: make([]TimelineEntry, 2),
		lease: &Lease{Token: "t"}, owner: &conn{}, deadline: 14}
	c := j.readCopy()
	if c.ID() != j.ID() || c.StartedAt() != 11 || c.DoneAt() != 12 || c.Heartbeat() != 13 || len(c.Timeline()) != 2 {
		t.Errorf("id or run part not copied: %q %+v", c.ID(), c.run())
	}
	if c.run().lease != nil || c.run().owner != nil {
		t.Error("the claim went with the copy")
	}
	// A field added to jobRun is one more to think about here.
	if n := reflect.TypeOf(jobRun{}).NumField(); n != 7 {
		t.Errorf("jobRun has %d fields; readCopy copies the wire ones (4 of 7 when this was written)", n)
	}
	same := func(v, cv reflect.Value) {
		for i := 0; i < v.NumField(); i++ {
			sf := v.Type().Field(i)
			if !sf.IsExported() {
				continue
			}
			if !reflect.DeepEqual(v.Field(i).Interface(), cv.Field(i).Interface()) {
				t.Errorf("field %s not copied", sf.Name)
			}
		}
	}
	same(reflect.ValueOf(j).Elem(), reflect.ValueOf(c).Elem())
	if c.c == j.c {
		t.Fatal("the cold fields are shared with the job")
	}
	same(reflect.ValueOf(j.c).Elem(), reflect.ValueOf(c.c).Elem())
	if c.state != j.state || c.cold().failErr != j.cold().failErr || c.cold().hasFail != j.cold().hasFail {
		t.Error("state or failure not copied")
	}
	for name, pair := range map[string][2]any{
		"DependsOn": {&j.cold().DependsOn[0], &c.cold().DependsOn[0]}, "Children": {&j.cold().Children[0], &c.cold().Children[0]},
		"Tags": {&j.cold().Tags[0], &c.cold().Tags[0]}, "Stack": {&j.cold().Stack[0], &c.cold().Stack[0]},
		"Timeline": {&j.Timeline()[0], &c.Timeline()[0]},
	} {
		if pair[0] == pair[1] {
			t.Errorf("%s shared with the job", name)
		}
	}
}

// TestColdIsDefaultCoversEveryField: isDefault looks at every field of
// jobCold, so that a job whose only unusual setting is in a field added
// later keeps it (settle would drop it otherwise).
func TestColdIsDefaultCoversEveryField(t *testing.T) {
	t.Parallel()
	if !noCold.isDefault() {
		t.Fatal("noCold is not the default")
	}
	typ := reflect.TypeOf(jobCold{})
	for i := 0; i < typ.NumField(); i++ {
		c := noCold
		f := reflect.ValueOf(&c).Elem().Field(i)
		f = reflect.NewAt(f.Type(), f.Addr().UnsafePointer()).Elem() // unexported fields too
		switch f.Kind() {
		case reflect.String:
			f.SetString("x")
		case reflect.Int64, reflect.Int32:
			f.SetInt(f.Int() + 1)
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 0, 0))
		default:
			t.Fatalf("field %s: kind %s not covered by this test", typ.Field(i).Name, f.Kind())
		}
		if c.isDefault() {
			t.Errorf("isDefault ignores %s", typ.Field(i).Name)
		}
	}
}

// TestPlainJobHasNoColdPart: a job pushed with no rare option carries no
// cold part, after a push and after a round trip through its record.
func TestPlainJobHasNoColdPart(t *testing.T) {
	t.Parallel()
	j := mustJob(t, "q", map[string]any{"name": "n", "data": map[string]any{"a": 1}})
	if j.c != nil {
		t.Fatalf("a plain job has a cold part: %+v", *j.c)
	}
	var e Enc
	encodeRecord(&e, j)
	d, err := decodeRecord(e.B)
	if err != nil {
		t.Fatal(err)
	}
	if d.c != nil {
		t.Fatalf("a plain job read from its record has a cold part: %+v", *d.c)
	}
	withTags := mustJob(t, "q", map[string]any{"name": "n", "data": 1, "tags": []any{"t"}})
	if withTags.c == nil || len(withTags.cold().Tags) != 1 {
		t.Fatal("a job with tags lost them")
	}
}

// TestJobSize: a Job fits the 208-byte size class; a field added to it
// costs every job 16 bytes more (the next class is 224), so it belongs
// in jobCold (or jobRun, for a claimed job's) unless most jobs set it.
func TestJobSize(t *testing.T) {
	t.Parallel()
	if n := unsafe.Sizeof(Job{}); n > 160 {
		t.Errorf("a Job is %d bytes, over its 160-byte size class", n)
	}
}

// TestCompletedPlainJobHasNoColdPart: a plain job pulled and completed
// still has no cold part. Completing one used to clear a failure flag
// through warm(), which gave every completed job some 400 bytes of
// defaults for as long as it was kept.
func TestCompletedPlainJobHasNoColdPart(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	ids := completeAll(t, b, "q", 10)
	for _, id := range ids {
		j := b.idxGet(id)
		if j == nil || j.state != StateCompleted {
			t.Fatalf("job %s is not kept as completed: %+v", id, j)
		}
		if j.c != nil {
			t.Fatalf("a completed plain job has a cold part: %+v", *j.c)
		}
	}
}

// TestTimelineEntrySize: every job has at least one entry, so its size
// is a waiting job's.
func TestTimelineEntrySize(t *testing.T) {
	t.Parallel()
	if n := unsafe.Sizeof(TimelineEntry{}); n != 32 {
		t.Errorf("a timeline entry is %d bytes, want 32", n)
	}
}

// timeline is the whole timeline, the implied first entry included.
func (j *Job) timeline() []TimelineEntry {
	if j.tl0 == StateNone {
		return j.Timeline()
	}
	return append([]TimelineEntry{{State: j.tl0, At: j.CreatedAt}}, j.Timeline()...)
}

// TestImpliedFirstTimelineEntry: a job's first timeline entry, at its
// creation, is held by tl0 rather than an array of its own; the wire and
// the record carry it as before, byte for byte, and a record read back
// holds it the same way.
func TestImpliedFirstTimelineEntry(t *testing.T) {
	t.Parallel()
	const created = 1796007115626
	j := withID(&Job{Queue: "q", Name: "n", Data: rawUndefined, CreatedAt: created, state: StateWaiting}, "a")
	j.addFirstEntry(created + 3) // admitted a moment after its batch was parsed
	if j.tl0 != StateWaiting || j.Timeline() != nil || j.timelineLen() != 1 {
		t.Fatalf("first entry: tl0 %v, Timeline %+v", j.tl0, j.Timeline())
	}
	explicit := withID(&Job{Queue: "q", Name: "n", Data: rawUndefined, CreatedAt: created, state: StateWaiting,
		rt: &jobRun{heartbeat: created, timeline: []TimelineEntry{{State: StateWaiting, At: created}}}}, "a")
	if !reflect.DeepEqual(j.timeline(), explicit.Timeline()) {
		t.Fatalf("timeline() = %+v", j.timeline())
	}
	same := func(step string) {
		t.Helper()
		var a, b Enc
		encodeJob(&a, j, jobWithState, "waiting", nil)
		encodeJob(&b, explicit, jobWithState, "waiting", nil)
		if !bytes.Equal(a.B, b.B) {
			t.Fatalf("%s: the wire differs:\n%x\n%x", step, a.B, b.B)
		}
		a.B, b.B = a.B[:0], b.B[:0]
		encodeRecord(&a, j)
		encodeRecord(&b, explicit)
		if !bytes.Equal(a.B, b.B) {
			t.Fatalf("%s: the record differs", step)
		}
		back, err := decodeRecord(a.B)
		if err != nil {
			t.Fatal(err)
		}
		if back.tl0 != StateWaiting || !reflect.DeepEqual(back.timeline(), j.timeline()) {
			t.Fatalf("%s: read back as tl0 %v, %+v", step, back.tl0, back.Timeline())
		}
	}
	same("waiting")

	m := j.timelineMark()
	for _, st := range []State{StateActive, StateCompleted} {
		j.addTimeline(TimelineEntry{State: st, At: created + 10})
		explicit.addTimeline(TimelineEntry{State: st, At: created + 10})
		same(st.String())
	}
	if cap(j.Timeline()) != 2 || j.lastTimelineState() != StateCompleted || j.timelineLen() != 3 {
		t.Fatalf("after two steps: %+v (cap %d)", j.Timeline(), cap(j.Timeline()))
	}
	j.timelineBack(m)
	if j.timelineLen() != 1 || j.lastTimelineState() != StateWaiting {
		t.Fatalf("back to the mark: tl0 %v, %+v", j.tl0, j.Timeline())
	}
	j.timelineBack(timelineMark{})
	if j.timelineLen() != 0 || j.lastTimelineState() != StateNone {
		t.Fatal("back to an empty timeline: not empty")
	}

	// An entry at another time, or with an error, is kept as it is.
	k := &Job{CreatedAt: created}
	k.addTimeline(TimelineEntry{State: StateWaiting, At: created + 1})
	if k.tl0 != StateNone || len(k.Timeline()) != 1 {
		t.Fatalf("an entry after creation was implied: %+v", k)
	}

	// The limit counts the implied entry.
	for range 2 * maxTimelineEntries {
		j.addTimeline(TimelineEntry{State: StateWaiting, At: created + 20})
	}
	if j.timelineLen() != maxTimelineEntries {
		t.Fatalf("%d entries, the limit is %d", j.timelineLen(), maxTimelineEntries)
	}
}

// TestWaitingJobIsCompact: a plain job pushed with a UUID id carries no
// cold part, no run part and no id text, after the push and after its
// record is read back (as at a start); its last heartbeat reads as its
// creation time, as the reference sets it. A claim makes the run part,
// with the start, heartbeat, completion and timeline a reader sees.
func TestWaitingJobIsCompact(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	defer b.Close()
	j := mustJob(t, "q", map[string]any{"data": int64(1)})
	b.pushJobs("q", []*Job{j}, nil)
	var e Enc
	encodeRecord(&e, j)
	back, err := decodeRecord(e.B)
	if err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]*Job{"pushed": j, "read back": back} {
		if w.c != nil || w.rt != nil || w.id == ([16]byte{}) || w.Timeline() != nil {
			t.Fatalf("%s: cold %v, run %v, id %x, timeline %v", name, w.c, w.rt, w.id, w.Timeline())
		}
		if w.Heartbeat() != w.CreatedAt || w.StartedAt() != 0 || w.DoneAt() != 0 || w.ID() != j.ID() {
			t.Fatalf("%s: heartbeat %d (created %d), started %d, done %d, id %s", name, w.Heartbeat(), w.CreatedAt, w.StartedAt(), w.DoneAt(), w.ID())
		}
	}
	got, tokens := claimN(b, "q", 1)
	if len(got) != 1 || got[0] != j {
		t.Fatalf("claimed %v", got)
	}
	s := b.shardOf("q")
	s.mu.Lock()
	started, beat := j.StartedAt(), j.Heartbeat()
	s.mu.Unlock()
	if started == 0 || beat != started {
		t.Fatalf("claimed: started %d, heartbeat %d", started, beat)
	}
	if _, err := b.ackOne(AckItem{ID: j.ID(), Token: tokens[0]}); err != nil {
		t.Fatal(err)
	}
	c := b.idxGet(j.ID())
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.DoneAt() < started || c.StartedAt() != started {
		t.Fatalf("completed: started %d, done %d", c.StartedAt(), c.DoneAt())
	}
	var states []State
	for _, e := range c.timeline() {
		states = append(states, e.State)
	}
	if !slices.Equal(states, []State{StateWaiting, StateActive, StateCompleted}) {
		t.Fatalf("timeline %v", states)
	}
}
