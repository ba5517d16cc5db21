// A worker that takes a job and hangs; the crash test kills it with SIGKILL.
import { Worker } from 'bunqueue/client';
import { conn } from './lib';

const [name, concurrency, lock] = process.argv.slice(2);
const w = new Worker(name, async (j) => {
  console.log('STARTED ' + j.id);
  await new Promise(() => {});
}, { connection: conn, concurrency: Number(concurrency), lockDuration: Number(lock), heartbeatInterval: 60000 });
w.on('error', () => {});
