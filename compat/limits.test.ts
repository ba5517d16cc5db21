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
    // Claims are timed by the server (the job's processedOn, written when
    // the server hands it out), not by when a worker got to run: on a
    // loaded machine the workers' own clocks say more about the machine
    // than about the limit.
    const times: number[] = [];
    const ws = [1, 2].map(() => new Worker(name, async (job) => { times.push(job.processedOn ?? NaN); }, { connection: conn, concurrency: 10 }));
    await waitFor(() => times.length >= 120, 30000, '120 jobs through the limit');
    await Promise.all(ws.map((w) => w.close()));
    check(times.every((t) => Number.isFinite(t)), 'every job has its processedOn');
    times.sort((a, b) => a - b);
    // The bucket starts full (a burst of 20), then refills at 40/s: no
    // window holds more than the burst plus what refilled in it.
    for (let i = 0; i < times.length; i++) {
      for (let k = i; k < times.length && times[k] - times[i] <= 1000; k++) {
        const allowed = 20 + Math.ceil(((times[k] - times[i]) / 1000) * 40) + 1;
        check(k - i + 1 <= allowed, `${k - i + 1} claims within ${times[k] - times[i]} ms, the limit allows ${allowed}`);
      }
    }
    const steady = times.filter((t) => t - times[0] >= 500);
    const span = (steady[steady.length - 1] - steady[0]) / 1000;
    const rate = (steady.length - 1) / span;
    console.log(`rate limit 40/s: measured ${rate.toFixed(1)}/s over ${span.toFixed(2)} s (server times)`);
    // The limit itself is checked window by window above.
    // Not a speed test: the floor only shows that the limiter lets jobs
    // through at its rate, not at a trickle, with room for a busy machine.
    check(rate >= 20, `rate ${rate.toFixed(1)}/s: under half of the 40/s the limit allows`);
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
