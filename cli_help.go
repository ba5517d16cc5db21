package main

// Help texts: `queued help`, `queued help CMD` and `queued CMD --help`.

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

func mainHelp() string {
	return strings.ReplaceAll(`queued: a job queue server that speaks the bunqueue protocol (v3), and its command line.

Usage:
  queued [server flags]             run the server (as queued serve)
  queued COMMAND [args] [options]   run a command; global options may stand anywhere
  queued help [COMMAND]             this text, or one command's

Server:
  serve [server flags]              run the server (see queued help serve)
  start [server flags]              the same as serve

Core:
  push <queue> <data> [options]     push a job (data is JSON)
  pull <queue> [--timeout ms]       take the next job; ack or fail it within {stall}
  ack <id> [--result json]          complete a job
  fail <id> [--error message]       fail a job; says whether it is retried or dead-lettered

Jobs:
  job get|state|result <id>         a job, its state, its result
  job cancel|promote|discard <id>   cancel; delayed to waiting; to the dead-letter queue
  job progress <id> <0-100> [-m s]  set progress
  job update <id> <data>            replace a job's data
  job priority <id> <n>             change priority
  job delay <id> <ms>               move an active job back to delayed
  job logs <id>                     a job's log lines
  job log <id> <message> [-l level] add a log line (info, warn, error)
  job wait <id> [--timeout ms]      wait until a job completes

Queues:
  queue list                        queue names
  queue pause|resume <queue>        stop and restart handing out jobs
  queue drain <queue>               remove waiting jobs
  queue obliterate <queue>          remove everything of a queue
  queue clean <queue> --grace ms    remove completed jobs older than grace [--state s] [--limit n]
  queue count <queue>               jobs waiting or delayed
  queue jobs <queue> [--state s]    list jobs [--limit n] [--offset n]
  queue paused <queue>              whether it is paused
  rate-limit set|clear <queue> [n]  jobs per second
  concurrency set|clear <queue> [n] jobs active at once

Dead-letter queue, schedules, workers, webhooks:
  dlq list <queue> [--count n]      dead-lettered jobs
  dlq retry <queue> [--id jobId]    send them back to waiting
  dlq purge <queue>                 delete them
  cron list | add <name> ... | delete <name>
  worker list | register <name> -q q1,q2 | unregister <id>
  webhook list | add <url> -e events [-q queue] [-s secret] | remove <id>

Monitoring:
  stats                             counts and rates
  metrics                           server metrics
  health                            one-line health over the wire protocol
  ping                              round trip on the wire protocol
  version                           this binary's version and the server's
  doctor                            checks health, storage, DLQ, TCP, token and TLS
  healthcheck [url]                 container probe: exit 0 when /health says healthy

Tools:
  mcp                               MCP server over stdio for AI agents (docs/mcp.md)
  bench [workloads] [options]       load generator (see queued help bench)
  backup --out FILE | --s3          copy a running server's database over HTTP, or
                                    have it upload one to its S3 bucket
  backups list [S3 flags]           the backups in an S3 bucket
  restore --from s3://B/KEY --data-path FILE
                                    download a backup into a new database file
  migrate --from FILE --postgres-url URL
                                    move a stopped SQLite deployment into PostgreSQL
  help [COMMAND]                    this text, or one command's

Global options (anywhere on the line):
  -H, --host HOST      server host (default localhost) [HOST, BUNQUEUE_HOST, BQ_HOST]
  -p, --port PORT      TCP port (default 6789; HTTP is PORT+1) [TCP_PORT]
  -t, --token TOKEN    auth token [BQ_TOKEN, BUNQUEUE_TOKEN]; after pull and job wait,
                       -t is their --timeout: use --token there
  --tls                connect with TLS, verifying the server with the system roots
  --tls-ca FILE        verify the server with this CA certificate (implies --tls)
  --tls-no-verify      TLS without verifying the server (testing only)
  --json               print the server's answer as JSON (push: {"id": ...})
  --help               help

Exit status: 0 done, 1 the server refused or could not be reached, 2 bad usage.
`, "{stall}", stallFigure)
}

// stallFigure is how long a job taken by queued pull may go without ack or
// fail before the queue's stall detection takes it back, by default.
var stallFigure = humanMs(float64(defaultStall.StallInterval))

// commandHelp is the help of one command, by its first word.
var commandHelp = map[string]string{
	"push": `Usage: queued push <queue> <data> [options]

Push a job; data is a JSON value. Prints the new job's id.

Options:
  -P, --priority N        higher runs first
  -d, --delay MS          wait this long before it can run
  --max-attempts N        attempts before the dead-letter queue (default 3)
  --backoff MS            wait between attempts (default 1000)
  --ttl MS                time to live
  --timeout MS            how long one attempt may run
  -u, --unique-key KEY    refuse a second job with this key while one lives
  --job-id ID             custom id; pushing it again before the job
                          finishes returns the same job
  --depends-on IDS        comma-separated ids that must complete first
  --tags TAGS             comma-separated tags
  -g, --group-id ID       group
  --lifo                  last in, first out
  --remove-on-complete    forget the job when it completes
  --remove-on-fail        forget the job when it fails for good

Examples:
  queued push emails '{"to":"a@example.com"}'
  queued push tasks '{"id":1}' --priority 10 --delay 5000 --json
`,
	"pull": strings.NewReplacer("{stall}", stallFigure, "{stalls}", strconv.Itoa(int(defaultStall.MaxStalls))).Replace(`Usage: queued pull <queue> [-t|--timeout MS]

Take the next job of a queue and print it. With --timeout, wait that long
for a job to arrive.

The job stays active after this command exits, so that ack or fail can
follow from another command, but not for ever: this pull holds no lock, so
the queue's stall detection takes the job back when it is neither acked nor
failed within the queue's stall interval ({stall} unless the queue's stall
config says otherwise; sooner when the job was pushed with --timeout). A job
taken back has used an attempt: it waits for its backoff and runs again, or
goes to the dead-letter queue when its attempts are used up or it has
stalled {stalls} times. Within that time:

  queued ack <id> [--result JSON]      complete it
  queued fail <id> [--error MESSAGE]   fail it
`),
	"ack": `Usage: queued ack <id> [-r|--result JSON]

Complete an active job, optionally with a result (a JSON value).
`,
	"fail": `Usage: queued fail <id> [-e|--error MESSAGE]

Fail an active job. While it has attempts left it goes back to its queue,
delayed by its backoff; on its last attempt it goes to the dead-letter queue
(or is removed, when it was pushed with --remove-on-fail). The command reads
the job afterwards and says which happened.
`,
	"job": `Usage: queued job <subcommand> <id> [...]

  get <id>                       the job (exit 1 when there is none)
  state <id>                     its state (exit 1 when there is no such job)
  result <id>                    its result
  cancel <id>                    cancel it
  progress <id> <0-100> [-m|--message TEXT]
  update <id> <data>             replace its data (JSON)
  priority <id> <n>              change its priority
  promote <id>                   make a delayed job wait now
  delay <id> <ms>                move an active job back to delayed
  discard <id>                   move it to the dead-letter queue
  logs <id>                      its log lines
  log <id> <message> [-l|--level info|warn|error]
  wait <id> [-t|--timeout MS]    wait until it completes (exit 1 when it
                                 fails or the time runs out)
`,
	"queue": `Usage: queued queue <subcommand> [...]

  list                                 queue names
  pause <queue>                        stop handing out its jobs
  resume <queue>                       start again
  drain <queue>                        remove its waiting jobs
  obliterate <queue>                   remove everything of it
  clean <queue> -g|--grace MS [-s|--state STATE] [-l|--limit N]
                                       remove up to N jobs (default 1000)
                                       of STATE older than MS (below)
  count <queue>                        jobs waiting or delayed
  jobs <queue> [-s|--state STATE] [-l|--limit N] [-o|--offset N]
  paused <queue>                       whether it is paused

STATE is one of waiting, delayed, active, completed, failed.

What clean removes, by --state:
  completed (the default)  jobs that completed more than MS ago
  failed                   dead-lettered jobs that failed more than MS ago
  waiting, delayed         jobs waiting or delayed (both, whichever is named),
                           created more than MS ago: only when asked for
  active                   nothing: active jobs are never cleaned
The reference CLI sends no state by default, which the protocol's Clean
takes as waiting; this one sends completed unless told otherwise.
`,
	"rate-limit": `Usage: queued rate-limit set <queue> <jobs-per-second>
       queued rate-limit clear <queue>
`,
	"concurrency": `Usage: queued concurrency set <queue> <max-active>
       queued concurrency clear <queue>
`,
	"dlq": `Usage: queued dlq <subcommand> <queue> [...]

  list <queue> [-c|--count N]   dead-lettered jobs with their errors
  retry <queue> [--id JOBID]    send them (or one) back to waiting
  purge <queue>                 delete them
`,
	"cron": `Usage: queued cron list
       queued cron add <name> -q QUEUE -d JSON (-s CRON | -e MS) [options]
       queued cron delete <name>

Options of add:
  -q, --queue QUEUE       target queue (required)
  -d, --data JSON         job data (required)
  -s, --schedule EXPR     cron expression, such as "0 * * * *"
  -e, --every MS          or: repeat interval
  -P, --priority N        job priority
  --max-limit N           most runs (0 = unlimited)
  -z, --timezone TZ       time zone of the schedule
`,
	"worker": `Usage: queued worker list
       queued worker register <name> -q|--queues q1,q2
       queued worker unregister <workerId>

A worker registered from here lasts only as long as the command runs.
`,
	"webhook": `Usage: queued webhook list
       queued webhook add <url> -e|--events E1,E2 [-q|--queue Q] [-s|--secret S]
       queued webhook remove <webhookId>

Events: job.pushed, job.started, job.completed, job.failed, job.progress.
`,
	"stats":   "Usage: queued stats\n\nJob counts across every queue, totals, rates and uptime.\n",
	"metrics": "Usage: queued metrics\n\nThe server's metrics (Prometheus text where the server has it).\n",
	"health":  "Usage: queued health\n\nAsks the server for its counts over the wire protocol and says it is healthy\nwhen it answers (exit 1 when it does not).\n",
	"ping":    "Usage: queued ping\n\nOne round trip on the wire protocol, with its time.\n",
	"version": "Usage: queued version\n\nThis binary's version, and the server's from its HTTP /health (port + 1).\n",
	"healthcheck": `Usage: queued healthcheck [URL]

The container probe, as bunqueue healthcheck: asks the server's HTTP
/health (default http://127.0.0.1:$HTTP_PORT/health, port 6790) and exits 0
when it answers healthy, 1 otherwise (after 5 s at most). It prints
"healthy" or "Health check failed", nothing of the answer.
`,
	"mcp": `Usage: queued mcp [--mcp-max-answer-bytes SIZE]

An MCP (Model Context Protocol) server over stdio, for an AI agent that
starts it as a subprocess: the 73 tools, 5 resources and 3 prompts of
bunqueue-mcp, against the server at -H/-p (or BUNQUEUE_HOST, BUNQUEUE_PORT,
BUNQUEUE_TOKEN, as bunqueue-mcp reads them in its tcp mode). One JSON-RPC
message per line on stdin and stdout; the log on stderr. The server
itself serves the same at http://HOST:HTTP_PORT/mcp. See docs/mcp.md.

  --mcp-max-answer-bytes SIZE   one answer, as written (default 1MiB, from
                                64KiB to 64MiB): lists of jobs are cut to
                                fit, with a note, and values past a
                                sixteenth of it are shown as their type and
                                length [QUEUED_MCP_MAX_ANSWER_BYTES]

Up to 16 requests run at once; one more is refused at once, while pings
and cancellations are always answered.
`,
	"doctor": `Usage: queued doctor

Checks a running server: HTTP /health on the TCP port plus one (status,
version, storage, dead-lettered jobs) and a Ping over the wire protocol
with the given token and TLS options. Exit 1 when any check fails.
`,
}

// printHelp prints the help of one command.
func printHelp(cmd string, stdout, stderr io.Writer) int {
	switch cmd {
	case "serve", "start":
		fs, _ := serverFlags(stdout)
		fs.Usage()
		return 0
	case "backup":
		return runBackup([]string{"--help"}, stdout, stdout)
	case "backups":
		return runBackups([]string{"--help"}, stdout, stdout)
	case "restore":
		return runRestore([]string{"--help"}, stdout, stdout)
	case "bench":
		return runBench([]string{"--help"}, stdout, stdout)
	case "migrate":
		return runMigrate([]string{"--help"}, stdout, stdout)
	case "help", "":
		fmt.Fprint(stdout, mainHelp())
		return 0
	}
	h, ok := commandHelp[cmd]
	if !ok {
		fmt.Fprintf(stderr, "queued: no help for %q: no such command (try: queued help)\n", cmd)
		return 2
	}
	fmt.Fprint(stdout, strings.TrimLeft(h, "\n"))
	fmt.Fprint(stdout, "\nGlobal options: -H/--host, -p/--port, -t/--token, --tls, --tls-ca FILE, --tls-no-verify, --json\n")
	return 0
}
