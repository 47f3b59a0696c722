import t from 'tap';
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net, { type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { promisify } from 'node:util';
import { X509Certificate } from 'node:crypto';
import { generateCa, issueCertificate } from '../../../core/tls.ts';
import { LEAF_LIFETIME_MS, LeafIssuer, RENEW_BEFORE_MS } from '../../../proxy/egress/leaf-issuer.ts';

// The interception leaves: one per name, the right SAN, signed by the CA, cached (LRU, one mint for
// concurrent asks), renewed before expiry; a CA that cannot mint them refuses the start.

t.setTimeout(60_000);
const dir = await mkdtemp(join(tmpdir(), 'dvx-leaf-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const ca = await generateCa('leaf test CA');
await writeFile(join(dir, 'ca.pem'), ca.certPem);
await writeFile(join(dir, 'ca-key.pem'), ca.keyPem);

/** The certificate a TLS server presenting `issuer`'s leaves gives a client asking for `servername`. */
async function presented(issuer: LeafIssuer, host: string, servername?: string): Promise<X509Certificate> {
  const context = await issuer.context(host);
  // A server-side TLSSocket as the interceptor makes one: a client without SNI gets the default context.
  const server = net.createServer((socket) => {
    const tlsSocket = new tls.TLSSocket(socket, { isServer: true, secureContext: context });
    tlsSocket.on('error', () => socket.destroy());
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  try {
    const socket = tls.connect({
      port: (server.address() as AddressInfo).port,
      host: '127.0.0.1',
      servername,
      ca: ca.certPem,
      checkServerIdentity: (_h, cert) => tls.checkServerIdentity(host, cert),
    });
    await once(socket, 'secureConnect');
    const cert = socket.getPeerX509Certificate()!;
    socket.destroy();
    return cert;
  } finally {
    server.close();
  }
}

t.test('a leaf per name: DNS SAN for a name, IP SAN for an IP literal, signed by the CA, 24 h', async (t) => {
  const issuer = await LeafIssuer.load(join(dir, 'ca.pem'), join(dir, 'ca-key.pem'));
  const named = await presented(issuer, 'api.example.com', 'api.example.com');
  t.equal(named.subjectAltName, 'DNS:api.example.com');
  t.ok(named.checkIssued(new X509Certificate(ca.certPem)), 'issued by the interception CA');
  t.ok(named.verify(new X509Certificate(ca.certPem).publicKey), 'its signature verifies');
  const lifetime = new Date(named.validTo).getTime() - new Date(named.validFrom).getTime();
  t.ok(lifetime > LEAF_LIFETIME_MS && lifetime <= LEAF_LIFETIME_MS + 180_000, 'lives a day');
  const ip = await presented(issuer, '10.1.2.3');
  t.equal(ip.subjectAltName, 'IP Address:10.1.2.3');
  const v6 = await presented(issuer, '::1');
  t.equal(v6.subjectAltName, 'IP Address:0:0:0:0:0:0:0:1', 'an IPv6 literal gets an IP SAN');
});

t.test('cached: a name is minted once, concurrent asks share the mint, another name mints its own', async (t) => {
  const issuer = new LeafIssuer(ca);
  const [a, b, c] = await Promise.all([issuer.context('a.test'), issuer.context('a.test'), issuer.context('a.test')]);
  t.equal(issuer.minted, 1, 'one mint for three concurrent asks');
  t.equal(a, b);
  t.equal(b, c);
  t.equal(await issuer.context('a.test'), a, 'a later ask hits the cache');
  await issuer.context('b.test');
  t.equal(issuer.minted, 2);
});

t.test('bounded: the least recently used name is evicted past the bound', async (t) => {
  const issuer = new LeafIssuer(ca, { maxLeaves: 2 });
  const a = await issuer.context('a.test');
  await issuer.context('b.test');
  t.equal(await issuer.context('a.test'), a, 'a is used again: b is now the oldest');
  await issuer.context('c.test');
  t.equal(issuer.size, 2);
  t.equal(await issuer.context('a.test'), a, 'a stayed');
  t.equal(issuer.minted, 3);
  await issuer.context('b.test');
  t.equal(issuer.minted, 4, 'b was evicted and is minted again');
});

t.test('renewed before it expires', async (t) => {
  let now = Date.now();
  const issuer = new LeafIssuer(ca, { now: () => now });
  const first = await issuer.context('a.test');
  now += LEAF_LIFETIME_MS - RENEW_BEFORE_MS - 1000;
  t.equal(await issuer.context('a.test'), first, 'still in its life');
  now += 2000;
  t.not(await issuer.context('a.test'), first, 'within the renewal margin: a new leaf');
  t.equal(issuer.minted, 2);
});

t.test('a CA that cannot mint leaves refuses the start, naming the file and never the key', async (t) => {
  const leaf = await issueCertificate(ca, { commonName: 'not-a-ca' });
  await writeFile(join(dir, 'leaf.pem'), leaf.certPem);
  await writeFile(join(dir, 'leaf-key.pem'), leaf.keyPem);
  const notCa = await LeafIssuer.load(join(dir, 'leaf.pem'), join(dir, 'leaf-key.pem')).catch((e: Error) => e);
  t.match(notCa, { code: 'DVX_GATEWAY_OPTIONS', message: /is not a CA certificate/ });

  const other = await generateCa('other');
  await writeFile(join(dir, 'other-key.pem'), other.keyPem);
  const mismatch = await LeafIssuer.load(join(dir, 'ca.pem'), join(dir, 'other-key.pem')).catch((e: Error) => e);
  t.match(mismatch, { code: 'DVX_TLS_CONFIG', message: /does not match/ });
  t.notMatch(String((mismatch as Error).message), /PRIVATE KEY/);

  // An RSA CA (openssl's default shape): the leaves are signed ECDSA P-256, so it is refused at the start.
  await promisify(execFile)('openssl', [
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-subj',
    '/CN=rsa ca',
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-keyout',
    join(dir, 'rsa-key.pem'),
    '-out',
    join(dir, 'rsa.pem'),
    '-days',
    '2',
  ]);
  const rsa = await LeafIssuer.load(join(dir, 'rsa.pem'), join(dir, 'rsa-key.pem')).catch((e: Error) => e);
  t.match(rsa, { code: 'DVX_GATEWAY_OPTIONS', message: /ECDSA P-256/ });
  t.notMatch(String((rsa as Error).message), /BEGIN/);
});
