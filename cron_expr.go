package main

// Cron expressions: a parser, and the next run of an expression in a time
// zone. The schedules that use them and their scheduler are in cron.go.
//
// The reference (bunqueue 2.9.5) hands the five calendar fields to Bun.cron
// (Bun 1.4.4) and reads a leading seconds field itself. What both accept,
// and how Bun.cron lands runs on daylight-saving changes, was measured
// against them; this file reproduces it, and says so where it does not.

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"time"

	// Schedules name IANA zones; embedding the database keeps them working
	// on hosts without zoneinfo files (scratch containers, some minimal
	// images).
	_ "time/tzdata"
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

// ---------------------------------------------------------------------------
// Next run

// cronHorizonYears bounds a search. Any expression ParseCron accepts runs at
// least every eight years (29 February), so Next reports "none" only past
// this.
const cronHorizonYears = 50

const allHours = 1<<24 - 1

// Next returns the first run strictly after t, with the fields read as the
// wall clock of loc. It reports false only when no run falls within
// cronHorizonYears.
//
// Across daylight-saving changes it does what Bun.cron does, for the
// reference's schedules to land where they did there:
//   - A wall time skipped by a forward change runs as if the change had not
//     happened yet: 02:30 on a night that jumps from 02:00 to 03:00 runs at
//     03:30, once; the times of the skipped hour do not pile up after it.
//   - A wall time shown twice by a backward change runs at its first
//     showing only; but an expression whose hour field is every hour runs
//     in the repeated stretch too (an hourly job runs at 01:00 EDT and at
//     01:00 EST), since its runs follow the clock rather than a time of day.
func (e *CronExpr) Next(t time.Time, loc *time.Location) (time.Time, bool) {
	if !e.hasSeconds {
		return e.nextMinute(t, loc)
	}
	// As the reference: find the first calendar minute at or after t's
	// minute, then the first of its seconds after t.
	m, ok := e.nextMinute(t.Truncate(time.Minute).Add(-1), loc)
	for ok {
		for s := e.seconds; s != 0; s &= s - 1 {
			c := m.Add(time.Duration(bits.TrailingZeros64(s)) * time.Second)
			if c.After(t) {
				return c, true
			}
		}
		n, more := e.nextMinute(m, loc)
		if !more || !n.After(m) {
			break
		}
		m = n
	}
	return time.Time{}, false
}

// nextMinute is Next for the five calendar fields.
func (e *CronExpr) nextMinute(t time.Time, loc *time.Location) (time.Time, bool) {
	tu := t.Unix() // floor: an instant in whole seconds is after t iff after tu
	off, _, _ := zoneAt(loc, tu)
	wall := floorDiv(tu+int64(off), 60)*60 + 60
	limit := yearOfWall(wall) + cronHorizonYears
	var best int64
	found := false
	// The wall clock is walked from t's wall time; a candidate whose first
	// showing is not after t (t is inside a repeated stretch) is passed by.
	for {
		w, ok := e.nextWall(wall, limit)
		if !ok {
			break
		}
		if at := resolveWall(loc, w); at > tu {
			best, found = at, true
			break
		}
		wall = w + 60
	}
	if e.hours == allHours {
		until := tu + 48*3600
		if found {
			until = best
		}
		if at, ok := e.inRepeat(loc, tu, until); ok {
			best, found = at, true
		}
	}
	if !found {
		return time.Time{}, false
	}
	return time.Unix(best, 0).In(loc), true
}

// nextWall returns the first wall time (seconds, as if UTC) at or after w,
// which is on a minute, that the calendar fields match; false past the end
// of year limit. It skips whole months, days and hours that cannot match.
func (e *CronExpr) nextWall(w int64, limit int) (int64, bool) {
	days := floorDiv(w, 86400)
	y, mo, d := civilFromDays(days)
	rest := int(w - days*86400)
	h, mi := rest/3600, rest%3600/60
	for y <= limit {
		if e.months&(1<<mo) == 0 {
			if next := nextBit(uint64(e.months), mo); next <= 12 {
				mo = next
			} else {
				y, mo = y+1, bits.TrailingZeros16(e.months)
			}
			d, h, mi = 1, 0, 0
			continue
		}
		if d > daysIn(y, mo) {
			if mo++; mo > 12 {
				y, mo = y+1, 1
			}
			d, h, mi = 1, 0, 0
			continue
		}
		if !e.dayMatches(y, mo, d) {
			d, h, mi = d+1, 0, 0
			continue
		}
		if e.hours&(1<<h) == 0 {
			if h = nextBit(uint64(e.hours), h); h > 23 {
				d, h = d+1, 0
			}
			mi = 0
			continue
		}
		if e.minutes&(1<<mi) == 0 {
			if mi = nextBit(e.minutes, mi); mi > 59 {
				h, mi = h+1, 0
				if h > 23 {
					d, h = d+1, 0
				}
			}
			continue
		}
		return daysFromCivil(y, mo, d)*86400 + int64(h)*3600 + int64(mi)*60, true
	}
	return 0, false
}

func (e *CronExpr) dayMatches(y, mo, d int) bool {
	dom := e.days&(1<<d) != 0
	dow := e.weekdays&(1<<weekday(daysFromCivil(y, mo, d))) != 0
	switch {
	case e.daysStar:
		return dow
	case e.weekdaysStar:
		return dom
	default:
		return dom || dow
	}
}

// inRepeat finds the first run in (tu, until) that falls in the repeated
// stretch after a backward clock change, for expressions that run every
// hour (see Next).
func (e *CronExpr) inRepeat(loc *time.Location, tu, until int64) (int64, bool) {
	// A repeat that began up to two days before t may still be running.
	p := tu - 48*3600
	for range 1000 {
		_, _, change := zoneAt(loc, p)
		if change == math.MaxInt64 || change >= until {
			return 0, false
		}
		p = change
		before, _, _ := zoneAt(loc, change-1)
		after, _, next := zoneAt(loc, change)
		if after >= before {
			continue
		}
		end := min(change+int64(before-after), next) // the repeat lasts as long as the change
		if end <= tu {
			continue
		}
		from := change + int64(after) // the repeat's wall times, as if UTC
		if change <= tu {
			from = floorDiv(tu+int64(after), 60)*60 + 60
		}
		from = -floorDiv(-from, 60) * 60
		w, ok := e.nextWall(from, yearOfWall(from)+1)
		if !ok {
			continue
		}
		if at := w - int64(after); at < end && at > tu && at < until {
			return at, true
		}
	}
	return 0, false
}

// resolveWall returns the instant at which loc's clock shows w (seconds, as
// if UTC): the first showing when it shows it twice; when it skips it, the
// instant w names under the offset before the skip, which is w moved past
// the gap by the gap's length (Bun.cron's rule, see Next).
func resolveWall(loc *time.Location, w int64) int64 {
	// No zone's offset, even local mean times of the past, reaches 16 hours.
	const reach = 16 * 3600
	p := w - reach
	prevOff, havePrev := 0, false
	for range 16 {
		off, start, end := zoneAt(loc, p)
		at := w - int64(off)
		if at >= start && at < end {
			return at
		}
		if havePrev && at < start {
			return w - int64(prevOff)
		}
		prevOff, havePrev = off, true
		if end == math.MaxInt64 || end > w+reach {
			break
		}
		p = end
	}
	off, _, _ := zoneAt(loc, w)
	return w - int64(off)
}

// zoneAt returns the UTC offset (seconds) in force in loc at Unix second u
// and the bounds of the period it is in force (math.MinInt64/MaxInt64 when
// open-ended).
func zoneAt(loc *time.Location, u int64) (off int, start, end int64) {
	t := time.Unix(u, 0).In(loc)
	_, off = t.Zone()
	s, e := t.ZoneBounds()
	start, end = math.MinInt64, math.MaxInt64
	if !s.IsZero() {
		start = s.Unix()
	}
	if !e.IsZero() {
		end = e.Unix()
	}
	return off, start, end
}

// nextBit returns the lowest set bit of set at or above from (64 if none).
func nextBit(set uint64, from int) int {
	if from > 63 {
		return 64
	}
	return bits.TrailingZeros64(set >> from << from)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// Proleptic Gregorian calendar arithmetic on day numbers (days since
// 1970-01-01), after Howard Hinnant's algorithms; the wall clock is walked
// without time.Date so that no zone rule moves it.
func daysFromCivil(y, m, d int) int64 {
	if m <= 2 {
		y--
	}
	era := floorDiv(int64(y), 400)
	yoe := int64(y) - era*400
	mp := int64((m + 9) % 12)
	doy := (153*mp+2)/5 + int64(d) - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

func civilFromDays(z int64) (y, m, d int) {
	z += 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = int(doy - (153*mp+2)/5 + 1)
	m = int(mp + 3)
	if m > 12 {
		m -= 12
	}
	y = int(yoe + era*400)
	if m <= 2 {
		y++
	}
	return y, m, d
}

func yearOfWall(w int64) int {
	y, _, _ := civilFromDays(floorDiv(w, 86400))
	return y
}

// weekday of a day number, Sunday 0 (1970-01-01 was a Thursday).
func weekday(days int64) int {
	return int((days%7 + 11) % 7)
}

// LoadCronZone resolves a schedule's time zone by IANA name. An empty name
// is the server's own zone, which is what Bun.cron uses when the reference
// passes no zone. Bun accepts names in any case ("europe/berlin"); Go's
// lookup is exact, so the usual spellings are tried too.
func LoadCronZone(name string) (*time.Location, error) {
	if name == "" {
		return time.Local, nil
	}
	// "Local" means the host's zone to Go and nothing to Bun.
	if !strings.EqualFold(name, "local") {
		for _, n := range []string{name, strings.ToUpper(name), titleZone(name)} {
			if loc, err := time.LoadLocation(n); err == nil {
				return loc, nil
			}
		}
	}
	return nil, fmt.Errorf("unknown time zone %q", name)
}

// titleZone spells "america/new_york" as "America/New_York".
func titleZone(name string) string {
	b := []byte(strings.ToLower(name))
	up := true
	for i, c := range b {
		if up && c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
		up = c == '/' || c == '_' || c == '-'
	}
	return string(b)
}
