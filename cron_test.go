package main

import (
	"errors"
	"strings"
	"testing"
)

// ---------------------------------------------------------------------------
// Parser

func TestCronParseFields(t *testing.T) {
	set := func(vs ...int) uint64 {
		var s uint64
		for _, v := range vs {
			s |= 1 << v
		}
		return s
	}
	span := func(lo, hi, step int) uint64 {
		var s uint64
		for v := lo; v <= hi; v += step {
			s |= 1 << v
		}
		return s
	}
	cases := []struct {
		expr                    string
		sec, min, hour, dom, mo uint64
		dow                     uint64
		domStar, dowStar        bool
	}{
		{expr: "* * * * *", min: span(0, 59, 1), hour: span(0, 23, 1), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: span(0, 6, 1), domStar: true, dowStar: true},
		{expr: "*/15 0,12 1-10/3 */5 1-5", min: set(0, 15, 30, 45), hour: set(0, 12), dom: set(1, 4, 7, 10), mo: set(1, 6, 11), dow: span(1, 5, 1)},
		{expr: "5/10 22-23 31 1,2 *", min: set(5, 15, 25, 35, 45, 55), hour: set(22, 23), dom: set(31), mo: set(1, 2), dow: span(0, 6, 1), dowStar: true},
		// Names in both lengths and any case; 7 and SUN-7 are Sunday.
		{expr: "0 0 * jan-MAR,December Mon-friday", min: set(0), hour: set(0), dom: span(1, 31, 1), mo: set(1, 2, 3, 12), dow: span(1, 5, 1), domStar: true},
		{expr: "0 0 * * 7", min: set(0), hour: set(0), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: set(0), domStar: true},
		{expr: "0 0 * * 5-7", min: set(0), hour: set(0), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: set(0, 5, 6), domStar: true},
		{expr: "0 0 * * SUN-7", min: set(0), hour: set(0), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: span(0, 6, 1), domStar: true},
		{expr: "0 0 * * 6/1", min: set(0), hour: set(0), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: set(0, 6), domStar: true},
		{expr: "0 0 * * MON/2", min: set(0), hour: set(0), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: set(0, 1, 3, 5), domStar: true},
		// "*" inside a list, or "*/1", restricts (it is not written "*").
		{expr: "0 0 */1 * *,1", min: set(0), hour: set(0), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: span(0, 6, 1)},
		// Bun.cron reads numbers with Zig's parser: a sign, underscores, zeros.
		{expr: "1_0 +5 * 0012 -0", min: set(10), hour: set(5), dom: span(1, 31, 1), mo: set(12), dow: set(0), domStar: true},
		{expr: "*/60 */127 * * *", min: set(0), hour: set(0), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: span(0, 6, 1), domStar: true, dowStar: true},
		// Six fields: the seconds come first.
		{expr: "*/20 0 0 1 1 *", sec: set(0, 20, 40), min: set(0), hour: set(0), dom: set(1), mo: set(1), dow: span(0, 6, 1), dowStar: true},
		{expr: "0-10/5,30 * * * * *", sec: set(0, 5, 10, 30), min: span(0, 59, 1), hour: span(0, 23, 1), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: span(0, 6, 1), domStar: true, dowStar: true},
		// Macros, in any case, with spaces around.
		{expr: "@yearly", min: set(0), hour: set(0), dom: set(1), mo: set(1), dow: span(0, 6, 1), dowStar: true},
		{expr: " @ANNUALLY ", min: set(0), hour: set(0), dom: set(1), mo: set(1), dow: span(0, 6, 1), dowStar: true},
		{expr: "@monthly", min: set(0), hour: set(0), dom: set(1), mo: span(1, 12, 1), dow: span(0, 6, 1), dowStar: true},
		{expr: "@Weekly", min: set(0), hour: set(0), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: set(0), domStar: true},
		{expr: "@daily", min: set(0), hour: set(0), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: span(0, 6, 1), domStar: true, dowStar: true},
		{expr: "@midnight", min: set(0), hour: set(0), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: span(0, 6, 1), domStar: true, dowStar: true},
		{expr: "@hourly", min: set(0), hour: span(0, 23, 1), dom: span(1, 31, 1), mo: span(1, 12, 1), dow: span(0, 6, 1), domStar: true, dowStar: true},
	}
	for _, c := range cases {
		e, err := ParseCron(c.expr)
		if err != nil {
			t.Errorf("%q: %v", c.expr, err)
			continue
		}
		got := [...]uint64{e.seconds, e.minutes, uint64(e.hours), uint64(e.days), uint64(e.months), uint64(e.weekdays)}
		wantSec := c.sec
		if wantSec == 0 {
			wantSec = 1
		}
		want := [...]uint64{wantSec, c.min, c.hour, c.dom, c.mo, c.dow}
		if got != want || e.daysStar != c.domStar || e.weekdaysStar != c.dowStar {
			t.Errorf("%q: fields %x stars %v %v, want %x stars %v %v", c.expr, got, e.daysStar, e.weekdaysStar, want, c.domStar, c.dowStar)
		}
		if e.hasSeconds != (c.sec != 0) {
			t.Errorf("%q: hasSeconds %v", c.expr, e.hasSeconds)
		}
	}
}

func TestCronParseErrors(t *testing.T) {
	cases := []struct{ expr, field, text, reason string }{
		{"61 * * * *", "minute", "61", "value 61 out of range 0-59"},
		{"0 24 * * *", "hour", "24", "value 24 out of range 0-23"},
		{"0 0 0 * *", "day-of-month", "0", "value 0 out of range 1-31"},
		{"0 0 32 * *", "day-of-month", "32", "out of range 1-31"},
		{"0 0 * 13 *", "month", "13", "out of range 1-12"},
		{"0 0 * * 8", "day-of-week", "8", "out of range 0-7"},
		{"-1 * * * *", "minute", "-1", "value -1 out of range 0-59"},
		{"0 0 -0 * *", "day-of-month", "-0", "value -0 out of range 1-31"},
		{"256 * * * *", "minute", "256", "out of range"},
		// Quartz extensions are not cron's, nor the reference's.
		{"0 0 L * *", "day-of-month", "L", "not a number"},
		{"0 0 ? * *", "day-of-month", "?", "not a number"},
		{"0 0 15W * *", "day-of-month", "15W", "not a number"},
		{"0 0 * * 1#2", "day-of-week", "1#2", "neither a number nor a day name"},
		{"0 0 * * 5L", "day-of-week", "5L", "neither"},
		{"*/0 * * * *", "minute", "*/0", "step \"0\" must be a whole number from 1 to 127"},
		{"*/128 * * * *", "minute", "*/128", "step"},
		{"*/2/3 * * * *", "minute", "*/2/3", "step"},
		{"*/ * * * *", "minute", "*/", "step"},
		{"0 22-2 * * *", "hour", "22-2", "range \"22-2\" must ascend (wrap around with a list: \"22-23,0-2\")"},
		{"0 0 * * FRI-MON", "day-of-week", "FRI-MON", "must ascend"},
		{"0 0 * DEC-JAN *", "month", "DEC-JAN", "must ascend"},
		{"0 0 * * 7-SUN", "day-of-week", "7-SUN", "must ascend"},
		{"1-2-3 * * * *", "minute", "1-2-3", "neither a value nor a range"},
		{"0 0 * * TUES", "day-of-week", "TUES", "neither a number nor a day name"},
		{"0 0 * * JAN", "day-of-week", "JAN", "day name"},
		{"0 0 * MON *", "month", "MON", "month name"},
		{"JAN * * * *", "minute", "JAN", "not a number"},
		{"1,,2 * * * *", "minute", "1,,2", "empty list item"},
		{"0 0 * * 1-5,", "day-of-week", "1-5,", "empty list item"},
		{"0x1 * * * *", "minute", "0x1", "not a number"},
		{"1.0 * * * *", "minute", "1.0", "not a number"},
		// The seconds field is the reference's own: plain digits, steps after
		// * or a range only, steps up to 60.
		{"60 * * * * *", "second", "60", "out of range 0-59"},
		{"5/10 * * * * *", "second", "5/10", "needs * or a range"},
		{"*/61 * * * * *", "second", "*/61", "step \"61\" must be a whole number from 1 to 60"},
		{"+1 * * * * *", "second", "+1", "not a number"},
		{"10-5 * * * * *", "second", "10-5", "must ascend"},
		{"1- * * * * *", "second", "1-", "not a range"},
		{", * * * * *", "second", ",", "empty list item"},
		// Runs never: the day exists in none of the months allowed.
		{"0 0 31 2 *", "day-of-month", "31", "no such day in any month the month field \"2\" allows, so it never runs"},
		{"0 0 30,31 2 *", "day-of-month", "30,31", "never runs"},
		{"0 0 31 4,6,9,11 *", "day-of-month", "31", "never runs"},
		// The whole expression.
		{"", "", "", "want 5 fields"},
		{"* * * *", "", "", "got 4"},
		{"* * * * * * *", "", "", "got 7"},
		{"@reboot", "", "", "unknown macro"},
		{"@every", "", "", "unknown macro"},
		{"@", "", "", "unknown macro"},
		{"@daily 1", "", "", "got 2"},
	}
	for _, c := range cases {
		_, err := ParseCron(c.expr)
		var ce *CronError
		if !errors.As(err, &ce) {
			t.Errorf("%q: got %v, want a CronError", c.expr, err)
			continue
		}
		if ce.Field != c.field || ce.Text != c.text || !strings.Contains(ce.Reason, c.reason) {
			t.Errorf("%q: got field %q text %q reason %q; want %q %q containing %q", c.expr, ce.Field, ce.Text, ce.Reason, c.field, c.text, c.reason)
		}
	}
	_, err := ParseCron("61 * * * *")
	if want := `cron expression "61 * * * *": minute field "61": value 61 out of range 0-59`; err == nil || err.Error() != want {
		t.Errorf("message %v, want %s", err, want)
	}
	// A day-of-week alongside makes an impossible day harmless (either runs).
	if _, err := ParseCron("0 0 31 2 1"); err != nil {
		t.Errorf("0 0 31 2 1: %v", err)
	}
}

// The reference trims and splits on JavaScript's whitespace.
func TestCronParseSpaces(t *testing.T) {
	for _, expr := range []string{"0\u00a00 * * *", "\ufeff0 0 * * *", "\t0  0\n* * *\r", "0\u30000 * * *", "@daily\u00a0"} {
		if _, err := ParseCron(expr); err != nil {
			t.Errorf("%q: %v", expr, err)
		}
	}
	if _, err := ParseCron("0\u00850 * * *"); err == nil || !strings.Contains(err.Error(), "got 4") {
		t.Errorf("NEL is no space in JavaScript: %v", err)
	}
}
