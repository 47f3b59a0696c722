import t from 'tap';
import { DeadlineQueue } from '../../../proxy/egress/deadline-queue.ts';
import { until } from '../../fixtures/eventually.ts';

// The one timer under every open flow's credential deadline (proxy/egress/deadline-queue.ts): items
// handed over in deadline order once due, removed ones never, a deadline past node's longest timer
// delay (2^31-1 ms) not taken as "now", and nothing left behind by the flows that ended first.

t.test('due items come in deadline order; removed ones never come', async (t) => {
  const got: number[] = [];
  const q = new DeadlineQueue<number>((items) => got.push(...items));
  const start = Date.now();
  const handles = [];
  // Deadlines 0..300 ms out in a scrambled order, a third of them removed before they are due.
  for (let i = 0; i < 300; i++) {
    const offset = (i * 7919) % 300;
    handles.push({ offset, handle: q.add(start + offset, offset) });
  }
  const removed = new Set<number>();
  for (const { offset, handle } of handles)
    if (offset % 3 === 0 && offset > 100) {
      q.remove(handle);
      q.remove(handle); // twice: nothing more happens
      removed.add(offset);
    }
  t.ok(await until(() => got.length === 300 - removed.size, 5_000), 'every item kept is handed over');
  t.same(
    got,
    [...got].sort((a, b) => a - b),
    'in deadline order',
  );
  t.notOk(
    got.some((o) => removed.has(o)),
    'no removed item',
  );
  t.equal(q.size, 0, 'nothing left behind');
});

t.test('an item is never handed over before its deadline, nor inside add', async (t) => {
  const got: { item: string; at: number }[] = [];
  const q = new DeadlineQueue<string>((items) => {
    for (const item of items) got.push({ item, at: Date.now() });
  });
  const now = Date.now();
  q.add(now - 1_000, 'past');
  t.same(got, [], 'a deadline already passed is not handed over synchronously');
  q.add(now + 200, 'later');
  q.add(now + 100, 'sooner');
  t.ok(await until(() => got.length === 3, 5_000));
  t.same(
    got.map((g) => g.item),
    ['past', 'sooner', 'later'],
  );
  t.ok(got[1].at >= now + 100 && got[2].at >= now + 200, 'none early');
});

t.test('a deadline past the longest timer delay waits, and a nearer one added later still fires', async (t) => {
  const warnings: Error[] = [];
  const onWarning = (w: Error) => warnings.push(w);
  process.on('warning', onWarning);
  t.teardown(() => process.off('warning', onWarning));
  const got: string[] = [];
  const q = new DeadlineQueue<string>((items) => got.push(...items));
  t.teardown(() => q.clear());
  const far = q.add(Date.now() + 40 * 24 * 3600_000, 'in 40 days');
  await new Promise((r) => setTimeout(r, 100));
  t.same(got, [], 'not taken as due (node would fire a too-long delay after 1 ms)');
  t.same(
    warnings.filter((w) => w.name === 'TimeoutOverflowWarning'),
    [],
    'no timer overflow',
  );
  q.add(Date.now() + 50, 'soon');
  t.ok(await until(() => got.length === 1, 5_000));
  t.same(got, ['soon']);
  await new Promise((r) => setTimeout(r, 50));
  t.same(got, ['soon'], 'the far one still waits');
  q.remove(far);
  t.equal(q.size, 0);
});

t.test('a deadline that is no number is due at once (fail closed)', async (t) => {
  const got: string[] = [];
  const q = new DeadlineQueue<string>((items) => got.push(...items));
  q.add(Date.now() + 60_000, 'later');
  q.add(Number.NaN, 'unreadable');
  t.ok(await until(() => got.length === 1, 5_000));
  t.same(got, ['unreadable']);
  q.clear();
});

t.test(
  'a wall clock set back while the timer waits: nothing early, handed over once the clock reaches it',
  async (t) => {
    let offset = 0;
    const got: number[] = [];
    const q = new DeadlineQueue<string>(
      () => got.push(Date.now()),
      () => Date.now() + offset,
    );
    t.teardown(() => q.clear());
    const start = Date.now();
    q.add(start + 20, 'at +20');
    offset = -150; // the clock is set back 150 ms: the timer fires at +20 with nothing due by the clock
    t.ok(await until(() => got.length === 1, 5_000), 're-armed, and handed over');
    t.ok(got[0] >= start + 160, `not before the clock reached the deadline (${got[0] - start} ms)`);
  },
);
