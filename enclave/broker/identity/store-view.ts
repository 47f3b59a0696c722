import { createHash } from 'node:crypto';
import type { BrokerAgent } from '../agents.ts';
import type { AgentView } from '../agent-routes.ts';
import type { BrokerDeps } from '../deps.ts';
import { allSecretsOf } from '../secrets.ts';

// The AgentView over the broker's store: secrets from the secret store (secrets.ts: merged org → group →
// agent), and, until the merged config (platform → org → group → agent, with locks) takes its place,
// config the agent's own keys (broker_agent_config) with nothing locked above them.

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
    // Every secret of the agent (agent-routes.ts drops the satellite names before serving them).
    secrets: (agent: BrokerAgent) => allSecretsOf(deps, agent),
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
