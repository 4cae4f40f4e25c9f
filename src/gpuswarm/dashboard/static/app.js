// gpuswarm dashboard: one page of plain JavaScript, no framework, no build step.
// Every string from a run (task names, log lines, reasons, diffs) reaches the page through
// textContent or an attribute set by the DOM API: never as HTML.
'use strict';

// The session: the login redirect (the printed URL's token, exchanged once) brings it in the
// fragment, #session=...; it is kept in this origin's localStorage (another port is another
// origin: no other server's page can read it; no cookie carries it) and leaves the address bar.
const SESSION_KEY = 'gpuswarm-session';
const SESSION = takeSession();
const NO_SESSION = 'No session: open the URL with ?token= that `gpuswarm dashboard` printed.';
const READ_ONLY = metaContent('gpuswarm-read-only') === '1';
const SVGNS = 'http://www.w3.org/2000/svg';
const OUTCOMES = ['done', 'failed', 'timeout', 'retried', 'interrupted', 'cancelled', 'skipped', 'running'];
const STATES = ['pending', 'running', 'done', 'failed', 'skipped', 'cancelled', 'blocked', 'dependency_failed'];
const WINDOWS = [[-1, 'fit'], [300, '5 min'], [1800, '30 min'], [7200, '2 h'], [0, 'all']];

function takeSession() {
  const m = /^#session=([A-Za-z0-9_-]+)$/.exec(location.hash);
  if (m) {
    history.replaceState(null, '', location.pathname + location.search);
    try { localStorage.setItem(SESSION_KEY, m[1]); } catch (e) { /* no storage: this page only */ }
    return m[1];
  }
  try { return localStorage.getItem(SESSION_KEY) || ''; } catch (e) { return ''; }
}
function withSession(path) {
  return `${path}${path.includes('?') ? '&' : '?'}session=${encodeURIComponent(SESSION)}`;
}

function metaContent(name) {
  const m = document.querySelector(`meta[name="${name}"]`);
  return m ? m.getAttribute('content') : '';
}

// -- DOM helpers ---------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
function setAttrs(node, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'text') node.textContent = String(v);
    else if (k === 'class') node.setAttribute('class', v);
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? '' : String(v));
  }
}
function svgEl(tag, attrs, ...children) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === 'text') node.textContent = String(v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children) node.append(c);
  return node;
}
function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
function replace(node, ...children) { clear(node); for (const c of children.flat()) if (c) node.append(c); }
function badge(state) {
  return el('span', { class: `badge st-${String(state).replace(/\s+/g, '-')}`, 'data-state': state, text: state });
}
function cssState(s) { return String(s).replace(/[^a-z0-9]+/gi, '-'); }

function fmtSeconds(s) {
  if (s === null || s === undefined || s === '' || !isFinite(s)) return '';
  s = Number(s);
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)}s`;
  const m = Math.floor(s / 60), sec = Math.floor(s % 60);
  if (m < 60) return `${m}m${String(sec).padStart(2, '0')}s`;
  const h = Math.floor(m / 60);
  return `${h}h${String(m % 60).padStart(2, '0')}m`;
}
// One formatter each: toLocale*String() builds a new one per call (a millisecond each: a
// Gantt of 2,400 bars took seconds to draw).
const TIME_FMT = new Intl.DateTimeFormat([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
function fmtTime(ts) { return ts ? TIME_FMT.format(new Date(ts * 1000)) : ''; }
// ISO 8601 in this browser's time zone, with its offset: 2026-12-02 10:34:06+01:00
function fmtDate(ts) {
  if (!ts) return '';
  const d = new Date(ts * 1000), p = (n) => String(Math.abs(n)).padStart(2, '0');
  const off = -d.getTimezoneOffset();
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`
    + `${off < 0 ? '-' : '+'}${p(Math.trunc(off / 60))}:${p(off % 60)}`;
}
function fmtMetric(v) { return v === null || v === undefined ? '—' : Number(v).toFixed(6); }
function fmtBytes(n) { return `${(n / 2 ** 30).toFixed(1)}G`; }

// Server clock offset: elapsed times use the server's clock.
let clockSkew = 0;
function serverNow() { return Date.now() / 1000 + clockSkew; }
function noteServerTime(now) { if (now) clockSkew = now - Date.now() / 1000; }

// -- talking to the server -----------------------------------------------------------------
async function getJSON(path) {
  const r = await fetch(path, { headers: { Accept: 'application/json', 'X-Gpuswarm-Session': SESSION } });
  const data = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (!r.ok) throw new Error(data.error || `HTTP ${r.status}`);
  return data;
}
async function post(path, body) {
  const r = await fetch(path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-Gpuswarm-Session': SESSION },
    body: JSON.stringify(body || {}),
  });
  const data = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (!r.ok) throw new Error(data.error || `HTTP ${r.status}`);
  return data;
}
function flash(message, error) {
  const box = document.getElementById('flash');
  if (!box) return;
  replace(box, el('div', { class: error ? 'notice error' : 'notice', role: 'status', text: message }));
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => clear(box), error ? 12000 : 5000);
}
async function act(rid, action, body, done) {
  if (action === 'cancel' && !window.confirm(`Cancel ${(body.tasks || []).join(', ')}? A running task is stopped, a pending one never starts (retry brings it back).`)) return;
  try {
    const data = await post(`/api/runs/${encodeURIComponent(rid)}/actions/${action}`, body);
    flash(describe(action, data));
    if (done) done(data);
  } catch (e) {
    flash(`${action}: ${e.message}`, true);
  }
}
function describe(action, data) {
  if (data.tasks) return data.tasks.map((t) => `${t.task}: ${t.was} → ${t.now}${t.note ? ` (${t.note})` : ''}`).join('; ') || `${action}: nothing to do`;
  if (action === 'add') return `added ${nTasks(data.added)}`;
  if (action === 'priority') return `${data.task}: priority ${data.was} → ${data.priority}`;
  if (action === 'pause' || action === 'unpause') return `${action}d ${data.slot ? `slot ${data.slot}` : 'the run'}${data.changed ? '' : ' (no change)'}`;
  return `${action}: ok`;
}

// A live stream: an EventSource that marks the connection state; closed when the page goes.
const streams = new Set();
function stream(path, handlers) {
  const es = new EventSource(withSession(path)); // EventSource sends no header of ours
  const conn = document.getElementById('conn');
  es.onopen = () => { conn.textContent = 'live'; conn.className = 'conn live'; };
  es.onerror = () => { if (es.readyState !== EventSource.OPEN) { conn.textContent = 'reconnecting…'; conn.className = 'conn down'; } };
  for (const [name, fn] of Object.entries(handlers)) {
    es.addEventListener(name, (ev) => {
      conn.textContent = 'live'; conn.className = 'conn live';
      fn(JSON.parse(ev.data), ev);
    });
  }
  streams.add(es);
  return es;
}
const timers = new Set();
function every(ms, fn) { const t = setInterval(fn, ms); timers.add(t); return t; }
function leavePage() {
  for (const es of streams) es.close();
  streams.clear();
  for (const t of timers) clearInterval(t);
  timers.clear();
}

function crumbs(...parts) {
  replace(document.getElementById('crumbs'), parts.map(([text, href]) => el('span', {}, href ? el('a', { href, text }) : text)));
}
function page(...children) {
  const main = document.getElementById('main');
  replace(main, el('div', { id: 'flash' }), ...children);
  return main;
}

// -- router --------------------------------------------------------------------------------
function route() {
  leavePage();
  if (!SESSION) { page(el('div', { class: 'notice error', 'data-testid': 'no-session', text: NO_SESSION })); return; }
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  try {
    if (parts[0] === 'run' && parts[2] === 'task' && parts[3]) taskPage(parts[1], parts.slice(3).join('/'));
    else if (parts[0] === 'run' && parts[1]) runPage(parts[1]);
    else if (parts[0] === 'exp' && parts[1]) experimentPage(parts[1]);
    else runsPage();
  } catch (e) {
    page(el('div', { class: 'notice error', text: String(e) }));
  }
}
window.addEventListener('hashchange', route);
document.addEventListener('DOMContentLoaded', () => { hatchDefs(); route(); });

function hatchDefs() {
  const defs = svgEl('svg', { width: 0, height: 0, 'aria-hidden': 'true' },
    svgEl('defs', {},
      svgEl('pattern', { id: 'idle-hatch', width: 6, height: 6, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
        svgEl('rect', { width: 6, height: 6, fill: '#fff' }),
        svgEl('rect', { width: 2.5, height: 6, fill: '#f3b3b1' }))));
  defs.style.position = 'absolute';
  document.body.append(defs);
}

// -- counts and progress -------------------------------------------------------------------
function countsLine(counts) {
  return el('span', { class: 'counts' },
    Object.entries(counts).filter(([k, n]) => n > 0 || ['pending', 'running', 'done', 'failed'].includes(k)).map(([k, n]) =>
      el('span', { 'data-count': k }, `${k} `, el('b', { text: n }))));
}
function progressBar(counts, total) {
  const bar = el('div', { class: 'progress', title: `${total} tasks` });
  if (!total) return bar;
  const part = (cls, n) => { if (n > 0) { const s = el('span', { class: cls }); s.style.width = `${(100 * n) / total}%`; bar.append(s); } };
  part('p-done', counts.done || 0);
  part('p-failed', counts.failed || 0);
  part('p-other', (counts.cancelled || 0) + (counts.skipped || 0));
  part('p-running', counts.running || 0);
  return bar;
}

// == runs page ===============================================================================
function runsPage() {
  crumbs(['runs']);
  document.title = 'gpuswarm dashboard';
  const runsBox = el('div', { id: 'runs' }, el('p', { class: 'muted', text: 'loading…' }));
  const expBox = el('div', { id: 'experiments' });
  const problems = el('div', { id: 'problems' });
  page(el('h1', { text: 'Runs' }), runsBox, expBox, problems);
  stream('/api/events/runs', {
    runs: (data) => {
      replace(runsBox, runsTable(data.runs, data.roots));
      replace(expBox, data.experiments.length ? [el('h2', { text: 'Research experiments' }), experimentsTable(data.experiments)] : []);
      const probs = Object.entries(data.problems || {});
      replace(problems, probs.length ? [el('h2', { text: 'Not shown' }), el('ul', {}, probs.map(([p, why]) => el('li', { class: 'mono' }, `${p}: ${why}`)))] : []);
    },
  });
}
function runsTable(runs, roots) {
  if (!runs.length) return el('p', { class: 'muted' }, `No runs under ${roots.join(', ')} yet: they appear here as they start.`);
  return el('table', { 'data-testid': 'runs-table' },
    el('thead', {}, el('tr', {}, ['run', 'state', 'tasks', 'progress', 'ETA', 'spent', 'folder'].map((h) => el('th', { text: h })))),
    el('tbody', {}, runs.map((r) => el('tr', { 'data-run': r.id },
      el('td', {}, el('a', { href: `#/run/${encodeURIComponent(r.id)}`, text: r.title })),
      el('td', {}, badge(r.state)),
      el('td', {}, countsLine(r.counts), el('span', { class: 'muted' }, ` of ${r.total}`)),
      el('td', {}, progressBar(r.counts, r.total), el('span', { class: 'muted', text: `${Math.round(r.progress * 100)}%` })),
      el('td', { text: r.live && r.eta !== null ? fmtSeconds(r.eta) : '' }),
      el('td', { 'data-testid': 'run-spent', text: fmtSpent(r.spent) }),
      el('td', { class: 'mono muted cell-clip', title: r.path, text: r.folder }),
    ))));
}
function experimentsTable(exps) {
  return el('table', { 'data-testid': 'experiments-table' },
    el('thead', {}, el('tr', {}, ['experiment', 'metric', 'BASE', 'best', 'experiments', 'kept', 'in flight', 'runner'].map((h) => el('th', { text: h })))),
    el('tbody', {}, exps.map((x) => el('tr', { 'data-exp': x.id },
      el('td', {}, el('a', { href: `#/exp/${encodeURIComponent(x.id)}`, text: x.title })),
      el('td', { text: `${x.metric} (${x.goal})` }),
      el('td', { class: 'mono', text: x.base }),
      el('td', { class: 'mono', text: fmtMetric(x.best) }),
      el('td', { class: 'num', text: x.experiments }),
      el('td', { class: 'num', text: x.kept }),
      el('td', { class: 'num', text: x.in_flight }),
      el('td', {}, x.live ? badge('live') : el('span', { class: 'muted', text: 'idle' })),
    ))));
}

// == run page ================================================================================
function runPage(rid) {
  const st = { rid, view: null, lanes: {}, feed: [], window: -1, table: { state: null, sort: 'order', dir: 'asc', offset: 0, limit: 50, q: '' }, lastCounts: '' };
  const head = el('div', { id: 'run-head' });
  const lanesBox = el('div', { class: 'lanes', id: 'lanes', 'data-testid': 'lanes' });
  const windowTabs = el('div', { class: 'tabs' });
  const legend = el('div', { class: 'legend' }, OUTCOMES.map((o) => el('span', {}, el('i', { class: `o-${o}` }), o)), el('span', {}, el('i', { class: 'idle-key' }), 'idle'));
  const failures = el('div', { id: 'failures' });
  const failuresTitle = el('h2', { text: 'Recent failures' });
  const feed = el('div', { class: 'feed card mono', id: 'feed' });
  const tableBox = el('div', { id: 'tasks' });
  const addBox = el('div', { id: 'add-box' });
  const groupsBox = el('div', { id: 'groups' }); // issue 35: each group's progress
  page(head, groupsBox, el('div', { class: 'row' }, el('h2', { class: 'grow', text: 'GPU slots' }), windowTabs), legend, lanesBox,
    el('div', { class: 'cols' }, el('div', {}, failuresTitle, failures), el('div', {}, el('h2', { text: 'Events' }), feed)),
    el('div', { class: 'row' }, el('h2', { class: 'grow', text: 'Tasks' })), addBox, tableBox);

  const drawWindowTabs = () => replace(windowTabs, WINDOWS.map(([s, label]) => el('button', { class: st.window === s ? 'on small' : 'small', onclick: () => { st.window = s; drawWindowTabs(); drawLanes(); } }, label)));
  drawWindowTabs();

  const drawHead = () => {
    const v = st.view;
    crumbs(['runs', '#/'], [v.title]);
    document.title = `${v.title}: gpuswarm`;
    const controls = [];
    if (!READ_ONLY) {
      // pausing and adding are for a supervisor that runs: an ended run is resumed instead
      if (v.live) {
        controls.push(v.paused
          ? el('button', { 'data-action': 'unpause', onclick: () => act(rid, 'unpause', {}) }, 'Unpause run')
          : el('button', { 'data-action': 'pause', onclick: () => act(rid, 'pause', {}) }, 'Pause run'));
        controls.push(el('button', { 'data-action': 'add', onclick: () => toggleAdd(addBox, rid) }, 'Add tasks…'));
      } else clear(addBox);
      if ((v.counts.failed || 0) > 0) controls.push(el('button', { 'data-action': 'retry-failed', onclick: () => act(rid, 'retry', { failed: true }) }, 'Retry failed'));
    }
    const f = v.final;
    replace(head,
      el('h1', {}, v.title, badge(v.state), v.paused ? el('span', { class: 'badge st-stopped', text: 'paused' }) : null, el('span', { class: 'grow' }), ...controls),
      el('div', { class: 'card row' },
        el('div', { class: 'grow' }, countsLine(v.counts), el('span', { class: 'muted' }, ` of ${v.total}`)),
        progressBar(v.counts, v.total),
        el('span', { 'data-testid': 'progress', text: `${Math.round(v.progress * 100)}%` }),
        el('span', { class: 'muted' }, v.live && v.eta !== null ? `ETA ${fmtSeconds(v.eta)}` : ''),
        v.spent ? el('span', { 'data-testid': 'spent', text: `spent ${fmtSpent(v.spent)}` }) : null,
        el('span', { class: 'mono muted cell-clip', title: v.path, text: v.folder })),
      f && f.window ? el('div', { class: 'muted', 'data-testid': 'run-busy' },
        `GPU busy ${pct(f.busy_share)} from the first start to the last end (${fmtDate(f.window[0])} → ${fmtTime(f.window[1])}, ${fmtSeconds(f.window[1] - f.window[0])})`) : null,
      v.note ? el('div', { class: 'notice', text: v.note }) : null,
      v.slurm && v.slurm.length ? el('div', { class: 'card mono', 'data-testid': 'slurm' }, v.slurm.map((line) => el('div', { text: line }))) : null,
      !v.live && !READ_ONLY ? el('div', { class: 'notice', 'data-testid': 'ended-hint' },
        'This run has ended. To run more of it: ', el('code', { text: `gpuswarm add ${v.path} LIST` }), ' (or retry), then ',
        el('code', { text: `gpuswarm resume ${v.path}` }), '.') : null,
      f && f.quarantined.length ? el('div', { class: 'notice error', 'data-testid': 'quarantines' }, el('b', { text: 'Quarantined slots' }),
        el('ul', {}, f.quarantined.map((q) => el('li', { 'data-slot': q.slot },
          el('b', { class: 'mono', text: q.slot }), ` (GPU ${q.gpus.join(',')}): ${q.reason}`, q.lifted ? `; lifted: ${q.lifted}` : '; still out at the end')))) : null);
  };

  const drawLanes = () => {
    const v = st.view;
    if (!v) return;
    const f = v.final;
    // an ended run's window ends at its last end (fit: its first start to it), a live one's now
    const now = f && f.window ? f.window[1] : serverNow();
    const spans = Object.values(st.lanes).flat();
    const first = spans.length ? Math.min(...spans.map((b) => b[0])) : now - 60;
    const t1 = now;
    // fit: from the first bar shown (at most 30 min back, at least one minute)
    const t0 = f && f.window && st.window < 0 ? f.window[0]
      : st.window > 0 ? now - st.window
        : st.window === 0 ? Math.min(first, now - 60)
          : Math.min(now - 10, Math.max(now - 1800, first - 0.03 * (now - first)));
    const rows = v.slots.map((s) => laneRow(rid, v, s, st.lanes[s.label] || [], t0, t1, now, first));
    replace(lanesBox, rows.length ? rows : [el('div', { class: 'muted', text: 'No slot has started yet.' })]);
  };

  const drawFailures = () => {
    const fin = st.view.final;
    const unfinished = fin && fin.failures.some((x) => x.state !== 'failed'); // a stopped run's pending ones
    failuresTitle.textContent = fin ? `${unfinished ? 'Failures and unfinished tasks' : 'Failures'} (${fin.not_done ?? fin.failures.length})` : 'Recent failures';
    if (fin) {
      const more = (fin.not_done || 0) - fin.failures.length;
      replace(failures, fin.failures.length ? el('ul', { 'data-testid': 'failures' }, fin.failures.map((x) => el('li', { 'data-task': x.task },
        el('a', { class: 'mono', href: `#/run/${encodeURIComponent(rid)}/task/${encodeURIComponent(x.task)}`, text: x.task }), ' ', badge(x.state), ' ', el('span', { class: 'reason', text: x.reason }))),
      more > 0 ? el('li', { class: 'muted', text: `${more} more: see results.tsv` }) : null)
        : el('p', { class: 'muted', text: 'None: every task ended done, skipped or cancelled.' }));
      return;
    }
    const f = st.view.failures;
    replace(failures, f.length ? el('ul', { class: 'mono' }, f.map((line) => el('li', { text: line }))) : el('p', { class: 'muted', text: 'None.' }));
  };
  const drawGroups = () => { // the table `gpuswarm status --group --json` computes
    const groups = Object.entries(st.view.groups || {});
    replace(groupsBox, groups.length ? [el('h2', { text: 'Groups' }), el('table', { class: 'card', 'data-testid': 'groups' },
      el('thead', {}, el('tr', {}, ['group', 'ended', 'progress', 'states', 'ETA'].map((h) => el('th', { text: h })))),
      el('tbody', {}, groups.map(([name, g]) => el('tr', { 'data-group': name },
        el('td', { class: 'mono', text: name }),
        el('td', { class: 'num', text: `${g.ended}/${g.total}` }),
        el('td', {}, progressBar(g.counts, g.total), el('span', { 'data-testid': 'group-percent', text: ` ${g.percent.toFixed(1)}%` })),
        el('td', {}, countsLine(g.counts)),
        el('td', { class: 'muted', text: g.eta_seconds ? fmtSeconds(g.eta_seconds) : '' })))))] : []);
  };
  const drawFeed = () => {
    replace(feed, st.feed.slice(-150).reverse().map((e) => el('div', { title: JSON.stringify(e) }, el('span', { class: 't', text: fmtTime(e.ts) }), eventText(e))));
  };

  let tableTimer = null;
  const refreshTable = (soon) => {
    clearTimeout(tableTimer);
    tableTimer = setTimeout(() => loadTable(rid, st, tableBox), soon ? 0 : 700);
  };

  const apply = (data) => {
    noteServerTime(data.view.now);
    if (st.view && st.view.live !== data.view.live) st.lanes = {}; // ended: its records; resumed: the journal's
    st.view = data.view;
    if (data.lanes) Object.assign(st.lanes, data.lanes);
    if (data.feed) st.feed = data.feed.slice();
    if (data.events) { st.feed.push(...data.events); if (st.feed.length > 400) st.feed.splice(0, st.feed.length - 400); }
    drawHead(); drawGroups(); drawLanes(); drawFailures(); drawFeed(); drawTabs(st);
    const key = JSON.stringify(st.view.counts);
    if (key !== st.lastCounts) { st.lastCounts = key; refreshTable(!data.events); }
  };
  stream(`/api/runs/${encodeURIComponent(rid)}/events`, {
    snapshot: (data) => { st.lanes = {}; apply(data); },
    update: apply,
  });
  // elapsed times and running bars move each second; a run with nothing running is redrawn
  // every 5 s (its window still slides)
  let ticks = 0;
  every(1000, () => { ticks += 1; if (st.view && st.view.live && (st.view.slots.some((s) => s.task) || ticks % 5 === 0)) drawLanes(); });
  refreshTable(true); // the table's first page comes in parallel with the stream's snapshot
  st.refreshTable = refreshTable;
}

function laneRow(rid, v, s, bars, t0, t1, now, origin) {
  const fin = v.final ? v.final.slots[s.label] : null;
  const busy = Boolean(s.task);
  const gpuLine = s.gpu && s.gpu.length ? s.gpu.map((g) => {
    const util = el('span', { class: 'meter', title: `GPU ${g.index} utilisation ${g.util}%` }, el('span'));
    util.firstChild.style.width = `${g.util}%`;
    return el('div', { class: 'gpu' }, `GPU${g.index}`, util, `${g.util}%  ${fmtBytes(g.mem_used)}/${fmtBytes(g.mem_total)}`);
  }) : [];
  const headCell = el('div', { class: 'lane-head' },
    el('div', { class: 'lane-label mono', text: s.label }),
    el('div', { class: 'muted' }, s.host ? `host ${s.host}` : '', s.gpus.length ? ` · GPU ${s.gpus.join('+')}` : ''),
    gpuLine,
    s.paused ? el('span', { class: 'badge st-stopped', text: 'paused' }) : null,
    s.quarantined ? el('span', { class: 'badge st-failed', 'data-testid': 'quarantined', title: s.quarantined, text: fin ? s.quarantined : 'quarantined' }) : null,
    READ_ONLY || !v.live ? null : el('button', { class: 'small', 'data-action': s.paused ? 'unpause-slot' : 'pause-slot', onclick: () => act(rid, s.paused ? 'unpause' : 'pause', { slot: s.label }) }, s.paused ? 'unpause slot' : 'pause slot'));
  let nowCell;
  if (busy) {
    const elapsed = Math.max(0, now - s.since);
    const bar = el('div', { class: 'elapsed' + (s.timeout && elapsed > 0.8 * s.timeout ? ' late' : '') }, el('span'));
    bar.firstChild.style.width = s.timeout ? `${Math.min(100, (100 * elapsed) / s.timeout)}%` : '100%';
    nowCell = el('div', { class: 'lane-now' },
      el('div', { class: 'row' },
        el('a', { class: 'task mono', href: `#/run/${encodeURIComponent(rid)}/task/${encodeURIComponent(s.task)}`, 'data-testid': 'lane-task', text: s.task }),
        s.name && s.name !== s.task ? el('span', { class: 'muted lane-name', title: s.name, text: s.name }) : el('span', { class: 'grow' }),
        READ_ONLY ? null : el('button', { class: 'small danger', 'data-action': 'cancel-lane', onclick: () => act(rid, 'cancel', { tasks: [s.task] }) }, 'cancel')),
      el('div', { class: 'muted' }, `attempt ${s.attempt} · `, el('span', { 'data-testid': 'elapsed', text: fmtSeconds(elapsed) }), s.timeout ? ` of ${fmtSeconds(s.timeout)}` : ' (no timeout)'),
      bar,
      el('div', { class: 'lastline mono', title: s.last_line, 'data-testid': 'last-line', text: s.last_line || ' ' }));
  } else {
    nowCell = fin
      ? el('div', { class: 'lane-now' }, el('div', { text: 'ended' }),
        el('div', { class: 'muted', 'data-testid': 'slot-attempts', 'data-attempts': fin.attempts },
          `${fin.attempts} ${fin.attempts === 1 ? 'attempt' : 'attempts'} ran here, ${fin.exited} exited 0`))
      : el('div', { class: 'lane-now' }, el('div', { text: 'idle' }), el('div', { class: 'muted' }, `${s.done} ${s.done === 1 ? 'attempt' : 'attempts'} ended here`));
  }
  const whole = fin && v.final.window && t0 === v.final.window[0];
  const ganttCell = el('div', { class: 'lane-gantt' }, ...gantt(bars, t0, t1, now, origin, whole ? fin.busy_share : null, !v.live));
  return el('div', { class: busy ? 'lane busy' : fin ? 'lane ended' : 'lane idle', 'data-slot': s.label, 'data-task': s.task || '' }, headCell, nowCell, ganttCell);
}

// One lane's recent attempts: bars by outcome over a hatched background, so that idle time
// (no bar) is what stands out; the time before the run's first attempt is not idle.
function gantt(bars, t0, t1, now, origin, share, ended) {
  const W = 1000, H = 18, span = Math.max(1, t1 - t0);
  const x = (t) => ((Math.max(t0, Math.min(t1, t)) - t0) / span) * W;
  const from = Math.max(t0, Math.min(origin, t1));
  const svg = svgEl('svg', { class: 'gantt', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img' });
  svg.append(svgEl('rect', { class: 'idle-bg', x: x(from), y: 0, width: W - x(from), height: H }));
  let idle = 0, last = from, shown = 0;
  for (const [start, end, outcome, task, attempt] of bars) {
    const stop = end === null ? now : end;
    if (stop < t0 || start > t1) continue;
    idle += Math.max(0, Math.max(t0, start) - last);
    last = Math.max(last, stop);
    shown += 1;
    const w = Math.max(1.5, x(stop) - x(start));
    const rect = svgEl('rect', { class: `bar o-${cssState(outcome)}`, x: x(start), y: 0, width: w, height: H, 'data-outcome': outcome });
    rect.bar = [start, end, outcome, task, attempt];
    svg.append(rect);
  }
  // tooltips made when hovered: thousands of <title>s would double the drawing's cost
  svg.addEventListener('mouseover', (ev) => {
    const rect = ev.target;
    if (!rect.bar || rect.firstChild) return;
    const [start, end, outcome, task, attempt] = rect.bar;
    const stop = end === null ? serverNow() : end;
    rect.append(svgEl('title', { text: `${task} attempt ${attempt}: ${outcome}, ${fmtTime(start)}–${end === null ? 'now' : fmtTime(end)} (${fmtSeconds(stop - start)})` }));
  });
  idle += Math.max(0, t1 - last);
  svg.dataset.bars = String(shown);
  // an ended run's whole window: the server's busy share (first start → last end, as the report)
  const idlePct = share !== null && share !== undefined ? Math.round(100 * (1 - share)) : Math.round((100 * idle) / Math.max(1, t1 - from));
  const note = share !== null && share !== undefined ? `busy ${pct(share)} of the run, idle ${idlePct}%` : `idle ${idlePct}% of this window`;
  return [svg, el('div', { class: 'axis-row' }, el('span', { text: fmtTime(t0) }),
    el('span', { class: idlePct > 20 ? 'idle-note bad' : 'idle-note', 'data-testid': 'idle-note', 'data-busy': share ?? '', text: note }), el('span', { text: ended ? `${fmtTime(t1)} (last end)` : 'now' }))];
}

function eventText(e) {
  const parts = [e.ev];
  if (e.task) parts.push(e.task);
  if (e.attempt) parts.push(`#${e.attempt}`);
  if (e.slot) parts.push(`on ${e.slot}`);
  if (e.state) parts.push(`→ ${e.state}`);
  if (e.request) parts.push(e.request);
  if (e.count) parts.push(nTasks(e.count));
  if (e.reason) parts.push(`(${e.reason})`);
  return parts.join(' ');
}

function toggleAdd(box, rid) {
  if (box.firstChild) { clear(box); return; }
  const text = el('textarea', { name: 'commands', placeholder: 'one command per line, e.g.\npython train.py --lr 0.01', 'aria-label': 'commands' });
  const shell = el('input', { type: 'checkbox', name: 'shell', checked: true });
  const timeout = el('input', { name: 'timeout', placeholder: 'timeout (90s, 10m, 2h)', size: 16 });
  const attempts = el('input', { name: 'max_attempts', type: 'number', min: 1, placeholder: 'attempts', size: 6 });
  const prio = el('input', { name: 'priority', type: 'number', placeholder: 'priority', size: 6 });
  const form = el('form', { class: 'add card' }, text,
    el('div', { class: 'row' }, el('label', {}, shell, ' run with /bin/sh -c'), timeout, attempts, prio, el('span', { class: 'grow' }), el('button', { type: 'submit' }, 'Add to the queue')));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    act(rid, 'add', { commands: text.value, shell: shell.checked, timeout: timeout.value || null, max_attempts: attempts.value || null, priority: prio.value || null }, () => clear(box));
  });
  replace(box, form);
  text.focus();
}

async function loadTable(rid, st, box) {
  const t = st.table;
  const params = new URLSearchParams({ sort: t.sort, dir: t.dir, offset: t.offset, limit: t.limit, q: t.q });
  if (t.state) params.set('state', t.state);
  let data;
  try {
    data = await getJSON(`/api/runs/${encodeURIComponent(rid)}/tasks?${params}`);
  } catch (e) {
    replace(box, el('div', { class: 'notice error', text: e.message }));
    return;
  }
  st.tabsBox = st.tabsBox || el('div', { class: 'tabs', role: 'tablist' });
  st.loadTable = () => loadTable(rid, st, box);
  const tabs = drawTabs(st);
  const search = el('input', { type: 'search', placeholder: 'filter by id or name', value: t.q, 'aria-label': 'filter tasks' });
  search.addEventListener('input', () => { clearTimeout(search.timer); search.timer = setTimeout(() => { t.q = search.value; t.offset = 0; loadTable(rid, st, box).then(() => { const s = box.querySelector('input[type=search]'); if (s) { s.focus(); s.setSelectionRange(s.value.length, s.value.length); } }); }, 300); });
  const col = (key, label, cls) => el('th', {
    class: `sortable ${cls || ''} ${t.sort === key ? `sorted-${t.dir}` : ''}`, 'data-sort': key,
    onclick: () => { if (t.sort === key) t.dir = t.dir === 'asc' ? 'desc' : 'asc'; else { t.sort = key; t.dir = 'asc'; } t.offset = 0; loadTable(rid, st, box); },
  }, label);
  const end = Math.min(data.total, data.offset + data.rows.length);
  const pager = el('div', { class: 'pager' },
    el('button', { class: 'small', disabled: data.offset === 0, onclick: () => { t.offset = Math.max(0, t.offset - t.limit); loadTable(rid, st, box); } }, '‹ prev'),
    el('span', { 'data-testid': 'pager', text: data.total ? `${data.offset + 1}–${end} of ${data.total}` : 'no tasks' }),
    el('button', { class: 'small', disabled: end >= data.total, onclick: () => { t.offset = t.offset + t.limit; loadTable(rid, st, box); } }, 'next ›'),
    (t.sort === 'name' || t.q) && !data.names_known ? el('span', { class: 'muted', text: 'reading every task\'s name: this page covers the names read so far' }) : null);
  if ((t.sort === 'name' || t.q) && !data.names_known) { clearTimeout(st.namesTimer); st.namesTimer = setTimeout(() => loadTable(rid, st, box), 2000); }
  const rows = data.rows.map((r) => el('tr', { 'data-task': r.id, 'data-state': r.state },
    el('td', { class: 'mono' }, el('a', { href: `#/run/${encodeURIComponent(rid)}/task/${encodeURIComponent(r.id)}`, text: r.id })),
    el('td', { class: 'cell-clip', title: r.name, text: r.name }),
    el('td', {}, badge(r.state)),
    el('td', { class: 'num', text: r.priority ?? '' }),
    el('td', { class: 'num', text: r.attempts === undefined ? '' : `${r.attempts}/${r.max_attempts}` }),
    el('td', { class: 'num', text: r.seconds === '' || r.seconds === undefined ? '' : fmtSeconds(r.seconds) }),
    el('td', { class: 'mono', text: r.exit ?? '' }),
    el('td', { class: 'cell-clip', title: r.reason || '', text: r.reason || '' }),
    el('td', {}, READ_ONLY ? null : rowActions(rid, r, () => loadTable(rid, st, box)))));
  replace(box,
    el('div', { class: 'row' }, tabs, el('span', { class: 'grow' }), search),
    el('table', { 'data-testid': 'task-table' },
      el('thead', {}, el('tr', {}, col('id', 'task'), col('name', 'name'), col('state', 'state'), col('order', 'priority', 'num'), el('th', { class: 'num', text: 'attempts' }), el('th', { class: 'num', text: 'seconds' }), el('th', { text: 'exit' }), el('th', { text: 'reason' }), el('th', { text: '' }))),
      el('tbody', {}, rows)),
    pager);
}

// The state tabs: drawn from the same view as the run's header (one snapshot: both change
// together), again with every update and every page of the table.
function drawTabs(st) {
  const box = st.tabsBox;
  if (!box) return null;
  const t = st.table, counts = st.view ? st.view.counts : {};
  replace(box, [[null, 'all', st.view ? st.view.total : '']].concat(STATES.filter((s) => counts[s] !== undefined).map((s) => [s, s, counts[s]])).map(([s, label, n]) =>
    el('button', { class: t.state === s ? 'on small' : 'small', 'data-filter': label, 'data-n': n, onclick: () => { t.state = s; t.offset = 0; st.loadTable(); } }, `${label} ${n}`)));
  return box;
}

// issue 34: what the agents spent: "$0.90 · 4.7k tokens" ("+ unknown" when a model had no price)
function fmtSpent(s) {
  if (!s) return '';
  const usd = s.cost_usd >= 0.01 || s.cost_usd === 0 ? s.cost_usd.toFixed(2) : s.cost_usd.toFixed(4);
  const tokens = s.tokens < 1000 ? `${s.tokens}` : s.tokens < 1e6 ? `${(s.tokens / 1000).toFixed(1)}k` : `${(s.tokens / 1e6).toFixed(1)}M`;
  const unknown = s.cost_unknown_attempts ? (s.cost_usd ? ' + unknown' : '') : '';
  return `${s.cost_unknown_attempts && !s.cost_usd ? 'unknown' : '$' + usd}${unknown} · ${tokens} tokens`;
}
function pct(share) { return share === null || share === undefined ? '' : `${Math.round(100 * share)}%`; }

function rowActions(rid, r, reload) {
  const out = el('span', { class: 'row' });
  if (r.state === 'pending' || r.state === 'running') out.append(el('button', { class: 'small danger', 'data-action': 'cancel', onclick: () => act(rid, 'cancel', { tasks: [r.id] }, reload) }, 'cancel'));
  if (r.state === 'failed' || r.state === 'cancelled') out.append(el('button', { class: 'small', 'data-action': 'retry', onclick: () => act(rid, 'retry', { tasks: [r.id] }, reload) }, 'retry'));
  if (r.state === 'pending') out.append(el('button', { class: 'small', 'data-action': 'priority', onclick: () => askPriority(rid, r.id, r.priority, reload) }, 'priority'));
  return out;
}
function askPriority(rid, task, now, reload) {
  const value = window.prompt(`New priority for ${task} (higher starts first, -4999..4999)`, String(now ?? 0));
  if (value === null || value.trim() === '') return;
  act(rid, 'priority', { task, priority: value.trim() }, reload);
}

// == task page ===============================================================================
function taskPage(rid, tid) {
  const head = el('div', { id: 'task-head' });
  const attempts = el('div', { id: 'attempts' });
  const fields = el('div', { id: 'fields', class: 'cols' });
  const log = el('pre', { class: 'log', id: 'log', 'data-testid': 'log', 'aria-live': 'polite' });
  const follow = el('input', { type: 'checkbox', checked: true });
  page(head, el('h2', { text: 'Attempts' }), attempts, fields,
    el('div', { class: 'row' }, el('h2', { class: 'grow', text: 'Log' }), el('label', { class: 'muted' }, follow, ' follow')), log);
  let runTitle = rid;
  const load = async () => {
    let d;
    try { d = await getJSON(`/api/runs/${encodeURIComponent(rid)}/tasks/${encodeURIComponent(tid)}`); } catch (e) { replace(head, el('div', { class: 'notice error', text: e.message })); return; }
    runTitle = d.run_title;
    crumbs(['runs', '#/'], [d.run_title, `#/run/${encodeURIComponent(rid)}`], [tid]);
    document.title = `${tid}: gpuswarm`;
    const controls = [];
    if (!d.read_only) {
      if (d.state === 'pending' || d.state === 'running') controls.push(el('button', { class: 'danger', 'data-action': 'cancel', onclick: () => act(rid, 'cancel', { tasks: [tid] }, load) }, 'Cancel'));
      if (d.state === 'failed' || d.state === 'cancelled') controls.push(el('button', { 'data-action': 'retry', onclick: () => act(rid, 'retry', { tasks: [tid] }, load) }, 'Retry'));
      if (d.state === 'pending') controls.push(el('button', { 'data-action': 'priority', onclick: () => askPriority(rid, tid, d.priority, load) }, 'Priority…'));
    }
    replace(head,
      el('h1', {}, el('span', { class: 'mono', text: d.id }), badge(d.state), d.waiting ? el('span', { class: 'badge st-pending', text: 'waiting to retry' }) : null, el('span', { class: 'grow' }), ...controls),
      el('div', { class: 'card' }, el('dl', { class: 'kv' },
        kv('name', d.name), kv('command', d.command_line, 'mono'), kv('cwd', d.cwd, 'mono'),
        kv('reason', d.reason), kv('attempts', `${d.used} of ${d.max_attempts} used (${d.attempts.length} recorded)`),
        kv('timeout', d.timeout ? fmtSeconds(d.timeout) : 'none'), kv('priority', d.priority),
        d.running ? kv('running', `attempt ${d.running.attempt} on ${d.running.slot} since ${fmtTime(d.running.since)}`) : null,
        d.env.length ? kv('env', d.env.join(', '), 'mono') : null)));
    replace(attempts, d.attempts.length ? el('table', { 'data-testid': 'attempts-table' },
      el('thead', {}, el('tr', {}, ['#', 'slot', 'GPUs', 'started', 'seconds', 'end', 'exit', 'reason', 'energy'].map((h) => el('th', { text: h })))),
      el('tbody', {}, d.attempts.map((a) => el('tr', {},
        el('td', { text: a.n }), el('td', { class: 'mono', text: a.slot || '' }), el('td', { text: a.gpus.join(',') }),
        el('td', { text: fmtDate(a.started) }), el('td', { class: 'num', text: fmtSeconds(a.duration) }),
        el('td', { text: `${a.kind || ''}${a.interrupted ? ' (interrupted)' : ''}${a.oom ? ' OOM' : ''}` }),
        el('td', { class: 'mono', text: a.signal || (a.returncode ?? '') }), el('td', { text: a.reason }),
        el('td', { class: 'num', 'data-testid': 'attempt-energy', text: a.energy_j == null ? '' : `${Math.round(a.energy_j).toLocaleString()} J${a.energy_mode === 'shared' ? ' (shared)' : ''}` })))))
      : el('p', { class: 'muted', text: 'No attempt yet.' }));
    replace(fields,
      el('div', {}, el('h2', { text: 'Metrics' }), kvTable(d.metrics)),
      el('div', {}, el('h2', { text: 'Result fields' }), kvTable(d.result)));
  };
  load();
  // Re-read the record when the journal says something happened to this task.
  stream(`/api/runs/${encodeURIComponent(rid)}/events`, {
    snapshot: () => {},
    update: (data) => { if ((data.events || []).some((e) => e.task === tid)) load(); },
  });
  let shown = 0;
  const append = (text, cls) => {
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 30;
    log.append(cls ? el('span', { class: cls, text }) : document.createTextNode(text));
    shown += text.length;
    while (shown > 2e6 && log.firstChild) { shown -= (log.firstChild.textContent || '').length; log.removeChild(log.firstChild); }
    if (follow.checked && atBottom) log.scrollTop = log.scrollHeight;
  };
  const es = stream(`/api/runs/${encodeURIComponent(rid)}/tasks/${encodeURIComponent(tid)}/log`, {
    attempt: (d) => append(`── attempt ${d.attempt}${d.skipped ? ` (first ${d.skipped} bytes left out)` : ''} ──\n`, 'hop'),
    text: (d) => append(`${d.text}\n`),
    end: (d) => { append(`── the task ended: ${d.state} ──\n`, 'end'); es.close(); load(); },
  });
  void runTitle;
}
function kv(k, v, cls) {
  if (v === null || v === undefined || v === '') return null;
  return [el('dt', { text: k }), el('dd', { class: cls || '', text: v })];
}
function kvTable(obj) {
  const entries = Object.entries(obj || {});
  if (!entries.length) return el('p', { class: 'muted', text: 'None.' });
  return el('table', {}, el('tbody', {}, entries.map(([k, v]) => el('tr', {}, el('td', { class: 'mono', text: k }), el('td', { class: 'mono', text: typeof v === 'object' ? JSON.stringify(v) : String(v) })))));
}

// == experiment page =========================================================================
function experimentPage(eid) {
  const head = el('div', { id: 'exp-head' });
  const chart = el('div', { id: 'chart', 'data-testid': 'chart' });
  const flight = el('div', { id: 'in-flight' });
  const table = el('div', { id: 'exp-table' });
  const diff = el('div', { id: 'diff' });
  let selected = null;
  page(head, chart, el('h2', { text: 'Variants in flight' }), flight, el('h2', { text: 'Experiments' }), table, diff);
  let last = null;
  const draw = () => {
    const v = last.view;
    crumbs(['runs', '#/'], [`experiment ${v.title}`]);
    document.title = `${v.title}: gpuswarm research`;
    const br = v.best_recorded;
    replace(head,
      el('h1', {}, `autoresearch/${v.title}`, v.live ? badge('live') : el('span', { class: 'badge st-stopped', text: 'runner idle' }),
        el('span', { class: 'grow' }), v.run ? el('a', { href: `#/run/${encodeURIComponent(v.run)}`, text: 'its run →' }) : null),
      el('div', { class: 'card' },
        stat(v.metric + (v.goal === 'min' ? ' ↓' : ' ↑'), 'metric'),
        stat(v.base || '—', 'BASE'), stat(fmtMetric(v.best), 'best (BASE)', 'best'),
        br ? stat(`${fmtMetric(br.metric)} (${br.id})`, 'best measured') : null,
        stat(v.experiments, 'experiments', 'experiments'), stat(v.kept, 'kept'), stat(v.in_flight.length, 'in flight'),
        v.pruned ? stat(`${v.pruned} (GPU time saved ${fmtSeconds(v.gpu_saved_s)})`, 'pruned', 'pruned') : null));
    replace(chart, progressChart(v, chart.clientWidth));
    const now = serverNow();
    replace(flight, v.in_flight.length ? el('table', { 'data-testid': 'in-flight-table' },
      el('thead', {}, el('tr', {}, ['variant', 'status', 'GPU slot', 'elapsed', 'description'].map((h) => el('th', { text: h })))),
      el('tbody', {}, v.in_flight.map((f) => el('tr', { 'data-variant': f.id, class: 'clickable', onclick: () => showDiff(f.id) },
        el('td', { class: 'mono', text: f.id }), el('td', {}, badge(f.status)), el('td', { class: 'mono', text: f.slot || '' }),
        el('td', { text: f.since ? `${fmtSeconds(now - f.since)} of ${fmtSeconds(f.timeout)}` : '' }),
        el('td', { class: 'cell-clip', text: f.description })))))
      : el('p', { class: 'muted', text: 'None.' }));
    replace(table, v.rows.length ? el('table', { 'data-testid': 'exp-rows' },
      el('thead', {}, el('tr', {}, ['#', 'variant', 'commit', v.metric, 'memory GB', 'status', 'description'].map((h) => el('th', { text: h })))),
      el('tbody', {}, v.rows.slice().reverse().map((r) => el('tr', { 'data-variant': r.id, class: `clickable${selected === r.id ? ' selected' : ''}`, onclick: () => showDiff(r.id) },
        el('td', { class: 'num', text: r.n }), el('td', { class: 'mono', text: r.id }), el('td', { class: 'mono', text: r.commit }),
        el('td', { class: 'mono num', text: fmtMetric(r.metric) }), el('td', { class: 'num', text: r.memory_gb === null ? '' : r.memory_gb.toFixed(1) }),
        el('td', {}, badge(r.status)), el('td', { class: 'cell-clip', title: r.reason, text: r.description })))))
      : el('p', { class: 'muted', text: 'No experiment recorded yet.' }));
  };
  const showDiff = async (vid) => {
    selected = vid;
    if (last) draw();
    replace(diff, el('h2', { text: `Diff of ${vid}` }), el('p', { class: 'muted', text: 'loading…' }));
    diff.scrollIntoView({ block: 'start' }); // below a long table it would be out of sight
    try {
      const d = await getJSON(`/api/experiments/${encodeURIComponent(eid)}/variants/${encodeURIComponent(vid)}/diff`);
      replace(diff, el('h2', {}, `${d.id}: `, el('span', { text: d.description })),
        el('p', { class: 'muted mono', text: `${d.parent.slice(0, 12)} → ${d.commit.slice(0, 12)} · ${d.status}${d.reason ? ` · ${d.reason}` : ''}` }),
        diffView(d.diff));
    } catch (e) { replace(diff, el('div', { class: 'notice error', text: e.message })); }
  };
  stream(`/api/experiments/${encodeURIComponent(eid)}/events`, { experiment: (d) => { last = d; draw(); } });
  every(1000, () => { if (last && last.view.in_flight.length) draw(); });
}
function stat(value, label, id) {
  return el('span', { class: 'stat', 'data-stat': id || label }, el('b', { text: value }), el('span', { text: label }));
}
function diffView(text) {
  const pre = el('pre', { class: 'diff', 'data-testid': 'diff' });
  for (const line of text.split('\n')) {
    let cls = '';
    if (line.startsWith('+++') || line.startsWith('---') || line.startsWith('diff ')) cls = 'file';
    else if (line.startsWith('+')) cls = 'add';
    else if (line.startsWith('-')) cls = 'del';
    else if (line.startsWith('@@')) cls = 'hunk';
    pre.append(cls ? el('span', { class: cls, text: line }) : document.createTextNode(`${line}\n`));
  }
  return pre;
}

// The autoresearch progress chart: every experiment by number, kept ones green (the best so
// far drawn as a step line), discarded grey, crashes as red crosses on the bottom edge.
function progressChart(v, width) {
  const W = Math.max(600, width || 1000), H = 320, L = 70, R = 30, T = 20, B = 36;
  const svg = svgEl('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'progress chart' });
  const rows = v.rows;
  svg.dataset.points = String(rows.length);
  if (!rows.length) {
    svg.append(svgEl('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', text: 'No experiment recorded yet: results appear here as they arrive.' }));
    return svg;
  }
  const vals = rows.filter((r) => r.metric !== null && isFinite(r.metric)).map((r) => r.metric);
  let lo = vals.length ? Math.min(...vals) : 0, hi = vals.length ? Math.max(...vals) : 1;
  if (hi - lo < 1e-12) { lo -= 0.5 * Math.abs(lo || 1) * 0.01 + 1e-6; hi += 0.5 * Math.abs(hi || 1) * 0.01 + 1e-6; }
  const pad = (hi - lo) * 0.08; lo -= pad; hi += pad;
  const n = rows.length;
  const x = (i) => L + ((W - L - R) * (n === 1 ? 0.5 : (i - 1) / (n - 1)));
  const y = (m) => T + ((H - T - B) * (hi - m)) / (hi - lo);
  const ticks = niceTicks(lo, hi);
  svg.dataset.ticks = ticks.values.join(' ');
  for (const m of ticks.values) {
    svg.append(svgEl('line', { class: 'grid', x1: L, x2: W - R, y1: y(m), y2: y(m) }));
    svg.append(svgEl('text', { class: 'tick', x: L - 6, y: y(m) + 4, 'text-anchor': 'end', text: m.toFixed(ticks.decimals) }));
  }
  svg.append(svgEl('text', { x: (W + L) / 2, y: H - 6, 'text-anchor': 'middle', text: `experiment # (${v.metric}, ${v.goal === 'min' ? 'lower' : 'higher'} is better)` }));
  // the running best as progress.png draws it (research/plot.py running_best: BASE's metric
  // after each keep), a step that holds until the next keep and runs to the last experiment
  const steps = v.best_steps || [];
  if (steps.length) {
    let d = `M${x(steps[0][0])},${y(steps[0][1])}`;
    for (let i = 1; i < steps.length; i++) d += `H${x(steps[i][0])}V${y(steps[i][1])}`;
    d += `H${x(n)}`;
    svg.append(svgEl('path', { class: 'best', d, 'data-steps': steps.length }));
  }
  const labels = [];
  for (const r of rows) {
    if (r.metric === null && r.status === 'pruned') { // issue 38: stopped early, a triangle
      const cx = x(r.n), cy = H - B - 12;
      svg.append(svgEl('path', { class: 'pruned', d: `M${cx - 4},${cy - 3}L${cx + 4},${cy - 3}L${cx},${cy + 4}Z`, 'data-variant': r.id },
        svgEl('title', { text: `${r.id}: pruned, ${r.description}` })));
      continue;
    }
    if (r.metric === null) {
      const cx = x(r.n), cy = H - B - 4;
      svg.append(svgEl('path', { class: 'crash', d: `M${cx - 4},${cy - 4}L${cx + 4},${cy + 4}M${cx - 4},${cy + 4}L${cx + 4},${cy - 4}`, 'data-variant': r.id },
        svgEl('title', { text: `${r.id}: crash, ${r.description}` })));
      continue;
    }
    const cls = r.status === 'keep' ? 'keep' : 'discard';
    svg.append(svgEl('circle', { class: cls, cx: x(r.n), cy: y(r.metric), r: r.status === 'keep' ? 5 : 3.5, 'data-variant': r.id },
      svgEl('title', { text: `${r.id} ${fmtMetric(r.metric)} ${r.status}: ${r.description}` })));
    if (r.status === 'keep' && (!r.kind || r.kind === 'variant' || r.kind === 'combo')) labels.push(r);
  }
  // a kept change's description by its dot; one that would overlap a label already placed is
  // left out, the newest first (as progress.png: a run of keeps reads as the newest ones)
  const placed = [];
  for (const r of labels.reverse()) {
    const text = r.description.replace(/^\[[^\]]*\]\s*/, '').slice(0, 40);
    const right = x(r.n) > W * 0.7; // labels near the right edge end at their point
    const w = 6.2 * text.length, x0 = right ? x(r.n) - 7 - w : x(r.n) + 7, y0 = y(r.metric) - 7;
    const box = [x0, y0 - 11, x0 + w, y0 + 2];
    if (placed.some((b) => box[0] < b[2] && b[0] < box[2] && box[1] < b[3] && b[1] < box[3])) continue;
    placed.push(box);
    svg.append(svgEl('text', { class: 'label', x: right ? x0 + w : x0, y: y0, 'text-anchor': right ? 'end' : 'start', 'data-variant': r.id, text }));
  }
  return svg;
}

// Round tick values for [lo, hi]: a step of 1, 2, 2.5 or 5 times a power of ten, 4 to 8 ticks,
// each written with the decimals its step needs (0.05, 0.1, 0.15: never 0.15000001).
function niceTicks(lo, hi) {
  const raw = (hi - lo) / 5, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((k) => k * mag).find((st) => (hi - lo) / st <= 7) || 10 * mag;
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9) + (String(step / mag).includes('.') ? 1 : 0));
  const values = [];
  for (let m = Math.ceil(lo / step) * step; m <= hi + step * 1e-9; m += step) values.push(Number(m.toFixed(decimals)));
  return { values, decimals };
}

function nTasks(n) {
  return `${n} task${n === 1 ? '' : 's'}`;
}
