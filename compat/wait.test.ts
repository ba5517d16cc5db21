// job.waitUntilFinished resolves with the result when a worker finishes it.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, eq, sleep } from './lib';

await main('wait', async () => {
  const name = uniq('wait');
  const q = new Queue(name, { connection: conn });
  const job = await q.add('w', { n: 3 });
  const waiting = job.waitUntilFinished(undefined, 10000);
  await sleep(200);
  const w = new Worker(name, async (j) => { await sleep(100); return (j.data as any).n * 3; }, { connection: conn });
  eq(await waiting, 9, 'result through waitUntilFinished');
  // Already finished: answers at once.
  eq(await job.waitUntilFinished(undefined, 1000), 9, 'result of a finished job');
  await w.close();
  await q.obliterateAsync();
  await q.close();
});
