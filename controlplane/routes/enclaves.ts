import { createHash, randomBytes } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ISOLATION_CLASSES } from '../../pipeline/policy/snapshot.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { callerGrants } from '../authz/capabilities.ts';
import { targetResolver } from '../authz/capability-hook.ts';
import { PLATFORM } from '../authz/targets.ts';
import { bad, httpsUrl } from '../bad-request.ts';
import {
  ANY,
  arrayOf,
  NO_CONTENT,
  NULLABLE_STRING,
  object,
  pathParams,
  STRING,
  TEXT,
  viewSchema,
} from '../../core/schemas.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { EventHub } from '../events.ts';
import { orgExists } from '../store/orgs.ts';
import {
  deleteEnclave,
  enclaveExists,
  enclaveNameTaken,
  enclaveOwner,
  getEnclave,
  insertEnclave,
  listEnclaves,
  setBrokerKeyHash,
  setEnclaveAddress,
  setIsolationClass,
  type EnclaveRow,
} from '../store/enclaves.ts';

// The enclave registry (spec: registerBrokerReq / registerBrokerView, enclaveView, addressReq,
// isoClassReq; rule 1: one owning org, a unique friendly name that never addresses anything).
// Registering mints the broker key, shown once: an opaque bearer the broker presents on /v1/broker/*;
// the store keeps its SHA-256 only. Registry changes are platform administration (platform:config);
// reading is enclaves:read (platform-wide, or over the owning org).

const ID = /^[a-z0-9][a-z0-9_-]{0,62}$/;

export const enclaveView = (r: EnclaveRow) => ({
  enclave_id: r.id,
  name: r.name,
  owning_org_id: r.owning_org_id,
  status: r.status,
  broker_url: r.broker_url,
  relay_url: r.relay_url,
  address_source: r.address_source,
  address_updated_at: r.address_updated_at ? new Date(r.address_updated_at).toISOString() : null,
});

export const ENCLAVE_VIEW = viewSchema('enclaveView', {
  enclave_id: STRING,
  name: STRING,
  owning_org_id: STRING,
  status: STRING,
  broker_url: STRING,
  relay_url: STRING,
  address_source: STRING,
  address_updated_at: NULLABLE_STRING,
});
const REGISTER_VIEW = viewSchema('registerBrokerView', { enclave_id: STRING, subject: STRING, key: ANY });
// null is absent; the id's form, the org, the URLs and the class are checked by the handler.
const REGISTER_REQ = object(
  { name: TEXT, enclave_id: NULLABLE_STRING, owning_org: TEXT },
  ['name', 'owning_org'],
  'registerBrokerReq',
);
export const ADDRESS_REQ = object({ broker_url: NULLABLE_STRING, relay_url: NULLABLE_STRING }, [], 'addressReq');
export interface AddressReq {
  broker_url?: string | null;
  relay_url?: string | null;
}
const ISO_CLASS_REQ = object({ isolationClass: TEXT }, ['isolationClass'], 'isoClassReq');
const ISO_CLASS_VIEW = viewSchema('isoClassView', { isolationClass: STRING });
const ID_PARAM = pathParams('id');
const platformConfig = { requiredCapability: 'platform:config', capabilityTarget: PLATFORM } as const;

export const hashBrokerKey = (token: string) => createHash('sha256').update(token).digest('hex');

function mintBrokerKey(enclave: string) {
  const token = `dvxb_${randomBytes(32).toString('base64url')}`;
  return { token, key: { type: 'broker_key', enclave_id: enclave, token } };
}

export function enclaveRoutes(deps: ChangeDeps, events: EventHub) {
  const { db } = deps;
  const idOf = (req: FastifyRequest) => (req.params as { id: string }).id;
  const load = async (id: string): Promise<EnclaveRow> => {
    const e = await getEnclave(db, id);
    if (!e) throw new ApiError(PROBLEMS.notFound, `no enclave ${id}`);
    return e;
  };
  /** An enclave is read over its owning org; one that does not exist over the platform (its 404 for admins only). */
  const enclaveOrg = targetResolver('enclave-org', async (req) => {
    const org = await enclaveOwner(db, idOf(req));
    return org !== undefined ? { kind: 'org', org } : { kind: 'platform' };
  });

  return async (api: FastifyInstance) => {
    api.get(
      '/enclaves',
      {
        config: {
          requiredCapability: 'enclaves:read',
          targetLabel: 'caller-org',
          authorizedInHandler: 'the list is of the enclaves the caller reads',
        },
        schema: { response: { 200: arrayOf(ENCLAVE_VIEW) } },
      },
      async (req) => {
        const p = req.principal!;
        if (p.kind === 'agent-operator')
          throw new ApiError(PROBLEMS.forbidden, 'agent operators cannot use this route');
        const held = (await callerGrants(db, p.subject, p.orgId)).grants.filter(
          (g) => g.capability === 'enclaves:read',
        );
        if (held.length === 0) throw new ApiError(PROBLEMS.forbidden, 'requires enclaves:read');
        const all = held.some((g) => g.scope_kind === 'platform');
        const orgs = [...new Set(held.filter((g) => g.scope_kind === 'org').map((g) => g.org_id))];
        return (await listEnclaves(db, all ? 'all' : orgs)).map(enclaveView);
      },
    );

    api.get(
      '/enclaves/:id',
      {
        config: { requiredCapability: 'enclaves:read', capabilityTarget: enclaveOrg },
        schema: { params: ID_PARAM, response: { 200: ENCLAVE_VIEW } },
      },
      async (req) => {
        const row = await getEnclave(db, idOf(req));
        if (!row) throw new ApiError(PROBLEMS.notFound, `no enclave ${idOf(req)}`);
        return enclaveView(row);
      },
    );

    api.post(
      '/enclaves',
      {
        config: platformConfig,
        schema: { body: REGISTER_REQ, response: { 201: REGISTER_VIEW } },
      },
      async (req, reply) => {
        const body = req.body as { name: string; owning_org: string; enclave_id?: string | null };
        const name = body.name;
        const owningOrg = body.owning_org;
        const id = body.enclave_id || `enc-${randomBytes(6).toString('hex')}`;
        if (!ID.test(id)) bad('enclave_id', 'must be 1–63 lowercase letters, digits, "-" or "_"');
        if (!(await orgExists(db, owningOrg))) bad('owning_org', `no org ${owningOrg}`);
        if (await enclaveNameTaken(db, name))
          throw new ApiError(PROBLEMS.conflict, `an enclave is already named ${name}`);
        if (await enclaveExists(db, id)) throw new ApiError(PROBLEMS.conflict, `enclave ${id} exists`);
        const minted = mintBrokerKey(id);
        await auditedChange(deps, req, 'enclave.register', owningOrg, async (tx) => {
          await insertEnclave(
            tx,
            { id, name, owningOrg, brokerKeyHash: hashBrokerKey(minted.token) },
            req.principal!.subject,
          );
          return { result: null, resource: `enclave:${id}` };
        });
        return reply.code(201).send({ enclave_id: id, subject: `enclave:${id}`, key: minted.key });
      },
    );

    // A new broker key (the old one stops working at once), shown once.
    api.post(
      '/enclaves/:id/broker-key',
      {
        config: platformConfig,
        schema: { params: ID_PARAM, response: { 201: REGISTER_VIEW } },
      },
      async (req, reply) => {
        const e = await load(idOf(req));
        const minted = mintBrokerKey(e.id);
        await auditedChange(deps, req, 'enclave.broker-key.rotate', e.owning_org_id, async (tx) => {
          await setBrokerKeyHash(tx, e.id, hashBrokerKey(minted.token));
          return { result: null, resource: `enclave:${e.id}` };
        });
        return reply.code(201).send({ enclave_id: e.id, subject: `enclave:${e.id}`, key: minted.key });
      },
    );

    api.put(
      '/enclaves/:id/address',
      {
        config: platformConfig,
        schema: { params: ID_PARAM, body: ADDRESS_REQ, response: { 200: ENCLAVE_VIEW } },
      },
      async (req) => {
        const e = await load(idOf(req));
        const body = req.body as AddressReq;
        const broker = httpsUrl('broker_url', body.broker_url);
        const relay = httpsUrl('relay_url', body.relay_url);
        return setAddress(deps, req, e, broker, relay, 'operator');
      },
    );

    api.put(
      '/enclaves/:id/isolation-class',
      {
        config: platformConfig,
        schema: { params: ID_PARAM, body: ISO_CLASS_REQ, response: { 200: ISO_CLASS_VIEW } },
      },
      async (req) => {
        const e = await load(idOf(req));
        const iso = (req.body as { isolationClass: string }).isolationClass;
        if (!(ISOLATION_CLASSES as readonly string[]).includes(iso))
          bad('isolationClass', `must be one of ${ISOLATION_CLASSES.join(', ')}`);
        return auditedChange(deps, req, 'enclave.isolation-class', e.owning_org_id, async (tx) => {
          await setIsolationClass(tx, e.id, iso);
          await events.publish(tx, [e.id], 'enclave.changed', { enclave_id: e.id, isolation_class: iso });
          return { result: { isolationClass: iso }, resource: `enclave:${e.id}` };
        }).finally(() => events.wake());
      },
    );

    api.delete(
      '/enclaves/:id',
      {
        config: platformConfig,
        schema: { params: ID_PARAM, response: NO_CONTENT },
      },
      async (req, reply) => {
        const e = await load(idOf(req));
        await auditedChange(deps, req, 'enclave.delete', e.owning_org_id, async (tx) => {
          await deleteEnclave(tx, e.id);
          return { result: null, resource: `enclave:${e.id}` };
        });
        return reply.code(204).send();
      },
    );
  };
}

/** Records an enclave's addresses (by an operator or by its own broker). */
export async function setAddress(
  deps: ChangeDeps,
  req: FastifyRequest,
  e: EnclaveRow,
  broker: string | undefined,
  relay: string | undefined,
  source: string,
) {
  return auditedChange(deps, req, 'enclave.address', e.owning_org_id, async (tx) => {
    const row = await setEnclaveAddress(tx, e.id, { broker: broker ?? null, relay: relay ?? null, source });
    return { result: enclaveView(row), resource: `enclave:${e.id}` };
  });
}
