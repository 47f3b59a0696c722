import { type Command, InvalidArgumentError, Option } from 'commander';
import { InvalidFlagError } from './errors.ts';
import { parseDuration } from './duration.ts';

// Every flag also reads DVX_<FLAG> (upper-cased, dashes to underscores); precedence is flag, then
// environment, then default (spec: Limits, "Environment"). commander implements that precedence for us
// once each Option carries its env name, so all flags are built here and nowhere else.
export const ENV_PREFIX = 'DVX_';

export function envName(flag: string): string {
  return ENV_PREFIX + flag.replace(/^-+/, '').replace(/-/g, '_').toUpperCase();
}

interface FlagSpec<T> {
  description: string;
  default?: T;
  parse?: (raw: string) => T;
  choices?: readonly string[];
}

/**
 * `flag('--inspect-timeout <duration>', {…})` → a commander Option bound to DVX_INSPECT_TIMEOUT.
 * A parse failure becomes commander's own "invalid argument" error naming the flag.
 */
export function flag<T = string>(spec: string, options: FlagSpec<T>): Option {
  const option = new Option(spec, options.description);
  const long = option.long ?? spec.split(/[ ,]/)[0];
  option.env(envName(long));
  if (options.choices) option.choices(options.choices);
  if (options.parse) {
    const parse = options.parse;
    option.argParser((raw: string) => {
      try {
        return parse(raw);
      } catch (err) {
        // commander reports an InvalidArgumentError as "option '--x <v>' argument 'v' is invalid. <message>".
        throw new InvalidArgumentError((err as Error).message);
      }
    });
  }
  if (options.default !== undefined) option.default(options.default);
  return option;
}

/**
 * A boolean flag: `--name` switches it on, `--no-name` off, DVX_NAME=true|false sets it from the
 * environment (flag wins). The flag takes no value, so `--name -` never swallows a following argument.
 */
export function addBooleanFlag(command: Command, name: string, description: string, defaultValue: boolean): Command {
  const key = camel(name);
  command.addOption(new Option(`--${name}`, `${description} (env ${envName(name)})`));
  command.addOption(new Option(`--no-${name}`, `turn off --${name}`).hideHelp());
  command.setOptionValueWithSource(key, defaultValue, 'default');
  command.hook('preAction', (_this, actionCommand) => {
    if (actionCommand !== command || command.getOptionValueSource(key) !== 'default') return;
    const raw = process.env[envName(name)];
    if (raw === undefined || raw === '') return;
    try {
      command.setOptionValueWithSource(key, parseBoolean(raw), 'env');
    } catch (err) {
      command.error(`error: environment ${envName(name)}: ${(err as Error).message}`, {
        exitCode: 2,
        code: 'commander.invalidArgument',
      });
    }
  });
  return command;
}

function camel(name: string): string {
  return name.replace(/-([a-z])/g, (_m, c: string) => c.toUpperCase());
}

export function parseBoolean(raw: string | undefined | boolean): boolean {
  if (raw === undefined || raw === true) return true;
  if (raw === false) return false;
  const v = raw.trim().toLowerCase();
  if (['1', 'true', 'yes', 'on'].includes(v)) return true;
  if (['0', 'false', 'no', 'off'].includes(v)) return false;
  throw new InvalidFlagError(`expected a boolean (true|false), got "${raw}"`);
}

export function parseDurationFlag(raw: string): number {
  const ms = parseDuration(raw);
  if (!(ms >= 0)) throw new InvalidFlagError(`expected a non-negative duration, got "${raw}"`);
  return ms;
}

export function parsePositiveInt(raw: string): number {
  if (!/^\d+$/.test(raw.trim())) throw new InvalidFlagError(`expected a non-negative integer, got "${raw}"`);
  return Number(raw);
}
