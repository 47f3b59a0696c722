import { bodyLocation, type Finding, type Phase } from './finding.ts';
import { deepScanView, hidesCharacters } from './json-view.ts';
import { normalizedView } from './normalized-view.ts';
import { sseText } from './sse-text.ts';
import * as apiKey from './inspectors/api-key.ts';
import * as model from './inspectors/model-restriction.ts';
import { namedModels } from './inspectors/named-models.ts';
import * as patterns from './inspectors/patterns.ts';
import * as pii from './inspectors/pii.ts';
import * as secrets from './inspectors/secrets.ts';
import type { ScanPlan } from './plan.ts';

// The synchronous half of the pipeline: every built-in inspector over one body, the same code inline on
// the main thread and inside a pool worker. Which inspectors run in which phase follows the spec's flow:
//   request:  model restriction (raw body) │ secrets │ pii │ api_key │ patterns
//   response: secrets │ patterns            (plus the joined delta text of a streamed response)
//
// Which bytes each one reads (DESIGN.md, "JSON escapes must not hide content"):
//   patterns see decoded string values whenever the body has escapes (`\n`, `\"` change what a regex
//   matches); secrets, pii and api_key read the body as sent (they know escape letters are not word
//   bytes, and secrets also look for their JSON-escaped form) unless `\u` or `\/` escapes could hide a
//   character of what they look for, in which case they read the decoded view too. The decode, the
//   most expensive step, happens at most once per body and only when something needs it.
// Every one of them also reads the normalized view (normalized-view.ts: NFKC, invisibles dropped, HTML
// entities decoded) of what it reads, when that differs: built at most once per body, on the decoded
// view when custom patterns run (they read it anyway) and on the builtin view otherwise; an ASCII
// body without `&` is turned away by one native pass each of isAscii and indexOf.
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
   * (inspectors/named-models.ts), instead of the top-level `model`: the proxy's pass-through routes.
   */
  modelsAnywhere?: { contentType: string | null };
  /** Model restriction already ran (the engine checks a pooled inference body's model first). */
  skipModel?: boolean;
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

/** The failure name of the normalized view (it feeds several inspectors). */
export const NORMALIZED_VIEW = 'normalized_view';

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
  }

  let decoded: Buffer | null = null;
  const decodedView = () => (decoded ??= deepScanView(body));
  let builtin: Buffer | null = null;
  const builtinView = () => (builtin ??= hidesCharacters(body) ? decodedView() : body);
  // A view that fails to build is a recorded failure (fail open or 503), as an inspector's would be.
  const normalize = (view: Buffer): Buffer | null => {
    try {
      return normalizedView(view)?.bytes ?? null;
    } catch (err) {
      failures.push({ inspector: NORMALIZED_VIEW, reason: (err as Error).message || String(err) });
      return null;
    }
  };
  let normalized: Buffer | null | undefined;
  const normalizedOf = () => (normalized === undefined ? (normalized = normalize(part !== 'others' && plan.patterns ? decodedView() : builtinView())) : normalized);
  // A streamed response is also read as the text the agent receives (sse-text.ts).
  const extra = phase === 'response' && (plan.secrets || plan.patterns) ? sseText(body) : null;
  const extraNormalized = extra ? normalize(extra) : null;

  // One RE2.Set pass over the decoded view: the custom patterns that hit, and (request phase) which
  // built-in detectors can have anything to find. Without custom patterns every detector runs.
  let setHits: patterns.SetHits | null = null;
  // The same pass over the normalized view, when there is one: its hits count for the prefilters too.
  let normalizedHits: patterns.SetHits | null = null;
  // (The 'others' half of a split body skips it: the 'patterns' half pays for that pass.)
  if (plan.patterns && part !== 'others') {
    try {
      setHits = patterns.hits(decodedView(), plan.patterns);
      const view = normalizedOf();
      if (view) normalizedHits = patterns.hits(view, plan.patterns);
    } catch (err) {
      failures.push({ inspector: patterns.id, reason: (err as Error).message || String(err) });
    }
  }
  let prefiltered = phase === 'request' ? setHits?.prefilters ?? null : null;
  if (prefiltered && normalizedHits) prefiltered = normalizedHits.prefilters && new Set([...prefiltered, ...normalizedHits.prefilters]);

  if (others && plan.secrets && request.secrets.length > 0) {
    const needles = secrets.needles(request.secrets);
    // As sent (raw and JSON-escaped needles), and decoded when escapes could hide a value. Both: a
    // secret holding a backslash (`Pa\ss\nw0rd`) is found as sent, and decoding a level further
    // would turn its `\n` into a newline.
    run(secrets.id, () => secrets.scan(body, plan.secrets!, needles, location));
    if (builtinView() !== body) run(secrets.id, () => secrets.scan(builtinView(), plan.secrets!, needles, location));
    if (normalizedOf()) run(secrets.id, () => secrets.scan(normalizedOf()!, plan.secrets!, needles, location));
    if (extra) run(secrets.id, () => secrets.scan(extra, plan.secrets!, needles, location));
    if (extraNormalized) run(secrets.id, () => secrets.scan(extraNormalized, plan.secrets!, needles, location));
  }
  if (others && phase === 'request' && plan.pii) {
    const p = prefiltered
      ? { ...plan.pii, email: plan.pii.email && prefiltered.has('email'), creditCard: plan.pii.creditCard && prefiltered.has('card'), ssn: plan.pii.ssn && prefiltered.has('ssn') }
      : plan.pii;
    if (p.email || p.creditCard || p.ssn) {
      run(pii.id, () => pii.scan(builtinView(), p, location));
      if (normalizedOf()) run(pii.id, () => pii.scan(normalizedOf()!, p, location));
    }
  }
  if (others && phase === 'request' && plan.apiKey && (!prefiltered || prefiltered.has('api_key'))) {
    run(apiKey.id, () => apiKey.scan(builtinView(), plan.apiKey!, location));
    if (normalizedOf()) run(apiKey.id, () => apiKey.scan(normalizedOf()!, plan.apiKey!, location));
  }
  if (part !== 'others' && plan.patterns && setHits) {
    const candidates = setHits.patterns;
    run(patterns.id, () => patterns.scan(decodedView(), plan.patterns!, location, candidates));
    if (normalizedHits && normalizedHits.patterns.length > 0) run(patterns.id, () => patterns.scan(normalizedOf()!, plan.patterns!, location, normalizedHits!.patterns));
    if (extra) run(patterns.id, () => patterns.scan(extra, plan.patterns!, location));
    if (extraNormalized) run(patterns.id, () => patterns.scan(extraNormalized, plan.patterns!, location));
  }
  return { findings, failures };
}
