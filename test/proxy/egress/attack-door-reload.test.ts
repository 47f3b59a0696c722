import { once } from 'node:events';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import http from 'node:http';
import https from 'node:https';
import { join } from 'node:path';
import tls from 'node:tls';
import t from 'tap';
import { generateCa, issueCertificate } from '../../../core/tls.ts';
import type { Lookup } from '../../../proxy/egress/resolve.ts';
import { until } from '../../fixtures/eventually.ts';
import { closedWithin, connectRequest, flows, holdConnection } from './door-clients.ts';
import { baseSnapshot, startEcho, startGatewayHarness } from './gateway-harness.ts';

// An attacker's review: a snapshot reload must reach what is already open. An agent suspended, or a
// destination a new deny rule refuses, keeps no blind tunnel, no intercepted tunnel (nor the request
// in flight inside it) and no absolute-form request in flight; each is cut, its one record `deny` with
// `policy changed: <why>` and the bytes it carried. What the new snapshot still allows runs on. A
// reload that lands while an attempt is being admitted (its name being looked up) applies to it too.

const echo = await startEcho();
t.teardown(() => echo.close());

// The interception CA and the CA trusted for the intercepted destination, as files.
const dir = await mkdtemp(join(tmpdir(), 'dvx-door-reload-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const interceptCaKey = join(dir, 'ca-key.pem');
const interceptCaCert = join(dir, 'ca.pem');
const upstreamCa = join(dir, 'upstream-ca.pem');

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

/** A name whose lookup waits until the test releases it (to land a reload during admission). */
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

const denyLoopback = (reason: string) =>
  baseSnapshot({ platform: { destination_policy: { value: { deny: [{ cidr: '127.0.0.1/32', reason }] } } } });
const suspended = () => {
  const s = baseSnapshot();
  s.agents['agent-1'] = { ...s.agents['agent-1'], status: 'suspended' };
  return s;
};

const h = await startGatewayHarness({
  resolve: { 'blind.test': ['127.0.0.1'], 'other.test': ['127.0.0.1'], 'seen.test': ['127.0.0.1'] },
  lookup,
});
t.teardown(() => h.close());

/** A tunnel to the echo, its 200 received and bytes passed both ways. */
async function echoTunnel(host: string, token: string) {
  const c = await holdConnection(h, connectRequest(`${host}:${echo.port}`, token));
  t.equal(c.status, 200, `tunnel to ${host} open`);
  c.socket.write('ping');
  await until(() => c.received().endsWith('ping'));
  return c;
}

t.test('a blind tunnel of an agent suspended by a reload is cut, one record saying why', async (t) => {
  const before = flows(h).length;
  const tunnel = await echoTunnel('blind.test', await h.token());
  const other = await echoTunnel('other.test', await h.token({ sub: 'agent-2', org_id: 'org-1' }));
  await h.writeSnapshot(suspended());
  t.ok(await closedWithin(tunnel), 'the tunnel is cut');
  t.ok(await until(() => flows(h).length > before), 'the cut tunnel is recorded');
  const cut = flows(h).slice(before);
  t.equal(cut.length, 1, 'one record: the other agent’s tunnel still runs');
  t.match(cut[0], {
    agent_id: 'agent-1',
    dst: `blind.test:${echo.port}`,
    outcome: 'deny',
    reason: 'policy changed: agent is suspended',
    attrs: { status: '200', bytes_up: '4', bytes_down: '4' },
  });
  other.socket.write('pong');
  t.ok(await until(() => other.received().endsWith('pong')), 'the tunnel the snapshot still allows carries bytes');
  other.socket.end();
  await other.closed;
  await h.writeSnapshot(baseSnapshot());
  t.ok(await until(() => flows(h).length === before + 2));
  t.match(flows(h).slice(before + 1), [{ agent_id: 'agent-2', outcome: 'allow', reason: '' }]);
});

t.test('a new deny rule cuts the tunnels it refuses, by their pinned address', async (t) => {
  const before = flows(h).length;
  const tunnel = await echoTunnel('blind.test', await h.token());
  await h.writeSnapshot(denyLoopback('loopback closed by the operator'));
  t.ok(await closedWithin(tunnel), 'the tunnel is cut');
  t.ok(await until(() => flows(h).length > before));
  t.match(flows(h).slice(before), [
    {
      outcome: 'deny',
      reason: 'policy changed: loopback closed by the operator',
      dst_ip: '127.0.0.1',
      attrs: { bytes_up: '4', bytes_down: '4' },
    },
  ]);
  // A second reload that refuses it as well finds nothing open: still one record.
  await h.writeSnapshot(suspended());
  await h.writeSnapshot(baseSnapshot());
  t.equal(flows(h).length, before + 1, 'a flow cut is recorded once');
});

t.test('an absolute-form request in flight is cut by a reload that refuses it', async (t) => {
  const before = flows(h).length;
  const token = await h.token();
  const c = await holdConnection(
    h,
    `GET http://127.0.0.1:${plainPort}/stream HTTP/1.1\r\nHost: 127.0.0.1:${plainPort}\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`,
  );
  t.equal(c.status, 200);
  await until(() => c.received().includes('first chunk'));
  await h.writeSnapshot(denyLoopback('no loopback'));
  t.ok(await closedWithin(c), 'the connection is cut');
  t.ok(await until(() => flows(h).length > before));
  t.match(flows(h).slice(before), [
    { proto: 'http', outcome: 'deny', reason: 'policy changed: no loopback', attrs: { method: 'GET', status: '200' } },
  ]);
  await h.writeSnapshot(baseSnapshot());
});

t.test('a reload during admission (the name being looked up) applies before anything opens', async (t) => {
  const before = flows(h).length;
  const accepted = echo.accepted;
  const asked = new Promise<void>((resolve) => (slowAsked = resolve));
  const pending = holdConnection(h, connectRequest(`slow.test:${echo.port}`, await h.token()));
  await asked;
  await h.writeSnapshot(suspended());
  releaseSlow!();
  const c = await pending;
  t.equal(c.status, 403, 'refused by the snapshot current when it was admitted');
  t.ok(await until(() => flows(h).length > before));
  t.match(flows(h).slice(before), [{ outcome: 'deny', reason: 'agent is suspended', attrs: { status: '403' } }]);
  t.equal(echo.accepted, accepted, 'nothing reached the destination');
  await h.writeSnapshot(baseSnapshot());
});

t.test('an intercepted tunnel, and the request in flight inside it, are cut by the reload', async (t) => {
  const ca = await generateCa('door reload interception CA');
  await writeFile(interceptCaCert, ca.certPem);
  await writeFile(interceptCaKey, ca.keyPem);
  const leaf = await issueCertificate(h.ca, { commonName: 'seen.test', dnsNames: ['seen.test'] });
  const upstream = https.createServer({ cert: leaf.certPem, key: leaf.keyPem }, (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.write('first chunk\n');
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', () => resolve()));
  t.teardown(() => {
    upstream.closeAllConnections();
    return new Promise<void>((resolve) => upstream.close(() => resolve()));
  });
  const port = (upstream.address() as { port: number }).port;
  await writeFile(upstreamCa, h.ca.certPem);
  const gateway = await startGatewayHarness({
    resolve: { 'seen.test': ['127.0.0.1'] },
    gateway: { caCert: interceptCaCert, caKey: interceptCaKey, upstreamCa },
  });
  t.teardown(() => gateway.close());
  const before = flows(gateway).length;
  const c = await holdConnection(gateway, connectRequest(`seen.test:${port}`, await gateway.token()));
  t.equal(c.status, 200);
  const inner = tls.connect({ socket: c.socket, servername: 'seen.test', ca: ca.certPem });
  inner.on('error', () => {});
  await once(inner, 'secureConnect');
  let got = '';
  inner.on('data', (d: Buffer) => (got += d.toString('latin1')));
  inner.write('GET /stream HTTP/1.1\r\nHost: seen.test\r\n\r\n');
  t.ok(await until(() => got.includes('first chunk')), 'the answer is streaming');
  await gateway.writeSnapshot(suspended());
  t.ok(await closedWithin(c), 'the tunnel is cut');
  t.ok(await until(() => flows(gateway).length >= before + 2), 'the request and the tunnel are recorded');
  const records = flows(gateway).slice(before);
  t.equal(records.length, 2);
  t.match(
    records.find((r) => r.proto === 'https'),
    {
      outcome: 'deny',
      reason: 'policy changed: agent is suspended',
      attrs: { status: '200', method: 'GET' },
    },
  );
  t.match(
    records.find((r) => r.proto === 'tcp'),
    {
      outcome: 'deny',
      reason: 'policy changed: agent is suspended',
      attrs: { intercepted: 'true', requests: '1' },
    },
  );
});
