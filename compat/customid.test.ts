// A custom jobId is the job's id and is idempotent: adding it again returns
// the same job and changes nothing, until the job has finished.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, eq, waitFor } from './lib';

await main('customid', async () => {
  const name = uniq('cid');
  const q = new Queue(name, { connection: conn });
  const id = uniq('order');
  const a = await q.add('o', { v: 1 }, { jobId: id });
  const b = await q.add('o', { v: 2 }, { jobId: id });
  const [c] = await q.addBulk([{ name: 'o', data: { v: 3 }, opts: { jobId: id } }]);
  const d = await q.add('o', { v: 4 }, { jobId: id, durable: true }); // single PUSH
  eq([a.id, b.id, c.id, d.id], [id, id, id, id], 'every add returns the custom id');
  eq((await q.getJob(id))!.data, { v: 1 }, 'the first data is kept');
  eq((await q.getJobCountsAsync()).waiting, 1, 'one job only');

  const w = new Worker(name, async (j) => (j.data as any).v, { connection: conn });
  await waitFor(async () => (await q.getJobState(id)) === 'completed', 10000, 'completed');
  await w.close();
  // Once finished, the id may be used again for a new job.
  const e = await q.add('o', { v: 5 }, { jobId: id });
  eq(e.id, id, 're-added id');
  eq(await q.getJobState(id), 'waiting', 'the re-added job waits');
  eq((await q.getJob(id))!.data, { v: 5 }, 'with its new data');
  await q.obliterateAsync();
  await q.close();
});
