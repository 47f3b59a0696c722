// The pipeline's error catalogue: stable codes, one class each (STYLE.md rule 2).

export class PolicyValidationError extends Error {
  override name = 'PolicyValidationError';
  readonly code = 'DVX_POLICY_INVALID';
  /** Dotted path of the offending field, e.g. `content_inspection.patterns[2].severity`. */
  readonly path: string;
  constructor(path: string, message: string) {
    super(`${path || 'policy'}: ${message}`);
    this.path = path;
  }
}

export class PolicyScopeError extends Error {
  override name = 'PolicyScopeError';
  readonly code = 'DVX_POLICY_SCOPE';
}

export class BodyTooLargeError extends Error {
  override name = 'BodyTooLargeError';
  readonly code = 'DVX_BODY_TOO_LARGE';
}

export class SidecarError extends Error {
  override name = 'SidecarError';
  readonly code = 'DVX_SIDECAR_FAILED';
  /** network | timeout | status | bad_json | too_large */
  readonly reason: string;
  constructor(reason: string, message: string) {
    super(message);
    this.reason = reason;
  }
}
