// Groups through QueuePro/WorkerPro: fair turns across groups, group
// concurrency and rate limits, a paused group skipped, and an overflowing
// bulk push refused whole.
import { QueuePro, WorkerPro } from 'bunqueue/client';
import { conn, uniq, main, check, eq, sleep, waitFor } from './lib';

await main('groups', async () => {
  // Fairness: 3 groups × 5 jobs come out interleaved.
  {
    const name = uniq('fair');
    const q = new QueuePro(name, { connection: conn });
    for (const g of ['A', 'B', 'C']) {
      await q.addBulk([1, 2, 3, 4, 5].map((i) => ({ name: g + i, data: {}, opts: { group: { id: g } } as any })));
    }
    const order: string[] = [];
    const w = new WorkerPro(name, async (j: any) => { order.push(j.name); }, { connection: conn, concurrency: 1 });
    await waitFor(() => order.length === 15, 10000, 'all processed');
    await w.close();
    eq(order, ['A1', 'B1', 'C1', 'A2', 'B2', 'C2', 'A3', 'B3', 'C3', 'A4', 'B4', 'C4', 'A5', 'B5', 'C5'], 'round-robin order');
    await q.obliterateAsync(); await q.close();
  }
  // Group concurrency 1 with a worker of concurrency 6: never two of a
  // group at once, and the three groups run side by side.
  {
    const name = uniq('gconc');
    const q = new QueuePro(name, { connection: conn });
    for (const g of ['A', 'B', 'C']) {
      await q.addBulk([1, 2, 3, 4].map((i) => ({ name: g + i, data: {}, opts: { group: { id: g } } as any })));
    }
    const running: Record<string, number> = {}; let peakGroup = 0, peakAll = 0, all = 0, done = 0;
    const w = new WorkerPro(name, async (j: any) => {
      const g = j.name[0];
      running[g] = (running[g] ?? 0) + 1; all++;
      peakGroup = Math.max(peakGroup, running[g]); peakAll = Math.max(peakAll, all);
      await sleep(40);
      running[g]--; all--; done++;
    }, { connection: conn, concurrency: 6, group: { concurrency: 1 } } as any);
    await waitFor(() => done === 12, 15000, 'all processed');
    await w.close();
    console.log(`group concurrency 1: peak per group ${peakGroup}, peak overall ${peakAll}`);
    eq(peakGroup, 1, 'peak per group');
    check(peakAll >= 2, `groups ran side by side (peak ${peakAll})`);
    await q.obliterateAsync(); await q.close();
  }
  // Group rate limit: 2 jobs per 400 ms per group.
  {
    const name = uniq('grate');
    const q = new QueuePro(name, { connection: conn });
    await q.addBulk([1, 2, 3, 4, 5, 6].map((i) => ({ name: 'A' + i, data: {}, opts: { group: { id: 'A' } } as any })));
    const times: number[] = [];
    // The server's claim times (processedOn), not when this process got to
    // run each job: on a loaded machine the first ran late, and the span
    // looked short (674 ms, in CI once).
    const w = new WorkerPro(name, async (job: any) => { times.push(Number(job.processedOn)); }, { connection: conn, concurrency: 4, group: { limit: { max: 2, duration: 400 } } } as any);
    await waitFor(() => times.length === 6, 10000, 'all processed');
    await w.close();
    check(times.every(Number.isFinite), `claim times: ${times}`);
    times.sort((a, b) => a - b);
    const span = times[5] - times[0];
    console.log(`group rate 2/400ms: 6 jobs over ${span} ms`);
    check(span >= 700, `6 jobs at 2 per 400 ms took only ${span} ms`);
    await q.obliterateAsync(); await q.close();
  }
  // A paused group is skipped while others run; resuming releases it.
  {
    const name = uniq('gpause');
    const q = new QueuePro(name, { connection: conn });
    await q.pauseGroup('B');
    eq(await q.isGroupPaused('B'), true, 'isGroupPaused');
    for (const g of ['A', 'B', 'C']) await q.add(g, {}, { group: { id: g } } as any);
    const ran: string[] = [];
    const w = new WorkerPro(name, async (j: any) => { ran.push(j.name); }, { connection: conn });
    await waitFor(() => ran.length === 2, 5000, 'A and C ran');
    await sleep(300);
    eq(ran.sort(), ['A', 'C'], 'B held while paused');
    await q.resumeGroup('B');
    await waitFor(() => ran.length === 3, 5000, 'B ran after resume');
    await w.close();
    await q.obliterateAsync(); await q.close();
  }
  // An addBulk that would overflow a group's maxSize is refused whole.
  {
    const name = uniq('gmax');
    const q = new QueuePro(name, { connection: conn });
    await q.add('first', {}, { group: { id: 'G', maxSize: 3 } } as any);
    let refused = '';
    try {
      await q.addBulk([1, 2, 3].map((i) => ({ name: 'x' + i, data: {}, opts: { group: { id: 'G', maxSize: 3 } } as any })));
    } catch (e: any) { refused = e.message; }
    check(refused.includes('maximum size of 3'), `overflow refused: ${refused}`);
    eq(await q.getGroupJobsCount('G'), 1, 'nothing of the refused batch was admitted');
    await q.obliterateAsync(); await q.close();
  }
}, 90000);
