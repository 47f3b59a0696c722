import Anthropic from '@anthropic-ai/sdk';
import net from 'node:net';
import t, { type Test } from 'tap';
import { request } from 'undici';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { type LlmPath, startLlmPath } from './e2e-llm-harness.ts';

// llmproxy unreachable, as the agent sees it through the gateway with its official SDK at
// https://api.anthropic.com: a llmproxy that was stopped, a port nothing listens on, a llmproxy whose
// certificate the gateway does not trust. Each time the agent gets 502 with the body exactly
// `Upstream request failed` (text/plain), the gateway records it, and nothing reaches a provider.

t.setTimeout(90_000);
const ask = (content: string) => ({
  model: 'claude-e2e-model',
  max_tokens: 16,
  messages: [{ role: 'user' as const, content }],
});

/** A loopback port nothing listens on (bound, then released). */
async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** The agent's view of an unreachable llmproxy: the SDK's 502 (plain and streamed), the exact body, the record. */
async function expectUpstreamFailed(t: Test, p: LlmPath, marker: string, reason: RegExp): Promise<void> {
  const dispatcher = p.proxyAgent(`Bearer ${await p.gw.token()}`);
  const client = p.anthropic(dispatcher);
  const upBefore = p.llm.upstream.received.length;
  const flowsBefore = p.flows().length;
  for (const stream of [false, true]) {
    const err = await client.messages.create({ ...ask(`${marker} stream=${stream}`), stream }).then(
      () => null,
      (e: unknown) => e,
    );
    t.ok(err instanceof Anthropic.InternalServerError, `stream=${stream}: the SDK's server error`);
    t.match(err, { status: 502 }, `stream=${stream}`);
  }
  const res = await request('https://api.anthropic.com/v1/messages', {
    method: 'POST',
    dispatcher,
    headers: { 'content-type': 'application/json', 'x-api-key': 'sk-ant-agent-dummy-key' },
    body: JSON.stringify(ask(`${marker} raw`)),
  });
  t.equal(res.statusCode, 502);
  t.match(res.headers['content-type'], /^text\/plain/);
  t.equal(await res.body.text(), 'Upstream request failed', 'the body, exactly');
  t.equal(p.llm.upstream.received.length, upBefore, 'nothing reached a provider');

  const flows = await p.flowsUntil((fs) => fs.slice(flowsBefore).filter((f) => f.proto === 'https').length >= 3);
  for (const flow of flows.slice(flowsBefore).filter((f) => f.proto === 'https'))
    t.match(flow, {
      action: 'http.request',
      dst_host: 'api.anthropic.com',
      agent_id: 'agent-1',
      org_id: 'org-1',
      // Let through by the gateway, failed on the way: allow, with the reason.
      outcome: 'allow',
      reason,
      attrs: { route: 'llmproxy', status: '502' },
    });
}

t.test('a llmproxy that was stopped', async (t) => {
  t.setTimeout(30_000);
  const p = await startLlmPath();
  t.teardown(() => p.close());
  const client = p.anthropic(p.proxyAgent(`Bearer ${await p.gw.token()}`));
  const msg = await client.messages.create(ask('before the stop'));
  t.equal(msg.content[0].type === 'text' ? msg.content[0].text : null, REPLY, 'answered while it runs');
  await p.llm.proxy.close();
  const llmBefore = p.llmRecords().length;
  await expectUpstreamFailed(t, p, 'after the stop', /^llmproxy failed: .*ECONNREFUSED/);
  t.equal(p.llmRecords().length, llmBefore);
});

t.test('a port nothing listens on', async (t) => {
  t.setTimeout(30_000);
  const p = await startLlmPath({ llmproxyAddr: `https://127.0.0.1:${await closedPort()}` });
  t.teardown(() => p.close());
  await expectUpstreamFailed(t, p, 'closed port', /^llmproxy failed: connect ECONNREFUSED 127\.0\.0\.1:\d+$/);
  t.equal(p.llmRecords().length, 0, 'the running llmproxy was not the one asked');
});

t.test('a llmproxy whose certificate the gateway does not trust (no --upstream-ca)', async (t) => {
  t.setTimeout(30_000);
  const p = await startLlmPath({ gateway: { upstreamCa: '' } });
  t.teardown(() => p.close());
  await expectUpstreamFailed(t, p, 'untrusted', /^llmproxy failed: UNABLE_TO_VERIFY_LEAF_SIGNATURE/);
  t.equal(p.llmRecords().length, 0, 'llmproxy never got a request');
});
