// Priority order: higher first; lifo first among equals; FIFO otherwise.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, eq, waitFor } from './lib';

await main('priority', async () => {
  const name = uniq('prio');
  const q = new Queue(name, { connection: conn });
  await q.add('none-a', {}, {});
  await q.add('low', {}, { priority: 1 });
  await q.add('neg', {}, { priority: -5 });
  await q.add('high', {}, { priority: 10 });
  await q.add('mid', {}, { priority: 5 });
  await q.add('mid-lifo', {}, { priority: 5, lifo: true });
  await q.add('none-b', {}, {});
  const counts = await q.getJobCountsAsync();
  eq([counts.waiting, counts.prioritized], [3, 4], 'waiting vs prioritized');
  const order: string[] = [];
  const w = new Worker(name, async (j) => { order.push(j.name); }, { connection: conn, concurrency: 1 });
  await waitFor(() => order.length === 7, 10000, 'all processed');
  await w.close();
  eq(order, ['high', 'mid-lifo', 'mid', 'low', 'none-a', 'none-b', 'neg'], 'processing order');
  await q.obliterateAsync();
  await q.close();
});
