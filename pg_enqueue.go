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
	"github.com/jackc/pgx/v5/pgconn"
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
func pgEnqueueMigration() string { return pgEnqueueLimits().Replace(pgEnqueueSQL) }

// pgEnqueueLimits writes PUSH's limits into the functions' text.
func pgEnqueueLimits() *strings.Replacer {
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	return strings.NewReplacer(
		"{maxQueueName}", n(maxQueueName), "{maxJobName}", n(maxJobName), "{maxGroupID}", n(maxGroupID),
		"{maxDataBytes}", n(maxDataBytes), "{maxJobBytes}", n(maxJobBytes), "{maxPriority}", n(maxPriority),
		"{maxGroupPrio}", n(maxGroupPrio), "{maxDelayMs}", n(maxDelayMs), "{maxTimeoutMs}", n(maxTimeoutMs),
		"{maxAttemptCap}", n(maxAttemptCap), "{maxKeyBytes}", n(maxKeyBytes), "{maxTags}", n(maxTags),
		// PUSH's own words for the limits (budgets.go).
		"{keyTooBig}", tooBig("", maxKeyBytes).Error(), "{tagsTooMany}", tooMany("tags of a job are", maxTags).Error(),
		"{jobTooBig}", errJobTooBig.Error(), "{tagTooBig}", tooBig("each entry of tags is", maxKeyBytes).Error(),
	)
}

// pgEnqueueSQL: see pgEnqueueMigration. push() and push_many() run as
// their owner (SECURITY DEFINER), so that a role granted EXECUTE on them
// and USAGE on the schema may enqueue and do nothing else
// (docs/postgresql.md); the functions they call run inside them, as the
// owner too, and no one else may execute those.
const pgEnqueueSQL = `-- MIGRATION transactional enqueue
	-- at: when push() was called (ms, the database's clock), the job's
	-- creation time; size: the request's length as JSON text.
	CREATE TABLE {s}.inbox (
		seq        BIGSERIAL PRIMARY KEY,
		id         TEXT COLLATE "C" NOT NULL,
		queue      TEXT COLLATE "C" NOT NULL,
		unique_key TEXT COLLATE "C",
		at         BIGINT NOT NULL,
		size       BIGINT NOT NULL,
		request    JSONB NOT NULL,
		error      TEXT
	);
	CREATE UNIQUE INDEX inbox_id ON {s}.inbox (id) WHERE error IS NULL;
	CREATE UNIQUE INDEX inbox_unique ON {s}.inbox (queue, unique_key) WHERE error IS NULL AND unique_key IS NOT NULL;

	-- push_num checks a number option as PUSH does; pfx starts the message.
	CREATE FUNCTION {s}.push_num(pfx text, label text, v jsonb, lo numeric, hi numeric, whole boolean) RETURNS numeric
	LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $f$
	DECLARE x numeric;
	BEGIN
		IF v IS NULL OR jsonb_typeof(v) = 'null' THEN RETURN NULL; END IF;
		IF jsonb_typeof(v) <> 'number' THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || label || ' must be a number';
		END IF;
		x := v::text::numeric;
		IF abs(x) > 1.7976931348623157e308 THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || label || ' must be a finite number';
		END IF;
		IF whole AND x <> trunc(x) THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || label || ' must be an integer';
		END IF;
		IF x < lo THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || label || ' must be at least ' || lo;
		END IF;
		IF x > hi THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || label || ' must be at most ' || hi;
		END IF;
		RETURN x;
	END $f$;

	-- push_str checks a string option: a string of at most maxKeyBytes.
	CREATE FUNCTION {s}.push_str(pfx text, label text, v jsonb) RETURNS text
	LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $f$
	BEGIN
		IF v IS NULL OR jsonb_typeof(v) = 'null' THEN RETURN NULL; END IF;
		IF jsonb_typeof(v) <> 'string' THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || label || ' must be a string';
		END IF;
		IF octet_length(v #>> '{}') > {maxKeyBytes} THEN
			RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = pfx || label || ' is{keyTooBig}';
		END IF;
		RETURN v #>> '{}';
	END $f$;

	-- push_bound is at least the bytes v takes as MessagePack, which is
	-- what PUSH's size limits count: its JSON text, 8 bytes more for each
	-- number (at least one character, at most 9 bytes), 3 for each string
	-- (2 quotes, a header of at most 5 bytes) and each array or object (2
	-- brackets, at most 5). Counted in the text, where a string's digits
	-- and quotes count too: more, never less.
	CREATE FUNCTION {s}.push_bound(v jsonb) RETURNS bigint
	LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $f$
		SELECT octet_length(t) + 8 * (SELECT count(*) FROM regexp_matches(t, '[0-9][-+0-9.eE]*', 'g'))
			+ 3 * ((octet_length(t) - octet_length(replace(t, '"', ''))) / 2
				+ octet_length(t) - octet_length(replace(replace(t, '[', ''), '{', '')))
		FROM (SELECT v::text AS t) x
	$f$;

` + pgPushOneSQL + `
	CREATE FUNCTION {s}.push(queue text, name text, data jsonb, options jsonb DEFAULT '{}') RETURNS text
	LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
	AS $f$ SELECT {s}.push_one(queue, name, data, options, 'queued push: ') $f$;

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
			ids := ids || {s}.push_one(queue, j->>'name', j->'data', j->'options', 'queued push: jobs[' || i || ']: ');
			i := i + 1;
		END LOOP;
		RETURN ids;
	END $f$;

	REVOKE ALL ON FUNCTION {s}.push(text, text, jsonb, jsonb), {s}.push_many(text, jsonb),
		{s}.push_one(text, text, jsonb, jsonb, text), {s}.push_num(text, text, jsonb, numeric, numeric, boolean),
		{s}.push_str(text, text, jsonb), {s}.push_bound(jsonb) FROM PUBLIC;`

// pgPushOneSQL is push_one, the check and the write of one job that
// push() and push_many() share: made by the transactional enqueue's
// migration, and made again by pgEnqueueLeanMigration.
const pgPushOneSQL = `	-- push_one checks one job and writes it to the inbox; it answers the
	-- job's id. A job with a custom id or unique key a live job or a
	-- request in the inbox holds answers that one's id, as PUSH does.
	-- It runs inside push() or push_many(), as their owner and with their
	-- search_path (pgEnqueueLeanMigration).
	CREATE OR REPLACE FUNCTION {s}.push_one(q text, name text, data jsonb, options jsonb, pfx text) RETURNS text
	LANGUAGE plpgsql AS $f$
	DECLARE
		k text;
		req jsonb;
		jid text;
		ukey text;
		grp text;
		found_id text;
		b bytea;
		quiet boolean;
		size bigint;
		dsize bigint;
		lo numeric;
		hi numeric;
		whole boolean;
	BEGIN
		IF q IS NULL OR q = '' THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'Queue name is required';
		END IF;
		IF octet_length(q) > {maxQueueName} THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'Queue name too long (max {maxQueueName} characters)';
		END IF;
		IF q !~ '^[a-zA-Z0-9_.:-]+$' THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'Queue name contains invalid characters';
		END IF;
		IF name IS NOT NULL AND (name = '' OR char_length(name) > {maxJobName}) THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'Job name must be a non-empty string of at most {maxJobName} characters';
		END IF;
		options := coalesce(options, '{}');
		IF jsonb_typeof(options) <> 'object' THEN
			RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'options must be a JSON object';
		END IF;
		-- No options (the most common push), no option to check.
		IF options <> '{}' THEN
		FOR k IN SELECT jsonb_object_keys(options) LOOP
			IF k IN ('parentId', 'dependsOn', 'childrenIds', 'dedup', 'debounceId', 'debounceTtl', 'repeat') THEN
				RAISE EXCEPTION USING ERRCODE = '0A000',
					MESSAGE = pfx || 'option ' || k || ' is not taken in a transaction; push that job over the wire';
			END IF;
			IF k NOT IN ('priority', 'delay', 'timeout', 'maxAttempts', 'backoff', 'ttl', 'jobId', 'uniqueKey', 'groupId',
					'tags', 'lifo', 'removeOnComplete', 'removeOnFail', 'durable', 'stallTimeout', 'keepLogs', 'sizeLimit',
					'stackTraceLimit', 'failParentOnFailure', 'continueParentOnFailure', 'ignoreDependencyOnFailure',
					'removeDependencyOnFailure', 'timestamp') THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'unknown option ' || k;
			END IF;
		END LOOP;
		END IF;
		-- MessagePack takes at most 5 bytes for a character of JSON text (a
		-- number of one digit and its comma: 9 for 2), so push_bound only
		-- counts for data of a fifth of the limit or more.
		dsize := coalesce(octet_length(data::text), 0);
		IF dsize * 5 > {maxDataBytes} AND {s}.push_bound(data) > {maxDataBytes} THEN
			RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = pfx || 'Job data too large (max 10MB)';
		END IF;
		IF options <> '{}' THEN
		IF options ? 'groupId' THEN
			IF jsonb_typeof(options->'groupId') <> 'string' THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'groupId must be a string';
			END IF;
			grp := options->>'groupId';
			IF grp = '' THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'groupId must be a non-empty string';
			END IF;
			IF char_length(grp) > {maxGroupID} THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'groupId must be at most {maxGroupID} characters';
			END IF;
		END IF;
		IF grp IS NULL AND options ? 'priority' THEN
			PERFORM {s}.push_num(pfx, 'priority', options->'priority', -{maxPriority}, {maxPriority}, true);
		ELSIF options ? 'priority' AND jsonb_typeof(options->'priority') <> 'null' THEN
			IF jsonb_typeof(options->'priority') <> 'number' OR abs((options->>'priority')::numeric) > 1.7976931348623157e308 THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'group.priority must be a finite number';
			END IF;
			IF (options->>'priority')::numeric <> trunc((options->>'priority')::numeric) THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'group.priority must be an integer';
			END IF;
			IF (options->>'priority')::numeric NOT BETWEEN 0 AND {maxGroupPrio} THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'group.priority must be between 0 and {maxGroupPrio}';
			END IF;
		END IF;
		-- In PUSH's order, those given (a push without them runs no query).
		IF options ?| ARRAY['delay', 'timeout', 'maxAttempts'] THEN
			FOR k, lo, hi, whole IN SELECT r.k, r.lo, r.hi, r.whole
				FROM (VALUES (1, 'delay', 0, {maxDelayMs}, false), (2, 'timeout', 0, {maxTimeoutMs}, false),
					(3, 'maxAttempts', 1, {maxAttemptCap}, true)) AS r(n, k, lo, hi, whole)
				WHERE options ? r.k ORDER BY r.n
			LOOP
				PERFORM {s}.push_num(pfx, k, options->k, lo, hi, whole);
			END LOOP;
		END IF;
		IF NOT options ? 'backoff' THEN
			NULL;
		ELSIF jsonb_typeof(options->'backoff') = 'object' THEN
			IF coalesce(options->'backoff'->>'type', '') NOT IN ('fixed', 'exponential') THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'backoff.type must be ''fixed'' or ''exponential''';
			END IF;
			IF {s}.push_num(pfx, 'backoff.delay', options->'backoff'->'delay', 0, {maxTimeoutMs}, false) IS NULL THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'backoff.delay is required';
			END IF;
			PERFORM {s}.push_num(pfx, 'backoff.maxDelay', options->'backoff'->'maxDelay', 0, {maxDelayMs}, false);
		ELSE
			PERFORM {s}.push_num(pfx, 'backoff', options->'backoff', 0, {maxTimeoutMs}, false);
		END IF;
		IF options ? 'ttl' THEN
			PERFORM {s}.push_num(pfx, 'ttl', options->'ttl', 0, {maxDelayMs}, false);
		END IF;
		IF options ? 'jobId' THEN
			jid := {s}.push_str(pfx, 'jobId', options->'jobId');
		END IF;
		IF options ? 'uniqueKey' THEN
			ukey := {s}.push_str(pfx, 'uniqueKey', options->'uniqueKey');
		END IF;
		-- Numbers kept as given: PUSH refuses what is not one, and those of
		-- the first three past 2^53.
		FOREACH k IN ARRAY ARRAY['stallTimeout', 'keepLogs', 'sizeLimit'] LOOP
			IF options ? k AND abs({s}.push_num(pfx, k, options->k, '-Infinity', 'Infinity', false)) > 9007199254740991 THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || k || ' must be a finite number';
			END IF;
		END LOOP;
		FOREACH k IN ARRAY ARRAY['stackTraceLimit', 'timestamp'] LOOP
			IF options ? k THEN
				PERFORM {s}.push_num(pfx, k, options->k, '-Infinity', 'Infinity', false);
			END IF;
		END LOOP;
		IF options ? 'tags' AND jsonb_typeof(options->'tags') <> 'null' THEN
			IF jsonb_typeof(options->'tags') <> 'array' THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'tags must be an array';
			END IF;
			SELECT min(n) - 1 INTO k FROM jsonb_array_elements(options->'tags') WITH ORDINALITY AS t(v, n) WHERE jsonb_typeof(v) <> 'string';
			IF k IS NOT NULL THEN
				RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pfx || 'tags[' || k || '] must be a string';
			END IF;
			IF jsonb_array_length(options->'tags') > {maxTags} THEN
				RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = pfx || '{tagsTooMany}';
			END IF;
			IF EXISTS (SELECT 1 FROM jsonb_array_elements_text(options->'tags') t(v) WHERE octet_length(v) > {maxKeyBytes}) THEN
				RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = pfx || '{tagTooBig}';
			END IF;
		END IF;
		END IF;
		IF data IS NULL THEN
			req := options || jsonb_build_object('name', coalesce(name, 'default'));
		ELSE
			req := options || jsonb_build_object('name', coalesce(name, 'default'), 'data', data);
		END IF;
		size := dsize + octet_length(options::text) + coalesce(octet_length(name), 7) + 32;
		IF size * 5 + 64 > {maxJobBytes} AND {s}.push_bound(req) + 64 > {maxJobBytes} THEN
			RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = pfx || '{jobTooBig}';
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
			b := overlay(uuid_send(gen_random_uuid()) PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) FROM 1 FOR 6);
			jid := encode(set_byte(b, 6, (get_byte(b, 6) & 15) | 112), 'hex')::uuid::text;
		ELSE
			req := req || jsonb_build_object('jobId', jid);
		END IF;
		-- The brokers are told only when the inbox was empty: while it is
		-- not, they are moving its rows and look again (inboxRound). A
		-- NOTIFY in every push cost a quarter of the pushes a second, as
		-- PostgreSQL commits the transactions that notify one at a time.
		quiet := NOT EXISTS (SELECT 1 FROM {s}.inbox WHERE error IS NULL);
		INSERT INTO {s}.inbox (id, queue, unique_key, at, size, request)
			VALUES (jid, q, ukey, (extract(epoch FROM clock_timestamp()) * 1000)::bigint, size, req) ON CONFLICT DO NOTHING;
		IF NOT FOUND THEN
			-- Another request in the inbox holds the id or the key.
			SELECT id INTO found_id FROM {s}.inbox WHERE error IS NULL AND (id = jid OR (queue = q AND unique_key = ukey)) ORDER BY seq LIMIT 1;
			RETURN coalesce(found_id, jid);
		END IF;
		IF quiet THEN
			PERFORM pg_notify('{inbox}', q);
		END IF;
		RETURN jid;
	END $f$;`

// pgEnqueueLeanMigration makes push_one again without SECURITY DEFINER
// and a search_path of its own, and takes the search_path off the
// helpers: they run inside push() or push_many(), as the owner and with
// its search_path already, since only the owner may execute them (EXECUTE
// is revoked from PUBLIC). A SECURITY DEFINER function switches the user
// at each call and a SET clause saves and restores the setting; push_one
// also skips the options' checks for a push without options. push_one
// had cost a push() 0.13 of its 0.15 ms of database time, most of it
// neither the inbox's INSERT nor the look whether it was empty.
func pgEnqueueLeanMigration() string { return pgEnqueueLimits().Replace(pgEnqueueLeanSQL) }

const pgEnqueueLeanSQL = `-- MIGRATION lean transactional enqueue
` + pgPushOneSQL + `
	ALTER FUNCTION {s}.push_num(text, text, jsonb, numeric, numeric, boolean) RESET search_path;
	ALTER FUNCTION {s}.push_str(text, text, jsonb) RESET search_path;
	ALTER FUNCTION {s}.push_bound(jsonb) RESET search_path;`

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
	at      int64 // when push() was called: the job's creation time
	size    int64
	request []byte
}

const (
	// pgInboxBatch and pgInboxBytes bound the rows moveInbox moves in one
	// transaction, by count and by the length of their requests (the
	// first row goes whatever its length).
	pgInboxBatch = 200
	pgInboxBytes = 16 << 20
)

// inboxRound moves what the inbox holds into jobs until it is empty or
// the round's context ends. Once it has moved a row it looks again every
// pgInboxLook until the inbox has stayed empty for pgInboxQuiet: a push
// that found other rows in the inbox notified no one, counting on this.
func (p *PG) inboxRound(ctx context.Context) {
	var movedAny, full bool
	quietSince := time.Time{}
	for ctx.Err() == nil {
		// An empty inbox is found in one statement, not a transaction's
		// three: an idle broker looks every pgInboxEvery. After a full
		// batch rows most likely remain, and the move goes on at once.
		waiting := full
		var err error
		if !full {
			err = p.pool.QueryRow(ctx, p.sql(`SELECT EXISTS (SELECT 1 FROM {s}.inbox WHERE error IS NULL)`)).Scan(&waiting)
		}
		moved := 0
		if err == nil && waiting {
			moved, err = p.moveInbox(ctx, pgInboxBatch)
		}
		full = moved >= pgInboxBatch
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("transactional enqueue: moving requests from the inbox", "err", redactPG(err, p.url))
			}
			return
		}
		switch {
		case moved >= pgInboxBatch:
			// Rows may remain: look again at once.
			movedAny, quietSince = true, time.Time{}
			continue
		case moved > 0:
			// Most likely drained (or a batch cut short by its bytes):
			// looking again at once mostly found it empty, a transaction
			// for nothing each round. The requests committing meanwhile
			// are gathered for pgInboxLook and moved together; with 8
			// application transactions pushing, the database's CPU a
			// job fell from 0.347 to 0.334 ms.
			movedAny, quietSince = true, time.Time{}
		case !movedAny:
			return
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

// pgRefusal reports an error that moving the same request again would
// meet again: the push's refusals, and the database's objections to the
// data (SQLSTATE classes 22, data exception, and 54, a program limit).
func pgRefusal(err error) bool {
	var rf pgRefused
	var je *jobErr
	var pe *pgconn.PgError
	return errors.As(err, &rf) || errors.As(err, &je) ||
		errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "54"))
}

// moveInbox moves up to limit of the oldest inbox rows no other broker is
// moving into jobs, in one transaction that deletes them, a multi-row
// push per queue; it answers how many rows it took from the inbox (moved,
// or set aside as refused). When a row is refused the
// transaction is rolled back: a row alone keeps its reason; of several,
// each is moved alone, so that the refused one keeps its reason and the
// others go in.
func (p *PG) moveInbox(ctx context.Context, limit int) (int, error) {
	var rows []inboxRow
	type made struct {
		queue string
		res   pgInserted
	}
	var done []made
	var refused error
	err := pgRetry(ctx, func() error {
		rows, done, refused = rows[:0], done[:0], nil
		tx, err := p.begin(ctx)
		if err != nil {
			return pgErr(err)
		}
		defer tx.Rollback(context.Background())
		if rows, err = p.readInbox(ctx, tx, rows, limit); err != nil || len(rows) == 0 {
			return pgErr(err)
		}
		// The jobs of a queue go in together, in the order they came.
		byQueue := map[string][]*Job{}
		var order []string
		seqs := make([]int64, 0, len(rows))
		for _, r := range rows {
			j, err := inboxJob(r)
			if err != nil {
				refused = err
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
			if err != nil {
				// Any error but a refusal is the database's, and the
				// rows wait for the next round.
				if pgRefusal(err) {
					refused = err
					return nil
				}
				return err
			}
			done = append(done, made{q, res})
		}
		if _, err := tx.Exec(ctx, p.sql(`DELETE FROM {s}.inbox WHERE seq = ANY($1)`), seqs); err != nil {
			return pgErr(fmt.Errorf("empty the inbox: %w", err))
		}
		return pgErr(tx.Commit(ctx))
	})
	switch {
	case err != nil:
		return 0, err
	case refused != nil && len(rows) == 1:
		r := rows[0]
		p.log.Warn("transactional enqueue: a request refused", "queue", r.queue, "id", r.id, "err", refused)
		_, err := p.pool.Exec(ctx, p.sql(`UPDATE {s}.inbox SET error = $2 WHERE seq = $1`), r.seq, pgPushErr(refused).Error())
		if err != nil {
			return 0, fmt.Errorf("set aside a refused inbox request: %w", err)
		}
		return 1, nil
	case refused != nil:
		n := 0
		for range rows {
			moved, err := p.moveInbox(ctx, 1)
			n += moved
			if err != nil || moved == 0 {
				return max(n, 1), err
			}
		}
		return n, nil
	}
	for _, d := range done {
		p.inserted(d.queue, d.res)
	}
	return len(rows), nil
}

// readInbox locks the oldest inbox rows no other broker holds, up to
// limit rows and pgInboxBytes of requests, and reads them into rows. The
// requests are read once the rows are chosen: rows of 10 MB each, 200 of
// them, would not fit in memory or in one answer.
func (p *PG) readInbox(ctx context.Context, tx pgx.Tx, rows []inboxRow, limit int) ([]inboxRow, error) {
	rs, err := tx.Query(ctx, p.sql(`SELECT seq, size FROM {s}.inbox WHERE error IS NULL
		ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`), limit)
	if err != nil {
		return rows, fmt.Errorf("read the inbox: %w", err)
	}
	var seqs []int64
	var total int64
	for rs.Next() {
		var seq, size int64
		if err := rs.Scan(&seq, &size); err != nil {
			rs.Close()
			return rows, fmt.Errorf("read the inbox: %w", err)
		}
		if len(seqs) > 0 && total+size > pgInboxBytes {
			break
		}
		seqs, total = append(seqs, seq), total+size
	}
	rs.Close()
	if err := rs.Err(); err != nil || len(seqs) == 0 {
		return rows, err
	}
	rs, err = tx.Query(ctx, p.sql(`SELECT seq, id, queue, at, size, request::text FROM {s}.inbox WHERE seq = ANY($1) ORDER BY seq`), seqs)
	if err != nil {
		return rows, fmt.Errorf("read the inbox: %w", err)
	}
	defer rs.Close()
	for rs.Next() {
		var r inboxRow
		if err := rs.Scan(&r.seq, &r.id, &r.queue, &r.at, &r.size, &r.request); err != nil {
			return rows, fmt.Errorf("read the inbox: %w", err)
		}
		rows = append(rows, r)
	}
	return rows, rs.Err()
}

// inboxJob reads an inbox row's request as PUSH reads one, at the time
// push() was called: the request is PUSH's fields, and the job keeps the
// id the function answered.
func inboxJob(r inboxRow) (*Job, error) {
	raw, err := jsonToMsgpack(r.request)
	if err != nil {
		return nil, err
	}
	m, err := ParseMap(raw, nil)
	if err != nil {
		return nil, err
	}
	j, err := parseJob(m, r.queue, "jobId", r.at)
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
