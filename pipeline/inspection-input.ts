import type { ViewContext } from './byte-ranges.ts';
import { bodyLocation, type FindingLocation, type Phase } from './finding.ts';
import { decodedViews, hidesCharacters, type Take } from './json-view.ts';
import { type NormalizedView, normalizedView } from './normalized-view.ts';
import { changedWindows, windowReach } from './normalized-windows.ts';
import { hits, type OpenRange, type PatternPlan, type PrefilterId, type SetHits } from './inspectors/patterns.ts';
import type { ScratchBuffers } from './scratch-buffers.ts';
import { sseText } from './sse-text.ts';

// One body as the inspectors read it: the bytes as sent and the views built from them, each built at
// most once and only when an inspector asks (the decode and the normalization are the costly steps):
//
//   raw ──┬── decoded()   JSON escapes decoded (json-view.ts, decodedViews)
//         ├── literal()   raw, or decoded() when `\u`, `\/`, `\\` or `\b` escapes could hide a character
//                         (told by the decoding walk when decoded() is built, else by hidesCharacters)
//         ├── joined()    a streamed response's delta text (sse-text.ts)
//         └── normalized(), normalizedJoined()   NFKC, invisibles dropped, entities decoded
//                         (normalized-view.ts): of decoded() when an inspector reads it, else of literal()
//               └── normalizedStage()   what the normalized stage reads of normalized(): the windows
//                         around what normalization changed (normalized-windows.ts), or all of it
//
// A view that cannot be built is a recorded failure (`normalized_view`, `sse_text`), never a silent
// pass, and so is the patterns' RE2.Set pass (`patterns`), which also tells api_key and pii whether
// they have anything to find (patterns.ts, PREFILTERS).

/** The failure named when a normalized view could not be built. */
export const NORMALIZED_VIEW = 'normalized_view';
/** The failure named when a stream's joined delta text was given up on (sse-text.ts, MAX_BAD_LINES). */
export const SSE_TEXT = 'sse_text';
const PATTERNS = 'patterns';

export interface InspectorFailure {
  inspector: string;
  reason: string;
}

export type Stage = 'literal' | 'normalized';

export interface InputOptions {
  raw: Buffer;
  phase: Phase;
  secrets: readonly string[];
  modelsAnywhere: { contentType: string | null } | null;
  /** Where view and set-pass failures are recorded. */
  failures: InspectorFailure[];
  /** The normalized view is built on the decoded view (an inspector that runs reads it anyway). */
  normalizeDecoded: boolean;
  /** The custom patterns, when they run in this scan: their set pass prefilters the others. */
  patterns: PatternPlan | null;
  /** A byte range of a larger body: its escapes are read as the whole body's (byte-ranges.ts). */
  context?: ViewContext | null;
  /** The larger body `raw` is bytes [start, end) of (a byte range's scan), for what must read past it. */
  within?: Within | null;
  /** The normalized stage reads the whole view, not its windows around changes (tests compare the two). */
  wholeNormalized?: boolean;
  /**
   * The scan's loans for the decoded view (scratch-buffers.ts): the scan ends them, after which no view
   * of this input may be read. Absent: views get buffers of their own.
   */
  scratch?: ScratchBuffers | null;
}

/** The whole body a byte range was cut from, and where. */
export interface Within {
  body: Buffer;
  start: number;
  end: number;
}

export function failureReason(err: unknown): string {
  return (err as Error)?.message || String(err);
}

export class InspectionInput {
  readonly raw: Buffer;
  readonly phase: Phase;
  readonly location: FindingLocation;
  /** The agent's secret values (the secrets inspector's needles). */
  readonly secrets: readonly string[];
  /** Model restriction reads every model named in the body, by its content type (named-models.ts). */
  readonly modelsAnywhere: { contentType: string | null } | null;
  #failures: InspectorFailure[];
  #normalizeDecoded: boolean;
  #patterns: PatternPlan | null;
  #context: ViewContext | null;
  #decoded: Buffer | null = null;
  #literal: Buffer | null = null;
  // undefined: not built yet; null: built, and there is nothing (or nothing different) to read.
  #joined: Buffer | null | undefined = undefined;
  #normalized: Buffer | null | undefined = undefined;
  /** NormalizedView.changes of #normalized. */
  #changes: number[] | null = null;
  #stage: Buffer | null | undefined = undefined;
  #normalizedJoined: Buffer | null | undefined = undefined;
  #literalHits: SetHits | null | undefined = undefined;
  #normalizedHits: SetHits | null | undefined = undefined;
  #within: Within | null;
  #wholeNormalized: boolean;
  #scratch: ScratchBuffers | null;
  #whole: InspectionInput | null = null;
  /**
   * Unbounded patterns escalated to the whole body (patterns.ts, OpenRange), across both stages; made
   * by a byte range's first openRange (a whole body has none).
   */
  #escalated: Set<number> | null = null;

  constructor(options: InputOptions) {
    this.raw = options.raw;
    this.phase = options.phase;
    this.location = bodyLocation(options.phase);
    this.secrets = options.secrets;
    this.modelsAnywhere = options.modelsAnywhere;
    this.#failures = options.failures;
    this.#normalizeDecoded = options.normalizeDecoded;
    this.#patterns = options.patterns;
    this.#context = options.context ?? null;
    this.#within = options.within ?? null;
    this.#wholeNormalized = options.wholeNormalized ?? false;
    this.#scratch = options.scratch ?? null;
  }

  /**
   * In a byte range's scan, what the patterns need to find a match the range holds only part of:
   * where the body goes on, and this stage's view of the whole body (built on first use). null when
   * this is a whole body.
   */
  openRange(stage: Stage): OpenRange | null {
    const within = this.#within;
    if (!within) return null;
    return {
      before: within.start > 0,
      after: within.end < within.body.length,
      whole: () => (stage === 'literal' ? this.#wholeInput(within).decoded() : this.#wholeInput(within).normalized()),
      escalated: (this.#escalated ??= new Set()),
    };
  }

  #wholeInput(within: Within): InspectionInput {
    this.#whole ??= new InspectionInput({
      raw: within.body,
      phase: this.phase,
      secrets: this.secrets,
      modelsAnywhere: this.modelsAnywhere,
      failures: this.#failures,
      normalizeDecoded: this.#normalizeDecoded,
      patterns: this.#patterns,
      context: this.#context,
      scratch: this.#scratch,
    });
    return this.#whole;
  }

  /** The body with its JSON escapes decoded. */
  decoded(): Buffer {
    if (this.#decoded === null) {
      const scratch = this.#scratch;
      const take: Take | undefined = scratch ? (n) => scratch.take(n) : undefined;
      const views = decodedViews(this.raw, this.#context?.jsonEscapes, take);
      this.#decoded = views.decoded;
      this.#literal = views.literal;
    }
    return this.#decoded;
  }

  /**
   * The body as sent, or decoded when escapes could hide a character of what the detectors look for.
   * When an inspector of the scan reads the decoded view anyway, it is built now and its walk tells
   * (no pass of its own over the body); else the body is searched for the escapes that hide.
   */
  literal(): Buffer {
    if (this.#literal === null) {
      if (this.#normalizeDecoded) this.decoded();
      else this.#literal = hidesCharacters(this.raw) ? this.decoded() : this.raw;
    }
    return this.#literal!;
  }

  /** A streamed response's joined delta text: what the agent reads (null: not a response, or no text). */
  joined(): Buffer | null {
    if (this.#joined === undefined) {
      this.#joined =
        this.phase === 'response'
          ? sseText(this.raw, () => this.#failures.push({ inspector: SSE_TEXT, reason: 'unparsable_lines' }))
          : null;
    }
    return this.#joined;
  }

  /** The normalized view of the body; null when it reads the same as the view it was built on. */
  normalized(): Buffer | null {
    if (this.#normalized === undefined) {
      const view = this.#normalize(this.#normalizeDecoded ? this.decoded() : this.literal());
      this.#normalized = view?.bytes ?? null;
      this.#changes = view?.changes ?? null;
    }
    return this.#normalized;
  }

  /**
   * What the normalized stage reads of normalized(): only the windows around what normalization changed
   * when the stage's detectors reach a bounded way from a change (normalized-windows.ts), else all of it;
   * null as for normalized(). A match elsewhere in the view is the decoded view's, found already.
   */
  normalizedStage(): Buffer | null {
    if (this.#stage === undefined) {
      const view = this.normalized();
      const changes = this.#changes;
      const reach =
        view === null || changes === null || this.#wholeNormalized || this.#within !== null
          ? null
          : windowReach(this.#patterns, this.secrets);
      this.#stage = reach === null ? view : (changedWindows(view!, changes!, reach) ?? view);
    }
    return this.#stage;
  }

  /** Where normalized() differs from the view it was built on (NormalizedView.changes); null: not told. */
  normalizedChanges(): number[] | null {
    this.normalized();
    return this.#changes;
  }

  /** The normalized view of the joined text; null as for joined(), or when it reads the same. */
  normalizedJoined(): Buffer | null {
    if (this.#normalizedJoined === undefined) {
      const joined = this.joined();
      this.#normalizedJoined = joined ? (this.#normalize(joined)?.bytes ?? null) : null;
    }
    return this.#normalizedJoined;
  }

  /**
   * The patterns' RE2.Set pass over the decoded view (`literal` stage) or the normalized view: which
   * custom patterns and which prefilters hit. null when the patterns do not run here, or it failed.
   */
  setHits(stage: Stage): SetHits | null {
    if (this.#patterns === null) return null;
    if (stage === 'literal') {
      if (this.#literalHits === undefined) this.#literalHits = this.#setPass(() => this.decoded());
      return this.#literalHits;
    }
    if (this.#normalizedHits === undefined) {
      this.#normalizedHits = this.#setPass(() => this.normalizedStage());
    }
    return this.#normalizedHits;
  }

  /** The prefilters that hit in a stage's view; null when no set pass ran (every detector runs). */
  prefilters(stage: Stage): Set<PrefilterId> | null {
    return this.phase === 'request' ? (this.setHits(stage)?.prefilters ?? null) : null;
  }

  /** The set pass over a view, built inside the guard: a view that fails to build fails the patterns only. */
  #setPass(view: () => Buffer | null): SetHits | null {
    try {
      const bytes = view();
      return bytes ? hits(bytes, this.#patterns!) : null;
    } catch (err) {
      this.#failures.push({ inspector: PATTERNS, reason: failureReason(err) });
      return null;
    }
  }

  #normalize(view: Buffer): NormalizedView | null {
    try {
      return normalizedView(view);
    } catch (err) {
      this.#failures.push({ inspector: NORMALIZED_VIEW, reason: failureReason(err) });
      return null;
    }
  }
}
