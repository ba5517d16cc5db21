// Job schedulers through the official client: a schedule every second
// fires on time, maxLimit ends a schedule, skipIfNoWorker fires only while
// a worker is there, and preventOverlap keeps one run pending at a time.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq, sleep, waitFor } from './lib';

await main('cron', async () => {
  // Every second for 5 s: 5 runs, one more or up to two fewer.
  {
    const name = uniq('every');
    const q = new Queue(name, { connection: conn });
    // Runs are counted by when the server made them (the job's
    // timestamp), not when the worker got them, so that a slow machine
    // delaying the worker does not change the count.
    const got: number[] = [];
    const w = new Worker(name, async (job) => { got.push(job.timestamp); }, { connection: conn });
    const t0 = Date.now();
    await q.upsertJobScheduler('tick', { every: 1000 }, { name: 'tick', data: { k: 1 } });
    const s: any = await q.getJobScheduler('tick');
    check(s && typeof s.next === 'number', 'scheduler listed with its next run');
    await sleep(5000 - (Date.now() - t0) + 150);
    await q.removeJobScheduler('tick');
    eq(await q.getJobScheduler('tick'), null, 'removed scheduler');
    await waitFor(async () => {
      const c = await q.getJobCountsAsync();
      return c.waiting + c.active + c.delayed === 0;
    }, 20000, 'the runs made so far worked');
    const n = got.filter((t) => t - t0 <= 5150).length;
    console.log(`every 1000 ms over 5 s: ${n} runs`);
    // Two fewer are allowed: a broker starved of CPU (CI runs many
    // scripts at once) makes a run late rather than twice.
    check(n >= 3 && n <= 6, `${n} runs in 5 s, want 5 (3 to 6)`);
    await w.close();
    await q.obliterateAsync(); await q.close();
  }
  // maxLimit: three runs, then the schedule is gone. Without overlap
  // prevention: with it (the default), a run that comes while the last
  // run's job still waits makes no job but counts toward the limit, and
  // a worker slowed by a busy machine saw fewer than three jobs (two CI
  // runs in three on 2026-12-06, PostgreSQL mode).
  {
    const name = uniq('limit');
    const q = new Queue(name, { connection: conn });
    let runs = 0;
    const w = new Worker(name, async () => { runs++; }, { connection: conn });
    await q.upsertJobScheduler('three', { every: 200, limit: 3, preventOverlap: false } as any, { name: 'x', data: {} });
    await waitFor(() => runs === 3, 20000, 'three runs');
    await sleep(700);
    eq(runs, 3, 'no fourth run');
    eq(await q.getJobScheduler('three'), null, 'schedule removed at its limit');
    await w.close();
    await q.obliterateAsync(); await q.close();
  }
  // skipIfNoWorker: nothing while no worker serves the queue.
  {
    const name = uniq('noworker');
    const q = new Queue(name, { connection: conn });
    await q.upsertJobScheduler('idle', { every: 200, skipIfNoWorker: true } as any, { name: 'x', data: {} });
    await sleep(900);
    eq((await q.getJobCountsAsync()).waiting, 0, 'no runs without a worker');
    let runs = 0;
    const w = new Worker(name, async () => { runs++; }, { connection: conn });
    await waitFor(() => runs >= 2, 20000, 'runs once a worker is there');
    await q.removeJobScheduler('idle');
    await w.close();
    await q.obliterateAsync(); await q.close();
  }
  // preventOverlap: a slow job keeps the next runs from piling up.
  {
    const name = uniq('overlap');
    const q = new Queue(name, { connection: conn });
    let running = 0, peak = 0, runs = 0;
    const w = new Worker(name, async () => {
      running++; peak = Math.max(peak, running); runs++;
      await sleep(700);
      running--;
    }, { connection: conn, concurrency: 5 });
    await q.upsertJobScheduler('slow', { every: 100, preventOverlap: true } as any, { name: 'x', data: {} });
    let pendingPeak = 0;
    for (let i = 0; i < 20; i++) {
      const c = await q.getJobCountsAsync();
      pendingPeak = Math.max(pendingPeak, c.waiting + c.active);
      await sleep(100);
    }
    await q.removeJobScheduler('slow');
    await w.close();
    console.log(`preventOverlap: peak running ${peak}, peak pending+active ${pendingPeak}, runs ${runs}`);
    eq(peak, 1, 'one run at a time');
    check(pendingPeak <= 1, `pending+active peaked at ${pendingPeak}`);
    await q.obliterateAsync(); await q.close();
  }
}, 60000);
