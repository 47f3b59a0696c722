import { availableParallelism } from 'node:os';
import { performance } from 'node:perf_hooks';
import { MessageChannel, receiveMessageOnPort, type MessagePort } from 'node:worker_threads';
import { Piscina } from 'piscina';
import { lazyPool, type InspectionPool } from './lazy-pool.ts';
import type { Registry } from 'prom-client';
import { counter, createRegistry, gauge, histogram } from '../core/metrics.ts';
import { silentLogger, type Logger } from '../core/logger.ts';
import { BodyTooLargeError, DeadlineError } from './errors.ts';
import type { Finding, Phase } from './finding.ts';
import { MODEL_RESTRICTION } from './inspectors/registry.ts';
import { callSidecar, type SidecarIdentity } from './inspectors/sidecar.ts';
import { hasInspector, PlanCache, type ScanPlan } from './plan.ts';
import { isInert } from './policy/resolve.ts';
import type { ResolvedPolicy, Sidecar } from './policy/types.ts';
import { builtinInspectors, hasBuiltinWork, scanBody, type InspectorFailure, type ScanResult } from './scan.ts';
import type { InspectorReport, WorkerTask } from './worker.ts';

// The inspection engine:
//
//   body ─┬─ inert policy ─────────────────────────────────────────────▶ allow (no cost)
//         ├─ sidecars (on_request / on_response) ── undici ──────────────┐  async: fire and forget
//         └─ built-ins ─┬─ small body: inline (scanBody on this thread) ─┤
//                       └─ large body: piscina worker, body shared ──────┤
//                                      all under --inspect-timeout ──────┴─▶ decision + findings
//
// Decision: a `block` finding blocks on the request path (observe-only on the response path). An
// inspector that failed or missed the deadline is a recorded fail-open (`inspection failopen`, logged
// and counted), or with failClosed a request-path `unavailable` (the 503 of the spec). Sidecars always
// fail open. Findings of the inspectors that did finish still count: a known leak is never let through
// because another inspector failed. In the pool each built-in inspector reports as it finishes, so at
// the deadline the ones that finished count and the ones that did not are named, one failure each.

export const MAX_BODY_BYTES = 32 * 1024 * 1024;
// The proxy limits what the agent sends to 32 MB; what it inspects is that body plus the
// security-context prefix (and, translated, a re-encoding), so the engine allows a little more.
export const MAX_INSPECTED_BYTES = MAX_BODY_BYTES + 1024 * 1024;
export const DEFAULT_INSPECT_TIMEOUT_MS = 2000;
// Below this size a scan costs less than a pool round trip (bench/RESULTS.md, "inline vs pool").
export const DEFAULT_INLINE_THRESHOLD_BYTES = 128 * 1024;
// From this size, with two or more workers, the custom patterns (decode + RE2) and the other
// inspectors scan the shared body on two workers at once: 1.9× faster at 32 MB, slower at 1 MB where
// the second round trip costs more than it saves (bench/RESULTS.md).
export const SPLIT_THRESHOLD_BYTES = 4 * 1024 * 1024;

export type Decision = 'allow' | 'block' | 'unavailable';

export interface InspectRequest {
  body: Buffer;
  phase: Phase;
  policy: ResolvedPolicy;
  /** The agent's secret values; only values of 8+ characters are scanned. */
  secrets?: readonly string[];
  identity?: SidecarIdentity;
  /** Response phase: the request body, for sidecars that want `context.recent_messages`. */
  requestBody?: Buffer;
  /** Request phase: model restriction reads every model named anywhere in the body (ScanRequest.modelsAnywhere). */
  modelsAnywhere?: { contentType: string | null };
}

export interface InspectionOutcome {
  decision: Decision;
  findings: Finding[];
  /** Something failed and the call went ahead anyway (the `inspection failopen` marker). */
  failOpen: boolean;
  failures: InspectorFailure[];
  mode: 'noop' | 'inline' | 'pool';
  durationMs: number;
}

export interface EngineOptions {
  timeoutMs?: number;
  /**
   * How long a pooled scan may wait for a free worker before it counts as not run (`queue_timeout`).
   * Default: 10× timeoutMs, at least 20 s.
   */
  queueTimeoutMs?: number;
  failClosed?: boolean;
  inlineThresholdBytes?: number;
  /** Worker threads for large bodies; 0 runs everything inline. Default: one per core. */
  threads?: number;
  logger?: Logger;
  registry?: Registry;
  /** Findings of async sidecars, which arrive after the decision (for audit). */
  onAsyncFindings?: (findings: Finding[], meta: { phase: Phase; sidecar: string }) => void;
  /** The worker module; tests point it at a worker that hangs to prove the deadline replaces it. */
  workerUrl?: URL;
}

const EMPTY: ScanResult = { findings: [], failures: [] };
const BUILTINS = 'builtin';

/** A body in shared memory crosses to a worker without a copy; anything else is copied once, here. */
export function toShared(body: Buffer): Uint8Array {
  if (body.buffer instanceof SharedArrayBuffer) return body;
  const shared = new Uint8Array(new SharedArrayBuffer(body.length));
  shared.set(body);
  return shared;
}

/** A Buffer in shared memory: read a large body straight into it and the pool never copies it. */
export function allocShared(size: number): Buffer {
  return Buffer.from(new SharedArrayBuffer(size));
}

export class InspectionEngine {
  #timeoutMs: number;
  #queueTimeoutMs: number;
  #failClosed: boolean;
  #inlineThreshold: number;
  #pool: InspectionPool | null;
  #threads: number;
  #plans: PlanCache;
  #log: Logger;
  #onAsync: EngineOptions['onAsyncFindings'];
  #metrics;

  constructor(options: EngineOptions = {}) {
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_INSPECT_TIMEOUT_MS;
    this.#queueTimeoutMs = options.queueTimeoutMs ?? Math.max(10 * this.#timeoutMs, 20_000);
    this.#failClosed = options.failClosed ?? false;
    this.#inlineThreshold = options.inlineThresholdBytes ?? DEFAULT_INLINE_THRESHOLD_BYTES;
    this.#log = options.logger ?? silentLogger();
    this.#onAsync = options.onAsyncFindings;
    const threads = options.threads ?? availableParallelism();
    this.#threads = threads;
    const self = import.meta.url.endsWith('.ts') ? './worker.ts' : './worker.js';
    this.#pool =
      threads > 0
        ? // Started by the first pooled body (pipeline/lazy-pool.ts): an idle gateway holds no thread.
          lazyPool(
            () =>
              new Piscina({
                filename: (options.workerUrl ?? new URL(self, import.meta.url)).href,
                minThreads: 1,
                maxThreads: threads,
                idleTimeout: 60_000,
              }),
          )
        : null;
    this.#plans = new PlanCache({ onCompile: (plan) => this.#reportCompile(plan) });
    const registry = options.registry ?? createRegistry();
    this.#metrics = {
      runs: counter(registry, 'dvx_inspection_runs_total', 'Inspection runs by phase, mode and decision', [
        'phase',
        'mode',
        'decision',
      ]),
      findings: counter(registry, 'dvx_inspection_findings_total', 'Findings by inspector and severity', [
        'inspector_type',
        'severity',
      ]),
      failopen: counter(registry, 'dvx_inspection_failopen_total', 'Inspector failures passed over (fail open)', [
        'phase',
        'inspector',
        'reason',
      ]),
      failclosed: counter(
        registry,
        'dvx_inspection_failclosed_total',
        'Request-path inspections refused because inspection failed',
        ['inspector', 'reason'],
      ),
      queue: gauge(registry, 'dvx_inspection_pool_queue_depth', 'Inspection tasks waiting for a pool worker'),
      duration: histogram(
        registry,
        'dvx_inspection_duration_seconds',
        'Inspection run time',
        ['phase', 'mode'],
        [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      ),
    };
  }

  #reportCompile(plan: ScanPlan): void {
    for (const w of plan.warnings) this.#log.warn({ policy_version: plan.version, ...w.fields }, w.message);
  }

  async inspect(request: InspectRequest): Promise<InspectionOutcome> {
    const started = performance.now();
    const { body, phase, policy } = request;
    if (body.length > MAX_INSPECTED_BYTES)
      throw new BodyTooLargeError(`body of ${body.length} bytes exceeds ${MAX_INSPECTED_BYTES}`);
    if (isInert(policy))
      return { decision: 'allow', findings: [], failOpen: false, failures: [], mode: 'noop', durationMs: 0 };

    const plan = this.#plans.get(policy);
    const secrets = request.secrets ?? [];
    const builtinWork = hasBuiltinWork(plan, phase, secrets.length);
    // A large inference body's model is checked here, on the main thread, before the pool runs: one
    // walk of the top level, milliseconds even at 32 MB, so no body is slow enough to carry a denied
    // model past the deadline. The pool gets the rest, if there is a rest.
    const large = this.#pool !== null && body.length >= this.#inlineThreshold;
    const modelFirst = large && phase === 'request' && hasInspector(plan, MODEL_RESTRICTION) && !request.modelsAnywhere;
    const pooled = large && (modelFirst ? hasBuiltinWork(plan, phase, secrets.length, true) : builtinWork);
    const identity = request.identity ?? { agentId: '', orgId: '', agentName: '' };
    let waitedSidecars = false;
    for (const sidecar of policy.sidecars) {
      if (!(phase === 'request' ? sidecar.on_request : sidecar.on_response)) continue;
      if (sidecar.async) this.#fireAndForget(sidecar, request, identity);
      else waitedSidecars = true;
    }

    let results: ScanResult[];
    let mode: InspectionOutcome['mode'] = 'inline';
    if (!pooled && !waitedSidecars) {
      // Everything runs here and now: no deadline timer to arm (it could not interrupt a synchronous
      // scan anyway; bodies this small are bounded by the inline threshold).
      results = [builtinWork ? this.#inline(plan, body, phase, secrets, request.modelsAnywhere) : EMPTY];
    } else {
      const deadline = new AbortController();
      const timer = setTimeout(() => deadline.abort(new DeadlineError('inspection deadline')), this.#timeoutMs);
      const waited: Promise<ScanResult>[] = [];
      for (const sidecar of policy.sidecars) {
        if ((phase === 'request' ? sidecar.on_request : sidecar.on_response) && !sidecar.async)
          waited.push(this.#runSidecar(sidecar, request, identity, deadline.signal));
      }
      let builtins: Promise<ScanResult> = Promise.resolve(EMPTY);
      if (pooled) {
        mode = 'pool';
        if (modelFirst) waited.push(Promise.resolve(this.#modelOnly(plan, body)));
        builtins = this.#onPool(policy, body, phase, secrets, request.modelsAnywhere, modelFirst);
      } else if (builtinWork) {
        builtins = Promise.resolve(this.#inline(plan, body, phase, secrets, request.modelsAnywhere));
      }
      results = await Promise.all([builtins, ...waited]);
      clearTimeout(timer);
    }

    const findings: Finding[] = [];
    const failures: InspectorFailure[] = [];
    for (const r of results) {
      for (const f of r.findings) findings.push(f);
      for (const f of r.failures) failures.push(f);
    }
    const blocked = phase === 'request' && findings.some((f) => f.severity === 'block');
    const builtinFailed = failures.some((f) => !f.inspector.startsWith('sidecar:'));
    const decision: Decision = blocked
      ? 'block'
      : phase === 'request' && builtinFailed && this.#failClosed
        ? 'unavailable'
        : 'allow';
    const failOpen = failures.length > 0 && decision !== 'unavailable';
    const durationMs = performance.now() - started;
    this.#record(phase, mode, decision, findings, failures, durationMs);
    return { decision, findings, failOpen, failures, mode, durationMs };
  }

  #modelOnly(plan: ScanPlan, body: Buffer): ScanResult {
    return this.#inline(plan, body, 'request', [], undefined, true);
  }

  #inline(
    plan: ScanPlan,
    body: Buffer,
    phase: Phase,
    secrets: readonly string[],
    modelsAnywhere: InspectRequest['modelsAnywhere'],
    modelOnly = false,
  ): ScanResult {
    try {
      return scanBody(plan, { body, phase, secrets, modelsAnywhere, modelOnly });
    } catch (err) {
      // Only a fault of the scanner itself lands here (each inspector's throw is its own failure); it
      // is recorded, and logged with the run's other failures (#record).
      return { findings: [], failures: [{ inspector: BUILTINS, reason: (err as Error).message }] };
    }
  }

  /**
   * A pooled scan's deadline runs from the moment a worker starts it, not from the request: time spent
   * waiting for a free worker is not inspection time, and counting it let a crowd of large bodies push
   * every other request's scan past the deadline before it ran (fail open with nothing inspected). The
   * wait has its own, longer bound (`queue_timeout`). The worker flags its start in shared memory.
   */
  async #onPool(
    policy: ResolvedPolicy,
    body: Buffer,
    phase: Phase,
    secrets: readonly string[],
    modelsAnywhere: InspectRequest['modelsAnywhere'],
    skipModel = false,
  ): Promise<ScanResult> {
    const shared = toShared(body);
    const plan = this.#plans.get(policy);
    const split =
      this.#threads >= 2 &&
      body.length >= SPLIT_THRESHOLD_BYTES &&
      policy.content !== null &&
      policy.content.patterns.length > 0;
    const parts: WorkerTask['part'][] = split ? ['patterns', 'others'] : ['all'];
    this.#metrics.queue.set(this.#pool!.queueSize);
    const results = await Promise.all(
      parts.map(async (part): Promise<ScanResult> => {
        // The worker posts each inspector's result here as it finishes; read only if the task fails.
        const { port1, port2 } = new MessageChannel();
        const started = new Int32Array(new SharedArrayBuffer(4));
        const task: WorkerTask = {
          body: shared,
          policy,
          phase,
          secrets: [...secrets],
          part,
          port: port2,
          started,
          ...(modelsAnywhere ? { modelsAnywhere } : {}),
          ...(skipModel ? { skipModel } : {}),
        };
        const abort = new AbortController();
        let deadline: NodeJS.Timeout | undefined;
        let settled = false;
        const wait = Atomics.waitAsync(started, 0, 0, this.#queueTimeoutMs);
        void Promise.resolve(wait.value).then((outcome) => {
          if (settled) return;
          if (outcome === 'timed-out') abort.abort('queue_timeout');
          else if (!abort.signal.aborted) deadline = setTimeout(() => abort.abort('timeout'), this.#timeoutMs);
        });
        try {
          // On abort piscina terminates the worker running the task and starts a fresh one: a hung
          // worker is replaced, never waited on.
          return (await this.#pool!.run(task, { signal: abort.signal, transferList: [port2] })) as ScanResult;
        } catch (err) {
          const reason = abort.signal.aborted ? String(abort.signal.reason) : (err as Error).message || 'worker error';
          return finishedBefore(port1, builtinInspectors(plan, phase, secrets.length, part, skipModel), reason);
        } finally {
          settled = true;
          clearTimeout(deadline);
          // A task that failed before a worker took it: wake the waiter rather than leave it to time out.
          if (Atomics.load(started, 0) === 0) Atomics.notify(started, 0);
          port1.close();
        }
      }),
    );
    if (results.length === 1) return results[0];
    const failures = [...results[0].failures, ...results[1].failures].filter(
      (f, i, all) => all.findIndex((g) => g.inspector === f.inspector && g.reason === f.reason) === i,
    );
    return { findings: [...results[1].findings, ...results[0].findings], failures };
  }

  async #runSidecar(
    sidecar: Sidecar,
    request: InspectRequest,
    identity: SidecarIdentity,
    signal: AbortSignal,
  ): Promise<ScanResult> {
    try {
      const findings = await callSidecar({
        sidecar,
        phase: request.phase,
        body: request.body,
        identity,
        requestBody: request.requestBody,
        signal,
      });
      return { findings, failures: [] };
    } catch (err) {
      const reason = (err as { reason?: string }).reason ?? 'error';
      this.#log.warn({ err, sidecar: sidecar.name, phase: request.phase, reason }, 'sidecar failed');
      return { findings: [], failures: [{ inspector: `sidecar:${sidecar.name}`, reason }] };
    }
  }

  #fireAndForget(sidecar: Sidecar, request: InspectRequest, identity: SidecarIdentity): void {
    const { phase } = request;
    callSidecar({ sidecar, phase, body: request.body, identity, requestBody: request.requestBody }).then(
      (findings) => {
        for (const f of findings)
          this.#metrics.findings.inc({ inspector_type: f.inspector_type, severity: f.severity });
        if (findings.length > 0) this.#log.info({ sidecar: sidecar.name, phase, findings }, 'async sidecar findings');
        this.#onAsync?.(findings, { phase, sidecar: sidecar.name });
      },
      (err: Error & { reason?: string }) => {
        const reason = err.reason ?? 'error';
        this.#metrics.failopen.inc({ phase, inspector: `sidecar:${sidecar.name}`, reason });
        this.#log.warn({ err, sidecar: sidecar.name, phase, reason, async: true }, 'inspection failopen');
      },
    );
  }

  #record(
    phase: Phase,
    mode: string,
    decision: Decision,
    findings: Finding[],
    failures: InspectorFailure[],
    durationMs: number,
  ): void {
    this.#metrics.runs.inc({ phase, mode, decision });
    this.#metrics.duration.observe({ phase, mode }, durationMs / 1000);
    for (const f of findings) this.#metrics.findings.inc({ inspector_type: f.inspector_type, severity: f.severity });
    if (failures.length === 0) return;
    if (decision === 'unavailable') {
      for (const f of failures)
        this.#metrics.failclosed.inc({ inspector: f.inspector, reason: metricReason(f.reason) });
      this.#log.error({ phase, failures }, 'inspection unavailable (fail closed)');
      return;
    }
    for (const f of failures)
      this.#metrics.failopen.inc({ phase, inspector: f.inspector, reason: metricReason(f.reason) });
    this.#log.warn({ phase, failures, decision }, 'inspection failopen');
  }

  async close(): Promise<void> {
    await this.#pool?.destroy();
    this.#pool = null;
  }
}

/**
 * What a pool task that failed (the deadline, a crash) had reported: the results of the inspectors
 * that finished, and a failure naming each one that did not.
 */
function finishedBefore(port: MessagePort, expected: readonly string[], reason: string): ScanResult {
  const findings: Finding[] = [];
  const failures: InspectorFailure[] = [];
  const finished = new Set<string>();
  for (let m = receiveMessageOnPort(port); m !== undefined; m = receiveMessageOnPort(port)) {
    const report = m.message as InspectorReport;
    finished.add(report.inspector);
    for (const f of report.result.findings) findings.push(f);
    for (const f of report.result.failures) failures.push(f);
  }
  for (const inspector of expected) if (!finished.has(inspector)) failures.push({ inspector, reason });
  return { findings, failures };
}

/** Failure reasons become label values: keep them to a small fixed set. */
function metricReason(reason: string): string {
  return ['timeout', 'queue_timeout', 'deadline', 'network', 'status', 'bad_json', 'too_large'].includes(reason)
    ? reason
    : 'error';
}
