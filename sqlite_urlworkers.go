package main

// The HTTP handlers in the data file: few, rarely changed, written at once
// as the webhooks are (HandlerSet answers once its handler is on disk).

import (
	"context"
	"encoding/json"
	"fmt"
)

func (s *SQLiteStore) SaveHandler(h *HandlerSpec) error {
	spec, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("encode handler: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), webhookWriteTimeout)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, `INSERT OR REPLACE INTO handlers(queue, spec) VALUES (?, ?)`, h.Queue, string(spec)); err != nil {
		return fmt.Errorf("save the handler of queue %s in %s: %w", h.Queue, s.path, err)
	}
	return nil
}

func (s *SQLiteStore) DeleteHandler(queue string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), webhookWriteTimeout)
	defer cancel()
	res, err := s.db.ExecContext(ctx, `DELETE FROM handlers WHERE queue = ?`, queue)
	if err != nil {
		return false, fmt.Errorf("delete the handler of queue %s in %s: %w", queue, s.path, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("delete the handler of queue %s in %s: %w", queue, s.path, err)
	}
	return n > 0, nil
}

// LoadHandlers returns the stored handlers in registration order.
func (s *SQLiteStore) LoadHandlers(ctx context.Context) ([]*HandlerSpec, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT queue, spec FROM handlers ORDER BY rowid`)
	if err != nil {
		return nil, fmt.Errorf("read handlers from %s: %w", s.path, err)
	}
	defer rows.Close()
	var out []*HandlerSpec
	for rows.Next() {
		var queue, spec string
		if err := rows.Scan(&queue, &spec); err != nil {
			return nil, fmt.Errorf("read handlers from %s: %w", s.path, err)
		}
		h := &HandlerSpec{}
		if err := json.Unmarshal([]byte(spec), h); err != nil {
			return nil, fmt.Errorf("the handler of queue %s is unreadable: %w", queue, err)
		}
		out = append(out, h)
	}
	return out, rows.Err()
}
