package main

// Help texts: `queued help`, `queued help CMD` and `queued CMD --help`.

import (
	"fmt"
	"io"
	"strings"
)

func mainHelp() string {
	return `queued: a job queue server that speaks the bunqueue protocol (v3), and its command line.

Usage:
  queued [serve] [server flags]     run the server (the default; see queued help serve)
  queued COMMAND [args] [options]   talk to a running server
  queued help [COMMAND]             this text, or one command's

Core:
  push <queue> <data> [options]     push a job (data is JSON)
  pull <queue> [--timeout ms]       take the next job (it stays active until ack/fail)
  ack <id> [--result json]          complete a job
  fail <id> [--error message]       fail a job (retried while attempts remain)

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
  queue clean <queue> --grace ms    remove old jobs [--state s] [--limit n]
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

Tools:
  bench [workloads] [options]       load generator (see queued help bench)
  backup --out FILE                 copy a running server's database over HTTP
  migrate --from FILE --postgres-url URL
                                    move a stopped SQLite deployment into PostgreSQL

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
`
}

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
  --job-id ID             custom id; pushing it again returns the same job
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
	"pull": `Usage: queued pull <queue> [-t|--timeout MS]

Take the next job of a queue and print it. The job stays active after this
command exits, so that ack or fail can follow from another command. With
--timeout, wait that long for a job to arrive.
`,
	"ack": `Usage: queued ack <id> [-r|--result JSON]

Complete an active job, optionally with a result (a JSON value).
`,
	"fail": `Usage: queued fail <id> [-e|--error MESSAGE]

Fail an active job; it is retried while it has attempts left, then goes to
the dead-letter queue.
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
                                       remove jobs older than grace
  count <queue>                        jobs waiting or delayed
  jobs <queue> [-s|--state STATE] [-l|--limit N] [-o|--offset N]
  paused <queue>                       whether it is paused

STATE is one of waiting, delayed, active, completed, failed.
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
		return cmdBackupCLI([]string{"--help"}, stdout, stdout)
	case "bench":
		return cmdBench([]string{"--help"}, stdout, stdout)
	case "migrate":
		return cmdMigrate([]string{"--help"}, stdout, stdout)
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
