import type { FastifyInstance, FastifyRequest } from 'fastify';
import { PolicyValidationError } from '../../pipeline/errors.ts';
import { orgFlag, policyLayers, resolveSnapshotSetting, SETTING_KEYS, settingJson, validateSetting, type SettingKey } from '../../pipeline/policy/snapshot.ts';
import { resolvePolicy } from '../../pipeline/policy/resolve.ts';
import { patternProblem } from '../../pipeline/inspectors/patterns.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { targetResolver } from '../authz/capability-hook.ts';
import { agentOrg, PLATFORM } from '../authz/targets.ts';
import { ANY, arrayOf, BOOLEAN, NO_CONTENT, NULLABLE_BOOLEAN, object as objectSchema, pathParams, STRING, viewSchema } from './schemas.ts';
import { bad } from '../bad-request.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { ChangeTarget, EventHub } from '../events.ts';
import { agentSnapshot } from '../../pipeline/policy/store-snapshot.ts';
import { reportSkipped } from '../skipped-rows.ts';
import type { Queryable } from '../../core/sql.ts';

// LLM content policy and settings of service `llmproxy` (llm-content-policy.md: Endpoints, Policy
// hierarchy): platform rows (platform:config), the caller's org rows (org:manage over it), agent
// overrides (agents:manage over the agent's org). The body is `{value: string}` — the JSON-encoded
// value — plus an optional `locked`; the value goes through the proxy's own validator and an invalid
// one is a 400 naming the field, with nothing stored. A lock at platform or org scope turns a write
// below it into a 409 naming the scope that holds the lock. Every write is audited and published to
// the enclaves it concerns, in the same transaction; `published` says whether any enclave was told.

const SERVICE = 'llmproxy';
const KEY = pathParams('key');
const ROW_VIEW = viewSchema('llmPolicyView', { key: STRING, scope: STRING, value: STRING, locked: BOOLEAN });
const OVERRIDE_VIEW = viewSchema('agentOverrideView', { override_service: STRING, key: STRING, scope: STRING, value: STRING, locked: BOOLEAN });
const WRITE_VIEW = viewSchema('policyWriteView', { key: STRING, scope: STRING, locked: BOOLEAN, published: BOOLEAN });
// `value` is the JSON-encoded policy value; it and `locked` are checked by policyBody (its messages name the field).
const POLICY_REQ = objectSchema({ value: ANY, locked: NULLABLE_BOOLEAN }, [], 'llmPolicyValueReq');
const OVERRIDE_REQ = objectSchema({ override_service: ANY, key: ANY, value: ANY, locked: NULLABLE_BOOLEAN }, [], 'agentOverrideReq');
const EFFECTIVE_VIEW = viewSchema('effectivePolicyView', {
  agent: STRING, org_id: STRING, group_id: STRING, flags: { type: 'object', additionalProperties: BOOLEAN }, policy: ANY, credential_mode: ANY,
  downstream_url: ANY, upstream: ANY, skipped: ANY,
});
const FLAG_VIEW = viewSchema('featureFlagView', { flag: STRING, org_id: STRING, enabled: BOOLEAN });
const FLAG_REQ = objectSchema({ enabled: NULLABLE_BOOLEAN }, [], 'featureFlagReq');
const FLAG_WRITE_VIEW = viewSchema('featureFlagWriteView', { flag: STRING, org_id: STRING, enabled: BOOLEAN, published: BOOLEAN });
export const FLAGS = ['inspect:llm', 'audit:llm'] as const;

interface AgentRow { uid: string; org_id: string; group_id: string; name: string; status: string; contained: boolean; enclave_id: string }

function settingKey(key: string): SettingKey {
  if (!(SETTING_KEYS as readonly string[]).includes(key)) throw new ApiError(PROBLEMS.notFound, `no llmproxy key ${key} (one of ${SETTING_KEYS.join(', ')})`);
  return key as SettingKey;
}

/** `{value: string, locked?}` → the validated value (its JSON text) and the lock. */
export function policyBody(raw: unknown, key: SettingKey, lockable: boolean): { value: string; locked: boolean } {
  const body = raw as Record<string, unknown>;
  if (typeof body.value !== 'string') bad('value', 'is required: the JSON-encoded policy value, as a string');
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.value);
  } catch {
    bad('value', 'is not valid JSON');
  }
  let valid: unknown;
  try {
    valid = validateSetting(key, parsed, key);
  } catch (err) {
    if (err instanceof PolicyValidationError) throw new ApiError(PROBLEMS.badRequest, `value: ${err.message}`);
    throw err;
  }
  // The proxy tolerates a pattern re2 cannot compile (it is recorded and skipped); authoring refuses it.
  if (key === 'content_inspection') {
    (valid as { patterns: { pattern: string }[] }).patterns.forEach((p, i) => {
      const problem = patternProblem(p.pattern);
      if (problem) bad('value', `content_inspection.patterns[${i}].pattern: not an RE2 expression (${problem})`);
    });
  }
  const locked = (body.locked as boolean | null | undefined) ?? false;
  if (locked && !lockable) bad('locked', 'is refused at agent scope');
  if (!lockable && (valid as { immutable?: unknown } | null)?.immutable === true) bad('value', `${key}.immutable is refused at agent scope`);
  // Stored in the form that validates back to the same value (never the validated form as such).
  return { value: JSON.stringify(settingJson(key, valid)), locked };
}

const isLock = (r: { value: string; locked: boolean }) => r.locked || (JSON.parse(r.value) as { immutable?: unknown } | null)?.immutable === true;

/** 409 when a broader scope locks `key` for a write at `scope` (platform, then org, then group). */
export async function assertNotLocked(db: Queryable, service: string, key: string, scope: 'org' | 'group' | 'agent', org: string, group = ''): Promise<void> {
  const broader: [string, string, string, string][] = [['platform', '', '', 'platform scope']];
  if (scope !== 'org') broader.push(['org', org, '', `org ${org}`]);
  if (scope === 'agent' && group) broader.push(['group', org, group, `group ${group}`]);
  for (const [kind, o, g, name] of broader) {
    const { rows } = await db.query<{ value: string; locked: boolean }>(
      'SELECT value, locked FROM service_config WHERE service = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = $4 AND key = $5', [service, kind, o, g, key],
    );
    if (rows[0] && isLock(rows[0])) throw new ApiError(PROBLEMS.conflict, `${key} is locked at ${name}: a more specific scope cannot override it`);
  }
}

export function llmPolicyRoutes(deps: ChangeDeps, events: EventHub) {
  const { db } = deps;
  const p = (req: FastifyRequest) => req.params as { key: string; id: string; flag: string };
  const callerOrg = (req: FastifyRequest): string => {
    const org = req.principal?.orgId;
    if (!org) throw new ApiError(PROBLEMS.badRequest, 'the token names no org: org-scope policy is written for the caller\'s org');
    return org;
  };
  const agentOf = async (req: FastifyRequest): Promise<AgentRow> => {
    const { rows } = await db.query<AgentRow>('SELECT uid, org_id, group_id, name, status, contained, enclave_id FROM agents WHERE uid = $1', [p(req).id]);
    // Authorized over the agent's org, or the caller's own when there is none (authz/targets.ts agentOrg).
    if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no agent ${p(req).id}`);
    return rows[0];
  };
  const orgMustExist = async (org: string) => {
    if ((await db.query('SELECT 1 FROM orgs WHERE id = $1', [org])).rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
  };
  /** Writes a service_config row (or deletes it with value null), audited and published. */
  const writeRow = async (req: FastifyRequest, scope: 'platform' | 'org', org: string, key: string, row: { value: string; locked: boolean } | null) => {
    const target: ChangeTarget = scope === 'platform' ? { kind: 'platform' } : { kind: 'org', org };
    const scopeName = scope === 'platform' ? 'platform' : `org:${org}`;
    return auditedChange(deps, req, row ? 'llm-policy.put' : 'llm-policy.delete', org, async (tx) => {
      if (row) {
        await tx.query(
          `INSERT INTO service_config (service, scope_kind, org_id, group_id, key, value, locked, updated_by) VALUES ($1, $2, $3, '', $4, $5, $6, $7)
           ON CONFLICT (service, scope_kind, org_id, group_id, key) DO UPDATE SET value = EXCLUDED.value, locked = EXCLUDED.locked, updated_by = EXCLUDED.updated_by, updated_at = now()`,
          [SERVICE, scope, org, key, row.value, row.locked, req.principal!.subject],
        );
      } else {
        const { rows } = await tx.query(`DELETE FROM service_config WHERE service = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = '' AND key = $4 RETURNING key`, [SERVICE, scope, org, key]);
        if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no ${key} at ${scopeName}`);
      }
      const published = await events.publishTo(tx, target, 'policy.changed', { service: SERVICE, key, scope: scopeName });
      return { result: { key, scope: scopeName, locked: row?.locked ?? false, published }, resource: `llmproxy:${scopeName}:${key}` };
    }).finally(() => events.wake());
  };
  const list = async (scope: 'platform' | 'org', org: string) => (await db.query<{ key: string; value: string; locked: boolean }>(
    `SELECT key, value, locked FROM service_config WHERE service = $1 AND scope_kind = $2 AND org_id = $3 AND group_id = '' ORDER BY key`, [SERVICE, scope, org],
  )).rows.map((r) => ({ key: r.key, scope: scope === 'platform' ? 'platform' : `org:${org}`, value: r.value, locked: r.locked }));

  // The org-scope rows are the caller's org's: a token naming no org is a 400 before any check.
  const ownOrg = targetResolver('caller-org', (req) => ({ kind: 'org', org: callerOrg(req) }));
  const platformConfig = { requiredCapability: 'platform:config', capabilityTarget: PLATFORM } as const;
  const orgManage = { requiredCapability: 'org:manage', capabilityTarget: ownOrg } as const;
  const agentsManage = { requiredCapability: 'agents:manage', capabilityTarget: agentOrg(db) } as const;

  return async (api: FastifyInstance) => {
    for (const prefix of ['/platform/config/llmproxy', '/platform-config/llmproxy']) {
      api.get(prefix, { config: platformConfig, schema: { response: { 200: arrayOf(ROW_VIEW) } } }, async (req) => {
        return list('platform', '');
      });
      api.put(`${prefix}/:key`, { config: platformConfig, schema: { params: KEY, body: POLICY_REQ, response: { 200: WRITE_VIEW } } }, async (req) => {
        const key = settingKey(p(req).key);
        return writeRow(req, 'platform', '', key, policyBody(req.body, key, true));
      });
      api.delete(`${prefix}/:key`, { config: platformConfig, schema: { params: KEY, response: NO_CONTENT } }, async (req, reply) => {
        await writeRow(req, 'platform', '', settingKey(p(req).key), null);
        return reply.code(204).send();
      });
    }

    for (const prefix of ['/config/llmproxy', '/service-config/llmproxy']) {
      api.get(prefix, { config: orgManage, schema: { response: { 200: arrayOf(ROW_VIEW) } } }, async (req) => {
        return list('org', callerOrg(req));
      });
      api.put(`${prefix}/:key`, { config: orgManage, schema: { params: KEY, body: POLICY_REQ, response: { 200: WRITE_VIEW } } }, async (req) => {
        const org = callerOrg(req);
        const key = settingKey(p(req).key);
        const row = policyBody(req.body, key, true);
        await orgMustExist(org);
        await assertNotLocked(db, SERVICE, key, 'org', org);
        return writeRow(req, 'org', org, key, row);
      });
      api.delete(`${prefix}/:key`, { config: orgManage, schema: { params: KEY, response: NO_CONTENT } }, async (req, reply) => {
        await writeRow(req, 'org', callerOrg(req), settingKey(p(req).key), null);
        return reply.code(204).send();
      });
    }

    // Agent overrides: `{override_service: "llmproxy", key, value}`.
    api.get('/agents/:id/config', { config: agentsManage, schema: { params: pathParams('id'), response: { 200: arrayOf(OVERRIDE_VIEW) } } }, async (req) => {
      const agent = await agentOf(req);
      return (await db.query<{ key: string; value: string }>('SELECT key, value FROM agent_config WHERE override_service = $1 AND agent_id = $2 ORDER BY key', [SERVICE, agent.uid]))
        .rows.map((r) => ({ override_service: SERVICE, key: r.key, scope: `agent:${agent.uid}`, value: r.value, locked: false }));
    });
    api.post('/agents/:id/config', { config: agentsManage, schema: { params: pathParams('id'), body: OVERRIDE_REQ, response: { 200: WRITE_VIEW } } }, async (req) => {
      const agent = await agentOf(req);
      const body = req.body as Record<string, unknown>;
      if (body.override_service !== SERVICE) bad('override_service', `must be "${SERVICE}"`);
      if (typeof body.key !== 'string') bad('key', 'is required');
      if (!(SETTING_KEYS as readonly string[]).includes(body.key)) bad('key', `unknown llmproxy key (one of ${SETTING_KEYS.join(', ')})`);
      const key = body.key as SettingKey;
      const row = policyBody({ value: body.value, ...(body.locked === undefined ? {} : { locked: body.locked }) }, key, false);
      await assertNotLocked(db, SERVICE, key, 'agent', agent.org_id, agent.group_id);
      return auditedChange(deps, req, 'llm-policy.put', agent.org_id, async (tx) => {
        await tx.query(
          `INSERT INTO agent_config (override_service, agent_id, org_id, key, value, updated_by) VALUES ($1, $2, $3, $4, $5, $6)
           ON CONFLICT (override_service, agent_id, key) DO UPDATE SET value = EXCLUDED.value, updated_by = EXCLUDED.updated_by, updated_at = now()`,
          [SERVICE, agent.uid, agent.org_id, key, row.value, req.principal!.subject],
        );
        const published = await events.publishTo(tx, { kind: 'agent', agent: agent.uid }, 'policy.changed', { service: SERVICE, key, scope: `agent:${agent.uid}` });
        return { result: { key, scope: `agent:${agent.uid}`, locked: false, published }, resource: `llmproxy:agent:${agent.uid}:${key}` };
      }).finally(() => events.wake());
    });
    api.delete('/agents/:id/config/:key', { config: agentsManage, schema: { params: pathParams('id', 'key'), response: NO_CONTENT } }, async (req, reply) => {
      const agent = await agentOf(req);
      const key = settingKey(p(req).key);
      await auditedChange(deps, req, 'llm-policy.delete', agent.org_id, async (tx) => {
        const { rows } = await tx.query('DELETE FROM agent_config WHERE override_service = $1 AND agent_id = $2 AND key = $3 RETURNING key', [SERVICE, agent.uid, key]);
        if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `agent ${agent.uid} has no ${key} override`);
        await events.publishTo(tx, { kind: 'agent', agent: agent.uid }, 'policy.changed', { service: SERVICE, key, scope: `agent:${agent.uid}` });
        return { result: null, resource: `llmproxy:agent:${agent.uid}:${key}` };
      }).finally(() => events.wake());
      return reply.code(204).send();
    });

    // The effective policy of an agent: the proxy's own resolver over the state the agent's enclave receives.
    api.get('/agents/:id/effective-policy', { config: agentsManage, schema: { params: pathParams('id'), response: { 200: EFFECTIVE_VIEW } } }, async (req) => {
      const agent = await agentOf(req);
      const snapshot = await agentSnapshot(db, agent.org_id, agent);
      reportSkipped(deps, `agent:${agent.uid}`, snapshot.skipped);
      const group = agent.group_id || null;
      const policy = resolvePolicy(policyLayers(snapshot, agent.org_id, group, agent.uid));
      return {
        agent: agent.uid, org_id: agent.org_id, group_id: agent.group_id,
        flags: Object.fromEntries(FLAGS.map((f) => [f, orgFlag(snapshot, agent.org_id, f)])),
        policy,
        credential_mode: resolveSnapshotSetting(snapshot, 'credential_mode', agent.org_id, group, agent.uid) ?? 'platform',
        downstream_url: resolveSnapshotSetting(snapshot, 'downstream_url', agent.org_id, group, agent.uid),
        upstream: resolveSnapshotSetting(snapshot, 'upstream', agent.org_id, group, agent.uid) ?? {},
        skipped: snapshot.skipped,
      };
    });

    // Org feature flags (`inspect:llm`, `audit:llm`; enabled when never set), for the caller's org.
    api.get('/feature-flags', { config: orgManage, schema: { response: { 200: arrayOf(FLAG_VIEW) } } }, async (req) => {
      const org = callerOrg(req);
      const set = new Map((await db.query<{ flag: string; enabled: boolean }>('SELECT flag, enabled FROM feature_flags WHERE org_id = $1', [org])).rows.map((r) => [r.flag, r.enabled]));
      return FLAGS.map((flag) => ({ flag, org_id: org, enabled: set.get(flag) ?? true }));
    });
    api.put('/feature-flags/:flag', { config: orgManage, schema: { params: pathParams('flag'), body: FLAG_REQ, response: { 200: FLAG_WRITE_VIEW } } }, async (req) => {
      const org = callerOrg(req);
      const flag = p(req).flag;
      if (!(FLAGS as readonly string[]).includes(flag)) throw new ApiError(PROBLEMS.notFound, `no feature flag ${flag} (one of ${FLAGS.join(', ')})`);
      const enabled = (req.body as { enabled?: boolean | null }).enabled;
      if (enabled === undefined || enabled === null) bad('enabled', 'is required (a boolean)');
      await orgMustExist(org);
      return auditedChange(deps, req, 'feature-flag.put', org, async (tx) => {
        await tx.query(
          `INSERT INTO feature_flags (org_id, flag, enabled, updated_by) VALUES ($1, $2, $3, $4)
           ON CONFLICT (org_id, flag) DO UPDATE SET enabled = EXCLUDED.enabled, updated_by = EXCLUDED.updated_by, updated_at = now()`,
          [org, flag, enabled, req.principal!.subject],
        );
        const published = await events.publishTo(tx, { kind: 'org', org }, 'flags.changed', { flag, org_id: org });
        return { result: { flag, org_id: org, enabled, published }, resource: `feature-flag:${org}:${flag}` };
      }).finally(() => events.wake());
    });
  };
}
