package main

// `queued migrate`: its options, and the command's run from the data file
// to the namespace with the counts printed before and after. The copy
// itself is in migrate_to_pg.go.

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

const migrateUsage = `Usage: queued migrate --from FILE --postgres-url URL [--postgres-namespace NS] [--append]
       queued migrate --from-bunqueue SRC [--from-namespace NS] (--data-path FILE | --postgres-url URL [--postgres-namespace NS])

Moves a SQLite deployment into a PostgreSQL namespace: jobs in every state
(active jobs wait again, with their attempts kept, as after a restart),
results, the dead-letter queue, logs, cron schedules, queue settings
(paused, rate and concurrency limits, stall and dead-letter policies),
groups with their settings, flows (the dependencies and children jobs
still wait for) and dedup keys (a ttl starts again, as at a restart).
Stop the server first: a data file a running server holds is refused.

Everything is written in one transaction. The counts per queue and state
are printed from SQLite before and read back from PostgreSQL after; when
they differ nothing is committed and the exit status is 1.

A namespace that already holds jobs or schedules is refused, unless
--append: the jobs are then added to those there (a job id already in the
namespace fails the migration), schedules of the same name and the
settings of queues in the file are replaced by the file's.

Webhooks are not moved: in PostgreSQL mode each broker has its own.

With --from-bunqueue, SRC is the data file of a bunqueue server (2.9.x),
or the postgres:// URL of the database its PostgreSQL mode uses (with
--from-namespace for its BUNQUEUE_POSTGRES_NAMESPACE). Everything a client
sees comes across into a new data file (--data-path) or a PostgreSQL
namespace: jobs in every state with their results, the dead-letter queue,
flows, groups, unique keys, logs, cron schedules and queue settings. The
source is only read; stop the bunqueue server first. What cannot come
across is listed and nothing is written. See docs/migrating.md.

Options:
`

// migrateOpts are queued migrate's arguments.
type migrateOpts struct {
	from, url, namespace string
	appendTo             bool
	// From bunqueue: the source, its namespace, and the new data file
	// (when the target is SQLite).
	bunqueue, bqNamespace, dataPath string
	// label names the source in what is printed, when it is not from.
	label string
}

// runMigrate is `queued migrate`: it reads the options and runs
// migrateSQLite.
func runMigrate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("queued migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o migrateOpts
	fs.StringVar(&o.from, "from", envOr(dataPathEnv, defaultDataPath), "the SQLite data file [DATA_PATH, BUNQUEUE_DATA_PATH]")
	o.url = pgURLFromEnv()
	fs.Var(dsnFlag{&o.url}, "postgres-url", "the PostgreSQL database `URL` (shown with its password masked) [BUNQUEUE_POSTGRES_URL]")
	fs.StringVar(&o.namespace, "postgres-namespace", envOr(pgNamespaceEnv, "default"), "the namespace to fill [BUNQUEUE_POSTGRES_NAMESPACE]")
	fs.BoolVar(&o.appendTo, "append", false, "add to a namespace that already holds jobs")
	fs.StringVar(&o.bunqueue, "from-bunqueue", "", "a bunqueue server's data: its SQLite data `FILE` or its postgres:// URL")
	fs.StringVar(&o.bqNamespace, "from-namespace", "default", "the bunqueue PostgreSQL namespace to read (its BUNQUEUE_POSTGRES_NAMESPACE)")
	fs.StringVar(&o.dataPath, "data-path", "", "with --from-bunqueue: the new queued data `FILE` to write")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), migrateUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "queued migrate: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.bunqueue != "" {
		return runMigrateBunqueue(o, set, stdout, stderr)
	}
	if o.url == "" {
		fmt.Fprintln(stderr, "queued migrate: --postgres-url (or BUNQUEUE_POSTGRES_URL) is required")
		return 2
	}
	if _, err := pgNamespace(o.namespace); err != nil {
		fmt.Fprintln(stderr, "queued migrate:", err)
		return 2
	}
	return runMigration(stderr, func(ctx context.Context, log *slog.Logger) error {
		return migrateSQLite(ctx, o, stdout, log)
	})
}

// runMigration runs a migration until it ends or a signal stops it, with
// warnings logged to stderr, and answers the exit status.
func runMigration(stderr io.Writer, run func(context.Context, *slog.Logger) error) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := run(ctx, log); err != nil {
		fmt.Fprintln(stderr, "queued migrate:", err)
		return 1
	}
	return 0
}

func migrateSQLite(ctx context.Context, o migrateOpts, out io.Writer, log *slog.Logger) error {
	if fi, err := os.Stat(o.from); err != nil {
		return fmt.Errorf("no SQLite data file at %s: %w", o.from, err)
	} else if fi.IsDir() {
		return fmt.Errorf("%s is a folder; --from names the SQLite data file", o.from)
	}
	release, err := lockDataFile(o.from)
	if errors.Is(err, errDataFileInUse) {
		return fmt.Errorf("%w; stop it first, so that the migration copies the file's final state", err)
	}
	if err != nil {
		return err
	}
	defer release()
	sq, err := OpenSQLite(o.from, "normal", log)
	if err != nil {
		return err
	}
	// Before release (deferred above, so run after): see datalock.go.
	defer sq.Close()

	now := nowMs()
	src, err := readSQLite(ctx, sq, now)
	if err != nil {
		return fmt.Errorf("%s: %w", o.from, err)
	}
	schema, _ := pgNamespace(o.namespace)
	label := cmp.Or(o.label, o.from)
	if o.label == "" {
		fmt.Fprintf(out, "Before: %s (SQLite)\n", o.from)
	} else {
		fmt.Fprintf(out, "Before: %s\n", o.label)
	}
	if err := src.report(out, o.from); err != nil {
		return err
	}

	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	// A copy of a large file may run past a broker's statement timeout.
	session := defaultPGSession
	session.statementTimeout = 0
	p, err := connectPG(cctx, o.url, o.namespace, nil, log, session)
	cancel()
	if err != nil {
		return err
	}
	defer p.Close()
	after, err := p.load(ctx, sq, src, schema, o.appendTo, now)
	if err != nil {
		return fmt.Errorf("nothing migrated: %w", err)
	}
	fmt.Fprintf(out, "After: namespace %s (PostgreSQL, read back)\n", o.namespace)
	printCounts(out, after.counts, after.order)
	fmt.Fprintf(out, "%d logs, %d cron schedules, %d queues, %d paused, %d dependencies not yet met\n",
		after.logs, after.crons, len(after.order), after.paused, after.deps)
	fmt.Fprintf(out, "Migrated %s into namespace %s (schema %s); the counts match.\n", label, o.namespace, schema)
	return nil
}

// report prints what a SQLite data file holds, and what will not move;
// an error if a job record cannot be read (nothing is migrated then).
func (src *sqliteSource) report(out io.Writer, from string) error {
	printCounts(out, src.before, src.queueOrder())
	fmt.Fprintf(out, "%d logs, %d cron schedules, %d queues with settings, %d webhooks, %d URL handlers\n",
		src.logs, len(src.crons)+len(src.ended), len(src.queues), src.webhooks, len(src.handlers))
	ngroups := 0
	for _, g := range src.groups {
		ngroups += len(g)
	}
	fmt.Fprintf(out, "%d groups, %d dependencies not yet met\n", ngroups, len(src.waiters))
	if src.bad > 0 {
		return fmt.Errorf("%s: %d job records could not be read; nothing migrated", from, src.bad)
	}
	if src.requeued > 0 {
		fmt.Fprintf(out, "%d active jobs wait again, with their attempts kept: their workers are gone\n", src.requeued)
	}
	if len(src.ended) > 0 {
		fmt.Fprintf(out, "cron schedules that had used up their runs are not moved: %s\n", strings.Join(src.ended, ", "))
	}
	if src.orphans > 0 {
		fmt.Fprintf(out, "%d logs of jobs no longer in the file are not moved\n", src.orphans)
	}
	if src.webhooks > 0 {
		fmt.Fprintf(out, "%d webhooks are not moved: in PostgreSQL mode each broker has its own; add them on each broker\n", src.webhooks)
	}
	if src.released > 0 {
		fmt.Fprintf(out, "%d jobs whose dependencies all completed run, as after a restart\n", src.released)
	}
	return nil
}

// printCounts writes a table of jobs by queue and state, with totals.
func printCounts(w io.Writer, qc queueCounts, order []string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "QUEUE\tWAITING\tPRIORITIZED\tDELAYED\tACTIVE\tCOMPLETED\tFAILED\tWAITING-CHILDREN\tTOTAL\t")
	var sum JobCounts
	row := func(name string, c *JobCounts) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", name, c.Waiting, c.Prioritized, c.Delayed, c.Active,
			c.Completed, c.Failed, c.WaitingChildren, jobTotal(c))
	}
	seen := map[string]bool{}
	names := append([]string(nil), order...)
	var extra []string
	for q := range qc {
		if !slices.Contains(order, q) {
			extra = append(extra, q)
		}
	}
	sort.Strings(extra)
	for _, q := range append(names, extra...) {
		if seen[q] {
			continue
		}
		seen[q] = true
		c := qc[q]
		if c == nil {
			c = &JobCounts{}
		}
		row(q, c)
		sum.plus(c)
	}
	row("(all)", &sum)
	tw.Flush()
}

// runMigrateBunqueue is `queued migrate --from-bunqueue`: it reads the
// bunqueue data, prints it, and writes it into a new data file or, through
// one, into a PostgreSQL namespace.
func runMigrateBunqueue(o migrateOpts, set map[string]bool, stdout, stderr io.Writer) int {
	toPG := set["postgres-url"]
	switch {
	case toPG && o.dataPath != "":
		fmt.Fprintln(stderr, "queued migrate: give --data-path or --postgres-url, not both")
		return 2
	case !toPG && o.dataPath == "":
		fmt.Fprintln(stderr, "queued migrate: say where the data goes: --data-path FILE (a new SQLite data file) or --postgres-url URL")
		return 2
	case set["from"]:
		fmt.Fprintln(stderr, "queued migrate: --from and --from-bunqueue name two sources; give one")
		return 2
	}
	if toPG {
		if _, err := pgNamespace(o.namespace); err != nil {
			fmt.Fprintln(stderr, "queued migrate:", err)
			return 2
		}
	}
	return runMigration(stderr, func(ctx context.Context, log *slog.Logger) error {
		return migrateBunqueue(ctx, o, toPG, stdout, log)
	})
}

func migrateBunqueue(ctx context.Context, o migrateOpts, toPG bool, out io.Writer, log *slog.Logger) error {
	now := nowMs()
	var src *bqSource
	var err error
	if isPostgresURL(o.bunqueue) {
		src, err = readBunqueuePG(ctx, o.bunqueue, o.bqNamespace, now, log)
	} else {
		src, err = readBunqueueSQLite(ctx, o.bunqueue, now)
	}
	if err != nil {
		return err
	}
	if err := src.report(out); err != nil {
		return err
	}
	file := o.dataPath
	if toPG {
		// Into a data file of our own first, then through the SQLite to
		// PostgreSQL migration, which prints the counts read back.
		dir, err := os.MkdirTemp("", "queued-migrate-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		file = dir + "/from-bunqueue.db"
	}
	back, err := src.writeSQLite(ctx, file, now)
	if err != nil {
		return err
	}
	if !toPG {
		fmt.Fprintf(out, "After: %s (queued SQLite, read back)\n", file)
		printCounts(out, back.before, back.queueOrder())
		fmt.Fprintf(out, "%d logs, %d cron schedules, %d queues with settings\n", back.logs, len(back.crons), len(back.queues))
		fmt.Fprintf(out, "Migrated %s into %s; the counts match. Start queued with --data-path %s.\n", src.what, file, file)
		return nil
	}
	fmt.Fprintln(out)
	o.from, o.label = file, "the data brought across, in a queued data file"
	return migrateSQLite(ctx, o, out, log)
}
