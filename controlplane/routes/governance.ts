import type { FastifyInstance, FastifyRequest } from 'fastify';
import { own } from '../../core/own.ts';
import type { Queryable } from '../../core/sql.ts';
import { PolicyValidationError } from '../../pipeline/errors.ts';
import { validatePacks } from '../../pipeline/policy/snapshot.ts';
import { policyDocumentJson } from '../../pipeline/policy/validate.ts';
import { validateGovernance, validateRules, type GovernanceKind } from '../../pipeline/policy/governance.ts';
import { isGovernanceKey } from '../../pipeline/policy/snapshot.ts';
import { snapshotGovernance } from '../../pipeline/policy/snapshot-governance.ts';
import { agentSnapshot } from '../../pipeline/policy/store-snapshot.ts';
import type { AgentRow } from '../store/agents.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { reportSkipped } from '../skipped-rows.ts';
import { agentOrg, checkedAgent, PLATFORM } from '../authz/targets.ts';
import { bad } from '../bad-request.ts';
import { ANY, arrayOf, BOOLEAN, NO_CONTENT, object, pathParams, STRING, TEXT, viewSchema } from '../../core/schemas.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { EventHub } from '../events.ts';
import { deletePolicy, getPolicy, policyLocked, upsertPolicy } from '../store/governance-policies.ts';
import { installPack, listPacks, packExists, packInstallations, uninstallPack, upsertPack } from '../store/packs.ts';
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

// Governance policy per scope and destination packs (operator-api.md: llmPolicyReq,
// destinationPolicyReq, exec/ssh/tunnel, tunnel ports → policyWriteView; definePackReq → definePackView;
// installPackView). Paths (not shown in the spec):
//   PUT|GET|DELETE /api/v1/policies/{kind}?scope=…&org=…&group=…&agent=…
//     (kind: llm, destination, exec, ssh, tunnel, tunnel-ports)
//   POST /api/v1/packs, GET /api/v1/packs
//   PUT|DELETE /api/v1/packs/{name}/installations?scope=…
//   GET /api/v1/agents/{id}/effective-governance
// platform:config over the scope, like config values; `locked` refused at agent scope (400); a lock
// at a broader scope → 409 naming it.

const KIND_OF_PATH: Record<string, GovernanceKind> = {
  llm: 'llm',
  destination: 'destination',
  exec: 'exec',
  ssh: 'ssh',
  tunnel: 'tunnel',
  'tunnel-ports': 'tunnel_ports',
};
const PACK = /^[a-z0-9][a-z0-9_.-]{0,62}$/;

/**
 * What an agent's enclave resolves (pipeline/policy/snapshot-governance.ts) over the snapshot built for it
 * from the store, so the read shows what is enforced. `skipped` names the governance rows and packs the
 * builder left out because they do not validate.
 */
export async function effectiveGovernance(db: Queryable, agent: AgentRow) {
  const snapshot = await agentSnapshot(db, agent.org_id, agent);
  const skipped = snapshot.skipped.filter((r) => isGovernanceKey(r.key) || r.scope.startsWith('pack:'));
  return { ...snapshotGovernance(snapshot, agent.org_id, agent.group_id || null, agent.uid), skipped };
}

const KIND = pathParams('kind');
const POLICY_VIEW = viewSchema('policyView', { key: STRING, scope: STRING, value: ANY, locked: BOOLEAN });
const WRITE_VIEW = viewSchema('policyWriteView', { key: STRING, scope: STRING, locked: BOOLEAN, published: BOOLEAN });
// The fields depend on {kind} and are checked by the governance validator (its messages name the field).
const POLICY_REQ = {
  type: 'object',
  title: 'governancePolicyReq',
  description:
    'by {kind}: destinationPolicyReq, execPolicyReq, sshPolicyReq, tunnelPolicyReq, tunnelPortsPolicyReq, llmPolicyReq',
};
const PACK_VIEW = viewSchema('packView', { name: STRING, allow: ANY, deny: ANY, config: ANY });
// The name's form, allow, deny and config are checked by the handler and the policy validators.
const DEFINE_PACK = object({ name: TEXT, allow: ANY, deny: ANY, config: ANY }, ['name'], 'definePackReq');
const DEFINE_VIEW = viewSchema('definePackView', { pack: STRING, published: BOOLEAN });
const INSTALL_VIEW = viewSchema('installPackView', {
  pack: STRING,
  scope: STRING,
  installed: BOOLEAN,
  published: BOOLEAN,
});
const EFFECTIVE_VIEW = viewSchema('effectiveGovernanceView', { agent: STRING, org_id: STRING, group_id: STRING }, true);

export function governanceRoutes(deps: ChangeDeps, events: EventHub) {
  const { db } = deps;
  const kindOf = (req: FastifyRequest): GovernanceKind => {
    const k = own(KIND_OF_PATH, (req.params as { kind: string }).kind);
    if (!k)
      throw new ApiError(
        PROBLEMS.notFound,
        `no policy kind ${(req.params as { kind: string }).kind} (one of ${Object.keys(KIND_OF_PATH).join(', ')})`,
      );
    return k;
  };
  const scoped = async (req: FastifyRequest): Promise<Scope> => {
    const s = await scopeOf(db, req);
    await scopeMustExist(db, s);
    return s;
  };
  const packNamed = async (name: string) => {
    if (!(await packExists(db, name))) throw new ApiError(PROBLEMS.notFound, `no pack ${name}`);
  };

  const scopedConfig = { requiredCapability: 'platform:config', capabilityTarget: scopeTargetOf(db) } as const;
  const platformConfig = { requiredCapability: 'platform:config', capabilityTarget: PLATFORM } as const;

  return async (api: FastifyInstance) => {
    api.get(
      '/policies/:kind',
      {
        config: scopedConfig,
        schema: { params: KIND, querystring: SCOPE_QUERY, response: { 200: POLICY_VIEW } },
      },
      async (req) => {
        const s = await scoped(req);
        const kind = kindOf(req);
        const found = await getPolicy(db, kind, rowKey(s));
        if (!found) throw new ApiError(PROBLEMS.notFound, `no ${kind} policy at ${scopeName(s)}`);
        return { key: kind, scope: scopeName(s), value: JSON.parse(found.value), locked: found.locked };
      },
    );

    api.put(
      '/policies/:kind',
      {
        config: scopedConfig,
        schema: { params: KIND, querystring: SCOPE_QUERY, body: POLICY_REQ, response: { 200: WRITE_VIEW } },
      },
      async (req) => {
        const s = await scoped(req);
        const kind = kindOf(req);
        let parsed: ReturnType<typeof validateGovernance>;
        try {
          parsed = validateGovernance(kind, req.body);
        } catch (err) {
          if (err instanceof PolicyValidationError)
            throw new ApiError(PROBLEMS.badRequest, err.message.replace(/^body\./, ''));
          throw err;
        }
        if (parsed.locked && s.kind === 'agent') bad('locked', 'is refused at agent scope');
        return auditedChange(deps, req, 'policy.put', s.org, async (tx) => {
          for (const b of broaderScopes(s, false)) {
            if (await policyLocked(tx, kind, rowKey(b)))
              throw new ApiError(
                PROBLEMS.conflict,
                `the ${kind} policy is locked at ${scopeName(b)}: a more specific scope cannot override it`,
              );
          }
          await upsertPolicy(
            tx,
            kind,
            rowKey(s),
            { value: JSON.stringify(parsed.value), locked: parsed.locked },
            req.principal!.subject,
          );
          const published = await events.publishTo(tx, scopeChange(s), 'policy.changed', {
            service: 'governance',
            key: kind,
            scope: scopeName(s),
          });
          return {
            result: { key: kind, scope: scopeName(s), locked: parsed.locked, published },
            resource: `policy:${kind}:${scopeName(s)}`,
          };
        }).finally(() => events.wake());
      },
    );

    api.delete(
      '/policies/:kind',
      {
        config: scopedConfig,
        schema: { params: KIND, querystring: SCOPE_QUERY, response: NO_CONTENT },
      },
      async (req, reply) => {
        const s = await scoped(req);
        const kind = kindOf(req);
        await auditedChange(deps, req, 'policy.delete', s.org, async (tx) => {
          if (!(await deletePolicy(tx, kind, rowKey(s))))
            throw new ApiError(PROBLEMS.notFound, `no ${kind} policy at ${scopeName(s)}`);
          await events.publishTo(tx, scopeChange(s), 'policy.changed', {
            service: 'governance',
            key: kind,
            scope: scopeName(s),
          });
          return { result: null, resource: `policy:${kind}:${scopeName(s)}` };
        }).finally(() => events.wake());
        return reply.code(204).send();
      },
    );

    api.get('/packs', { config: platformConfig, schema: { response: { 200: arrayOf(PACK_VIEW) } } }, async () => {
      return (await listPacks(db)).map((r) => ({
        name: r.name,
        allow: JSON.parse(r.allow),
        deny: JSON.parse(r.deny),
        config: JSON.parse(r.config),
      }));
    });

    // Define (or redefine) a pack; a redefinition reaches every scope it is installed at.
    api.post(
      '/packs',
      {
        config: platformConfig,
        schema: { body: DEFINE_PACK, response: { 200: DEFINE_VIEW, 201: DEFINE_VIEW } },
      },
      async (req, reply) => {
        const body = req.body as Record<string, unknown>;
        const name = body.name as string;
        if (!PACK.test(name)) bad('name', 'must be 1–63 lowercase letters, digits, ".", "-" or "_"');
        let allow, deny, config;
        try {
          allow = validateRules(body.allow, 'allow');
          deny = validateRules(body.deny, 'deny');
          // Our extension of definePackReq: LLM policy the pack adds (only adds: the resolver composes it).
          config = body.config === undefined ? {} : validatePacks([{ name, config: body.config }], 'pack')[0].config;
        } catch (err) {
          if (err instanceof PolicyValidationError)
            throw new ApiError(PROBLEMS.badRequest, err.message.replace(/^pack\[0\]\./, ''));
          throw err;
        }
        const existed = await packExists(db, name);
        const view = await auditedChange(deps, req, existed ? 'pack.redefine' : 'pack.define', '', async (tx) => {
          const definition = {
            name,
            allow: JSON.stringify(allow),
            deny: JSON.stringify(deny),
            config: JSON.stringify(policyDocumentJson(config)),
          };
          await upsertPack(tx, definition, req.principal!.subject);
          let published = false;
          for (const r of await packInstallations(tx, name)) {
            const s = { kind: r.scope_kind, org: r.org_id, group: r.group_id, agent: r.agent_id } as Scope;
            published =
              (await events.publishTo(tx, scopeChange(s), 'policy.changed', {
                service: 'governance',
                key: `pack:${name}`,
                scope: scopeName(s),
              })) || published;
          }
          return { result: { pack: name, published }, resource: `pack:${name}` };
        }).finally(() => events.wake());
        return reply.code(existed ? 200 : 201).send(view);
      },
    );

    for (const install of [true, false]) {
      api.route({
        method: install ? 'PUT' : 'DELETE',
        url: '/packs/:name/installations',
        config: scopedConfig,
        schema: { params: pathParams('name'), querystring: SCOPE_QUERY, response: { 200: INSTALL_VIEW } },
        handler: async (req) => {
          const name = (req.params as { name: string }).name;
          const s = await scoped(req);
          await packNamed(name);
          return auditedChange(deps, req, install ? 'pack.install' : 'pack.uninstall', s.org, async (tx) => {
            const changed = install
              ? await installPack(tx, name, rowKey(s), req.principal!.subject)
              : await uninstallPack(tx, name, rowKey(s));
            if (!install && !changed)
              throw new ApiError(PROBLEMS.notFound, `pack ${name} is not installed at ${scopeName(s)}`);
            const published =
              changed &&
              (await events.publishTo(tx, scopeChange(s), 'policy.changed', {
                service: 'governance',
                key: `pack:${name}`,
                scope: scopeName(s),
              }));
            return {
              result: { pack: name, scope: scopeName(s), installed: install, published },
              resource: `pack:${name}:${scopeName(s)}`,
            };
          }).finally(() => events.wake());
        },
      });
    }

    api.get(
      '/agents/:id/effective-governance',
      {
        config: { requiredCapability: 'agents:manage', capabilityTarget: agentOrg(db) },
        schema: { params: pathParams('id'), response: { 200: EFFECTIVE_VIEW } },
      },
      async (req) => {
        const id = (req.params as { id: string }).id;
        const agent = await checkedAgent(db, req, id);
        const effective = await effectiveGovernance(db, agent);
        reportSkipped(deps, `agent:${id}`, effective.skipped);
        return { agent: id, org_id: agent.org_id, group_id: agent.group_id, ...effective };
      },
    );
  };
}
