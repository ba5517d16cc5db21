// The dashboard's live events, by category, as a bunqueue dashboard hears
// them: a WebSocket on /ws subscribed to "*", while the official client
// and the HTTP API do what causes each event.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq, sleep, waitFor } from './lib';

const http = `http://127.0.0.1:${process.env.QUEUED_HTTP_PORT}`;

type Ev = { event: string; ts: number; data: any };

async function api(method: string, path: string, body?: unknown): Promise<any> {
  const res = await fetch(http + path, {
    method,
    headers: body === undefined ? {} : { 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const out = await res.json();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(out)}`);
  return out;
}

await main('live-catalog', async () => {
  const seen: Ev[] = [];
  const ws = new WebSocket(`ws://127.0.0.1:${process.env.QUEUED_HTTP_PORT}/ws`);
  await new Promise<void>((ok, bad) => { ws.onopen = () => ok(); ws.onerror = (e) => bad(e); });
  const subscribed = new Promise<any>((ok) => {
    ws.onmessage = (m) => {
      const v = JSON.parse(String(m.data));
      if (v.reqId === 'sub') ok(v);
      else if (v.event) seen.push(v);
    };
  });
  ws.send(JSON.stringify({ cmd: 'Subscribe', events: ['*'], reqId: 'sub' }));
  eq((await subscribed).subscribed, ['*'], 'Subscribe answer');

  // Waits for an event named name whose data has the given fields.
  const want = (name: string, fields: Record<string, unknown> = {}) =>
    waitFor(() => seen.find((e) => e.event === name &&
      Object.entries(fields).every(([k, v]) => JSON.stringify(e.data?.[k]) === JSON.stringify(v))),
    15000, `${name} ${JSON.stringify(fields)} (seen: ${[...new Set(seen.map((e) => e.event))].join(' ')})`);

  const name = uniq('cat');
  const q = new Queue(name, { connection: conn });

  // queue:*
  await q.pauseAsync();
  await want('queue:paused', { queue: name });
  await q.resumeAsync();
  await want('queue:resumed', { queue: name });
  await q.add('a', {});
  await want('queue:created', { queue: name });
  await q.add('b', {});
  await q.drainAsync();
  await want('queue:drained', { queue: name, count: 2 });

  // job:* moved by hand
  const later = await q.add('later', { v: 1 }, { delay: 60000 });
  await q.changeJobDelay(later.id, 30000);
  await want('job:delay-changed', { jobId: later.id, newDelay: 30000 });
  await q.changeJobPriority(later.id, { priority: 4 });
  await want('job:priority-changed', { jobId: later.id, newPriority: 4 });
  await q.updateJobData(later.id, { v: 2 });
  await want('job:data-updated', { jobId: later.id });
  await q.promoteJob(later.id);
  await want('job:promoted', { jobId: later.id });

  // worker:* and job:* from a Worker through the official client; a job
  // given up lands in the DLQ.
  const w = new Worker(name, async (job) => {
    if (job.name === 'doomed') throw new Error('no');
    return 'ok';
  }, { connection: conn, concurrency: 2 });
  w.on('error', () => {});
  await want('worker:connected', { queues: [name] });
  const doomed = await q.add('doomed', {}, { attempts: 1 });
  await want('dlq:added', { queue: name, jobId: doomed.id });
  await want('job:completed', { jobId: later.id });
  await w.close();
  await want('worker:disconnected');

  // dlq:*
  await q.retryDlqAsync(doomed.id);
  await want('dlq:retried', { queue: name, jobId: doomed.id, count: 1 });
  await q.drainAsync();

  // ratelimit:* and concurrency:*, over the HTTP API too.
  await q.setGlobalRateLimitAsync(10, 1000);
  await want('ratelimit:set', { queue: name, max: 10 });
  await q.removeGlobalRateLimitAsync();
  await want('ratelimit:cleared', { queue: name });
  await api('PUT', `/queues/${name}/concurrency`, { limit: 3 });
  await want('concurrency:set', { queue: name, concurrency: 3 });
  await api('DELETE', `/queues/${name}/concurrency`);
  await want('concurrency:cleared', { queue: name });

  // config:*
  await q.setStallConfigAsync({ maxStalls: 5 });
  await want('config:stall-changed', { queue: name });
  await q.setDlqConfigAsync({ maxEntries: 50 });
  await want('config:dlq-changed', { queue: name });

  // cron:*
  const cron = uniq('cron');
  await q.upsertJobScheduler(cron, { every: 60000 }, { name: 'tick', data: {} });
  await want('cron:created', { name: cron, queue: name, every: 60000 });
  await q.removeJobScheduler(cron);
  await want('cron:deleted', { name: cron });

  // webhook:*, over the HTTP API.
  const hook = await api('POST', '/webhooks', { url: 'https://example.invalid/hook', events: ['job.completed'] });
  const hookId = hook.data?.webhookId ?? hook.webhookId;
  check(typeof hookId === 'string', `webhook id in ${JSON.stringify(hook)}`);
  await want('webhook:added', { id: hookId });
  await api('DELETE', `/webhooks/${hookId}`);
  await want('webhook:removed', { id: hookId });

  // batch:*
  await q.addBulk([{ name: 'x', data: {} }, { name: 'y', data: {} }, { name: 'z', data: {} }]);
  await want('batch:pushed', { queue: name, total: 3, inserted: 3, duplicates: 0 });

  // queue:cleaned and queue:obliterated, queue:removed
  await sleep(5);
  const cleaned = await q.cleanAsync(0, 100, 'wait');
  check(cleaned.length === 3, `clean removed ${cleaned.length}`);
  await want('queue:cleaned', { queue: name, count: 3 });
  await q.obliterateAsync();
  await want('queue:obliterated', { queue: name });
  await want('queue:removed', { queue: name });

  // The periodic figures and per-queue counts reach a subscriber too.
  await want('queue:counts');
  await want('stats:snapshot');

  await q.close();
  ws.close();
}, 90000);
