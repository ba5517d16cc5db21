package main

// Reading the reference server's SQLite data file (bunqueue 2.9, schema
// version 37: dist/infrastructure/persistence/schema.js) for `queued
// migrate --from-bunqueue FILE`. The file is opened read-only and never
// changed. Each job row is turned into the Job object the reference's
// rowToJob makes of it (columns under the object's names, the
// extended_options blob's fields beside them), for bunqueue_import.go to
// read.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"slices"
)

// bqSQLiteVersion is the reference's schema version this reader knows.
const bqSQLiteVersion = 37

// bqJobCols maps the reference's jobs columns to the Job object's names
// and how each is stored: 'n' a number, 's' text, 'b' a 0/1 flag, 'm' a
// MessagePack blob, 'x' the extended options (merged), '-' read apart.
var bqJobCols = map[string]struct {
	key  string
	kind byte
}{
	"id": {"id", 's'}, "queue": {"queue", 's'}, "name": {"name", 's'}, "data": {"data", 'm'},
	"priority": {"priority", 'n'}, "created_at": {"createdAt", 'n'}, "run_at": {"runAt", 'n'},
	"started_at": {"startedAt", 'n'}, "completed_at": {"completedAt", 'n'}, "attempts": {"attempts", 'n'},
	"max_attempts": {"maxAttempts", 'n'}, "backoff": {"backoff", 'n'}, "ttl": {"ttl", 'n'},
	"timeout": {"timeout", 'n'}, "unique_key": {"uniqueKey", 's'}, "custom_id": {"customId", 's'},
	"depends_on": {"dependsOn", 'm'}, "parent_id": {"parentId", 's'}, "children_ids": {"childrenIds", 'm'},
	"tags": {"tags", 'm'}, "state": {"", '-'}, "lifo": {"lifo", 'b'}, "group_id": {"groupId", 's'},
	"progress": {"progress", 'n'}, "progress_msg": {"progressMessage", 's'},
	"remove_on_complete": {"removeOnComplete", 'b'}, "remove_on_fail": {"removeOnFail", 'b'},
	"fail_parent_on_failure": {"failParentOnFailure", 'b'}, "remove_dependency_on_failure": {"removeDependencyOnFailure", 'b'},
	"continue_parent_on_failure": {"continueParentOnFailure", 'b'}, "ignore_dependency_on_failure": {"ignoreDependencyOnFailure", 'b'},
	"stall_timeout": {"stallTimeout", 'n'}, "last_heartbeat": {"lastHeartbeat", 'n'}, "stall_count": {"stallCount", 'n'},
	"timeline": {"timeline", 'm'}, "stacktrace": {"stacktrace", 'm'}, "dlq_retry_state": {"", '-'},
	"extended_options": {"", 'x'},
}

// readBunqueueSQLite reads a bunqueue data file.
func readBunqueueSQLite(ctx context.Context, path string, now int64) (*bqSource, error) {
	if fi, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no bunqueue data file at %s: %w", path, err)
	} else if fi.IsDir() {
		return nil, fmt.Errorf("%s is a folder; --from-bunqueue names the bunqueue data file", path)
	}
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if err := bqCheckSQLite(ctx, db, path); err != nil {
		return nil, err
	}
	src := newBQSource(path + " (bunqueue SQLite)")
	results, err := bqResults(ctx, db)
	if err != nil {
		return nil, err
	}
	for _, read := range []func(context.Context, *sql.DB, *bqSource, map[string][]byte, int64) error{
		bqSQLiteJobs, bqSQLiteDLQ, bqSQLiteFailures, bqSQLiteCrons, bqSQLiteQueues, bqSQLiteGroups,
	} {
		if err := read(ctx, db, src, results, now); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	src.linkFlows()
	src.counted(now)
	return src, nil
}

// bqCheckSQLite makes sure the file is a bunqueue data file of the schema
// this reader knows.
func bqCheckSQLite(ctx context.Context, db *sql.DB, path string) error {
	var v sql.NullInt64
	err := db.QueryRowContext(ctx, `SELECT max(version) FROM migrations`).Scan(&v)
	if err != nil {
		var n int
		if db.QueryRowContext(ctx, `SELECT count(*) FROM schema_version`).Scan(&n) == nil {
			return fmt.Errorf("%s is a queued data file, not a bunqueue one: serve it as it is", path)
		}
		return fmt.Errorf("%s is not a bunqueue data file (no migrations table: %w)", path, err)
	}
	if !v.Valid || v.Int64 != bqSQLiteVersion {
		return fmt.Errorf("%s has bunqueue schema version %d; queued reads version %d (bunqueue 2.9.x): open it once with bunqueue 2.9.5 to bring it to that version",
			path, v.Int64, bqSQLiteVersion)
	}
	return nil
}

func bqResults(ctx context.Context, db *sql.DB) (map[string][]byte, error) {
	rows, err := db.QueryContext(ctx, `SELECT job_id, result FROM job_results`)
	if err != nil {
		return nil, fmt.Errorf("read job_results: %w", err)
	}
	defer rows.Close()
	out := map[string][]byte{}
	for rows.Next() {
		var id string
		var res []byte
		if err := rows.Scan(&id, &res); err != nil {
			return nil, err
		}
		out[id] = res
	}
	return out, rows.Err()
}

// bqSQLiteJobs reads the jobs table, but for the rows of jobs that have a
// dead-letter entry: the entry is the job's latest word, and the row (left
// from before the job failed) gives way to it unread. Reading them, then
// deleting each from the list of jobs and indexing the list again, took
// n² steps for n of them (20,000: 40 s of CPU). NOT IN has SQLite build
// the set of ids once, with or without the dlq table's index (a
// correlated NOT EXISTS without it scans the dlq table for each job);
// NULLs are kept out of it, and a row without an id is read (and
// refused), as NOT IN with a NULL on either side is false.
func bqSQLiteJobs(ctx context.Context, db *sql.DB, src *bqSource, results map[string][]byte, now int64) error {
	rows, err := db.QueryContext(ctx, `SELECT * FROM jobs WHERE id IS NULL OR id NOT IN (SELECT job_id FROM dlq WHERE job_id IS NOT NULL)`)
	if err != nil {
		return fmt.Errorf("read jobs: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return err
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return fmt.Errorf("read jobs: %w", err)
		}
		src.readSteps++
		var e Enc
		at := e.OpenMap()
		n := 0
		var state string
		var retry Raw
		for i, c := range cols {
			switch c {
			case "state":
				state, _ = vals[i].(string)
				continue
			case "dlq_retry_state":
				if b, ok := vals[i].([]byte); ok {
					retry = Raw(b)
				}
				continue
			}
			col, ok := bqJobCols[c]
			if !ok || vals[i] == nil {
				continue // a column a later bunqueue added, or unset
			}
			k, err := bqColumn(&e, col.key, col.kind, vals[i])
			if err != nil {
				return fmt.Errorf("jobs row %v: column %s: %w", vals[0], c, err)
			}
			n += k
		}
		e.CloseMap(at, n)
		m, err := ParseMap(Raw(e.B), nil)
		if err != nil {
			src.refuse("jobs row %v: %v", vals[0], err)
			continue
		}
		id, _, _ := m.Str("id")
		src.addJob(fmt.Sprintf("jobs row %v", vals[0]), m, state, nil, retry, results[id], now)
	}
	return rows.Err()
}

// bqColumn writes one column's value into the Job object under key, and
// answers how many fields it wrote (the extended options' blob writes its
// own fields).
func bqColumn(e *Enc, key string, kind byte, v any) (int, error) {
	switch kind {
	case 'x':
		b, ok := v.([]byte)
		if !ok {
			return 0, errors.New("not a blob")
		}
		ext, err := ParseMap(Raw(b), nil)
		if err != nil {
			return 0, err
		}
		for _, f := range ext.Fields {
			e.Str(string(f.Key))
			e.Raw(f.Val)
		}
		return len(ext.Fields), nil
	case 'm':
		b, ok := v.([]byte)
		if !ok {
			return 0, errors.New("not a blob")
		}
		if err := Validate(b, false); err != nil {
			return 0, err
		}
		e.Str(key)
		e.Raw(Raw(b))
	case 's':
		s, ok := v.(string)
		if !ok {
			if b, isBytes := v.([]byte); isBytes {
				s, ok = string(b), true
			}
		}
		if !ok {
			return 0, fmt.Errorf("not text: %T", v)
		}
		e.Str(key)
		e.Str(s)
	case 'n', 'b':
		var f float64
		switch x := v.(type) {
		case int64:
			f = float64(x)
		case float64:
			f = x
		default:
			return 0, fmt.Errorf("not a number: %T", v)
		}
		e.Str(key)
		if kind == 'b' {
			e.Bool(f != 0)
		} else if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			e.Int(int64(f))
		} else {
			e.Float64(f)
		}
	}
	return 1, nil
}

// bqSQLiteDLQ reads the dead-letter queue: each entry holds its job. Of
// two entries of one job, the later is its latest word; the earlier is
// marked as it is found and dropped in one pass at the end.
func bqSQLiteDLQ(ctx context.Context, db *sql.DB, src *bqSource, _ map[string][]byte, now int64) error {
	rows, err := db.QueryContext(ctx, `SELECT id, job_id, entry FROM dlq ORDER BY id`)
	if err != nil {
		return fmt.Errorf("read dlq: %w", err)
	}
	defer rows.Close()
	at := map[string]int{} // where each entry's job is in src.jobs
	gone := 0
	for rows.Next() {
		var n int64
		var jobID sql.NullString
		var entry []byte
		if err := rows.Scan(&n, &jobID, &entry); err != nil {
			return fmt.Errorf("read dlq: %w", err)
		}
		src.readSteps++
		if !jobID.Valid {
			// The column allows it; the reference never writes it.
			src.refuse("dlq row %d: job_id is null", n)
			continue
		}
		id := jobID.String
		row := fmt.Sprintf("dlq row %d (job %s)", n, id)
		m, err := ParseMap(Raw(entry), nil)
		if err != nil {
			src.refuse("%s: %v", row, err)
			continue
		}
		jm, ok, err := m.Map("job")
		if err != nil || !ok {
			src.refuse("%s: no job in it", row)
			continue
		}
		// The row's job_id is what gives the jobs row way: an entry of
		// another job would take its place unseen.
		if inner, err := bqID(jm.Get("id")); err == nil && inner != id {
			src.refuse("%s: the entry holds job %s", row, inner)
			continue
		}
		if i, ok := at[id]; ok && src.jobs[i].j != nil {
			src.jobs[i].j = nil
			gone++
		}
		k := len(src.jobs)
		src.addJob(row, jm, "failed", Raw(entry), nil, nil, now)
		if len(src.jobs) > k {
			at[id] = k
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if gone > 0 {
		src.readSteps += len(src.jobs)
		src.jobs = slices.DeleteFunc(src.jobs, func(bj bqJob) bool { return bj.j == nil })
	}
	return nil
}

// bqSQLiteFailures reads the failures of children their parents keep.
func bqSQLiteFailures(ctx context.Context, db *sql.DB, src *bqSource, _ map[string][]byte, _ int64) error {
	rows, err := db.QueryContext(ctx, `SELECT parent_id, child_id, child_queue, mode, error FROM flow_failures`)
	if err != nil {
		return fmt.Errorf("read flow_failures: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var parent, child, queue, mode, msg string
		if err := rows.Scan(&parent, &child, &queue, &mode, &msg); err != nil {
			return err
		}
		src.kids[parent] = append(src.kids[parent], bqKid{key: queue + ":" + child, mode: mode, err: msg})
	}
	return rows.Err()
}

// bqSQLiteCrons reads the cron schedules into the reference's CronJob
// object, as its PostgreSQL mode stores them whole.
func bqSQLiteCrons(ctx context.Context, db *sql.DB, src *bqSource, _ map[string][]byte, _ int64) error {
	rows, err := db.QueryContext(ctx, `SELECT name, queue, job_name, data, schedule, repeat_every, priority, next_run,
		executions, max_limit, timezone, unique_key, dedup, skip_missed_on_restart, skip_if_no_worker, prevent_overlap, job_options FROM cron_jobs`)
	if err != nil {
		return fmt.Errorf("read cron_jobs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, queue string
		var jobName, schedule, tz, unique sql.NullString
		var data, dedup, opts []byte
		var every, limit sql.NullFloat64
		var prio, next, execs float64
		var skipMissed, skipNoWorker, overlap int64
		if err := rows.Scan(&name, &queue, &jobName, &data, &schedule, &every, &prio, &next, &execs, &limit, &tz, &unique,
			&dedup, &skipMissed, &skipNoWorker, &overlap, &opts); err != nil {
			return err
		}
		var e Enc
		at := e.OpenMap()
		n := 0
		put := func(k string, write func()) {
			e.Str(k)
			write()
			n++
		}
		put("name", func() { e.Str(name) })
		put("queue", func() { e.Str(queue) })
		if jobName.Valid {
			put("jobName", func() { e.Str(jobName.String) })
		}
		if len(data) > 0 && Validate(data, false) == nil {
			put("data", func() { e.Raw(data) })
		}
		if schedule.Valid {
			put("schedule", func() { e.Str(schedule.String) })
		}
		if every.Valid {
			put("repeatEvery", func() { e.Num(every.Float64) })
		}
		put("priority", func() { e.Num(prio) })
		if limit.Valid {
			put("maxLimit", func() { e.Num(limit.Float64) })
		}
		if tz.Valid {
			put("timezone", func() { e.Str(tz.String) })
		}
		if unique.Valid {
			put("uniqueKey", func() { e.Str(unique.String) })
		}
		if len(dedup) > 0 && Validate(dedup, false) == nil {
			put("dedup", func() { e.Raw(dedup) })
		}
		put("skipMissedOnRestart", func() { e.Bool(skipMissed != 0) })
		put("skipIfNoWorker", func() { e.Bool(skipNoWorker != 0) })
		put("preventOverlap", func() { e.Bool(overlap != 0) })
		if len(opts) > 0 && Validate(opts, false) == nil {
			put("jobOptions", func() { e.Raw(opts) })
		}
		e.CloseMap(at, n)
		row := fmt.Sprintf("cron_jobs row %q", name)
		m, err := ParseMap(Raw(e.B), nil)
		if err != nil {
			src.refuse("%s: %v", row, err)
			continue
		}
		src.addCron(row, m, next, int64(execs))
	}
	return rows.Err()
}

// bqSQLiteQueues reads the queues' settings.
func bqSQLiteQueues(ctx context.Context, db *sql.DB, src *bqSource, _ map[string][]byte, _ int64) error {
	rows, err := db.QueryContext(ctx, `SELECT name, paused, rate_limit, concurrency_limit, rate_limit_duration,
		stall_enabled, stall_interval, max_stalls, stall_grace_period, dlq_config FROM queue_state`)
	if err != nil {
		return fmt.Errorf("read queue_state: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var paused int64
		var rate, conc, rateDur, stallOn, interval, maxStalls, grace sql.NullFloat64
		var dlq []byte
		if err := rows.Scan(&name, &paused, &rate, &conc, &rateDur, &stallOn, &interval, &maxStalls, &grace, &dlq); err != nil {
			return err
		}
		row := fmt.Sprintf("queue_state row %q", name)
		if !src.duration(row, "rate_limit_duration", rateDur.Float64, rateDur.Valid) ||
			!src.duration(row, "stall_interval", interval.Float64, interval.Valid) ||
			!src.duration(row, "stall_grace_period", grace.Float64, grace.Valid) {
			continue
		}
		q := src.queue(name)
		q.paused = paused != 0
		if rate.Valid && rate.Float64 > 0 {
			q.rate = &RateLimit{Max: rate.Float64, Duration: int64(rateDur.Float64)}
			if !rateDur.Valid || rateDur.Float64 <= 0 {
				q.rate.Duration = 1000
			}
		}
		if conc.Valid && conc.Float64 > 0 {
			q.conc = int64(conc.Float64)
		}
		if stallOn.Valid {
			q.hasStall = true
			q.stall = stallPatch{enabled: stallOn.Float64 != 0, hasEnabled: true}
			for _, f := range []struct {
				v   sql.NullFloat64
				dst **float64
			}{{interval, &q.stall.interval}, {maxStalls, &q.stall.maxStall}, {grace, &q.stall.grace}} {
				if f.v.Valid {
					x := f.v.Float64
					*f.dst = &x
				}
			}
		}
		src.policy(row, "dlq_config", dlq, q.readDLQConfig)
	}
	return rows.Err()
}

// maxSafeInt is the largest whole number a JavaScript number holds
// exactly: the reference's counts and times are such numbers.
const maxSafeInt = 1<<53 - 1

// bqSQLiteNum reads a number SQLite handed back as it was stored (an
// INTEGER or a REAL; NULL: not valid); anything else is an error.
func bqSQLiteNum(v any) (f float64, valid bool, err error) {
	switch x := v.(type) {
	case nil:
		return 0, false, nil
	case int64:
		return float64(x), true, nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return 0, false, fmt.Errorf("%v is not a number", x)
		}
		return x, true, nil
	}
	return 0, false, fmt.Errorf("%T %.40q is not a number", v, fmt.Sprint(v))
}

// readDLQConfig reads the reference's DlqConfig object; its two times
// (the retry interval and the age) in the range SetDlqConfig takes.
func (q *bqQueue) readDLQConfig(b Raw) error {
	m, err := ParseMap(b, nil)
	if err != nil {
		return err
	}
	q.hasDLQ = true
	if v, ok, err := m.Bool("autoRetry"); err == nil && ok {
		q.dlq.autoRetry = &v
	}
	for _, f := range []struct {
		key string
		dst **int64
	}{{"autoRetryInterval", &q.dlq.interval}, {"maxAutoRetries", &q.dlq.maxRetries}, {"maxAge", &q.dlq.maxAge}, {"maxEntries", &q.dlq.maxEntries}} {
		v, ok, err := m.Int(f.key)
		if err != nil {
			return err
		}
		if ok && (f.key == "autoRetryInterval" || f.key == "maxAge") {
			if err := delayRule.check(f.key, float64(v)); err != nil {
				return err
			}
		}
		if ok {
			*f.dst = &v
		}
	}
	if r := m.Get("maxAge"); r != nil && r.IsNil() {
		q.dlq.noMaxAge = true
	}
	return nil
}

// bqSQLiteGroups reads the groups' settings.
func bqSQLiteGroups(ctx context.Context, db *sql.DB, src *bqSource, _ map[string][]byte, _ int64) error {
	rows, err := db.QueryContext(ctx, `SELECT queue, group_id, rate_limit, rate_duration, concurrency_limit, paused FROM group_state`)
	if err != nil {
		return fmt.Errorf("read group_state: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		// SQLite keeps whatever type a value was written with: each
		// number is read as what it is and checked, so that a REAL or a
		// TEXT where the reference writes an INTEGER is refused naming its
		// row, not a scan error that names nothing.
		var queue, id sql.NullString
		var vals [4]any // rate_limit, rate_duration, concurrency_limit, paused
		if err := rows.Scan(&queue, &id, &vals[0], &vals[1], &vals[2], &vals[3]); err != nil {
			return fmt.Errorf("read group_state: %w", err)
		}
		row := fmt.Sprintf("group_state row %q/%q", queue.String, id.String)
		if !queue.Valid || !id.Valid {
			src.refuse("%s: queue and group_id must not be null", row)
			continue
		}
		var nums [4]float64
		var has [4]bool
		cols := []string{"rate_limit", "rate_duration", "concurrency_limit", "paused"}
		ok := true
		for i, col := range cols {
			var err error
			if nums[i], has[i], err = bqSQLiteNum(vals[i]); err != nil {
				src.refuse("%s: %s: %v", row, col, err)
				ok = false
				break
			}
		}
		// The window in the range SetGroupRateLimit takes, in its words;
		// then every number a whole one, as the reference writes them.
		if !ok || !src.duration(row, "rate_duration", nums[1], has[1]) {
			continue
		}
		for i, f := range nums {
			if f < 0 || f > maxSafeInt || f != math.Trunc(f) {
				src.refuse("%s: %s: %v is not a whole number from 0 to %d", row, cols[i], f, int64(maxSafeInt))
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		q := src.queue(queue.String)
		q.groupState = append(q.groupState, bqGroup{id: id.String, paused: nums[3] != 0, conc: int64(nums[2]),
			rateMax: int64(nums[0]), rateDur: int64(nums[1])})
	}
	return rows.Err()
}
