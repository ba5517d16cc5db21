// An UnrecoverableError fails the job at once, whatever attempts are left.
import { Queue, Worker, UnrecoverableError } from 'bunqueue/client';
import { conn, uniq, main, eq, waitFor } from './lib';

await main('unrecoverable', async () => {
  const name = uniq('unrec');
  const q = new Queue(name, { connection: conn });
  const job = await q.add('fatal', {}, { attempts: 5, backoff: 100 });
  let runs = 0;
  const w = new Worker(name, async () => { runs++; throw new UnrecoverableError('fatal thing'); }, { connection: conn });
  w.on('error', () => {});
  await waitFor(async () => (await q.getJobState(job.id)) === 'failed', 10000, 'job failed');
  await new Promise((r) => setTimeout(r, 300));
  await w.close();
  eq(runs, 1, 'processed once');
  const got = await q.getJob(job.id);
  eq(got!.attemptsMade, 1, 'attemptsMade');
  eq(got!.failedReason, 'fatal thing', 'failedReason');
  await q.obliterateAsync();
  await q.close();
});
