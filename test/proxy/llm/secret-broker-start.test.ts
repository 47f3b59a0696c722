import t from 'tap';
import { join } from 'node:path';
import { until } from '../../fixtures/eventually.ts';
import { anthropicBody, post, startHarness } from '../../fixtures/llmproxy-harness.ts';
import { broker, freePort, keyOf, ORG_KEY_1, put, snapshot } from './secret-broker-fixture.ts';

// llmproxy started while its broker does not answer: it serves, says so, and takes the keys up once the
// broker answers.

t.test('a broker unreachable at start: llmproxy serves, says so, and picks the keys up once it answers', async (t) => {
  // A broker started once (its satellite token and CA exist), then stopped: its port answers nothing.
  const port = await freePort();
  const b = await broker(port);
  t.teardown(() => b.close());
  await b.broker.close();

  const p = await startHarness({
    snapshot,
    proxy: {
      secretsFile: '',
      secretBrokerUrl: `https://127.0.0.1:${port}`,
      secretBrokerTokenFile: join(b.dir, 'state', 'satellite-token'),
      brokerCa: b.caFile,
    },
  });
  t.teardown(() => p.close());
  t.ok(
    p.logs.some((l) => /secret broker unreachable/.test(String(l.msg)) && l.level === 'error'),
    'an error logged at start',
  );
  const none = await post(p, '/v1/messages', anthropicBody('hi'), {}, { sub: 'agent-2', group_id: 'g-2' });
  t.equal(none.status, 500);
  t.match(JSON.parse(none.text), { error: { message: 'no LLM API credential configured' } });

  await b.restart();
  t.equal((await put(b, 'llmproxy:llm.api_key', ORG_KEY_1)).status, 200);
  t.ok(await until(async () => (await keyOf(p, 'agent-2')) === ORG_KEY_1, 20_000), 'the key once the broker answers');
  t.ok(p.logs.some((l) => l.msg === 'secrets loaded from the secret broker'));
});
