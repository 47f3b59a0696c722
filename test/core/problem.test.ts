import t from 'tap';
import { problem, PROBLEM_CONTENT_TYPE } from '../../core/problem.ts';
import { newId } from '../../core/ids.ts';

t.test('problem documents carry the RFC 9457 members and extensions that do not clash', async (t) => {
  t.equal(PROBLEM_CONTENT_TYPE, 'application/problem+json');
  const p = problem({
    type: 'https://dvx.dev/problems/x',
    title: 'X',
    status: 400,
    detail: 'd',
    instance: '/a',
    extensions: { field: 'f', status: 999 },
  });
  t.same(p, { type: 'https://dvx.dev/problems/x', title: 'X', status: 400, detail: 'd', instance: '/a', field: 'f' });
});

t.test('ids are unique and url-safe', async (t) => {
  const ids = new Set(Array.from({ length: 10_000 }, newId));
  t.equal(ids.size, 10_000);
  for (const id of [...ids].slice(0, 10)) t.match(id, /^[A-Za-z0-9_-]+$/);
});
