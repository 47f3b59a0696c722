import type { IncomingHttpHeaders } from 'node:http';
import type { CredentialMode } from '../../pipeline/policy/snapshot.ts';
import type { AgentIdentity } from './auth.ts';
import { AGENT_LLM_KEY, ORG_LLM_KEY, type SecretSource } from './secrets-file.ts';

// The upstream credential (spec: Authentication, "LLM proxy to upstream"):
//   platform     the agent-level secret `agent:llmproxy.llm.api_key`, else the org-level
//                `llmproxy:llm.api_key`; it replaces whatever key the agent sent.
//   passthrough  the agent's own credential: the one of `Authorization: Bearer` / `x-api-key` that is
//                not the platform JWT (docs/decisions.md).
// No credential: the spec's `no LLM API credential configured`.

export function resolveCredential(
  mode: CredentialMode,
  identity: AgentIdentity,
  headers: IncomingHttpHeaders,
  secrets: SecretSource,
): string | null {
  if (mode === 'platform') {
    // The agent's own map may hold the org-level name too: the broker merges a group's key into it.
    return (
      secrets.get(`agent:${identity.agentId}`, AGENT_LLM_KEY) ??
      secrets.get(`agent:${identity.agentId}`, ORG_LLM_KEY) ??
      secrets.get(`org:${identity.orgId}`, ORG_LLM_KEY) ??
      null
    );
  }
  const fromAuth =
    typeof headers.authorization === 'string' ? headers.authorization.replace(/^bearer\s+/i, '').trim() : '';
  const fromKey = typeof headers['x-api-key'] === 'string' ? headers['x-api-key'].trim() : '';
  if (identity.tokenHeader === 'authorization') return fromKey || null;
  if (identity.tokenHeader === 'x-api-key') return fromAuth || null;
  return fromKey || fromAuth || null; // mTLS: either header may carry the agent's key
}
