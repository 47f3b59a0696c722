import t from 'tap';
import { PolicyValidationError } from '../../../pipeline/errors.ts';
import {
  validateContentInspection,
  validateModelPolicy,
  validatePolicyDocument,
  validatePolicyValue,
  validateSidecarInspection,
} from '../../../pipeline/policy/validate.ts';

t.test('defaults are filled in', async (t) => {
  t.same(validateContentInspection({}), {
    immutable: false,
    secrets_filter: { enabled: false, severity: 'block' },
    pii_detection: { enabled: false, severity: 'warn', types: null },
    api_key_detection: { enabled: false, severity: 'warn' },
    patterns: [],
  });
  t.same(validateContentInspection({ pii_detection: { enabled: true }, patterns: [{ pattern: 'x' }] }).patterns, [
    { pattern: 'x', description: '', severity: 'warn' },
  ]);
  t.same(
    validateContentInspection({ secrets_filter: { severity: 'log' } }).secrets_filter,
    { enabled: true, severity: 'log' },
    'an object without enabled is enabled',
  );
  t.same(validateModelPolicy({ mode: 'blocklist' }), { immutable: false, mode: 'blocklist', models: [] });
  t.same(validateSidecarInspection({ sidecars: [{ name: 'a', url: 'https://s.example/x' }] }).sidecars[0], {
    name: 'a',
    url: 'https://s.example/x',
    timeout_ms: 5000,
    on_request: false,
    on_response: false,
    async: false,
    severity: 'warn',
    include_context: false,
  });
});

t.test('errors name the field path', async (t) => {
  const cases: [string, unknown, RegExp][] = [
    ['model_policy', { mode: 'denylist' }, /^model_policy\.mode: /],
    ['model_policy', { models: ['a'] }, /^model_policy\.mode: is required/],
    ['model_policy', { mode: 'allowlist', models: ['a', 3] }, /^model_policy\.models\[1\]: must be a string/],
    ['model_policy', { mode: 'allowlist', model: [] }, /^model_policy\.model: unknown field/],
    ['model_policy', [], /^model_policy: must be a JSON object/],
    [
      'content_inspection',
      { pii_detection: { enabled: true, types: ['email', 'phone'] } },
      /^content_inspection\.pii_detection\.types\[1\]: must be one of email, credit_card, ssn/,
    ],
    [
      'content_inspection',
      { pii_detection: { types: [] } },
      /^content_inspection\.pii_detection\.types: must not be empty/,
    ],
    [
      'content_inspection',
      { secrets_filter: { enabled: 'yes' } },
      /^content_inspection\.secrets_filter\.enabled: must be a boolean/,
    ],
    [
      'content_inspection',
      { api_key_detection: { enabled: true, severity: 'deny' } },
      /^content_inspection\.api_key_detection\.severity: must be one of log, warn, block, redact/,
    ],
    [
      'content_inspection',
      { patterns: [{ pattern: 'a' }, { description: 'd' }] },
      /^content_inspection\.patterns\[1\]\.pattern: is required/,
    ],
    [
      'content_inspection',
      { patterns: [{ pattern: 'a', severity: 'hide' }] },
      /^content_inspection\.patterns\[0\]\.severity/,
    ],
    ['content_inspection', { pii_detecton: {} }, /^content_inspection\.pii_detecton: unknown field/],
    ['content_inspection', { immutable: 1 }, /^content_inspection\.immutable: must be a boolean/],
    ['sidecar_inspection', { sidecars: [{ name: 'a' }] }, /^sidecar_inspection\.sidecars\[0\]\.url: is required/],
    [
      'sidecar_inspection',
      { sidecars: [{ name: 'a', url: 'ftp://x' }] },
      /^sidecar_inspection\.sidecars\[0\]\.url: must be an http or https URL/,
    ],
    [
      'sidecar_inspection',
      { sidecars: [{ name: 'a', url: 'http://x', timeout_ms: 0 }] },
      /timeout_ms: must be an integer/,
    ],
    ['sidecar_inspection', { sidecars: [{ name: 'a', url: 'http://x', timeout_ms: 1.5 }] }, /timeout_ms/],
    [
      'sidecar_inspection',
      {
        sidecars: [
          { name: 'a', url: 'http://x' },
          { name: 'a', url: 'http://y' },
        ],
      },
      /sidecars\[1\]\.name: duplicate sidecar name "a"/,
    ],
    ['sidecar_inspection', { sidecars: {} }, /^sidecar_inspection\.sidecars: must be an array/],
  ];
  for (const [key, value, message] of cases) {
    const err = (() => {
      try {
        validatePolicyValue(key as 'model_policy', value);
      } catch (e) {
        return e;
      }
    })();
    t.ok(err instanceof PolicyValidationError, `${JSON.stringify(value)} is refused`);
    t.match((err as Error).message, message);
  }
});

t.test('invalid regexes are accepted here: the spec skips them at compile time', async (t) => {
  t.equal(validateContentInspection({ patterns: [{ pattern: '([' }] }).patterns.length, 1);
});

t.test('documents take any subset of the three keys and nothing else', async (t) => {
  t.same(Object.keys(validatePolicyDocument({ model_policy: { mode: 'allowlist', models: [] } })), ['model_policy']);
  t.throws(() => validatePolicyDocument({ credential_mode: 'platform' }), /credential_mode: unknown field/);
  t.throws(() => validatePolicyDocument('x'), /policy: must be a JSON object/);
});
