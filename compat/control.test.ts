// Moving jobs by hand: promote, change delay and priority, update data,
// remove, retry, clean, and retry completed.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq, waitFor } from './lib';

await main('control', async () => {
  const name = uniq('control');
  const q = new Queue(name, { connection: conn });
  const d = await q.add('d', { v: 1 }, { delay: 60000 });
  eq(await q.getJobState(d.id), 'delayed', 'delayed at first');
  await q.promoteJob(d.id);
  await waitFor(async () => (await q.getJobState(d.id)) === 'waiting', 2000, 'promoted');
  await q.changeJobDelay(d.id, 60000);
  await waitFor(async () => (await q.getJobState(d.id)) === 'delayed', 2000, 'delayed again');
  eq(await q.promoteJobs({ count: 10 }), 1, 'promoteJobs count');
  await q.changeJobPriority(d.id, { priority: 7 });
  await waitFor(async () => (await q.getJobState(d.id)) === 'prioritized', 2000, 'prioritized');
  await q.updateJobData(d.id, { v: 2 });
  eq((await q.getJob(d.id))!.data, { v: 2 }, 'data updated');

  const gone = await q.add('x', {});
  await q.removeAsync(gone.id);
  await waitFor(async () => (await q.getJobState(gone.id)) === 'unknown', 2000, 'removed');

  const bad = await q.add('bad', {}, { attempts: 1 });
  const w = new Worker(name, async (j) => { if (j.name === 'bad') throw new Error('nope'); return j.name; }, { connection: conn });
  w.on('error', () => {});
  await waitFor(async () => (await q.getJobState(bad.id)) === 'failed', 5000, 'bad failed');
  await waitFor(async () => (await q.getJobState(d.id)) === 'completed', 5000, 'd completed');
  await w.close();
  await q.retryJob(bad.id);
  eq(await q.getJobState(bad.id), 'waiting', 'retried from failed');

  // clean: waiting jobs older than the grace period.
  const ids = await q.cleanAsync(0, 100, 'waiting');
  check(ids.includes(bad.id), 'clean removed the waiting job');
  eq(await q.getJobState(bad.id), 'unknown', 'cleaned job gone');

  // retryCompleted puts the completed job back.
  eq(await q.retryCompletedAsync(d.id), 1, "retryCompleted");
  eq(await q.getJobState(d.id), 'prioritized', 'completed job waits again');
  await q.obliterateAsync();
  await q.close();
});
