package main

// The MessagePack decoder's validation and generic decoding: skip checks a
// whole value (every request is scanned with it before a field is read),
// and Decode builds Go values for tests, tools and the HTTP bridge.

import (
	"encoding/binary"
	"fmt"
	"math"
)

// ---------------------------------------------------------------------------
// Scanning

// skip returns the offset just past the value starting at b[i]. It validates
// the whole value; ext says which ext values pass.
//
// The one-byte values, fixstr, fixarray and fixmap, the commonest by far,
// are handled here; values with a length field go to a step of their own.
func skip(b []byte, i int, depth int, ext extRule) (int, error) {
	if depth > maxDepth {
		return 0, errTooDeep
	}
	if i >= len(b) {
		return 0, errTruncated
	}
	c := b[i]
	i++
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return i, nil
	case c >= 0xa0 && c <= 0xbf:
		return need(b, i, int(c&0x1f))
	case c >= 0x90 && c <= 0x9f:
		return skipN(b, i, int(c&0x0f), depth, ext)
	case c >= 0x80 && c <= 0x8f:
		return skipN(b, i, 2*int(c&0x0f), depth, ext)
	}
	switch c {
	case 0xc1:
		return 0, errBadFormat
	case 0xcc, 0xd0:
		return need(b, i, 1)
	case 0xcd, 0xd1:
		return need(b, i, 2)
	case 0xce, 0xd2, 0xca:
		return need(b, i, 4)
	case 0xcf, 0xd3, 0xcb:
		return need(b, i, 8)
	case 0xc4, 0xd9, 0xc5, 0xda, 0xc6, 0xdb:
		return skipBytes(b, c, i)
	case 0xdc, 0xdd:
		return skipArray(b, c, i, depth, ext)
	case 0xde, 0xdf:
		return skipMap(b, c, i, depth, ext)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return skipFixExt(b, c, i, ext)
	case 0xc7, 0xc8, 0xc9:
		return skipExt(b, c, i, ext)
	}
	return 0, errBadFormat
}

// skipBytes skips a str 8/16/32 or bin 8/16/32 whose format byte c is
// before b[i]: a 1-, 2- or 4-byte length, then that many bytes.
func skipBytes(b []byte, c byte, i int) (int, error) {
	w := 4
	switch c {
	case 0xc4, 0xd9:
		w = 1
	case 0xc5, 0xda:
		w = 2
	}
	l, j, err := readLen(b, i, w)
	if err != nil {
		return 0, err
	}
	return need(b, j, l)
}

// skipArray skips an array 16 (0xdc) or array 32 (0xdd).
func skipArray(b []byte, c byte, i, depth int, ext extRule) (int, error) {
	w := 2
	if c == 0xdd {
		w = 4
	}
	l, j, err := readLen(b, i, w)
	if err != nil {
		return 0, err
	}
	return skipN(b, j, l, depth, ext)
}

// skipMap skips a map 16 (0xde) or map 32 (0xdf). Its count is checked
// against the bytes left before it is doubled, so that it cannot overflow.
func skipMap(b []byte, c byte, i, depth int, ext extRule) (int, error) {
	w := 2
	if c == 0xdf {
		w = 4
	}
	l, j, err := readLen(b, i, w)
	if err != nil {
		return 0, err
	}
	if l > (len(b)-j)/2 {
		return 0, errTruncated
	}
	return skipN(b, j, 2*l, depth, ext)
}

// skipFixExt skips a fixext 1/2/4/8/16 (0xd4..0xd8): a type byte at b[i]
// and a payload of fixed size, if ext lets its type through.
func skipFixExt(b []byte, c byte, i int, ext extRule) (int, error) {
	size := 1 << (c - 0xd4)
	end, err := need(b, i, 1+size)
	if err != nil {
		return 0, err
	}
	if !ext.allows(b[i], true, b[i-1:end]) {
		return 0, &ExtError{Type: int8(b[i])}
	}
	return end, nil
}

// skipExt skips an ext 8/16/32 (0xc7..0xc9): a length, a type byte and
// the payload, if ext lets its type through.
func skipExt(b []byte, c byte, i int, ext extRule) (int, error) {
	w := 1 << (c - 0xc7)
	l, j, err := readLen(b, i, w)
	if err != nil {
		return 0, err
	}
	end, err := need(b, j, 1+l)
	if err != nil {
		return 0, err
	}
	if !ext.allows(b[j], false, nil) {
		return 0, &ExtError{Type: int8(b[j])}
	}
	return end, nil
}

func skipN(b []byte, i, n, depth int, ext extRule) (int, error) {
	// Every element takes at least one byte: a count larger than what is
	// left is a lie, refused before any work is done for it.
	if n > len(b)-i {
		return 0, errTruncated
	}
	var err error
	for k := 0; k < n; k++ {
		if i, err = skip(b, i, depth+1, ext); err != nil {
			return 0, err
		}
	}
	return i, nil
}

func need(b []byte, i, n int) (int, error) {
	if n < 0 || n > len(b)-i {
		return 0, errTruncated
	}
	return i + n, nil
}

func readLen(b []byte, i, w int) (int, int, error) {
	if w > len(b)-i {
		return 0, 0, errTruncated
	}
	var l uint64
	switch w {
	case 1:
		l = uint64(b[i])
	case 2:
		l = uint64(binary.BigEndian.Uint16(b[i:]))
	case 4:
		l = uint64(binary.BigEndian.Uint32(b[i:]))
	}
	if l > uint64(len(b)) {
		return 0, 0, errTruncated
	}
	return int(l), i + w, nil
}

// Validate checks that b holds exactly one well-formed value; allowExt
// permits ext values other than undefined.
func Validate(b []byte, allowExt bool) error {
	ext := extNone
	if allowExt {
		ext = extAny
	}
	end, err := skip(b, 0, 0, ext)
	if err != nil {
		return err
	}
	if end != len(b) {
		return fmt.Errorf("%d trailing bytes after MessagePack value", len(b)-end)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Generic decoding, for tests, tools and the HTTP bridge. The hot path never
// builds these trees.

// Ext is an ext value kept as it came.
type Ext struct {
	Type int8
	Data []byte
}

// Undefined is how a decoded msgpackr undefined is represented.
type Undefined struct{}

// Decode decodes one value into Go values: nil, bool, int64, uint64 (only
// above MaxInt64), float32, float64, string, []byte, []any, map[string]any,
// Ext or Undefined. Non-string map keys are rendered with fmt, as
// JavaScript renders object keys.
func Decode(b []byte) (any, error) {
	v, end, err := decodeAt(b, 0, 0)
	if err != nil {
		return nil, err
	}
	if end != len(b) {
		return nil, fmt.Errorf("%d trailing bytes after MessagePack value", len(b)-end)
	}
	return v, nil
}

// decodeAt decodes the value at b[i], after skip has validated it whole;
// it returns the value and the offset past it.
func decodeAt(b []byte, i, depth int) (any, int, error) {
	if depth > maxDepth {
		return nil, 0, errTooDeep
	}
	end, err := skip(b, i, depth, extAny)
	if err != nil {
		return nil, 0, err
	}
	c := b[i]
	switch {
	case c <= 0x7f:
		return int64(c), end, nil
	case c >= 0xe0:
		return int64(int8(c)), end, nil
	case c >= 0xa0 && c <= 0xbf, c == 0xd9, c == 0xda, c == 0xdb:
		s, e, _ := strRange(b, i)
		return string(b[s:e]), end, nil
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		return decodeArray(b, i, end, depth)
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		return decodeMap(b, i, end, depth)
	}
	return decodeScalar(b, c, i, end)
}

// decodeArray decodes the array in b[i:end] element by element, with no
// slice of raw values in between; the count was checked against the bytes
// present by skip.
func decodeArray(b []byte, i, end, depth int) (any, int, error) {
	n, j, _ := arrayHead(b[i:end])
	j += i
	out := make([]any, n)
	var err error
	for k := range out {
		if out[k], j, err = decodeAt(b, j, depth+1); err != nil {
			return nil, 0, err
		}
	}
	return out, end, nil
}

// decodeMap decodes the map at b[i]. A map grows as its entries are read:
// a declared count is not trusted with a preallocation.
func decodeMap(b []byte, i, end, depth int) (any, int, error) {
	n, j, _ := mapHeader(b, i)
	out := make(map[string]any, min(n, 64))
	for k := 0; k < n; k++ {
		key, kj, err := decodeAt(b, j, depth+1)
		if err != nil {
			return nil, 0, err
		}
		val, vj, err := decodeAt(b, kj, depth+1)
		if err != nil {
			return nil, 0, err
		}
		ks, isStr := key.(string)
		if !isStr {
			ks = fmt.Sprint(key)
		}
		out[ks] = val
		j = vj
	}
	return out, end, nil
}

// decodeScalar decodes what is neither a fixint, a string, an array nor a
// map: nil, booleans, bin, floats, sized integers and ext values.
func decodeScalar(b []byte, c byte, i, end int) (any, int, error) {
	switch c {
	case 0xc0:
		return nil, end, nil
	case 0xc2:
		return false, end, nil
	case 0xc3:
		return true, end, nil
	case 0xc4, 0xc5, 0xc6:
		w := 1 << (c - 0xc4)
		l, j, _ := readLen(b, i+1, w)
		return append([]byte{}, b[j:j+l]...), end, nil
	case 0xca:
		return math.Float32frombits(binary.BigEndian.Uint32(b[i+1:])), end, nil
	case 0xcb:
		return math.Float64frombits(binary.BigEndian.Uint64(b[i+1:])), end, nil
	case 0xcf:
		u := binary.BigEndian.Uint64(b[i+1:])
		if u > math.MaxInt64 {
			return u, end, nil
		}
		return int64(u), end, nil
	case 0xcc, 0xcd, 0xce, 0xd0, 0xd1, 0xd2, 0xd3:
		f, _ := Raw(b[i:end]).Float()
		if c == 0xd3 {
			return int64(binary.BigEndian.Uint64(b[i+1:])), end, nil
		}
		return int64(f), end, nil
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		if isUndefined(b[i:end]) {
			return Undefined{}, end, nil
		}
		return Ext{Type: int8(b[i+1]), Data: append([]byte{}, b[i+2:end]...)}, end, nil
	case 0xc7, 0xc8, 0xc9:
		w := 1 << (c - 0xc7)
		l, j, _ := readLen(b, i+1, w)
		if b[j] == 0 && l == 1 && b[j+1] == 0 {
			// undefined in the longer form: the same value as the fixext
			// one (which is how it is written back).
			return Undefined{}, end, nil
		}
		return Ext{Type: int8(b[j]), Data: append([]byte{}, b[j+1:j+1+l]...)}, end, nil
	}
	return nil, 0, errBadFormat
}
