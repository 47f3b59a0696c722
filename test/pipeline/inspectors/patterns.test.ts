import t from 'tap';
import { compile, scan } from '../../../pipeline/inspectors/patterns.ts';
import { scanView } from '../../../pipeline/json-view.ts';

t.test('RE2.Set finds which patterns match; only those extract', async (t) => {
  const plan = compile(
    [
      { pattern: '(?i)project[- ]nightingale', description: 'codename', severity: 'block' },
      { pattern: 'ticket-[0-9]{4}', description: '', severity: 'warn' },
      { pattern: 'never-here', description: 'absent', severity: 'log' },
    ],
    [],
    { located: false },
  )!;
  t.ok(plan.set, 'a set over the compiled patterns');
  const f = scan(
    Buffer.from('Project Nightingale: see ticket-1234 and ticket-5678, ticket-1234'),
    plan,
    'request_body',
  );
  t.same(
    f.map((x) => [x.description, x.match, x.severity]),
    [
      ['codename', 'Proj****', 'block'],
      ['custom pattern /ticket-[0-9]{4}/', 'tick****', 'warn'],
      ['custom pattern /ticket-[0-9]{4}/', 'tick****', 'warn'],
    ],
  );
  t.equal(f.length, 3, 'distinct matches only');
});

t.test('invalid patterns are skipped and reported, never an error', async (t) => {
  const plan = compile([
    { pattern: '(?<!x)lookbehind', description: 'unsupported by re2', severity: 'block' },
    { pattern: '([unclosed', description: 'broken', severity: 'block' },
    { pattern: 'ok-[0-9]+', description: 'fine', severity: 'warn' },
  ])!;
  t.equal(plan.invalid.length, 2);
  t.match(plan.invalid[0], { pattern: '(?<!x)lookbehind' });
  t.same(
    scan(Buffer.from('ok-1 lookbehind'), plan, 'request_body').map((f) => f.description),
    ['fine'],
  );
});

t.test('catastrophic-backtracking patterns run in linear time under re2', async (t) => {
  const plan = compile([
    { pattern: '(a+)+$', description: 'redos', severity: 'warn' },
    { pattern: '(x+x+)+y', description: 'redos2', severity: 'warn' },
  ])!;
  const body = Buffer.from('a'.repeat(100_000) + '!' + 'x'.repeat(100_000));
  const started = process.hrtime.bigint();
  t.same(scan(body, plan, 'request_body'), []);
  t.ok(Number(process.hrtime.bigint() - started) / 1e6 < 5000, 'finishes (V8 RegExp would not)');
});

t.test('empty matches are ignored; escapes are decoded first', async (t) => {
  const plan = compile([
    { pattern: 'z*', description: 'empty', severity: 'warn' },
    { pattern: 'https://internal/[a-z]+', description: 'url', severity: 'warn' },
  ])!;
  t.same(
    scan(scanView(Buffer.from('{"u":"https:\\/\\/internal\\/admin"}')), plan, 'request_body').map((f) => f.description),
    ['url'],
  );
});

t.test('several hitting patterns: one combined pass, and none loses its findings', async (t) => {
  const plan = compile([
    { pattern: 'abc', description: 'short', severity: 'warn' },
    { pattern: 'abcdef', description: 'long', severity: 'block' },
    { pattern: '(?P<x>id)-([0-9]+)', description: 'grouped', severity: 'log' },
    { pattern: '(?P<x>zz)', description: 'same group name', severity: 'log' },
  ])!;
  const found = scan(Buffer.from('abcdef and id-42 and zz'), plan, 'request_body')
    .map((f) => `${f.description}:${f.match}:${f.severity}`)
    .sort();
  t.same(
    found,
    ['grouped:id-4****:log', 'long:abcd****:block', 'same group name:zz****:log', 'short:abc****:warn'],
    'overlaps and shared group names still report every pattern',
  );
  const two = compile([
    { pattern: 'foo[0-9]+', description: 'a', severity: 'warn' },
    { pattern: 'bar', description: 'b', severity: 'warn' },
  ])!;
  t.same(
    scan(Buffer.from('foo1 bar foo2 bar'), two, 'request_body').map((f) => f.match),
    ['foo1****', 'bar****', 'foo2****'],
    'in order of appearance',
  );
});

t.test('the findings bound is shared per pattern: many matches of one pattern do not hide another', async (t) => {
  const plan = compile([
    { pattern: 'INC-[0-9]{6}', description: 'incident', severity: 'log' },
    { pattern: 'corp-secret-[a-z]{4}', description: 'corp secret', severity: 'block' },
  ])!;
  // 200 distinct incidents first, then one secret: the old scan stopped the whole inspector at 64.
  const padding = Array.from({ length: 200 }, (_, i) => `INC-${String(100000 + i)}`).join(' ');
  const found = scan(Buffer.from(`${padding} corp-secret-abcd`), plan, 'request_body');
  t.ok(
    found.some((f) => f.severity === 'block' && f.description === 'corp secret'),
    'the block pattern after the padding is found',
  );
  t.ok(found.length <= 64 + 2, `bounded (${found.length})`);
  t.equal(found.filter((f) => f.description === 'incident').length, 32, 'each pattern keeps its share');
  const alone = compile([{ pattern: 'INC-[0-9]{6}', description: 'incident', severity: 'log' }])!;
  t.equal(scan(Buffer.from(padding), alone, 'request_body').length, 64, 'one pattern alone may use the whole bound');
});
