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
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// appendJSON renders one MessagePack value as JSON. Binary becomes an
// array of byte values; a timestamp ext (a JavaScript Date) its ISO-8601
// string, as JSON.stringify renders a Date; undefined is null inside arrays
// and left out of objects; NaN and infinities are null.
func appendJSON(dst []byte, r Raw) ([]byte, error) {
	o := jsonOut{b: dst}
	err := o.raw(r)
	return o.b, err
}

// jsonPiece is about how much JSON a jsonOut with a sink holds before it
// hands it on.
const jsonPiece = 32 << 10

// jsonGrowth bounds how many times longer than its MessagePack a value's
// JSON is (FuzzAppendJSON holds it): two bytes, a map key that is an empty
// map and a false, make 24 ("[object Object]":false,); binary takes four
// for each byte ("255,"), a string six for each control character.
const jsonGrowth = 12

// jsonOut is where JSON is rendered: appended to b and, when it has a
// sink, handed to the sink in pieces of about jsonPiece bytes as b fills,
// so that JSON of any length is held a piece at a time (an answer streamed
// to its client, or measured by a sink that only counts).
type jsonOut struct {
	b    []byte
	sink func([]byte) error
	// piece is how much b holds before it is handed on (0: jsonPiece; the
	// tests use tiny pieces to try every place the JSON is cut).
	piece int
	// sent is what was handed to the sink; err the sink's first error,
	// after which nothing more is handed to it.
	sent int64
	err  error
	// measure: strings and binary data are counted, not rendered (their
	// length is all a measure needs, and binary's rendering is most of
	// the work); everything else is rendered as usual, for the sink to
	// drop. measureOnSpill turns measure on once a piece has been handed
	// on: what fits in a piece is kept whole, what does not is measured.
	measure, measureOnSpill bool
}

// spill hands b to the sink once it holds a piece.
func (o *jsonOut) spill() error {
	if o.sink == nil || len(o.b) < o.pieceSize() {
		return o.err
	}
	return o.flush()
}

func (o *jsonOut) pieceSize() int {
	if o.piece > 0 {
		return o.piece
	}
	return jsonPiece
}

// flush hands what b holds to the sink. Once the sink has failed, what
// is rendered after is dropped, not kept.
func (o *jsonOut) flush() error {
	if o.err != nil {
		o.b = o.b[:0]
		return o.err
	}
	if o.sink == nil || len(o.b) == 0 {
		return nil
	}
	o.err = o.sink(o.b)
	o.sent += int64(len(o.b))
	o.b = o.b[:0]
	if o.measureOnSpill {
		o.measure = true
	}
	return o.err
}

// size is every byte rendered so far.
func (o *jsonOut) size() int64 { return o.sent + int64(len(o.b)) }

// raw renders the value r, checked whole first: the walk below then
// trusts its lengths, and passes over each byte once.
func (o *jsonOut) raw(r Raw) error {
	if _, err := skip(r, 0, 0, extAny); err != nil {
		return err
	}
	_, err := o.value(r, 0, 0)
	return err
}

// value renders the (checked) value at b[i] and returns the offset past
// it. Numbers, strings and constants are rendered here; containers,
// binary and ext values each by a step of their own.
func (o *jsonOut) value(b []byte, i, depth int) (int, error) {
	if depth > maxDepth {
		return 0, errTooDeep
	}
	c := b[i]
	switch {
	case c <= 0x7f:
		o.b = strconv.AppendInt(o.b, int64(c), 10)
		return i + 1, nil
	case c >= 0xe0:
		o.b = strconv.AppendInt(o.b, int64(int8(c)), 10)
		return i + 1, nil
	case c == 0xcf:
		o.b = strconv.AppendUint(o.b, binary.BigEndian.Uint64(b[i+1:]), 10)
		return i + 9, nil
	case c == 0xd3:
		o.b = strconv.AppendInt(o.b, int64(binary.BigEndian.Uint64(b[i+1:])), 10)
		return i + 9, nil
	case (c >= 0xcc && c <= 0xd2) || c == 0xca || c == 0xcb:
		end := i + 1 + numWidth(c)
		f, _ := Raw(b[i:end]).Float()
		o.b = appendJSONNumber(o.b, f)
		return end, nil
	case c >= 0xa0 && c <= 0xbf, c == 0xd9, c == 0xda, c == 0xdb:
		s, e, err := strRange(b, i)
		if err != nil {
			return 0, err
		}
		return e, o.str(b[s:e])
	case c == 0xc0:
		o.b = append(o.b, "null"...)
		return i + 1, nil
	case c == 0xc2:
		o.b = append(o.b, "false"...)
		return i + 1, nil
	case c == 0xc3:
		o.b = append(o.b, "true"...)
		return i + 1, nil
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		return o.array(b, i, depth)
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		return o.object(b, i, depth)
	case c == 0xc4 || c == 0xc5 || c == 0xc6:
		return o.binary(b, c, i)
	}
	end, err := skip(b, i, depth, extAny)
	if err != nil {
		return 0, err
	}
	return end, o.ext(b[i:end], depth)
}

// numWidth is the bytes after a number's format byte c.
func numWidth(c byte) int {
	switch c {
	case 0xcc, 0xd0:
		return 1
	case 0xcd, 0xd1:
		return 2
	case 0xce, 0xd2, 0xca:
		return 4
	}
	return 8
}

// array renders the array at b[i], undefined elements as null.
func (o *jsonOut) array(b []byte, i, depth int) (int, error) {
	n, j, err := arrayHead(b[i:])
	if err != nil {
		return 0, err
	}
	j += i
	o.b = append(o.b, '[')
	for k := 0; k < n; k++ {
		if k > 0 {
			o.b = append(o.b, ',')
		}
		if undefinedAt(b, j) {
			o.b = append(o.b, "null"...)
			j += 3
		} else if j, err = o.value(b, j, depth+1); err != nil {
			return 0, err
		}
		if err := o.spill(); err != nil {
			return 0, err
		}
	}
	o.b = append(o.b, ']')
	return j, nil
}

// undefinedAt reports whether the value at b[j] is undefined (three
// bytes).
func undefinedAt(b []byte, j int) bool { return j+3 <= len(b) && isUndefined(b[j:j+3]) }

// object renders the map at b[i] as an object, leaving out the entries
// whose value is undefined.
func (o *jsonOut) object(b []byte, i, depth int) (int, error) {
	n, j, err := mapHeader(b, i)
	if err != nil {
		return 0, err
	}
	o.b = append(o.b, '{')
	first := true
	for k := 0; k < n; k++ {
		kend, err := skip(b, j, depth+1, extAny)
		if err != nil {
			return 0, err
		}
		if undefinedAt(b, kend) {
			j = kend + 3
			continue
		}
		if !first {
			o.b = append(o.b, ',')
		}
		first = false
		if err := o.key(b[j:kend]); err != nil {
			return 0, err
		}
		o.b = append(o.b, ':')
		if j, err = o.value(b, kend, depth+1); err != nil {
			return 0, err
		}
		if err := o.spill(); err != nil {
			return 0, err
		}
	}
	o.b = append(o.b, '}')
	return j, nil
}

// key renders a map key as the property name JavaScript gives it. A
// string is itself; a number, boolean, nil or undefined its text, as
// String() makes it. Any other key (a map, an array, binary, a date) is
// one JavaScript's decoder refuses outright (msgpackr: "Invalid property
// type"), and is named by the constant String() gives an object: rendering
// it as its own JSON, escaped into a name, doubled its length at each
// level of nesting (45 bytes of MessagePack rendered as 8 MB).
func (o *jsonOut) key(k []byte) error {
	if s, e, err := strRange(k, 0); err == nil {
		return o.str(k[s:e])
	}
	var text []byte
	switch c := k[0]; {
	case c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3) || c == 0xca || c == 0xcb:
		f, _ := Raw(k).Float()
		text = appendJSKeyNumber(nil, k, f)
	case c == 0xc0:
		text = []byte("null")
	case c == 0xc2:
		text = []byte("false")
	case c == 0xc3:
		text = []byte("true")
	case isUndefined(k):
		text = []byte("undefined")
	default:
		text = []byte("[object Object]")
	}
	o.b = appendJSONString(o.b, text)
	return nil
}

// appendJSKeyNumber writes a number key's text: its JSON form, but NaN and
// the infinities as JavaScript names them.
func appendJSKeyNumber(dst []byte, k []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, "NaN"...)
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	}
	var o jsonOut
	o.value(k, 0, 0)
	return append(dst, o.b...)
}

// binary renders a bin 8/16/32 (format byte c at b[i]) as an array of
// byte values, as JSON.stringify renders a Uint8Array's bytes.
func (o *jsonOut) binary(b []byte, c byte, i int) (int, error) {
	w := 1 << (c - 0xc4)
	l, j, err := readLen(b, i+1, w)
	if err != nil {
		return 0, err
	}
	data := b[j : j+l]
	if o.measure {
		n := int64(2 + max(l-1, 0)) // brackets and commas
		for _, x := range data {
			n += int64(byteDigits[x])
		}
		o.sent += n
		return j + l, nil
	}
	o.b = append(o.b, '[')
	if l > 0 {
		o.b = append(o.b, byteText[data[0]][:byteDigits[data[0]]]...)
		data = data[1:]
	}
	// The rest, a comma before each, a piece's worth at a time (four
	// bytes at most for each: ",255").
	every := max(o.pieceSize()/4, 1)
	for len(data) > 0 {
		part := data[:min(len(data), every)]
		data = data[len(part):]
		o.b = slices.Grow(o.b, 4*len(part))
		for _, x := range part {
			t := &byteText[x]
			switch byteDigits[x] {
			case 1:
				o.b = append(o.b, ',', t[0])
			case 2:
				o.b = append(o.b, ',', t[0], t[1])
			default:
				o.b = append(o.b, ',', t[0], t[1], t[2])
			}
		}
		if err := o.spill(); err != nil {
			return 0, err
		}
	}
	o.b = append(o.b, ']')
	return j + l, nil
}

// byteText and byteDigits are each byte value's decimal digits and their
// count: binary data is rendered from them rather than by formatting each
// byte.
var byteText, byteDigits = func() (text [256][3]byte, digits [256]uint8) {
	for v := range 256 {
		d := strconv.Itoa(v)
		copy(text[v][:], d)
		digits[v] = uint8(len(d))
	}
	return text, digits
}()

// str renders a string, a piece at a time when it is long: an eighth of a
// piece of it is escaped at a time (six times that, every byte escaped,
// is still under a piece), each part ending on a character's boundary so
// that no character is split.
func (o *jsonOut) str(s []byte) error {
	if o.measure {
		o.sent += 2 + escapedLen(s)
		return nil
	}
	o.b = append(o.b, '"')
	part := max(o.pieceSize()/8, utf8.UTFMax+1)
	for len(s) > part {
		cut := charCut(s, part)
		o.b = appendJSONStringBody(o.b, s[:cut])
		s = s[cut:]
		if err := o.spill(); err != nil {
			return err
		}
	}
	o.b = appendJSONStringBody(o.b, s)
	o.b = append(o.b, '"')
	return nil
}

// charCut is where to cut s near at so that the two parts escape as s
// does whole: before the character that covers at, if one does. A
// continuation byte no character covers stands alone (as U+FFFD) either
// way.
func charCut(s []byte, at int) int {
	if utf8.RuneStart(s[at]) {
		return at
	}
	for p := at - 1; p >= 0 && p > at-utf8.UTFMax; p-- {
		if utf8.RuneStart(s[p]) {
			if _, size := utf8.DecodeRune(s[p:]); p+size > at {
				return p
			}
			break
		}
	}
	return at
}

// ext renders the ext value v: undefined reads as null; the timestamp
// ext as a date; any other as null.
func (o *jsonOut) ext(v []byte, depth int) error {
	x, _, err := decodeAt(v, 0, depth)
	if err != nil {
		return err
	}
	switch x := x.(type) {
	case Undefined:
		o.b = append(o.b, "null"...)
		return nil
	case Ext:
		if t, ok := extTime(x); ok {
			o.b = appendJSONString(o.b, []byte(t.UTC().Format("2006-01-02T15:04:05.000Z")))
			return nil
		}
	}
	o.b = append(o.b, "null"...)
	return nil
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
	dst = append(dst, '"')
	dst = appendJSONStringBody(dst, s)
	return append(dst, '"')
}

// escapedLen is the length of s escaped as appendJSONStringBody escapes
// it.
func escapedLen(s []byte) int64 {
	var n int64
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
				n += 2
			case c < 0x20:
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			n += int64(len("\ufffd"))
		case r == '\u2028' || r == '\u2029':
			n += 6
		default:
			n += int64(size)
		}
		i += size
	}
	return n
}

// appendJSONStringBody writes s escaped, without the quotes.
func appendJSONStringBody(dst []byte, s []byte) []byte {
	const hex = "0123456789abcdef"
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
	return dst
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
