package main

// Reading the reference server's PostgreSQL tables (bunqueue 2.9, schema
// version 21: dist/infrastructure/persistence/postgres/schema.js) for
// `queued migrate --from-bunqueue postgres://...`. One namespace is read,
// in one read-only snapshot, so that a broker still writing cannot tear
// it; nothing is written. Each job's payload column is the reference's
// Job object itself, read by bunqueue_import.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// bqPGVersion is the reference's PostgreSQL schema version this reader
// knows.
const bqPGVersion = 21

// isPostgresURL tells a postgres:// URL from a file name.
func isPostgresURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// readBunqueuePG reads one namespace of a bunqueue PostgreSQL database.
func readBunqueuePG(ctx context.Context, dsn, namespace string, now int64, log *slog.Logger) (*bqSource, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	conn, err := pgx.Connect(cctx, dsn)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("connect to the bunqueue database %s: %w", redactDSN(dsn), err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.Background())
	if err := bqCheckPG(ctx, tx, namespace); err != nil {
		return nil, err
	}
	src := newBQSource(fmt.Sprintf("namespace %s of %s (bunqueue PostgreSQL)", namespace, redactDSN(dsn)))
	for _, read := range []func(context.Context, pgx.Tx, *bqSource, string, int64) error{
		bqPGQueues, bqPGGroups, bqPGJobs, bqPGFailures, bqPGLogs, bqPGCrons,
	} {
		if err := read(ctx, tx, src, namespace, now); err != nil {
			return nil, err
		}
	}
	src.linkFlows()
	src.counted(now)
	return src, nil
}

// bqCheckPG makes sure the database holds bunqueue's tables of the schema
// this reader knows, and the namespace asked for.
func bqCheckPG(ctx context.Context, tx pgx.Tx, namespace string) error {
	var v *int64
	err := tx.QueryRow(ctx, `SELECT max(version) FROM bunqueue_schema_migrations`).Scan(&v)
	if err != nil {
		return fmt.Errorf("no bunqueue tables in this database (bunqueue_schema_migrations: %w)", err)
	}
	if v == nil || *v != bqPGVersion {
		got := int64(0)
		if v != nil {
			got = *v
		}
		return fmt.Errorf("the bunqueue tables have schema version %d; queued reads version %d (bunqueue 2.9.x): start bunqueue 2.9.5 on them once to bring them to that version",
			got, bqPGVersion)
	}
	var n int64
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM bunqueue_jobs WHERE namespace = $1) +
		(SELECT count(*) FROM bunqueue_crons WHERE namespace = $1) + (SELECT count(*) FROM bunqueue_queue_state WHERE namespace = $1)`,
		namespace).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `SELECT DISTINCT namespace FROM bunqueue_queue_state UNION SELECT DISTINCT namespace FROM bunqueue_crons ORDER BY 1`)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return errors.New("the bunqueue tables are empty: nothing to migrate")
	}
	return fmt.Errorf("bunqueue namespace %q holds nothing; the tables hold %s (give one with --from-namespace)", namespace, strings.Join(names, ", "))
}

// bqPGJobs reads the jobs, dead-lettered ones included (their entry is a
// column), with their results.
func bqPGJobs(ctx context.Context, tx pgx.Tx, src *bqSource, ns string, now int64) error {
	results := map[string][]byte{}
	rows, err := tx.Query(ctx, `SELECT job_id, result FROM bunqueue_completions WHERE namespace = $1 AND result IS NOT NULL`, ns)
	if err != nil {
		return fmt.Errorf("read bunqueue_completions: %w", err)
	}
	for rows.Next() {
		var id string
		var res []byte
		if err := rows.Scan(&id, &res); err != nil {
			rows.Close()
			return err
		}
		results[id] = res
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = tx.Query(ctx, `SELECT id, state, payload, result, dlq_entry, dlq_retry_state FROM bunqueue_jobs WHERE namespace = $1`, ns)
	if err != nil {
		return fmt.Errorf("read bunqueue_jobs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, state string
		var payload, result, dlq, retry []byte
		if err := rows.Scan(&id, &state, &payload, &result, &dlq, &retry); err != nil {
			return err
		}
		row := "bunqueue_jobs row " + id
		m, err := ParseMap(Raw(payload), nil)
		if err != nil {
			src.refuse("%s: payload: %v", row, err)
			continue
		}
		if result == nil {
			result = results[id]
		}
		src.addJob(row, m, state, Raw(dlq), Raw(retry), Raw(result), now)
	}
	return rows.Err()
}

// bqPGFailures reads the failures of children their parents keep.
func bqPGFailures(ctx context.Context, tx pgx.Tx, src *bqSource, ns string, _ int64) error {
	rows, err := tx.Query(ctx, `SELECT parent_id, child_id, child_queue, mode, error FROM bunqueue_flow_failures WHERE namespace = $1`, ns)
	if err != nil {
		return fmt.Errorf("read bunqueue_flow_failures: %w", err)
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

// bqPGLogs reads the jobs' logs, oldest first.
func bqPGLogs(ctx context.Context, tx pgx.Tx, src *bqSource, ns string, _ int64) error {
	rows, err := tx.Query(ctx, `SELECT id, job_id, timestamp, level, message FROM bunqueue_job_logs WHERE namespace = $1 ORDER BY id`, ns)
	if err != nil {
		return fmt.Errorf("read bunqueue_job_logs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var n int64
		var id, level, msg string
		var at int64
		if err := rows.Scan(&n, &id, &at, &level, &msg); err != nil {
			return err
		}
		if err := bqTimeRule.check("timestamp", float64(at)); err != nil {
			src.refuse("bunqueue_job_logs row %d (job %s): %v", n, id, err)
			continue
		}
		var e Enc
		e.Str(msg)
		src.logs[id] = append(src.logs[id], LogEntry{At: at, Level: level, Message: Raw(e.B)})
	}
	return rows.Err()
}

// bqPGCrons reads the cron schedules: the payload is the CronJob object.
func bqPGCrons(ctx context.Context, tx pgx.Tx, src *bqSource, ns string, _ int64) error {
	rows, err := tx.Query(ctx, `SELECT name, payload, next_run, executions FROM bunqueue_crons WHERE namespace = $1 ORDER BY name`, ns)
	if err != nil {
		return fmt.Errorf("read bunqueue_crons: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var payload []byte
		var next int64
		var execs int32
		if err := rows.Scan(&name, &payload, &next, &execs); err != nil {
			return err
		}
		row := fmt.Sprintf("bunqueue_crons row %q", name)
		m, err := ParseMap(Raw(payload), nil)
		if err != nil {
			src.refuse("%s: %v", row, err)
			continue
		}
		src.addCron(row, m, float64(next), int64(execs))
	}
	return rows.Err()
}

// bqPGQueues reads the queues' settings.
func bqPGQueues(ctx context.Context, tx pgx.Tx, src *bqSource, ns string, _ int64) error {
	rows, err := tx.Query(ctx, `SELECT queue, paused, rate_limit, rate_duration_ms, concurrency_limit, stall_config, dlq_config
		FROM bunqueue_queue_state WHERE namespace = $1 ORDER BY queue`, ns)
	if err != nil {
		return fmt.Errorf("read bunqueue_queue_state: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var paused bool
		var rate, conc *int32
		var dur *int64
		var stall, dlq []byte
		if err := rows.Scan(&name, &paused, &rate, &dur, &conc, &stall, &dlq); err != nil {
			return err
		}
		row := fmt.Sprintf("bunqueue_queue_state row %q", name)
		if dur != nil && !src.duration(row, "rate_duration_ms", float64(*dur), true) {
			continue
		}
		q := src.queue(name)
		q.paused = paused
		if rate != nil && *rate > 0 {
			q.rate = &RateLimit{Max: float64(*rate), Duration: 1000}
			if dur != nil && *dur > 0 {
				q.rate.Duration = *dur
			}
		}
		if conc != nil && *conc > 0 {
			q.conc = int64(*conc)
		}
		src.policy(row, "stall_config", stall, q.readStallConfig)
		src.policy(row, "dlq_config", dlq, q.readDLQConfig)
	}
	return rows.Err()
}

// readStallConfig reads the reference's StallConfig object; its two times
// (the interval and the grace period) in the range SetStallConfig takes.
func (q *bqQueue) readStallConfig(b Raw) error {
	m, err := ParseMap(b, nil)
	if err != nil {
		return err
	}
	q.hasStall = true
	if v, ok, err := m.Bool("enabled"); err == nil && ok {
		q.stall.enabled, q.stall.hasEnabled = v, true
	}
	for _, f := range []struct {
		key string
		dst **float64
	}{{"stallInterval", &q.stall.interval}, {"maxStalls", &q.stall.maxStall}, {"gracePeriod", &q.stall.grace}} {
		v, ok, err := m.Num(f.key)
		if err != nil {
			return err
		}
		if ok && f.key != "maxStalls" {
			if err := delayRule.check(f.key, v); err != nil {
				return err
			}
		}
		if ok {
			*f.dst = &v
		}
	}
	return nil
}

// bqPGGroups reads the groups' settings.
func bqPGGroups(ctx context.Context, tx pgx.Tx, src *bqSource, ns string, _ int64) error {
	rows, err := tx.Query(ctx, `SELECT queue, group_id, rate_limit, rate_duration_ms, concurrency_limit, paused
		FROM bunqueue_group_state WHERE namespace = $1 ORDER BY queue, group_id`, ns)
	if err != nil {
		return fmt.Errorf("read bunqueue_group_state: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var queue, id string
		var rate, dur, conc *int64
		var paused bool
		if err := rows.Scan(&queue, &id, &rate, &dur, &conc, &paused); err != nil {
			return err
		}
		if dur != nil && !src.duration(fmt.Sprintf("bunqueue_group_state row %q/%q", queue, id), "rate_duration_ms", float64(*dur), true) {
			continue
		}
		g := bqGroup{id: id, paused: paused}
		if rate != nil && dur != nil {
			g.rateMax, g.rateDur = *rate, *dur
		}
		if conc != nil {
			g.conc = *conc
		}
		q := src.queue(queue)
		q.groupState = append(q.groupState, g)
	}
	return rows.Err()
}

// refuseBunqueueTables stops a broker from starting on a database that
// holds a bunqueue deployment's tables and no queued namespace yet: its
// jobs would look lost. It names the command that brings them across.
func refuseBunqueueTables(ctx context.Context, dsn, namespace string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil // connectPG reports it, with the reason
	}
	defer conn.Close(context.Background())
	var theirs, ours bool
	err = conn.QueryRow(ctx, `SELECT to_regclass('bunqueue_jobs') IS NOT NULL,
		EXISTS (SELECT 1 FROM information_schema.tables WHERE table_schema LIKE 'queued\_%' AND table_name = 'schema_version')`).Scan(&theirs, &ours)
	if err != nil || !theirs || ours {
		return nil
	}
	var jobs bool
	if conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM bunqueue_jobs)`).Scan(&jobs) != nil || !jobs {
		return nil
	}
	return fmt.Errorf("this database holds a bunqueue server's tables (bunqueue_jobs) and no queued namespace: queued keeps its own tables. "+
		"Bring the jobs across first: queued migrate --from-bunqueue %s --from-namespace NS --postgres-url %s --postgres-namespace %s (docs/migrating.md)",
		redactDSN(dsn), redactDSN(dsn), namespace)
}
