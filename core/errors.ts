import type { CatalogueEntry } from './problem.ts';

// The root of every dvx error, and core's own catalogue (CONTRIBUTING.md, "Errors").
//
// Each package keeps its errors in one `errors.ts`: one class per error, each with a stable `code`
// (`DVX_*`, never reused) declared once as a static and copied onto the instance, so the code is an
// own enumerable property and pino's `err` serializer writes it next to the message and the stack.
// docs/errors.md lists every code; test/core/error-catalogue.test.ts keeps the two in step.

export class DvxError extends Error {
  static readonly code: string = 'DVX_ERROR';
  readonly code: string;

  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.code = (new.target as typeof DvxError).code;
  }
}

/** `--tls-cert`/`--tls-key`/a CA bundle is missing, unreadable, not PEM, or the key does not match. */
export class TlsConfigError extends coded('DVX_TLS_CONFIG') {}

/**
 * A flag's or a `DVX_*` variable's value does not parse (a duration, an integer, a boolean). `flag()`
 * hands it to commander as its own invalid-argument error, so the usage line names the flag.
 */
export class InvalidFlagError extends coded('DVX_INVALID_FLAG') {}

/** A request an operator-facing API refuses: answered as the problem document of its catalogue entry (core/problem.ts). */
export class ApiError extends coded('DVX_API_PROBLEM') {
  readonly entry: CatalogueEntry;
  readonly detail: string | undefined;
  constructor(e: CatalogueEntry, detail?: string, options?: ErrorOptions) {
    super(detail ?? e.title, options);
    this.entry = e;
    this.detail = detail;
  }
}

/** A bearer token an operator API does not accept (bad signature, issuer, audience, org; a disabled account). */
export class AuthenticationError extends coded('DVX_UNAUTHENTICATED') {}

/** The KMS refused: unavailable provider, unreadable master key, a wrapped key it cannot unwrap. */
export class KmsError extends coded('DVX_KMS_REFUSED') {}

/** `--workers`: a worker of the first generation exited before it was ready, so the component did not start. */
export class WorkerStartError extends coded('DVX_WORKER_START') {
  /** The worker's exit code (1 when it was killed by a signal): the primary exits with it. */
  readonly exitCode: number;
  constructor(message: string, exitCode: number) {
    super(message);
    this.exitCode = exitCode;
  }
}

/**
 * The base of one catalogue entry: `export class WalFullError extends coded('DVX_WAL_FULL') {}`. The
 * class keeps its own name (the `name` of what is thrown) and may add fields and a constructor.
 */
export function coded(code: string) {
  return class extends DvxError {
    static override readonly code: string = code;
  };
}
