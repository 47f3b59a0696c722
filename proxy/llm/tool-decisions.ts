import { performance } from 'node:perf_hooks';
import { newId } from '../../core/ids.ts';
import { gated } from '../../audit-wal/gate.ts';
import { AuditUnavailableError } from '../../audit-wal/errors.ts';
import type { LlmGovernance } from '../../pipeline/policy/governance.ts';
import { snapshotAgent } from '../../pipeline/policy/snapshot.ts';
import { governanceOf } from '../../pipeline/policy/snapshot-governance.ts';
import { MAX_APPROVAL_ARGUMENTS_BYTES, MIN_APPROVAL_EXPIRY_MS, type ApprovalView } from './approvals-client.ts';
import type { CallContext } from './context.ts';
import { ApprovalRateLimitError } from './errors.ts';
import { compileToolPolicy, type ToolPolicy } from '../../pipeline/tool-policy/compile.ts';
import { evaluateToolCall, type ToolEvaluation } from '../../pipeline/tool-policy/evaluate.ts';
import { redactArguments } from '../../pipeline/tool-policy/redact.ts';
import { denialMessage } from './tools/denial.ts';
import type { Decide, ToolCall, ToolVerdict } from './tools/types.ts';

// The tool-call decision of one call (docs/decisions.md, "Tool-call decisions: approvals, escalation
// and their record"): the call's `Decide`, built once per call from its governance's
// `llm_policy.inspection`, null when that has no rule (the relays then cost nothing). For each tool
// call of the answer:
//
//   evaluate (strictest matching rule) ─▶ allow ─▶ recorded (durable first, with capture-or-deny) ─▶ run
//                                       ─▶ deny  ─▶ recorded ─▶ the agent reads the denial
//                                       ─▶ require_approval ─▶ no --approvals-url: deny
//                                            create the approval (429: deny, approval rate limit exceeded;
//                                            unreachable: deny) ─▶ held until decided or --escalation-timeout
//                                            approved + same digest, same policy version, in time ─▶ allow
//                                            anything else ─▶ deny; the agent gone ─▶ cancelled, deny
//
// Every decision is one row of `tool_call_decisions` (its call's llm_audit_log id in `call_id`), with
// the arguments redacted of the agent's secrets. The agent reads the reason (--inspection-disclosure
// detailed) or only "refused by policy" (opaque); the record always has the detail. A Decide never
// rejects: a failure inside is a denial, recorded.

type DecidedBy = string;

/** One decision's outcome before it is recorded. */
interface Outcome {
  allow: boolean;
  /** For the record (and the operator): the whole why. */
  reason: string;
  /** What the agent reads under `detailed` (never an internal error text). */
  agentReason: string;
  decidedBy: DecidedBy;
  decidedAt?: string | null;
  approvalId?: string | null;
  heldMs?: number;
}

const compiled = new WeakMap<object, ToolPolicy | null>();

/** The policy compiled once per resolved inspection object (governance is resolved per snapshot). */
function policyFor(inspection: NonNullable<LlmGovernance['inspection']>): ToolPolicy | null {
  let policy = compiled.get(inspection);
  if (policy === undefined) compiled.set(inspection, (policy = compileToolPolicy(inspection)));
  return policy;
}

/** The call's Decide, or null when its governance has no tool rule. */
export function toolDecider(ctx: CallContext): Decide | null {
  const inspection = ctx.governance?.llm.inspection;
  if (!inspection) return null;
  const policy = policyFor(inspection);
  if (policy === null) return null;
  const gone = agentGoneSignal(ctx);
  const decider: Decide = (call) =>
    decide(ctx, policy, call, gone).catch((err: unknown) => internalFailure(ctx, policy, call, err));
  decider.refused = (call, reason) => gateRefusal(ctx, policy, call, reason);
  return decider;
}

/**
 * A call the stream gate refused without asking (an inconsistent stream, the hold bound): recorded as
 * a deny by `gate`, with what the policy would have said as its verdict.
 */
function gateRefusal(ctx: CallContext, policy: ToolPolicy, call: ToolCall, reason: string): void {
  try {
    const ev = unruledEvaluation(policy, call, ctx.model, reason);
    const args = redactArguments(call.arguments, ctx.d.secrets.agentSecrets(ctx.identity!.agentId));
    const outcome: Outcome = {
      allow: false,
      reason: `refused by the tool gate: ${reason}`,
      agentReason: reason,
      decidedBy: 'gate',
    };
    append(ctx, record(ctx, policy, call, ev, args, outcome));
    ctx.d.metrics.toolDecisions.inc({ verdict: ev.verdict, outcome: 'deny' });
  } catch (err) {
    ctx.d.log.error({ err, request_id: ctx.id, tool: call.name }, 'tool call refusal record lost');
  }
}

/**
 * Aborted when the agent's connection closes before its answer was sent, or when a reload cuts the call
 * (LlmProxy.recheck): a held call then cancels its approval. Listened for on first use only.
 */
function agentGoneSignal(ctx: CallContext): () => AbortSignal {
  let controller: AbortController | null = null;
  return () => {
    if (controller) return controller.signal;
    controller = new AbortController();
    const { res, req } = ctx;
    const abort = () => {
      if (!res.writableFinished && !controller!.signal.aborted)
        controller!.abort(new Error(ctx.cut ?? 'the agent disconnected'));
    };
    if (res.destroyed || req.socket?.destroyed || ctx.cut !== null) abort();
    else {
      res.once('close', abort);
      ctx.upstreamAbort.signal.addEventListener('abort', abort, { once: true });
    }
    return controller.signal;
  };
}

async function decide(
  ctx: CallContext,
  policy: ToolPolicy,
  call: ToolCall,
  gone: () => AbortSignal,
): Promise<ToolVerdict> {
  const ev = evaluateToolCall(policy, { name: call.name, arguments: call.arguments, model: ctx.model });
  const args = redactArguments(call.arguments, ctx.d.secrets.agentSecrets(ctx.identity!.agentId));
  let outcome: Outcome;
  if (ev.verdict === 'allow') outcome = { allow: true, reason: ev.reason, agentReason: ev.reason, decidedBy: 'policy' };
  else if (ev.verdict === 'deny')
    outcome = { allow: false, reason: ev.reason, agentReason: ev.reason, decidedBy: 'policy' };
  else outcome = await approval(ctx, policy, call, ev, args, gone());
  return settle(ctx, policy, call, ev, args, outcome);
}

/** A `require_approval` call: held for a person, until decided or --escalation-timeout. */
async function approval(
  ctx: CallContext,
  policy: ToolPolicy,
  call: ToolCall,
  ev: ToolEvaluation,
  args: string,
  gone: AbortSignal,
): Promise<Outcome> {
  const d = ctx.d;
  const started = performance.now();
  const held = () => performance.now() - started;
  const deny = (reason: string, agentReason: string, decidedBy: DecidedBy, more: Partial<Outcome> = {}): Outcome => ({
    allow: false,
    reason,
    agentReason,
    decidedBy,
    heldMs: held(),
    ...more,
  });
  if (d.approvals === null)
    return deny('no approval service configured', 'no approval service configured', 'approvals-unavailable');
  if (gone.aborted) return goneDenial(ctx, 'before the call was decided', deny);
  if (Buffer.byteLength(args) > MAX_APPROVAL_ARGUMENTS_BYTES)
    return deny(
      `the arguments exceed ${MAX_APPROVAL_ARGUMENTS_BYTES} bytes, more than an approval carries`,
      'the arguments are too large to be approved',
      'approvals-unavailable',
    );
  const deadline = started + d.options.escalationTimeout;
  const identity = ctx.identity!;
  let created: ApprovalView;
  try {
    // Not aborted by the agent leaving: an approval created meanwhile is cancelled just below.
    created = await d.approvals.create({
      request_id: newId(),
      call_id: ctx.id,
      org_id: identity.orgId,
      agent_id: identity.agentId,
      agent_name: identity.agentName,
      model: ctx.model ?? '',
      tool: call.name,
      arguments: args,
      args_digest: ev.argsDigest,
      rule: ev.rule,
      summary: ev.summary,
      policy_version: policy.version,
      expires_in_ms: Math.max(MIN_APPROVAL_EXPIRY_MS, Math.round(deadline - performance.now())),
    });
  } catch (err) {
    if (err instanceof ApprovalRateLimitError)
      return deny('approval rate limit exceeded', 'approval rate limit exceeded', 'approval-limit');
    d.log.warn({ err, request_id: ctx.id, tool: call.name }, 'approval could not be created: tool call denied');
    return deny(
      `approval service unavailable: ${(err as Error).message}`,
      'the approval service is unavailable',
      'approvals-unavailable',
    );
  }
  const approvalId = created.id;
  d.log.info({ request_id: ctx.id, tool: call.name, approval_id: approvalId }, 'tool call held for approval');
  let view: ApprovalView;
  try {
    view =
      created.status === 'pending'
        ? await d.approvals.waitDecided(approvalId, deadline, () => performance.now(), gone)
        : created;
  } catch (err) {
    // The call is refused either way: its approval is cancelled, not left pending for a person's yes that
    // would release nothing (the broker's audit would say approved for a call that never ran).
    const cancel = async (): Promise<string> => {
      const cancelled = await d.approvals!.cancel(approvalId).catch((e: unknown) => {
        d.log.warn({ err: e, request_id: ctx.id, approval_id: approvalId }, 'held approval could not be cancelled');
        return undefined;
      });
      return cancelled === null ? ' (it had been decided meanwhile)' : cancelled ? ' (approval cancelled)' : '';
    };
    if (gone.aborted) {
      const note = await cancel();
      return goneDenial(ctx, `while the call was held${note}`, deny, { approvalId });
    }
    d.log.warn({ err, request_id: ctx.id, approval_id: approvalId }, 'approval wait failed: tool call denied');
    // Not waited for: a broker that does not answer would hold the denial up to a request's timeout.
    void cancel();
    return deny(
      `approval service unavailable: ${(err as Error).message}`,
      'the approval service is unavailable',
      'approvals-unavailable',
      { approvalId },
    );
  }
  return applied(view, created, call, ev, policy, currentVersion(ctx), agentRefusal(ctx), deny, held);
}

/**
 * The denial of a call whose agent left, or whose call a reload cut (LlmProxy.recheck: the agent may no
 * longer act), `when` saying at which point of its decision.
 */
function goneDenial(
  ctx: CallContext,
  when: string,
  deny: (reason: string, agentReason: string, decidedBy: DecidedBy, more?: Partial<Outcome>) => Outcome,
  more: Partial<Outcome> = {},
): Outcome {
  if (ctx.cut !== null) return deny(`${ctx.cut} ${when}`, 'the agent may no longer act', 'agent-refused', more);
  return deny(`the agent disconnected ${when}`, 'agent gone', 'agent-gone', more);
}

/**
 * Why the caller may no longer act, by the snapshot the proxy holds now (null: it may): contained,
 * suspended or isolated while its call was held, or moved to another org. admit.ts refuses such an agent
 * at the start of a call; a person's yes given meanwhile must not release a call the agent could no
 * longer make.
 */
function agentRefusal(ctx: CallContext): string | null {
  const { orgId, agentId } = ctx.identity!;
  const agent = snapshotAgent(ctx.d.snapshot(), agentId);
  if (!agent) return null;
  if (agent.org_id !== orgId) return `the agent is no longer in org ${orgId}`;
  if (agent.contained) return 'the agent is contained';
  if (agent.status === 'suspended' || agent.status === 'isolated') return `the agent is ${agent.status}`;
  return null;
}

/**
 * The version of the caller's tool policy in the snapshot the proxy holds now (null: no tool rule any
 * more). A call is held under the policy of its start; an approval given meanwhile applies only while
 * that policy is still the caller's: a person's yes never outlives the policy it was asked under.
 */
function currentVersion(ctx: CallContext): string | null {
  const { orgId, groupId, agentId } = ctx.identity!;
  const inspection = governanceOf(ctx.d.snapshot(), orgId, groupId, agentId)?.llm.inspection;
  return inspection ? (policyFor(inspection)?.version ?? null) : null;
}

/** A decided (or timed-out) approval as the call's outcome: an approval applies only to this call as it is. */
function applied(
  view: ApprovalView,
  created: ApprovalView,
  call: ToolCall,
  ev: ToolEvaluation,
  policy: ToolPolicy,
  /** The caller's policy version now (currentVersion). */
  current: string | null,
  /** Why the caller may no longer act now (agentRefusal), or null. */
  refusal: string | null,
  deny: (reason: string, agentReason: string, decidedBy: DecidedBy, more?: Partial<Outcome>) => Outcome,
  held: () => number,
): Outcome {
  const approvalId = created.id;
  const more = { approvalId, decidedAt: view.decided_at };
  const person = view.decided_by ?? 'unknown';
  switch (view.status) {
    case 'pending':
    case 'expired':
      return deny('escalation timeout', 'escalation timeout', 'escalation-timeout', { approvalId });
    case 'denied':
      return deny(
        `denied by ${person}${view.reason ? `: ${view.reason}` : ''}`,
        `denied by an approver${view.reason ? `: ${view.reason}` : ''}`,
        person,
        more,
      );
    case 'cancelled':
      return deny('the approval was cancelled', 'the approval was cancelled', person, more);
    case 'approved': {
      const decidedAt = view.decided_at === null ? NaN : Date.parse(view.decided_at);
      const expiresAt = Date.parse(view.expires_at);
      const why =
        view.id !== approvalId
          ? `the broker answered for approval ${view.id}`
          : view.tool !== call.name
            ? 'it was given for another tool'
            : view.args_digest !== ev.argsDigest
              ? 'it was given for other arguments (args_digest differs)'
              : view.policy_version !== policy.version
                ? `it was given under policy version ${view.policy_version}, not ${policy.version}`
                : !(decidedAt <= expiresAt)
                  ? 'it was decided after it expired'
                  : current !== policy.version
                    ? `the policy changed while the call was held (version ${policy.version}, now ${current ?? 'none'})`
                    : refusal !== null
                      ? `${refusal} (changed while the call was held)`
                      : null;
      if (why !== null)
        return deny(
          `approved by ${person}, but the approval does not apply: ${why}`,
          'the approval does not apply to this call',
          person,
          more,
        );
      return {
        allow: true,
        reason: `approved by ${person}`,
        agentReason: '',
        decidedBy: person,
        heldMs: held(),
        ...more,
      };
    }
  }
}

/** Records the decision and counts it; an allow that cannot be made durable (capture-or-deny) is a deny. */
async function settle(
  ctx: CallContext,
  policy: ToolPolicy,
  call: ToolCall,
  ev: ToolEvaluation,
  args: string,
  outcome: Outcome,
): Promise<ToolVerdict> {
  const d = ctx.d;
  const row = record(ctx, policy, call, ev, args, outcome);
  if (outcome.allow) {
    try {
      await gated(d.audit, 'tool_call_decisions', row, () => undefined, { ...d.capture, log: d.log });
    } catch (err) {
      if (!(err instanceof AuditUnavailableError)) throw err;
      // The allow went to the sink and may still land: the deny is a row of its own, under a derived id.
      const refused: Outcome = {
        ...outcome,
        allow: false,
        reason: `${outcome.reason}; refused: ${err.message}`,
        agentReason: 'the decision could not be recorded',
      };
      append(ctx, { ...record(ctx, policy, call, ev, args, refused), id: `${row.id}.refused` });
      return counted(ctx, ev, call, refused);
    }
    return counted(ctx, ev, call, outcome);
  }
  append(ctx, row);
  d.log.info(
    {
      request_id: ctx.id,
      tool: call.name,
      tool_call_id: call.id,
      rule: ev.rule,
      verdict: ev.verdict,
      decided_by: outcome.decidedBy,
      reason: outcome.reason,
    },
    'tool call denied',
  );
  return counted(ctx, ev, call, outcome);
}

function counted(ctx: CallContext, ev: ToolEvaluation, call: ToolCall, outcome: Outcome): ToolVerdict {
  const m = ctx.d.metrics;
  const result = outcome.allow ? 'allow' : 'deny';
  m.toolDecisions.inc({ verdict: ev.verdict, outcome: result });
  if (ev.verdict === 'require_approval') m.toolHeld.observe({ outcome: result }, (outcome.heldMs ?? 0) / 1000);
  if (outcome.allow) return { allow: true, message: '' };
  return { allow: false, message: denialMessage(call, outcome.agentReason, ctx.d.options.inspectionDisclosure) };
}

function append(ctx: CallContext, row: Record<string, unknown>): void {
  ctx.d.audit.append('tool_call_decisions', row).catch((err: Error) => {
    ctx.d.log.error({ err, request_id: ctx.id, id: row.id }, 'tool call decision record lost');
  });
}

function record(
  ctx: CallContext,
  policy: ToolPolicy,
  call: ToolCall,
  ev: ToolEvaluation,
  args: string,
  outcome: Outcome,
): Record<string, unknown> {
  const identity = ctx.identity!;
  const now = new Date().toISOString();
  return {
    id: newId(),
    event_time: now,
    call_id: ctx.id,
    org_id: identity.orgId,
    agent_id: identity.agentId,
    agent_name: identity.agentName,
    enclave_id: ctx.d.options.enclaveId || ctx.snapshot.enclave.id,
    model: ctx.model,
    tool: call.name,
    tool_call_id: call.id,
    args_digest: ev.argsDigest,
    arguments: args,
    args_parsed: ev.argsParsed,
    rule: ev.rule,
    inspector: ev.inspector,
    summary: ev.summary,
    verdict: ev.verdict,
    outcome: outcome.allow ? 'allow' : 'deny',
    reason: outcome.reason,
    policy_version: policy.version,
    decided_by: outcome.decidedBy,
    decided_at: outcome.decidedAt ?? now,
    approval_id: outcome.approvalId ?? null,
    held_ms: Math.round((outcome.heldMs ?? 0) * 1000) / 1000,
  };
}

/** A failure inside the decision (a bug): the call is denied, and the denial recorded as far as it can be. */
function internalFailure(ctx: CallContext, policy: ToolPolicy, call: ToolCall, err: unknown): ToolVerdict {
  ctx.d.log.error({ err, request_id: ctx.id, tool: call.name }, 'tool call decision failed: denied');
  const reason = `the decision failed: ${(err as Error)?.message ?? String(err)}`;
  try {
    const ev = unruledEvaluation(policy, call, ctx.model, reason);
    const outcome: Outcome = { allow: false, reason, agentReason: 'the decision failed', decidedBy: 'policy' };
    append(ctx, record(ctx, policy, call, ev, '', outcome));
    return counted(ctx, ev, call, outcome);
  } catch {
    return { allow: false, message: denialMessage(call, 'the decision failed', ctx.d.options.inspectionDisclosure) };
  }
}

/**
 * The record's evaluation of a call denied without a rule (by the gate, or a failure): what the policy
 * says of it (verdict, digest) as far as it can be evaluated, else a deny with neither.
 */
function unruledEvaluation(policy: ToolPolicy, call: ToolCall, model: string | null, reason: string): ToolEvaluation {
  const ev: ToolEvaluation = {
    verdict: 'deny',
    rule: null,
    inspector: null,
    summary: null,
    reason,
    argsDigest: '',
    argsParsed: false,
  };
  try {
    const { verdict, argsDigest, argsParsed } = evaluateToolCall(policy, { ...call, model });
    return { ...ev, verdict, argsDigest, argsParsed };
  } catch {
    return ev;
  }
}
