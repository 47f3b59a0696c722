import { onGrantsChanged } from '../authz/capabilities.ts';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { coalesced } from '../../core/coalesce.ts';
import { formatSse, startSseResponse } from '../../core/sse.ts';
import type { ChangeDeps } from '../audited-change.ts';
import { httpsUrl } from '../bad-request.ts';
import { ApiError, PROBLEMS } from '../errors.ts';
import type { EventHub } from '../events.ts';
import { enclaveConfig, enclaveSnapshot, storeSnapshotDocument } from '../../pipeline/policy/store-snapshot.ts';
import { reportSkipped } from '../skipped-rows.ts';
import { ADDRESS_REQ, ENCLAVE_VIEW, hashBrokerKey, setAddress, type AddressReq } from './enclaves.ts';
import { brokerKeyHash, enclaveByBrokerKey, type EnclaveRow } from '../store/enclaves.ts';
import { getAgent, setAgentStatusFrom, type AgentRow } from '../store/agents.ts';
import { agentView, AGENT_VIEW } from './agents.ts';
import { object, pathParams } from '../../core/schemas.ts';
import type { AgentOperatorIssuer } from '../auth/agent-operator-issuer.ts';
import { auditedChange, auditedChangeBy } from '../audited-change.ts';
import { StreamGuard, type StreamGuardDeps } from '../../core/stream-guard.ts';

// The enclave-facing surface, authenticated by the broker key (not an operator token):
//   GET /v1/broker/snapshot  the desired state of this enclave (docs/snapshot.md)
//   GET /v1/broker/config    the config values it serves (docs/snapshot.md, "Config values")
//   GET /v1/broker/events    SSE of this enclave's events (spec: Broker events), resumable with
//                            Last-Event-ID, a heartbeat comment every 30 s; ends with `event: end`
//                            when the key it was opened with is rotated or its enclave deleted
//   PUT /v1/broker/address   the broker reports its own addresses (addressReq → enclaveView)
//   POST /v1/broker/agents/{uid}/operator-token   a 60 s agent-operator token for an agent this enclave
//                            runs (spec: Agent operators); a contained agent is refused (403)
//   PUT /v1/broker/agents/{uid}/status   the broker reports a status it set (spec: States and
//                            transitions) → agentView; 404 for an agent it does not run, 409 when the
//                            agent's current status does not allow it
// Resuming with Last-Event-ID N marks the enclave's events up to N consumed (the hourly purge takes them).

// What a broker may set, from which statuses (spec: States and transitions). The broker owns
// `provisioning` and `active` and suspends an agent whose refresh token was replayed; the operator owns
// suspended, isolated and their restore, so a broker never moves an agent out of them.
const BROKER_TRANSITIONS: Record<string, readonly string[]> = {
  provisioning: ['created', 'provisioning', 'active'],
  active: ['provisioning', 'active'],
  suspended: ['created', 'provisioning', 'active'],
};
const STATUS_REQ = object(
  {
    status: {
      type: 'string',
      enum: Object.keys(BROKER_TRANSITIONS),
      'x-error': `must be one of ${Object.keys(BROKER_TRANSITIONS).join(', ')}`,
    },
    reason: {
      type: ['string', 'null'],
      pattern: '^[A-Za-z0-9_.:-]{1,100}$',
      'x-error': 'must be 1–100 letters, digits, ".", "_", ":" or "-"',
    },
  },
  ['status'],
  'agentStatusReq',
);
interface StatusReq {
  status: string;
  reason?: string | null;
}

export interface BrokerOptions {
  heartbeatMs: number;
  /** The agent-operator issuer (--agent-token-issuer-url); without it, no mint route. */
  agentIssuer: AgentOperatorIssuer | null;
  /** Re-checks an open event stream's key while it runs. */
  guard: StreamGuardDeps;
}

export function brokerRoutes(deps: ChangeDeps, events: EventHub, options: BrokerOptions) {
  const { db } = deps;
  const streams = new Set<StreamGuard>();

  const keyHash = (req: FastifyRequest): string => {
    const header = req.headers.authorization;
    const token =
      typeof header === 'string' && /^bearer\s+/i.test(header) ? header.replace(/^bearer\s+/i, '').trim() : '';
    if (!token) throw new ApiError(PROBLEMS.unauthenticated, 'missing broker key');
    return hashBrokerKey(token);
  };

  const authenticate = async (req: FastifyRequest): Promise<EnclaveRow> => {
    const e = await enclaveByBrokerKey(db, keyHash(req));
    if (!e) throw new ApiError(PROBLEMS.unauthenticated, 'unknown broker key');
    req.principal = { kind: 'service', subject: `enclave:${e.id}`, orgId: e.owning_org_id, claims: {} };
    return e;
  };

  return async (app: FastifyInstance) => {
    app.addHook('preClose', async () => {
      for (const guard of streams) guard.end('shutdown');
      await Promise.all([...streams].map((guard) => guard.settled()));
    });

    app.get('/v1/broker/snapshot', async (req, reply) => {
      const e = await authenticate(req);
      const snapshot = await enclaveSnapshot(db, e.id);
      if (snapshot) reportSkipped(deps, `enclave:${e.id}`, snapshot.skipped);
      return reply.header('cache-control', 'no-store').send(snapshot && storeSnapshotDocument(snapshot));
    });

    app.get('/v1/broker/config', async (req, reply) => {
      const e = await authenticate(req);
      return reply
        .header('cache-control', 'no-store')
        .send(await enclaveConfig(db, e.id, undefined, deps.keys ? (org, v) => deps.keys!.open(org, v) : undefined));
    });

    // The enclave authenticates before its body is validated (a 401 is not a 400).
    const caller = new WeakMap<FastifyRequest, EnclaveRow>();
    const preValidation = async (req: FastifyRequest) => void caller.set(req, await authenticate(req));
    app.put(
      '/v1/broker/address',
      {
        preValidation,
        schema: { body: ADDRESS_REQ, response: { 200: ENCLAVE_VIEW } },
      },
      async (req) => {
        const e = caller.get(req)!;
        const body = req.body as AddressReq;
        const broker = httpsUrl('broker_url', body.broker_url);
        return setAddress(deps, req, e, broker, httpsUrl('relay_url', body.relay_url), 'broker');
      },
    );

    const issuer = options.agentIssuer;
    if (issuer) {
      app.post('/v1/broker/agents/:uid/operator-token', async (req) => {
        const e = await authenticate(req);
        const uid = (req.params as { uid: string }).uid;
        const agent = await getAgent(db, uid);
        if (!agent || agent.enclave_id !== e.id)
          throw new ApiError(PROBLEMS.notFound, `enclave ${e.id} runs no agent ${uid}`);
        if (agent.contained)
          throw new ApiError(PROBLEMS.forbidden, `agent ${uid} is contained: no agent-operator token is minted for it`);
        return auditedChange(deps, req, 'agent-operator-token.mint', agent.org_id, async () => ({
          result: await issuer.mint(agent.org_id, uid),
          resource: `agent:${uid}`,
        }));
      });
    }

    // The enclave's report of a status it set. The check and the write are one statement, so an
    // operator's suspend or isolate made meanwhile stands (409). Audited as the enclave; published like
    // an operator's change, so the snapshot and agentView show it within seconds.
    app.put(
      '/v1/broker/agents/:uid/status',
      {
        preValidation,
        schema: { params: pathParams('uid'), body: STATUS_REQ, response: { 200: AGENT_VIEW } },
      },
      async (req) => {
        const e = caller.get(req)!;
        const uid = (req.params as { uid: string }).uid;
        const { status, reason } = req.body as StatusReq;
        const agent = await getAgent(db, uid);
        if (!agent || agent.enclave_id !== e.id)
          throw new ApiError(PROBLEMS.notFound, `enclave ${e.id} runs no agent ${uid}`);
        if (agent.status === status) return agentView(agent);
        const from = BROKER_TRANSITIONS[status];
        const actor = { subject: `enclave:${e.id}`, kind: 'service', traceId: String(req.id) };
        const row = await auditedChangeBy<{ changed?: AgentRow; stands?: string | null }>(
          deps,
          actor,
          `agent.status.${status}`,
          agent.org_id,
          async (tx) => {
            const changed = await setAgentStatusFrom(tx, uid, e.id, status, from);
            if (changed)
              await events.publishTo(tx, { kind: 'agent', agent: uid }, 'agent.changed', {
                agent_id: uid,
                org_id: changed.org_id,
                status: changed.status,
                contained: changed.contained,
              });
            if (changed) return { result: { changed }, resource: `agent:${uid}`, ...(reason ? { reason } : {}) };
            // Refused: recorded (outcome deny) with the status that stands.
            const current = await getAgent(tx, uid);
            const stands = current?.enclave_id === e.id ? current.status : null;
            return {
              result: { stands },
              resource: `agent:${uid}`,
              outcome: 'deny' as const,
              reason: stands ? `agent is ${stands}` : 'agent not in this enclave',
            };
          },
        ).finally(() => events.wake());
        if (row.changed) return agentView(row.changed);
        if (!row.stands) throw new ApiError(PROBLEMS.notFound, `enclave ${e.id} runs no agent ${uid}`);
        throw new ApiError(
          PROBLEMS.conflict,
          `agent ${uid} is ${row.stands}: a broker may not set ${status} from it${
            row.stands === 'suspended' || row.stands === 'isolated' ? ' (only an operator restores it)' : ''
          }`,
        );
      },
    );

    app.get('/v1/broker/events', async (req, reply) => {
      const e = await authenticate(req);
      const header = req.headers['last-event-id'];
      const resume = Array.isArray(header) ? header[0] : header;
      if (resume !== undefined && resume !== '' && !/^\d{1,18}$/.test(resume))
        throw new ApiError(PROBLEMS.badRequest, 'Last-Event-ID: must be an event id this stream sent');
      let cursor = resume ? Number(resume) : 0;
      if (cursor > 0) await events.consumed(db, e.id, cursor);

      reply.hijack();
      const res = reply.raw;
      startSseResponse(res);
      // The stream lives as long as the key it was opened with is the enclave's key.
      const hash = keyHash(req);
      const guard = new StreamGuard(
        {
          stream: 'broker_events',
          res,
          wake: (recheck) => onGrantsChanged(db, recheck),
          expiresAt: null,
          recheck: async () => {
            const current = await brokerKeyHash(db, e.id);
            if (current === undefined) return 'enclave_deleted';
            return current === hash ? null : 'key_rotated';
          },
        },
        options.guard,
      );
      streams.add(guard);
      let closed = false;
      // One sender at a time; a wake-up while sending makes it look once more.
      const send = coalesced(
        async () => {
          const batch = await events.since(db, e.id, cursor);
          for (const ev of batch) {
            // Each event waits for the client to take it (a client that does not read ends the stream).
            if (closed || !(await guard.write(formatSse(ev.kind, { kind: ev.kind, ...ev.payload }, ev.id))))
              return false;
            cursor = ev.id;
          }
          return batch.length === 500;
        },
        () => closed || guard.stopped,
      );
      // The events could not be read: the stream ends with its reason, and the client's reconnect
      // (Last-Event-ID) resumes where it was once the store answers.
      const guarded = () =>
        send().catch((err: Error) => {
          options.guard.log.warn(
            { err, stream: 'broker_events', enclave: e.id },
            'broker events could not be read; ending the stream',
          );
          guard.end('store_unavailable');
        });
      const off = events.onWake(() => void guarded());
      const heartbeat = setInterval(() => !closed && void guard.write(': heartbeat\n\n'), options.heartbeatMs);
      res.on('close', () => {
        closed = true;
        streams.delete(guard);
        off();
        clearInterval(heartbeat);
      });
      await guarded();
    });
  };
}
