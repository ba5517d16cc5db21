package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestJSONRoundTrip(t *testing.T) {
	t.Parallel()
	docs := []string{
		`{"a":1,"b":[true,false,null],"c":{"d":"é ✓ \"q\" \n"},"e":-5,"f":1.5,"g":1700000000123,"h":[]}`,
		`[1,2,3]`, `"x"`, `null`, `12345678901234`, `{"nested":{"deep":{"deeper":[{"k":"v"}]}}}`,
	}
	for _, d := range docs {
		mp, err := jsonToMsgpack([]byte(d))
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		back, err := appendJSON(nil, mp)
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		var a, b any
		json.Unmarshal([]byte(d), &a)
		if err := json.Unmarshal(back, &b); err != nil {
			t.Fatalf("%s rendered as invalid JSON %s", d, back)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s came back as %s", d, back)
		}
	}
	// Integers stay integers on the way in.
	mp, _ := jsonToMsgpack([]byte(`{"n":3}`))
	if m, _ := ParseMap(mp, nil); m.Get("n")[0] != 3 {
		t.Fatalf("integer encoded as %x", mp)
	}
	if _, err := jsonToMsgpack([]byte(`{"a":`)); err == nil {
		t.Fatal("broken JSON accepted")
	}
	if _, err := jsonToMsgpack([]byte(`1 2`)); err == nil {
		t.Fatal("two values accepted")
	}
}

func TestJSONFromMsgpackSpecials(t *testing.T) {
	t.Parallel()
	var e Enc
	e.MapHead(6)
	e.Str("date") // 2023-11-14T22:13:20Z, as msgpackr packs a Date (timestamp32)
	e.Ext(-1, []byte{0x65, 0x53, 0xf1, 0x00})
	e.Str("undef")
	e.Undefined()
	e.Str("arr")
	e.ArrayHead(2)
	e.Undefined()
	e.Float64(nan())
	e.Str("bin")
	e.Bin([]byte{1, 2})
	e.Str("bad")
	e.Str("a\xffb")
	e.B = append(e.B, 0x05) // int key
	e.Str("five")
	got, err := appendJSON(nil, e.B)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"date":"2023-11-14T22:13:20.000Z","arr":[null,null],"bin":[1,2],"bad":"a` + "\ufffd" + `b","5":"five"}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func nan() float64 {
	var z float64
	return z / z
}

func FuzzAppendJSON(f *testing.F) {
	f.Add([]byte{0x81, 0xa1, 0x61, 0x01})
	f.Add([]byte{0xd6, 0xff, 0x65, 0x53, 0xf1, 0x00})
	f.Add([]byte{0x92, 0xc4, 0x03, 1, 2, 3, 0xa4, 0xe2, 0x82, 0xac, 0x0a})
	f.Add([]byte{0x81, 0x81, 0x80, 0xc2, 0xc2})
	f.Fuzz(func(t *testing.T, b []byte) {
		if Validate(b, true) != nil {
			return
		}
		out, err := appendJSON(nil, b)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("%x rendered as invalid JSON %s", b, out)
		}
		if n := len(out); n > jsonGrowth*len(b) {
			t.Fatalf("%x (%d bytes) rendered as %d bytes of JSON, over %d times", b, len(b), n, jsonGrowth)
		}
		// Rendered a byte at a time, the pieces make the same JSON.
		if got := renderInPieces(t, b, 1); !bytes.Equal(got, out) {
			t.Fatalf("%x in pieces: %s\nwhole: %s", b, got, out)
		}
		// Measured, it is as long.
		m := jsonOut{measure: true, sink: func([]byte) error { return nil }}
		if err := m.raw(b); err != nil || m.size() != int64(len(out)) {
			t.Fatalf("%x measured as %d bytes (%v), rendered as %d", b, m.size(), err, len(out))
		}
	})
}

// renderInPieces renders r through a sink, with pieces of piece bytes.
func renderInPieces(t *testing.T, r Raw, piece int) []byte {
	t.Helper()
	var got []byte
	o := jsonOut{piece: piece, sink: func(p []byte) error { got = append(got, p...); return nil }}
	if err := o.raw(r); err != nil {
		t.Fatal(err)
	}
	o.flush()
	if o.size() != int64(len(got)) {
		t.Fatalf("size says %d, %d rendered", o.size(), len(got))
	}
	return got
}

// Big values rendered through a sink, in pieces of the size answers use,
// make the same JSON as rendered whole: strings cut between characters
// (never inside one, nor inside an invalid sequence), binary data, long
// arrays and maps.
func TestJSONPiecesMatchWhole(t *testing.T) {
	t.Parallel()
	var e Enc
	e.MapHead(4)
	e.Str("text") // multi-byte characters across every cut, and bytes that are not UTF-8
	e.Str(strings.Repeat("a€\u2028\x80\xe2\x82x\"\n😀", 40_000))
	e.Str("bin")
	bin := make([]byte, 300_000)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	e.Bin(bin)
	e.Str("list")
	e.ArrayHead(50_000)
	for i := range 50_000 {
		e.Int(int64(i))
	}
	e.Str("nested")
	e.MapHead(1000)
	for i := range 1000 {
		e.Str(fmt.Sprint("k", i))
		e.ArrayHead(2)
		e.Undefined()
		e.Str("v")
	}
	whole, err := appendJSON(nil, e.B)
	if err != nil || !json.Valid(whole) {
		t.Fatalf("whole: valid %v, err %v", json.Valid(whole), err)
	}
	for _, piece := range []int{0, 1, 7, 4096} {
		if got := renderInPieces(t, e.B, piece); !bytes.Equal(got, whole) {
			t.Fatalf("pieces of %d: %d bytes, whole %d; first difference at %d", piece, len(got), len(whole), firstDiff(got, whole))
		}
	}
	m := jsonOut{measure: true, sink: func([]byte) error { return nil }}
	if err := m.raw(e.B); err != nil || m.size() != int64(len(whole)) {
		t.Fatalf("measured as %d bytes (%v), rendered as %d", m.size(), err, len(whole))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// A map key that is not a string, number, boolean or nil (a map, an array,
// binary, a date) is named "[object Object]", as JavaScript's String names
// an object; its decoder refuses such keys. Rendered as its own JSON and
// escaped into a name, each level of nesting doubled it: 45 bytes of
// MessagePack became 8 MB of JSON, and 30 levels (61 bytes, a job's data
// pushed by anyone) would have been 2 GB for each reader of the job.
func TestJSONMapKeysBounded(t *testing.T) {
	t.Parallel()
	v := []byte{0xc2}
	for range 24 { // 33 MB of JSON before

		v = append(append([]byte{0x81}, v...), 0xc2) // {previous: false}
	}
	out, err := appendJSON(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) > jsonGrowth*len(v) {
		t.Fatalf("%d bytes of nested map keys rendered as %d bytes of JSON", len(v), len(out))
	}
	var e Enc
	e.MapHead(7)
	e.Int(5)
	e.Str("int")
	e.Float64(1.5)
	e.Str("float")
	e.Float64(nan())
	e.Str("nan")
	e.Bool(false)
	e.Str("bool")
	e.Nil()
	e.Str("nil")
	e.Undefined()
	e.Str("undefined")
	e.ArrayHead(1)
	e.Int(1)
	e.Str("array")
	got, err := appendJSON(nil, e.B)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"5":"int","1.5":"float","NaN":"nan","false":"bool","null":"nil","undefined":"undefined","[object Object]":"array"}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// BenchmarkJSON renders job data as the HTTP side does: a typical small
// object, and 1 MB of binary data (rendered, and measured as a big
// answer's first pass measures it).
//
//	go test -run '^$' -bench 'BenchmarkJSON' -benchmem
func BenchmarkJSON(b *testing.B) {
	small, _ := jsonToMsgpack([]byte(`{"to":"a@example.com","subject":"Welcome","n":42,"tags":["a","b"],"ok":true}`))
	var e Enc
	e.Bin(binaryData(1 << 20))
	bin := e.B
	for _, c := range []struct {
		name    string
		v       Raw
		measure bool
	}{{"small", small, false}, {"binary1MB", bin, false}, {"binary1MB/measure", bin, true}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.v)))
			buf := make([]byte, 0, 8<<20)
			for range b.N {
				o := jsonOut{b: buf[:0], measure: c.measure}
				if err := o.raw(c.v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
