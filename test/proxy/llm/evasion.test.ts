import t from 'tap';
import { until } from '../../fixtures/eventually.ts';
import { AGENT_SECRET, startHarness } from '../../fixtures/llmproxy-harness.ts';

// Evasion the detectors should not allow, end to end: what a reader of the upstream would
// reassemble (a secret with a zero-width space inside and in upper case, a key spelled with HTML
// entities, JSON-escaped invisibles or control characters, an address in full width) is found and, at `block`, never
// forwarded (docs/decisions.md, "Evasion: the normalized view").
const h = await startHarness();
t.teardown(() => h.close());

const anthropicBody = (content: string) =>
  JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content }] });
const post = async (body: string, headers: Record<string, string> = {}) =>
  h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token(), ...headers },
    body,
  });
const zwsp = (s: string, at: number) => s.slice(0, at) + '\u200b' + s.slice(at);

t.test('a request is blocked with the right findings, and nothing reaches the upstream', async (t) => {
  const cases: [string, string, Record<string, unknown>][] = [
    [
      'the agent secret, upper case, a ZWSP inside',
      anthropicBody(`db password: ${zwsp(AGENT_SECRET.toUpperCase(), 7)}`),
      { inspector_type: 'secrets', severity: 'block', location: 'request_body', match: 'hunt****' },
    ],
    [
      'an AWS key with &#x200b; inside',
      anthropicBody('key AKIA&#x200b;IOSFODNN7EXAMPLE'),
      {
        inspector_type: 'api_key',
        severity: 'block',
        location: 'request_body',
        match: 'AKIA****',
        description: 'AWS access key ID',
      },
    ],
    [
      'an AWS key with a JSON-escaped ZWSP inside',
      anthropicBody('key AKIA\u200bIOSFODNN7EXAMPLE').replace('\u200b', '\\u200B'),
      { inspector_type: 'api_key', severity: 'block', location: 'request_body', match: 'AKIA****' },
    ],
    [
      'an AWS key in full width',
      anthropicBody('key ＡＫＩＡＩＯＳＦＯＤＮＮ７ＥＸＡＭＰＬＥ'),
      { inspector_type: 'api_key', severity: 'block', location: 'request_body', match: 'AKIA****' },
    ],
    [
      'the agent secret spelled with entities',
      anthropicBody(`pw ${AGENT_SECRET.replaceAll('-', '&#45;').replace('h', '&#x68;')}`),
      { inspector_type: 'secrets', severity: 'block', location: 'request_body', match: 'hunt****' },
    ],
    [
      'an AWS key with a NUL escaped after each letter',
      anthropicBody([...'AKIAIOSFODNN7EXAMPLE'].join('\u0000')),
      { inspector_type: 'api_key', severity: 'block', location: 'request_body', match: 'AKIA****' },
    ],
    [
      'the agent secret with a raw DEL and a \\b escape inside',
      anthropicBody(`pw ${AGENT_SECRET.slice(0, 3)}\u007f${AGENT_SECRET.slice(3, 9)}\b${AGENT_SECRET.slice(9)}`),
      { inspector_type: 'secrets', severity: 'block', location: 'request_body', match: 'hunt****' },
    ],
  ];
  for (const [name, body, finding] of cases) {
    const before = h.upstream.received.length;
    const r = await post(body);
    t.equal(r.status, 403, name);
    t.match(JSON.parse(r.text), { type: 'error', error: { type: 'content_policy_violation' } });
    t.equal(h.upstream.received.length, before, `${name}: nothing forwarded`);
    await until(() => h.proxy.proxy.inFlight === 0);
    t.match(h.audit.at(-1), { status: 403, findings: [finding] }, name);
    t.notOk(
      JSON.stringify(h.audit.at(-1)).toLowerCase().includes(AGENT_SECRET.slice(4)),
      `${name}: the secret is not in the audit record`,
    );
  }
});

t.test('a warn finding in normalized text is recorded and the call goes ahead', async (t) => {
  const r = await post(anthropicBody('write to bob＠example&period;com'));
  t.equal(r.status, 200);
  await until(() => h.proxy.proxy.inFlight === 0);
  t.match(h.audit.at(-1), {
    status: 200,
    findings: [{ inspector_type: 'pii', severity: 'warn', description: 'email address', match: 'bob@****' }],
  });
});

t.test('a response leaking the secret in another case, split by an entity, is recorded', async (t) => {
  const leak = `the password is ${AGENT_SECRET.toUpperCase().replace('-', '&#x200b;-')} ok`;
  const r = await post(anthropicBody('hi'), { 'x-test-reply': leak });
  t.equal(r.status, 200, 'response inspection is observe-only');
  await until(() => h.proxy.proxy.inFlight === 0);
  t.match(h.audit.at(-1), {
    status: 200,
    findings: [{ inspector_type: 'secrets', severity: 'block', location: 'response_body', match: 'hunt****' }],
  });
});

t.test('ordinary text is no finding', async (t) => {
  const r = await post(anthropicBody('R&D report, ２０２４年１２月, family 👨‍👩‍👧, Tom &amp; Jerry, HUNTER2-AGENT'));
  t.equal(r.status, 200);
  await until(() => h.proxy.proxy.inFlight === 0);
  t.same(h.audit.at(-1)!.findings, []);
});
