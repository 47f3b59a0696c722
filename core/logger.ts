import { pino, type Logger, type DestinationStream } from 'pino';

// Two streams share stdout and are told apart by a top-level `stream` key (spec: operator-api, rule 6):
// `{"stream":"app",…}` for application logs, `{"stream":"audit",…}` for audit records when no store is set
// (audit-wal/stdout-sink.ts writes those).
export type LogFormat = 'json' | 'text';
export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
export const LOG_FORMATS: readonly LogFormat[] = ['json', 'text'];
export const LOG_LEVELS: readonly LogLevel[] = ['debug', 'info', 'warn', 'error'];

export interface LoggerOptions {
  level?: LogLevel;
  format?: LogFormat;
  /** Where lines go; stdout by default. Tests pass a stream to read what was logged. */
  destination?: DestinationStream;
  component?: string;
}

const REDACT_PATHS = ['secret', 'secrets', 'value', 'authorization', 'headers.authorization', 'headers["x-api-key"]'];

export function createLogger(options: LoggerOptions = {}): Logger {
  const stream = 'app';
  const destination = options.destination ?? pino.destination({ dest: 1, sync: false });
  const sink = options.format === 'text' ? textFormatter(destination) : destination;
  return pino(
    {
      level: options.level ?? 'info',
      base: options.component ? { stream, component: options.component } : { stream },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
      // A secret value must never reach a log line, even by accident (spec: secrets filter).
      redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    },
    sink,
  );
}

/** A logger that drops everything: for library use where the caller passed none. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}

/** `--log-format text`: one human line per record, `time level [stream] msg key=value…`. */
function textFormatter(out: DestinationStream): DestinationStream {
  return {
    write(line: string) {
      let rec: Record<string, unknown>;
      try {
        rec = JSON.parse(line) as Record<string, unknown>;
      } catch {
        out.write(line); // not a pino record: passed through as it is
        return;
      }
      const { time, level, stream, msg, ...rest } = rec;
      const extras = Object.entries(rest)
        .map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`)
        .join(' ');
      out.write(
        `${String(time)} ${String(level).toUpperCase()} [${String(stream)}] ${String(msg ?? '')}${extras ? ' ' + extras : ''}\n`,
      );
    },
  };
}

export type { Logger };
