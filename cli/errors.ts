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
