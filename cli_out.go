package main

// Human output of the client subcommands: aligned tables, times as ages
// people can read ("3m 12s ago"), one line of confirmation for changes.
// --json bypasses all of this and prints the server's answer.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// view is one answer being shown.
type view struct {
	o        cliOpts
	cmd, sub string
	req      map[string]any
	ans      map[string]any // data lifted to the top
	rtt      time.Duration
	now      time.Time
	// after is the job as GetJob found it once FAIL was answered (FAIL's
	// answer does not say where the job went); afterErr when it could not.
	after    map[string]any
	afterErr error
}

// check turns answers that say ok but mean failure into errors, as the
// reference CLI does, so that scripts see a non-zero exit.
func (v *view) check() error {
	switch v.req["cmd"] {
	case "GetState":
		if v.ans["state"] == "unknown" {
			return fmt.Errorf("job %s: %w", v.req["id"], errNoJob)
		}
	case "WaitJob":
		if v.ans["completed"] == true {
			return nil
		}
		if v.ans["failed"] == true {
			return fmt.Errorf("job %s failed: %s", v.req["id"], jsStr(v.ans["error"], "no reason given"))
		}
		return fmt.Errorf("job %s not completed within the timeout", v.req["id"])
	}
	return nil
}

// render prints the answer for a person; "OK" for a command that has
// nothing else to say.
func (v *view) render(w io.Writer) {
	cmd, _ := v.req["cmd"].(string)
	if !v.renderJob(w, cmd) && !v.renderQueue(w, cmd) && !v.renderServer(w, cmd) {
		fmt.Fprintln(w, "OK")
	}
}

// renderJob prints the answer of a command on jobs; false when cmd is
// not one.
func (v *view) renderJob(w io.Writer, cmd string) bool {
	a := v.ans
	id, _ := v.req["id"].(string)
	queue, _ := v.req["queue"].(string)
	applied := a["applied"] != false
	switch cmd {
	case "PUSH":
		fmt.Fprintf(w, "Job created: %s\n", jsStr(a["id"], "?"))
	case "PULL":
		job, ok := a["job"].(map[string]any)
		if !ok {
			fmt.Fprintf(w, "No job available in %s\n", queue)
			return true
		}
		v.job(w, job)
	case "ACK":
		if !applied {
			fmt.Fprintf(w, "Job %s was already finished (%s); nothing changed\n", id, jsStr(a["reason"], "not applied"))
			return true
		}
		fmt.Fprintf(w, "Job %s completed\n", id)
	case "FAIL":
		if !applied {
			fmt.Fprintf(w, "Job %s was already finished (%s); nothing changed\n", id, jsStr(a["reason"], "not applied"))
			return true
		}
		v.failed(w, id)
	case "GetJob":
		job, ok := a["job"].(map[string]any)
		if !ok {
			fmt.Fprintf(w, "Job %s: not found\n", id)
			return true
		}
		v.job(w, job)
	case "GetState":
		fmt.Fprintf(w, "State: %s\n", jsStr(a["state"], "unknown"))
	case "GetResult", "WaitJob":
		if v.req["cmd"] == "WaitJob" {
			fmt.Fprintf(w, "Job %s completed\n", id)
		}
		r, has := a["result"]
		if _, undef := r.(Undefined); !has || undef || r == nil {
			fmt.Fprintln(w, "No result (the job has not completed, or its result was removed)")
			return true
		}
		b, _ := json.MarshalIndent(toJSON(r), "", "  ")
		fmt.Fprintf(w, "Result: %s\n", b)
	case "Progress":
		msg := ""
		if m, _ := v.req["message"].(string); m != "" {
			msg = " (" + m + ")"
		}
		fmt.Fprintf(w, "Progress of job %s set to %v%%%s\n", id, v.req["progress"], msg)
	case "GetLogs":
		v.logs(w)
	case "AddLog":
		fmt.Fprintf(w, "Log added to job %s\n", id)
	case "Cancel":
		fmt.Fprintf(w, "Job %s cancelled\n", id)
	case "Update":
		fmt.Fprintf(w, "Data of job %s updated\n", id)
	case "ChangePriority":
		fmt.Fprintf(w, "Priority of job %s set to %v\n", id, v.req["priority"])
	case "Promote":
		fmt.Fprintf(w, "Job %s promoted to waiting\n", id)
	case "MoveToDelayed":
		d, _ := numOf(v.req["delay"])
		fmt.Fprintf(w, "Job %s delayed by %s\n", id, humanMs(d))
	case "Discard":
		fmt.Fprintf(w, "Job %s discarded to the dead-letter queue\n", id)
	default:
		return false
	}
	return true
}

// renderQueue prints the answer of a command on a queue or its
// dead-letter queue; false when cmd is not one.
func (v *view) renderQueue(w io.Writer, cmd string) bool {
	a := v.ans
	queue, _ := v.req["queue"].(string)
	switch cmd {
	case "ListQueues":
		qs, _ := a["queues"].([]any)
		if len(qs) == 0 {
			fmt.Fprintln(w, "No queues")
			return true
		}
		rows := [][]string{{"QUEUE"}}
		for _, q := range qs {
			rows = append(rows, []string{jsStr(q, "?")})
		}
		table(w, rows)
	case "Pause":
		fmt.Fprintf(w, "Queue %s paused\n", queue)
	case "Resume":
		fmt.Fprintf(w, "Queue %s resumed\n", queue)
	case "Drain":
		fmt.Fprintf(w, "Drained %s: %s waiting jobs removed\n", queue, countOf(a))
	case "Obliterate":
		fmt.Fprintf(w, "Queue %s obliterated\n", queue)
	case "Clean":
		g, _ := numOf(v.req["grace"])
		what := jsStr(v.req["state"], "waiting")
		if what == "waiting" || what == "delayed" {
			// The protocol's Clean takes either as both.
			what = "waiting and delayed"
		}
		fmt.Fprintf(w, "Cleaned %s: %s %s jobs older than %s removed\n", queue, countOf(a), what, humanMs(g))
	case "Count":
		fmt.Fprintf(w, "Count: %s\n", jsStr(a["count"], "0"))
	case "GetJobs":
		v.jobsTable(w)
	case "IsPaused":
		if a["paused"] == true {
			fmt.Fprintf(w, "Queue %s is paused\n", queue)
		} else {
			fmt.Fprintf(w, "Queue %s is active\n", queue)
		}
	case "RateLimit":
		fmt.Fprintf(w, "Rate limit of %s set to %v jobs/s\n", queue, v.req["limit"])
	case "RateLimitClear":
		fmt.Fprintf(w, "Rate limit of %s cleared\n", queue)
	case "SetConcurrency":
		fmt.Fprintf(w, "Concurrency of %s limited to %v active jobs\n", queue, v.req["limit"])
	case "ClearConcurrency":
		fmt.Fprintf(w, "Concurrency limit of %s cleared\n", queue)
	case "Dlq":
		v.dlq(w)
	case "RetryDlq":
		fmt.Fprintf(w, "Retried %s jobs from the dead-letter queue of %s\n", countOf(a), queue)
	case "PurgeDlq":
		fmt.Fprintf(w, "Purged %s jobs from the dead-letter queue of %s\n", countOf(a), queue)
	default:
		return false
	}
	return true
}

// renderServer prints the answer of a command on the server: crons,
// workers, webhooks, figures, ping; false when cmd is not one.
func (v *view) renderServer(w io.Writer, cmd string) bool {
	a := v.ans
	switch cmd {
	case "CronList":
		v.crons(w)
	case "Cron":
		next := ""
		if c, ok := a["cron"].(map[string]any); ok {
			if t, ok := numOf(c["nextRun"]); ok {
				next = " (next run " + v.rel(t) + ")"
			}
		}
		fmt.Fprintf(w, "Cron scheduled: %s%s\n", v.req["name"], next)
	case "CronDelete":
		fmt.Fprintf(w, "Cron %s deleted\n", v.req["name"])
	case "ListWorkers":
		v.workers(w)
	case "RegisterWorker":
		fmt.Fprintf(w, "Worker registered: %s\n", jsStr(a["workerId"], "?"))
	case "UnregisterWorker":
		fmt.Fprintf(w, "Worker %s unregistered\n", v.req["workerId"])
	case "ListWebhooks":
		v.webhooks(w)
	case "AddWebhook":
		wid := a["webhookId"]
		if wh, ok := a["webhook"].(map[string]any); ok && wid == nil {
			wid = wh["id"]
		}
		fmt.Fprintf(w, "Webhook added: %s\n", jsStr(wid, "?"))
	case "RemoveWebhook":
		fmt.Fprintf(w, "Webhook %s removed\n", v.req["webhookId"])
	case "Stats":
		if v.cmd == "health" {
			v.health(w)
		} else {
			v.stats(w)
		}
	case "Prometheus":
		if m, ok := a["metrics"].(string); ok {
			fmt.Fprint(w, m)
			if !strings.HasSuffix(m, "\n") {
				fmt.Fprintln(w)
			}
			return true
		}
		v.keyValues(w, a["metrics"])
	case "Metrics":
		v.keyValues(w, a["metrics"])
	case "Ping":
		fmt.Fprintf(w, "PONG from %s in %s\n", v.o.addr(), v.rtt.Round(10*time.Microsecond))
	default:
		return false
	}
	return true
}

func countOf(a map[string]any) string {
	if ids, ok := a["ids"].([]any); ok {
		return strconv.Itoa(len(ids))
	}
	return jsStr(a["count"], "0")
}

// job shows one job as aligned label: value lines.
func (v *view) job(w io.Writer, j map[string]any) {
	state := jsStr(j["state"], "")
	rows := [][]string{
		{"Job:", jsStr(j["id"], "?")},
		{"Queue:", jsStr(j["queue"], "?")},
		{"Name:", jsStr(j["name"], "-")},
	}
	if state != "" {
		rows = append(rows, []string{"State:", state})
	}
	rows = append(rows,
		[]string{"Priority:", jsStr(j["priority"], "0")},
		[]string{"Attempts:", jsStr(j["attempts"], "0") + "/" + jsStr(j["maxAttempts"], "?")},
		[]string{"Data:", compactJSON(j["data"])})
	if p, ok := numOf(j["progress"]); ok && p != 0 {
		rows = append(rows, []string{"Progress:", fmtNum(p) + "%"})
	} else if pm, ok := j["progress"].(map[string]any); ok {
		rows = append(rows, []string{"Progress:", compactJSON(pm)})
	}
	for _, t := range []struct{ label, key string }{
		{"Created:", "createdAt"}, {"Run at:", "runAt"}, {"Started:", "startedAt"}, {"Completed:", "completedAt"},
	} {
		if ms, ok := numOf(j[t.key]); ok && ms > 0 {
			if t.key == "runAt" {
				if c, _ := numOf(j["createdAt"]); ms <= c {
					continue
				}
			}
			rows = append(rows, []string{t.label, v.stamp(ms)})
		}
	}
	if tags, ok := j["tags"].([]any); ok && len(tags) > 0 {
		rows = append(rows, []string{"Tags:", joinAny(tags)})
	}
	if r, ok := j["result"]; ok && r != nil {
		if _, undef := r.(Undefined); !undef {
			rows = append(rows, []string{"Result:", compactJSON(r)})
		}
	}
	if e := jsStr(j["error"], ""); e != "" {
		rows = append(rows, []string{"Error:", e})
	}
	table(w, rows)
}

func (v *view) jobsTable(w io.Writer) {
	jobs, _ := v.ans["jobs"].([]any)
	if len(jobs) == 0 {
		fmt.Fprintln(w, "No jobs")
		return
	}
	rows := [][]string{{"ID", "NAME", "STATE", "PRIORITY", "ATTEMPTS", "CREATED", "DATA"}}
	for _, it := range jobs {
		j, _ := it.(map[string]any)
		created := "-"
		if ms, ok := numOf(j["createdAt"]); ok {
			created = v.rel(ms)
		}
		rows = append(rows, []string{jsStr(j["id"], "?"), jsStr(j["name"], "-"), jsStr(j["state"], "-"),
			jsStr(j["priority"], "0"), jsStr(j["attempts"], "0") + "/" + jsStr(j["maxAttempts"], "?"), created,
			clip(compactJSON(j["data"]), 40)})
	}
	table(w, rows)
}

func (v *view) logs(w io.Writer) {
	logs, _ := v.ans["logs"].([]any)
	if len(logs) == 0 {
		fmt.Fprintln(w, "No logs")
		return
	}
	rows := [][]string{{"TIME", "LEVEL", "MESSAGE"}}
	for _, it := range logs {
		l, _ := it.(map[string]any)
		t := "-"
		if ms, ok := numOf(l["timestamp"]); ok {
			t = v.stamp(ms)
		}
		rows = append(rows, []string{t, strings.ToUpper(jsStr(l["level"], "info")), jsStr(l["message"], "")})
	}
	table(w, rows)
}

func (v *view) dlq(w io.Writer) {
	// queued sends entries with the reason and time of dead-lettering;
	// the reference sends the jobs alone.
	entries, _ := v.ans["entries"].([]any)
	jobs, _ := v.ans["jobs"].([]any)
	if len(entries) == 0 && len(jobs) == 0 {
		fmt.Fprintf(w, "The dead-letter queue of %s is empty\n", v.req["queue"])
		return
	}
	rows := [][]string{{"ID", "NAME", "ATTEMPTS", "FAILED", "ERROR"}}
	if len(entries) > 0 {
		for _, it := range entries {
			e, _ := it.(map[string]any)
			j, _ := e["job"].(map[string]any)
			failed := "-"
			if ms, ok := numOf(e["enteredAt"]); ok {
				failed = v.rel(ms)
			}
			rows = append(rows, []string{jsStr(j["id"], "?"), jsStr(j["name"], "-"),
				jsStr(j["attempts"], "0") + "/" + jsStr(j["maxAttempts"], "?"), failed,
				clip(jsStr(e["error"], jsStr(e["reason"], "-")), 60)})
		}
	} else {
		for _, it := range jobs {
			j, _ := it.(map[string]any)
			failed := "-"
			if ms, ok := numOf(j["failedAt"]); ok {
				failed = v.rel(ms)
			} else if ms, ok := numOf(j["completedAt"]); ok {
				failed = v.rel(ms)
			}
			rows = append(rows, []string{jsStr(j["id"], "?"), jsStr(j["name"], "-"),
				jsStr(j["attempts"], "0") + "/" + jsStr(j["maxAttempts"], "?"), failed, clip(jsStr(j["error"], "-"), 60)})
		}
	}
	table(w, rows)
}

func (v *view) crons(w io.Writer) {
	list, _ := v.ans["crons"].([]any)
	if list == nil {
		list, _ = v.ans["cronJobs"].([]any)
	}
	if len(list) == 0 {
		fmt.Fprintln(w, "No cron jobs")
		return
	}
	rows := [][]string{{"NAME", "QUEUE", "SCHEDULE", "NEXT RUN", "RUNS", "LIMIT"}}
	for _, it := range list {
		c, _ := it.(map[string]any)
		sched := jsStr(c["schedule"], "")
		if sched == "" {
			if ms, ok := numOf(c["repeatEvery"]); ok {
				sched = "every " + humanMs(ms)
			}
		}
		next := "-"
		if ms, ok := numOf(c["nextRun"]); ok {
			next = v.rel(ms)
		}
		rows = append(rows, []string{jsStr(c["name"], "?"), jsStr(c["queue"], "?"), sched, next,
			jsStr(c["executions"], "0"), jsStr(c["maxLimit"], "-")})
	}
	table(w, rows)
}

func (v *view) workers(w io.Writer) {
	list, _ := v.ans["workers"].([]any)
	if len(list) == 0 {
		fmt.Fprintln(w, "No workers registered")
		return
	}
	rows := [][]string{{"ID", "NAME", "QUEUES", "CONCURRENCY", "ACTIVE", "PROCESSED", "FAILED", "LAST SEEN"}}
	for _, it := range list {
		wk, _ := it.(map[string]any)
		qs, _ := wk["queues"].([]any)
		seen := "-"
		if ms, ok := numOf(wk["lastSeen"]); ok {
			seen = v.rel(ms)
		}
		rows = append(rows, []string{jsStr(wk["id"], "?"), jsStr(wk["name"], "-"), joinAny(qs),
			jsStr(wk["concurrency"], "-"), jsStr(wk["activeJobs"], "0"), jsStr(wk["processedJobs"], "0"),
			jsStr(wk["failedJobs"], "0"), seen})
	}
	table(w, rows)
}

func (v *view) webhooks(w io.Writer) {
	list, _ := v.ans["webhooks"].([]any)
	if len(list) == 0 {
		fmt.Fprintln(w, "No webhooks registered")
		return
	}
	// CIRCUIT and DROPPED are queued's own fields: "-" from the reference.
	rows := [][]string{{"ID", "URL", "EVENTS", "QUEUE", "ENABLED", "DELIVERED", "FAILED", "DROPPED", "CIRCUIT"}}
	for _, it := range list {
		h, _ := it.(map[string]any)
		evs, _ := h["events"].([]any)
		rows = append(rows, []string{jsStr(h["id"], "?"), jsStr(h["url"], "?"), joinAny(evs), jsStr(h["queue"], "all"),
			jsStr(h["enabled"], "true"), jsStr(h["successCount"], "0"), jsStr(h["failureCount"], "0"),
			jsStr(h["droppedCount"], "-"), jsStr(h["circuit"], "-")})
	}
	table(w, rows)
}

func (v *view) stats(w io.Writer) {
	s, _ := v.ans["stats"].(map[string]any)
	rows := [][]string{}
	for _, k := range []string{"waiting", "active", "delayed", "completed", "failed", "dlq"} {
		rows = append(rows, []string{strings.ToUpper(k[:1]) + k[1:] + ":", jsStr(s[k], "0")})
	}
	if k := "dlq"; s[k] != nil {
		rows[len(rows)-1][0] = "DLQ:"
	}
	for _, k := range []struct{ label, key string }{{"Total pushed:", "totalPushed"}, {"Total pulled:", "totalPulled"},
		{"Total completed:", "totalCompleted"}, {"Total failed:", "totalFailed"}} {
		if s[k.key] != nil {
			rows = append(rows, []string{k.label, jsStr(s[k.key], "0")})
		}
	}
	if ms, ok := numOf(s["uptime"]); ok {
		rows = append(rows, []string{"Uptime:", humanMs(ms)})
	}
	if s["pushPerSec"] != nil {
		rows = append(rows, []string{"Push/s:", jsStr(s["pushPerSec"], "0")}, []string{"Pull/s:", jsStr(s["pullPerSec"], "0")})
	}
	table(w, rows)
}

func (v *view) health(w io.Writer) {
	s, _ := v.ans["stats"].(map[string]any)
	up := ""
	if ms, ok := numOf(s["uptime"]); ok {
		up = ", up " + humanMs(ms)
	}
	fmt.Fprintf(w, "Healthy: %s answers%s (%s waiting, %s active, %s delayed, %s in the DLQ)\n", v.o.addr(), up,
		jsStr(s["waiting"], "0"), jsStr(s["active"], "0"), jsStr(s["delayed"], "0"), jsStr(s["dlq"], "0"))
}

// keyValues shows a flat map as a two-column table, keys sorted.
func (v *view) keyValues(w io.Writer, x any) {
	m, ok := x.(map[string]any)
	if !ok {
		fmt.Fprintln(w, compactJSON(x))
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	rows := make([][]string, 0, len(keys))
	for _, k := range keys {
		rows = append(rows, []string{k, jsStr(m[k], "-")})
	}
	table(w, rows)
}

// stamp shows a millisecond timestamp as local time and age.
func (v *view) stamp(ms float64) string {
	t := time.UnixMilli(int64(ms))
	return t.Format("2006-01-02 15:04:05") + " (" + v.rel(ms) + ")"
}

// rel shows a millisecond timestamp relative to now.
func (v *view) rel(ms float64) string {
	d := float64(v.now.UnixMilli()) - ms
	if d >= 0 {
		if d < 1000 {
			return "just now"
		}
		return humanMs(d) + " ago"
	}
	return "in " + humanMs(-d)
}

// humanMs renders a duration in milliseconds with its two largest units:
// 850ms, 12s, 4m 10s, 2h 5m, 3d 4h.
func humanMs(ms float64) string {
	if ms < 1000 {
		return strconv.FormatFloat(math.Round(ms), 'f', -1, 64) + "ms"
	}
	s := int64(ms / 1000)
	units := []struct {
		n    int64
		name string
	}{{86400, "d"}, {3600, "h"}, {60, "m"}, {1, "s"}}
	for i, u := range units {
		if s >= u.n {
			out := strconv.FormatInt(s/u.n, 10) + u.name
			if i+1 < len(units) {
				if r := (s % u.n) / units[i+1].n; r > 0 {
					out += " " + strconv.FormatInt(r, 10) + units[i+1].name
				}
			}
			return out
		}
	}
	return "0s"
}

// table writes rows with aligned columns.
func table(w io.Writer, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

// jsStr renders a decoded value for a table cell.
func jsStr(x any, fallback string) string {
	switch t := x.(type) {
	case nil, Undefined:
		return fallback
	case string:
		return t
	case bool:
		return strconv.FormatBool(t)
	case int64:
		return strconv.FormatInt(t, 10)
	case uint64:
		return strconv.FormatUint(t, 10)
	case float64:
		return fmtNum(t)
	case float32:
		return fmtNum(float64(t))
	}
	return compactJSON(x)
}

func numOf(x any) (float64, bool) {
	switch t := x.(type) {
	case int64:
		return float64(t), true
	case uint64:
		return float64(t), true
	case float64:
		return t, !math.IsNaN(t)
	case float32:
		return float64(t), true
	}
	return 0, false
}

func compactJSON(x any) string {
	b, err := json.Marshal(toJSON(x))
	if err != nil {
		return fmt.Sprint(x)
	}
	return string(b)
}

func joinAny(xs []any) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = jsStr(x, "")
	}
	return strings.Join(parts, ",")
}

// clip keeps table cells to a readable width.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// failed says what became of a job FAIL applied to, from its state read
// just after: retried (delayed by its backoff, or already waiting or
// active again), dead-lettered, or removed.
func (v *view) failed(w io.Writer, id string) {
	var se *ServerError
	if errors.As(v.afterErr, &se) && se.Msg == errNoJob.Error() {
		fmt.Fprintf(w, "Job %s failed and was removed (pushed with --remove-on-fail, or its queue is gone)\n", id)
		return
	}
	job, ok := v.after["job"].(map[string]any)
	if v.afterErr != nil || !ok {
		why := "no job in the answer"
		if v.afterErr != nil {
			why = v.afterErr.Error()
		}
		fmt.Fprintf(w, "Job %s marked failed (what became of it could not be read: %s)\n", id, why)
		return
	}
	made, _ := numOf(job["attempts"])
	maxAtt, _ := numOf(job["maxAttempts"])
	attempt := fmt.Sprintf("attempt %v of %v", made, maxAtt)
	switch st := jsStr(job["state"], "unknown"); st {
	case "failed":
		q := jsStr(job["queue"], "?")
		fmt.Fprintf(w, "Job %s failed for good (%s): moved to the dead-letter queue of %s (queued dlq list %s)\n", id, attempt, q, q)
	case "delayed":
		in := "now"
		if at, ok := numOf(job["runAt"]); ok {
			in = "in " + humanMs(max0(at-float64(v.now.UnixMilli())))
		}
		fmt.Fprintf(w, "Job %s failed (%s); it will be retried %s\n", id, attempt, in)
	case "waiting", "prioritized":
		fmt.Fprintf(w, "Job %s failed (%s); it is waiting to be retried\n", id, attempt)
	case "active":
		fmt.Fprintf(w, "Job %s failed (%s); it has already been retried and is active again\n", id, attempt)
	default:
		fmt.Fprintf(w, "Job %s failed (%s); it is now %s\n", id, attempt, st)
	}
}

func max0(x float64) float64 { return math.Max(x, 0) }

// cliDoctor checks a server from the outside: its health document over
// HTTP (the TCP port plus one, as the reference finds it) and a round trip
// on the wire protocol, which also proves the token and TLS settings.
func cliDoctor(o cliOpts, stdout, stderr io.Writer) int {
	var checks doctorChecks
	checks.health(o)
	checks.ping(o)
	issues := 0
	for _, c := range checks {
		if !c.OK {
			issues++
		}
	}
	if o.json {
		b, _ := json.MarshalIndent(map[string]any{"ok": issues == 0, "issues": issues, "checks": checks}, "", "  ")
		fmt.Fprintln(stdout, string(b))
	} else {
		rows := [][]string{{"CHECK", "RESULT", "DETAIL"}}
		for _, c := range checks {
			mark := "ok"
			if !c.OK {
				mark = "FAIL"
			} else if c.Warn {
				mark = "warn"
			}
			rows = append(rows, []string{c.Name, mark, c.Detail})
		}
		table(stdout, rows)
		if issues == 0 {
			fmt.Fprintln(stdout, "All checks passed.")
		} else {
			fmt.Fprintf(stdout, "%d issue(s) found.\n", issues)
		}
	}
	if issues > 0 {
		return 1
	}
	return 0
}

// doctorCheck is one line of doctor's report.
type doctorCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Warn   bool   `json:"warning,omitempty"` // worth knowing, not a fault
	Detail string `json:"detail"`
}

// doctorChecks is doctor's report, in the order the checks ran.
type doctorChecks []doctorCheck

func (cs *doctorChecks) add(name string, ok bool, detail string) {
	*cs = append(*cs, doctorCheck{Name: name, OK: ok, Detail: detail})
}

// warn adds a check that passes with something worth knowing.
func (cs *doctorChecks) warn(name, detail string) {
	*cs = append(*cs, doctorCheck{Name: name, OK: true, Warn: true, Detail: detail})
}

// health checks the server's /health document.
func (cs *doctorChecks) health(o cliOpts) {
	doc, herr := fetchHealth(o, 5*time.Second)
	if herr != nil {
		cs.add("http", false, fmt.Sprintf("not reachable at %s: %v", o.httpBase(), herr))
		return
	}
	cs.add("http", true, "reachable at "+o.httpBase())
	// Another version (the reference server, or another queued) is
	// worth knowing but not a fault: the protocol is the same.
	switch name, sv := serverIdentity(doc); {
	case sv == "":
	case name == "queued" && sv == version:
		cs.add("version", true, fmt.Sprintf("server and this client are both queued %s", version))
	default:
		cs.warn("version", fmt.Sprintf("server %s %s, this client queued %s (bunqueue protocol %d)", name, sv, version, protocolVersion))
	}
	cs.add("status", doc["status"] == "healthy", "status "+jsStr(doc["status"], "unknown"))
	if doc["version"] == nil && doc["storage"] == nil {
		// A server with tokens answers {ok, status} to a caller without one.
		cs.warn("details", "the server shows its details only with its token (--token, BQ_TOKEN)")
	}
	if st, ok := doc["storage"].(map[string]any); ok {
		detail := jsStr(st["driver"], "?")
		if p := jsStr(st["path"], ""); p != "" {
			detail += " at " + p
		}
		if e := jsStr(st["error"], ""); e != "" {
			detail += ": " + e
		}
		cs.add("storage", st["ok"] != false, detail)
	}
	if q, ok := doc["queues"].(map[string]any); ok {
		dlq, _ := numOf(q["dlq"])
		cs.add("dlq", dlq == 0, fmt.Sprintf("%s dead-lettered jobs", jsStr(q["dlq"], "0")))
		cs.add("queues", true, fmt.Sprintf("%s waiting, %s active, %s delayed, %s completed",
			jsStr(q["waiting"], "0"), jsStr(q["active"], "0"), jsStr(q["delayed"], "0"), jsStr(q["completed"], "0")))
	}
	if up, ok := numOf(doc["uptime"]); ok {
		cs.add("uptime", true, humanMs(up*1000))
	}
}

// ping checks a round trip on the wire protocol.
func (cs *doctorChecks) ping(o cliOpts) {
	cfg, err := o.clientConfig()
	if err != nil {
		cs.add("tcp", false, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	start := time.Now()
	c, err := Dial(ctx, cfg)
	if err == nil {
		_, err = c.Call(ctx, map[string]any{"cmd": "Ping"})
		c.Close()
	}
	cancel()
	if err != nil {
		cs.add("tcp", false, fmt.Sprintf("%s: %v", o.addr(), err))
	} else {
		cs.add("tcp", true, fmt.Sprintf("%s answered Ping in %s", o.addr(), time.Since(start).Round(10*time.Microsecond)))
	}
}
