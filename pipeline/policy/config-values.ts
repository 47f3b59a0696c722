import { createHash } from 'node:crypto';
import { dict, own } from '../../core/own.ts';
import { ConfigValuesError } from '../errors.ts';
import { LOCKABLE_SCOPES, resolveSetting, type RowsByScope } from './resolve.ts';

// Config values (docs/snapshot.md, "Config values"): the document the control plane serves an enclave
// (`GET /v1/broker/config`, `dvx config-pull`), validated whole like the policy snapshot, and one
// agent's config merged from it platform → org → group → agent with the policy keys' lock rule
// (resolveSetting: a locked row at platform, then org, then group wins; otherwise the most specific).
// Keys declared `secret: true` carry no value here: they are listed apart, for the enclave to fill
// from its own secret store.

/** A config key as the control plane accepts it (POST /api/v1/config/{key}). */
export const CONFIG_KEY = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

export interface ConfigValueRow {
  value: unknown;
  locked: boolean;
  secret: boolean;
}
export type ConfigValueRows = Record<string, ConfigValueRow>;

export interface ConfigDocument {
  version: string;
  enclave: { id: string; name: string };
  platform: ConfigValueRows;
  orgs: Record<string, { config: ConfigValueRows; groups: Record<string, { config: ConfigValueRows }> }>;
  agents: Record<string, { org_id: string; group_id: string | null; config: ConfigValueRows }>;
}

type Obj = Record<string, unknown>;

function fail(path: string, message: string): never {
  throw new ConfigValuesError(path, message);
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

/** One row `KEY: {value, locked, secret}`; `lockable` false at agent scope. */
export function validateConfigValueRow(key: string, raw: unknown, path: string, lockable: boolean): ConfigValueRow {
  if (!CONFIG_KEY.test(key)) fail(path, 'is not a config key (1–128 letters, digits, ".", "_", ":" or "-")');
  const row = obj(raw, path);
  for (const k of Object.keys(row))
    if (k !== 'value' && k !== 'locked' && k !== 'secret')
      fail(`${path}.${k}`, 'unknown field (value, locked, secret)');
  for (const k of ['locked', 'secret'] as const)
    if (row[k] !== undefined && typeof row[k] !== 'boolean') fail(`${path}.${k}`, 'must be a boolean');
  if (!lockable && row.locked === true) fail(`${path}.locked`, 'locked is refused at agent scope');
  const secret = row.secret === true;
  // A secret key's bytes never cross the control plane.
  if (secret && row.value !== null && row.value !== undefined) fail(`${path}.value`, 'must be null for a secret key');
  if (!secret && !('value' in row)) fail(`${path}.value`, 'is required');
  return { value: secret ? null : row.value, locked: row.locked === true, secret };
}

function rows(value: unknown, path: string, lockable: boolean): ConfigValueRows {
  const out = dict<ConfigValueRow>();
  if (value === undefined) return out;
  for (const [key, raw] of Object.entries(obj(value, path)))
    out[key] = validateConfigValueRow(key, raw, `${path}.${key}`, lockable);
  return out;
}

/** The config document, validated whole (one bad row refuses all of it; the last good one stays). */
export function validateConfigDocument(value: unknown): ConfigDocument {
  const root = obj(value, 'config');
  const enclave = obj(root.enclave ?? {}, 'config.enclave');
  const orgs: ConfigDocument['orgs'] = dict();
  for (const [id, raw] of Object.entries(obj(root.orgs ?? {}, 'config.orgs'))) {
    const p = `config.orgs.${id}`;
    const o = obj(raw, p);
    const groups: ConfigDocument['orgs'][string]['groups'] = dict();
    for (const [g, graw] of Object.entries(obj(o.groups ?? {}, `${p}.groups`)))
      groups[g] = { config: rows(obj(graw, `${p}.groups.${g}`).config, `${p}.groups.${g}.config`, true) };
    orgs[id] = { config: rows(o.config, `${p}.config`, true), groups };
  }
  const agents: ConfigDocument['agents'] = dict();
  for (const [uid, raw] of Object.entries(obj(root.agents ?? {}, 'config.agents'))) {
    const p = `config.agents.${uid}`;
    const a = obj(raw, p);
    agents[uid] = {
      org_id: str(a.org_id, `${p}.org_id`),
      group_id: a.group_id === undefined || a.group_id === null ? null : str(a.group_id, `${p}.group_id`),
      config: rows(a.config, `${p}.config`, false),
    };
  }
  return {
    version: str(root.version ?? '', 'config.version'),
    enclave: { id: str(enclave.id, 'config.enclave.id', true), name: str(enclave.name, 'config.enclave.name', true) },
    platform: rows(root.platform, 'config.platform', true),
    orgs,
    agents,
  };
}

/** Who an agent is, for its config: its org and group (the broker's record of it). */
export interface ConfigSubject {
  uid: string;
  org_id: string;
  group_id: string | null;
}

export type LockScope = (typeof LOCKABLE_SCOPES)[number];

/** One agent's config: plain values, the keys declared secret (values to fill in), and where a key is locked. */
export interface MergedConfig {
  config: Record<string, unknown>;
  secrets: string[];
  locked: Record<string, LockScope>;
}

/** The rows that apply to one agent, scope by scope (the agent's rows only when it is of the same org). */
function scopes(doc: ConfigDocument, who: ConfigSubject) {
  const org = own(doc.orgs, who.org_id);
  const agent = own(doc.agents, who.uid);
  return {
    platform: doc.platform,
    org: org?.config ?? {},
    group: (who.group_id !== null && org && own(org.groups, who.group_id)?.config) || {},
    agent: agent?.org_id === who.org_id ? agent.config : {},
  };
}

/**
 * Merges one agent's config: per key, a locked row at platform, then org, then group wins, otherwise the
 * most specific row. `ownValues` are the values the agent wrote for itself (agent scope, over the control
 * plane's agent rows; never over a lock). A key declared secret at any scope that applies is listed in
 * `secrets` and never carries a value here.
 */
export function mergeAgentConfig(
  doc: ConfigDocument,
  who: ConfigSubject,
  ownValues: Record<string, unknown> = {},
): MergedConfig {
  const s = scopes(doc, who);
  const keys = new Set([
    ...Object.keys(s.platform),
    ...Object.keys(s.org),
    ...Object.keys(s.group),
    ...Object.keys(s.agent),
    ...Object.keys(ownValues),
  ]);
  const config = dict<unknown>();
  const locked = dict<LockScope>();
  const secrets: string[] = [];
  for (const key of [...keys].sort()) {
    // Boxed, so a value that happens to carry `immutable: true` is not taken for a lock (only `locked` is).
    const byScope: RowsByScope<{ v: unknown }> = {};
    let secret = false;
    for (const scope of ['platform', 'org', 'group', 'agent'] as const) {
      const row = own(s[scope], key);
      if (!row) continue;
      secret ||= row.secret;
      byScope[scope] = { value: { v: row.value }, locked: row.locked };
    }
    const lock = LOCKABLE_SCOPES.find((scope) => byScope[scope]?.locked);
    if (lock) locked[key] = lock;
    if (secret) {
      secrets.push(key);
      continue;
    }
    if (Object.hasOwn(ownValues, key) && !lock) byScope.agent = { value: { v: ownValues[key] } };
    const won = resolveSetting(byScope);
    if (won) config[key] = won.v;
  }
  return { config, secrets, locked };
}

/** The scope that locks `key` for this agent (an agent may not set it), or null. */
export function lockedAbove(doc: ConfigDocument, who: ConfigSubject, key: string): LockScope | null {
  const s = scopes(doc, who);
  return LOCKABLE_SCOPES.find((scope) => own(s[scope], key)?.locked) ?? null;
}

/** Whether `key` is declared secret at any scope that applies to this agent. */
export function isSecretKey(doc: ConfigDocument, who: ConfigSubject, key: string): boolean {
  const s = scopes(doc, who);
  return (['platform', 'org', 'group', 'agent'] as const).some((scope) => own(s[scope], key)?.secret === true);
}

/** JSON with every object's keys sorted (arrays keep their order): one text per value. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  const entries = Object.keys(value)
    .filter((k) => (value as Obj)[k] !== undefined)
    .sort()
    .map((k) => `${JSON.stringify(k)}:${canonicalJson((value as Obj)[k])}`);
  return `{${entries.join(',')}}`;
}

/** SHA-256 (hex) of the config's canonical JSON: equal configs hash equal whatever their key order. */
export function configHash(config: Record<string, unknown>): string {
  return createHash('sha256').update(canonicalJson(config)).digest('hex');
}
