// Every lifecycle event reaches QueueEvents, in order per job.
import { Queue, Worker, QueueEvents, DelayedError } from 'bunqueue/client';
import { conn, uniq, main, eq, sleep, waitFor } from './lib';

await main('events', async () => {
  const name = uniq('events');
  const q = new Queue(name, { connection: conn });
  const ev = new QueueEvents(name, { connection: conn });
  await ev.waitUntilReady?.();
  const log: [string, string][] = [];
  for (const t of ['waiting', 'active', 'progress', 'completed', 'failed', 'retried', 'delayed', 'removed', 'duplicated', 'stalled']) {
    ev.on(t, (e: any) => log.push([t, e.jobId]));
  }
  ev.on('paused', () => log.push(['paused', '']));
  ev.on('resumed', () => log.push(['resumed', '']));
  const of = (id: string) => log.filter((e) => e[1] === id).map((e) => e[0]);

  await q.pauseAsync();
  await q.resumeAsync();
  const ok = await q.add('ok', {});
  const flaky = await q.add('flaky', {}, { attempts: 2, backoff: { type: 'fixed', delay: 50 } });
  const later = await q.add('later', {});
  const doomed = await q.add('doomed', { x: 1 }, { delay: 60000 });
  const d1 = await q.add('dup', {}, { deduplication: { id: 'same' } });
  await q.add('dup', {}, { deduplication: { id: 'same' } });
  await q.removeAsync(doomed.id);
  await q.removeAsync(d1.id);
  let flakyRuns = 0, laterRuns = 0;
  const w = new Worker(name, async (j) => {
    if (j.name === 'ok') { await j.updateProgress(40); return 'done'; }
    if (j.name === 'flaky' && flakyRuns++ === 0) throw new Error('once');
    if (j.name === 'later' && laterRuns++ === 0) throw new DelayedError();
    return 'fine';
  }, { connection: conn });
  w.on('error', () => {});
  await waitFor(async () => (await q.getJobCountsAsync()).completed === 3, 10000, 'three completed');
  await w.close();
  // A job whose worker stops renewing its lock stalls.
  const stuck = await q.add('stuck', {});
  const w2 = new Worker(name, async () => { await sleep(2000); }, { connection: conn, lockDuration: 300, skipLockRenewal: true, heartbeatInterval: 0 });
  w2.on('error', () => {});
  await waitFor(() => of(stuck.id).includes('stalled'), 6000, 'stalled event');
  await w2.close(true);
  await sleep(200);

  eq(log.slice(0, 2).map((e) => e[0]), ['paused', 'resumed'], 'queue events first');
  eq(of(ok.id), ['waiting', 'active', 'progress', 'completed'], 'ok job');
  eq(of(flaky.id), ['waiting', 'active', 'failed', 'retried', 'active', 'completed'], 'flaky job');
  eq(of(later.id), ['waiting', 'active', 'delayed', 'active', 'completed'], 'delayed job');
  eq(of(doomed.id), ['waiting', 'removed'], 'removed job');
  eq(of(d1.id), ['waiting', 'duplicated', 'removed'], 'duplicated job');
  eq(of(stuck.id).slice(0, 3), ['waiting', 'active', 'stalled'], 'stalled job');
  await ev.close();
  await q.obliterateAsync();
  await q.close();
});
