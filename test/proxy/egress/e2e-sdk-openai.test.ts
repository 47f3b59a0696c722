import t, { type Test } from 'tap';
import { GATEWAY_IDENTITY_HEADER } from '../../../proxy/llm/gateway-identity.ts';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { PLATFORM_KEY } from '../../fixtures/llmproxy-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { AGENT_KEY, startLlmPath } from './e2e-llm-harness.ts';

// The official OpenAI SDK, untouched (its default https://api.openai.com/v1), through the gateway by
// undici's ProxyAgent: Chat Completions and Responses, plain and streamed, answered by the local
// upstream through a real llmproxy; llmproxy's record is the agent's, the gateway's record says
// proto https, api.openai.com, allow, route llmproxy.

t.setTimeout(90_000);
const p = await startLlmPath();
t.teardown(() => p.close());
const MODEL = 'gpt-e2e-model';

async function requestFlow(marker: string): Promise<Record<string, unknown>> {
  const has = (f: Record<string, unknown>) =>
    f.proto === 'https' && String((f.attrs as Record<string, string>).request_body).includes(marker);
  return (await p.flowsUntil((fs) => fs.some(has))).find(has)!;
}

async function checkCall(t: Test, marker: string, path: string, format: string, llmBefore: number): Promise<void> {
  const got = p.llm.upstream.received.find((r) => JSON.stringify(r.body).includes(marker));
  t.ok(got, `${marker}: reached the upstream`);
  t.equal(got?.path, path);
  t.equal(got?.headers.authorization, `Bearer ${PLATFORM_KEY}`, "platform mode: the agent's key replaced");
  t.notOk(got && GATEWAY_IDENTITY_HEADER in got.headers, 'the identity header stops at llmproxy');
  t.notOk(got && 'proxy-authorization' in got.headers);
  t.ok(await until(() => p.llmRecords().length > llmBefore), "llmproxy's record arrived");
  t.match(p.llmRecords().at(-1), {
    agent_id: 'agent-1',
    org_id: 'org-1',
    path,
    format,
    model: MODEL,
    status: 200,
    decision: 'allow',
  });
  const flow = await requestFlow(marker);
  t.match(flow, {
    action: 'http.request',
    proto: 'https',
    dst: 'api.openai.com:443',
    dst_host: 'api.openai.com',
    dst_port: 443,
    outcome: 'allow',
    agent_id: 'agent-1',
    org_id: 'org-1',
    attrs: { route: 'llmproxy', method: 'POST', url: `https://api.openai.com:443${path}`, status: '200' },
  });
  t.notMatch(JSON.stringify(flow), AGENT_KEY, "the agent's key is not recorded");
}

t.test('chat.completions: plain and streamed', async (t) => {
  t.setTimeout(30_000);
  const client = p.openai(p.proxyAgent(`Bearer ${await p.gw.token()}`));
  t.equal(client.baseURL, 'https://api.openai.com/v1', 'the SDK keeps its default base URL');

  let before = p.llmRecords().length;
  const { data, response } = await client.chat.completions
    .create({ model: MODEL, messages: [{ role: 'user', content: 'chat marker-c1' }] })
    .withResponse();
  t.equal(response.status, 200);
  t.equal(data.choices[0].message.content, REPLY);
  t.equal(data.choices[0].finish_reason, 'stop');
  await checkCall(t, 'marker-c1', '/v1/chat/completions', 'openai-chat', before);

  before = p.llmRecords().length;
  const stream = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'user', content: 'chat stream marker-c2' }],
    stream: true,
  });
  const parts: string[] = [];
  let finish: string | null = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (choice?.delta.content) parts.push(choice.delta.content);
    if (choice?.finish_reason) finish = choice.finish_reason;
  }
  t.ok(parts.length > 1, 'several chunks');
  t.equal(parts.join(''), REPLY);
  t.equal(finish, 'stop');
  await checkCall(t, 'marker-c2', '/v1/chat/completions', 'openai-chat', before);
  const flow = await requestFlow('marker-c2');
  t.match((flow.attrs as Record<string, string>).response_body, /data: \[DONE\]/, 'the stream, captured');
});

t.test('responses: plain and streamed', async (t) => {
  t.setTimeout(30_000);
  const client = p.openai(p.proxyAgent(`Bearer ${await p.gw.token()}`));
  let before = p.llmRecords().length;
  const { data, response } = await client.responses
    .create({ model: MODEL, input: 'responses marker-r1' })
    .withResponse();
  t.equal(response.status, 200);
  t.equal(data.output_text, REPLY);
  await checkCall(t, 'marker-r1', '/v1/responses', 'openai-responses', before);

  before = p.llmRecords().length;
  const stream = await client.responses.create({ model: MODEL, input: 'responses stream marker-r2', stream: true });
  let text = '';
  const types: string[] = [];
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === 'response.output_text.delta') text += event.delta;
  }
  t.equal(text, REPLY);
  t.equal(types[0], 'response.created');
  t.equal(types.at(-1), 'response.completed');
  await checkCall(t, 'marker-r2', '/v1/responses', 'openai-responses', before);
});
