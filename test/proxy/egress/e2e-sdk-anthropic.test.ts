import Anthropic from '@anthropic-ai/sdk';
import t from 'tap';
import { GATEWAY_IDENTITY_HEADER } from '../../../proxy/llm/gateway-identity.ts';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { PLATFORM_KEY } from '../../fixtures/llmproxy-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { AGENT_KEY, startLlmPath } from './e2e-llm-harness.ts';

// The official Anthropic SDK, untouched (its default https://api.anthropic.com), sent through the
// gateway by undici's ProxyAgent (fetchOptions.dispatcher): the gateway terminates the tunnel with its
// interception CA and routes the call to a real llmproxy, which answers from the local upstream. The
// agent gets the upstream's answer, plain and streamed; llmproxy records the call as the agent's; the
// gateway records the request (proto https, api.anthropic.com, allow, route llmproxy) and its tunnel.

t.setTimeout(90_000);
const p = await startLlmPath();
t.teardown(() => p.close());

const MODEL = 'claude-e2e-model';
const ask = (content: string) => ({ model: MODEL, max_tokens: 16, messages: [{ role: 'user' as const, content }] });

/** The gateway's https record of the request whose captured body holds `marker`. */
async function requestFlow(marker: string): Promise<Record<string, unknown>> {
  const flows = await p.flowsUntil((fs) =>
    fs.some((f) => f.proto === 'https' && String((f.attrs as Record<string, string>).request_body).includes(marker)),
  );
  return flows.find(
    (f) => f.proto === 'https' && String((f.attrs as Record<string, string>).request_body).includes(marker),
  )!;
}

t.test('messages.create: 200 with the upstream reply, recorded by llmproxy and the gateway', async (t) => {
  t.setTimeout(30_000);
  const dispatcher = p.proxyAgent(`Bearer ${await p.gw.token()}`);
  const client = p.anthropic(dispatcher);
  t.equal(client.baseURL, 'https://api.anthropic.com', 'the SDK keeps its default base URL');
  const llmBefore = p.llmRecords().length;
  const upBefore = p.llm.upstream.received.length;

  const { data, response } = await client.messages.create(ask('plain call marker-a1')).withResponse();
  t.equal(response.status, 200);
  t.equal(data.content[0].type, 'text');
  t.equal(data.content[0].type === 'text' ? data.content[0].text : null, REPLY);
  t.equal(data.stop_reason, 'end_turn');

  // What reached the provider: the call as the agent made it, llmproxy's key in place of the agent's
  // dummy one, neither the gateway's identity header nor the proxy credential.
  t.equal(p.llm.upstream.received.length, upBefore + 1, 'one call reached the upstream');
  const got = p.llm.upstream.received.at(-1)!;
  t.equal(got.method, 'POST');
  t.equal(got.path, '/v1/messages');
  t.match(got.body, { model: MODEL, messages: [{ role: 'user', content: 'plain call marker-a1' }] });
  t.equal(got.headers['x-api-key'], PLATFORM_KEY, "platform mode: the agent's key replaced");
  t.notOk(GATEWAY_IDENTITY_HEADER in got.headers, 'the identity header stops at llmproxy');
  t.notOk('proxy-authorization' in got.headers, 'Proxy-Authorization stops at the gateway');
  t.notMatch(JSON.stringify(got.headers), AGENT_KEY);

  t.ok(await until(() => p.llmRecords().length > llmBefore), "llmproxy's record arrived");
  const calls = p.llmRecords().slice(llmBefore);
  t.equal(calls.length, 1, 'one llm_audit_log record');
  t.match(calls[0], {
    table: 'llm_audit_log',
    agent_id: 'agent-1',
    agent_name: 'builder',
    org_id: 'org-1',
    enclave_id: 'enc-1',
    path: '/v1/messages',
    model: MODEL,
    format: 'anthropic-messages',
    status: 200,
    upstream_status: 200,
    decision: 'allow',
    input_tokens: 12,
    output_tokens: 7,
  });

  const flow = await requestFlow('marker-a1');
  t.match(flow, {
    kind: 'network_flow',
    action: 'http.request',
    source: 'gateway',
    proto: 'https',
    dst: 'api.anthropic.com:443',
    dst_host: 'api.anthropic.com',
    dst_port: 443,
    dst_ip: '',
    outcome: 'allow',
    actor: 'agent:agent-1',
    actor_kind: 'agent',
    agent_id: 'agent-1',
    org_id: 'org-1',
    identified: true,
    attrs: {
      route: 'llmproxy',
      method: 'POST',
      url: 'https://api.anthropic.com:443/v1/messages',
      status: '200',
      request_truncated: 'false',
      response_truncated: 'false',
    },
  });
  const attrs = flow.attrs as Record<string, string>;
  t.equal(attrs.request_body, JSON.stringify(ask('plain call marker-a1')), 'the request as the SDK sent it');
  t.match(JSON.parse(attrs.response_body), { content: [{ type: 'text', text: REPLY }] });
  t.equal(Number(attrs.bytes_up), Buffer.byteLength(attrs.request_body));
  t.equal(Number(attrs.bytes_down), Buffer.byteLength(attrs.response_body));
  const recordedHeaders = JSON.parse(attrs.request_headers) as Record<string, string>;
  t.equal(recordedHeaders['anthropic-version'] !== undefined, true, "the SDK's headers are recorded");
  for (const name of ['x-api-key', 'proxy-authorization', GATEWAY_IDENTITY_HEADER])
    t.notOk(name in recordedHeaders, `${name} is not recorded`);
  t.notMatch(JSON.stringify(p.flows()), AGENT_KEY, "the agent's key is in no record");

  // The tunnel's own record once the agent lets it go: intercepted, one request, the same bytes.
  await dispatcher.close();
  const flows = await p.flowsUntil((fs) => fs.some((f) => f.proto === 'tcp' && f.src === flow.src));
  t.match(
    flows.find((f) => f.proto === 'tcp' && f.src === flow.src),
    {
      action: 'connect',
      dst: 'api.anthropic.com:443',
      outcome: 'allow',
      agent_id: 'agent-1',
      attrs: { status: '200', intercepted: 'true', requests: '1', bytes_up: attrs.bytes_up },
    },
  );
});

t.test('streamed: messages.stream and stream: true, event by event', async (t) => {
  t.setTimeout(30_000);
  const client = p.anthropic(p.proxyAgent(`Bearer ${await p.gw.token()}`));
  const llmBefore = p.llmRecords().length;

  const stream = client.messages.stream(ask('streamed helper marker-s1'));
  const deltas: string[] = [];
  stream.on('text', (text) => deltas.push(text));
  t.equal(await stream.finalText(), REPLY);
  t.ok(deltas.length > 1, 'the text came in several deltas');
  t.equal(deltas.join(''), REPLY);
  const final = await stream.finalMessage();
  t.match(final, { stop_reason: 'end_turn', usage: { output_tokens: 7 } });

  const raw = await client.messages.create({ ...ask('raw stream marker-s2'), stream: true });
  const types: string[] = [];
  let text = '';
  for await (const event of raw) {
    types.push(event.type);
    if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') text += event.delta.text;
  }
  t.equal(text, REPLY);
  t.equal(types[0], 'message_start');
  t.equal(types.at(-1), 'message_stop');

  t.ok(await until(() => p.llmRecords().length >= llmBefore + 2), "llmproxy's records arrived");
  for (const record of p.llmRecords().slice(llmBefore))
    t.match(record, { agent_id: 'agent-1', org_id: 'org-1', status: 200, decision: 'allow', output_tokens: 7 });

  for (const marker of ['marker-s1', 'marker-s2']) {
    const flow = await requestFlow(marker);
    t.match(flow, {
      proto: 'https',
      dst_host: 'api.anthropic.com',
      outcome: 'allow',
      agent_id: 'agent-1',
      attrs: { route: 'llmproxy', status: '200' },
    });
    const attrs = flow.attrs as Record<string, string>;
    t.match(JSON.parse(attrs.response_headers), { 'content-type': 'text/event-stream' }, marker);
    t.match(attrs.response_body, /event: message_start[\s\S]*event: message_stop/, `${marker}: the stream, captured`);
  }
});

t.test('a query string: signed with the request, it reaches the provider as sent', async (t) => {
  t.setTimeout(30_000);
  const client = p.anthropic(p.proxyAgent(`Bearer ${await p.gw.token()}`));
  const msg = await client.messages.create(ask('query marker-q1'), { query: { trace: 'a b&c=d/é', empty: '' } });
  t.equal(msg.content[0].type === 'text' ? msg.content[0].text : null, REPLY);
  const sent = '/v1/messages?trace=a%20b%26c%3Dd%2F%C3%A9&empty=';
  t.equal(p.llm.upstream.received.at(-1)!.path, sent, 'the path and query, byte for byte');
  t.match(await requestFlow('marker-q1'), { attrs: { url: `https://api.anthropic.com:443${sent}`, status: '200' } });
});

t.test('the agent abandons a stream: the call is cut all the way to the provider, and recorded', async (t) => {
  t.setTimeout(30_000);
  const client = p.anthropic(p.proxyAgent(`Bearer ${await p.gw.token()}`));
  const llmBefore = p.llmRecords().length;
  const upBefore = p.llm.upstream.received.length;
  // A long stream (2,000 repeats of the reply, 5 ms apart): the agent stops after five deltas.
  const stream = client.messages.stream(ask('abandoned marker-x1'), {
    headers: { 'x-test-stream-repeat': '2000', 'x-test-event-gap': '5' },
  });
  let deltas = 0;
  stream.on('text', () => {
    if (++deltas === 5) stream.abort();
  });
  await t.rejects(stream.done(), Anthropic.APIUserAbortError);
  t.ok(
    await until(() => p.llm.upstream.received.length > upBefore && p.llm.upstream.received.at(-1)!.outcome === 'cut'),
    "the provider's answer was cut, not streamed to its end",
  );
  t.ok(await until(() => p.llmRecords().length > llmBefore), "llmproxy's record");
  t.match(p.llmRecords().at(-1), { agent_id: 'agent-1', status: 200, error: /aborted/ });
  const flow = await requestFlow('marker-x1');
  t.match(flow, {
    outcome: 'allow',
    reason: 'the agent closed the connection before the answer was delivered',
    attrs: { route: 'llmproxy', status: '200' },
  });
  const captured = (flow.attrs as Record<string, string>).response_body;
  t.match(captured, /^event: message_start\n/, 'what was relayed, captured');
  t.notMatch(captured, /message_stop/, 'the end never came');
});
