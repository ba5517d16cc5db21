package main

// A job's id. Nearly every id is a UUID the broker made (newUUID) or a
// client's UUID in the canonical text form (8-4-4-4-12 lowercase hex
// digits). Such an id is kept as its 16 bytes in Job.id, where the text
// would cost a 16-byte string header and a 48-byte allocation for its 36
// characters; the text is made again when it is read (ID) or written
// straight into an answer or a record (appendID). Any other id (a custom
// id such as "order-42", an upper-case UUID, the nil UUID) is kept as
// text in the cold part (jobCold.rawID) with Job.id all zero, so that
// every id reads back exactly as it came.

import "encoding/hex"

// ID is the job's id as text: a new string for a UUID, so that the hot
// paths write it with appendID or compare it through idKey instead.
func (j *Job) ID() string {
	if j.id == ([16]byte{}) {
		return j.cold().rawID
	}
	var b [36]byte // one allocation, the string's
	return string(appendUUID(b[:0], j.id))
}

// setID gives the job its id, kept in whichever form fits (see above).
func (j *Job) setID(s string) {
	if u, ok := parseUUID(s); ok {
		j.id = u
		if j.c != nil {
			j.c.rawID = ""
		}
		return
	}
	j.id = [16]byte{}
	if s != "" || j.c != nil {
		j.warm().rawID = s
	}
}

// setIDBytes is setID for an id read from a record: no string is made
// for a UUID.
func (j *Job) setIDBytes(b []byte) {
	if u, ok := parseUUID(b); ok {
		j.id = u
		if j.c != nil {
			j.c.rawID = ""
		}
		return
	}
	j.setID(string(b))
}

// appendID appends the job's id as text.
func (j *Job) appendID(dst []byte) []byte {
	if j.id == ([16]byte{}) {
		return append(dst, j.cold().rawID...)
	}
	return appendUUID(dst, j.id)
}

// idLen is the length of the job's id as text.
func (j *Job) idLen() int {
	if j.id == ([16]byte{}) {
		return len(j.cold().rawID)
	}
	return 36
}

// hasID reports whether the job's id is s, without making its text.
func (j *Job) hasID(s string) bool {
	return j.idIs(keyOf(s))
}

// idKey is an id in the job's own form: its 16 bytes for a canonical
// UUID, its text otherwise. Looking an id up converts it once.
type idKey struct {
	u [16]byte
	s string
}

func keyOf(s string) idKey {
	if u, ok := parseUUID(s); ok {
		return idKey{u: u}
	}
	return idKey{s: s}
}

func (j *Job) key() idKey {
	if j.id == ([16]byte{}) {
		return idKey{s: j.cold().rawID}
	}
	return idKey{u: j.id}
}

func (j *Job) idIs(k idKey) bool {
	if k.u == ([16]byte{}) {
		return j.id == ([16]byte{}) && j.cold().rawID == k.s
	}
	return j.id == k.u
}

// parseUUID reads a UUID in the canonical text form; false for any other
// text, and for the nil UUID, whose zero bytes mark a text id.
func parseUUID[T string | []byte](s T) (u [16]byte, ok bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	k := 0
	for i := 0; i < 36; i += 2 {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			i-- // a dash (checked above): the next pair starts after it
			continue
		}
		hi, ok1 := lowerHex(s[i])
		lo, ok2 := lowerHex(s[i+1])
		if !ok1 || !ok2 {
			return [16]byte{}, false
		}
		u[k] = hi<<4 | lo
		k++
	}
	return u, u != [16]byte{}
}

// lowerHex reads one lower-case hex digit: an upper-case one would not
// come back the same from appendUUID.
func lowerHex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// appendUUID appends u in the canonical text form.
func appendUUID(dst []byte, u [16]byte) []byte {
	n := len(dst)
	dst = append(dst, "00000000-0000-0000-0000-000000000000"...)
	s := dst[n:]
	hex.Encode(s[0:8], u[0:4])
	hex.Encode(s[9:13], u[4:6])
	hex.Encode(s[14:18], u[6:8])
	hex.Encode(s[19:23], u[8:10])
	hex.Encode(s[24:36], u[10:16])
	return dst
}

// withID gives j the id and returns it, for a Job written as a literal.
func withID(j *Job, id string) *Job {
	j.setID(id)
	return j
}
