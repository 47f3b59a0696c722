import { coded } from '../core/errors.ts';
import { EXIT_USAGE } from './exit-codes.ts';

// The cli error catalogue (docs/errors.md, "cli").

/** A command cannot go on: reported as one line on stderr with its exit code, never as a stack trace. */
export class CliError extends coded('DVX_CLI') {
  readonly exitCode: number;
  constructor(message: string, exitCode = EXIT_USAGE, options?: ErrorOptions) {
    super(message, options);
    this.exitCode = exitCode;
  }
}

/**
 * An operator API or the broker answered a call with a non-2xx status: reported as one line
 * (`404 Not Found: no org acme`, from its Problem document) with the exit code of its class.
 */
export class ProblemAnswerError extends coded('DVX_CLI_PROBLEM') {
  readonly exitCode: number;
  readonly status: number;
  readonly body: unknown;
  constructor(message: string, exitCode: number, status: number, body: unknown) {
    super(message);
    this.exitCode = exitCode;
    this.status = status;
    this.body = body;
  }
}

/**
 * A component of `dvx dev` failed to start: its error (the cause) tagged with the `dvx dev` flags of
 * the listeners it opens, so that an address in use is reported against the right flag (cli/dev.ts).
 */
export class DevStartError extends coded('DVX_CLI_DEV_START') {
  /** DevFlags keys: `llmproxyAddr`, … (the broker's two: `brokerAddr`, `brokerOperatorAddr`). */
  readonly listeners: readonly string[];
  constructor(listeners: readonly string[], cause: unknown) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
    this.listeners = listeners;
  }
}
