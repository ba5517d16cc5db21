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

  // ttl and extend depend on when the server saw each add. Each round
  // notes when its adds were sent and answered; a round the machine
  // slowed down so much that it cannot tell (an add "within" the ttl
  // answered after the ttl ran out) is run again with a new key, up to
  // five times, instead of failing or passing by chance.
  const rounds = async (what: string, round: (key: string) => Promise<boolean>) => {
    for (let i = 0; i < 5; i++) {
      if (await round(`${what}-${i}`)) return;
      console.log(`${what}: round ${i} too slow to tell, again`);
    }
    throw new Error(`${what}: five rounds too slow to tell`);
  };
  const timedAdd = async (v: number, dedup: any) => {
    const sent = Date.now();
    const job = await q.add('d', { v }, { deduplication: dedup });
    return { id: job.id, sent, answered: Date.now() };
  };

  // ttl: the key lapses, then a new job is made.
  await rounds('ttl', async (key) => {
    const t1 = await timedAdd(1, { id: key, ttl: 300 });
    const t2 = await timedAdd(2, { id: key, ttl: 300 });
    if (t2.answered - t1.sent >= 300) return false;
    eq(t2.id, t1.id, 'within ttl');
    await sleep(450 - (Date.now() - t1.answered));
    const t3 = await timedAdd(3, { id: key, ttl: 300 });
    check(t3.id !== t1.id, 'after the ttl a new job is made');
    return true;
  });

  // extend: the key's ttl restarts and the holder is returned.
  await rounds('extend', async (key) => {
    const e1 = await timedAdd(1, { id: key, ttl: 400, extend: true });
    await sleep(250);
    const e2 = await timedAdd(2, { id: key, ttl: 400, extend: true });
    if (e2.answered - e1.sent >= 400) return false;
    eq(e2.id, e1.id, 'extend returns the holder');
    // Past the first add's ttl, within the extension's.
    await sleep(Math.max(0, e1.answered + 400 + 50 - Date.now()));
    const e3 = await timedAdd(3, { id: key, ttl: 400, extend: true });
    if (e3.answered - e2.sent >= 400) return false;
    eq(e3.id, e1.id, 'still held thanks to the extension');
    return true;
  });

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
  // Six jobs at least (more when a timing round ran again), all done.
  await waitFor(async () => {
    const c = await q.getJobCountsAsync();
    return c.completed >= 6 && c.waiting + c.active + c.delayed + (c.prioritized ?? 0) === 0;
  }, 10000, 'all jobs done');
  await w.close();
  const after = await q.add('d', { v: 10 }, { deduplication: { id: 'k1' } });
  check(after.id !== again.id, 'completion releases the key');
  await events.close();
  await q.obliterateAsync();
  await q.close();
});
