package main

// The HTTP handlers of a namespace (urlworker.go), kept in its handlers
// table: every broker of the namespace runs them and follows the table
// (sharedHandlerStore), so a handler registered through one broker is
// run by all of them and kept across their restarts.

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// pgHandlersMigration keeps the handlers in the namespace. pos, from a
// sequence, orders them as registered (a handler set again moves last,
// as in SQLite mode) and, with the count, tells a broker that they
// changed: any registration raises the greatest pos, any removal lowers
// the count.
const pgHandlersMigration = `-- MIGRATION handlers
	CREATE SEQUENCE {s}.handlers_pos;
	CREATE TABLE {s}.handlers (
		queue TEXT COLLATE "C" PRIMARY KEY,
		spec  TEXT NOT NULL,
		pos   BIGINT NOT NULL DEFAULT nextval('{s}.handlers_pos')
	);
	ALTER SEQUENCE {s}.handlers_pos OWNED BY {s}.handlers.pos;`

// SaveHandler stores h, replacing the queue's handler.
func (p *PG) SaveHandler(h *HandlerSpec) error {
	ctx, cancel := p.opCtx(context.Background())
	defer cancel()
	return p.inTx(ctx, func(tx pgx.Tx) error { return p.saveHandlerTx(ctx, tx, h) })
}

// saveHandlerTx stores h in tx. The table is locked against other
// registrations for the count check, so that brokers registering at once
// cannot pass maxHandlers together.
func (p *PG) saveHandlerTx(ctx context.Context, tx pgx.Tx, h *HandlerSpec) error {
	spec, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("encode handler: %w", err)
	}
	if _, err := tx.Exec(ctx, p.sql(`LOCK TABLE {s}.handlers IN SHARE ROW EXCLUSIVE MODE`)); err != nil {
		return pgErr(fmt.Errorf("save the handler of queue %s: %w", h.Queue, err))
	}
	tag, err := tx.Exec(ctx, p.sql(`INSERT INTO {s}.handlers (queue, spec)
		SELECT $1, $2 WHERE (SELECT count(*) FROM {s}.handlers) < $3
			OR EXISTS (SELECT 1 FROM {s}.handlers WHERE queue = $1)
		ON CONFLICT (queue) DO UPDATE SET spec = excluded.spec, pos = nextval('{s}.handlers_pos')`),
		h.Queue, string(spec), maxHandlers)
	if err != nil {
		return pgErr(fmt.Errorf("save the handler of queue %s: %w", h.Queue, err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("a namespace has at most %d handlers", maxHandlers)
	}
	return nil
}

// DeleteHandler removes the queue's handler; false when it had none.
func (p *PG) DeleteHandler(queue string) (bool, error) {
	ctx, cancel := p.opCtx(context.Background())
	defer cancel()
	tag, err := p.pool.Exec(ctx, p.sql(`DELETE FROM {s}.handlers WHERE queue = $1`), queue)
	if err != nil {
		return false, pgErr(fmt.Errorf("delete the handler of queue %s: %w", queue, err))
	}
	return tag.RowsAffected() > 0, nil
}

// LoadHandlers returns the namespace's handlers in registration order.
func (p *PG) LoadHandlers(ctx context.Context) ([]*HandlerSpec, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	rows, err := p.pool.Query(ctx, p.sql(`SELECT queue, spec FROM {s}.handlers ORDER BY pos`))
	if err != nil {
		return nil, pgErr(fmt.Errorf("read handlers: %w", err))
	}
	specs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*HandlerSpec, error) {
		var queue, spec string
		if err := r.Scan(&queue, &spec); err != nil {
			return nil, err
		}
		h := &HandlerSpec{}
		if err := json.Unmarshal([]byte(spec), h); err != nil {
			return nil, fmt.Errorf("the handler of queue %s is unreadable: %w", queue, err)
		}
		return h, nil
	})
	if err != nil {
		return nil, pgErr(fmt.Errorf("read handlers: %w", err))
	}
	return specs, nil
}

// HandlersVersion changes whenever the stored handlers do (see
// pgHandlersMigration).
func (p *PG) HandlersVersion(ctx context.Context) (string, error) {
	ctx, cancel := p.opCtx(ctx)
	defer cancel()
	var n, top int64
	if err := p.pool.QueryRow(ctx, p.sql(`SELECT count(*), coalesce(max(pos), 0) FROM {s}.handlers`)).Scan(&n, &top); err != nil {
		return "", pgErr(fmt.Errorf("read the handlers' version: %w", err))
	}
	return fmt.Sprintf("%d/%d", n, top), nil
}
