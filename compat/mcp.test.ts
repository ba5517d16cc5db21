// queued: --webhook-allow-private
// MCP: the official MCP SDK client drives three MCP servers against the
// same queued server: the reference's bunqueue-mcp (its tcp mode), `queued
// mcp` over stdio, and the server's own /mcp over Streamable HTTP. The
// tools' list and schemas must match the reference's, and a scenario of
// calls covering every tool family must answer the same, field by field
// (ids, times and the scenario's own names normalised). Then what only
// queued does: its HTTP handlers run in the server, and its resources and
// prompts read.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { check, eq, main, port, uniq } from './lib';

const httpPort = Number(process.env.QUEUED_HTTP_PORT ?? port + 1);
const queuedBin = process.env.QUEUED_BIN;

type Tool = { name: string; inputSchema: any };

async function stdioClient(command: string, args: string[], env: Record<string, string>): Promise<Client> {
  const t = new StdioClientTransport({ command, args, env: { ...(process.env as Record<string, string>), ...env }, stderr: 'ignore' });
  const c = new Client({ name: 'queued-compat', version: '1' });
  await c.connect(t);
  return c;
}

async function httpClient(): Promise<Client> {
  const c = new Client({ name: 'queued-compat', version: '1' });
  await c.connect(new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${httpPort}/mcp`)));
  return c;
}

/** A schema without what does not change its meaning: descriptions, the
 * dialect, the order of required names; references resolved. */
function normSchema(s: any, defs: any = s?.definitions ?? {}, depth = 0): any {
  if (Array.isArray(s)) return s.map((x) => normSchema(x, defs, depth));
  if (!s || typeof s !== 'object') return s;
  if (s.$ref) {
    if (depth > 3) return { $ref: 'recursive' };
    return normSchema(defs[s.$ref.replace('#/definitions/', '')], defs, depth + 1);
  }
  const out: any = {};
  for (const k of Object.keys(s).sort()) {
    if (k === 'description' || k === '$schema' || k === 'definitions') continue;
    out[k] = k === 'required' ? [...s[k]].sort() : normSchema(s[k], defs, depth);
  }
  return out;
}

/** Text of a tool's answer, and whether it is an error. */
async function call(c: Client, name: string, args: Record<string, unknown> = {}) {
  const r: any = await c.callTool({ name, arguments: args });
  const text: string = r.content?.[0]?.text ?? '';
  let json: any;
  try {
    json = JSON.parse(text);
  } catch {
    json = text;
  }
  return { isError: !!r.isError, json };
}

/** Steps where queued answers otherwise, on purpose: the reference's tcp
 * mode reads webhook and worker ids where the server does not put them
 * (it answers "0", lists no webhook, and removes none). */
const fixedSteps = new Set(['bunqueue_add_webhook', 'bunqueue_list_webhooks', 'bunqueue_set_webhook_enabled', 'bunqueue_remove_webhook', 'bunqueue_register_worker']);

/** One scenario's answers, with ids, times and its own names replaced by
 * what any run has in their place. */
class Recorder {
  ids = new Map<string, string>();
  log: { step: string; isError: boolean; json: unknown }[] = [];
  raw: unknown[] = [];
  constructor(readonly tag: string) {}
  norm(v: any): any {
    if (typeof v === 'string') {
      if (/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/.test(v)) return '<time>';
      if (/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(v)) {
        if (!this.ids.has(v)) this.ids.set(v, `<id${this.ids.size}>`);
        return this.ids.get(v);
      }
      return v.split(this.tag).join('<tag>');
    }
    if (typeof v === 'number' && v > 1e12) return '<ms>';
    if (Array.isArray(v)) return v.map((x) => this.norm(x));
    if (v && typeof v === 'object') {
      const o: any = {};
      for (const k of Object.keys(v)) o[this.norm(k)] = this.norm(v[k]);
      return o;
    }
    return v;
  }
  add(step: string, r: { isError: boolean; json: unknown }) {
    // The ids of the steps queued mends are numbered apart, so that the
    // other steps' ids are numbered alike in every run.
    const ids = this.ids;
    if (fixedSteps.has(step)) this.ids = this.fixedIds;
    this.log.push({ step, isError: r.isError, json: this.norm(r.json) });
    this.raw.push(r.json);
    if (fixedSteps.has(step)) {
      this.fixedIds = this.ids;
      this.ids = ids;
    }
  }
  fixedIds = new Map<string, string>();
}

/** Keys, and the types of their values, of an object: for answers that
 * are the whole server's (stats, memory), which no two runs share. */
function shape(v: any): any {
  if (Array.isArray(v)) return 'array';
  if (v && typeof v === 'object') {
    const o: any = {};
    for (const k of Object.keys(v).sort()) o[k] = typeof v[k] === 'object' && v[k] !== null && !Array.isArray(v[k]) ? 'object' : typeof v[k];
    return o;
  }
  return typeof v;
}

async function scenario(c: Client, tag: string): Promise<Recorder> {
  const rec = new Recorder(tag);
  const q1 = `${tag}-jobs`, q2 = `${tag}-mgmt`, q3 = `${tag}-dlq`, q4 = `${tag}-flow`;
  const step = async (name: string, args: Record<string, unknown> = {}, keep = true) => {
    const r = await call(c, name, args);
    if (keep) rec.add(name, r);
    return r;
  };
  // Jobs
  const a = (await step('bunqueue_add_job', { queue: q1, name: 'a', data: { x: 1 }, priority: 5 })).json.jobId;
  const bulk = (await step('bunqueue_add_jobs_bulk', { queue: q1, jobs: [{ name: 'b', data: { i: 1 } }, { name: 'c', data: { i: 2 }, delay: 60000 }] })).json.jobIds;
  await step('bunqueue_get_job', { jobId: a });
  await step('bunqueue_get_job', { jobId: 'no-such-job' });
  await step('bunqueue_get_job_state', { jobId: bulk[1] });
  await step('bunqueue_get_job_by_custom_id', { customId: `${tag}-none` });
  await step('bunqueue_promote_job', { jobId: bulk[1] });
  await step('bunqueue_get_job_state', { jobId: bulk[1] });
  await step('bunqueue_get_jobs', { queue: q1, state: 'waiting' });
  await step('bunqueue_get_job_counts', { queue: q1 });
  await step('bunqueue_count_jobs', { queue: q1 });
  // Consuming
  const pulled = await step('bunqueue_pull_job', { queue: q1 });
  eq(pulled.json.job?.id, a, 'the job of highest priority is pulled first');
  await step('bunqueue_update_progress', { jobId: a, progress: 40, message: 'half' });
  await step('bunqueue_get_progress', { jobId: a });
  await step('bunqueue_add_job_log', { jobId: a, message: 'hello', level: 'warn' });
  await step('bunqueue_get_job_logs', { jobId: a });
  await step('bunqueue_job_heartbeat', { jobId: a });
  await step('bunqueue_job_heartbeat_batch', { jobIds: [a] });
  await step('bunqueue_extend_lock', { jobId: a, token: 'not-the-token', duration: 5000 });
  await step('bunqueue_ack_job', { jobId: a, result: { done: true } });
  await step('bunqueue_get_job_result', { jobId: a });
  await step('bunqueue_wait_for_job', { jobId: a, timeoutMs: 1000 });
  await step('bunqueue_clear_job_logs', { jobId: a });
  await step('bunqueue_get_job_logs', { jobId: a });
  const batch = await step('bunqueue_pull_job_batch', { queue: q1, count: 5 });
  eq(batch.json.count, 2, 'both other jobs are pulled');
  await step('bunqueue_fail_job', { jobId: bulk[0], error: 'boom' });
  await step('bunqueue_ack_job_batch', { jobIds: [bulk[1]] });
  await step('bunqueue_get_jobs', { queue: q1, state: 'completed' });
  await step('bunqueue_get_queue_stats', { queue: q1 });
  // Job management
  const d = (await step('bunqueue_add_job', { queue: q2, name: 'd', data: {} })).json.jobId;
  await step('bunqueue_update_job_data', { jobId: d, data: { y: 2 } });
  await step('bunqueue_change_job_priority', { jobId: d, priority: 9 });
  await step('bunqueue_get_counts_per_priority', { queue: q2 });
  await step('bunqueue_move_to_delayed', { jobId: d, delay: 60000 });
  await step('bunqueue_change_delay', { jobId: d, delay: 120000 });
  await step('bunqueue_get_job_state', { jobId: d });
  await step('bunqueue_get_progress', { jobId: d });
  await step('bunqueue_discard_job', { jobId: d });
  await step('bunqueue_cancel_job', { jobId: d });
  // Queue control
  await step('bunqueue_add_job', { queue: q2, name: 'e', data: {} }, false);
  await step('bunqueue_pause_queue', { queue: q2 });
  await step('bunqueue_is_paused', { queue: q2 });
  await step('bunqueue_resume_queue', { queue: q2 });
  await step('bunqueue_is_paused', { queue: q2 });
  await step('bunqueue_drain_queue', { queue: q2 });
  await step('bunqueue_clean_queue', { queue: q1, graceMs: 0, state: 'completed' });
  await step('bunqueue_retry_completed', { queue: q1 });
  const queues = (await call(c, 'bunqueue_list_queues')).json.queues as string[];
  rec.add('bunqueue_list_queues', { isError: false, json: queues.filter((q) => q.startsWith(tag)).sort() });
  // Dead-letter queue
  await step('bunqueue_add_job', { queue: q3, name: 'f', data: {}, attempts: 1 }, false);
  await step('bunqueue_pull_job', { queue: q3 }, false);
  const dlqJob = (await call(c, 'bunqueue_get_jobs', { queue: q3, state: 'active' })).json.jobs[0].id;
  await step('bunqueue_fail_job', { jobId: dlqJob, error: 'for good' });
  await step('bunqueue_get_dlq', { queue: q3 });
  await step('bunqueue_retry_dlq', { queue: q3 });
  await step('bunqueue_pull_job', { queue: q3 }, false);
  await step('bunqueue_fail_job', { jobId: dlqJob, error: 'again' });
  await step('bunqueue_purge_dlq', { queue: q3 });
  // Cron
  await step('bunqueue_add_cron', { name: `${tag}-cron`, queue: q4, data: { c: 1 }, repeatEvery: 3600000 });
  const crons = (await call(c, 'bunqueue_list_crons')).json.crons as any[];
  rec.add('bunqueue_list_crons', { isError: false, json: crons.filter((x) => x.name.startsWith(tag)) });
  await step('bunqueue_get_cron', { name: `${tag}-cron` });
  await step('bunqueue_delete_cron', { name: `${tag}-cron` });
  await step('bunqueue_get_cron', { name: `${tag}-cron` });
  await step('bunqueue_add_cron', { name: `${tag}-bad`, queue: q4, data: {}, schedule: 'not a cron' });
  // Limits
  await step('bunqueue_set_rate_limit', { queue: q1, limit: 10 });
  await step('bunqueue_clear_rate_limit', { queue: q1 });
  await step('bunqueue_set_concurrency', { queue: q1, limit: 2 });
  await step('bunqueue_clear_concurrency', { queue: q1 });
  // Webhooks
  await step('bunqueue_add_webhook', { url: 'https://example.com/hook', events: ['job.completed'], queue: q1 });
  const hooks = ((await call(c, 'bunqueue_list_webhooks')).json.webhooks as any[]).filter((w) => w.queue === q1);
  rec.add('bunqueue_list_webhooks', { isError: false, json: hooks });
  await step('bunqueue_set_webhook_enabled', { id: hooks[0]?.id ?? 'none', enabled: false });
  await step('bunqueue_remove_webhook', { id: hooks[0]?.id ?? 'none' });
  // Workers
  await step('bunqueue_register_worker', { name: `${tag}-worker`, queues: [q1] });
  const workers = ((await call(c, 'bunqueue_list_workers')).json.workers as any[]).filter((w) => w.name === `${tag}-worker`);
  rec.add('bunqueue_list_workers', { isError: false, json: workers });
  await step('bunqueue_worker_heartbeat', { workerId: workers[0]?.id ?? 'none' });
  await step('bunqueue_unregister_worker', { workerId: workers[0]?.id ?? 'none' });
  // Flows
  const flow = await step('bunqueue_add_flow', {
    name: 'root', queueName: q4, data: { r: 1 },
    children: [{ name: 'kid1', queueName: q4, data: { k: 1 } }, { name: 'kid2', queueName: q4, children: [{ name: 'grandkid', queueName: q4, data: {} }] }],
  });
  await step('bunqueue_get_flow', { jobId: flow.json.jobId, queueName: q4 });
  await step('bunqueue_get_flow', { jobId: flow.json.jobId, queueName: q4, depth: 1, maxChildren: 1 });
  await step('bunqueue_get_flow', { jobId: 'no-such-job', queueName: q4 });
  await step('bunqueue_get_children_values', { parentJobId: flow.json.jobId });
  const chain = await step('bunqueue_add_flow_chain', { steps: [{ name: 's1', queueName: q4, data: {} }, { name: 's2', queueName: q4, data: { n: 2 } }] });
  await step('bunqueue_get_job_state', { jobId: chain.json.jobIds[1] });
  const fan = await step('bunqueue_add_flow_bulk_then', {
    parallel: [{ name: 'p1', queueName: q4, data: {} }, { name: 'p2', queueName: q4, data: {} }], final: { name: 'fin', queueName: q4, data: {} },
  });
  await step('bunqueue_get_job_state', { jobId: fan.json.finalId });
  await step('bunqueue_get_job_counts', { queue: q4 });
  // Monitoring: the whole server's figures, by shape
  for (const name of ['bunqueue_get_stats', 'bunqueue_get_memory_stats', 'bunqueue_get_storage_status']) {
    const r = await call(c, name);
    rec.add(name, { isError: r.isError, json: shape(r.json) });
  }
  const per = (await call(c, 'bunqueue_get_per_queue_stats')).json;
  // Each of the scenario's queues with its figures; their values move with
  // time (a failed job's backoff ends, the dashboard's figures are
  // refreshed), so by shape.
  rec.add('bunqueue_get_per_queue_stats', { isError: false, json: Object.fromEntries(Object.entries(per).filter(([k]) => k.startsWith(tag)).map(([k, v]) => [k, shape(v)])) });
  const prom = await call(c, 'bunqueue_get_prometheus_metrics');
  rec.add('bunqueue_get_prometheus_metrics', { isError: prom.isError, json: typeof prom.json === 'string' && prom.json.includes('# TYPE') });
  await step('bunqueue_compact_memory');
  // Refusals
  await step('bunqueue_add_job', { queue: q1, name: 'x' });
  await step('bunqueue_pull_job_batch', { queue: q1, count: 0 });
  // Clean up, so that the next scenario's listings see only its own.
  for (const q of [q1, q2, q3, q4]) await step('bunqueue_obliterate_queue', { queue: q });
  return rec;
}

function compare(ref: Recorder, got: Recorder, who: string) {
  eq(got.log.length, ref.log.length, `${who}: steps`);
  const diffs: string[] = [];
  for (let i = 0; i < ref.log.length; i++) {
    const r = ref.log[i], g = got.log[i];
    if (r.isError && g.isError && r.step === g.step) continue; // both refuse; the wording is each one's
    if (fixedSteps.has(r.step)) continue;
    // Stats carry the reqId of the request that asked, meaningless here.
    if (r.step === 'bunqueue_get_stats') delete (r.json as any).reqId;
    if (JSON.stringify(g) !== JSON.stringify(r)) diffs.push(`step ${i} (${r.step}): got ${JSON.stringify(g)}, want ${JSON.stringify(r)}`);
  }
  if (diffs.length) throw new Error(`${who}: ${diffs.length} answers differ from the reference's:\n` + diffs.join('\n'));
  // Where queued mends the reference: the webhook and the worker have
  // their real ids, the webhook is listed, turned off and removed.
  const at = (step: string, n = 0) => got.log.filter((x) => x.step === step)[n];
  const hookID = (at('bunqueue_add_webhook').json as any).id;
  check(/^<id\d+>$/.test(hookID), `${who}: add_webhook answers the webhook's id (${hookID})`);
  eq((at('bunqueue_list_webhooks').json as any[]).map((w) => [w.id, w.url, w.events, w.enabled]), [[hookID, 'https://example.com/hook', ['job.completed'], true]], `${who}: the webhook is listed`);
  eq(at('bunqueue_set_webhook_enabled').json, { success: true, id: hookID, enabled: false }, `${who}: the webhook is turned off`);
  eq(at('bunqueue_remove_webhook').json, { success: true, id: hookID }, `${who}: the webhook is removed`);
  const rawAt = (step: string) => got.raw[got.log.findIndex((x) => x.step === step)] as any;
  eq(rawAt('bunqueue_list_workers').map((w: any) => w.id), [rawAt('bunqueue_register_worker').worker.id], `${who}: register_worker answers the worker's id`);
}

main('mcp', async () => {
  check(queuedBin, 'QUEUED_BIN names the queued binary');
  const env = { BUNQUEUE_MODE: 'tcp', BUNQUEUE_HOST: '127.0.0.1', BUNQUEUE_PORT: String(port) };
  const ref = await stdioClient(process.execPath, ['node_modules/bunqueue/dist/mcp/index.js'], env);
  const ours = await stdioClient(queuedBin!, ['mcp'], env);
  const http = await httpClient();

  // The tools, their schemas; the resources and prompts.
  const refTools = (await ref.listTools()).tools as Tool[];
  eq(refTools.length, 73, 'the reference has 73 tools');
  for (const [who, c] of [['queued mcp', ours], ['/mcp', http]] as const) {
    const tools = (await c.listTools()).tools as Tool[];
    eq(tools.map((t) => t.name), refTools.map((t) => t.name), `${who}: tool names`);
    for (let i = 0; i < tools.length; i++) {
      eq(normSchema(tools[i].inputSchema), normSchema(refTools[i].inputSchema), `${who}: input schema of ${tools[i].name}`);
    }
    eq((await c.listResources()).resources.map((r) => [r.name, r.uri]), (await ref.listResources()).resources.map((r) => [r.name, r.uri]), `${who}: resources`);
    eq((await c.listPrompts()).prompts.map((p) => [p.name, p.arguments ?? []]), (await ref.listPrompts()).prompts.map((p) => [p.name, p.arguments ?? []]), `${who}: prompts`);
  }

  // The same scenario through each; one after the other, so that the
  // server-wide listings hold one scenario's entries at a time.
  const r = await scenario(ref, uniq('r'));
  const o = await scenario(ours, uniq('o'));
  const h = await scenario(http, uniq('h'));
  compare(r, o, 'queued mcp');
  compare(r, h, '/mcp');

  // Resources and prompts read, the same in shape as the reference's.
  for (const uri of ['bunqueue://stats', 'bunqueue://queues', 'bunqueue://crons', 'bunqueue://workers', 'bunqueue://webhooks']) {
    const want = JSON.parse((await ref.readResource({ uri })).contents[0].text as string);
    if (!Array.isArray(want)) delete want.reqId; // the reference's own request's
    for (const c of [ours, http]) {
      const got = JSON.parse((await c.readResource({ uri })).contents[0].text as string);
      eq(shape(got), shape(want), `resource ${uri}`);
    }
  }
  for (const c of [ours, http]) {
    const health = await c.getPrompt({ name: 'bunqueue_health_report' });
    check((health.messages[0].content as any).text.includes('## Storage Status'), 'the health report holds the storage status');
    const dbg = await c.getPrompt({ name: 'bunqueue_debug_queue', arguments: { queue: 'nothing-here' } });
    check((dbg.messages[0].content as any).text.includes('"waiting": 0'), 'the queue diagnosis holds its counts');
    const inc = await c.getPrompt({ name: 'bunqueue_incident_response', arguments: {} });
    check((inc.messages[0].content as any).text.includes('INCIDENT'), 'the incident prompt reads');
  }

  // Handlers run in the server: a job pushed to the queue is worked by a
  // call to the URL, and its result is the answer.
  const calls: any[] = [];
  const receiver = Bun.serve({
    port: 0,
    async fetch(req) {
      calls.push({ method: req.method, body: await req.json(), auth: req.headers.get('x-key') });
      return Response.json({ seen: calls.length });
    },
  });
  try {
    const hq = uniq('hq');
    const reg = await call(ours, 'bunqueue_register_handler', { queue: hq, url: `http://127.0.0.1:${receiver.port}/work`, method: 'POST', headers: { 'x-key': 'k1' } });
    check(!reg.isError && reg.json.success === true, `handler registered: ${JSON.stringify(reg.json)}`);
    const listed = await call(http, 'bunqueue_list_handlers');
    eq(listed.json.handlers.filter((x: any) => x.queue === hq).map((x: any) => [x.handler.url.endsWith('/work'), x.active]), [[true, true]], 'the handler is listed, on every transport');
    const id = (await call(ours, 'bunqueue_add_job', { queue: hq, name: 'h', data: { n: 7 } })).json.jobId;
    const done = await call(ours, 'bunqueue_wait_for_job', { jobId: id, timeoutMs: 10000 });
    eq(done.json.completed, true, 'the handler completed the job');
    eq((await call(ours, 'bunqueue_get_job_result', { jobId: id })).json.result, { status: 200, body: { seen: 1 } }, 'the job result is the call\'s answer');
    eq(calls, [{ method: 'POST', body: { n: 7 }, auth: 'k1' }], 'the call carried the job data and the header');
    const bad = await call(ours, 'bunqueue_register_handler', { queue: hq, url: 'ftp://example.com/x', method: 'POST' });
    check(bad.isError, 'a handler on a URL no call can reach is refused');
    eq((await call(ours, 'bunqueue_unregister_handler', { queue: hq })).json, { success: true, queue: hq }, 'unregistered');
    eq((await call(ours, 'bunqueue_unregister_handler', { queue: hq })).json, { success: false, queue: hq }, 'unregistered once');
  } finally {
    receiver.stop(true);
  }

  // Refused before a tool runs: an unknown tool, arguments of the wrong type.
  const unknown = await call(ours, 'bunqueue_no_such_tool');
  check(unknown.isError && String(unknown.json).includes('not found'), 'an unknown tool is an error result');
  const wrong = await call(http, 'bunqueue_get_job', { jobId: 42 });
  check(wrong.isError && String(wrong.json).includes('Input validation error'), `a wrong argument is an error result: ${JSON.stringify(wrong.json)}`);

  await Promise.all([ref.close(), ours.close(), http.close()]);
}, 120000);
