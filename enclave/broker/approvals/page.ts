import { createHash } from 'node:crypto';
import type { FastifyInstance } from 'fastify';

// The approvals page for people (GET /approvals on the operator listener): one self-contained HTML
// document, its script and style inline and allowed by hash in a strict CSP (nothing else loads, no
// request leaves for another origin). The operator pastes a bearer token of --local-issuer; it is kept
// in sessionStorage (gone with the tab). The page opens the live feed first (a fetch-based SSE reader:
// EventSource cannot send Authorization), then lists the pending approvals, and keeps both: each pending
// call shows its agent, tool, pretty-printed arguments, rule and summary and a countdown to its expiry,
// with approve and deny (and a reason). Every text goes in through textContent, never as markup.

const STYLE = `
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f5f5f4;color:#1c1917}
header{background:#1c1917;color:#fafaf9;padding:10px 16px;display:flex;gap:12px;align-items:center}
header h1{font-size:16px;margin:0;flex:1}
header input{width:320px}
main{padding:16px;display:grid;gap:12px;max-width:960px}
.card{background:#fff;border:1px solid #d6d3d1;border-radius:6px;padding:12px}
.card h2{font-size:15px;margin:0 0 6px}
.meta{color:#57534e;font-size:12px}
pre{background:#fafaf9;border:1px solid #e7e5e4;padding:8px;overflow:auto;max-height:240px;white-space:pre-wrap;word-break:break-all}
.countdown{font-weight:600}
.actions{display:flex;gap:8px;margin-top:8px}
.actions input{flex:1}
.status{font-weight:600;text-transform:uppercase;font-size:12px}
.approved{color:#15803d}.denied,.expired{color:#b91c1c}.cancelled{color:#57534e}
#state{font-size:12px}
`;

const SCRIPT = `
'use strict';
const $ = (sel) => document.querySelector(sel);
const approvals = new Map();
let lastId = null;
let token = sessionStorage.getItem('dvx.approvals.token') || '';
let feed = null;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
// Invisible and control characters shown as escapes: what the approver reads is what the tool gets.
// Every control, format (bidi controls, tag characters), private-use, surrogate and unassigned code
// point, line and paragraph separators, and the blank fillers and selectors that render as nothing;
// line breaks and tabs stay (pretty-printed arguments have them).
const INVISIBLE = /(?![\\n\\t])[\\p{C}\\p{Zl}\\p{Zp}\\u034f\\u115f\\u1160\\u17b4\\u17b5\\u180b-\\u180f\\u3164\\uffa0\\ufe00-\\ufe0f\\u{e0100}-\\u{e01ef}]/gu;
const visible = (s) => s.replace(INVISIBLE, (c) => {
  const cp = c.codePointAt(0);
  return cp > 0xffff ? '\\\\u{' + cp.toString(16) + '}' : '\\\\u' + cp.toString(16).padStart(4, '0');
});
const pretty = (a) => visible(typeof a === 'string' ? a : JSON.stringify(a, null, 2));
const setState = (s) => { $('#state').textContent = s; };

function left(a) {
  const ms = Date.parse(a.expires_at) - Date.now();
  if (ms <= 0) return 'expired';
  const s = Math.ceil(ms / 1000);
  return 'expires in ' + (s >= 60 ? Math.floor(s / 60) + 'm ' : '') + (s % 60) + 's';
}

function render() {
  const pending = $('#pending');
  const decided = $('#decided');
  // A reason being typed survives a redraw.
  const typed = new Map();
  for (const r of document.querySelectorAll('.card .reason')) typed.set(r.closest('.card').dataset.id, r.value);
  const focused = document.activeElement && document.activeElement.classList.contains('reason')
    ? document.activeElement.closest('.card').dataset.id : null;
  pending.replaceChildren();
  decided.replaceChildren();
  const all = [...approvals.values()].sort((a, b) => a.created_at.localeCompare(b.created_at));
  for (const a of all) {
    if (a.status === 'pending' && Date.parse(a.expires_at) > Date.now()) pending.append(card(a));
  }
  for (const a of all.reverse()) {
    if (!(a.status === 'pending' && Date.parse(a.expires_at) > Date.now())) decided.append(card(a));
  }
  if (!pending.children.length) pending.append(el('p', { class: 'meta' }, 'No pending approvals.'));
  for (const r of document.querySelectorAll('.card .reason')) {
    const id = r.closest('.card').dataset.id;
    if (typed.has(id)) r.value = typed.get(id);
    if (id === focused) r.focus();
  }
}

function card(a) {
  const pending = a.status === 'pending' && Date.parse(a.expires_at) > Date.now();
  const c = el('section', { class: 'card', 'data-id': a.id, 'data-status': pending ? 'pending' : a.status },
    el('h2', {}, visible(a.tool), ' ', el('span', { class: 'meta' }, 'by ' + visible(a.agent_name) + ' (' + visible(a.agent_id) + ')')),
    el('div', { class: 'meta' }, 'rule ' + visible(a.rule) + (a.summary ? ': ' + visible(a.summary) : '')),
    el('pre', { class: 'arguments' }, pretty(a.arguments)));
  if (pending) {
    c.append(el('div', { class: 'countdown', 'data-expires': a.expires_at }, left(a)));
    const reason = el('input', { placeholder: 'reason (optional)', maxlength: '1024', class: 'reason' });
    const approve = el('button', { class: 'approve' }, 'Approve');
    const deny = el('button', { class: 'deny' }, 'Deny');
    approve.addEventListener('click', () => decide(a.id, 'approve', reason.value));
    deny.addEventListener('click', () => decide(a.id, 'deny', reason.value));
    c.append(el('div', { class: 'actions' }, reason, approve, deny));
  } else {
    c.append(el('div', {}, el('span', { class: 'status ' + (pending ? 'pending' : a.status) }, pending ? 'pending' : a.status === 'pending' ? 'expired' : a.status),
      ' ', el('span', { class: 'meta' }, (a.decided_by ? 'by ' + visible(a.decided_by) : '') + (a.reason ? ' — ' + visible(a.reason) : ''))));
  }
  return c;
}

async function api(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: Object.assign({ authorization: 'Bearer ' + token }, body ? { 'content-type': 'application/json' } : {}),
    body: body ? JSON.stringify(body) : undefined,
  });
  const data = await res.json().catch(() => null);
  if (!res.ok) throw new Error((data && data.detail) || res.status + ' ' + res.statusText);
  return data;
}

async function decide(id, verb, reason) {
  try {
    const view = await api('POST', '/api/v1/approvals/' + encodeURIComponent(id) + '/' + verb, reason ? { reason } : {});
    approvals.set(view.id, view);
    render();
  } catch (err) {
    setState(verb + ' failed: ' + err.message);
  }
}

// The feed: fetch + a small SSE parser; reconnects with Last-Event-ID.
async function follow(signal) {
  while (!signal.aborted) {
    try {
      const headers = { authorization: 'Bearer ' + token, accept: 'text/event-stream' };
      if (lastId) headers['last-event-id'] = lastId;
      const res = await fetch('/api/v1/approvals/stream', { headers, signal, cache: 'no-store' });
      if (!res.ok) {
        const p = await res.json().catch(() => null);
        setState('feed refused: ' + ((p && p.detail) || res.status));
        if (res.status === 401 || res.status === 403) return;
        throw new Error('retry');
      }
      setState('live');
      // Listed after the feed is open: nothing changes unseen between the two.
      const page = await api('GET', '/api/v1/approvals?status=pending&limit=500');
      for (const a of page.approvals) approvals.set(a.id, a);
      render();
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      let ev = { event: null, data: [], id: null };
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let nl;
        while ((nl = buf.search(/\\r\\n|\\r|\\n/)) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + (buf.startsWith('\\r\\n', nl) ? 2 : 1));
          if (line === '') {
            if (ev.id !== null) lastId = ev.id;
            if (ev.event === 'approval' && ev.data.length) {
              const a = JSON.parse(ev.data.join('\\n'));
              approvals.set(a.id, a);
              render();
            } else if (ev.event === 'end') {
              setState('feed ended: ' + ev.data.join(''));
            }
            ev = { event: null, data: [], id: null };
          } else if (!line.startsWith(':')) {
            const i = line.indexOf(':');
            const field = i < 0 ? line : line.slice(0, i);
            const v = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
            if (field === 'event') ev.event = v;
            else if (field === 'data') ev.data.push(v);
            else if (field === 'id') ev.id = v;
          }
        }
      }
    } catch (err) {
      if (signal.aborted) return;
    }
    setState('reconnecting…');
    await new Promise((r) => setTimeout(r, 2000));
  }
}

function start() {
  if (feed) feed.abort();
  if (!token) { setState('paste a bearer token'); return; }
  feed = new AbortController();
  follow(feed.signal);
}

$('#token').value = token ? '********' : '';
$('#save').addEventListener('click', () => {
  const v = $('#token').value.trim();
  if (v && v !== '********') {
    token = v.replace(/^bearer\\s+/i, '');
    sessionStorage.setItem('dvx.approvals.token', token);
    $('#token').value = '********';
  }
  approvals.clear();
  lastId = null;
  start();
});
setInterval(() => {
  for (const c of document.querySelectorAll('.countdown')) {
    const a = approvals.get(c.closest('.card').dataset.id);
    if (!a) continue;
    if (Date.parse(a.expires_at) <= Date.now()) { render(); break; }
    c.textContent = left(a);
  }
}, 1000);
start();
`;

const sha = (s: string) => `'sha256-${createHash('sha256').update(s).digest('base64')}'`;

export const PAGE_CSP = [
  "default-src 'none'",
  `script-src ${sha(SCRIPT)}`,
  `style-src ${sha(STYLE)}`,
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

const PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>dvx approvals</title>
<style>${STYLE}</style>
</head>
<body>
<header>
<h1>dvx approvals</h1>
<span id="state"></span>
<input id="token" type="password" autocomplete="off" placeholder="operator bearer token">
<button id="save">Use token</button>
</header>
<main>
<div id="pending"></div>
<h2>Decided</h2>
<div id="decided"></div>
</main>
<script>${SCRIPT}</script>
</body>
</html>
`;

/** GET /approvals: the page (no data in it: everything it shows comes through the bearer-authenticated API). */
export async function approvalsPage(app: FastifyInstance): Promise<void> {
  app.get('/approvals', async (_req, reply) =>
    reply
      .header('content-security-policy', PAGE_CSP)
      .header('x-content-type-options', 'nosniff')
      .header('x-frame-options', 'DENY')
      .header('referrer-policy', 'no-referrer')
      .header('cache-control', 'no-store')
      .type('text/html; charset=utf-8')
      .send(PAGE),
  );
}
