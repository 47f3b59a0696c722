import { PolicyValidationError } from '../errors.ts';
import {
  DEFAULT_SEVERITY,
  PII_TYPES,
  POLICY_KEYS,
  SEVERITIES,
  SIDECAR_DEFAULT_TIMEOUT_MS,
  type ContentInspection,
  type CustomPattern,
  type ModelPolicy,
  type PiiToggle,
  type PiiType,
  type PolicyDocument,
  type PolicyKey,
  type PolicyValues,
  type Severity,
  type Sidecar,
  type SidecarInspection,
  type Toggle,
} from './types.ts';

// Validation of the three policy keys. Every error names the field path; unknown fields are refused
// (a misspelt toggle in a security policy must not be silently ignored); defaults are filled in so
// the resolver and the engine never meet a missing field.

type Obj = Record<string, unknown>;

function fail(path: string, message: string): never {
  throw new PolicyValidationError(path, message);
}

function object(value: unknown, path: string, allowed: readonly string[]): Obj {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) fail(path, 'must be a JSON object');
  for (const key of Object.keys(value)) {
    if (!allowed.includes(key)) fail(path ? `${path}.${key}` : key, `unknown field (allowed: ${allowed.join(', ')})`);
  }
  return value as Obj;
}

function boolean(obj: Obj, key: string, path: string, fallback: boolean): boolean {
  const v = obj[key];
  if (v === undefined) return fallback;
  if (typeof v !== 'boolean') fail(`${path}.${key}`, 'must be a boolean');
  return v;
}

function string(
  obj: Obj,
  key: string,
  path: string,
  options: { required?: boolean; fallback?: string; nonEmpty?: boolean } = {},
): string {
  const v = obj[key];
  if (v === undefined) {
    if (options.required) fail(`${path}.${key}`, 'is required');
    return options.fallback ?? '';
  }
  if (typeof v !== 'string') fail(`${path}.${key}`, 'must be a string');
  if (options.nonEmpty && v.trim() === '') fail(`${path}.${key}`, 'must not be empty');
  return v;
}

function severity(obj: Obj, key: string, path: string, fallback: Severity): Severity {
  const v = obj[key];
  if (v === undefined) return fallback;
  if (typeof v !== 'string' || !SEVERITIES.includes(v as Severity))
    fail(`${path}.${key}`, `must be one of ${SEVERITIES.join(', ')}`);
  return v as Severity;
}

function array(obj: Obj, key: string, path: string): unknown[] | undefined {
  const v = obj[key];
  if (v === undefined) return undefined;
  if (!Array.isArray(v)) fail(`${path}.${key}`, 'must be an array');
  return v;
}

function prefix(path: string, key: string): string {
  return path ? `${path}.${key}` : key;
}

export function validateModelPolicy(value: unknown, path = 'model_policy'): ModelPolicy {
  const obj = object(value, path, ['immutable', 'mode', 'models']);
  const mode = obj.mode;
  if (mode === undefined) fail(`${path}.mode`, 'is required (allowlist or blocklist)');
  if (mode !== 'allowlist' && mode !== 'blocklist') fail(`${path}.mode`, 'must be "allowlist" or "blocklist"');
  const models = (array(obj, 'models', path) ?? []).map((m, i) => {
    if (typeof m !== 'string') fail(`${path}.models[${i}]`, 'must be a string');
    return m;
  });
  return { immutable: boolean(obj, 'immutable', path, false), mode, models };
}

function toggle(
  value: unknown,
  path: string,
  fallbackSeverity: Severity,
  extra: readonly string[] = [],
): { obj: Obj; toggle: Toggle } {
  const obj = object(value, path, ['enabled', 'severity', ...extra]);
  // An object given without `enabled` is read as enabled: writing `{severity: "block"}` and getting no
  // inspection would be the surprise (docs/decisions.md).
  return {
    obj,
    toggle: {
      enabled: boolean(obj, 'enabled', path, true),
      severity: severity(obj, 'severity', path, fallbackSeverity),
    },
  };
}

const OFF = (s: Severity): Toggle => ({ enabled: false, severity: s });

export function validateContentInspection(value: unknown, path = 'content_inspection'): ContentInspection {
  const obj = object(value, path, ['immutable', 'secrets_filter', 'pii_detection', 'api_key_detection', 'patterns']);
  const secrets =
    obj.secrets_filter === undefined
      ? OFF(DEFAULT_SEVERITY.secrets_filter)
      : toggle(obj.secrets_filter, `${path}.secrets_filter`, DEFAULT_SEVERITY.secrets_filter).toggle;
  const apiKey =
    obj.api_key_detection === undefined
      ? OFF(DEFAULT_SEVERITY.api_key_detection)
      : toggle(obj.api_key_detection, `${path}.api_key_detection`, DEFAULT_SEVERITY.api_key_detection).toggle;
  let pii: PiiToggle = { ...OFF(DEFAULT_SEVERITY.pii_detection), types: null };
  if (obj.pii_detection !== undefined) {
    const p = `${path}.pii_detection`;
    const t = toggle(obj.pii_detection, p, DEFAULT_SEVERITY.pii_detection, ['types']);
    const raw = array(t.obj, 'types', p);
    let types: PiiType[] | null = null;
    if (raw !== undefined) {
      if (raw.length === 0) fail(`${p}.types`, 'must not be empty (omit it to check every type)');
      types = [];
      raw.forEach((v, i) => {
        if (typeof v !== 'string' || !PII_TYPES.includes(v as PiiType))
          fail(`${p}.types[${i}]`, `must be one of ${PII_TYPES.join(', ')}`);
        if (!types!.includes(v as PiiType)) types!.push(v as PiiType);
      });
    }
    pii = { ...t.toggle, types };
  }
  const patterns: CustomPattern[] = (array(obj, 'patterns', path) ?? []).map((v, i) => {
    const p = `${path}.patterns[${i}]`;
    const o = object(v, p, ['pattern', 'description', 'severity']);
    // An invalid regex is not an error here: the spec says it is logged and skipped at compile time.
    const pattern = string(o, 'pattern', p, { required: true, nonEmpty: true });
    return {
      pattern,
      description: string(o, 'description', p, { fallback: '' }),
      severity: severity(o, 'severity', p, DEFAULT_SEVERITY.pattern),
    };
  });
  return {
    immutable: boolean(obj, 'immutable', path, false),
    secrets_filter: secrets,
    pii_detection: pii,
    api_key_detection: apiKey,
    patterns,
  };
}

export const MAX_SIDECAR_TIMEOUT_MS = 600_000;

export function validateSidecar(value: unknown, path: string): Sidecar {
  const obj = object(value, path, [
    'name',
    'url',
    'timeout_ms',
    'on_request',
    'on_response',
    'async',
    'severity',
    'include_context',
  ]);
  const name = string(obj, 'name', path, { required: true, nonEmpty: true });
  const url = string(obj, 'url', path, { required: true, nonEmpty: true });
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    fail(`${path}.url`, 'must be an absolute http(s) URL');
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') fail(`${path}.url`, 'must be an http or https URL');
  let timeout = SIDECAR_DEFAULT_TIMEOUT_MS;
  if (obj.timeout_ms !== undefined) {
    const t = obj.timeout_ms;
    if (typeof t !== 'number' || !Number.isInteger(t) || t <= 0 || t > MAX_SIDECAR_TIMEOUT_MS) {
      fail(`${path}.timeout_ms`, `must be an integer between 1 and ${MAX_SIDECAR_TIMEOUT_MS}`);
    }
    timeout = t;
  }
  return {
    name,
    url,
    timeout_ms: timeout,
    on_request: boolean(obj, 'on_request', path, false),
    on_response: boolean(obj, 'on_response', path, false),
    async: boolean(obj, 'async', path, false),
    severity: severity(obj, 'severity', path, DEFAULT_SEVERITY.sidecar),
    include_context: boolean(obj, 'include_context', path, false),
  };
}

export function validateSidecarInspection(value: unknown, path = 'sidecar_inspection'): SidecarInspection {
  const obj = object(value, path, ['immutable', 'sidecars']);
  const seen = new Set<string>();
  const sidecars = (array(obj, 'sidecars', path) ?? []).map((v, i) => {
    const sidecar = validateSidecar(v, `${path}.sidecars[${i}]`);
    if (seen.has(sidecar.name)) fail(`${path}.sidecars[${i}].name`, `duplicate sidecar name "${sidecar.name}"`);
    seen.add(sidecar.name);
    return sidecar;
  });
  return { immutable: boolean(obj, 'immutable', path, false), sidecars };
}

const VALIDATORS: { [K in PolicyKey]: (value: unknown, path?: string) => PolicyValues[K] } = {
  model_policy: validateModelPolicy,
  content_inspection: validateContentInspection,
  sidecar_inspection: validateSidecarInspection,
};

export function isPolicyKey(key: string): key is PolicyKey {
  return (POLICY_KEYS as readonly string[]).includes(key);
}

/** Validates one key's value; the error path starts with the key (or with `pathPrefix` when given). */
export function validatePolicyValue<K extends PolicyKey>(key: K, value: unknown, pathPrefix?: string): PolicyValues[K] {
  return VALIDATORS[key](value, pathPrefix === undefined ? key : prefix(pathPrefix, key)) as PolicyValues[K];
}

/**
 * A validated value as the JSON that validates back to it: what authoring stores and the snapshot
 * carries. The one field the validated form holds that the wire form cannot is `pii_detection.types:
 * null` ("every type", from an omitted field): it is written as an absent field again.
 */
export function policyValueJson<K extends PolicyKey>(key: K, value: PolicyValues[K]): unknown {
  if (key !== 'content_inspection') return value;
  const ci = value as ContentInspection;
  const { types, ...pii } = ci.pii_detection;
  return { ...ci, pii_detection: types === null ? pii : { ...pii, types } };
}

/** `policyValueJson` of every key a document holds. */
export function policyDocumentJson(doc: PolicyDocument): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const key of POLICY_KEYS) if (doc[key] !== undefined) out[key] = policyValueJson(key, doc[key]);
  return out;
}

/** A document with any subset of the three keys (`dvx inspect --policy`, a pack's config). */
export function validatePolicyDocument(value: unknown, path = ''): PolicyDocument {
  const obj = object(value, path, POLICY_KEYS);
  const doc: PolicyDocument = {};
  for (const key of POLICY_KEYS) {
    if (obj[key] !== undefined)
      (doc as Record<string, unknown>)[key] = validatePolicyValue(key, obj[key], path || undefined);
  }
  return doc;
}
