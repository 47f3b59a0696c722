import t from 'tap';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { cpUrl, operatorCli } from './operator-cli-fixture.ts';

// dvx flags against a real control plane: the token's org's feature flags, enabled when never set,
// disabled and enabled again; an unknown flag fails locally; a caller without org:manage gets exit 4.

const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'nobody', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
const cli = await operatorCli(t, h.issuer, h.ca, cpUrl(h));

t.test('list, get, disable, enable, set', async (t) => {
  t.same(await cli.json('root', ['flags', 'list']), [
    { flag: 'inspect:llm', org_id: 'org-a', enabled: true },
    { flag: 'audit:llm', org_id: 'org-a', enabled: true },
  ]);
  t.same(await cli.json('root', ['flags', 'disable', 'inspect:llm']), {
    flag: 'inspect:llm',
    org_id: 'org-a',
    enabled: false,
    published: false,
  });
  t.match(await cli.json('root', ['flags', 'get', 'inspect:llm']), { enabled: false });
  t.match(await cli.json('root', ['flags', 'enable', 'inspect:llm']), { enabled: true });
  t.match(await cli.json('root', ['flags', 'set', 'audit:llm', 'false']), { enabled: false });
  const stored = (await h.call('root', 'GET', '/feature-flags')).body;
  t.match(stored, [
    { flag: 'inspect:llm', enabled: true },
    { flag: 'audit:llm', enabled: false },
  ]);
  const table = await cli.dvx('root', ['flags', 'list', '--output', 'table']);
  t.match(table.stdout, /^FLAG\s+ORG_ID\s+ENABLED\ninspect:llm\s+org-a\s+true\naudit:llm\s+org-a\s+false\n$/);
});

t.test('local validation and refusals', async (t) => {
  for (const args of [
    ['flags', 'enable', 'inspect:everything'],
    ['flags', 'set', 'audit:llm', 'maybe'],
  ]) {
    const r = await cli.dvx('root', args, { url: 'https://127.0.0.1:1' });
    t.equal(r.code, 2, args.join(' '));
  }
  const refused = await cli.dvx('nobody', ['flags', 'disable', 'audit:llm']);
  t.equal(refused.code, 4);
  t.match(refused.stderr, /^dvx: 403 /);
});
