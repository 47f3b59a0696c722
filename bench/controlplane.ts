import Fastify from 'fastify';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { createRemoteJWKSet, jwtVerify } from 'jose';
import pg from 'pg';
import { createLogger } from '../core/logger.ts';
import { StdoutAuditSink } from '../audit-wal/stdout-sink.ts';
import { startControlPlane, type RunningControlPlane } from '../controlplane/server.ts';
import { AUDIENCE, startIssuer } from '../test/fixtures/oidc-issuer.ts';
import { freshPgDatabase } from '../test/fixtures/pg-database.ts';
import { conditions, UNPINNED } from './conditions.ts';
import { writeServerTls } from './fixtures.ts';
import { type LatencyAndRate, latencyThenRate } from './loops.ts';
import { formatMs, table } from './measure.ts';
import { MEMBERS_OF_ORG } from '../controlplane/store/members.ts';

// npm run bench -- controlplane [--seconds N]
//
// What authentication and authorization add to an operator-API request. Contenders, one run, one machine:
//   floor  a bare fastify route over the same TLS, no auth;
//   peer   the same bare route behind a typical per-request check: jose verifies the JWT against the
//          issuer's JWKS and the caller's grants are read from PostgreSQL on every request (what a
//          fastify app with @fastify/jwt and a grant query does);
//   ours   `GET /api/v1/whoami` (valid token only) and `GET /api/v1/orgs/{org}/members` (members:* over
//          the org: a grant-checked list) on PGlite and on PostgreSQL.
// Each contender is measured sequentially (latency p50/p99) and with 8 requests in flight (req/s).
// Client, servers and the OIDC provider share the machine's cores (in one process).

interface Contender {
  name: string;
  port: number;
  path: string;
  token?: string;
}

/** A contender's sequential p50/p99 and its req/s with 8 in flight. */
type Result = LatencyAndRate & { name: string };

async function run(c: Contender, dispatcher: Agent, seconds: number): Promise<Result> {
  const headers = c.token ? { authorization: `Bearer ${c.token}` } : {};
  const once = async () => {
    const res = await request(`https://127.0.0.1:${c.port}${c.path}`, { dispatcher, headers });
    await res.body.dump();
    if (res.statusCode !== 200) throw new Error(`${c.name}: HTTP ${res.statusCode}`);
  };
  return { name: c.name, ...(await latencyThenRate(once, seconds, { warm: 200 })) };
}

export async function main(args: string[]): Promise<void> {
  const seconds = Number(args[args.indexOf('--seconds') + 1]) || 4;
  const dir = await mkdtemp(join(tmpdir(), 'dvx-bench-cp-'));
  const { ca, leaf } = await writeServerTls(dir);
  const dispatcher = new Agent({ connect: { ca: ca.certPem }, connections: 8 });
  const issuer = await startIssuer([
    { clientId: 'operator', org: 'org-a' },
    { clientId: 'admin', org: 'org-a' },
  ]);
  const token = await issuer.token('operator');
  const admin = await issuer.token('admin');
  const quiet = createLogger({ level: 'error', destination: { write: () => {} } });
  const pgDb = await freshPgDatabase('dvx_bench_cp');
  const closers: (() => Promise<unknown>)[] = [];
  const contenders: Contender[] = [];

  const floor = Fastify({ https: { cert: leaf.certPem, key: leaf.keyPem }, logger: false });
  floor.get('/ping', async () => ({
    subject: 'operator',
    kind: 'service',
    org_id: 'org-a',
    groups: [],
    capabilities: [],
  }));
  await floor.listen({ port: 0, host: '127.0.0.1' });
  closers.push(() => floor.close());
  contenders.push({
    name: 'floor: bare fastify route',
    port: (floor.server.address() as { port: number }).port,
    path: '/ping',
  });

  for (const [store, dsn] of [
    ['PGlite', `pglite://${join(dir, 'db')}`],
    ...(pgDb ? [['PostgreSQL', pgDb.dsn]] : []),
  ] as [string, string][]) {
    const cp: RunningControlPlane = await startControlPlane(
      {
        addr: '127.0.0.1:0',
        tlsCert: join(dir, 'cert.pem'),
        tlsKey: join(dir, 'key.pem'),
        oidcIssuer: issuer.issuer,
        oidcAudience: AUDIENCE,
        databaseDsn: dsn,
        seedAdmin: ['admin'],
      },
      { logger: quiet, audit: new StdoutAuditSink({ write: () => true } as never) },
    );
    closers.push(() => cp.close());
    // An org with 20 members and the operator's org-admin grant over it, written through the API.
    await cpCall(cp.port, dispatcher, admin, 'POST', '/api/v1/orgs', { id: 'org-a', name: 'A' });
    await cpCall(cp.port, dispatcher, admin, 'POST', '/api/v1/orgs/org-a/grants', {
      principal: 'user:operator',
      role: 'org-admin',
    });
    for (let i = 0; i < 20; i++)
      await cpCall(cp.port, dispatcher, admin, 'PUT', `/api/v1/orgs/org-a/members/user-${i}`, {
        username: `user-${i}`,
        email: `user-${i}@example.com`,
      });
    contenders.push({ name: `ours: whoami, ${store}`, port: cp.port, path: '/api/v1/whoami', token });
    contenders.push({
      name: `ours: grant-checked list, ${store}`,
      port: cp.port,
      path: '/api/v1/orgs/org-a/members',
      token,
    });
  }

  // The peer: the bare route behind per-request JWT verification and a grant query.
  if (pgDb) {
    const pool = new pg.Pool({ connectionString: pgDb.dsn, max: 8 });
    closers.push(() => pool.end());
    const jwks = createRemoteJWKSet(new URL(`${issuer.issuer}/jwks`));
    const peer = Fastify({ https: { cert: leaf.certPem, key: leaf.keyPem }, logger: false });
    peer.get('/ping', async (req, reply) => {
      const bearer = String(req.headers.authorization ?? '').replace(/^Bearer /, '');
      const { payload } = await jwtVerify(bearer, jwks, { issuer: issuer.issuer, audience: AUDIENCE });
      const { rows } = await pool.query('SELECT role, capability FROM grants WHERE principal = $1', [
        `user:${payload.sub}`,
      ]);
      if (rows.length === 0) return reply.code(403).send();
      return { subject: payload.sub, org_id: payload.org_id, grants: rows.length };
    });
    await peer.listen({ port: 0, host: '127.0.0.1' });
    closers.push(() => peer.close());
    const listFloor = Fastify({ https: { cert: leaf.certPem, key: leaf.keyPem }, logger: false });
    listFloor.get('/members', async () =>
      (await pool.query(MEMBERS_OF_ORG, ['org-a'])).rows.map(({ subject, username, email }) => ({
        subject,
        username,
        email,
      })),
    );
    await listFloor.listen({ port: 0, host: '127.0.0.1' });
    closers.push(() => listFloor.close());
    contenders.push({
      name: 'floor: bare fastify route + the same list query, PostgreSQL',
      port: (listFloor.server.address() as { port: number }).port,
      path: '/members',
    });
    contenders.splice(1, 0, {
      name: 'peer: fastify + per-request jose verify + grant query (PostgreSQL)',
      port: (peer.server.address() as { port: number }).port,
      path: '/ping',
      token,
    });
  }

  const results: Result[] = [];
  for (const c of contenders) results.push(await run(c, dispatcher, seconds));
  // A list route is compared with the floor that runs the same query; everything else with the bare route.
  const listFloor = results.find((r) => r.name.startsWith('floor: bare fastify route + the same list query'));
  const floorOf = (r: Result) => (r.name.includes('grant-checked list') && listFloor ? listFloor : results[0]);
  const rows = results.map((r) => {
    const f = floorOf(r);
    // PGlite has no floor of its own (one PGlite instance per directory): its list row is not compared.
    const comparable =
      !r.name.startsWith('floor') && !(r.name.includes('grant-checked list') && r.name.includes('PGlite'));
    return [
      r.name,
      r.rps.toFixed(0),
      formatMs(r.p50),
      formatMs(r.p99),
      comparable ? `${((r.p50 - f.p50) * 1000).toFixed(0)} µs` : '—',
      comparable || r.name.startsWith('floor') ? `${(r.p50 / f.p50).toFixed(2)}×` : '—',
    ];
  });
  process.stdout.write(`\n### controlplane (\`npm run bench -- controlplane\`)\n`);
  process.stdout.write(
    `Conditions: ${conditions(`TLS keep-alive, one process (client, servers, oidc-provider); latency sequential, req/s with 8 in flight, ${seconds / 2} s each; added = p50 - its floor's p50 (list routes: the floor running the same query)`, UNPINNED)}\n\n`,
  );
  process.stdout.write(table(['contender', 'req/s', 'p50', 'p99', 'added at p50', 'p50 vs floor'], rows) + '\n');
  for (const close of closers.reverse()) await close();
  await issuer.close();
  await dispatcher.close();
  await pgDb?.drop();
  await rm(dir, { recursive: true, force: true });
}

async function cpCall(
  port: number,
  dispatcher: Agent,
  token: string,
  method: string,
  path: string,
  body?: unknown,
): Promise<void> {
  const res = await request(`https://127.0.0.1:${port}${path}`, {
    method: method as 'GET',
    dispatcher,
    headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.body.text();
  if (res.statusCode >= 300) throw new Error(`seeding ${method} ${path}: HTTP ${res.statusCode} ${text}`);
}
