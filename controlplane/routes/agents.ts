import type { FastifyInstance, FastifyRequest } from 'fastify';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { describe, holds, type Target } from '../authz/guard.ts';
import { bad } from '../bad-request.ts';
import {
  arrayOf,
  BOOLEAN,
  NO_CONTENT,
  NON_EMPTY_STRINGS,
  NULLABLE_BOOLEAN,
  NULLABLE_STRING,
  object,
  optionalBody,
  pathParams,
  STRING,
  STRINGS,
  TEXT,
  viewSchema,
} from '../../core/schemas.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { EventHub } from '../events.ts';
import { orgExists } from '../store/orgs.ts';
import { groupExists, groupIdsOf } from '../store/groups.ts';
import { enclaveOwner } from '../store/enclaves.ts';
import { packExists } from '../store/packs.ts';
import {
  deleteAgent,
  getAgent,
  getAgentInOrg,
  listAgents,
  setAgentState,
  upsertAgent,
  type AgentRow,
} from '../store/agents.ts';

// Agents of an org (spec: createAgentReq / agentView, States and transitions, Authentication rule 4).
// Create is an upsert on `uid`. Authorization stays path-derived (agents:manage over {org}); the body
// `group` only narrows: the caller must hold agents:manage over that group (an org-wide grant covers
// every group), and on an upsert over the stored group too. `agent.created` is published to the
// owning enclave with the agent's id, name and org. Containment and restore nudge the enclave.

const UID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
export const AGENT_STATUSES = ['created', 'provisioning', 'active', 'suspended', 'isolated'] as const;

export const agentView = (r: AgentRow) => ({
  uid: r.uid,
  name: r.name,
  image: r.image,
  command: r.command,
  contained: r.contained,
  enclave_id: r.enclave_id,
  group_id: r.group_id,
  org_id: r.org_id,
  status: r.status,
  policy_packs: r.policy_packs,
});

export const AGENT_VIEW = viewSchema('agentView', {
  uid: STRING,
  name: STRING,
  image: STRING,
  command: STRINGS,
  contained: BOOLEAN,
  enclave_id: STRING,
  group_id: STRING,
  org_id: STRING,
  status: STRING,
  policy_packs: STRINGS,
});
const CONTAINMENT_VIEW = viewSchema('containmentView', {
  agent: STRING,
  contained: BOOLEAN,
  nudged: BOOLEAN,
  published: BOOLEAN,
  enclave_id: STRING,
  org_id: STRING,
});
// null is absent; uid's form, the group, the enclave and the packs are checked by the handler.
const CREATE_AGENT = object(
  {
    name: TEXT,
    uid: TEXT,
    image: NULLABLE_STRING,
    command: NON_EMPTY_STRINGS,
    enclave_id: NULLABLE_STRING,
    group: NULLABLE_STRING,
    policy_packs: NON_EMPTY_STRINGS,
  },
  ['uid', 'name'],
  'createAgentReq',
);
interface CreateAgentReq {
  name: string;
  uid: string;
  image?: string | null;
  command?: string[] | null;
  enclave_id?: string | null;
  group?: string | null;
  policy_packs?: string[] | null;
}
const CONTAINMENT_REQ = object({ contained: NULLABLE_BOOLEAN }, [], 'containmentReq');
const ORG = pathParams('org');
const AGENT = pathParams('org', 'uid');

export function agentRoutes(deps: ChangeDeps, events: EventHub) {
  const { db } = deps;
  const params = (req: FastifyRequest) => req.params as { org: string; uid: string };
  const orgTarget = (req: FastifyRequest): Target => ({ kind: 'org', org: params(req).org });
  const load = async (req: FastifyRequest): Promise<AgentRow> => {
    const agent = await getAgentInOrg(db, params(req).org, params(req).uid);
    if (!agent) throw new ApiError(PROBLEMS.notFound, `no agent ${params(req).uid} in org ${params(req).org}`);
    return agent;
  };
  /** agents:manage over the agent: its org, or its group when it has one. */
  const guardAgent = async (req: FastifyRequest): Promise<AgentRow> => {
    const org = params(req).org;
    if (await holds(db, req, 'agents:manage', orgTarget(req))) return load(req);
    if (req.principal?.kind === 'agent-operator')
      throw new ApiError(PROBLEMS.forbidden, 'agent operators cannot use this route');
    const agent = await getAgentInOrg(db, org, params(req).uid);
    if (agent?.group_id && (await holds(db, req, 'agents:manage', { kind: 'group', org, group: agent.group_id })))
      return agent;
    throw new ApiError(
      PROBLEMS.forbidden,
      `requires agents:manage over ${describe(orgTarget(req))} or the agent's group`,
    );
  };
  /** The caller may manage agents somewhere in the org (org-wide, or over some group). */
  const anyAgentsManage = async (req: FastifyRequest) => {
    if (req.principal?.kind === 'agent-operator')
      throw new ApiError(PROBLEMS.forbidden, 'agent operators cannot use this route');
    if (await holds(db, req, 'agents:manage', orgTarget(req))) return;
    for (const g of await groupIdsOf(db, params(req).org))
      if (await holds(db, req, 'agents:manage', { kind: 'group', org: params(req).org, group: g })) return;
    throw new ApiError(PROBLEMS.forbidden, `requires agents:manage over ${describe(orgTarget(req))}`);
  };

  // Agents routes authorize conditionally (spec: Authentication, rule 4): over the org, or over a group.
  // The agent a route's check loaded, for its handler.
  const guarded = new WeakMap<FastifyRequest, AgentRow>();
  const anyInOrg = {
    requiredCapability: 'agents:manage',
    authorize: anyAgentsManage,
    targetLabel: 'path-org',
  } as const;
  const overAgent = {
    requiredCapability: 'agents:manage',
    targetLabel: 'path-org',
    authorize: async (req: FastifyRequest) => void guarded.set(req, await guardAgent(req)),
  } as const;

  const setState = async (
    req: FastifyRequest,
    agent: AgentRow,
    action: string,
    change: { status?: string; contained?: boolean },
  ) =>
    auditedChange(deps, req, action, agent.org_id, async (tx) => {
      const row = await setAgentState(tx, agent.uid, {
        status: change.status ?? null,
        contained: change.contained ?? null,
      });
      const published = await events.publishTo(tx, { kind: 'agent', agent: agent.uid }, 'agent.changed', {
        agent_id: agent.uid,
        org_id: agent.org_id,
        status: row.status,
        contained: row.contained,
      });
      return { result: { row, published }, resource: `agent:${agent.uid}` };
    }).finally(() => events.wake());

  return async (api: FastifyInstance) => {
    api.get(
      '/orgs/:org/agents',
      {
        config: anyInOrg,
        schema: { params: ORG, response: { 200: arrayOf(AGENT_VIEW) } },
      },
      async (req) => {
        const all = await holds(db, req, 'agents:manage', orgTarget(req));
        const rows = await listAgents(db, params(req).org);
        const visible: AgentRow[] = [];
        for (const r of rows)
          if (
            all ||
            (r.group_id && (await holds(db, req, 'agents:manage', { kind: 'group', org: r.org_id, group: r.group_id })))
          )
            visible.push(r);
        return visible.map(agentView);
      },
    );

    api.post(
      '/orgs/:org/agents',
      {
        config: anyInOrg,
        schema: { params: ORG, body: CREATE_AGENT, response: { 200: AGENT_VIEW, 201: AGENT_VIEW } },
      },
      async (req, reply) => {
        const org = params(req).org;
        const body = req.body as CreateAgentReq;
        const uid = body.uid;
        if (!UID.test(uid))
          bad('uid', 'must be 1–128 letters, digits, ".", "_" or "-", starting with a letter or digit');
        const group = body.group || '';
        // The org comes from the path; the body's group only narrows what the caller must hold.
        const target: Target = group ? { kind: 'group', org, group } : { kind: 'org', org };
        if (!(await holds(db, req, 'agents:manage', target)))
          throw new ApiError(PROBLEMS.forbidden, `requires agents:manage over ${describe(target)}`);
        const name = body.name;
        const image = body.image ?? '';
        const command = body.command ?? [];
        const packs = body.policy_packs ?? [];
        const enclave = body.enclave_id ?? '';
        if (!(await orgExists(db, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
        if (group && !(await groupExists(db, org, group))) bad('group', `no group ${group} in org ${org}`);
        if (enclave) {
          const owner = await enclaveOwner(db, enclave);
          if (owner === undefined) bad('enclave_id', `no enclave ${enclave}`);
          if (owner !== org) bad('enclave_id', `enclave ${enclave} belongs to another org`);
        }
        for (const [i, pack] of packs.entries()) {
          if (!(await packExists(db, pack))) bad(`policy_packs[${i}]`, `no pack ${pack}`);
        }
        const existing = await getAgent(db, uid);
        if (existing && existing.org_id !== org)
          throw new ApiError(PROBLEMS.conflict, `agent ${uid} belongs to another org`);
        if (
          existing?.group_id &&
          !(await holds(db, req, 'agents:manage', { kind: 'group', org, group: existing.group_id }))
        ) {
          throw new ApiError(
            PROBLEMS.forbidden,
            `agent ${uid} is in group ${existing.group_id}, which you do not manage`,
          );
        }
        if (existing && !existing.group_id && !(await holds(db, req, 'agents:manage', { kind: 'org', org }))) {
          throw new ApiError(
            PROBLEMS.forbidden,
            `agent ${uid} is in no group: updating it requires agents:manage over org ${org}`,
          );
        }
        const result = await auditedChange(deps, req, existing ? 'agent.update' : 'agent.create', org, async (tx) => {
          // The agent's packs are installed at its own scope (composed at read time with every other scope's).
          const row = await upsertAgent(
            tx,
            { uid, org, name, image, command, enclave, group, packs },
            req.principal!.subject,
          );
          if (!existing && enclave)
            await events.publish(tx, [enclave], 'agent.created', { agent_id: uid, agent_name: name, org_id: org });
          else
            await events.publishTo(tx, { kind: 'agent', agent: uid }, 'agent.changed', { agent_id: uid, org_id: org });
          if (existing?.enclave_id && existing.enclave_id !== enclave)
            await events.publish(tx, [existing.enclave_id], 'agent.changed', { agent_id: uid, org_id: org });
          return { result: row, resource: `agent:${uid}` };
        }).finally(() => events.wake());
        return reply.code(existing ? 200 : 201).send(agentView(result));
      },
    );

    api.get(
      '/orgs/:org/agents/:uid',
      {
        config: overAgent,
        schema: { params: AGENT, response: { 200: AGENT_VIEW } },
      },
      async (req) => agentView(guarded.get(req)!),
    );

    api.delete(
      '/orgs/:org/agents/:uid',
      {
        config: overAgent,
        schema: { params: AGENT, response: NO_CONTENT },
      },
      async (req, reply) => {
        const agent = guarded.get(req)!;
        await auditedChange(deps, req, 'agent.delete', agent.org_id, async (tx) => {
          if (agent.enclave_id)
            await events.publish(tx, [agent.enclave_id], 'agent.deleted', {
              agent_id: agent.uid,
              org_id: agent.org_id,
            });
          await deleteAgent(tx, agent.uid);
          return { result: null, resource: `agent:${agent.uid}` };
        }).finally(() => events.wake());
        return reply.code(204).send();
      },
    );

    // Containment: `{contained: true|false}` (default true) → containmentView.
    api.post(
      '/orgs/:org/agents/:uid/containment',
      {
        config: overAgent,
        schema: { params: AGENT, body: optionalBody(CONTAINMENT_REQ), response: { 200: CONTAINMENT_VIEW } },
      },
      async (req) => {
        const agent = guarded.get(req)!;
        const contained = (req.body as { contained?: boolean | null } | undefined)?.contained ?? true;
        const { row, published } = await setState(req, agent, contained ? 'agent.contain' : 'agent.release', {
          contained,
        });
        return {
          agent: row.uid,
          contained: row.contained,
          nudged: published,
          published,
          enclave_id: row.enclave_id,
          org_id: row.org_id,
        };
      },
    );

    // Suspend or isolate (calls refused 403 while in these states), and restore to active.
    for (const [path, status, from] of [
      ['suspend', 'suspended', null],
      ['isolate', 'isolated', null],
      ['restore', 'active', ['suspended', 'isolated']],
    ] as const) {
      api.post(
        `/orgs/:org/agents/:uid/${path}`,
        {
          config: overAgent,
          schema: { params: AGENT, body: optionalBody(object({})), response: { 200: AGENT_VIEW } },
        },
        async (req) => {
          const agent = guarded.get(req)!;
          if (from && !(from as readonly string[]).includes(agent.status))
            throw new ApiError(
              PROBLEMS.conflict,
              `agent ${agent.uid} is ${agent.status}: only a suspended or isolated agent is restored`,
            );
          const { row } = await setState(req, agent, `agent.${path}`, { status });
          return agentView(row);
        },
      );
    }
  };
}
