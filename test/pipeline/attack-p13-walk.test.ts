import t from 'tap';
import { InspectionEngine, type InspectionOutcome } from '../../pipeline/engine.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';

// Attacks on the part walk (conversation-parts.ts): bodies it might read differently from JSON.parse or
// an upstream, sent twice (the second time every part is a cache hit), each decided as an engine
// without the cache (the oracle) decides it. These held: every byte is in the skeleton or in a part,
// and what the walk cannot read it leaves whole.

const policy = policyFromDocument(
  validatePolicyDocument({
    content_inspection: {
      secrets_filter: { enabled: true },
      api_key_detection: { enabled: true, severity: 'block' },
      pii_detection: { enabled: true },
      patterns: [{ pattern: 'launch code [a-z]{6}', description: 'launch', severity: 'block' }],
    },
  }),
);
const SECRETS = Object.freeze(['hunter2hunter2']);
const AGENT = { agentId: 'agent-1', orgId: 'org-1', agentName: 'coder' };
const pad = 'lorem ipsum '.repeat(30);
const part = (text: string) => JSON.stringify({ role: 'user', content: `${pad} ${text} ${pad}` });
const clean = part('nothing here');
const leak = part('launch code abcdef');

const BODIES: Record<string, string> = {
  'messages twice (upstream reads the last)': `{"model":"m","messages":[${clean}],"messages":[${leak}]}`,
  'messages twice, leak in the first': `{"model":"m","messages":[${leak}],"messages":[${clean}]}`,
  'an escaped key names messages': `{"model":"m","m\\u0065ssages":[${clean},${leak}]}`,
  'a byte order mark first': `\ufeff{"model":"m","messages":[${clean},${leak}]}`,
  'a second document': `{"model":"m","messages":[${clean}]}{"model":"m","messages":[${leak}]}`,
  'odd backslash runs before quotes': `{"model":"m","messages":[${part('\\\\\\" ] } { [ ,')},${leak}]}`,
  'a quote-backslash run closing a string': `{"model":"m","messages":[${part('x\\\\')},${part('\\\\\\\\')},${leak}]}`,
  'nested arrays as elements': `{"model":"m","messages":[[${clean}],[${leak}]]}`,
  'literals among the elements': `{"model":"m","messages":[true,1e5,null,-0.5,${clean},${leak}]}`,
  'the leak behind escapes': `{"model":"m","messages":[${clean},${part('l\\u0061unch code \\u0061bcdef')}]}`,
  'a secret behind a nested escape': `{"model":"m","messages":[${clean},${part('hunter2\\\\u0068unter2')}]}`,
  'an api key in tools': `{"model":"m","messages":[${clean}],"tools":[${part('AKIAIOSFODNN7EXAMPLE')}]}`,
  'the leak in the skeleton next to cached parts': `{"model":"m","messages":[${clean},"launch code abcdef"]}`,
  'whitespace everywhere': `\n\t {\r\n"model" : "m" ,\n "messages" :\n[\n${clean}\n,\n${leak}\n]\n}\n`,
  'invalid UTF-8 in a part': `{"model":"m","messages":[${part('\udc80')},${leak}]}`,
};

const view = (o: InspectionOutcome) => ({
  decision: o.decision,
  findings: o.findings.map((f) => `${f.inspector_type}|${f.description}|${f.match}|${f.severity}`).sort(),
});

t.test('bodies the walk might misread are decided as without the cache', async (t) => {
  const cached = new InspectionEngine({ threads: 0, adaptiveOffload: null });
  const oracle = new InspectionEngine({ threads: 0, adaptiveOffload: null, cacheBytes: 0 });
  t.teardown(() => Promise.all([cached.close(), oracle.close()]));
  for (const [name, text] of Object.entries(BODIES)) {
    const body = Buffer.from(text);
    const inspect = (e: InspectionEngine) =>
      e.inspect({ body, phase: 'request', policy, secrets: SECRETS, identity: AGENT });
    const want = view(await oracle.inspect({ body, phase: 'request', policy, secrets: SECRETS }));
    t.not(want.findings.length, 0, `${name}: the oracle finds the leak`);
    t.same(view(await inspect(cached)), want, `${name}: first time`);
    t.same(view(await inspect(cached)), want, `${name}: resent`);
  }
});

t.test('a clean turn cached, then the same parts with the leak moved into them', async (t) => {
  const cached = new InspectionEngine({ threads: 0, adaptiveOffload: null });
  t.teardown(() => cached.close());
  const inspect = (text: string) =>
    cached.inspect({ body: Buffer.from(text), phase: 'request', policy, secrets: SECRETS, identity: AGENT });
  t.equal((await inspect(`{"model":"m","messages":[${clean},${clean}]}`)).decision, 'allow');
  // Parts of the same length as the cached clean ones, one word changed: compared, not trusted.
  const first = part('launch code qwerty');
  const second = part('launch code zxcvbn');
  t.equal(first.length, part('nothing here zzzzz').length);
  t.equal((await inspect(`{"model":"m","messages":[${clean},${first}]}`)).decision, 'block');
  t.equal((await inspect(`{"model":"m","messages":[${second},${clean}]}`)).decision, 'block');
  t.equal((await inspect(`{"model":"m","messages":[${clean},${part('nothing here zzzzz')}]}`)).decision, 'allow');
  t.equal((await inspect(`{"model":"m","messages":[${clean},${first}]}`)).decision, 'block', 'a cached block blocks');
});
