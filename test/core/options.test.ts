import t from 'tap';
import { Command } from 'commander';
import { addBooleanFlag, envName, flag, parseDurationFlag } from '../../core/options.ts';
import { parseDuration } from '../../core/duration.ts';

function program() {
  const c = new Command('x').exitOverride().configureOutput({ writeErr: () => {} });
  c.addOption(flag('--inspect-timeout <duration>', { description: 'd', default: 2000, parse: parseDurationFlag }));
  c.addOption(flag('--log-level <level>', { description: 'l', choices: ['debug', 'info'], default: 'info' }));
  addBooleanFlag(c, 'inspect-fail-closed', 'fc', false);
  c.argument('[rest]').action(() => {});
  return c;
}

function parse(argv: string[], env: Record<string, string>) {
  const saved = { ...process.env };
  Object.assign(process.env, env);
  try {
    return program().parse(argv, { from: 'user' }).opts();
  } finally {
    for (const k of Object.keys(env)) delete process.env[k];
    Object.assign(process.env, saved);
  }
}

t.test('env names are DVX_ + upper-cased flag with underscores', async (t) => {
  t.equal(envName('--inspect-timeout'), 'DVX_INSPECT_TIMEOUT');
  t.equal(envName('tls-cert'), 'DVX_TLS_CERT');
});

t.test('precedence is flag, then environment, then default', async (t) => {
  t.same(parse([], {}), { inspectTimeout: 2000, logLevel: 'info', inspectFailClosed: false });
  t.same(parse([], { DVX_INSPECT_TIMEOUT: '5s', DVX_LOG_LEVEL: 'debug', DVX_INSPECT_FAIL_CLOSED: 'true' }), {
    inspectTimeout: 5000,
    logLevel: 'debug',
    inspectFailClosed: true,
  });
  t.same(
    parse(['--inspect-timeout', '250ms', '--log-level', 'info', '--no-inspect-fail-closed'], {
      DVX_INSPECT_TIMEOUT: '5s',
      DVX_LOG_LEVEL: 'debug',
      DVX_INSPECT_FAIL_CLOSED: 'true',
    }),
    { inspectTimeout: 250, logLevel: 'info', inspectFailClosed: false },
  );
  t.equal(
    parse(['--inspect-fail-closed'], { DVX_INSPECT_FAIL_CLOSED: 'false' }).inspectFailClosed,
    true,
    'the flag beats the environment',
  );
  t.equal(parse([], { DVX_INSPECT_FAIL_CLOSED: 'false' }).inspectFailClosed, false);
  t.equal(parse(['--inspect-fail-closed', '-'], {}).inspectFailClosed, true, 'a boolean flag takes no value');
});

t.test('bad values are refused with the flag named', async (t) => {
  t.throws(() => parse(['--inspect-timeout', 'soon'], {}), /inspect-timeout/);
  t.throws(() => parse([], { DVX_INSPECT_TIMEOUT: 'soon' }), /inspect-timeout/);
  t.throws(() => parse(['--log-level', 'loud'], {}), /log-level/);
  t.throws(() => parse([], { DVX_INSPECT_FAIL_CLOSED: 'maybe' }), /DVX_INSPECT_FAIL_CLOSED: expected a boolean/);
});

t.test('durations read like Go durations', async (t) => {
  t.equal(parseDuration('2s'), 2000);
  t.equal(parseDuration('500ms'), 500);
  t.equal(parseDuration('1m30s'), 90_000);
  t.equal(parseDuration('5m'), 300_000);
  t.equal(parseDuration('1.5s'), 1500);
  t.equal(parseDuration('750'), 750, 'a bare number is milliseconds');
  t.throws(() => parseDuration(''));
  t.throws(() => parseDuration('2 s'));
  t.throws(() => parseDuration('2x'));
});
