package main

// A queue row's policy columns (stall and dead-letter settings) as the
// PostgreSQL engine's operations read them, and the lease renewals of
// jobs: what the DLQ, the reaper, failures and the policy commands share.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// pgSettings are a queue row's policy columns; nil is the default.
type pgSettings struct {
	stallEnabled                 *bool
	stallInterval, stallGrace    *int64
	stallMax                     *int32
	dlqAuto                      *bool
	dlqInterval, dlqMaxAge       *int64
	dlqMaxRetries, dlqMaxEntries *int32
}

// pgNever is dlq_max_age for entries that never expire.
const pgNever = -1

func (s *pgSettings) stallConfig() StallConfig {
	c := defaultStall
	if s == nil {
		return c
	}
	if s.stallEnabled != nil {
		c.Enabled = *s.stallEnabled
	}
	if s.stallInterval != nil {
		c.StallInterval = *s.stallInterval
	}
	if s.stallGrace != nil {
		c.GracePeriod = *s.stallGrace
	}
	if s.stallMax != nil {
		c.MaxStalls = *s.stallMax
	}
	return c
}

func (s *pgSettings) dlqConfig() DLQConfig {
	c := defaultDLQ
	if s == nil {
		return c
	}
	if s.dlqAuto != nil {
		c.AutoRetry = *s.dlqAuto
	}
	if s.dlqInterval != nil {
		c.AutoRetryInterval = *s.dlqInterval
	}
	if s.dlqMaxRetries != nil {
		c.MaxAutoRetries = *s.dlqMaxRetries
	}
	if s.dlqMaxAge != nil {
		c.MaxAge = *s.dlqMaxAge
		if c.MaxAge == pgNever {
			c.MaxAge = none
		}
	}
	if s.dlqMaxEntries != nil {
		c.MaxEntries = int(*s.dlqMaxEntries)
	}
	return c
}

// pgQuerier is a transaction or the pool.
type pgQuerier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// settings reads the policy of queues (a queue without a row has the
// defaults: it is missing from the map, and a nil *pgSettings reads as
// the defaults). With lock, the rows are locked for an update.
func (p *PG) settings(ctx context.Context, q pgQuerier, queues []string) (map[string]*pgSettings, error) {
	return p.readSettings(ctx, q, queues, false)
}

func (p *PG) readSettings(ctx context.Context, q pgQuerier, queues []string, lock bool) (map[string]*pgSettings, error) {
	sql := `SELECT name, stall_enabled, stall_interval, stall_grace, stall_max, dlq_auto_retry, dlq_retry_interval,
		dlq_max_age, dlq_max_retries, dlq_max_entries FROM {s}.queues WHERE name = ANY($1) ORDER BY name`
	if lock {
		sql += ` FOR UPDATE`
	}
	rows, err := q.Query(ctx, p.sql(sql), queues)
	if err != nil {
		return nil, fmt.Errorf("read queue settings: %w", err)
	}
	defer rows.Close()
	out := map[string]*pgSettings{}
	for rows.Next() {
		var name string
		s := &pgSettings{}
		if err := rows.Scan(&name, &s.stallEnabled, &s.stallInterval, &s.stallGrace, &s.stallMax, &s.dlqAuto,
			&s.dlqInterval, &s.dlqMaxAge, &s.dlqMaxRetries, &s.dlqMaxEntries); err != nil {
			return nil, fmt.Errorf("read queue settings: %w", err)
		}
		out[name] = s
	}
	return out, rows.Err()
}

// settingsOf reads the policy of the jobs' queues.
func (p *PG) settingsOf(ctx context.Context, q pgQuerier, jobs []*Job) (map[string]*pgSettings, error) {
	names := make([]string, len(jobs))
	for i, j := range jobs {
		names[i] = j.Queue
	}
	return p.settings(ctx, q, names)
}

// leaseRenewals answers, by id, the renewals of the jobs that hold a lock
// (rows the caller has locked).
func (p *PG) leaseRenewals(ctx context.Context, q pgQuerier, jobs []*Job) (map[string]int32, error) {
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID()
	}
	rows, err := q.Query(ctx, p.sql(`SELECT id, lease_renewals FROM {s}.jobs WHERE id = ANY($1) AND lease_owner IS NOT NULL`), ids)
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	defer rows.Close()
	out := map[string]int32{}
	for rows.Next() {
		var id string
		var n int32
		if err := rows.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("read leases: %w", err)
		}
		out[id] = n
	}
	return out, rows.Err()
}
