import { createHash } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { request } from 'undici';
import type { LlmProxyOptions } from '../../../proxy/llm/options.ts';
import { startBrokerHarness, type BrokerHarness } from '../../fixtures/broker-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import type { ScriptedTool } from '../../fixtures/llm-upstream.ts';
import { baseSnapshot, PLATFORM_KEY, startHarness, type Harness } from '../../fixtures/llmproxy-harness.ts';
import { addAgent } from '../../enclave/broker/secrets-fixture.ts';

// The whole tool-call approval loop on real parts, for the end-to-end tests: a real broker (TLS,
// PGlite, its satellite token file and CA, an operator `admin-1` of org-1 from a real OIDC issuer)
// running the test agents of org-1, and llmproxy with the tool policy from its snapshot's `llm_policy`
// (the production decider, no injected one), `--approvals-url` pointing at the broker's agent listener.
// A person decides through the broker's operator API; what was decided is read back from the proxy's
// `tool_call_decisions` audit rows and the broker's approvalView.

export const sha256 = (s: string): string => createHash('sha256').update(s).digest('hex');

/** The tool policy of the tests: `allow_*` runs, `deny_*` never, `hold_*` and large `pay_*` wait for a person. */
export const POLICY = {
  inspection: {
    inspectors: [
      {
        name: 'e2e',
        rules: [
          { tool: 'allow_*', verdict: 'allow', summary: 'Harmless' },
          { tool: 'deny_*', verdict: 'deny', summary: 'Never in tests' },
          { tool: 'hold_*', verdict: 'require_approval', summary: 'A person decides' },
          { tool: 'pay_*', verdict: 'require_approval', summary: 'Large payments', arg_gt: { amount: 100 } },
        ],
      },
    ],
  },
};

/** The agents the broker runs in org-1 (each test area has its own, so the broker's limits never cross). */
export const AGENTS = ['agent-1', 'agent-2', 'agent-3', 'agent-4', 'agent-5', 'agent-6'];

/** A snapshot listing AGENTS in org-1 under `policy` (the org's `llm_policy`). */
export function snapshotWith(policy: unknown = POLICY) {
  return (upstreamUrl: string) => {
    const s = baseSnapshot(upstreamUrl) as {
      orgs: Record<string, { config: Record<string, unknown> }>;
      agents: Record<string, unknown>;
    };
    s.orgs['org-1'].config.llm_policy = { value: policy };
    for (const uid of AGENTS)
      s.agents[uid] = {
        org_id: 'org-1',
        group_id: 'g-1',
        name: `n-${uid}`,
        status: 'active',
        contained: false,
        config: {},
      };
    return s;
  };
}

const secrets = Object.fromEntries(AGENTS.map((a) => [`agent:${a}`, { 'agent:llmproxy.llm.api_key': PLATFORM_KEY }]));

export interface Broker extends BrokerHarness {
  caFile: string;
  tokenFile: string;
  url: string;
}

/** The broker, its agents, its CA as a file. */
export async function startE2eBroker(): Promise<Broker> {
  const b = await startBrokerHarness({ seedAdmin: ['admin-1'] }, [{ clientId: 'admin-1', org: 'org-1', human: true }]);
  const caFile = join(b.dir, 'broker-ca.pem');
  await writeFile(caFile, b.tls.ca.certPem);
  for (const uid of AGENTS) await addAgent(b, uid, 'org-1', 'g-1');
  return Object.assign(b, {
    caFile,
    tokenFile: join(b.dir, 'state', 'satellite-token'),
    url: `https://127.0.0.1:${b.broker.agentPort}`,
  });
}

/** llmproxy with the snapshot's tool policy, its approvals at `broker` (or none: null). */
export function startE2eProxy(
  broker: Broker | null,
  proxy: Partial<LlmProxyOptions> = {},
  policy: unknown = POLICY,
): Promise<Harness> {
  return startHarness({
    snapshot: snapshotWith(policy),
    secrets,
    proxy: broker
      ? { approvalsUrl: broker.url, secretBrokerTokenFile: broker.tokenFile, brokerCa: broker.caFile, ...proxy }
      : proxy,
  });
}

/** The scripted calls (and leading text) as the test upstream's headers (JSON, non-ASCII escaped). */
export const script = (list: ScriptedTool[], reply?: string): Record<string, string> => ({
  'x-test-tools': JSON.stringify(list).replace(
    /[\u0080-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
  ),
  ...(reply ? { 'x-test-reply': reply } : {}),
});

/** The token claims of `agent` (org-1, g-1). */
export const as = (agent: string) => ({ sub: agent, agent_name: `n-${agent}` });

/** The proxy's tool_call_decisions rows, those of `tool` only when given. */
export const decisions = (h: Harness, tool?: string) =>
  h.audit.filter((r) => r.table === 'tool_call_decisions' && (tool === undefined || r.tool === tool));

/** Waits for the decision rows of `tool` (at least `count`), and returns them. */
export async function decisionsOf(h: Harness, tool: string, count = 1): Promise<Record<string, unknown>[]> {
  if (!(await until(() => decisions(h, tool).length >= count, 10_000)))
    throw new Error(`no tool_call_decisions row for ${tool}`);
  return decisions(h, tool);
}

/** The broker's approvals of `tool` (any status), as the operator reads them. */
export async function approvalsOf(b: Broker, tool: string): Promise<Record<string, any>[]> {
  const res = await b.operator('admin-1', 'GET', '/api/v1/approvals?limit=500');
  if (res.status !== 200) throw new Error(`approvals list: ${res.status}`);
  return (res.body.approvals as Record<string, any>[]).filter((a) => a.tool === tool);
}

/** Waits until the broker holds a pending approval of `tool`; returns its view. */
export async function pendingOf(b: Broker, tool: string): Promise<Record<string, any>> {
  let found: Record<string, any> | undefined;
  const ok = await until(async () => {
    found = (await approvalsOf(b, tool)).find((a) => a.status === 'pending');
    return found !== undefined;
  }, 15_000);
  if (!ok) throw new Error(`no pending approval of ${tool} on the broker`);
  return found!;
}

/** A person decides on the broker's operator listener. */
export async function decide(b: Broker, id: string, how: 'approve' | 'deny', reason?: string) {
  const res = await b.operator('admin-1', 'POST', `/api/v1/approvals/${id}/${how}`, reason ? { reason } : {});
  if (res.status !== 200) throw new Error(`${how} ${id}: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body as Record<string, any>;
}

/** The approval as the operator reads it now. */
export async function approvalView(b: Broker, id: string): Promise<Record<string, any>> {
  return (await b.operator('admin-1', 'GET', `/api/v1/approvals/${id}`)).body;
}

/** Waits until the broker shows approval `id` in `status`. */
export async function becomes(b: Broker, id: string, status: string): Promise<Record<string, any>> {
  let view: Record<string, any> = {};
  await until(async () => (view = await approvalView(b, id)).status === status, 10_000);
  return view;
}

/** The upstream's own bytes for the same scripted answer (it answers by the headers and the body alone). */
export async function upstreamBytes(
  h: Harness,
  path: string,
  body: unknown,
  headers: Record<string, string>,
): Promise<string> {
  const res = await request(`${h.upstream.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return res.body.text();
}

export const FORMATS = ['anthropic-messages', 'openai-chat', 'openai-responses'] as const;
export type Format = (typeof FORMATS)[number];

/** Where each format is asked, how its key is sent, and a request body for it. */
export const WIRE: Record<
  Format,
  { path: string; auth: (token: string) => Record<string, string>; body: (stream: boolean) => Record<string, unknown> }
> = {
  'anthropic-messages': {
    path: '/v1/messages',
    auth: (token) => ({ 'x-api-key': token }),
    body: (stream) => ({
      model: 'claude-sonnet-4-5',
      max_tokens: 64,
      messages: [{ role: 'user', content: 'go' }],
      ...(stream ? { stream: true } : {}),
    }),
  },
  'openai-chat': {
    path: '/v1/chat/completions',
    auth: (token) => ({ authorization: `Bearer ${token}` }),
    body: (stream) => ({
      model: 'gpt-4o',
      messages: [{ role: 'user', content: 'go' }],
      ...(stream ? { stream: true } : {}),
    }),
  },
  'openai-responses': {
    path: '/v1/responses',
    auth: (token) => ({ authorization: `Bearer ${token}` }),
    // Not stored: the test upstream gives a stored answer an id of its own each time (as the provider
    // does), and these tests compare an answer through the proxy with the upstream's own for the same
    // request.
    body: (stream) => ({ model: 'gpt-4o', input: 'go', store: false, ...(stream ? { stream: true } : {}) }),
  },
};

/** One tool call as the agent's SDK assembled it, or a denial the agent reads, in order. */
export type Seen = { call: string; id: string; args: string } | { text: string };

/**
 * Asks through the official SDK of `format` (plain or streamed) as `agent`, with the scripted calls;
 * returns what the agent got: its calls and texts in order, and the stop/finish reason.
 */
export async function viaSdk(
  h: Harness,
  format: Format,
  stream: boolean,
  agent: string,
  list: ScriptedTool[],
  reply?: string,
  signal?: AbortSignal,
): Promise<{ seen: Seen[]; stop: string | null }> {
  const token = await h.token(as(agent));
  const options = { headers: script(list, reply), signal };
  if (format === 'anthropic-messages') {
    const client = h.anthropic(token);
    const body = WIRE[format].body(false) as never;
    const msg = stream
      ? await client.messages.stream(body, options).finalMessage()
      : await client.messages.create(body, options);
    return {
      seen: msg.content.map((b) =>
        b.type === 'tool_use'
          ? { call: b.name, id: b.id, args: JSON.stringify(b.input) }
          : { text: b.type === 'text' ? b.text : b.type },
      ),
      stop: msg.stop_reason,
    };
  }
  const client = h.openai(token);
  if (format === 'openai-chat') {
    const body = WIRE[format].body(false) as never;
    const c = stream
      ? await client.chat.completions.stream(body, options).finalChatCompletion()
      : await client.chat.completions.create(body, options);
    const m = c.choices[0].message;
    const seen: Seen[] = [];
    if (m.content) seen.push({ text: m.content });
    for (const x of m.tool_calls ?? [])
      if (x.type === 'function') seen.push({ call: x.function.name, id: x.id, args: x.function.arguments });
    return { seen, stop: c.choices[0].finish_reason };
  }
  const body = WIRE[format].body(false) as never;
  const r = stream
    ? await client.responses.stream(body, options).finalResponse()
    : await client.responses.create(body, options);
  return {
    seen: r.output.map((o) =>
      o.type === 'function_call'
        ? { call: o.name, id: o.call_id, args: o.arguments }
        : {
            text:
              o.type === 'message'
                ? o.content.map((c) => (c.type === 'output_text' ? c.text : c.type)).join('')
                : o.type,
          },
    ),
    stop: null,
  };
}

/** A raw request through the proxy as `agent` (the bytes the agent receives), abortable. */
export async function raw(
  h: Harness,
  format: Format,
  stream: boolean,
  agent: string,
  list: ScriptedTool[],
  reply?: string,
  signal?: AbortSignal,
) {
  const headers = script(list, reply);
  const body = WIRE[format].body(stream);
  const res = await request(`${h.url}${WIRE[format].path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...WIRE[format].auth(await h.token(as(agent))), ...headers },
    body: JSON.stringify(body),
    dispatcher: h.dispatcher,
    signal,
  });
  return { res, headers, body };
}

/** The denial text the agent reads (detailed). */
export const denial = (tool: string, id: string, reason: string) =>
  `[dvx] The tool call ${tool} (id ${id}) was not run: ${reason}.`;

/** The id each format gives the first scripted call. */
export const FIRST_ID: Record<Format, string> = {
  'anthropic-messages': 'toolu_1',
  'openai-chat': 'call_1',
  'openai-responses': 'call_1',
};
export const idOf = (format: Format, n: number) => (format === 'anthropic-messages' ? `toolu_${n}` : `call_${n}`);
