import { own } from '../../core/own.ts';
import {
  GOVERNANCE_KEYS,
  agentScopes,
  snapshotAgent,
  snapshotOrg,
  type ConfigRows,
  type CredentialMode,
  type GovernanceKey,
  type Snapshot,
  type UpstreamMap,
} from './snapshot.ts';
import { resolveGovernance, type EffectiveGovernance, type GovernanceRows, type PackRules } from './governance.ts';
import { resolveSetting, type PolicyRow, type RowsByScope, type Scope } from './resolve.ts';
import type { LlmGovernance } from './governance.ts';

// Governance policy as an enclave resolves it from its snapshot (docs/snapshot.md): the six governance
// keys at platform, org, group and agent scope, and the packs that apply to the agent (those installed
// at platform or org scope, at its group's and at its own, most general first, each once), through
// the same resolveGovernance the control plane's effective-governance read uses.
//
// The governance `llm_policy` and the llmproxy settings `credential_mode` and `upstream` answer the same
// questions; they form one hierarchy here (docs/decisions.md, "The governance llm policy reaches the
// proxy"): at each scope the governance value stands in for the setting's row when it sets one, a lock
// on either locks that scope, and the usual rule picks the winner.

const ORDER: readonly Scope[] = ['platform', 'org', 'group', 'agent'];

/** Every governance row and pack that applies to one agent, resolved. */
export function snapshotGovernance(
  snapshot: Snapshot,
  orgId: string,
  groupId: string | null,
  agentId: string,
): EffectiveGovernance {
  const { rows, packs } = governanceInputs(snapshot, orgId, groupId, agentId);
  return resolveGovernance(rows, packs);
}

function governanceInputs(snapshot: Snapshot, orgId: string, groupId: string | null, agentId: string) {
  const s = agentScopes(snapshot, orgId, groupId, agentId);
  const rows: GovernanceRows = {};
  let any = false;
  for (const scope of ORDER) {
    for (const [key, kind] of Object.entries(GOVERNANCE_KEYS) as [GovernanceKey, keyof GovernanceRows][]) {
      const row = s[scope][key];
      if (!row) continue;
      ((rows[kind] ??= {}) as Record<Scope, PolicyRow<unknown>>)[scope] = row;
      any = true;
    }
  }
  const org = snapshotOrg(snapshot, orgId);
  const agent = snapshotAgent(snapshot, agentId);
  const packs: PackRules[] = [];
  const add = (from: readonly PackRules[] | undefined) => {
    for (const p of from ?? [])
      if (!packs.some((q) => q.name === p.name)) packs.push({ name: p.name, allow: p.allow, deny: p.deny });
  };
  add(org?.packs);
  if (groupId !== null && org) add(own(org.groups, groupId)?.packs);
  if (agent?.org_id === orgId) add(agent.packs);
  return { rows, packs, any: any || packs.length > 0 };
}

// Per snapshot object (a reload is a new object, so nothing outlives it), per caller. The bound keeps
// callers the snapshot does not list (their group is the token's claim) from growing it without end.
const CACHE_BOUND = 10_000;
const cache = new WeakMap<Snapshot, Map<string, EffectiveGovernance | null>>();

/**
 * The caller's effective governance, or null when no governance row nor pack applies to it (nothing
 * to enforce: the call takes the path it took before governance existed). Resolved once per snapshot
 * and caller, so a call pays a map lookup.
 */
export function governanceOf(
  snapshot: Snapshot,
  orgId: string,
  groupId: string | null,
  agentId: string,
): EffectiveGovernance | null {
  let bySnapshot = cache.get(snapshot);
  if (!bySnapshot) cache.set(snapshot, (bySnapshot = new Map()));
  const key = `${orgId}\u0000${groupId ?? '\u0001'}\u0000${agentId}`;
  const hit = bySnapshot.get(key);
  if (hit !== undefined) return hit;
  const { rows, packs, any } = governanceInputs(snapshot, orgId, groupId, agentId);
  const value = any ? resolveGovernance(rows, packs) : null;
  if (bySnapshot.size >= CACHE_BOUND) bySnapshot.clear();
  bySnapshot.set(key, value);
  return value;
}

/**
 * `credential_mode` or `upstream` for one agent: the setting's rows and `llm_policy`'s field of the same
 * name as one hierarchy. At a scope, the governance value (when it sets one: a null `credential_mode`
 * sets none) stands in for the setting's; the scope is locked if either row is.
 */
export function governedSetting<K extends 'credential_mode' | 'upstream'>(
  snapshot: Snapshot,
  key: K,
  orgId: string,
  groupId: string | null,
  agentId: string,
): (K extends 'credential_mode' ? CredentialMode : UpstreamMap | Record<string, string>) | null {
  const s = agentScopes(snapshot, orgId, groupId, agentId);
  const rows: RowsByScope<unknown> = {};
  for (const scope of ORDER) {
    const setting = (s[scope] as ConfigRows)[key];
    const llm = (s[scope] as ConfigRows).llm_policy as PolicyRow<LlmGovernance> | undefined;
    const governed = llm?.value[key];
    if (governed !== undefined && governed !== null)
      rows[scope] = { value: governed, locked: llm!.locked === true || setting?.locked === true };
    else if (setting) rows[scope] = setting;
  }
  return resolveSetting(rows) as never;
}
