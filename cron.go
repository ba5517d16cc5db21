package main

// Cron schedules: a parser for cron expressions.
//
// The reference (bunqueue 2.9.5) hands the five calendar fields to Bun.cron
// (Bun 1.4.4) and reads a leading seconds field itself. What both accept
// was measured against them; this file reproduces it, and says so where it
// does not.

import (
	"fmt"
	"strings"
)

// ---------------------------------------------------------------------------
// Parsing

// CronExpr is a parsed cron expression.
type CronExpr struct {
	src        string
	hasSeconds bool
	seconds    uint64 // bit s: second s; five fields run at second 0
	minutes    uint64 // bits 0-59
	hours      uint32 // bits 0-23
	days       uint32 // bits 1-31
	months     uint16 // bits 1-12
	weekdays   uint8  // bits 0-6, Sunday 0
	// Bun.cron's day rule, the classic one: a day field written exactly
	// "*" does not restrict; when both restrict, a day matching either one
	// runs (so "0 0 13 * 5" is every 13th and every Friday).
	daysStar, weekdaysStar bool
}

// CronError says what is wrong with an expression, naming the field.
type CronError struct {
	Expr   string
	Field  string // "second", "minute", ...; "" when the whole expression is wrong
	Text   string // the field as written
	Reason string
}

func (e *CronError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("cron expression %q: %s", e.Expr, e.Reason)
	}
	return fmt.Sprintf("cron expression %q: %s field %q: %s", e.Expr, e.Field, e.Text, e.Reason)
}

// The macros Bun.cron knows (case-insensitive); it rejects any other word
// after "@" (@reboot, @every ...).
var cronMacros = map[string]string{
	"@yearly":   "0 0 1 1 *",
	"@annually": "0 0 1 1 *",
	"@monthly":  "0 0 1 * *",
	"@weekly":   "0 0 * * 0",
	"@daily":    "0 0 * * *",
	"@midnight": "0 0 * * *",
	"@hourly":   "0 * * * *",
}

// A calendar field. Names are accepted as three letters or in full, in any
// case ("jan", "JANUARY"), and only in their own field, as Bun.cron does.
type cronField struct {
	name       string
	min, max   int
	short      []string // short[i] names value nameBase+i
	long       []string
	nameBase   int
	namedValue string // what a name here is, for messages
}

var cronFields = [5]cronField{
	{name: "minute", min: 0, max: 59},
	{name: "hour", min: 0, max: 23},
	{name: "day-of-month", min: 1, max: 31},
	{name: "month", min: 1, max: 12, nameBase: 1, namedValue: "month name",
		short: []string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"},
		long:  []string{"january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"}},
	// 7 is Sunday too; it is folded into 0 once the field is read.
	{name: "day-of-week", min: 0, max: 7, nameBase: 0, namedValue: "day name",
		short: []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"},
		long:  []string{"sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"}},
}

// ParseCron reads a cron expression: five fields (minute hour day-of-month
// month day-of-week), six with a leading seconds field, or one of the
// macros. Each field takes "*", values, names, ranges "a-b", steps "*/n",
// "a-b/n" and "a/n" (a to the field's end), and comma lists of those.
// Like the reference it rejects L, W, #, ? and @reboot, and an expression
// that can never run ("0 0 31 2 *").
func ParseCron(expr string) (*CronExpr, error) {
	s := strings.TrimFunc(expr, jsSpace)
	if strings.HasPrefix(s, "@") && strings.IndexFunc(s, jsSpace) < 0 {
		exp, ok := cronMacros[strings.ToLower(s)]
		if !ok {
			return nil, &CronError{Expr: expr, Reason: "unknown macro; want @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly"}
		}
		s = exp
	}
	fields := strings.FieldsFunc(s, jsSpace)
	e := &CronExpr{src: expr}
	switch len(fields) {
	case 5:
		e.seconds = 1
	case 6:
		secs, why := parseCronSeconds(fields[0])
		if why != "" {
			return nil, &CronError{Expr: expr, Field: "second", Text: fields[0], Reason: why}
		}
		e.hasSeconds, e.seconds = true, secs
		fields = fields[1:]
	default:
		return nil, &CronError{Expr: expr, Reason: fmt.Sprintf(
			"want 5 fields (minute hour day-of-month month day-of-week), or 6 with leading seconds; got %d", len(fields))}
	}
	var sets [5]uint64
	for i := range cronFields {
		set, why := cronFields[i].parse(fields[i])
		if why != "" {
			return nil, &CronError{Expr: expr, Field: cronFields[i].name, Text: fields[i], Reason: why}
		}
		sets[i] = set
	}
	if sets[4]&(1<<7) != 0 {
		sets[4] = sets[4]&^(1<<7) | 1
	}
	e.minutes, e.hours, e.days = sets[0], uint32(sets[1]), uint32(sets[2])
	e.months, e.weekdays = uint16(sets[3]), uint8(sets[4])
	e.daysStar, e.weekdaysStar = fields[2] == "*", fields[4] == "*"
	if !e.daysStar && e.weekdaysStar && !e.dayFitsSomeMonth() {
		return nil, &CronError{Expr: expr, Field: "day-of-month", Text: fields[2],
			Reason: fmt.Sprintf("no such day in any month the month field %q allows, so it never runs", fields[3])}
	}
	return e, nil
}

// jsSpace is JavaScript's \s, which the reference trims and splits on; it
// differs from unicode.IsSpace on U+0085 and U+FEFF.
func jsSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

// String returns the expression as it was given.
func (e *CronExpr) String() string { return e.src }

// dayFitsSomeMonth reports whether a day-of-month restricted on its own
// can ever occur (February counts 29 days: leap years come).
func (e *CronExpr) dayFitsSomeMonth() bool {
	for m := 1; m <= 12; m++ {
		if e.months&(1<<m) != 0 && e.days&(1<<(daysIn(2000, m)+1)-1) != 0 {
			return true
		}
	}
	return false
}

func daysIn(y, m int) int {
	switch m {
	case 2:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// parse reads one calendar field into a bit set; a non-empty reason says
// what is wrong.
func (f *cronField) parse(text string) (uint64, string) {
	var set uint64
	for _, item := range strings.Split(text, ",") {
		if item == "" {
			return 0, "empty list item"
		}
		base, stepText, hasStep := strings.Cut(item, "/")
		step := 1
		if hasStep {
			// Bun.cron reads a step as a signed byte: 1 to 127.
			neg, n, ok := zigInt(stepText, 127)
			if !ok || neg || n < 1 || n > 127 {
				return 0, fmt.Sprintf("step %q must be a whole number from 1 to 127", stepText)
			}
			step = n
		}
		lo, hi := f.min, f.max
		if base != "*" {
			// The whole base is tried as a value first: Zig's integer
			// parser takes "-0", so "-0" is a value, not a range.
			v, why, isNum := f.value(base)
			switch {
			case why == "":
				lo = v
				if !hasStep {
					hi = v
				}
			case !isNum && strings.Contains(base, "-"):
				ends := strings.Split(base, "-")
				if len(ends) != 2 {
					return 0, fmt.Sprintf("%q is neither a value nor a range", base)
				}
				a, why, _ := f.value(ends[0])
				if why != "" {
					return 0, why
				}
				b, why, _ := f.value(ends[1])
				if why != "" {
					return 0, why
				}
				if a > b {
					return 0, fmt.Sprintf("range %q must ascend (wrap around with a list: %q)", base,
						ends[0]+"-"+fmt.Sprint(f.max)+","+fmt.Sprint(f.min)+"-"+ends[1])
				}
				lo, hi = a, b
			default:
				return 0, why
			}
		}
		for v := lo; v <= hi; v += step {
			set |= 1 << v
		}
	}
	return set, ""
}

// value reads one number or name of the field; isNum reports that s is
// written as a number, in range or not.
func (f *cronField) value(s string) (v int, why string, isNum bool) {
	if neg, n, ok := zigInt(s, 255); ok {
		if neg && n != 0 || n < f.min || n > f.max {
			return 0, fmt.Sprintf("value %s out of range %d-%d", s, f.min, f.max), true
		}
		return n, "", true
	}
	if f.short != nil {
		low := strings.ToLower(s)
		for i := range f.short {
			if low == f.short[i] || low == f.long[i] {
				return f.nameBase + i, "", false
			}
		}
		return 0, fmt.Sprintf("%q is neither a number nor a %s", s, f.namedValue), false
	}
	return 0, fmt.Sprintf("%q is not a number", s), false
}

// zigInt reads s as Zig's std.fmt.parseInt reads a decimal, which is what
// Bun.cron calls: an optional sign, then digits with underscores allowed
// between them ("1_0" is 10). Values past limit come back as limit+1.
func zigInt(s string, limit int) (neg bool, n int, ok bool) {
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg, s = s[0] == '-', s[1:]
	}
	if s == "" || s[0] == '_' || s[len(s)-1] == '_' {
		return false, 0, false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_':
		case c >= '0' && c <= '9':
			if n <= limit {
				n = n*10 + int(c-'0')
			}
		default:
			return false, 0, false
		}
	}
	return neg, min(n, limit+1), true
}

// parseCronSeconds reads the leading seconds field the way the reference
// reads it (it does not go through Bun.cron): plain digits only, no names,
// a step only after "*" or a range, and steps up to 60.
func parseCronSeconds(text string) (uint64, string) {
	var set uint64
	for _, item := range strings.Split(text, ",") {
		if item == "" {
			return 0, "empty list item"
		}
		parts := strings.Split(item, "/")
		if len(parts) > 2 || parts[0] == "" || len(parts) == 2 && parts[1] == "" {
			return 0, fmt.Sprintf("%q is not a value, range or step", item)
		}
		step := 1
		if len(parts) == 2 {
			n, ok := plainInt(parts[1])
			if !ok || n < 1 || n > 60 {
				return 0, fmt.Sprintf("step %q must be a whole number from 1 to 60", parts[1])
			}
			step = n
		}
		var lo, hi int
		switch base := parts[0]; {
		case base == "*":
			lo, hi = 0, 59
		case strings.Contains(base, "-"):
			ends := strings.Split(base, "-")
			var ok1, ok2 bool
			if len(ends) == 2 {
				lo, ok1 = plainInt(ends[0])
				hi, ok2 = plainInt(ends[1])
			}
			if !ok1 || !ok2 {
				return 0, fmt.Sprintf("%q is not a range of numbers", base)
			}
		default:
			if len(parts) == 2 {
				return 0, fmt.Sprintf("step in %q needs * or a range before it", item)
			}
			var ok bool
			if lo, ok = plainInt(base); !ok {
				return 0, fmt.Sprintf("%q is not a number", base)
			}
			hi = lo
		}
		if lo > 59 || hi > 59 {
			return 0, fmt.Sprintf("%q out of range 0-59", item)
		}
		if lo > hi {
			return 0, fmt.Sprintf("range %q must ascend", parts[0])
		}
		for v := lo; v <= hi; v += step {
			set |= 1 << v
		}
	}
	return set, ""
}

// plainInt reads digits only, capping large values at 1000.
func plainInt(s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		if n < 1000 {
			n = n*10 + int(s[i]-'0')
		}
	}
	return n, true
}
