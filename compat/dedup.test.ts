// Deduplication with each policy, through Queue.add's deduplication option.
import { Queue, Worker, QueueEvents } from 'bunqueue/client';
import { conn, uniq, main, check, eq, sleep, waitFor } from './lib';

await main('dedup', async () => {
  const name = uniq('dedup');
  const q = new Queue(name, { connection: conn });
  const events = new QueueEvents(name, { connection: conn });
  await events.waitUntilReady?.();
  const dups: string[] = [];
  events.on('duplicated', (e: any) => dups.push(e.jobId));

  // Default: a second add with the same id returns the first job.
  const a = await q.add('d', { v: 1 }, { deduplication: { id: 'k1' } });
  const b = await q.add('d', { v: 2 }, { deduplication: { id: 'k1' } });
  eq(b.id, a.id, 'duplicate returns the holder');
  eq((await q.getJob(a.id))!.data, { v: 1 }, 'holder data kept');
  eq(await q.getDeduplicationJobId('k1'), a.id, 'getDeduplicationJobId');
  await waitFor(() => dups.includes(a.id), 5000, 'duplicated event');

  // ttl: the key lapses, then a new job is made.
  const t1 = await q.add('d', { v: 1 }, { deduplication: { id: 'k2', ttl: 300 } });
  eq((await q.add('d', { v: 2 }, { deduplication: { id: 'k2', ttl: 300 } })).id, t1.id, 'within ttl');
  await sleep(450);
  const t3 = await q.add('d', { v: 3 }, { deduplication: { id: 'k2', ttl: 300 } });
  check(t3.id !== t1.id, 'after the ttl a new job is made');

  // extend: the key's ttl restarts and the holder is returned.
  const e1 = await q.add('d', { v: 1 }, { deduplication: { id: 'k3', ttl: 400, extend: true } });
  await sleep(250);
  eq((await q.add('d', { v: 2 }, { deduplication: { id: 'k3', ttl: 400, extend: true } })).id, e1.id, 'extend returns the holder');
  await sleep(250); // 500 ms after the first add, 250 after the extension
  eq((await q.add('d', { v: 3 }, { deduplication: { id: 'k3', ttl: 400, extend: true } })).id, e1.id, 'still held thanks to the extension');

  // replace: the waiting holder is replaced by the new job.
  const r1 = await q.add('d', { v: 1 }, { deduplication: { id: 'k4', replace: true } });
  const r2 = await q.add('d', { v: 2 }, { deduplication: { id: 'k4', replace: true } });
  check(r2.id !== r1.id, 'replace makes a new job');
  eq(await q.getJobState(r1.id), 'unknown', 'the replaced job is gone');
  eq((await q.getJob(r2.id))!.data, { v: 2 }, 'the new job holds the key');

  // The key is released when the job completes.
  eq(await q.removeDeduplicationKey('k1'), 1, 'removeDeduplicationKey');
  const again = await q.add('d', { v: 9 }, { deduplication: { id: 'k1' } });
  check(again.id !== a.id, 'a removed key admits a new job');
  const w = new Worker(name, async (j) => j.data, { connection: conn });
  await waitFor(async () => (await q.getJobCountsAsync()).completed >= 6, 10000, 'all six jobs done');
  await w.close();
  const after = await q.add('d', { v: 10 }, { deduplication: { id: 'k1' } });
  check(after.id !== again.id, 'completion releases the key');
  await events.close();
  await q.obliterateAsync();
  await q.close();
});
