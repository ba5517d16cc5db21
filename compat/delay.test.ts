// A delayed job stays delayed until its time, then runs; jobs added later
// without a delay are not held up by it.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq, waitFor } from './lib';

await main('delay', async () => {
  const name = uniq('delay');
  const q = new Queue(name, { connection: conn });
  const t0 = Date.now();
  const late = await q.add('late', {}, { delay: 800 });
  const now = await q.add('now', {}, {});
  eq(await q.getJobState(late.id), 'delayed', 'state of the delayed job');
  eq((await q.getJobCountsAsync()).delayed, 1, 'delayed count');
  const ran = new Map<string, number>();
  const w = new Worker(name, async (j) => { ran.set(j.name, Date.now()); }, { connection: conn });
  await waitFor(() => ran.size === 2, 10000, 'both jobs ran');
  await w.close();
  check(ran.get('now')! < ran.get('late')!, 'the undelayed job ran first');
  // The clocks are the client's and the server's: allow for their skew.
  check(ran.get('late')! - t0 >= 750, `delayed job ran ${ran.get('late')! - t0} ms after add, before its delay`);
  eq(await q.getJobState(late.id), 'completed', 'delayed job completed');
  check(now.id !== late.id, 'distinct ids');
  await q.obliterateAsync();
  await q.close();
});
