// The embedded secret source (`--secrets-file`): `{"agent:ID": {NAME: VALUE}, "org:ID": {NAME: VALUE}}`.
// The secret broker (`--secret-broker-url`) replaces it when the enclave has one. Values never reach a
// log line or an error message: errors name the entry, never the value.

export type SecretMap = Map<string, Map<string, string>>;

export const AGENT_LLM_KEY = 'agent:llmproxy.llm.api_key';
export const ORG_LLM_KEY = 'llmproxy:llm.api_key';

export function parseSecretsFile(value: unknown): SecretMap {
  if (value === null || typeof value !== 'object' || Array.isArray(value))
    throw new Error('secrets file must be a JSON object');
  const out: SecretMap = new Map();
  for (const [owner, entries] of Object.entries(value as Record<string, unknown>)) {
    if (!/^(agent|org):.+/.test(owner))
      throw new Error(`secrets file: key "${owner}" must be "agent:<id>" or "org:<id>"`);
    if (entries === null || typeof entries !== 'object' || Array.isArray(entries))
      throw new Error(`secrets file: "${owner}" must be an object of name → value`);
    const names = new Map<string, string>();
    for (const [name, v] of Object.entries(entries as Record<string, unknown>)) {
      if (typeof v !== 'string') throw new Error(`secrets file: "${owner}"."${name}" must be a string`);
      names.set(name, v);
    }
    out.set(owner, names);
  }
  return out;
}

export interface SecretSource {
  /** All secret values of an agent (for the secrets filter); the same frozen array while they stay the same. */
  agentSecrets(agentId: string): readonly string[];
  get(owner: `agent:${string}` | `org:${string}`, name: string): string | undefined;
}

export function secretSource(read: () => SecretMap): SecretSource {
  // One array per agent and version of the map: the secrets filter keeps its needles per array.
  const lists = new WeakMap<SecretMap, Map<string, string[]>>();
  return {
    agentSecrets: (agentId) => {
      const map = read();
      let byAgent = lists.get(map);
      if (byAgent === undefined) lists.set(map, (byAgent = new Map()));
      let values = byAgent.get(agentId);
      if (values === undefined)
        byAgent.set(agentId, (values = Object.freeze([...(map.get(`agent:${agentId}`)?.values() ?? [])]) as string[]));
      return values;
    },
    get: (owner, name) => read().get(owner)?.get(name),
  };
}
