// queued dashboard. Everything it shows comes from the server's own HTTP
// API (/dashboard, /queues/summary, /health, /queues/:q/..., /jobs/:id)
// and its event stream (/events); nothing is loaded from other hosts.
// Every string from the server is put in the page as text, never as
// markup: job data is whatever producers sent.
'use strict';
// Errors are kept where the browser test can read them.
window.__errors = [];
window.addEventListener('error', (e) => window.__errors.push(String(e.message)));
window.addEventListener('unhandledrejection', (e) => window.__errors.push(String(e.reason)));
(() => {
  const $ = (id) => document.getElementById(id);
  const REFRESH_MS = 2000;
  const CHART_SPAN = 600e3; // the server keeps 10 minutes of rates
  const SPARK_BUCKETS = 60; // 2 minutes of 2 s buckets
  const FEED_MAX = 100;

  const S = {
    token: sessionStorage.getItem('queued.token') || '',
    queues: new Map(), // name -> {name, paused, counts, activity: []}
    selected: null,
    tab: 'waiting',
    series: [], // {t, push, done, fail}: the server's rate history
    seriesNow: 0, // the server's clock when it sent the history
    feedPaused: false,
    feedBuf: [],
    jobOpen: null,
    tokenWaiters: [],
  };

  // ---------------------------------------------------------------- DOM

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = v;
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k === 'style') el.style.cssText = v; // CSSOM: allowed by the page's CSP
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const k of kids.flat()) {
      if (k === null || k === undefined || k === false) continue;
      el.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return el;
  }

  const fmt = new Intl.NumberFormat();
  const n = (v) => (typeof v === 'number' ? fmt.format(v) : '–');
  const rate = (v) => (v >= 100 ? fmt.format(Math.round(v)) : v >= 10 ? v.toFixed(1) : v.toFixed(2));

  function ago(ms) {
    if (!ms) return '–';
    const d = Date.now() - ms;
    const a = Math.abs(d);
    const s = a < 60e3 ? Math.round(a / 1e3) + 's' : a < 3600e3 ? Math.round(a / 60e3) + 'm'
      : a < 86400e3 ? Math.round(a / 3600e3) + 'h' : Math.round(a / 86400e3) + 'd';
    return d >= 0 ? s + ' ago' : 'in ' + s;
  }
  // One date format everywhere, whatever the browser's locale: ISO-like,
  // local time, 24-hour (2026-12-01 04:05:06). clock leaves out the date
  // of a moment of today, for the feed, the logs and the timeline.
  const pad = (v) => String(v).padStart(2, '0');
  function when(ms) {
    if (!ms) return '–';
    const d = new Date(ms);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  function clock(ms) {
    const s = when(ms);
    return s.slice(0, 10) === when(Date.now()).slice(0, 10) ? s.slice(11) : s;
  }
  const shortId = (id) => (id && id.length > 13 ? id.slice(0, 8) + '…' + id.slice(-4) : id);

  let toastTimer;
  function toast(msg, bad) {
    const t = $('toast');
    t.textContent = msg;
    t.className = 'toast' + (bad ? ' bad' : '');
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => t.classList.add('hidden'), 3500);
  }

  // ---------------------------------------------------------------- API

  async function api(path, opts = {}) {
    const headers = {};
    if (S.token) headers.Authorization = 'Bearer ' + S.token;
    if (opts.body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, {
      method: opts.method || 'GET', headers, cache: 'no-store',
      body: opts.body !== undefined ? JSON.stringify(opts.body) : undefined,
    });
    if (res.status === 401) {
      askToken();
      throw new Error('unauthorized');
    }
    const ct = res.headers.get('content-type') || '';
    const data = ct.includes('json') ? await res.json() : await res.text();
    return { status: res.status, data };
  }

  // act runs a command from a button and says how it went.
  async function act(label, path, opts) {
    try {
      const r = await api(path, opts);
      if (r.data && r.data.ok === false) throw new Error(r.data.error || 'failed');
      toast(label);
      refresh();
      loadDetail();
      return r.data;
    } catch (e) {
      if (e.message !== 'unauthorized') toast(label + ' failed: ' + e.message, true);
      return null;
    }
  }

  function askToken() {
    $('token-btn').classList.remove('hidden');
    if (!$('token-dialog').classList.contains('hidden')) return;
    $('token-dialog').classList.remove('hidden');
    $('token-input').focus();
  }
  const tokenReady = () => new Promise((res) => S.tokenWaiters.push(res));
  $('token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    S.token = $('token-input').value.trim();
    sessionStorage.setItem('queued.token', S.token);
    $('token-dialog').classList.add('hidden');
    S.tokenWaiters.splice(0).forEach((f) => f());
    refresh();
  });
  $('token-btn').addEventListener('click', () => {
    $('token-dialog').classList.remove('hidden');
    $('token-input').focus();
  });

  // ---------------------------------------------------------------- overview

  async function refresh() {
    let dash, summary, health;
    try {
      [dash, summary, health] = await Promise.all([api('/dashboard'), api('/queues/summary'), api('/health')]);
    } catch (e) {
      if (e.message !== 'unauthorized') {
        $('status').textContent = 'unreachable';
        $('status').className = 'pill pill-bad';
      }
      return;
    }
    renderHealth(health.data);
    const d = dash.data;
    takeHistory(d.history);
    renderCards(d, health.data);
    if (Array.isArray(summary.data)) mergeQueues(summary.data);
    renderQueues();
    renderDetailHead();
    renderCrons(d.crons);
    renderWorkers(d.workers);
    drawChart();
  }

  function renderHealth(hd) {
    const st = $('status');
    st.textContent = hd.status || 'unknown';
    st.className = 'pill ' + (hd.status === 'healthy' ? 'pill-ok' : 'pill-bad');
    st.title = hd.storage && hd.storage.error ? 'storage: ' + hd.storage.error : '/health';
    // In PostgreSQL mode the rates are this broker's own.
    $('tp-hint').textContent = hd.storage && hd.storage.driver === 'postgres' ? 'this broker' : '';
    const c = hd.connections || {};
    $('meta').textContent = `v${hd.queuedVersion} · up ${dur(hd.uptime)} · ${hd.storage ? hd.storage.driver : ''} · ` +
      `${c.tcp ?? 0} tcp, ${c.ws ?? 0} ws, ${c.sse ?? 0} sse · ${hd.memory ? hd.memory.rss + ' MB' : ''}`;
  }

  function dur(s) {
    if (typeof s !== 'number') return '–';
    const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    return d ? `${d}d ${hh}h` : hh ? `${hh}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
  }

  // takeHistory takes the server's last ten minutes of rates: the chart is
  // full from the first paint, whenever the page was opened.
  function takeHistory(hs) {
    if (!hs || !Array.isArray(hs.at)) return;
    S.seriesNow = hs.now;
    S.series = hs.at.map((t, i) => ({ t, push: hs.pushPerSec[i], done: hs.completePerSec[i], fail: hs.failPerSec[i] }));
  }

  function renderCards(d, hd) {
    const st = d.stats;
    const tp = d.throughput || {};
    const last = { push: tp.pushPerSec || 0, done: tp.completePerSec || 0, fail: tp.failPerSec || 0 };
    const w = d.workers || {};
    const cards = [
      ['Waiting', n(st.waiting), null],
      ['Active', n(st.active), null],
      ['Delayed', n(st.delayed), null],
      ['Completed', n(st.completed), `${n(st.totalCompleted)} since start`],
      ['Failed (DLQ)', n(st.dlq), `${n(st.totalFailed)} failures since start`, st.dlq > 0],
      ['Workers', `${n(w.active)} / ${n(w.total)}`, 'active / registered'],
      ['Pushed /s', rate(last.push), `${n(st.totalPushed)} since start`],
      ['Completed /s', rate(last.done), last.fail > 0 ? `${rate(last.fail)} failed/s` : null, last.fail > 0],
    ];
    // The pull figure is the server's time for a pull, without the time a
    // long poll slept waiting for a job (the reference's figures count it).
    const lat = d.latency && d.latency.percentiles, ps = d.pullService;
    if (ps && lat) {
      cards.push(['Pull p95 (service)', ps.p95 + ' ms', `ack p95 ${lat.ack.p95} ms`, false,
        `The server's time for a pull, without the time a long poll waited for a job (with it: p95 ${lat.pull.p95} ms)`]);
    }
    if (hd && hd.status !== 'healthy') cards.unshift(['Storage', 'degraded', hd.storage && hd.storage.error, true]);
    $('cards').replaceChildren(...cards.map(([label, value, sub, alert, title]) =>
      h('div', { class: 'card' + (alert ? ' alert' : ''), title },
        h('div', { class: 'label', text: label }), h('div', { class: 'value', text: value }),
        sub ? h('div', { class: 'sub', text: sub }) : null)));
  }

  // ---------------------------------------------------------------- chart

  function drawChart() {
    const cv = $('chart');
    const dpr = window.devicePixelRatio || 1;
    const W = cv.clientWidth, H = cv.clientHeight;
    if (!W) return;
    cv.width = W * dpr;
    cv.height = H * dpr;
    const g = cv.getContext('2d');
    g.scale(dpr, dpr);
    const css = getComputedStyle(document.documentElement);
    const col = (v) => css.getPropertyValue(v).trim();
    const padL = 46, padR = 8, padT = 8, padB = 20;
    const pw = W - padL - padR, ph = H - padT - padB;
    const pts = S.series;
    let max = 1;
    for (const p of pts) max = Math.max(max, p.push, p.done, p.fail);
    max = niceMax(max);
    g.font = '11px system-ui, sans-serif';
    g.fillStyle = col('--muted');
    g.strokeStyle = col('--line');
    g.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = padT + ph - (ph * i) / 4;
      g.beginPath();
      g.moveTo(padL, Math.round(y) + 0.5);
      g.lineTo(W - padR, Math.round(y) + 0.5);
      g.stroke();
      g.textAlign = 'right';
      g.fillText(rate((max * i) / 4), padL - 6, y + 4);
    }
    // Placed by the server's clock, so that a browser's clock that is off
    // does not shift the chart.
    const now = S.seriesNow || Date.now(), span = CHART_SPAN;
    const x = (t) => padL + pw * (1 - (now - t) / span);
    // What was drawn, and what the first drawing had: the browser test
    // reads them.
    cv.dataset.points = pts.length;
    cv.dataset.spanMs = pts.length ? now - pts[0].t : 0;
    if (cv.dataset.firstPoints === undefined) {
      cv.dataset.firstPoints = cv.dataset.points;
      cv.dataset.firstSpanMs = cv.dataset.spanMs;
    }
    g.textAlign = 'center';
    for (let m = 0; m <= 10; m += 2) {
      g.fillText(m === 0 ? 'now' : `-${m}m`, padL + pw * (1 - (m * 60e3) / span), H - 5);
    }
    if (pts.length < 2) {
      g.textAlign = 'center';
      g.fillText('collecting…', padL + pw / 2, padT + ph / 2);
      return;
    }
    const line = (key, color, fill) => {
      g.beginPath();
      pts.forEach((p, i) => {
        const px = x(p.t), py = padT + ph - (p[key] / max) * ph;
        if (i === 0) g.moveTo(px, py);
        else g.lineTo(px, py);
      });
      g.strokeStyle = color;
      g.lineWidth = 1.8;
      g.lineJoin = 'round';
      g.stroke();
      if (fill) {
        g.lineTo(x(pts[pts.length - 1].t), padT + ph);
        g.lineTo(x(pts[0].t), padT + ph);
        g.closePath();
        const grad = g.createLinearGradient(0, padT, 0, padT + ph);
        grad.addColorStop(0, color + '40');
        grad.addColorStop(1, color + '00');
        g.fillStyle = grad;
        g.fill();
      }
    };
    line('done', col('--done'), true);
    line('push', col('--push'), false);
    line('fail', col('--fail'), false);
  }

  function niceMax(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }
  window.addEventListener('resize', () => drawChart());

  // ---------------------------------------------------------------- queues

  function queueOf(name) {
    let q = S.queues.get(name);
    if (!q) {
      q = { name, paused: false, counts: {}, activity: new Array(SPARK_BUCKETS).fill(0) };
      S.queues.set(name, q);
    }
    return q;
  }

  function mergeQueues(list) {
    const seen = new Set();
    for (const s of list) {
      const q = queueOf(s.name);
      q.paused = s.paused;
      q.counts = s.counts;
      seen.add(s.name);
    }
    for (const name of [...S.queues.keys()]) if (!seen.has(name)) S.queues.delete(name);
  }

  let queuesFrame = 0;
  function renderQueuesSoon() {
    if (!queuesFrame) queuesFrame = requestAnimationFrame(() => { queuesFrame = 0; renderQueues(); renderDetailHead(); });
  }

  function renderQueues() {
    const rows = [...S.queues.values()].sort((a, b) => a.name.localeCompare(b.name));
    $('queues-empty').classList.toggle('hidden', rows.length > 0);
    $('queue-count').textContent = rows.length ? `${rows.length} queue${rows.length > 1 ? 's' : ''}` : '';
    const cell = (v, bad) => h('td', { class: 'num' + (!v ? ' zero' : bad ? ' bad' : ''), text: n(v || 0) });
    $('queues').replaceChildren(...rows.map((q) => {
      const c = q.counts || {};
      return h('tr', {
        class: 'clickable' + (S.selected === q.name ? ' selected' : ''), dataset: { queue: q.name },
        onclick: () => selectQueue(q.name),
      },
      h('td', {}, h('span', { class: 'qname', text: q.name }), ' ', q.paused ? h('span', { class: 'badge b-paused', text: 'paused' }) : null),
      cell((c.waiting || 0) + (c.prioritized || 0)), cell(c.delayed), cell(c.active), cell(c.completed), cell(c.failed, true),
      h('td', {}, spark(q.activity)),
      h('td', { class: 'num' }, h('button', {
        class: 'ghost small', text: q.paused ? 'Resume' : 'Pause',
        onclick: (e) => {
          e.stopPropagation();
          act(q.paused ? `Resumed ${q.name}` : `Paused ${q.name}`, `/queues/${encodeURIComponent(q.name)}/${q.paused ? 'resume' : 'pause'}`, { method: 'POST' });
        },
      })));
    }));
  }

  const SVG = 'http://www.w3.org/2000/svg';
  function spark(values) {
    const w = 120, hh = 24;
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('width', w);
    svg.setAttribute('height', hh);
    svg.setAttribute('class', 'spark');
    const max = Math.max(1, ...values);
    const step = w / (values.length - 1);
    const d = values.map((v, i) => `${i ? 'L' : 'M'}${(i * step).toFixed(1)},${(hh - 2 - (v / max) * (hh - 4)).toFixed(1)}`).join('');
    const area = document.createElementNS(SVG, 'path');
    area.setAttribute('d', `${d}L${w},${hh}L0,${hh}Z`);
    area.style.fill = 'var(--accent)';
    area.style.opacity = '0.15';
    const path = document.createElementNS(SVG, 'path');
    path.setAttribute('d', d);
    path.style.fill = 'none';
    path.style.stroke = 'var(--accent)';
    path.style.strokeWidth = '1.5';
    svg.append(area, path);
    const total = values.reduce((a, b) => a + b, 0);
    const title = document.createElementNS(SVG, 'title');
    title.textContent = `${total} events in the last 2 minutes`;
    svg.append(title);
    return svg;
  }

  // Every 2 s, the activity buckets move on.
  setInterval(() => {
    for (const q of S.queues.values()) {
      q.activity.push(0);
      if (q.activity.length > SPARK_BUCKETS) q.activity.shift();
    }
  }, REFRESH_MS);

  // ---------------------------------------------------------------- queue detail

  const TABS = [
    ['waiting', 'Waiting', (c) => c.waiting],
    ['prioritized', 'Prioritized', (c) => c.prioritized],
    ['delayed', 'Delayed', (c) => c.delayed],
    ['active', 'Active', (c) => c.active],
    ['completed', 'Completed', (c) => c.completed],
    ['dlq', 'Failed (DLQ)', (c) => c.failed],
  ];

  function selectQueue(name) {
    S.selected = name;
    S.tab = 'waiting';
    renderQueues();
    $('qdetail').classList.remove('hidden');
    loadDetail();
    $('qdetail').scrollIntoView({ behavior: 'smooth', block: 'nearest' });
  }

  let detailTimer = 0;
  function loadDetailSoon() {
    if (!detailTimer) detailTimer = setTimeout(() => { detailTimer = 0; loadDetail(); }, 400);
  }

  // renderDetailHead draws the selected queue's actions and tabs, with
  // the counts the page has now.
  function renderDetailHead() {
    const name = S.selected;
    if (!name) return;
    const q = S.queues.get(name) || queueOf(name);
    const c = q.counts || {};
    $('qd-name').textContent = name;
    $('qd-paused').classList.toggle('hidden', !q.paused);
    const enc = encodeURIComponent(name);
    const acts = [
      h('button', { class: 'ghost small', text: q.paused ? 'Resume' : 'Pause',
        onclick: () => act(q.paused ? `Resumed ${name}` : `Paused ${name}`, `/queues/${enc}/${q.paused ? 'resume' : 'pause'}`, { method: 'POST' }) }),
    ];
    if (S.tab === 'dlq') {
      acts.push(h('button', { class: 'small', text: 'Retry all', disabled: !c.failed,
        onclick: () => act('Retried the dead-letter queue', `/queues/${enc}/dlq/retry`, { method: 'POST', body: {} }) }));
      acts.push(h('button', { class: 'small danger', text: 'Purge', disabled: !c.failed,
        onclick: () => confirm(`Delete every job in the dead-letter queue of ${name}?`) &&
          act('Purged the dead-letter queue', `/queues/${enc}/dlq/purge`, { method: 'POST' }) }));
    }
    acts.push(h('button', { class: 'ghost small', text: 'Close', onclick: () => {
      S.selected = null;
      saveHash();
      $('qdetail').classList.add('hidden');
      renderQueues();
    } }));
    $('qd-actions').replaceChildren(...acts);
    $('qd-tabs').replaceChildren(...TABS.map(([key, label, count]) => h('button', {
      class: S.tab === key ? 'on' : '', role: 'tab', 'aria-selected': S.tab === key ? 'true' : 'false',
      onclick: () => { S.tab = key; loadDetail(); },
    }, label, h('span', { class: 'count', text: n(count(c) || 0) }))));
  }

  async function loadDetail() {
    const name = S.selected;
    saveHash();
    if (!name) return;
    renderDetailHead();
    const enc = encodeURIComponent(name);
    try {
      if (S.tab === 'dlq') {
        const r = await api(`/queues/${enc}/dlq?limit=50`);
        if (S.selected !== name || S.tab !== 'dlq') return;
        renderDLQ(name, r.data.entries || [], r.data.total || 0);
      } else {
        const tab = S.tab;
        const r = await api(`/queues/${enc}/jobs/list?state=${tab}&limit=50`);
        if (S.selected !== name || S.tab !== tab) return;
        renderJobs(r.data.jobs || [], tab);
      }
    } catch (e) {
      if (e.message !== 'unauthorized') $('qd-body').replaceChildren(h('p', { class: 'empty', text: 'Could not load: ' + e.message }));
    }
  }

  function renderJobs(jobs, tab) {
    if (!jobs.length) {
      $('qd-body').replaceChildren(h('p', { class: 'empty', text: `No ${tab} jobs.` }));
      return;
    }
    const timeCol = tab === 'delayed' ? 'Runs' : tab === 'completed' ? 'Finished' : tab === 'active' ? 'Started' : 'Created';
    const timeOf = (j) => (tab === 'delayed' ? j.runAt : tab === 'completed' ? j.completedAt : tab === 'active' ? j.startedAt : j.createdAt);
    $('qd-body').replaceChildren(h('div', { class: 'table-wrap' }, h('table', {},
      h('thead', {}, h('tr', {}, h('th', { text: 'Id' }), h('th', { text: 'Name' }), h('th', { class: 'num', text: 'Priority' }),
        h('th', { class: 'num', text: 'Attempts' }), h('th', { text: 'Progress' }), h('th', { text: timeCol }))),
      h('tbody', {}, jobs.map((j) => h('tr', { class: 'clickable', dataset: { jobId: j.id }, onclick: () => openJob(j.id) },
        h('td', { class: 'mono', title: j.id, text: shortId(j.id) }),
        h('td', { text: j.name }),
        h('td', { class: 'num', text: j.priority }),
        h('td', { class: 'num', text: `${j.attempts}/${j.maxAttempts}` }),
        h('td', {}, progressBar(j.progress)),
        h('td', { title: when(timeOf(j)), text: ago(timeOf(j)) })))))));
  }

  function progressBar(p) {
    if (typeof p !== 'number') return p == null ? '' : JSON.stringify(p);
    const v = Math.max(0, Math.min(100, p));
    return h('div', { class: 'progress', title: v + '%' }, h('i', { style: `width:${v}%` }));
  }

  function renderDLQ(name, entries, total) {
    if (!entries.length) {
      $('qd-body').replaceChildren(h('p', { class: 'empty', text: 'The dead-letter queue is empty.' }));
      return;
    }
    const enc = encodeURIComponent(name);
    $('qd-body').replaceChildren(...[
      total > entries.length ? h('p', { class: 'hint', text: `Showing ${entries.length} of ${n(total)}.` }) : null,
      h('div', { class: 'table-wrap' }, h('table', {},
        h('thead', {}, h('tr', {}, h('th', { text: 'Id' }), h('th', { text: 'Reason' }), h('th', { text: 'Error' }),
          h('th', { class: 'num', text: 'Attempts' }), h('th', { text: 'Failed' }), h('th', {}))),
        h('tbody', {}, entries.map((e) => h('tr', { class: 'clickable', dataset: { jobId: e.job.id }, onclick: () => openJob(e.job.id) },
          h('td', { class: 'mono', title: e.job.id, text: shortId(e.job.id) }),
          h('td', {}, h('span', { class: 'badge b-failed', text: e.reason })),
          h('td', { title: e.error || '', text: (e.error || '').slice(0, 80) }),
          h('td', { class: 'num', text: e.job.attempts }),
          h('td', { title: when(e.enteredAt), text: ago(e.enteredAt) }),
          h('td', { class: 'num' }, h('button', { class: 'small', text: 'Retry', onclick: (ev) => {
            ev.stopPropagation();
            act(`Retried ${shortId(e.job.id)}`, `/queues/${enc}/dlq/retry`, { method: 'POST', body: { jobId: e.job.id } });
          } })))))))].filter(Boolean));
  }

  // ---------------------------------------------------------------- side lists

  function renderCrons(c) {
    const list = (c && c.list) || [];
    $('cron-count').textContent = list.length ? n(c.total) : '';
    if (!list.length) {
      $('crons').replaceChildren(h('p', { class: 'empty', text: 'No schedules.' }));
      return;
    }
    $('crons').replaceChildren(...list.map((s) => h('div', { class: 'item' },
      h('div', { class: 'row' }, h('span', { class: 'name', text: s.name }), h('span', { class: 'sub', title: when(s.nextRun), text: 'next ' + ago(s.nextRun) })),
      h('div', { class: 'row sub' },
        h('span', {}, h('code', { text: s.schedule || `every ${every(s.repeatEvery)}` }), ' → ', s.queue),
        h('span', { text: `${n(s.executions)} run${s.executions === 1 ? '' : 's'}` })))));
  }

  function every(ms) {
    const u = [[86400e3, 'd'], [3600e3, 'h'], [60e3, 'm'], [1e3, 's']].find(([d]) => ms >= d && ms % d === 0);
    return u ? `${ms / u[0]}${u[1]}` : `${ms} ms`;
  }

  function renderWorkers(w) {
    const list = (w && w.list) || [];
    $('worker-count').textContent = list.length ? `${n(w.active)} active` : '';
    if (!list.length) {
      $('workers').replaceChildren(h('p', { class: 'empty', text: 'No registered workers.' }));
      return;
    }
    $('workers').replaceChildren(...list.map((x) => {
      const stale = Date.now() - x.lastSeen > 30000;
      return h('div', { class: 'item' },
        h('div', { class: 'row' }, h('span', { class: 'name', text: x.name || x.id }),
          h('span', { class: 'badge ' + (stale ? 'b-failed' : 'b-completed'), text: stale ? 'stale' : 'active' })),
        h('div', { class: 'row sub' }, h('span', { text: (x.queues || []).join(', ') }),
          h('span', { text: `${n(x.activeJobs)} active · ${n(x.processedJobs)} done · ${n(x.failedJobs)} failed` })),
        h('div', { class: 'sub', title: when(x.lastSeen), text: 'seen ' + ago(x.lastSeen) }));
    }));
  }

  // ---------------------------------------------------------------- job drawer

  async function openJob(id) {
    id = String(id).trim();
    if (!id) return;
    S.jobOpen = id;
    saveHash();
    $('jd-id').textContent = id;
    $('jd-body').replaceChildren(h('p', { class: 'empty', text: 'Loading…' }));
    $('drawer').classList.add('open');
    $('drawer').setAttribute('aria-hidden', 'false');
    let job, logs = [];
    try {
      const enc = encodeURIComponent(id);
      const [jr, lr] = await Promise.all([api(`/jobs/${enc}`), api(`/jobs/${enc}/logs`)]);
      if (S.jobOpen !== id) return;
      if (!jr.data.ok) {
        $('jd-body').replaceChildren(h('p', { class: 'empty', text: `No job with this id (${jr.data.error}). Completed jobs removed on completion, and purged ones, are gone.` }));
        return;
      }
      job = jr.data.job;
      logs = (lr.data.data && lr.data.data.logs) || [];
    } catch (e) {
      if (e.message !== 'unauthorized') $('jd-body').replaceChildren(h('p', { class: 'empty', text: 'Could not load: ' + e.message }));
      return;
    }
    renderJob(job, logs);
  }

  function renderJob(j, logs) {
    const enc = encodeURIComponent(j.id), qenc = encodeURIComponent(j.queue);
    const acts = [];
    if (j.state === 'failed') {
      acts.push(h('button', { class: 'small', text: 'Retry', onclick: () => act('Retried', `/queues/${qenc}/dlq/retry`, { method: 'POST', body: { jobId: j.id } }).then(() => openJob(j.id)) }));
    }
    if (j.state === 'delayed') {
      acts.push(h('button', { class: 'small', text: 'Run now', onclick: () => act('Promoted', `/jobs/${enc}/promote`, { method: 'POST' }).then(() => openJob(j.id)) }));
    }
    if (['waiting', 'delayed', 'prioritized', 'paused'].includes(j.state)) {
      acts.push(h('button', { class: 'small danger', text: 'Remove', onclick: () => confirm('Remove this job?') &&
        act('Removed', `/jobs/${enc}`, { method: 'DELETE' }).then(() => openJob(j.id)) }));
    }
    const kv = [
      ['State', h('span', { class: 'badge b-' + j.state, text: j.state })],
      ['Queue', h('a', { href: '#', text: j.queue, onclick: (e) => { e.preventDefault(); closeJob(); selectQueue(j.queue); } })],
      ['Name', j.name],
      ['Attempts', `${j.attempts} of ${j.maxAttempts}`],
      ['Priority', j.priority],
      ['Created', `${when(j.createdAt)} (${ago(j.createdAt)})`],
      j.runAt > j.createdAt ? ['Runs at', `${when(j.runAt)} (${ago(j.runAt)})`] : null,
      j.startedAt ? ['Started', `${when(j.startedAt)} (${ago(j.startedAt)})`] : null,
      j.completedAt ? ['Finished', `${when(j.completedAt)} (${ago(j.completedAt)})`] : null,
      j.progress ? ['Progress', h('span', {}, typeof j.progress === 'number' ? j.progress + '%' : JSON.stringify(j.progress), j.progressMessage ? ' — ' + j.progressMessage : '')] : null,
      j.customId ? ['Custom id', j.customId] : null,
      j.parentId ? ['Parent', h('a', { href: '#', class: 'mono', text: j.parentId, onclick: (e) => { e.preventDefault(); openJob(j.parentId); } })] : null,
      j.groupId ? ['Group', j.groupId] : null,
      j.tags && j.tags.length ? ['Tags', j.tags.join(', ')] : null,
    ].filter(Boolean);
    const pretty = (v) => (v === undefined ? 'undefined' : JSON.stringify(v, null, 2));
    const blocks = [
      acts.length ? h('div', { class: 'actions' }, acts) : null,
      h('dl', { class: 'kv' }, kv.flatMap(([k, v]) => [h('dt', { text: k }), h('dd', {}, v)])),
      h('div', { class: 'block' }, h('h3', { text: 'Data' }), h('pre', { id: 'jd-data', text: pretty(j.data) })),
    ];
    if (j.state === 'completed' || j.returnvalue !== undefined) {
      blocks.push(h('div', { class: 'block' }, h('h3', { text: 'Result' }), h('pre', { id: 'jd-result', text: pretty(j.returnvalue) })));
    }
    if (j.failedReason || (j.stacktrace && j.stacktrace.length)) {
      blocks.push(h('div', { class: 'block' }, h('h3', { text: 'Error' }),
        h('pre', { class: 'error', text: [j.failedReason, (j.stacktrace || []).join('\n')].filter(Boolean).join('\n\n') })));
    }
    blocks.push(h('div', { class: 'block' }, h('h3', { text: `Logs (${logs.length})` }),
      logs.length ? h('div', { class: 'logs' }, logs.map((l) => h('div', { class: 'lvl-' + l.level },
        h('span', { class: 'when', title: when(l.timestamp), text: clock(l.timestamp) + ' ' }), `[${l.level}] `, l.message))) : h('p', { class: 'empty', text: 'No logs.' })));
    if (j.timeline && j.timeline.length) {
      blocks.push(h('div', { class: 'block' }, h('h3', { text: 'Timeline' }), h('ol', { class: 'timeline' },
        j.timeline.map((t) => h('li', { class: 's-' + t.state }, h('strong', { text: t.state }),
          t.attempt ? ` (attempt ${t.attempt})` : '', h('span', { class: 'when', title: when(t.timestamp), text: clock(t.timestamp) }),
          t.error ? h('div', { class: 'sub', text: t.error }) : null)))));
    }
    $('jd-body').replaceChildren(...blocks.filter(Boolean));
  }

  function closeJob() {
    S.jobOpen = null;
    saveHash();
    $('drawer').classList.remove('open');
    $('drawer').setAttribute('aria-hidden', 'true');
  }
  $('jd-close').addEventListener('click', closeJob);
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape') closeJob(); });
  $('search').addEventListener('submit', (e) => {
    e.preventDefault();
    openJob($('search-id').value);
  });

  // ---------------------------------------------------------------- live events

  const SHORT = { 'job:pushed': 'pushed', 'job:active': 'active', 'job:completed': 'completed', 'job:failed': 'failed',
    'job:progress': 'progress', 'job:stalled': 'stalled', 'job:removed': 'removed', 'job:delayed': 'delayed',
    'job:retried': 'retried', 'job:waiting': 'waiting', 'job:duplicated': 'duplicate' };

  function onEvent(name, data) {
    if (name === 'queue:counts') {
      const q = queueOf(data.queue);
      q.counts = Object.assign({}, q.counts, data);
      renderQueuesSoon();
      return;
    }
    if (!name.startsWith('job:') || !data || !data.queue) return;
    const q = queueOf(data.queue);
    q.activity[q.activity.length - 1]++;
    if (data.queue === S.selected) loadDetailSoon();
    if (data.jobId && data.jobId === S.jobOpen) reloadJobSoon();
    if (!S.feedPaused) {
      S.feedBuf.push({ name, data });
      if (S.feedBuf.length > FEED_MAX) S.feedBuf.splice(0, S.feedBuf.length - FEED_MAX);
      feedSoon();
    }
  }

  let jobTimer = 0;
  function reloadJobSoon() {
    if (!jobTimer) jobTimer = setTimeout(() => { jobTimer = 0; if (S.jobOpen) openJobQuiet(S.jobOpen); }, 300);
  }
  async function openJobQuiet(id) {
    try {
      const enc = encodeURIComponent(id);
      const [jr, lr] = await Promise.all([api(`/jobs/${enc}`), api(`/jobs/${enc}/logs`)]);
      if (S.jobOpen === id && jr.data.ok) renderJob(jr.data.job, (lr.data.data && lr.data.data.logs) || []);
    } catch (e) { /* the next event tries again */ }
  }

  let feedFrame = 0;
  function feedSoon() {
    if (!feedFrame) feedFrame = requestAnimationFrame(flushFeed);
  }
  function flushFeed() {
    feedFrame = 0;
    const items = S.feedBuf.splice(0);
    if (!items.length) return;
    const feed = $('feed');
    const frag = document.createDocumentFragment();
    for (const { name, data } of items.reverse()) {
      const short = SHORT[name] || name.replace('job:', '');
      frag.append(h('li', { class: 'fresh', dataset: { jobId: data.jobId, queue: data.queue }, title: data.error || data.jobId,
        onclick: () => openJob(data.jobId) },
      h('span', { class: 't', title: when(data.timestamp || Date.now()), text: clock(data.timestamp || Date.now()) }),
      h('span', {}, h('span', { class: 'badge b-' + short, text: short })),
      h('span', { class: 'who' }, h('span', { class: 'q', text: data.queue + ' · ' }), h('span', { class: 'mono', text: data.jobId }))));
    }
    feed.prepend(frag);
    while (feed.children.length > FEED_MAX) feed.lastChild.remove();
    $('feed-empty').classList.add('hidden');
  }
  $('feed-pause').addEventListener('click', () => {
    S.feedPaused = !S.feedPaused;
    $('feed-pause').textContent = S.feedPaused ? 'Resume' : 'Pause';
  });

  function setLive(kind) {
    $('live').className = 'live ' + kind;
    $('live-text').textContent = kind === 'on' ? 'live' : kind === 'retry' ? 'reconnecting' : 'connecting';
  }

  // The stream is read with fetch rather than EventSource, which cannot
  // send the Authorization header a server with tokens needs. It follows
  // the same rules: the retry delay the server gives, and Last-Event-ID
  // on reconnection so that nothing kept is missed.
  async function stream() {
    let lastId = '', retry = 3000;
    for (;;) {
      try {
        setLive('connecting');
        const headers = { Accept: 'text/event-stream' };
        if (S.token) headers.Authorization = 'Bearer ' + S.token;
        if (lastId) headers['Last-Event-ID'] = lastId;
        const res = await fetch('/events', { headers, cache: 'no-store' });
        if (res.status === 401) {
          askToken();
          await tokenReady();
          continue;
        }
        if (!res.ok || !res.body) throw new Error('HTTP ' + res.status);
        setLive('on');
        const reader = res.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            let event = 'message', data = null, id = null;
            for (const line of block.split('\n')) {
              if (!line || line[0] === ':') continue;
              const c = line.indexOf(':');
              const field = c < 0 ? line : line.slice(0, c);
              let val = c < 0 ? '' : line.slice(c + 1);
              if (val[0] === ' ') val = val.slice(1);
              if (field === 'data') data = data === null ? val : data + '\n' + val;
              else if (field === 'event') event = val;
              else if (field === 'id') id = val;
              else if (field === 'retry' && /^\d+$/.test(val)) retry = +val;
            }
            if (id !== null) lastId = id;
            if (data === null) continue;
            try {
              onEvent(event, JSON.parse(data));
            } catch (e) { /* a malformed event is skipped */ }
          }
        }
      } catch (e) { /* reconnect below */ }
      setLive('retry');
      await new Promise((r) => setTimeout(r, retry));
    }
  }

  // ---------------------------------------------------------------- links

  // The address says what is open (#queue=q&tab=dlq&job=id), so that a
  // view can be shared during an incident and survives a reload.
  function saveHash() {
    const p = new URLSearchParams();
    if (S.selected) p.set('queue', S.selected);
    if (S.selected && S.tab !== 'waiting') p.set('tab', S.tab);
    if (S.jobOpen) p.set('job', S.jobOpen);
    const hsh = p.toString();
    history.replaceState(null, '', hsh ? '#' + hsh : location.pathname);
  }

  function loadHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    const q = p.get('queue');
    if (q) {
      selectQueue(q);
      const tab = p.get('tab');
      if (tab && TABS.some(([k]) => k === tab)) {
        S.tab = tab;
        loadDetail();
      }
    }
    if (p.get('job')) openJob(p.get('job'));
  }

  // ---------------------------------------------------------------- start

  loadHash();
  refresh();
  setInterval(refresh, REFRESH_MS);
  setInterval(() => { if (S.selected) loadDetail(); }, 10000);
  stream();
})();
