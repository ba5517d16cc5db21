// Job ttl, job timeout, a stall into the DLQ, and DLQ auto-retry.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq, sleep, waitFor } from './lib';

await main('timing', async () => {
  // ttl: a job that waits past its ttl is dropped, never run.
  {
    const name = uniq('ttl');
    const q = new Queue(name, { connection: conn });
    const j = await q.add('t', {}, { ttl: 200 });
    await sleep(400);
    let ran = 0;
    const w = new Worker(name, async () => { ran++; }, { connection: conn });
    await sleep(500);
    await w.close();
    eq(ran, 0, 'expired job not run');
    eq(await q.getJobState(j.id), 'unknown', 'expired job gone');
    await q.obliterateAsync();
    await q.close();
  }
  // timeout: a job running past its timeout is failed by the server.
  {
    const name = uniq('timeout');
    const q = new Queue(name, { connection: conn });
    const j = await q.add('t', {}, { timeout: 200, attempts: 1 });
    const w = new Worker(name, async () => { await sleep(1500); return 'late'; }, { connection: conn });
    w.on('error', () => {});
    await waitFor(async () => (await q.getJobState(j.id)) === 'failed', 5000, 'timed-out job failed');
    const got = await q.getJob(j.id);
    eq(got!.failedReason, 'Job timeout exceeded', 'timeout reason');
    await w.close();
    await q.obliterateAsync();
    await q.close();
  }
  // stall: a worker that stops renewing its lock; with maxStalls 1 the job
  // goes to the DLQ.
  {
    const name = uniq('stall');
    const q = new Queue(name, { connection: conn });
    // setStallConfig is fire-and-forget in the client: wait for it to land.
    q.setStallConfig({ maxStalls: 1 });
    await waitFor(async () => (await q.getStallConfigAsync()).maxStalls === 1, 3000, 'stall config applied');
    const j = await q.add('s', {}, { attempts: 5 });
    const w = new Worker(name, async () => { await sleep(3000); }, { connection: conn, lockDuration: 300, skipLockRenewal: true, heartbeatInterval: 0 });
    w.on('error', () => {});
    await waitFor(async () => (await q.getJobState(j.id)) === 'failed', 8000, 'stalled job in the DLQ');
    const dlq = await q.getDlqAsync();
    eq(dlq.map((e: any) => e.reason), ['stalled'], 'DLQ reason');
    await w.close(true);
    await q.obliterateAsync();
    await q.close();
  }
  // DLQ auto-retry: a job that fails once comes back by itself and completes.
  {
    const name = uniq('autoretry');
    const q = new Queue(name, { connection: conn });
    q.setDlqConfig({ autoRetry: true, autoRetryInterval: 300, maxAutoRetries: 2 });
    await waitFor(async () => (await q.getDlqConfigAsync()).autoRetry === true, 3000, 'DLQ config applied');
    const j = await q.add('a', {}, { attempts: 1 });
    let runs = 0;
    const w = new Worker(name, async () => { runs++; if (runs === 1) throw new Error('first run fails'); return 'ok'; }, { connection: conn });
    w.on('error', () => {});
    await waitFor(async () => (await q.getJobState(j.id)) === 'completed', 8000, 'auto-retried job completed');
    eq(runs, 2, 'ran twice');
    await w.close();
    await q.obliterateAsync();
    await q.close();
  }
}, 60000);
