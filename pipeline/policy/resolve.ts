import { createHash } from 'node:crypto';
import { PolicyScopeError } from '../errors.ts';
import { stronger } from './severity.ts';
import type {
  ContentInspection,
  CustomPattern,
  ModelPolicy,
  PiiToggle,
  PolicyDocument,
  PolicyKey,
  PolicyValues,
  ResolvedPolicy,
  Sidecar,
  SidecarInspection,
  Toggle,
} from './types.ts';

// The policy resolver, shared by the proxies and the control plane (docs/decisions.md, "Resolution").
//
//   platform ─┐   per key: a locked (or `immutable: true`) row at platform, then org, then group wins;
//   org ──────┤   otherwise the most specific row of agent → group → org → platform; otherwise nothing
//   group ────┼─▶ (inert). patterns and sidecars are additive across every scope. ──▶ base
//   agent ────┘
//   base + packs ─▶ content inspection only adds; model layers compose by AND ──▶ ResolvedPolicy

export type Scope = 'platform' | 'org' | 'group' | 'agent';
export const LOCKABLE_SCOPES = ['platform', 'org', 'group'] as const;

export interface PolicyRow<V> {
  value: V;
  locked?: boolean;
}

export type ScopeRows = { [K in PolicyKey]?: PolicyRow<PolicyValues[K]> };

export interface PolicyPack {
  name: string;
  config: PolicyDocument;
}

export interface PolicyLayers {
  platform?: ScopeRows;
  org?: ScopeRows;
  group?: ScopeRows;
  agent?: ScopeRows;
  packs?: PolicyPack[];
}

/** `locked` is refused at agent scope (spec: Policy hierarchy); so is `immutable`, the in-value lock. */
export function assertRowAllowed(scope: Scope, key: PolicyKey, row: PolicyRow<{ immutable: boolean }>): void {
  if (scope !== 'agent') return;
  if (row.locked) throw new PolicyScopeError(`${key}: locked is refused at agent scope`);
  if (row.value.immutable)
    throw new PolicyScopeError(`${key}.immutable: refused at agent scope (there is no lower scope to lock out)`);
}

const MOST_SPECIFIC_FIRST: readonly Scope[] = ['agent', 'group', 'org', 'platform'];
const MOST_GENERAL_FIRST: readonly Scope[] = ['platform', 'org', 'group', 'agent'];

export type RowsByScope<V> = { [S in Scope]?: PolicyRow<V> };

/**
 * The winning row of one key: a locked row (or one whose value says `immutable: true`) at platform,
 * then org, then group; otherwise the most specific row. The same rule serves the policy keys and the
 * plain settings (`credential_mode`, `downstream_url`, `upstream`).
 */
export function resolveSetting<V>(rows: RowsByScope<V>): V | null {
  for (const scope of LOCKABLE_SCOPES) {
    const row = rows[scope];
    if (row && (row.locked || (row.value as { immutable?: unknown } | null)?.immutable === true)) return row.value;
  }
  for (const scope of MOST_SPECIFIC_FIRST) {
    const row = rows[scope];
    if (row) return row.value;
  }
  return null;
}

function winner<K extends PolicyKey>(layers: PolicyLayers, key: K): PolicyValues[K] | null {
  return resolveSetting<PolicyValues[K]>({
    platform: layers.platform?.[key] as PolicyRow<PolicyValues[K]> | undefined,
    org: layers.org?.[key] as PolicyRow<PolicyValues[K]> | undefined,
    group: layers.group?.[key] as PolicyRow<PolicyValues[K]> | undefined,
    agent: layers.agent?.[key] as PolicyRow<PolicyValues[K]> | undefined,
  });
}

function patternId(p: CustomPattern): string {
  return `${p.severity}\u0000${p.pattern}\u0000${p.description}`;
}

function addPatterns(into: CustomPattern[], from: readonly CustomPattern[]): void {
  const seen = new Set(into.map(patternId));
  for (const p of from) {
    const id = patternId(p);
    if (!seen.has(id)) {
      seen.add(id);
      into.push(p);
    }
  }
}

/** A sidecar name is claimed by the most general scope that declares it: a lower scope cannot replace it. */
function addSidecars(into: Sidecar[], from: readonly Sidecar[]): void {
  for (const s of from) if (!into.some((t) => t.name === s.name)) into.push(s);
}

function addToggle<T extends Toggle>(base: T, extra: T): T {
  if (!extra.enabled) return base;
  if (!base.enabled) return { ...extra };
  return { ...base, severity: stronger(base.severity, extra.severity) };
}

function addPii(base: PiiToggle, extra: PiiToggle): PiiToggle {
  if (!extra.enabled) return base;
  if (!base.enabled) return { ...extra, types: extra.types ? [...extra.types] : null };
  const types = base.types === null || extra.types === null ? null : [...new Set([...base.types, ...extra.types])];
  return { ...base, severity: stronger(base.severity, extra.severity), types };
}

const EMPTY_CONTENT: ContentInspection = {
  immutable: false,
  secrets_filter: { enabled: false, severity: 'block' },
  pii_detection: { enabled: false, severity: 'warn', types: null },
  api_key_detection: { enabled: false, severity: 'warn' },
  patterns: [],
};

/** Adds a pack's content inspection to the base: it may enable, widen and add; it never disables. */
export function composeContent(base: ContentInspection | null, pack: ContentInspection): ContentInspection {
  const b = base ?? EMPTY_CONTENT;
  const patterns = [...b.patterns];
  addPatterns(patterns, pack.patterns);
  return {
    immutable: b.immutable,
    secrets_filter: addToggle(b.secrets_filter, pack.secrets_filter),
    pii_detection: addPii(b.pii_detection, pack.pii_detection),
    api_key_detection: addToggle(b.api_key_detection, pack.api_key_detection),
    patterns,
  };
}

export function resolvePolicy(layers: PolicyLayers): ResolvedPolicy {
  for (const key of ['model_policy', 'content_inspection', 'sidecar_inspection'] as const) {
    const row = layers.agent?.[key];
    if (row) assertRowAllowed('agent', key, row);
  }

  const models: ModelPolicy[] = [];
  const baseModel = winner(layers, 'model_policy');
  if (baseModel) models.push(baseModel);

  let content: ContentInspection | null = winner(layers, 'content_inspection');
  if (content) {
    const patterns: CustomPattern[] = [];
    for (const scope of MOST_GENERAL_FIRST)
      addPatterns(patterns, layers[scope]?.content_inspection?.value.patterns ?? []);
    content = { ...content, patterns };
  }

  const sidecars: Sidecar[] = [];
  for (const scope of MOST_GENERAL_FIRST)
    addSidecars(sidecars, layers[scope]?.sidecar_inspection?.value.sidecars ?? []);

  for (const pack of layers.packs ?? []) {
    if (pack.config.model_policy) models.push(pack.config.model_policy);
    if (pack.config.content_inspection) content = composeContent(content, pack.config.content_inspection);
    if (pack.config.sidecar_inspection) addSidecars(sidecars, pack.config.sidecar_inspection.sidecars);
  }

  return withVersion({ models, content, sidecars });
}

export function withVersion(policy: Omit<ResolvedPolicy, 'version'>): ResolvedPolicy {
  const version = createHash('sha256')
    .update(JSON.stringify([policy.models, policy.content, policy.sidecars]))
    .digest('base64url')
    .slice(0, 16);
  return { version, models: policy.models, content: policy.content, sidecars: policy.sidecars };
}

/** A policy document applied as the only layer (`dvx inspect`, the benchmark). */
export function policyFromDocument(doc: PolicyDocument): ResolvedPolicy {
  const rows: ScopeRows = {};
  if (doc.model_policy) rows.model_policy = { value: doc.model_policy };
  if (doc.content_inspection) rows.content_inspection = { value: doc.content_inspection };
  if (doc.sidecar_inspection) rows.sidecar_inspection = { value: doc.sidecar_inspection as SidecarInspection };
  return resolvePolicy({ platform: rows });
}

/** No model layer, no enabled inspector, no sidecar: inspection is a no-op (spec: rule 1). */
export function isInert(policy: ResolvedPolicy): boolean {
  const c = policy.content;
  const contentActive =
    c !== null &&
    (c.secrets_filter.enabled || c.pii_detection.enabled || c.api_key_detection.enabled || c.patterns.length > 0);
  return policy.models.length === 0 && !contentActive && policy.sidecars.length === 0;
}
