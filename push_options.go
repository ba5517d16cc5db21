package main

// Reading and validating a job's options from a PUSH request or a PUSHB
// entry. The checks, their order and their messages are the reference's, so
// that clients see the same errors; fields the reference takes unchecked
// get a check of their own, with a message that names the field.

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// validNameChars reports whether s uses only [a-zA-Z0-9_\-.:], the
// reference's queue-name alphabet.
func validNameChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// storableText reports whether s can be kept as text by every storage:
// valid UTF-8 without NUL, which PostgreSQL's text refuses (its error
// would reach the client as a database error). What a client names
// things by that is kept in text columns or looked up in them must be
// such text: ids and tokens (Map.Key, Map.Keys), a job's keys
// (checkJobFields), a pull's owner (checkKeyText), a cron's name.
func storableText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// checkKeyText checks a short string a client names something by (a
// pull's owner): at most maxKeyBytes, and storable text.
func checkKeyText(field, s string) error {
	if len(s) > maxKeyBytes {
		return tooBig(field+" is", maxKeyBytes)
	}
	if !storableText(s) {
		return errors.New(field + " " + textRule)
	}
	return nil
}

const (
	maxQueueName  = 256
	maxJobName    = 256
	maxGroupID    = 256
	maxDataBytes  = 10 * 1024 * 1024
	maxPriority   = 1000000
	maxGroupPrio  = 2097151
	maxDelayMs    = 31536000000
	maxTimeoutMs  = 86400000
	maxAttemptCap = 1000
	// maxTimestamp bounds a time given as a date (ms since the epoch): it
	// is past the year 33000, and far enough from int64's end that a
	// delay added to it cannot wrap around.
	maxTimestamp = 1000000000000000
)

// later is now plus d ms, for a time a client set that no handler bounds
// (a DLQ policy's interval or age): at most maxTimestamp ahead, so that
// the sum cannot wrap around to a time in the past.
func later(now, d int64) int64 { return now + min(d, maxTimestamp) }

// The ranges PUSH takes for a priority and a time, which every command
// that takes one applies too (issue 25): the commands that move a job
// could otherwise put it where PUSH would never have, and a time past
// int64's end wraps around to one in the past (a delay of 2^63-1 made
// the job due at once).
var (
	priorityRule = numRule{min: -maxPriority, max: maxPriority, integer: true}
	delayRule    = numRule{min: 0, max: maxDelayMs}
	// leaseRule is a lock's time to live: a year at most, as a delay; one
	// of 0 or less keeps the default (or the lock's own), as it always has.
	leaseRule = numRule{min: -maxDelayMs, max: maxDelayMs}
)

func validQueueName(name string, ok bool) error {
	switch {
	case !ok || name == "":
		return errors.New("Queue name is required")
	case len(name) > maxQueueName:
		return errors.New("Queue name too long (max 256 characters)")
	case !validNameChars(name):
		return errors.New("Queue name contains invalid characters")
	}
	return nil
}

// queueArg reads and validates the queue field of a request.
func queueArg(m Map) (string, error) {
	q, ok, err := m.Str("queue")
	if err != nil {
		return "", err
	}
	return q, validQueueName(q, ok)
}

// numField reads an optional number with the reference's validation.
type numRule struct {
	min, max float64
	integer  bool
}

func numField(m Map, key, label string, r numRule) (float64, bool, error) {
	raw := m.Get(key)
	if raw.IsNil() {
		return 0, false, nil
	}
	f, err := raw.Float()
	if err != nil {
		return 0, false, errors.New(label + " must be a number")
	}
	if err := r.check(label, f); err != nil {
		return 0, false, err
	}
	return f, true, nil
}

// check refuses f, the number a field labelled label was given, when the
// rule does not take it; the words are the reference's.
func (r numRule) check(label string, f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return errors.New(label + " must be a finite number")
	}
	if r.integer && f != math.Trunc(f) {
		return errors.New(label + " must be an integer")
	}
	if f < r.min {
		return errors.New(label + " must be at least " + fmtNum(r.min))
	}
	if f > r.max {
		return errors.New(label + " must be at most " + fmtNum(r.max))
	}
	return nil
}

// anyNumber only checks that a number is finite (and an integer when
// asked): a rule for a field whose range is checked later.
func anyNumber(integer bool) numRule {
	return numRule{min: math.Inf(-1), max: math.Inf(1), integer: integer}
}

func fmtNum(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e18 {
		return itoa(int64(f))
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// optNum reads an unvalidated optional number the reference keeps as given,
// refusing what is not a number at all. Zero reads as absent, as the
// reference's `value || null` makes it.
func optNum(m Map, key string) (int64, error) {
	f, ok, err := m.Num(key)
	if err != nil {
		return none, err
	}
	if !ok || f == 0 || math.IsNaN(f) {
		return none, nil
	}
	if math.IsInf(f, 0) || math.Abs(f) > 9007199254740991 {
		return none, errors.New(key + " must be a finite number")
	}
	return int64(f), nil
}

// truthy reads a field the way JavaScript's Boolean() would for the values
// a client sends: absent, nil, false, 0 and "" are false.
func truthy(m Map, key string) bool {
	r := m.Get(key)
	if r.IsNil() {
		return false
	}
	switch r[0] {
	case 0xc2:
		return false
	case 0xc3:
		return true
	}
	if f, err := r.Float(); err == nil {
		return f != 0 && !math.IsNaN(f)
	}
	if s, err := r.Str(); err == nil {
		return s != ""
	}
	return true
}

func optStrField(m Map, key string) (string, error) {
	s, _, err := m.Str(key)
	return s, err
}

var rawUndefined = Raw{0xd4, 0, 0}

func clone(r Raw) Raw {
	if r == nil {
		return nil
	}
	return appendBig(make([]byte, 0, len(r)), r)
}

// parseJob builds a job from a PUSH request or PUSHB entry. customKey is the
// field that carries a custom id: "jobId" for PUSH, "customId" for PUSHB.
//
// The steps run in the reference's order, so that a request with several
// faults gets the same (first) error; each stops at its first fault.
func parseJob(m Map, queue, customKey string, now int64) (*Job, error) {
	// The cold options' defaults are noCold's (job.go).
	j := &Job{Queue: queue}
	if err := parseJobPayload(m, j); err != nil {
		return nil, err
	}
	if err := parseJobGroup(m, j); err != nil {
		return nil, err
	}
	delay, err := parseJobSchedule(m, j)
	if err != nil {
		return nil, err
	}
	if err := parseJobLinks(m, j, customKey); err != nil {
		return nil, err
	}
	if err := parseJobLimits(m, j); err != nil {
		return nil, err
	}
	parseJobFlags(m, j)
	if err := parseJobDedupRepeat(m, j); err != nil {
		return nil, err
	}
	if err := parseJobTimes(m, j, now, delay); err != nil {
		return nil, err
	}
	if j.cold().CustomID != "" {
		j.setID(j.cold().CustomID)
		j.warm().arrived = now
	} else {
		j.id = newUUID()
	}
	if err := checkJobFields(j, customKey); err != nil {
		return nil, err
	}
	j.settle()
	return j, nil
}

// parseJobBatch reads PUSHB's jobs. A refusal names the job.
func parseJobBatch(items []Raw, queue string, now int64) ([]*Job, error) {
	jobs := make([]*Job, len(items))
	var fields []Field // one slice for every job's fields: parseJob keeps none of them
	for i, it := range items {
		m, err := ParseMap(it, fields[:0])
		fields = m.Fields
		if err != nil {
			return nil, errors.New("jobs[" + strconv.Itoa(i) + "]: job must be an object")
		}
		if jobs[i], err = parseJob(m, queue, "customId", now); err != nil {
			return nil, errors.New("jobs[" + strconv.Itoa(i) + "]: " + err.Error())
		}
		// The jobs of a batch mostly share a name: one string for all
		// of them keeps a waiting job some 16 bytes smaller.
		if i > 0 && jobs[i].Name == jobs[i-1].Name {
			jobs[i].Name = jobs[i-1].Name
		}
	}
	return jobs, nil
}

// parseJobPayload reads the data, and the name (possibly from a legacy
// {name, ...} payload).
func parseJobPayload(m Map, j *Job) error {
	data := m.Get("data")
	if data == nil {
		data = rawUndefined
	}
	if len(data) > maxDataBytes {
		return errors.New("Job data too large (max 10MB)")
	}
	nameRaw := m.Get("name")
	switch {
	case nameRaw != nil:
		name, err := nameRaw.Str()
		if err != nil || name == "" || utf8.RuneCountInString(name) > maxJobName {
			return errors.New("Job name must be a non-empty string of at most 256 characters")
		}
		j.Name = name
	default:
		j.Name, data = legacyName(data)
	}
	j.Data = clone(data)
	return nil
}

// parseJobGroup reads the group id and the group size asked for at push.
func parseJobGroup(m Map, j *Job) error {
	if g := m.Get("groupId"); g != nil {
		gs, err := g.Str()
		if err != nil {
			return errors.New("groupId must be a string")
		}
		if err := checkGroupID(gs); err != nil {
			return err
		}
		j.warm().GroupID = gs
	}
	if m.Has("groupMaxSize") {
		v, err := positiveSafeInt(m, "groupMaxSize")
		if err != nil {
			return errors.New("group.maxSize must be a positive safe integer")
		}
		j.warm().groupMax = v
	}
	return nil
}

// parseJobSchedule reads the options the reference validates, in its order:
// priority (the group's range when the job has a group), delay, timeout,
// maxAttempts, backoff and ttl. The delay is returned for parseJobTimes,
// which needs createdAt first.
func parseJobSchedule(m Map, j *Job) (delay float64, err error) {
	var f float64
	var ok bool
	if j.cold().GroupID == "" {
		f, ok, err = numField(m, "priority", "priority", priorityRule)
	} else {
		f, ok, err = groupPriority(m)
	}
	if err != nil {
		return 0, err
	}
	if ok {
		j.Priority = int64(f)
	}
	if delay, _, err = numField(m, "delay", "delay", delayRule); err != nil {
		return 0, err
	}
	if f, ok, err = numField(m, "timeout", "timeout", numRule{min: 0, max: maxTimeoutMs}); err != nil {
		return 0, err
	} else if ok && f > 0 {
		j.warm().Timeout = int64(math.Ceil(f))
	}
	if f, ok, err = numField(m, "maxAttempts", "maxAttempts", numRule{min: 1, max: maxAttemptCap, integer: true}); err != nil {
		return 0, err
	} else if ok {
		j.warm().MaxAttempts = int32(f)
	}
	if err := parseBackoff(m, j); err != nil {
		return 0, err
	}
	if f, ok, err = numField(m, "ttl", "ttl", numRule{min: 0, max: maxDelayMs}); err != nil {
		return 0, err
	} else if ok && f > 0 {
		j.warm().TTL = int64(f)
	}
	return delay, nil
}

// parseJobLinks reads what ties the job to others: its unique key, custom
// id, parent, tags, dependencies and children. From here on, fields are
// checked for their type only.
func parseJobLinks(m Map, j *Job, customKey string) error {
	var err error
	if j.warm().UniqueKey, err = optStrField(m, "uniqueKey"); err != nil {
		return err
	}
	if customKey != "" {
		if j.warm().CustomID, err = optStrField(m, customKey); err != nil {
			return err
		}
		if j.cold().CustomID != "" && !utf8.ValidString(j.cold().CustomID) {
			return errors.New("custom ID must be well-formed Unicode")
		}
	}
	if j.warm().ParentID, err = optStrField(m, "parentId"); err != nil {
		return err
	}
	for _, k := range []struct {
		key string
		dst *[]string
	}{{"tags", &j.warm().Tags}, {"dependsOn", &j.warm().DependsOn}, {"childrenIds", &j.warm().Children}} {
		v, _, err := m.Strs(k.key)
		if err != nil {
			return err
		}
		*k.dst = v
	}
	return nil
}

// parseJobLimits reads the optional numbers the reference keeps as given
// (stall timeout, log and size limits, debounce ttl), the stack trace
// limit, clamped, and the debounce id.
func parseJobLimits(m Map, j *Job) error {
	var err error
	for _, k := range []struct {
		key string
		dst *int64
	}{{"stallTimeout", &j.warm().StallTimeout}, {"keepLogs", &j.warm().KeepLogs}, {"sizeLimit", &j.warm().SizeLimit}, {"debounceTtl", &j.warm().DebounceTTL}} {
		if *k.dst, err = optNum(m, k.key); err != nil {
			return err
		}
	}
	if f, ok, err := m.Num("stackTraceLimit"); err != nil {
		return err
	} else if ok && !math.IsNaN(f) {
		j.warm().StackTraceLimit = int32(max(0, min(f, 1000)))
	}
	if j.warm().DebounceID, err = optStrField(m, "debounceId"); err != nil {
		return err
	}
	return nil
}

// parseJobFlags reads the boolean options, which never fail: any value
// reads as JavaScript's Boolean() would.
func parseJobFlags(m Map, j *Job) {
	j.warm().Lifo = truthy(m, "lifo")
	j.warm().RemoveOnComplete = truthy(m, "removeOnComplete")
	j.warm().RemoveOnFail = truthy(m, "removeOnFail")
	j.warm().Durable = truthy(m, "durable")
	j.warm().FailParent = truthy(m, "failParentOnFailure")
	j.warm().RemoveDepOnFail = truthy(m, "removeDependencyOnFailure")
	j.warm().ContinueParent = truthy(m, "continueParentOnFailure")
	j.warm().IgnoreDepOnFail = truthy(m, "ignoreDependencyOnFailure")
}

// parseJobDedupRepeat reads the dedup object and the repeat object, which
// is kept as given for the cron side to read.
func parseJobDedupRepeat(m Map, j *Job) error {
	if d, ok, err := m.Map("dedup"); err != nil {
		return err
	} else if ok {
		if j.warm().DedupTTL, err = optNum(d, "ttl"); err != nil {
			return &FieldError{Field: "dedup." + err.Error()}
		}
		j.warm().DedupExtend = truthy(d, "extend")
		j.warm().DedupReplace = truthy(d, "replace")
	}
	if r := m.Get("repeat"); r != nil {
		if r[0] < 0x80 || (r[0] > 0x8f && r[0] != 0xde && r[0] != 0xdf) {
			return errors.New("repeat must be an object")
		}
		j.warm().Repeat = clone(r)
	}
	return nil
}

// parseJobTimes sets the job's times: createdAt may be given (timestamp);
// runAt follows from delay.
func parseJobTimes(m Map, j *Job, now int64, delay float64) error {
	j.CreatedAt = now
	if ts, ok, err := m.Num("timestamp"); err != nil {
		return err
	} else if ok && ts > 0 && !math.IsInf(ts, 0) && ts < maxTimestamp {
		j.CreatedAt = int64(ts)
	}
	j.RunAt = j.CreatedAt + int64(delay)
	j.setHeartbeat(j.CreatedAt)
	return nil
}

func groupPriority(m Map) (float64, bool, error) {
	raw := m.Get("priority")
	if raw.IsNil() {
		return 0, false, nil
	}
	f, err := raw.Float()
	switch {
	case err != nil || math.IsNaN(f) || math.IsInf(f, 0):
		return 0, false, errors.New("group.priority must be a finite number")
	case f != math.Trunc(f):
		return 0, false, errors.New("group.priority must be an integer")
	}
	if err := checkPriority(f, true); err != nil {
		return 0, false, err
	}
	return f, true, nil
}

// checkPriority refuses a finite integer priority out of PUSH's range for
// a job with a group (grouped) or without one, in PUSH's words.
func checkPriority(f float64, grouped bool) error {
	if !grouped {
		return priorityRule.check("priority", f)
	}
	if f < 0 || f > maxGroupPrio {
		return errors.New("group.priority must be between 0 and 2097151")
	}
	return nil
}

func parseBackoff(m Map, j *Job) error {
	raw := m.Get("backoff")
	if raw.IsNil() {
		return nil
	}
	if sub, err := ParseMap(raw, nil); err == nil {
		typ, _, _ := sub.Str("type")
		if typ != "fixed" && typ != "exponential" {
			return errors.New("backoff.type must be 'fixed' or 'exponential'")
		}
		d, ok, err := numField(sub, "delay", "backoff.delay", numRule{min: 0, max: maxTimeoutMs})
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("backoff.delay is required")
		}
		c := &Backoff{Exponential: typ == "exponential", Delay: int64(d), MaxDelay: none}
		if md, ok, err := numField(sub, "maxDelay", "backoff.maxDelay", numRule{min: 0, max: maxDelayMs}); err != nil {
			return err
		} else if ok && md > 0 {
			c.MaxDelay = int64(md)
		}
		j.warm().BackoffObj = c
		j.warm().Backoff = c.Delay
		return nil
	}
	d, _, err := numField(m, "backoff", "backoff", numRule{min: 0, max: maxTimeoutMs})
	if err != nil {
		return err
	}
	j.warm().Backoff = int64(d)
	return nil
}

// legacyName takes the job name out of a {name, ...} payload, as older
// clients sent it; anything else is named "default".
func legacyName(data Raw) (string, Raw) {
	d, err := ParseMap(data, nil)
	if err != nil {
		return "default", data
	}
	name, ok, err := d.Str("name")
	if err != nil || !ok {
		return "default", data
	}
	var e Enc
	kept := 0
	for _, f := range d.Fields {
		if string(f.Key) != "name" {
			kept++
		}
	}
	e.MapHead(kept)
	for _, f := range d.Fields {
		if string(f.Key) == "name" {
			continue
		}
		e.Str(string(f.Key))
		e.Raw(f.Val)
	}
	return name, e.B
}

// checkGroupID is the rule of a group's id, at push and in the group
// commands: the reference's (non-empty, at most 256 characters, no NUL),
// and UTF-8, as PostgreSQL's text keeps it.
func checkGroupID(g string) error {
	switch {
	case g == "":
		return errors.New("groupId must be a non-empty string")
	case utf8.RuneCountInString(g) > maxGroupID:
		return errors.New("groupId must be at most 256 characters")
	case containsNUL(g):
		return errors.New("groupId must not contain NUL characters")
	case !utf8.ValidString(g):
		return errors.New("groupId must be UTF-8 text")
	}
	return nil
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}
