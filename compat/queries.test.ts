// getJob, getJobState, getJobCounts and getJobs across every state.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq, waitFor } from './lib';

await main('queries', async () => {
  const name = uniq('query');
  const q = new Queue(name, { connection: conn });
  // done: completes; bad: fails for good; held: active when we look;
  // later: delayed; prio: prioritized; plain: waiting.
  const done = await q.add('done', { k: 'done' }, { priority: 100 });
  const bad = await q.add('bad', { k: 'bad' }, { priority: 90, attempts: 1 });
  const held = await q.add('held', { k: 'held' }, { priority: 80 });
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  let n = 0;
  const w = new Worker(name, async (j) => {
    n++;
    if (j.name === 'bad') throw new Error('bad job');
    if (j.name === 'held') await gate;
    return 'r-' + j.name;
  }, { connection: conn, concurrency: 1 });
  w.on('error', () => {});
  await waitFor(async () => (await q.getJobState(held.id)) === 'active', 10000, 'held job active');
  const later = await q.add('later', { k: 'later' }, { delay: 60000 });
  const prio = await q.add('prio', { k: 'prio' }, { priority: 3 });
  const plain = await q.add('plain', { k: 'plain' });

  eq(await q.getJobState(done.id), 'completed', 'completed state');
  eq(await q.getJobState(bad.id), 'failed', 'failed state');
  eq(await q.getJobState(held.id), 'active', 'active state');
  eq(await q.getJobState(later.id), 'delayed', 'delayed state');
  eq(await q.getJobState(prio.id), 'prioritized', 'prioritized state');
  eq(await q.getJobState(plain.id), 'waiting', 'waiting state');
  eq(await q.getJobState('missing-id'), 'unknown', 'unknown state');

  const c = await q.getJobCountsAsync();
  eq([c.waiting, c.prioritized, c.delayed, c.active, c.completed, c.failed], [1, 1, 1, 1, 1, 1], 'counts');
  eq(await q.countAsync(), 3, 'count of waiting, prioritized and delayed');

  const names = async (opts: any) => (await q.getJobsAsync(opts)).map((j: any) => j.name).sort();
  eq(await names({ state: 'waiting' }), ['plain'], 'getJobs waiting');
  eq(await names({ state: 'delayed' }), ['later'], 'getJobs delayed');
  eq(await names({ state: 'active' }), ['held'], 'getJobs active');
  eq(await names({ state: 'completed' }), ['done'], 'getJobs completed');
  eq(await names({ state: 'failed' }), ['bad'], 'getJobs failed');
  eq(await names({ state: ['waiting', 'prioritized'] }), ['plain', 'prio'], 'getJobs several states');
  eq((await names({})).length, 6, 'getJobs without a state lists all');
  const page = await q.getJobsAsync({ state: ['waiting', 'prioritized', 'delayed'], start: 0, end: 2, asc: true });
  eq(page.map((j: any) => j.name), ['later', 'prio'], 'getJobs page, oldest first');

  const d = await q.getJob(done.id);
  eq([d!.name, d!.returnvalue, d!.data], ['done', 'r-done', { k: 'done' }], 'completed job read back');
  const b = await q.getJob(bad.id);
  eq(b!.failedReason, 'bad job', 'failed job reason');
  eq(await q.getJob('missing-id'), null, 'missing job');

  release();
  await waitFor(async () => (await q.getJobState(plain.id)) === 'completed', 10000, 'rest processed');
  await w.close();
  check(n >= 5, 'worker ran the jobs');
  await q.obliterateAsync();
  await q.close();
});
