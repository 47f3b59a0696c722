import type http from 'node:http';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { generateCa, issueCertificate, type PemPair } from '../core/tls.ts';
import { BENCH_PATTERNS } from './corpus.ts';

// What the processes under test read, written to a bench's temporary directory: a TLS certificate for
// 127.0.0.1, an agent identity (a JWKS file and tokens signed for it), the policy snapshot of the full
// set; and the mock upstreams' listening and their canned answer.

/** A plain Anthropic Messages answer ("ok"), as the proxy and broker benches' upstreams give it. */
export const ANTHROPIC_TEXT_REPLY = JSON.stringify({
  id: 'msg_1',
  type: 'message',
  role: 'assistant',
  model: 'claude-sonnet-4-5',
  content: [{ type: 'text', text: 'ok' }],
  stop_reason: 'end_turn',
  stop_sequence: null,
  usage: { input_tokens: 10, output_tokens: 1 },
});

/** Listens on 127.0.0.1 (a port of the kernel's pick), keep-alive 60 s. */
export function listenLocal(server: http.Server): Promise<{ port: number; url: string; close: () => void }> {
  server.keepAliveTimeout = 60_000;
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      resolve({ port, url: `http://127.0.0.1:${port}`, close: () => server.close() });
    }),
  );
}

export interface ServerTls {
  ca: PemPair;
  leaf: PemPair;
  certFile: string;
  keyFile: string;
}

/** A CA and a leaf for localhost / 127.0.0.1, the leaf written to dir/cert.pem and dir/key.pem. */
export async function writeServerTls(dir: string, caName?: string): Promise<ServerTls> {
  const ca = await generateCa(caName);
  const leaf = await issueCertificate(ca, { commonName: 'localhost', ipAddresses: ['127.0.0.1'] });
  const certFile = join(dir, 'cert.pem');
  const keyFile = join(dir, 'key.pem');
  await writeFile(certFile, leaf.certPem);
  await writeFile(keyFile, leaf.keyPem);
  return { ca, leaf, certFile, keyFile };
}

export interface AgentIdentity {
  jwksFile: string;
  /** A fresh platform JWT of agent-b in org-b (under 5 minutes, as platform JWTs are). */
  token: () => Promise<string>;
}

/** An ES256 key (kid "b"), its JWKS in dir/jwks.json, and tokens of agent-b in org-b signed with it. */
export async function writeAgentIdentity(dir: string): Promise<AgentIdentity> {
  const { publicKey, privateKey } = await generateKeyPair('ES256', { extractable: true });
  const jwksFile = join(dir, 'jwks.json');
  await writeFile(jwksFile, JSON.stringify({ keys: [{ ...(await exportJWK(publicKey)), kid: 'b', alg: 'ES256' }] }));
  const token = () =>
    new SignJWT({ org_id: 'org-b' })
      .setProtectedHeader({ alg: 'ES256', kid: 'b' })
      .setSubject('agent-b')
      .setIssuedAt()
      .setExpirationTime('290s')
      .sign(privateKey);
  return { jwksFile, token };
}

/** llmproxy's snapshot for org-b: audit on, and inspection with the full set (built-ins + 10 RE2) or off. */
export function fullSetSnapshot(upstreamUrl: string, inspect: boolean): Record<string, unknown> {
  return {
    version: 'bench',
    enclave: { id: 'e', name: 'bench', isolation_class: 'vm' },
    platform: { downstream_url: { value: upstreamUrl } },
    orgs: {
      'org-b': {
        flags: { 'inspect:llm': inspect, 'audit:llm': true },
        config: {
          content_inspection: {
            value: {
              secrets_filter: { enabled: true },
              pii_detection: { enabled: true },
              api_key_detection: { enabled: true },
              patterns: BENCH_PATTERNS,
            },
          },
        },
      },
    },
    agents: {},
  };
}

/** Writes `value` as JSON to dir/name and returns the path. */
export async function writeJson(dir: string, name: string, value: unknown): Promise<string> {
  const file = join(dir, name);
  await writeFile(file, JSON.stringify(value));
  return file;
}
