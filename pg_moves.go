package main

// What is left here is not the moves' (they are in pg_control.go): the
// PostgreSQL twins of reads (GetCountsPerPriority, GetJobByCustomId),
// until their domain moves them onto the engine. The dashboard's figures
// are in pg_dashboard.go.

import (
	"context"
	"fmt"
)

// ---------------------------------------------------------------------------
// Reading

func pgGetCountsPerPriority(r *Req) error {
	queue, err := queueArg(r.m)
	if err != nil {
		return err
	}
	p := r.c.srv.pg
	ctx, cancel := pgCtx(r)
	defer cancel()
	per, err := p.countsPerPriority(ctx, p.pool, queue)
	if err != nil {
		return err
	}
	r.field("queue").Str(queue)
	encodePriorityCounts(r.field("counts"), priorityKeys(per), per)
	return nil
}

// countsPerPriority counts a queue's waiting and delayed jobs by priority.
func (p *PG) countsPerPriority(ctx context.Context, q pgQuerier, queue string) (map[int64]int, error) {
	rows, err := q.Query(ctx, p.sql(`SELECT priority, count(*) FROM {s}.jobs WHERE queue = $1 AND state = 1 GROUP BY priority`), queue)
	if err != nil {
		return nil, pgErr(fmt.Errorf("count jobs by priority: %w", err))
	}
	defer rows.Close()
	per := map[int64]int{}
	for rows.Next() {
		var prio, n int64
		if err := rows.Scan(&prio, &n); err != nil {
			return nil, pgErr(err)
		}
		per[prio] = int(n)
	}
	return per, pgErr(rows.Err())
}

func pgGetJobByCustomID(r *Req) error {
	id, _, err := r.m.Str("customId")
	if err != nil {
		return err
	}
	ctx, cancel := pgCtx(r)
	defer cancel()
	j, _, err := r.c.srv.pg.getJob(ctx, id)
	if err != nil {
		return err
	}
	if j == nil || !liveByCustomID(j) {
		return errJobNotFound
	}
	encodeJob(r.field("job"), j, jobWithRead, "", nil)
	return nil
}
