import t from 'tap';
import { request } from 'undici';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { until } from '../../fixtures/eventually.ts';
import { startLlmPath } from './e2e-llm-harness.ts';
import { startHttps } from './gateway-harness.ts';

// Many agents' requests at once through one gateway, with Node's undici ProxyAgent: 200 concurrent
// HTTPS requests, each in a tunnel the gateway terminates (interception CA), all answered by the
// destination, each with its own network_flow record and its tunnel's; then 100 concurrent calls of
// the official Anthropic SDK to https://api.anthropic.com, routed through a real llmproxy, each
// answered and recorded once by llmproxy and once by the gateway.

t.setTimeout(110_000);
const p = await startLlmPath();
t.teardown(() => p.close());
// Its certificate is of llmproxy's CA, which the gateway trusts (--upstream-ca).
const dest = await startHttps(p.llm.ca);
t.teardown(() => dest.close());

t.test('200 concurrent intercepted HTTPS requests: all answered, one record each', async (t) => {
  t.setTimeout(60_000);
  const N = 200;
  const dispatcher = p.proxyAgent(`Bearer ${await p.gw.token()}`);
  const flowsBefore = p.flows().length;
  const answers = await Promise.all(
    Array.from({ length: N }, async (_, i) => {
      const res = await request(`https://127.0.0.1:${dest.port}/parallel/${i}`, {
        dispatcher,
        headersTimeout: 30_000,
        bodyTimeout: 30_000,
      });
      return { status: res.statusCode, body: (await res.body.json()) as { url: string } };
    }),
  );
  t.equal(answers.filter((a) => a.status === 200).length, N, 'every request answered 200');
  t.same(
    answers.map((a) => a.body.url),
    Array.from({ length: N }, (_, i) => `/parallel/${i}`),
    'each its own answer',
  );
  t.ok(dest.accepted > 0);

  const isRequest = (f: Record<string, unknown>) =>
    f.proto === 'https' && String((f.attrs as Record<string, string>).url).includes('/parallel/');
  const flows = await p.flowsUntil((fs) => fs.slice(flowsBefore).filter(isRequest).length >= N);
  const requests = flows.slice(flowsBefore).filter(isRequest);
  t.equal(requests.length, N, 'one https record per request');
  t.equal(new Set(requests.map((f) => (f.attrs as Record<string, string>).url)).size, N, 'one per URL, none twice');
  t.equal(new Set(requests.map((f) => f.id)).size, N, 'distinct ids');
  for (const f of requests)
    t.match(
      f,
      {
        action: 'http.request',
        dst: `127.0.0.1:${dest.port}`,
        dst_ip: '127.0.0.1',
        outcome: 'allow',
        agent_id: 'agent-1',
        org_id: 'org-1',
        attrs: { status: '200', route: 'destination', method: 'GET' },
      },
      { diagnostic: false },
    );

  // The tunnels' records once the agent lets them go: intercepted, carrying the N requests between them.
  await dispatcher.close();
  const isTunnel = (f: Record<string, unknown>) => f.proto === 'tcp' && f.dst === `127.0.0.1:${dest.port}`;
  const srcs = new Set(requests.map((f) => f.src));
  t.ok(
    await until(() => p.flows().filter((f) => isTunnel(f) && srcs.has(f.src)).length >= srcs.size),
    'every tunnel recorded',
  );
  const tunnels = p.flows().filter((f) => isTunnel(f) && srcs.has(f.src));
  t.equal(tunnels.length, srcs.size, 'one record per tunnel');
  t.equal(
    tunnels.reduce((n, f) => n + Number((f.attrs as Record<string, string>).requests), 0),
    N,
    'the tunnels carried the N requests',
  );
  t.ok(
    tunnels.every((f) => (f.attrs as Record<string, string>).intercepted === 'true' && f.outcome === 'allow'),
    'all intercepted, all allowed',
  );
});

t.test('100 concurrent Anthropic SDK calls to api.anthropic.com: all answered, recorded by both', async (t) => {
  t.setTimeout(60_000);
  const N = 100;
  const client = p.anthropic(p.proxyAgent(`Bearer ${await p.gw.token()}`));
  const flowsBefore = p.flows().length;
  const llmBefore = p.llmRecords().length;
  const upBefore = p.llm.upstream.received.length;
  const messages = await Promise.all(
    Array.from({ length: N }, (_, i) =>
      client.messages.create({
        model: 'claude-e2e-model',
        max_tokens: 8,
        messages: [{ role: 'user', content: `parallel call ${i}` }],
      }),
    ),
  );
  t.equal(
    messages.filter((m) => m.content[0].type === 'text' && m.content[0].text === REPLY).length,
    N,
    'every call answered',
  );
  t.equal(p.llm.upstream.received.length, upBefore + N, 'each reached the upstream once');
  t.same(
    new Set(p.llm.upstream.received.slice(upBefore).map((r) => JSON.stringify(r.body))).size,
    N,
    'each its own call',
  );
  t.ok(await until(() => p.llmRecords().length >= llmBefore + N), "llmproxy's records");
  const calls = p.llmRecords().slice(llmBefore);
  t.equal(calls.length, N, 'one llm_audit_log record per call');
  t.ok(
    calls.every((r) => r.agent_id === 'agent-1' && r.status === 200 && r.decision === 'allow'),
    'all the agent’s, all allowed',
  );
  const isCall = (f: Record<string, unknown>) => f.proto === 'https' && f.dst_host === 'api.anthropic.com';
  const flows = await p.flowsUntil((fs) => fs.slice(flowsBefore).filter(isCall).length >= N);
  const requests = flows.slice(flowsBefore).filter(isCall);
  t.equal(requests.length, N, 'one gateway record per call');
  t.ok(
    requests.every(
      (f) =>
        f.outcome === 'allow' &&
        f.agent_id === 'agent-1' &&
        (f.attrs as Record<string, string>).route === 'llmproxy' &&
        (f.attrs as Record<string, string>).status === '200',
    ),
    'all routed to llmproxy, all 200',
  );
  t.equal(
    new Set(requests.map((f) => /parallel call \d+/.exec((f.attrs as Record<string, string>).request_body)?.[0])).size,
    N,
    'each call recorded once',
  );
});
