import http from 'node:http';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Fastify from 'fastify';
import { createRemoteJWKSet, customFetch, jwtVerify } from 'jose';
import { Agent, request } from 'undici';
import { StdoutAuditSink } from '../audit-wal/stdout-sink.ts';
import { fetchTrusting } from '../core/fetch.ts';
import { createLogger } from '../core/logger.ts';
import { issueBootstrapToken } from '../enclave/broker/bootstrap-tokens.ts';
import { startBroker, type RunningBroker } from '../enclave/broker/server.ts';
import { startLlmProxy } from '../proxy/llm/server.ts';
import { freshPgDatabase } from '../test/fixtures/pg-database.ts';
import { conditions, UNPINNED } from './conditions.ts';
import { ANTHROPIC_TEXT_REPLY, writeServerTls } from './fixtures.ts';
import { type LatencyAndRate, latencyThenRate } from './loops.ts';
import { formatMs, table } from './measure.ts';

// npm run bench -- broker [--seconds N]
//
// What the broker's identity exchanges cost, and what verifying its JWTs costs llmproxy. One run, one
// machine (client, servers and upstream share the cores, in one process):
//   floor   a bare fastify route over the same TLS (POST, a small JSON body answered with a small one);
//   peer    the same route verifying a bearer JWT against a remote JWKS with jose on every request;
//   ours    POST /v1/agent/bootstrap (a fresh token each time: redeem, family, status, audit, JWT) and
//           POST /v1/agent/refresh (rotate in a chain, JWT) on PGlite and on PostgreSQL;
//           llmproxy answering an Anthropic call (inspection off) with the JWT verified against the
//           broker's JWKS, against the same call straight to the upstream.
// Sequential latency (p50/p99) and 8 requests in flight (req/s).

/** A contender's sequential p50/p99 and its req/s with 8 in flight. */
type Result = LatencyAndRate & { name: string };

async function run(name: string, once: () => Promise<void>, seconds: number, warm = 50): Promise<Result> {
  return { name, ...(await latencyThenRate(once, seconds, { warm })) };
}

async function post(dispatcher: Agent, url: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await request(url, {
    method: 'POST',
    dispatcher,
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.body.text();
  if (res.statusCode !== 200) throw new Error(`${url}: HTTP ${res.statusCode} ${text.slice(0, 200)}`);
  return JSON.parse(text) as Record<string, unknown>;
}

/** Agents the broker knows, each `active`-able: rows as convergence writes them. */
async function seedAgents(broker: RunningBroker, n: number, prefix = 'bench'): Promise<string[]> {
  const uids: string[] = [];
  for (let i = 0; i < n; i++) {
    const uid = `${prefix}-${i}`;
    await broker.deps.db.query(
      `INSERT INTO broker_agents (uid, org_id, group_id, name, status) VALUES ($1, 'org-bench', NULL, $1, 'provisioning')
       ON CONFLICT (uid) DO NOTHING`,
      [uid],
    );
    uids.push(uid);
  }
  return uids;
}

async function exchanges(label: string, broker: RunningBroker, dispatcher: Agent, seconds: number): Promise<Result[]> {
  const base = `https://127.0.0.1:${broker.agentPort}`;
  const uids = await seedAgents(broker, 64);
  let i = 0;
  const bootstrap = async () => {
    const uid = uids[i++ % uids.length]!;
    const token = await issueBootstrapToken(broker.deps.db, uid, 3_600_000, Date.now());
    await post(dispatcher, `${base}/v1/agent/bootstrap`, { token });
  };
  // Each of the 8 in-flight loops rotates its own chain (a refresh token is single use), each of its own
  // agent (a bootstrap revokes the agent's older families).
  const chainAgents = await seedAgents(broker, 8, 'chain');
  const chains: string[] = [];
  for (let c = 0; c < 8; c++) {
    const token = await issueBootstrapToken(broker.deps.db, chainAgents[c]!, 3_600_000, Date.now());
    chains.push(String((await post(dispatcher, `${base}/v1/agent/bootstrap`, { token })).refresh_token));
  }
  // A chain is taken while its refresh is in flight and put back with its successor.
  const refresh = async () => {
    const held = chains.shift()!;
    const out = await post(dispatcher, `${base}/v1/agent/refresh`, { refresh_token: held });
    chains.push(String(out.refresh_token));
  };
  return [
    await run(`ours: bootstrap exchange (${label})`, bootstrap, seconds, 20),
    await run(`ours: refresh exchange (${label})`, refresh, seconds, 20),
  ];
}

export async function main(args: string[]): Promise<void> {
  const seconds = Number(args[args.indexOf('--seconds') + 1]) || 4;
  const dir = await mkdtemp(join(tmpdir(), 'dvx-bench-broker-'));
  const { ca, leaf, certFile: cert, keyFile: key } = await writeServerTls(dir);
  const dispatcher = new Agent({ connect: { ca: ca.certPem }, connections: 16 });
  const logger = createLogger({ level: 'error', destination: { write: () => {} } });
  const silentAudit = () => new StdoutAuditSink({ write: () => {} } as never);
  const results: Result[] = [];

  // floor and peer: bare fastify over the same TLS.
  const bare = Fastify({ https: { cert: leaf.certPem, key: leaf.keyPem }, logger: false });
  bare.post('/floor', async () => ({ ok: true }));
  let jwks: ReturnType<typeof createRemoteJWKSet> | null = null;
  bare.post('/peer', async (req) => {
    const token = String(req.headers.authorization ?? '').replace(/^Bearer /, '');
    await jwtVerify(token, jwks!, { algorithms: ['ES256'] });
    return { ok: true };
  });
  await bare.listen({ port: 0, host: '127.0.0.1' });
  const barePort = (bare.server.address() as AddressInfo).port;

  const brokers: { label: string; broker: RunningBroker; drop?: () => Promise<void> }[] = [];
  const common = {
    addr: '127.0.0.1:0',
    operatorAddr: '127.0.0.1:0',
    tlsCert: cert,
    tlsKey: key,
    enclaveId: 'enc-bench',
  };
  brokers.push({
    label: 'PGlite',
    broker: await startBroker({ ...common, stateDir: join(dir, 'pglite') }, { logger, audit: silentAudit() }),
  });
  const pg = await freshPgDatabase('dvx_bench_broker');
  if (pg)
    brokers.push({
      label: 'PostgreSQL',
      broker: await startBroker(
        { ...common, stateDir: join(dir, 'pg'), databaseDsn: pg.dsn },
        { logger, audit: silentAudit() },
      ),
      drop: pg.drop,
    });
  const first = brokers[0]!.broker;
  const brokerBase = `https://127.0.0.1:${first.agentPort}`;
  jwks = createRemoteJWKSet(new URL(`${brokerBase}/.well-known/jwks.json`), {
    [customFetch]: fetchTrusting(Buffer.from(ca.certPem)),
  });

  results.push(
    await run(
      'floor: bare fastify route',
      () => post(dispatcher, `https://127.0.0.1:${barePort}/floor`, {}).then(() => {}),
      seconds,
    ),
  );
  for (const b of brokers) results.push(...(await exchanges(b.label, b.broker, dispatcher, seconds)));

  // A JWT the broker minted, for the peer route and llmproxy.
  const [uid] = await seedAgents(first, 1, 'proxy');
  const minted = await post(dispatcher, `${brokerBase}/v1/agent/bootstrap`, {
    token: await issueBootstrapToken(first.deps.db, uid!, 3_600_000, Date.now()),
  });
  const jwt = String(minted.jwt);
  results.push(
    await run(
      'peer: fastify + jose remote-JWKS verify',
      () =>
        post(dispatcher, `https://127.0.0.1:${barePort}/peer`, {}, { authorization: `Bearer ${jwt}` }).then(() => {}),
      seconds,
    ),
  );

  // llmproxy verifying the broker's JWT, against the same call made straight to the upstream.
  const reply = ANTHROPIC_TEXT_REPLY;
  const upstream = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(reply));
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  const upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
  await writeFile(join(dir, 'broker-ca.pem'), ca.certPem);
  await writeFile(
    join(dir, 'secrets.json'),
    JSON.stringify({ 'org:org-bench': { 'llmproxy:llm.api_key': 'sk-ant-bench' } }),
  );
  const proxy = await startLlmProxy(
    {
      addr: '127.0.0.1:0',
      tlsCert: cert,
      tlsKey: key,
      agentJwks: `${brokerBase}/.well-known/jwks.json`,
      brokerCa: join(dir, 'broker-ca.pem'),
      secretsFile: join(dir, 'secrets.json'),
      upstreamDefault: upstreamUrl,
    } as never,
    { logger, audit: silentAudit() } as never,
  );
  const call = { model: 'claude-sonnet-4-5', max_tokens: 16, messages: [{ role: 'user', content: 'hello' }] };
  const anthropic = { 'anthropic-version': '2023-06-01' };
  const direct = new Agent({ connections: 16 });
  results.push(
    await run(
      'baseline: the call straight to the upstream',
      () => post(direct, `${upstreamUrl}/v1/messages`, call, anthropic).then(() => {}),
      seconds,
    ),
  );
  results.push(
    await run(
      'ours: llmproxy call, JWT verified against the broker JWKS',
      () =>
        post(dispatcher, `https://127.0.0.1:${proxy.port}/v1/messages`, call, {
          ...anthropic,
          authorization: `Bearer ${jwt}`,
        }).then(() => {}),
      seconds,
    ),
  );

  const floor = results[0]!;
  process.stdout.write(
    `${conditions(`${seconds / 2}s sequential + ${seconds / 2}s with 8 in flight per contender; ratio = p50 / floor p50`, `${UNPINNED}; client, servers and upstream in one process`)}\n\n`,
  );
  process.stdout.write(
    table(
      ['contender', 'p50', 'p99', 'req/s (8 in flight)', 'p50 vs floor'],
      results.map((r) => [
        r.name,
        formatMs(r.p50),
        formatMs(r.p99),
        r.rps.toFixed(0),
        `${(r.p50 / floor.p50).toFixed(2)}×`,
      ]),
    ) + '\n',
  );
  await proxy.close();
  upstream.close();
  await direct.close();
  for (const b of brokers) {
    await b.broker.close();
    await b.drop?.();
  }
  await bare.close();
  await dispatcher.close();
  await rm(dir, { recursive: true, force: true });
}
