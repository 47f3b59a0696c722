import { ANY, NULLABLE_STRING, STRING, viewSchema } from '../../../core/schemas.ts';

// An approval as every reader sees it (approvalView: the operator routes, the live feed, the satellite
// routes). A pending row past its expiry reads as `expired` (decided by `escalation-timeout` at
// `expires_at`) before the sweeper marks it, so no reader ever acts on a pending approval whose time is up.

export const APPROVAL_STATUSES = ['pending', 'approved', 'denied', 'expired', 'cancelled'] as const;
export type ApprovalStatus = (typeof APPROVAL_STATUSES)[number];

/** Who expires an approval nobody decided in time (its audit actor and `decided_by`). */
export const EXPIRY_ACTOR = 'escalation-timeout';

/** A row of broker_approvals as the store returns it (timestamps as Date). */
export interface ApprovalRow {
  id: string;
  org_id: string;
  agent_id: string;
  agent_name: string;
  request_id: string;
  call_id: string;
  model: string;
  tool: string;
  arguments: string;
  args_digest: string;
  rule: string;
  summary: string;
  policy_version: string;
  status: ApprovalStatus;
  reason: string | null;
  created_at: Date;
  expires_at: Date;
  decided_by: string | null;
  decided_at: Date | null;
}

export interface ApprovalView {
  id: string;
  org_id: string;
  agent_id: string;
  agent_name: string;
  tool: string;
  /** The redacted arguments: parsed JSON when they parse, else the text. */
  arguments: unknown;
  args_digest: string;
  rule: string;
  summary: string;
  policy_version: string;
  status: ApprovalStatus;
  reason: string | null;
  created_at: string;
  expires_at: string;
  decided_by: string | null;
  decided_at: string | null;
}

export const APPROVAL_VIEW = viewSchema('approvalView', {
  id: STRING,
  org_id: STRING,
  agent_id: STRING,
  agent_name: STRING,
  tool: STRING,
  arguments: ANY,
  args_digest: STRING,
  rule: STRING,
  summary: STRING,
  policy_version: STRING,
  status: STRING,
  reason: NULLABLE_STRING,
  created_at: STRING,
  expires_at: STRING,
  decided_by: NULLABLE_STRING,
  decided_at: NULLABLE_STRING,
});

const iso = (d: Date | string): string => new Date(d).toISOString();

function parsed(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** Whether a pending row's time is up at `nowMs`. */
export const isDue = (row: Pick<ApprovalRow, 'status' | 'expires_at'>, nowMs: number): boolean =>
  row.status === 'pending' && new Date(row.expires_at).getTime() <= nowMs;

/** The row as readers see it at `nowMs`. */
export function approvalView(row: ApprovalRow, nowMs: number): ApprovalView {
  const due = isDue(row, nowMs);
  return {
    id: row.id,
    org_id: row.org_id,
    agent_id: row.agent_id,
    agent_name: row.agent_name,
    tool: row.tool,
    arguments: parsed(row.arguments),
    args_digest: row.args_digest,
    rule: row.rule,
    summary: row.summary,
    policy_version: row.policy_version,
    status: due ? 'expired' : row.status,
    reason: due ? 'no decision before expires_at' : row.reason,
    created_at: iso(row.created_at),
    expires_at: iso(row.expires_at),
    decided_by: due ? EXPIRY_ACTOR : row.decided_by,
    decided_at: due ? iso(row.expires_at) : row.decided_at === null ? null : iso(row.decided_at),
  };
}
