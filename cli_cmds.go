package main

// The client subcommands: what each sends on the wire. Names, arguments,
// options and the protocol command each one sends follow the reference
// CLI (bunqueue 2.9.5), so that a script written for one works with the
// other.

import (
	"net/url"
	"slices"
	"strings"
)

// clientCommands maps a command word to its subcommands ("" when it has
// none). The order is the order of the help text.
var clientCommands = []struct {
	name string
	subs []string
}{
	{"push", nil}, {"pull", nil}, {"ack", nil}, {"fail", nil},
	{"job", []string{"get", "state", "result", "cancel", "progress", "update", "priority", "promote", "delay", "discard", "logs", "log", "wait"}},
	{"queue", []string{"list", "pause", "resume", "drain", "obliterate", "clean", "count", "jobs", "paused"}},
	{"rate-limit", []string{"set", "clear"}},
	{"concurrency", []string{"set", "clear"}},
	{"dlq", []string{"list", "retry", "purge"}},
	{"cron", []string{"list", "add", "delete"}},
	{"worker", []string{"list", "register", "unregister"}},
	{"webhook", []string{"list", "add", "remove"}},
	{"stats", nil}, {"metrics", nil}, {"health", nil}, {"ping", nil},
}

func isClientCommand(name string) bool {
	for _, c := range clientCommands {
		if c.name == name {
			return true
		}
	}
	return false
}

func subsOf(name string) []string {
	for _, c := range clientCommands {
		if c.name == name {
			return c.subs
		}
	}
	return nil
}

// jobStates are the states `queue jobs` and `queue clean` accept.
var jobStates = []string{"waiting", "delayed", "active", "completed", "failed"}

// buildRequest turns a subcommand line into the request it sends. sub is
// the subcommand word, "" for commands without one.
func buildRequest(cmd string, args []string) (req map[string]any, sub string, err error) {
	subs := subsOf(cmd)
	if subs != nil {
		if len(args) == 0 || strings.HasPrefix(args[0], "-") {
			return nil, "", usagef("%s: missing subcommand; use one of: %s", cmd, strings.Join(subs, ", "))
		}
		sub = args[0]
		if !slices.Contains(subs, sub) {
			return nil, "", usagef("%s: unknown subcommand %q; use one of: %s", cmd, sub, strings.Join(subs, ", "))
		}
		args = args[1:]
	}
	name := strings.TrimSpace(cmd + " " + sub)
	switch cmd {
	case "push":
		req, err = buildPush(args)
	case "pull":
		req, err = buildPull(args)
	case "ack":
		req, err = buildAck(args)
	case "fail":
		req, err = buildFail(args)
	case "job":
		req, err = buildJob(name, sub, args)
	case "queue":
		req, err = buildQueue(name, sub, args)
	case "rate-limit", "concurrency":
		req, err = buildLimit(name, cmd, sub, args)
	case "dlq":
		req, err = buildDlq(name, sub, args)
	case "cron":
		req, err = buildCron(name, sub, args)
	case "worker":
		req, err = buildWorker(name, sub, args)
	case "webhook":
		req, err = buildWebhook(name, sub, args)
	case "stats", "health":
		req, err = noArgs(name, args, "Stats")
	case "metrics":
		req, err = noArgs(name, args, "Prometheus")
	case "ping":
		req, err = noArgs(name, args, "Ping")
	default:
		return nil, "", usagef("unknown command %q (try: queued help)", cmd)
	}
	return req, sub, err
}

func noArgs(name string, args []string, wire string) (map[string]any, error) {
	p, err := parseArgs(name, args)
	if err != nil {
		return nil, err
	}
	if len(p.pos) > 0 {
		return nil, usagef("%s: unexpected argument %q", name, p.pos[0])
	}
	return map[string]any{"cmd": wire}, nil
}

// onePos reads a subcommand that takes exactly the named positionals.
func onePos(name string, args []string, names ...string) ([]string, error) {
	p, err := parseArgs(name, args)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(names))
	for i, n := range names {
		if out[i], err = p.need(name, i, n); err != nil {
			return nil, err
		}
	}
	if len(p.pos) > len(names) {
		return nil, usagef("%s: unexpected argument %q", name, p.pos[len(names)])
	}
	return out, nil
}

func buildPush(args []string) (map[string]any, error) {
	const name = "push"
	p, err := parseArgs(name, args,
		optSpec{long: "priority", short: "P"}, optSpec{long: "delay", short: "d"},
		optSpec{long: "max-attempts"}, optSpec{long: "backoff"}, optSpec{long: "ttl"},
		optSpec{long: "timeout"}, optSpec{long: "unique-key", short: "u"}, optSpec{long: "job-id"},
		optSpec{long: "depends-on"}, optSpec{long: "tags"}, optSpec{long: "group-id", short: "g"},
		optSpec{long: "lifo", bool: true}, optSpec{long: "remove-on-complete", bool: true},
		optSpec{long: "remove-on-fail", bool: true})
	if err != nil {
		return nil, err
	}
	queue, err := p.need(name, 0, "queue")
	if err != nil {
		return nil, err
	}
	raw, err := p.need(name, 1, "data")
	if err != nil {
		return nil, err
	}
	if len(p.pos) > 2 {
		return nil, usagef("push: unexpected argument %q (quote the JSON data as one argument)", p.pos[2])
	}
	data, err := parseJSON(name, "data", raw)
	if err != nil {
		return nil, err
	}
	req := map[string]any{"cmd": "PUSH", "queue": queue, "name": "default", "data": data}
	for _, o := range []struct {
		opt, field string
		check      func(int64) string
	}{
		{"priority", "priority", nil},
		{"delay", "delay", func(n int64) string { return cond(n < 0, "delay must be >= 0") }},
		{"max-attempts", "maxAttempts", func(n int64) string { return cond(n < 1, "max-attempts must be >= 1") }},
		{"backoff", "backoff", nil},
		{"ttl", "ttl", nil},
		{"timeout", "timeout", func(n int64) string { return cond(n <= 0, "timeout must be > 0") }},
	} {
		n, ok, err := p.optInt(name, o.opt)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if o.check != nil {
			if msg := o.check(n); msg != "" {
				return nil, usagef("push: %s", msg)
			}
		}
		req[o.field] = n
	}
	if v := p.str("unique-key"); v != "" {
		req["uniqueKey"] = v
	}
	if v := p.str("job-id"); v != "" {
		req["jobId"] = v
	}
	if v := p.str("depends-on"); v != "" {
		req["dependsOn"] = splitList(v)
	}
	if v := p.str("tags"); v != "" {
		req["tags"] = splitList(v)
	}
	if v := p.str("group-id"); v != "" {
		req["groupId"] = v
	}
	for opt, field := range map[string]string{"lifo": "lifo", "remove-on-complete": "removeOnComplete", "remove-on-fail": "removeOnFail"} {
		if p.set[opt] {
			req[field] = true
		}
	}
	return req, nil
}

func cond(bad bool, msg string) string {
	if bad {
		return msg
	}
	return ""
}

func buildPull(args []string) (map[string]any, error) {
	p, err := parseArgs("pull", args, optSpec{long: "timeout", short: "t"})
	if err != nil {
		return nil, err
	}
	queue, err := p.need("pull", 0, "queue")
	if err != nil {
		return nil, err
	}
	// detach: the job stays active after this short-lived connection
	// closes, so that ack or fail can come from another one.
	req := map[string]any{"cmd": "PULL", "queue": queue, "detach": true}
	if n, ok, err := p.optInt("pull", "timeout"); err != nil {
		return nil, err
	} else if ok {
		req["timeout"] = n
	}
	return req, nil
}

func buildAck(args []string) (map[string]any, error) {
	p, err := parseArgs("ack", args, optSpec{long: "result", short: "r"})
	if err != nil {
		return nil, err
	}
	id, err := p.need("ack", 0, "id")
	if err != nil {
		return nil, err
	}
	req := map[string]any{"cmd": "ACK", "id": id}
	if v := p.str("result"); v != "" {
		if req["result"], err = parseJSON("ack", "result", v); err != nil {
			return nil, err
		}
	}
	return req, nil
}

func buildFail(args []string) (map[string]any, error) {
	p, err := parseArgs("fail", args, optSpec{long: "error", short: "e"})
	if err != nil {
		return nil, err
	}
	id, err := p.need("fail", 0, "id")
	if err != nil {
		return nil, err
	}
	req := map[string]any{"cmd": "FAIL", "id": id}
	if v := p.str("error"); v != "" {
		req["error"] = v
	}
	return req, nil
}

func buildJob(name, sub string, args []string) (map[string]any, error) {
	simple := map[string]string{"get": "GetJob", "state": "GetState", "result": "GetResult", "cancel": "Cancel",
		"promote": "Promote", "discard": "Discard", "logs": "GetLogs"}
	if wire, ok := simple[sub]; ok {
		v, err := onePos(name, args, "id")
		if err != nil {
			return nil, err
		}
		return map[string]any{"cmd": wire, "id": v[0]}, nil
	}
	switch sub {
	case "progress":
		return buildProgress(name, args)
	case "update":
		v, err := onePos(name, args, "id", "data")
		if err != nil {
			return nil, err
		}
		data, err := parseJSON(name, "data", v[1])
		if err != nil {
			return nil, err
		}
		return map[string]any{"cmd": "Update", "id": v[0], "data": data}, nil
	case "priority":
		v, err := onePos(name, args, "id", "priority")
		if err != nil {
			return nil, err
		}
		n, err := parseInt(name, "priority", v[1])
		if err != nil {
			return nil, err
		}
		return map[string]any{"cmd": "ChangePriority", "id": v[0], "priority": n}, nil
	case "delay":
		v, err := onePos(name, args, "id", "delay")
		if err != nil {
			return nil, err
		}
		n, err := parseInt(name, "delay", v[1])
		if err != nil || n < 0 {
			return nil, usagef("%s: delay must be a positive number of milliseconds", name)
		}
		return map[string]any{"cmd": "MoveToDelayed", "id": v[0], "delay": n}, nil
	case "log":
		return buildAddLog(name, args)
	case "wait":
		return buildWaitJob(name, args)
	}
	return nil, usagef("%s: not handled", name)
}

// buildProgress is `job progress ID N [-m MESSAGE]`.
func buildProgress(name string, args []string) (map[string]any, error) {
	p, err := parseArgs(name, args, optSpec{long: "message", short: "m"})
	if err != nil {
		return nil, err
	}
	id, err := p.need(name, 0, "id")
	if err != nil {
		return nil, err
	}
	s, err := p.need(name, 1, "progress")
	if err != nil {
		return nil, err
	}
	n, err := parseInt(name, "progress", s)
	if err != nil || n < 0 || n > 100 {
		return nil, usagef("%s: progress must be a number between 0 and 100", name)
	}
	req := map[string]any{"cmd": "Progress", "id": id, "progress": n}
	if m := p.str("message"); m != "" {
		req["message"] = m
	}
	return req, nil
}

// buildAddLog is `job log ID MESSAGE [-l LEVEL]`.
func buildAddLog(name string, args []string) (map[string]any, error) {
	p, err := parseArgs(name, args, optSpec{long: "level", short: "l"})
	if err != nil {
		return nil, err
	}
	id, err := p.need(name, 0, "id")
	if err != nil {
		return nil, err
	}
	msg, err := p.need(name, 1, "message")
	if err != nil {
		return nil, err
	}
	level := p.str("level")
	if level == "" {
		level = "info"
	}
	if !slices.Contains([]string{"info", "warn", "error"}, level) {
		return nil, usagef("%s: invalid log level %q: must be info, warn or error", name, level)
	}
	return map[string]any{"cmd": "AddLog", "id": id, "message": msg, "level": level}, nil
}

// buildWaitJob is `job wait ID [-t TIMEOUT]`.
func buildWaitJob(name string, args []string) (map[string]any, error) {
	p, err := parseArgs(name, args, optSpec{long: "timeout", short: "t"})
	if err != nil {
		return nil, err
	}
	id, err := p.need(name, 0, "id")
	if err != nil {
		return nil, err
	}
	req := map[string]any{"cmd": "WaitJob", "id": id}
	if n, ok, err := p.optInt(name, "timeout"); err != nil {
		return nil, err
	} else if ok {
		if n < 0 {
			return nil, usagef("%s: invalid timeout %d: must be >= 0 ms", name, n)
		}
		req["timeout"] = n
	}
	return req, nil
}

func buildQueue(name, sub string, args []string) (map[string]any, error) {
	simple := map[string]string{"pause": "Pause", "resume": "Resume", "drain": "Drain", "obliterate": "Obliterate",
		"count": "Count", "paused": "IsPaused"}
	if wire, ok := simple[sub]; ok {
		v, err := onePos(name, args, "queue")
		if err != nil {
			return nil, err
		}
		return map[string]any{"cmd": wire, "queue": v[0]}, nil
	}
	switch sub {
	case "list":
		return noArgs(name, args, "ListQueues")
	case "clean":
		return buildClean(name, args)
	case "jobs":
		return buildGetJobs(name, args)
	}
	return nil, usagef("%s: not handled", name)
}

// buildClean is `queue clean QUEUE --grace MS [-s STATE] [-l LIMIT]`.
func buildClean(name string, args []string) (map[string]any, error) {
	p, err := parseArgs(name, args, optSpec{long: "grace", short: "g"}, optSpec{long: "state", short: "s"},
		optSpec{long: "limit", short: "l"})
	if err != nil {
		return nil, err
	}
	queue, err := p.need(name, 0, "queue")
	if err != nil {
		return nil, err
	}
	grace, ok, err := p.optInt(name, "grace")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, usagef("%s: --grace is required (age in milliseconds)", name)
	}
	if grace < 0 {
		return nil, usagef("%s: grace must be >= 0", name)
	}
	if err := checkState(name, p.str("state")); err != nil {
		return nil, err
	}
	// Always a state: without one the protocol's Clean removes
	// waiting and delayed jobs, which nobody should get by leaving
	// out an option. Completed jobs are what cleaning is for.
	state := p.str("state")
	if state == "" {
		state = "completed"
	}
	req := map[string]any{"cmd": "Clean", "queue": queue, "grace": grace, "state": state}
	if n, ok, err := p.optInt(name, "limit"); err != nil {
		return nil, err
	} else if ok {
		req["limit"] = n
	}
	return req, nil
}

// buildGetJobs is `queue jobs QUEUE [-s STATE] [-l LIMIT] [-o OFFSET]`.
func buildGetJobs(name string, args []string) (map[string]any, error) {
	p, err := parseArgs(name, args, optSpec{long: "state", short: "s"}, optSpec{long: "limit", short: "l"},
		optSpec{long: "offset", short: "o"})
	if err != nil {
		return nil, err
	}
	queue, err := p.need(name, 0, "queue")
	if err != nil {
		return nil, err
	}
	if err := checkState(name, p.str("state")); err != nil {
		return nil, err
	}
	req := map[string]any{"cmd": "GetJobs", "queue": queue}
	if s := p.str("state"); s != "" {
		req["state"] = s
	}
	if n, ok, err := p.optInt(name, "limit"); err != nil {
		return nil, err
	} else if ok {
		if n <= 0 {
			return nil, usagef("%s: limit must be > 0", name)
		}
		req["limit"] = n
	}
	if n, ok, err := p.optInt(name, "offset"); err != nil {
		return nil, err
	} else if ok {
		if n < 0 {
			return nil, usagef("%s: offset must be >= 0", name)
		}
		req["offset"] = n
	}
	return req, nil
}

// checkState refuses a state that is not a job state; "" is none.
func checkState(name, s string) error {
	if s != "" && !slices.Contains(jobStates, s) {
		return usagef("%s: invalid state %q: must be one of %s", name, s, strings.Join(jobStates, ", "))
	}
	return nil
}

func buildLimit(name, cmd, sub string, args []string) (map[string]any, error) {
	if sub == "clear" {
		v, err := onePos(name, args, "queue")
		if err != nil {
			return nil, err
		}
		wire := "RateLimitClear"
		if cmd == "concurrency" {
			wire = "ClearConcurrency"
		}
		return map[string]any{"cmd": wire, "queue": v[0]}, nil
	}
	v, err := onePos(name, args, "queue", "limit")
	if err != nil {
		return nil, err
	}
	n, err := parseInt(name, "limit", v[1])
	if err != nil || n <= 0 {
		what := "jobs per second"
		if cmd == "concurrency" {
			what = "most jobs active at once"
		}
		return nil, usagef("%s: limit must be a positive number (%s)", name, what)
	}
	wire := "RateLimit"
	if cmd == "concurrency" {
		wire = "SetConcurrency"
	}
	return map[string]any{"cmd": wire, "queue": v[0], "limit": n}, nil
}

func buildDlq(name, sub string, args []string) (map[string]any, error) {
	switch sub {
	case "list":
		p, err := parseArgs(name, args, optSpec{long: "count", short: "c"})
		if err != nil {
			return nil, err
		}
		queue, err := p.need(name, 0, "queue")
		if err != nil {
			return nil, err
		}
		req := map[string]any{"cmd": "Dlq", "queue": queue}
		if n, ok, err := p.optInt(name, "count"); err != nil {
			return nil, err
		} else if ok {
			req["count"] = n
		}
		return req, nil
	case "retry":
		p, err := parseArgs(name, args, optSpec{long: "id"})
		if err != nil {
			return nil, err
		}
		queue, err := p.need(name, 0, "queue")
		if err != nil {
			return nil, err
		}
		req := map[string]any{"cmd": "RetryDlq", "queue": queue}
		if id := p.str("id"); id != "" {
			req["jobId"] = id
		}
		return req, nil
	}
	v, err := onePos(name, args, "queue")
	if err != nil {
		return nil, err
	}
	return map[string]any{"cmd": "PurgeDlq", "queue": v[0]}, nil
}

func buildCron(name, sub string, args []string) (map[string]any, error) {
	switch sub {
	case "list":
		return noArgs(name, args, "CronList")
	case "delete":
		v, err := onePos(name, args, "name")
		if err != nil {
			return nil, err
		}
		return map[string]any{"cmd": "CronDelete", "name": v[0]}, nil
	}
	p, err := parseArgs(name, args, optSpec{long: "queue", short: "q"}, optSpec{long: "data", short: "d"},
		optSpec{long: "schedule", short: "s"}, optSpec{long: "every", short: "e"}, optSpec{long: "priority", short: "P"},
		optSpec{long: "max-limit"}, optSpec{long: "timezone", short: "z"})
	if err != nil {
		return nil, err
	}
	cname, err := p.need(name, 0, "name")
	if err != nil {
		return nil, err
	}
	if p.str("queue") == "" {
		return nil, usagef("%s: --queue (-q) is required", name)
	}
	if p.str("data") == "" {
		return nil, usagef("%s: --data (-d) is required (JSON)", name)
	}
	if p.str("schedule") == "" && p.str("every") == "" {
		return nil, usagef("%s: either --schedule (-s) or --every (-e) is required", name)
	}
	data, err := parseJSON(name, "data", p.str("data"))
	if err != nil {
		return nil, err
	}
	req := map[string]any{"cmd": "Cron", "name": cname, "queue": p.str("queue"), "data": data}
	if s := p.str("schedule"); s != "" {
		req["schedule"] = s
	}
	if n, ok, err := p.optInt(name, "every"); err != nil {
		return nil, err
	} else if ok {
		// A non-positive interval would fire on every scheduler tick.
		if n <= 0 {
			return nil, usagef("%s: invalid every %d: must be a positive interval in ms", name, n)
		}
		req["repeatEvery"] = n
	}
	if n, ok, err := p.optInt(name, "priority"); err != nil {
		return nil, err
	} else if ok {
		req["priority"] = n
	}
	if n, ok, err := p.optInt(name, "max-limit"); err != nil {
		return nil, err
	} else if ok {
		if n < 0 {
			return nil, usagef("%s: invalid max-limit %d: must be >= 0 (0 = unlimited)", name, n)
		}
		// 0 means unlimited, which is the field left out.
		if n > 0 {
			req["maxLimit"] = n
		}
	}
	if z := p.str("timezone"); z != "" {
		req["timezone"] = z
	}
	return req, nil
}

func buildWorker(name, sub string, args []string) (map[string]any, error) {
	switch sub {
	case "list":
		return noArgs(name, args, "ListWorkers")
	case "unregister":
		v, err := onePos(name, args, "workerId")
		if err != nil {
			return nil, err
		}
		return map[string]any{"cmd": "UnregisterWorker", "workerId": v[0]}, nil
	}
	p, err := parseArgs(name, args, optSpec{long: "queues", short: "q"})
	if err != nil {
		return nil, err
	}
	wname, err := p.need(name, 0, "name")
	if err != nil {
		return nil, err
	}
	if p.str("queues") == "" {
		return nil, usagef("%s: --queues (-q) is required (comma-separated queue names)", name)
	}
	queues := splitList(p.str("queues"))
	if len(queues) == 0 {
		return nil, usagef("%s: at least one queue must be given", name)
	}
	return map[string]any{"cmd": "RegisterWorker", "name": wname, "queues": queues}, nil
}

func buildWebhook(name, sub string, args []string) (map[string]any, error) {
	switch sub {
	case "list":
		return noArgs(name, args, "ListWebhooks")
	case "remove":
		v, err := onePos(name, args, "webhookId")
		if err != nil {
			return nil, err
		}
		return map[string]any{"cmd": "RemoveWebhook", "webhookId": v[0]}, nil
	}
	p, err := parseArgs(name, args, optSpec{long: "events", short: "e"}, optSpec{long: "queue", short: "q"},
		optSpec{long: "secret", short: "s"})
	if err != nil {
		return nil, err
	}
	u, err := p.need(name, 0, "url")
	if err != nil {
		return nil, err
	}
	valid := strings.Join(webhookEvents[:], ", ")
	if p.str("events") == "" {
		return nil, usagef("%s: --events (-e) is required (comma-separated); valid events: %s", name, valid)
	}
	events := splitList(p.str("events"))
	if len(events) == 0 {
		return nil, usagef("%s: at least one event must be given", name)
	}
	for _, ev := range events {
		if !slices.Contains(webhookEvents[:], ev) {
			return nil, usagef("%s: invalid event %q; valid events: %s", name, ev, valid)
		}
	}
	pu, perr := url.Parse(u)
	if perr != nil || pu.Host == "" {
		return nil, usagef("%s: invalid URL %q", name, u)
	}
	if pu.Scheme != "http" && pu.Scheme != "https" {
		return nil, usagef("%s: webhook URL must use http or https: %s", name, u)
	}
	req := map[string]any{"cmd": "AddWebhook", "url": u, "events": events}
	if q := p.str("queue"); q != "" {
		req["queue"] = q
	}
	if s := p.str("secret"); s != "" {
		req["secret"] = s
	}
	return req, nil
}
