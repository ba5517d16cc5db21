// Progress and logs from inside a job reach the server, QueueEvents
// subscribers, and later readers.
import { Queue, Worker, QueueEvents } from 'bunqueue/client';
import { conn, uniq, main, check, eq, waitFor } from './lib';

await main('progress', async () => {
  const name = uniq('prog');
  const q = new Queue(name, { connection: conn });
  const events = new QueueEvents(name, { connection: conn });
  await events.waitUntilReady?.();
  const seen: any[] = [];
  events.on('progress', (e: any) => seen.push(['progress', e.data]));
  events.on('completed', (e: any) => seen.push(['completed', e.returnvalue]));
  events.on('active', () => seen.push(['active']));
  const job = await q.add('p', {});
  const w = new Worker(name, async (j) => {
    await j.updateProgress(50);
    await j.log('half way');
    await j.updateProgress(100);
    await j.log('done');
    return 'fin';
  }, { connection: conn });
  await waitFor(() => seen.some((e) => e[0] === 'completed'), 10000, 'completed event');
  await w.close();
  eq(seen, [['active'], ['progress', 50], ['progress', 100], ['completed', 'fin']], 'events in order');
  const logs = await q.getJobLogs(job.id);
  eq(logs.count, 2, 'log count');
  check(logs.logs.some((l: string) => l.includes('half way')), 'log line kept');
  const got = await q.getJob(job.id);
  eq(got!.progress, 100, 'final progress');
  await events.close();
  await q.obliterateAsync();
  await q.close();
});
