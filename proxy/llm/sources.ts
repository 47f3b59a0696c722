import { readFile } from 'node:fs/promises';
import type { Logger } from '../../core/logger.ts';
import { WatchedJsonFile } from '../../core/watched-file.ts';
import { validateSnapshot, type Snapshot } from '../../pipeline/policy/snapshot.ts';
import { AgentAuthenticator, jwksFromDocument, jwksFromUrl } from './auth.ts';
import type { GatewayIdentityVerifier } from './gateway-identity.ts';
import { SecretBroker } from './secret-broker.ts';
import { parseSecretsFile, secretSource, type SecretMap, type SecretSource } from './secrets-file.ts';

// What every agent-facing satellite (llmproxy, the gateway) reads from outside and keeps current: the
// policy snapshot file, the agents' secrets (a file, or the enclave broker), the keys that verify
// platform JWTs (a JWKS file, or the broker's URL), and a CA bundle named by a flag. Each is opened
// once at start (a source that cannot be read refuses the start) and then follows its origin; a reload
// that does not validate keeps the last good value and is logged.

/** A PEM bundle named by `flag`, or undefined when the flag is empty; `fail` makes the refusal's error. */
export async function readCaFlag(
  flag: string,
  path: string,
  fail: (message: string) => Error,
): Promise<Buffer | undefined> {
  if (!path) return undefined;
  return readFile(path).catch((err: NodeJS.ErrnoException) => {
    throw fail(`cannot read ${flag} ${path}: ${err.code ?? err.message}`);
  });
}

/** The --policy-snapshot file, re-read on change (`onChange` after each accepted reload); null when not set. */
export async function openSnapshotFile(
  path: string,
  log: Logger,
  onChange: () => void,
): Promise<WatchedJsonFile<Snapshot> | null> {
  if (!path) return null;
  return WatchedJsonFile.open({
    path,
    parse: validateSnapshot,
    onChange: (s) => {
      onChange();
      log.info({ snapshot_version: s.version }, 'policy snapshot reloaded');
    },
    onError: (err) => log.error({ err }, 'policy snapshot reload refused; keeping the last good one'),
  });
}

export interface SecretSourceOptions {
  secretsFile: string;
  secretBrokerUrl: string;
  secretBrokerTokenFile: string;
}

export interface OpenSecrets {
  source: SecretSource;
  close(): Promise<void>;
}

/**
 * The agents' secrets: the broker's (--secret-broker-url, followed over its events stream), else the
 * --secrets-file (re-read on change), else none.
 */
export async function openSecretSource(
  o: SecretSourceOptions,
  brokerCa: Buffer | undefined,
  log: Logger,
): Promise<OpenSecrets> {
  let file: WatchedJsonFile<SecretMap> | null = null;
  if (o.secretsFile) {
    file = await WatchedJsonFile.open({
      path: o.secretsFile,
      parse: parseSecretsFile,
      onChange: () => log.info('secrets file reloaded'),
      onError: (err) => log.error({ err }, 'secrets file reload refused; keeping the last good one'),
    });
  }
  const broker = o.secretBrokerUrl
    ? await SecretBroker.start({ url: o.secretBrokerUrl, tokenFile: o.secretBrokerTokenFile, ca: brokerCa, log })
    : null;
  const empty: SecretMap = new Map();
  return {
    source: secretSource(() => broker?.map ?? file?.value ?? empty),
    async close() {
      file?.close();
      await broker?.close();
    },
  };
}

export interface OpenAuthenticator {
  auth: AgentAuthenticator;
  close(): void;
}

/**
 * The verifier of platform JWTs (and identity certificates) for --agent-jwks: a URL (the broker's
 * `/.well-known/jwks.json`, trusting `brokerCa`), a file re-read on change (the token cache cleared),
 * or nothing (every token refused; certificates still verify).
 */
export async function openAgentAuthenticator(
  agentJwks: string,
  brokerCa: Buffer | undefined,
  log: Logger,
  gateway: GatewayIdentityVerifier | null = null,
): Promise<OpenAuthenticator> {
  let jwksFile: WatchedJsonFile<ReturnType<typeof jwksFromDocument>> | null = null;
  const remote = /^https?:\/\//.test(agentJwks) ? jwksFromUrl(agentJwks, brokerCa) : null;
  const auth = new AgentAuthenticator({
    keys: () => {
      if (remote) return remote;
      if (jwksFile) return jwksFile.value;
      return () => Promise.reject(new Error('no JWKS configured'));
    },
    gateway,
  });
  if (!remote && agentJwks) {
    jwksFile = await WatchedJsonFile.open({
      path: agentJwks,
      parse: (doc) => {
        if (!Array.isArray((doc as { keys?: unknown })?.keys)) throw new Error('a JWKS needs a "keys" array');
        return jwksFromDocument(doc);
      },
      onChange: () => auth.clearCache(),
      onError: (err) => log.error({ err }, 'agent JWKS reload refused; keeping the last good one'),
    });
  }
  return { auth, close: () => jwksFile?.close() };
}
