import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateCa, issueCertificate, type PemPair } from '../../../core/tls.ts';
import { tokenIssuer, type TokenIssuer } from '../../fixtures/agent-identity.ts';
import { startDvxServer, type DvxServer } from '../../fixtures/dvx-server.ts';
import { until } from '../../fixtures/eventually.ts';
import { gatewayKey } from '../../fixtures/gateway-key.ts';
import { startLlmUpstream, type LlmUpstream } from '../../fixtures/llm-upstream.ts';
import { AGENT_SECRET, PLATFORM_KEY } from '../../fixtures/llmproxy-harness.ts';
import { curl, type CurlResult } from './gateway-harness.ts';

// The gateway and llmproxy as an operator runs them (docs/gateway.md): `bin/dvx serve llmproxy
// --gateway-key <public>` and `bin/dvx serve gateway … --llmproxy-addr --gateway-key <private>` in child
// processes, their records read from their stdout, and real curl as the agent. Around them, on
// loopback: an https upstream and a plain http one that echo what they got, and the node:http
// provider upstream llmproxy answers from (--upstream-default).

export interface Echo {
  port: number;
  /** Requests received: method, url, body. */
  seen: { method: string; url: string; body: string; headers: http.IncomingHttpHeaders }[];
}

export interface CliWorld {
  dir: string;
  file(name: string): string;
  /** The CA of the gateway's and llmproxy's listeners and of the https upstream (the agent trusts it). */
  ca: PemPair;
  /** The interception CA (--ca-cert/--ca-key): curl's --cacert for intercepted tunnels. */
  interceptCaFile: string;
  issuer: TokenIssuer;
  token(claims?: Record<string, unknown>): Promise<string>;
  secureEcho: Echo;
  plainEcho: Echo;
  llmUpstream: LlmUpstream;
  /** `dvx serve llmproxy`, started on first use. */
  llmproxy(): Promise<DvxServer>;
  /** `dvx serve gateway` with the base flags and `extra`; stopped at close(). */
  gateway(extra: string[]): Promise<DvxServer>;
  /** curl through `gw` (TLS to it trusting `ca`), with `Proxy-Authorization: Bearer <token>` unless null. */
  curlVia(gw: DvxServer, token: string | null, args: string[]): Promise<CurlResult>;
  /** Waits for `gw`'s network_flow records until `check` holds; throws past 20 s. */
  flowsUntil(gw: DvxServer, check: (flows: Record<string, unknown>[]) => boolean): Promise<Record<string, unknown>[]>;
  close(): Promise<void>;
}

/** The snapshot both read: org-1 inspects content (secrets, API keys block); agent-1 active, agent-s suspended. */
export function cliSnapshot(): Record<string, unknown> {
  return {
    version: 'v1',
    enclave: { id: 'enc-cli', name: 'cli-enclave', isolation_class: 'vm' },
    platform: {},
    orgs: {
      'org-1': {
        config: {
          content_inspection: {
            value: {
              secrets_filter: { enabled: true },
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
      'agent-s': { org_id: 'org-1', group_id: 'g-1', name: 'held', status: 'suspended', contained: false, config: {} },
    },
  };
}

function echoHandler(seen: Echo['seen']) {
  return (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      seen.push({ method: req.method ?? '', url: req.url ?? '', body, headers: req.headers });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ echo: true, method: req.method, url: req.url, body }));
    });
  };
}

async function listen(server: http.Server): Promise<{ port: number; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

export async function startCliWorld(): Promise<CliWorld> {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-e2e-cli-'));
  const file = (name: string) => join(dir, name);
  const closers: (() => Promise<unknown>)[] = [];
  const close = async () => {
    for (const c of closers.reverse()) await c().catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  };
  try {
    const ca = await generateCa('e2e cli CA');
    const leaf = await issueCertificate(ca, {
      commonName: 'localhost',
      dnsNames: ['localhost'],
      ipAddresses: ['127.0.0.1'],
    });
    await writeFile(file('ca.pem'), ca.certPem);
    await writeFile(file('cert.pem'), leaf.certPem);
    await writeFile(file('key.pem'), leaf.keyPem, { mode: 0o600 });
    const interceptCa = await generateCa('e2e cli interception CA');
    await writeFile(file('intercept-ca.pem'), interceptCa.certPem);
    await writeFile(file('intercept-ca-key.pem'), interceptCa.keyPem, { mode: 0o600 });
    const issuer = await tokenIssuer();
    await writeFile(file('jwks.json'), JSON.stringify(issuer.jwks));
    await writeFile(file('snapshot.json'), JSON.stringify(cliSnapshot()));
    await writeFile(
      file('secrets.json'),
      JSON.stringify({ 'agent:agent-1': { 'agent:llmproxy.llm.api_key': PLATFORM_KEY, db_password: AGENT_SECRET } }),
    );
    const key = await gatewayKey(dir);

    const secureSeen: Echo['seen'] = [];
    const secure = await listen(https.createServer({ cert: leaf.certPem, key: leaf.keyPem }, echoHandler(secureSeen)));
    closers.push(secure.close);
    const plainSeen: Echo['seen'] = [];
    const plain = await listen(http.createServer(echoHandler(plainSeen)));
    closers.push(plain.close);
    const llmUpstream = await startLlmUpstream();
    closers.push(() => llmUpstream.close());

    const common = ['--tls-cert', file('cert.pem'), '--tls-key', file('key.pem'), '--agent-jwks', file('jwks.json')];
    const common2 = ['--policy-snapshot', file('snapshot.json'), '--secrets-file', file('secrets.json')];
    let llmproxy: Promise<DvxServer> | null = null;
    const world: CliWorld = {
      dir,
      file,
      ca,
      interceptCaFile: file('intercept-ca.pem'),
      issuer,
      token: (claims) => issuer.mint(claims),
      secureEcho: { port: secure.port, seen: secureSeen },
      plainEcho: { port: plain.port, seen: plainSeen },
      llmUpstream,
      llmproxy: () =>
        (llmproxy ??= (async () => {
          const server = await startDvxServer(
            [
              'serve',
              'llmproxy',
              '--addr',
              '127.0.0.1:0',
              ...common,
              ...common2,
              '--gateway-key',
              key.publicPath,
              '--upstream-default',
              llmUpstream.url,
            ],
            'llmproxy listening',
          );
          closers.push(() => server.stop());
          return server;
        })()),
      async gateway(extra) {
        const server = await startDvxServer(
          [
            'serve',
            'gateway',
            '--addr',
            '127.0.0.1:0',
            ...common,
            ...common2,
            '--upstream-ca',
            file('ca.pem'),
            '--deny-dest',
            'host=blocked.test,reason=no exfiltration, ever',
            ...extra,
          ],
          'gateway listening',
        );
        closers.push(() => server.stop());
        return server;
      },
      curlVia: (gw, token, args) =>
        curl([
          '--proxy',
          `https://127.0.0.1:${gw.port}`,
          '--proxy-cacert',
          file('ca.pem'),
          ...(token === null ? [] : ['--proxy-header', `Proxy-Authorization: Bearer ${token}`]),
          ...args,
        ]),
      async flowsUntil(gw, check) {
        if (!(await until(() => check(gw.records('network_flow')))))
          throw new Error(
            `the expected network_flow records did not arrive: ${JSON.stringify(gw.records('network_flow'))}`,
          );
        return gw.records('network_flow');
      },
      close,
    };
    return world;
  } catch (err) {
    await close();
    throw err;
  }
}

/** The gateway flags of an intercepting gateway routing the LLM hosts to `llmproxy`. */
export function interceptFlags(world: CliWorld, llmproxy: DvxServer | null): string[] {
  return [
    '--ca-cert',
    world.interceptCaFile,
    '--ca-key',
    world.file('intercept-ca-key.pem'),
    ...(llmproxy
      ? ['--llmproxy-addr', `https://127.0.0.1:${llmproxy.port}`, '--gateway-key', world.file('gateway-key.pem')]
      : []),
  ];
}
