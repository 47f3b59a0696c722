import t from 'tap';
import { anthropicBody, baseSnapshot, ORG_KEY, post, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The credential step: the org-level key when the agent has none, passthrough, and none at all.
const h = await startHarness();
t.teardown(() => h.close());

t.test('credentials: org key fallback, passthrough, and none', async (t) => {
  const snapshot = baseSnapshot(h.upstream.url) as { agents: Record<string, unknown>; orgs: Record<string, unknown> };
  snapshot.orgs['org-2'] = { config: { content_inspection: { value: {} } } };
  snapshot.agents['agent-2'] = { org_id: 'org-2', name: 'two', config: {} };
  snapshot.orgs['org-3'] = { config: { credential_mode: { value: 'passthrough' } } };
  await h.writeSnapshot(snapshot);
  t.equal((await post(h, '/v1/messages', anthropicBody('hi'), {}, { sub: 'agent-2', org_id: 'org-2' })).status, 200);
  t.equal(h.upstream.received.at(-1)!.headers['x-api-key'], ORG_KEY, 'the org-level key');
  const own = await h.call('/v1/chat/completions', {
    headers: {
      'content-type': 'application/json',
      authorization: `Bearer ${await h.token({ sub: 'agent-3', org_id: 'org-3' })}`,
      'x-api-key': 'sk-agents-own-key-123',
    },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  t.equal(own.status, 200);
  t.equal(
    h.upstream.received.at(-1)!.headers.authorization,
    'Bearer sk-agents-own-key-123',
    "passthrough forwards the agent's own key",
  );
  const none = await post(
    h,
    '/v1/chat/completions',
    JSON.stringify({ model: 'gpt-4o', messages: [] }),
    {},
    { sub: 'agent-3', org_id: 'org-3' },
  );
  t.equal(none.status, 500);
  t.match(JSON.parse(none.text), { error: { message: 'no LLM API credential configured' } });
});
