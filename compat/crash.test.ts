// A worker process killed mid-job: its job is delivered again. With a lock
// it renewed, after the lock expires (counted as a stall); with a lock it
// never renewed, as soon as its connection drops.
import { Queue, Worker } from 'bunqueue/client';
import { spawn } from 'node:child_process';
import { conn, uniq, main, eq, waitFor } from './lib';

async function crashAndRecover(concurrency: number) {
  const name = uniq('crash');
  const q = new Queue(name, { connection: conn });
  const job = await q.add('c', { v: 1 });
  const child = spawn(process.execPath, ['run', new URL('./crash-worker.ts', import.meta.url).pathname, name, String(concurrency), '1500'],
    { env: process.env, stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  await waitFor(() => out.includes('STARTED ' + job.id), 15000, 'child started the job');
  eq(await q.getJobState(job.id), 'active', 'active while the child runs it');
  child.kill('SIGKILL');
  await new Promise((r) => child.on('exit', r));

  const got: any[] = [];
  const w = new Worker(name, async (j) => { got.push({ id: j.id, attemptsMade: j.attemptsMade }); return 'recovered'; }, { connection: conn });
  await waitFor(() => got.length > 0, 20000, 'job delivered again');
  await waitFor(async () => (await q.getJobState(job.id)) === 'completed', 5000, 'job completed');
  await w.close();
  eq(got.length, 1, 'delivered once more, not twice');
  // The worker's job object does not carry the stall count; read it back.
  const after = await q.getJob(job.id);
  await q.obliterateAsync();
  await q.close();
  return { attemptsMade: got[0].attemptsMade, stalled: after!.stalledCounter };
}

await main('crash', async () => {
  // concurrency 2: the worker renews its lock right after pulling, so the
  // job stays leased until the lock expires; that counts as an attempt.
  const renewed = await crashAndRecover(2);
  eq([renewed.attemptsMade, renewed.stalled], [1, 1], 'redelivered after lock expiry');
  // concurrency 1: the lock was never renewed; the job is released when the
  // connection drops, without costing an attempt.
  const released = await crashAndRecover(1);
  eq([released.attemptsMade, released.stalled], [0, 0], 'released on disconnect');
}, 90000);
