import type { FastifyInstance, FastifyRequest } from 'fastify';
import { exportJWK, generateKeyPair, type JWK } from 'jose';
import { newId } from '../../core/ids.ts';
import { auditedChange, type ChangeActor, type ChangeDeps } from '../audited-change.ts';
import type { ServiceAccountStatus } from '../auth/service-account-status.ts';
import { builtInRole, CAPABILITIES, groupsOf, type Capability, type ScopeKind } from '../authz/capabilities.ts';
import type { GrantRow } from '../store/grants.ts';
import { describe, holds, requireCapability, type Target } from '../authz/guard.ts';
import { conferredBy, requireConferrable, requireHoldsAllOf } from '../authz/confer.ts';
import { bad } from '../bad-request.ts';
import { PATH_ORG } from '../authz/targets.ts';
import {
  ANY,
  arrayOf,
  INTEGER,
  NO_CONTENT,
  NON_EMPTY_STRINGS,
  NULLABLE_STRING,
  object,
  optionalBody,
  pathParams,
  STRING,
  TEXT,
  viewSchema,
} from '../../core/schemas.ts';
import { ApiError, IdpError, PROBLEMS } from '../errors.ts';
import { serviceAccountMetadata, type IdpProvisioner, type Registration } from '../idp/provisioner.ts';
import type { ServiceAccountKey } from '../idp/service-account-key.ts';
import { dropIntent, recordIntent, recordRegistration, settleIntent, undoIdpStep } from '../idp/pending-undo.ts';
import type { Queryable } from '../../core/sql.ts';
import { orgExists as orgStored } from '../store/orgs.ts';
import { customRoleExists } from '../store/roles.ts';
import { addMemberOnce, addMembership, memberExists } from '../store/members.ts';
import { deleteGrantOf, grantCapabilityOnce, grantsToInOrg, insertGrant } from '../store/grants.ts';
import {
  addServiceAccountKey,
  deleteServiceAccountKey,
  disableServiceAccount,
  getServiceAccount,
  insertServiceAccount,
  listServiceAccounts,
  serviceAccountKeys,
  setServiceAccountOwner,
  type AccountRow,
} from '../store/service-accounts.ts';

// Service accounts of an org (spec: "Service accounts"), provisioned at the OIDC identity provider so
// their tokens come from the issuer the control plane already trusts. Two ways in:
//   - org-created (clients:manage over the org), level "org";
//   - self-service by a member of the org, level "self-service", owned by that member, with groups the
//     member belongs to and capability grants the member holds over the same target (never more).
// The account's key (a private JWK) is returned once, at creation or when a key is added, and never
// again: the store keeps only public keys. Disabling removes the client at the IdP and refuses the
// account's still-valid tokens. Every change is audited; an IdP step that succeeded is undone when the
// change that follows it fails, so nothing is left half-done. The undo is persisted before the IdP is
// called and settled in the store change's own transaction, so a crash at any point leaves it behind;
// an undo that fails or is left by a crash is logged, counted, audited and retried (idp/pending-undo.ts).

const view = (r: AccountRow) => ({
  id: r.id,
  owner: r.owner,
  level: r.level,
  status: r.status,
  org_id: r.org_id,
  created_at: new Date(r.created_at).toISOString(),
});
const registration = (r: AccountRow): Registration => ({
  client_id: r.id,
  registration_client_uri: r.registration_client_uri,
  registration_access_token: r.registration_access_token,
});

const grantView = (r: GrantRow) => ({
  id: Number(r.id),
  role: r.role,
  capability: r.capability,
  scope_kind: r.scope_kind,
  org_id: r.org_id,
  group_id: r.group_id,
  agent_id: r.agent_id,
});

async function newKey(): Promise<{ kid: string; publicJwk: JWK; privateJwk: JWK }> {
  const { publicKey, privateKey } = await generateKeyPair('ES256', { extractable: true });
  const kid = newId();
  return {
    kid,
    publicJwk: { ...(await exportJWK(publicKey)), kid, alg: 'ES256', use: 'sig' },
    privateJwk: { ...(await exportJWK(privateKey)), kid, alg: 'ES256' },
  };
}

function capabilityOf(body: GrantFields): Capability | null {
  const c = body.capability;
  if (c === undefined || c === null || c === '') return null;
  if (!(CAPABILITIES as readonly string[]).includes(c))
    bad('capability', `unknown capability (one of ${CAPABILITIES.join(', ')})`);
  return c as Capability;
}

/** The scope a grant of a service account narrows to, within the path's org. */
function grantTarget(org: string, body: GrantFields, field: string): Target {
  const group = body.group || undefined;
  const agent = body.agent || undefined;
  if (group && agent) bad(`${field}agent`, 'a grant is narrowed to a group or an agent, not both');
  return group ? { kind: 'group', org, group } : agent ? { kind: 'agent', org, agent } : { kind: 'org', org };
}

const scopeOf = (t: Target) => ({
  scope_kind: t.kind as ScopeKind,
  group_id: t.kind === 'group' ? t.group : '',
  agent_id: t.kind === 'agent' ? t.agent : '',
});

const ACCOUNT_FIELDS = { id: STRING, owner: STRING, level: STRING, status: STRING, org_id: STRING, created_at: STRING };
const ACCOUNT_VIEW = viewSchema('serviceAccountView', ACCOUNT_FIELDS);
const CREDENTIAL_VIEW = viewSchema('serviceAccountCredentialView', {
  ...ACCOUNT_FIELDS,
  credential: ANY,
});
const KEY_VIEW = viewSchema('serviceAccountKeyView', { id: STRING, credential: ANY });
const SA_GRANT_VIEW = viewSchema('serviceAccountGrantView', {
  id: INTEGER,
  role: NULLABLE_STRING,
  capability: NULLABLE_STRING,
  scope_kind: STRING,
  org_id: STRING,
  group_id: STRING,
  agent_id: STRING,
});
// null (and for grant fields an empty string) is absent; what they name is checked by the handler.
const CREATE_REQ = object({ name: TEXT }, ['name'], 'createServiceAccountReq');
const SELF_GRANT_REQ = object(
  { capability: NULLABLE_STRING, agent: NULLABLE_STRING, group: NULLABLE_STRING },
  [],
  'selfServiceGrantReq',
);
const SELF_SERVICE_REQ = object(
  { name: TEXT, groups: NON_EMPTY_STRINGS, grants: { type: ['array', 'null'], items: SELF_GRANT_REQ } },
  ['name'],
  'createSelfServiceSAReq',
);
const GRANT_REQ = object(
  { role: NULLABLE_STRING, capability: NULLABLE_STRING, agent: NULLABLE_STRING, group: NULLABLE_STRING },
  [],
  'createServiceAccountGrantReq',
);
const TRANSFER_REQ = object({ owner: TEXT }, ['owner'], 'transferServiceAccountReq');
type GrantFields = Partial<Record<'role' | 'capability' | 'agent' | 'group', string | null>>;
const NO_FIELDS = optionalBody(object({}));
const ORG = pathParams('org');
const ACCOUNT = pathParams('org', 'id');
const clientsManage = { requiredCapability: 'clients:manage', capabilityTarget: PATH_ORG } as const;

const actorOf = (req: FastifyRequest): ChangeActor => ({
  subject: req.principal!.subject,
  kind: req.principal!.kind,
  traceId: String(req.id),
});

export function serviceAccountRoutes(
  deps: ChangeDeps,
  idp: IdpProvisioner,
  status: ServiceAccountStatus,
  undoGraceMs: number,
) {
  const { db } = deps;
  const params = (req: FastifyRequest) => req.params as { org: string; id: string; key: string; grant: string };
  const orgTarget = (req: FastifyRequest): Target => ({ kind: 'org', org: params(req).org });

  const load = async (req: FastifyRequest): Promise<AccountRow> => {
    const { org, id } = params(req);
    const account = await getServiceAccount(db, org, id);
    if (!account) throw new ApiError(PROBLEMS.notFound, `no service account ${id} in org ${org}`);
    return account;
  };
  /** clients:manage over the org, or the account's owner (a member of the org acting as themself). */
  const requireManagerOrOwner = async (req: FastifyRequest, account: AccountRow) => {
    const p = req.principal!;
    const owner = p.kind !== 'agent-operator' && p.subject === account.owner && p.orgId === account.org_id;
    if (!owner) await requireCapability(db, req, 'clients:manage', orgTarget(req));
  };
  /** The account, for its manager or owner; a caller who is neither learns nothing of whether it exists. */
  const loadManaged = async (req: FastifyRequest): Promise<AccountRow> => {
    let account: AccountRow;
    try {
      account = await load(req);
    } catch (err) {
      await requireCapability(db, req, 'clients:manage', orgTarget(req));
      throw err;
    }
    await requireManagerOrOwner(req, account);
    return account;
  };
  // Routes over one account authorize its manager or its owner (loadManaged); the account, for the handler.
  const managed = new WeakMap<FastifyRequest, AccountRow>();
  const managerOrOwner = {
    requiredCapability: 'clients:manage',
    targetLabel: 'path-org',
    authorize: async (req: FastifyRequest) => void managed.set(req, await loadManaged(req)),
  } as const;
  const orgExists = async (org: string) => {
    if (!(await orgStored(db, org))) throw new ApiError(PROBLEMS.notFound, `no org ${org}`);
  };
  const idpStep = async <T>(step: () => Promise<T>): Promise<T> => {
    try {
      return await step();
    } catch (err) {
      if (err instanceof IdpError) throw new ApiError(PROBLEMS.idpUnavailable, err.message);
      throw err;
    }
  };
  const keyFile = (clientId: string, key: { kid: string; privateJwk: JWK }): ServiceAccountKey => ({
    type: 'service_account_key',
    issuer: idp.issuer,
    client_id: clientId,
    key_id: key.kid,
    key: key.privateJwk,
  });

  /**
   * Registers the account at the IdP, then stores it (with its key, groups and grants) in one audited
   * transaction; if that fails, the IdP client is removed again. The undo is on record before the
   * registration and is settled by the transaction that stores the account.
   */
  async function create(
    req: FastifyRequest,
    org: string,
    name: string,
    level: 'org' | 'self-service',
    extra: (tx: Queryable, id: string) => Promise<void>,
  ) {
    const key = await newKey();
    const intent = await recordIntent(deps, undoGraceMs, 'remove', org, name, null);
    let reg: Registration;
    try {
      reg = await idpStep(() => idp.register(serviceAccountMetadata(name, org, [key.publicJwk])));
    } catch (err) {
      await dropIntent(deps, intent);
      throw err;
    }
    const pending = await recordRegistration(deps, idp, intent, reg);
    try {
      const row = await auditedChange(deps, req, 'service-account.create', org, async (tx) => {
        const account = await insertServiceAccount(tx, { org, name, owner: req.principal!.subject, level }, reg);
        await addServiceAccountKey(tx, reg.client_id, key.kid, key.publicJwk);
        await extra(tx, reg.client_id);
        await settleIntent(tx, pending);
        return { result: account, resource: `service-account:${reg.client_id}` };
      });
      return { ...view(row), credential: keyFile(reg.client_id, key) };
    } catch (err) {
      await undoIdpStep(deps, idp, actorOf(req), pending, err);
      throw err;
    }
  }

  /** Replaces the account's key set at the IdP around a store change; the IdP is put back if it fails. */
  async function changeKeys(
    req: FastifyRequest,
    account: AccountRow,
    next: JWK[],
    action: string,
    store: (tx: Queryable) => Promise<void>,
  ) {
    const intent = await recordIntent(deps, undoGraceMs, 'update', account.org_id, account.name, registration(account));
    try {
      await idpStep(() =>
        idp.update(registration(account), serviceAccountMetadata(account.name, account.org_id, next)),
      );
    } catch (err) {
      await dropIntent(deps, intent);
      throw err;
    }
    try {
      await auditedChange(deps, req, action, account.org_id, async (tx) => {
        await store(tx);
        await settleIntent(tx, intent);
        return { result: null, resource: `service-account:${account.id}` };
      });
    } catch (err) {
      // The IdP is put back to the keys the store holds (`before`, unchanged by the failed change).
      await undoIdpStep(deps, idp, actorOf(req), intent, err);
      throw err;
    }
  }

  return async (api: FastifyInstance) => {
    api.get(
      '/orgs/:org/service-accounts',
      {
        config: clientsManage,
        schema: { params: ORG, response: { 200: arrayOf(ACCOUNT_VIEW) } },
      },
      async (req) => {
        await orgExists(params(req).org);
        return (await listServiceAccounts(db, params(req).org)).map(view);
      },
    );

    api.post(
      '/orgs/:org/service-accounts',
      {
        config: clientsManage,
        schema: { params: ORG, body: CREATE_REQ, response: { 201: CREDENTIAL_VIEW } },
      },
      async (req, reply) => {
        const { name } = req.body as { name: string };
        const { org } = params(req);
        await orgExists(org);
        return reply.code(201).send(await create(req, org, name, 'org', async () => {}));
      },
    );

    // Self-service: any member of the org (token org = path org), for themself; what the account may do
    // is bounded by what the member may do.
    // Any token of the org may create one (it confers only what its caller holds, checked per grant below).
    const memberOfOrg = async (req: FastifyRequest) => {
      const p = req.principal!;
      const { org } = params(req);
      if (p.kind === 'agent-operator')
        throw new ApiError(PROBLEMS.forbidden, 'agent operators cannot create service accounts');
      if (p.orgId !== org)
        throw new ApiError(PROBLEMS.forbidden, `only members of org ${org} create self-service accounts in it`);
    };
    api.post(
      '/orgs/:org/service-accounts/self-service',
      {
        config: { requiredCapability: null, authorize: memberOfOrg, targetLabel: 'path-org' },
        schema: { params: ORG, body: SELF_SERVICE_REQ, response: { 201: CREDENTIAL_VIEW } },
      },
      async (req, reply) => {
        const p = req.principal!;
        const { org } = params(req);
        const body = req.body as { name: string; groups?: string[] | null; grants?: GrantFields[] | null };
        const { name } = body;
        const groups = body.groups ?? [];
        const mine = new Set(await groupsOf(db, org, p.subject));
        groups.forEach((g, i) => {
          if (!mine.has(g)) bad(`groups[${i}]`, `you are not a member of group ${g}`);
        });
        const rawGrants = body.grants ?? [];
        const grants: { capability: Capability; target: Target }[] = [];
        for (const [i, raw] of rawGrants.entries()) {
          const g = raw;
          const capability = capabilityOf(g);
          if (!capability) bad(`grants[${i}].capability`, 'is required');
          const target = grantTarget(org, g, `grants[${i}].`);
          if (!(await holds(db, req, capability, target)))
            throw new ApiError(
              PROBLEMS.forbidden,
              `grants[${i}]: you do not hold ${capability} over ${describe(target)}, so you cannot pass it on`,
            );
          grants.push({ capability, target });
        }
        await orgExists(org);
        return reply.code(201).send(
          await create(req, org, name, 'self-service', async (tx, id) => {
            if (groups.length > 0) {
              await addMemberOnce(tx, org, id, name, p.subject);
              for (const g of new Set(groups)) await addMembership(tx, org, g, id);
            }
            for (const g of grants) {
              const s = scopeOf(g.target);
              await grantCapabilityOnce(
                tx,
                { principal: `user:${id}`, capability: g.capability, org_id: org, ...s },
                p.subject,
              );
            }
          }),
        );
      },
    );

    api.get(
      '/orgs/:org/service-accounts/:id',
      {
        config: managerOrOwner,
        schema: { params: ACCOUNT, response: { 200: ACCOUNT_VIEW } },
      },
      async (req) => {
        const account = managed.get(req)!;
        return view(account);
      },
    );

    api.post(
      '/orgs/:org/service-accounts/:id/keys',
      {
        config: managerOrOwner,
        schema: { params: ACCOUNT, body: NO_FIELDS, response: { 201: KEY_VIEW } },
      },
      async (req, reply) => {
        const account = managed.get(req)!;
        if (account.status !== 'active')
          throw new ApiError(PROBLEMS.conflict, `service account ${account.id} is ${account.status}`);
        await requireHoldsAllOf(db, req, account.id, account.org_id, `a key of service account ${account.id}`);
        const key = await newKey();
        const rows = await serviceAccountKeys(db, account.id);
        await changeKeys(
          req,
          account,
          [...rows.map((r) => JSON.parse(r.public_jwk) as JWK), key.publicJwk],
          'service-account.key.create',
          async (tx) => {
            await addServiceAccountKey(tx, account.id, key.kid, key.publicJwk);
          },
        );
        return reply.code(201).send({ id: key.kid, credential: keyFile(account.id, key) });
      },
    );

    api.delete(
      '/orgs/:org/service-accounts/:id/keys/:key',
      {
        config: managerOrOwner,
        schema: { params: pathParams('org', 'id', 'key'), response: NO_CONTENT },
      },
      async (req, reply) => {
        const account = managed.get(req)!;
        const rows = await serviceAccountKeys(db, account.id);
        const kid = params(req).key;
        if (!rows.some((r) => r.key_id === kid))
          throw new ApiError(PROBLEMS.notFound, `service account ${account.id} has no key ${kid}`);
        const rest = rows.filter((r) => r.key_id !== kid).map((r) => JSON.parse(r.public_jwk) as JWK);
        const store = (tx: Queryable) => deleteServiceAccountKey(tx, account.id, kid);
        if (account.status === 'active') await changeKeys(req, account, rest, 'service-account.key.delete', store);
        else
          await auditedChange(deps, req, 'service-account.key.delete', account.org_id, async (tx) => ({
            result: await store(tx),
            resource: `service-account:${account.id}`,
          }));
        return reply.code(204).send();
      },
    );

    api.post(
      '/orgs/:org/service-accounts/:id/transfer',
      {
        config: clientsManage,
        schema: { params: ACCOUNT, body: TRANSFER_REQ, response: { 200: ACCOUNT_VIEW } },
      },
      async (req) => {
        const account = await load(req);
        const { owner } = req.body as { owner: string };
        if (!(await memberExists(db, account.org_id, owner)))
          bad('owner', `${owner} is not a member of org ${account.org_id}`);
        if (owner === account.id) bad('owner', 'a service account cannot own itself');
        await requireHoldsAllOf(db, req, account.id, account.org_id, `ownership of service account ${account.id}`);
        return auditedChange(deps, req, 'service-account.transfer', account.org_id, async (tx) => {
          return {
            result: view(await setServiceAccountOwner(tx, account.id, owner)),
            resource: `service-account:${account.id}`,
          };
        });
      },
    );

    // Disabling: the client is removed at the IdP first (no new tokens), then the account is marked
    // disabled, which also refuses the tokens it still holds. Disabling twice is harmless.
    api.post(
      '/orgs/:org/service-accounts/:id/disable',
      {
        config: managerOrOwner,
        schema: { params: ACCOUNT, body: NO_FIELDS, response: { 200: ACCOUNT_VIEW } },
      },
      async (req) => {
        const account = managed.get(req)!;
        await idpStep(() => idp.remove(registration(account)));
        const out = await auditedChange(deps, req, 'service-account.disable', account.org_id, async (tx) => {
          return {
            result: view(await disableServiceAccount(tx, account.id)),
            resource: `service-account:${account.id}`,
          };
        });
        status.invalidate(account.id);
        return out;
      },
    );

    api.get(
      '/orgs/:org/service-accounts/:id/grants',
      {
        config: clientsManage,
        schema: { params: ACCOUNT, response: { 200: arrayOf(SA_GRANT_VIEW) } },
      },
      async (req) => {
        const account = await load(req);
        return (await grantsToInOrg(db, `user:${account.id}`, account.org_id)).map(grantView);
      },
    );

    api.post(
      '/orgs/:org/service-accounts/:id/grants',
      {
        config: clientsManage,
        schema: { params: ACCOUNT, body: GRANT_REQ, response: { 201: SA_GRANT_VIEW } },
      },
      async (req, reply) => {
        const account = await load(req);
        const body = req.body as GrantFields;
        const role = body.role || null;
        const capability = capabilityOf(body);
        if ((role === null) === (capability === null)) bad('role', 'exactly one of role and capability is required');
        if (role === 'platform-admin') bad('role', 'platform-admin is granted at platform scope only');
        if (role !== null && !builtInRole(role) && !(await customRoleExists(db, role)))
          bad('role', `unknown role "${role}"`);
        const target = grantTarget(account.org_id, body, '');
        await requireConferrable(db, req, await conferredBy(db, role, capability), target, 'this grant');
        const s = scopeOf(target);
        const created = await auditedChange(deps, req, 'service-account.grant.create', account.org_id, async (tx) => {
          const row = await insertGrant(
            tx,
            { principal: `user:${account.id}`, role, capability, org_id: account.org_id, ...s },
            req.principal!.subject,
          );
          return { result: grantView(row), resource: `grant:${row.id}` };
        });
        return reply.code(201).send(created);
      },
    );

    api.delete(
      '/orgs/:org/service-accounts/:id/grants/:grant',
      {
        config: clientsManage,
        schema: { params: pathParams('org', 'id', 'grant'), response: NO_CONTENT },
      },
      async (req, reply) => {
        const account = await load(req);
        const id = params(req).grant;
        if (!/^\d{1,18}$/.test(id)) throw new ApiError(PROBLEMS.notFound, `no grant ${id}`);
        await auditedChange(deps, req, 'service-account.grant.delete', account.org_id, async (tx) => {
          if (!(await deleteGrantOf(tx, `user:${account.id}`, account.org_id, id)))
            throw new ApiError(PROBLEMS.notFound, `service account ${account.id} has no grant ${id}`);
          return { result: null, resource: `grant:${id}` };
        });
        return reply.code(204).send();
      },
    );
  };
}
