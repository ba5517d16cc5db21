package main

// Bridging MessagePack and JSON, for the HTTP API, webhooks and live event
// streams: job data arrives and is kept as MessagePack, and leaves as JSON
// the way JavaScript's JSON.stringify would render the decoded value.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// appendJSON renders one MessagePack value as JSON. Binary becomes an
// array of byte values; a timestamp ext (a JavaScript Date) its ISO-8601
// string, as JSON.stringify renders a Date; undefined is null inside arrays
// and left out of objects; NaN and infinities are null.
func appendJSON(dst []byte, r Raw) ([]byte, error) {
	out, _, err := jsonAt(dst, r, 0, 0)
	return out, err
}

func jsonAt(dst []byte, b []byte, i, depth int) ([]byte, int, error) {
	if depth > maxDepth {
		return dst, 0, errTooDeep
	}
	end, err := skip(b, i, depth, true)
	if err != nil {
		return dst, 0, err
	}
	c := b[i]
	switch {
	case c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3) || c == 0xca || c == 0xcb:
		if c == 0xcf {
			return strconv.AppendUint(dst, binary.BigEndian.Uint64(b[i+1:]), 10), end, nil
		}
		if c == 0xd3 {
			return strconv.AppendInt(dst, int64(binary.BigEndian.Uint64(b[i+1:])), 10), end, nil
		}
		f, _ := Raw(b[i:end]).Float()
		return appendJSONNumber(dst, f), end, nil
	case c >= 0xa0 && c <= 0xbf, c == 0xd9, c == 0xda, c == 0xdb:
		s, e, _ := strRange(b, i)
		return appendJSONString(dst, b[s:e]), end, nil
	case c == 0xc0:
		return append(dst, "null"...), end, nil
	case c == 0xc2:
		return append(dst, "false"...), end, nil
	case c == 0xc3:
		return append(dst, "true"...), end, nil
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		items, _ := Raw(b[i:end]).Array()
		dst = append(dst, '[')
		for k, it := range items {
			if k > 0 {
				dst = append(dst, ',')
			}
			if isUndefined(it) {
				dst = append(dst, "null"...)
				continue
			}
			if dst, _, err = jsonAt(dst, it, 0, depth+1); err != nil {
				return dst, 0, err
			}
		}
		return append(dst, ']'), end, nil
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		n, j, _ := mapHeader(b, i)
		dst = append(dst, '{')
		first := true
		for k := 0; k < n; k++ {
			kend, _ := skip(b, j, depth+1, true)
			vend, _ := skip(b, kend, depth+1, true)
			if isUndefined(b[kend:vend]) {
				j = vend
				continue
			}
			if !first {
				dst = append(dst, ',')
			}
			first = false
			// JavaScript object keys are strings: other keys are rendered
			// as their text.
			if s, e, err := strRange(b, j); err == nil {
				dst = appendJSONString(dst, b[s:e])
			} else {
				var kb []byte
				if kb, _, err = jsonAt(nil, b[j:kend], 0, depth+1); err != nil {
					return dst, 0, err
				}
				dst = appendJSONString(dst, bytes.Trim(kb, `"`))
			}
			dst = append(dst, ':')
			if dst, _, err = jsonAt(dst, b[kend:vend], 0, depth+1); err != nil {
				return dst, 0, err
			}
			j = vend
		}
		return append(dst, '}'), end, nil
	case c == 0xc4 || c == 0xc5 || c == 0xc6:
		w := 1 << (c - 0xc4)
		l, j, _ := readLen(b, i+1, w)
		dst = append(dst, '[')
		for k, x := range b[j : j+l] {
			if k > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(x), 10)
		}
		return append(dst, ']'), end, nil
	}
	// Ext values: undefined reads as null; the timestamp ext as a date.
	v, _, err := decodeAt(b[i:end], 0, depth)
	if err != nil {
		return dst, 0, err
	}
	switch x := v.(type) {
	case Undefined:
		return append(dst, "null"...), end, nil
	case Ext:
		if t, ok := extTime(x); ok {
			return appendJSONString(dst, []byte(t.UTC().Format("2006-01-02T15:04:05.000Z"))), end, nil
		}
	}
	return append(dst, "null"...), end, nil
}

// extTime reads the MessagePack timestamp extension (type -1).
func extTime(x Ext) (time.Time, bool) {
	if x.Type != -1 {
		return time.Time{}, false
	}
	d := x.Data
	switch len(d) {
	case 4:
		return time.Unix(int64(binary.BigEndian.Uint32(d)), 0), true
	case 8:
		v := binary.BigEndian.Uint64(d)
		return time.Unix(int64(v&0x3ffffffff), int64(v>>34)), true
	case 12:
		return time.Unix(int64(binary.BigEndian.Uint64(d[4:])), int64(binary.BigEndian.Uint32(d))), true
	}
	return time.Time{}, false
}

func appendJSONNumber(dst []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(dst, "null"...)
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e21 {
		return strconv.AppendFloat(dst, f, 'f', -1, 64)
	}
	return strconv.AppendFloat(dst, f, 'g', -1, 64)
}

// appendJSONString quotes s; invalid UTF-8 becomes U+FFFD.
func appendJSONString(dst []byte, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, "\ufffd"...)
		} else if r == '\u2028' || r == '\u2029' {
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// jsonToMsgpack converts a JSON document to MessagePack, keeping integers
// as integers.
func jsonToMsgpack(data []byte) (Raw, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("invalid JSON: more than one value")
	}
	var e Enc
	if err := encodeJSONValue(&e, v, 0); err != nil {
		return nil, err
	}
	return e.B, nil
}

func encodeJSONValue(e *Enc, v any, depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			e.Int(i)
			return nil
		}
		f, err := x.Float64()
		if err != nil {
			return fmt.Errorf("number %s: %w", x, err)
		}
		e.Num(f)
	case []any:
		e.ArrayHead(len(x))
		for _, it := range x {
			if err := encodeJSONValue(e, it, depth+1); err != nil {
				return err
			}
		}
	case map[string]any:
		e.MapHead(len(x))
		for k, it := range x {
			e.Str(k)
			if err := encodeJSONValue(e, it, depth+1); err != nil {
				return err
			}
		}
	default:
		return e.Any(v)
	}
	return nil
}
