// add() and a Worker completing the job with a result; the job and its
// result read back exactly, data types intact.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq } from './lib';

await main('basic', async () => {
  const name = uniq('basic');
  const q = new Queue(name, { connection: conn });
  const data = { s: 'héllo ✓', n: 42, neg: -7, f: 1.5, big: 1700000000123, nul: null, arr: [1, 'a', null, true], nested: { deep: { x: [] } } };
  const job = await q.add('greet', data);
  check(typeof job.id === 'string' && job.id.length > 0, 'add returns a string id');
  eq(await q.getJobState(job.id), 'waiting', 'state after add');

  const done = new Promise<any>((resolve, reject) => {
    const w = new Worker(name, async (j) => {
      eq(j.name, 'greet', 'worker sees the name');
      eq(j.data, data, 'worker sees the data');
      eq(j.attemptsMade, 0, 'first attempt');
      return { doubled: (j.data as any).n * 2, at: 'done' };
    }, { connection: conn });
    w.on('completed', (j: any, r: any) => resolve({ w, j, r }));
    w.on('failed', (_j: any, e: any) => reject(e));
  });
  const { w, j, r } = await done;
  eq(j.id, job.id, 'completed job id');
  eq(r, { doubled: 84, at: 'done' }, 'result seen by the worker');
  await w.close();

  const got = await q.getJob(job.id);
  check(got, 'getJob finds the completed job');
  eq(got!.returnvalue, { doubled: 84, at: 'done' }, 'returnvalue read back');
  eq(got!.data, data, 'data read back');
  check(typeof got!.finishedOn === 'number' && typeof got!.processedOn === 'number', 'processedOn and finishedOn are numbers');
  eq(await q.getJobState(job.id), 'completed', 'state after completion');
  eq(await q.getJob('no-such-job'), null, 'getJob of a missing id');
  await q.obliterateAsync();
  await q.close();
});
