// A graceful stop through the official client (drain_test.go): two jobs of
// 4 s each and a worker of concurrency 1. The test stops the server 1.5 s
// into the first job and starts it again on the same port; the worker
// reconnects by itself. The script prints each job's start (id and time)
// as it happens, then, once both have completed, how many times each ran:
//   started <id> <ms>          ...          done {"<id>": runs, ...}
import { Queue, Worker } from 'bunqueue/client';
import { conn, waitFor } from './lib';

const name = process.argv[2] ?? 'drain';
const q = new Queue(name, { connection: conn });
const a = await q.add('slow', { n: 1 });
const b = await q.add('slow', { n: 2 });
const runs: Record<string, number> = { [a.id]: 0, [b.id]: 0 };
const w = new Worker(name, async (job: any) => {
  runs[job.id] = (runs[job.id] ?? 0) + 1;
  console.log(`started ${job.id} ${Date.now()}`);
  await new Promise((r) => setTimeout(r, 4000));
  return 'finished';
}, { connection: conn, concurrency: 1 });
w.on('error', () => {}); // the server going away is expected here
await waitFor(async () => {
  try {
    return (await q.getJobState(a.id)) === 'completed' && (await q.getJobState(b.id)) === 'completed';
  } catch {
    return false; // between the stop and the restart
  }
}, 60000, 'both jobs completed');
console.log('done ' + JSON.stringify(runs));
await w.close();
process.exit(0);
