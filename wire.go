package main

// MessagePack codec and framing for the bunqueue wire protocol.
//
// Requests are never decoded into a tree. A frame is scanned once: the top
// map's keys and the byte ranges of their values are recorded, and handlers
// read typed fields on demand. Opaque user values (job data, results) stay as
// raw MessagePack bytes from the moment they arrive to the moment they leave,
// so they are never re-encoded and keep the client's exact encoding.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"unicode/utf8"
)

// MaxFrame is the largest frame either side may send (64 MiB).
const MaxFrame = 64 << 20

// maxDepth bounds nesting so that a hostile frame cannot exhaust the stack.
const maxDepth = 512

var (
	errTruncated = errors.New("truncated MessagePack value")
	errBadFormat = errors.New("invalid MessagePack format byte 0xc1")
	errTooDeep   = errors.New("MessagePack value nested too deeply")
)

// FrameSizeError is a frame header that declares more than the reader's
// limit: MaxFrame, or a smaller one before Auth.
type FrameSizeError struct {
	N, Max  uint32
	PreAuth bool // the limit is the one for a connection not yet authenticated
}

func (e *FrameSizeError) Error() string {
	if e.PreAuth {
		return fmt.Sprintf("Frame too large: %d bytes exceeds maximum %d before Auth (a connection that has not authenticated may send frames of %d KiB at most)",
			e.N, e.Max, e.Max>>10)
	}
	return fmt.Sprintf("Frame too large: %d bytes exceeds maximum %d", e.N, e.Max)
}

// ExtError reports an ext value where none is allowed. Field, when set,
// is the request field that holds it.
type ExtError struct {
	Type  int8
	Field string
}

func (e *ExtError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("field %s holds MessagePack ext type %d, which is not supported (only undefined, ext 0, and timestamp, ext -1, are)", e.Field, e.Type)
	}
	return fmt.Sprintf("MessagePack ext type %d is not supported", e.Type)
}

// extRule says which ext values a scan lets through.
type extRule uint8

const (
	// extNone allows msgpackr's undefined only.
	extNone extRule = iota
	// extKnown allows what the official client's decoder understands and
	// its encoder sends: undefined (type 0) and the timestamp (type -1) a
	// JavaScript Date becomes. The reference refuses a request holding any
	// other ext type, since its decoder knows no such type; and a value
	// kept with one could not be read back by the client (its getJob fails
	// with "Invalid response from server").
	extKnown
	// extAny allows every ext value: for values the server wrote itself.
	extAny
)

// allows reports whether an ext of type typ passes; data is its payload
// as a fixext or ext header declared it.
func (r extRule) allows(typ byte, fixed bool, b []byte) bool {
	switch r {
	case extAny:
		return true
	case extKnown:
		if typ == 0 || typ == 0xff {
			return true
		}
	}
	return fixed && isUndefined(b)
}

// Raw is one complete encoded MessagePack value.
type Raw []byte

var rawNil = Raw{0xc0}

// IsNil reports whether r is absent, nil, or the msgpackr "undefined" ext.
func (r Raw) IsNil() bool {
	return len(r) == 0 || r[0] == 0xc0 || isUndefined(r)
}

// isUndefined recognises msgpackr's encoding of JavaScript undefined
// (fixext1, type 0, data 0), which the official client can emit for
// optional fields; it is read as "absent", never as an ext value.
func isUndefined(b []byte) bool {
	return len(b) == 3 && b[0] == 0xd4 && b[1] == 0 && b[2] == 0
}

// ---------------------------------------------------------------------------
// Maps: the shape of every request.

// Field is one key/value pair of a map, as slices of the frame.
type Field struct {
	Key []byte
	Val Raw
}

// Map is a decoded map header with its fields, values still encoded.
type Map struct {
	Fields []Field
}

// size is the bytes of the map's keys and values.
func (m Map) size() int {
	n := 0
	for _, f := range m.Fields {
		n += len(f.Key) + len(f.Val)
	}
	return n
}

// FieldError names the request field that is wrong and why.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + " " + e.Msg }

// ParseMap reads a map whose keys are all strings. fields is reused to
// avoid allocating for every request. On error the fields read before the
// fault are still returned, so that a reqId may be echoed.
func ParseMap(b Raw, fields []Field) (Map, error) {
	return parseMap(b, fields, -1, extAny)
}

// FieldCountError is a request map with more fields than its limit.
type FieldCountError struct {
	N, Max  int
	PreAuth bool
}

func (e *FieldCountError) Error() string {
	if e.PreAuth {
		return fmt.Sprintf("a request before Auth is limited to %d fields (this one has %d)", e.Max, e.N)
	}
	return fmt.Sprintf("a request is limited to %d fields (this one has %d)", e.Max, e.N)
}

// parseRequest is ParseMap for a client's request: at most maxFields
// fields, refused before anything is allocated for them, and no ext value
// the official client could not read back (see extKnown). An ext refusal
// comes after the whole map is read, so that the reqId is echoed wherever
// it stands.
func parseRequest(b Raw, fields []Field, maxFields int) (Map, error) {
	return parseMap(b, fields, maxFields, extKnown)
}

func parseMap(b Raw, fields []Field, maxFields int, ext extRule) (Map, error) {
	n, i, err := mapHeader(b, 0)
	if err != nil {
		return Map{}, err
	}
	if maxFields >= 0 && n > maxFields {
		return Map{}, &FieldCountError{N: n, Max: maxFields}
	}
	if n > len(b)-i {
		return Map{}, errTruncated
	}
	fields = fields[:0]
	var extErr error
	for k := 0; k < n; k++ {
		ks, ke, err := strRange(b, i)
		if err != nil {
			if errors.Is(err, errNotStr) {
				err = errors.New("map keys must be strings")
			}
			return Map{Fields: fields}, err
		}
		// Values may hold the ext types the rule allows: the official
		// client packs a JavaScript Date inside job data as the timestamp
		// ext, and such data is passed through untouched. A field the
		// server reads refuses what is not its type, naming the field.
		ve, err := skip(b, ke, 1, ext)
		if err != nil {
			// Declared here, not for every field: errors.As takes its
			// address, which puts it on the heap, an allocation a field.
			var xe *ExtError
			if errors.As(err, &xe) && extErr == nil {
				extErr = &ExtError{Type: xe.Type, Field: string(b[ks:ke])}
				ve, err = skip(b, ke, 1, extAny)
			}
			if err != nil {
				return Map{Fields: fields}, err
			}
		}
		fields = append(fields, Field{Key: b[ks:ke], Val: b[ke:ve]})
		i = ve
	}
	if i != len(b) {
		return Map{Fields: fields}, fmt.Errorf("%d trailing bytes after MessagePack value", len(b)-i)
	}
	return Map{Fields: fields}, extErr
}

var errNotStr = errors.New("not a string")
var errNotMap = errors.New("not a map")

func mapHeader(b []byte, i int) (int, int, error) {
	if i >= len(b) {
		return 0, 0, errTruncated
	}
	c := b[i]
	switch {
	case c >= 0x80 && c <= 0x8f:
		return int(c & 0x0f), i + 1, nil
	case c == 0xde:
		return readLen(b, i+1, 2)
	case c == 0xdf:
		return readLen(b, i+1, 4)
	}
	return 0, 0, errNotMap
}

// strRange returns the byte range of the string starting at b[i] and the
// offset after it (which equals the end of the range).
func strRange(b []byte, i int) (int, int, error) {
	if i >= len(b) {
		return 0, 0, errTruncated
	}
	c := b[i]
	var l, j int
	var err error
	switch {
	case c >= 0xa0 && c <= 0xbf:
		l, j = int(c&0x1f), i+1
	case c == 0xd9:
		l, j, err = readLen(b, i+1, 1)
	case c == 0xda:
		l, j, err = readLen(b, i+1, 2)
	case c == 0xdb:
		l, j, err = readLen(b, i+1, 4)
	default:
		return 0, 0, errNotStr
	}
	if err != nil {
		return 0, 0, err
	}
	end, err := need(b, j, l)
	if err != nil {
		return 0, 0, err
	}
	return j, end, nil
}

// Get returns the raw value of key, or nil when absent or undefined. When a
// key repeats, the last one wins, as it does for a JavaScript decoder.
func (m Map) Get(key string) Raw {
	for i := len(m.Fields) - 1; i >= 0; i-- {
		f := &m.Fields[i]
		if string(f.Key) == key {
			if isUndefined(f.Val) {
				return nil
			}
			return f.Val
		}
	}
	return nil
}

// Has reports whether key is present with a non-nil value.
func (m Map) Has(key string) bool { return !m.Get(key).IsNil() }

// Str reads a string field. ok is false when the field is absent or nil.
func (m Map) Str(key string) (s string, ok bool, err error) {
	r := m.Get(key)
	if r.IsNil() {
		return "", false, nil
	}
	s, err = r.Str()
	if err != nil {
		return "", false, &FieldError{Field: key, Msg: "must be a string"}
	}
	return s, true, nil
}

// Key is Str for a field that names something kept as text (an id, a
// token, an owner): it must be storableText, which every storage can
// keep and look up (PostgreSQL's text refuses NUL and invalid UTF-8: one
// such id in a round of ACKs failed every ACK of the round).
func (m Map) Key(key string) (s string, ok bool, err error) {
	s, ok, err = m.Str(key)
	if err == nil && !storableText(s) {
		return "", false, &FieldError{Field: key, Msg: textRule}
	}
	return s, ok, err
}

// Keys is Strs for a list of such names.
func (m Map) Keys(key string) ([]string, bool, error) {
	out, ok, err := m.Strs(key)
	if err != nil {
		return nil, false, err
	}
	for k, s := range out {
		if !storableText(s) {
			return nil, false, &FieldError{Field: fmt.Sprintf("%s[%d]", key, k), Msg: textRule}
		}
	}
	return out, ok, nil
}

// textRule is the refusal of what is not storableText.
const textRule = "must be UTF-8 text without NUL characters"

// Num reads a numeric field of any MessagePack numeric form.
func (m Map) Num(key string) (f float64, ok bool, err error) {
	r := m.Get(key)
	if r.IsNil() {
		return 0, false, nil
	}
	f, err = r.Float()
	if err != nil {
		return 0, false, &FieldError{Field: key, Msg: "must be a number"}
	}
	return f, true, nil
}

// Int reads a numeric field as an integer; fractions are truncated toward
// zero as JavaScript's Math.trunc would, and non-finite values refused.
func (m Map) Int(key string) (int64, bool, error) {
	f, ok, err := m.Num(key)
	if err != nil || !ok {
		return 0, ok, err
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false, &FieldError{Field: key, Msg: "must be a finite number"}
	}
	if f > 9007199254740991 || f < -9007199254740991 {
		return 0, false, &FieldError{Field: key, Msg: "is out of range"}
	}
	return int64(f), true, nil
}

// Bool reads a boolean field; absent and nil read as false.
func (m Map) Bool(key string) (bool, bool, error) {
	r := m.Get(key)
	if r.IsNil() {
		return false, false, nil
	}
	switch r[0] {
	case 0xc2:
		return false, true, nil
	case 0xc3:
		return true, true, nil
	}
	return false, false, &FieldError{Field: key, Msg: "must be a boolean"}
}

// Map reads a nested map field.
func (m Map) Map(key string) (Map, bool, error) {
	r := m.Get(key)
	if r.IsNil() {
		return Map{}, false, nil
	}
	sub, err := ParseMap(r, nil)
	if err != nil {
		return Map{}, false, &FieldError{Field: key, Msg: "must be an object with string keys"}
	}
	return sub, true, nil
}

// maxArrayItems bounds an array field of a request. Each element costs
// the server far more than its byte on the wire (a slice entry of 16 to
// 24 bytes, a string header), so a 64 MiB array of empty strings would
// cost gigabytes; a million items is beyond any batch a client sends.
const maxArrayItems = 1000000

// arrayField reads an array field's header: the element count (checked
// against maxArrayItems and the bytes present) and where the elements
// start.
func (m Map) arrayField(key string) (r Raw, n, i int, ok bool, err error) {
	r = m.Get(key)
	if r.IsNil() {
		return nil, 0, 0, false, nil
	}
	n, i, err = arrayHead(r)
	if err != nil {
		return nil, 0, 0, false, &FieldError{Field: key, Msg: "must be an array"}
	}
	if n > maxArrayItems {
		return nil, 0, 0, false, &FieldError{Field: key, Msg: fmt.Sprintf("is limited to %d items (this one has %d)", maxArrayItems, n)}
	}
	return r, n, i, true, nil
}

// Array returns the elements of an array field as raw values.
func (m Map) Array(key string) ([]Raw, bool, error) {
	r, n, i, ok, err := m.arrayField(key)
	if err != nil || !ok {
		return nil, ok, err
	}
	items, err := arrayItems(r, n, i)
	if err != nil {
		return nil, false, &FieldError{Field: key, Msg: "must be an array"}
	}
	return items, true, nil
}

// Strs reads an array of strings, element by element: no slice of raw
// values in between.
func (m Map) Strs(key string) ([]string, bool, error) {
	r, n, i, ok, err := m.arrayField(key)
	if err != nil || !ok {
		return nil, ok, err
	}
	out := make([]string, n)
	for k := range out {
		s, e, err := strRange(r, i)
		if err != nil {
			if errors.Is(err, errNotStr) {
				return nil, false, &FieldError{Field: fmt.Sprintf("%s[%d]", key, k), Msg: "must be a string"}
			}
			return nil, false, &FieldError{Field: key, Msg: "must be an array"}
		}
		out[k] = string(r[s:e])
		i = e
	}
	if i != len(r) {
		return nil, false, &FieldError{Field: key, Msg: "must be an array"}
	}
	return out, true, nil
}

// Str decodes a string value.
func (r Raw) Str() (string, error) {
	s, e, err := strRange(r, 0)
	if err != nil {
		return "", err
	}
	if e != len(r) {
		return "", errNotStr
	}
	return string(r[s:e]), nil
}

// Float decodes any numeric value as float64.
func (r Raw) Float() (float64, error) {
	if len(r) == 0 {
		return 0, errTruncated
	}
	c := r[0]
	switch {
	case c <= 0x7f:
		return float64(c), nil
	case c >= 0xe0:
		return float64(int8(c)), nil
	}
	switch c {
	case 0xcc:
		if len(r) < 2 {
			return 0, errTruncated
		}
		return float64(r[1]), nil
	case 0xcd:
		if len(r) < 3 {
			return 0, errTruncated
		}
		return float64(binary.BigEndian.Uint16(r[1:])), nil
	case 0xce:
		if len(r) < 5 {
			return 0, errTruncated
		}
		return float64(binary.BigEndian.Uint32(r[1:])), nil
	case 0xcf:
		if len(r) < 9 {
			return 0, errTruncated
		}
		return float64(binary.BigEndian.Uint64(r[1:])), nil
	case 0xd0:
		if len(r) < 2 {
			return 0, errTruncated
		}
		return float64(int8(r[1])), nil
	case 0xd1:
		if len(r) < 3 {
			return 0, errTruncated
		}
		return float64(int16(binary.BigEndian.Uint16(r[1:]))), nil
	case 0xd2:
		if len(r) < 5 {
			return 0, errTruncated
		}
		return float64(int32(binary.BigEndian.Uint32(r[1:]))), nil
	case 0xd3:
		if len(r) < 9 {
			return 0, errTruncated
		}
		return float64(int64(binary.BigEndian.Uint64(r[1:]))), nil
	case 0xca:
		if len(r) < 5 {
			return 0, errTruncated
		}
		return float64(math.Float32frombits(binary.BigEndian.Uint32(r[1:]))), nil
	case 0xcb:
		if len(r) < 9 {
			return 0, errTruncated
		}
		return math.Float64frombits(binary.BigEndian.Uint64(r[1:])), nil
	}
	return 0, errors.New("not a number")
}

// Array splits an array value into its elements.
func (r Raw) Array() ([]Raw, error) {
	n, i, err := arrayHead(r)
	if err != nil {
		return nil, err
	}
	return arrayItems(r, n, i)
}

// arrayHead reads an array header: the element count and the offset of
// the first element. Every element takes at least one byte, so a count
// larger than the bytes left is refused before anything is allocated for
// it: what an array costs is bounded by the bytes that arrived.
func arrayHead(r []byte) (n, i int, err error) {
	if len(r) == 0 {
		return 0, 0, errTruncated
	}
	c := r[0]
	switch {
	case c >= 0x90 && c <= 0x9f:
		n, i = int(c&0x0f), 1
	case c == 0xdc:
		n, i, err = readLen(r, 1, 2)
	case c == 0xdd:
		n, i, err = readLen(r, 1, 4)
	default:
		return 0, 0, errors.New("not an array")
	}
	if err != nil {
		return 0, 0, err
	}
	if n > len(r)-i {
		return 0, 0, errTruncated
	}
	return n, i, nil
}

func arrayItems(r Raw, n, i int) ([]Raw, error) {
	out := make([]Raw, n)
	for k := 0; k < n; k++ {
		e, err := skip(r, i, 1, extAny)
		if err != nil {
			return nil, err
		}
		out[k] = r[i:e]
		i = e
	}
	return out, nil
}

// ---------------------------------------------------------------------------
// Encoding

// Enc appends MessagePack to a byte slice. Responses are written straight
// into the connection's output buffer through it.
type Enc struct {
	B []byte
}

func (e *Enc) Nil() { e.B = append(e.B, 0xc0) }

// Undefined writes msgpackr's JavaScript undefined (fixext1, type 0), which
// the reference sends where a value is absent but its key is not.
func (e *Enc) Undefined() { e.B = append(e.B, 0xd4, 0, 0) }
func (e *Enc) Raw(r Raw) {
	if len(r) == 0 {
		e.Nil()
		return
	}
	e.B = appendBig(e.B, r)
}

// bigCopy is the most one copy moves at once. The runtime's memmove
// cannot be preempted (a preemption signal that lands in it is lost), and
// on a machine whose page faults are slow a copy of 10 MB into fresh
// memory takes 50-120 ms, during which a collection waiting to stop the
// world holds up every goroutine: other clients' Pings took hundreds of
// milliseconds while big answers were built. Between pieces the copy
// yields, which also lets a waiting stop happen.
const bigCopy = 256 << 10

// appendBig appends src to dst a bigCopy at a time, growing dst at most
// once (its old bytes also copied a bigCopy at a time).
func appendBig(dst, src []byte) []byte {
	if len(src) <= bigCopy {
		return append(dst, src...)
	}
	dst = growBig(dst, len(src))
	for len(src) > 0 {
		n := min(len(src), bigCopy)
		dst = append(dst, src[:n]...)
		src = src[n:]
		runtime.Gosched()
	}
	return dst
}

// growBig makes room for n more bytes in b, as append would (doubling),
// copying what b holds a bigCopy at a time.
func growBig(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b
	}
	nb := make([]byte, 0, max(len(b)+n, 2*cap(b)))
	for len(nb) < len(b) {
		nb = append(nb, b[len(nb):min(len(b), len(nb)+bigCopy)]...)
		if len(nb) < len(b) {
			runtime.Gosched()
		}
	}
	return nb
}

func (e *Enc) Bool(v bool) {
	if v {
		e.B = append(e.B, 0xc3)
	} else {
		e.B = append(e.B, 0xc2)
	}
}

// Int writes an integer the way a JavaScript peer can use it: within the
// int32 range as the smallest integer form, beyond it as float64 (exact to
// 2^53), since int64/uint64 decode as BigInt there.
func (e *Enc) Int(v int64) {
	if v >= math.MinInt32 && v <= math.MaxInt32 {
		e.intCompact(v)
		return
	}
	e.Float64(float64(v))
}

func (e *Enc) intCompact(v int64) {
	switch {
	case v >= 0 && v <= 0x7f:
		e.B = append(e.B, byte(v))
	case v >= -32 && v < 0:
		e.B = append(e.B, byte(int8(v)))
	case v >= 0 && v <= math.MaxUint8:
		e.B = append(e.B, 0xcc, byte(v))
	case v >= 0 && v <= math.MaxUint16:
		e.B = append(e.B, 0xcd, byte(v>>8), byte(v))
	case v >= 0 && v <= math.MaxUint32:
		e.B = append(e.B, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	case v >= math.MinInt8 && v < 0:
		e.B = append(e.B, 0xd0, byte(int8(v)))
	case v >= math.MinInt16 && v < 0:
		e.B = append(e.B, 0xd1, byte(v>>8), byte(v))
	case v >= math.MinInt32 && v < 0:
		e.B = append(e.B, 0xd2, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		e.B = append(e.B, 0xd3)
		e.B = binary.BigEndian.AppendUint64(e.B, uint64(v))
	}
}

// Int64Exact writes any int64 in its smallest integer form, int64 included.
// Only for peers that want 64-bit integers; the server's responses use Int.
func (e *Enc) Int64Exact(v int64) { e.intCompact(v) }

// Uint64Exact writes any uint64 in its smallest unsigned form.
func (e *Enc) Uint64Exact(v uint64) {
	if v <= math.MaxUint32 {
		e.intCompact(int64(v))
		return
	}
	e.B = append(e.B, 0xcf)
	e.B = binary.BigEndian.AppendUint64(e.B, v)
}

// Num writes a JavaScript number: integral values within int32 compactly,
// everything else as float64.
func (e *Enc) Num(f float64) {
	if f == math.Trunc(f) && f >= math.MinInt32 && f <= math.MaxInt32 && !(f == 0 && math.Signbit(f)) {
		e.intCompact(int64(f))
		return
	}
	e.Float64(f)
}

func (e *Enc) Float64(f float64) {
	e.B = append(e.B, 0xcb)
	e.B = binary.BigEndian.AppendUint64(e.B, math.Float64bits(f))
}

func (e *Enc) Float32(f float32) {
	e.B = append(e.B, 0xca)
	e.B = binary.BigEndian.AppendUint32(e.B, math.Float32bits(f))
}

func (e *Enc) Str(s string) {
	e.strHead(len(s))
	e.B = append(e.B, s...)
}

// JobID writes the job's id as a string, without making its text.
func (e *Enc) JobID(j *Job) {
	e.strHead(j.idLen())
	e.B = j.appendID(e.B)
}

func (e *Enc) strHead(l int) {
	switch {
	case l <= 31:
		e.B = append(e.B, 0xa0|byte(l))
	case l <= math.MaxUint8:
		e.B = append(e.B, 0xd9, byte(l))
	case l <= math.MaxUint16:
		e.B = append(e.B, 0xda, byte(l>>8), byte(l))
	default:
		e.B = append(e.B, 0xdb)
		e.B = binary.BigEndian.AppendUint32(e.B, uint32(l))
	}
}

func (e *Enc) Bin(b []byte) {
	l := len(b)
	switch {
	case l <= math.MaxUint8:
		e.B = append(e.B, 0xc4, byte(l))
	case l <= math.MaxUint16:
		e.B = append(e.B, 0xc5, byte(l>>8), byte(l))
	default:
		e.B = append(e.B, 0xc6)
		e.B = binary.BigEndian.AppendUint32(e.B, uint32(l))
	}
	e.B = append(e.B, b...)
}

func (e *Enc) ArrayHead(n int) {
	switch {
	case n <= 15:
		e.B = append(e.B, 0x90|byte(n))
	case n <= math.MaxUint16:
		e.B = append(e.B, 0xdc, byte(n>>8), byte(n))
	default:
		e.B = append(e.B, 0xdd)
		e.B = binary.BigEndian.AppendUint32(e.B, uint32(n))
	}
}

func (e *Enc) MapHead(n int) {
	switch {
	case n <= 15:
		e.B = append(e.B, 0x80|byte(n))
	case n <= math.MaxUint16:
		e.B = append(e.B, 0xde, byte(n>>8), byte(n))
	default:
		e.B = append(e.B, 0xdf)
		e.B = binary.BigEndian.AppendUint32(e.B, uint32(n))
	}
}

// OpenMap starts a map whose size is known only at the end; CloseMap
// patches the count. Uses map16, as the official client does.
func (e *Enc) OpenMap() int {
	e.B = append(e.B, 0xde, 0, 0)
	return len(e.B) - 3
}

func (e *Enc) CloseMap(at, n int) {
	e.B[at+1] = byte(n >> 8)
	e.B[at+2] = byte(n)
}

// MapWriter writes a map and counts its keys as they are written, so that
// no count is kept by hand: e.BeginMap(), then Key before each value, then
// End.
type MapWriter struct {
	e     *Enc
	at, n int
}

// BeginMap starts a map written through the MapWriter.
func (e *Enc) BeginMap() MapWriter { return MapWriter{e: e, at: e.OpenMap()} }

// Key writes a key, counted, and answers the encoder for its value.
func (m *MapWriter) Key(k string) *Enc {
	m.n++
	m.e.Str(k)
	return m.e
}

// End writes the count into the map's header.
func (m *MapWriter) End() { m.e.CloseMap(m.at, m.n) }

// OpenArray and CloseArray do the same for arrays (array32, so that any
// count fits).
func (e *Enc) OpenArray() int {
	e.B = append(e.B, 0xdd, 0, 0, 0, 0)
	return len(e.B) - 5
}

func (e *Enc) CloseArray(at, n int) {
	binary.BigEndian.PutUint32(e.B[at+1:], uint32(n))
}

func (e *Enc) Ext(typ int8, data []byte) {
	l := len(data)
	switch l {
	case 1, 2, 4, 8, 16:
		code := byte(0xd4)
		for s := 1; s < l; s <<= 1 {
			code++
		}
		e.B = append(e.B, code, byte(typ))
	default:
		switch {
		case l <= math.MaxUint8:
			e.B = append(e.B, 0xc7, byte(l), byte(typ))
		case l <= math.MaxUint16:
			e.B = append(e.B, 0xc8, byte(l>>8), byte(l), byte(typ))
		default:
			e.B = append(e.B, 0xc9)
			e.B = binary.BigEndian.AppendUint32(e.B, uint32(l))
			e.B = append(e.B, byte(typ))
		}
	}
	e.B = append(e.B, data...)
}

// Any encodes a Go value of the kinds Decode produces (and common others).
// Integers follow the wire rule of Int.
func (e *Enc) Any(v any) error {
	switch x := v.(type) {
	case nil:
		e.Nil()
	case Undefined:
		e.B = append(e.B, 0xd4, 0, 0)
	case bool:
		e.Bool(x)
	case int:
		e.Int(int64(x))
	case int64:
		e.Int(x)
	case int32:
		e.Int(int64(x))
	case uint64:
		e.Float64(float64(x))
	case float64:
		e.Num(x)
	case float32:
		e.Float32(x)
	case string:
		e.Str(x)
	case []byte:
		e.Bin(x)
	case Raw:
		e.Raw(x)
	case []string:
		e.ArrayHead(len(x))
		for _, s := range x {
			e.Str(s)
		}
	case []any:
		e.ArrayHead(len(x))
		for _, it := range x {
			if err := e.Any(it); err != nil {
				return err
			}
		}
	case map[string]any:
		e.MapHead(len(x))
		for k, it := range x {
			e.Str(k)
			if err := e.Any(it); err != nil {
				return err
			}
		}
	case Ext:
		e.Ext(x.Type, x.Data)
	default:
		return fmt.Errorf("cannot encode %T", v)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Framing: a 4-byte big-endian length, then that many bytes.

// ReadFrame reads one frame into buf (grown as needed) and returns its body.
// A declared length over MaxFrame is an error before anything is allocated.
func ReadFrame(r *bufio.Reader, buf []byte) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return buf, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return buf, &FrameSizeError{N: n, Max: MaxFrame}
	}
	return readFrameBody(r, buf, int(n))
}

// readFrameBody reads a frame body of n bytes into buf. It grows with the data
// actually received, so that a header declaring a huge frame costs
// nothing until the bytes arrive.
func readFrameBody(r io.Reader, buf []byte, n int) ([]byte, error) {
	buf = buf[:0]
	for len(buf) < n {
		chunk := n - len(buf)
		if grow := max(len(buf), 64<<10); chunk > grow {
			chunk = grow
		}
		if cap(buf)-len(buf) < chunk {
			nb := make([]byte, len(buf), len(buf)+chunk)
			copy(nb, buf)
			buf = nb
		}
		k, err := io.ReadFull(r, buf[len(buf):len(buf)+chunk])
		buf = buf[:len(buf)+k]
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return buf, err
		}
	}
	return buf, nil
}

// BeginFrame reserves the length prefix; EndFrame fills it in.
func (e *Enc) BeginFrame() int {
	e.B = append(e.B, 0, 0, 0, 0)
	return len(e.B) - 4
}

func (e *Enc) EndFrame(at int) {
	binary.BigEndian.PutUint32(e.B[at:], uint32(len(e.B)-at-4))
	if frameCheck != nil {
		frameCheck(e.B[at+4:])
	}
}

// frameCheck sees every frame's body as it is closed. The tests set it to a
// check that the body is one whole MessagePack value, so that a map or
// array header counted by hand (MapHead, ArrayHead) that announces more or
// fewer entries than follow fails the suite wherever the suite reaches it.
// The server leaves it nil.
var frameCheck func(body []byte)

// validUTF8 is used where a string is about to become a map key or a name
// a person reads; the wire itself does not require it.
func validUTF8(s string) bool { return utf8.ValidString(s) }
