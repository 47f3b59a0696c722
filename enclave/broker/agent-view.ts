import { ApiError } from '../../core/errors.ts';
import { dict } from '../../core/own.ts';
import { PROBLEMS } from '../../core/problem.ts';
import type { Queryable } from '../../core/sql.ts';
import {
  CONFIG_KEY,
  configHash,
  isSecretKey,
  lockedAbove,
  mergeAgentConfig,
  type ConfigDocument,
} from '../../pipeline/policy/config-values.ts';
import type { BrokerAgent } from './agents.ts';
import type { AgentView } from './agent-routes.ts';
import type { BrokerDeps } from './deps.ts';
import { AgentConfigLockedError } from '../errors.ts';
import { agentSecrets, allSecretsOf } from './secrets.ts';

// What an agent is served about itself (the agent routes and the bootstrap / refresh bundles):
//   secrets  every secret of the agent, merged org → group → agent (agent-routes.ts drops the satellite
//            names, those with a `:`, before serving them)
//   config   the config values the control plane authored (the enclave's last good config document,
//            kept by convergence.ts), merged platform → org → group → agent with locks
//            (pipeline/policy/config-values.ts), with the values the agent wrote for itself at agent
//            scope; a key declared secret (`secret: true`) gets its bytes from the secret store by the
//            same name (agent over group over org), and is left out while no secret of that name exists
//            or when the name is a satellite secret's (it carries a `:`)
//   config_hash  SHA-256 of the config's canonical JSON: it changes exactly when the config does.
// An agent may not write a key a broader scope locked, nor one declared secret (409).

/** The agent's own config writes (broker_agent_config). */
async function ownValues(db: Queryable, uid: string): Promise<Record<string, unknown>> {
  const { rows } = await db.query<{ key: string; value: unknown }>(
    'SELECT key, value FROM broker_agent_config WHERE agent_uid = $1 ORDER BY key',
    [uid],
  );
  const out = dict<unknown>();
  for (const r of rows) out[r.key] = r.value;
  return out;
}

/** Before the first config document: no authored values, only the agent's own. */
const EMPTY: ConfigDocument = {
  version: '',
  enclave: { id: '', name: '' },
  platform: dict(),
  orgs: dict(),
  agents: dict(),
};

export function storeAgentView(
  deps: Pick<BrokerDeps, 'db' | 'sealer'>,
  /** The enclave's config document (convergence.ts keeps the last good one); null before the first. */
  document: () => ConfigDocument | null,
): AgentView {
  return {
    secrets: (agent: BrokerAgent) => allSecretsOf(deps, agent),
    async config(agent: BrokerAgent) {
      const merged = mergeAgentConfig(document() ?? EMPTY, agent, await ownValues(deps.db, agent.uid));
      const config = merged.config;
      if (merged.secrets.length > 0) {
        // The agent's own names only: a satellite secret (a name with `:`) never reaches the agent, whoever
        // declared its name secret.
        const secrets = await agentSecrets(deps, agent);
        for (const key of merged.secrets) if (Object.hasOwn(secrets, key)) config[key] = secrets[key];
      }
      return { config, config_hash: configHash(config) };
    },
    async putConfig(tx, agent, key, value) {
      if (!CONFIG_KEY.test(key))
        throw new ApiError(PROBLEMS.badRequest, 'key: 1-128 characters of A-Z a-z 0-9 . _ : - starting alphanumeric');
      const doc = document() ?? EMPTY;
      const lock = lockedAbove(doc, agent, key);
      if (lock) throw new AgentConfigLockedError(`config key ${key} is locked at ${lock} scope`);
      if (isSecretKey(doc, agent, key))
        throw new AgentConfigLockedError(`config key ${key} is declared secret: its value is a secret of the enclave`);
      await tx.query(
        `INSERT INTO broker_agent_config (agent_uid, key, value) VALUES ($1, $2, $3)
         ON CONFLICT (agent_uid, key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()`,
        [agent.uid, key, JSON.stringify(value)],
      );
    },
  };
}
