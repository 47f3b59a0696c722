import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// LLM policy authoring: the proxy's own validator on the way in (400 naming the field, nothing
// stored), locks at platform and org scope (409 naming the holder), agent overrides, flags, and the
// effective policy computed by the proxy's resolver.
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'admin-a', org: 'org-a', human: true },
    { clientId: 'admin-b', org: 'org-b', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
await h.call('root', 'POST', '/orgs', { id: 'org-b', name: 'B' });
await h.call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:admin-a', role: 'org-admin' });
await h.call('root', 'POST', '/orgs/org-b/grants', { principal: 'user:admin-b', role: 'org-admin' });
await h.call('admin-a', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'builder' });
const enc = (v: unknown) => ({ value: JSON.stringify(v) });

t.test('writes at three scopes, both spellings, read back', async (t) => {
  const platform = await h.call(
    'root',
    'PUT',
    '/platform/config/llmproxy/model_policy',
    enc({ mode: 'blocklist', models: ['*-preview'] }),
  );
  t.equal(platform.status, 200);
  t.same(platform.body, { key: 'model_policy', scope: 'platform', locked: false, published: false });
  t.equal((await h.call('root', 'PUT', '/platform-config/llmproxy/credential_mode', enc('platform'))).status, 200);
  const org = await h.call(
    'admin-a',
    'PUT',
    '/config/llmproxy/content_inspection',
    enc({ secrets_filter: { enabled: true }, pii_detection: { enabled: true, types: ['email'] } }),
  );
  t.same(org.body, { key: 'content_inspection', scope: 'org:org-a', locked: false, published: false });
  t.equal(
    (await h.call('admin-a', 'PUT', '/service-config/llmproxy/downstream_url', enc('https://api.anthropic.com')))
      .status,
    200,
  );
  const agent = await h.call('admin-a', 'POST', '/agents/bot-1/config', {
    override_service: 'llmproxy',
    key: 'model_policy',
    value: JSON.stringify({ mode: 'allowlist', models: ['claude-*'] }),
  });
  t.same(agent.body, { key: 'model_policy', scope: 'agent:bot-1', locked: false, published: false });

  const list = (await h.call('root', 'GET', '/platform/config/llmproxy')).body;
  t.same(
    list.map((r: { key: string }) => r.key),
    ['credential_mode', 'model_policy'],
  );
  t.match(
    JSON.parse(list[1].value),
    { mode: 'blocklist', models: ['*-preview'] },
    'stored as validated (defaults filled in)',
  );
  t.same(
    (await h.call('admin-a', 'GET', '/config/llmproxy')).body.map((r: { scope: string }) => r.scope),
    ['org:org-a', 'org:org-a'],
  );
  t.same((await h.call('admin-b', 'GET', '/config/llmproxy')).body, [], 'org-b sees its own rows only');
  t.equal((await h.call('admin-a', 'GET', '/agents/bot-1/config')).body.length, 1);
  t.equal((await h.call('admin-b', 'GET', '/agents/bot-1/config')).status, 403, "another org's agent");
  t.equal(
    (await h.call('admin-a', 'PUT', '/platform/config/llmproxy/model_policy', enc({ mode: 'blocklist', models: [] })))
      .status,
    403,
    'platform rows need platform:config',
  );
  t.ok(
    h.audit.some(
      (r) =>
        r.action === 'llm-policy.put' &&
        r.resource === 'llmproxy:org:org-a:content_inspection' &&
        r.actor === 'admin-a',
    ),
  );
});

t.test("the effective policy is the resolver's answer", async (t) => {
  const e = (await h.call('admin-a', 'GET', '/agents/bot-1/effective-policy')).body;
  t.same(e.flags, { 'inspect:llm': true, 'audit:llm': true });
  t.same(
    e.policy.models.map((m: { mode: string }) => m.mode),
    ['allowlist'],
    'the agent override wins (no lock)',
  );
  t.equal(e.policy.content.pii_detection.enabled, true);
  t.equal(e.credential_mode, 'platform');
  t.equal(e.downstream_url, 'https://api.anthropic.com');
  t.match(e.policy.version, /^[A-Za-z0-9_-]{16}$/);
});

t.test('locks: a lock above refuses the write below with 409; locked is refused at agent scope', async (t) => {
  t.equal(
    (
      await h.call('root', 'PUT', '/platform/config/llmproxy/sidecar_inspection', {
        value: JSON.stringify({ sidecars: [] }),
        locked: true,
      })
    ).body.locked,
    true,
  );
  const org = await h.call('admin-a', 'PUT', '/config/llmproxy/sidecar_inspection', enc({ sidecars: [] }));
  t.equal(org.status, 409);
  t.match(org.body, {
    type: 'https://dvx.dev/problems/conflict',
    detail: /sidecar_inspection is locked at platform scope/,
  });
  t.equal(
    (
      await h.call('admin-a', 'PUT', '/config/llmproxy/downstream_url', {
        value: JSON.stringify('https://llm.internal'),
        locked: true,
      })
    ).status,
    200,
  );
  const agent = await h.call('admin-a', 'POST', '/agents/bot-1/config', {
    override_service: 'llmproxy',
    key: 'downstream_url',
    value: JSON.stringify('https://elsewhere.example'),
  });
  t.equal(agent.status, 409);
  t.match(agent.body.detail, /locked at org org-a/);
  const lockedAgent = await h.call('admin-a', 'POST', '/agents/bot-1/config', {
    override_service: 'llmproxy',
    key: 'credential_mode',
    value: JSON.stringify('passthrough'),
    locked: true,
  });
  t.match(lockedAgent.body, { status: 400, detail: /^locked: is refused at agent scope/ });
  // An in-value lock (`immutable`) counts as a lock too.
  t.equal(
    (
      await h.call(
        'admin-b',
        'PUT',
        '/config/llmproxy/content_inspection',
        enc({ immutable: true, secrets_filter: { enabled: true } }),
      )
    ).status,
    200,
  );
  await h.call('admin-b', 'POST', '/orgs/org-b/agents', { uid: 'bot-b', name: 'b' });
  t.equal(
    (
      await h.call('admin-b', 'POST', '/agents/bot-b/config', {
        override_service: 'llmproxy',
        key: 'content_inspection',
        value: JSON.stringify({ secrets_filter: { enabled: false } }),
      })
    ).status,
    409,
  );
  t.equal((await h.call('root', 'DELETE', '/platform/config/llmproxy/sidecar_inspection')).status, 204);
  t.equal(
    (await h.call('admin-a', 'PUT', '/config/llmproxy/sidecar_inspection', enc({ sidecars: [] }))).status,
    200,
    'unlocked once the lock is gone',
  );
});

t.test('an invalid policy is a 400 naming the field, and nothing is stored', async (t) => {
  const before = (await h.call('admin-a', 'GET', '/config/llmproxy')).body;
  const cases: [string, unknown, RegExp][] = [
    [
      'content_inspection',
      { value: JSON.stringify({ patterns: [{ description: 'x', pattern: '(', severity: 'block' }] }) },
      /^value: content_inspection\.patterns\[0\]\.pattern/,
    ],
    [
      'content_inspection',
      { value: JSON.stringify({ pii_detection: { enabled: true, types: ['passport'] } }) },
      /^value: content_inspection\.pii_detection\.types/,
    ],
    ['model_policy', { value: JSON.stringify({ mode: 'maybe', models: [] }) }, /^value: model_policy\.mode/],
    ['model_policy', { value: '{not json' }, /^value: is not valid JSON/],
    ['model_policy', { value: { mode: 'blocklist', models: [] } }, /^value: is required: the JSON-encoded/],
    ['model_policy', {}, /^value: is required/],
    ['model_policy', { value: '{}', extra: 1 }, /^extra: unknown field/],
    ['credential_mode', { value: JSON.stringify('sometimes') }, /^value: credential_mode/],
    ['upstream', { value: JSON.stringify({ 'grpc-thing': 'https://x' }) }, /^value: upstream\.grpc-thing/],
  ];
  for (const [key, body, detail] of cases) {
    const r = await h.call('admin-a', 'PUT', `/config/llmproxy/${key}`, body);
    t.equal(r.status, 400, `${key} ${JSON.stringify(body)}`);
    t.match(r.body.detail, detail);
  }
  t.equal((await h.call('admin-a', 'PUT', '/config/llmproxy/no_such_key', enc(1))).status, 404);
  t.same((await h.call('admin-a', 'GET', '/config/llmproxy')).body, before, 'nothing stored');
  t.match(
    (
      await h.call('admin-a', 'POST', '/agents/bot-1/config', {
        override_service: 'gateway',
        key: 'model_policy',
        value: '{}',
      })
    ).body,
    { status: 400, detail: /^override_service/ },
  );
  t.equal((await h.call('admin-a', 'GET', '/agents/nope/effective-policy')).status, 404);
});

t.test('feature flags per org, default enabled', async (t) => {
  t.same((await h.call('admin-a', 'GET', '/feature-flags')).body, [
    { flag: 'inspect:llm', org_id: 'org-a', enabled: true },
    { flag: 'audit:llm', org_id: 'org-a', enabled: true },
  ]);
  const off = await h.call('admin-a', 'PUT', '/feature-flags/inspect:llm', { enabled: false });
  t.same(off.body, { flag: 'inspect:llm', org_id: 'org-a', enabled: false, published: false });
  t.equal((await h.call('admin-a', 'GET', '/agents/bot-1/effective-policy')).body.flags['inspect:llm'], false);
  t.equal((await h.call('admin-b', 'GET', '/feature-flags')).body[0].enabled, true, 'org-b untouched');
  t.match((await h.call('admin-a', 'PUT', '/feature-flags/inspect:llm', { enabled: 'no' })).body, {
    status: 400,
    detail: /^enabled: must be a boolean/,
  });
  t.equal((await h.call('admin-a', 'PUT', '/feature-flags/fly:llm', { enabled: true })).status, 404);
});
