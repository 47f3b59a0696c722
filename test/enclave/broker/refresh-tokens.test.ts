import t from 'tap';
import {
  peekRefreshToken,
  pruneRefreshTokens,
  revokeAgentFamilies,
  rotate,
  startFamily,
  type Rotation,
} from '../../../enclave/broker/identity/refresh-tokens.ts';
import { brokerStore } from './identity-fixture.ts';

// Refresh-token families on a real store: single use, rotating, a replay kills the family, concurrent
// rotations of one token have exactly one winner (PostgreSQL with separate connections: real concurrency).

const TTL = 3600_000;

for (const kind of ['pglite', 'postgres'] as const) {
  t.test(kind, async (t) => {
    const store = await brokerStore(kind);
    if (!store) {
      if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
      else t.comment('PostgreSQL is not reachable on 127.0.0.1:5432: skipped');
      return;
    }
    t.teardown(() => store.close());
    const db = store.db;
    const now = Date.now();
    const tx = <T>(fn: Parameters<typeof db.transaction<T>>[0]) => db.transaction(fn);

    t.test('rotation, replay, a dead family', async (t) => {
      const first = await tx((q) => startFamily(q, 'bot-1', TTL, now));
      t.match(first.token, /^dvxr_[A-Za-z0-9_-]{43}$/);
      const stored = await db.query('SELECT * FROM broker_refresh_tokens');
      t.notMatch(JSON.stringify(stored.rows), first.token.slice(5), 'only a hash is stored');

      const r1 = (await tx((q) => rotate(q, first.token, TTL, now + 1000))) as Extract<Rotation, { ok: true }>;
      t.match(r1, { ok: true, uid: 'bot-1', familyId: first.familyId });
      t.not(r1.next, first.token, 'a new token');
      const r2 = (await tx((q) => rotate(q, r1.next, TTL, now + 2000))) as Extract<Rotation, { ok: true }>;
      t.match(r2, { ok: true, familyId: first.familyId });

      t.same(await peekRefreshToken(db, first.token, now), { uid: 'bot-1', familyId: first.familyId, state: 'used' });
      t.same(await peekRefreshToken(db, r2.next, now), { uid: 'bot-1', familyId: first.familyId, state: 'live' });
      t.same(
        await tx((q) => rotate(q, first.token, TTL, now + 3000)),
        { replayed: true, uid: 'bot-1', familyId: first.familyId },
        'a used token again is a replay',
      );
      t.match(
        await tx((q) => rotate(q, r2.next, TTL, now + 4000)),
        { revoked: true, reason: 'replayed' },
        "the family's newest token is dead too",
      );
      t.match(await tx((q) => rotate(q, first.token, TTL, now + 5000)), { revoked: true }, 'and the replayed one');
      t.equal((await peekRefreshToken(db, r2.next, now))?.state, 'revoked');
    });

    t.test('malformed, unknown, expired', async (t) => {
      const fam = await tx((q) => startFamily(q, 'bot-2', 1000, now));
      for (const bad of [undefined, 42, '', 'dvxr_short', `dvxb_${'a'.repeat(43)}`, `dvxr_${'a'.repeat(43)}`])
        t.equal(await tx((q) => rotate(q, bad, TTL, now)), null, `refused: ${String(bad).slice(0, 12)}`);
      t.equal(await tx((q) => rotate(q, fam.token, TTL, now + 1000)), null, 'expired');
      t.equal(await peekRefreshToken(db, fam.token, now + 1000), null);
      await pruneRefreshTokens(db, now + 1000);
      const left = await db.query('SELECT 1 FROM broker_token_families WHERE family_id = $1', [fam.familyId]);
      t.equal(left.rows.length, 0, 'pruned with its family');
    });

    t.test('revokeAgentFamilies ends every family of the agent, not others', async (t) => {
      const a = await tx((q) => startFamily(q, 'bot-3', TTL, now));
      const b = await tx((q) => startFamily(q, 'bot-3', TTL, now));
      const other = await tx((q) => startFamily(q, 'bot-4', TTL, now));
      t.equal(await tx((q) => revokeAgentFamilies(q, 'bot-3', 'suspended', now)), 2);
      t.match(await tx((q) => rotate(q, a.token, TTL, now)), { revoked: true, reason: 'suspended' });
      t.match(await tx((q) => rotate(q, b.token, TTL, now)), { revoked: true });
      t.match(await tx((q) => rotate(q, other.token, TTL, now)), { ok: true });
    });

    t.test('concurrent rotations of one token: one winner, the losers are a replay', async (t) => {
      const pools = [db];
      for (let i = 0; i < 3; i++) pools.push((await store.second()) ?? db);
      for (const n of [2, 6]) {
        const fam = await tx((q) => startFamily(q, 'bot-5', TTL, now));
        const results = await Promise.all(
          Array.from({ length: n }, (_, i) =>
            pools[i % pools.length].transaction((q) => rotate(q, fam.token, TTL, now + 1)),
          ),
        );
        const winners = results.filter((r) => r && 'ok' in r);
        t.equal(winners.length, 1, `${n} at once: exactly one rotation wins`);
        t.ok(
          results.every((r) => r && ('ok' in r || 'replayed' in r || 'revoked' in r)),
          'the others find it used (a replay) or its family already revoked',
        );
        t.ok(
          results.some((r) => r && 'replayed' in r),
          'at least one is reported a replay',
        );
        const winner = winners[0] as Extract<Rotation, { ok: true }>;
        t.match(await tx((q) => rotate(q, winner.next, TTL, now + 2)), { revoked: true }, "the winner's token is dead");
      }
    });
  });
}
