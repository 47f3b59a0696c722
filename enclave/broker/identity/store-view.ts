import { createHash } from 'node:crypto';
import type { BrokerAgent } from '../agents.ts';
import type { AgentView } from '../agent-routes.ts';
import type { BrokerDeps } from '../deps.ts';

// A minimal AgentView straight over the broker's store, which the server wires until the secret store
// (secrets: merged org → group → agent) and the merged config (platform → org → group → agent, with
// locks) take its place: secrets from broker_secrets, config the agent's own keys (broker_agent_config)
// with nothing locked above them.

const RANK: Record<string, number> = { org: 0, group: 1, agent: 2 };

/** JSON with object keys sorted, so equal config hashes equally whatever order it was built in. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v !== null && typeof v === 'object')
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  return JSON.stringify(v);
}

export const configHash = (config: Record<string, unknown>): string =>
  createHash('sha256').update(canonical(config)).digest('hex');

export function storeAgentView(deps: Pick<BrokerDeps, 'db' | 'sealer'>): AgentView {
  return {
    async secrets(agent: BrokerAgent) {
      const { rows } = await deps.db.query<{ scope_kind: string; name: string; sealed: string }>(
        `SELECT scope_kind, name, sealed FROM broker_secrets
          WHERE org_id = $1 AND (scope_kind = 'org' AND scope_id = $1
                              OR scope_kind = 'group' AND scope_id = $2
                              OR scope_kind = 'agent' AND scope_id = $3)`,
        [agent.org_id, agent.group_id ?? '', agent.uid],
      );
      const out: Record<string, string> = Object.create(null);
      for (const r of rows.sort((a, b) => RANK[a.scope_kind]! - RANK[b.scope_kind]!))
        if (r.scope_kind !== 'group' || agent.group_id) out[r.name] = await deps.sealer.open(r.sealed);
      return out;
    },
    async config(agent: BrokerAgent) {
      const { rows } = await deps.db.query<{ key: string; value: unknown }>(
        'SELECT key, value FROM broker_agent_config WHERE agent_uid = $1 ORDER BY key',
        [agent.uid],
      );
      const config: Record<string, unknown> = Object.create(null);
      for (const r of rows) config[r.key] = r.value;
      return { config, config_hash: configHash(config) };
    },
    async putConfig(tx, agent, key, value) {
      await tx.query(
        `INSERT INTO broker_agent_config (agent_uid, key, value) VALUES ($1, $2, $3)
         ON CONFLICT (agent_uid, key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()`,
        [agent.uid, key, JSON.stringify(value)],
      );
    },
  };
}
