package main

import (
	"bytes"
	"reflect"
	"testing"
	"unsafe"
)

// fullJob sets every field a record carries to something other than its
// zero value.
func fullJob() *Job {
	j := &Job{
		Queue: "q", Name: "n", Data: Raw{0x81, 0xa1, 0x61, 0x01}, Priority: -3,
		CreatedAt: 1796007115626, RunAt: 1796007116626, Attempts: 2,
		rt: &jobRun{startedAt: 1796007117000, doneAt: 1796007118000, heartbeat: 1796007117500,
			timeline: []TimelineEntry{{State: StateWaiting, At: 1}, {State: StateFailed, At: 2, Error: "boom", HasErr: true, Attempt: 1}}},
		state: StateFailed, seq: 1 << 40,
		dlq: &DLQEntry{EnteredAt: 3, Reason: "max_attempts_exceeded", Error: "boom", HasErr: true, RetryCount: 2, LastRetryAt: 4, NextRetryAt: 5, ExpiresAt: 6},
	}
	j.c = &jobCold{
		MaxAttempts: 5, Backoff: 250, TTL: 60000, Timeout: 3000,
		BackoffObj: &Backoff{Exponential: true, Delay: 250, MaxDelay: 9000},
		UniqueKey:  "u", CustomID: "j-1", rawID: "j-1", DependsOn: []string{"a", "b"}, ParentID: "p",
		Children: []string{"c1"}, ChildDone: 1, Tags: []string{"t"}, GroupID: "g", Progress: Raw{0x32},
		ProgressMsg: "half", HasProgressMsg: true, Stack: []string{"Error: x", "at y"}, Repeat: Raw{0x80}, Durable: true,
		StallTimeout: 7000, Stalls: 1, StackTraceLimit: 4, KeepLogs: 10, SizeLimit: 1024,
		Lifo: true, RemoveOnComplete: true, RemoveOnFail: true, FailParent: true, RemoveDepOnFail: true,
		ContinueParent: true, IgnoreDepOnFail: true, DedupTTL: 5000, DedupExtend: true, DedupReplace: true,
		DebounceID: "d", DebounceTTL: 300, failErr: "boom", hasFail: true,
		history: []AttemptRec{{Attempt: 1, StartedAt: 7, FailedAt: 8, Reason: "explicit_fail", Error: "e", HasErr: true}},
	}
	return j
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	for _, j := range []*Job{fullJob(), withID(&Job{Queue: "q", Data: rawUndefined,
		state: StateWaiting}, "minimal")} {
		var e Enc
		encodeRecord(&e, j)
		if err := Validate(e.B, true); err != nil {
			t.Fatalf("%s: record is not one MessagePack value: %v", j.ID(), err)
		}
		got, err := decodeRecord(e.B)
		if err != nil {
			t.Fatalf("%s: %v", j.ID(), err)
		}
		if !reflect.DeepEqual(got, j) {
			t.Fatalf("%s: round trip changed the job:\n got %+v\nwant %+v", j.ID(), got, j)
		}
	}
}

func TestRecordRejectsDamage(t *testing.T) {
	t.Parallel()
	var e Enc
	encodeRecord(&e, fullJob())
	for _, b := range [][]byte{nil, {0xc0}, e.B[:len(e.B)/2], {0x91, 0x07}} {
		if _, err := decodeRecord(b); err == nil {
			t.Fatalf("damaged record %x accepted", b)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	var e Enc
	encodeRecord(&e, fullJob())
	f.Add(e.B)
	f.Fuzz(func(t *testing.T, b []byte) {
		j, err := decodeRecord(b)
		if err != nil {
			return
		}
		// What decodes must encode again and give the same job.
		var e2 Enc
		encodeRecord(&e2, j)
		j2, err := decodeRecord(e2.B)
		if err != nil || !reflect.DeepEqual(j, j2) {
			t.Fatalf("re-encoded record differs: %v", err)
		}
	})
}

// TestRecordUnknownTimelineState: a timeline state this build does not
// know reads as StateNone rather than failing the record.
func TestRecordUnknownTimelineState(t *testing.T) {
	t.Parallel()
	var e Enc
	encodeRecord(&e, withID(&Job{Queue: "q", Data: rawUndefined,
		state: StateWaiting, rt: &jobRun{timeline: []TimelineEntry{{State: StateWaiting, At: 5}}}}, "1"))
	at := bytes.Index(e.B, []byte("\xa7waiting"))
	if at < 0 {
		t.Fatal("no timeline state in the record")
	}
	copy(e.B[at+1:], "made-up")
	j, err := decodeRecord(e.B)
	if err != nil {
		t.Fatal(err)
	}
	if len(j.Timeline()) != 1 || j.Timeline()[0].State != StateNone || j.Timeline()[0].At != 5 {
		t.Fatalf("timeline read back as %+v", j.Timeline())
	}
}

// TestRecordRunSharesStrings decodes a run of records the way a recovery
// does: each job comes back as it was, whatever its neighbours held, and
// neighbours with the same queue and name share one string of each.
func TestRecordRunSharesStrings(t *testing.T) {
	t.Parallel()
	mk := func(id, queue, name string, state State) *Job {
		return withID(&Job{Queue: queue, Name: name, Data: rawUndefined,
			state: StateWaiting, rt: &jobRun{timeline: []TimelineEntry{{State: state, At: 5}}}}, id)
	}
	want := []*Job{mk("1", "mail", "send", StateWaiting), mk("2", "mail", "send", StateDelayed),
		mk("3", "mail", "other", StateWaitingChildren), mk("4", "sms", "other", StateWaiting), mk("5", "mail", "", StateActive)}
	var last recLast
	var got []*Job
	for _, j := range want {
		var e Enc
		encodeRecord(&e, j)
		d, err := last.decode(e.B)
		if err != nil {
			t.Fatalf("%s: %v", j.ID(), err)
		}
		if !reflect.DeepEqual(d, j) {
			t.Fatalf("%s: got %+v\nwant %+v", j.ID(), d, j)
		}
		got = append(got, d)
	}
	if unsafe.StringData(got[0].Queue) != unsafe.StringData(got[1].Queue) ||
		unsafe.StringData(got[0].Name) != unsafe.StringData(got[1].Name) {
		t.Fatal("two records of one queue and name hold two copies of them")
	}
}
