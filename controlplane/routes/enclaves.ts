import { createHash, randomBytes } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ISOLATION_CLASSES } from '../../pipeline/policy/snapshot.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { callerGrants } from '../authz/capabilities.ts';
import { requireCapability } from '../authz/guard.ts';
import { bad, object, text, url } from '../body.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { EventHub } from '../events.ts';
import { orgExists } from '../store/orgs.ts';
import {
  deleteEnclave, enclaveExists, enclaveNameTaken, getEnclave, insertEnclave, listEnclaves, setBrokerKeyHash, setEnclaveAddress,
  setIsolationClass, type EnclaveRow,
} from '../store/enclaves.ts';

// The enclave registry (spec: registerBrokerReq / registerBrokerView, enclaveView, addressReq,
// isoClassReq; rule 1: one owning org, a unique friendly name that never addresses anything).
// Registering mints the broker key, shown once: an opaque bearer the broker presents on /v1/broker/*;
// the store keeps its SHA-256 only. Registry changes are platform administration (platform:config);
// reading is enclaves:read (platform-wide, or over the owning org).

const ID = /^[a-z0-9][a-z0-9_-]{0,62}$/;

export const enclaveView = (r: EnclaveRow) => ({
  enclave_id: r.id, name: r.name, owning_org_id: r.owning_org_id, status: r.status, broker_url: r.broker_url, relay_url: r.relay_url,
  address_source: r.address_source, address_updated_at: r.address_updated_at ? new Date(r.address_updated_at).toISOString() : null,
});

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
  const platform = (req: FastifyRequest) => requireCapability(db, req, 'platform:config', { kind: 'platform' });

  return async (api: FastifyInstance) => {
    api.get('/enclaves', { config: { requiredCapability: 'enclaves:read', target: 'caller-org' } }, async (req) => {
      const p = req.principal!;
      if (p.kind === 'agent-operator') throw new ApiError(PROBLEMS.forbidden, 'agent operators cannot use this route');
      const held = (await callerGrants(db, p.subject, p.orgId)).grants.filter((g) => g.capability === 'enclaves:read');
      if (held.length === 0) throw new ApiError(PROBLEMS.forbidden, 'requires enclaves:read');
      const all = held.some((g) => g.scope_kind === 'platform');
      const orgs = [...new Set(held.filter((g) => g.scope_kind === 'org').map((g) => g.org_id))];
      return (await listEnclaves(db, all ? 'all' : orgs)).map(enclaveView);
    });

    api.get('/enclaves/:id', { config: { requiredCapability: 'enclaves:read' } }, async (req) => {
      const row = await getEnclave(db, idOf(req));
      await requireCapability(db, req, 'enclaves:read', row ? { kind: 'org', org: row.owning_org_id } : { kind: 'platform' });
      if (!row) throw new ApiError(PROBLEMS.notFound, `no enclave ${idOf(req)}`);
      return enclaveView(row);
    });

    api.post('/enclaves', { config: { requiredCapability: 'platform:config' } }, async (req, reply) => {
      await platform(req);
      const body = object(req.body, ['name', 'enclave_id', 'owning_org']);
      const name = text(body, 'name', true)!;
      const owningOrg = text(body, 'owning_org', true)!;
      const id = text(body, 'enclave_id', false) || `enc-${randomBytes(6).toString('hex')}`;
      if (!ID.test(id)) bad('enclave_id', 'must be 1–63 lowercase letters, digits, "-" or "_"');
      if (!(await orgExists(db, owningOrg))) bad('owning_org', `no org ${owningOrg}`);
      if (await enclaveNameTaken(db, name)) throw new ApiError(PROBLEMS.conflict, `an enclave is already named ${name}`);
      if (await enclaveExists(db, id)) throw new ApiError(PROBLEMS.conflict, `enclave ${id} exists`);
      const minted = mintBrokerKey(id);
      await auditedChange(deps, req, 'enclave.register', owningOrg, async (tx) => {
        await insertEnclave(tx, { id, name, owningOrg, brokerKeyHash: hashBrokerKey(minted.token) }, req.principal!.subject);
        return { result: null, resource: `enclave:${id}` };
      });
      return reply.code(201).send({ enclave_id: id, subject: `enclave:${id}`, key: minted.key });
    });

    // A new broker key (the old one stops working at once), shown once.
    api.post('/enclaves/:id/broker-key', { config: { requiredCapability: 'platform:config' } }, async (req, reply) => {
      await platform(req);
      const e = await load(idOf(req));
      const minted = mintBrokerKey(e.id);
      await auditedChange(deps, req, 'enclave.broker-key.rotate', e.owning_org_id, async (tx) => {
        await setBrokerKeyHash(tx, e.id, hashBrokerKey(minted.token));
        return { result: null, resource: `enclave:${e.id}` };
      });
      return reply.code(201).send({ enclave_id: e.id, subject: `enclave:${e.id}`, key: minted.key });
    });

    api.put('/enclaves/:id/address', { config: { requiredCapability: 'platform:config' } }, async (req) => {
      await platform(req);
      const e = await load(idOf(req));
      const body = object(req.body, ['broker_url', 'relay_url']);
      const broker = url(body, 'broker_url', false);
      const relay = url(body, 'relay_url', false);
      return setAddress(deps, req, e, broker, relay, 'operator');
    });

    api.put('/enclaves/:id/isolation-class', { config: { requiredCapability: 'platform:config' } }, async (req) => {
      await platform(req);
      const e = await load(idOf(req));
      const iso = text(object(req.body, ['isolationClass']), 'isolationClass', true)!;
      if (!(ISOLATION_CLASSES as readonly string[]).includes(iso)) bad('isolationClass', `must be one of ${ISOLATION_CLASSES.join(', ')}`);
      return auditedChange(deps, req, 'enclave.isolation-class', e.owning_org_id, async (tx) => {
        await setIsolationClass(tx, e.id, iso);
        await events.publish(tx, [e.id], 'enclave.changed', { enclave_id: e.id, isolation_class: iso });
        return { result: { isolationClass: iso }, resource: `enclave:${e.id}` };
      }).finally(() => events.wake());
    });

    api.delete('/enclaves/:id', { config: { requiredCapability: 'platform:config' } }, async (req, reply) => {
      await platform(req);
      const e = await load(idOf(req));
      await auditedChange(deps, req, 'enclave.delete', e.owning_org_id, async (tx) => {
        await deleteEnclave(tx, e.id);
        return { result: null, resource: `enclave:${e.id}` };
      });
      return reply.code(204).send();
    });
  };
}

/** Records an enclave's addresses (by an operator or by its own broker). */
export async function setAddress(deps: ChangeDeps, req: FastifyRequest, e: EnclaveRow, broker: string | undefined, relay: string | undefined, source: string) {
  return auditedChange(deps, req, 'enclave.address', e.owning_org_id, async (tx) => {
    const row = await setEnclaveAddress(tx, e.id, { broker: broker ?? null, relay: relay ?? null, source });
    return { result: enclaveView(row), resource: `enclave:${e.id}` };
  });
}
