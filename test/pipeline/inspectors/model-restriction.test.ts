import t from 'tap';
import { compile, permitted, scan } from '../../../pipeline/inspectors/model-restriction.ts';

const body = (o: unknown) => Buffer.from(JSON.stringify(o));

t.test('allowlist and blocklist', async (t) => {
  const allow = compile([{ immutable: false, mode: 'allowlist', models: ['claude-*', 'gpt-4o'] }])!;
  t.same(scan(body({ model: 'claude-sonnet-4-5', messages: [] }), allow), []);
  t.same(scan(body({ model: 'gpt-4o-mini' }), allow), [
    {
      inspector_type: 'model_restriction',
      severity: 'block',
      description: 'model is not on the allowlist of model_policy',
      match: 'gpt-****',
      location: 'model',
    },
  ]);
  const block = compile([{ immutable: false, mode: 'blocklist', models: ['*-preview'] }])!;
  t.equal(scan(body({ model: 'o1-preview' }), block).length, 1);
  t.same(scan(body({ model: 'o1' }), block), []);
  t.same(scan(body({ messages: [] }), block), [], 'no model: nothing on a blocklist to match');
  t.match(scan(body({ messages: [] }), allow)[0], { description: /no string model field/ });
});

t.test('layers compose by AND', async (t) => {
  const plan = compile([
    { immutable: false, mode: 'allowlist', models: ['claude-*'] },
    { immutable: false, mode: 'blocklist', models: ['claude-*-opus*'] },
  ])!;
  t.ok(permitted(plan, 'claude-3-5-sonnet'));
  t.notOk(permitted(plan, 'claude-3-opus-latest'));
  t.notOk(permitted(plan, 'gpt-4o'));
});

t.test('the model is read from the top level only, escapes decoded, every duplicate in any case checked', async (t) => {
  const plan = compile([{ immutable: false, mode: 'allowlist', models: ['claude-*'] }])!;
  t.equal(
    scan(Buffer.from('{"messages":[{"model":"claude-x"}],"metadata":{"model":"claude-y"},"model":"gpt-4o"}'), plan)
      .length,
    1,
  );
  t.same(scan(Buffer.from('{"model":"\\u0063laude-haiku"}'), plan), []);
  t.equal(
    scan(Buffer.from('{"model":"claude-haiku","model":"gpt-4o"}'), plan).length,
    1,
    'upstreams read the last one',
  );
  t.equal(
    scan(Buffer.from('{"model":"gpt-4o","model":"claude-haiku"}'), plan).length,
    1,
    'and a parser that keeps the first would read this one',
  );
  t.equal(
    scan(Buffer.from('{"model":"claude-haiku","Model":"gpt-4o"}'), plan).length,
    1,
    'Go decoders take "Model" for the same field',
  );
  t.equal(scan(Buffer.from('{"model":"claude-haiku","MOD\\u0045L":"gpt-4o"}'), plan).length, 1, 'escaped, in any case');
  t.same(
    scan(Buffer.from('{"model":"claude-haiku","models":"gpt-4o","Mode":"x"}'), plan),
    [],
    'other keys are other keys',
  );
  t.equal(scan(Buffer.from('{"model":["claude-haiku"]}'), plan).length, 1, 'not a string');
  t.equal(scan(Buffer.from('not json'), plan).length, 1);
  t.same(
    scan(Buffer.from('  {"stream":true,"messages":[{"content":"a \\"quoted\\" {brace"}],"model":"claude-z"}'), plan),
    [],
  );
});

t.test('malformed globs match nothing and are reported', async (t) => {
  const plan = compile([{ immutable: false, mode: 'blocklist', models: ['[', 'gpt-*'] }])!;
  t.same(plan.malformed, ['[']);
  t.ok(permitted(plan, '['));
  t.notOk(permitted(plan, 'gpt-4'));
});
