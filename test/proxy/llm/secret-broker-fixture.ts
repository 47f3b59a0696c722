import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { startBrokerHarness, type BrokerHarness } from '../../fixtures/broker-harness.ts';
import { anthropicBody, baseSnapshot, post, type Harness } from '../../fixtures/llmproxy-harness.ts';
import { addAgent } from '../../enclave/broker/secrets-fixture.ts';

// What the llmproxy-with-a-broker tests share: a broker on a known port with two agents of org-1 (g-1,
// g-2) and an operator (admin-1), its CA as a file, the snapshot that lists both agents, and the key the
// upstream saw on an agent's call.

export const ORG_KEY_1 = 'sk-broker-org-key-one-0123';
export const ORG_KEY_2 = 'sk-broker-org-key-two-4567';
export const AGENT_KEY = 'sk-broker-agent-key-89ab';
export const AGENT_KEY_2 = 'sk-broker-agent-key-cdef';
export const GROUP_KEY = 'sk-broker-group-key-0246';
export const DB_PASSWORD = 'broker-held-db-password';
export const VALUES = [ORG_KEY_1, ORG_KEY_2, AGENT_KEY, AGENT_KEY_2, GROUP_KEY, DB_PASSWORD];

export { freePort } from '../../fixtures/free-port.ts';

export async function broker(port: number, tokenFile?: string): Promise<BrokerHarness & { caFile: string }> {
  const h = await startBrokerHarness(
    { addr: `127.0.0.1:${port}`, seedAdmin: ['admin-1'], ...(tokenFile ? { satelliteTokenFile: tokenFile } : {}) },
    [{ clientId: 'admin-1', org: 'org-1', human: true }],
  );
  const caFile = join(h.dir, 'broker-ca.pem');
  await writeFile(caFile, h.tls.ca.certPem);
  await addAgent(h, 'agent-1', 'org-1', 'g-1');
  await addAgent(h, 'agent-2', 'org-1', 'g-2');
  return Object.assign(h, { caFile });
}

export const snapshot = (upstream: string) => {
  const s = baseSnapshot(upstream) as { agents: Record<string, unknown> };
  s.agents['agent-2'] = {
    org_id: 'org-1',
    group_id: 'g-2',
    name: 'two',
    status: 'active',
    contained: false,
    config: {},
  };
  return s;
};

export const put = (b: BrokerHarness, name: string, value: string, q = '') =>
  b.operator('admin-1', 'PUT', `/api/v1/secrets/${encodeURIComponent(name)}${q}`, { value });

/** The key the upstream saw on a call of `agent` (null when the proxy did not forward it). */
export async function keyOf(p: Harness, agent: 'agent-1' | 'agent-2'): Promise<string | null> {
  const before = p.upstream.received.length;
  const res = await post(
    p,
    '/v1/messages',
    anthropicBody('hi'),
    {},
    { sub: agent, group_id: agent === 'agent-1' ? 'g-1' : 'g-2' },
  );
  if (res.status !== 200 || p.upstream.received.length === before) return null;
  return String(p.upstream.received.at(-1)!.headers['x-api-key']);
}
