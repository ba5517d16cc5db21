// Dependencies, parent links and repeat through the official client's
// Queue.add options: a job waits for the job it depends on, a parent for
// the child linked to it (and sees its value), and a repeatable job runs
// as many times as its limit says.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq, waitFor, sleep } from './lib';

await main('depends', async () => {
  const name = uniq('deps');
  const q = new Queue(name, { connection: conn });
  const a = await q.add('a', { n: 1 });
  const b = await q.add('b', { n: 2 }, { dependsOn: [a.id] } as any);
  eq(await q.getJobState(b.id), 'waiting-children', 'a job waits for its dependency');
  const parent = await q.add('parent', { p: 1 });
  const child = await q.add('child', { c: 1 }, { parent: { id: parent.id, queue: name } } as any);
  eq(await q.getJobState(parent.id), 'waiting-children', 'a parent waits for its linked child');

  const order: string[] = [];
  let seen: any = null;
  const w = new Worker(name, async (j: any) => {
    order.push(j.name);
    if (j.name === 'parent') seen = await j.getChildrenValues();
    return 'r-' + j.name;
  }, { connection: conn });
  await waitFor(async () => (await q.getJobState(parent.id)) === 'completed' && (await q.getJobState(b.id)) === 'completed',
    15000, 'the dependent and the parent completed');
  await w.close();
  check(order.indexOf('a') < order.indexOf('b'), `dependency first: ${order}`);
  check(order.indexOf('child') < order.indexOf('parent'), `child first: ${order}`);
  eq(seen, { [`${name}:${child.id}`]: 'r-child' }, 'the parent sees its child\'s value');

  const rname = uniq('rep');
  const r = new Queue(rname, { connection: conn });
  await r.add('tick', { t: 1 }, { repeat: { every: 100, limit: 3 } } as any);
  let runs = 0;
  const rw = new Worker(rname, async () => { runs++; }, { connection: conn });
  await waitFor(() => runs >= 3, 15000, 'three runs');
  await sleep(600); // six periods more: a fourth run would have come
  await rw.close();
  eq(runs, 3, 'runs of a job repeating with a limit of 3');
  eq((await r.getJobCountsAsync()).completed, 3, 'completed runs');

  await q.obliterateAsync(); await r.obliterateAsync();
  await q.close(); await r.close();
}, 60000);
