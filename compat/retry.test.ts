// Retries with backoff, then failed after maxAttempts, with the last error
// and stack kept.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq, waitFor } from './lib';

await main('retry', async () => {
  const name = uniq('retry');
  const q = new Queue(name, { connection: conn });
  const job = await q.add('flaky', { x: 1 }, { attempts: 3, backoff: { type: 'fixed', delay: 300 } });
  const starts: number[] = [];
  let failedEvents = 0;
  const w = new Worker(name, async () => {
    starts.push(Date.now());
    throw new Error('boom ' + (starts.length - 1));
  }, { connection: conn });
  w.on('failed', () => { failedEvents++; });
  w.on('error', () => {});
  await waitFor(async () => (await q.getJobState(job.id)) === 'failed', 15000, 'job failed for good');
  await w.close();
  eq(starts.length, 3, 'attempts made');
  eq(failedEvents, 3, 'failed events');
  for (let i = 1; i < starts.length; i++) {
    // fixed backoff of 300 ms with the reference's ±20% jitter
    check(starts[i] - starts[i - 1] >= 200, `gap ${i} was ${starts[i] - starts[i - 1]} ms, under the backoff`);
  }
  const got = await q.getJob(job.id);
  eq(got!.attemptsMade, 3, 'attemptsMade');
  eq(got!.failedReason, 'boom 2', 'failedReason is the last error');
  check(Array.isArray(got!.stacktrace) && got!.stacktrace!.length > 0, 'stacktrace kept');
  const counts = await q.getJobCountsAsync();
  eq([counts.failed, counts.waiting, counts.delayed], [1, 0, 0], 'counts after failing');
  const dlq = await q.getDlqAsync();
  eq(dlq.length, 1, 'one DLQ entry');
  eq(dlq[0].reason, 'max_attempts_exceeded', 'DLQ reason');
  await q.obliterateAsync();
  await q.close();
});
