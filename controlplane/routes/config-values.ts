import type { FastifyInstance, FastifyRequest } from 'fastify';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { requireCapability, type Target } from '../authz/guard.ts';
import { bad, bool, object } from '../body.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { ChangeTarget, EventHub } from '../events.ts';
import type { Queryable } from '../../core/sql.ts';

// Config values (spec: POST/DELETE /api/v1/config/{key}, configValueReq → configValueView) at platform,
// org, group or agent scope, chosen by query parameters (the path is the spec's): `scope`
// (platform | org | group | agent; default platform), `org`, `group`, `agent`. platform:config over
// the target. `secret: true` declares the key secret: no value bytes cross the control plane.
//
//   200  written (configValueView)                    204  deleted
//   400  malformed body, key or scope parameters; a value sent with `secret: true`; `locked` at agent scope
//   404  the org, group or agent does not exist; DELETE of a value that is not set at that scope
//   409  a broader scope locks the key; a value for a key declared secret at this or a broader scope

type ScopeKind = 'platform' | 'org' | 'group' | 'agent';
interface Scope { kind: ScopeKind; org: string; group: string; agent: string }

const KEY = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

const scopeName = (s: Scope) => (s.kind === 'platform' ? 'platform' : s.kind === 'org' ? `org:${s.org}` : s.kind === 'group' ? `group:${s.org}:${s.group}` : `agent:${s.agent}`);

export function configValueRoutes(deps: ChangeDeps, events: EventHub) {
  const { db } = deps;

  /** The scope of the query parameters, checked to exist; the agent's org comes from the store. */
  const scopeOf = async (req: FastifyRequest): Promise<Scope> => {
    const q = req.query as Record<string, unknown>;
    for (const k of Object.keys(q)) if (!['scope', 'org', 'group', 'agent'].includes(k)) bad(k, 'unknown query parameter (scope, org, group, agent)');
    const str = (k: string) => (typeof q[k] === 'string' ? (q[k] as string) : '');
    const kind = (str('scope') || 'platform') as ScopeKind;
    if (!['platform', 'org', 'group', 'agent'].includes(kind)) bad('scope', 'must be platform, org, group or agent');
    const s: Scope = { kind, org: str('org'), group: str('group'), agent: str('agent') };
    if (kind === 'platform') {
      if (s.org || s.group || s.agent) bad('scope', 'platform scope takes no org, group or agent');
      return s;
    }
    if (kind === 'agent') {
      if (!s.agent) bad('agent', 'is required at agent scope');
      const { rows } = await db.query<{ org_id: string; group_id: string }>('SELECT org_id, group_id FROM agents WHERE uid = $1', [s.agent]);
      if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no agent ${s.agent}`);
      if (s.org && s.org !== rows[0].org_id) throw new ApiError(PROBLEMS.notFound, `no agent ${s.agent} in org ${s.org}`);
      return { ...s, org: rows[0].org_id, group: rows[0].group_id };
    }
    if (!s.org) bad('org', `is required at ${kind} scope`);
    if (kind === 'group' && !s.group) bad('group', 'is required at group scope');
    return s;
  };
  const target = (s: Scope): Target => (s.kind === 'platform' ? { kind: 'platform' } : s.kind === 'group' ? { kind: 'group', org: s.org, group: s.group } : { kind: 'org', org: s.org });
  const mustExist = async (s: Scope) => {
    if (s.kind === 'platform' || s.kind === 'agent') return;
    if ((await db.query('SELECT 1 FROM orgs WHERE id = $1', [s.org])).rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no org ${s.org}`);
    if (s.kind === 'group' && (await db.query('SELECT 1 FROM org_groups WHERE org_id = $1 AND id = $2', [s.org, s.group])).rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no group ${s.group} in org ${s.org}`);
  };
  /** Rows of `key` at the scopes broader than `s` (and at `s` itself with `self`). */
  const chain = async (tx: Queryable, s: Scope, key: string, self: boolean) => {
    const order: Scope[] = [{ kind: 'platform', org: '', group: '', agent: '' }];
    if (s.kind !== 'platform') order.push({ kind: 'org', org: s.org, group: '', agent: '' });
    if ((s.kind === 'group' || s.kind === 'agent') && s.group) order.push({ kind: 'group', org: s.org, group: s.group, agent: '' });
    if (s.kind === 'agent') order.push(s);
    const scopes = self ? order : order.filter((o) => o.kind !== s.kind);
    const out: { scope: Scope; locked: boolean; secret: boolean }[] = [];
    for (const o of scopes) {
      const { rows } = await tx.query<{ locked: boolean; secret: boolean }>(
        'SELECT locked, secret FROM config_values WHERE scope_kind = $1 AND org_id = $2 AND group_id = $3 AND agent_id = $4 AND key = $5',
        [o.kind, o.kind === 'platform' ? '' : o.org, o.kind === 'group' ? o.group : '', o.kind === 'agent' ? o.agent : '', key],
      );
      if (rows[0]) out.push({ scope: o, ...rows[0] });
    }
    return out;
  };
  const change = (s: Scope): ChangeTarget => (s.kind === 'platform' ? { kind: 'platform' } : s.kind === 'agent' ? { kind: 'agent', agent: s.agent } : { kind: 'org', org: s.org });
  const keyOf = (req: FastifyRequest) => {
    const key = (req.params as { key: string }).key;
    if (!KEY.test(key)) bad('key', 'must be 1–128 letters, digits, ".", "_", ":" or "-"');
    return key;
  };
  const rowKey = (s: Scope) => [s.kind, s.kind === 'platform' ? '' : s.org, s.kind === 'group' || s.kind === 'agent' ? (s.kind === 'group' ? s.group : '') : '', s.kind === 'agent' ? s.agent : ''];

  return async (api: FastifyInstance) => {
    api.get('/config', { config: { requiredCapability: 'platform:config' } }, async (req) => {
      const s = await scopeOf(req);
      await requireCapability(db, req, 'platform:config', target(s));
      await mustExist(s);
      const [kind, org, group, agent] = rowKey(s);
      const { rows } = await db.query<{ key: string; value: string | null; locked: boolean; secret: boolean }>(
        'SELECT key, value, locked, secret FROM config_values WHERE scope_kind = $1 AND org_id = $2 AND group_id = $3 AND agent_id = $4 ORDER BY key', [kind, org, group, agent],
      );
      return rows.map((r) => ({ key: r.key, scope: scopeName(s), value: r.secret || r.value === null ? null : JSON.parse(r.value), locked: r.locked, secret: r.secret }));
    });

    api.post('/config/:key', { config: { requiredCapability: 'platform:config' } }, async (req) => {
      const key = keyOf(req);
      const s = await scopeOf(req);
      await requireCapability(db, req, 'platform:config', target(s));
      const body = object(req.body, ['value', 'locked', 'secret']);
      const secret = bool(body, 'secret') ?? false;
      const locked = bool(body, 'locked') ?? false;
      const hasValue = 'value' in body && body.value !== undefined;
      if (secret && hasValue) bad('value', 'must be absent when secret is true: secret values are authored enclave-side, never through the control plane');
      if (!secret && !hasValue) bad('value', 'is required (or declare the key secret)');
      if (locked && s.kind === 'agent') bad('locked', 'is refused at agent scope');
      await mustExist(s);
      return auditedChange(deps, req, 'config.put', s.org, async (tx) => {
        const held = await chain(tx, s, key, true);
        const lock = held.find((h) => h.locked && h.scope.kind !== s.kind);
        if (lock) throw new ApiError(PROBLEMS.conflict, `${key} is locked at ${scopeName(lock.scope)}: a more specific scope cannot override it`);
        const declared = held.find((h) => h.secret && !(h.scope.kind === s.kind && secret));
        if (hasValue && declared) throw new ApiError(PROBLEMS.conflict, `${key} is declared secret at ${scopeName(declared.scope)}: its value is authored enclave-side`);
        const [kind, org, group, agent] = rowKey(s);
        await tx.query(
          `INSERT INTO config_values (scope_kind, org_id, group_id, agent_id, key, value, locked, secret, updated_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
           ON CONFLICT (scope_kind, org_id, group_id, agent_id, key) DO UPDATE SET value = EXCLUDED.value, locked = EXCLUDED.locked, secret = EXCLUDED.secret, updated_by = EXCLUDED.updated_by, updated_at = now()`,
          [kind, org, group, agent, key, secret ? null : JSON.stringify(body.value), locked, secret, req.principal!.subject],
        );
        const published = await events.publishTo(tx, change(s), 'config.changed', { key, scope: scopeName(s) });
        return { result: { key, scope: scopeName(s), locked, published }, resource: `config:${scopeName(s)}:${key}` };
      }).finally(() => events.wake());
    });

    api.delete('/config/:key', { config: { requiredCapability: 'platform:config' } }, async (req, reply) => {
      const key = keyOf(req);
      const s = await scopeOf(req);
      await requireCapability(db, req, 'platform:config', target(s));
      await mustExist(s);
      await auditedChange(deps, req, 'config.delete', s.org, async (tx) => {
        const lock = (await chain(tx, s, key, false)).find((h) => h.locked);
        if (lock) throw new ApiError(PROBLEMS.conflict, `${key} is locked at ${scopeName(lock.scope)}: changes below it are refused`);
        const [kind, org, group, agent] = rowKey(s);
        const { rows } = await tx.query('DELETE FROM config_values WHERE scope_kind = $1 AND org_id = $2 AND group_id = $3 AND agent_id = $4 AND key = $5 RETURNING key', [kind, org, group, agent, key]);
        if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `${key} is not set at ${scopeName(s)}`);
        await events.publishTo(tx, change(s), 'config.changed', { key, scope: scopeName(s) });
        return { result: null, resource: `config:${scopeName(s)}:${key}` };
      }).finally(() => events.wake());
      return reply.code(204).send();
    });
  };
}
