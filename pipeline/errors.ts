import { coded } from '../core/errors.ts';

// The pipeline's error catalogue: stable codes, one class each (docs/errors.md, "pipeline").

/** A policy document fails validation: the dotted path of the offending field is kept. */
export class PolicyValidationError extends coded('DVX_POLICY_INVALID') {
  /** Dotted path of the offending field, e.g. `content_inspection.patterns[2].severity`. */
  readonly path: string;
  constructor(path: string, message: string) {
    super(`${path || 'policy'}: ${message}`);
    this.path = path;
  }
}

/** A policy row asks for what its scope cannot have (a lock or `immutable` at agent scope). */
export class PolicyScopeError extends coded('DVX_POLICY_SCOPE') {}

/** A body handed to the engine is larger than it inspects (MAX_INSPECTED_BYTES). */
export class BodyTooLargeError extends coded('DVX_BODY_TOO_LARGE') {}

/** A sidecar call failed: network, timeout, a non-200 status, bad JSON or a response over 1 MB. */
export class SidecarError extends coded('DVX_SIDECAR_FAILED') {
  /** network | timeout | deadline | status | bad_json | too_large */
  readonly reason: string;
  constructor(reason: string, message: string, options?: ErrorOptions) {
    super(message, options);
    this.reason = reason;
  }
}

/** The inspection deadline passed before the waited-for inspectors finished (the abort reason). */
export class DeadlineError extends coded('DVX_INSPECTION_DEADLINE') {}

/**
 * A custom pattern's syntax the literal reader (pattern-anchors.ts) does not follow: the pattern gets no
 * anchor and runs over the whole view, as before. Caught inside anchorOf; never reaches a caller.
 */
export class AnchorUnsupportedError extends coded('DVX_PATTERN_ANCHOR_UNSUPPORTED') {}

/** A model glob is malformed in Go's path.Match syntax (ErrBadPattern); it matches nothing. */
export class BadGlobError extends coded('DVX_GLOB_MALFORMED') {}

/** A config-values document (docs/snapshot.md, "Config values") fails validation: the offending field's path is kept. */
export class ConfigValuesError extends coded('DVX_CONFIG_VALUES_INVALID') {
  /** Dotted path of the offending field, e.g. `config.orgs.org-1.config.api.token.locked`. */
  readonly path: string;
  constructor(path: string, message: string) {
    super(`${path}: ${message}`);
    this.path = path;
  }
}
