import type { FastifyInstance, FastifyRequest } from 'fastify';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { bad } from '../bad-request.ts';
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
import { ApiError, PROBLEMS } from '../errors.ts';
import type { EventHub } from '../events.ts';
import {
  broaderScopes,
  rowKey,
  scopeChange,
  scopeMustExist,
  scopeName,
  scopeOf,
  scopeTargetOf,
  SCOPE_QUERY,
  type Scope,
} from '../scope-query.ts';
import { configFlags, configValuesAt, deleteConfigValue, upsertConfigValue } from '../store/config-values.ts';
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

const KEY = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
const VALUE_VIEW = viewSchema('configValueView', { key: STRING, scope: STRING, locked: BOOLEAN, published: BOOLEAN });
const LISTED_VIEW = viewSchema('configValueListView', {
  key: STRING,
  scope: STRING,
  value: ANY,
  locked: BOOLEAN,
  secret: BOOLEAN,
});
// null is absent; whether a value is required depends on `secret` (checked by the handler).
const VALUE_REQ = object({ value: ANY, locked: NULLABLE_BOOLEAN, secret: NULLABLE_BOOLEAN }, [], 'configValueReq');

export function configValueRoutes(deps: ChangeDeps, events: EventHub) {
  const { db } = deps;

  /** Rows of `key` at the scopes broader than `s` (and at `s` itself with `self`). */
  const chain = async (tx: Queryable, s: Scope, key: string, self: boolean) => {
    const scopes = broaderScopes(s, self);
    const out: { scope: Scope; locked: boolean; secret: boolean }[] = [];
    for (const o of scopes) {
      const flags = await configFlags(tx, rowKey(o), key);
      if (flags) out.push({ scope: o, ...flags });
    }
    return out;
  };
  const keyOf = (req: FastifyRequest) => {
    const key = (req.params as { key: string }).key;
    if (!KEY.test(key)) bad('key', 'must be 1–128 letters, digits, ".", "_", ":" or "-"');
    return key;
  };

  const config = { requiredCapability: 'platform:config', capabilityTarget: scopeTargetOf(db) } as const;
  const keyed = { requiredCapability: 'platform:config', capabilityTarget: scopeTargetOf(db, keyOf) } as const;
  const KEY_PARAM = pathParams('key');

  return async (api: FastifyInstance) => {
    api.get(
      '/config',
      {
        config,
        schema: { querystring: SCOPE_QUERY, response: { 200: arrayOf(LISTED_VIEW) } },
      },
      async (req) => {
        const s = await scopeOf(db, req);
        await scopeMustExist(db, s);
        const out = [];
        for (const r of await configValuesAt(db, rowKey(s))) {
          const value =
            r.secret || r.value === null
              ? null
              : JSON.parse(deps.keys ? await deps.keys.open(s.org, r.value) : r.value);
          out.push({ key: r.key, scope: scopeName(s), value, locked: r.locked, secret: r.secret });
        }
        return out;
      },
    );

    api.post(
      '/config/:key',
      {
        config: keyed,
        schema: { params: KEY_PARAM, querystring: SCOPE_QUERY, body: VALUE_REQ, response: { 200: VALUE_VIEW } },
      },
      async (req) => {
        const key = keyOf(req);
        const s = await scopeOf(db, req);
        const body = req.body as { value?: unknown; locked?: boolean | null; secret?: boolean | null };
        const secret = body.secret ?? false;
        const locked = body.locked ?? false;
        const hasValue = 'value' in body && body.value !== undefined;
        if (secret && hasValue)
          bad(
            'value',
            'must be absent when secret is true: secret values are authored enclave-side, never through the control plane',
          );
        if (!secret && !hasValue) bad('value', 'is required (or declare the key secret)');
        if (locked && s.kind === 'agent') bad('locked', 'is refused at agent scope');
        await scopeMustExist(db, s);
        // Values of an org's scopes are sealed under its data key (erasure shreds it); platform values are not org
        // data.
        const stored = secret
          ? null
          : deps.keys && s.kind !== 'platform'
            ? await deps.keys.seal(s.org, JSON.stringify(body.value))
            : JSON.stringify(body.value);
        return auditedChange(deps, req, 'config.put', s.org, async (tx) => {
          const held = await chain(tx, s, key, true);
          const lock = held.find((h) => h.locked && h.scope.kind !== s.kind);
          if (lock)
            throw new ApiError(
              PROBLEMS.conflict,
              `${key} is locked at ${scopeName(lock.scope)}: a more specific scope cannot override it`,
            );
          const declared = held.find((h) => h.secret && !(h.scope.kind === s.kind && secret));
          if (hasValue && declared)
            throw new ApiError(
              PROBLEMS.conflict,
              `${key} is declared secret at ${scopeName(declared.scope)}: its value is authored enclave-side`,
            );
          await upsertConfigValue(tx, rowKey(s), { key, value: stored, locked, secret }, req.principal!.subject);
          const published = await events.publishTo(tx, scopeChange(s), 'config.changed', { key, scope: scopeName(s) });
          return { result: { key, scope: scopeName(s), locked, published }, resource: `config:${scopeName(s)}:${key}` };
        }).finally(() => events.wake());
      },
    );

    api.delete(
      '/config/:key',
      {
        config: keyed,
        schema: { params: KEY_PARAM, querystring: SCOPE_QUERY, response: NO_CONTENT },
      },
      async (req, reply) => {
        const key = keyOf(req);
        const s = await scopeOf(db, req);
        await scopeMustExist(db, s);
        await auditedChange(deps, req, 'config.delete', s.org, async (tx) => {
          const lock = (await chain(tx, s, key, false)).find((h) => h.locked);
          if (lock)
            throw new ApiError(
              PROBLEMS.conflict,
              `${key} is locked at ${scopeName(lock.scope)}: changes below it are refused`,
            );
          if (!(await deleteConfigValue(tx, rowKey(s), key)))
            throw new ApiError(PROBLEMS.notFound, `${key} is not set at ${scopeName(s)}`);
          await events.publishTo(tx, scopeChange(s), 'config.changed', { key, scope: scopeName(s) });
          return { result: null, resource: `config:${scopeName(s)}:${key}` };
        }).finally(() => events.wake());
        return reply.code(204).send();
      },
    );
  };
}
