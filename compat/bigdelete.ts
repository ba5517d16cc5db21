// Big-deletion probe (issue 31): whether one big deletion stalls the
// SQLite writer. Not a test: run it by hand (docs/performance.md gives the
// figures it printed).
//
//   bun run bigdelete.ts /path/to/queued [JOBS] [obliterate|drain]
//
// It starts queued on a new SQLite file, pushes JOBS (1,500,000) jobs to
// one queue with addBulk in batches of 1,000, removes them all (Obliterate
// or Drain, awaited), then times a durable push to another queue, and a
// graceful stop (SIGTERM) right after. Then again on a new file, with a
// kill -9 right after the removal was answered: it counts what the
// restarted server holds of the removed queue (it must be none) and times
// the restart until /health answers. One JSON line on stdout.
import { Queue } from 'bunqueue/client';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { healthy } from './lib';

const bin = process.argv[2];
const N = Number(process.argv[3] ?? 1_500_000);
const op = process.argv[4] ?? 'obliterate';
if (!bin || (op !== 'obliterate' && op !== 'drain')) {
  console.error('usage: bun run bigdelete.ts BINARY [JOBS] [obliterate|drain]');
  process.exit(2);
}
const dir = mkdtempSync(join(tmpdir(), 'bigdelete-'));
const tcp = 20000 + Math.floor(Math.random() * 20000);
const http = tcp + 1;
const conn = { host: '127.0.0.1', port: tcp };

function start(db: string) {
  return Bun.spawn([bin, '--data-path', db, '--port', String(tcp), '--http-port', String(http)], {
    stdout: 'ignore', stderr: 'ignore',
  });
}

// Fills a new file with N jobs in 'big' and removes them; the server is
// left running, the time the removal took returned.
async function fillAndRemove(db: string) {
  const srv = start(db);
  await healthy(http, 60_000);
  const big = new Queue('big', { connection: conn });
  for (let i = 0; i < N; i += 1000) {
    const batch = [];
    for (let j = i; j < Math.min(N, i + 1000); j++) batch.push({ name: 'j', data: { i: j, s: 'payload-' + j } });
    await big.addBulk(batch);
  }
  const t0 = performance.now();
  if (op === 'obliterate') await big.obliterateAsync();
  else await big.drainAsync();
  const removeMs = performance.now() - t0;
  big.close?.();
  return { srv, removeMs };
}

// 1. The durable push right after, and a graceful stop.
const a = await fillAndRemove(join(dir, 'a.db'));
const other = new Queue('other', { connection: conn });
const t1 = performance.now();
await other.add('x', { n: 1 }, { durable: true });
const durablePushMs = performance.now() - t1;
other.close?.();
const t2 = performance.now();
a.srv.kill('SIGTERM');
await a.srv.exited;
const stopMs = performance.now() - t2;

// 2. A kill -9 right after the removal was answered.
const b = await fillAndRemove(join(dir, 'b.db'));
b.srv.kill('SIGKILL');
await b.srv.exited;
const srv = start(join(dir, 'b.db'));
const restartMs = await healthy(http, 600_000);
const big = new Queue('big', { connection: conn });
const counts = await big.getJobCountsAsync();
big.close?.();
srv.kill('SIGTERM');
await srv.exited;
rmSync(dir, { recursive: true, force: true });
console.log(JSON.stringify({
  op, jobs: N, remove_ms: Math.round(a.removeMs), durable_push_after_ms: +durablePushMs.toFixed(1),
  graceful_stop_ms: Math.round(stopMs), after_kill9_waiting: counts.waiting, restart_to_health_ms: Math.round(restartMs),
}));
process.exit(0);
