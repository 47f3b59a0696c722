import type { IncomingMessage, ServerResponse } from 'node:http';
import { performance } from 'node:perf_hooks';
import type { Dispatcher } from 'undici';
import type { Logger } from '../../core/logger.ts';
import { newId } from '../../core/ids.ts';
import type { AuditSink } from '../../audit-wal/sink.ts';
import type { CaptureOptions } from '../../audit-wal/gate.ts';
import type { InspectionEngine } from '../../pipeline/engine.ts';
import type { Finding, Phase } from '../../pipeline/finding.ts';
import type { PolicyCache } from '../../pipeline/policy/cache.ts';
import type { EffectiveGovernance } from '../../pipeline/policy/governance.ts';
import type { Snapshot, WireFormat } from '../../pipeline/policy/snapshot.ts';
import type { ResolvedPolicy } from '../../pipeline/policy/types.ts';
import type { ApprovalsClient } from './approvals-client.ts';
import type { BodyBudget } from '../../core/body-budget.ts';
import type { RemovedAgents } from './agent-standing.ts';
import type { AgentAuthenticator, AgentIdentity } from './auth.ts';
import type { ProxyMetrics } from './metrics.ts';
import type { LlmProxyOptions } from './options.ts';
import type { SecretSource } from './secrets-file.ts';
import type { RefusalMemory } from './tools/refusal-memory.ts';
import type { Decide } from './tools/types.ts';
import type { UpstreamAnswer } from './upstream.ts';
import type { TokenUsage } from './usage.ts';

// One agent call as it goes through the steps (docs/decisions.md, "The request path as steps").
// Everything a step decides lands here once: the snapshot is read once per call (a reload during the
// call never mixes two policies), the flags and the policy are resolved once, and the fields of the
// audit record (steps/audit.ts) fill in as the call goes. Every field is set in the constructor, so
// every call has the same shape.

export interface ProxyDeps {
  options: LlmProxyOptions;
  auth: AgentAuthenticator;
  snapshot: () => Snapshot;
  policies: PolicyCache<ResolvedPolicy>;
  secrets: SecretSource;
  engine: InspectionEngine;
  dispatcher: Dispatcher;
  audit: AuditSink;
  /** The broker's approvals (--approvals-url); null: a call that requires approval is denied. */
  approvals: ApprovalsClient | null;
  log: Logger;
  metrics: ProxyMetrics;
  version: string;
  /**
   * The refused tool calls of rewritten answers, per agent and answer id, for the conversations a
   * provider holds (steps/refused-results.ts); per process, bounded.
   */
  refusals: RefusalMemory;
  /** The request bodies held at once (--max-buffered-bodies): each call's body is taken from it while the call runs. */
  bodies: BodyBudget;
  /** The agents a reload removed from the snapshot (agent-standing.ts): refused, their open calls cut. */
  removed: RemovedAgents;
  /** Answers wait for their record (audit, then replay); capture-or-deny only with a durable sink. */
  capture: Omit<CaptureOptions, 'log'>;
  /**
   * Builds a call's tool-call decision (steps/tool-policy.ts): tool-decisions.ts's `toolDecider` (the
   * caller's llm_policy, the approvals on the broker), unless the proxy was started with another
   * (StartOptions.toolDecider: the relays' tests decide without a broker).
   */
  toolDecider: (ctx: CallContext) => Decide | null;
}

/** An inspector that did not finish (`inspector: 'all'` when none could run: an unreadable answer). */
export interface InspectionFailure {
  phase: Phase;
  inspector: string;
  reason: string;
}

/** One step of a call: reads and fills the context, or throws a Refusal (errors.ts) that ends the call. */
export type Step = (ctx: CallContext) => Promise<void> | void;

export class CallContext {
  readonly d: ProxyDeps;
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  readonly id: string;
  readonly started: number;
  readonly path: string;
  /**
   * The policy snapshot this call reads, and only this one: taken again once the caller is known
   * (steps/authenticate.ts), and from then on never replaced.
   */
  snapshot: Snapshot;

  identity: AgentIdentity | null = null;
  /** `audit:llm` of the caller's org: the call has a record. */
  audit = false;
  /** `inspect:llm` of the caller's org: its bodies go through the pipeline. */
  inspect = false;
  /** Resolved once, by the first inspection that needs it (inspection.ts). */
  policy: ResolvedPolicy | null = null;
  /**
   * The caller's governance policy (llm_policy and the rest), resolved once by admit from the call's
   * snapshot (cached per snapshot and caller: snapshot-governance.ts); null when no governance row nor
   * pack applies to the caller.
   */
  governance: EffectiveGovernance | null = null;

  /**
   * Decides each tool call of the answer (steps/tool-policy.ts, tool-decisions.ts); null when no tool
   * rule applies to this call, and the relays take their path without tool calls.
   */
  decideTool: Decide | null = null;

  /** The agent's wire format (a pass-through route's API family). */
  format: WireFormat | null = null;
  /** Set when the route is an inference route (POST to one of INFERENCE_ROUTES). */
  inference = false;
  /** The format the upstream speaks: the agent's, or --translate-upstream-format. */
  upstreamFormat: WireFormat | null = null;
  /** The security-context prefix (steps/prefix.ts). */
  prefix: string | null = null;
  /** The request body has begun to be read (an earlier refusal drains it). */
  reading = false;
  body: Buffer = EMPTY;
  /** Bytes this call holds of the bodies' budget (ProxyDeps.bodies), given back when it ends. */
  held = 0;
  /** The agent's standing was read and let the call go on (steps/admit.ts): a reload re-checks it. */
  admitted = false;
  /**
   * Why a reload ended this call while it was open (LlmProxy.recheck: the agent is now contained,
   * suspended, isolated, in another org, or removed), else null. Its record says so, whatever the
   * cut made the other steps see afterwards.
   */
  cut: string | null = null;
  /** Aborts the call to the upstream (steps/forward.ts): the agent leaving, or a cut. */
  readonly upstreamAbort = new AbortController();
  credential: string | null = null;
  answer: UpstreamAnswer | null = null;

  // The audit record's fields (steps/audit.ts).
  /** Set when --translate converted the call to another wire format. */
  translatedTo: WireFormat | null = null;
  model: string | null = null;
  requestBytes = 0;
  responseBytes = 0;
  status = 0;
  upstreamStatus: number | null = null;
  upstreamMs: number | null = null;
  findings: Finding[] = [];
  failOpen = false;
  /** The inspectors that did not finish, each with its phase and why (the record's `inspection_failures`). */
  failures: InspectionFailure[] = [];
  decision = 'allow';
  usage: TokenUsage | null = null;
  /** The record was already handed to the sink (before delivery). */
  audited = false;
  error: string | null = null;

  constructor(d: ProxyDeps, req: IncomingMessage, res: ServerResponse, path: string) {
    this.d = d;
    this.req = req;
    this.res = res;
    this.id = newId();
    this.started = performance.now();
    this.path = path;
    this.snapshot = d.snapshot();
  }
}

const EMPTY = Buffer.alloc(0);
