import 'reflect-metadata'; // before @peculiar/x509, which needs it when it loads
import { createPrivateKey, createPublicKey, webcrypto, X509Certificate, type KeyObject } from 'node:crypto';
import { mkdir, open, readFile, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import * as x509 from '@peculiar/x509';
import { generateCa } from '../../../core/tls.ts';
import { CsrInvalidError, EnclaveCaError } from '../../errors.ts';

// The enclave CA (spec: Authentication, "An agent identity certificate (ECDSA P-256, 5 minutes) is issued
// by the enclave CA"). It is two PEM files, --enclave-ca-cert and --enclave-ca-key, made on the first
// start when both are absent; the broker signs an agent's CSR with it into a 5-minute client
// certificate whose subject llmproxy's --agent-ca reads (proxy/llm/auth.ts, certificateIdentity):
// CN = agent uid, O = org id, OU = group id. Of the CSR only the public key is used: the subject is the
// broker's to say, never the agent's.
//
// core/tls.ts sets @peculiar/x509's crypto provider on import.

const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
/** The identity certificate's lifetime; it is also valid a minute back, for clock skew. */
export const AGENT_CERT_LIFETIME_MS = 5 * 60_000;
const BACKDATE_MS = 60_000;
/** A CSR larger than this is not one a P-256 key makes. */
export const MAX_CSR_BYTES = 16 * 1024;
const CSR_PEM =
  /^\s*-----BEGIN CERTIFICATE REQUEST-----\r?\n([A-Za-z0-9+/=\r\n]+)-----END CERTIFICATE REQUEST-----\s*$/;
/** Characters a subject value may not hold (the reader splits the subject on newlines and `=`). */
const UNSAFE = /[\u0000-\u001f\u007f,=+<>#;"\\]/;

export interface AgentSubject {
  agentId: string;
  orgId: string;
  groupId: string | null;
}

export interface EnclaveCaPaths {
  cert: string;
  key: string;
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw new EnclaveCaError(`cannot read ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
}

/** Writes `data` to `path` atomically (temp file, fsync, rename, directory fsync) with `mode` from the start. */
async function writeAtomic(path: string, data: string, mode: number): Promise<void> {
  const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.${Date.now()}.tmp`);
  const file = await open(tmp, 'wx', mode);
  try {
    await file.writeFile(data);
    await file.sync();
    await file.close();
    await rename(tmp, path);
  } catch (err) {
    await file.close().catch(() => {}); // already closed on the rename path; the write's error is the one raised
    await rm(tmp, { force: true });
    throw err;
  }
  const dir = await open(dirname(path), 'r');
  try {
    await dir.sync();
  } finally {
    await dir.close();
  }
}

function serial(): string {
  const bytes = webcrypto.getRandomValues(new Uint8Array(16));
  bytes[0] &= 0x7f;
  return Buffer.from(bytes).toString('hex');
}

export class EnclaveCa {
  readonly certPem: string;
  readonly generated: boolean;
  #cert: x509.X509Certificate;
  #key: Promise<webcrypto.CryptoKey>;

  private constructor(certPem: string, key: KeyObject, generated: boolean) {
    this.certPem = certPem;
    this.generated = generated;
    this.#cert = new x509.X509Certificate(certPem);
    this.#key = webcrypto.subtle.importKey('pkcs8', key.export({ format: 'der', type: 'pkcs8' }), ALG, false, [
      'sign',
    ]) as Promise<webcrypto.CryptoKey>;
  }

  /**
   * Loads the CA, or makes one (key 0600, both files written atomically) when neither file exists.
   * Refuses only one of the pair, unreadable or non-PEM files, a certificate that is not a CA or has
   * expired, a key that is not ECDSA P-256 or does not match the certificate.
   */
  static async load(paths: EnclaveCaPaths, options: { commonName?: string; nowMs?: number } = {}): Promise<EnclaveCa> {
    const [hasCert, hasKey] = await Promise.all([exists(paths.cert), exists(paths.key)]);
    if (!hasCert && !hasKey) {
      const ca = await generateCa(options.commonName ?? 'dvx enclave CA');
      await mkdir(dirname(paths.key), { recursive: true, mode: 0o700 });
      await mkdir(dirname(paths.cert), { recursive: true, mode: 0o700 });
      // The key first: a crash between the two leaves a key alone, which the next start refuses by name
      // rather than pairing it with a certificate of another key.
      await writeAtomic(paths.key, ca.keyPem, 0o600);
      await writeAtomic(paths.cert, ca.certPem, 0o644);
      return new EnclaveCa(ca.certPem, createPrivateKey(ca.keyPem), true);
    }
    if (!hasCert || !hasKey) {
      const [there, missing] = hasCert ? [paths.cert, paths.key] : [paths.key, paths.cert];
      throw new EnclaveCaError(
        `enclave CA: ${there} exists but ${missing} does not; give both (--enclave-ca-cert, --enclave-ca-key) or remove ${there} to have a new CA made`,
      );
    }
    const [certPem, keyPem] = await Promise.all([
      readFile(paths.cert, 'utf8').catch((err: NodeJS.ErrnoException) => {
        throw new EnclaveCaError(`cannot read enclave CA certificate ${paths.cert}: ${err.code ?? err.message}`);
      }),
      readFile(paths.key, 'utf8').catch((err: NodeJS.ErrnoException) => {
        throw new EnclaveCaError(`cannot read enclave CA key ${paths.key}: ${err.code ?? err.message}`);
      }),
    ]);
    let cert: X509Certificate;
    try {
      cert = new X509Certificate(certPem);
    } catch (err) {
      throw new EnclaveCaError(`enclave CA certificate ${paths.cert} is not a PEM certificate`, { cause: err });
    }
    let key: KeyObject;
    try {
      key = createPrivateKey(keyPem);
    } catch (err) {
      throw new EnclaveCaError(`enclave CA key ${paths.key} is not a PEM private key`, { cause: err });
    }
    if (key.asymmetricKeyType !== 'ec' || key.asymmetricKeyDetails?.namedCurve !== 'prime256v1')
      throw new EnclaveCaError(`enclave CA key ${paths.key} must be ECDSA P-256`);
    if (!cert.checkPrivateKey(key))
      throw new EnclaveCaError(`enclave CA key ${paths.key} does not match certificate ${paths.cert}`);
    if (!cert.ca) throw new EnclaveCaError(`enclave CA certificate ${paths.cert} is not a CA certificate`);
    if (new Date(cert.validTo).getTime() <= (options.nowMs ?? Date.now()))
      throw new EnclaveCaError(`enclave CA certificate ${paths.cert} expired on ${cert.validTo}`);
    return new EnclaveCa(certPem.endsWith('\n') ? certPem : `${certPem}\n`, key, false);
  }

  /**
   * Signs an agent's CSR (PEM) into its 5-minute identity certificate (PEM): the CSR's public key, the
   * subject and usage the broker says. Throws CsrInvalidError (400) for a CSR that does not parse, whose
   * key is not ECDSA P-256, or whose self-signature does not verify.
   */
  async signCsr(csrPem: unknown, subject: AgentSubject, nowMs: number): Promise<string> {
    const csr = await parseCsr(csrPem);
    for (const [what, v] of [
      ['agent id', subject.agentId],
      ['org id', subject.orgId],
      ['group id', subject.groupId ?? 'x'],
    ] as const)
      if (v === '' || v.length > 128 || UNSAFE.test(v))
        throw new CsrInvalidError(`the agent's ${what} cannot be a certificate subject`);
    const name: x509.JsonName = [{ CN: [subject.agentId] }, { O: [subject.orgId] }];
    if (subject.groupId) name.push({ OU: [subject.groupId] });
    const notBefore = new Date(nowMs - BACKDATE_MS);
    const cert = await x509.X509CertificateGenerator.create({
      serialNumber: serial(),
      subject: name,
      issuer: this.#cert.subjectName,
      notBefore,
      notAfter: new Date(nowMs + AGENT_CERT_LIFETIME_MS),
      publicKey: csr.publicKey,
      signingKey: (await this.#key) as never,
      signingAlgorithm: ALG,
      extensions: [
        new x509.BasicConstraintsExtension(false, undefined, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
        new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.clientAuth], false),
        await x509.AuthorityKeyIdentifierExtension.create(this.#cert, false),
        await x509.SubjectKeyIdentifierExtension.create(csr.publicKey),
      ],
    });
    return cert.toString('pem') + '\n';
  }
}

/** A checked CSR: PEM of one certificate request, an ECDSA P-256 key, a self-signature that verifies. */
async function parseCsr(csrPem: unknown): Promise<x509.Pkcs10CertificateRequest> {
  if (typeof csrPem !== 'string' || csrPem.length > MAX_CSR_BYTES || !CSR_PEM.test(csrPem))
    throw new CsrInvalidError('csr: not one PEM certificate request');
  let csr: x509.Pkcs10CertificateRequest;
  try {
    csr = new x509.Pkcs10CertificateRequest(csrPem);
  } catch (err) {
    throw new CsrInvalidError('csr: the certificate request does not parse', { cause: err });
  }
  let key: KeyObject;
  try {
    key = createPublicKey({ key: Buffer.from(csr.publicKey.rawData), format: 'der', type: 'spki' });
  } catch (err) {
    throw new CsrInvalidError('csr: its public key does not parse', { cause: err });
  }
  if (key.asymmetricKeyType !== 'ec' || key.asymmetricKeyDetails?.namedCurve !== 'prime256v1')
    throw new CsrInvalidError('csr: the key must be ECDSA P-256');
  let verified: boolean;
  try {
    verified = await csr.verify();
  } catch (err) {
    throw new CsrInvalidError('csr: its signature does not verify', { cause: err });
  }
  if (!verified) throw new CsrInvalidError('csr: its signature does not verify');
  return csr;
}
