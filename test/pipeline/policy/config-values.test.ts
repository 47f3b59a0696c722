import t from 'tap';
import { ConfigValuesError } from '../../../pipeline/errors.ts';
import {
  canonicalJson,
  configHash,
  isSecretKey,
  lockedAbove,
  mergeAgentConfig,
  validateConfigDocument,
} from '../../../pipeline/policy/config-values.ts';

// Config values: the document validated whole, one agent's config merged platform → org → group →
// agent with locks, secret keys listed apart, and a hash that does not depend on key order.

const doc = () => ({
  version: '2026-11-22T10:00:00.000Z#42',
  enclave: { id: 'enc-1', name: 'eu-prod' },
  platform: {
    'log.level': { value: 'info', locked: false, secret: false },
    region: { value: 'eu', locked: true, secret: false },
    'llm.api_key': { value: null, locked: false, secret: true },
  },
  orgs: {
    'org-1': {
      config: {
        'log.level': { value: 'debug', locked: false, secret: false },
        region: { value: 'us', locked: false, secret: false },
        limits: { value: { rpm: 10, burst: [1, 2] }, locked: true, secret: false },
        feature: { value: { immutable: true, on: false }, locked: false, secret: false },
      },
      groups: {
        ops: {
          config: {
            limits: { value: { rpm: 99 }, locked: false, secret: false },
            'log.level': { value: 'warn', locked: false, secret: false },
            team: { value: 'ops', locked: true, secret: false },
          },
        },
      },
    },
    'org-2': { config: { other: { value: 1, locked: false, secret: false } }, groups: {} },
  },
  agents: {
    'bot-1': {
      org_id: 'org-1',
      group_id: 'ops',
      config: {
        'log.level': { value: 'trace', locked: false, secret: false },
        team: { value: 'mine', locked: false, secret: false },
        feature: { value: { on: true }, locked: false, secret: false },
        'db.password': { value: null, locked: false, secret: true },
      },
    },
    'bot-2': { org_id: 'org-2', group_id: null, config: {} },
  },
});

t.test('merge: locks at platform, org, group win; otherwise the most specific row', async (t) => {
  const d = validateConfigDocument(doc());
  const merged = mergeAgentConfig(d, { uid: 'bot-1', org_id: 'org-1', group_id: 'ops' });
  t.same(merged.config, {
    feature: { on: true },
    limits: { rpm: 10, burst: [1, 2] },
    'log.level': 'trace',
    region: 'eu',
    team: 'ops',
  });
  t.same(merged.secrets, ['db.password', 'llm.api_key'], 'secret keys listed apart, without values');
  t.same(merged.locked, { limits: 'org', region: 'platform', team: 'group' });
  t.same(Object.keys(merged.config), ['feature', 'limits', 'log.level', 'region', 'team'], 'keys in order');

  const noGroup = mergeAgentConfig(d, { uid: 'bot-x', org_id: 'org-1', group_id: null });
  t.same(noGroup.config['log.level'], 'debug', 'an agent with no rows of its own: its org');
  t.same(noGroup.config.feature, { immutable: true, on: false }, 'immutable inside a config value is no lock');

  const other = mergeAgentConfig(d, { uid: 'bot-1', org_id: 'org-2', group_id: 'ops' });
  t.same(
    other.config,
    { 'log.level': 'info', other: 1, region: 'eu' },
    "rows of another org's agent or group never apply",
  );
});

t.test("the agent's own values sit at agent scope, under every lock", async (t) => {
  const d = validateConfigDocument(doc());
  const who = { uid: 'bot-1', org_id: 'org-1', group_id: 'ops' };
  const merged = mergeAgentConfig(d, who, {
    'log.level': 'error',
    team: 'override',
    region: 'moon',
    'db.password': 'nope',
    scratch: { a: 1 },
  });
  t.equal(merged.config['log.level'], 'error', 'over the control plane agent row');
  t.equal(merged.config.team, 'ops', 'a group lock stands');
  t.equal(merged.config.region, 'eu', 'a platform lock stands');
  t.notOk('db.password' in merged.config, 'a secret key never takes a value from here');
  t.same(merged.config.scratch, { a: 1 });
  t.equal(lockedAbove(d, who, 'team'), 'group');
  t.equal(lockedAbove(d, who, 'region'), 'platform');
  t.equal(lockedAbove(d, who, 'limits'), 'org');
  t.equal(lockedAbove(d, who, 'log.level'), null);
  t.ok(isSecretKey(d, who, 'llm.api_key'));
  t.ok(isSecretKey(d, who, 'db.password'));
  t.notOk(isSecretKey(d, who, 'log.level'));
});

t.test('the hash is of canonical JSON', async (t) => {
  const a = configHash({ b: 1, a: { y: [1, { d: 2, c: 3 }], x: null } });
  const b = configHash({ a: { x: null, y: [1, { c: 3, d: 2 }] }, b: 1 });
  t.equal(a, b, 'key order does not matter');
  t.match(a, /^[0-9a-f]{64}$/);
  t.not(configHash({ a: [1, 2] }), configHash({ a: [2, 1] }), 'array order does');
  t.equal(canonicalJson({ b: 'x', a: [true, null, 1.5] }), '{"a":[true,null,1.5],"b":"x"}');
  t.equal(configHash({}), '44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a', 'sha256("{}")');
});

t.test('a document with one bad row is refused whole, naming the field', async (t) => {
  const cases: [string, (d: any) => void, RegExp][] = [
    ['not an object', (d) => (d.platform = []), /^config\.platform: must be a JSON object/],
    ['bad key', (d) => (d.platform['bad key'] = { value: 1 }), /^config\.platform\.bad key: is not a config key/],
    ['unknown field', (d) => (d.platform.region.extra = 1), /config\.platform\.region\.extra: unknown field/],
    ['locked type', (d) => (d.platform.region.locked = 'yes'), /region\.locked: must be a boolean/],
    ['secret type', (d) => (d.platform.region.secret = 1), /region\.secret: must be a boolean/],
    ['secret with bytes', (d) => (d.platform['llm.api_key'].value = 'sk-x'), /llm\.api_key\.value: must be null/],
    ['no value', (d) => delete d.orgs['org-1'].config.region.value, /region\.value: is required/],
    [
      'locked at agent scope',
      (d) => (d.agents['bot-1'].config.team.locked = true),
      /config\.agents\.bot-1\.config\.team\.locked: locked is refused at agent scope/,
    ],
    ['agent without org', (d) => delete d.agents['bot-1'].org_id, /config\.agents\.bot-1\.org_id: must be a string/],
    ['group id type', (d) => (d.agents['bot-1'].group_id = 3), /group_id: must be a string/],
    ['group not object', (d) => (d.orgs['org-1'].groups.ops = 'x'), /groups\.ops: must be a JSON object/],
    ['version', (d) => (d.version = 7), /^config\.version: must be a string/],
  ];
  for (const [name, mutate, message] of cases) {
    const d = doc();
    mutate(d);
    t.throws(() => validateConfigDocument(d), { name: 'ConfigValuesError', message }, name);
  }
  t.throws(() => validateConfigDocument(null), ConfigValuesError);
  t.throws(() => validateConfigDocument('x'), ConfigValuesError);
  const secret = validateConfigDocument({ platform: { k: { secret: true } } });
  t.same(secret.platform.k, { value: null, locked: false, secret: true }, 'a secret row needs no value');
});

t.test('ids named like Object.prototype members are ids', async (t) => {
  // Parsed, as a pulled document is: `__proto__` is then a key, not the literal's prototype.
  const d = validateConfigDocument(
    JSON.parse(`{"platform": {},
      "orgs": {"__proto__": {"config": {"a": {"value": 1}}, "groups": {"constructor": {"config": {"b": {"value": 2}}}}}},
      "agents": {"__proto__": {"org_id": "__proto__", "group_id": "constructor", "config": {"c": {"value": 3}}}}}`),
  );
  t.same(mergeAgentConfig(d, { uid: '__proto__', org_id: '__proto__', group_id: 'constructor' }).config, {
    a: 1,
    b: 2,
    c: 3,
  });
  t.same(mergeAgentConfig(d, { uid: 'toString', org_id: 'toString', group_id: 'hasOwnProperty' }).config, {});
});
