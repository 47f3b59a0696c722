import 'reflect-metadata';
import { readFile, writeFile, mkdir, access } from 'node:fs/promises';
import { join } from 'node:path';
import { webcrypto, X509Certificate, createPrivateKey } from 'node:crypto';
import * as x509 from '@peculiar/x509';
import { TlsConfigError } from './errors.ts';

// Server components are TLS-only (spec: Server components). This file loads PEM material with errors
// that name the file, and mints a local development CA plus leaf certificates (ECDSA P-256) for
// `dvx dev` and for tests, which run over real TLS.
x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

type CryptoKey = webcrypto.CryptoKey;
type CryptoKeyPair = webcrypto.CryptoKeyPair;

const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;

export interface TlsMaterial {
  cert: Buffer;
  key: Buffer;
  ca?: Buffer;
}

export interface PemPair {
  certPem: string;
  keyPem: string;
}

async function readPem(path: string, what: string): Promise<Buffer> {
  let data: Buffer;
  try {
    data = await readFile(path);
  } catch (err) {
    throw new TlsConfigError(
      `cannot read ${what} ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
    );
  }
  if (!data.includes('-----BEGIN ')) throw new TlsConfigError(`${what} ${path} is not PEM`);
  return data;
}

/** Loads and checks `--tls-cert`/`--tls-key` (and an optional CA bundle). */
export async function loadTls(paths: { cert?: string; key?: string; ca?: string }): Promise<TlsMaterial> {
  if (!paths.cert || !paths.key)
    throw new TlsConfigError('--tls-cert and --tls-key are required (server components are TLS-only)');
  const cert = await readPem(paths.cert, 'certificate');
  const key = await readPem(paths.key, 'private key');
  try {
    const parsed = new X509Certificate(cert);
    if (!parsed.checkPrivateKey(createPrivateKey(key)))
      throw new TlsConfigError(`private key ${paths.key} does not match certificate ${paths.cert}`);
  } catch (err) {
    if (err instanceof TlsConfigError) throw err;
    throw new TlsConfigError(`invalid TLS material (${paths.cert}, ${paths.key}): ${(err as Error).message}`);
  }
  const material: TlsMaterial = { cert, key };
  if (paths.ca) material.ca = await readPem(paths.ca, 'CA bundle');
  return material;
}

async function exportKeyPem(key: CryptoKey): Promise<string> {
  const der = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', key));
  return `-----BEGIN PRIVATE KEY-----\n${der
    .toString('base64')
    .replace(/(.{64})/g, '$1\n')
    .replace(/\n?$/, '\n')}-----END PRIVATE KEY-----\n`;
}

function serial(): string {
  const bytes = webcrypto.getRandomValues(new Uint8Array(16));
  bytes[0] &= 0x7f;
  return Buffer.from(bytes).toString('hex');
}

export async function generateCa(commonName = 'dvx development CA', days = 3650): Promise<PemPair> {
  const keys = (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as unknown as CryptoKeyPair;
  const notBefore = new Date(Date.now() - 60_000);
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: `CN=${commonName}`,
    notBefore,
    notAfter: new Date(notBefore.getTime() + days * 86_400_000),
    keys: keys as never,
    signingAlgorithm: ALG,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey as never),
    ],
  });
  return { certPem: cert.toString('pem') + '\n', keyPem: await exportKeyPem(keys.privateKey) };
}

export interface LeafOptions {
  commonName: string;
  dnsNames?: string[];
  ipAddresses?: string[];
  /** Extended key usage: server (default), client, or both. */
  usage?: 'server' | 'client' | 'both';
  days?: number;
  /** Lifetime in milliseconds; wins over `days` (agent identity certificates live 5 minutes). */
  lifetimeMs?: number;
}

export async function issueCertificate(ca: PemPair, options: LeafOptions): Promise<PemPair> {
  const caCert = new x509.X509Certificate(ca.certPem);
  const caKeyDer = createPrivateKey(ca.keyPem).export({ format: 'der', type: 'pkcs8' });
  const caKey = await webcrypto.subtle.importKey('pkcs8', caKeyDer, ALG, false, ['sign']);
  const keys = (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as unknown as CryptoKeyPair;
  const notBefore = new Date(Date.now() - 60_000);
  const lifetime = options.lifetimeMs ?? (options.days ?? 825) * 86_400_000;
  const usage = options.usage ?? 'server';
  const eku: string[] = [];
  if (usage !== 'client') eku.push(x509.ExtendedKeyUsage.serverAuth);
  if (usage !== 'server') eku.push(x509.ExtendedKeyUsage.clientAuth);
  const altNames: x509.JsonGeneralName[] = [
    ...(options.dnsNames ?? []).map((value) => ({ type: 'dns' as const, value })),
    ...(options.ipAddresses ?? []).map((value) => ({ type: 'ip' as const, value })),
  ];
  const extensions: x509.Extension[] = [
    new x509.BasicConstraintsExtension(false, undefined, true),
    new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyAgreement, true),
    new x509.ExtendedKeyUsageExtension(eku, false),
    await x509.AuthorityKeyIdentifierExtension.create(caCert, false),
  ];
  if (altNames.length > 0) extensions.push(new x509.SubjectAlternativeNameExtension(altNames, false));
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    subject: `CN=${options.commonName}`,
    issuer: caCert.subject,
    notBefore,
    notAfter: new Date(notBefore.getTime() + 60_000 + lifetime),
    publicKey: keys.publicKey as never,
    signingKey: caKey as never,
    signingAlgorithm: ALG,
    extensions,
  });
  return { certPem: cert.toString('pem') + '\n', keyPem: await exportKeyPem(keys.privateKey) };
}

export interface DevCertPaths {
  caCert: string;
  caKey: string;
  serverCert: string;
  serverKey: string;
}

/** `dvx dev`: a local CA and a localhost server certificate, created on first run and reused after. */
export async function ensureDevCertificates(dir: string): Promise<DevCertPaths> {
  const paths: DevCertPaths = {
    caCert: join(dir, 'ca.pem'),
    caKey: join(dir, 'ca-key.pem'),
    serverCert: join(dir, 'server.pem'),
    serverKey: join(dir, 'server-key.pem'),
  };
  const exists = async (p: string) =>
    access(p).then(
      () => true,
      () => false,
    );
  if ((await Promise.all(Object.values(paths).map(exists))).every(Boolean)) return paths;
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const ca = await generateCa();
  const server = await issueCertificate(ca, {
    commonName: 'localhost',
    dnsNames: ['localhost'],
    ipAddresses: ['127.0.0.1', '::1'],
  });
  await writeFile(paths.caCert, ca.certPem);
  await writeFile(paths.caKey, ca.keyPem, { mode: 0o600 });
  await writeFile(paths.serverCert, server.certPem);
  await writeFile(paths.serverKey, server.keyPem, { mode: 0o600 });
  return paths;
}
