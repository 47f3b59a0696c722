import t from 'tap';
import { buildProgram } from '../../../cli/program.ts';
import { declaredRoutes } from '../../../cli/operator/operator-command.ts';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';

// The control plane's OpenAPI document and the CLI agree (issue: "a test fails when a route has no
// command"): every operation of GET /api/v1/openapi.json is declared by some command, and every
// control-plane route a command declares is in the document (no command wraps nothing).

const h = await startCpHarness([{ clientId: 'root', org: 'org-a' }], { seedAdmin: ['root'] });
t.teardown(() => h.close());

t.test('every operation has a command, every declared route an operation', async (t) => {
  const doc = await h.call('root', 'GET', '/openapi.json');
  t.equal(doc.status, 200);
  const operations = new Set<string>();
  for (const [p, ops] of Object.entries(doc.body.paths as Record<string, Record<string, unknown>>))
    for (const method of Object.keys(ops)) operations.add(`${method.toUpperCase()} ${p}`);
  t.ok(operations.size > 50, 'the document lists the routes');
  const declared = [...declaredRoutes(buildProgram())].filter((r) => !r.startsWith('broker '));
  const withoutCommand = [...operations].filter((op) => !declared.includes(op)).sort();
  const wrappingNothing = declared.filter((r) => !operations.has(r)).sort();
  t.same(withoutCommand, [], `operations no command declares:\n  ${withoutCommand.join('\n  ')}`);
  t.same(wrappingNothing, [], `declared routes the document does not have:\n  ${wrappingNothing.join('\n  ')}`);
});
