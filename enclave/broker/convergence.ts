import { coalesced } from '../../core/coalesce.ts';
import type { Queryable } from '../../core/sql.ts';
import { canonicalJson, validateConfigDocument, type ConfigDocument } from '../../pipeline/policy/config-values.ts';
import { validateSnapshot, type AgentState, type Snapshot } from '../../pipeline/policy/snapshot.ts';
import { AgentStateChangedError, EnclaveMismatchError } from '../errors.ts';
import { startPuller, type RunningPuller } from '../pullers/puller.ts';
import { listAgents, lockAgent, REFUSED_STATUSES, setStatus, type BrokerAgent } from './agents.ts';
import { auditedChange, BROKER_ACTOR } from './audit.ts';
import type { BrokerDeps } from './deps.ts';
import {
  deliverBootstrapToken,
  forgetAgentIn,
  revokeCredentialsIn,
  hasLiveFamily,
  isSafeUid,
  provisionIn,
  removeBootstrapToken,
} from './provision.ts';
import { getState, putState } from './state.ts';
import { startStatusReport, type StatusReporter } from './status-report.ts';

// The broker follows the control plane (spec: Events; States and transitions). It pulls the enclave's
// snapshot and config with the pull sidecars' own puller (writing the satellites' files exactly as
// `dvx policy-pull` / `dvx config-pull` do, when asked), pulls again on every event of the enclave's
// stream, and keeps its cursor in broker_state across restarts. The last good snapshot and config are
// kept in broker_state too and loaded at start: the enclave is sovereign, and a control plane that is
// away never stops its agents.
//
// broker_agents converges on the snapshot's agents:
//   new (control plane: created, provisioning or active)   → provisioned: status provisioning, a bootstrap
//                                                            token in the agent's host (provision.ts)
//   control plane suspended / isolated, contained          → copied in and enforced at once
//   restored (suspended/isolated → not) at the control plane → re-provisioned when the broker had
//                                                            suspended it for a replayed refresh token or
//                                                            it holds no live refresh family; else active
//   provisioning whose bootstrap token expired              → a new token
//   gone from the snapshot                                  → its tokens and families revoked, row removed
// Every change is audited (actor enclave:<id>) and told to the rest of the broker (bus 'agent');
// status changes the broker owns are queued for the control plane (status-report.ts).

export interface ConvergenceOptions {
  /** The control plane's base URL; empty: the enclave runs on its store alone. */
  controlplane: string;
  brokerToken: string;
  ca?: string | Buffer;
  insecureSkipVerify?: boolean;
  /** Default: deps.options.pullInterval. */
  pullIntervalMs?: number;
  /** Follow the event stream (default true). */
  events?: boolean;
  /** Default: deps.options.snapshotOut / configOut (empty: no file). */
  snapshotOut?: string;
  configOut?: string;
  /** How often the status outbox is looked at when nothing woke it (default 1 s). */
  statusPollMs?: number;
}

export interface Convergence {
  /** Resolves once a snapshot and a config pulled from the control plane were applied (at once without one). */
  ready: Promise<void>;
  /** The last good snapshot (pulled, or kept in the store); null before there is any. */
  snapshot(): Snapshot | null;
  /** The last good config values; null before there are any. */
  config(): ConfigDocument | null;
  /** Converges broker_agents on the current snapshot now. */
  reconcile(): Promise<void>;
  /** Delivers the queued status reports now. */
  flushReports(): Promise<void>;
  close(): Promise<void>;
}

const REPLAYED = 'refresh_token_replayed';
const OPERATOR_STATES = REFUSED_STATUSES;
const RETRY_MIN_MS = 1000;
const RETRY_MAX_MS = 30_000;

const sameDoc = (doc: unknown) => canonicalJson({ ...(doc as object), version: undefined });

export async function startConvergence(deps: BrokerDeps, o: ConvergenceOptions): Promise<Convergence> {
  const { db, log } = deps;
  let snapshot: Snapshot | null = null;
  let config: ConfigDocument | null = null;
  let storedSnapshot: string | null = null;
  let storedConfig: string | null = null;
  let closed = false;

  // The last good state kept in the store: what the broker serves until the control plane answers.
  const kept = async <T>(key: 'snapshot' | 'config', validate: (doc: unknown) => T) => {
    const doc = await getState(db, key);
    if (doc === null) return null;
    try {
      return { doc, value: validate(doc) };
    } catch (err) {
      log.warn({ err, state: key }, 'the kept state does not validate; waiting for the control plane');
      return null;
    }
  };
  const keptSnapshot = await kept('snapshot', validateSnapshot);
  if (keptSnapshot) {
    snapshot = keptSnapshot.value;
    storedSnapshot = sameDoc(keptSnapshot.doc);
  }
  const keptConfig = await kept('config', validateConfigDocument);
  if (keptConfig) {
    config = keptConfig.value;
    storedConfig = sameDoc(keptConfig.doc);
  }
  const keptCursor = await getState<string>(db, 'events_cursor');
  log.info(
    { snapshot: snapshot?.version ?? null, config: config?.version ?? null, cursor: keptCursor },
    'broker state loaded',
  );

  // One reconcile at a time; a failed step is tried again after a backoff (and on every pull).
  let retryTimer: NodeJS.Timeout | null = null;
  let retryMs = RETRY_MIN_MS;
  const reconcile = coalesced(
    async () => {
      if (!snapshot || closed) return;
      const { failed } = await reconcileAgents(deps, snapshot);
      if (failed === 0) {
        retryMs = RETRY_MIN_MS;
        return;
      }
      if (!retryTimer && !closed) {
        retryTimer = setTimeout(() => {
          retryTimer = null;
          void reconcile();
        }, retryMs);
        retryTimer.unref();
        retryMs = Math.min(retryMs * 2, RETRY_MAX_MS);
      }
    },
    () => closed,
  );
  const reconcileLogged = () =>
    reconcile().catch((err: unknown) => log.error({ err }, 'agents could not be converged; retrying on the next pull'));

  const applySnapshot = async (doc: unknown) => {
    const next = validateSnapshot(doc);
    if (deps.enclave.id && next.enclave.id && next.enclave.id !== deps.enclave.id)
      throw new EnclaveMismatchError(
        `the control plane serves enclave ${next.enclave.id}, this broker is ${deps.enclave.id}: check --enclave-id and --broker-key`,
      );
    const key = sameDoc(doc);
    if (key !== storedSnapshot) {
      await putState(db, 'snapshot', doc);
      storedSnapshot = key;
      log.info({ version: next.version, agents: Object.keys(next.agents).length }, 'snapshot kept');
    }
    snapshot = next;
    await reconcile();
  };
  const applyConfig = async (doc: unknown) => {
    const next = validateConfigDocument(doc);
    if (deps.enclave.id && next.enclave.id && next.enclave.id !== deps.enclave.id)
      throw new EnclaveMismatchError(
        `the control plane serves the config of enclave ${next.enclave.id}, this broker is ${deps.enclave.id}`,
      );
    const key = sameDoc(doc);
    if (key !== storedConfig) {
      await putState(db, 'config', doc);
      storedConfig = key;
      log.info({ version: next.version }, 'config kept');
    }
    config = next;
  };

  // The event cursor is written as it moves (the latest one wins; one write at a time).
  let cursor = keptCursor;
  let savedCursor = keptCursor;
  const saveCursor = coalesced(async () => {
    const at = cursor;
    if (at === null || at === savedCursor) return;
    try {
      await putState(db, 'events_cursor', at);
      savedCursor = at;
    } catch (err) {
      log.warn({ err }, 'the event cursor could not be kept; it is written again on the next event');
    }
  });

  let pullers: RunningPuller[] = [];
  let reporter: StatusReporter | null = null;
  let ready: Promise<void> = Promise.resolve();
  if (o.controlplane) {
    const common = {
      controlplane: o.controlplane,
      brokerToken: o.brokerToken,
      ca: o.ca,
      insecureSkipVerify: o.insecureSkipVerify,
      intervalMs: o.pullIntervalMs ?? deps.options.pullInterval,
      log,
    };
    const configPuller = startPuller({
      ...common,
      route: '/v1/broker/config',
      out: o.configOut ?? deps.options.configOut,
      events: false,
      validate: (doc) => void validateConfigDocument(doc),
      onDocument: applyConfig,
    });
    const snapshotPuller = startPuller({
      ...common,
      route: '/v1/broker/snapshot',
      out: o.snapshotOut ?? deps.options.snapshotOut,
      events: o.events ?? true,
      // The same validation as `dvx policy-pull`: the proxy's own validator.
      validate: (doc) => void validateSnapshot(doc),
      onDocument: applySnapshot,
      lastEventId: keptCursor,
      onCursor: (id) => {
        cursor = id;
        void saveCursor();
      },
      onNudge: () => void configPuller.nudge(),
    });
    pullers = [snapshotPuller, configPuller];
    ready = Promise.all([snapshotPuller.ready, configPuller.ready]).then(() => undefined);
    reporter = startStatusReport(deps, {
      controlplane: o.controlplane,
      brokerToken: o.brokerToken,
      ca: o.ca,
      insecureSkipVerify: o.insecureSkipVerify,
      pollMs: o.statusPollMs,
    });
  }
  // Whatever the kept snapshot asks for and was not done before a restart.
  void reconcileLogged();

  return {
    ready,
    snapshot: () => snapshot,
    config: () => config,
    reconcile: reconcileLogged,
    flushReports: () => reporter?.flush() ?? Promise.resolve(),
    async close() {
      if (closed) return;
      closed = true;
      if (retryTimer) clearTimeout(retryTimer);
      await Promise.all(pullers.map((p) => p.close()));
      await reporter?.close();
      await reconcile().catch(() => undefined); // a run in flight logged its own failures
      await saveCursor();
    },
  };
}

function changedMeanwhile(uid: string): never {
  throw new AgentStateChangedError(`agent ${uid} changed while it was converged`);
}

const refused = (status: string | null) => status !== null && OPERATOR_STATES.includes(status);

/** Uids already refused as unsafe, so each is logged once per process, not on every pull. */
const unsafeLogged = new Set<string>();

/**
 * Converges broker_agents on `snapshot.agents` (see the top of this file). Each agent's changes are
 * their own audited transactions; one that fails is logged and counted, the others go on.
 */
export async function reconcileAgents(
  deps: BrokerDeps,
  snapshot: Snapshot,
): Promise<{ changed: number; failed: number }> {
  const { db, log } = deps;
  const actor = BROKER_ACTOR(deps.enclave.id);
  const now = deps.now();
  const rows = new Map((await listAgents(db)).map((a) => [a.uid, a]));
  const liveTokens = new Set(
    (
      await db.query<{ agent_uid: string }>(
        'SELECT DISTINCT agent_uid FROM broker_bootstrap_tokens WHERE used_at IS NULL AND expires_at > $1',
        [new Date(now)],
      )
    ).rows.map((r) => r.agent_uid),
  );
  const queued = new Set(
    (await db.query<{ agent_uid: string }>('SELECT agent_uid FROM broker_status_outbox')).rows.map((r) => r.agent_uid),
  );
  let changed = 0;
  let failed = 0;

  /**
   * One audited change of one agent. A change that provisions returns its bootstrap token, delivered into
   * the agent's host once the change committed.
   */
  const step = async (
    uid: string,
    action: string,
    orgId: string,
    change: (tx: Queryable) => Promise<{ attrs?: Record<string, string>; token?: string } | undefined>,
  ) => {
    const token = await auditedChange(deps, actor, action, orgId, async (tx) => {
      const out = await change(tx);
      return { result: out?.token, resource: `agent:${uid}`, ...(out?.attrs ? { attrs: out.attrs } : {}) };
    });
    changed++;
    deps.bus.emit('agent', uid);
    if (token) await deliverBootstrapToken(deps, uid, token);
  };

  const converge = async (uid: string, want: AgentState, row: BrokerAgent | undefined) => {
    const cpStatus = want.status;
    if (!row) {
      if (refused(cpStatus)) {
        await step(uid, 'agent.add', want.org_id, async (tx) => {
          if (await lockAgent(tx, uid)) changedMeanwhile(uid);
          await insertAgent(tx, uid, want, cpStatus, 'operator');
          return { attrs: { status: cpStatus } };
        });
        return;
      }
      await step(uid, 'agent.provision', want.org_id, async (tx) => {
        if (await lockAgent(tx, uid)) changedMeanwhile(uid);
        await insertAgent(tx, uid, want, 'created', null);
        return { token: await provisionIn(tx, deps, uid, 'provisioned'), attrs: { reason: 'provisioned' } };
      });
      return;
    }

    if (row.org_id !== want.org_id || row.group_id !== want.group_id || row.name !== want.name) {
      await step(uid, 'agent.update', want.org_id, async (tx) => {
        if (!(await lockAgent(tx, uid))) changedMeanwhile(uid);
        await tx.query(
          'UPDATE broker_agents SET org_id = $2, group_id = $3, name = $4, updated_at = now() WHERE uid = $1',
          [uid, want.org_id, want.group_id, want.name],
        );
        return { attrs: { org_id: want.org_id, group_id: want.group_id ?? '' } };
      });
    }
    if (row.contained !== want.contained) {
      await step(uid, want.contained ? 'agent.contain' : 'agent.release', want.org_id, async (tx) => {
        if (!(await lockAgent(tx, uid))) changedMeanwhile(uid);
        await tx.query('UPDATE broker_agents SET contained = $2, updated_at = now() WHERE uid = $1', [
          uid,
          want.contained,
        ]);
        if (want.contained) await revokeCredentialsIn(tx, uid, 'operator_contained', now);
        return undefined;
      });
    }

    if (refused(cpStatus)) {
      // The operator's state wins, and is enforced at once.
      if (row.status !== cpStatus)
        await step(uid, cpStatus === 'isolated' ? 'agent.isolate' : 'agent.suspend', want.org_id, async (tx) => {
          const cur = await lockAgent(tx, uid);
          if (!cur || cur.status === cpStatus) changedMeanwhile(uid);
          await setStatus(tx, uid, cpStatus as BrokerAgent['status'], 'operator');
          // What the agent could authenticate with dies with the suspension: a restore re-provisions it,
          // so a credential copied before the operator acted never comes back with it.
          await revokeCredentialsIn(tx, uid, `operator_${cpStatus}`, now);
          return { attrs: { status: cpStatus, was: cur.status } };
        });
    } else if (refused(row.status)) {
      // Only a restore seen at the control plane lets the agent back; a suspension of the broker's own
      // that the control plane has not shown yet stays.
      if (refused(row.cp_status))
        await step(uid, 'agent.restore', want.org_id, async (tx) => {
          const cur = await lockAgent(tx, uid);
          if (!cur || !refused(cur.status)) changedMeanwhile(uid);
          if (cur.reason === REPLAYED || !(await hasLiveFamily(tx, uid, now)))
            return {
              token: await provisionIn(tx, deps, uid, 'restored'),
              attrs: { reprovisioned: 'true', was: cur.status },
            };
          await setStatus(tx, uid, 'active', 'restored');
          return { attrs: { reprovisioned: 'false', was: cur.status } };
        });
    } else if (
      row.status === 'created' ||
      (row.status === 'provisioning' && !liveTokens.has(uid)) ||
      (row.status === 'active' && !want.contained && !liveTokens.has(uid) && !(await hasLiveFamily(db, uid, now)))
    ) {
      // A new agent; a bootstrap token that expired unused; an active agent left with nothing to
      // authenticate with (its refresh tokens expired while it was away, or a containment revoked them
      // and was released): each gets a new bootstrap token.
      const reason =
        row.status === 'created'
          ? 'provisioned'
          : row.status === 'provisioning'
            ? 'bootstrap_token_expired'
            : 'credentials_lapsed';
      await step(uid, 'agent.provision', want.org_id, async (tx) => {
        const cur = await lockAgent(tx, uid);
        if (!cur || cur.status !== row.status) changedMeanwhile(uid);
        if (cur.status === 'active' && (await hasLiveFamily(tx, uid, now))) changedMeanwhile(uid);
        return { token: await provisionIn(tx, deps, uid, reason), attrs: { reason } };
      });
    } else if (cpStatus !== row.status && !queued.has(uid)) {
      // The control plane shows another status than the broker's and nothing is on its way: report it
      // again (a stale snapshot only costs a no-op report).
      await db.query(
        `INSERT INTO broker_status_outbox (agent_uid, status, reason) VALUES ($1, $2, $3) ON CONFLICT (agent_uid) DO NOTHING`,
        [uid, row.status, row.reason],
      );
      deps.bus.emit('agent', uid);
    }
    // What the control plane showed, recorded once the steps it asked for are done (a failed one is
    // seen again, restore included).
    if (row.cp_status !== cpStatus)
      await db.query('UPDATE broker_agents SET cp_status = $2 WHERE uid = $1', [uid, cpStatus]);
  };

  for (const [uid, want] of Object.entries(snapshot.agents)) {
    const row = rows.get(uid);
    rows.delete(uid);
    if (!isSafeUid(uid)) {
      if (!unsafeLogged.has(uid)) {
        if (unsafeLogged.size >= 1000) unsafeLogged.clear(); // bounded, whatever a snapshot holds
        unsafeLogged.add(uid);
        log.error(
          { agent: JSON.stringify(uid).slice(0, 200) },
          'the agent uid is not a safe file name: the agent is not provisioned',
        );
      }
      continue;
    }
    try {
      await converge(uid, want, row);
    } catch (err) {
      failed++;
      if (err instanceof AgentStateChangedError) log.info({ agent: uid }, 'agent changed meanwhile; converging again');
      else log.error({ err, agent: uid }, 'agent could not be converged; retrying');
    }
  }

  // Agents the control plane no longer runs here: nothing they hold works any more.
  for (const row of rows.values()) {
    try {
      await step(row.uid, 'agent.remove', row.org_id, async (tx) => {
        if (!(await lockAgent(tx, row.uid))) changedMeanwhile(row.uid);
        await forgetAgentIn(tx, row.uid, 'agent_removed', now);
        return undefined;
      });
      await removeBootstrapToken(deps.options.agentHostDir, row.uid).catch((err: unknown) =>
        log.warn({ err, agent: row.uid }, 'the bootstrap-token file of a removed agent could not be deleted'),
      );
    } catch (err) {
      failed++;
      log.error({ err, agent: row.uid }, 'agent could not be removed; retrying');
    }
  }
  return { changed, failed };
}

async function insertAgent(
  tx: Queryable,
  uid: string,
  want: AgentState,
  status: string,
  reason: string | null,
): Promise<void> {
  await tx.query(
    `INSERT INTO broker_agents (uid, org_id, group_id, name, status, cp_status, contained, reason)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
    [uid, want.org_id, want.group_id, want.name, status, want.status, want.contained, reason],
  );
}
