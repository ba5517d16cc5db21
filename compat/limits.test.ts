// Queue-wide rate and concurrency limits hold across workers.
import { Queue, Worker } from 'bunqueue/client';
import { conn, uniq, main, check, eq, sleep, waitFor } from './lib';

await main('limits', async () => {
  // Rate limit: 20 jobs per 500 ms, measured over the steady part.
  {
    const name = uniq('rate');
    const q = new Queue(name, { connection: conn });
    await q.setGlobalRateLimitAsync(20, 500);
    await q.addBulk(Array.from({ length: 400 }, (_, i) => ({ name: 'r', data: { i } })));
    const times: number[] = [];
    const ws = [1, 2].map(() => new Worker(name, async () => { times.push(Date.now()); }, { connection: conn, concurrency: 10 }));
    await sleep(3500);
    await Promise.all(ws.map((w) => w.close()));
    // The bucket starts full (a burst of 20), then refills at 40/s.
    const steady = times.filter((t) => t - times[0] >= 500);
    const span = (steady[steady.length - 1] - steady[0]) / 1000;
    const rate = (steady.length - 1) / span;
    console.log(`rate limit 40/s: measured ${rate.toFixed(1)}/s over ${span.toFixed(2)} s`);
    check(Math.abs(rate - 40) / 40 <= 0.1, `rate ${rate.toFixed(1)}/s not within 10% of 40/s`);
    const limits = await q.getGlobalRateLimit();
    eq(limits, { max: 20, duration: 500 }, 'getGlobalRateLimit');
    await q.removeGlobalRateLimit();
    await q.obliterateAsync();
    await q.close();
  }
  // Concurrency limit: never more than 3 at once, whatever the workers ask.
  {
    const name = uniq('conc');
    const q = new Queue(name, { connection: conn });
    await q.setGlobalConcurrencyAsync(3);
    await q.addBulk(Array.from({ length: 60 }, (_, i) => ({ name: 'c', data: { i } })));
    let running = 0, peak = 0, done = 0;
    const ws = [1, 2].map(() => new Worker(name, async () => {
      running++; peak = Math.max(peak, running);
      await sleep(20);
      running--; done++;
    }, { connection: conn, concurrency: 10 }));
    await waitFor(() => done === 60, 20000, 'all processed');
    await Promise.all(ws.map((w) => w.close()));
    console.log(`concurrency limit 3: peak ${peak}`);
    check(peak <= 3, `peak concurrency ${peak} over the limit of 3`);
    check(peak >= 2, `peak concurrency ${peak}: the limit was never approached`);
    eq(await q.getGlobalConcurrency(), 3, 'getGlobalConcurrency');
    await q.obliterateAsync();
    await q.close();
  }
}, 60000);
