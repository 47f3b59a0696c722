import { createHash, randomBytes } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ISOLATION_CLASSES } from '../../pipeline/policy/snapshot.ts';
import { auditedChange, type ChangeDeps } from '../audited-change.ts';
import { callerGrants } from '../authz/capabilities.ts';
import { targetResolver } from '../authz/capability-hook.ts';
import { PLATFORM } from '../authz/targets.ts';
import { bad, httpsUrl } from '../bad-request.ts';
import { ANY, arrayOf, NO_CONTENT, NULLABLE_STRING, object, pathParams, STRING, TEXT, viewSchema } from './schemas.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { EventHub } from '../events.ts';

// The enclave registry (spec: registerBrokerReq / registerBrokerView, enclaveView, addressReq,
// isoClassReq; rule 1: one owning org, a unique friendly name that never addresses anything).
// Registering mints the broker key, shown once: an opaque bearer the broker presents on /v1/broker/*;
// the store keeps its SHA-256 only. Registry changes are platform administration (platform:config);
// reading is enclaves:read (platform-wide, or over the owning org).

export interface EnclaveRow {
  id: string; name: string; owning_org_id: string; status: string; isolation_class: string;
  broker_url: string; relay_url: string; address_source: string; address_updated_at: Date | string | null;
}

const COLUMNS = 'id, name, owning_org_id, status, isolation_class, broker_url, relay_url, address_source, address_updated_at';
const ID = /^[a-z0-9][a-z0-9_-]{0,62}$/;

export const enclaveView = (r: EnclaveRow) => ({
  enclave_id: r.id, name: r.name, owning_org_id: r.owning_org_id, status: r.status, broker_url: r.broker_url, relay_url: r.relay_url,
  address_source: r.address_source, address_updated_at: r.address_updated_at ? new Date(r.address_updated_at).toISOString() : null,
});

export const ENCLAVE_VIEW = viewSchema('enclaveView', {
  enclave_id: STRING, name: STRING, owning_org_id: STRING, status: STRING, broker_url: STRING, relay_url: STRING,
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
export interface AddressReq { broker_url?: string | null; relay_url?: string | null }
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
    const { rows } = await db.query<EnclaveRow>(`SELECT ${COLUMNS} FROM enclaves WHERE id = $1`, [id]);
    if (rows.length === 0) throw new ApiError(PROBLEMS.notFound, `no enclave ${id}`);
    return rows[0];
  };
  /** An enclave is read over its owning org; one that does not exist over the platform (its 404 for admins only). */
  const enclaveOwner = targetResolver('enclave-org', async (req) => {
    const { rows } = await db.query<{ owning_org_id: string }>(
      'SELECT owning_org_id FROM enclaves WHERE id = $1', [idOf(req)],
    );
    return rows[0] ? { kind: 'org', org: rows[0].owning_org_id } : { kind: 'platform' };
  });

  return async (api: FastifyInstance) => {
    api.get('/enclaves', {
      config: {
        requiredCapability: 'enclaves:read', targetLabel: 'caller-org',
        authorizedInHandler: 'the list is of the enclaves the caller reads',
      },
      schema: { response: { 200: arrayOf(ENCLAVE_VIEW) } },
    }, async (req) => {
      const p = req.principal!;
      if (p.kind === 'agent-operator') throw new ApiError(PROBLEMS.forbidden, 'agent operators cannot use this route');
      const held = (await callerGrants(db, p.subject, p.orgId)).grants.filter((g) => g.capability === 'enclaves:read');
      if (held.length === 0) throw new ApiError(PROBLEMS.forbidden, 'requires enclaves:read');
      const all = held.some((g) => g.scope_kind === 'platform');
      const orgs = [...new Set(held.filter((g) => g.scope_kind === 'org').map((g) => g.org_id))];
      const { rows } = all
        ? await db.query<EnclaveRow>(`SELECT ${COLUMNS} FROM enclaves ORDER BY name`)
        : await db.query<EnclaveRow>(`SELECT ${COLUMNS} FROM enclaves WHERE owning_org_id = ANY($1) ORDER BY name`, [orgs]);
      return rows.map(enclaveView);
    });

    api.get('/enclaves/:id', {
      config: { requiredCapability: 'enclaves:read', capabilityTarget: enclaveOwner },
      schema: { params: ID_PARAM, response: { 200: ENCLAVE_VIEW } },
    }, async (req) => {
      const row = await db.query<EnclaveRow>(`SELECT ${COLUMNS} FROM enclaves WHERE id = $1`, [idOf(req)]);
      if (!row.rows[0]) throw new ApiError(PROBLEMS.notFound, `no enclave ${idOf(req)}`);
      return enclaveView(row.rows[0]);
    });

    api.post('/enclaves', {
      config: platformConfig, schema: { body: REGISTER_REQ, response: { 201: REGISTER_VIEW } },
    }, async (req, reply) => {
      const body = req.body as { name: string; owning_org: string; enclave_id?: string | null };
      const name = body.name;
      const owningOrg = body.owning_org;
      const id = body.enclave_id || `enc-${randomBytes(6).toString('hex')}`;
      if (!ID.test(id)) bad('enclave_id', 'must be 1–63 lowercase letters, digits, "-" or "_"');
      if ((await db.query('SELECT 1 FROM orgs WHERE id = $1', [owningOrg])).rows.length === 0) bad('owning_org', `no org ${owningOrg}`);
      if ((await db.query('SELECT 1 FROM enclaves WHERE name = $1', [name])).rows.length > 0) throw new ApiError(PROBLEMS.conflict, `an enclave is already named ${name}`);
      if ((await db.query('SELECT 1 FROM enclaves WHERE id = $1', [id])).rows.length > 0) throw new ApiError(PROBLEMS.conflict, `enclave ${id} exists`);
      const minted = mintBrokerKey(id);
      await auditedChange(deps, req, 'enclave.register', owningOrg, async (tx) => {
        await tx.query(`INSERT INTO enclaves (id, name, owning_org_id, broker_key_hash, created_by) VALUES ($1, $2, $3, $4, $5)`, [id, name, owningOrg, hashBrokerKey(minted.token), req.principal!.subject]);
        return { result: null, resource: `enclave:${id}` };
      });
      return reply.code(201).send({ enclave_id: id, subject: `enclave:${id}`, key: minted.key });
    });

    // A new broker key (the old one stops working at once), shown once.
    api.post('/enclaves/:id/broker-key', {
      config: platformConfig, schema: { params: ID_PARAM, response: { 201: REGISTER_VIEW } },
    }, async (req, reply) => {
      const e = await load(idOf(req));
      const minted = mintBrokerKey(e.id);
      await auditedChange(deps, req, 'enclave.broker-key.rotate', e.owning_org_id, async (tx) => {
        await tx.query('UPDATE enclaves SET broker_key_hash = $2 WHERE id = $1', [e.id, hashBrokerKey(minted.token)]);
        return { result: null, resource: `enclave:${e.id}` };
      });
      return reply.code(201).send({ enclave_id: e.id, subject: `enclave:${e.id}`, key: minted.key });
    });

    api.put('/enclaves/:id/address', {
      config: platformConfig, schema: { params: ID_PARAM, body: ADDRESS_REQ, response: { 200: ENCLAVE_VIEW } },
    }, async (req) => {
      const e = await load(idOf(req));
      const body = req.body as AddressReq;
      const broker = httpsUrl('broker_url', body.broker_url);
      const relay = httpsUrl('relay_url', body.relay_url);
      return setAddress(deps, req, e, broker, relay, 'operator');
    });

    api.put('/enclaves/:id/isolation-class', {
      config: platformConfig, schema: { params: ID_PARAM, body: ISO_CLASS_REQ, response: { 200: ISO_CLASS_VIEW } },
    }, async (req) => {
      const e = await load(idOf(req));
      const iso = (req.body as { isolationClass: string }).isolationClass;
      if (!(ISOLATION_CLASSES as readonly string[]).includes(iso)) bad('isolationClass', `must be one of ${ISOLATION_CLASSES.join(', ')}`);
      return auditedChange(deps, req, 'enclave.isolation-class', e.owning_org_id, async (tx) => {
        await tx.query('UPDATE enclaves SET isolation_class = $2 WHERE id = $1', [e.id, iso]);
        await events.publish(tx, [e.id], 'enclave.changed', { enclave_id: e.id, isolation_class: iso });
        return { result: { isolationClass: iso }, resource: `enclave:${e.id}` };
      }).finally(() => events.wake());
    });

    api.delete('/enclaves/:id', {
      config: platformConfig, schema: { params: ID_PARAM, response: NO_CONTENT },
    }, async (req, reply) => {
      const e = await load(idOf(req));
      await auditedChange(deps, req, 'enclave.delete', e.owning_org_id, async (tx) => {
        await tx.query(`UPDATE agents SET enclave_id = '' WHERE enclave_id = $1`, [e.id]);
        await tx.query('DELETE FROM enclaves WHERE id = $1', [e.id]);
        return { result: null, resource: `enclave:${e.id}` };
      });
      return reply.code(204).send();
    });
  };
}

/** Records an enclave's addresses (by an operator or by its own broker). */
export async function setAddress(deps: ChangeDeps, req: FastifyRequest, e: EnclaveRow, broker: string | undefined, relay: string | undefined, source: string) {
  return auditedChange(deps, req, 'enclave.address', e.owning_org_id, async (tx) => {
    const { rows } = await tx.query<EnclaveRow>(
      `UPDATE enclaves SET broker_url = coalesce($2, broker_url), relay_url = coalesce($3, relay_url), address_source = $4, address_updated_at = now()
       WHERE id = $1 RETURNING ${COLUMNS}`,
      [e.id, broker ?? null, relay ?? null, source],
    );
    return { result: enclaveView(rows[0]), resource: `enclave:${e.id}` };
  });
}
