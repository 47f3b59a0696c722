import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// A scoped route's agent scope (?scope=agent&agent=…) is checked over the agent's org when the agent is
// there, and over the org the caller named (or its own) when it is not: a caller without the capability
// is refused the same way whether the agent exists or not, and the 404 comes only after the check.
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'bob', org: 'org-b', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
for (const [id, name] of [
  ['org-a', 'A'],
  ['org-b', 'B'],
])
  await h.call('root', 'POST', '/orgs', { id, name });
await h.call('root', 'POST', '/orgs/org-a/agents', { uid: 'ag1', name: 'one' });

t.test('a caller without the capability learns nothing of which agents exist', async (t) => {
  for (const path of ['/config', '/policies/destination']) {
    for (const q of ['scope=agent&agent=ag1', 'scope=agent&agent=nope', 'scope=agent&agent=ag1&org=org-b']) {
      const r = await h.call('bob', 'GET', `${path}?${q}`);
      t.equal(r.status, 403, `${path}?${q}`);
    }
  }
});

t.test('the caller with the capability gets the 404', async (t) => {
  const missing = await h.call('root', 'GET', '/config?scope=agent&agent=nope');
  t.equal(missing.status, 404);
  t.equal(missing.body.detail, 'no agent nope');
  const elsewhere = await h.call('root', 'GET', '/config?scope=agent&agent=ag1&org=org-b');
  t.equal(elsewhere.status, 404);
  t.equal(elsewhere.body.detail, 'no agent ag1 in org org-b');
  t.equal((await h.call('root', 'GET', '/config?scope=agent&agent=ag1')).status, 200);
});
