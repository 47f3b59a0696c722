import type Anthropic from '@anthropic-ai/sdk';
import type OpenAI from 'openai';
import t from 'tap';
import { request } from 'undici';
import { AGENT_SECRET, baseSnapshot, startHarness, type Harness } from '../../fixtures/llmproxy-harness.ts';

// The per-part inspection cache through a real llmproxy (real TLS, the official SDKs, a node:http
// upstream): an agent resends its growing conversation each turn, and a message that was refused once
// is refused on every turn that resends it, with its finding in each call's audit record, though its
// bytes are no longer scanned. A policy change, a changed byte, and the system prompt (where the
// security-context prefix lives) are never answered from the cache (docs/decisions.md, "The per-part
// inspection cache").

const h = await startHarness({ proxy: { metricsAddr: '127.0.0.1:0' } });
t.teardown(() => h.close());

async function metric(harness: Harness, name: string): Promise<number> {
  const res = await request(`https://127.0.0.1:${harness.proxy.metricsPort}/metrics`, {
    dispatcher: harness.dispatcher,
  });
  const text = await res.body.text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(`${name}{`) || line.startsWith(`${name} `))
      sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}

const pad = (s: string) => `${s} ${'and here is a long stretch of ordinary conversation. '.repeat(8)}`;
type Turn = Anthropic.MessageParam;
const m0: Turn = { role: 'user', content: pad('Please refactor the billing module; the codename is bluebird-9.') };
const a1: Turn = { role: 'assistant', content: pad('Sure. Which database does it use?') };
const u1: Turn = {
  role: 'user',
  content: [{ type: 'text', text: pad(`It is postgres, the password is ${AGENT_SECRET}.`) }],
};
const a2: Turn = { role: 'assistant', content: pad('I cannot use that.') };
const u2: Turn = { role: 'user', content: pad('Then go on without it.') };

async function send(client: Anthropic, messages: Turn[], system = 'You help with code.') {
  return client.messages
    .create({ model: 'claude-sonnet-4-5', max_tokens: 8, system, messages })
    .then(() => 200)
    .catch((err: { status: number }) => err.status);
}

const lastAudit = () => h.audit.filter((r) => r.table === 'llm_audit_log').at(-1) as Record<string, unknown>;

t.test('a refused message stays refused on every turn that resends it, from the cache', async (t) => {
  const client = h.anthropic(await h.token());
  const start = await metric(h, 'dvx_inspection_cache_misses_total');
  t.equal(await send(client, [m0]), 200, 'turn 1 is clean');
  t.equal(await metric(h, 'dvx_inspection_cache_misses_total'), start, 'turn 1: first sight, scanned whole');
  t.equal(await send(client, [m0, a1, u1]), 403, 'turn 2 carries the secret');
  const first = lastAudit();
  t.match(first, { status: 403, decision: 'block', findings: [{ inspector_type: 'secrets', severity: 'block' }] });
  const hits = await metric(h, 'dvx_inspection_cache_hits_total');
  const saved = await metric(h, 'dvx_inspection_cache_bytes_saved_total');
  t.equal(await metric(h, 'dvx_inspection_cache_misses_total'), start + 3, 'turn 2 resends m0: its parts looked up');

  const before = h.upstream.received.length;
  t.equal(await send(client, [m0, a1, u1, a2, u2]), 403, 'turn 3 resends it: still refused');
  t.equal(h.upstream.received.length, before, 'the upstream never saw it');
  t.match(lastAudit(), { status: 403, decision: 'block', findings: first.findings as object });
  // New parts with a finding are halved down to it (and stored) the first time they are resent.
  t.equal(await metric(h, 'dvx_inspection_cache_hits_total'), hits + 1, 'm0 came from the cache');
  t.equal(await send(client, [m0, a1, u1, a2, u2]), 403, 'turn 4 resends it again: still refused');
  t.match(lastAudit(), { status: 403, decision: 'block', findings: first.findings as object });
  t.equal(await metric(h, 'dvx_inspection_cache_hits_total'), hits + 6, 'm0, a1, u1, a2 and u2 came from the cache');
  t.equal(h.upstream.received.length, before, 'the upstream never saw it');
  t.ok((await metric(h, 'dvx_inspection_cache_bytes_saved_total')) > saved, 'bytes saved');
  t.ok((await metric(h, 'dvx_inspection_cache_bytes')) > 0);
  t.notOk(JSON.stringify(h.audit).includes(AGENT_SECRET), 'the secret is in no audit record');
});

t.test('the system prompt is scanned on every call, whatever the cache holds', async (t) => {
  const client = h.anthropic(await h.token());
  await send(client, [m0, a1]);
  const hits = await metric(h, 'dvx_inspection_cache_hits_total');
  t.equal(await send(client, [m0, a1], 'You help with code. Deploy key AKIAIOSFODNN7EXAMPLE.'), 403);
  t.equal(await metric(h, 'dvx_inspection_cache_hits_total'), hits + 2, 'the messages were cached');
  t.match(lastAudit(), { findings: [{ inspector_type: 'api_key', match: 'AKIA****' }] });
});

t.test('a one-byte change in a part misses the cache', async (t) => {
  const client = h.anthropic(await h.token());
  await send(client, [m0, a1]);
  const misses = await metric(h, 'dvx_inspection_cache_misses_total');
  const hits = await metric(h, 'dvx_inspection_cache_hits_total');
  const changed = { ...a1, content: (a1.content as string).replace('database', 'databasE') };
  t.equal(await send(client, [m0, changed]), 200);
  t.equal(await metric(h, 'dvx_inspection_cache_misses_total'), misses + 1, 'the changed part missed');
  t.equal(await metric(h, 'dvx_inspection_cache_hits_total'), hits + 1, 'm0 did not');
});

t.test('a policy change catches an old, cached message', async (t) => {
  const client = h.anthropic(await h.token());
  t.equal(await send(client, [m0]), 200, 'cached clean under the old policy');
  const snapshot = baseSnapshot(h.upstream.url) as { orgs: Record<string, { config: Record<string, unknown> }> };
  (snapshot.orgs['org-1'].config.content_inspection as { value: Record<string, unknown> }).value.patterns = [
    { pattern: 'bluebird-[0-9]', description: 'project codename', severity: 'block' },
  ];
  await h.writeSnapshot(snapshot);
  t.teardown(() => h.writeSnapshot(baseSnapshot(h.upstream.url)));
  t.equal(await send(client, [m0]), 403, 'the new pattern finds it');
  t.match(lastAudit(), { findings: [{ inspector_type: 'patterns', description: 'project codename' }] });
});

t.test('OpenAI Chat: a resent tool result with a key is refused each time', async (t) => {
  const client = h.openai(await h.token());
  const history: OpenAI.ChatCompletionMessageParam[] = [
    { role: 'user', content: pad('Read the config file.') },
    {
      role: 'assistant',
      content: null,
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'read', arguments: '{"path":"cfg"}' } }],
    },
    { role: 'tool', tool_call_id: 'call_1', content: pad('aws_access_key_id = AKIAIOSFODNN7EXAMPLE') },
  ];
  const status = (messages: OpenAI.ChatCompletionMessageParam[]) =>
    client.chat.completions
      .create({ model: 'gpt-4o', messages })
      .then(() => 200)
      .catch((err: { status: number }) => err.status);
  t.equal(await status(history), 403);
  const hits = await metric(h, 'dvx_inspection_cache_hits_total');
  t.equal(await status([...history, { role: 'user', content: 'Go on.' }]), 403, 'resent: still refused');
  // Stored on the first resend (halved down to the tool result), read from the cache on the next.
  t.equal(await status([...history, { role: 'user', content: 'Go on.' }]), 403, 'resent again: still refused');
  t.ok((await metric(h, 'dvx_inspection_cache_hits_total')) > hits, 'from the cache');
  t.match(lastAudit(), { status: 403, findings: [{ inspector_type: 'api_key', match: 'AKIA****' }] });
});

t.test('the cache stays under --inspection-cache-mb', async (t) => {
  const small = await startHarness({ proxy: { metricsAddr: '127.0.0.1:0', inspectionCacheMb: 1 } });
  t.teardown(() => small.close());
  const client = small.anthropic(await small.token());
  for (let call = 0; call < 12; call++) {
    const messages: Turn[] = [];
    for (let i = 0; i < 400; i++)
      messages.push({ role: i % 2 ? 'assistant' : 'user', content: pad(`call ${call} message ${i}`) });
    // Seen first (scanned whole), then resent: its parts are stored.
    t.equal(await send(client, messages), 200);
    t.equal(await send(client, messages), 200);
    t.ok((await metric(small, 'dvx_inspection_cache_bytes')) <= 1024 * 1024, 'under the cap');
  }
  t.ok((await metric(small, 'dvx_inspection_cache_evictions_total')) > 0, 'old entries were dropped');
});

t.test('--inspection-cache-mb 0 turns it off', async (t) => {
  const off = await startHarness({ proxy: { metricsAddr: '127.0.0.1:0', inspectionCacheMb: 0 } });
  t.teardown(() => off.close());
  const client = off.anthropic(await off.token());
  t.equal(await send(client, [m0, a1, u1]), 403);
  t.equal(await send(client, [m0, a1, u1]), 403);
  t.equal(await metric(off, 'dvx_inspection_cache_hits_total'), 0);
  t.equal(await metric(off, 'dvx_inspection_cache_misses_total'), 0);
});
