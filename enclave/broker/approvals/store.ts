import type { Queryable } from '../../../core/sql.ts';
import type { ApprovalRow, ApprovalStatus, ApprovalView } from './view.ts';

// The approvals' SQL (broker_approvals, broker_approval_events; store/migrations/0002_approvals.sql).
// Every statement takes the clock as a parameter (deps.now), never the database's now(): the broker's
// clock decides what is due, and tests move it.

const COLUMNS =
  'id, org_id, agent_id, agent_name, request_id, call_id, model, tool, arguments, args_digest, rule, summary, ' +
  'policy_version, status, reason, created_at, expires_at, decided_by, decided_at';

/** The advisory lock every change of an approval appends its event under (held to its commit). */
const EVENTS_LOCK = 0x64767803;

export async function getApproval(db: Queryable, id: string): Promise<ApprovalRow | null> {
  const { rows } = await db.query<ApprovalRow>(`SELECT ${COLUMNS} FROM broker_approvals WHERE id = $1`, [id]);
  return rows[0] ?? null;
}

/** The row, locked for the rest of the transaction `tx`. */
export async function lockApproval(tx: Queryable, id: string): Promise<ApprovalRow | null> {
  const { rows } = await tx.query<ApprovalRow>(`SELECT ${COLUMNS} FROM broker_approvals WHERE id = $1 FOR UPDATE`, [
    id,
  ]);
  return rows[0] ?? null;
}

export async function findByCall(
  tx: Queryable,
  agentId: string,
  requestId: string,
  callId: string,
): Promise<ApprovalRow | null> {
  const { rows } = await tx.query<ApprovalRow>(
    `SELECT ${COLUMNS} FROM broker_approvals WHERE agent_id = $1 AND request_id = $2 AND call_id = $3`,
    [agentId, requestId, callId],
  );
  return rows[0] ?? null;
}

export interface ListFilters {
  org: string;
  status?: ApprovalStatus;
  agent?: string;
  limit: number;
  offset: number;
  now: Date;
}

/** An org's approvals, newest first, as their status reads at `now`. */
export async function listApprovals(db: Queryable, f: ListFilters): Promise<ApprovalRow[]> {
  const params: unknown[] = [f.org];
  const arg = (v: unknown) => `$${params.push(v)}`;
  let where = 'org_id = $1';
  if (f.status === 'pending') where += ` AND status = 'pending' AND expires_at > ${arg(f.now)}`;
  else if (f.status === 'expired')
    where += ` AND (status = 'expired' OR (status = 'pending' AND expires_at <= ${arg(f.now)}))`;
  else if (f.status) where += ` AND status = ${arg(f.status)}`;
  if (f.agent) where += ` AND agent_id = ${arg(f.agent)}`;
  const sql = `SELECT ${COLUMNS} FROM broker_approvals WHERE ${where}
    ORDER BY created_at DESC, id DESC LIMIT ${arg(f.limit)} OFFSET ${arg(f.offset)}`;
  return (await db.query<ApprovalRow>(sql, params)).rows;
}

export interface Counts {
  agentPending: number;
  orgPending: number;
  agentLastHour: number;
}

/** What the limits count: pending (not yet due) of the agent and of its org, and the agent's creates since `hourAgo`. */
export async function countsFor(tx: Queryable, org: string, agent: string, now: Date, hourAgo: Date): Promise<Counts> {
  const { rows } = await tx.query<{ agent_pending: string; org_pending: string; agent_hour: string }>(
    `SELECT
       (SELECT count(*) FROM broker_approvals WHERE agent_id = $2 AND status = 'pending' AND expires_at > $3) AS agent_pending,
       (SELECT count(*) FROM broker_approvals WHERE org_id = $1 AND status = 'pending' AND expires_at > $3) AS org_pending,
       (SELECT count(*) FROM broker_approvals WHERE agent_id = $2 AND created_at > $4) AS agent_hour`,
    [org, agent, now, hourAgo],
  );
  const r = rows[0]!;
  return {
    agentPending: Number(r.agent_pending),
    orgPending: Number(r.org_pending),
    agentLastHour: Number(r.agent_hour),
  };
}

export async function insertApproval(tx: Queryable, row: ApprovalRow): Promise<ApprovalRow> {
  const { rows } = await tx.query<ApprovalRow>(
    `INSERT INTO broker_approvals (${COLUMNS})
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)
     RETURNING ${COLUMNS}`,
    [
      row.id,
      row.org_id,
      row.agent_id,
      row.agent_name,
      row.request_id,
      row.call_id,
      row.model,
      row.tool,
      row.arguments,
      row.args_digest,
      row.rule,
      row.summary,
      row.policy_version,
      row.status,
      row.reason,
      row.created_at,
      row.expires_at,
      row.decided_by,
      row.decided_at,
    ],
  );
  return rows[0]!;
}

/** Moves a pending row to its final status; the caller holds its lock and has checked it is pending. */
export async function settleApproval(
  tx: Queryable,
  id: string,
  s: { status: ApprovalStatus; reason: string | null; decidedBy: string; decidedAt: Date },
): Promise<ApprovalRow> {
  const { rows } = await tx.query<ApprovalRow>(
    `UPDATE broker_approvals SET status = $2, reason = $3, decided_by = $4, decided_at = $5
     WHERE id = $1 AND status = 'pending' RETURNING ${COLUMNS}`,
    [id, s.status, s.reason, s.decidedBy, s.decidedAt],
  );
  if (!rows[0]) throw new Error(`approval ${id} is not pending`);
  return rows[0];
}

/** Ids of pending rows due at `now` (the sweeper's work), oldest first. */
export async function dueIds(db: Queryable, now: Date, limit: number): Promise<string[]> {
  const { rows } = await db.query<{ id: string }>(
    `SELECT id FROM broker_approvals WHERE status = 'pending' AND expires_at <= $1 ORDER BY expires_at LIMIT $2`,
    [now, limit],
  );
  return rows.map((r) => r.id);
}

/**
 * Appends a change to the feed in the transaction `tx` that made it; returns its seq. The advisory lock
 * held to the commit makes seq order commit order across connections and brokers sharing the store.
 */
export async function appendEvent(tx: Queryable, view: ApprovalView, at: Date): Promise<number> {
  await tx.query('SELECT pg_advisory_xact_lock($1)', [EVENTS_LOCK]);
  const { rows } = await tx.query<{ seq: string }>(
    'INSERT INTO broker_approval_events (approval_id, org_id, view, at) VALUES ($1, $2, $3, $4) RETURNING seq',
    [view.id, view.org_id, JSON.stringify(view), at],
  );
  return Number(rows[0]!.seq);
}

export interface FeedEvent {
  seq: number;
  view: ApprovalView;
}

/** An org's changes after `seq`, in order, at most `limit`. */
export async function eventsAfter(db: Queryable, org: string, seq: number, limit: number): Promise<FeedEvent[]> {
  const { rows } = await db.query<{ seq: string; view: ApprovalView | string }>(
    'SELECT seq, view FROM broker_approval_events WHERE org_id = $1 AND seq > $2 ORDER BY seq LIMIT $3',
    [org, seq, limit],
  );
  return rows.map((r) => ({ seq: Number(r.seq), view: typeof r.view === 'string' ? JSON.parse(r.view) : r.view }));
}

/** The newest seq of the whole feed (0 when empty): where a stream opened without Last-Event-ID starts. */
export async function latestSeq(db: Queryable): Promise<number> {
  const { rows } = await db.query<{ seq: string | null }>('SELECT max(seq) AS seq FROM broker_approval_events');
  return Number(rows[0]?.seq ?? 0);
}

/** Drops feed events older than `before`; returns how many. */
export async function pruneEvents(db: Queryable, before: Date): Promise<number> {
  const { rows } = await db.query<{ seq: string }>('DELETE FROM broker_approval_events WHERE at < $1 RETURNING seq', [
    before,
  ]);
  return rows.length;
}
