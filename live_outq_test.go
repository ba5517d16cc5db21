package main

import "testing"

// TestOutQueueBounds: the send queue refuses by count and by bytes, takes
// one oversized message when empty, reports the first refusal once, and
// hands everything to the writer in order.
func TestOutQueueBounds(t *testing.T) {
	t.Parallel()
	q := outQueue{maxN: 3, maxB: 10}
	if ok, _, _, _ := q.offer(outMsg{b: make([]byte, 50)}, false); !ok {
		t.Fatal("an empty queue refused one oversized message")
	}
	if ok, first, n, size := q.offer(outMsg{b: []byte("x")}, false); ok || !first || n != 1 || size != 50 {
		t.Fatalf("over the byte bound: ok=%v first=%v n=%d size=%d", ok, first, n, size)
	}
	if got := q.take(nil); len(got) != 1 || len(got[0].b) != 50 {
		t.Fatalf("take: %d messages", len(got))
	}
	for i := range 3 {
		if ok, _, _, _ := q.offer(outMsg{b: []byte{byte('a' + i)}}, false); !ok {
			t.Fatalf("message %d refused under the bounds", i)
		}
	}
	if ok, first, n, _ := q.offer(outMsg{b: []byte("d")}, false); ok || first || n != 3 {
		t.Fatalf("over the count bound: ok=%v first=%v (want a repeat refusal) n=%d", ok, first, n)
	}
	got := q.take(make([]outMsg, 0, 8))
	if string(got[0].b)+string(got[1].b)+string(got[2].b) != "abc" || q.bytes != 0 || len(q.msgs) != 0 {
		t.Fatalf("take: %v, left %d bytes %d msgs", got, q.bytes, len(q.msgs))
	}
	q.offer(outMsg{b: []byte("e")}, false)
	q.discard()
	if len(q.msgs) != 0 || q.bytes != 0 {
		t.Fatalf("discard left %d msgs, %d bytes", len(q.msgs), q.bytes)
	}
}
