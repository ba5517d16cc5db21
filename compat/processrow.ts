// Process-row probe (issue 31): where the time of the upstream benchmark's
// "Process" row goes, the client's CPU against the server's. Not a test:
// run it by hand against a running server (docs/performance.md gives the
// figures it printed).
//
//   bun run processrow.ts PORT SERVER_PID [RUNS]
//
// Each run is the row as bench/comparison/run.ts of the bunqueue
// repository runs it: a Worker of concurrency 50 and batchSize 20 on a
// new queue, 10,000 `add` of a 100-character payload, 1,000 in flight,
// timed until the worker has done them all. It prints one JSON line a
// run: jobs/s, and the CPU time this process and the server used over
// the row (from process.cpuUsage and /proc/PID/stat).
import { Queue, Worker } from 'bunqueue/client';
import { readFileSync } from 'node:fs';

const port = Number(process.argv[2]);
const pid = Number(process.argv[3]);
const runs = Number(process.argv[4] ?? 3);
if (!port || !pid) {
  console.error('usage: bun run processrow.ts PORT SERVER_PID [RUNS]');
  process.exit(2);
}

function serverCpuMs(): number {
  const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) * 10; // utime, stime; USER_HZ is 100
}

const N = 10_000;
const connection = { host: '127.0.0.1', port, poolSize: 32, pingInterval: 0, commandTimeout: 60_000 };
for (let r = 0; r < runs; r++) {
  const name = `processrow-${Date.now()}-${r}`;
  let processed = 0;
  const worker = new Worker(name, async () => { processed++; return { ok: true }; },
    { connection, concurrency: 50, heartbeatInterval: 0, batchSize: 20 });
  const queue = new Queue(name, { connection });
  await Bun.sleep(500);
  const c0 = process.cpuUsage();
  const s0 = serverCpuMs();
  const t0 = performance.now();
  for (let i = 0; i < N; i += 1000) {
    const adds = [];
    for (let j = 0; j < 1000; j++) adds.push(queue.add('process-job', { data: 'x'.repeat(100) }));
    await Promise.all(adds);
  }
  while (processed < N) await Bun.sleep(10);
  const ms = performance.now() - t0;
  const c = process.cpuUsage(c0);
  console.log(JSON.stringify({
    jobs_per_s: Math.round(N / ms * 1000), ms: Math.round(ms),
    client_cpu_ms: Math.round((c.user + c.system) / 1000), server_cpu_ms: serverCpuMs() - s0,
  }));
  await worker.close();
  await queue.obliterate();
  await queue.close();
}
process.exit(0);
