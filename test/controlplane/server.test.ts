import t from 'tap';
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { Agent, request } from 'undici';
import { SignJWT, generateKeyPair } from 'jose';
import { createLogger } from '../../core/logger.ts';
import { generateCa, issueCertificate } from '../../core/tls.ts';
import { startControlPlane } from '../../controlplane/server.ts';
import { openDb } from '../../core/sql.ts';
import { migrate } from '../../controlplane/store/migrate.ts';
import { AUDIENCE, startIssuer } from '../fixtures/oidc-issuer.ts';

// The control plane's spine, for real: TLS, skeleton mode, migrations on PGlite and PostgreSQL, OIDC
// bearer authentication against a real provider (oidc-provider), `whoami`, problem documents.

const dir = await mkdtemp(join(tmpdir(), 'dvx-cp-'));
const ca = await generateCa();
const leaf = await issueCertificate(ca, { commonName: 'localhost', ipAddresses: ['127.0.0.1'] });
await writeFile(join(dir, 'cert.pem'), leaf.certPem);
await writeFile(join(dir, 'key.pem'), leaf.keyPem);
const dispatcher = new Agent({ connect: { ca: ca.certPem } });
const quiet = createLogger({ level: 'error', destination: { write: () => {} } });
const issuer = await startIssuer([
  { clientId: 'svc-admin', org: 'org-1' },
  { clientId: 'svc-plain', org: 'org-2' },
]);
t.teardown(async () => {
  await issuer.close();
  await dispatcher.close();
  await rm(dir, { recursive: true, force: true });
});
const base = { addr: '127.0.0.1:0', tlsCert: join(dir, 'cert.pem'), tlsKey: join(dir, 'key.pem') };
const get = async (port: number, path: string, token?: string) => {
  const res = await request(`https://127.0.0.1:${port}${path}`, {
    dispatcher,
    headers: token ? { authorization: `Bearer ${token}` } : {},
  });
  return {
    status: res.statusCode,
    headers: res.headers,
    body: (await res.body.json().catch(() => null)) as Record<string, unknown> | null,
  };
};

t.test('skeleton mode: /healthz and a 501 placeholder, nothing else', async (t) => {
  for (const opts of [{}, { oidcIssuer: issuer.issuer }, { databaseDsn: `pglite://${join(dir, 'sk')}` }]) {
    const cp = await startControlPlane({ ...base, ...opts }, { logger: quiet });
    const health = await get(cp.port, '/healthz');
    t.same(health.body, { component: 'controlplane', status: 'ok', version: '0.1.0' });
    const who = await get(cp.port, '/api/v1/whoami');
    t.equal(who.status, 501);
    t.equal(who.headers['content-type'], 'application/problem+json; charset=utf-8');
    t.match(who.body, {
      type: 'https://dvx.dev/problems/not-implemented',
      title: 'The operator API is not yet implemented',
      status: 501,
      detail: /skeleton mode/,
      instance: '/api/v1/whoami',
    });
    await cp.close();
  }
});

for (const store of ['pglite', 'postgres'] as const) {
  t.test(`${store}: bearer authentication and whoami`, async (t) => {
    let dsn = `pglite://${join(dir, `db-${Date.now()}`)}`;
    if (store === 'postgres') {
      const name = `dvx_cp_${Date.now().toString(36)}`;
      const admin = new pg.Client({ connectionString: 'postgres://postgres@127.0.0.1:5432/test' });
      try {
        await admin.connect();
      } catch (err) {
        t.plan(0, `PostgreSQL not reachable: ${(err as Error).message}`);
        return;
      }
      await admin.query(`CREATE DATABASE ${name}`);
      await admin.end();
      dsn = `postgres://postgres@127.0.0.1:5432/${name}`;
      t.teardown(async () => {
        const c = new pg.Client({ connectionString: 'postgres://postgres@127.0.0.1:5432/test' });
        await c.connect();
        await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
        await c.end();
      });
    }
    const cp = await startControlPlane(
      { ...base, oidcIssuer: issuer.issuer, oidcAudience: AUDIENCE, databaseDsn: dsn, seedAdmin: ['svc-admin'] },
      { logger: quiet },
    );
    t.teardown(() => cp.close());
    const admin = await get(cp.port, '/api/v1/whoami', await issuer.token('svc-admin'));
    t.equal(admin.status, 200);
    t.same(admin.body, {
      subject: 'svc-admin',
      kind: 'service',
      org_id: 'org-1',
      groups: [],
      capabilities: [
        'agents:manage',
        'audit:read',
        'audit:read:all',
        'clients:manage',
        'enclaves:read',
        'members:*',
        'org:manage',
        'platform:audit:read',
        'platform:config',
      ],
    });
    const plain = await get(cp.port, '/api/v1/whoami', await issuer.token('svc-plain'));
    t.same(plain.body, { subject: 'svc-plain', kind: 'service', org_id: 'org-2', groups: [], capabilities: [] });

    const none = await get(cp.port, '/api/v1/whoami');
    t.equal(none.status, 401);
    t.equal(none.headers['www-authenticate'], 'Bearer');
    t.match(none.body, { type: 'https://dvx.dev/problems/unauthenticated', status: 401 });
    t.equal((await get(cp.port, '/api/v1/whoami', 'garbage')).status, 401);
    const otherAudience = await get(
      cp.port,
      '/api/v1/whoami',
      await issuer.token('svc-admin', 'https://elsewhere.test'),
    );
    t.equal(otherAudience.status, 401, 'a token minted for another audience');
    t.match(otherAudience.body, { detail: /aud/ });
    const { privateKey } = await generateKeyPair('ES256');
    const forged = await new SignJWT({ org_id: 'org-1' })
      .setProtectedHeader({ alg: 'ES256', kid: 'issuer-1' })
      .setIssuer(issuer.issuer)
      .setAudience(AUDIENCE)
      .setSubject('svc-admin')
      .setIssuedAt()
      .setExpirationTime('5m')
      .sign(privateKey);
    t.equal((await get(cp.port, '/api/v1/whoami', forged)).status, 401, "forged with the issuer's kid");
    const unknown = await get(cp.port, '/api/v1/nope', await issuer.token('svc-admin'));
    t.match(unknown.body, { type: 'https://dvx.dev/problems/not-found', status: 404 });
    t.equal((await get(cp.port, '/api/v1/nope')).status, 401, 'authentication comes before routing under /api/v1');
  });
}

t.test('migrations are idempotent and transactional', async (t) => {
  const db = await openDb(`pglite://${join(dir, 'mig')}`);
  const versions = (await readdir(new URL('../../controlplane/store/migrations/', import.meta.url)))
    .filter((f) => f.endsWith('.sql'))
    .map((f) => f.slice(0, 4))
    .sort();
  t.ok(versions.length >= 5);
  t.same(await migrate(db), versions, 'every version, in order');
  t.same(await migrate(db), [], 'a second start applies nothing');
  const { rows } = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM schema_migrations');
  t.equal(rows[0].n, versions.length);
  await db.close();
});

t.test('--seed-admin is idempotent across restarts', async (t) => {
  const dsn = `pglite://${join(dir, 'seed')}`;
  for (let i = 0; i < 2; i++) {
    const cp = await startControlPlane(
      { ...base, oidcIssuer: issuer.issuer, databaseDsn: dsn, seedAdmin: ['alice', 'svc-admin'] },
      { logger: quiet },
    );
    await cp.close();
  }
  const db = await openDb(dsn);
  const { rows } = await db.query<{ principal: string; role: string; scope_kind: string }>(
    'SELECT principal, role, scope_kind FROM grants ORDER BY principal',
  );
  t.same(rows, [
    { principal: 'user:alice', role: 'platform-admin', scope_kind: 'platform' },
    { principal: 'user:svc-admin', role: 'platform-admin', scope_kind: 'platform' },
  ]);
  await db.close();
});
