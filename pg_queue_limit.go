package main

// --max-queues in PostgreSQL mode. A queue is a row of the namespace's
// queues table, made by the first command that names it (a push, a flow,
// a cron run, Pause or Resume, a rate or concurrency limit, a stall or DLQ
// policy, a group setting), and kept until Obliterate: a client naming
// queue after queue would make a row each. The limit of memory mode
// bounds them, for the whole namespace, with the same refusal.
//
// The table is counted only by a command that has just made a new row
// (its INSERT says so), inside the transaction that made it, which sees
// that row and every committed one; past the limit the row is taken back
// and the command refused. Pushes to existing queues never count. Brokers
// making new queues at the same moment do not see each other's rows
// before they commit, so the namespace may go past the limit by as many
// queues as are being made at that instant (one per transaction in
// flight: a few per broker), never by more: each later one counts them.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

const (
	// pgRegisterMadeSQL makes a queue's row, answering a row when it was
	// made.
	pgRegisterMadeSQL = `INSERT INTO {s}.queues (name) VALUES ($1) ON CONFLICT DO NOTHING RETURNING true`
	// pgRegisterGroupedSQL makes a queue's row or marks it grouped (its
	// claims take the grouped path from now on); made is true when the
	// row is new. Either way the row stays locked until the transaction
	// ends, which the group reaper counts on (pg_group_reap.go).
	pgRegisterGroupedSQL = `INSERT INTO {s}.queues AS q (name, grouped) VALUES ($1, true)
		ON CONFLICT (name) DO UPDATE SET grouped = true WHERE NOT q.grouped RETURNING (xmax = 0)`
	// pgRegisterBareSQL is the register of a pipeline of pushes
	// (insertBare), where no statement can look at another's answer: it
	// counts the queues only when the queue has no row, and makes none
	// past the limit ($2; 0: none). The jobs' insert then finds no queue
	// and inserts nothing (pgInsertBareSQL, pgInsertHandSQL).
	pgRegisterBareSQL = pgRegisterMadeCTE + `
		SELECT pg_notify($3, $4) FROM made`
	// pgRegisterCopySQL is pgRegisterBareSQL answering whether the queue
	// has its row, made now or before, for a COPY (insertCopy), which
	// cannot look for it itself. (The row made here is not yet visible
	// to the statement's own look at the table, hence the two counts.)
	pgRegisterCopySQL = pgRegisterMadeCTE + `,
		noted AS (SELECT pg_notify($3, $4) FROM made)
		SELECT (SELECT count(*) FROM noted) + (SELECT count(*) FROM {s}.queues WHERE name = $1) > 0`
	// pgRegisterMadeCTE makes queue $1's row unless it has one or the
	// limit ($2) is reached: the made of the two registers above.
	pgRegisterMadeCTE = `WITH made AS (INSERT INTO {s}.queues (name) SELECT $1
		WHERE CASE WHEN EXISTS (SELECT 1 FROM {s}.queues WHERE name = $1) THEN false
			ELSE $2::bigint <= 0 OR (SELECT count(*) FROM {s}.queues) < $2::bigint END
		ON CONFLICT DO NOTHING RETURNING name)`
)

// queueCreated tells every broker, this one too, that tx made queue's row
// (queue:created): a NOTIFY is sent when its transaction commits, and
// never when it rolls back, so a queue is announced once, by whichever
// broker made it.
func (p *PG) queueCreated(ctx context.Context, tx pgx.Tx, queue string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, p.evName, p.createdPayload(queue)); err != nil {
		return fmt.Errorf("announce queue %s: %w", queue, err)
	}
	return nil
}

// createdPayload is queue:created as an event notification from no
// broker in particular (pgAnySender): every broker delivers it.
func (p *PG) createdPayload(queue string) string {
	var e Enc
	e.ArrayHead(1)
	encodeRemoteNotice(&e, "queue:created", p.now(), noticeQueue("queue:created", queue).o.close())
	return pgAnySender + " " + base64.StdEncoding.EncodeToString(e.B)
}

// registerQueue makes a queue's row if it has none, within --max-queues;
// grouped marks it as having grouped jobs. A refusal is a pgRefused, and
// leaves nothing of the queue in tx: a transaction of several queues'
// pushes (insertPlain) goes on with the others.
func (p *PG) registerQueue(ctx context.Context, tx pgx.Tx, queue string, grouped bool) error {
	sql := pgRegisterMadeSQL
	if grouped {
		sql = pgRegisterGroupedSQL
	}
	var made bool
	err := tx.QueryRow(ctx, p.sql(sql), queue).Scan(&made)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // there already
	}
	if err != nil {
		return fmt.Errorf("register queue %s: %w", queue, err)
	}
	if !made {
		return nil
	}
	if err := p.queueMade(ctx, tx, queue); err != nil {
		return err
	}
	return p.queueCreated(ctx, tx, queue)
}

// queueMade checks a queue row tx has just made against --max-queues,
// taking it back past the limit.
func (p *PG) queueMade(ctx context.Context, tx pgx.Tx, queue string) error {
	limit := p.b.maxQueues
	if limit <= 0 {
		return nil
	}
	var n int64
	if err := tx.QueryRow(ctx, p.sql(`SELECT count(*) FROM {s}.queues`)).Scan(&n); err != nil {
		return fmt.Errorf("count queues: %w", err)
	}
	if n <= int64(limit) {
		return nil
	}
	if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.queues WHERE name = $1`), queue); err != nil {
		return fmt.Errorf("take back queue %s: %w", queue, err)
	}
	return pgRefused{errTooManyQueues(limit)}
}
