package main

// MCP answers sized for an agent. An agent reads an answer into its
// context, where a megabyte is already a lot; and an answer is JSON twice
// over: a tool's JSON text, indented, escaped again inside the MCP text
// content. Rendered as it came, a job of 9.9 MB of binary data (a
// JavaScript Buffer) became 130 MB of escaped numbers, and one get_jobs
// over six of them took a server from 118 MB to 5.2 GB.
//
// So every answer has a cap (--mcp-max-answer-bytes, 1 MiB by default),
// counted on the JSON-RPC message as written:
//
//   - a value the server sends (job data, results, progress, anything a
//     user sized) is rendered only when a bound of what it takes in the
//     answer, worked out from its MessagePack before anything is
//     rendered, is within a sixteenth of the cap; otherwise it is shown
//     as its type and length ("[not shown: binary of 10,380,000 bytes;
//     ...]");
//   - a list of jobs keeps the first jobs that fit, each measured as it
//     will be written, and says how many it left out and how to page on;
//   - an answer that cannot fit even so is refused, naming the limit.
//
// Nothing is rendered past what the answer can hold: a tool's rendering
// stops at twice the cap (mcpFit.left), whatever the wire answer holds.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

const (
	// defaultMCPAnswer is the cap of one MCP answer.
	defaultMCPAnswer = 1 << 20
	// minMCPAnswer and maxMCPAnswer bound --mcp-max-answer-bytes: room
	// for the tool list (31 KB), which no agent can do without; and no
	// JSON answer over the protocol's frame limit.
	minMCPAnswer = 64 << 10
	maxMCPAnswer = MaxFrame
	// mcpValueShare: a value is shown when it takes at most this part of
	// the cap (64 KiB of 1 MiB).
	mcpValueShare = 16
	// mcpTightValue is what a value may take in the jobs of a pull shown
	// past what fits in full: those jobs were taken, so each is shown,
	// with its bigger values summarised.
	mcpTightValue = 256
	// mcpValueDepth is the indentation depth a value's bound is worked
	// out for: a job's data in a list (object, list, job, value). The
	// answer is measured whole at the end, so a deeper one is still
	// held to the cap.
	mcpValueDepth = 4
	// mcpMaxID bounds a JSON-RPC id: every answer repeats it, so that an
	// id of megabytes would make every answer too big to give.
	mcpMaxID = 1 << 10
)

// checkMCPAnswer refuses a cap out of its range.
func checkMCPAnswer(n int64, flag string) error {
	if n < minMCPAnswer || n > maxMCPAnswer {
		return fmt.Errorf("%s must be from %s to %s, not %d", flag, sizeText(minMCPAnswer), sizeText(maxMCPAnswer), n)
	}
	return nil
}

// mcpFit is one request's room: what its answer may take, and what the
// tool has rendered so far.
type mcpFit struct {
	max      int64 // the cap (--mcp-max-answer-bytes)
	text     int64 // the escaped text's room: the cap less the envelope
	valueMax int64 // the most one value may take
	left     int64 // what the tool may still render
	tight    bool  // values of more than mcpTightValue are summarised
	full     bool  // a value was summarised for want of room
}

func newMCPFit(max int64, envelope int) *mcpFit {
	return &mcpFit{max: max, text: max - int64(envelope), valueMax: max / mcpValueShare, left: 2 * max}
}

// errMCPTooBig is the refusal of an answer that cannot fit.
func errMCPTooBig(max int64) string {
	return fmt.Sprintf("the answer does not fit: an MCP answer is limited to %s (--mcp-max-answer-bytes); ask for less (a smaller page, fewer jobs)",
		sizeText(max))
}

// val renders a value of a wire answer as JSON, or its summary when it is
// too big to show. A backend without a fit (the HTTP handlers') renders
// it whole.
func (b *mcpBackend) val(r Raw) []byte {
	f := b.fit
	if f == nil {
		return rawJSON(r)
	}
	if absent(r) {
		return nil
	}
	lim := f.valueMax
	if f.tight {
		lim = min(lim, mcpTightValue)
	}
	// Decided from the MessagePack alone: a value longer than the limit
	// takes at least that much as JSON, and is not walked.
	if int64(len(r)) <= lim {
		cost, err := mcpCost(r, mcpValueDepth, lim)
		if err != nil {
			return []byte("null")
		}
		if cost <= lim {
			if cost <= f.left {
				out, err := appendJSON(nil, r)
				if err != nil {
					return []byte("null")
				}
				f.left -= int64(len(out))
				return out
			}
			f.full = true
			return b.summary(r, fmt.Sprintf("the answer's room, %s (--mcp-max-answer-bytes), is spent", sizeText(f.max)))
		}
	}
	return b.summary(r, fmt.Sprintf("an MCP answer shows values of up to %s", sizeText(lim)))
}

// or is JavaScript's r ?? def, as JSON.
func (b *mcpBackend) or(r Raw, def string) []byte {
	if nullish(r) {
		return []byte(def)
	}
	return b.val(r)
}

// summary is a value shown as its type and length.
func (b *mcpBackend) summary(r Raw, why string) []byte {
	s := jsonStr("[not shown: " + mpKind(r) + "; " + why + "]")
	if b.fit != nil {
		b.fit.left -= int64(len(s))
	}
	return s
}

// mpKind says what a MessagePack value is and how long: "binary of
// 10,380,000 bytes", "object of 3 keys, 1,234 bytes as MessagePack".
func mpKind(r Raw) string {
	if len(r) == 0 {
		return "nothing"
	}
	c := r[0]
	switch {
	case c == 0xc4 || c == 0xc5 || c == 0xc6:
		if l, _, err := readLen(r, 1, 1<<(c-0xc4)); err == nil {
			return "binary of " + groupDigits(float64(l)) + " bytes"
		}
	case c >= 0xa0 && c <= 0xbf, c == 0xd9, c == 0xda, c == 0xdb:
		if s, e, err := strRange(r, 0); err == nil {
			return "string of " + groupDigits(float64(e-s)) + " bytes"
		}
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		if n, _, err := arrayHead(r); err == nil {
			return "array of " + groupDigits(float64(n)) + " items, " + groupDigits(float64(len(r))) + " bytes as MessagePack"
		}
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		if n, _, err := mapHeader(r, 0); err == nil {
			return "object of " + groupDigits(float64(n)) + " keys, " + groupDigits(float64(len(r))) + " bytes as MessagePack"
		}
	}
	return "a value of " + groupDigits(float64(len(r))) + " bytes as MessagePack"
}

// ---------------------------------------------------------------------------
// What a value takes in an answer, from its MessagePack

// mcpCost bounds the bytes the MessagePack value r takes in an MCP
// answer: rendered as appendJSON renders it, indented at depth as
// json.Indent indents it (two spaces a level), and escaped as a JSON
// string. It stops once the bound passes limit (answering more than
// limit): the walk costs no more than the bytes it reads, and allocates
// nothing.
func mcpCost(r Raw, depth int, limit int64) (int64, error) {
	w := costWalk{b: r, limit: limit}
	if _, err := w.at(0, depth, 0); err != nil && err != errCostOver {
		return 0, err
	}
	return w.cost, nil
}

type costWalk struct {
	b     []byte
	cost  int64
	limit int64
}

var errCostTruncated = fmt.Errorf("malformed value: %w", errTruncated)

// errCostOver ends a walk whose bound passed its limit.
var errCostOver = errors.New("over the limit")

// at adds the bound of the value at b[i], at indentation d, and answers
// the offset past it. nest counts the containers it is in, to refuse
// what appendJSON would refuse.
func (w *costWalk) at(i, d, nest int) (int, error) {
	if nest > maxDepth {
		return 0, errTooDeep
	}
	if w.cost > w.limit {
		return 0, errCostOver // the rest need not be looked at
	}
	b := w.b
	if i >= len(b) {
		return 0, errCostTruncated
	}
	c := b[i]
	switch {
	case c <= 0x7f || c >= 0xe0:
		w.cost += 3
		return i + 1, nil
	case c == 0xc0 || c == 0xc2 || c == 0xc3:
		w.cost += 5
		return i + 1, nil
	case c >= 0xca && c <= 0xd3:
		end, err := skip(b, i, 0, extAny)
		w.cost += 24
		return end, err
	case c >= 0xa0 && c <= 0xbf, c == 0xd9, c == 0xda, c == 0xdb:
		s, e, err := strRange(b, i)
		if err != nil {
			return 0, err
		}
		w.cost += strCost(b[s:e])
		return e, nil
	case c == 0xc4 || c == 0xc5 || c == 0xc6:
		l, j, err := readLen(b, i+1, 1<<(c-0xc4))
		if err != nil {
			return 0, err
		}
		end, err := need(b, j, l)
		if err != nil {
			return 0, err
		}
		// An array of numbers: each up to "255", on a line of its own.
		w.container(int64(l), d, 3)
		return end, nil
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		return w.array(i, d, nest)
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		return w.mapAt(i, d, nest)
	}
	// An ext: null, or a date as an ISO string.
	end, err := skip(b, i, 0, extAny)
	w.cost += 30
	return end, err
}

// array is at for an array: its items, a level deeper.
func (w *costWalk) array(i, d, nest int) (int, error) {
	n, j, err := arrayHead(w.b[i:])
	if err != nil {
		return 0, err
	}
	j += i
	w.container(int64(n), d, 0)
	for k := 0; k < n; k++ {
		if j, err = w.at(j, d+1, nest+1); err != nil {
			return 0, err
		}
	}
	return j, nil
}

// mapAt is at for a map: each entry's key and ": ", and its value a level
// deeper.
func (w *costWalk) mapAt(i, d, nest int) (int, error) {
	b := w.b
	n, j, err := mapHeader(b, i)
	if err != nil {
		return 0, err
	}
	if n > (len(b)-j)/2 {
		return 0, errCostTruncated
	}
	w.container(int64(n), d, 2)
	for k := 0; k < n; k++ {
		if s, e, err := strRange(b, j); err == nil {
			w.cost += strCost(b[s:e])
			j = e
		} else {
			// A key that is not a string is rendered as its JSON, quoted:
			// each of its bytes becomes at most 6 of JSON, escaped twice.
			end, err := skip(b, j, nest+1, extAny)
			if err != nil {
				return 0, err
			}
			w.cost += 28*int64(end-j) + 8
			j = end
		}
		if j, err = w.at(j, d+1, nest+1); err != nil {
			return 0, err
		}
	}
	return j, nil
}

// strCost is what a string takes in an answer: quoted by
// appendJSONString, then escaped again as part of the text.
func strCost(s []byte) int64 {
	n := int64(4) // the quotes, escaped: \"
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				n += 4 // \\\"
			case c == '\n' || c == '\r' || c == '\t':
				n += 3 // \\n
			case c < 0x20:
				n += 7 // \\u001f
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			n += 3 // U+FFFD
		case r == '\u2028' || r == '\u2029':
			n += 7 // \\u2028
		default:
			n += int64(size)
		}
		i += size
	}
	return n
}

// container adds what an array or object of n items at depth d takes
// besides its items: its brackets, and for each item a line of its own
// (an escaped newline, the indentation, a comma) and each bare.
func (w *costWalk) container(n int64, d int, each int64) {
	if n == 0 {
		w.cost += 2
		return
	}
	w.cost += 2 + n*(2+2*int64(d+1)+1+each) + 2 + 2*int64(d)
}

// ---------------------------------------------------------------------------
// Measuring what is written

// indentCost is what an item of a list takes in the answer's text: on a
// line of its own at depth d, indented, with its comma, escaped. scratch
// is reused from item to item.
func indentCost(scratch *bytes.Buffer, item []byte, d int) int64 {
	scratch.Reset()
	prefix := strings.Repeat("  ", d)
	if json.Indent(scratch, item, prefix, "  ") != nil {
		scratch.Reset()
		scratch.Write(item)
	}
	return escapedLen(scratch.Bytes()) + 2 + 2*int64(d) + 1
}

// textCost is what JSON text takes in the answer, indented and escaped.
func textCost(b []byte) int64 { return escapedLen(pretty(b)) }

// mcpNoteRoom is kept, in a list's room, for the note that tells what was
// left out.
const mcpNoteRoom = 640

// fitJobs renders the jobs of a list that fit in the answer, the first
// ones, each on a line at depth d; rest is what the answer's text takes
// besides the list (textCost of it with the list empty). It answers the
// jobs shown and how many were left out. With all, no job is left out
// (they were taken by a pull, and the agent must know them): every job is
// first measured with its values summarised, and the first ones are then
// shown in full while the room left allows; when even the summarised
// ones do not fit, the answer is refused.
func (b *mcpBackend) fitJobs(raws []Raw, rest int64, d int, all bool) (kept [][]byte, left int, err error) {
	f := b.fit
	if f == nil {
		for _, r := range raws {
			j, err := b.job(r)
			if err != nil {
				return nil, 0, err
			}
			kept = append(kept, j)
		}
		return kept, 0, nil
	}
	room := f.text - rest - mcpNoteRoom
	var scratch bytes.Buffer
	if all {
		return b.fitAll(raws, room, d, &scratch)
	}
	for i, r := range raws {
		j, err := b.job(r)
		if err != nil {
			return nil, 0, err
		}
		cost := indentCost(&scratch, j, d)
		if cost > room {
			return kept, len(raws) - i, nil
		}
		room -= cost
		kept = append(kept, j)
	}
	return kept, 0, nil
}

// fitAll is fitJobs showing every job.
func (b *mcpBackend) fitAll(raws []Raw, room int64, d int, scratch *bytes.Buffer) ([][]byte, int, error) {
	f := b.fit
	kept := make([][]byte, len(raws))
	costs := make([]int64, len(raws))
	f.tight = true
	for i, r := range raws {
		j, err := b.job(r)
		if err != nil {
			f.tight = false
			return nil, 0, err
		}
		kept[i], costs[i] = j, indentCost(scratch, j, d)
		room -= costs[i]
	}
	f.tight = false
	if room < 0 {
		return nil, 0, &mcpTooBig{max: f.max}
	}
	for i, r := range raws {
		j, err := b.job(r)
		if err != nil {
			return nil, 0, err
		}
		cost := indentCost(scratch, j, d)
		if cost-costs[i] > room {
			break
		}
		room -= cost - costs[i]
		kept[i] = j
	}
	return kept, 0, nil
}

// mcpTooBig is an answer that cannot fit: refused, naming the limit.
type mcpTooBig struct{ max int64 }

func (e *mcpTooBig) Error() string { return errMCPTooBig(e.max) }

// jobsNote tells an agent what a list left out and how to get it.
func jobsNote(b *mcpBackend, o *jsonObj, left int, what, how string) {
	if left == 0 {
		return
	}
	o.num("omitted", float64(left)).str("note", fmt.Sprintf("%d more %s left out to keep this answer within %s (--mcp-max-answer-bytes); %s",
		left, what, sizeText(b.fit.max), how))
}
