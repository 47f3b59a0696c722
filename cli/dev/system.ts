import { access, mkdir, open, readFile, rm } from 'node:fs/promises';
import net from 'node:net';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseAddr } from '../../core/addr.ts';
import { writeFileAtomic } from '../../core/atomic-file.ts';
import { createLogger, type LogLevel, type Logger } from '../../core/logger.ts';
import { ensureDevCertificates } from '../../core/tls.ts';
import { startControlPlane } from '../../controlplane/server.ts';
import { AgentLogin } from '../../enclave/agent-login.ts';
import { startBroker } from '../../enclave/broker/server.ts';
import { AgentLoginRefusedError } from '../../enclave/errors.ts';
import { startGateway } from '../../proxy/egress/server.ts';
import { startLlmProxy } from '../../proxy/llm/server.ts';
import { CliError, DevStartError } from '../errors.ts';
import { profilesPath, saveProfile } from '../operator/profiles.ts';
import { DevApi } from './dev-api.ts';
import { startMockUpstream } from './mock-upstream.ts';
import { DEV_ADMIN, DEV_AUDIENCE, startDevIssuer } from './oidc-issuer.ts';

// `dvx dev`: the whole system in one process on embedded defaults (docs/dev.md). Under DIR (.dvx/):
//
//   ca.pem, server.pem …   the dev CA and the one localhost certificate every listener serves
//   oidc/                  the dev issuer's keys and registered clients; dev-admin-key.json (the CLI's --idp-key)
//   controlplane/db        the control plane's store (PGlite)
//   broker/                the broker's state (its PGlite store, keys, enclave CA, bootstrap tokens …)
//   broker-key.json        the enclave's broker key, from its registration (shown once by the control plane)
//   snapshot.json          the enclave's policy snapshot, written by the broker for llmproxy and the gateway
//   agent/                 the demo agent's identity files, kept by its agent-login (jwt, refresh-token …)
//   audit/controlplane     the control plane's audit store (PGlite), fed by its WAL under wal/controlplane
//   audit/enclave          the enclave's audit store, shared by the broker, llmproxy and the gateway (wal/<component>)
//   dev.json               the facts for scripts, written once everything answers, kept fresh, removed at stop
//
// Everything is set up through the product's own paths: the operators' API creates the demo org, group,
// enclave, agent and policy; the broker provisions the agent from the control plane's agent.created; the
// agent logs in with the bootstrap token the broker wrote. A second start finds every object and reuses it.

export const DEMO_ORG = 'demo';
export const DEMO_GROUP = 'builders';
export const DEMO_AGENT = 'demo-agent';
export const DEV_ENCLAVE = 'dev';
/** The example block pattern of the demo org's content inspection. */
export const BLOCKED_EXAMPLE = 'Project Nightingale';

export interface DevOptions {
  dir: string;
  controlplaneAddr: string;
  brokerAddr: string;
  brokerOperatorAddr: string;
  llmproxyAddr: string;
  gatewayAddr: string;
  issuerAddr: string;
  upstreamAddr: string;
  /** `mock`: the built-in upstream; `providers`: the real APIs with the key from the environment. */
  upstream: 'mock' | 'providers';
  /** The provider key (providers mode); never printed. */
  providerKey: string;
  profile: string;
  /** The profiles file; empty: the XDG location. */
  profiles: string;
  logLevel: LogLevel;
}

/** What `.dvx/dev.json` holds (and the banner prints). */
export interface DevFacts {
  controlplane: string;
  broker: string;
  llmproxy: string;
  gateway: string;
  approvals_page: string;
  ca_cert: string;
  agent_token: string;
  profile: string;
  /** Beyond the required keys: what a script may also want. */
  broker_operator: string;
  issuer: string;
  upstream: string;
  org: string;
  agent: string;
  blocked_example: string;
  profiles_file: string;
}

export interface DevSystem {
  facts: DevFacts;
  close(): Promise<void>;
}

const WITHIN_MS = 60_000;

const exists = (p: string) =>
  access(p).then(
    () => true,
    () => false,
  );

async function until<T>(what: string, probe: () => Promise<T | null | undefined | false>): Promise<T> {
  const deadline = Date.now() + WITHIN_MS;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() > deadline) throw new CliError(`dvx dev: ${what} did not happen within ${WITHIN_MS / 1000} s`);
    await sleep(200);
  }
}

/**
 * The broker names itself by its agent address (the JWT's `iss`, its discovery document): with port 0 a
 * free port is taken first, so that name is one that answers.
 */
async function concreteAddr(addr: string): Promise<string> {
  const { host, port } = parseAddr(addr);
  if (port !== 0) return addr;
  const h = host ?? '127.0.0.1';
  const free = await new Promise<number>((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, h, () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
  return h.includes(':') ? `[${h}]:${free}` : `${h}:${free}`;
}

/** Component logs go to stderr, so stdout holds the banner alone. */
const stderrLogger = (component: string, level: LogLevel): Logger =>
  createLogger({
    level,
    format: 'text',
    component,
    destination: { write: (s: string) => process.stderr.write(s) } as never,
  });

export async function startDevSystem(o: DevOptions): Promise<DevSystem> {
  const dir = resolve(o.dir);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const factsFile = join(dir, 'dev.json');
  // One dvx dev per directory: a second would delete the first's dev.json and open its PGlite stores.
  const releaseLock = await lockDir(dir);
  // A dev.json left by a run that did not stop cleanly names ports nobody listens on: it goes until
  // this run is ready, so its appearance means ready.
  await rm(factsFile, { force: true });
  const closers: (() => Promise<unknown>)[] = [];
  const closeAll = async () => {
    for (const c of closers.splice(0).reverse()) {
      try {
        await c();
      } catch (err) {
        process.stderr.write(`dvx dev: a component did not stop cleanly: ${(err as Error).message}\n`);
      }
    }
  };
  closers.push(releaseLock); // closers run in reverse: the lock goes last
  try {
    return await start(o, dir, factsFile, closers, closeAll);
  } catch (err) {
    await closeAll();
    throw err;
  }
}

/**
 * Takes DIR/dev.lock (created exclusively, holding this pid); a lock whose process is gone is stale and
 * taken over. Returns its release.
 */
async function lockDir(dir: string): Promise<() => Promise<void>> {
  const file = join(dir, 'dev.lock');
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const h = await open(file, 'wx', 0o600);
      await h.writeFile(`${process.pid}\n`);
      await h.close();
      return () => rm(file, { force: true });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const pid = Number.parseInt(await readFile(file, 'utf8').catch(() => ''), 10);
    if (Number.isInteger(pid) && pid > 0 && pid !== process.pid && alive(pid))
      throw new CliError(`${dir} is in use by a running dvx dev (pid ${pid}): stop it first, or give another --dir`);
    await rm(file, { force: true });
  }
  throw new CliError(`cannot take ${file}: another dvx dev is starting in ${dir}`);
}

/**
 * A component's start, a failure tagged with the `dvx dev` flags of the listeners it opens
 * (DevStartError), so that cli/dev.ts names the right one; a CliError (the lock, a refusal) is the
 * command's own and goes as it is.
 */
async function starting<T>(listeners: readonly string[], start: () => Promise<T>): Promise<T> {
  try {
    return await start();
  } catch (err) {
    if (err instanceof CliError) throw err;
    throw new DevStartError(listeners, err);
  }
}

/** The pid of the dvx dev that holds DIR, or null when none runs (no lock, or its process is gone). */
export async function runningDevPid(dir: string): Promise<number | null> {
  const pid = Number.parseInt(await readFile(join(dir, 'dev.lock'), 'utf8').catch(() => ''), 10);
  return Number.isInteger(pid) && pid > 0 && alive(pid) ? pid : null;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function start(
  o: DevOptions,
  dir: string,
  factsFile: string,
  closers: (() => Promise<unknown>)[],
  closeAll: () => Promise<void>,
): Promise<DevSystem> {
  const certs = await ensureDevCertificates(dir);
  const ca = await readFile(certs.caCert, 'utf8');
  const tls = { tlsCert: certs.serverCert, tlsKey: certs.serverKey };
  const logs = { logFormat: 'text' as const, logLevel: o.logLevel };
  // Two audit stores, as in production: the control plane's own, and the enclave's, which the broker,
  // llmproxy and the gateway share (each through its own WAL), so the broker's audit routes
  // (`dvx audit tail --local`) show the agents' LLM calls and network flows.
  const audit = (component: string) => ({
    auditDsn: `pglite://${join(dir, 'audit', component === 'controlplane' ? 'controlplane' : 'enclave')}`,
    auditWalDir: join(dir, 'wal', component),
  });

  // PGlite makes its own directory, not the ones above it.
  for (const sub of ['oidc', 'controlplane', 'audit', 'wal'])
    await mkdir(join(dir, sub), { recursive: true, mode: 0o700 });
  // The issuer of every operator token.
  const issuer = await starting(['issuerAddr'], async () =>
    startDevIssuer({ dir: join(dir, 'oidc'), addr: o.issuerAddr, org: DEMO_ORG }),
  );
  closers.push(() => issuer.close());

  // The control plane on PGlite; the dev admin is its platform admin; it provisions service accounts at
  // the dev issuer with its own key.
  const cp = await starting(['controlplaneAddr'], async () =>
    startControlPlane(
      {
        addr: o.controlplaneAddr,
        ...tls,
        ...logs,
        oidcIssuer: issuer.issuer,
        oidcAudience: DEV_AUDIENCE,
        idpKey: issuer.controlplaneKeyFile,
        databaseDsn: `pglite://${join(dir, 'controlplane', 'db')}`,
        seedAdmin: [DEV_ADMIN],
        ...audit('controlplane'),
      },
      { logger: stderrLogger('controlplane', o.logLevel) },
    ),
  );
  closers.push(() => cp.close());
  const cpUrl = `https://127.0.0.1:${cp.port}`;
  const api = new DevApi({ ca, keyFile: issuer.adminKeyFile, issuer: issuer.issuer, audience: DEV_AUDIENCE });
  closers.push(() => api.close());
  const cpApi = (path: string) => `${cpUrl}/api/v1${path}`;

  // The demo org and group, then the enclave registered: its broker key is shown once, so it is kept.
  await api.must('creating the demo org', [201, 409], 'POST', cpApi('/orgs'), { id: DEMO_ORG, name: 'Demo' });
  await api.must('creating the demo group', [201, 409], 'POST', cpApi(`/orgs/${DEMO_ORG}/groups`), {
    id: DEMO_GROUP,
    name: 'Builders',
  });
  const brokerKeyFile = join(dir, 'broker-key.json');
  let brokerKey = (await exists(brokerKeyFile))
    ? String(JSON.parse(await readFile(brokerKeyFile, 'utf8')).token ?? '')
    : '';
  if (!brokerKey) {
    const reg = await api.must('registering the dev enclave', [201, 409], 'POST', cpApi('/enclaves'), {
      name: DEV_ENCLAVE,
      enclave_id: DEV_ENCLAVE,
      owning_org: DEMO_ORG,
    });
    // 409: registered by an earlier run whose key file is gone; a new key replaces the old one.
    const view =
      reg.status === 201
        ? reg.body
        : (await api.must('renewing the broker key', [201], 'POST', cpApi(`/enclaves/${DEV_ENCLAVE}/broker-key`))).body;
    brokerKey = String(view.key.token);
    await writeFileAtomic(brokerKeyFile, JSON.stringify(view.key), { mode: 0o600 });
  }

  // The example policy, authored as an operator would: content inspection for the demo org, with a block
  // pattern (spec: llm-content-policy, content_inspection).
  await api.must('authoring the example policy', [200], 'PUT', cpApi('/config/llmproxy/content_inspection'), {
    value: JSON.stringify({
      secrets_filter: { enabled: true, severity: 'block' },
      api_key_detection: { enabled: true, severity: 'block' },
      pii_detection: { enabled: true, severity: 'warn' },
      patterns: [{ pattern: '(?i)project[- ]nightingale', description: 'example codename', severity: 'block' }],
    }),
  });

  // The broker of the dev enclave, converging on the control plane, its operators the dev issuer's.
  const brokerDir = join(dir, 'broker');
  const snapshotFile = join(dir, 'snapshot.json');
  const broker = await starting(['brokerAddr', 'brokerOperatorAddr'], async () =>
    startBroker(
      {
        addr: await concreteAddr(o.brokerAddr),
        operatorAddr: o.brokerOperatorAddr,
        ...tls,
        ...logs,
        stateDir: brokerDir,
        enclaveId: DEV_ENCLAVE,
        enclaveName: DEV_ENCLAVE,
        controlplane: cpUrl,
        brokerKey,
        caCert: certs.caCert,
        localIssuer: issuer.issuer,
        localAudience: DEV_AUDIENCE,
        owningOrg: DEMO_ORG,
        seedAdmin: [DEV_ADMIN],
        snapshotOut: snapshotFile,
        ...audit('broker'),
      },
      { logger: stderrLogger('broker', o.logLevel) },
    ),
  );
  closers.push(() => broker.close());
  const brokerUrl = `https://127.0.0.1:${broker.agentPort}`;
  const brokerOperatorUrl = `https://127.0.0.1:${broker.operatorPort}`;

  // The provider key llmproxy presents upstream: an org secret at the broker (platform credential mode).
  // The mock upstream takes any; a real one comes from the environment and is stored, never printed.
  await api.must(
    'storing the provider key at the broker',
    [200, 201],
    'PUT',
    `${brokerOperatorUrl}/api/v1/secrets/llmproxy:llm.api_key`,
    { value: o.upstream === 'mock' ? 'dvx-dev-mock-upstream-key' : o.providerKey },
  );

  // The demo agent, through the real lifecycle: created on the control plane → agent.created reaches the
  // broker → it writes the bootstrap token → agent-login redeems it for the agent's platform JWT.
  await api.must('creating the demo agent', [200, 201, 409], 'POST', cpApi(`/orgs/${DEMO_ORG}/agents`), {
    uid: DEMO_AGENT,
    name: DEMO_AGENT,
    group: DEMO_GROUP,
    enclave_id: DEV_ENCLAVE,
  });
  const agentDir = join(dir, 'agent');
  const tokenFile = join(brokerDir, 'agents', DEMO_AGENT, 'bootstrap-token');
  await until(
    'the broker provisioning the demo agent',
    async () => (await exists(tokenFile)) || (await exists(join(agentDir, 'refresh-token'))),
  );
  const stopLogin = new AbortController();
  const login = new AgentLogin({
    broker: brokerUrl,
    tokenFile,
    out: agentDir,
    ca: Buffer.from(ca),
    log: stderrLogger('agent-login', o.logLevel),
    signal: stopLogin.signal,
  });
  let loginFailed: Error | null = null;
  const loginRun = login.run().catch((err: Error) => {
    loginFailed = err;
  });
  closers.push(async () => {
    stopLogin.abort();
    await loginRun;
  });
  await until('the demo agent logging in', async () => {
    if (loginFailed)
      throw new CliError(
        loginFailed instanceof AgentLoginRefusedError
          ? `dvx dev: the broker refused the demo agent's login (${loginFailed.message}); remove ${dir} to start afresh`
          : `dvx dev: the demo agent's login failed: ${(loginFailed as Error).message}`,
      );
    return login.state !== null;
  });
  const agentToken = async () => (await readFile(join(agentDir, 'jwt'), 'utf8')).trim();

  await until('the broker writing the policy snapshot', () => exists(snapshotFile));
  let upstreamUrl = '';
  if (o.upstream === 'mock') {
    const mock = await starting(['upstreamAddr'], async () => startMockUpstream(o.upstreamAddr));
    closers.push(() => mock.close());
    upstreamUrl = mock.url;
  }

  // llmproxy: the agents' JWTs verified against the broker's JWKS, secrets and approvals from the broker,
  // the snapshot the broker writes.
  const satellite = {
    agentJwks: `${brokerUrl}/.well-known/jwks.json`,
    brokerCa: certs.caCert,
    secretBrokerUrl: brokerUrl,
    secretBrokerTokenFile: broker.deps.options.satelliteTokenFile,
    policySnapshot: snapshotFile,
    enclaveId: DEV_ENCLAVE,
    enclaveName: DEV_ENCLAVE,
  };
  const proxy = await starting(['llmproxyAddr'], async () =>
    startLlmProxy(
      {
        addr: o.llmproxyAddr,
        ...tls,
        ...logs,
        ...satellite,
        approvalsUrl: brokerUrl,
        upstreamDefault: upstreamUrl,
        ...audit('llmproxy'),
      },
      { logger: stderrLogger('llmproxy', o.logLevel) },
    ),
  );
  closers.push(() => proxy.close());
  const gateway = await starting(['gatewayAddr'], async () =>
    startGateway(
      { addr: o.gatewayAddr, ...tls, ...logs, ...satellite, ...audit('gateway') },
      { logger: stderrLogger('gateway', o.logLevel) },
    ),
  );
  closers.push(() => gateway.close());

  // The CLI profile, logged in as the dev admin through its key file; the default only when there is none.
  const profilesFile = profilesPath(o.profiles || undefined);
  await saveProfile(profilesFile, o.profile, {
    controlplane: cpUrl,
    broker: brokerOperatorUrl,
    idp_key: issuer.adminKeyFile,
    issuer: issuer.issuer,
    audience: DEV_AUDIENCE,
    ca_cert: certs.caCert,
  });

  const facts: DevFacts = {
    controlplane: cpUrl,
    broker: brokerUrl,
    llmproxy: `https://127.0.0.1:${proxy.port}`,
    gateway: `https://127.0.0.1:${gateway.port}`,
    approvals_page: `${brokerOperatorUrl}/approvals`,
    ca_cert: certs.caCert,
    agent_token: await agentToken(),
    profile: o.profile,
    broker_operator: brokerOperatorUrl,
    issuer: issuer.issuer,
    upstream: upstreamUrl || 'providers',
    org: DEMO_ORG,
    agent: DEMO_AGENT,
    blocked_example: BLOCKED_EXAMPLE,
    profiles_file: profilesFile,
  };
  const writeFacts = () => writeFileAtomic(factsFile, `${JSON.stringify(facts, null, 2)}\n`, { mode: 0o600 });
  await writeFacts();
  closers.push(() => rm(factsFile, { force: true }));

  // The JWT lives 5 minutes; agent-login renews it into agent/jwt, and dev.json follows.
  const refresh = setInterval(() => {
    void agentToken()
      .then(async (token) => {
        if (token && token !== facts.agent_token) {
          facts.agent_token = token;
          await writeFacts();
        }
      })
      .catch((err: Error) => process.stderr.write(`dvx dev: cannot refresh dev.json: ${err.message}\n`));
  }, 2_000);
  closers.push(async () => clearInterval(refresh));

  return { facts, close: closeAll };
}
