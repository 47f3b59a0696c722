import { ApiError } from '../../../core/errors.ts';
import { newId } from '../../../core/ids.ts';
import { PROBLEMS } from '../../../core/problem.ts';
import { ApprovalLimitError } from '../../errors.ts';
import { getAgent, refusalOf } from '../agents.ts';
import { auditedChange, auditRefusal, type BrokerActor } from '../audit.ts';
import type { BrokerDeps } from '../deps.ts';
import { announce, logChange, type LoggedChange } from './feed.ts';
import { checkLimits } from './limits.ts';
import { findByCall, insertApproval } from './store.ts';
import { approvalView, type ApprovalView } from './view.ts';

// A held tool call becomes a pending approval (POST /v1/satellite/approvals, from llmproxy). The agent
// must be one this enclave runs, in the org the request names, and allowed to act (not suspended,
// isolated or contained). The limits are counted and the row inserted in one transaction under the
// org's advisory lock: creates racing each other are serialized per org, so none slips past a limit.
// A create sent again for the same call (agent, request_id, call_id) answers the approval it made.

export interface ApprovalRequest {
  request_id: string;
  call_id: string;
  org_id: string;
  agent_id: string;
  agent_name: string;
  model: string;
  tool: string;
  arguments: string;
  args_digest: string;
  rule: string;
  summary: string;
  policy_version: string;
  expires_in_ms: number;
}

/** The advisory lock (with the org's hash) creates of one org take. */
const ORG_LOCK = 0x64767804;

/** The approval made for the call `r` names (created now, or by an earlier identical create). */
export async function createApproval(deps: BrokerDeps, actor: BrokerActor, r: ApprovalRequest): Promise<ApprovalView> {
  const agent = await getAgent(deps.db, r.agent_id);
  if (!agent || agent.org_id !== r.org_id)
    throw new ApiError(PROBLEMS.notFound, `this enclave runs no agent ${r.agent_id} in org ${r.org_id}`);
  const refusal = refusalOf(agent);
  if (refusal) {
    await auditRefusal(deps, actor, 'approval.create', r.org_id, `agent:${r.agent_id}`, refusal);
    throw new ApiError(PROBLEMS.forbidden, `${refusal}: no approval is requested for it`);
  }
  const again = await findByCall(deps.db, r.agent_id, r.request_id, r.call_id);
  if (again) return replayed(deps, again, r);

  const now = deps.now();
  let change: LoggedChange;
  try {
    change = await auditedChange(deps, actor, 'approval.create', r.org_id, async (tx) => {
      await tx.query('SELECT pg_advisory_xact_lock($1, hashtext($2))', [ORG_LOCK, r.org_id]);
      await checkLimits(tx, r.org_id, r.agent_id, now);
      const row = await insertApproval(tx, {
        id: newId(),
        org_id: r.org_id,
        agent_id: r.agent_id,
        agent_name: agent.name,
        request_id: r.request_id,
        call_id: r.call_id,
        model: r.model,
        tool: r.tool,
        arguments: r.arguments,
        args_digest: r.args_digest,
        rule: r.rule,
        summary: r.summary,
        policy_version: r.policy_version,
        status: 'pending',
        reason: null,
        created_at: new Date(now),
        expires_at: new Date(now + r.expires_in_ms),
        decided_by: null,
        decided_at: null,
      });
      return {
        result: await logChange(deps, tx, row),
        resource: `approval:${row.id}`,
        attrs: {
          agent_id: row.agent_id,
          tool: row.tool,
          rule: row.rule,
          args_digest: row.args_digest,
          policy_version: row.policy_version,
          request_id: row.request_id,
          call_id: row.call_id,
          model: row.model,
          expires_at: new Date(row.expires_at).toISOString(),
        },
      };
    });
  } catch (err) {
    if (err instanceof ApprovalLimitError) {
      await auditRefusal(
        deps,
        actor,
        'approval.create',
        r.org_id,
        `agent:${r.agent_id}`,
        `${err.message} (${err.limit})`,
      );
      throw err;
    }
    // The same call created meanwhile by a create racing this one (the unique index refused this one).
    if ((err as { code?: string }).code === '23505') {
      const raced = await findByCall(deps.db, r.agent_id, r.request_id, r.call_id);
      if (raced) return replayed(deps, raced, r);
    }
    throw err;
  }
  announce(deps, change);
  return approvalView(change.row, deps.now());
}

/** An earlier approval of the same call: answered when it is the same request (org, tool, digest, policy), 409 when it is not. */
function replayed(deps: BrokerDeps, row: Parameters<typeof approvalView>[0], r: ApprovalRequest): ApprovalView {
  if (
    row.org_id !== r.org_id ||
    row.tool !== r.tool ||
    row.args_digest !== r.args_digest ||
    row.policy_version !== r.policy_version
  )
    throw new ApiError(
      PROBLEMS.conflict,
      `an approval with another tool, other arguments or another policy version exists for request ${r.request_id} call ${r.call_id}`,
    );
  return approvalView(row, deps.now());
}
