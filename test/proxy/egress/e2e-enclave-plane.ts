import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ProxyAgent, request } from 'undici';
import { getAgent } from '../../../enclave/broker/agents.ts';
import { startBrokerHarness, type BrokerHarness } from '../../fixtures/broker-harness.ts';
import { startCpHarness, type CpHarness } from '../../fixtures/controlplane-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';
import { destinationCa, interceptionCa, startDestination, type Destination } from './e2e-enclave-fixture.ts';
import { startGatewayHarness, type GatewayHarness } from './gateway-harness.ts';

// A whole enclave for the end-to-end tests of the gateway (e2e-enclave-*.test.ts), every part real and
// over TLS, sharing one PostgreSQL audit store:
//
//   control plane (OIDC personas: root, alice, bob; --audit-dsn PG)  ◀── relay (counts) ◀─┐
//        ▲ broker key                                                                     │ --cp-api-host
//   broker (connected: runs the control plane's agents; local personas admin-a, bob;      │
//           satellite routes; --audit-dsn PG)  ◀── --secret-broker-url ── gateway ────────┘
//                                                                           │ --audit-dsn PG, WAL
//   agents bot-1, bot-2 (created on the control plane for enc-test)         └──▶ api.dest.test (https)
//
// The gateway runs in this process (gateway-harness.ts), with its own WAL sink: its network_flow and
// audit_events records reach the store the broker's and the control plane's audit read APIs read.

export interface Enclave {
  dir: string;
  cph: CpHarness;
  broker: BrokerHarness;
  gw: GatewayHarness;
  /** The relay in front of the control plane that the gateway's --cp-api-host names. */
  cpRelay: CountingRelay;
  /** An https destination agents reach through the gateway (api.dest.test). */
  dest: Destination;
  /** `--cp-api-host`: 127.0.0.1:<relay port>. */
  cpApiHost: string;
  /** An agent's undici client through the gateway (its JWT as proxy credential, trusting the interception CA). */
  agent(uid: string): Promise<ProxyAgent>;
  /** A GET through the gateway as `uid`, on a tunnel of its own closed after: status, headers and text. */
  get(uid: string, url: string, headers?: Record<string, string>): Promise<AgentAnswer>;
  close(): Promise<void>;
}

export interface AgentAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
}

export interface CountingRelay {
  port: number;
  /** Connections accepted and bytes relayed toward the target so far. */
  connections: number;
  bytesUp: number;
  close(): Promise<void>;
}

/** A TCP relay to `targetPort` counting what it carries toward it. */
export async function startCountingRelay(targetPort: number): Promise<CountingRelay> {
  const sockets = new Set<net.Socket>();
  const stats = { connections: 0, bytesUp: 0 };
  const server = net.createServer((client) => {
    stats.connections++;
    const upstream = net.connect(targetPort, '127.0.0.1');
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('error', () => {});
      s.once('close', () => {
        sockets.delete(s);
        client.destroy();
        upstream.destroy();
      });
    }
    client.on('data', (d: Buffer) => (stats.bytesUp += d.length));
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    get connections() {
      return stats.connections;
    },
    get bytesUp() {
      return stats.bytesUp;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

export const AGENTS = ['bot-1', 'bot-2'] as const;

/** The gateway's policy snapshot (what config-pull would write): the org and its agents, all active. */
export function enclaveSnapshot() {
  const agent = (name: string) => ({
    org_id: 'org-a',
    group_id: 'g-1',
    name,
    status: 'active',
    contained: false,
    config: {},
  });
  return {
    version: 'v1',
    enclave: { id: 'enc-test', name: 'test-enclave', isolation_class: 'vm' },
    platform: {},
    orgs: { 'org-a': { config: {}, flags: {}, groups: {}, packs: [] } },
    agents: Object.fromEntries(AGENTS.map((uid) => [uid, agent(uid)])),
  };
}

/** Null when there is no PostgreSQL at 127.0.0.1:5432 (the caller says so and skips). */
export async function startEnclave(
  options: { agentTokenTtl?: number; denyDest?: string[] } = {},
): Promise<Enclave | null> {
  const pg = await freshPgDatabase('dvx_e2e_enclave');
  if (!pg) return null;
  const dir = await mkdtemp(join(tmpdir(), 'dvx-e2e-enclave-'));
  const closers: (() => Promise<unknown>)[] = [() => rm(dir, { recursive: true, force: true }), () => pg.drop()];
  const close = async () => {
    for (const c of closers.reverse()) await c().catch(() => {});
  };
  try {
    const cph = await startCpHarness(
      [
        { clientId: 'root', org: 'org-a', human: true },
        { clientId: 'alice', org: 'org-a', human: true },
        { clientId: 'bob', org: 'org-a', human: true },
      ],
      {
        seedAdmin: ['root'],
        agentTokenIssuerUrl: 'https://cp.dvx.test',
        agentTokenTtl: options.agentTokenTtl ?? 0,
        auditDsn: pg.dsn,
        auditWalDir: join(dir, 'cp-wal'),
      },
    );
    closers.push(() => cph.close());
    const must = (what: string, status: number, expected: number) => {
      if (status !== expected) throw new Error(`${what}: ${status}`);
    };
    must('org', (await cph.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' })).status, 201);
    const reg = await cph.call('root', 'POST', '/enclaves', {
      name: 'eu',
      enclave_id: 'enc-test',
      owning_org: 'org-a',
    });
    must('enclave', reg.status, 201);
    await writeFile(join(dir, 'cp-ca.pem'), cph.ca);
    // alice audits org-a; bob is a plain member of it.
    must(
      'grant',
      (await cph.call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:alice', role: 'auditor' })).status,
      201,
    );
    must(
      'grant',
      (await cph.call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:bob', role: 'member' })).status,
      201,
    );

    const broker = await startBrokerHarness(
      {
        controlplane: `https://127.0.0.1:${cph.cp.port}`,
        brokerKey: reg.body.key.token as string,
        enclaveId: 'enc-test',
        caCert: join(dir, 'cp-ca.pem'),
        seedAdmin: ['admin-a'],
        auditDsn: pg.dsn,
        auditWalDir: join(dir, 'broker-wal'),
      },
      [
        { clientId: 'admin-a', org: 'org-a', human: true },
        { clientId: 'bob', org: 'org-a', human: true },
      ],
    );
    closers.push(() => broker.close());
    await writeFile(join(dir, 'broker-ca.pem'), broker.tls.ca.certPem);
    for (const uid of AGENTS)
      must(
        `agent ${uid}`,
        (await cph.call('root', 'POST', '/orgs/org-a/agents', { uid, name: uid, enclave_id: 'enc-test' })).status,
        201,
      );
    if (!(await until(async () => (await getAgent(broker.broker.deps.db, AGENTS.at(-1)!)) !== null)))
      throw new Error('the broker did not get the agents from the control plane');

    const cpRelay = await startCountingRelay(cph.cp.port);
    closers.push(() => cpRelay.close());
    const icp = await interceptionCa(dir);
    const dca = await destinationCa(dir);
    const dest = await startDestination(dca.ca, ['api.dest.test']);
    closers.push(() => dest.close());
    // --upstream-ca: the destinations' CA and the control plane's.
    await writeFile(join(dir, 'upstream-ca.pem'), dca.ca.certPem + cph.ca);
    const cpApiHost = `127.0.0.1:${cpRelay.port}`;
    const gw = await startGatewayHarness({
      snapshot: enclaveSnapshot(),
      resolve: { 'api.dest.test': ['127.0.0.1'] },
      audit: 'own',
      gateway: {
        enclaveId: 'enc-test',
        enclaveName: 'test-enclave',
        auditDsn: pg.dsn,
        auditWalDir: join(dir, 'gateway-wal'),
        secretBrokerUrl: `https://127.0.0.1:${broker.broker.agentPort}`,
        secretBrokerTokenFile: join(broker.dir, 'state', 'satellite-token'),
        brokerCa: join(dir, 'broker-ca.pem'),
        cpApiHost,
        upstreamCa: join(dir, 'upstream-ca.pem'),
        caCert: icp.certFile,
        caKey: icp.keyFile,
        denyDest: options.denyDest ?? [],
      },
    });
    closers.push(() => gw.close());

    const proxies: ProxyAgent[] = [];
    closers.push(() => Promise.all(proxies.map((p) => p.close())));
    const agent = async (uid: string) => {
      const p = new ProxyAgent({
        uri: gw.proxyUrl,
        token: `Bearer ${await gw.token({ sub: uid, org_id: 'org-a', agent_name: uid })}`,
        proxyTls: { ca: gw.ca.certPem, servername: 'localhost' },
        requestTls: { ca: icp.ca.certPem },
      });
      proxies.push(p);
      return p;
    };
    return {
      dir,
      cph,
      broker,
      gw,
      cpRelay,
      dest,
      cpApiHost,
      agent,
      async get(uid, url, headers = {}) {
        const dispatcher = await agent(uid);
        try {
          const res = await request(url, { dispatcher, headers });
          return { status: res.statusCode, headers: res.headers, text: await res.body.text() };
        } finally {
          // Its tunnel ends here: the tunnel's own record is written when it closes.
          await dispatcher.close();
        }
      },
      close,
    };
  } catch (err) {
    await close();
    throw err;
  }
}
