import { once } from 'node:events';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { createLocalJWKSet } from 'jose';
import { pino } from 'pino';
import { Agent, ProxyAgent, type Dispatcher } from 'undici';
import type { AuditSink } from '../../../audit-wal/sink.ts';
import { StdoutAuditSink } from '../../../audit-wal/stdout-sink.ts';
import { createRegistry } from '../../../core/metrics.ts';
import { generateCa, issueCertificate, type PemPair } from '../../../core/tls.ts';
import { type EngineOptions, InspectionEngine } from '../../../pipeline/engine.ts';
import { PolicyCache } from '../../../pipeline/policy/cache.ts';
import { validateSnapshot } from '../../../pipeline/policy/snapshot.ts';
import type { ResolvedPolicy } from '../../../pipeline/policy/types.ts';
import { AgentAuthenticator, type AgentIdentity } from '../../../proxy/llm/auth.ts';
import { secretSource, type SecretMap } from '../../../proxy/llm/secrets-file.ts';
import {
  Flow,
  type GatewayDeps,
  type LlmproxyRoute,
  type OperatorTokenSource,
  type PinnedTarget,
} from '../../../proxy/egress/context.ts';
import { OperatorTokenError } from '../../../proxy/egress/errors.ts';
import { exchangeHandler } from '../../../proxy/egress/exchange.ts';
import { canonicalHost } from '../../../proxy/egress/host-match.ts';
import { parseInjectRule } from '../../../proxy/egress/inject-cred.ts';
import { openInterceptor } from '../../../proxy/egress/intercept.ts';
import { gatewayMetrics } from '../../../proxy/egress/metrics.ts';
import { type GatewayOptions, validateGatewayOptions } from '../../../proxy/egress/options.ts';

// A small real stand-in for the gateway's doors (built elsewhere) around the parts under test: a plain
// node:http server whose 'connect' answers 200 and hands the socket to the interceptor (the CONNECT's
// host pinned to the address `names` gives), and whose absolute-form requests go to the exchange
// (scheme http). Every flow carries the identity `agent` (no authentication here). Everything else is
// real: the inspection engine, the audit sink (stdout format over a stream we parse), https upstreams
// with a CA of their own (passed as --upstream-ca), clients trusting the interception CA.

export const AGENT: AgentIdentity = {
  agentId: 'agent-1',
  orgId: 'org-1',
  agentName: 'builder',
  groupId: 'g-1',
  via: 'jwt',
  tokenHeader: null,
};
/** A secret of agent-1 (the secrets filter blocks it in a request body). */
export const AGENT_SECRET = 'hunter2-correct-horse-battery';
/** A secret only an --inject-cred rule uses. */
export const GITHUB_TOKEN = 'ghp_injected0credential0value0000000000';
export const ORG_TOKEN = 'org-level-token-value-0123456789';

export function snapshotDoc(): Record<string, unknown> {
  return {
    version: 'v1',
    enclave: { id: 'enc-1', name: 'test-enclave', isolation_class: 'vm' },
    platform: {},
    orgs: {
      'org-1': {
        config: {
          content_inspection: {
            value: {
              secrets_filter: { enabled: true },
              pii_detection: { enabled: true, severity: 'warn' },
              api_key_detection: { enabled: true, severity: 'block' },
            },
          },
        },
        flags: {},
        groups: {},
        packs: [],
      },
    },
    agents: {
      'agent-1': { org_id: 'org-1', group_id: 'g-1', name: 'builder', status: 'active', contained: false, config: {} },
    },
  };
}

export interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  rawHeaders: string[];
  body: Buffer;
  servername: string | null;
}

/** A real https (or http) server recording what reached it; `handle` answers (default: 200 `ok`). */
export interface Upstream {
  port: number;
  seen: Seen[];
  handle: (req: IncomingMessage, res: ServerResponse, body: Buffer) => void;
  server: http.Server;
}

async function startUpstream(tls: { cert: string; key: string } | null): Promise<Upstream> {
  const seen: Seen[] = [];
  const onRequest = (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const servername = (req.socket as { servername?: string | false }).servername;
      seen.push({
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        rawHeaders: req.rawHeaders,
        body,
        servername: typeof servername === 'string' ? servername : null,
      });
      up.handle(req, res, body);
    });
  };
  const server = tls ? https.createServer(tls, onRequest) : http.createServer(onRequest);
  const up: Upstream = { port: 0, seen, handle: (_req, res) => res.end('ok'), server };
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  up.port = (server.address() as AddressInfo).port;
  return up;
}

export interface HarnessOptions {
  options?: Partial<GatewayOptions>;
  secrets?: Record<string, Record<string, string>>;
  /** Wraps the stdout audit sink (a sink slow to make records durable, one that never does). */
  audit?: (sink: AuditSink) => AuditSink;
  llmproxy?: boolean;
  controlPlane?: boolean;
  /** Engine options over the harness's (a faulty worker). */
  engine?: EngineOptions;
  /** An https door (the gateway is TLS-only): the tunnel's TLS runs inside the door's. */
  tlsDoor?: boolean;
}

export interface Harness {
  dir: string;
  /** The interception CA: what agents trust. */
  gatewayCa: PemPair;
  gatewayCaPath: string;
  /** The upstreams' CA (--upstream-ca). */
  upstreamCa: PemPair;
  deps: GatewayDeps;
  doorPort: number;
  doorUrl: string;
  /** An https upstream answering as `dest.test`, `other.test`, `org.test`, `nocap.test` (and `127.0.0.1`). */
  upstream: Upstream;
  /** A plain node:http upstream (`plain.test`). */
  plain: Upstream;
  llm: Upstream | null;
  cp: Upstream | null;
  /** Names the door and the gateway resolve (what the policy check would have pinned). */
  names: Map<string, string>;
  audit: Record<string, unknown>[];
  logs: string[];
  /** Tunnel flows once serve() resolved. */
  tunnels: Flow[];
  /** The length of each CONNECT's `head` (bytes that came with it). */
  heads: number[];
  identity: AgentIdentity | null;
  flows(): Record<string, unknown>[];
  events(): Record<string, unknown>[];
  /** A ProxyAgent through the door trusting the interception CA; `tunnel: false` sends http:// URLs absolute-form. */
  proxy(o?: { tunnel?: boolean }): ProxyAgent;
  close(): Promise<void>;
}

export async function startHarness(o: HarnessOptions = {}): Promise<Harness> {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-intercept-'));
  const gatewayCa = await generateCa('dvx test interception CA');
  const upstreamCa = await generateCa('test upstream CA');
  const gatewayCaPath = join(dir, 'ca.pem');
  await writeFile(gatewayCaPath, gatewayCa.certPem);
  await writeFile(join(dir, 'ca-key.pem'), gatewayCa.keyPem, { mode: 0o600 });
  const serverLeaf = async (names: string[]) => {
    const leaf = await issueCertificate(upstreamCa, {
      commonName: names[0],
      dnsNames: names,
      ipAddresses: ['127.0.0.1'],
    });
    return { cert: leaf.certPem, key: leaf.keyPem };
  };
  const upstream = await startUpstream(await serverLeaf(['dest.test', 'other.test', 'org.test', 'nocap.test']));
  const plain = await startUpstream(null);
  const llm = o.llmproxy ? await startUpstream(await serverLeaf(['llmproxy.test'])) : null;
  const cp = o.controlPlane ? await startUpstream(await serverLeaf(['cp.test'])) : null;

  const names = new Map<string, string>([
    ['dest.test', '127.0.0.1'],
    ['other.test', '127.0.0.1'],
    ['org.test', '127.0.0.1'],
    ['nocap.test', '127.0.0.1'],
    ['plain.test', '127.0.0.1'],
    ['cp.test', '127.0.0.1'],
  ]);
  const auditOut = new PassThrough();
  const audit: Record<string, unknown>[] = [];
  let pending = '';
  auditOut.on('data', (d: Buffer) => {
    pending += d.toString();
    let nl: number;
    while ((nl = pending.indexOf('\n')) >= 0) {
      audit.push(JSON.parse(pending.slice(0, nl)) as Record<string, unknown>);
      pending = pending.slice(nl + 1);
    }
  });
  const logs: string[] = [];
  const logOut = new PassThrough();
  logOut.on('data', (d: Buffer) => logs.push(d.toString()));
  const log = pino({ level: 'debug' }, logOut);

  const options = validateGatewayOptions({
    tlsCert: join(dir, 'unused-cert.pem'),
    tlsKey: join(dir, 'unused-key.pem'),
    agentJwks: join(dir, 'unused-jwks.json'),
    caCert: gatewayCaPath,
    caKey: join(dir, 'ca-key.pem'),
    enclaveId: 'enc-1',
    enclaveName: 'test-enclave',
    ...(o.secrets || o.options?.injectCred ? { secretsFile: join(dir, 'secrets.json') } : {}),
    ...(o.controlPlane
      ? { cpApiHost: 'cp.test', secretBrokerUrl: 'https://broker.test', secretBrokerTokenFile: 'x' }
      : {}),
    ...o.options,
  });
  const secretMap: SecretMap = new Map();
  for (const [owner, entries] of Object.entries(
    o.secrets ?? { 'agent:agent-1': { db_password: AGENT_SECRET, github_token: GITHUB_TOKEN } },
  ))
    secretMap.set(owner, new Map(Object.entries(entries)));
  const registry = createRegistry();
  const snapshot = validateSnapshot(snapshotDoc());

  const llmproxyRoute: LlmproxyRoute | null = llm
    ? {
        matches: (host) => host === 'api.anthropic.com',
        route: async (identity, method, path) => ({
          origin: `https://127.0.0.1:${llm.port}`,
          dispatcher: new Agent({ connect: { ca: upstreamCa.certPem } }),
          headers: { 'x-dvx-gateway-identity': `signed:${identity.agentId}:${method}:${path}` },
        }),
        close: async () => {},
      }
    : null;
  const operatorTokens: OperatorTokenSource | null = cp
    ? {
        matches: (host, port) => host === 'cp.test' && port === cp.port,
        token: async (identity) => {
          if (identity.agentId === 'contained-agent')
            throw new OperatorTokenError('agent contained-agent is contained: no agent-operator token', 403);
          if (identity.agentId === 'unreachable-agent')
            throw new OperatorTokenError('broker unreachable: ECONNREFUSED', null);
          return `op-token-for-${identity.agentId}-0123456789`;
        },
        close: async () => {},
      }
    : null;

  const deps: GatewayDeps = {
    options,
    auth: new AgentAuthenticator({ keys: () => createLocalJWKSet({ keys: [] }) }),
    snapshot: () => snapshot,
    policies: new PolicyCache<ResolvedPolicy>(),
    secrets: secretSource(() => secretMap),
    engine: new InspectionEngine({
      threads: 0,
      timeoutMs: options.inspectTimeout,
      failClosed: options.inspectFailClosed,
      registry,
      ...o.engine,
    }),
    audit: o.audit ? o.audit(new StdoutAuditSink(auditOut)) : new StdoutAuditSink(auditOut),
    capture: { captureOrDeny: options.auditCaptureOrDeny, timeoutMs: options.auditCaptureTimeout },
    log,
    metrics: gatewayMetrics(registry),
    version: 'test',
    cliRules: { allow: [], deny: [] },
    injectRules: options.injectCred.map(parseInjectRule),
    upstreamCa: Buffer.from(upstreamCa.certPem),
    lookup: async (host) => {
      const address = names.get(host);
      if (address === undefined) throw Object.assign(new Error(`no such host ${host}`), { code: 'ENOTFOUND' });
      return [{ address, family: 4 as const }];
    },
    interceptor: null,
    exchange: () => {},
    llmproxy: llmproxyRoute,
    operatorTokens,
  };
  deps.exchange = exchangeHandler(deps);
  const interceptor = await openInterceptor(deps);
  deps.interceptor = interceptor;

  const tunnels: Flow[] = [];
  const heads: number[] = [];
  const h: Partial<Harness> & { identity: AgentIdentity | null } = { identity: AGENT };
  const pin = (host: string, port: number): PinnedTarget => {
    const canonical = canonicalHost(host);
    return { host: canonical, port, address: names.get(canonical) ?? '', family: 4 };
  };
  const onConnect = (req: IncomingMessage, socket: import('node:stream').Duplex, head: Buffer) => {
    const m = /^(.+):(\d+)$/.exec(req.url ?? '');
    if (!m) {
      socket.end('HTTP/1.1 400 Bad Request\r\n\r\n');
      return;
    }
    const target = pin(m[1], Number(m[2]));
    const remote = req.socket;
    const flow = new Flow('tcp', { address: remote.remoteAddress ?? '', port: remote.remotePort ?? 0 }, target);
    flow.identity = h.identity;
    flow.dstIp = target.address;
    if (!interceptor.wants(target)) {
      socket.end('HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n');
      return;
    }
    heads.push(head.length);
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    void interceptor.serve(socket, head, target, flow).then(() => tunnels.push(flow));
  };
  const onRequest = (req: IncomingMessage, res: ServerResponse) => {
    let url: URL;
    try {
      url = new URL(req.url ?? '');
    } catch {
      res.writeHead(400).end();
      return;
    }
    const target = pin(url.hostname.replace(/^\[|\]$/g, ''), Number(url.port || 80));
    const flow = new Flow(
      'http',
      { address: req.socket.remoteAddress ?? '', port: req.socket.remotePort ?? 0 },
      target,
    );
    flow.identity = h.identity;
    deps.exchange(req, res, target, 'http', flow);
  };
  let doorTls: { cert: string; key: string } | null = null;
  if (o.tlsDoor) doorTls = await serverLeaf(['localhost']);
  const door = doorTls ? https.createServer(doorTls, onRequest) : http.createServer(onRequest);
  door.on('connect', onConnect);
  door.listen(0, '127.0.0.1');
  await once(door, 'listening');
  const doorPort = (door.address() as AddressInfo).port;
  const doorUrl = `${doorTls ? 'https' : 'http'}://127.0.0.1:${doorPort}`;
  const agents: Dispatcher[] = [];

  Object.assign(h, {
    dir,
    gatewayCa,
    gatewayCaPath,
    upstreamCa,
    deps,
    doorPort,
    doorUrl,
    upstream,
    plain,
    llm,
    cp,
    names,
    audit,
    logs,
    tunnels,
    heads,
    flows: () => audit.filter((r) => r.table === 'network_flow'),
    events: () => audit.filter((r) => r.table === 'audit_events'),
    proxy: ({ tunnel = true }: { tunnel?: boolean } = {}) => {
      const agent = new ProxyAgent({
        uri: doorUrl,
        proxyTunnel: tunnel,
        requestTls: { ca: gatewayCa.certPem },
        ...(doorTls ? { proxyTls: { ca: upstreamCa.certPem, servername: '127.0.0.1' } } : {}),
      });
      agents.push(agent);
      return agent;
    },
    close: async () => {
      await Promise.all(agents.map((a) => a.close().catch(() => undefined)));
      // The tunnels first: a CONNECT's socket is no longer the door's to close.
      await interceptor.close();
      door.closeAllConnections();
      await new Promise<void>((r) => door.close(() => r()));
      for (const up of [upstream, plain, llm, cp]) {
        if (!up) continue;
        up.server.closeAllConnections();
        await new Promise<void>((r) => up.server.close(() => r()));
      }
      await deps.engine.close?.();
      await rm(dir, { recursive: true, force: true });
    },
  });
  return h as Harness;
}

/** The network_flow record of the request to `path` (the last one). */
export function flowOf(h: Harness, path: string): Record<string, unknown> | undefined {
  return h
    .flows()
    .filter((r) => typeof r.attrs === 'object' && String((r.attrs as Record<string, string>).url ?? '').includes(path))
    .at(-1);
}

export function attrsOf(record: Record<string, unknown> | undefined): Record<string, string> {
  return (record?.attrs ?? {}) as Record<string, string>;
}
