import type { Inspector } from '../inspector.ts';
import { inspector as apiKey } from './api-key.ts';
import { inspector as model } from './model-restriction.ts';
import { inspector as patterns } from './patterns.ts';
import { inspector as pii } from './pii.ts';
import { inspector as secrets } from './secrets.ts';

// The built-in inspectors, in the order a scan runs them (plan.ts and scan.ts iterate this list; none
// is named anywhere else). The cheap ones that block most often come first, so a deadline finds them
// done: model restriction, secrets, api_key, then pii and the custom patterns. The patterns come last
// also because they compile after the detectors whose prefilters join their RE2.Set. A pool worker
// reports each as it finishes, in this order, then the normalized view (scan.ts); a deadline names
// the ones that did not finish (engine.ts).
//
// The sidecars are not here: they are asynchronous network calls with a deadline and failure model
// of their own (always fail open), configured per sidecar rather than compiled (inspectors/sidecar.ts).

export const INSPECTORS: readonly Inspector<unknown>[] = [model, secrets, apiKey, pii, patterns];

/** The inspector whose model check the engine runs first, on the main thread, for a large body. */
export const MODEL_RESTRICTION = model.id;

/**
 * The inspector a large body's scan splits off onto a worker of its own (ScanPart `patterns`): the
 * decode and the RE2 passes cost about as much as every other inspector together.
 */
export const SPLIT_OFF = patterns.id;
