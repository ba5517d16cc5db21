package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"reflect"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
)

// vector is one line of the frames captured between the official client and
// the reference server.
type vector struct {
	Cmd         string          `json:"cmd"`
	Request     json.RawMessage `json:"request"`
	RequestHex  string          `json:"request_hex"`
	Response    json.RawMessage `json:"response"`
	ResponseHex string          `json:"response_hex"`
}

func loadVectors(t testing.TB) []vector {
	t.Helper()
	f, err := os.Open("testdata/vectors/reference-2.9.5-client-session.jsonl")
	if err != nil {
		t.Fatalf("open vectors: %v", err)
	}
	defer f.Close()
	var out []vector
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var v vector
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("vector line: %v", err)
		}
		out = append(out, v)
	}
	if len(out) < 20 {
		t.Fatalf("only %d vectors", len(out))
	}
	return out
}

// normalize turns decoded MessagePack into the shapes encoding/json gives,
// so the two can be compared.
func normalize(v any) any {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case uint64:
		return float64(x)
	case float32:
		return float64(x)
	case []any:
		for i := range x {
			x[i] = normalize(x[i])
		}
		return x
	case map[string]any:
		for k := range x {
			if _, undef := x[k].(Undefined); undef {
				// JSON has no undefined: the capture dropped these keys.
				delete(x, k)
				continue
			}
			x[k] = normalize(x[k])
		}
		return x
	}
	return v
}

func TestVectorsDecodeAsCaptured(t *testing.T) {
	t.Parallel()
	n := 0
	for _, v := range loadVectors(t) {
		for _, pair := range [][2]any{{v.RequestHex, v.Request}, {v.ResponseHex, v.Response}} {
			hx, js := pair[0].(string), pair[1].(json.RawMessage)
			if hx == "" {
				continue
			}
			b, err := hex.DecodeString(hx)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(b)
			if err != nil {
				t.Fatalf("%s: decode: %v", v.Cmd, err)
			}
			var want any
			if err := json.Unmarshal(js, &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(normalize(got), want) {
				t.Fatalf("%s: decoded %v, captured %v", v.Cmd, got, want)
			}
			// Every captured frame is a map with string keys, as requests must be.
			m, err := ParseMap(b, nil)
			if err != nil {
				t.Fatalf("%s: ParseMap: %v", v.Cmd, err)
			}
			if len(m.Fields) == 0 {
				t.Fatalf("%s: no fields", v.Cmd)
			}
			n++
		}
	}
	if n < 40 {
		t.Fatalf("checked only %d frames", n)
	}
}

func TestVectorsReencodeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, v := range loadVectors(t) {
		b, _ := hex.DecodeString(v.RequestHex)
		if len(b) == 0 {
			continue
		}
		val, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		var e Enc
		if err := e.Any(val); err != nil {
			t.Fatal(err)
		}
		again, err := Decode(e.B)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(normalize(again), normalize(val)) {
			t.Fatalf("%s: round trip changed the value", v.Cmd)
		}
	}
}

func TestRequestFieldsFromVector(t *testing.T) {
	t.Parallel()
	for _, v := range loadVectors(t) {
		if v.Cmd != "PULLB" {
			continue
		}
		b, _ := hex.DecodeString(v.RequestHex)
		m, err := ParseMap(b, nil)
		if err != nil {
			t.Fatal(err)
		}
		cmd, _, _ := m.Str("cmd")
		q, ok, _ := m.Str("queue")
		cnt, _, _ := m.Int("count")
		ttl, _, _ := m.Int("lockTtl")
		if cmd != "PULLB" || !ok || q == "" || cnt < 1 || ttl != 30000 {
			t.Fatalf("got cmd=%q queue=%q count=%d lockTtl=%d", cmd, q, cnt, ttl)
		}
		return
	}
	t.Fatal("no PULLB vector")
}

// The reference writes millisecond timestamps as float64; ours must match
// byte for byte (taken from a captured GetJob response).
func TestIntEncodingMatchesReference(t *testing.T) {
	t.Parallel()
	cases := []struct {
		v   int64
		hex string
	}{
		{1796007115626, "cb427a22a5dbb6a000"},
		{0, "00"},
		{127, "7f"},
		{128, "cc80"},
		{1000, "cd03e8"},
		{30000, "cd7530"},
		{70000, "ce00011170"},
		{-1, "ff"},
		{-32, "e0"},
		{-33, "d0df"},
		{-200, "d1ff38"},
		{-70000, "d2fffeee90"},
		{math.MaxInt32, "ce7fffffff"},
		{math.MaxInt32 + 1, "cb41e0000000000000"},
		{math.MinInt32, "d280000000"},
		{math.MinInt32 - 1, "cbc1e0000000200000"},
	}
	for _, c := range cases {
		var e Enc
		e.Int(c.v)
		if got := hex.EncodeToString(e.B); got != c.hex {
			t.Errorf("Int(%d) = %s, want %s", c.v, got, c.hex)
		}
	}
}

// Every format of the spec decodes, including those the encoder only emits
// on request (int64, uint64, bin, ext).
func TestDecodeEveryFormat(t *testing.T) {
	t.Parallel()
	cases := []struct {
		hex  string
		want any
	}{
		{"c0", nil}, {"c2", false}, {"c3", true},
		{"05", int64(5)}, {"ef", int64(-17)},
		{"cc ff", int64(255)}, {"cd 0100", int64(256)}, {"ce 00010000", int64(65536)},
		{"cf 0000000100000000", int64(1 << 32)}, {"cf ffffffffffffffff", uint64(math.MaxUint64)},
		{"d0 80", int64(-128)}, {"d1 8000", int64(-32768)}, {"d2 80000000", int64(math.MinInt32)},
		{"d3 8000000000000000", int64(math.MinInt64)},
		{"ca 3fc00000", float32(1.5)}, {"cb 3ff8000000000000", 1.5},
		{"a3 616263", "abc"}, {"d9 03 616263", "abc"}, {"da 0003 616263", "abc"}, {"db 00000003 616263", "abc"},
		{"c4 02 0102", []byte{1, 2}}, {"c5 0002 0102", []byte{1, 2}}, {"c6 00000002 0102", []byte{1, 2}},
		{"92 01 02", []any{int64(1), int64(2)}}, {"dc 0001 01", []any{int64(1)}}, {"dd 00000001 01", []any{int64(1)}},
		{"81 a1 61 01", map[string]any{"a": int64(1)}}, {"de 0001 a1 61 01", map[string]any{"a": int64(1)}},
		{"df 00000001 a1 61 01", map[string]any{"a": int64(1)}},
		{"81 01 02", map[string]any{"1": int64(2)}},
		{"d4 00 00", Undefined{}},
		{"d4 05 aa", Ext{Type: 5, Data: []byte{0xaa}}}, {"d5 05 aabb", Ext{Type: 5, Data: []byte{0xaa, 0xbb}}},
		{"d6 ff 01020304", Ext{Type: -1, Data: []byte{1, 2, 3, 4}}},
		{"d7 01 0102030405060708", Ext{Type: 1, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}}},
		{"d8 01 0102030405060708090a0b0c0d0e0f10", Ext{Type: 1, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}},
		{"c7 03 02 010203", Ext{Type: 2, Data: []byte{1, 2, 3}}},
		{"c8 0003 02 010203", Ext{Type: 2, Data: []byte{1, 2, 3}}},
		{"c9 00000003 02 010203", Ext{Type: 2, Data: []byte{1, 2, 3}}},
	}
	for _, c := range cases {
		b, err := hex.DecodeString(string(bytes.ReplaceAll([]byte(c.hex), []byte(" "), nil)))
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Errorf("%s: %v", c.hex, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %#v want %#v", c.hex, got, c.want)
		}
		// And the encoder writes it back to something that decodes the same.
		var e Enc
		switch w := c.want.(type) {
		case int64:
			e.Int64Exact(w)
		case uint64:
			e.Uint64Exact(w)
		default:
			if err := e.Any(c.want); err != nil {
				t.Fatal(err)
			}
		}
		back, err := Decode(e.B)
		if err != nil || !reflect.DeepEqual(back, c.want) {
			t.Errorf("%s: re-encoded %x decodes to %#v (%v)", c.hex, e.B, back, err)
		}
	}
}

func TestEncodeLengthBoundaries(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 15, 16, 31, 32, 255, 256, 65535, 65536} {
		s := string(bytes.Repeat([]byte("x"), n))
		var e Enc
		e.Str(s)
		e.Bin([]byte(s))
		arr := make([]any, n)
		for i := range arr {
			arr[i] = nil
		}
		if err := e.Any(arr); err != nil {
			t.Fatal(err)
		}
		m := map[string]any{}
		for i := 0; i < n && i < 70000; i++ {
			m[string(rune('a'+i%26))+string(rune(i))] = true
		}
		if err := e.Any(m); err != nil {
			t.Fatal(err)
		}
		i := 0
		for _, want := range []any{s, []byte(s), arr, m} {
			end, err := skip(e.B, i, 0, extNone)
			if err != nil {
				t.Fatalf("n=%d: %v", n, err)
			}
			got, err := Decode(e.B[i:end])
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("n=%d: round trip of %T failed: %v", n, want, err)
			}
			i = end
		}
	}
}

func TestNumEncoding(t *testing.T) {
	t.Parallel()
	cases := map[float64]string{0: "00", 1.5: "cb3ff8000000000000", 42: "2a", -5: "fb", 1e10: "cb4202a05f20000000"}
	for f, want := range cases {
		var e Enc
		e.Num(f)
		if got := hex.EncodeToString(e.B); got != want {
			t.Errorf("Num(%v) = %s want %s", f, got, want)
		}
	}
}

func TestParseMapRejects(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"not a map":        "92 01 02",
		"non-string key":   "81 01 02",
		"truncated value":  "82 a1 61 01 a1 62",
		"truncated string": "81 a1 61 a5 6162",
		"truncated ext":    "81 a4 64617461 c7 05 05 00",
		"trailing bytes":   "81 a1 61 01 01",
		"0xc1":             "81 a1 61 c1",
		"lying count":      "df ffffffff a1 61 01",
		"lying array":      "81 a1 61 dd ffffffff 01",
	}
	for name, hx := range cases {
		b, _ := hex.DecodeString(string(bytes.ReplaceAll([]byte(hx), []byte(" "), nil)))
		if _, err := ParseMap(b, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// An ext value (a Date in job data) is carried, and a getter that wants
	// another type refuses it, naming the field.
	b, _ := hex.DecodeString("82a464617461d6ff6553f100a171d40500")
	m, err := ParseMap(b, nil)
	if err != nil {
		t.Fatalf("ext value refused: %v", err)
	}
	if got := hex.EncodeToString(m.Get("data")); got != "d6ff6553f100" {
		t.Fatalf("ext value not kept as sent: %s", got)
	}
	var fe *FieldError
	if _, _, err := m.Str("q"); !errors.As(err, &fe) || fe.Field != "q" {
		t.Fatalf("ext read as a string: %v", err)
	}
	// msgpackr's undefined is accepted and reads as absent.
	b, _ = hex.DecodeString("82a171d40000a17201")
	m, err = ParseMap(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Has("q") {
		t.Fatal("undefined read as present")
	}
	if r, ok, _ := m.Int("r"); !ok || r != 1 {
		t.Fatal("r not read")
	}
}

func TestTypedGetters(t *testing.T) {
	t.Parallel()
	var e Enc
	if err := e.Any(map[string]any{
		"s": "x", "n": 3.9, "i": int64(-7), "b": true, "f": float32(2.5),
		"arr": []any{"a", "b"}, "bad": []any{"a", int64(1)}, "m": map[string]any{"k": "v"},
	}); err != nil {
		t.Fatal(err)
	}
	m, err := ParseMap(e.B, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok, err := m.Str("s"); s != "x" || !ok || err != nil {
		t.Error("Str")
	}
	if _, _, err := m.Str("n"); err == nil || err.Error() != "n must be a string" {
		t.Errorf("Str on number: %v", err)
	}
	if n, ok, _ := m.Int("n"); n != 3 || !ok {
		t.Error("Int truncates")
	}
	if n, _, _ := m.Int("i"); n != -7 {
		t.Error("Int negative")
	}
	if f, _, _ := m.Num("f"); f != 2.5 {
		t.Error("float32")
	}
	if b, ok, _ := m.Bool("b"); !b || !ok {
		t.Error("Bool")
	}
	if _, _, err := m.Bool("s"); err == nil {
		t.Error("Bool on string")
	}
	if a, _, _ := m.Strs("arr"); len(a) != 2 || a[1] != "b" {
		t.Error("Strs")
	}
	if _, _, err := m.Strs("bad"); err == nil || err.Error() != "bad[1] must be a string" {
		t.Errorf("Strs bad: %v", err)
	}
	if sub, ok, _ := m.Map("m"); !ok || sub.Get("k") == nil {
		t.Error("Map")
	}
	if _, ok, err := m.Str("absent"); ok || err != nil {
		t.Error("absent")
	}
}

func TestFraming(t *testing.T) {
	t.Parallel()
	var e Enc
	at := e.BeginFrame()
	e.MapHead(1)
	e.Str("ok")
	e.Bool(true)
	e.EndFrame(at)
	at = e.BeginFrame()
	e.Nil()
	e.EndFrame(at)
	r := bufio.NewReader(bytes.NewReader(e.B))
	body, err := ReadFrame(r, nil)
	if err != nil || hex.EncodeToString(body) != "81a26f6bc3" {
		t.Fatalf("frame 1: %x %v", body, err)
	}
	body, err = ReadFrame(r, body)
	if err != nil || hex.EncodeToString(body) != "c0" {
		t.Fatalf("frame 2: %x %v", body, err)
	}
	if _, err := ReadFrame(r, body); err == nil {
		t.Fatal("read past end")
	}
	// Oversized: refused from the header alone.
	big := []byte{0x04, 0x00, 0x00, 0x01}
	var fse *FrameSizeError
	if _, err := ReadFrame(bufio.NewReader(bytes.NewReader(big)), nil); !errors.As(err, &fse) || fse.N != 64<<20+1 {
		t.Fatalf("oversized: %v", err)
	}
	// Exactly the cap is allowed by the header check (body then short).
	capHdr := []byte{0x04, 0x00, 0x00, 0x00, 1, 2}
	if _, err := ReadFrame(bufio.NewReader(bytes.NewReader(capHdr)), nil); errors.As(err, &fse) {
		t.Fatal("64 MiB exactly refused")
	}
}

func FuzzParseMap(f *testing.F) {
	for _, v := range loadVectors(f) {
		for _, hx := range []string{v.RequestHex, v.ResponseHex} {
			if b, err := hex.DecodeString(hx); err == nil && len(b) > 0 {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// A request as the server reads it: accepted only if ParseMap
		// accepts it too, with the same fields, within the field limit and
		// with no ext type the official client cannot read.
		if rm, err := parseRequest(b, nil, 8); err == nil {
			pm, perr := ParseMap(b, nil)
			if perr != nil || len(pm.Fields) != len(rm.Fields) || len(rm.Fields) > 8 {
				t.Fatalf("parseRequest accepted %d fields, ParseMap %d (%v)", len(rm.Fields), len(pm.Fields), perr)
			}
			for _, fl := range rm.Fields {
				if _, err := skip(fl.Val, 0, 1, extKnown); err != nil {
					t.Fatalf("parseRequest let through %x: %v", fl.Val, err)
				}
			}
		}
		m, err := ParseMap(b, nil)
		if err != nil {
			return
		}
		// A map that parses must validate, decode, and answer every getter
		// without panicking.
		if err := Validate(b, true); err != nil {
			t.Fatalf("ParseMap accepted what Validate refuses: %v", err)
		}
		if _, err := Decode(b); err != nil {
			t.Fatalf("Decode refused a parsed map: %v", err)
		}
		for _, fl := range m.Fields {
			k := string(fl.Key)
			m.Str(k)
			m.Int(k)
			m.Bool(k)
			m.Strs(k)
			m.Map(k)
		}
	})
}

func FuzzDecodeRoundTrip(f *testing.F) {
	f.Add([]byte{0xc0})
	f.Add([]byte{0x92, 0x01, 0xa1, 0x61})
	f.Add([]byte{0xde, 0x00, 0x01, 0xa1, 0x61, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := Decode(b)
		if err != nil {
			return
		}
		var e Enc
		if err := e.Any(v); err != nil {
			t.Fatalf("cannot re-encode %#v: %v", v, err)
		}
		w, err := Decode(e.B)
		if err != nil {
			t.Fatalf("re-encoded value does not decode: %v", err)
		}
		if !reflect.DeepEqual(normalizeNaN(normalize(w)), normalizeNaN(normalize(v))) {
			t.Fatalf("round trip: %#v != %#v", w, v)
		}
	})
}

// NaN never equals itself; replace it so DeepEqual can compare.
func normalizeNaN(v any) any {
	switch x := v.(type) {
	case float64:
		if math.IsNaN(x) {
			return "NaN"
		}
	case []any:
		for i := range x {
			x[i] = normalizeNaN(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = normalizeNaN(x[k])
		}
	}
	return v
}

func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0xc0})
	f.Add([]byte{0, 0, 0, 5, 0x81, 0xa1, 0x61, 0x01})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	srv := memServer(NewMemEngine(1, nil), nil, quietLog())
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bufio.NewReader(bytes.NewReader(b))
		var buf []byte
		var frames [][]byte
		total := 0
		for {
			body, err := ReadFrame(r, buf)
			if err != nil {
				break
			}
			total += 4 + len(body)
			if total > len(b) {
				t.Fatalf("read %d bytes from %d", total, len(b))
			}
			frames = append(frames, append([]byte(nil), body...))
			buf = body
			ParseMap(body, nil)
		}
		// A server connection reads the same frames, whether it reads
		// them in place, into a buffer of their own, or wakes between them.
		c := newConn(srv, &bytesConn{r: bytes.NewReader(b), step: 1 + len(b)%7})
		for i := 0; ; i++ {
			if c.br == nil || (c.br.Buffered() == 0 && len(c.src.pre) == 0) {
				c.idle()
				if c.awake() != nil {
					break
				}
			}
			body, err := c.readFrame()
			if err != nil {
				break
			}
			if i >= len(frames) || !bytes.Equal(body, frames[i]) {
				t.Fatalf("frame %d read by the connection differs from ReadFrame's", i)
			}
			c.frameDone()
		}
		c.idle()
	})
}

// bytesConn is a connection that reads from r, at most step bytes a read.
type bytesConn struct {
	net.Conn
	r    *bytes.Reader
	step int
}

func (b *bytesConn) Read(p []byte) (int, error) {
	if len(p) > b.step {
		p = p[:b.step]
	}
	return b.r.Read(p)
}

func (b *bytesConn) SetReadDeadline(time.Time) error { return nil }

// pushFrame is a PUSH as the official client sends it.
func pushFrame(b testing.TB) []byte {
	var e Enc
	if err := e.Any(map[string]any{
		"cmd": "PUSH", "queue": "emails", "name": "welcome",
		"data":     map[string]any{"to": "someone@example.com", "tries": int64(1), "meta": map[string]any{"plan": "pro", "seats": int64(12)}},
		"priority": int64(5), "maxAttempts": int64(3), "backoff": map[string]any{"type": "exponential", "delay": int64(1000)},
		"removeOnComplete": false, "removeOnFail": false, "timestamp": 1796007115626.0, "reqId": "42",
	}); err != nil {
		b.Fatal(err)
	}
	return e.B
}

func BenchmarkDecodePush(b *testing.B) {
	frame := pushFrame(b)
	var fields []Field
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for i := 0; i < b.N; i++ {
		m, err := ParseMap(frame, fields)
		if err != nil {
			b.Fatal(err)
		}
		fields = m.Fields[:0]
		if _, err := parseJob(m, "emails", "jobId", 1796007115626); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseRequest is the scan alone: what every command pays.
func BenchmarkParseRequest(b *testing.B) {
	frame := pushFrame(b)
	var fields []Field
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for i := 0; i < b.N; i++ {
		m, err := ParseMap(frame, fields)
		if err != nil {
			b.Fatal(err)
		}
		fields = m.Fields[:0]
		if q, _, _ := m.Str("queue"); q != "emails" {
			b.Fatal("queue")
		}
	}
}

func BenchmarkEncodeJob(b *testing.B) {
	m, _ := ParseMap(pushFrame(b), nil)
	j, err := parseJob(m, "emails", "jobId", 1796007115626)
	if err != nil {
		b.Fatal(err)
	}
	j.setTimeline(append(j.Timeline(), TimelineEntry{State: StateWaiting, At: 1796007115626}, TimelineEntry{State: StateActive, At: 1796007115700}))
	j.setStartedAt(1796007115700)
	e := Enc{B: make([]byte, 0, 4096)}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		e.B = e.B[:0]
		encodeJob(&e, j, jobPlain, "", nil)
	}
	b.SetBytes(int64(len(e.B)))
}

// TestEncodersWellFormed: the encoders whose map sizes are counted by hand
// (a count that depends on the mode, or on what is set) write maps whose
// header says as many keys as follow: each output decodes whole, with no
// trailing bytes, in every mode, for a job with nothing set and one with
// everything.
func TestEncodersWellFormed(t *testing.T) {
	t.Parallel()
	bare := mustJob(t, "enc", map[string]any{"data": 1})
	full := mustJob(t, "enc", map[string]any{"data": map[string]any{"k": "v"}, "priority": 3, "delay": 1000,
		"attempts": 5, "backoff": map[string]any{"type": "exponential", "delay": 100}, "ttl": 60000, "timeout": 500,
		"uniqueKey": "u", "jobId": "custom", "tags": []any{"a", "b"}, "groupId": "g", "lifo": true,
		"removeOnComplete": true, "stackTraceLimit": 3, "keepLogs": 5, "dedup": map[string]any{"ttl": 100, "extend": true}})
	full.warm().Progress = Raw{0x32}
	full.warm().Stack = []string{"Error: x", "at y"}
	check := func(what string, b []byte) {
		t.Helper()
		if _, err := Decode(b); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	for _, j := range []*Job{bare, full} {
		for _, mode := range []int{jobPlain, jobWithRead, jobWithState} {
			var e Enc
			encodeJob(&e, j, mode, "waiting", Raw{0xc3})
			check(fmt.Sprintf("job %s, mode %d", j.ID(), mode), e.B)
		}
	}
	w := &worker{ID: "w1", Name: "n", Queues: []string{"a"}}
	for _, uptime := range []bool{false, true} {
		var e Enc
		encodeWorker(&e, w, "id", 10, true, uptime)
		check(fmt.Sprintf("worker, uptime %v", uptime), e.B)
	}
	b := NewMemEngine(1, nil)
	defer b.Close()
	b.SetRateLimit(context.Background(), "enc", RateLimit{Max: 5, Duration: 1000})
	b.SetConcurrency(context.Background(), "enc", 2)
	b.SetGroupPaused(context.Background(), "enc", "g", true)
	s := b.shardOf("enc")
	s.with(func() { check("queue settings", encodeQueueSettings(s.queues["enc"])) })
}

// The check every frame the tests see written passes (frameCheck, set by
// TestMain): its body is one whole MessagePack value. A miscounted map or
// array header is reported with the stack that wrote it, and fails the run.
var badFrames struct {
	sync.Mutex
	n    int
	seen []string
}

// frameNesting is how deep an answer's own maps and arrays may hold a
// value the client sent, itself up to maxDepth deep.
const frameNesting = 16

func checkFrameBody(body []byte) {
	err := frameBodyErr(body)
	if err == nil {
		return
	}
	head := body[:min(len(body), 64)]
	badFrames.Lock()
	defer badFrames.Unlock()
	badFrames.n++
	if len(badFrames.seen) < 5 {
		badFrames.seen = append(badFrames.seen, fmt.Sprintf("%v, starting %x, written by:\n%s", err, head, debug.Stack()))
	}
}

// malformedFrames describes the malformed frames seen, or is empty.
func malformedFrames() string {
	badFrames.Lock()
	defer badFrames.Unlock()
	if badFrames.n == 0 {
		return ""
	}
	return fmt.Sprintf("%d frames were written whose body is not one whole MessagePack value; the first:\n%s\n",
		badFrames.n, strings.Join(badFrames.seen, "\n"))
}

func frameBodyErr(body []byte) error {
	end, err := skip(body, 0, -frameNesting, extAny)
	if err == nil && end != len(body) {
		err = fmt.Errorf("%d bytes after the value", len(body)-end)
	}
	return err
}

// TestFrameCheck: the check the suite runs on every frame tells a header
// that counts one pair too many or too few from a right one.
func TestFrameCheck(t *testing.T) {
	t.Parallel()
	frame := func(head int) []byte {
		var e Enc
		e.MapHead(head)
		e.Str("ok")
		e.Bool(true)
		e.Str("reqId")
		e.Str("1")
		return e.B
	}
	if err := frameBodyErr(frame(2)); err != nil {
		t.Errorf("a map of 2 pairs headed 2: %v", err)
	}
	for _, head := range []int{1, 3} {
		if frameBodyErr(frame(head)) == nil {
			t.Errorf("a map of 2 pairs headed %d passed", head)
		}
	}
}

// TestParseMapAllocates: a map read into a buffer it is given allocates
// nothing, whatever its size; every request and every job of a PUSHB is
// read this way. Taking the address of an error target in the loop had
// put one on the heap for each field.
//
// Serial: it counts allocations (AllocsPerRun).
func TestParseMapAllocates(t *testing.T) {
	frame := pushFrame(t)
	fields := make([]Field, 0, 32)
	if n := testing.AllocsPerRun(100, func() {
		m, err := ParseMap(frame, fields)
		if err != nil || len(m.Fields) != 11 {
			t.Fatalf("%d fields, err %v", len(m.Fields), err)
		}
		fields = m.Fields[:0]
	}); n != 0 {
		t.Errorf("ParseMap allocated %v times for a map of 11 fields, want 0", n)
	}
}
