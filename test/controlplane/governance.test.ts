import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// Governance policy per scope (llm, destination, exec, ssh, tunnel, tunnel ports) and destination
// packs, resolved for an agent: deny unions, each allow gates, locks hold, packs compose on top.
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'cfg', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
const call = (method: string, path: string, body?: unknown) => h.call('root', method, path, body);
await call('POST', '/orgs', { id: 'org-a', name: 'A' });
await call('POST', '/orgs/org-a/groups', { id: 'ops', name: 'Ops' });
await call('POST', '/orgs/org-a/grants', { principal: 'user:cfg', capability: 'platform:config' });
await call('POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'b', group: 'ops' });

t.test('writes at each scope answer policyWriteView; the effective view composes them', async (t) => {
  t.same((await call('PUT', '/policies/ssh', { enabled: true })).body, {
    key: 'ssh',
    scope: 'platform',
    locked: false,
    published: false,
  });
  t.same((await h.call('cfg', 'PUT', '/policies/ssh?scope=org&org=org-a', { enabled: false })).body, {
    key: 'ssh',
    scope: 'org:org-a',
    locked: false,
    published: false,
  });
  await h.call('cfg', 'PUT', '/policies/exec?scope=agent&agent=bot-1', { enabled: true });
  await h.call('cfg', 'PUT', '/policies/tunnel-ports?scope=group&org=org-a&group=ops', { ports: [443, 22, 443] });
  await call('PUT', '/policies/llm', {
    models: { allow: ['claude-*', 'gpt-*'], deny: ['*-preview'] },
    providers: { deny: ['openrouter'] },
    credential_mode: 'platform',
  });
  await h.call('cfg', 'PUT', '/policies/llm?scope=org&org=org-a', {
    models: { allow: ['claude-*'], deny: ['claude-2*'] },
    providers: { allow: ['anthropic'] },
  });
  await call('PUT', '/policies/destination', { deny: [{ cidr: '169.254.169.254/32', reason: 'metadata' }] });
  await h.call('cfg', 'PUT', '/policies/destination?scope=org&org=org-a', {
    allow: [{ host: '*.example.com', port: 443 }],
  });
  t.same((await h.call('cfg', 'GET', '/policies/tunnel-ports?scope=group&org=org-a&group=ops')).body, {
    key: 'tunnel_ports',
    scope: 'group:org-a:ops',
    value: { ports: [22, 443] },
    locked: false,
  });

  const e = (await call('GET', '/agents/bot-1/effective-governance')).body;
  t.equal(e.ssh, false, 'the org row is more specific than the platform row');
  t.equal(e.exec, true);
  t.equal(e.tunnel, false, 'disabled when never enabled');
  t.same(e.tunnel_ports, [22, 443]);
  t.same(
    e.llm.models,
    { allow_gates: [['claude-*', 'gpt-*'], ['claude-*']], deny: ['*-preview', 'claude-2*'] },
    'deny unions, each allow gates',
  );
  t.same(e.llm.providers, { allow_gates: [['anthropic']], deny: ['openrouter'] });
  t.equal(e.llm.credential_mode, 'platform');
  t.same(e.destination, {
    allow_gates: [[{ host: '*.example.com', port: 443 }]],
    deny: [{ cidr: '169.254.169.254/32', reason: 'metadata' }],
  });
});

t.test('locks: 409 below; locked refused at agent scope; an empty port list denies all', async (t) => {
  await call('PUT', '/policies/tunnel', { enabled: false, locked: true });
  const r = await h.call('cfg', 'PUT', '/policies/tunnel?scope=org&org=org-a', { enabled: true });
  t.equal(r.status, 409);
  t.match(r.body.detail, /tunnel policy is locked at platform/);
  t.match((await call('PUT', '/policies/exec?scope=agent&agent=bot-1', { enabled: true, locked: true })).body, {
    status: 400,
    detail: /^locked: is refused at agent scope/,
  });
  await h.call('cfg', 'PUT', '/policies/tunnel-ports?scope=agent&agent=bot-1', { ports: [] });
  t.same(
    (await call('GET', '/agents/bot-1/effective-governance')).body.tunnel_ports,
    [],
    'the most specific row: none allowed',
  );
});

t.test('packs: define, install at a scope or on agent create, compose on top', async (t) => {
  const defined = await call('POST', '/packs', { name: 'no-paste', deny: [{ host: 'pastebin.com' }], allow: [] });
  t.equal(defined.status, 201);
  t.same(defined.body, { pack: 'no-paste', published: false });
  t.equal(
    (await call('POST', '/packs', { name: 'no-paste', deny: [{ host: 'pastebin.com' }, { host: 'ghostbin.co' }] }))
      .status,
    200,
    'a redefinition',
  );
  const installed = await h.call('cfg', 'PUT', '/packs/no-paste/installations?scope=org&org=org-a');
  t.same(installed.body, { pack: 'no-paste', scope: 'org:org-a', installed: true, published: false });
  const e = (await call('GET', '/agents/bot-1/effective-governance')).body;
  t.same(e.packs, ['no-paste']);
  t.ok(
    e.destination.deny.some((r: { host?: string }) => r.host === 'ghostbin.co'),
    "the pack's deny rules are added",
  );
  await call('POST', '/packs', { name: 'corp-only', allow: [{ cidr: '10.0.0.0/8' }] });
  t.equal(
    (await call('POST', '/orgs/org-a/agents', { uid: 'bot-2', name: 'c', policy_packs: ['corp-only'] })).status,
    201,
  );
  t.same(
    (await call('GET', '/agents/bot-2/effective-governance')).body.packs,
    ['no-paste', 'corp-only'],
    'most general scope first',
  );
  t.match((await call('POST', '/orgs/org-a/agents', { uid: 'bot-3', name: 'c', policy_packs: ['ghost'] })).body, {
    status: 400,
    detail: /^policy_packs\[0\]: no pack ghost/,
  });
  t.same((await h.call('cfg', 'DELETE', '/packs/no-paste/installations?scope=org&org=org-a')).body, {
    pack: 'no-paste',
    scope: 'org:org-a',
    installed: false,
    published: false,
  });
  t.equal((await h.call('cfg', 'DELETE', '/packs/no-paste/installations?scope=org&org=org-a')).status, 404);
  t.equal((await call('PUT', '/packs/ghost/installations')).status, 404);
});

t.test('bad bodies name the field', async (t) => {
  const cases: [string, unknown, RegExp][] = [
    ['/policies/ssh', {}, /^enabled: is required/],
    ['/policies/ssh', { enabled: true, colour: 1 }, /colour: unknown field/],
    ['/policies/tunnel-ports', { ports: [0] }, /^ports\[0\]: must be an integer 1..65535/],
    ['/policies/destination', { allow: [{ cidr: '10.0.0.0/33' }] }, /^allow\[0\]\.cidr/],
    ['/policies/destination', { deny: [{ port: 22 }] }, /^deny\[0\]: a rule names a cidr or a host/],
    ['/policies/llm', { models: { allow: ['[bad'] } }, /^models\.allow\[0\]: is not a valid glob/],
    ['/policies/llm', { credential_mode: 'maybe' }, /^credential_mode/],
    [
      '/policies/llm',
      { inspection: { inspectors: [{ rules: [{ tool: 'bash', verdict: 'shrug' }] }] } },
      /^inspection\.inspectors\[0\]\.rules\[0\]\.verdict/,
    ],
  ];
  for (const [path, body, detail] of cases) {
    const r = await call('PUT', path, body);
    t.equal(r.status, 400, `${path} ${JSON.stringify(body)}`);
    t.match(r.body.detail, detail);
  }
  t.equal((await call('PUT', '/policies/teleport', { enabled: true })).status, 404);
  t.match((await call('POST', '/packs', { name: 'Bad Name' })).body, { status: 400, detail: /^name:/ });
  t.match(
    (
      await call('POST', '/packs', {
        name: 'llm-bad',
        config: { content_inspection: { pii_detection: { types: ['passport'] } } },
      })
    ).body,
    { status: 400, detail: /content_inspection\.pii_detection\.types/ },
  );
  t.match((await call('POST', '/packs', { name: 'llm-bad', config: { downstream_url: 'https://x' } })).body, {
    status: 400,
    detail: /a pack carries model_policy, content_inspection or sidecar_inspection only/,
  });
  t.equal(
    (
      await call('POST', '/packs', {
        name: 'llm-ok',
        config: { model_policy: { mode: 'blocklist', models: ['*-preview'] } },
      })
    ).status,
    201,
  );
  t.match(
    (await call('GET', '/packs')).body.find((p: { name: string }) => p.name === 'llm-ok'),
    { config: { model_policy: { mode: 'blocklist', models: ['*-preview'] } } },
  );
});
