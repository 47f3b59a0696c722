import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// A route's body is a JSON object, whatever media type it is sent as. fastify parses text/plain into a
// string, and a body schema keyed by media type (routes/schemas.ts optionalBody) is validated only for
// the types it names: such a body must still be refused before the handler acts on it.
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'bob', org: 'org-b', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
const call = (who: string, method: string, path: string, body?: unknown) => h.call(who, method, path, body);
const token = new Map<string, string>();
const plain = async (who: string, method: string, path: string, text: string) => {
  if (!token.has(who)) token.set(who, await h.issuer.token(who));
  const r = await h.rawAt(h.cp.port, method, `/api/v1${path}`, text, {
    authorization: `Bearer ${token.get(who)}`,
    'content-type': 'text/plain',
  });
  return { status: r.status, body: JSON.parse(r.text) as { detail?: string } };
};

await call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
await call('root', 'PUT', '/orgs/org-a/members/alice', { username: 'alice', email: 'alice@example.com' });
await call('root', 'POST', '/orgs/org-a/agents', { uid: 'ag1', name: 'one' });

t.test('a text/plain body on a route whose body is optional is a 400, and nothing changes', async (t) => {
  const member = await plain('root', 'PUT', '/orgs/org-a/members/alice', '{"username":5,"zzz":1}');
  t.equal(member.status, 400);
  t.equal(member.body.detail, 'body: must be a JSON object');
  const members = await call('root', 'GET', '/orgs/org-a/members');
  t.match(members.body, [{ subject: 'alice', username: 'alice', email: 'alice@example.com' }], 'the member is kept');

  const release = await plain('root', 'POST', '/orgs/org-a/agents/ag1/containment', '{"contained":false}');
  t.equal(release.status, 400);
  const suspend = await plain('root', 'POST', '/orgs/org-a/agents/ag1/suspend', 'junk');
  t.equal(suspend.status, 400);
  const agent = await call('root', 'GET', '/orgs/org-a/agents/ag1');
  t.equal(agent.body.contained, false, 'not contained');
  t.not(agent.body.status, 'suspended', 'not suspended');

  const erasure = await plain('root', 'POST', '/orgs/org-a/erasure', '{"x":1}');
  t.equal(erasure.status, 400, 'no erasure starts on a refused body');
});

t.test('a caller without the capability is refused before its body is looked at', async (t) => {
  const r = await plain('bob', 'PUT', '/orgs/org-a/members/alice', 'junk');
  t.equal(r.status, 403);
});
