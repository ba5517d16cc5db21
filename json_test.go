package main

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestJSONRoundTrip(t *testing.T) {
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
	})
}
