import type { FastifyInstance, FastifyRequest } from 'fastify';
import { PolicyValidationError } from '../../pipeline/errors.ts';
import { SETTING_KEYS, settingJson, validateSetting, type SettingKey } from '../../pipeline/policy/snapshot.ts';
import { patternProblem } from '../../pipeline/inspectors/patterns.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { agentOrg, checkedAgent, PLATFORM, TOKEN_ORG, tokenOrg } from '../authz/targets.ts';
import { bad } from '../bad-request.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { ChangeTarget, EventHub } from '../events.ts';
import { orgExists } from '../store/orgs.ts';
import {
  agentOverrides,
  deleteAgentOverride,
  deleteServiceRow,
  putAgentOverride,
  putServiceRow,
  serviceRowAt,
  serviceRows,
} from '../store/policies.ts';
import type { Queryable } from '../../core/sql.ts';
import {
  ANY,
  arrayOf,
  BOOLEAN,
  NO_CONTENT,
  NULLABLE_BOOLEAN,
  object,
  pathParams,
  STRING,
  viewSchema,
} from '../../core/schemas.ts';

// LLM content policy and settings of service `llmproxy` (llm-content-policy.md: Endpoints, Policy
// hierarchy): platform rows (platform:config), the caller's org rows (org:manage over it), agent
// overrides (agents:manage over the agent's org). The body is `{value: string}` — the JSON-encoded
// value — plus an optional `locked`; the value goes through the proxy's own validator and an invalid
// one is a 400 naming the field, with nothing stored. A lock at platform or org scope turns a write
// below it into a 409 naming the scope that holds the lock. Every write is audited and published to
// the enclaves it concerns, in the same transaction; `published` says whether any enclave was told.
// The agent's effective policy and the org's feature flags are effective-policy.ts and feature-flags.ts.

export const SERVICE = 'llmproxy';
const KEY = pathParams('key');
const ROW_VIEW = viewSchema('llmPolicyView', { key: STRING, scope: STRING, value: STRING, locked: BOOLEAN });
const OVERRIDE_VIEW = viewSchema('agentOverrideView', {
  override_service: STRING,
  key: STRING,
  scope: STRING,
  value: STRING,
  locked: BOOLEAN,
});
const WRITE_VIEW = viewSchema('policyWriteView', { key: STRING, scope: STRING, locked: BOOLEAN, published: BOOLEAN });
// `value` is the JSON-encoded policy value; it and `locked` are checked by policyBody (its messages name the field).
const POLICY_REQ = object({ value: ANY, locked: NULLABLE_BOOLEAN }, [], 'llmPolicyValueReq');
const OVERRIDE_REQ = object(
  { override_service: ANY, key: ANY, value: ANY, locked: NULLABLE_BOOLEAN },
  [],
  'agentOverrideReq',
);

function settingKey(key: string): SettingKey {
  if (!(SETTING_KEYS as readonly string[]).includes(key))
    throw new ApiError(PROBLEMS.notFound, `no llmproxy key ${key} (one of ${SETTING_KEYS.join(', ')})`);
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
  if (!lockable && (valid as { immutable?: unknown } | null)?.immutable === true)
    bad('value', `${key}.immutable is refused at agent scope`);
  // Stored in the form that validates back to the same value (never the validated form as such).
  return { value: JSON.stringify(settingJson(key, valid)), locked };
}

const isLock = (r: { value: string; locked: boolean }) =>
  r.locked || (JSON.parse(r.value) as { immutable?: unknown } | null)?.immutable === true;

/** 409 when a broader scope locks `key` for a write at `scope` (platform, then org, then group). */
export async function assertNotLocked(
  db: Queryable,
  service: string,
  key: string,
  scope: 'org' | 'group' | 'agent',
  org: string,
  group = '',
): Promise<void> {
  const broader: [string, string, string, string][] = [['platform', '', '', 'platform scope']];
  if (scope !== 'org') broader.push(['org', org, '', `org ${org}`]);
  if (scope === 'agent' && group) broader.push(['group', org, group, `group ${group}`]);
  for (const [kind, o, g, name] of broader) {
    const row = await serviceRowAt(db, service, { kind, org: o, group: g }, key);
    if (row && isLock(row))
      throw new ApiError(PROBLEMS.conflict, `${key} is locked at ${name}: a more specific scope cannot override it`);
  }
}

export function policyRoutes(deps: ChangeDeps, events: EventHub) {
  const { db } = deps;
  const p = (req: FastifyRequest) => req.params as { key: string; id: string };
  /** Writes a service_config row (or deletes it with value null), audited and published. */
  const writeRow = async (
    req: FastifyRequest,
    scope: 'platform' | 'org',
    org: string,
    key: string,
    row: { value: string; locked: boolean } | null,
  ) => {
    const target: ChangeTarget = scope === 'platform' ? { kind: 'platform' } : { kind: 'org', org };
    const scopeName = scope === 'platform' ? 'platform' : `org:${org}`;
    return auditedChange(deps, req, row ? 'llm-policy.put' : 'llm-policy.delete', org, async (tx) => {
      if (row) {
        await putServiceRow(tx, SERVICE, scope, org, { key, ...row }, req.principal!.subject);
      } else if (!(await deleteServiceRow(tx, SERVICE, scope, org, key))) {
        throw new ApiError(PROBLEMS.notFound, `no ${key} at ${scopeName}`);
      }
      const published = await events.publishTo(tx, target, 'policy.changed', {
        service: SERVICE,
        key,
        scope: scopeName,
      });
      return {
        result: { key, scope: scopeName, locked: row?.locked ?? false, published },
        resource: `llmproxy:${scopeName}:${key}`,
      };
    }).finally(() => events.wake());
  };
  const list = async (scope: 'platform' | 'org', org: string) =>
    (await serviceRows(db, SERVICE, scope, org)).map((r) => ({
      key: r.key,
      scope: scope === 'platform' ? 'platform' : `org:${org}`,
      value: r.value,
      locked: r.locked,
    }));

  const platformConfig = { requiredCapability: 'platform:config', capabilityTarget: PLATFORM } as const;
  const orgManage = { requiredCapability: 'org:manage', capabilityTarget: TOKEN_ORG } as const;
  const agentsManage = { requiredCapability: 'agents:manage', capabilityTarget: agentOrg(db) } as const;

  return async (api: FastifyInstance) => {
    for (const prefix of ['/platform/config/llmproxy', '/platform-config/llmproxy']) {
      api.get(prefix, { config: platformConfig, schema: { response: { 200: arrayOf(ROW_VIEW) } } }, async () =>
        list('platform', ''),
      );
      api.put(
        `${prefix}/:key`,
        { config: platformConfig, schema: { params: KEY, body: POLICY_REQ, response: { 200: WRITE_VIEW } } },
        async (req) => {
          const key = settingKey(p(req).key);
          return writeRow(req, 'platform', '', key, policyBody(req.body, key, true));
        },
      );
      api.delete(
        `${prefix}/:key`,
        { config: platformConfig, schema: { params: KEY, response: NO_CONTENT } },
        async (req, reply) => {
          await writeRow(req, 'platform', '', settingKey(p(req).key), null);
          return reply.code(204).send();
        },
      );
    }

    for (const prefix of ['/config/llmproxy', '/service-config/llmproxy']) {
      api.get(prefix, { config: orgManage, schema: { response: { 200: arrayOf(ROW_VIEW) } } }, async (req) =>
        list('org', tokenOrg(req)),
      );
      api.put(
        `${prefix}/:key`,
        { config: orgManage, schema: { params: KEY, body: POLICY_REQ, response: { 200: WRITE_VIEW } } },
        async (req) => {
          const org = tokenOrg(req);
          const key = settingKey(p(req).key);
          const row = policyBody(req.body, key, true);
          if (!(await orgExists(db, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
          await assertNotLocked(db, SERVICE, key, 'org', org);
          return writeRow(req, 'org', org, key, row);
        },
      );
      api.delete(
        `${prefix}/:key`,
        { config: orgManage, schema: { params: KEY, response: NO_CONTENT } },
        async (req, reply) => {
          await writeRow(req, 'org', tokenOrg(req), settingKey(p(req).key), null);
          return reply.code(204).send();
        },
      );
    }

    // Agent overrides: `{override_service: "llmproxy", key, value}`.
    api.get(
      '/agents/:id/config',
      { config: agentsManage, schema: { params: pathParams('id'), response: { 200: arrayOf(OVERRIDE_VIEW) } } },
      async (req) => {
        const agent = await checkedAgent(db, req, p(req).id);
        return (await agentOverrides(db, SERVICE, agent.uid)).map((r) => ({
          override_service: SERVICE,
          key: r.key,
          scope: `agent:${agent.uid}`,
          value: r.value,
          locked: false,
        }));
      },
    );
    api.post(
      '/agents/:id/config',
      { config: agentsManage, schema: { params: pathParams('id'), body: OVERRIDE_REQ, response: { 200: WRITE_VIEW } } },
      async (req) => {
        const agent = await checkedAgent(db, req, p(req).id);
        const body = req.body as Record<string, unknown>;
        if (body.override_service !== SERVICE) bad('override_service', `must be "${SERVICE}"`);
        if (typeof body.key !== 'string') bad('key', 'is required');
        if (!(SETTING_KEYS as readonly string[]).includes(body.key))
          bad('key', `unknown llmproxy key (one of ${SETTING_KEYS.join(', ')})`);
        const key = body.key as SettingKey;
        const row = policyBody(
          { value: body.value, ...(body.locked === undefined ? {} : { locked: body.locked }) },
          key,
          false,
        );
        await assertNotLocked(db, SERVICE, key, 'agent', agent.org_id, agent.group_id);
        return auditedChange(deps, req, 'llm-policy.put', agent.org_id, async (tx) => {
          await putAgentOverride(tx, SERVICE, agent, { key, value: row.value }, req.principal!.subject);
          const published = await events.publishTo(tx, { kind: 'agent', agent: agent.uid }, 'policy.changed', {
            service: SERVICE,
            key,
            scope: `agent:${agent.uid}`,
          });
          return {
            result: { key, scope: `agent:${agent.uid}`, locked: false, published },
            resource: `llmproxy:agent:${agent.uid}:${key}`,
          };
        }).finally(() => events.wake());
      },
    );
    api.delete(
      '/agents/:id/config/:key',
      { config: agentsManage, schema: { params: pathParams('id', 'key'), response: NO_CONTENT } },
      async (req, reply) => {
        const agent = await checkedAgent(db, req, p(req).id);
        const key = settingKey(p(req).key);
        await auditedChange(deps, req, 'llm-policy.delete', agent.org_id, async (tx) => {
          if (!(await deleteAgentOverride(tx, SERVICE, agent.uid, key)))
            throw new ApiError(PROBLEMS.notFound, `agent ${agent.uid} has no ${key} override`);
          await events.publishTo(tx, { kind: 'agent', agent: agent.uid }, 'policy.changed', {
            service: SERVICE,
            key,
            scope: `agent:${agent.uid}`,
          });
          return { result: null, resource: `llmproxy:agent:${agent.uid}:${key}` };
        }).finally(() => events.wake());
        return reply.code(204).send();
      },
    );
  };
}
