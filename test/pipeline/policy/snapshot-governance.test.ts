import t from 'tap';
import { readFileSync } from 'node:fs';
import { PolicyValidationError } from '../../../pipeline/errors.ts';
import {
  gateRefusal,
  governedUpstream,
  resolveGovernance,
  validateGovernance,
} from '../../../pipeline/policy/governance.ts';
import { snapshotDocument, validateSnapshot } from '../../../pipeline/policy/snapshot.ts';
import { governanceOf, governedSetting, snapshotGovernance } from '../../../pipeline/policy/snapshot-governance.ts';

// The governance keys in the snapshot (docs/snapshot.md): validated with the control plane's own
// validator, round-tripped through the served document, resolved enclave-side like the effective read.

const llm = {
  models: { allow: ['claude-*', 'gpt-*'], deny: ['*-preview'] },
  providers: { deny: ['openrouter'] },
  credential_mode: 'platform',
  upstream: { anthropic: 'https://llm.internal/anthropic/', 'openai-chat': 'https://llm.internal/chat' },
  inspection: {
    inspectors: [
      {
        name: 'payments',
        rules: [{ tool: 'transfer_*', verdict: 'require_approval', arg_gt: { amount: 100 }, model_match: 'claude-*' }],
      },
    ],
  },
};

function doc(): Record<string, unknown> {
  return structuredClone({
    version: 'v1',
    enclave: { id: 'enc-1', name: 'e', isolation_class: 'plain' },
    platform: {
      llm_policy: { value: llm, locked: false },
      ssh_policy: { value: { enabled: true } },
      destination_policy: { value: { deny: [{ cidr: '169.254.169.254/32', reason: 'metadata' }] }, locked: true },
    },
    orgs: {
      'org-1': {
        config: {
          llm_policy: {
            value: { models: { allow: ['claude-*'], deny: ['claude-2*'] }, providers: { allow: ['anthropic'] } },
          },
          ssh_policy: { value: { enabled: false } },
          credential_mode: { value: 'passthrough' },
        },
        flags: {},
        groups: {
          ops: {
            config: { tunnel_ports_policy: { value: { ports: [443, 22] }, locked: true } },
            packs: [{ name: 'corp-only', allow: [{ cidr: '10.0.0.0/8' }] }],
          },
        },
        packs: [
          { name: 'no-paste', config: {}, deny: [{ host: 'pastebin.com' }] },
          { name: 'hipaa', config: { model_policy: { mode: 'blocklist', models: ['x'] } } },
        ],
      },
    },
    agents: {
      'bot-1': {
        org_id: 'org-1',
        group_id: 'ops',
        name: 'b',
        status: 'active',
        contained: false,
        config: { exec_policy: { value: { enabled: true } }, tunnel_policy: { value: { enabled: true } } },
        packs: [
          { name: 'no-paste', deny: [{ host: 'ghostbin.co' }] },
          { name: 'lab', allow: [{ host: '*.lab' }] },
        ],
      },
    },
  });
}

t.test('round trip: the served document validates back to the same snapshot', async (t) => {
  const s = validateSnapshot(doc());
  const again = validateSnapshot(JSON.parse(JSON.stringify(snapshotDocument(s))));
  t.same(again, s);
  t.same(snapshotDocument(again), snapshotDocument(s), 'a fixed point');
  const served = snapshotDocument(s) as { orgs: Record<string, { packs: unknown[] }> };
  t.same(
    served.orgs['org-1'].packs[1],
    { name: 'hipaa', config: { model_policy: { immutable: false, mode: 'blocklist', models: ['x'] } } },
    'a pack without rules reads as before (no empty allow/deny)',
  );
  t.same(
    (s.platform.llm_policy!.value as typeof llm).upstream,
    { anthropic: 'https://llm.internal/anthropic', 'openai-chat': 'https://llm.internal/chat' },
    'upstream URLs lose their trailing slash, as the setting does',
  );
});

t.test('snapshotGovernance resolves what resolveGovernance does over the same rows and packs', async (t) => {
  const s = validateSnapshot(doc());
  const e = snapshotGovernance(s, 'org-1', 'ops', 'bot-1');
  const v = <K extends Parameters<typeof validateGovernance>[0]>(k: K, body: unknown) => validateGovernance(k, body);
  const expected = resolveGovernance(
    {
      llm: {
        platform: v('llm', llm),
        org: v('llm', { models: { allow: ['claude-*'], deny: ['claude-2*'] }, providers: { allow: ['anthropic'] } }),
      },
      ssh: { platform: v('ssh', { enabled: true }), org: v('ssh', { enabled: false }) },
      destination: {
        platform: v('destination', { deny: [{ cidr: '169.254.169.254/32', reason: 'metadata' }], locked: true }),
      },
      tunnel_ports: { group: v('tunnel_ports', { ports: [22, 443], locked: true }) },
      exec: { agent: v('exec', { enabled: true }) },
      tunnel: { agent: v('tunnel', { enabled: true }) },
    },
    [
      { name: 'no-paste', allow: [], deny: [{ host: 'pastebin.com' }] },
      { name: 'hipaa', allow: [], deny: [] },
      { name: 'corp-only', allow: [{ cidr: '10.0.0.0/8' }], deny: [] },
      { name: 'lab', allow: [{ host: '*.lab' }], deny: [] },
    ],
  );
  t.same(e, expected);
  t.equal(e.ssh, false, 'the org row is more specific');
  t.equal(e.exec, true);
  t.same(e.tunnel_ports, [22, 443]);
  t.same(e.llm.models, { allow_gates: [['claude-*', 'gpt-*'], ['claude-*']], deny: ['*-preview', 'claude-2*'] });
  t.same(e.packs, ['no-paste', 'hipaa', 'corp-only', 'lab'], 'most general first, a pack once (the org install wins)');
  t.same(e.destination.allow_gates, [[{ cidr: '10.0.0.0/8' }], [{ host: '*.lab' }]]);
  t.same(e.llm.inspection!.inspectors[0].rules[0].model_match, 'claude-*');

  const other = snapshotGovernance(s, 'org-1', null, 'bot-9');
  t.equal(other.exec, false, "an agent the snapshot does not list has no agent rows, and no group's");
  t.same(other.packs, ['no-paste', 'hipaa']);
  t.equal(snapshotGovernance(s, 'org-2', null, 'bot-1').exec, false, "another org's caller never gets bot-1's rows");
});

t.test('governanceOf: null when nothing applies; once per snapshot and caller', async (t) => {
  const s = validateSnapshot(doc());
  const a = governanceOf(s, 'org-1', 'ops', 'bot-1');
  t.ok(a);
  t.equal(governanceOf(s, 'org-1', 'ops', 'bot-1'), a, 'the same object: cached');
  t.not(governanceOf(s, 'org-1', null, 'bot-1'), a, 'the group is part of the key');
  const reloaded = validateSnapshot(doc());
  t.not(governanceOf(reloaded, 'org-1', 'ops', 'bot-1'), a, 'a reload is a new snapshot: resolved again');
  const bare = validateSnapshot({
    version: 'b',
    orgs: { 'org-1': { config: { credential_mode: { value: 'platform' } } } },
  });
  t.equal(governanceOf(bare, 'org-1', null, 'bot-1'), null, 'no governance row nor pack: null');
});

t.test('prototype-named ids are ids', async (t) => {
  // JSON.parse makes `__proto__` an own key, as a snapshot file does.
  const raw = `{"version":"p","orgs":{"__proto__":{"config":{"exec_policy":{"value":{"enabled":true}}},"groups":{"constructor":{"config":{"ssh_policy":{"value":{"enabled":true}}},"packs":[{"name":"p","deny":[{"host":"x.com"}]}]}}}},"agents":{"toString":{"org_id":"__proto__","group_id":"constructor","config":{"tunnel_policy":{"value":{"enabled":true}}}}}}`;
  const s = validateSnapshot(JSON.parse(raw));
  const e = snapshotGovernance(s, '__proto__', 'constructor', 'toString');
  t.same([e.exec, e.ssh, e.tunnel], [true, true, true]);
  t.same(e.destination.deny, [{ host: 'x.com' }]);
  const stranger = snapshotGovernance(s, 'hasOwnProperty', 'constructor', 'valueOf');
  t.same([stranger.exec, stranger.ssh, stranger.tunnel, stranger.packs], [false, false, false, []]);
  t.equal(governanceOf(s, 'valueOf', '__proto__', 'constructor'), null);
  t.equal(Object.hasOwn(Object.prototype, 'exec'), false, 'no prototype was written');
});

t.test('bad values are refused whole, with the field path', async (t) => {
  const cases: [(d: Record<string, any>) => void, RegExp][] = [
    [
      (d) => (d.orgs['org-1'].config.llm_policy.value.models.allow = ['[bad']),
      /^snapshot\.orgs\.org-1\.config\.llm_policy\.value\.models\.allow\[0\]: is not a valid glob/,
    ],
    [(d) => (d.platform.ssh_policy.value = {}), /^snapshot\.platform\.ssh_policy\.value\.enabled: is required/],
    [
      (d) => (d.platform.ssh_policy.value = { enabled: true, colour: 1 }),
      /^snapshot\.platform\.ssh_policy\.value\.colour: unknown field/,
    ],
    [
      (d) => (d.platform.ssh_policy.value = { enabled: true, locked: true }),
      /^snapshot\.platform\.ssh_policy\.value\.locked: unknown field/,
    ],
    [(d) => (d.platform.ssh_policy.value = 'on'), /^snapshot\.platform\.ssh_policy\.value: must be a JSON object/],
    [
      (d) => (d.agents['bot-1'].config.exec_policy.locked = true),
      /^snapshot\.agents\.bot-1\.config\.exec_policy\.locked: locked is refused at agent scope/,
    ],
    [
      (d) => (d.orgs['org-1'].groups.ops.config.tunnel_ports_policy.value.ports = [0]),
      /^snapshot\.orgs\.org-1\.groups\.ops\.config\.tunnel_ports_policy\.value\.ports\[0\]: must be an integer 1..65535/,
    ],
    [
      (d) => (d.platform.destination_policy.value.deny = [{ port: 22 }]),
      /^snapshot\.platform\.destination_policy\.value\.deny\[0\]: a rule names a cidr or a host/,
    ],
    [
      (d) => (d.platform.llm_policy.value.upstream = { grpc: 'https://x' }),
      /^snapshot\.platform\.llm_policy\.value\.upstream\.grpc: unknown field/,
    ],
    [
      (d) => (d.platform.llm_policy.value.upstream = { openai: 'file:///etc/passwd' }),
      /^snapshot\.platform\.llm_policy\.value\.upstream\.openai: must be an http\(s\) URL/,
    ],
    [
      (d) => (d.platform.llm_policy.value.inspection.inspectors[0].rules[0].model_match = 'claude-['),
      /^snapshot\.platform\.llm_policy\.value\.inspection\.inspectors\[0\]\.rules\[0\]\.model_match: is not a valid glob/,
    ],
    [
      (d) => (d.platform.llm_policy.value.inspection.inspectors[0].rules[0].model_match = 7),
      /rules\[0\]\.model_match: must be a string/,
    ],
    [
      (d) => (d.platform.llm_policy.value.credential_mode = 'mine'),
      /^snapshot\.platform\.llm_policy\.value\.credential_mode: must be/,
    ],
    [
      (d) => (d.orgs['org-1'].groups.ops.packs[0].config = {}),
      /^snapshot\.orgs\.org-1\.groups\.ops\.packs\[0\]\.config: unknown field \(name, allow, deny\)/,
    ],
    [
      (d) => (d.agents['bot-1'].packs[0].allow = [{ cidr: '10.0.0.0/33' }]),
      /^snapshot\.agents\.bot-1\.packs\[0\]\.allow\[0\]\.cidr: must be an IP address or CIDR block/,
    ],
    [
      (d) => (d.orgs['org-1'].packs[0].deny = 'all'),
      /^snapshot\.orgs\.org-1\.packs\[0\]\.deny: must be an array of Rule/,
    ],
    [(d) => (d.orgs['org-1'].packs[0].colour = 1), /^snapshot\.orgs\.org-1\.packs\[0\]\.colour: unknown field/],
    [(d) => (d.platform.gossip_policy = { value: {} }), /^snapshot\.platform\.gossip_policy: unknown key/],
  ];
  for (const [mutate, message] of cases) {
    const d = doc() as Record<string, any>;
    mutate(d);
    t.throws(() => validateSnapshot(d), message, String(message));
    try {
      validateSnapshot(d);
    } catch (err) {
      t.type(err, PolicyValidationError);
    }
  }
});

t.test('credential_mode and upstream: the setting and llm_policy form one hierarchy', async (t) => {
  const snap = (platform: object, org: object, agent: object = {}) =>
    validateSnapshot({
      version: 'x',
      platform,
      orgs: { o: { config: org } },
      agents: { a: { org_id: 'o', config: agent } },
    });
  const mode = (s: ReturnType<typeof snap>) => governedSetting(s, 'credential_mode', 'o', null, 'a');
  t.equal(
    mode(
      snap({ credential_mode: { value: 'platform' } }, { llm_policy: { value: { credential_mode: 'passthrough' } } }),
    ),
    'passthrough',
    'a more specific governance value wins over a broader setting',
  );
  t.equal(
    mode(
      snap({ llm_policy: { value: { credential_mode: 'passthrough' } } }, { credential_mode: { value: 'platform' } }),
    ),
    'platform',
    'and a more specific setting over a broader governance value',
  );
  t.equal(
    mode(
      snap({ credential_mode: { value: 'platform' }, llm_policy: { value: { credential_mode: 'passthrough' } } }, {}),
    ),
    'passthrough',
    'at one scope the governance value stands in for the setting',
  );
  t.equal(
    mode(
      snap(
        { credential_mode: { value: 'platform' }, llm_policy: { value: { models: {} }, locked: true } },
        {
          llm_policy: { value: { credential_mode: 'passthrough' } },
        },
      ),
    ),
    'passthrough',
    'a locked llm_policy that sets no credential_mode locks none',
  );
  t.equal(
    mode(
      snap(
        { credential_mode: { value: 'platform' }, llm_policy: { value: { credential_mode: null } } },
        {},
        {
          llm_policy: { value: { credential_mode: 'passthrough' } },
        },
      ),
    ),
    'passthrough',
    'a null credential_mode sets nothing',
  );
  t.equal(
    mode(
      snap(
        { credential_mode: { value: 'platform' }, llm_policy: { value: { models: {} }, locked: true } },
        {},
        {
          llm_policy: { value: { credential_mode: 'passthrough' } },
        },
      ),
    ),
    'passthrough',
  );
  t.equal(
    mode(
      snap(
        { credential_mode: { value: 'platform', locked: true } },
        { llm_policy: { value: { credential_mode: 'passthrough' } } },
      ),
    ),
    'platform',
    'a locked setting is not escaped through llm_policy',
  );
  t.equal(
    mode(
      snap(
        { llm_policy: { value: { credential_mode: 'platform' }, locked: true } },
        { credential_mode: { value: 'passthrough' } },
      ),
    ),
    'platform',
    'nor a locked llm_policy through the setting',
  );
  t.equal(mode(snap({}, {})), null);

  const up = governedSetting(
    snap(
      { upstream: { value: { 'openai-chat': 'https://setting' } } },
      {
        llm_policy: { value: { upstream: { openai: 'https://openai-gov', 'openai-responses': 'https://resp-gov' } } },
      },
    ),
    'upstream',
    'o',
    null,
    'a',
  )!;
  t.equal(governedUpstream(up, 'openai-chat'), 'https://openai-gov', "the provider's key covers its formats");
  t.equal(governedUpstream(up, 'openai-responses'), 'https://resp-gov', "a format's own key first");
  t.equal(governedUpstream(up, 'anthropic-messages'), undefined);
  t.equal(governedUpstream(Object.create(null), 'openai-chat'), undefined);
});

t.test('gates: every deny refuses, every allow list is a gate', async (t) => {
  const g = { allow_gates: [['claude-*', 'gpt-*'], ['claude-*']], deny: ['*-preview'] };
  t.equal(gateRefusal(g, 'claude-sonnet-4-5'), null);
  t.match(gateRefusal(g, 'gpt-4o'), /no allow list of \["claude-\*"\]/);
  t.match(gateRefusal(g, 'claude-x-preview'), /deny glob "\*-preview"/);
  t.match(gateRefusal(g, null), /no allow list/, 'an unreadable name passes no gate');
  t.equal(gateRefusal({ allow_gates: [], deny: ['x'] }, null), null, 'and no deny');
});

t.test("docs/snapshot.md's example loads and resolves", async (t) => {
  const md = readFileSync(new URL('../../../docs/snapshot.md', import.meta.url), 'utf8');
  const s = validateSnapshot(JSON.parse(md.split('```json\n')[1].split('```')[0]));
  const e = snapshotGovernance(s, 'org-1', 'g-1', 'agent-1');
  t.same(e.packs, ['hipaa', 'no-paste', 'corp-only', 'lab']);
  t.same(e.llm.models.allow_gates, [['claude-*', 'gpt-*'], ['claude-*']]);
  t.same([e.exec, e.ssh, e.tunnel_ports], [true, false, [443]]);
});
