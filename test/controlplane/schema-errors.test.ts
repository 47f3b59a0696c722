import t from 'tap';
import Fastify from 'fastify';
import { VALIDATION } from '../../core/schema-errors.ts';
import { NON_EMPTY_STRINGS, NULLABLE_BOOLEAN, NULLABLE_STRING, object, TEXT } from '../../core/schemas.ts';

// A body its route's schema refuses is a 400 whose detail starts with the field, in the words the
// routes' hand-written parsers used (docs/decisions.md, "Route schemas and the capability hook").
const app = Fastify({ logger: false, ...VALIDATION });
const grant = object({ capability: NULLABLE_STRING, group: NULLABLE_STRING }, [], 'grantReq');
const body = object(
  {
    name: TEXT,
    note: NULLABLE_STRING,
    tags: NON_EMPTY_STRINGS,
    on: NULLABLE_BOOLEAN,
    grants: { type: 'array', items: grant },
  },
  ['name'],
);
app.post(
  '/x',
  { schema: { body, querystring: { type: 'object', properties: {}, additionalProperties: false } } },
  async () => ({ ok: true }),
);
app.setErrorHandler((err: Error, _req, reply) => reply.code(400).send({ detail: err.message }));
t.teardown(() => app.close());

t.test('each refusal names its field', async (t) => {
  const cases: [unknown, string][] = [
    [[], 'body: must be a JSON object'],
    ['text', 'body: must be a JSON object'],
    [{}, 'name: is required'],
    [{ name: 'x', colour: 'red' }, 'colour: unknown field'],
    [{ name: 1 }, 'name: must be a string'],
    [{ name: '  ' }, 'name: must not be empty'],
    [{ name: 'x', note: 3 }, 'note: must be a string'],
    [{ name: 'x', tags: 'a' }, 'tags: must be an array of strings'],
    [{ name: 'x', tags: ['a', ''] }, 'tags[1]: must be a non-empty string'],
    [{ name: 'x', on: 'yes' }, 'on: must be a boolean'],
    [{ name: 'x', grants: [{ capability: 1 }] }, 'grants[0].capability: must be a string'],
    [{ name: 'x', grants: [{ agent: 'a' }] }, 'grants[0].agent: unknown field'],
  ];
  for (const [payload, detail] of cases) {
    const r = await app.inject({
      method: 'POST',
      url: '/x',
      payload: JSON.stringify(payload),
      headers: { 'content-type': 'application/json' },
    });
    t.equal(r.statusCode, 400, JSON.stringify(payload));
    t.equal(r.json().detail, detail, JSON.stringify(payload));
  }
  const query = await app.inject({ method: 'POST', url: '/x?flavour=1', payload: { name: 'x' } });
  t.equal(query.json().detail, 'flavour: unknown query parameter');
});

t.test('a schema only checks: nothing is coerced, defaulted or dropped', async (t) => {
  const ok = await app.inject({ method: 'POST', url: '/x', payload: { name: 'x', note: null, on: null, tags: null } });
  t.equal(ok.statusCode, 200, 'null is an absent optional field');
  t.equal(
    (await app.inject({ method: 'POST', url: '/x', payload: { name: 'x', on: 'true' } })).json().detail,
    'on: must be a boolean',
  );
  t.equal(
    (await app.inject({ method: 'POST', url: '/x', payload: { name: 'x', note: 5 } })).json().detail,
    'note: must be a string',
  );
});
