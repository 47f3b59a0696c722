import { Agent, request } from 'undici';
import { coalesced } from '../../core/coalesce.ts';
import type { BrokerDeps } from './deps.ts';

// Delivers the status changes the broker queued (broker_status_outbox, one row per agent: the latest
// change) to the control plane: `PUT /v1/broker/agents/{uid}/status` `{status, reason}`. A row leaves the
// outbox only once the control plane acknowledged it (200) or refused it for good (409: the operator's
// state wins; 404: the control plane does not have the agent on this enclave; 400); anything else
// (unreachable, 401 after a key rotation, 5xx) keeps it, retried with backoff, across restarts.
// A row changed while it was being delivered stays for its own delivery.

export interface StatusReportOptions {
  controlplane: string;
  brokerToken: string;
  ca?: string | Buffer;
  insecureSkipVerify?: boolean;
  /** How often the outbox is looked at when nothing woke the reporter. */
  pollMs?: number;
  /** First retry delay after a failed delivery (doubling up to maxBackoffMs). */
  backoffMs?: number;
  maxBackoffMs?: number;
}

export interface StatusReporter {
  /** Delivers what is queued now (resolves when that attempt is over, delivered or not). */
  flush(): Promise<void>;
  /** Consecutive failed attempts (0 when the last one reached the control plane). */
  failures(): number;
  close(): Promise<void>;
}

interface OutboxRow {
  agent_uid: string;
  status: string;
  reason: string | null;
  /** As text: the stored timestamp exactly (microseconds), to remove only the row delivered. */
  queued_at: string;
}

type Outcome = 'delivered' | 'refused' | 'retry';

/** The reasons the control plane takes (agentStatusReq.reason). */
const REASON = /^[A-Za-z0-9_.:-]{1,100}$/;

export function startStatusReport(deps: BrokerDeps, o: StatusReportOptions): StatusReporter {
  const base = o.controlplane.replace(/\/+$/, '');
  const dispatcher = new Agent({
    connect: { ...(o.ca ? { ca: o.ca } : {}), rejectUnauthorized: !o.insecureSkipVerify },
    headersTimeout: 10_000,
    bodyTimeout: 10_000,
  });
  const minBackoff = o.backoffMs ?? 250;
  const maxBackoff = o.maxBackoffMs ?? 30_000;
  let backoff = minBackoff;
  let failed = 0;
  let retryAt = 0;
  let closed = false;
  let retryTimer: NodeJS.Timeout | null = null;

  const put = async (uid: string, status: string, reason: string | null) => {
    // A reason the control plane would refuse (400, the report lost) is left out rather than sent.
    if (reason !== null && !REASON.test(reason)) reason = null;
    const res = await request(`${base}/v1/broker/agents/${encodeURIComponent(uid)}/status`, {
      method: 'PUT',
      dispatcher,
      headers: { authorization: `Bearer ${o.brokerToken}`, 'content-type': 'application/json' },
      body: JSON.stringify(reason ? { status, reason } : { status }),
    });
    const text = await res.body.text();
    let detail: string | undefined;
    try {
      detail = (JSON.parse(text) as { detail?: string }).detail;
    } catch {
      detail = undefined; // not a Problem document: the status code says enough
    }
    return { status: res.statusCode, detail };
  };

  const deliverOne = async (row: OutboxRow): Promise<Outcome> => {
    let res = await put(row.agent_uid, row.status, row.reason);
    // The outbox keeps the latest change only: an agent provisioned and bootstrapped while the control
    // plane was away reports `active` to an agent it still shows `created`. It walks the path.
    if (res.status === 409 && row.status === 'active') {
      const first = await put(row.agent_uid, 'provisioning', row.reason);
      if (first.status === 200) res = await put(row.agent_uid, row.status, row.reason);
    }
    const log = { agent: row.agent_uid, status: row.status, http_status: res.status, detail: res.detail };
    if (res.status === 200) return 'delivered';
    if (res.status === 409) {
      deps.log.warn(log, "the control plane keeps the agent's status (the operator's state wins); report dropped");
      return 'refused';
    }
    if (res.status === 404 || res.status === 400) {
      deps.log.error(log, 'the control plane refused the status report for good; report dropped');
      return 'refused';
    }
    deps.log.warn(log, 'status report not accepted; retrying');
    return 'retry';
  };

  /** Removes the row only if it is still the change that was delivered. */
  const settle = async (row: OutboxRow) => {
    await deps.db.query(
      `DELETE FROM broker_status_outbox WHERE agent_uid = $1 AND status = $2 AND reason IS NOT DISTINCT FROM $3 AND queued_at = $4::timestamptz`,
      [row.agent_uid, row.status, row.reason, row.queued_at],
    );
  };

  const schedule = (ms: number) => {
    if (closed || retryTimer) return;
    retryTimer = setTimeout(() => {
      retryTimer = null;
      void run();
    }, ms);
    retryTimer.unref();
  };

  const run = coalesced(
    async () => {
      if (closed || Date.now() < retryAt) return false;
      let rows: OutboxRow[];
      try {
        rows = (
          await deps.db.query<OutboxRow>(
            'SELECT agent_uid, status, reason, queued_at::text AS queued_at FROM broker_status_outbox ORDER BY broker_status_outbox.queued_at, agent_uid LIMIT 100',
          )
        ).rows;
      } catch (err) {
        deps.log.warn({ err }, 'the status outbox could not be read; retrying');
        return false;
      }
      for (const row of rows) {
        if (closed) return false;
        let outcome: Outcome;
        try {
          outcome = await deliverOne(row);
        } catch (err) {
          deps.log.warn({ err, agent: row.agent_uid }, 'the control plane is unreachable; status reports wait');
          outcome = 'retry';
        }
        if (outcome === 'retry') {
          failed++;
          await deps.db
            .query('UPDATE broker_status_outbox SET attempts = attempts + 1 WHERE agent_uid = $1', [row.agent_uid])
            .catch((err: unknown) => deps.log.warn({ err }, 'the status outbox could not be updated'));
          retryAt = Date.now() + backoff;
          schedule(backoff);
          backoff = Math.min(backoff * 2, maxBackoff);
          return false;
        }
        failed = 0;
        backoff = minBackoff;
        try {
          await settle(row);
        } catch (err) {
          deps.log.warn(
            { err, agent: row.agent_uid },
            'a delivered status report could not be removed; it is sent again',
          );
          return false;
        }
      }
      return rows.length === 100;
    },
    () => closed,
  );

  const onAgent = () => void run();
  deps.bus.on('agent', onAgent);
  const poll = setInterval(() => void run(), o.pollMs ?? 1000);
  poll.unref();
  void run();

  return {
    flush: () => {
      retryAt = 0;
      return run();
    },
    failures: () => failed,
    async close() {
      closed = true;
      deps.bus.off('agent', onAgent);
      clearInterval(poll);
      if (retryTimer) clearTimeout(retryTimer);
      await run().catch(() => undefined); // a run in flight logged its own failures
      await dispatcher.destroy().catch(() => undefined); // nothing this process still needs
    },
  };
}
