// queued: --auth-tokens secret-one,secret-two
// With AUTH_TOKENS set, a client with a valid token works and one without
// (or with a wrong one) gets nowhere.
import { Queue, Worker } from 'bunqueue/client';
import { pack, unpack } from 'msgpackr';
import { connect } from 'node:net';
import { conn, uniq, main, check, eq, waitFor } from './lib';

// Sends frames on a raw socket and returns the decoded answers.
async function raw(frames: any[]): Promise<any[]> {
  const sock = connect(conn.port, conn.host);
  const answers: any[] = [];
  let buf = Buffer.alloc(0);
  return new Promise((resolve, reject) => {
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32BE(0)) {
        const n = buf.readUInt32BE(0);
        answers.push(unpack(buf.subarray(4, 4 + n)));
        buf = buf.subarray(4 + n);
      }
      if (answers.length === frames.length) { sock.end(); resolve(answers); }
    });
    sock.on('error', reject);
    for (const f of frames) {
      const body = pack(f);
      const hdr = Buffer.alloc(4);
      hdr.writeUInt32BE(body.length);
      sock.write(Buffer.concat([hdr, body]));
    }
  });
}

await main('auth', async () => {
  const [before, badAuth, stillOut, goodAuth, after] = await raw([
    { cmd: 'Ping', reqId: '1' },
    { cmd: 'Auth', token: 'wrong', reqId: '2' },
    { cmd: 'Stats', reqId: '3' },
    { cmd: 'Auth', token: 'secret-two', reqId: '4' },
    { cmd: 'Ping', reqId: '5' },
  ]);
  eq([before.ok, before.error], [false, 'Not authenticated'], 'command before Auth');
  eq([badAuth.ok, badAuth.error], [false, 'Invalid token'], 'wrong token');
  eq(stillOut.ok, false, 'still refused after a wrong token');
  eq(goodAuth.ok, true, 'right token');
  eq([after.ok, after.data?.pong], [true, true], 'commands after Auth');

  const name = uniq('auth');
  const q = new Queue(name, { connection: { ...conn, token: 'secret-one' } });
  const job = await q.add('a', { x: 1 });
  let ran = false;
  const w = new Worker(name, async () => { ran = true; return 'ok'; }, { connection: { ...conn, token: 'secret-one' } });
  await waitFor(() => ran, 10000, 'worker with a token ran the job');
  await waitFor(async () => (await q.getJobState(job.id)) === 'completed', 5000, 'completed');
  await w.close();

  const bad = new Queue(name, { connection: { ...conn, token: 'nope', commandTimeout: 2000 } as any });
  const outcome = await Promise.race([
    bad.add('x', {}).then(() => 'added', () => 'refused'),
    new Promise((r) => setTimeout(() => r('refused'), 4000)),
  ]);
  eq(outcome, 'refused', 'a wrong token cannot add');
  check((await q.getJobCountsAsync()).waiting === 0, 'nothing was added with the wrong token');
  await q.obliterateAsync();
  await q.close();
  bad.close?.();
});
