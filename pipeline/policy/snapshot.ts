import { PolicyValidationError } from '../errors.ts';
import { isPolicyKey, policyDocumentJson, policyValueJson, validatePolicyValue } from './validate.ts';
import type { PolicyLayers, PolicyPack, PolicyRow, RowsByScope, ScopeRows } from './resolve.ts';
import { resolveSetting } from './resolve.ts';
import type { PolicyDocument, PolicyKey, PolicyValues } from './types.ts';
import { dict, own } from '../../core/own.ts';
import { validateGovernance, validateRules, type GovernanceKind, type PackRules } from './governance.ts';

// The policy snapshot: the desired state an enclave's proxies enforce, written by `dvx policy-pull`
// (or by hand until the control plane exists). docs/snapshot.md pins the shape. Validation is whole:
// a snapshot with one bad value is refused entirely, so a reload never half-applies.

export const SETTING_KEYS = [
  'model_policy',
  'content_inspection',
  'sidecar_inspection',
  'credential_mode',
  'downstream_url',
  'upstream',
] as const;
export type SettingKey = (typeof SETTING_KEYS)[number];

/**
 * The governance keys (operator-api.md: llmPolicyReq, destinationPolicyReq, …), authored through
 * `/api/v1/policies/{kind}`, carried at every scope next to the settings and resolved by
 * pipeline/policy/governance.ts (snapshot-governance.ts).
 */
export const GOVERNANCE_KEYS = {
  llm_policy: 'llm',
  destination_policy: 'destination',
  exec_policy: 'exec',
  ssh_policy: 'ssh',
  tunnel_policy: 'tunnel',
  tunnel_ports_policy: 'tunnel_ports',
} as const satisfies Record<string, GovernanceKind>;
export type GovernanceKey = keyof typeof GOVERNANCE_KEYS;

/** Every key a scope's rows may carry. */
export const ROW_KEYS = [...SETTING_KEYS, ...(Object.keys(GOVERNANCE_KEYS) as GovernanceKey[])] as const;
export type RowKey = SettingKey | GovernanceKey;

export function isGovernanceKey(key: string): key is GovernanceKey {
  return Object.hasOwn(GOVERNANCE_KEYS, key);
}

export const ISOLATION_CLASSES = ['plain', 'vm', 'node-cvm', 'per-agent-tee'] as const;
export type IsolationClass = (typeof ISOLATION_CLASSES)[number];

export const WIRE_FORMATS = ['anthropic-messages', 'openai-chat', 'openai-responses'] as const;
export type WireFormat = (typeof WIRE_FORMATS)[number];

export type CredentialMode = 'platform' | 'passthrough';
export type UpstreamMap = Partial<Record<WireFormat, string>>;

export interface SettingValues {
  credential_mode: CredentialMode;
  downstream_url: string;
  upstream: UpstreamMap;
}

export type ConfigRows = { [K in RowKey]?: PolicyRow<unknown> };

/** A pack installed at platform or org scope: its LLM policy (`config`) and its destination rules. */
export interface SnapshotPack extends PolicyPack, PackRules {}

export interface OrgState {
  config: ConfigRows;
  flags: { 'inspect:llm'?: boolean; 'audit:llm'?: boolean };
  /** A group's packs (installed at its scope) contribute their destination rules only. */
  groups: Record<string, { config: ConfigRows; packs: PackRules[] }>;
  packs: SnapshotPack[];
}

export type AgentStatus = 'active' | 'suspended' | 'isolated' | string;

export interface AgentState {
  org_id: string;
  group_id: string | null;
  name: string;
  status: AgentStatus;
  contained: boolean;
  config: ConfigRows;
  /** The agent's own packs (its `policy_packs`): their destination rules only. */
  packs: PackRules[];
}

export interface Snapshot {
  version: string;
  enclave: { id: string; name: string; isolation_class: IsolationClass };
  platform: ConfigRows;
  orgs: Record<string, OrgState>;
  agents: Record<string, AgentState>;
}

type Obj = Record<string, unknown>;

// Orgs, groups, agents and flags are keyed by ids that arrive from outside (the snapshot file, a
// token's claims): their records have no prototype and every read goes through `own`, so an id such
// as `__proto__` or `constructor` is an id like any other (core/own.ts).

function fail(path: string, message: string): never {
  throw new PolicyValidationError(path, message);
}

function obj(value: unknown, path: string): Obj {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) fail(path, 'must be a JSON object');
  return value as Obj;
}

function str(value: unknown, path: string, optional = false): string {
  if (value === undefined && optional) return '';
  if (typeof value !== 'string') fail(path, 'must be a string');
  return value;
}

function httpUrl(value: unknown, path: string): string {
  const s = str(value, path);
  let url: URL;
  try {
    url = new URL(s);
  } catch {
    fail(path, 'must be an absolute http(s) URL');
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') fail(path, 'must be an http or https URL');
  return s.replace(/\/+$/, '');
}

/** Validates one setting's value (policy keys through the pipeline's own validator). */
export function validateSetting(key: SettingKey, value: unknown, path: string): unknown {
  if (isPolicyKey(key)) {
    try {
      return validatePolicyValue(key as PolicyKey, value);
    } catch (err) {
      if (!(err instanceof PolicyValidationError)) throw err;
      // Re-root the pipeline validator's path (`content_inspection.x`) at this value's path.
      fail(path + err.path.slice(key.length), err.message.slice(err.path.length + 2));
    }
  }
  switch (key) {
    case 'credential_mode':
      if (value !== 'platform' && value !== 'passthrough') fail(path, 'must be "platform" or "passthrough"');
      return value;
    case 'downstream_url':
      return httpUrl(value, path);
    case 'upstream': {
      const o = obj(value, path);
      const map: UpstreamMap = {};
      for (const [format, url] of Object.entries(o)) {
        if (!(WIRE_FORMATS as readonly string[]).includes(format))
          fail(`${path}.${format}`, `unknown wire format (one of ${WIRE_FORMATS.join(', ')})`);
        map[format as WireFormat] = httpUrl(url, `${path}.${format}`);
      }
      return map;
    }
  }
}

/** A setting's validated value as the JSON that validates back to it (`policyValueJson` for the policy keys). */
export function settingJson(key: RowKey, value: unknown): unknown {
  return isPolicyKey(key) ? policyValueJson(key, value as PolicyValues[PolicyKey]) : value;
}

/**
 * A governance key's value: what `validateGovernance` accepts from the authoring route, less `locked`
 * (the row's own field). Its errors are re-rooted at `path`.
 */
export function validateGovernanceValue(key: GovernanceKey, value: unknown, path: string): unknown {
  const o = obj(value, path);
  if (Object.hasOwn(o, 'locked')) fail(`${path}.locked`, 'unknown field (a row is locked by its own `locked`)');
  try {
    return validateGovernance(GOVERNANCE_KEYS[key], o).value;
  } catch (err) {
    if (!(err instanceof PolicyValidationError)) throw err;
    // The governance validator names fields from its request body (`body.x`, `models.allow[0]`).
    const field = err.path.replace(/^body\.?/, '');
    fail(field ? `${path}.${field}` : path, err.message.slice(err.path.length + 2));
  }
}

/** Any row key's value (a setting, a policy key or a governance key), validated. */
export function validateRowValue(key: RowKey, value: unknown, path: string): unknown {
  return isGovernanceKey(key) ? validateGovernanceValue(key, value, path) : validateSetting(key, value, path);
}

/** One row `KEY: {value, locked}` of a scope (`lockable` false at agent scope), validated. */
export function validateConfigRow(key: string, raw: unknown, p: string, lockable: boolean): PolicyRow<unknown> {
  if (!(ROW_KEYS as readonly string[]).includes(key)) fail(p, `unknown key (one of ${ROW_KEYS.join(', ')})`);
  const row = obj(raw, p);
  for (const k of Object.keys(row))
    if (k !== 'value' && k !== 'locked') fail(`${p}.${k}`, 'unknown field (value, locked)');
  if (!('value' in row)) fail(`${p}.value`, 'is required');
  if (row.locked !== undefined && typeof row.locked !== 'boolean') fail(`${p}.locked`, 'must be a boolean');
  if (!lockable && row.locked) fail(`${p}.locked`, 'locked is refused at agent scope');
  const v = validateRowValue(key as RowKey, row.value, `${p}.value`);
  if (!lockable && (v as { immutable?: unknown } | null)?.immutable === true)
    fail(`${p}.value.immutable`, 'refused at agent scope');
  return { value: v, locked: row.locked === true };
}

function configRows(value: unknown, path: string, lockable: boolean): ConfigRows {
  if (value === undefined) return {};
  const o = obj(value, path);
  const rows: ConfigRows = {};
  for (const [key, raw] of Object.entries(o))
    rows[key as RowKey] = validateConfigRow(key, raw, `${path}.${key}`, lockable);
  return rows;
}

function rowsJson(rows: ConfigRows, lockable: boolean): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, row] of Object.entries(rows) as [RowKey, PolicyRow<unknown>][]) {
    out[key] = lockable
      ? { value: settingJson(key, row.value), locked: row.locked }
      : { value: settingJson(key, row.value) };
  }
  return out;
}

/**
 * A validated snapshot as the JSON document `validateSnapshot` accepts back (docs/snapshot.md): what
 * the control plane serves and publishes. `JSON.stringify` of the validated form is not that document
 * (an omitted `pii_detection.types` is `null` in it, which the validator refuses).
 */
export function snapshotDocument(s: Snapshot): Record<string, unknown> {
  const orgs: Record<string, unknown> = {};
  for (const [id, o] of Object.entries(s.orgs)) {
    const groups: Record<string, unknown> = {};
    for (const [g, group] of Object.entries(o.groups))
      groups[g] = { config: rowsJson(group.config, true), ...packsJson('packs', group.packs ?? []) };
    orgs[id] = {
      config: rowsJson(o.config, true),
      flags: o.flags,
      groups,
      packs: o.packs.map((p) => ({
        name: p.name,
        config: policyDocumentJson(p.config),
        ...rulesJson(p),
      })),
    };
  }
  const agents: Record<string, unknown> = {};
  for (const [id, a] of Object.entries(s.agents)) {
    const { packs, ...rest } = a;
    agents[id] = { ...rest, config: rowsJson(a.config, false), ...packsJson('packs', packs ?? []) };
  }
  return { version: s.version, enclave: s.enclave, platform: rowsJson(s.platform, true), orgs, agents };
}

/** A pack's destination rules, omitted when empty (a pack of LLM policy alone reads as before). */
function rulesJson(p: PackRules): Record<string, unknown> {
  return { ...(p.allow.length > 0 ? { allow: p.allow } : {}), ...(p.deny.length > 0 ? { deny: p.deny } : {}) };
}

function packsJson(field: string, packs: PackRules[]): Record<string, unknown> {
  return packs.length > 0 ? { [field]: packs.map((p) => ({ name: p.name, ...rulesJson(p) })) } : {};
}

function fields(o: Obj, path: string, allowed: readonly string[]): void {
  for (const k of Object.keys(o))
    if (!allowed.includes(k)) fail(`${path}.${k}`, `unknown field (${allowed.join(', ')})`);
}

/** Packs installed at platform or org scope: `{name, config?, allow?, deny?}`. */
export function validatePacks(value: unknown, path: string): SnapshotPack[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) fail(path, 'must be an array');
  return value.map((raw, i) => {
    const p = `${path}[${i}]`;
    const o = obj(raw, p);
    fields(o, p, ['name', 'config', 'allow', 'deny']);
    const config: PolicyDocument = {};
    for (const [key, v] of Object.entries(obj(o.config ?? {}, `${p}.config`))) {
      if (!isPolicyKey(key))
        fail(`${p}.config.${key}`, 'a pack carries model_policy, content_inspection or sidecar_inspection only');
      (config as Obj)[key] = validatePolicyValue(key, v, `${p}.config`);
    }
    return {
      name: str(o.name, `${p}.name`),
      config,
      allow: validateRules(o.allow, `${p}.allow`),
      deny: validateRules(o.deny, `${p}.deny`),
    };
  });
}

/** Packs installed at a group's or an agent's scope: `{name, allow?, deny?}` (their destination rules). */
export function validateRulePacks(value: unknown, path: string): PackRules[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) fail(path, 'must be an array');
  return value.map((raw, i) => {
    const p = `${path}[${i}]`;
    const o = obj(raw, p);
    fields(o, p, ['name', 'allow', 'deny']);
    return {
      name: str(o.name, `${p}.name`),
      allow: validateRules(o.allow, `${p}.allow`),
      deny: validateRules(o.deny, `${p}.deny`),
    };
  });
}

export function validateSnapshot(value: unknown): Snapshot {
  const root = obj(value, 'snapshot');
  const enclaveRaw = obj(root.enclave ?? {}, 'snapshot.enclave');
  const isolation = enclaveRaw.isolation_class ?? 'plain';
  if (!(ISOLATION_CLASSES as readonly unknown[]).includes(isolation))
    fail('snapshot.enclave.isolation_class', `must be one of ${ISOLATION_CLASSES.join(', ')}`);
  const orgs = dict<OrgState>();
  for (const [id, raw] of Object.entries(obj(root.orgs ?? {}, 'snapshot.orgs'))) {
    const p = `snapshot.orgs.${id}`;
    const o = obj(raw, p);
    const flags: OrgState['flags'] = dict<boolean>();
    for (const [flag, v] of Object.entries(obj(o.flags ?? {}, `${p}.flags`))) {
      if (typeof v !== 'boolean') fail(`${p}.flags.${flag}`, 'must be a boolean');
      (flags as Record<string, boolean>)[flag] = v;
    }
    const groups: OrgState['groups'] = dict();
    for (const [g, graw] of Object.entries(obj(o.groups ?? {}, `${p}.groups`))) {
      const gp = `${p}.groups.${g}`;
      const group = obj(graw, gp);
      groups[g] = {
        config: configRows(group.config, `${gp}.config`, true),
        packs: validateRulePacks(group.packs, `${gp}.packs`),
      };
    }
    orgs[id] = {
      config: configRows(o.config, `${p}.config`, true),
      flags,
      groups,
      packs: validatePacks(o.packs, `${p}.packs`),
    };
  }
  const agents = dict<AgentState>();
  for (const [id, raw] of Object.entries(obj(root.agents ?? {}, 'snapshot.agents'))) {
    const p = `snapshot.agents.${id}`;
    const a = obj(raw, p);
    if (a.contained !== undefined && typeof a.contained !== 'boolean') fail(`${p}.contained`, 'must be a boolean');
    agents[id] = {
      org_id: str(a.org_id, `${p}.org_id`),
      group_id: a.group_id === undefined || a.group_id === null ? null : str(a.group_id, `${p}.group_id`),
      name: str(a.name, `${p}.name`, true),
      status: str(a.status ?? 'active', `${p}.status`),
      contained: a.contained === true,
      config: configRows(a.config, `${p}.config`, false),
      packs: validateRulePacks(a.packs, `${p}.packs`),
    };
  }
  return {
    version: str(root.version ?? '', 'snapshot.version'),
    enclave: {
      id: str(enclaveRaw.id, 'snapshot.enclave.id', true),
      name: str(enclaveRaw.name, 'snapshot.enclave.name', true),
      isolation_class: isolation as IsolationClass,
    },
    platform: configRows(root.platform, 'snapshot.platform', true),
    orgs,
    agents,
  };
}

export const EMPTY_SNAPSHOT: Snapshot = validateSnapshot({
  version: 'empty',
  enclave: {},
  platform: {},
  orgs: {},
  agents: {},
});

/** The rows that apply to one agent, scope by scope. */
export function agentScopes(snapshot: Snapshot, orgId: string, groupId: string | null, agentId: string) {
  const org = snapshotOrg(snapshot, orgId);
  const agent = snapshotAgent(snapshot, agentId);
  return {
    platform: snapshot.platform,
    org: org?.config ?? {},
    group: (groupId !== null && org && own(org.groups, groupId)?.config) || {},
    agent: agent?.org_id === orgId ? agent.config : {},
  };
}

export function policyLayers(snapshot: Snapshot, orgId: string, groupId: string | null, agentId: string): PolicyLayers {
  const s = agentScopes(snapshot, orgId, groupId, agentId);
  const pick = (rows: ConfigRows): ScopeRows => {
    const out: ScopeRows = {};
    for (const key of ['model_policy', 'content_inspection', 'sidecar_inspection'] as const)
      if (rows[key]) (out as Obj)[key] = rows[key];
    return out;
  };
  return {
    platform: pick(s.platform),
    org: pick(s.org),
    group: pick(s.group),
    agent: pick(s.agent),
    packs: snapshotOrg(snapshot, orgId)?.packs ?? [],
  };
}

export function resolveSnapshotSetting<K extends keyof SettingValues>(
  snapshot: Snapshot,
  key: K,
  orgId: string,
  groupId: string | null,
  agentId: string,
): SettingValues[K] | null {
  const s = agentScopes(snapshot, orgId, groupId, agentId);
  const rows: RowsByScope<SettingValues[K]> = {};
  for (const scope of ['platform', 'org', 'group', 'agent'] as const) {
    const row = s[scope][key];
    if (row) rows[scope] = row as PolicyRow<SettingValues[K]>;
  }
  return resolveSetting(rows);
}

/** Org feature flags: enabled when absent (spec rules 2 and 3). */
export function orgFlag(snapshot: Snapshot, orgId: string, flag: 'inspect:llm' | 'audit:llm'): boolean {
  const flags = snapshotOrg(snapshot, orgId)?.flags;
  return flags === undefined || own(flags, flag) !== false;
}

/** The org of that id in the snapshot, if it lists one. */
export function snapshotOrg(snapshot: Snapshot, orgId: string): OrgState | undefined {
  return own(snapshot.orgs, orgId);
}

/** The agent of that id in the snapshot, if it lists one. */
export function snapshotAgent(snapshot: Snapshot, agentId: string): AgentState | undefined {
  return own(snapshot.agents, agentId);
}
