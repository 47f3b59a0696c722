import 'reflect-metadata';
import t from 'tap';
import { createPrivateKey, webcrypto, X509Certificate } from 'node:crypto';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { once } from 'node:events';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls, { type TLSSocket } from 'node:tls';
import * as x509 from '@peculiar/x509';
import { generateCa, issueCertificate } from '../../../core/tls.ts';
import { EnclaveCa } from '../../../enclave/broker/identity/enclave-ca.ts';
import { CsrInvalidError, EnclaveCaError } from '../../../enclave/errors.ts';
import { certificateIdentity, type AgentIdentity } from '../../../proxy/llm/auth.ts';
import { tlsDir } from '../../fixtures/tls-dir.ts';

// The enclave CA: made on the first start (key 0600), loaded after, refused when half there or
// mismatched; agents' CSRs signed into 5-minute client certificates that llmproxy's certificate reader
// accepts over a real mTLS handshake, the CSR's own subject ignored, bad CSRs refused.

const P256 = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
const dir = await mkdtemp(join(tmpdir(), 'dvx-enclave-ca-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));

async function agentKeys(alg: { name: string; namedCurve?: string; hash?: string } = P256) {
  const params =
    alg.name === 'RSASSA-PKCS1-v1_5'
      ? { name: alg.name, modulusLength: 2048, publicExponent: new Uint8Array([1, 0, 1]), hash: 'SHA-256' }
      : alg;
  const keys = (await webcrypto.subtle.generateKey(params as never, true, [
    'sign',
    'verify',
  ])) as webcrypto.CryptoKeyPair;
  const der = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey));
  const keyPem = createPrivateKey({ key: der, format: 'der', type: 'pkcs8' }).export({ format: 'pem', type: 'pkcs8' });
  return { keys, keyPem: String(keyPem) };
}

async function csrOf(keys: webcrypto.CryptoKeyPair, alg: object = P256, name = 'CN=evil, O=other-org, OU=admins') {
  const csr = await x509.Pkcs10CertificateRequestGenerator.create({
    name,
    keys: keys as never,
    signingAlgorithm: alg as never,
  });
  return csr.toString('pem');
}

t.test('made on the first start, loaded after', async (t) => {
  const paths = { cert: join(dir, 'a', 'enclave-ca.pem'), key: join(dir, 'a', 'enclave-ca.key') };
  const made = await EnclaveCa.load(paths);
  t.equal(made.generated, true);
  t.equal((await stat(paths.key)).mode & 0o777, 0o600, 'the key is 0600');
  const cert = new X509Certificate(await readFile(paths.cert));
  t.equal(cert.ca, true, 'a CA certificate');
  t.ok(cert.checkPrivateKey(createPrivateKey(await readFile(paths.key))), 'key and certificate match');
  const again = await EnclaveCa.load(paths);
  t.equal(again.generated, false, 'loaded, not made again');
  t.equal(again.certPem, made.certPem);
});

t.test('refuses half a pair, a mismatch, non-PEM, a leaf', async (t) => {
  const ca = await generateCa('one');
  const other = await generateCa('two');
  const leaf = await issueCertificate(ca, { commonName: 'leaf' });
  const pair = async (name: string, cert?: string, key?: string) => {
    const p = { cert: join(dir, `${name}.pem`), key: join(dir, `${name}.key`) };
    if (cert !== undefined) await writeFile(p.cert, cert);
    if (key !== undefined) await writeFile(p.key, key, { mode: 0o600 });
    return p;
  };
  const refused = async (p: { cert: string; key: string }, why: RegExp, what: string) => {
    const err = await EnclaveCa.load(p).catch((e: unknown) => e);
    t.type(err, EnclaveCaError, what);
    t.match((err as Error).message, why, what);
  };
  await refused(
    await pair('only-cert', ca.certPem),
    /only-cert\.pem exists but .*only-cert\.key does not/,
    'cert alone',
  );
  await refused(await pair('only-key', undefined, ca.keyPem), /only-key\.key exists but/, 'key alone');
  await refused(await pair('mismatch', ca.certPem, other.keyPem), /does not match/, 'mismatch');
  await refused(await pair('garbage', 'hello', ca.keyPem), /not a PEM certificate/, 'not PEM');
  await refused(await pair('garbage-key', ca.certPem, 'hello'), /not a PEM private key/, 'key not PEM');
  await refused(await pair('leaf', leaf.certPem, leaf.keyPem), /not a CA/, 'a leaf certificate');
  t.ok(await EnclaveCa.load(await pair('ok', ca.certPem, ca.keyPem)), 'a given pair loads');
});

t.test('signs a CSR into the identity certificate llmproxy reads, over real mTLS', async (t) => {
  const ca = await EnclaveCa.load({ cert: join(dir, 'b', 'ca.pem'), key: join(dir, 'b', 'ca.key') });
  const now = Date.now();
  const agent = await agentKeys();
  const pem = await ca.signCsr(await csrOf(agent.keys), { agentId: 'bot-1', orgId: 'org-a', groupId: 'ops' }, now);
  const cert = new X509Certificate(pem);
  t.equal(cert.subject, 'CN=bot-1\nO=org-a\nOU=ops', "the broker's subject, not the CSR's");
  t.ok(cert.verify(new X509Certificate(ca.certPem).publicKey), 'signed by the enclave CA');
  const life = new Date(cert.validTo).getTime() - now;
  t.ok(life <= 5 * 60_000 && life > 5 * 60_000 - 2000, 'valid for 5 minutes');
  t.same(cert.keyUsage, ['1.3.6.1.5.5.7.3.2'], 'clientAuth only');
  t.equal(cert.ca, false);
  t.equal(cert.publicKey.asymmetricKeyDetails?.namedCurve, 'prime256v1', "the CSR's P-256 key");

  const server = await tlsDir('dvx-enclave-ca-server-');
  t.teardown(() => server.remove());
  const handshake = async (certPem: string, keyPem: string) => {
    const srv = tls.createServer({
      cert: await readFile(server.cert),
      key: await readFile(server.key),
      ca: ca.certPem,
      requestCert: true,
      rejectUnauthorized: false,
    });
    const seen = new Promise<AgentIdentity | null>((resolve) =>
      srv.on('secureConnection', (socket: TLSSocket) => {
        resolve(certificateIdentity(socket));
        socket.end();
      }),
    );
    srv.listen(0, '127.0.0.1');
    await once(srv, 'listening');
    const port = (srv.address() as { port: number }).port;
    const client = tls.connect({ host: '127.0.0.1', port, ca: server.ca.certPem, cert: certPem, key: keyPem });
    client.on('error', () => {}); // the server ends the connection once it has read the certificate
    client.resume();
    const identity = await seen;
    client.destroy();
    srv.close();
    return identity;
  };
  t.match(await handshake(pem, agent.keyPem), { agentId: 'bot-1', orgId: 'org-a', groupId: 'ops', via: 'mtls' });

  const noGroup = await ca.signCsr(await csrOf(agent.keys), { agentId: 'bot-2', orgId: 'org-a', groupId: null }, now);
  t.match(await handshake(noGroup, agent.keyPem), { agentId: 'bot-2', orgId: 'org-a', groupId: null });

  // A certificate of the same shape from another CA is not an identity.
  const stranger = await generateCa('stranger');
  const forged = await issueCertificate(stranger, { commonName: 'bot-1', usage: 'client' });
  t.equal(await handshake(forged.certPem, forged.keyPem), null, "another CA's certificate is refused");
});

t.test('refuses CSRs that do not parse, do not verify, or are not P-256', async (t) => {
  const ca = await EnclaveCa.load({ cert: join(dir, 'c', 'ca.pem'), key: join(dir, 'c', 'ca.key') });
  const who = { agentId: 'bot-1', orgId: 'org-a', groupId: 'ops' };
  const refused = async (csr: unknown, why: RegExp, what: string) => {
    const err = await ca.signCsr(csr, who, Date.now()).catch((e: unknown) => e);
    t.type(err, CsrInvalidError, what);
    t.match((err as Error).message, why, what);
  };
  await refused('hello', /not one PEM/, 'garbage');
  await refused(42, /not one PEM/, 'not a string');
  await refused(ca.certPem, /not one PEM/, 'a certificate, not a request');
  await refused(
    '-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n',
    /does not parse/,
    'PEM of nothing',
  );
  await refused(
    `-----BEGIN CERTIFICATE REQUEST-----\n${'A'.repeat(20_000)}\n-----END CERTIFICATE REQUEST-----\n`,
    /not one PEM/,
    'huge',
  );

  const good = await csrOf((await agentKeys()).keys);
  const der = Buffer.from(good.replace(/-----[^-]+-----|\s/g, ''), 'base64');
  der[der.length - 1] ^= 0x01;
  const tampered = `-----BEGIN CERTIFICATE REQUEST-----\n${der.toString('base64')}\n-----END CERTIFICATE REQUEST-----\n`;
  await refused(tampered, /signature does not verify|does not parse/, 'a tampered signature');

  const p384 = { name: 'ECDSA', namedCurve: 'P-384', hash: 'SHA-384' };
  await refused(await csrOf((await agentKeys(p384)).keys, p384), /P-256/, 'a P-384 key');
  const rsa = { name: 'RSASSA-PKCS1-v1_5', hash: 'SHA-256' };
  await refused(await csrOf((await agentKeys(rsa)).keys, rsa), /P-256/, 'an RSA key');

  await t.rejects(
    ca.signCsr(good, { agentId: 'bot\nO=org-b', orgId: 'org-a', groupId: null }, Date.now()),
    CsrInvalidError,
    'an identity that would forge the subject is refused',
  );
  t.ok(await ca.signCsr(good, who, Date.now()), 'the untampered CSR signs');
});
