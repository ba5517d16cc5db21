// Flows through the official FlowProducer: a three-level tree across two
// queues completes bottom-up with the children's values at each parent,
// and each child failure policy gives the reference's outcome.
import { Queue, Worker, FlowProducer } from 'bunqueue/client';
import { conn, uniq, main, check, eq, waitFor } from './lib';

await main('flows', async () => {
  const qa = uniq('flow-a'), qb = uniq('flow-b');
  const A = new Queue(qa, { connection: conn }), B = new Queue(qb, { connection: conn });
  const fp = new FlowProducer({ connection: conn } as any);
  const tree: any = await fp.add({
    name: 'root', queueName: qa, data: { r: 1 }, children: [
      { name: 'mid', queueName: qb, data: { m: 1 }, children: [
        { name: 'leaf1', queueName: qa, data: { l: 1 } },
        { name: 'leaf2', queueName: qb, data: { l: 2 } },
      ] },
      { name: 'side', queueName: qb, data: { s: 1 } },
    ],
  } as any);
  const rootId = tree.job.id;
  eq(await A.getJobState(rootId), 'waiting-children', 'root waits for its children');
  eq((await B.getJobCountsAsync())['waiting-children'], 1, 'mid waits too');

  const order: string[] = [];
  const seen: Record<string, any> = {};
  const proc = async (j: any) => {
    order.push(j.name);
    if (j.name === 'mid' || j.name === 'root') {
      seen[j.name] = await j.getChildrenValues();
      return j.name + ':' + Object.keys(seen[j.name]).length;
    }
    return 'v-' + j.name;
  };
  const wa = new Worker(qa, proc, { connection: conn });
  const wb = new Worker(qb, proc, { connection: conn });
  await waitFor(async () => (await A.getJobState(rootId)) === 'completed', 15000, 'root completed');
  await wa.close(); await wb.close();
  const pos = (n: string) => order.indexOf(n);
  check(pos('leaf1') < pos('mid') && pos('leaf2') < pos('mid'), `leaves before mid: ${order}`);
  check(pos('mid') < pos('root') && pos('side') < pos('root'), `children before root: ${order}`);
  eq(Object.values(seen.mid).sort(), ['v-leaf1', 'v-leaf2'], 'mid sees its children\'s values');
  eq(Object.keys(seen.mid).sort(), [`${qa}:${tree.children[0].children[0].job.id}`, `${qb}:${tree.children[0].children[1].job.id}`].sort(), 'keys are queue:id');
  eq(Object.values(seen.root).sort(), ['mid:2', 'v-side'], 'root sees its children\'s values');
  eq((await A.getJob(rootId))!.returnvalue, 'root:2', 'root result');

  // Failure policies: one child fails for good; the parent's outcome.
  const outcomes: Record<string, string> = {};
  for (const policy of ['failParentOnFailure', 'continueParentOnFailure', 'ignoreDependencyOnFailure', 'removeDependencyOnFailure', 'none']) {
    const q = uniq('pol');
    const Q = new Queue(q, { connection: conn });
    const opts: any = { attempts: 1 };
    if (policy !== 'none') opts[policy] = true;
    const t: any = await fp.add({ name: 'parent', queueName: q, data: {}, children: [
      { name: 'bad', queueName: q, data: {}, opts },
      { name: 'good', queueName: q, data: {} },
    ] } as any);
    let failedSeen: any = null, ignoredSeen: any = null;
    const w = new Worker(q, async (j: any) => {
      if (j.name === 'bad') throw new Error('child broke');
      if (j.name === 'parent') { failedSeen = await j.getFailedChildrenValues(); ignoredSeen = await j.getIgnoredChildrenFailures(); }
      return j.name;
    }, { connection: conn });
    w.on('error', () => {});
    // Until the children are done and the parent has its outcome (none:
    // it waits for its failed child for good), not for a fixed time: a
    // loaded machine may take longer, an idle one much less.
    const [bad, good] = t.children.map((c: any) => c.job.id);
    await waitFor(async () => {
      const [sb, sg, sp] = await Promise.all([Q.getJobState(bad), Q.getJobState(good), Q.getJobState(t.job.id)]);
      const childrenDone = sb !== 'waiting' && sb !== 'active' && sb !== 'delayed' && sg !== 'waiting' && sg !== 'active';
      return childrenDone && (policy === 'none' ? sp === 'waiting-children' : sp === 'completed' || sp === 'failed');
    }, 15000, `the children and the parent settled under ${policy}`);
    await w.close();
    outcomes[policy] = await Q.getJobState(t.job.id);
    if (policy === 'continueParentOnFailure') eq(Object.values(failedSeen ?? {}), ['child broke'], 'failed children values');
    if (policy === 'ignoreDependencyOnFailure') eq(Object.values(ignoredSeen ?? {}), ['child broke'], 'ignored children failures');
    await Q.obliterateAsync(); await Q.close();
  }
  eq(outcomes, {
    failParentOnFailure: 'failed', continueParentOnFailure: 'completed',
    ignoreDependencyOnFailure: 'completed', removeDependencyOnFailure: 'completed', none: 'waiting-children',
  }, 'parent outcome per policy');
  await fp.close();
  await A.obliterateAsync(); await B.obliterateAsync();
  await A.close(); await B.close();
}, 90000);
