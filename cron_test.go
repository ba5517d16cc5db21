package main

import (
	"bufio"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Parser

func TestCronParseFields(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
	for _, expr := range []string{"0\u00a00 * * *", "\ufeff0 0 * * *", "\t0  0\n* * *\r", "0\u30000 * * *", "@daily\u00a0"} {
		if _, err := ParseCron(expr); err != nil {
			t.Errorf("%q: %v", expr, err)
		}
	}
	if _, err := ParseCron("0\u00850 * * *"); err == nil || !strings.Contains(err.Error(), "got 4") {
		t.Errorf("NEL is no space in JavaScript: %v", err)
	}
}

// ---------------------------------------------------------------------------
// Next run: known answers

// cronKnown are next runs the reference gives (Bun.cron 1.4.4 under
// bunqueue 2.9.5), one per line: expression | zone | from | want ("" for
// none). Times carry their offset, so that each line shows which side of a
// clock change it is on.
var cronKnown = []struct{ expr, zone, from, want string }{
	// Plain calendar cases.
	{"* * * * *", "UTC", "2026-01-01T00:00:30.5Z", "2026-01-01T00:01:00Z"},
	{"* * * * *", "UTC", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"}, // strictly after a match
	{"*/15 * * * *", "UTC", "2026-01-01T23:59:00Z", "2026-01-02T00:00:00Z"},
	{"5/10 * * * *", "UTC", "2026-01-01T00:06:00Z", "2026-01-01T00:15:00Z"},
	{"0 0 1 1 *", "UTC", "2026-12-31T23:59:59Z", "2027-01-01T00:00:00Z"},
	{"0 0 29 2 *", "UTC", "2026-01-01T00:00:00Z", "2028-02-29T00:00:00Z"},
	{"0 0 29 2 *", "UTC", "2097-01-01T00:00:00Z", "2104-02-29T00:00:00Z"}, // 2100 is no leap year
	{"0 0 31 * *", "UTC", "2026-01-31T00:00:00Z", "2026-03-31T00:00:00Z"}, // February has none
	{"0 0 31 * *", "UTC", "2026-03-31T00:00:00Z", "2026-05-31T00:00:00Z"}, // nor April
	{"0 0 31 * *", "UTC", "2026-07-31T00:00:00Z", "2026-08-31T00:00:00Z"},
	{"0 0 30 * *", "UTC", "2026-01-30T00:00:00Z", "2026-03-30T00:00:00Z"},
	{"0 0 13 * 5", "UTC", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"}, // a Friday
	{"0 0 13 * 5", "UTC", "2026-01-09T00:00:00Z", "2026-01-13T00:00:00Z"}, // the 13th, a Tuesday
	{"0 0 13 * *", "UTC", "2026-01-01T00:00:00Z", "2026-01-13T00:00:00Z"},
	{"0 0 * * 5", "UTC", "2026-01-09T00:00:00Z", "2026-01-16T00:00:00Z"},
	{"0 0 */2 * 1", "UTC", "2026-01-01T00:00:00Z", "2026-01-03T00:00:00Z"},   // "*/2" restricts: OR
	{"0 0 1 * */1", "UTC", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"},   // so does "*/1"
	{"0 0 * * 7", "UTC", "2026-01-01T00:00:00Z", "2026-01-04T00:00:00Z"},     // 7 is Sunday
	{"0 0 * * 5/2", "UTC", "2026-01-02T01:00:00Z", "2026-01-04T00:00:00Z"},   // 5 and 7
	{"0 0 1 JAN/3 *", "UTC", "2026-01-01T00:00:00Z", "2026-04-01T00:00:00Z"}, // quarters
	{"@weekly", "UTC", "2026-01-01T00:00:00Z", "2026-01-04T00:00:00Z"},
	{"@monthly", "UTC", "2026-01-15T10:00:00Z", "2026-02-01T00:00:00Z"},
	// Six fields.
	{"*/10 * * * * *", "UTC", "2026-01-01T12:00:05.5Z", "2026-01-01T12:00:10Z"},
	{"*/10 * * * * *", "UTC", "2026-01-01T12:00:50Z", "2026-01-01T12:01:00Z"},
	{"30 0 12 * * *", "UTC", "2026-01-01T12:00:30Z", "2026-01-02T12:00:30Z"},
	{"15,45 * * * * *", "UTC", "2026-01-01T12:00:15Z", "2026-01-01T12:00:45Z"},
	{"0 30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", "2026-03-08T03:30:00-04:00"},

	// America/New_York, spring: 02:00 EST becomes 03:00 EDT on 8 March.
	{"30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", "2026-03-08T03:30:00-04:00"},
	{"30 2 * * *", "America/New_York", "2026-03-08T03:30:00-04:00", "2026-03-09T02:30:00-04:00"},
	{"0 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", "2026-03-08T03:00:00-04:00"},
	{"0 * * * *", "America/New_York", "2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00"},
	{"*/20 * * * *", "America/New_York", "2026-03-08T01:40:00-05:00", "2026-03-08T03:00:00-04:00"},
	{"30 2 8 3 *", "America/New_York", "2026-01-01T00:00:00Z", "2026-03-08T03:30:00-04:00"},
	// Autumn: 02:00 EDT becomes 01:00 EST on 1 November; 01:xx shows twice.
	{"30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", "2026-11-01T01:30:00-04:00"},
	{"30 1 * * *", "America/New_York", "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"}, // once
	{"30 1 * * *", "America/New_York", "2026-11-01T01:15:00-05:00", "2026-11-02T01:30:00-05:00"},
	{"0 1-3 * * *", "America/New_York", "2026-11-01T01:00:00-04:00", "2026-11-01T02:00:00-05:00"},
	{"0 1 1 11 *", "America/New_York", "2026-11-01T01:00:00-04:00", "2027-11-01T01:00:00-04:00"},
	// Every hour follows the clock through the repeat.
	{"0 * * * *", "America/New_York", "2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00"},
	{"0 * * * *", "America/New_York", "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00"},
	{"45 * * * *", "America/New_York", "2026-11-01T01:50:00-04:00", "2026-11-01T01:45:00-05:00"},
	{"*/30 * * * *", "America/New_York", "2026-11-01T01:10:00-05:00", "2026-11-01T01:30:00-05:00"},
	{"0 0-23 * * *", "America/New_York", "2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00"},
	{"15 0-22 * * *", "America/New_York", "2026-11-01T01:20:00-04:00", "2026-11-01T02:15:00-05:00"},

	// Europe/Berlin, spring: 02:00 CET becomes 03:00 CEST on 29 March.
	{"30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", "2026-03-29T03:30:00+02:00"},
	{"30 2 * * *", "Europe/Berlin", "2026-03-29T03:30:00+02:00", "2026-03-30T02:30:00+02:00"},
	{"0,30 2 * * *", "Europe/Berlin", "2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00"},
	{"0,30 2 * * *", "Europe/Berlin", "2026-03-29T03:00:00+02:00", "2026-03-30T02:00:00+02:00"}, // 02:30 not piled up
	{"15 2,3 * * *", "Europe/Berlin", "2026-03-29T01:00:00+01:00", "2026-03-29T03:15:00+02:00"},
	{"15 2,3 * * *", "Europe/Berlin", "2026-03-29T03:15:00+02:00", "2026-03-30T02:15:00+02:00"}, // once
	{"30 1-3 * * *", "Europe/Berlin", "2026-03-29T01:30:00+01:00", "2026-03-29T03:30:00+02:00"},
	{"30 1-3 * * *", "Europe/Berlin", "2026-03-29T03:30:00+02:00", "2026-03-30T01:30:00+02:00"},
	{"30 * * * *", "Europe/Berlin", "2026-03-29T01:30:00+01:00", "2026-03-29T03:30:00+02:00"},
	// Autumn: 03:00 CEST becomes 02:00 CET on 25 October.
	{"30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", "2026-10-25T02:30:00+02:00"},
	{"30 2 * * *", "Europe/Berlin", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"},
	{"0 * * * *", "Europe/Berlin", "2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00"},
	{"0 * * * *", "Europe/Berlin", "2026-10-25T02:00:00+01:00", "2026-10-25T03:00:00+01:00"},
	{"@daily", "Europe/Berlin", "2026-10-24T22:30:00Z", "2026-10-26T00:00:00+01:00"},

	// Australia/Sydney, southern autumn: 03:00 AEDT becomes 02:00 AEST on 5 April.
	{"30 2 * * *", "Australia/Sydney", "2026-04-04T12:00:00Z", "2026-04-05T02:30:00+11:00"},
	{"30 2 * * *", "Australia/Sydney", "2026-04-05T02:30:00+11:00", "2026-04-06T02:30:00+10:00"},
	{"30 * * * *", "Australia/Sydney", "2026-04-05T02:30:00+11:00", "2026-04-05T02:30:00+10:00"},
	// Southern spring: 02:00 AEST becomes 03:00 AEDT on 4 October.
	{"30 2 * * *", "Australia/Sydney", "2026-10-03T12:00:00Z", "2026-10-04T03:30:00+11:00"},
	{"30 2 * * *", "Australia/Sydney", "2026-10-04T03:30:00+11:00", "2026-10-05T02:30:00+11:00"},

	// Australia/Lord_Howe moves by half an hour: 02:00 becomes 02:30 on 4 October,
	// 02:00 becomes 01:30 on 5 April.
	{"0 * * * *", "Australia/Lord_Howe", "2026-10-04T01:00:00+10:30", "2026-10-04T02:30:00+11:00"},
	{"0 * * * *", "Australia/Lord_Howe", "2026-10-04T02:30:00+11:00", "2026-10-04T03:00:00+11:00"},
	{"20,25 * * * *", "Australia/Lord_Howe", "2026-10-04T01:25:00+10:30", "2026-10-04T02:50:00+11:00"},
	{"20,25 * * * *", "Australia/Lord_Howe", "2026-10-04T02:50:00+11:00", "2026-10-04T03:20:00+11:00"},
	{"15 2 * * *", "Australia/Lord_Howe", "2026-10-03T12:00:00Z", "2026-10-04T02:45:00+11:00"},
	{"45 * * * *", "Australia/Lord_Howe", "2026-04-05T01:45:00+11:00", "2026-04-05T01:45:00+10:30"},
	{"15 1 * * *", "Australia/Lord_Howe", "2026-04-05T01:15:00+11:00", "2026-04-06T01:15:00+10:30"},

	// Clock changes at midnight, and a day that never was.
	{"0 0 * * *", "America/Havana", "2026-03-07T00:00:00-05:00", "2026-03-08T01:00:00-04:00"},
	{"30 0 * * *", "America/Havana", "2026-11-01T00:00:00-04:00", "2026-11-01T00:30:00-04:00"},
	{"30 23 * * *", "America/Santiago", "2026-04-04T23:30:00-03:00", "2026-04-05T23:30:00-04:00"},
	{"0 0 6 9 *", "America/Santiago", "2026-09-04T12:00:00Z", "2026-09-06T01:00:00-03:00"},
	{"0 12 30 12 *", "Pacific/Apia", "2011-12-28T12:00:00Z", "2011-12-31T12:00:00+14:00"},
	{"0 12 * * *", "Pacific/Apia", "2011-12-29T12:00:00-10:00", "2011-12-31T12:00:00+14:00"},

	// Zones without changes.
	{"30 9 * * 1-5", "Asia/Kolkata", "2026-01-02T03:00:00Z", "2026-01-02T09:30:00+05:30"},
	{"30 9 * * 1-5", "Asia/Kolkata", "2026-01-02T09:30:00+05:30", "2026-01-05T09:30:00+05:30"},
	{"0 0 * * *", "Etc/GMT+5", "2026-01-01T00:00:00Z", "2026-01-01T00:00:00-05:00"},
}

func TestCronNextKnownAnswers(t *testing.T) {
	t.Parallel()
	for _, c := range cronKnown {
		e, err := ParseCron(c.expr)
		if err != nil {
			t.Errorf("%q: %v", c.expr, err)
			continue
		}
		loc, err := LoadCronZone(c.zone)
		if err != nil {
			t.Fatal(err)
		}
		from := mustTime(t, c.from)
		got, ok := e.Next(from, loc)
		want := mustTime(t, c.want)
		if !ok || !got.Equal(want) {
			t.Errorf("%q in %s after %s: got %s (%v), want %s", c.expr, c.zone, c.from, got.Format(time.RFC3339Nano), ok, c.want)
		}
		if ok {
			// What Next returns carries the zone, so it reads as the table.
			_, off := got.Zone()
			_, woff := want.Zone()
			if off != woff {
				t.Errorf("%q in %s: offset %d, want %d", c.expr, c.zone, off, woff)
			}
		}
	}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCronReferenceVectors compares with next runs captured from the
// reference's own code (compat/cron-vectors.ts): random expressions in
// thirteen zones, mostly within hours of their 2026 clock changes, and
// malformed expressions it refuses.
func TestCronReferenceVectors(t *testing.T) {
	t.Parallel()
	f, err := os.Open("testdata/vectors/cron-next-reference-2.9.5.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zones := map[string]*time.Location{}
	n, bad := 0, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.Split(sc.Text(), "\t")
		if len(p) != 4 {
			t.Fatalf("line %d: %q", n+1, sc.Text())
		}
		n++
		expr := strings.ReplaceAll(p[0], `\t`, "\t")
		loc := zones[p[1]]
		if loc == nil {
			if loc, err = LoadCronZone(p[1]); err != nil {
				t.Fatal(err)
			}
			zones[p[1]] = loc
		}
		from, err := strconv.ParseInt(p[2], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		got := "error"
		if e, err := ParseCron(expr); err == nil {
			got = "none"
			if next, ok := e.Next(time.UnixMilli(from), loc); ok {
				got = strconv.FormatInt(next.UnixMilli(), 10)
			}
		}
		if got != p[3] {
			if bad++; bad <= 20 {
				t.Errorf("%q in %s after %d: got %s, want %s", expr, p[1], from, got, p[3])
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 3000 {
		t.Fatalf("only %d vectors", n)
	}
	if bad > 0 {
		t.Errorf("%d of %d differ", bad, n)
	}
}

// ---------------------------------------------------------------------------
// Next run: properties

// randomCron builds a well-formed expression.
func randomCron(r *rand.Rand) string {
	field := func(lo, hi int, star float64) string {
		if r.Float64() < star {
			return "*"
		}
		var items []string
		for range 1 + r.IntN(2) {
			a := lo + r.IntN(hi-lo+1)
			switch r.IntN(4) {
			case 0:
				items = append(items, strconv.Itoa(a))
			case 1:
				b := a + r.IntN(hi-a+1)
				items = append(items, strconv.Itoa(a)+"-"+strconv.Itoa(b))
			case 2:
				items = append(items, "*/"+strconv.Itoa(1+r.IntN(hi-lo+1)))
			default:
				items = append(items, strconv.Itoa(a)+"/"+strconv.Itoa(1+r.IntN(12)))
			}
		}
		return strings.Join(items, ",")
	}
	e := strings.Join([]string{field(0, 59, 0.2), field(0, 23, 0.5), field(1, 31, 0.7), field(1, 12, 0.7), field(0, 7, 0.7)}, " ")
	if r.IntN(5) == 0 {
		e = field(0, 59, 0.3) + " " + e
	}
	return e
}

// matchesUTC is an oracle written apart from the parser's bit sets: does
// the expression's calendar match t, read in UTC?
func matchesUTC(e *CronExpr, t time.Time) bool {
	t = t.UTC()
	in := func(set uint64, v int) bool { return set&(1<<v) != 0 }
	dom, dow := in(uint64(e.days), t.Day()), in(uint64(e.weekdays), int(t.Weekday()))
	var day bool
	switch {
	case e.daysStar:
		day = dow
	case e.weekdaysStar:
		day = dom
	default:
		day = dom || dow
	}
	return in(e.seconds, t.Second()) && in(e.minutes, t.Minute()) && in(uint64(e.hours), t.Hour()) &&
		in(uint64(e.months), int(t.Month())) && day
}

func TestCronNextProperties(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	zones := []string{"UTC", "America/New_York", "Europe/Berlin", "Australia/Sydney", "Australia/Lord_Howe", "Asia/Kolkata"}
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 4000 {
		expr := randomCron(r)
		e, err := ParseCron(expr)
		if err != nil {
			continue // an impossible day, now and then
		}
		loc, _ := LoadCronZone(zones[i%len(zones)])
		from := start.Add(time.Duration(r.Int64N(int64(3 * 365 * 24 * time.Hour))))
		if r.IntN(2) == 0 {
			from = from.Truncate(time.Minute)
		}
		next, ok := e.Next(from, loc)
		if !ok || !next.After(from) {
			t.Fatalf("%q in %s after %s: %s %v", expr, loc, from, next, ok)
		}
		// From a run, the next is the following run, never the same one.
		again, ok := e.Next(next, loc)
		if !ok || !again.After(next) {
			t.Fatalf("%q in %s after run %s: %s %v", expr, loc, next, again, ok)
		}
		if loc != time.UTC {
			continue
		}
		// In UTC there are no clock changes: the answer matches the
		// fields, and no second between holds a match. Searching second by
		// second is affordable within a day.
		if !matchesUTC(e, next) || next.Nanosecond() != 0 {
			t.Fatalf("%q after %s: %s does not match", expr, from, next)
		}
		if next.Sub(from) < 24*time.Hour {
			for s := from.Truncate(time.Second).Add(time.Second); s.Before(next); s = s.Add(time.Second) {
				if matchesUTC(e, s) {
					t.Fatalf("%q after %s: got %s, but %s matches", expr, from, next, s)
				}
			}
		}
	}
}

// A fixed-time schedule runs once a day through a whole year of clock
// changes in each zone: never twice in a wall day, never a wall day missed.
func TestCronNextOncePerDayAcrossYear(t *testing.T) {
	t.Parallel()
	for _, zone := range []string{"America/New_York", "Europe/Berlin", "Australia/Sydney", "Australia/Lord_Howe", "America/Havana", "America/Santiago"} {
		loc, _ := LoadCronZone(zone)
		for _, expr := range []string{"30 2 * * *", "0 0 * * *", "45 1 * * *", "15 0 * * *"} {
			e, err := ParseCron(expr)
			if err != nil {
				t.Fatal(err)
			}
			at := time.Date(2026, 1, 1, 12, 0, 0, 0, loc)
			seen := map[string]int{}
			for range 365 {
				next, ok := e.Next(at, loc)
				if !ok {
					t.Fatalf("%s %q: none after %s", zone, expr, at)
				}
				// A gap moves a run forward by its length, never past the day.
				seen[next.Format("2006-01-02")]++
				at = next
			}
			day := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
			for range 360 {
				if k := day.Format("2006-01-02"); seen[k] != 1 {
					t.Errorf("%s %q: %d runs on %s", zone, expr, seen[k], k)
				}
				day = day.AddDate(0, 0, 1)
			}
		}
	}
}

func TestLoadCronZone(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"UTC": "UTC", "utc": "UTC", "Europe/Berlin": "Europe/Berlin", "europe/berlin": "Europe/Berlin",
		"america/new_york": "America/New_York", "EST5EDT": "EST5EDT", "est5edt": "EST5EDT", "Etc/GMT+5": "Etc/GMT+5",
	} {
		loc, err := LoadCronZone(name)
		if err != nil || loc.String() != want {
			t.Errorf("%q: %v %v, want %s", name, loc, err, want)
		}
	}
	if loc, err := LoadCronZone(""); err != nil || loc != time.Local {
		t.Errorf(`"": %v %v, want the local zone`, loc, err)
	}
	for _, name := range []string{"Not/AZone", "Local", "local", "+02:00", "../etc/passwd"} {
		if _, err := LoadCronZone(name); err == nil || !strings.Contains(err.Error(), "unknown time zone") {
			t.Errorf("%q: %v", name, err)
		}
	}
}

func TestCronCalendarArithmetic(t *testing.T) {
	t.Parallel()
	// Against the time package, over a span that crosses leap centuries.
	for d := int64(-800000); d <= 800000; d += 37 {
		y, m, day := civilFromDays(d)
		want := time.Unix(d*86400, 0).UTC()
		if y != want.Year() || m != int(want.Month()) || day != want.Day() {
			t.Fatalf("day %d: %d-%d-%d, want %s", d, y, m, day, want)
		}
		if back := daysFromCivil(y, m, day); back != d {
			t.Fatalf("day %d: back %d", d, back)
		}
		if weekday(d) != int(want.Weekday()) {
			t.Fatalf("day %d: weekday %d, want %d", d, weekday(d), want.Weekday())
		}
	}
	if bits.OnesCount32(allHours) != 24 {
		t.Fatal("allHours")
	}
}

func BenchmarkCronNext(b *testing.B) {
	loc, _ := LoadCronZone("Europe/Berlin")
	for _, expr := range []string{"*/5 * * * *", "30 2 * * 1-5", "0 0 29 2 *", "*/10 * * * * *"} {
		e, err := ParseCron(expr)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(expr, func(b *testing.B) {
			at := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
			for b.Loop() {
				next, _ := e.Next(at, loc)
				at = next
				if at.Year() > 2400 {
					at = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
				}
			}
		})
	}
}

func BenchmarkCronParse(b *testing.B) {
	for b.Loop() {
		if _, err := ParseCron("0,30 */2 1-15 JAN-JUN MON-FRI"); err != nil {
			b.Fatal(err)
		}
	}
}

// ---------------------------------------------------------------------------
// Fuzzing

var fuzzZones = func() []*time.Location {
	var out []*time.Location
	for _, n := range []string{"UTC", "America/New_York", "Europe/Berlin", "Australia/Sydney", "Australia/Lord_Howe", "America/Havana", "Pacific/Apia"} {
		loc, err := time.LoadLocation(n)
		if err != nil {
			panic(err)
		}
		out = append(out, loc)
	}
	return out
}()

// FuzzCronParse: the parser never panics and refuses with a CronError;
// what it accepts has a next run after any time (between 1900 and 2500),
// within the horizon, and the run after that is later still.
func FuzzCronParse(f *testing.F) {
	for _, c := range cronKnown {
		f.Add(c.expr, int64(1772323200), uint8(0))
	}
	for _, s := range []string{"*/5 1-10/2 * JAN-dec sun-SAT", "0 0 31 2 *", "1_0 +5 -0 * *", "@reboot", "61 * * * * *", "0 0 * * 7-SUN", ",", "*/-1 * * * *"} {
		f.Add(s, int64(1793500000), uint8(1))
	}
	f.Fuzz(func(t *testing.T, expr string, fromSec int64, zone uint8) {
		e, err := ParseCron(expr)
		if err != nil {
			var ce *CronError
			if !errors.As(err, &ce) || ce.Expr != expr {
				t.Fatalf("%q: %v is not a CronError of the expression", expr, err)
			}
			return
		}
		const lo, hi = -2208988800, 16725225600 // 1900 to 2500
		fromSec = lo + (fromSec%(hi-lo)+(hi-lo))%(hi-lo)
		loc := fuzzZones[int(zone)%len(fuzzZones)]
		from := time.Unix(fromSec, 0)
		next, ok := e.Next(from, loc)
		if !ok {
			t.Fatalf("%q in %s after %s: no run", expr, loc, from)
		}
		if !next.After(from) || next.Sub(from) > 9*366*24*time.Hour {
			t.Fatalf("%q in %s after %s: %s", expr, loc, from, next)
		}
		if again, ok := e.Next(next, loc); !ok || !again.After(next) {
			t.Fatalf("%q in %s after %s: %s %v", expr, loc, next, again, ok)
		}
	})
}

// ---------------------------------------------------------------------------
// Scheduler, on a fake clock

// fakeClock moves only when told; its timers fire when it passes them.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	clk   *fakeClock
	ch    chan time.Time
	when  time.Time
	armed bool
}

func newFakeClock(now time.Time) *fakeClock { return &fakeClock{now: now} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{clk: c, ch: make(chan time.Time, 1)}
	c.mu.Lock()
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	t.Reset(d)
	return t
}

// set moves the clock to now and fires the timers it passes.
func (c *fakeClock) set(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
	for _, t := range c.timers {
		t.fireIfDue()
	}
}

// armed returns the deadlines of the timers armed, and how many timers
// were ever made.
func (c *fakeClock) armed() (deadlines []time.Time, made int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.timers {
		if t.armed {
			deadlines = append(deadlines, t.when)
		}
	}
	return deadlines, len(c.timers)
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(d time.Duration) {
	t.clk.mu.Lock()
	defer t.clk.mu.Unlock()
	t.drain()
	t.when, t.armed = t.clk.now.Add(d), true
	t.fireIfDue()
}

func (t *fakeTimer) Stop() {
	t.clk.mu.Lock()
	defer t.clk.mu.Unlock()
	t.armed = false
	t.drain()
}

func (t *fakeTimer) drain() {
	select {
	case <-t.ch:
	default:
	}
}

func (t *fakeTimer) fireIfDue() {
	if t.armed && !t.when.After(t.clk.now) {
		t.armed = false
		select {
		case t.ch <- t.clk.now:
		default:
		}
	}
}

type fireRec struct {
	name       string
	at         time.Time
	executions int64
}

// cronRig is a scheduler on a fake clock that records what it fires.
type cronRig struct {
	t       *testing.T
	clk     *fakeClock
	sch     *CronScheduler
	mu      sync.Mutex
	fired   []fireRec
	changed map[string]int
	removed []string
	workers map[string]bool
}

func newCronRig(t *testing.T, now string) *cronRig {
	r := &cronRig{t: t, clk: newFakeClock(mustTime(t, now)), changed: map[string]int{}, workers: map[string]bool{}}
	r.sch = NewCronScheduler(CronConfig{
		Clock: r.clk,
		Fire: func(s *CronSchedule, at time.Time) {
			r.mu.Lock()
			r.fired = append(r.fired, fireRec{s.Name, at, s.Executions})
			r.mu.Unlock()
		},
		HasWorkers: func(q string) bool { return r.workers[q] },
		// Called under the scheduler's lock, from its goroutine or the
		// caller's; read by the test after a Flush.
		Changed: func(s *CronSchedule) { r.changed[s.Name]++ },
		Removed: func(name string) { r.removed = append(r.removed, name) },
	})
	t.Cleanup(r.sch.Stop)
	return r
}

// at moves the clock and waits until what came due has fired.
func (r *cronRig) at(when string) {
	r.clk.set(mustTime(r.t, when))
	r.sch.Flush()
}

// takeFired returns the runs fired since the last call.
func (r *cronRig) takeFired() []fireRec {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.fired
	r.fired = nil
	return out
}

func (r *cronRig) add(s CronSchedule) CronSchedule {
	r.t.Helper()
	got, err := r.sch.Add(s)
	if err != nil {
		r.t.Fatal(err)
	}
	r.sch.Flush()
	return got
}

// wantFired checks the runs fired since the last check, as "name@time".
func (r *cronRig) wantFired(want ...string) {
	r.t.Helper()
	var got []string
	for _, f := range r.takeFired() {
		got = append(got, f.name+"@"+f.at.UTC().Format(time.RFC3339Nano))
	}
	for i := range want {
		name, at, _ := strings.Cut(want[i], "@")
		want[i] = name + "@" + mustTime(r.t, at).UTC().Format(time.RFC3339Nano)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		r.t.Errorf("fired %v, want %v", got, want)
	}
}

// wantArmed checks that exactly one timer exists and that it is armed for
// when ("" for disarmed).
func (r *cronRig) wantArmed(when string) {
	r.t.Helper()
	deadlines, made := r.clk.armed()
	if made != 1 {
		r.t.Errorf("%d timers made, want 1", made)
	}
	if when == "" {
		if len(deadlines) != 0 {
			r.t.Errorf("timer armed for %v, want disarmed", deadlines)
		}
		return
	}
	if len(deadlines) != 1 || !deadlines[0].Equal(mustTime(r.t, when)) {
		r.t.Errorf("timer armed for %v, want %s", deadlines, when)
	}
}

func TestCronSchedulerFiresOnTime(t *testing.T) {
	t.Parallel()
	r := newCronRig(t, "2026-01-01T12:07:00Z")
	s := r.add(CronSchedule{Name: "q15", Queue: "q", Schedule: "*/15 * * * *", Timezone: "UTC"})
	if want := mustTime(t, "2026-01-01T12:15:00Z").UnixMilli(); s.NextRun != want || s.Executions != 0 {
		t.Fatalf("added with next %d executions %d, want %d 0", s.NextRun, s.Executions, want)
	}
	r.wantArmed("2026-01-01T12:15:00Z")
	r.at("2026-01-01T12:14:59.999Z")
	r.wantFired()
	r.at("2026-01-01T12:15:00Z")
	r.wantFired("q15@2026-01-01T12:15:00Z")
	r.wantArmed("2026-01-01T12:30:00Z")
	r.at("2026-01-01T12:30:00.250Z") // a late wake-up still fires the run
	r.wantFired("q15@2026-01-01T12:30:00Z")
	// Asleep for hours: one run, not one per quarter hour missed.
	r.at("2026-01-01T15:40:00Z")
	r.wantFired("q15@2026-01-01T12:45:00Z")
	r.wantArmed("2026-01-01T15:45:00Z")
	got, _ := r.sch.Get("q15")
	if got.Executions != 3 || got.NextRun != mustTime(t, "2026-01-01T15:45:00Z").UnixMilli() {
		t.Errorf("executions %d next %d", got.Executions, got.NextRun)
	}
	if r.changed["q15"] != 3 {
		t.Errorf("changed %d times, want 3", r.changed["q15"])
	}
}

func TestCronSchedulerInterval(t *testing.T) {
	t.Parallel()
	r := newCronRig(t, "2026-01-01T00:00:00Z")
	r.add(CronSchedule{Name: "every", Queue: "q", RepeatEvery: 1000})
	r.wantArmed("2026-01-01T00:00:01Z")
	for i := 1; i <= 5; i++ {
		r.at("2026-01-01T00:00:0" + strconv.Itoa(i) + "Z")
	}
	r.wantFired("every@2026-01-01T00:00:01Z", "every@2026-01-01T00:00:02Z", "every@2026-01-01T00:00:03Z",
		"every@2026-01-01T00:00:04Z", "every@2026-01-01T00:00:05Z")
	// Late by 4.5 s: one run, and the next keeps the phase.
	r.at("2026-01-01T00:00:10.5Z")
	r.wantFired("every@2026-01-01T00:00:06Z")
	r.wantArmed("2026-01-01T00:00:11Z")
}

func TestCronSchedulerDST(t *testing.T) {
	t.Parallel()
	r := newCronRig(t, "2026-03-07T12:00:00Z")
	r.add(CronSchedule{Name: "night", Queue: "q", Schedule: "30 2 * * *", Timezone: "America/New_York"})
	r.wantArmed("2026-03-08T03:30:00-04:00") // 02:30 does not exist that night
	r.at("2026-03-08T03:30:00-04:00")
	r.wantFired("night@2026-03-08T03:30:00-04:00")
	r.wantArmed("2026-03-09T02:30:00-04:00")
	r.at("2026-10-31T23:59:00-04:00")
	r.wantFired("night@2026-03-09T02:30:00-04:00")
	r.wantArmed("2026-11-01T02:30:00-05:00")
	// 01:30 shows twice on 1 November: the schedule runs at the first.
	r.add(CronSchedule{Name: "one", Queue: "q", Schedule: "30 1 * * *", Timezone: "America/New_York"})
	r.wantArmed("2026-11-01T01:30:00-04:00")
	r.at("2026-11-01T01:30:00-04:00")
	r.wantFired("one@2026-11-01T01:30:00-04:00")
	r.wantArmed("2026-11-01T02:30:00-05:00")
	r.at("2026-11-01T01:30:00-05:00")
	r.wantFired()
	r.at("2026-11-01T02:30:00-05:00")
	r.wantFired("night@2026-11-01T02:30:00-05:00")
	if s, _ := r.sch.Get("one"); s.NextRun != mustTime(t, "2026-11-02T01:30:00-05:00").UnixMilli() {
		t.Errorf("one: next %s", time.UnixMilli(s.NextRun).UTC())
	}
}

func TestCronSchedulerMaxLimit(t *testing.T) {
	t.Parallel()
	r := newCronRig(t, "2026-01-01T00:00:00Z")
	r.add(CronSchedule{Name: "thrice", Queue: "q", RepeatEvery: 60000, MaxLimit: 3})
	r.add(CronSchedule{Name: "other", Queue: "q", Schedule: "0 * * * *", Timezone: "UTC"})
	for _, at := range []string{"00:01", "00:02", "00:03"} {
		r.at("2026-01-01T" + at + ":00Z")
	}
	fired := r.takeFired()
	if len(fired) != 3 || fired[2].executions != 3 {
		t.Fatalf("fired %v", fired)
	}
	if _, ok := r.sch.Get("thrice"); ok {
		t.Error("schedule still there after its last run")
	}
	if strings.Join(r.removed, ",") != "thrice" || r.sch.Len() != 1 {
		t.Errorf("removed %v, %d left", r.removed, r.sch.Len())
	}
	r.wantArmed("2026-01-01T01:00:00Z")
	r.at("2026-01-01T00:59:00Z")
	r.wantFired()
	// Zero or less is no limit, as in the reference.
	s := r.add(CronSchedule{Name: "nolimit", Queue: "q", RepeatEvery: 1000, MaxLimit: -1})
	if s.MaxLimit != 0 {
		t.Errorf("maxLimit %d, want 0", s.MaxLimit)
	}
}

func TestCronSchedulerImmediately(t *testing.T) {
	t.Parallel()
	r := newCronRig(t, "2026-01-01T10:00:00Z")
	r.add(CronSchedule{Name: "now", Queue: "q", RepeatEvery: 3600000, Immediately: true})
	r.add(CronSchedule{Name: "cron", Queue: "q", Schedule: "@daily", Timezone: "UTC", Immediately: true})
	r.wantFired("now@2026-01-01T10:00:00Z", "cron@2026-01-01T10:00:00Z")
	r.wantArmed("2026-01-01T11:00:00Z")
	r.at("2026-01-01T11:00:00Z")
	r.wantFired("now@2026-01-01T11:00:00Z")
	// Replacing keeps the executions and does not fire at once again.
	s := r.add(CronSchedule{Name: "now", Queue: "q", RepeatEvery: 60000, Immediately: true})
	r.wantFired()
	if s.Executions != 2 || s.NextRun != mustTime(t, "2026-01-01T11:01:00Z").UnixMilli() {
		t.Errorf("replaced: executions %d next %d", s.Executions, s.NextRun)
	}
	r.wantArmed("2026-01-01T11:01:00Z")
}

func TestCronSchedulerOneTimer(t *testing.T) {
	t.Parallel()
	r := newCronRig(t, "2026-01-01T00:00:00Z")
	r.wantArmed("")
	r.add(CronSchedule{Name: "late", Queue: "q", RepeatEvery: 3600000})
	r.wantArmed("2026-01-01T01:00:00Z")
	r.add(CronSchedule{Name: "soon", Queue: "q", RepeatEvery: 60000})
	r.wantArmed("2026-01-01T00:01:00Z")
	r.add(CronSchedule{Name: "later", Queue: "q", Schedule: "0 0 * * *", Timezone: "UTC"})
	r.wantArmed("2026-01-01T00:01:00Z")
	if !r.sch.Delete("soon") || r.sch.Delete("soon") {
		t.Error("Delete")
	}
	r.sch.Flush()
	r.wantArmed("2026-01-01T01:00:00Z")
	r.sch.Delete("late")
	r.sch.Delete("later")
	r.sch.Flush()
	r.wantArmed("")
	r.at("2026-01-02T00:00:00Z")
	r.wantFired()
}

func TestCronSchedulerSkipIfNoWorker(t *testing.T) {
	t.Parallel()
	r := newCronRig(t, "2026-01-01T00:00:00Z")
	r.add(CronSchedule{Name: "w", Queue: "jobs", RepeatEvery: 1000, SkipIfNoWorker: true})
	r.add(CronSchedule{Name: "any", Queue: "jobs", RepeatEvery: 1000})
	r.at("2026-01-01T00:00:01Z")
	r.wantFired("any@2026-01-01T00:00:01Z")
	if s, _ := r.sch.Get("w"); s.Executions != 0 || s.NextRun != mustTime(t, "2026-01-01T00:00:02Z").UnixMilli() {
		t.Errorf("skipped run: executions %d next %d", s.Executions, s.NextRun)
	}
	r.workers["jobs"] = true
	r.at("2026-01-01T00:00:02Z")
	r.wantFired("w@2026-01-01T00:00:02Z", "any@2026-01-01T00:00:02Z")
}

func TestCronSchedulerRestore(t *testing.T) {
	t.Parallel()
	r := newCronRig(t, "2026-01-01T12:00:00Z")
	ms := func(s string) int64 { return mustTime(t, s).UnixMilli() }
	err := r.sch.Restore([]CronSchedule{
		// Down since 09:00: the missed runs are dropped...
		{Name: "skip", Queue: "q", Schedule: "0 * * * *", Timezone: "UTC", SkipMissedOnRestart: true, NextRun: ms("2026-01-01T09:00:00Z"), Executions: 7},
		{Name: "skipw", Queue: "q", RepeatEvery: 60000, SkipIfNoWorker: true, NextRun: ms("2026-01-01T09:00:00Z")},
		// ...or run once at start, not once each.
		{Name: "catchup", Queue: "q", Schedule: "*/5 * * * *", Timezone: "UTC", NextRun: ms("2026-01-01T09:00:00Z"), Executions: 1},
		{Name: "catchupe", Queue: "q", RepeatEvery: 600000, NextRun: ms("2026-01-01T09:00:00Z")},
		// Still to come: left as it was.
		{Name: "future", Queue: "q", RepeatEvery: 1000, SkipMissedOnRestart: true, NextRun: ms("2026-01-01T12:30:00Z")},
		{Name: "spent", Queue: "q", RepeatEvery: 1000, MaxLimit: 2, Executions: 2, NextRun: ms("2026-01-01T09:00:00Z")},
		{Name: "broken", Queue: "q", Schedule: "0 0 L * *", NextRun: ms("2026-01-01T09:00:00Z")},
	})
	if want := `not restored: cron "broken": cron expression "0 0 L * *": day-of-month field "L"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Restore: %v, want %s", err, want)
	}
	var ce *CronError
	if !errors.As(err, &ce) || ce.Field != "day-of-month" {
		t.Errorf("Restore: %v", err)
	}
	r.sch.Flush()
	r.wantFired("catchup@2026-01-01T09:00:00Z", "catchupe@2026-01-01T09:00:00Z")
	for name, want := range map[string]string{
		"skip": "2026-01-01T13:00:00Z", "skipw": "2026-01-01T12:01:00Z", "catchup": "2026-01-01T12:05:00Z",
		"catchupe": "2026-01-01T12:10:00Z", "future": "2026-01-01T12:30:00Z",
	} {
		s, ok := r.sch.Get(name)
		if !ok || s.NextRun != ms(want) {
			t.Errorf("%s: next %s, want %s", name, time.UnixMilli(s.NextRun).UTC(), want)
		}
	}
	if s, _ := r.sch.Get("skip"); s.Executions != 7 {
		t.Errorf("skip: executions %d", s.Executions)
	}
	if r.changed["skip"] != 1 || r.changed["skipw"] != 1 || r.changed["future"] != 0 {
		t.Errorf("changed %v", r.changed)
	}
	if _, ok := r.sch.Get("spent"); ok || strings.Join(r.removed, ",") != "spent" {
		t.Errorf("spent schedule kept; removed %v", r.removed)
	}
	if _, ok := r.sch.Get("broken"); ok {
		t.Error("broken schedule loaded")
	}
}

func TestCronSchedulerAddErrors(t *testing.T) {
	t.Parallel()
	r := newCronRig(t, "2026-01-01T00:00:00Z")
	for _, c := range []struct {
		s    CronSchedule
		want string
	}{
		{CronSchedule{Queue: "q", RepeatEvery: 1}, "cron name is required"},
		{CronSchedule{Name: "a", RepeatEvery: 1}, `cron "a": queue is required`},
		{CronSchedule{Name: "a", Queue: "q"}, `cron "a": needs a schedule or repeatEvery`},
		{CronSchedule{Name: "a", Queue: "q", RepeatEvery: -5}, "repeatEvery must be a positive whole number"},
		{CronSchedule{Name: "a", Queue: "q", RepeatEvery: 1 << 53}, "repeatEvery must be a positive whole number"},
		{CronSchedule{Name: "a", Queue: "q", Schedule: "* * * * *", Timezone: "Nope/Zone"}, `cron "a": unknown time zone "Nope/Zone"`},
		{CronSchedule{Name: "a", Queue: "q", Schedule: "0 0 * * 8"}, `cron "a": cron expression "0 0 * * 8": day-of-week field "8": value 8 out of range 0-7`},
	} {
		if _, err := r.sch.Add(c.s); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.s, err, c.want)
		}
	}
	if r.sch.Len() != 0 {
		t.Errorf("%d schedules after refusals", r.sch.Len())
	}
}

func TestCronSchedulerList(t *testing.T) {
	t.Parallel()
	r := newCronRig(t, "2026-01-01T00:00:00Z")
	for _, n := range []string{"c", "a", "b"} {
		r.add(CronSchedule{Name: n, Queue: "q", RepeatEvery: 1000})
	}
	r.add(CronSchedule{Name: "a", Queue: "q2", RepeatEvery: 5000}) // replaced in place
	var names []string
	for _, s := range r.sch.List() {
		names = append(names, s.Name+":"+s.Queue)
	}
	if strings.Join(names, " ") != "c:q a:q2 b:q" {
		t.Errorf("list %v", names)
	}
}

// cronGoroutines counts the goroutines running sch's loop (the receiver
// is the first value of its frame in a traceback), so that schedulers of
// other tests' brokers, still stopping, do not count.
func cronGoroutines(sch *CronScheduler) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), fmt.Sprintf("(*CronScheduler).run(%p", sch))
		}
		buf = make([]byte, 2*len(buf))
	}
}

func TestCronSchedulerStop(t *testing.T) {
	t.Parallel()
	r := newCronRig(t, "2026-01-01T00:00:00Z")
	r.add(CronSchedule{Name: "a", Queue: "q", RepeatEvery: 1000})
	if n := cronGoroutines(r.sch); n != 1 {
		t.Fatalf("%d scheduler goroutines running, want 1", n)
	}
	r.sch.Stop()
	r.sch.Stop() // twice is harmless
	// Stop waited for the goroutine; all that may remain is its last
	// instructions after closing done.
	eventually(t, 10*time.Second, "no scheduler goroutine left", func() (bool, string) {
		n := cronGoroutines(r.sch)
		return n == 0, fmt.Sprint(n, " left")
	})
	if d, _ := r.clk.armed(); len(d) != 0 {
		t.Errorf("timer still armed for %v", d)
	}
	// Stopped: readable, nothing fires, Flush does not block.
	r.at("2026-01-01T00:00:05Z")
	r.wantFired()
	if _, ok := r.sch.Get("a"); !ok {
		t.Error("schedule gone after Stop")
	}
}

// The system clock and timer, for real: an interval of 10 ms fires.
func TestCronSchedulerSystemClock(t *testing.T) {
	t.Parallel()
	fired := make(chan time.Time, 10)
	sch := NewCronScheduler(CronConfig{Fire: func(s *CronSchedule, at time.Time) {
		select {
		case fired <- at:
		default:
		}
	}})
	defer sch.Stop()
	if _, err := sch.Add(CronSchedule{Name: "fast", Queue: "q", RepeatEvery: 10, MaxLimit: 3}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	var last time.Time
	for i := range 3 {
		select {
		case at := <-fired:
			// A slow machine may wake late and step over a run.
			if d := at.Sub(last); i > 0 && (d <= 0 || d%(10*time.Millisecond) != 0) {
				t.Errorf("run %d due %s after the previous, want a multiple of 10ms", i, d)
			}
			last = at
		case <-deadline:
			t.Fatalf("%d runs in 10 s", i)
		}
	}
	sch.Flush()
	if sch.Len() != 0 {
		t.Error("schedule left after maxLimit")
	}
}

// PUSH's repeat option: each completion pushes the next run, until limit.
func TestRepeatableJob(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c := dial(t, ts.addr)
	c.ok(map[string]any{"cmd": "PUSH", "queue": "rep", "name": "r", "data": 1, "repeat": map[string]any{"every": 100, "limit": 3}})
	if e := c.fail(map[string]any{"cmd": "PUSH", "queue": "rep", "data": 1, "repeat": map[string]any{"every": 100, "pattern": "* * * * *"}}); e != "repeat requires exactly one of every or pattern" {
		t.Fatalf("both every and pattern: %q", e)
	}
	if e := c.fail(map[string]any{"cmd": "PUSH", "queue": "rep", "data": 1, "jobId": "x", "repeat": map[string]any{"every": 100}}); e != "repeat jobs cannot use JobOptions.jobId; use repeat.jobId instead" {
		t.Fatalf("repeat with jobId: %q", e)
	}
	done := 0
	deadline := time.Now().Add(5 * time.Second)
	for done < 5 && time.Now().Before(deadline) {
		a := c.ok(map[string]any{"cmd": "PULL", "queue": "rep", "timeout": 300})
		if a["job"] == nil {
			if done >= 3 {
				break
			}
			continue
		}
		c.ok(map[string]any{"cmd": "ACK", "id": a["job"].(map[string]any)["id"]})
		done++
	}
	if done != 3 {
		t.Fatalf("a repeat with limit 3 ran %d times", done)
	}
}
