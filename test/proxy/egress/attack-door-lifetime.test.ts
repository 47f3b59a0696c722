import { once } from 'node:events';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import t, { type Test } from 'tap';
import { generateCa, issueCertificate } from '../../../core/tls.ts';
import type { Lookup } from '../../../proxy/egress/resolve.ts';
import { until } from '../../fixtures/eventually.ts';
import { closedWithin, connectRequest, flows, type HeldConnection, holdConnection } from './door-clients.ts';
import { agentCertificate, baseSnapshot, startEcho, startGatewayHarness } from './gateway-harness.ts';

// An attacker's review: "revoked credentials on open streams". A tunnel (blind or intercepted) and an
// absolute-form request in flight lived on after the credential that admitted them had expired: a
// token's exp, an identity certificate's notAfter. Each is now cut when its credential would no longer
// admit it (a token: exp plus the 5 s clock tolerance its verification forgives; a certificate: past
// notAfter), its one record `deny`, `credential expired: …`. A flow admitted by a credential still
// valid runs on. Requests inside an intercepted tunnel carrying a fresher token do not extend it.

/** How long a retired intercepted tunnel's requests in flight may still take here (RETIRE_GRACE_MS in production). */
const RETIRE_GRACE_TEST_MS = 3_000;

/** The token verifier forgives this much skew on exp (proxy/llm/auth.ts CLOCK_TOLERANCE_S). */
const TOLERANCE_MS = 5_000;

const echo = await startEcho();
t.teardown(() => echo.close());

// A plain http destination whose /stream never ends (an absolute-form request stays in flight).
const plain = http.createServer((req, res) => {
  res.writeHead(200, { 'content-type': 'text/plain' });
  res.write('first chunk\n');
  if (req.url !== '/stream') res.end();
});
await new Promise<void>((resolve) => plain.listen(0, '127.0.0.1', () => resolve()));
t.teardown(() => {
  plain.closeAllConnections();
  return new Promise<void>((resolve) => plain.close(() => resolve()));
});
const plainPort = (plain.address() as { port: number }).port;

// The interception CA, and the CA the intercepted destination's certificate is issued by (--upstream-ca).
const dir = await mkdtemp(join(tmpdir(), 'dvx-door-lifetime-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const interceptCa = await generateCa('door lifetime interception CA');
await writeFile(join(dir, 'ca.pem'), interceptCa.certPem);
await writeFile(join(dir, 'ca-key.pem'), interceptCa.keyPem);
const upstreamCa = await generateCa('door lifetime destination CA');
await writeFile(join(dir, 'upstream-ca.pem'), upstreamCa.certPem);

/** A name whose lookup waits until the test releases it (for a credential that ends during admission). */
let releaseSlow: (() => void) | null = null;
let slowAsked: (() => void) | null = null;
const lookup: Lookup = async (host) => {
  if (host === 'slow.test') {
    slowAsked?.();
    await new Promise<void>((resolve) => (releaseSlow = resolve));
    return [{ address: '127.0.0.1', family: 4 }];
  }
  throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
};

const h = await startGatewayHarness({
  resolve: { 'blind.test': ['127.0.0.1'], 'seen.test': ['127.0.0.1'] },
  lookup,
  agentCa: true,
  gateway: {
    caCert: join(dir, 'ca.pem'),
    caKey: join(dir, 'ca-key.pem'),
    upstreamCa: join(dir, 'upstream-ca.pem'),
    // blind.test and slow.test are blind tunnels; seen.test is intercepted.
    noCaptureHost: ['blind.test', 'slow.test'],
  },
  retireGraceMs: RETIRE_GRACE_TEST_MS,
});
t.teardown(() => h.close());

/** A token valid for about `seconds` more (exp in whole seconds). */
function shortToken(seconds: number, claims: Record<string, unknown> = {}): Promise<string> {
  return h.issuer.mint(claims, { expiresIn: seconds });
}

/** The instant a token expiring in whole seconds stops admitting (its exp plus the tolerance). */
function endOf(token: string): number {
  const exp = JSON.parse(Buffer.from(token.split('.')[1], 'base64url').toString()).exp as number;
  return exp * 1000 + TOLERANCE_MS;
}

/** A tunnel to the echo, its 200 received and bytes passed both ways. */
async function echoTunnel(t: Test, request: string, tlsOptions: tls.ConnectionOptions = {}): Promise<HeldConnection> {
  const c = await holdConnection(h, request, tlsOptions);
  t.equal(c.status, 200, 'tunnel open');
  c.socket.write('ping');
  await until(() => c.received().endsWith('ping'));
  return c;
}

/** Whether `c` is still open at `instant` (checked a little before it). */
async function openUntil(c: HeldConnection, instant: number): Promise<boolean> {
  await until(() => Date.now() >= instant - 300, 30_000);
  return !c.socket.destroyed && c.socket.readyState === 'open';
}

t.test('a blind tunnel is cut when its token expires; one with a valid token runs on', async (t) => {
  const before = flows(h).length;
  const token = await shortToken(1);
  const tunnel = await echoTunnel(t, connectRequest(`blind.test:${echo.port}`, token));
  const other = await echoTunnel(t, connectRequest(`blind.test:${echo.port}`, await h.token({ sub: 'agent-2' })));
  t.ok(await openUntil(tunnel, endOf(token) - TOLERANCE_MS), 'open while the token is valid');
  t.ok(await closedWithin(tunnel, TOLERANCE_MS + 5_000), 'cut once the token no longer admits');
  t.ok(Date.now() >= endOf(token), 'not before the token stopped admitting');
  t.ok(await until(() => flows(h).length > before), 'the cut tunnel is recorded');
  const records = flows(h).slice(before);
  t.equal(records.length, 1, 'one record: the other tunnel still runs');
  t.match(records[0], {
    agent_id: 'agent-1',
    proto: 'tcp',
    outcome: 'deny',
    reason: /^credential expired: token expired at \d{4}-/,
    attrs: { status: '200', bytes_up: '4', bytes_down: '4' },
  });
  t.ok(
    h.logs.some(
      (l) => l.msg === 'open flow cut: the credential that admitted it expired' && l.flow_id === records[0].id,
    ),
    'logged',
  );
  other.socket.write('pong');
  t.ok(await until(() => other.received().endsWith('pong')), 'the tunnel whose token is valid carries bytes');
  other.socket.end();
  await other.closed;
  t.ok(await until(() => flows(h).length === before + 2));
  t.match(flows(h)[before + 1], { agent_id: 'agent-2', outcome: 'allow', reason: '' });
});

t.test('an absolute-form request in flight is cut when its token expires', async (t) => {
  const before = flows(h).length;
  const token = await shortToken(1);
  const c = await holdConnection(
    h,
    `GET http://127.0.0.1:${plainPort}/stream HTTP/1.1\r\nHost: 127.0.0.1:${plainPort}\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`,
  );
  t.equal(c.status, 200);
  await until(() => c.received().includes('first chunk'));
  t.ok(await closedWithin(c, endOf(token) - Date.now() + 5_000), 'the connection is cut');
  t.ok(Date.now() >= endOf(token), 'not before the token stopped admitting');
  t.ok(await until(() => flows(h).length > before));
  t.match(flows(h).slice(before), [
    {
      proto: 'http',
      outcome: 'deny',
      reason: /^credential expired: token expired at /,
      attrs: { method: 'GET', status: '200' },
    },
  ]);
});

/** An intercepted destination (seen.test): /stream answers its first chunk and ends when `endStreams` is called. */
async function seenDestination(t: Test) {
  const leaf = await issueCertificate(upstreamCa, { commonName: 'seen.test', dnsNames: ['seen.test'] });
  const streams: http.ServerResponse[] = [];
  const upstream = https.createServer({ cert: leaf.certPem, key: leaf.keyPem }, (req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.write('first chunk\n');
    if (req.url !== '/stream') res.end();
    else streams.push(res);
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', () => resolve()));
  t.teardown(() => {
    upstream.closeAllConnections();
    return new Promise<void>((resolve) => upstream.close(() => resolve()));
  });
  return {
    port: (upstream.address() as { port: number }).port,
    endStreams: () => {
      for (const res of streams.splice(0)) res.end('last chunk\n');
    },
  };
}

/** An intercepted tunnel to seen.test under `token`, its TLS done, and what it received. */
async function seenTunnel(port: number, token: string) {
  const c = await holdConnection(h, connectRequest(`seen.test:${port}`, token));
  const inner = tls.connect({ socket: c.socket, servername: 'seen.test', ca: interceptCa.certPem });
  inner.on('error', () => {});
  await once(inner, 'secureConnect');
  let got = '';
  inner.on('data', (d: Buffer) => (got += d.toString('latin1')));
  return { c, inner, status: c.status, got: () => got };
}

/** An intercepted tunnel under a 1-second token whose /stream answer is in flight. */
async function streamingTunnel(t: Test) {
  const seen = await seenDestination(t);
  const before = flows(h).length;
  const token = await shortToken(1);
  const s = await seenTunnel(seen.port, token);
  s.inner.write('GET /stream HTTP/1.1\r\nHost: seen.test\r\n\r\n');
  t.ok(await until(() => s.got().includes('first chunk')), 'the answer is streaming');
  return { seen, before, token, s };
}

const byUrl = (records: Record<string, unknown>[], path: string) =>
  records.find((r) => r.proto === 'https' && (r.attrs as Record<string, string>).url?.endsWith(path));

t.test(
  'an idle intercepted tunnel closes at the CONNECT token’s expiry, fresher tokens inside notwithstanding',
  async (t) => {
    const { port } = await seenDestination(t);
    const before = flows(h).length;
    const token = await shortToken(1);
    const s = await seenTunnel(port, token);
    t.equal(s.status, 200);
    // Requests inside carry a fresh token (Proxy-Authorization, as some clients repeat it): the tunnel
    // stays bound to the credential that opened it.
    const fresh = await h.token();
    s.inner.write(`GET /once HTTP/1.1\r\nHost: seen.test\r\nProxy-Authorization: Bearer ${fresh}\r\n\r\n`);
    t.ok(await until(() => s.got().includes('first chunk')), 'a request inside is answered');
    t.ok(await openUntil(s.c, endOf(token)), 'open until the CONNECT token stops admitting');
    t.ok(await closedWithin(s.c, endOf(token) - Date.now() + 5_000), 'then closed');
    t.ok(await until(() => flows(h).length >= before + 2), 'the request and the tunnel are recorded');
    const records = flows(h).slice(before);
    t.match(byUrl(records, '/once'), { outcome: 'allow', reason: '' }, 'the request answered before stands');
    t.match(
      records.find((r) => r.proto === 'tcp'),
      {
        outcome: 'allow',
        reason: /^credential expired: token expired at .*: tunnel closed$/,
        attrs: { intercepted: 'true', requests: '1' },
      },
    );
  },
);

t.test('a request in flight at the token’s expiry finishes, and the tunnel closes with it', async (t) => {
  const { seen, before, token, s } = await streamingTunnel(t);
  t.ok(await openUntil(s.c, endOf(token) + 1_500), 'past the expiry, the answer in flight goes on');
  seen.endStreams();
  t.ok(await until(() => s.got().includes('last chunk')), 'the answer reaches its end');
  t.ok(await closedWithin(s.c, 3_000), 'the tunnel closes with its last answer');
  t.ok(await until(() => flows(h).length >= before + 2));
  const records = flows(h).slice(before);
  t.match(byUrl(records, '/stream'), { outcome: 'allow', reason: '' }, 'the answer is not cut');
  t.match(
    records.find((r) => r.proto === 'tcp'),
    {
      outcome: 'allow',
      reason: /^credential expired: token expired at .*: tunnel closed$/,
    },
  );
});

t.test('a request still in flight past the retire grace is cut, and so is its tunnel', async (t) => {
  const { seen, before, token, s } = await streamingTunnel(t);
  t.ok(await openUntil(s.c, endOf(token) + RETIRE_GRACE_TEST_MS - 500), 'open through the grace');
  t.ok(await closedWithin(s.c, 5_000), 'cut once the grace is over');
  t.ok(Date.now() >= endOf(token) + RETIRE_GRACE_TEST_MS, 'not before');
  t.ok(await until(() => flows(h).length >= before + 2));
  const records = flows(h).slice(before);
  const overdue = /^credential expired: token expired at .*: still in flight 3 s later$/;
  t.match(byUrl(records, '/stream'), { outcome: 'deny', reason: overdue });
  t.match(
    records.find((r) => r.proto === 'tcp'),
    { outcome: 'deny', reason: overdue },
  );
  seen.endStreams();
});

t.test('a tunnel admitted by an identity certificate is cut past its notAfter', async (t) => {
  // X.509 times are whole seconds: valid for the next two or three of them.
  const notAfter = new Date(Math.ceil(Date.now() / 1000) * 1000 + 2_000);
  const cert = await agentCertificate(h.ca, { agent: 'agent-1', org: 'org-1', group: 'g-1' }, notAfter);
  const longer = await agentCertificate(h.ca, { agent: 'agent-2', org: 'org-1' });
  const before = flows(h).length;
  const mtls = (c: { certPem: string; keyPem: string }) => ({ cert: c.certPem, key: c.keyPem });
  const tunnel = await echoTunnel(t, connectRequest(`blind.test:${echo.port}`, null), mtls(cert));
  const other = await echoTunnel(t, connectRequest(`blind.test:${echo.port}`, null), mtls(longer));
  t.ok(await openUntil(tunnel, notAfter.getTime()), 'open while the certificate is valid');
  t.ok(await closedWithin(tunnel, 5_000), 'cut past notAfter');
  t.ok(Date.now() > notAfter.getTime(), 'not before notAfter');
  t.ok(await until(() => flows(h).length > before));
  t.match(flows(h).slice(before), [
    {
      agent_id: 'agent-1',
      outcome: 'deny',
      reason: `credential expired: identity certificate expired at ${notAfter.toISOString()}`,
      attrs: { status: '200', bytes_up: '4', bytes_down: '4' },
    },
  ]);
  other.socket.write('pong');
  t.ok(await until(() => other.received().endsWith('pong')), 'the other certificate’s tunnel carries bytes');
  other.socket.destroy();
  t.ok(await until(() => flows(h).length === before + 2));
});

t.test('a token that ends while its attempt is admitted opens nothing', async (t) => {
  const before = flows(h).length;
  const accepted = echo.accepted;
  const token = await shortToken(1);
  const asked = new Promise<void>((resolve) => (slowAsked = resolve));
  const pending = holdConnection(h, connectRequest(`slow.test:${echo.port}`, token));
  await asked;
  await until(() => Date.now() >= endOf(token), 30_000);
  releaseSlow!();
  const c = await pending;
  t.equal(c.status, 407, 'refused as an expired credential is');
  t.match(c.received(), /proxy-authenticate: Bearer realm="dvx-gateway"/i);
  t.ok(await until(() => flows(h).length > before));
  t.match(flows(h).slice(before), [
    { outcome: 'deny', reason: /^agent authentication failed: token expired at /, attrs: { status: '407' } },
  ]);
  t.equal(echo.accepted, accepted, 'nothing reached the destination');
});

t.test('a reload that removes an agent cuts its flows and refuses it from then on', async (t) => {
  const before = flows(h).length;
  const tunnel = await echoTunnel(t, connectRequest(`blind.test:${echo.port}`, await h.token()));
  // agent-2 is in no snapshot: it stands as its credential says, before and after.
  const unlisted = await echoTunnel(t, connectRequest(`blind.test:${echo.port}`, await h.token({ sub: 'agent-2' })));
  const without = baseSnapshot();
  delete (without.agents as Record<string, unknown>)['agent-1'];
  await h.writeSnapshot(without);
  t.ok(await closedWithin(tunnel), 'the removed agent’s tunnel is cut');
  t.ok(await until(() => flows(h).length > before));
  t.match(flows(h).slice(before), [
    { agent_id: 'agent-1', outcome: 'deny', reason: 'policy changed: agent was removed from the policy snapshot' },
  ]);
  const again = await holdConnection(h, connectRequest(`blind.test:${echo.port}`, await h.token()));
  t.equal(again.status, 403, 'a new attempt with a valid token is refused');
  t.ok(await until(() => flows(h).length === before + 2));
  t.match(flows(h)[before + 1], {
    agent_id: 'agent-1',
    outcome: 'deny',
    reason: 'agent was removed from the policy snapshot',
    attrs: { status: '403' },
  });
  unlisted.socket.write('pong');
  t.ok(await until(() => unlisted.received().endsWith('pong')), 'an agent never listed runs on');
  const agent2 = await holdConnection(h, connectRequest(`blind.test:${echo.port}`, await h.token({ sub: 'agent-2' })));
  t.equal(agent2.status, 200, 'and is admitted');
  agent2.socket.destroy();
  unlisted.socket.destroy();
  // Listed again, the snapshot speaks for it.
  await h.writeSnapshot(baseSnapshot());
  const back = await holdConnection(h, connectRequest(`blind.test:${echo.port}`, await h.token()));
  t.equal(back.status, 200, 'listed again: admitted');
  back.socket.destroy();
});
