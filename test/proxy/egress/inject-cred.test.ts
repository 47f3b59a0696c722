import t from 'tap';
import fc from 'fast-check';
import { GatewayRuleError, MissingCredentialError } from '../../../proxy/egress/errors.ts';
import { injectionsFor, parseInjectRule, rulesFor, type InjectRule } from '../../../proxy/egress/inject-cred.ts';
import { secretSource, type SecretMap } from '../../../proxy/llm/secrets-file.ts';

// --inject-cred rules: the two spellings, every refusal of a rule that does not hold together, which
// rules apply to a destination, and the credential each sets (the agent's secret over its org's; a
// missing or unsendable one refused, never sent bare). Properties: the spellings agree, any text is a
// rule or a GatewayRuleError, and the value lands in the header verbatim.

const secrets = (entries: Record<string, Record<string, string>>) =>
  secretSource(() => {
    const map: SecretMap = new Map();
    for (const [owner, values] of Object.entries(entries)) map.set(owner, new Map(Object.entries(values)));
    return map;
  });
const agent = { agentId: 'agent-1', orgId: 'org-1' };

const label = fc.stringMatching(/^[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?$/);
const host = fc
  .tuple(fc.boolean(), fc.array(label, { minLength: 1, maxLength: 3 }))
  .map(([glob, ls]) => `${glob ? '*.' : ''}${ls.join('.')}.test`);
const header = fc.stringMatching(/^x-[a-z0-9-]{1,20}$/);
const secretName = fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._:/-]{0,20}$/);
/** A header value around `{}`: printable, commas and spaces included, no `{}` of its own. */
const around = fc.stringMatching(/^[ -z|~]{0,12}$/).filter((s) => !s.includes('{}') && !s.endsWith('{'));
/** After `{}`: the same, not ending in a space (the end of a rule's text is trimmed, as HTTP trims a value). */
const after = around.filter((s) => !s.endsWith(' ') && !s.startsWith('}'));

t.test('the two spellings', async (t) => {
  const rule = parseInjectRule('host=API.GitHub.com,header=Authorization,secret=github_token,format=Bearer {}');
  t.same(rule, {
    host: 'api.github.com',
    port: null,
    header: 'authorization',
    secret: 'github_token',
    format: 'Bearer {}',
    text: 'host=API.GitHub.com,header=Authorization,secret=github_token,format=Bearer {}',
  });
  t.match(parseInjectRule('host=*.corp.test, port=8443, header=x-token, secret=t'), {
    host: '*.corp.test',
    port: 8443,
    format: '{}',
  });
  t.match(parseInjectRule('host=a.test,header=x-k,secret=s,format=k={}, v=1, w=2'), { format: 'k={}, v=1, w=2' });
  t.match(parseInjectRule('{"host":"a.test","port":443,"header":"x-k","secret":"s","format":"Token {}"}'), {
    host: 'a.test',
    port: 443,
    format: 'Token {}',
  });
});

t.test('rules that do not hold together are refused, naming why', async (t) => {
  const bad: [string, RegExp][] = [
    ['', /host is required/],
    ['header=x-k,secret=s', /host is required/],
    ['host=a b,header=x-k,secret=s', /not a host name or glob/],
    ['host=**.a.test,header=x-k,secret=s', /not a host name or glob/],
    ['host=a.test,port=0,header=x-k,secret=s', /port must be 1\.\.65535/],
    ['host=a.test,port=70000,header=x-k,secret=s', /port must be 1\.\.65535/],
    ['host=a.test,header=bad header,secret=s', /header must be an HTTP header name/],
    ['host=a.test,header=Host,secret=s', /header Host cannot be injected/],
    ['host=a.test,header=transfer-encoding,secret=s', /cannot be injected/],
    ['host=a.test,header=Proxy-Authorization,secret=s', /cannot be injected/],
    ['host=a.test,header=x-k,secret=', /secret must name a secret/],
    ['host=a.test,header=x-k,secret=s,format=none', /\{\} exactly once/],
    ['host=a.test,header=x-k,secret=s,format={}{}', /\{\} exactly once/],
    ['host=a.test,header=x-k,secret=s,format={}\r\nx-evil: 1', /line break/],
    ['host=a.test,header=x-k,secret=s,format={}\u0007', /control character/],
    ['host=a.test,host=b.test,header=x-k,secret=s', /host is given twice/],
    ['host=a.test,header=x-k,secret=s,colour=red', /unknown field "colour"/],
    ['host=a.test,__proto__=x,header=x-k,secret=s', /unknown field "__proto__"/],
    ['{"host":"a.test","header":"x-k","secret":"s","__proto__":"x"}', /unknown field "__proto__"/],
    ['{"host":"a.test","header":"x-k","secret":1}', /secret must be a string/],
    ['{"host":', /not valid JSON/],
    ['["host"]', /key=value/],
    ['{"x":"1"} ', /unknown field "x"/],
    ['null', /key=value/],
    ['novalue', /key=value/],
  ];
  for (const [text, message] of bad)
    t.throws(() => parseInjectRule(text), { name: 'GatewayRuleError', message }, JSON.stringify(text));
});

t.test('property: the two spellings are one rule', async (t) => {
  fc.assert(
    fc.property(
      host,
      fc.option(fc.integer({ min: 1, max: 65535 }), { nil: null }),
      header,
      secretName,
      around,
      after,
      (h, port, name, secret, before, after) => {
        const format = `${before}{}${after}`;
        const fields = `host=${h},${port === null ? '' : `port=${port},`}header=${name},secret=${secret},format=${format}`;
        const json = JSON.stringify({ host: h, ...(port === null ? {} : { port }), header: name, secret, format });
        const a = parseInjectRule(fields);
        const b = parseInjectRule(json);
        return (
          a.host === b.host &&
          a.port === b.port &&
          a.header === b.header &&
          a.secret === b.secret &&
          a.format === format &&
          b.format === format
        );
      },
    ),
  );
  t.pass();
});

t.test('property: any text is a rule or a GatewayRuleError, never a crash', async (t) => {
  const text = fc.oneof(
    fc.string(),
    fc.json(),
    fc
      .array(fc.tuple(fc.constantFrom('host', 'port', 'header', 'secret', 'format', 'x'), fc.string()), {
        maxLength: 6,
      })
      .map((fields) => fields.map(([k, v]) => `${k}=${v}`).join(',')),
  );
  fc.assert(
    fc.property(text, (s) => {
      try {
        parseInjectRule(s);
        return true;
      } catch (err) {
        return err instanceof GatewayRuleError;
      }
    }),
    { numRuns: 500 },
  );
  t.pass();
});

t.test('which rules apply: host glob and port, in the order given', async (t) => {
  const rules = [
    parseInjectRule('host=*.github.com,header=x-a,secret=a'),
    parseInjectRule('host=api.github.com,port=443,header=x-b,secret=b'),
    parseInjectRule('host=other.test,header=x-c,secret=c'),
  ];
  t.same(
    rulesFor(rules, 'api.github.com', 443).map((r) => r.header),
    ['x-a', 'x-b'],
  );
  t.same(
    rulesFor(rules, 'API.GITHUB.COM.', 8443).map((r) => r.header),
    ['x-a'],
  );
  t.same(rulesFor(rules, 'github.com', 443), []);
});

t.test('the credential: the agent secret over the org one; missing or unsendable refused', async (t) => {
  const rule = parseInjectRule('host=api.test,header=Authorization,secret=token,format=Bearer {}');
  const both = secrets({ 'agent:agent-1': { token: 'agent-value' }, 'org:org-1': { token: 'org-value' } });
  t.same(
    injectionsFor([rule], both, agent, 'api.test', 443).map((i) => [i.header, i.value]),
    [['authorization', 'Bearer agent-value']],
  );
  const orgOnly = secrets({ 'org:org-1': { token: 'org-value' } });
  t.equal(injectionsFor([rule], orgOnly, agent, 'api.test', 443)[0]!.value, 'Bearer org-value');
  t.same(injectionsFor([rule], orgOnly, agent, 'elsewhere.test', 443), [], 'no rule for that host');
  const refusals: [string, ReturnType<typeof secrets>, RegExp][] = [
    ['missing', secrets({}), /needs secret "token", which agent agent-1 does not have/],
    ['empty', secrets({ 'agent:agent-1': { token: '' } }), /does not have/],
    ['another org', secrets({ 'org:org-2': { token: 'x' } }), /does not have/],
    ['a line break', secrets({ 'agent:agent-1': { token: 'abc\r\nx-evil: 1' } }), /line break/],
    ['a control character', secrets({ 'agent:agent-1': { token: 'abc\u0000' } }), /control character/],
  ];
  for (const [name, source, message] of refusals) {
    const err = (() => {
      try {
        injectionsFor([rule], source, agent, 'api.test', 443);
        return null;
      } catch (e) {
        return e;
      }
    })();
    t.type(err, MissingCredentialError, name);
    t.match((err as Error).message, message, name);
    t.notOk((err as Error).message.includes('abc'), `${name}: the value is in no message`);
  }
});

t.test('property: the secret lands in the header verbatim, once', async (t) => {
  const value = fc.stringMatching(/^[\t -~]{1,40}$/);
  fc.assert(
    fc.property(around, around, value, (before, after, secret) => {
      const rule: InjectRule = parseInjectRule(
        JSON.stringify({ host: 'a.test', header: 'x-k', secret: 's', format: `${before}{}${after}` }),
      );
      const [injection] = injectionsFor([rule], secrets({ 'agent:agent-1': { s: secret } }), agent, 'a.test', 1);
      // `$&`, `$1` and `{}` in the value are text, not replacement patterns.
      return injection!.value === `${before}${secret}${after}`;
    }),
  );
  t.pass();
});
