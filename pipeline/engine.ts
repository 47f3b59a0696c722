import { availableParallelism } from 'node:os';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { MessageChannel, receiveMessageOnPort, type MessagePort } from 'node:worker_threads';
import { Piscina } from 'piscina';
import { lazyPool, type InspectionPool } from './lazy-pool.ts';
import type { Registry } from 'prom-client';
import { counter, createRegistry, gauge, histogram } from '../core/metrics.ts';
import { silentLogger, type Logger } from '../core/logger.ts';
import { conversationParts, group, MIN_PART_BYTES, skeleton } from './conversation-parts.ts';
import { copyBytes } from './shared-bytes.ts';
import { pooledPolicy } from './pooled-policy.ts';
import { BodyTooLargeError, DeadlineError } from './errors.ts';
import { MAX_FINDINGS_PER_INSPECTOR, type Finding, type Phase } from './finding.ts';
import type { Span } from './json-view.ts';
import { DEFAULT_CACHE_BYTES, PartCache } from './part-cache.ts';
import { type Recall, ResentParts } from './resent-parts.ts';
import { id as PATTERNS, type PatternPlan } from './inspectors/patterns.ts';
import { MODEL_RESTRICTION } from './inspectors/registry.ts';
import { carriesJsonEscapes } from './json-view.ts';
import { mergeResults, planRanges, secretsReach, type ByteRange, type ViewContext } from './byte-ranges.ts';
import { callSidecar, type SidecarIdentity } from './inspectors/sidecar.ts';
import { hasInspector, PlanCache, type ScanPlan } from './plan.ts';
import { isInert } from './policy/resolve.ts';
import type { ResolvedPolicy, Sidecar } from './policy/types.ts';
import { builtinInspectors, hasBuiltinWork, scanBody, type InspectorFailure, type ScanResult } from './scan.ts';
import type { InspectorReport, WorkerTask } from './worker.ts';
import { StreamInspection } from './stream-inspection.ts';
import { scanStretch, stretchInspectors, type StretchTask } from './stream-scan.ts';

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
/** --inspection-cache-mb: the per-part inspection cache's default cap, and the most it may be set to. */
export const DEFAULT_INSPECTION_CACHE_MB = DEFAULT_CACHE_BYTES / (1024 * 1024);
export const MAX_INSPECTION_CACHE_MB = 64 * 1024;
// The cache hashes a body's parts on the event loop (sha256, ~1 ms per MB here): past this size a body
// is scanned whole, as before, off the loop and split across two workers (SPLIT_THRESHOLD_BYTES).
export const MAX_CACHED_BODY_BYTES = SPLIT_THRESHOLD_BYTES;
// Adaptive offload: while the event loop falls behind (its delay's p99 over a sampling window at or
// above LAG_HIGH_MS), bodies from this size go to the pool too, so that one mid-sized body's scan does
// not hold up every small call queued behind it; back to the inline threshold once the p99 is at or
// below LAG_LOW_MS (the gap between the two is the hysteresis). docs/decisions.md, "Adaptive offload".
export const ADAPTIVE_INLINE_THRESHOLD_BYTES = 16 * 1024;
export const LAG_HIGH_MS = 20;
export const LAG_LOW_MS = 5;
export const LAG_WINDOW_MS = 1000;
const LAG_RESOLUTION_MS = 10;

// From this size a request body is cut into one byte range per worker (byte-ranges.ts), each scanned
// by every inspector: docs/decisions.md, "Splitting a large body by byte range" has the measurements.
export const RANGE_THRESHOLD_BYTES = 4 * 1024 * 1024;

/** One pool task of a body: which inspectors, over which bytes (all of them when no range). */
interface PoolTask {
  part: WorkerTask['part'];
  range?: ByteRange;
  /** Model restriction runs in this range's task, over the whole body (it reads the top level). */
  modelWhole?: boolean;
  /** What a range's views must know of the whole body. */
  context?: ViewContext;
}

/**
 * How far a policy's custom patterns reach across an edge (patterns.ts, PatternPlan.rangeReach: an
 * unbounded pattern by its literal, found around it in each range), or null when one cannot be split
 * (unbounded with no literal). Such a pattern would scan the whole body as a task of its own, and its
 * views (decode, normalization) cost most of a whole scan: measured, that ran no faster than the split
 * by inspector, so the body is split by inspector instead (docs/decisions.md).
 */
function patternReachOf(plan: ScanPlan): number | null {
  const patterns = plan.inspectors.find((p) => p.inspector.id === PATTERNS)?.compiled as PatternPlan | undefined;
  return patterns ? patterns.rangeReach : 0;
}

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
  /**
   * The per-part inspection cache's cap in bytes (part-cache.ts); 0 turns it off. Default 64 MiB.
   * Request phase, inference bodies only (docs/decisions.md, "The per-part inspection cache").
   */
  cacheBytes?: number;
  /** The pool's module for a streamed response's stretches (stream-scan.ts); tests point it at a faulty one. */
  streamWorkerUrl?: URL;
  /**
   * Adaptive offload (ADAPTIVE_INLINE_THRESHOLD_BYTES); null turns it off. Default: the constants above
   * when this process may run on two cores or more (`cores`), else off.
   */
  adaptiveOffload?: AdaptiveOffload | null;
  /** The cores this process may run on. Default: os.availableParallelism(), which reads its CPU affinity (taskset). */
  cores?: number;
}

/** A streamed response being inspected as it arrives (InspectionEngine.streamInspection). */
export interface StreamedResponse {
  /** A chunk of the stream, as the response pipeline keeps it (its first MAX_BODY_BYTES). */
  push(chunk: Buffer): void;
  /** The bytes kept so far. */
  readonly body: Buffer;
  /** The stream ended: the outcome of the whole body's inspection. */
  finish(): Promise<InspectionOutcome>;
}

export interface AdaptiveOffload {
  /** The inline threshold while the event loop lags. */
  thresholdBytes: number;
  /** Lagging from this p99 of the event loop's delay over a window… */
  highMs: number;
  /** …until the p99 is back at or below this. */
  lowMs: number;
  windowMs: number;
}

const EMPTY: ScanResult = { findings: [], failures: [] };
const BUILTINS = 'builtin';

/** A body in shared memory crosses to a worker without a copy; anything else is copied once, here. */
export function toShared(body: Buffer): Uint8Array {
  if (body.buffer instanceof SharedArrayBuffer) return body;
  const shared = new Uint8Array(new SharedArrayBuffer(body.length));
  copyBytes(body, shared);
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
  #cache: PartCache | null;
  #resent: ResentParts | null;
  #adaptive: AdaptiveOffload | null;
  #streamWorker: string;
  #lagging = false;
  #lag: ReturnType<typeof monitorEventLoopDelay> | null = null;
  #lagTimer: NodeJS.Timeout | null = null;

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
    this.#streamWorker = (
      options.streamWorkerUrl ?? new URL(self.replace('worker', 'stream-scan'), import.meta.url)
    ).href;
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
      splits: counter(
        registry,
        'dvx_inspection_pool_splits_total',
        'Pooled bodies by how they were shared out: range (byte ranges), inspector (patterns | the rest), none',
        ['split'],
      ),
      duration: histogram(
        registry,
        'dvx_inspection_duration_seconds',
        'Inspection run time',
        ['phase', 'mode'],
        [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      ),
      cacheHits: counter(
        registry,
        'dvx_inspection_cache_hits_total',
        'Conversation parts found in the inspection cache',
        ['phase'],
      ),
      cacheMisses: counter(
        registry,
        'dvx_inspection_cache_misses_total',
        'Conversation parts not in the inspection cache (scanned)',
        ['phase'],
      ),
      cacheSaved: counter(
        registry,
        'dvx_inspection_cache_bytes_saved_total',
        'Bytes of conversation parts not scanned again thanks to the inspection cache',
        ['phase'],
      ),
      cacheBytes: gauge(
        registry,
        'dvx_inspection_cache_bytes',
        'Bytes held by the inspection cache (entries, and the resent bodies kept to compare against)',
      ),
      cacheUnhashed: counter(
        registry,
        'dvx_inspection_cache_parts_compared_total',
        'Conversation parts whose key was found by comparing them with the same part of an earlier body (not hashed again)',
        ['phase'],
      ),
      cacheSkeletonHits: counter(
        registry,
        'dvx_inspection_cache_skeleton_hits_total',
        'Bodies whose skeleton (all but their conversation parts) was found in the inspection cache (not scanned again)',
        ['phase'],
      ),
      cacheEvictions: counter(
        registry,
        'dvx_inspection_cache_evictions_total',
        'Inspection cache entries dropped to stay under the cap',
      ),
      offload: gauge(
        registry,
        'dvx_inspection_adaptive_offload',
        '1 while the event loop lags and smaller bodies go to the pool (adaptive offload), else 0',
      ),
      offloadSwitches: counter(
        registry,
        'dvx_inspection_adaptive_offload_switches_total',
        'Adaptive offload turned on',
      ),
      lagP99: gauge(registry, 'dvx_inspection_event_loop_lag_p99_seconds', 'p99 of the event loop delay, last window'),
      checkpoints: counter(
        registry,
        'dvx_inspection_stream_checkpoints_total',
        'Stretches of streamed responses scanned while the stream passed: bytes (as sent) or joined (finished blocks)',
        ['kind'],
      ),
    };
    const cacheBytes = options.cacheBytes ?? DEFAULT_CACHE_BYTES;
    this.#cache =
      cacheBytes > 0
        ? new PartCache({ maxBytes: cacheBytes / 2, onEvict: (n) => this.#metrics.cacheEvictions.inc({}, n) })
        : null;
    // The cap is shared: half for the entries, half for the resent bodies kept to compare against
    // (resent-parts.ts), so the two together stay under --inspection-cache-mb.
    this.#resent = cacheBytes > 0 ? new ResentParts(cacheBytes / 2, this.#cache) : null;
    // By default only with a core for the pool beside the event loop: on a process's only core the
    // pool's thread takes its turns from the loop it was to relieve, and a mid-sized body then costs
    // its scan plus the round trip (docs/decisions.md, "Adaptive offload needs a second core").
    const offloadDefault =
      (options.cores ?? availableParallelism()) >= 2
        ? {
            thresholdBytes: ADAPTIVE_INLINE_THRESHOLD_BYTES,
            highMs: LAG_HIGH_MS,
            lowMs: LAG_LOW_MS,
            windowMs: LAG_WINDOW_MS,
          }
        : null;
    this.#adaptive =
      options.adaptiveOffload === null || this.#pool === null ? null : (options.adaptiveOffload ?? offloadDefault);
    if (this.#adaptive !== null && this.#adaptive.thresholdBytes < this.#inlineThreshold)
      this.#watchLag(this.#adaptive);
  }

  /** Samples the event loop's delay; past highMs smaller bodies go to the pool, until back under lowMs. */
  #watchLag(adaptive: AdaptiveOffload): void {
    const lag = monitorEventLoopDelay({ resolution: LAG_RESOLUTION_MS });
    lag.enable();
    this.#lag = lag;
    this.#lagTimer = setInterval(() => {
      // The histogram holds each sample's whole interval: the resolution plus the lag.
      const p99 = Math.max(0, lag.percentile(99) / 1e6 - LAG_RESOLUTION_MS);
      lag.reset();
      this.#metrics.lagP99.set(p99 / 1000);
      if (!this.#lagging && p99 >= adaptive.highMs) {
        this.#lagging = true;
        this.#metrics.offloadSwitches.inc();
        this.#log.info({ lag_p99_ms: p99, threshold_bytes: adaptive.thresholdBytes }, 'adaptive offload on');
      } else if (this.#lagging && p99 <= adaptive.lowMs) {
        this.#lagging = false;
        this.#log.info({ lag_p99_ms: p99 }, 'adaptive offload off');
      }
      this.#metrics.offload.set(this.#lagging ? 1 : 0);
    }, adaptive.windowMs);
    this.#lagTimer.unref();
  }

  /** The size from which a body is scanned on the pool: lower while the event loop lags. */
  #threshold(): number {
    return this.#lagging ? Math.min(this.#inlineThreshold, this.#adaptive!.thresholdBytes) : this.#inlineThreshold;
  }

  /** Whether adaptive offload is on now (the event loop lags). */
  get offloading(): boolean {
    return this.#lagging;
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
    const large = this.#pool !== null && body.length >= this.#threshold();
    const modelFirst = large && phase === 'request' && hasInspector(plan, MODEL_RESTRICTION) && !request.modelsAnywhere;
    const pooled = large && (modelFirst ? hasBuiltinWork(plan, phase, secrets.length, true) : builtinWork);
    const identity = request.identity ?? { agentId: '', orgId: '', agentName: '' };
    let waitedSidecars = false;
    for (const sidecar of policy.sidecars) {
      if (!(phase === 'request' ? sidecar.on_request : sidecar.on_response)) continue;
      if (sidecar.async) this.#fireAndForget(sidecar, request, identity);
      else waitedSidecars = true;
    }

    // The per-part cache: request phase, an inference body (model restriction reads the top level only,
    // and that is in the skeleton), and work for the inspectors besides model restriction.
    // The leading parts this agent sent before are stepped over, not walked again (resent-parts.ts).
    // A body none of whose parts the agent sent before is scanned whole, as with no cache, and
    // remembered unhashed: its parts are hashed and cached once the agent resends them (seenFirst).
    const cacheable =
      this.#cache !== null &&
      phase === 'request' &&
      body.length < MAX_CACHED_BODY_BYTES &&
      request.modelsAnywhere === undefined &&
      hasBuiltinWork(plan, phase, secrets.length, true);
    const holder = cacheable ? holderOf(request.identity) : null;
    const recall = cacheable ? this.#resent!.recall(holder, body) : null;
    let parts = cacheable ? conversationParts(body, MIN_PART_BYTES, recall?.known) : null;
    if (
      parts !== null &&
      holder !== null &&
      (recall?.verified ?? 0) === 0 &&
      this.#resent!.seenFirst(holder, body, parts)
    )
      parts = null;

    let results: ScanResult[];
    let mode: InspectionOutcome['mode'] = 'inline';
    if (parts !== null) {
      const sidecars = this.#waitedSidecars(request, identity);
      const pool = { used: false };
      results = await Promise.all([
        this.#inspectParts(plan, policy, body, parts, phase, secrets, holder, recall, pool),
        ...sidecars.scans,
      ]);
      sidecars.stop();
      if (pool.used) mode = 'pool';
    } else if (!pooled && !waitedSidecars) {
      // Everything runs here and now: no deadline timer to arm (it could not interrupt a synchronous
      // scan anyway; bodies this small are bounded by the inline threshold).
      results = [builtinWork ? this.#inline(plan, body, phase, secrets, request.modelsAnywhere) : EMPTY];
    } else {
      const sidecars = this.#waitedSidecars(request, identity);
      const waited = sidecars.scans;
      let builtins: Promise<ScanResult> = Promise.resolve(EMPTY);
      if (pooled) {
        mode = 'pool';
        if (modelFirst) waited.push(Promise.resolve(this.#modelOnly(plan, body)));
        builtins = this.#onPool(policy, body, phase, secrets, request.modelsAnywhere, modelFirst);
      } else if (builtinWork) {
        builtins = Promise.resolve(this.#inline(plan, body, phase, secrets, request.modelsAnywhere));
      }
      results = await Promise.all([builtins, ...waited]);
      sidecars.stop();
    }
    return this.#conclude(phase, mode, results, started);
  }

  /**
   * The sidecars a phase waits for, each under one deadline for them all (armed only when there is
   * one); `stop` disarms it once they are in.
   */
  #waitedSidecars(request: InspectRequest, identity: SidecarIdentity): { scans: Promise<ScanResult>[]; stop(): void } {
    const scans: Promise<ScanResult>[] = [];
    const deadline = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    for (const sidecar of request.policy.sidecars) {
      if (!(request.phase === 'request' ? sidecar.on_request : sidecar.on_response) || sidecar.async) continue;
      timer ??= setTimeout(() => deadline.abort(new DeadlineError('inspection deadline')), this.#timeoutMs);
      scans.push(this.#runSidecar(sidecar, request, identity, deadline.signal));
    }
    return { scans, stop: () => clearTimeout(timer) };
  }

  /** The outcome of a phase from what its scans found and which failed, recorded (metrics, log). */
  #conclude(
    phase: Phase,
    mode: InspectionOutcome['mode'],
    results: readonly ScanResult[],
    started: number,
  ): InspectionOutcome {
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

  /**
   * A body with parts (conversation-parts.ts): each part is looked up (in what this agent's last body
   * learnt, resent-parts.ts, else in the cache) and only the new ones are scanned, together (#scanNew).
   * The skeleton is looked up too, by its own sha256 under a context of its own (model restriction
   * reads it), and scanned when it is new. What a cached part or skeleton found counts as if it had
   * been found now: a cached `block` blocks.
   */
  async #inspectParts(
    plan: ScanPlan,
    policy: ResolvedPolicy,
    body: Buffer,
    parts: readonly Span[],
    phase: Phase,
    secrets: readonly string[],
    holder: string | null,
    recall: Recall | null,
    pool: { used: boolean },
  ): Promise<ScanResult> {
    const cache = this.#cache!;
    const context = cache.scanContext(plan, 'parts', phase, policy.version, secrets, () =>
      builtinInspectors(plan, phase, secrets.length, 'all', true),
    );
    const cached: (readonly Finding[])[] = [];
    const fresh: NewPart[] = [];
    let hits = 0;
    let saved = 0;
    const { hashes, reused, found, remembered } = this.#resent!.hashes(holder, body, parts, recall, context);
    if (reused > 0) this.#metrics.cacheUnhashed.inc({ phase }, reused);
    for (let k = 0; k < parts.length; k++) {
      const span = parts[k];
      // A part this agent's last body held, byte for byte, under the same context: its findings are
      // known without a look-up; else the cache (the key concatenated only then).
      let hit = found[k];
      let key = '';
      if (hit === undefined) {
        key = context + hashes[k];
        hit = cache.get(key);
        found[k] = hit;
      }
      if (hit === undefined) fresh.push({ span, key, index: k, seen: recall !== null && k < recall.verified });
      else {
        if (hit.length > 0) cached.push(hit);
        hits++;
        saved += span.end - span.start;
      }
    }
    if (hits > 0) {
      this.#metrics.cacheHits.inc({ phase }, hits);
      this.#metrics.cacheSaved.inc({ phase }, saved);
    }
    if (fresh.length > 0) this.#metrics.cacheMisses.inc({ phase }, fresh.length);

    // The skeleton: scanned with model restriction, keyed by the sha256 of every byte of it.
    const skel = skeleton(body, parts);
    const skelKey =
      cache.scanContext(plan, 'skeleton', phase, policy.version, secrets, () =>
        builtinInspectors(plan, phase, secrets.length, 'all', false),
      ) + this.#resent!.skeletonHash(recall, remembered, skel);
    const skelHit = cache.get(skelKey);
    if (skelHit !== undefined) this.#metrics.cacheSkeletonHits.inc({ phase });
    const scans: (ScanResult | Promise<ScanResult>)[] = [
      skelHit === undefined
        ? this.#scanUnit(plan, policy, skel, phase, secrets, false, pool)
        : { findings: skelHit.map((f) => ({ ...f })), failures: [] },
    ];
    const budget = rescanBudget(fresh);
    for (const g of this.#groups(fresh))
      scans.push(this.#scanNew(plan, policy, body, g, phase, secrets, pool, budget, found));
    const results = await Promise.all(scans);
    if (skelHit === undefined && results[0].failures.length === 0) cache.set(skelKey, results[0].findings);
    this.#metrics.cacheBytes.set(cache.bytes + this.#resent!.bytes);

    const merged = new FindingSet();
    const failures: InspectorFailure[] = [];
    merged.add(results[0].findings);
    // Copies: a cached finding is frozen, and the outcome's belong to the caller.
    for (const c of cached) merged.add(c.map((f) => ({ ...f })));
    for (const r of results) {
      merged.add(r.findings);
      for (const f of r.failures) failures.push(f);
    }
    return { findings: merged.findings, failures };
  }

  /**
   * New parts in groups: one when they are few bytes together (one scan's fixed cost, not one per
   * part), else as many groups as pool threads, each at least the inline threshold.
   */
  #groups(fresh: NewPart[]): NewPart[][] {
    if (fresh.length === 0) return [];
    let total = 0;
    for (const p of fresh) total += p.span.end - p.span.start;
    const threshold = this.#threshold();
    if (this.#pool === null || total < threshold) return [fresh];
    const target = Math.max(threshold, Math.ceil(total / Math.max(1, this.#threads)));
    const groups: NewPart[][] = [];
    let current: NewPart[] = [];
    let size = 0;
    for (const p of fresh) {
      current.push(p);
      size += p.span.end - p.span.start;
      if (size >= target) {
        groups.push(current);
        current = [];
        size = 0;
      }
    }
    if (current.length > 0) groups.push(current);
    return groups;
  }

  /**
   * New parts scanned as one JSON array. Clean: each part is stored clean. Findings: the group is
   * halved and each half scanned again until each finding belongs to a part, so each part is stored
   * with its own (a part with a finding costs about twice its group's bytes, once). The group's own
   * findings always count; a rescan's failure only keeps its parts out of the cache.
   */
  async #scanNew(
    plan: ScanPlan,
    policy: ResolvedPolicy,
    body: Buffer,
    parts: NewPart[],
    phase: Phase,
    secrets: readonly string[],
    pool: { used: boolean },
    budget: { left: number },
    found: (readonly Finding[] | undefined)[],
  ): Promise<ScanResult> {
    const cache = this.#cache!;
    const result = await this.#scanUnit(
      plan,
      policy,
      group(
        body,
        parts.map((p) => p.span),
        this.#pool === null ? Number.POSITIVE_INFINITY : this.#threshold(),
      ),
      phase,
      secrets,
      true,
      pool,
    );
    if (result.failures.length > 0) return result;
    if (result.findings.length === 0 || parts.length === 1) {
      // What is stored is also what this agent's next body inherits (resent-parts.ts).
      for (const p of parts) found[p.index] = cache.set(p.key, result.findings);
      return result;
    }
    // Parts never seen before are not halved: on traffic that never resends (every body fresh) the
    // halving would cost about twice the body's bytes again per finding, for entries never read. They
    // are halved the first time the agent resends them (then they are `seen`), and cached from then on.
    if (!parts.some((p) => p.seen)) return result;
    // The halving is bounded (rescanBudget): past it these parts are not stored, and are scanned
    // again next turn, as without the cache. What this scan found counts either way.
    const cost = rescanCost(parts);
    if (cost > budget.left) return result;
    budget.left -= cost;
    const half = parts.length >> 1;
    const [a, b] = await Promise.all([
      this.#scanNew(plan, policy, body, parts.slice(0, half), phase, secrets, pool, budget, found),
      this.#scanNew(plan, policy, body, parts.slice(half), phase, secrets, pool, budget, found),
    ]);
    const merged = new FindingSet();
    merged.add(result.findings);
    merged.add(a.findings);
    merged.add(b.findings);
    return { findings: merged.findings, failures: [] };
  }

  /**
   * One piece of a body (the skeleton, a group of parts): inline when small, else on the pool, with the
   * model checked here first as for a whole body. Parts skip model restriction: a `model` inside a
   * message is no model the call names, and the top level is in the skeleton.
   */
  #scanUnit(
    plan: ScanPlan,
    policy: ResolvedPolicy,
    bytes: Buffer,
    phase: Phase,
    secrets: readonly string[],
    skipModel: boolean,
    pool: { used: boolean },
  ): ScanResult | Promise<ScanResult> {
    if (this.#pool === null || bytes.length < this.#threshold()) {
      try {
        return scanBody(plan, { body: bytes, phase, secrets, skipModel });
      } catch (err) {
        return { findings: [], failures: [{ inspector: BUILTINS, reason: (err as Error).message }] };
      }
    }
    const modelFirst = !skipModel && phase === 'request' && hasInspector(plan, MODEL_RESTRICTION);
    if (!modelFirst) {
      pool.used = true;
      return this.#onPool(policy, bytes, phase, secrets, undefined, skipModel);
    }
    const model = this.#modelOnly(plan, bytes);
    if (!hasBuiltinWork(plan, phase, secrets.length, true)) return model;
    pool.used = true;
    return this.#onPool(policy, bytes, phase, secrets, undefined, true).then((rest) => ({
      findings: [...model.findings, ...rest.findings],
      failures: [...model.failures, ...rest.failures],
    }));
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
    const tasks = this.#poolTasks(plan, policy, shared, phase, secrets, skipModel);
    const pooled = pooledPolicy(policy);
    this.#metrics.splits.inc({ split: tasks[0].range ? 'range' : tasks.length > 1 ? 'inspector' : 'none' });
    this.#metrics.queue.set(this.#pool!.queueSize);
    const results = await Promise.all(
      tasks.map(async ({ part, range, modelWhole, context }): Promise<ScanResult> => {
        const skip = skipModel || (range !== undefined && !modelWhole);
        // The worker posts each inspector's result here as it finishes; read only if the task fails.
        const task = {
          body: shared,
          policy: pooled,
          phase,
          secrets: [...secrets],
          part,
          ...(modelsAnywhere ? { modelsAnywhere } : {}),
          ...(skipModel ? { skipModel } : {}),
          ...(range ? { range, context, modelWhole } : {}),
        } satisfies Omit<WorkerTask, 'port' | 'started'>;
        return this.#runPooled(task, null, () => builtinInspectors(plan, phase, secrets.length, part, skip));
      }),
    );
    if (results.length === 1) return results[0];
    // Ranges merge in body order; the split by inspector reports the others before the patterns.
    return mergeResults(tasks[0].range ? results : [...results].reverse());
  }

  /**
   * How a pooled body is shared out. A request body from RANGE_THRESHOLD_BYTES, with two or more
   * workers, is cut into one byte range per worker (byte-ranges.ts), each scanned by every inspector.
   * Failing that (a response, whose joined stream text is built from every line; a custom pattern
   * with no bound and no literal, patternReachOf; a secret too long; a body with no edge to cut at), from
   * SPLIT_THRESHOLD_BYTES the patterns and the other inspectors scan the whole body on two workers;
   * else one task does it all.
   */
  #poolTasks(
    plan: ScanPlan,
    policy: ResolvedPolicy,
    shared: Uint8Array,
    phase: Phase,
    secrets: readonly string[],
    skipModel: boolean,
  ): PoolTask[] {
    const patterns = policy.content?.patterns ?? [];
    if (this.#threads >= 2 && phase === 'request' && shared.length >= RANGE_THRESHOLD_BYTES) {
      const secretReach = secretsReach(secrets);
      const patternReach = patternReachOf(plan);
      const ranges =
        secretReach === null || patternReach === null
          ? null
          : planRanges(shared, this.#threads, Math.max(secretReach, patternReach));
      if (ranges) {
        const body = Buffer.from(shared.buffer, shared.byteOffset, shared.byteLength);
        const context = { jsonEscapes: carriesJsonEscapes(body) };
        return ranges.map((range, i) => ({ part: 'all', range, modelWhole: i === 0 && !skipModel, context }));
      }
    }
    const split = this.#threads >= 2 && shared.length >= SPLIT_THRESHOLD_BYTES && patterns.length > 0;
    return split ? [{ part: 'patterns' }, { part: 'others' }] : [{ part: 'all' }];
  }

  /**
   * A streamed response inspected as it arrives (stream-inspection.ts; docs/decisions.md, "A streamed
   * answer inspected as it arrives"): push each chunk kept of the stream, then `finish` gives the
   * outcome inspect() gives for the whole body, with only the last stretch left to scan. null when
   * the policy is inert (inspect() would cost nothing either). Stretches during the stream go to the
   * pool when there is one (off the event loop that relays the stream); the last one as inspect()
   * decides for a body of its size. Each has the deadline a pooled scan has; one that fails is a
   * recorded fail-open, as the whole body's would be.
   */
  streamInspection(request: Omit<InspectRequest, 'body' | 'phase'>): StreamedResponse | null {
    const { policy } = request;
    if (isInert(policy)) return null;
    const plan = this.#plans.get(policy);
    const secrets = request.secrets ?? [];
    let pooled = false;
    const scan = (task: Omit<StretchTask, 'policy' | 'secrets'>, last: boolean): Promise<ScanResult> => {
      const full: StretchTask = { ...task, policy: pooledPolicy(policy), secrets: [...secrets] };
      if (this.#pool === null || (last && task.body.length < this.#threshold())) {
        try {
          return Promise.resolve(scanStretch(plan, full));
        } catch (err) {
          return Promise.resolve({ findings: [], failures: [{ inspector: BUILTINS, reason: (err as Error).message }] });
        }
      }
      pooled = true;
      return this.#stretchOnPool(plan, full);
    };
    const inspection = new StreamInspection(plan, policy, secrets, scan, (kind) =>
      this.#metrics.checkpoints.inc({ kind }),
    );
    return {
      push: (chunk) => inspection.push(chunk),
      get body() {
        return inspection.body;
      },
      finish: async () => {
        const started = performance.now();
        const body = inspection.body;
        const whole: InspectRequest = { ...request, body, phase: 'response' };
        const identity = request.identity ?? { agentId: '', orgId: '', agentName: '' };
        for (const sidecar of policy.sidecars)
          if (sidecar.on_response && sidecar.async) this.#fireAndForget(sidecar, whole, identity);
        const sidecars = this.#waitedSidecars(whole, identity);
        const results = await Promise.all([inspection.finish(), ...sidecars.scans]);
        sidecars.stop();
        return this.#conclude('response', pooled ? 'pool' : 'inline', results, started);
      },
    };
  }

  /** One stretch of a stream on the pool (stream-scan.ts's entry), under the deadline #onPool keeps. */
  #stretchOnPool(plan: ScanPlan, task: StretchTask): Promise<ScanResult> {
    this.#metrics.queue.set(this.#pool!.queueSize);
    return this.#runPooled(task, this.#streamWorker, () => stretchInspectors(plan, task.kind, task.secrets.length));
  }

  /**
   * One task on the pool (`filename`: another entry than the worker's; null: the worker). Its deadline
   * runs from the moment a worker starts it (the task's `started` word), after at most the queue
   * timeout waiting for one. A task that fails (deadline, crash) reports what its `inspectors` had
   * finished (the port the worker posts each result to), the rest failed with the reason.
   */
  async #runPooled(task: object, filename: string | null, inspectors: () => readonly string[]): Promise<ScanResult> {
    const { port1, port2 } = new MessageChannel();
    const started = new Int32Array(new SharedArrayBuffer(4));
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
      return (await this.#pool!.run(
        { ...task, port: port2, started },
        { signal: abort.signal, transferList: [port2], ...(filename === null ? {} : { filename }) },
      )) as ScanResult;
    } catch (err) {
      const reason = abort.signal.aborted ? String(abort.signal.reason) : (err as Error).message || 'worker error';
      return finishedBefore(port1, inspectors(), reason);
    } finally {
      settled = true;
      clearTimeout(deadline);
      // A task that failed before a worker took it: wake the waiter rather than leave it to time out.
      if (Atomics.load(started, 0) === 0) Atomics.notify(started, 0);
      port1.close();
    }
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
    if (this.#lagTimer !== null) clearInterval(this.#lagTimer);
    this.#lag?.disable();
    await this.#pool?.destroy();
    this.#pool = null;
  }
}

/** Whose earlier bodies a body is compared with (resent-parts.ts): the calling agent's, when known. */
function holderOf(identity: SidecarIdentity | undefined): string | null {
  return identity === undefined || identity.agentId === '' ? null : `${identity.orgId}\u0000${identity.agentId}`;
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

interface NewPart {
  span: Span;
  key: string;
  /** Its index among the body's parts. */
  index: number;
  /** It led the agent's last body too (resent-parts.ts): worth halving a finding down to it. */
  seen: boolean;
}

/** What a rescan costs beyond its bytes (one input, a pass per inspector), counted as this many bytes. */
const RESCAN_FIXED_BYTES = 4096;

/** Halving a group scans its bytes again, as two scans. */
function rescanCost(parts: readonly NewPart[]): number {
  let bytes = 2 * RESCAN_FIXED_BYTES;
  for (const p of parts) bytes += p.span.end - p.span.start;
  return bytes;
}

/**
 * How much the halving of a turn's new parts may rescan: three times their bytes, plus the fixed cost
 * of 64 scans. A finding in one part costs about twice the group's bytes and two scans per halving;
 * without a bound, a 4 MB body of 256-byte parts each with a finding cost ~30,000 scans and 14 levels
 * of rescanning (1.5 s, the event loop held 0.5 s by the small ones, against 0.17 s for the body
 * scanned whole; test/pipeline/attack-p13-rescan.test.ts).
 */
function rescanBudget(fresh: readonly NewPart[]): { left: number } {
  let bytes = 0;
  for (const p of fresh) bytes += p.span.end - p.span.start;
  return { left: 3 * bytes + 64 * RESCAN_FIXED_BYTES };
}

/**
 * Findings of several scans as one list: the same finding twice is one (as scan.ts keeps them), and
 * each inspector keeps at most MAX_FINDINGS_PER_INSPECTOR, as one scan of the whole body would. Past
 * that bound a finding of a kind (inspector, description, severity) not yet listed is still kept, as
 * one scan shares its bound out so that every pattern reports (patterns.ts, scan): else 64 distinct
 * `log` matches in the skeleton pushed a part's `block` finding out and the call went through.
 */
class FindingSet {
  readonly findings: Finding[] = [];
  #seen = new Set<string>();
  #kinds = new Set<string>();
  #per = new Map<string, number>();

  add(found: readonly Finding[]): void {
    for (const f of found) {
      const kind = `${f.inspector_type}\u0000${f.description}\u0000${f.severity}`;
      const key = `${kind}\u0000${f.match}`;
      if (this.#seen.has(key)) continue;
      const n = this.#per.get(f.inspector_type) ?? 0;
      if (n >= MAX_FINDINGS_PER_INSPECTOR && this.#kinds.has(kind)) continue;
      this.#seen.add(key);
      this.#kinds.add(kind);
      this.#per.set(f.inspector_type, n + 1);
      this.findings.push(f);
    }
  }
}

/** Failure reasons become label values: keep them to a small fixed set. */
function metricReason(reason: string): string {
  return ['timeout', 'queue_timeout', 'deadline', 'network', 'status', 'bad_json', 'too_large'].includes(reason)
    ? reason
    : 'error';
}
