import { own } from '../../core/own.ts';
import { configHash, mergeAgentConfig, type ConfigDocument } from '../../pipeline/policy/config-values.ts';
import { errorAnswer, notFound, type ImdsAnswer } from './errors.ts';

// The agent's config as imds serves it (GET /v1/config): the config values document `dvx config-pull`
// writes (docs/snapshot.md, "Config values"), merged for this one agent platform → org → group → agent
// with the locks of the policy keys (pipeline/policy/config-values.ts, the broker's own merge), and
// the hash of the result (config_hash: it changes exactly when the config does).
//
// A key declared secret is listed in `secret_keys`, never valued: imds hands a secret out only as a
// credential of an --inject-cred rule, each read audited (docs/imds.md, "Config").
//
// The agent's org is --org-id when given, else the document's record of the agent. Both given and
// different: the config is refused (503) rather than merged for an org the snapshot says the agent is
// not in; the document names no such agent and no --org-id: 404.

export interface AgentIdentity {
  agentId: string;
  /** --org-id; empty when not given. */
  orgId: string;
}

export interface AgentConfigBody {
  agent_id: string;
  org_id: string;
  group_id: string | null;
  /** The document's version (the control plane's). */
  version: string;
  config: Record<string, unknown>;
  config_hash: string;
  secret_keys: string[];
}

/** Who the agent is in this document: its org and group; an answer when it cannot be told. */
export function agentInDocument(
  doc: ConfigDocument,
  who: AgentIdentity,
): { org_id: string; group_id: string | null } | ImdsAnswer {
  const record = own(doc.agents, who.agentId);
  if (record && who.orgId && record.org_id !== who.orgId)
    return errorAnswer(
      503,
      'config_unavailable',
      `the config snapshot puts agent ${who.agentId} in org ${record.org_id}, but imds serves it in org ${who.orgId} (--org-id)`,
    );
  if (record) return { org_id: record.org_id, group_id: record.group_id };
  if (who.orgId) return { org_id: who.orgId, group_id: null };
  return notFound(`agent ${who.agentId} is not in the config snapshot (and --org-id is not set)`);
}

export function agentConfig(doc: ConfigDocument, who: AgentIdentity): AgentConfigBody | ImdsAnswer {
  const place = agentInDocument(doc, who);
  if ('status' in place) return place;
  const merged = mergeAgentConfig(doc, { uid: who.agentId, ...place });
  return {
    agent_id: who.agentId,
    org_id: place.org_id,
    group_id: place.group_id,
    version: doc.version,
    config: merged.config,
    config_hash: configHash(merged.config),
    secret_keys: merged.secrets,
  };
}
