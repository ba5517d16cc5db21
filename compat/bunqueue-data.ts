// Data for the migration from bunqueue (migrate_bunqueue_test.go), made and
// read through the official client so that the same script runs against
// the reference and against queued:
//
//   bun run bunqueue-data.ts make IDS      fills a server with every kind of
//                                          state and writes the ids to IDS;
//                                          it prints "ready" and keeps one
//                                          job active until it is killed
//   bun run bunqueue-data.ts snapshot IDS  prints, as JSON, what a client
//                                          sees of that data
//   bun run bunqueue-data.ts finish IDS    works off everything that can run
//                                          and checks that it did, flows
//                                          included
import { Queue, Worker, FlowProducer } from 'bunqueue/client';
import { conn, check, eq, sleep, waitFor } from './lib';

const [mode, idsFile] = process.argv.slice(2);
const Q = {
  jobs: 'mig-jobs', flow: 'mig-flow', group: 'mig-group', paused: 'mig-paused',
  limits: 'mig-limits', active: 'mig-active', dlq: 'mig-dlq',
};
const queues = Object.values(Q);
const q = (name: string) => new Queue(name, { connection: conn });
const hour = 3600_000;

async function make() {
  const ids: Record<string, string> = {};
  const jobs = q(Q.jobs);
  ids.plain = (await jobs.add('plain', { a: 1, nested: { list: [1, 'two', null] } })).id;
  ids.nulldata = (await jobs.add('nulldata', null as any)).id;
  ids.prio = (await jobs.add('prio', { p: 7 }, { priority: 7 })).id;
  ids.lifo = (await jobs.add('lifo', 'a string', { lifo: true } as any)).id;
  ids.custom = (await jobs.add('custom', { c: 1 }, { jobId: 'mig-custom-1', attempts: 5, backoff: 2500, timeout: 60000 } as any)).id;
  ids.delayed = (await jobs.add('delayed', { d: 1 }, { delay: 2 * hour })).id;
  ids.dedup = (await jobs.add('dedup', { k: 1 }, { deduplication: { id: 'mig-key', ttl: 6 * hour } } as any)).id;

  // Completed with a result, progress and logs; failed once and waiting
  // for its retry; failed for good (in the DLQ).
  const done = q(Q.dlq);
  ids.done = (await done.add('done', { n: 1 })).id;
  ids.retrying = (await done.add('retrying', { n: 2 }, { attempts: 3, backoff: 2 * hour })).id;
  ids.dead = (await done.add('dead', { n: 3 }, { attempts: 1 })).id;
  let seen = 0;
  const w = new Worker(Q.dlq, async (j: any) => {
    seen++;
    if (j.name === 'done') {
      await j.updateProgress(60);
      await j.log('half way');
      await j.log('nearly there');
      return { answer: 42, list: ['x', 'y'] };
    }
    throw new Error('broke: ' + j.name);
  }, { connection: conn, concurrency: 3 });
  await waitFor(async () => (await done.getJobState(ids.dead)) === 'failed'
    && (await done.getJobState(ids.done)) === 'completed'
    && (await done.getJobState(ids.retrying)) === 'delayed', 15000, 'done, dead and retrying settled');
  await w.close();
  check(seen === 3, `the worker ran 3 jobs, ran ${seen}`);

  // A flow whose parent waits on two children, one of them done.
  const fp = new FlowProducer({ connection: conn } as any);
  const tree: any = await fp.add({
    name: 'parent', queueName: Q.flow, data: { root: true }, children: [
      { name: 'child-done', queueName: Q.flow, data: { c: 1 } },
      { name: 'child-waits', queueName: Q.flow, data: { c: 2 }, opts: { delay: hour } },
    ],
  } as any);
  ids.parent = tree.job.id;
  ids.childDone = tree.children[0].job.id;
  ids.childWaits = tree.children[1].job.id;
  const fw = new Worker(Q.flow, async (j: any) => 'child result ' + j.name, { connection: conn });
  await waitFor(async () => (await q(Q.flow).getJobState(ids.childDone)) === 'completed', 15000, 'first child done');
  await fw.close();

  // Groups, a paused queue and queue settings.
  const g = q(Q.group);
  ids.g1 = (await g.add('g1', { g: 1 }, { group: { id: 'tenant-a' } } as any)).id;
  ids.g2 = (await g.add('g2', { g: 2 }, { group: { id: 'tenant-b' } } as any)).id;
  const paused = q(Q.paused);
  ids.pausedJob = (await paused.add('held', { h: 1 })).id;
  await paused.pauseAsync();
  const limits = q(Q.limits);
  await limits.setGlobalRateLimitAsync(20, 1000);
  await limits.setGlobalConcurrencyAsync(3);
  await limits.setStallConfigAsync({ stallInterval: 45000, maxStalls: 4 } as any);
  await limits.setDlqConfigAsync({ maxEntries: 500 } as any);
  ids.limited = (await limits.add('limited', { l: 1 })).id;

  // Cron schedules.
  await jobs.upsertJobScheduler('mig-every', { every: hour }, { name: 'tick', data: { t: 1 } });
  await jobs.upsertJobScheduler('mig-pattern', { pattern: '0 3 * * *' }, { name: 'nightly', data: { t: 2 } });

  // A job held by a worker when the server dies: it comes back waiting.
  const active = q(Q.active);
  ids.active = (await active.add('held', { a: 1 })).id;
  const aw = new Worker(Q.active, async () => { await sleep(10 * hour); }, { connection: conn, lockDuration: hour } as any);
  await waitFor(async () => (await active.getJobState(ids.active)) === 'active', 15000, 'job active');
  await Bun.write(idsFile, JSON.stringify(ids, null, 1));
  await sleep(1500); // the reference's write buffer flushes
  console.log('ready');
  void aw;
  await sleep(10 * hour);
}

/** What a client sees of the data, in a form both servers can be compared by. */
async function snapshot() {
  const ids: Record<string, string> = JSON.parse(await Bun.file(idsFile).text());
  const out: any = { counts: {}, jobs: {}, queues: {} };
  for (const name of queues) {
    const c: any = await q(name).getJobCountsAsync();
    out.counts[name] = c;
  }
  for (const [key, id] of Object.entries(ids)) {
    let job: any = null;
    for (const name of queues) {
      job = await q(name).getJob(id);
      if (job) break;
    }
    if (!job) { out.jobs[key] = null; continue; }
    const jq = q(job.queueName);
    out.jobs[key] = {
      id: job.id, queue: job.queueName, name: job.name, data: job.data,
      state: await jq.getJobState(id), priority: job.priority, attemptsMade: job.attemptsMade,
      progress: job.progress, returnvalue: job.returnvalue ?? null, failedReason: job.failedReason ?? null,
      timestamp: job.timestamp, delay: job.delay, parent: job.parentKey ?? job.parent?.id ?? null,
      attempts: job.opts?.attempts, backoff: job.opts?.backoff, jobId: job.opts?.jobId ?? null,
      logs: (await jq.getJobLogs(id)).logs,
    };
  }
  out.dedup = await (q(Q.jobs) as any).getDeduplicationJobId('mig-key');
  const dlq: any[] = await (q(Q.dlq) as any).getDlqAsync();
  out.dlq = dlq.map((e: any) => ({ id: e.job?.id ?? e.id, reason: e.reason, error: e.error }));
  const sched: any[] = await (q(Q.jobs) as any).getJobSchedulers();
  out.crons = sched.map((s: any) => ({ key: s.key ?? s.id ?? s.name, every: s.every ?? null, pattern: s.pattern ?? null, next: s.next }))
    .sort((a: any, b: any) => String(a.key).localeCompare(String(b.key)));
  for (const name of queues) {
    const x: any = q(name);
    out.queues[name] = {
      paused: await x.isPausedAsync(),
      rate: await x.getGlobalRateLimit(),
      concurrency: await x.getGlobalConcurrency(),
      stall: await x.getStallConfigAsync(),
      dlq: await x.getDlqConfigAsync(),
    };
  }
  // The same through the HTTP API.
  const http = `http://127.0.0.1:${process.env.QUEUED_HTTP_PORT}`;
  const get = async (path: string) => (await fetch(http + path)).json();
  out.http = { counts: {}, jobs: {} };
  for (const name of queues) out.http.counts[name] = await get(`/queues/${name}/counts`);
  for (const key of ['plain', 'done', 'dead', 'parent', 'custom', 'retrying']) {
    out.http.jobs[key] = { state: await get(`/jobs/${ids[key]}/state`), result: await get(`/jobs/${ids[key]}/result`) };
  }
  out.http.crons = ((await get('/crons')).crons ?? []).map((c: any) => [c.name, c.nextRun, c.repeatEvery, c.schedule]).sort();
  console.log(JSON.stringify(out));
  process.exit(0);
}

/** Works off the migrated data: every job that can run does, flows included. */
async function finish() {
  const ids: Record<string, string> = JSON.parse(await Bun.file(idsFile).text());
  await q(Q.paused).resumeAsync();
  await q(Q.jobs).promoteJobs?.();
  const ran: string[] = [];
  const workers = [Q.jobs, Q.flow, Q.group, Q.paused, Q.limits, Q.active].map((name) =>
    new Worker(name, async (j: any) => { ran.push(j.name); return 'finished ' + j.name; }, { connection: conn, concurrency: 4 }));
  // The delayed ones are due in hours: promote them.
  for (const key of ['delayed', 'childWaits']) {
    const job: any = await q(key === 'delayed' ? Q.jobs : Q.flow).getJob(ids[key]);
    await job.promote();
  }
  for (const key of ['plain', 'nulldata', 'prio', 'lifo', 'custom', 'delayed', 'dedup', 'childWaits', 'parent', 'g1', 'g2', 'pausedJob', 'limited', 'active']) {
    let name = '';
    await waitFor(async () => {
      for (const n of queues) {
        const st = await q(n).getJobState(ids[key]);
        if (st !== 'unknown') { name = st; break; }
      }
      return name === 'completed';
    }, 20000, `${key} completed (last seen ${name})`);
  }
  const parent: any = await q(Q.flow).getJob(ids.parent);
  const values = await parent.getChildrenValues();
  eq(Object.values(values).sort(), ['child result child-done', 'finished child-waits'], 'the parent saw both children\'s results');
  await Promise.all(workers.map((w) => w.close()));
  console.log('finished ' + ran.length);
  process.exit(0);
}

const body = { make, snapshot, finish }[mode as 'make'];
if (!body || !idsFile) {
  console.error('usage: bun run bunqueue-data.ts make|snapshot|finish IDS');
  process.exit(2);
}
await body().catch((e) => { console.error(e instanceof Error ? e.stack : String(e)); process.exit(1); });
