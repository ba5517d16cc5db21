// A paused queue hands out nothing; resume lets its jobs run.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq, sleep, waitFor } from './lib';

await main('pause', async () => {
  const name = uniq('pause');
  const q = new Queue(name, { connection: conn });
  await q.pauseAsync();
  eq(await q.isPausedAsync(), true, 'isPaused after pause');
  const job = await q.add('p', { x: 1 });
  let ran = 0;
  const w = new Worker(name, async () => { ran++; }, { connection: conn });
  await sleep(600);
  eq(ran, 0, 'nothing runs while paused');
  const c = await q.getJobCountsAsync();
  eq([c.waiting, c.paused], [0, 1], 'paused counts');
  await q.resumeAsync();
  eq(await q.isPausedAsync(), false, 'isPaused after resume');
  await waitFor(() => ran === 1, 10000, 'job ran after resume');
  await w.close();
  eq(await q.getJobState(job.id), 'completed', 'completed after resume');
  check(ran === 1, 'ran once');
  await q.obliterateAsync();
  await q.close();
});
