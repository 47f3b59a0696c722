import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { writeFile } from 'node:fs/promises';
import https from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { join } from 'node:path';
import { generateCa, issueCertificate, type PemPair } from '../../../core/tls.ts';
import { until } from '../../fixtures/eventually.ts';
import { DVX_BIN } from '../../fixtures/run-dvx.ts';

// What the end-to-end tests of the gateway in an enclave share (e2e-enclave-*.test.ts): an interception
// CA written where the gateway reads it, a real https destination that records what reached it, and a
// dvx server run as an operator runs it (the real binary, a child process).

export interface InterceptionCa {
  ca: PemPair;
  certFile: string;
  keyFile: string;
}

/** An interception CA (ECDSA P-256) as --ca-cert / --ca-key files in `dir`. */
export async function interceptionCa(dir: string): Promise<InterceptionCa> {
  const ca = await generateCa('dvx e2e interception CA');
  const certFile = join(dir, 'interception-ca.pem');
  const keyFile = join(dir, 'interception-ca-key.pem');
  await writeFile(certFile, ca.certPem);
  await writeFile(keyFile, ca.keyPem, { mode: 0o600 });
  return { ca, certFile, keyFile };
}

export interface Received {
  url: string;
  method: string;
  /** Every Authorization header line the destination got, as sent. */
  authorizations: string[];
  headers: Record<string, string | string[] | undefined>;
}

/**
 * A real https server (a certificate of `ca` for `names`) recording every request and every
 * connection. It answers JSON saying what it got without the credential itself: the SHA-256 of the
 * Authorization it received and how many it received. `/echo` answers the Authorization as it came
 * (a destination that hands a credential back).
 */
export interface Destination {
  port: number;
  received: Received[];
  connections: number;
  close(): Promise<void>;
}

export const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');

/** The destinations' CA, written as the gateway's --upstream-ca file in `dir`. */
export async function destinationCa(dir: string): Promise<{ ca: PemPair; file: string }> {
  const ca = await generateCa('e2e destinations CA');
  const file = join(dir, 'destinations-ca.pem');
  await writeFile(file, ca.certPem);
  return { ca, file };
}

export async function startDestination(ca: PemPair, names: string[]): Promise<Destination> {
  const leaf = await issueCertificate(ca, { commonName: names[0], dnsNames: names, ipAddresses: ['127.0.0.1'] });
  const received: Received[] = [];
  const sockets = new Set<Socket>();
  let connections = 0;
  const server = https.createServer({ cert: leaf.certPem, key: leaf.keyPem }, (req, res) => {
    const authorizations: string[] = [];
    for (let i = 0; i < req.rawHeaders.length; i += 2)
      if (req.rawHeaders[i].toLowerCase() === 'authorization') authorizations.push(req.rawHeaders[i + 1]);
    received.push({ url: req.url ?? '', method: req.method ?? '', authorizations, headers: req.headers });
    req.resume();
    req.on('end', () => {
      if (req.url === '/echo') {
        res.writeHead(200, { 'content-type': 'text/plain' }).end(`you sent ${authorizations.join(', ')}`);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(
        JSON.stringify({
          url: req.url,
          authorization_count: authorizations.length,
          authorization_sha256: authorizations.map(sha256),
        }),
      );
    });
  });
  server.on('secureConnection', (s: Socket) => {
    connections++;
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as AddressInfo).port,
    received,
    get connections() {
      return connections;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

export interface DvxChild {
  child: ChildProcessWithoutNullStreams;
  /** Its JSON log lines (stdout), parsed. */
  lines: Record<string, unknown>[];
  /** The line that said it was ready. */
  ready: Record<string, unknown>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** SIGTERM (SIGKILL after 15 s): the exit. */
  stop(): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * `bin/dvx ARGS` (no DVX_* variable of this process leaks into it), resolved once it logs `readyMsg`;
 * refused (and killed) when it exits or stays silent for 30 s. The caller stops it (t.teardown).
 */
export async function startDvx(args: string[], readyMsg: string): Promise<DvxChild> {
  const env: Record<string, string | undefined> = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith('DVX_')) delete env[k];
  const child = spawn(DVX_BIN, args, { env, stdio: ['pipe', 'pipe', 'pipe'] });
  const lines: Record<string, unknown>[] = [];
  let pending = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => {
    pending += d.toString('utf8');
    let nl = pending.indexOf('\n');
    while (nl >= 0) {
      lines.push(JSON.parse(pending.slice(0, nl)));
      pending = pending.slice(nl + 1);
      nl = pending.indexOf('\n');
    }
  });
  child.stderr.on('data', (d: Buffer) => (stderr += d));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    const end = await exited;
    clearTimeout(timer);
    return end;
  };
  const up = await until(() => lines.some((l) => l.msg === readyMsg) || child.exitCode !== null, 30_000);
  const ready = lines.find((l) => l.msg === readyMsg);
  if (!up || !ready) {
    child.kill('SIGKILL');
    await exited;
    throw new Error(`dvx ${args.slice(0, 2).join(' ')} did not start: ${stderr}`);
  }
  return { child, lines, ready, exited, stop };
}
