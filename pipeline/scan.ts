import { bodyLocation, type Finding, type Phase } from './finding.ts';
import { deepScanView, hidesCharacters } from './json-view.ts';
import { normalizedView } from './normalized-view.ts';
import { sseText } from './sse-text.ts';
import * as apiKey from './inspectors/api-key.ts';
import * as model from './inspectors/model-restriction.ts';
import { namedModels } from './named-models.ts';
import * as patterns from './inspectors/patterns.ts';
import * as pii from './inspectors/pii.ts';
import * as secrets from './inspectors/secrets.ts';
import type { ScanPlan } from './plan.ts';

// The synchronous half of the pipeline: every built-in inspector over one body, the same code inline on
// the main thread and inside a pool worker. Which inspectors run in which phase follows the spec's flow
// (in this order: the cheap ones that block most often first, so a deadline finds them done):
//   request:  model restriction (raw body) │ secrets │ api_key │ pii │ patterns │ normalized view
//   response: secrets │ patterns │ normalized view   (plus the joined delta text of a streamed response)
//
// Which bytes each one reads (DESIGN.md, "JSON escapes must not hide content"):
//   patterns see decoded string values whenever the body has escapes (`\n`, `\"` change what a regex
//   matches); secrets, pii and api_key read the body as sent (they know escape letters are not word
//   bytes, and secrets also look for their JSON-escaped form) unless `\u` or `\/` escapes could hide a
//   character of what they look for, in which case they read the decoded view too. The decode, the
//   most expensive step, happens at most once per body and only when something needs it.
// Then every one of them reads the normalized view (normalized-view.ts: NFKC, invisibles dropped, HTML
// entities decoded) of what it read, when that differs: built at most once per body, on the decoded
// view when custom patterns run (they read it anyway) and on the builtin view otherwise; an ASCII body
// without `&` is turned away by one native pass each of isAscii and indexOf. It is a step of its own,
// last: what the literal views found is reported before it starts, so a deadline that catches the
// normalized view names it (`normalized_view`) and keeps the rest.
// An inspector that throws is reported as a failure, never as a clean pass (STYLE.md rule 10).

/** Which inspectors a scan runs: all of them, or one half of a body split across two workers. */
export type ScanPart = 'all' | 'patterns' | 'others';

export interface ScanRequest {
  body: Buffer;
  phase: Phase;
  secrets: readonly string[];
  part?: ScanPart;
  /**
   * Model restriction checks every model named anywhere in the body, read by its content type
   * (named-models.ts), instead of the top-level `model`: the proxy's pass-through routes.
   */
  modelsAnywhere?: { contentType: string | null };
  /** Model restriction already ran (the engine checks a pooled inference body's model first). */
  skipModel?: boolean;
  /**
   * Called as each inspector of `builtinInspectors` finishes, with what it found: a pool worker
   * reports these as it goes, so a deadline keeps what finished (engine.ts). Not set inline.
   */
  onInspector?: (inspector: string, result: ScanResult) => void;
}

export interface InspectorFailure {
  inspector: string;
  reason: string;
}

export interface ScanResult {
  findings: Finding[];
  failures: InspectorFailure[];
}

/** Whether any built-in inspector has work in this phase (sidecars are handled by the engine). */
export function hasBuiltinWork(plan: ScanPlan, phase: Phase, secretCount: number): boolean {
  if (phase === 'request' && (plan.model || plan.pii || plan.apiKey)) return true;
  return plan.patterns !== null || (plan.secrets !== null && secretCount > 0);
}

/**
 * The built-in inspectors a scan runs, in the order it runs them: the cheap ones that block most
 * often first (model, secrets, api_key), then pii and the custom patterns. An inspector named here
 * reports once through `onInspector`, even when a prefilter finds it has nothing to look at.
 */
export function builtinInspectors(plan: ScanPlan, phase: Phase, secretCount: number, part: ScanPart = 'all', skipModel = false): string[] {
  const out: string[] = [];
  const others = part !== 'patterns';
  if (others && phase === 'request' && plan.model && !skipModel) out.push(model.id);
  if (others && plan.secrets && secretCount > 0) out.push(secrets.id);
  if (others && phase === 'request' && plan.apiKey) out.push(apiKey.id);
  if (others && phase === 'request' && plan.pii) out.push(pii.id);
  if (part !== 'others' && plan.patterns) out.push(patterns.id);
  if (out.length > 0 && out.at(-1) !== model.id) out.push(NORMALIZED_VIEW);
  return out;
}

/** The step (and failure name) of the normalized view, which feeds every inspector but the model's. */
export const NORMALIZED_VIEW = 'normalized_view';

function unreported(_inspector: string): void {}

/** The failure named when a stream's joined delta text was given up on (sse-text.ts, MAX_BAD_LINES). */
export const SSE_TEXT = 'sse_text';

function findingKey(f: Finding): string {
  return `${f.inspector_type}\u0000${f.description}\u0000${f.match}\u0000${f.severity}`;
}

export function scanBody(plan: ScanPlan, request: ScanRequest): ScanResult {
  const findings: Finding[] = [];
  const seen = new Set<string>();
  const failures: InspectorFailure[] = [];
  const { body, phase } = request;
  const part = request.part ?? 'all';
  const others = part !== 'patterns';
  const location = bodyLocation(phase);
  const onInspector = request.onInspector;
  let reportedFindings = 0;
  let reportedFailures = 0;
  // (Inline, with no one to report to, no closure is made for it.)
  const done = onInspector ? (inspector: string) => {
    onInspector(inspector, { findings: findings.slice(reportedFindings), failures: failures.slice(reportedFailures) });
    reportedFindings = findings.length;
    reportedFailures = failures.length;
  } : unreported;
  const run = (inspector: string, fn: () => Finding[]) => {
    try {
      for (const f of fn()) {
        const key = findingKey(f);
        if (!seen.has(key)) {
          seen.add(key);
          findings.push(f);
        }
      }
    } catch (err) {
      failures.push({ inspector, reason: (err as Error).message || String(err) });
    }
  };

  if (others && phase === 'request' && plan.model && !request.skipModel) {
    const anywhere = request.modelsAnywhere;
    run(model.id, () => (anywhere ? model.check(namedModels(body, anywhere.contentType), plan.model!) : model.scan(body, plan.model!)));
    done(model.id);
  }

  let decoded: Buffer | null = null;
  const decodedView = () => (decoded ??= deepScanView(body));
  let builtin: Buffer | null = null;
  const builtinView = () => (builtin ??= hidesCharacters(body) ? decodedView() : body);
  // A streamed response is also read as the text the agent receives (sse-text.ts).
  const extra = phase === 'response' && (plan.secrets || plan.patterns) ? sseText(body, () => failures.push({ inspector: SSE_TEXT, reason: 'unparsable_lines' })) : null;

  if (others && plan.secrets && request.secrets.length > 0) {
    const needles = secrets.needles(request.secrets);
    // As sent (raw and JSON-escaped needles), and decoded when escapes could hide a value. Both: a
    // secret holding a backslash (`Pa\ss\nw0rd`) is found as sent, and decoding a level further
    // would turn its `\n` into a newline.
    run(secrets.id, () => secrets.scan(body, plan.secrets!, needles, location));
    if (builtinView() !== body) run(secrets.id, () => secrets.scan(builtinView(), plan.secrets!, needles, location));
    if (extra) run(secrets.id, () => secrets.scan(extra, plan.secrets!, needles, location));
    done(secrets.id);
  }
  // One RE2.Set pass over the decoded view: the custom patterns that hit, and (request phase) which
  // built-in detectors can have anything to find. Without custom patterns every detector runs.
  let setHits: patterns.SetHits | null = null;
  // (The 'others' half of a split body skips it: the 'patterns' half pays for that pass.)
  if (plan.patterns && part !== 'others') {
    try {
      setHits = patterns.hits(decodedView(), plan.patterns);
    } catch (err) {
      failures.push({ inspector: patterns.id, reason: (err as Error).message || String(err) });
    }
  }
  const prefiltered = phase === 'request' ? setHits?.prefilters ?? null : null;

  if (others && phase === 'request' && plan.apiKey) {
    if (!prefiltered || prefiltered.has('api_key')) run(apiKey.id, () => apiKey.scan(builtinView(), plan.apiKey!, location));
    done(apiKey.id);
  }
  if (others && phase === 'request' && plan.pii) {
    const p = prefiltered
      ? { ...plan.pii, email: plan.pii.email && prefiltered.has('email'), creditCard: plan.pii.creditCard && prefiltered.has('card'), ssn: plan.pii.ssn && prefiltered.has('ssn') }
      : plan.pii;
    if (p.email || p.creditCard || p.ssn) run(pii.id, () => pii.scan(builtinView(), p, location));
    done(pii.id);
  }
  if (part !== 'others' && plan.patterns) {
    if (setHits) {
      const candidates = setHits.patterns;
      run(patterns.id, () => patterns.scan(decodedView(), plan.patterns!, location, candidates));
      if (extra) run(patterns.id, () => patterns.scan(extra, plan.patterns!, location));
    }
    done(patterns.id);
  }

  const secretsOn = others && plan.secrets !== null && request.secrets.length > 0;
  const apiKeyOn = others && phase === 'request' && plan.apiKey !== null;
  const piiOn = others && phase === 'request' && plan.pii !== null;
  const patternsOn = part !== 'others' && plan.patterns !== null;
  if (secretsOn || apiKeyOn || piiOn || patternsOn) {
    // A view that fails to build is a recorded failure (fail open or 503), as an inspector's would be.
    const normalize = (view: Buffer): Buffer | null => {
      try {
        return normalizedView(view)?.bytes ?? null;
      } catch (err) {
        failures.push({ inspector: NORMALIZED_VIEW, reason: (err as Error).message || String(err) });
        return null;
      }
    };
    const view = normalize(patternsOn ? decodedView() : builtinView());
    const extraView = extra ? normalize(extra) : null;
    if (secretsOn) {
      const needles = secrets.needles(request.secrets);
      if (view) run(secrets.id, () => secrets.scan(view, plan.secrets!, needles, location));
      if (extraView) run(secrets.id, () => secrets.scan(extraView, plan.secrets!, needles, location));
    }
    // The view's own RE2.Set pass: the patterns that hit it, and which detectors have anything to find.
    let viewHits: patterns.SetHits | null = null;
    if (view && patternsOn) {
      try {
        viewHits = patterns.hits(view, plan.patterns!);
      } catch (err) {
        failures.push({ inspector: patterns.id, reason: (err as Error).message || String(err) });
      }
    }
    const viewPrefiltered = phase === 'request' ? viewHits?.prefilters ?? null : null;
    if (view && apiKeyOn && (!viewPrefiltered || viewPrefiltered.has('api_key'))) run(apiKey.id, () => apiKey.scan(view, plan.apiKey!, location));
    if (view && piiOn) {
      const p = viewPrefiltered
        ? { ...plan.pii!, email: plan.pii!.email && viewPrefiltered.has('email'), creditCard: plan.pii!.creditCard && viewPrefiltered.has('card'), ssn: plan.pii!.ssn && viewPrefiltered.has('ssn') }
        : plan.pii!;
      if (p.email || p.creditCard || p.ssn) run(pii.id, () => pii.scan(view, p, location));
    }
    if (view && viewHits && viewHits.patterns.length > 0) run(patterns.id, () => patterns.scan(view, plan.patterns!, location, viewHits!.patterns));
    if (extraView && patternsOn) run(patterns.id, () => patterns.scan(extraView, plan.patterns!, location));
    done(NORMALIZED_VIEW);
  }
  return { findings, failures };
}
