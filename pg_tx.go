package main

// Transactions with fewer round trips. pgx's own transaction sends BEGIN
// and COMMIT as statements of their own, each waiting for its answer, so a
// claim (BEGIN, its limits, the plan setting, the claim, the queue's
// settings, the rows' UPDATE, COMMIT) cost seven round trips and an ACK
// batch four, for work the database does in well under a millisecond. A
// pgLazyTx holds BEGIN back and sends it in one pipeline with the first
// statement; writes whose answer nothing waits for (pgLater: the rows an
// operation saves at its end) go out with the next statement or with
// COMMIT. Each pipeline ends with one Sync, so the statements still run
// in order, inside the transaction, exactly as they would one by one: an
// error in one skips the rest, and the transaction rolls back.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgLazyTx is a transaction on a pool connection whose BEGIN and deferred
// writes ride with the statement that follows them.
type pgLazyTx struct {
	c      *pgxpool.Conn
	begun  bool // BEGIN has been sent
	closed bool
	later  []pgLaterStmt
}

type pgLaterStmt struct {
	sql  string
	args []any
	what string // names the statement in its error
}

var errLazyNested = errors.New("postgres: nested transactions are not supported here")

// beginLazy takes a pool connection for a transaction whose BEGIN goes out
// with its first statement.
func (p *PG) beginLazy(ctx context.Context) (*pgLazyTx, error) {
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &pgLazyTx{c: c}, nil
}

// defer queues a write to go out with the next statement or the commit;
// what names it in an error.
func (t *pgLazyTx) deferExec(what, sql string, args ...any) {
	t.later = append(t.later, pgLaterStmt{sql: sql, args: args, what: what})
}

// pending moves BEGIN and the deferred writes into a batch, first.
func (t *pgLazyTx) pending() (*pgx.Batch, int) {
	b := &pgx.Batch{}
	n := 0
	if !t.begun {
		b.Queue("BEGIN")
		t.begun = true
		n++
	}
	for _, s := range t.later {
		b.Queue(s.sql, s.args...)
	}
	return b, n
}

// readPending reads the answers of what pending queued (nBegin BEGINs,
// then the deferred writes), and forgets the writes.
func (t *pgLazyTx) readPending(br pgx.BatchResults, nBegin int) error {
	later := t.later
	t.later = nil
	for range nBegin {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
	}
	for _, s := range later {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
	}
	return nil
}

// flush sends what is pending on its own (before a statement that cannot
// share a pipeline with it).
func (t *pgLazyTx) flush(ctx context.Context) error {
	if t.begun && len(t.later) == 0 {
		return nil
	}
	b, n := t.pending()
	br := t.c.SendBatch(ctx, b)
	err := t.readPending(br, n)
	return errors.Join(err, br.Close())
}

func (t *pgLazyTx) Begin(context.Context) (pgx.Tx, error) { return nil, errLazyNested }

func (t *pgLazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	b, n := t.pending()
	b.Queue(sql, args...)
	br := t.c.SendBatch(ctx, b)
	if err := t.readPending(br, n); err != nil {
		br.Close()
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *pgLazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	if t.begun && len(t.later) == 0 {
		return t.c.Query(ctx, sql, args...)
	}
	b, n := t.pending()
	b.Queue(sql, args...)
	br := t.c.SendBatch(ctx, b)
	if err := t.readPending(br, n); err != nil {
		br.Close()
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, err
	}
	return &pgBatchRows{Rows: rows, br: br}, nil
}

func (t *pgLazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return pgLazyRow{rows: rows, err: err}
}

// SendBatch sends BEGIN and the deferred writes first in the same
// pipeline; the results are b's.
func (t *pgLazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed {
		return pgErrBatch{pgx.ErrTxClosed}
	}
	pb, n := t.pending()
	pb.QueuedQueries = append(pb.QueuedQueries, b.QueuedQueries...)
	br := t.c.SendBatch(ctx, pb)
	if err := t.readPending(br, n); err != nil {
		br.Close()
		return pgErrBatch{err}
	}
	return br
}

// pgPipe sends b in one pipeline within tx (with what a pgLazyTx holds
// back).
func pgPipe(ctx context.Context, tx pgx.Tx, b *pgx.Batch) pgx.BatchResults {
	if t, ok := tx.(*pgTx); ok {
		return t.Tx.SendBatch(ctx, b)
	}
	return tx.SendBatch(ctx, b)
}

func (t *pgLazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.c.CopyFrom(ctx, table, cols, src)
}

func (t *pgLazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.c.Conn().Prepare(ctx, name, sql)
}

// LargeObjects is not used by the engine; the zero value is unusable.
func (t *pgLazyTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *pgLazyTx) Conn() *pgx.Conn { return t.c.Conn() }

// Commit sends the deferred writes and COMMIT in one pipeline, and gives
// the connection back.
func (t *pgLazyTx) Commit(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	if !t.begun && len(t.later) == 0 {
		// Nothing was sent: there is nothing to commit.
		t.release()
		return nil
	}
	b, n := t.pending()
	b.Queue("COMMIT")
	br := t.c.SendBatch(ctx, b)
	err := t.readPending(br, n)
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
		if err != nil {
			err = fmt.Errorf("commit: %w", err)
		}
	}
	err = errors.Join(err, br.Close())
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		// A write or the COMMIT failed: the transaction is over or
		// aborted, and is rolled back before the connection goes back.
		t.rollback(ctx)
		return err
	}
	t.release()
	return nil
}

func (t *pgLazyTx) Rollback(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.rollback(ctx)
	return nil
}

// rollback ends the transaction, if the database has one, and gives the
// connection back (the pool drops a connection left in a transaction).
func (t *pgLazyTx) rollback(ctx context.Context) {
	t.later = nil
	if t.begun && t.c.Conn().PgConn().TxStatus() != 'I' && !t.c.Conn().IsClosed() {
		if _, err := t.c.Exec(ctx, "ROLLBACK"); err != nil {
			t.c.Conn().Close(context.Background())
		}
	}
	t.release()
}

func (t *pgLazyTx) release() {
	t.closed = true
	t.later = nil
	t.c.Release()
}

// pgBatchRows are the rows of a pipeline's last statement; closing them
// ends the pipeline.
type pgBatchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
}

func (r *pgBatchRows) Close() {
	r.Rows.Close()
	if r.br != nil {
		if err := r.br.Close(); err != nil && r.err == nil {
			r.err = err
		}
		r.br = nil
	}
}

func (r *pgBatchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (r *pgBatchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

// pgLazyRow is QueryRow's answer on a pgLazyTx, as pgx answers one.
type pgLazyRow struct {
	rows pgx.Rows
	err  error
}

func (r pgLazyRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// pgErrBatch is a batch that could not be sent.
type pgErrBatch struct{ err error }

func (b pgErrBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b pgErrBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b pgErrBatch) QueryRow() pgx.Row                { return pgLazyRow{err: b.err} }
func (b pgErrBatch) Close() error                     { return b.err }
func (b pgErrBatch) Tx() pgx.Tx                       { return nil }

// pgLater runs a write whose answer nothing waits for: on a transaction
// from p.begin it goes out with the next statement or with COMMIT (its
// error comes back from there), elsewhere at once.
func pgLater(ctx context.Context, q pgx.Tx, what, sql string, args ...any) error {
	if t, ok := q.(*pgTx); ok {
		if lt, ok := t.Tx.(*pgLazyTx); ok {
			lt.deferExec(what, sql, args...)
			return nil
		}
	}
	if _, err := q.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// snapshot begins a read-only transaction whose queries all see one
// moment, so that the figures of one answer agree with each other.
func (p *PG) snapshot(ctx context.Context) (pgx.Tx, error) {
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	return tx, pgErr(err)
}

// pgRetry runs a transaction again, a few times, when PostgreSQL aborted
// it to break a deadlock (or a serialization failure): jobs locked in
// another order by a rare pair of flow commands, say a push depending on
// a job and on its dependent while the first completes. The transaction
// rolled back whole, so running it again is safe. The retries wait a
// growing, random pause: two transactions that deadlocked once and start
// again at the same instant tend to deadlock again, the more so on a busy
// machine where both are slowed alike.
func pgRetry(ctx context.Context, fn func() error) error {
	for i := 0; ; i++ {
		err := fn()
		var pe *pgconn.PgError
		if i < pgRetries && errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001" || pe.Code == "55P03") {
			t := time.NewTimer(pgRetryPause(i))
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				// The request is over: its last error stands.
				t.Stop()
				return err
			}
		}
		return err
	}
}

// pgRetries is how many times pgRetry runs a transaction again: enough
// that a retry losing to the same rival every time is not seen in
// practice, with pauses that add up to under a second.
const pgRetries = 10

// pgRetryPause is the pause before retry i: random in [0, 2^i ms), at
// most 128 ms.
func pgRetryPause(i int) time.Duration {
	return time.Duration(rand.Int64N(int64(time.Millisecond) << min(i, 7)))
}

// pgRefused is a push refused for what it asks, not for the database: its
// message reaches the client as it is.
type pgRefused struct{ error }
