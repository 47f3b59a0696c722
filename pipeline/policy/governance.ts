import { isIP } from 'node:net';
import { PolicyValidationError } from '../errors.ts';
import { isValidPattern, pathMatch } from '../path-match.ts';
import { resolveSetting, type RowsByScope, type Scope } from './resolve.ts';
import type { WireFormat } from './snapshot.ts';

// Governance policy (operator-api.md: llmPolicyReq, destinationPolicyReq, exec/ssh/tunnel, tunnel
// ports; llm-content-policy.md "Governance scopes for interactive access") and its resolution across
// platform, org, group and agent scope, with installed packs composed on top at read time. Shared by the
// control plane (authoring, effective reads) and the components that enforce it.
//
//   exec, ssh, tunnel   {enabled}: the lock-aware most specific row; none → disabled
//   tunnel_ports        {ports}: the lock-aware most specific row; none or [] → every port denied
//   llm                 credential_mode, upstream, inspection: lock-aware most specific;
//                       models and providers: deny globs union across scopes, each allow is a gate
//                       (`providers` names: PROVIDER_OF_FORMAT; `upstream` keys: a wire format or a
//                       provider name, the format's own key first)
//   destination         deny rules union across scopes and packs; each allow list (scope or pack) is a gate

export const GOVERNANCE_KINDS = ['llm', 'destination', 'exec', 'ssh', 'tunnel', 'tunnel_ports'] as const;
export type GovernanceKind = (typeof GOVERNANCE_KINDS)[number];

export interface Rule {
  cidr?: string;
  host?: string;
  port?: number;
  reason?: string;
}
export interface AllowDeny {
  allow?: string[];
  deny?: string[];
}
export interface InspectionRule {
  tool?: string;
  verdict?: string;
  summary?: string;
  arg_gt?: Record<string, number>;
  /** A glob (pathMatch) over the request's model: the rule applies only to calls of a matching model. */
  model_match?: string;
}
export interface LlmGovernance {
  credential_mode?: string | null;
  inspection?: { inspectors: { name?: string; rules: InspectionRule[] }[] };
  models?: AllowDeny;
  providers?: AllowDeny;
  upstream?: Record<string, string>;
}
export interface GovernanceValues {
  llm: LlmGovernance;
  destination: { allow: Rule[]; deny: Rule[] };
  exec: { enabled: boolean };
  ssh: { enabled: boolean };
  tunnel: { enabled: boolean };
  tunnel_ports: { ports: number[] };
}

/**
 * The provider a wire format reaches: what `llm_policy.providers` globs match, and the provider-wide key
 * of `llm_policy.upstream` (docs/decisions.md, "The governance llm policy reaches the proxy").
 */
export const PROVIDER_OF_FORMAT = {
  'anthropic-messages': 'anthropic',
  'openai-chat': 'openai',
  'openai-responses': 'openai',
} as const satisfies Record<WireFormat, string>;

const UPSTREAM_KEYS: readonly string[] = [
  ...Object.keys(PROVIDER_OF_FORMAT),
  ...new Set(Object.values(PROVIDER_OF_FORMAT)),
];

/** The base URL `llm_policy.upstream` names for a wire format: the format's own key, else its provider's. */
export function governedUpstream(upstream: Record<string, string>, format: WireFormat): string | undefined {
  return Object.hasOwn(upstream, format)
    ? upstream[format]
    : Object.hasOwn(upstream, PROVIDER_OF_FORMAT[format])
      ? upstream[PROVIDER_OF_FORMAT[format]]
      : undefined;
}

export interface PackRules {
  name: string;
  allow: Rule[];
  deny: Rule[];
}

type Obj = Record<string, unknown>;
const fail = (path: string, message: string): never => {
  throw new PolicyValidationError(path, message);
};
function obj(v: unknown, path: string, allowed: readonly string[]): Obj {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) fail(path, 'must be a JSON object');
  for (const k of Object.keys(v as Obj))
    if (!allowed.includes(k)) fail(`${path}.${k}`, `unknown field (allowed: ${allowed.join(', ')})`);
  return v as Obj;
}
function strings(v: unknown, path: string, check?: (s: string, p: string) => void): string[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) fail(path, 'must be an array of strings');
  return (v as unknown[]).map((s, i) => {
    if (typeof s !== 'string' || s === '') fail(`${path}[${i}]`, 'must be a non-empty string');
    check?.(s as string, `${path}[${i}]`);
    return s as string;
  });
}
const glob = (s: string, p: string) => {
  if (!isValidPattern(s)) fail(p, 'is not a valid glob');
};

/** An absolute http(s) URL, its trailing slashes dropped (the form the snapshot's `upstream` keeps). */
function httpUrl(v: unknown, path: string): string {
  if (typeof v !== 'string') fail(path, 'must be an http(s) URL');
  let url: URL | null = null;
  try {
    url = new URL(v as string);
  } catch {
    // refused below
  }
  if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:') || !url.host)
    fail(path, 'must be an http(s) URL');
  return (v as string).replace(/\/+$/, '');
}

function validateRule(v: unknown, path: string): Rule {
  const o = obj(v, path, ['cidr', 'host', 'port', 'reason']);
  const rule: Rule = {};
  if (o.cidr !== undefined) {
    if (typeof o.cidr !== 'string') fail(`${path}.cidr`, 'must be a string');
    const [addr, bits, extra] = (o.cidr as string).split('/');
    // node's isIP accepts an IPv6 zone id (`fe80::1%eth0`); a zone names an interface of one host, not
    // a network a rule can match, and no address the gateway compares carries one.
    if ((addr ?? '').includes('%'))
      fail(`${path}.cidr`, 'must not carry an IPv6 zone id (fe80::1%eth0): name the network alone (fe80::/64)');
    const family = isIP(addr ?? '');
    if (
      !family ||
      extra !== undefined ||
      (bits !== undefined && (!/^\d+$/.test(bits) || Number(bits) > (family === 4 ? 32 : 128)))
    )
      fail(`${path}.cidr`, 'must be an IP address or CIDR block');
    rule.cidr = o.cidr as string;
  }
  if (o.host !== undefined) {
    if (typeof o.host !== 'string' || !/^(\*\.)?[A-Za-z0-9.-]+$/.test(o.host))
      fail(`${path}.host`, 'must be a host name, optionally starting with "*."');
    rule.host = (o.host as string).toLowerCase();
  }
  if (o.port !== undefined) {
    if (!Number.isInteger(o.port) || (o.port as number) < 0 || (o.port as number) > 65535)
      fail(`${path}.port`, 'must be an integer 0..65535');
    rule.port = o.port as number;
  }
  if (o.reason !== undefined) {
    if (typeof o.reason !== 'string') fail(`${path}.reason`, 'must be a string');
    rule.reason = o.reason as string;
  }
  if (!rule.cidr && !rule.host) fail(path, 'a rule names a cidr or a host');
  return rule;
}

export function validateRules(v: unknown, path: string): Rule[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) fail(path, 'must be an array of Rule');
  return (v as unknown[]).map((r, i) => validateRule(r, `${path}[${i}]`));
}

function allowDeny(v: unknown, path: string): AllowDeny {
  const o = obj(v, path, ['allow', 'deny']);
  return { allow: strings(o.allow, `${path}.allow`, glob), deny: strings(o.deny, `${path}.deny`, glob) };
}

/** A governance request body (its `locked` taken apart) → the validated value. */
export function validateGovernance<K extends GovernanceKind>(
  kind: K,
  body: unknown,
): { value: GovernanceValues[K]; locked: boolean } {
  const fields: Record<GovernanceKind, string[]> = {
    llm: ['credential_mode', 'inspection', 'locked', 'models', 'providers', 'upstream'],
    destination: ['allow', 'deny', 'locked'],
    exec: ['enabled', 'locked'],
    ssh: ['enabled', 'locked'],
    tunnel: ['enabled', 'locked'],
    tunnel_ports: ['ports', 'locked'],
  };
  const o = obj(body, 'body', fields[kind]);
  if (o.locked !== undefined && typeof o.locked !== 'boolean') fail('locked', 'must be a boolean');
  const locked = o.locked === true;
  let value: unknown;
  switch (kind) {
    case 'exec':
    case 'ssh':
    case 'tunnel':
      if (typeof o.enabled !== 'boolean') fail('enabled', 'is required (a boolean)');
      value = { enabled: o.enabled };
      break;
    case 'tunnel_ports': {
      if (!Array.isArray(o.ports)) fail('ports', 'is required: an array of ports (an empty list denies every port)');
      (o.ports as unknown[]).forEach((p, i) => {
        if (!Number.isInteger(p) || (p as number) < 1 || (p as number) > 65535)
          fail(`ports[${i}]`, 'must be an integer 1..65535');
      });
      value = { ports: [...new Set(o.ports as number[])].sort((a, b) => a - b) };
      break;
    }
    case 'destination':
      value = { allow: validateRules(o.allow, 'allow'), deny: validateRules(o.deny, 'deny') };
      break;
    case 'llm': {
      const llm: LlmGovernance = {};
      if (o.credential_mode !== undefined) {
        if (o.credential_mode !== null && o.credential_mode !== 'platform' && o.credential_mode !== 'passthrough')
          fail('credential_mode', 'must be "platform", "passthrough" or null');
        llm.credential_mode = o.credential_mode as string | null;
      }
      if (o.models !== undefined) llm.models = allowDeny(o.models, 'models');
      if (o.providers !== undefined) llm.providers = allowDeny(o.providers, 'providers');
      if (o.upstream !== undefined) {
        const u = obj(o.upstream, 'upstream', UPSTREAM_KEYS);
        const map: Record<string, string> = {};
        for (const [k, url] of Object.entries(u)) map[k] = httpUrl(url, `upstream.${k}`);
        llm.upstream = map;
      }
      if (o.inspection !== undefined) {
        const ins = obj(o.inspection, 'inspection', ['inspectors']);
        if (!Array.isArray(ins.inspectors)) fail('inspection.inspectors', 'must be an array');
        llm.inspection = {
          inspectors: (ins.inspectors as unknown[]).map((raw, i) => {
            const p = `inspection.inspectors[${i}]`;
            const insp = obj(raw, p, ['name', 'rules']);
            if (insp.name !== undefined && typeof insp.name !== 'string') fail(`${p}.name`, 'must be a string');
            if (!Array.isArray(insp.rules ?? [])) fail(`${p}.rules`, 'must be an array');
            const rules = ((insp.rules ?? []) as unknown[]).map((r, j) => {
              const rp = `${p}.rules[${j}]`;
              const rule = obj(r, rp, ['tool', 'verdict', 'summary', 'arg_gt', 'model_match']);
              for (const f of ['tool', 'verdict', 'summary', 'model_match'])
                if (rule[f] !== undefined && typeof rule[f] !== 'string') fail(`${rp}.${f}`, 'must be a string');
              for (const f of ['tool', 'model_match'])
                if (rule[f] !== undefined && !isValidPattern(rule[f] as string))
                  fail(`${rp}.${f}`, 'is not a valid glob');
              if (rule.verdict !== undefined && !['allow', 'deny', 'require_approval'].includes(rule.verdict as string))
                fail(`${rp}.verdict`, 'must be allow, deny or require_approval');
              if (rule.arg_gt !== undefined) {
                const gt = obj(rule.arg_gt, `${rp}.arg_gt`, Object.keys((rule.arg_gt as Obj) ?? {}));
                for (const [k, n] of Object.entries(gt))
                  if (typeof n !== 'number' || !Number.isFinite(n)) fail(`${rp}.arg_gt.${k}`, 'must be a number');
              }
              return rule as InspectionRule;
            });
            return { ...(insp.name ? { name: insp.name as string } : {}), rules };
          }),
        };
      }
      value = llm;
      break;
    }
  }
  return { value: value as GovernanceValues[K], locked };
}

export type GovernanceRows = { [K in GovernanceKind]?: RowsByScope<GovernanceValues[K]> };

export interface EffectiveGovernance {
  exec: boolean;
  ssh: boolean;
  tunnel: boolean;
  tunnel_ports: number[];
  destination: { allow_gates: Rule[][]; deny: Rule[] };
  llm: {
    credential_mode: string | null;
    upstream: Record<string, string>;
    inspection: LlmGovernance['inspection'] | null;
    models: GlobGates;
    providers: GlobGates;
  };
  packs: string[];
}

const ORDER: readonly Scope[] = ['platform', 'org', 'group', 'agent'];

function gates(rows: RowsByScope<LlmGovernance> | undefined, pick: (v: LlmGovernance) => AllowDeny | undefined) {
  const allow: string[][] = [];
  const deny: string[] = [];
  for (const s of ORDER) {
    const ad = rows?.[s] ? pick(rows[s]!.value) : undefined;
    if (!ad) continue;
    if (ad.allow && ad.allow.length > 0) allow.push(ad.allow);
    for (const d of ad.deny ?? []) if (!deny.includes(d)) deny.push(d);
  }
  return { allow_gates: allow, deny };
}

export function resolveGovernance(rows: GovernanceRows, packs: PackRules[]): EffectiveGovernance {
  const field = <K extends keyof LlmGovernance>(k: K) => {
    const byScope: RowsByScope<LlmGovernance[K]> = {};
    for (const s of ORDER) {
      const r = rows.llm?.[s];
      // A null (credential_mode) sets nothing: the scope inherits, as if the field were omitted.
      if (r && r.value[k] !== undefined && r.value[k] !== null) byScope[s] = { value: r.value[k], locked: r.locked };
    }
    return resolveSetting(byScope);
  };
  const destAllow: Rule[][] = [];
  const destDeny: Rule[] = [];
  const key = (r: Rule) => JSON.stringify([r.cidr, r.host, r.port]);
  const addDeny = (rs: Rule[]) => {
    for (const r of rs) if (!destDeny.some((d) => key(d) === key(r))) destDeny.push(r);
  };
  for (const s of ORDER) {
    const d = rows.destination?.[s]?.value;
    if (!d) continue;
    if (d.allow.length > 0) destAllow.push(d.allow);
    addDeny(d.deny);
  }
  for (const p of packs) {
    if (p.allow.length > 0) destAllow.push(p.allow);
    addDeny(p.deny);
  }
  return {
    exec: resolveSetting(rows.exec ?? {})?.enabled ?? false,
    ssh: resolveSetting(rows.ssh ?? {})?.enabled ?? false,
    tunnel: resolveSetting(rows.tunnel ?? {})?.enabled ?? false,
    tunnel_ports: resolveSetting(rows.tunnel_ports ?? {})?.ports ?? [],
    destination: { allow_gates: destAllow, deny: destDeny },
    llm: {
      credential_mode: field('credential_mode') ?? null,
      upstream: field('upstream') ?? {},
      inspection: field('inspection') ?? null,
      models: gates(rows.llm, (v) => v.models),
      providers: gates(rows.llm, (v) => v.providers),
    },
    packs: packs.map((p) => p.name),
  };
}

/** Resolved allow/deny globs: every deny glob refuses, and every allow list is a gate the name must pass. */
export interface GlobGates {
  allow_gates: string[][];
  deny: string[];
}

/** True when no glob of these gates can refuse anything. */
export function gatesOpen(g: GlobGates): boolean {
  return g.deny.length === 0 && g.allow_gates.length === 0;
}

/**
 * Why these gates refuse a name, or null when they permit it: a deny glob it matches, else the first
 * allow list it matches nothing of. A null name (none could be read) passes the denies and no allow list.
 */
export function gateRefusal(g: GlobGates, name: string | null): string | null {
  if (name !== null) for (const d of g.deny) if (pathMatch(d, name)) return `matches deny glob ${JSON.stringify(d)}`;
  for (const gate of g.allow_gates)
    if (name === null || !gate.some((a) => pathMatch(a, name))) return `is on no allow list of ${JSON.stringify(gate)}`;
  return null;
}
