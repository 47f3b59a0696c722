import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import t from 'tap';
import { request } from 'undici';
import { GATEWAY_IDENTITY_HEADER, GatewayIdentitySigner } from '../../../proxy/llm/gateway-identity.ts';
import { tokenIssuer } from '../../fixtures/agent-identity.ts';
import { until } from '../../fixtures/eventually.ts';
import { gatewayKey } from '../../fixtures/gateway-key.ts';
import { AGENT_SECRET, anthropicBody, baseSnapshot, PLATFORM_KEY } from '../../fixtures/llmproxy-harness.ts';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { AGENT_KEY, startLlmPath } from './e2e-llm-harness.ts';
import { parseAnswer, rawExchange } from './gateway-harness.ts';

// What the LLM path refuses, seen by the agent's official SDK at the provider's URL through the
// gateway: a body carrying the agent's secret or an API key (llmproxy's 403 content_policy_violation,
// the SDK's PermissionDeniedError, both records); an agent without a valid token (407 from the
// gateway, before anything reaches llmproxy); a suspended agent (403); and an agent that forges the
// gateway's identity header (the gateway replaces it; sent straight to llmproxy it is refused 401).

t.setTimeout(90_000);
const p = await startLlmPath({
  llmSecrets: {
    'agent:agent-1': { 'agent:llmproxy.llm.api_key': PLATFORM_KEY, db_password: AGENT_SECRET },
    'agent:agent-2': { 'agent:llmproxy.llm.api_key': PLATFORM_KEY },
  },
  llmSnapshot: (url) => {
    const s = baseSnapshot(url) as { agents: Record<string, unknown> };
    s.agents['agent-2'] = { org_id: 'org-1', group_id: 'g-1', name: 'other', status: 'active', config: {} };
    return s;
  },
});
t.teardown(() => p.close());
const MODEL = 'claude-e2e-model';
/** An Anthropic-shaped API key (the api_key inspector's shape). */
const API_KEY = 'sk-ant-api03-Xq7Rt2Lm9Kp4Vn8Wz3Hy6Bc1Df5Gj0Ab';
const ask = (content: string) => ({ model: MODEL, max_tokens: 16, messages: [{ role: 'user' as const, content }] });

const hasBody = (marker: string) => (f: Record<string, unknown>) =>
  f.proto === 'https' && String((f.attrs as Record<string, string> | undefined)?.request_body).includes(marker);

t.test('a body with the agent’s secret or an API key: 403 content_policy_violation, recorded', async (t) => {
  t.setTimeout(30_000);
  const dispatcher = p.proxyAgent(`Bearer ${await p.gw.token()}`);
  const anthropic = p.anthropic(dispatcher);
  const openai = p.openai(dispatcher);
  const cases: [string, string, string, (content: string) => Promise<unknown>][] = [
    [
      'the agent’s secret (Anthropic SDK)',
      `my database password is ${AGENT_SECRET} marker-b1`,
      'secrets',
      (content) => anthropic.messages.create(ask(content)),
    ],
    [
      'an API key (Anthropic SDK, streamed)',
      `use the key ${API_KEY} marker-b2`,
      'api_key',
      (content) => anthropic.messages.create({ ...ask(content), stream: true }),
    ],
    [
      'an API key (OpenAI SDK)',
      `use the key ${API_KEY} marker-b3`,
      'api_key',
      (content) => openai.chat.completions.create({ model: 'gpt-e2e', messages: [{ role: 'user', content }] }),
    ],
  ];
  for (const [name, content, inspector, call] of cases) {
    const marker = content.slice(-9);
    const secret = inspector === 'secrets' ? AGENT_SECRET : API_KEY;
    const upBefore = p.llm.upstream.received.length;
    const llmBefore = p.llmRecords().length;
    const err = await call(content).then(
      () => null,
      (e: unknown) => e,
    );
    const openaiSdk = name.includes('OpenAI');
    const PermissionDenied = openaiSdk ? OpenAI.PermissionDeniedError : Anthropic.PermissionDeniedError;
    t.ok(err instanceof PermissionDenied, `${name}: the SDK's PermissionDeniedError`);
    // Each SDK's `error`: Anthropic's the whole body, OpenAI's the body's `error`.
    const body = { type: 'error', error: { type: 'content_policy_violation' } };
    t.match(err, { status: 403, error: openaiSdk ? body.error : body }, name);
    t.equal(p.llm.upstream.received.length, upBefore, `${name}: nothing reached the provider`);

    t.ok(await until(() => p.llmRecords().length > llmBefore), `${name}: llmproxy's record`);
    const record = p.llmRecords().at(-1)!;
    t.match(record, {
      agent_id: 'agent-1',
      org_id: 'org-1',
      status: 403,
      decision: 'block',
      upstream_status: null,
      findings: [{ inspector_type: inspector, severity: 'block', match: `${secret.slice(0, 4)}****` }],
    });

    const flow = (await p.flowsUntil((fs) => fs.some(hasBody(marker)))).find(hasBody(marker))!;
    t.match(flow, {
      proto: 'https',
      dst_host: openaiSdk ? 'api.openai.com' : 'api.anthropic.com',
      agent_id: 'agent-1',
      // The gateway let the request through to llmproxy; llmproxy's verdict is its own record.
      outcome: 'allow',
      attrs: { route: 'llmproxy', status: '403' },
    });
    const attrs = flow.attrs as Record<string, string>;
    t.match(attrs.request_body, /\[REDACTED\]/, `${name}: redacted in the gateway's capture`);
    t.match(JSON.parse(attrs.response_body), { error: { type: 'content_policy_violation' } });
    t.notMatch(JSON.stringify([flow, record]), secret, `${name}: the value is in no record`);
  }
});

t.test('no token, or one that does not verify: 407, nothing reaches llmproxy', async (t) => {
  t.setTimeout(30_000);
  const stranger = await tokenIssuer();
  const upBefore = p.llm.upstream.received.length;
  const llmBefore = p.llmRecords().length;
  const flowsBefore = p.flows().length;
  for (const [name, token] of [
    ['no Proxy-Authorization', null],
    ['a token of another issuer', `Bearer ${await stranger.mint()}`],
    ['not a JWT', 'Bearer not-a-token'],
    ['a Basic credential', `Basic ${Buffer.from('agent-1:secret').toString('base64')}`],
  ] as [string, string | null][]) {
    const dispatcher = p.proxyAgent(token);
    const err = await p
      .anthropic(dispatcher)
      .messages.create(ask('hello'))
      .then(
        () => null,
        (e: unknown) => e,
      );
    t.ok(err instanceof Anthropic.APIConnectionError, `${name}: the SDK sees a connection error`);
    // The same dispatcher, undici's own request: the CONNECT's answer is in the error.
    await t.rejects(
      request('https://api.anthropic.com/v1/models', { dispatcher }),
      { code: 'UND_ERR_ABORTED', message: /Proxy response \(407\) !== 200/ },
      `${name}: 407 to the CONNECT`,
    );
    const raw = await rawExchange(
      p.gw,
      `CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n${
        token ? `Proxy-Authorization: ${token}\r\n` : ''
      }\r\n`,
    );
    const answer = parseAnswer(raw.text);
    t.equal(answer.status, 407, `${name}: raw CONNECT`);
    t.equal(answer.headers['proxy-authenticate'], 'Bearer realm="dvx-gateway"');
    t.match(JSON.parse(answer.body), { type: 'error', error: { type: 'authentication_error' } });
  }
  t.equal(p.llm.upstream.received.length, upBefore, 'nothing reached the provider');
  t.equal(p.llmRecords().length, llmBefore, 'nor llmproxy');
  t.equal(p.flows().length, flowsBefore, "a stranger's attempts are in no org's audit");
});

t.test('a suspended agent: 403 at the gateway, recorded under the agent', async (t) => {
  t.setTimeout(30_000);
  const upBefore = p.llm.upstream.received.length;
  const flowsBefore = p.flows().length;
  const token = `Bearer ${await p.gw.token({ sub: 'agent-s' })}`;
  const dispatcher = p.proxyAgent(token);
  const err = await p
    .anthropic(dispatcher)
    .messages.create(ask('hello'))
    .then(
      () => null,
      (e: unknown) => e,
    );
  t.ok(err instanceof Anthropic.APIConnectionError, 'the SDK sees a connection error');
  await t.rejects(request('https://api.anthropic.com/v1/models', { dispatcher }), {
    message: /Proxy response \(403\) !== 200/,
  });
  const answer = parseAnswer(
    (
      await rawExchange(
        p.gw,
        `CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\nProxy-Authorization: ${token}\r\n\r\n`,
      )
    ).text,
  );
  t.equal(answer.status, 403);
  t.match(JSON.parse(answer.body), { error: { type: 'permission_error' } });
  t.equal(p.llm.upstream.received.length, upBefore, 'nothing reached the provider');
  const flows = await p.flowsUntil((fs) => fs.length >= flowsBefore + 3);
  for (const flow of flows.slice(flowsBefore))
    t.match(flow, {
      proto: 'tcp',
      action: 'connect',
      dst: 'api.anthropic.com:443',
      agent_id: 'agent-s',
      org_id: 'org-1',
      outcome: 'deny',
      reason: 'agent is suspended',
      attrs: { status: '403' },
    });
});

t.test('a forged x-dvx-gateway-identity: replaced by the gateway, refused 401 by llmproxy itself', async (t) => {
  t.setTimeout(30_000);
  const stranger = await gatewayKey(p.dir, 'stranger');
  const forged = await new GatewayIdentitySigner(stranger.privateKey).sign(
    { agentId: 'agent-2', orgId: 'org-1', agentName: 'other', groupId: 'g-1', via: 'jwt', tokenHeader: null },
    'POST',
    '/v1/messages',
  );
  // Signed with the gateway's own key: llmproxy would believe it, were it to arrive.
  const lifted = await new GatewayIdentitySigner(p.key.privateKey).sign(
    { agentId: 'agent-2', orgId: 'org-1', agentName: 'other', groupId: 'g-1', via: 'jwt', tokenHeader: null },
    'POST',
    '/v1/messages',
  );

  for (const [name, header] of [
    ['signed with a key of its own', forged],
    ["signed with the gateway's key, naming another agent", lifted],
  ]) {
    const llmBefore = p.llmRecords().length;
    const client = p.anthropic(p.proxyAgent(`Bearer ${await p.gw.token()}`), {
      defaultHeaders: { [GATEWAY_IDENTITY_HEADER]: header, 'X-DVX-Other': 'mine' },
    });
    const msg = await client.messages.create(ask(`forged ${name}`));
    t.equal(msg.content[0].type === 'text' ? msg.content[0].text : null, REPLY, `${name}: through the gateway, 200`);
    t.ok(await until(() => p.llmRecords().length > llmBefore));
    t.match(p.llmRecords().at(-1), { agent_id: 'agent-1', agent_name: 'builder', status: 200 }, name);
    const flow = (await p.flowsUntil((fs) => fs.some(hasBody(`forged ${name}`)))).find(hasBody(`forged ${name}`))!;
    const recorded = JSON.parse((flow.attrs as Record<string, string>).request_headers) as Record<string, string>;
    t.notOk(GATEWAY_IDENTITY_HEADER in recorded, 'the forged header is neither sent nor recorded');
    t.notOk('x-dvx-other' in recorded, 'nor any x-dvx-* header of the agent');
  }

  // Straight to llmproxy, the forged header is refused whatever comes with it.
  const refused = {
    type: 'error',
    error: { type: 'authentication_error', message: 'invalid or missing agent credential' },
  };
  const upBefore = p.llm.upstream.received.length;
  const alone: Record<string, string> = { [GATEWAY_IDENTITY_HEADER]: forged };
  // With the agent's own valid JWT beside it: a bad header is not rescued.
  const withJwt: Record<string, string> = { ...alone, 'x-api-key': await p.llm.token() };
  for (const headers of [alone, withJwt]) {
    const r = await p.llm.call('/v1/messages', {
      headers: { 'content-type': 'application/json', ...headers },
      body: anthropicBody('forged, sent straight'),
    });
    t.equal(r.status, 401);
    t.same(JSON.parse(r.text), refused);
  }
  t.equal(p.llm.upstream.received.length, upBefore, 'nothing reached the provider');
  // …whereas the header signed with the gateway's key would have been believed: the gateway did replace it.
  const believed = await p.llm.call('/v1/messages', {
    headers: { 'content-type': 'application/json', [GATEWAY_IDENTITY_HEADER]: lifted, 'x-api-key': AGENT_KEY },
    body: anthropicBody('lifted, sent straight'),
  });
  t.equal(believed.status, 200);
  t.ok(await until(() => p.llmRecords().at(-1)?.agent_id === 'agent-2'), 'as agent-2');
});

t.test(
  'raw, inside the tunnel: identity headers in any case and number are dropped; another host is 421',
  async (t) => {
    t.setTimeout(30_000);
    const token = `Bearer ${await p.gw.token()}`;
    const body = anthropicBody('raw marker-r1');
    const request = (headers: string) =>
      `POST /v1/messages HTTP/1.1\r\n${headers}content-type: application/json\r\nx-api-key: ${AGENT_KEY}\r\n` +
      `content-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`;
    const llmBefore = p.llmRecords().length;
    const forged = parseAnswer(
      await p.rawInTunnel(
        token,
        'api.anthropic.com',
        request(
          'Host: api.anthropic.com\r\nX-DVX-Gateway-Identity: a.b.c\r\nx-dvx-gateway-identity: d.e.f\r\nX-Dvx-Gateway-Identity: \r\n',
        ),
      ),
    );
    t.equal(forged.status, 200, 'the gateway’s own header went, alone');
    t.match(JSON.parse(forged.body), { content: [{ text: REPLY }] });
    t.ok(await until(() => p.llmRecords().length > llmBefore));
    t.match(p.llmRecords().at(-1), { agent_id: 'agent-1', status: 200 });

    const upBefore = p.llm.upstream.received.length;
    const misdirected = parseAnswer(
      await p.rawInTunnel(token, 'api.anthropic.com', request('Host: api.openai.com\r\n')),
    );
    t.equal(misdirected.status, 421, "a Host other than the tunnel's");
    t.match(JSON.parse(misdirected.body), { error: { type: 'invalid_request_error', message: /misdirected/ } });
    t.equal(p.llm.upstream.received.length, upBefore, 'not sent');
  },
);
