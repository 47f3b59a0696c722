import { spawnSync } from 'node:child_process';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Client } from 'undici';
import { generateCa, issueCertificate, type PemPair } from '../core/tls.ts';
import { conditions } from './conditions.ts';
import { writeAgentIdentity, writeServerTls } from './fixtures.ts';
import { sequential } from './loops.ts';
import { formatMs, table } from './measure.ts';
import { rssOf } from './proc-stats.ts';
import { accepts, freePort, NODE, type Pinned, pinned, pinSelf, ROOT, waitFor } from './processes.ts';

// npm run bench -- gateway [--quick]
//
// The gateway (`dvx serve gateway`) against the floor and two peers, in one run on one machine:
//   floor       bench/floor-connect.ts: node:net CONNECT + node:http absolute-form, nothing else
//               (plain TCP, and over TLS like ours)
//   peers       tinyproxy and squid from Debian (plain TCP listeners, no auth, no policy)
//   ours        dvx gateway over TLS: JWT in Proxy-Authorization, destination policy, DNS pinning,
//               one network_flow record per attempt (stdout); blind tunnels (--no-http-capture);
//               and with --ca-cert (TLS terminated, each request captured and inspected).
// The proxies run on core 1 (taskset), this process (client and upstreams) on core 0. Measured:
//   tunnel      a new CONNECT, TLS to the upstream through it and one GET, sequentially (p50/p99);
//               added = its p50 minus direct's (a TLS connection and one GET), and that as a ratio of
//               the TLS floor's: where a proxy does its work (a blind tunnel only copies bytes after)
//   in tunnel   GETs on one open tunnel, sequentially (p50/p99)
//   http        absolute-form GETs on a kept-alive proxy connection (p50/p99)
//   req/s       16 tunnels, GETs back to back; MB/s one 64 MB download through one tunnel; RSS after

interface Proxy {
  name: string;
  port: number;
  /** The client speaks TLS to the proxy itself. */
  tls: boolean;
  /** Proxy-Authorization value, if any. */
  auth: string | null;
  /** The upstream's TLS is terminated by the proxy: the client trusts this CA for it. */
  interceptCa: string | null;
  pid: number | null;
  stop: () => Promise<void>;
}

/** Waits until `port` accepts connections (and the process, if given, is still there). */
async function waitPort(port: number, what: string, p: Pinned | null = null, ms = 30_000): Promise<number> {
  await waitFor(() => accepts(port), what, { ms, exited: p?.exited });
  return port;
}

/** Opens a tunnel through `p` to 127.0.0.1:port and returns the raw socket after the 200. */
function openTunnel(p: Proxy, port: number, ca: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket: net.Socket = p.tls
      ? tls.connect({ host: '127.0.0.1', port: p.port, ca, servername: 'localhost' })
      : net.connect(p.port, '127.0.0.1');
    socket.once('error', reject);
    socket.once(p.tls ? 'secureConnect' : 'connect', () => {
      const auth = p.auth ? `Proxy-Authorization: ${p.auth}\r\n` : '';
      socket.write(`CONNECT 127.0.0.1:${port} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n${auth}\r\n`);
    });
    let buf = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      socket.off('data', onData);
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(buf.toString('latin1'))?.[1]);
      if (status !== 200) {
        socket.destroy();
        reject(new Error(`${p.name}: CONNECT answered ${status}`));
        return;
      }
      if (buf.length > end + 4) socket.unshift(buf.subarray(end + 4));
      resolve(socket);
    };
    socket.on('data', onData);
  });
}

/** An undici client whose one connection is a TLS session to the upstream inside a tunnel through `p`. */
function tunnelClient(p: Proxy, port: number, proxyCa: string, upstreamCa: string): Client {
  return new Client(`https://127.0.0.1:${port}`, {
    pipelining: 1,
    connect: (_opts, cb) => {
      openTunnel(p, port, proxyCa).then(
        (raw) => {
          const s = tls.connect({ socket: raw, host: '127.0.0.1', ca: p.interceptCa ?? upstreamCa });
          s.once('secureConnect', () => cb(null, s));
          s.once('error', (err) => cb(err, null));
        },
        (err) => cb(err as Error, null),
      );
    },
  });
}

async function getOn(client: Client, path: string): Promise<number> {
  const res = await client.request({ path, method: 'GET' });
  let n = 0;
  for await (const c of res.body) n += (c as Buffer).length;
  if (res.statusCode !== 200) throw new Error(`status ${res.statusCode}`);
  return n;
}

/**
 * One absolute-form GET through `p` on a kept-alive connection (node's agent, over TLS or not). A proxy
 * that answers HTTP/1.0 and closes (tinyproxy) makes a reused socket fail at once: that request is
 * sent again on a fresh one, as node's documentation advises.
 */
async function absoluteGet(p: Proxy, agent: http.Agent, port: number, ca: string): Promise<void> {
  try {
    await absoluteGetOnce(p, agent, port, ca);
  } catch (err) {
    if ((err as { reused?: boolean }).reused) await absoluteGetOnce(p, agent, port, ca);
    else throw err;
  }
}

function absoluteGetOnce(p: Proxy, agent: http.Agent, port: number, ca: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const options = {
      host: '127.0.0.1',
      port: p.port,
      method: 'GET',
      path: `http://127.0.0.1:${port}/small`,
      headers: { host: `127.0.0.1:${port}`, ...(p.auth ? { 'proxy-authorization': p.auth } : {}) },
      agent,
      ...(p.tls ? { ca, servername: 'localhost' } : {}),
    };
    const req = (p.tls ? https : http).request(options, (res) => {
      res.resume();
      res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`status ${res.statusCode}`))));
    });
    req.on('error', (err) => reject(Object.assign(err, { reused: req.reusedSocket })));
    req.end();
  });
}

export async function main(args: string[]): Promise<void> {
  const quick = args.includes('--quick');
  const n = quick ? 200 : 1000;
  const seconds = quick ? 1 : 3;
  pinSelf('0');
  const dir = await mkdtemp(join(tmpdir(), 'dvx-bench-gw-'));
  const proxies: Proxy[] = [];
  try {
    // Upstreams: https (tunnels) and http (absolute-form), on this core.
    const upstreamCa = await generateCa('bench upstream CA');
    const upstreamLeaf = await issueCertificate(upstreamCa, { commonName: '127.0.0.1', ipAddresses: ['127.0.0.1'] });
    const small = Buffer.alloc(1024, 'a');
    const chunk = Buffer.alloc(1024 * 1024, 'b');
    const handler = (req: http.IncomingMessage, res: http.ServerResponse) => {
      req.resume();
      if (req.url === '/big') {
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': 64 * chunk.length });
        let left = 64;
        const write = () => {
          while (left > 0) {
            left--;
            if (!res.write(chunk)) return void res.once('drain', write);
          }
          res.end();
        };
        write();
        return;
      }
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': small.length });
      res.end(small);
    };
    const upstreamTls = https.createServer({ cert: upstreamLeaf.certPem, key: upstreamLeaf.keyPem }, handler);
    const upstreamHttp = http.createServer(handler);
    await Promise.all(
      [upstreamTls, upstreamHttp].map((s) => new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()))),
    );
    const tlsPort = (upstreamTls.address() as net.AddressInfo).port;
    const httpPort = (upstreamHttp.address() as net.AddressInfo).port;
    await writeFile(join(dir, 'upstream-ca.pem'), upstreamCa.certPem);

    // The proxies' own TLS and the gateway's identity and interception material.
    const { ca: proxyCa } = await writeServerTls(dir, 'bench proxy CA');
    const interceptCa: PemPair = await generateCa('bench interception CA');
    await writeFile(join(dir, 'ica.pem'), interceptCa.certPem);
    await writeFile(join(dir, 'ica.key'), interceptCa.keyPem);
    const token = await (await writeAgentIdentity(dir)).token();

    // floor, plain and over TLS
    for (const overTls of [false, true]) {
      const portFile = join(dir, `floor-${overTls}.port`);
      const child = pinned([
        NODE,
        join(ROOT, 'bench/floor-connect.ts'),
        portFile,
        ...(overTls ? [join(dir, 'cert.pem'), join(dir, 'key.pem')] : []),
      ]);
      let port = 0;
      await waitFor(
        async () => (port = Number(await readFile(portFile, 'utf8'))) > 0 && (await accepts(port)),
        'the floor proxy',
        { exited: child.exited },
      );
      proxies.push({
        name: overTls ? 'floor (node:net, TLS)' : 'floor (node:net)',
        port,
        tls: overTls,
        auth: null,
        interceptCa: null,
        pid: child.pid,
        stop: child.stop,
      });
    }
    // tinyproxy
    if (spawnSync('which', ['tinyproxy']).status === 0) {
      const port = await freePort();
      await writeFile(
        join(dir, 'tinyproxy.conf'),
        `User root\nGroup root\nPort ${port}\nListen 127.0.0.1\nTimeout 600\nMaxClients 1024\nLogLevel Critical\nPidFile "${dir}/tinyproxy.pid"\nDisableViaHeader Yes\n`,
      );
      const child = pinned(['tinyproxy', '-d', '-c', join(dir, 'tinyproxy.conf')]);
      await waitPort(port, 'tinyproxy', child);
      proxies.push({
        name: 'tinyproxy 1.11',
        port,
        tls: false,
        auth: null,
        interceptCa: null,
        pid: child.pid,
        stop: child.stop,
      });
    }
    // squid
    if (spawnSync('which', ['squid']).status === 0) {
      const port = await freePort();
      await writeFile(
        join(dir, 'squid.conf'),
        [
          `http_port 127.0.0.1:${port}`,
          'http_access allow all',
          'cache deny all',
          'access_log none',
          `cache_log ${dir}/squid-cache.log`,
          `pid_filename ${dir}/squid.pid`,
          `coredump_dir ${dir}`,
          'shutdown_lifetime 0 seconds',
          'via off',
          'forwarded_for delete',
          'cache_effective_user proxy',
        ].join('\n') + '\n',
      );
      spawnSync('chown', ['-R', 'proxy', dir]);
      const child = pinned(['squid', '-N', '-f', join(dir, 'squid.conf')]);
      await waitPort(port, 'squid', child);
      proxies.push({
        name: 'squid 5.7',
        port,
        tls: false,
        auth: null,
        interceptCa: null,
        pid: child.pid,
        stop: child.stop,
      });
    }
    // ours: blind, and with interception + capture + inspection
    for (const capture of [false, true]) {
      const port = await freePort();
      const child = pinned([
        join(ROOT, 'bin/dvx'),
        'serve',
        'gateway',
        '--addr',
        `127.0.0.1:${port}`,
        '--tls-cert',
        join(dir, 'cert.pem'),
        '--tls-key',
        join(dir, 'key.pem'),
        '--agent-jwks',
        join(dir, 'jwks.json'),
        '--allow-dest',
        '127.0.0.1',
        '--upstream-ca',
        join(dir, 'upstream-ca.pem'),
        '--max-connections-per-client',
        '10000',
        '--log-level',
        'error',
        ...(capture ? ['--ca-cert', join(dir, 'ica.pem'), '--ca-key', join(dir, 'ica.key')] : ['--no-http-capture']),
      ]);
      try {
        await waitPort(port, 'dvx gateway', child, 20_000);
      } catch (err) {
        process.stderr.write(`dvx gateway did not start (${(err as Error).message}); its row is left out\n`);
        await child.stop();
        continue;
      }
      proxies.push({
        name: capture ? 'dvx gateway, capture + inspection' : 'dvx gateway (blind tunnels)',
        port,
        tls: true,
        auth: `Bearer ${token}`,
        interceptCa: capture ? interceptCa.certPem : null,
        pid: child.pid,
        stop: child.stop,
      });
    }

    // direct: the same measurements without a proxy
    const directTunnel = await sequential(n, async () => {
      const s = tls.connect({ host: '127.0.0.1', port: tlsPort, ca: upstreamCa.certPem });
      await new Promise<void>((resolve, reject) => {
        s.once('secureConnect', () => s.write('GET /small HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n'));
        s.on('data', () => {});
        s.once('end', () => resolve());
        s.once('error', reject);
      });
    });
    const direct = new Client(`https://127.0.0.1:${tlsPort}`, { connect: { ca: upstreamCa.certPem } });
    const directIn = await sequential(n, async () => void (await getOn(direct, '/small')));
    await direct.close();
    const directHttpAgent = new http.Agent({ keepAlive: true });
    const directHttp = await sequential(
      n,
      () =>
        new Promise<void>((resolve, reject) => {
          http
            .get({ host: '127.0.0.1', port: httpPort, path: '/small', agent: directHttpAgent }, (res) => {
              res.resume();
              res.on('end', () => resolve());
            })
            .on('error', reject);
        }),
    );
    directHttpAgent.destroy();

    const rows: string[][] = [
      [
        'direct (no proxy)',
        `${formatMs(directTunnel.p50)} / ${formatMs(directTunnel.p99)}`,
        `${formatMs(directIn.p50)} / ${formatMs(directIn.p99)}`,
        '—',
        `${formatMs(directHttp.p50)} / ${formatMs(directHttp.p99)}`,
        '—',
        '—',
        '—',
      ],
    ];
    let floorAdded = NaN;
    for (const p of proxies) {
      const proxyCaPem = proxyCa.certPem;
      process.stderr.write(`${p.name}: measuring\n`);
      const tunnel = await sequential(Math.round(n / 2), async () => {
        const raw = await openTunnel(p, tlsPort, proxyCaPem);
        const s = tls.connect({ socket: raw, host: '127.0.0.1', ca: p.interceptCa ?? upstreamCa.certPem });
        await new Promise<void>((resolve, reject) => {
          s.once('secureConnect', () => s.write('GET /small HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n'));
          s.on('data', () => {});
          s.once('end', () => resolve());
          s.once('close', () => resolve());
          s.once('error', reject);
        });
        raw.destroy();
      });
      const one = tunnelClient(p, tlsPort, proxyCaPem, upstreamCa.certPem);
      const inTunnel = await sequential(n, async () => void (await getOn(one, '/small')));
      // What the proxy adds where it works: opening the tunnel (a blind tunnel only copies bytes after).
      const added = tunnel.p50 - directTunnel.p50;
      if (p.name === 'floor (node:net, TLS)') floorAdded = added;
      const t0 = performance.now();
      const bytes = await getOn(one, '/big');
      const mbps = bytes / 1e6 / ((performance.now() - t0) / 1000);
      await one.close();
      const agent = p.tls ? new https.Agent({ keepAlive: true, ca: proxyCaPem }) : new http.Agent({ keepAlive: true });
      const abs = await sequential(n, () => absoluteGet(p, agent, httpPort, proxyCaPem));
      agent.destroy();
      const clients = Array.from({ length: 16 }, () => tunnelClient(p, tlsPort, proxyCaPem, upstreamCa.certPem));
      await Promise.all(clients.map((c) => getOn(c, '/small')));
      let done = 0;
      const end = performance.now() + seconds * 1000;
      const start = performance.now();
      await Promise.all(
        clients.map(async (c) => {
          while (performance.now() < end) {
            await getOn(c, '/small');
            done++;
          }
        }),
      );
      const rps = done / ((performance.now() - start) / 1000);
      await Promise.all(clients.map((c) => c.close()));
      const rss = await rssOf(p.pid);
      rows.push([
        p.name,
        `${formatMs(tunnel.p50)} / ${formatMs(tunnel.p99)}`,
        `${formatMs(inTunnel.p50)} / ${formatMs(inTunnel.p99)}`,
        `${formatMs(added)}${Number.isFinite(floorAdded) && p.tls ? ` (${(added / floorAdded).toFixed(2)}×)` : ''}`,
        `${formatMs(abs.p50)} / ${formatMs(abs.p99)}`,
        rps.toFixed(0),
        mbps.toFixed(0),
        rss ? `${Math.round(rss / 1024 / 1024)} MB` : '—',
      ]);
      process.stderr.write(`${p.name}: done\n`);
    }
    process.stdout.write(
      `\n${table(
        [
          'proxy',
          'new tunnel + GET p50 / p99',
          'GET in a tunnel p50 / p99',
          'tunnel added p50 (× floor TLS)',
          'absolute-form GET p50 / p99',
          'req/s (16 tunnels)',
          'MB/s (one tunnel)',
          'RSS after',
        ],
        rows,
      )}\n\n${conditions(
        `${n} sequential requests per latency column, ${seconds} s of load; 1 KB answers; 64 MB download; the floor over TLS and dvx listen over TLS, the others over plain TCP; dvx checks a JWT, the destination policy and records a network_flow per tunnel and per request (stdout)`,
        'proxies on core 1, client and upstreams on core 0 (taskset)',
      )}\n`,
    );
    await new Promise<void>((r) => upstreamTls.close(() => r()));
    upstreamTls.closeAllConnections();
    upstreamHttp.close();
    upstreamHttp.closeAllConnections();
  } finally {
    await Promise.all(proxies.map((p) => p.stop()));
    await rm(dir, { recursive: true, force: true });
  }
}
