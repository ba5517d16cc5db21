package main

// Transactional enqueue in PostgreSQL mode: SQL functions an application
// calls inside its own transaction, so that a job is made exactly when
// the data it is about is committed, and not when it rolls back.
//
//	SELECT queued_ns.push('emails', 'welcome', '{"user": 42}', '{"delay": 5000}');
//
// The functions check the request as PUSH does (the same limits, the same
// words) and write it to the namespace's inbox, with the job's id (its
// custom id, or a new UUIDv7 as a broker would give it) and a NOTIFY,
// which PostgreSQL delivers at commit. A broker hearing it, starting, or
// looking every second, moves what the inbox holds into jobs through the
// push path every other push takes (custom ids, unique keys, groups,
// events), in transactions that delete the rows as they insert the jobs. A request the broker refuses all the same (a job larger than
// the limit once encoded) stays in the inbox with its reason.
//
// What a flow needs (parentId, dependsOn, childrenIds), deduplication by
// dedup or debounce ids, and repeat are refused by the functions: their
// checks need the jobs they name, which the function cannot see until
// they are pushed; those are pushed over the wire.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgInboxEvery is how often a broker looks for inbox rows it was not
// told of (a notification sent while its listener was reconnecting).
const pgInboxEvery = time.Second

const (
	// pgInboxLook and pgInboxQuiet: after moving rows, a broker looks at
	// the inbox every pgInboxLook until it has been empty for pgInboxQuiet.
	pgInboxLook  = 5 * time.Millisecond
	pgInboxQuiet = 200 * time.Millisecond
)

// pgEnqueueMigration creates the inbox and the functions, with PUSH's
// limits written in (the namespace's migrations replace {s} and the
// states).
func pgEnqueueMigration() string {
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	return strings.NewReplacer(
		"{maxQueueName}", n(maxQueueName), "{maxJobName}", n(maxJobName), "{maxGroupID}", n(maxGroupID),
		"{maxDataBytes}", n(maxDataBytes), "{maxJobBytes}", n(maxJobBytes), "{maxPriority}", n(maxPriority),
		"{maxGroupPrio}", n(maxGroupPrio), "{maxDelayMs}", n(maxDelayMs), "{maxTimeoutMs}", n(maxTimeoutMs),
		"{maxAttemptCap}", n(maxAttemptCap), "{maxKeyBytes}", n(maxKeyBytes), "{maxTags}", n(maxTags),
		// PUSH's own words for the limits (budgets.go).
		"{keyTooBig}", tooBig("", maxKeyBytes).Error(), "{tagsTooMany}", tooMany("tags of a job are", maxTags).Error(),
		"{jobTooBig}", errJobTooBig.Error(),
	).Replace(pgEnqueueSQL)
}

// pgEnqueueSQL: see pgEnqueueMigration. The functions run as their owner
// (SECURITY DEFINER), so that a role granted EXECUTE on them and USAGE on
// the schema may enqueue and do nothing else (docs/postgresql.md).
const pgEnqueueSQL = `-- MIGRATION transactional enqueue
	CREATE TABLE {s}.inbox (
		seq        BIGSERIAL PRIMARY KEY,
		id         TEXT COLLATE "C" NOT NULL,
		queue      TEXT COLLATE "C" NOT NULL,
		unique_key TEXT COLLATE "C",
		request    JSONB NOT NULL,
		error      TEXT
	);
	CREATE UNIQUE INDEX inbox_id ON {s}.inbox (id) WHERE error IS NULL;
	CREATE UNIQUE INDEX inbox_unique ON {s}.inbox (queue, unique_key) WHERE error IS NULL AND unique_key IS NOT NULL;

	-- push_num checks a number option as PUSH does.
	CREATE FUNCTION {s}.push_num(label text, v jsonb, lo numeric, hi numeric, whole boolean) RETURNS numeric
	LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $f$
	DECLARE x numeric;
	BEGIN
		IF v IS NULL OR jsonb_typeof(v) = 'null' THEN RETURN NULL; END IF;
		IF jsonb_typeof(v) <> 'number' THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: ' || label || ' must be a number';
		END IF;
		x := v::text::numeric;
		IF abs(x) > 1.7976931348623157e308 THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: ' || label || ' must be a finite number';
		END IF;
		IF whole AND x <> trunc(x) THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: ' || label || ' must be an integer';
		END IF;
		IF x < lo THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: ' || label || ' must be at least ' || lo;
		END IF;
		IF x > hi THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: ' || label || ' must be at most ' || hi;
		END IF;
		RETURN x;
	END $f$;

	-- push_str checks a string option: a string of at most maxKeyBytes.
	CREATE FUNCTION {s}.push_str(label text, v jsonb) RETURNS text
	LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $f$
	BEGIN
		IF v IS NULL OR jsonb_typeof(v) = 'null' THEN RETURN NULL; END IF;
		IF jsonb_typeof(v) <> 'string' THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: ' || label || ' must be a string';
		END IF;
		IF octet_length(v #>> '{}') > {maxKeyBytes} THEN
			RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = 'queued push: ' || label || ' is{keyTooBig}';
		END IF;
		RETURN v #>> '{}';
	END $f$;

	-- push_one checks one job and writes it to the inbox; it answers the
	-- job's id. A job with a custom id or unique key a live job or a
	-- request in the inbox holds answers that one's id, as PUSH does.
	CREATE FUNCTION {s}.push_one(q text, name text, data jsonb, options jsonb) RETURNS text
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
	DECLARE
		k text;
		req jsonb;
		jid text;
		ukey text;
		grp text;
		found_id text;
		b bytea;
		quiet boolean;
	BEGIN
		IF q IS NULL OR q = '' OR char_length(q) > {maxQueueName} OR q !~ '^[a-zA-Z0-9_.:-]+$' THEN
			RAISE EXCEPTION USING ERRCODE = '22023',
				MESSAGE = 'queued push: the queue name must be 1 to {maxQueueName} characters of a-z, A-Z, 0-9, _, -, ., :';
		END IF;
		IF name IS NOT NULL AND (name = '' OR char_length(name) > {maxJobName}) THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: Job name must be a non-empty string of at most 256 characters';
		END IF;
		options := coalesce(options, '{}');
		IF jsonb_typeof(options) <> 'object' THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: options must be a JSON object';
		END IF;
		FOR k IN SELECT jsonb_object_keys(options) LOOP
			IF k IN ('parentId', 'dependsOn', 'childrenIds', 'dedup', 'debounceId', 'debounceTtl', 'repeat') THEN
				RAISE EXCEPTION USING ERRCODE = '0A000',
					MESSAGE = 'queued push: option ' || k || ' is not taken in a transaction; push that job over the wire';
			END IF;
			IF k NOT IN ('priority', 'delay', 'timeout', 'maxAttempts', 'backoff', 'ttl', 'jobId', 'uniqueKey', 'groupId',
					'tags', 'lifo', 'removeOnComplete', 'removeOnFail', 'durable', 'stallTimeout', 'keepLogs', 'sizeLimit',
					'stackTraceLimit', 'failParentOnFailure', 'continueParentOnFailure', 'ignoreDependencyOnFailure',
					'removeDependencyOnFailure', 'timestamp') THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: unknown option ' || k;
			END IF;
		END LOOP;
		IF data IS NOT NULL AND octet_length(data::text) > {maxDataBytes} THEN
			RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = 'queued push: Job data too large (max 10MB)';
		END IF;
		IF jsonb_typeof(options->'groupId') NOT IN ('string', 'null') THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: groupId must be a string';
		END IF;
		grp := options->>'groupId';
		IF grp = '' THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: groupId must be a non-empty string';
		END IF;
		IF char_length(grp) > {maxGroupID} THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: groupId must be at most 256 characters';
		END IF;
		IF grp IS NULL THEN
			PERFORM {s}.push_num('priority', options->'priority', -{maxPriority}, {maxPriority}, true);
		ELSIF options ? 'priority' AND jsonb_typeof(options->'priority') <> 'null' THEN
			IF jsonb_typeof(options->'priority') <> 'number' OR abs((options->>'priority')::numeric) > 1.7976931348623157e308 THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: group.priority must be a finite number';
			END IF;
			IF (options->>'priority')::numeric <> trunc((options->>'priority')::numeric) THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: group.priority must be an integer';
			END IF;
			IF (options->>'priority')::numeric NOT BETWEEN 0 AND {maxGroupPrio} THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: group.priority must be between 0 and {maxGroupPrio}';
			END IF;
		END IF;
		PERFORM {s}.push_num('delay', options->'delay', 0, {maxDelayMs}, false);
		PERFORM {s}.push_num('timeout', options->'timeout', 0, {maxTimeoutMs}, false);
		PERFORM {s}.push_num('maxAttempts', options->'maxAttempts', 1, {maxAttemptCap}, true);
		IF jsonb_typeof(options->'backoff') = 'object' THEN
			IF coalesce(options->'backoff'->>'type', '') NOT IN ('fixed', 'exponential') THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: backoff.type must be ''fixed'' or ''exponential''';
			END IF;
			IF {s}.push_num('backoff.delay', options->'backoff'->'delay', 0, {maxTimeoutMs}, false) IS NULL THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: backoff.delay is required';
			END IF;
			PERFORM {s}.push_num('backoff.maxDelay', options->'backoff'->'maxDelay', 0, {maxDelayMs}, false);
		ELSE
			PERFORM {s}.push_num('backoff', options->'backoff', 0, {maxTimeoutMs}, false);
		END IF;
		PERFORM {s}.push_num('ttl', options->'ttl', 0, {maxDelayMs}, false);
		jid := {s}.push_str('jobId', options->'jobId');
		ukey := {s}.push_str('uniqueKey', options->'uniqueKey');
		IF options ? 'tags' AND jsonb_typeof(options->'tags') <> 'null' THEN
			IF jsonb_typeof(options->'tags') <> 'array' THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: tags must be an array';
			END IF;
			SELECT min(n) - 1 INTO k FROM jsonb_array_elements(options->'tags') WITH ORDINALITY AS t(v, n) WHERE jsonb_typeof(v) <> 'string';
			IF k IS NOT NULL THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: tags[' || k || '] must be a string';
			END IF;
			IF jsonb_array_length(options->'tags') > {maxTags} THEN
				RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = 'queued push: {tagsTooMany}';
			END IF;
		END IF;
		req := options || jsonb_build_object('name', coalesce(name, 'default'));
		IF data IS NOT NULL THEN
			req := req || jsonb_build_object('data', data);
		END IF;
		IF octet_length(req::text) > {maxJobBytes} THEN
			RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = 'queued push: {jobTooBig}';
		END IF;
		IF jid = '' THEN
			jid := NULL;
		END IF;
		IF jid IS NOT NULL THEN
			SELECT id INTO found_id FROM {s}.jobs WHERE id = jid AND state IN ({queued}, {active}, {children});
			IF found_id IS NOT NULL THEN
				RETURN found_id;
			END IF;
		END IF;
		IF ukey IS NOT NULL AND ukey <> '' THEN
			SELECT id INTO found_id FROM {s}.jobs WHERE queue = q AND unique_key = ukey AND state IN ({queued}, {active}, {children});
			IF found_id IS NOT NULL THEN
				RETURN found_id;
			END IF;
		ELSE
			ukey := NULL;
		END IF;
		IF jid IS NULL THEN
			-- A UUIDv7, as a broker gives a job: the time in ms, then random bits.
			b := uuid_send(gen_random_uuid());
			b := overlay(b PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) FROM 1 FOR 6);
			b := set_byte(b, 6, (get_byte(b, 6) & 15) | 112);
			jid := encode(b, 'hex');
			jid := substr(jid, 1, 8) || '-' || substr(jid, 9, 4) || '-' || substr(jid, 13, 4) || '-' || substr(jid, 17, 4) || '-' || substr(jid, 21);
		ELSE
			req := req || jsonb_build_object('jobId', jid);
		END IF;
		-- The brokers are told only when the inbox was empty: while it is
		-- not, they are moving its rows and look again (inboxRound). A
		-- NOTIFY in every push cost a quarter of the pushes a second, as
		-- PostgreSQL commits the transactions that notify one at a time.
		quiet := NOT EXISTS (SELECT 1 FROM {s}.inbox WHERE error IS NULL);
		INSERT INTO {s}.inbox (id, queue, unique_key, request) VALUES (jid, q, ukey, req) ON CONFLICT DO NOTHING;
		IF NOT FOUND THEN
			-- Another request in the inbox holds the id or the key.
			SELECT id INTO found_id FROM {s}.inbox WHERE error IS NULL AND (id = jid OR (queue = q AND unique_key = ukey)) ORDER BY seq LIMIT 1;
			RETURN coalesce(found_id, jid);
		END IF;
		IF quiet THEN
			PERFORM pg_notify('{inbox}', q);
		END IF;
		RETURN jid;
	END $f$;

	CREATE FUNCTION {s}.push(queue text, name text, data jsonb, options jsonb DEFAULT '{}') RETURNS text
	LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
	AS $f$ SELECT {s}.push_one(queue, name, data, options) $f$;

	-- push_many pushes jobs, a JSON array of {"name", "data", "options"},
	-- in their order; it answers their ids in the same order.
	CREATE FUNCTION {s}.push_many(queue text, jobs jsonb) RETURNS text[]
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
	DECLARE
		ids text[] := '{}';
		j jsonb;
		i int := 0;
	BEGIN
		IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: jobs must be a JSON array';
		END IF;
		FOR j IN SELECT value FROM jsonb_array_elements(jobs) LOOP
			IF jsonb_typeof(j) <> 'object' THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'queued push: jobs[' || i || '] must be an object';
			END IF;
			BEGIN
				ids := ids || {s}.push_one(queue, j->>'name', j->'data', j->'options');
			EXCEPTION WHEN OTHERS THEN
				RAISE EXCEPTION USING ERRCODE = SQLSTATE, MESSAGE = replace(SQLERRM, 'queued push: ', 'queued push: jobs[' || i || ']: ');
			END;
			i := i + 1;
		END LOOP;
		RETURN ids;
	END $f$;

	REVOKE ALL ON FUNCTION {s}.push(text, text, jsonb, jsonb), {s}.push_many(text, jsonb),
		{s}.push_one(text, text, jsonb, jsonb), {s}.push_num(text, jsonb, numeric, numeric, boolean), {s}.push_str(text, jsonb) FROM PUBLIC;`

// kickInbox has the inbox looked at now (a transactional push was
// committed, or the listener may have missed one).
func (p *PG) kickInbox() {
	select {
	case p.inboxKick <- struct{}{}:
	default:
	}
}

// inboxRow is a request the inbox holds.
type inboxRow struct {
	seq     int64
	id      string
	queue   string
	request []byte
}

// inboxRound moves what the inbox holds into jobs, a row at a time, until
// it is empty or the round's context ends. Once it has moved a row it
// looks again every pgInboxLook until the inbox has stayed empty for
// pgInboxQuiet: a push that found other rows in the inbox notified no
// one, counting on this.
func (p *PG) inboxRound(ctx context.Context) {
	quietSince := time.Time{}
	for ctx.Err() == nil {
		moved, err := p.moveMany(ctx)
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("transactional enqueue: moving a request from the inbox", "err", redactPG(err, p.url))
			}
			return
		}
		switch {
		case moved:
			quietSince = time.Time{}
			continue
		case quietSince.IsZero():
			quietSince = time.Now()
		case time.Since(quietSince) > pgInboxQuiet:
			return
		}
		select {
		case <-ctx.Done():
		case <-p.stop:
			return
		case <-time.After(pgInboxLook):
		}
	}
}

// pgInboxBatch bounds the rows moveMany moves in one transaction.
const pgInboxBatch = 200

// moveMany moves up to pgInboxBatch inbox rows no other broker is moving
// into jobs in one transaction, a multi-row push per queue; false when
// there were none. When a row is refused, the transaction is rolled back
// and moveOne takes the rows one at a time, so that the refused row keeps
// its reason and the others go in.
func (p *PG) moveMany(ctx context.Context) (bool, error) {
	var rows []inboxRow
	type made struct {
		queue string
		res   pgInserted
	}
	var done []made
	refused := false
	err := pgRetry(ctx, func() error {
		rows, done, refused = rows[:0], done[:0], false
		tx, err := p.begin(ctx)
		if err != nil {
			return pgErr(err)
		}
		defer tx.Rollback(context.Background())
		if rows, err = p.readInbox(ctx, tx, rows); err != nil {
			return pgErr(fmt.Errorf("read the inbox: %w", err))
		}
		if len(rows) == 0 {
			return nil
		}
		// The jobs of a queue go in together, in the order they came.
		byQueue := map[string][]*Job{}
		var order []string
		seqs := make([]int64, 0, len(rows))
		now := p.now()
		for _, r := range rows {
			j, err := inboxJob(r, now)
			if err != nil {
				refused = true
				return nil
			}
			if byQueue[r.queue] == nil {
				order = append(order, r.queue)
			}
			byQueue[r.queue] = append(byQueue[r.queue], j)
			seqs = append(seqs, r.seq)
		}
		for _, q := range order {
			res, err := p.insertInbox(ctx, tx, q, byQueue[q])
			var rf pgRefused
			var je *jobErr
			switch {
			case err == nil:
				done = append(done, made{q, res})
			case errors.As(err, &rf), errors.As(err, &je):
				refused = true
				return nil
			default:
				return err
			}
		}
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.inbox WHERE seq = ANY($1)`), seqs); err != nil {
			return pgErr(fmt.Errorf("empty the inbox: %w", err))
		}
		return pgErr(tx.Commit(ctx))
	})
	switch {
	case err != nil:
		return false, err
	case refused:
		return p.moveOne(ctx)
	}
	for _, d := range done {
		p.inserted(d.queue, d.res)
	}
	return len(rows) > 0, nil
}

// readInbox locks and reads, into rows, the oldest inbox rows no other
// broker holds, up to pgInboxBatch.
func (p *PG) readInbox(ctx context.Context, tx pgx.Tx, rows []inboxRow) ([]inboxRow, error) {
	rs, err := tx.Query(ctx, p.sql(`SELECT seq, id, queue, request::text FROM {s}.inbox WHERE error IS NULL
		ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`), pgInboxBatch)
	if err != nil {
		return rows, err
	}
	defer rs.Close()
	for rs.Next() {
		var r inboxRow
		if err := rs.Scan(&r.seq, &r.id, &r.queue, &r.request); err != nil {
			return rows, err
		}
		rows = append(rows, r)
	}
	return rows, rs.Err()
}

// moveOne moves the oldest inbox row no other broker is moving into
// jobs, in one transaction that deletes the row; false when there was
// none. A request the push refuses keeps its row, with the reason.
func (p *PG) moveOne(ctx context.Context) (bool, error) {
	var r inboxRow
	var refused error
	var res pgInserted
	err := pgRetry(ctx, func() error {
		refused, res = nil, pgInserted{}
		tx, err := p.begin(ctx)
		if err != nil {
			return pgErr(err)
		}
		defer tx.Rollback(context.Background())
		err = tx.QueryRow(ctx, p.sql(`SELECT seq, id, queue, request::text FROM {s}.inbox WHERE error IS NULL
			ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED`)).Scan(&r.seq, &r.id, &r.queue, &r.request)
		if errors.Is(err, pgx.ErrNoRows) {
			r.seq = 0
			return nil
		}
		if err != nil {
			return pgErr(fmt.Errorf("read the inbox: %w", err))
		}
		j, err := inboxJob(r, p.now())
		if err != nil {
			refused = err
			return nil
		}
		// A refusal keeps the row with its reason; any other error is the
		// database's, and the row waits for the next round.
		res, err = p.insertInbox(ctx, tx, j.Queue, []*Job{j})
		var rf pgRefused
		var je *jobErr
		switch {
		case err == nil:
		case errors.As(err, &rf), errors.As(err, &je):
			refused = err
			return nil
		default:
			return err
		}
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.inbox WHERE seq = $1`), r.seq); err != nil {
			return pgErr(fmt.Errorf("empty the inbox: %w", err))
		}
		return pgErr(tx.Commit(ctx))
	})
	if err != nil || r.seq == 0 {
		return false, err
	}
	if refused != nil {
		p.log.Warn("transactional enqueue: a request refused", "queue", r.queue, "id", r.id, "err", refused)
		_, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.inbox SET error = $2 WHERE seq = $1`), r.seq, pgPushErr(refused).Error())
		return err == nil, err
	}
	p.inserted(r.queue, res)
	return true, nil
}

// inboxJob reads an inbox row's request as PUSH reads one: the request
// is PUSH's fields, the job keeps the id the function answered.
func inboxJob(r inboxRow, now int64) (*Job, error) {
	raw, err := jsonToMsgpack(r.request)
	if err != nil {
		return nil, err
	}
	m, err := ParseMap(raw, nil)
	if err != nil {
		return nil, err
	}
	j, err := parseJob(m, r.queue, "jobId", now)
	if err != nil {
		return nil, err
	}
	if j.cold().CustomID == "" {
		j.setID(r.id)
	}
	return j, nil
}

// insertInbox is a push of a queue's jobs within tx, as pushOnce makes
// one.
func (p *PG) insertInbox(ctx context.Context, tx pgx.Tx, queue string, jobs []*Job) (pgInserted, error) {
	plan, err := p.pushChecks(ctx, tx, jobs, nil)
	if err != nil {
		return pgInserted{}, err
	}
	res, err := p.insertJobs(ctx, tx, queue, jobs)
	if err != nil {
		return pgInserted{}, pgErr(err)
	}
	if res.refused != nil {
		return pgInserted{}, pgRefused{res.refused}
	}
	return res, p.admitted(ctx, tx, plan, res.made)
}
