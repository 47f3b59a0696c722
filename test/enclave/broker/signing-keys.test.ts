import t from 'tap';
import {
  createLocalJWKSet,
  decodeProtectedHeader,
  exportJWK,
  generateKeyPair,
  importJWK,
  jwtVerify,
  SignJWT,
} from 'jose';
import type { JWK } from 'jose';
import { bearerToken, verifyPlatformJwt } from '../../../enclave/broker/identity/jwt.ts';
import {
  agentBaseUrl,
  RETENTION_MS,
  SigningKeys,
  type PlatformClaims,
} from '../../../enclave/broker/identity/signing-keys.ts';
import { PlatformJwtError } from '../../../enclave/errors.ts';
import { brokerStore, testClock, testDeps, testSealer } from './identity-fixture.ts';

// The platform JWT's signing keys on a real store (PGlite, and PostgreSQL with two pools standing for two
// broker processes), rotated on a clock the test moves: tokens in flight keep verifying against the
// published JWKS across a rotation, and a key leaves the JWKS only once every token it signed expired.

const MIN = 60_000;
const claims: PlatformClaims = { sub: 'bot-1', org_id: 'org-a', agent_name: 'builder', group_id: 'ops' };
const verifyAgainst = async (jwks: { keys: JWK[] }, jwt: string, at: number) =>
  jwtVerify(jwt, createLocalJWKSet(jwks), { algorithms: ['ES256'], currentDate: new Date(at), clockTolerance: 5 });

t.test('agentBaseUrl: --public-url, else the agent listener', async (t) => {
  t.equal(agentBaseUrl({ publicUrl: 'https://b.example/', addr: ':8450' }), 'https://b.example');
  t.equal(agentBaseUrl({ publicUrl: '', addr: ':8450' }), 'https://localhost:8450');
  t.equal(agentBaseUrl({ publicUrl: '', addr: '10.0.0.5:9000' }), 'https://10.0.0.5:9000');
  t.equal(agentBaseUrl({ publicUrl: '', addr: '[::1]:9000' }), 'https://[::1]:9000');
});

t.test('bearerToken takes only a JWT-shaped bearer', async (t) => {
  t.equal(bearerToken('Bearer eyJa.eyJb.c'), 'eyJa.eyJb.c');
  t.equal(bearerToken('bearer   eyJa.eyJb.c  '), 'eyJa.eyJb.c');
  t.equal(bearerToken('Basic eyJa.eyJb.c'), null);
  t.equal(bearerToken('Bearer abc'), null);
  t.equal(bearerToken(undefined), null);
  t.equal(bearerToken(['Bearer eyJa.eyJb.c']), null);
});

for (const kind of ['pglite', 'postgres'] as const) {
  t.test(kind, async (t) => {
    const store = await brokerStore(kind);
    if (!store) {
      if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
      else t.comment('PostgreSQL is not reachable on 127.0.0.1:5432: skipped');
      return;
    }
    t.teardown(() => store.close());

    t.test('the first key signs at once; tokens carry the claims, kid and a 5-minute life', async (t) => {
      await store.db.query('DELETE FROM broker_signing_keys');
      const clock = testClock();
      const deps = testDeps(store.db, {}, clock);
      const keys = await SigningKeys.open(deps, { checkEveryMs: 0 });
      t.teardown(() => keys.close());
      const jwks = await keys.jwks();
      t.equal(jwks.keys.length, 1, 'one key published');
      t.notOk('d' in jwks.keys[0], 'the JWKS holds no private part');
      t.match(jwks.keys[0], { kty: 'EC', crv: 'P-256', alg: 'ES256', use: 'sig' });
      const minted = await keys.mint(claims);
      t.equal(decodeProtectedHeader(minted.jwt).kid, jwks.keys[0].kid, 'kid in the header');
      const { payload } = await verifyAgainst(jwks, minted.jwt, clock.now());
      t.match(payload, { ...claims, iss: 'https://broker.test:8450' });
      t.equal(payload.exp! - payload.iat!, 300);
      t.type(payload.jti, 'string');
      const verified = await verifyPlatformJwt(keys, minted.jwt, clock.now());
      t.match(verified, { sub: 'bot-1', org_id: 'org-a', group_id: 'ops', agent_name: 'builder' });

      const { rows } = await store.db.query<{ private_sealed: string }>(
        'SELECT private_sealed FROM broker_signing_keys',
      );
      t.notMatch(rows[0].private_sealed, /"d"/, 'the private JWK is sealed at rest');
      t.equal(await keys.rotateIfDue(), false, 'a fresh key is not due');
    });

    t.test(
      'rotation: pre-published, tokens in flight verify, retired keys leave only after their tokens expired',
      async (t) => {
        await store.db.query('DELETE FROM broker_signing_keys');
        const start = Date.UTC(2030, 0, 1);
        const clock = testClock(start);
        const deps = testDeps(store.db, { keyRotation: 60 * MIN }, clock);
        const keys = await SigningKeys.open(deps, { checkEveryMs: 0 });
        t.teardown(() => keys.close());
        t.equal(keys.prePublishMs, 10 * MIN);
        const kidA = decodeProtectedHeader((await keys.mint(claims)).jwt).kid;

        clock.set(start + 49 * MIN);
        t.equal(await keys.rotateIfDue(), false, 'not due before rotation − pre-publication');
        clock.set(start + 50 * MIN);
        t.equal(await keys.rotateIfDue(), true, 'due: the next key is made');
        t.equal(await keys.rotateIfDue(), false, 'made once');
        const published = await keys.jwks();
        t.equal(published.keys.length, 2, 'the next key is published before it signs');
        const kidB = published.keys.map((k) => k.kid).find((k) => k !== kidA)!;
        t.equal(decodeProtectedHeader((await keys.mint(claims)).jwt).kid, kidA, 'the old key still signs');

        // A verifier that fetched the JWKS now verifies tokens of both keys, before and after the switch.
        const cached = await keys.jwks();
        clock.set(start + 60 * MIN - 1);
        const inFlight = await keys.mint(claims);
        t.equal(decodeProtectedHeader(inFlight.jwt).kid, kidA);
        clock.set(start + 60 * MIN);
        const fresh = await keys.mint(claims);
        t.equal(decodeProtectedHeader(fresh.jwt).kid, kidB, 'the next key signs from its activation');
        await t.resolves(
          verifyAgainst(cached, fresh.jwt, clock.now()),
          'a JWKS cached before the switch knows the new key',
        );
        await t.resolves(
          verifyAgainst(await keys.jwks(), inFlight.jwt, clock.now()),
          'a token minted before verifies after',
        );
        await t.resolves(verifyPlatformJwt(keys, inFlight.jwt, clock.now()));

        // The old key stays published until its last token expired (inFlight: exp = 65 min), then goes.
        clock.set(start + 60 * MIN + RETENTION_MS - 1);
        t.ok(
          (await keys.jwks()).keys.some((k) => k.kid === kidA),
          'the retired key is published past its last token',
        );
        t.ok(inFlight.exp * 1000 < clock.now(), 'its tokens have expired by then');
        clock.set(start + 60 * MIN + RETENTION_MS);
        t.same(
          (await keys.jwks()).keys.map((k) => k.kid),
          [kidB],
          'then it leaves the JWKS',
        );
        await keys.rotateIfDue();
        const { rows } = await store.db.query<{ kid: string }>('SELECT kid FROM broker_signing_keys');
        t.same(
          rows.map((r) => r.kid),
          [kidB],
          'and the store',
        );
        await t.rejects(verifyPlatformJwt(keys, inFlight.jwt, clock.now()), PlatformJwtError);
      },
    );

    t.test('a broker down past a rotation: the old key signs until the new one is published long enough', async (t) => {
      await store.db.query('DELETE FROM broker_signing_keys');
      const start = Date.UTC(2030, 1, 1);
      const clock = testClock(start);
      const deps = testDeps(store.db, { keyRotation: 60 * MIN }, clock);
      const first = await SigningKeys.open(deps, { checkEveryMs: 0 });
      const kidA = decodeProtectedHeader((await first.mint(claims)).jwt).kid;
      first.close();
      clock.set(start + 5 * 60 * MIN);
      const again = await SigningKeys.open(deps, { checkEveryMs: 0 });
      t.teardown(() => again.close());
      t.equal((await again.jwks()).keys.length, 2);
      t.equal(decodeProtectedHeader((await again.mint(claims)).jwt).kid, kidA, 'no unpublished key signs');
      clock.advance(10 * MIN);
      t.not(decodeProtectedHeader((await again.mint(claims)).jwt).kid, kidA);
    });

    t.test('several processes on one store make one key per rotation and verify each other', async (t) => {
      await store.db.query('DELETE FROM broker_signing_keys');
      const dbs = [store.db, (await store.second()) ?? store.db, (await store.second()) ?? store.db];
      const clock = testClock(Date.UTC(2030, 2, 1));
      const sealer = testSealer(); // one data key, as processes of one broker share
      const all = await Promise.all(
        dbs.map((db) => SigningKeys.open(testDeps(db, { keyRotation: 60 * MIN }, clock, sealer), { checkEveryMs: 0 })),
      );
      t.teardown(() => {
        for (const k of all) k.close();
      });
      const count = async () =>
        Number((await store.db.query<{ n: string }>('SELECT count(*) AS n FROM broker_signing_keys')).rows[0].n);
      t.equal(await count(), 1, 'one first key');
      clock.advance(50 * MIN);
      const made = await Promise.all(all.map((k) => k.rotateIfDue()));
      t.equal(made.filter(Boolean).length, 1, 'exactly one process made the next key');
      t.equal(await count(), 2);
      const tokens = await Promise.all(all.map((k) => k.mint(claims)));
      t.equal(new Set(tokens.map((m) => m.kid)).size, 1, 'all sign with the same key');
      for (const k of all) for (const m of tokens) await t.resolves(verifyPlatformJwt(k, m.jwt, clock.now()));
    });

    t.test('tokens the broker did not sign, or signs no more, are refused', async (t) => {
      await store.db.query('DELETE FROM broker_signing_keys');
      const clock = testClock();
      const deps = testDeps(store.db, {}, clock);
      const keys = await SigningKeys.open(deps, { checkEveryMs: 0 });
      t.teardown(() => keys.close());
      const good = await keys.mint(claims);
      const now = Math.floor(clock.now() / 1000);
      const other = await generateKeyPair('ES256');
      const forge = (key: Parameters<SignJWT['sign']>[0], kid: string, over: Record<string, unknown> = {}) =>
        new SignJWT({ org_id: 'org-a', agent_name: 'builder', group_id: 'ops', ...over })
          .setProtectedHeader({ alg: 'ES256', kid })
          .setIssuer(keys.issuer)
          .setSubject('bot-1')
          .setIssuedAt(now)
          .setExpirationTime(now + 300)
          .sign(key);
      const refused = async (jwt: string, why: RegExp, what: string) => {
        const err = await verifyPlatformJwt(keys, jwt, clock.now()).catch((e: unknown) => e);
        t.type(err, PlatformJwtError, what);
        t.match((err as Error).message, why, what);
      };
      await refused(await forge(other.privateKey, good.kid), /signature invalid/, 'another key under our kid');
      await refused(await forge(other.privateKey, 'someone-else'), /unknown key/, 'another key, its own kid');
      const hs = await new SignJWT({ org_id: 'org-a' })
        .setProtectedHeader({ alg: 'HS256', kid: good.kid })
        .setIssuer(keys.issuer)
        .setSubject('bot-1')
        .setIssuedAt(now)
        .setExpirationTime(now + 300)
        .sign(new TextEncoder().encode('x'.repeat(32)));
      await refused(hs, /ES256 only/, 'HS256 under our kid');
      const [, payload] = good.jwt.split('.');
      await refused(`${good.jwt.split('.')[0]}.${payload}.`, /malformed|rejected|signature/, 'no signature');

      // Our own key, misused: a long lifetime, another issuer, no org.
      const { rows } = await store.db.query<{ private_sealed: string }>(
        'SELECT private_sealed FROM broker_signing_keys WHERE kid = $1',
        [good.kid],
      );
      const ours = await importJWK(JSON.parse(await deps.sealer.open(rows[0].private_sealed)) as JWK, 'ES256');
      const long = await new SignJWT({ org_id: 'org-a' })
        .setProtectedHeader({ alg: 'ES256', kid: good.kid })
        .setIssuer(keys.issuer)
        .setSubject('bot-1')
        .setIssuedAt(now)
        .setExpirationTime(now + 3600)
        .sign(ours);
      await refused(long, /lifetime/, 'an hour-long token');
      await refused(await forge(ours, good.kid, { org_id: undefined }), /org_id/, 'no org_id');
      const elsewhere = await new SignJWT({ org_id: 'org-a' })
        .setProtectedHeader({ alg: 'ES256', kid: good.kid })
        .setIssuer('https://other.example')
        .setSubject('bot-1')
        .setIssuedAt(now)
        .setExpirationTime(now + 300)
        .sign(ours);
      await refused(elsewhere, /iss/, 'another issuer');
      clock.advance(301_000 + 5_000);
      await refused(good.jwt, /expired/, 'expired');
      t.ok((await exportJWK(other.publicKey)).x, 'the forged key is a real P-256 key');
    });

    t.test('a key whose sealed private part cannot be opened fails clearly', async (t) => {
      await store.db.query('DELETE FROM broker_signing_keys');
      const clock = testClock();
      const keys = await SigningKeys.open(testDeps(store.db, {}, clock), { checkEveryMs: 0 });
      // Another broker's data key (a different sealer) cannot open this one's keys.
      const stranger = await SigningKeys.open(testDeps(store.db, {}, clock), { checkEveryMs: 0 });
      t.teardown(() => {
        keys.close();
        stranger.close();
      });
      await t.rejects(stranger.mint(claims), { code: 'DVX_BROKER_SIGNING_KEY' });
      const minted = await keys.mint(claims);
      await t.resolves(verifyPlatformJwt(stranger, minted.jwt, clock.now()), 'its public keys still verify');
    });
  });
}
