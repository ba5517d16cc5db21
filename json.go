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
	"io"
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

// jsonAt renders the value at b[i] and returns the offset past it. Numbers,
// strings and constants are rendered here; containers, binary and ext
// values each by a step of their own.
func jsonAt(dst []byte, b []byte, i, depth int) ([]byte, int, error) {
	if depth > maxDepth {
		return dst, 0, errTooDeep
	}
	end, err := skip(b, i, depth, extAny)
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
		if dst, err = jsonArray(dst, b, i, end, depth); err != nil {
			return dst, 0, err
		}
		return dst, end, nil
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		if dst, err = jsonObject(dst, b, i, depth); err != nil {
			return dst, 0, err
		}
		return dst, end, nil
	case c == 0xc4 || c == 0xc5 || c == 0xc6:
		return jsonBinary(dst, b, c, i), end, nil
	}
	if dst, err = jsonExt(dst, b[i:end], depth); err != nil {
		return dst, 0, err
	}
	return dst, end, nil
}

// jsonArray renders the array in b[i:end], undefined elements as null.
// It goes element by element: no slice of raw values in between, whose 24
// bytes an element would cost far more than the element's byte.
func jsonArray(dst []byte, b []byte, i, end, depth int) ([]byte, error) {
	n, j, _ := arrayHead(b[i:end])
	j += i
	dst = append(dst, '[')
	var err error
	for k := 0; k < n; k++ {
		if k > 0 {
			dst = append(dst, ',')
		}
		ie, _ := skip(b, j, depth+1, extAny)
		if isUndefined(b[j:ie]) {
			dst = append(dst, "null"...)
			j = ie
			continue
		}
		if dst, _, err = jsonAt(dst, b[j:ie], 0, depth+1); err != nil {
			return dst, err
		}
		j = ie
	}
	return append(dst, ']'), nil
}

// jsonObject renders the map at b[i] as an object, leaving out the
// entries whose value is undefined.
func jsonObject(dst []byte, b []byte, i, depth int) ([]byte, error) {
	n, j, _ := mapHeader(b, i)
	dst = append(dst, '{')
	first := true
	for k := 0; k < n; k++ {
		kend, _ := skip(b, j, depth+1, extAny)
		vend, _ := skip(b, kend, depth+1, extAny)
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
		var err error
		if s, e, err := strRange(b, j); err == nil {
			dst = appendJSONString(dst, b[s:e])
		} else {
			var kb []byte
			if kb, _, err = jsonAt(nil, b[j:kend], 0, depth+1); err != nil {
				return dst, err
			}
			dst = appendJSONString(dst, bytes.Trim(kb, `"`))
		}
		dst = append(dst, ':')
		if dst, _, err = jsonAt(dst, b[kend:vend], 0, depth+1); err != nil {
			return dst, err
		}
		j = vend
	}
	return append(dst, '}'), nil
}

// jsonBinary renders a bin 8/16/32 (format byte c at b[i]) as an array of
// byte values, as JSON.stringify renders a Uint8Array's bytes.
func jsonBinary(dst []byte, b []byte, c byte, i int) []byte {
	w := 1 << (c - 0xc4)
	l, j, _ := readLen(b, i+1, w)
	dst = append(dst, '[')
	for k, x := range b[j : j+l] {
		if k > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(x), 10)
	}
	return append(dst, ']')
}

// jsonExt renders the ext value v: undefined reads as null; the timestamp
// ext as a date; any other as null.
func jsonExt(dst []byte, v []byte, depth int) ([]byte, error) {
	x, _, err := decodeAt(v, 0, depth)
	if err != nil {
		return dst, err
	}
	switch x := x.(type) {
	case Undefined:
		return append(dst, "null"...), nil
	case Ext:
		if t, ok := extTime(x); ok {
			return appendJSONString(dst, []byte(t.UTC().Format("2006-01-02T15:04:05.000Z"))), nil
		}
	}
	return append(dst, "null"...), nil
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

// jsonToMsgpack converts a JSON document to MessagePack as a JavaScript
// peer would encode what JSON.parse made of it: objects keep their keys in
// document order (job data comes back the way it was sent), and numbers are
// JavaScript numbers (integral ones within int32 as integers).
func jsonToMsgpack(data []byte) (Raw, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var e Enc
	if err := encodeJSONTokens(&e, dec, 0); err != nil {
		return nil, jsonError(data, dec, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("invalid JSON: more than one value (at byte %d)", dec.InputOffset())
	}
	return e.B, nil
}

// jsonError says what is wrong with a document and where, for a person
// reading a 400 answer.
func jsonError(data []byte, dec *json.Decoder, err error) error {
	var se *json.SyntaxError
	switch {
	case errors.Is(err, errTooDeep):
		return fmt.Errorf("invalid JSON: nested deeper than %d levels", maxDepth)
	case errors.As(err, &se):
		return fmt.Errorf("invalid JSON: %s (at byte %d)", se.Error(), se.Offset)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		if len(bytes.TrimSpace(data)) == 0 {
			return errors.New("invalid JSON: empty document")
		}
		return fmt.Errorf("invalid JSON: unexpected end of input after byte %d", dec.InputOffset())
	}
	return fmt.Errorf("invalid JSON: %w", err)
}

// encodeJSONTokens encodes the next JSON value the decoder holds. Going
// through tokens, not a map, is what keeps the order of object keys.
func encodeJSONTokens(e *Enc, dec *json.Decoder, depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '[':
			at, n := e.OpenArray(), 0
			for dec.More() {
				if err := encodeJSONTokens(e, dec, depth+1); err != nil {
					return err
				}
				n++
			}
			if _, err := dec.Token(); err != nil {
				return err
			}
			e.CloseArray(at, n)
		case '{':
			at, n := e.OpenMap(), 0
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				e.Str(k.(string))
				if err := encodeJSONTokens(e, dec, depth+1); err != nil {
					return err
				}
				n++
			}
			if _, err := dec.Token(); err != nil {
				return err
			}
			e.CloseMap(at, n)
		}
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return fmt.Errorf("number %s: %w", x, err)
		}
		// Out of range is what JavaScript makes of it too: Infinity or 0.
		e.Num(f)
	case string:
		e.Str(x)
	case bool:
		e.Bool(x)
	case nil:
		e.Nil()
	}
	return nil
}
