import { spawn } from 'node:child_process';
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import https from 'node:https';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import tls from 'node:tls';
import type { Registry } from 'prom-client';
import { StdoutAuditSink } from '../../../audit-wal/stdout-sink.ts';
import type { AuditSink } from '../../../audit-wal/sink.ts';
import { createLogger } from '../../../core/logger.ts';
import { createRegistry } from '../../../core/metrics.ts';
import { generateCa, issueCertificate, type PemPair } from '../../../core/tls.ts';
import type { GatewayOptions } from '../../../proxy/egress/options.ts';
import { systemLookup, type Lookup } from '../../../proxy/egress/resolve.ts';
import { startGateway, type RunningGateway } from '../../../proxy/egress/server.ts';
import { tokenIssuer, type TokenIssuer } from '../../fixtures/agent-identity.ts';
import { until } from '../../fixtures/eventually.ts';

// Everything a test of the gateway's doors and tunnels needs, for real: a CA and the gateway's server
// certificate, an ES256 token issuer and its JWKS file, a policy snapshot on disk (rewritten and
// reloaded on demand), the gateway over TLS with its audit on a stdout sink whose lines are read back,
// a lookup that records every name it is asked (and answers some from a table), and destinations to
// tunnel to: a TCP echo, an https server, a server that accepts and never answers.

export interface GatewayHarness {
  dir: string;
  ca: PemPair;
  /** The CA file an agent trusts the gateway (and the test destinations) with. */
  caFile: string;
  issuer: TokenIssuer;
  gw: RunningGateway;
  port: number;
  proxyUrl: string;
  registry: Registry;
  logs: Record<string, unknown>[];
  /** network_flow (and other) records, parsed from the stdout sink's lines. */
  audit: Record<string, unknown>[];
  /** Every name the gateway asked the lookup to resolve, in order. */
  lookups: string[];
  token(claims?: Record<string, unknown>): Promise<string>;
  writeSnapshot(snapshot: unknown): Promise<void>;
  /** Resolves with the network_flow records once more than `count` have arrived. */
  flowsAfter(count: number, n?: number): Promise<Record<string, unknown>[]>;
  close(): Promise<void>;
}

export function baseSnapshot(extra: { platform?: Record<string, unknown>; agents?: Record<string, unknown> } = {}) {
  return {
    version: 'v1',
    enclave: { id: 'enc-1', name: 'test-enclave', isolation_class: 'vm' },
    platform: extra.platform ?? {},
    orgs: { 'org-1': { config: {}, flags: {}, groups: {}, packs: [] } },
    agents: {
      'agent-1': { org_id: 'org-1', group_id: 'g-1', name: 'builder', status: 'active', contained: false, config: {} },
      'agent-s': { org_id: 'org-1', group_id: 'g-1', name: 'held', status: 'suspended', contained: false, config: {} },
      'agent-c': { org_id: 'org-1', group_id: 'g-1', name: 'boxed', status: 'active', contained: true, config: {} },
      ...extra.agents,
    },
  };
}

export async function startGatewayHarness(
  options: {
    snapshot?: unknown;
    gateway?: Partial<GatewayOptions>;
    /** Names the lookup answers itself (others go to the system resolver). */
    resolve?: Record<string, string[]>;
    /** The audit sink; `'own'`: the gateway's own (a WalSink with --audit-dsn); default: stdout lines read back. */
    audit?: AuditSink | 'own';
    /** Replaces the lookup's fallback (the system resolver) for names not in `resolve`. */
    lookup?: Lookup;
    /** Trust the harness CA for agent identity certificates (--agent-ca). */
    agentCa?: boolean;
    /** GatewayStart.retireGraceMs. */
    retireGraceMs?: number;
  } = {},
): Promise<GatewayHarness> {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-gateway-'));
  const ca = await generateCa('gateway test CA');
  const server = await issueCertificate(ca, {
    commonName: 'localhost',
    dnsNames: ['localhost'],
    ipAddresses: ['127.0.0.1'],
  });
  await writeFile(join(dir, 'server.pem'), server.certPem);
  await writeFile(join(dir, 'server-key.pem'), server.keyPem);
  const caFile = join(dir, 'ca.pem');
  await writeFile(caFile, ca.certPem);
  const issuer = await tokenIssuer();
  await writeFile(join(dir, 'jwks.json'), JSON.stringify(issuer.jwks));
  const snapshotPath = join(dir, 'snapshot.json');
  const logs: Record<string, unknown>[] = [];
  const verdicts = () =>
    logs.filter((l) => l.msg === 'policy snapshot reloaded' || /^policy snapshot reload refused/.test(String(l.msg)))
      .length;
  let listening = false;
  const writeSnapshot = async (snapshot: unknown) => {
    const before = verdicts();
    await writeFile(`${snapshotPath}.tmp`, JSON.stringify(snapshot));
    await rename(`${snapshotPath}.tmp`, snapshotPath);
    if (listening && !(await until(() => verdicts() > before)))
      throw new Error('the gateway did not reload the snapshot');
  };
  await writeSnapshot(options.snapshot ?? baseSnapshot());

  const audit: Record<string, unknown>[] = [];
  const out = new PassThrough();
  let pending = '';
  out.on('data', (chunk: Buffer) => {
    pending += chunk.toString('utf8');
    let nl = pending.indexOf('\n');
    while (nl >= 0) {
      audit.push(JSON.parse(pending.slice(0, nl)));
      pending = pending.slice(nl + 1);
      nl = pending.indexOf('\n');
    }
  });
  const lookups: string[] = [];
  const table = options.resolve ?? {};
  const lookup: Lookup = async (host) => {
    lookups.push(host);
    const fixed = table[host];
    if (fixed) return fixed.map((address) => ({ address, family: net.isIP(address) === 6 ? 6 : 4 }));
    return (options.lookup ?? systemLookup)(host);
  };
  const registry = createRegistry();
  const gw = await startGateway(
    {
      addr: '127.0.0.1:0',
      tlsCert: join(dir, 'server.pem'),
      tlsKey: join(dir, 'server-key.pem'),
      agentJwks: join(dir, 'jwks.json'),
      policySnapshot: snapshotPath,
      ...(options.agentCa ? { agentCa: caFile } : {}),
      ...options.gateway,
    },
    {
      logger: createLogger({ level: 'debug', destination: { write: (s: string) => void logs.push(JSON.parse(s)) } }),
      registry,
      audit: options.audit === 'own' ? undefined : (options.audit ?? new StdoutAuditSink(out)),
      lookup,
      ...(options.retireGraceMs !== undefined ? { retireGraceMs: options.retireGraceMs } : {}),
    },
  ).catch(async (err: unknown) => {
    await rm(dir, { recursive: true, force: true });
    throw err;
  });
  listening = true;
  const flows = () => audit.filter((r) => r.table === 'network_flow');
  return {
    dir,
    ca,
    caFile,
    issuer,
    gw,
    port: gw.port,
    proxyUrl: `https://127.0.0.1:${gw.port}`,
    registry,
    logs,
    audit,
    lookups,
    token: (claims) => issuer.mint(claims),
    writeSnapshot,
    async flowsAfter(count, n = 1) {
      if (!(await until(() => flows().length >= count + n))) throw new Error('no network_flow record arrived');
      return flows().slice(count);
    },
    async close() {
      await gw.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

export interface Destination {
  port: number;
  /** Connections accepted so far. */
  accepted: number;
  close(): Promise<void>;
}

function track(server: net.Server): { sockets: Set<net.Socket>; stats: { accepted: number } } {
  const sockets = new Set<net.Socket>();
  const stats = { accepted: 0 };
  server.on('connection', (s: net.Socket) => {
    stats.accepted++;
    sockets.add(s);
    s.on('error', () => {});
    s.once('close', () => sockets.delete(s));
  });
  return { sockets, stats };
}

async function listen(server: net.Server, sockets: Set<net.Socket>, stats: { accepted: number }): Promise<Destination> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  return {
    port: (server.address() as net.AddressInfo).port,
    get accepted() {
      return stats.accepted;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** An agent identity certificate (ECDSA P-256, client auth): CN = agent id, O = org id, OU = group id. */
export async function agentCertificate(
  ca: PemPair,
  subject: { agent: string; org: string; group?: string },
  /** When the certificate expires; five minutes from now by default. */
  notAfter: Date = new Date(Date.now() + 300_000),
): Promise<PemPair> {
  const x509 = await import('@peculiar/x509');
  const { webcrypto, createPrivateKey } = await import('node:crypto');
  const alg = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
  const caCert = new x509.X509Certificate(ca.certPem);
  const caKey = await webcrypto.subtle.importKey(
    'pkcs8',
    createPrivateKey(ca.keyPem).export({ format: 'der', type: 'pkcs8' }),
    alg,
    false,
    ['sign'],
  );
  const keys = await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify']);
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: Date.now().toString(16),
    subject: `CN=${subject.agent}, O=${subject.org}${subject.group ? `, OU=${subject.group}` : ''}`,
    issuer: caCert.subject,
    notBefore: new Date(Date.now() - 60_000),
    notAfter,
    publicKey: keys.publicKey as never,
    signingKey: caKey as never,
    signingAlgorithm: alg,
    extensions: [new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.clientAuth])],
  });
  const der = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey));
  const keyPem = `-----BEGIN PRIVATE KEY-----\n${der
    .toString('base64')
    .replace(/(.{64})/g, '$1\n')
    .replace(/\n$/, '')}\n-----END PRIVATE KEY-----\n`;
  return { certPem: `${cert.toString('pem')}\n`, keyPem };
}

/** A TCP server that echoes what it reads, and ends its side when the client ends its own. */
export async function startEcho(): Promise<Destination> {
  const server = net.createServer({ allowHalfOpen: true }, (s) => s.pipe(s));
  const { sockets, stats } = track(server);
  return listen(server, sockets, stats);
}

/** A TCP server that accepts and never sends a byte. */
export async function startSilent(): Promise<Destination> {
  const server = net.createServer(() => {});
  const { sockets, stats } = track(server);
  return listen(server, sockets, stats);
}

/** An https server (certificate of `ca`: localhost, 127.0.0.1) answering what it was asked. */
export async function startHttps(ca: PemPair): Promise<Destination> {
  const leaf = await issueCertificate(ca, {
    commonName: 'localhost',
    dnsNames: ['localhost'],
    ipAddresses: ['127.0.0.1'],
  });
  const server = https.createServer({ cert: leaf.certPem, key: leaf.keyPem }, (req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({
        hello: 'from https',
        method: req.method,
        url: req.url,
        authorization: req.headers.authorization ?? null,
        proxy_authorization: req.headers['proxy-authorization'] ?? null,
      }),
    );
  });
  const { sockets, stats } = track(server);
  return listen(server, sockets, stats);
}

export interface CurlResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs curl (the machine's), killed after `ms`. */
export function curl(args: string[], ms = 30_000): Promise<CurlResult> {
  return new Promise((resolve, reject) => {
    const child = spawn('curl', ['-sS', '--max-time', String(Math.floor(ms / 1000) - 2), ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), ms);
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** The proxy arguments of curl for this gateway: TLS to it trusting the test CA, a token when given. */
export function viaGateway(h: GatewayHarness, token?: string): string[] {
  return [
    '--proxy',
    h.proxyUrl,
    '--proxy-cacert',
    h.caFile,
    ...(token ? ['--proxy-header', `Proxy-Authorization: Bearer ${token}`] : []),
  ];
}

/**
 * A raw TLS connection to the gateway that sends `text` and collects everything the gateway sends back
 * until it closes, or `ms` passes (then `closed` is false and the connection is destroyed), or what
 * came back satisfies `done` (then the client closes it).
 */
export function rawExchange(
  h: GatewayHarness,
  text: string,
  ms = 10_000,
  tlsOptions: tls.ConnectionOptions = {},
  done?: (got: string) => boolean,
): Promise<{ closed: boolean; text: string }> {
  return new Promise((resolve, reject) => {
    const socket = tls.connect(
      { host: '127.0.0.1', port: h.port, ca: h.ca.certPem, servername: 'localhost', ...tlsOptions },
      () => socket.write(text),
    );
    let got = '';
    socket.on('data', (d: Buffer) => {
      got += d.toString('latin1');
      if (done?.(got)) socket.end();
    });
    socket.on('error', (err) => {
      if (!got) reject(err);
    });
    const timer = setTimeout(() => {
      socket.destroy();
      resolve({ closed: false, text: got });
    }, ms);
    socket.on('close', () => {
      clearTimeout(timer);
      resolve({ closed: true, text: got });
    });
  });
}

/** The answer's status line, headers and body of a raw HTTP/1.1 answer. */
export function parseAnswer(text: string): { status: number; headers: Record<string, string>; body: string } {
  const at = text.indexOf('\r\n\r\n');
  const head = at < 0 ? text : text.slice(0, at);
  const [line, ...rest] = head.split('\r\n');
  const headers: Record<string, string> = {};
  for (const l of rest) {
    const c = l.indexOf(':');
    if (c > 0) headers[l.slice(0, c).trim().toLowerCase()] = l.slice(c + 1).trim();
  }
  return {
    status: Number(/^HTTP\/1\.1 (\d{3})/.exec(line)?.[1] ?? 0),
    headers,
    body: at < 0 ? '' : text.slice(at + 4),
  };
}
