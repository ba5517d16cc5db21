package main

// Byte budgets and count limits on what clients send: every string and
// array a job carries, its progress, a failure's error and stack, a
// result, a job's logs. They are read and checked here once for both
// engines (memory/SQLite and PostgreSQL), and each refusal names the limit
// and its value. The limits are far above what a normal client sends: they
// are there so that one client cannot make the server hold (or a SQLite
// row carry) more than a bounded amount.

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

const (
	// maxJobBytes bounds a whole job: its data (itself at most
	// maxDataBytes, the reference's cap) with every other field that
	// grows it (tags, keys, dependencies, progress, errors, stack).
	maxJobBytes = maxDataBytes + 2<<20
	// maxKeyBytes bounds each short string of a job: uniqueKey, custom id,
	// parentId, debounceId, each tag and each dependency or child id.
	maxKeyBytes = 1 << 10
	// maxTags, maxDeps bound a job's arrays.
	maxTags = 1000
	maxDeps = 10000
	// maxRepeatBytes bounds a job's repeat options, encoded.
	maxRepeatBytes = 64 << 10
	// maxProgressBytes bounds a progress value (encoded) and, apart, a
	// progress message.
	maxProgressBytes = 64 << 10
	// maxErrorBytes bounds a FAIL's error; maxStackBytes the lines of its
	// stack trace together.
	maxErrorBytes = 64 << 10
	maxStackBytes = 256 << 10
	// maxResultBytes bounds one ACK's result, as the data cap bounds a
	// job's data; maxResultsBytes the results kept in memory together.
	maxResultBytes  = maxDataBytes
	maxResultsBytes = 256 << 20
	// A job's logs: each message, the level, all of one job's entries (the
	// oldest go first when a new one would not fit, as with the count
	// limit), and all jobs' logs together (the least recently used job's
	// logs go first).
	maxLogMessageBytes = 64 << 10
	maxLogLevelBytes   = 64
	maxLogBytesPerJob  = 1 << 20
	maxLogsBytes       = 256 << 20
)

// sizeText is n as a person reads it: "64 KiB (65536 bytes)".
func sizeText(n int64) string {
	unit := ""
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		unit = strconv.FormatInt(n>>20, 10) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		unit = strconv.FormatInt(n>>10, 10) + " KiB"
	default:
		return strconv.FormatInt(n, 10) + " bytes"
	}
	return unit + " (" + strconv.FormatInt(n, 10) + " bytes)"
}

// tooBig is the refusal of what is over a byte limit: what says what it is
// ("a log message is", "the logs of a job are").
func tooBig(what string, limit int64) error {
	return errors.New(what + " limited to " + sizeText(limit))
}

// tooMany is the refusal of a list or registry over its count limit.
func tooMany(what string, limit int) error {
	return errors.New(what + " limited to " + strconv.Itoa(limit))
}

func strsBytes(a []string) int64 {
	var n int64
	for _, s := range a {
		n += int64(len(s))
	}
	return n
}

// size is what a job weighs against maxJobBytes: its data and every
// string it carries.
func (j *Job) size() int64 {
	n := int64(len(j.Data) + len(j.Name) + j.idLen() + len(j.cold().UniqueKey) + len(j.cold().ParentID) +
		len(j.cold().GroupID) + len(j.cold().DebounceID) + len(j.cold().Progress) + len(j.cold().ProgressMsg) + len(j.cold().Repeat) + len(j.cold().failErr))
	if !j.hasID(j.cold().CustomID) {
		n += int64(len(j.cold().CustomID))
	}
	n += strsBytes(j.cold().Tags) + strsBytes(j.cold().DependsOn) + strsBytes(j.cold().Children) + strsBytes(j.cold().Stack)
	for i := range j.Timeline() {
		n += int64(len(j.Timeline()[i].Error))
	}
	for i := range j.cold().history {
		n += int64(len(j.cold().history[i].Error))
	}
	return n
}

var errJobTooBig = tooBig("a job (its data and other fields together) is", maxJobBytes)

// checkJobFields applies the limits of a job's own fields and of the
// whole job, at push. key names the custom id's field.
func checkJobFields(j *Job, key string) error {
	for _, f := range []struct {
		name, val string
	}{{"uniqueKey", j.cold().UniqueKey}, {key, j.cold().CustomID}, {"parentId", j.cold().ParentID}, {"debounceId", j.cold().DebounceID}} {
		if len(f.val) > maxKeyBytes {
			return tooBig(f.name+" is", maxKeyBytes)
		}
		if !storableText(f.val) {
			return errors.New(f.name + " " + textRule)
		}
	}
	for _, f := range []struct {
		name string
		list []string
		max  int
	}{{"tags", j.cold().Tags, maxTags}, {"dependsOn", j.cold().DependsOn, maxDeps}, {"childrenIds", j.cold().Children, maxDeps}} {
		if len(f.list) > f.max {
			return tooMany(f.name+" of a job are", f.max)
		}
		for _, s := range f.list {
			if len(s) > maxKeyBytes {
				return tooBig("each entry of "+f.name+" is", maxKeyBytes)
			}
			if !storableText(s) {
				return errors.New("each entry of " + f.name + " " + textRule)
			}
		}
	}
	if len(j.cold().Repeat) > maxRepeatBytes {
		return tooBig("repeat is", maxRepeatBytes)
	}
	if j.size() > maxJobBytes {
		return errJobTooBig
	}
	return nil
}

// checkProgress applies the progress limits, and the job's total with the
// new progress in place of the old.
func (u progressSet) check(j *Job) error {
	n := j.size() - int64(len(j.cold().Progress)) + int64(len(u.prog))
	if u.msgKey {
		n += int64(len(u.msg) - len(j.cold().ProgressMsg))
	}
	if n > maxJobBytes {
		return errJobTooBig
	}
	return nil
}

// checkResult applies the result limit to one ACK's result.
func checkResult(res Raw) error {
	if len(res) > maxResultBytes {
		return tooBig("a job's result is", maxResultBytes)
	}
	return nil
}

// checkLogEntry applies the limits of one log line.
func checkLogEntry(e LogEntry) error {
	if len(e.Message) > maxLogMessageBytes {
		return tooBig("a log message is", maxLogMessageBytes)
	}
	if len(e.Level) > maxLogLevelBytes {
		return tooBig("a log level is", maxLogLevelBytes)
	}
	return nil
}

func logEntryBytes(e LogEntry) int64 { return int64(len(e.Message)+len(e.Level)) + 16 }

func logsBytes(logs []LogEntry) int64 {
	var n int64
	for _, e := range logs {
		n += logEntryBytes(e)
	}
	return n
}

// appendLog adds e to a job's logs and drops the oldest entries while the
// logs are over their count or byte limit. logs is not changed.
func appendLog(logs []LogEntry, e LogEntry) []LogEntry {
	drop := max(len(logs)+1-maxLogsPerJob, 0)
	total := logsBytes(logs[drop:]) + logEntryBytes(e)
	for drop < len(logs) && total > maxLogBytesPerJob {
		total -= logEntryBytes(logs[drop])
		drop++
	}
	out := make([]LogEntry, 0, len(logs)-drop+1)
	out = append(out, logs[drop:]...)
	return append(out, e)
}

// setJobData replaces a job's data (Update) unless the job would then be
// over its size limit.
func setJobData(j *Job, data Raw) error {
	if j.size()-int64(len(j.Data))+int64(len(data)) > maxJobBytes {
		return errJobTooBig
	}
	j.Data = data
	return nil
}

// byteSize is a flag of bytes, written as a number with an optional unit:
// 512MiB, 1GiB, 64KiB, 100MB (powers of ten), or plain bytes.
type byteSize int64

// String writes the size as it could be given: 512MiB, 1GiB, or bytes.
func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		s string
		m int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.m == 0 {
			return strconv.FormatInt(n/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}
func (b *byteSize) Get() any { return *b }

func (b *byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

// parseByteSize reads a byteSize.
func parseByteSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if len(t) > len(u.suffix) && strings.EqualFold(t[len(t)-len(u.suffix):], u.suffix) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is not a size: a whole number of bytes, or one with a unit (KiB, MiB, GiB, KB, MB, GB)", s)
	}
	return n * mult, nil
}

// envSize reads a size from the first of keys that is set; def when none
// is or it is not a size (checkFlagEnv refuses the latter at start).
func envSize(keys []string, def int64) byteSize {
	if v := envOr(keys, ""); v != "" {
		if n, err := parseByteSize(v); err == nil {
			return byteSize(n)
		}
	}
	return byteSize(def)
}
