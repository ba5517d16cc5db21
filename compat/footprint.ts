// Footprint probe (issue 18): what a million waiting jobs cost a server,
// and how long it is down after a kill -9, through the official client.
// Not a test: run it by hand, against queued and the reference in one
// sitting (docs/performance.md, "Memory", gives the figures it printed).
//
//   bun run footprint.ts queued /path/to/queued [JOBS]
//   bun run footprint.ts reference [JOBS]       (bunqueue from node_modules)
//
// It starts the server on a new SQLite file, pushes JOBS (1,000,000)
// jobs with addBulk in batches of 1,000 (data {i, s}, about 40 bytes),
// reads the server's RSS and CPU time (and the RSS again after 15 s
// idle), kills it with SIGKILL, starts it
// again on the same file and times until GET /health answers, then reads
// the RSS once it has settled. One JSON line on stdout.
import { Queue } from 'bunqueue/client';
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { healthy } from './lib';

const kind = process.argv[2];
const bin = kind === 'queued' ? process.argv[3] : '';
const N = Number(process.argv[kind === 'queued' ? 4 : 3] ?? 1_000_000);
if ((kind !== 'queued' && kind !== 'reference') || (kind === 'queued' && !bin)) {
  console.error('usage: bun run footprint.ts queued BINARY [JOBS] | reference [JOBS]');
  process.exit(2);
}
const dir = mkdtempSync(join(tmpdir(), 'footprint-'));
const tcp = 20000 + Math.floor(Math.random() * 20000);
const http = tcp + 1;

function start() {
  const db = join(dir, 'q.db');
  const cmd = kind === 'queued'
    ? [bin, '--data-path', db, '--port', String(tcp), '--http-port', String(http)]
    : [join(import.meta.dir, 'node_modules/.bin/bun'), join(import.meta.dir, 'node_modules/.bin/bunqueue'), 'start', '--data-path', db];
  return Bun.spawn(cmd, {
    env: { ...process.env, TCP_PORT: String(tcp), HTTP_PORT: String(http) },
    stdout: 'ignore', stderr: 'ignore',
  });
}

// The process and its descendants (the reference may run under a wrapper).
function tree(pid: number): number[] {
  const kids = new Map<number, number[]>();
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const st = readFileSync(`/proc/${e}/stat`, 'utf8');
      const ppid = Number(st.slice(st.lastIndexOf(')') + 2).split(' ')[1]);
      kids.set(ppid, [...(kids.get(ppid) ?? []), Number(e)]);
    } catch {}
  }
  const out: number[] = [];
  const walk = (p: number) => { out.push(p); for (const k of kids.get(p) ?? []) walk(k); };
  walk(pid);
  return out;
}

function rssMB(pid: number): number {
  let kb = 0;
  for (const p of tree(pid)) {
    const m = /VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${p}/status`, 'utf8'));
    if (m) kb += Number(m[1]);
  }
  return Math.round(kb / 1024);
}

function cpuMs(pid: number): number {
  let ticks = 0;
  for (const p of tree(pid)) {
    const st = readFileSync(`/proc/${p}/stat`, 'utf8');
    const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
    ticks += Number(f[11]) + Number(f[12]); // utime, stime
  }
  return ticks * 10; // USER_HZ is 100
}

let srv = start();
await healthy(http, 60_000);
const q = new Queue(`footprint`, { connection: { host: '127.0.0.1', port: tcp } });
const cpu0 = cpuMs(srv.pid);
const t0 = performance.now();
for (let i = 0; i < N; i += 1000) {
  const batch = [];
  for (let j = i; j < Math.min(N, i + 1000); j++) batch.push({ name: 'j', data: { i: j, s: 'payload-' + j } });
  await q.addBulk(batch);
}
const pushSec = (performance.now() - t0) / 1000;
const pushCpuMs = cpuMs(srv.pid) - cpu0;
const counts = await q.getJobCountsAsync?.().catch(() => undefined);
const rss = rssMB(srv.pid);
await Bun.sleep(15_000); // idle: the server gives back what the burst left free
const rssIdle = rssMB(srv.pid);
q.close?.();
srv.kill('SIGKILL');
await srv.exited;
srv = start();
const restartMs = await healthy(http, 600_000);
const rssAtHealth = rssMB(srv.pid);
await Bun.sleep(10_000);
const rssSettled = rssMB(srv.pid);
srv.kill('SIGTERM');
await srv.exited;
rmSync(dir, { recursive: true, force: true });
console.log(JSON.stringify({
  server: kind, jobs: N, waiting: counts?.waiting,
  addbulk_jobs_per_s: Math.round(N / pushSec), addbulk_cpu_ms_per_1000: +(pushCpuMs / (N / 1000)).toFixed(2),
  rss_mb_waiting: rss, rss_mb_waiting_15s_idle: rssIdle, restart_to_health_ms: Math.round(restartMs),
  rss_mb_at_health: rssAtHealth, rss_mb_10s_later: rssSettled,
}));
process.exit(0);
