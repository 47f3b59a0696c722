import t from 'tap';
import { readFile } from 'node:fs/promises';
import { PROBLEMS } from '../../controlplane/errors.ts';

// The catalogue and docs/api.md say the same thing (fastify checks its errors against its docs too).
t.test('every catalogue entry is documented with its status and title', async (t) => {
  const doc = await readFile(new URL('../../docs/api.md', import.meta.url), 'utf8');
  const types = new Set<string>();
  for (const [name, e] of Object.entries(PROBLEMS)) {
    t.notOk(types.has(e.type), `${name}: type URIs are unique`);
    types.add(e.type);
    t.match(doc, `| \`${e.type}\` | ${e.status} | ${e.title} |`, `${name} documented`);
  }
});
