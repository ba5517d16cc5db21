// addBulk of 1,000 jobs, each processed exactly once by several workers.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq, waitFor } from './lib';

await main('bulk', async () => {
  const name = uniq('bulk');
  const q = new Queue(name, { connection: conn });
  const N = 1000;
  const jobs = await q.addBulk(Array.from({ length: N }, (_, i) => ({ name: 'b', data: { i } })));
  eq(jobs.length, N, 'addBulk returns one job per input');
  eq(new Set(jobs.map((j) => j.id)).size, N, 'ids are distinct');
  const counts = await q.getJobCountsAsync();
  eq(counts.waiting, N, 'all waiting');

  const seen = new Map<number, number>();
  const workers = [1, 2, 3].map(() => new Worker(name, async (j) => {
    const i = (j.data as any).i;
    seen.set(i, (seen.get(i) ?? 0) + 1);
    return i;
  }, { connection: conn, concurrency: 20, batchSize: 20 }));
  await waitFor(async () => (await q.getJobCountsAsync()).completed === N, 30000, 'all completed');
  await Promise.all(workers.map((w) => w.close()));
  eq(seen.size, N, 'every job processed');
  for (const [i, n] of seen) check(n === 1, `job ${i} processed ${n} times`);
  const end = await q.getJobCountsAsync();
  eq([end.waiting, end.active, end.failed, end.completed], [0, 0, 0, N], 'final counts');
  await q.obliterateAsync();
  await q.close();
});
