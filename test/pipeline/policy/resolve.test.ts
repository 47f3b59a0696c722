import t from 'tap';
import fc from 'fast-check';
import { PolicyScopeError } from '../../../pipeline/errors.ts';
import { isInert, resolvePolicy, type PolicyLayers, type ScopeRows } from '../../../pipeline/policy/resolve.ts';
import {
  validateContentInspection,
  validateModelPolicy,
  validateSidecarInspection,
} from '../../../pipeline/policy/validate.ts';
import { compile, permitted } from '../../../pipeline/inspectors/model-restriction.ts';
import type { ContentInspection } from '../../../pipeline/policy/types.ts';

const model = (mode: 'allowlist' | 'blocklist', models: string[], immutable = false) =>
  validateModelPolicy({ mode, models, immutable });
const content = (v: Record<string, unknown>) => validateContentInspection(v);

t.test('empty everywhere is inert', async (t) => {
  const r = resolvePolicy({});
  t.ok(isInert(r));
  t.same(r.models, []);
  t.equal(r.content, null);
  t.ok(
    isInert(resolvePolicy({ org: { content_inspection: { value: content({}) } } })),
    'every toggle off is inert too',
  );
});

t.test('most specific row wins without locks', async (t) => {
  const layers: PolicyLayers = {
    platform: { model_policy: { value: model('allowlist', ['p']) } },
    org: { model_policy: { value: model('allowlist', ['o']) } },
    group: { model_policy: { value: model('allowlist', ['g']) } },
    agent: { model_policy: { value: model('allowlist', ['a']) } },
  };
  t.same(resolvePolicy(layers).models[0].models, ['a']);
  delete layers.agent;
  t.same(resolvePolicy(layers).models[0].models, ['g']);
  delete layers.group;
  t.same(resolvePolicy(layers).models[0].models, ['o']);
  delete layers.org;
  t.same(resolvePolicy(layers).models[0].models, ['p']);
});

t.test('a locked row at platform, then org, then group wins', async (t) => {
  const layers: PolicyLayers = {
    platform: { model_policy: { value: model('allowlist', ['p']) } },
    org: { model_policy: { value: model('allowlist', ['o']), locked: true } },
    group: { model_policy: { value: model('allowlist', ['g']), locked: true } },
    agent: { model_policy: { value: model('allowlist', ['a']) } },
  };
  t.same(resolvePolicy(layers).models[0].models, ['o'], 'org lock beats the group lock below it');
  layers.platform!.model_policy!.locked = true;
  t.same(resolvePolicy(layers).models[0].models, ['p']);
  layers.platform!.model_policy = { value: model('allowlist', ['p'], true) };
  t.same(resolvePolicy(layers).models[0].models, ['p'], 'immutable: true acts as a lock');
});

t.test('locked or immutable at agent scope is refused', async (t) => {
  t.throws(
    () => resolvePolicy({ agent: { model_policy: { value: model('allowlist', []), locked: true } } }),
    PolicyScopeError,
  );
  t.throws(
    () => resolvePolicy({ agent: { content_inspection: { value: content({ immutable: true }) } } }),
    /immutable: refused at agent scope/,
  );
});

t.test("patterns and sidecars add up across scopes; other fields are the winner's", async (t) => {
  const r = resolvePolicy({
    platform: {
      content_inspection: {
        value: content({ pii_detection: { enabled: true }, patterns: [{ pattern: 'p' }] }),
        locked: true,
      },
      sidecar_inspection: { value: validateSidecarInspection({ sidecars: [{ name: 'a', url: 'http://a/' }] }) },
    },
    org: {
      content_inspection: {
        value: content({ api_key_detection: { enabled: true }, patterns: [{ pattern: 'o' }, { pattern: 'p' }] }),
      },
    },
    agent: {
      content_inspection: { value: content({ patterns: [{ pattern: 'x' }] }) },
      sidecar_inspection: {
        value: validateSidecarInspection({
          sidecars: [
            { name: 'a', url: 'http://evil/' },
            { name: 'b', url: 'http://b/' },
          ],
        }),
      },
    },
  });
  t.same(
    r.content!.patterns.map((p) => p.pattern),
    ['p', 'o', 'x'],
    'union, deduplicated, general first',
  );
  t.equal(r.content!.pii_detection.enabled, true);
  t.equal(r.content!.api_key_detection.enabled, false, 'the org toggle does not merge into the locked platform row');
  t.same(
    r.sidecars.map((s) => [s.name, s.url]),
    [
      ['a', 'http://a/'],
      ['b', 'http://b/'],
    ],
    'a lower scope cannot replace a sidecar',
  );
});

t.test('packs add content and AND models', async (t) => {
  const r = resolvePolicy({
    org: {
      content_inspection: {
        value: content({
          pii_detection: { enabled: true, severity: 'log', types: ['email'] },
          secrets_filter: { enabled: false },
        }),
      },
      model_policy: { value: model('allowlist', ['claude-*', 'gpt-*']) },
    },
    packs: [
      {
        name: 'hipaa',
        config: {
          content_inspection: content({
            pii_detection: { enabled: true, severity: 'block', types: ['ssn'] },
            secrets_filter: { enabled: true },
            patterns: [{ pattern: 'mrn-[0-9]+' }],
          }),
        },
      },
      { name: 'no-gpt', config: { model_policy: model('blocklist', ['gpt-*']) } },
      { name: 'weak', config: { content_inspection: content({ pii_detection: { enabled: false } }) } },
    ],
  });
  t.same(r.content!.pii_detection, { enabled: true, severity: 'block', types: ['email', 'ssn'] });
  t.equal(r.content!.secrets_filter.enabled, true);
  t.same(
    r.content!.patterns.map((p) => p.pattern),
    ['mrn-[0-9]+'],
  );
  const plan = compile(r.models)!;
  t.ok(permitted(plan, 'claude-haiku'));
  t.notOk(permitted(plan, 'gpt-4o'));
});

t.test('versions are stable for equal policies and differ otherwise', async (t) => {
  const a = resolvePolicy({ org: { model_policy: { value: model('allowlist', ['x']) } } });
  const b = resolvePolicy({ platform: { model_policy: { value: model('allowlist', ['x']) } } });
  const c = resolvePolicy({ org: { model_policy: { value: model('allowlist', ['y']) } } });
  t.equal(a.version, b.version);
  t.not(a.version, c.version);
});

// ---- properties ----
const modelArb = fc.record({
  mode: fc.constantFrom<'allowlist' | 'blocklist'>('allowlist', 'blocklist'),
  models: fc.array(fc.constantFrom('a*', 'b*', 'c', 'a1', 'b2', '*'), { maxLength: 3 }),
});
const toggleArb = fc.record({ enabled: fc.boolean(), severity: fc.constantFrom('log', 'warn', 'block', 'redact') });
const contentArb = fc.record({
  secrets_filter: toggleArb,
  api_key_detection: toggleArb,
  pii_detection: fc.record({
    enabled: fc.boolean(),
    severity: fc.constantFrom('log', 'warn', 'block'),
    types: fc.option(fc.subarray(['email', 'credit_card', 'ssn'], { minLength: 1 }), { nil: undefined }),
  }),
  patterns: fc.array(
    fc.record({ pattern: fc.constantFrom('x', 'y', 'z+'), severity: fc.constantFrom('log', 'block') }),
    { maxLength: 2 },
  ),
});
const rowArb = <V>(valueArb: fc.Arbitrary<V>) =>
  fc.option(fc.record({ value: valueArb, locked: fc.boolean() }), { nil: undefined });
const scopeArb = fc.record({ model: rowArb(modelArb), content: rowArb(contentArb) });
const layersArb = fc.record({ platform: scopeArb, org: scopeArb, group: scopeArb, agent: scopeArb });

type ScopeRaw = typeof scopeArb extends fc.Arbitrary<infer V> ? V : never;
type LayersRaw = typeof layersArb extends fc.Arbitrary<infer V> ? V : never;

function toLayers(raw: LayersRaw, packs: { model?: unknown; content?: unknown }[] = []): PolicyLayers {
  const rows = (s: ScopeRaw, agent: boolean): ScopeRows => {
    const r: ScopeRows = {};
    if (s.model) r.model_policy = { value: validateModelPolicy(s.model.value), locked: agent ? false : s.model.locked };
    if (s.content)
      r.content_inspection = {
        value: validateContentInspection(s.content.value),
        locked: agent ? false : s.content.locked,
      };
    return r;
  };
  return {
    platform: rows(raw.platform, false),
    org: rows(raw.org, false),
    group: rows(raw.group, false),
    agent: rows(raw.agent, true),
    packs: packs.map((p, i) => ({
      name: `p${i}`,
      config: {
        ...(p.model ? { model_policy: validateModelPolicy(p.model) } : {}),
        ...(p.content ? { content_inspection: validateContentInspection(p.content) } : {}),
      },
    })),
  };
}

t.test('property: a lock always wins', async (_t) => {
  fc.assert(
    fc.property(layersArb, (raw) => {
      const layers = toLayers(raw);
      const r = resolvePolicy(layers);
      for (const scope of ['platform', 'org', 'group'] as const) {
        const row = layers[scope]?.model_policy;
        if (row?.locked) return JSON.stringify(r.models[0]) === JSON.stringify(row.value);
      }
      return true;
    }),
  );
});

const enabled = (c: ContentInspection | null) =>
  c === null
    ? []
    : [
        c.secrets_filter.enabled && 'secrets',
        c.api_key_detection.enabled && 'api_key',
        c.pii_detection.enabled && 'pii',
        ...c.patterns.map((p) => `pattern:${p.pattern}:${p.severity}`),
      ].filter(Boolean);

t.test('property: packs never disable what the base enabled', async (_t) => {
  fc.assert(
    fc.property(layersArb, fc.array(contentArb, { maxLength: 3 }), (raw, packs) => {
      const base = resolvePolicy(toLayers(raw));
      const withPacks = resolvePolicy(
        toLayers(
          raw,
          packs.map((content) => ({ content })),
        ),
      );
      const after = new Set(enabled(withPacks.content));
      if (!enabled(base.content).every((x) => after.has(x))) return false;
      // PII types only widen.
      const bp = base.content?.pii_detection;
      const ap = withPacks.content?.pii_detection;
      if (bp?.enabled) {
        if (bp.types === null && ap!.types !== null) return false;
        if (bp.types && ap!.types && !bp.types.every((x) => ap!.types!.includes(x))) return false;
      }
      return true;
    }),
  );
});

t.test('property: a model denied by any layer stays denied', async (_t) => {
  fc.assert(
    fc.property(
      layersArb,
      fc.array(modelArb, { maxLength: 3 }),
      fc.constantFrom('a1', 'b2', 'c', 'd', 'ab'),
      (raw, packs, name) => {
        const layers = toLayers(
          raw,
          packs.map((model) => ({ model })),
        );
        const r = resolvePolicy(layers);
        const all = compile(r.models);
        if (all === null) return true;
        for (const layer of r.models) {
          if (!permitted(compile([layer])!, name) && permitted(all, name)) return false;
        }
        for (const p of packs)
          if (!permitted(compile([validateModelPolicy(p)])!, name) && permitted(all, name)) return false;
        return true;
      },
    ),
  );
});
