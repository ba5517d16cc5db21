// The HTTP side as bunqueue's own tools and a browser-like client see it:
// the official CLI's healthcheck and doctor read /health; jobs added and
// processed through the official client show up in the REST API, on the
// SSE stream and on a WebSocket, in the reference's shapes.
import { Queue, Worker } from 'bunqueue/client';
import { runHealthcheck } from './node_modules/bunqueue/dist/cli/commands/healthcheck.js';
import { fetchDoctorHealth, evaluateDoctor } from './node_modules/bunqueue/dist/cli/commands/doctor.js';
import { conn, uniq, main, check, eq, waitFor } from './lib';

const httpPort = Number(process.env.QUEUED_HTTP_PORT ?? 6790);
const base = `http://127.0.0.1:${httpPort}`;

await main('http', async () => {
  // The official CLI's probes.
  eq(await runHealthcheck([`${base}/health`]), 0, 'bunqueue healthcheck exit code');
  const q = new Queue(uniq('http'), { connection: conn });
  await q.add('warmup', {}); // a TCP connection for the doctor to count
  const report = evaluateDoctor(await fetchDoctorHealth('127.0.0.1', httpPort));
  check(report.reachable, 'doctor reaches the server');
  eq(report.health.status, 'healthy', 'doctor sees healthy');
  eq(report.issues, 0, 'doctor finds no issue (version, status, DLQ, memory)');
  check(typeof report.health.connections.tcp === 'number' && report.health.connections.tcp >= 1, 'doctor counts TCP connections');
  await q.obliterateAsync();

  // Events: an SSE stream and a WebSocket, open before the work.
  const name = uniq('http');
  const sse: { event: string; data: any }[] = [];
  const ac = new AbortController();
  const res = await fetch(`${base}/events/queues/${name}`, { signal: ac.signal });
  eq(res.headers.get('content-type'), 'text/event-stream', 'SSE content type');
  const reader = res.body!.getReader();
  let first = '';
  (async () => {
    const dec = new TextDecoder();
    let buf = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (!first) first = block;
          let event = 'message', data = '';
          for (const line of block.split('\n')) {
            if (line.startsWith('event: ')) event = line.slice(7);
            if (line.startsWith('data: ')) data += line.slice(6);
          }
          if (data) sse.push({ event, data: JSON.parse(data) });
        }
      }
    } catch { /* aborted at the end */ }
  })();

  const ws = new WebSocket(`ws://127.0.0.1:${httpPort}/ws`);
  const wsMsgs: any[] = [];
  ws.onmessage = (m) => wsMsgs.push(JSON.parse(String(m.data)));
  await new Promise((r, j) => { ws.onopen = r; ws.onerror = j; });
  ws.send(JSON.stringify({ cmd: 'Subscribe', events: ['job:completed', 'job:active'], reqId: 'sub' }));
  await waitFor(() => wsMsgs.find((m) => m.reqId === 'sub'), 5000, 'the Subscribe answer');
  eq(wsMsgs.find((m) => m.reqId === 'sub'), { ok: true, subscribed: ['job:completed', 'job:active'], reqId: 'sub' }, 'Subscribe answer');

  // Work through the official client.
  const queue = new Queue(name, { connection: conn });
  const data = { to: 'ada@example.com', n: 3, nested: { list: [1, 'two', null] } };
  const job = await queue.add('mail', data);
  const w = new Worker(name, async () => ({ sent: true }), { connection: conn });
  await waitFor(async () => (await queue.getJobState(job.id)) === 'completed', 10000, 'the job to complete');
  await w.close();

  // REST: the job as the client left it.
  const got = await (await fetch(`${base}/jobs/${job.id}`)).json();
  eq(got.ok, true, 'GET /jobs/:id ok');
  eq(got.job.data, data, 'data over HTTP');
  eq(got.job.state, 'completed', 'state over HTTP');
  eq(got.job.returnvalue, { sent: true }, 'result over HTTP');
  const counts = await (await fetch(`${base}/queues/${name}/counts`)).json();
  eq(counts.counts.completed, 1, 'completed count over HTTP');

  // SSE: the connected message first, then the job's events by name.
  await waitFor(() => sse.find((e) => e.event === 'job:completed'), 5000, 'job:completed on SSE');
  check(first.startsWith('retry: 3000\ndata: {"connected":true,"clientId":"'), 'first SSE chunk: ' + first);
  const names = sse.filter((e) => e.event.startsWith('job:')).map((e) => e.event);
  eq(names, ['job:pushed', 'job:active', 'job:completed'], 'SSE job events in order');
  const done = sse.find((e) => e.event === 'job:completed')!.data;
  eq([done.queue, done.jobId, typeof done.timestamp], [name, job.id, 'number'], 'job:completed data');

  // WebSocket: the subscribed events in the {event, ts, data} form, and a
  // command answered as over TCP.
  const ev = await waitFor(() => wsMsgs.find((m) => m.event === 'job:completed' && m.data.jobId === job.id), 5000, 'job:completed on the WebSocket');
  eq(ev.data, { queue: name, jobId: job.id }, 'WebSocket event data');
  check(typeof ev.ts === 'number', 'WebSocket event ts');
  check(!wsMsgs.some((m) => m.event === 'job:pushed'), 'no job:pushed without subscribing to it');
  ws.send(JSON.stringify({ cmd: 'GetJobCounts', queue: name, reqId: 'c' }));
  const c = await waitFor(() => wsMsgs.find((m) => m.reqId === 'c'), 5000, 'the GetJobCounts answer');
  eq([c.ok, c.counts.completed], [true, 1], 'GetJobCounts over the WebSocket');

  ws.close();
  ac.abort();
  await queue.obliterateAsync();
  await queue.close();
});
