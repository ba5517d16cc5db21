package main

// Job rows whose record this build cannot read: not written by queued as
// it is (a tool, a hand, or a bug of ours wrote them), or spoiled. In
// memory and SQLite mode such a record is left out when the file is
// loaded. Here a row is read when it is claimed, reaped, locked or
// listed, and one that could not be read failed the whole statement every
// time: its queue's claims, every round of the reaper, the ACKs of a
// parent's children, the listings it fell in, for good. Such a row is set aside instead: its state becomes
// pgSetAside, which no claim, reaper, count or listing takes and a lock
// by id passes over, its record is kept as it is for whoever mends or
// deletes it, and the log names it. A record of a newer build is not set
// aside: that build reads it (errRecordNewer), and a broker of this build
// keeps failing on it, saying so, until it is upgraded.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// pgSetAside is the state of a row whose record could not be read.
const pgSetAside = 8

// pgSetAsideMigration indexes the rows set aside by queue, for Obliterate.
const pgSetAsideMigration = `-- MIGRATION rows set aside
	CREATE INDEX jobs_set_aside ON {s}.jobs (queue) WHERE state = 8;`

// pgUnreadable is the failure to decode a job row's record that this
// build should read: the row's id, and the record as read.
type pgUnreadable struct {
	id   string
	body []byte
	err  error
}

func (e pgUnreadable) Error() string {
	if msg := e.err.Error(); strings.HasPrefix(msg, "job record") {
		return msg
	}
	return "job record: " + e.err.Error()
}

func (e pgUnreadable) Unwrap() error { return e.err }

// pgSetAsideTries bounds how many rows one operation sets aside before it
// gives up with the error; the next goes on.
const pgSetAsideTries = 16

// pastUnreadable runs read, a claim round, the scan of a reaper's round
// (txJobs) or a listing of a queue's jobs or its DLQ; each time it
// fails on a record that cannot be read, it sets that row aside and runs
// read again (read starts afresh: it keeps nothing from a failed run).
func (p *PG) pastUnreadable(ctx context.Context, read func() error) error {
	err := read()
	for range pgSetAsideTries {
		u, ok := errors.AsType[pgUnreadable](err)
		if !ok {
			return err
		}
		set, serr := p.setAsideRow(ctx, p.pool, u)
		if serr != nil {
			return errors.Join(err, serr)
		}
		if !set {
			return err // written again meanwhile: the next run reads it anew
		}
		err = read()
	}
	return err
}

// setAsideRow sets aside the row of u, while it still holds the record
// that was read (another broker may have written it since), and logs it.
func (p *PG) setAsideRow(ctx context.Context, db pgQuerier, u pgUnreadable) (bool, error) {
	var queue string
	err := db.QueryRow(ctx, p.sql(`UPDATE {s}.jobs SET state = {setaside}, lease_expires = NULL, dlq_due = NULL
		WHERE id = $1 AND body = $2 AND state <> {setaside} RETURNING queue`), u.id, u.body).Scan(&queue)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("set aside job %s, whose record cannot be read: %w", u.id, err)
	}
	p.log.Error("a job's record could not be read: its row is set aside, kept as it is", "id", u.id, "queue", queue,
		"state", pgSetAside, "err", u.err.Error())
	return true, nil
}
