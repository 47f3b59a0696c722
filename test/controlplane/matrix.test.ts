import t from 'tap';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { generateKeyPair, SignJWT } from 'jose';
import { AUDIENCE } from '../fixtures/oidc-issuer.ts';
import { BUILT_IN_ROLES } from '../../controlplane/authz/capabilities.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';

// The route × persona matrix, generated from the OpenAPI document the control plane serves: every
// operation refuses a caller without a token, with a token for another audience or a forged one (401),
// an agent-operator on every capability-gated route and a caller without the capability it declares
// (403), and lets the platform administrator past both.
// On PGlite (the embedded default) and on PostgreSQL.
const pgDb = await freshPgDatabase('dvx_matrix');
if (!pgDb && process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
const stores: [string, string | undefined][] = [
  ['pglite', undefined],
  ...(pgDb ? [['postgres', pgDb.dsn] as [string, string]] : []),
];
for (const [store, dsn] of stores) {
  const h = await startCpHarness(
    [
      { clientId: 'root', org: 'org-a', human: true },
      { clientId: 'nobody', org: 'org-a', human: true },
      { clientId: 'org-admin-a', org: 'org-a', human: true },
      { clientId: 'member-a', org: 'org-a', human: true },
      { clientId: 'auditor-a', org: 'org-a', human: true },
      { clientId: 'admin-b', org: 'org-b', human: true },
      { clientId: 'svc-a', org: 'org-a' },
    ],
    {
      seedAdmin: ['root'],
      agentTokenIssuerUrl: 'https://controlplane.dvx.test',
      auditDsn: `pglite://${await mkdtemp(join(tmpdir(), 'dvx-matrix-audit-'))}`,
      auditWalDir: await mkdtemp(join(tmpdir(), 'dvx-matrix-wal-')),
      ...(dsn ? { databaseDsn: dsn } : {}),
    },
  );
  t.teardown(() => h.close());
  // Persona -> what it was granted; a route is allowed when the persona holds its capability over the
  // route's target (the org in its path, else the platform).
  const PERSONAS: Record<string, { org: string; capabilities: readonly string[] }> = {
    'org-admin-a': { org: 'org-a', capabilities: BUILT_IN_ROLES['org-admin'] },
    'member-a': { org: 'org-a', capabilities: BUILT_IN_ROLES.member },
    'auditor-a': { org: 'org-a', capabilities: BUILT_IN_ROLES.auditor },
    'admin-b': { org: 'org-b', capabilities: BUILT_IN_ROLES['org-admin'] },
    'svc-a': { org: 'org-a', capabilities: ['members:*'] },
  };
  /** The orgs and grants every row starts from (a row before may have deleted an org); idempotent. */
  async function seed() {
    await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
    await h.call('root', 'POST', '/orgs', { id: 'org-b', name: 'B' });
    await h.call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:org-admin-a', role: 'org-admin' });
    await h.call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:member-a', role: 'member' });
    await h.call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:auditor-a', role: 'auditor' });
    await h.call('root', 'POST', '/orgs/org-b/grants', { principal: 'user:admin-b', role: 'org-admin' });
    await h.call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:svc-a', capability: 'members:*' });
    await h.call('root', 'POST', '/orgs/org-a/grants', { principal: 'agent:agent-1', role: 'auditor' });
    const agent = await h.call('root', 'POST', '/orgs/org-a/agents', { uid: 'agent-1', name: 'agent one' });
    if (agent.status >= 300) throw new Error(`seeding agent-1: ${JSON.stringify(agent.body)}`);
    await h.call('root', 'POST', '/orgs/org-a/agents/agent-1/containment', { contained: false });
    await h.call('root', 'POST', '/orgs/org-a/agents/agent-1/restore');
  }
  await seed();

  const wrongAudience = await h.issuer.token('root', 'https://elsewhere.dvx.test');
  const { privateKey } = await generateKeyPair('ES256');
  const forged = await new SignJWT({ org_id: 'org-a' })
    .setProtectedHeader({ alg: 'ES256', kid: 'issuer-1' })
    .setIssuer(h.issuer.issuer)
    .setAudience(AUDIENCE)
    .setSubject('root')
    .setIssuedAt()
    .setExpirationTime('5m')
    .sign(privateKey);
  const agentOperator = (await h.call('root', 'POST', '/orgs/org-a/agents/agent-1/operator-token')).body
    .access_token as string;
  const doc = (await h.call('root', 'GET', '/openapi.json')).body as {
    openapi: string;
    paths: Record<
      string,
      Record<
        string,
        {
          'x-required-capability': string | null;
          'x-capability-target'?: string;
          'x-agent-operator'?: boolean;
          'x-stream'?: boolean;
        }
      >
    >;
  };
  const VALUES: Record<string, string> = {
    org: 'org-a',
    subject: 'someone-else',
    group: 'g1',
    id: '999',
    name: 'custom-x',
    key: 'k1',
    grant: '1',
    agent: 'agent-1',
    uid: 'agent-1',
    flag: 'inspect:llm',
  };

  t.test(`${store}: the document`, async (t) => {
    t.equal(doc.openapi, '3.2.0');
    t.ok(Object.keys(doc.paths).length >= 10, `${Object.keys(doc.paths).length} paths`);
    for (const [path, ops] of Object.entries(doc.paths)) {
      for (const [method, op] of Object.entries(ops))
        t.ok('x-required-capability' in op, `${method} ${path} declares its capability`);
    }
    t.equal(doc.paths['/api/v1/whoami'].get['x-required-capability'], null);
    t.equal(doc.paths['/api/v1/orgs/{org}/grants'].post['x-required-capability'], 'members:*');
  });

  // One way to ask every route, SSE ones included: the status (and body, unless a stream) of a call.
  const raw = new Agent({ connect: { rejectUnauthorized: false } });
  t.teardown(() => raw.close());
  const tokens = new Map<string, string>();
  async function ask(
    who: string | { token: string } | null,
    method: string,
    path: string,
    body: unknown,
    stream: boolean,
  ): Promise<{ status: number; body: any }> {
    let token: string | null = null;
    if (typeof who === 'string') {
      if (!tokens.has(who)) tokens.set(who, await h.issuer.token(who));
      token = tokens.get(who)!;
    } else if (who) token = who.token;
    const res = await request(`https://127.0.0.1:${h.cp.port}/api/v1${path}`, {
      method: method as 'GET',
      dispatcher: raw,
      headers: {
        ...(token ? { authorization: `Bearer ${token}` } : {}),
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (stream && res.statusCode === 200) {
      res.body.destroy();
      return { status: 200, body: null };
    }
    const text = await res.body.text();
    return { status: res.statusCode, body: text ? JSON.parse(text) : null };
  }

  for (const [path, ops] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      const stream = op['x-stream'] === true;
      // Agent routes address agent-1; the erasure routes an org that does not exist (never erase org-a here).
      const values = path.startsWith('/api/v1/agents/{id}')
        ? { ...VALUES, id: 'agent-1' }
        : path.endsWith('/erasure')
          ? { ...VALUES, org: 'org-gone' }
          : VALUES;
      const concrete = path.replace(/\{([A-Za-z_]+)\}/g, (_m, p: string) => values[p] ?? 'x').replace(/^\/api\/v1/, '');
      t.test(`${store}: ${method.toUpperCase()} ${path}`, async (t) => {
        await seed();
        const body = ['post', 'put'].includes(method) ? {} : undefined;
        const anonymous = await ask(null, method.toUpperCase(), concrete, body, stream);
        t.equal(anonymous.status, 401, 'no token');
        t.equal(anonymous.body.type, 'https://dvx.dev/problems/unauthenticated');
        for (const [name, token] of [
          ['another audience', wrongAudience],
          ['forged', forged],
        ]) {
          const refused = await ask({ token }, method.toUpperCase(), concrete, body, stream);
          t.equal(refused.status, 401, name);
        }
        const agent = await ask({ token: agentOperator }, method.toUpperCase(), concrete, body, stream);
        if (op['x-required-capability'] === null) t.not(agent.status, 401, 'the agent-operator token is valid');
        else if (op['x-agent-operator'])
          t.notOk(
            [401, 403].includes(agent.status),
            `its own audit trail is the agent-operator's one surface (${agent.status})`,
          );
        else t.equal(agent.status, 403, 'the agent-operator kind is refused');
        const nobody = await ask('nobody', method.toUpperCase(), concrete, body, stream);
        if (op['x-required-capability'] === null) t.not(nobody.status, 403, 'a valid token is enough');
        else t.equal(nobody.status, 403, `nobody is refused (${op['x-required-capability']})`);
        for (const [persona, p] of Object.entries(PERSONAS)) {
          const capability = op['x-required-capability'];
          // An org route open to any caller (self-service) is still open to callers of that org only.
          // A route over the caller's own org (x-capability-target) is allowed to whoever holds it there.
          const callerOrg = op['x-capability-target'] === 'caller-org';
          // Routes addressing an agent by id are checked over the agent's org (agent-1 is in org-a).
          const inOrg = path.startsWith('/api/v1/orgs/{org}') || op['x-capability-target'] === 'agent-org';
          const allowed =
            capability === null
              ? !inOrg || p.org === 'org-a'
              : callerOrg
                ? p.capabilities.includes(capability)
                : inOrg && p.org === 'org-a' && p.capabilities.includes(capability);
          const r = await ask(persona, method.toUpperCase(), concrete, body, stream);
          if (allowed) t.notOk([401, 403].includes(r.status), `${persona} gets past authorization (${r.status})`);
          else t.equal(r.status, 403, `${persona} is refused (${capability})`);
        }
        const root = await ask('root', method.toUpperCase(), concrete, body, stream);
        t.notOk([401, 403].includes(root.status), `the platform admin gets past authorization (${root.status})`);
      });
    }
  }
}
if (pgDb) t.teardown(() => pgDb.drop());
