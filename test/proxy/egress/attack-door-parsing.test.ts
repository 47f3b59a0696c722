import { once } from 'node:events';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import t from 'tap';
import { generateCa } from '../../../core/tls.ts';
import { validateRules } from '../../../pipeline/policy/governance.ts';
import { parseDestRule } from '../../../proxy/egress/destination.ts';
import { GatewayRuleError } from '../../../proxy/egress/errors.ts';
import { startGateway } from '../../../proxy/egress/server.ts';
import { runDvx } from '../../fixtures/run-dvx.ts';
import { connectRequest, exchangeOn, flows, holdConnection } from './door-clients.ts';
import {
  baseSnapshot,
  parseAnswer,
  rawExchange,
  startEcho,
  startGatewayHarness,
  startHttps,
} from './gateway-harness.ts';

// An attacker's review of the door's parsing: a host with userinfo (`denied@allowed`) in the Host
// header, the CONNECT authority or an absolute URL is refused 400, never matched by the part after the
// `@`; a name longer than 253 bytes or with a label over 63 is refused 400; a cidr rule with an IPv6
// zone id (`fe80::1%eth0/64`) is refused where rules are validated (the command line, the snapshot,
// the control plane's API, which share one validation).

const echo = await startEcho();
t.teardown(() => echo.close());
const dir = await mkdtemp(join(tmpdir(), 'dvx-door-parsing-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const h = await startGatewayHarness({
  resolve: { 'allowed.test': ['127.0.0.1'], 'denied.test': ['127.0.0.1'] },
  gateway: { allowDest: [`host=allowed.test,port=${echo.port}`, 'cidr=127.0.0.1/32'] },
});
t.teardown(() => h.close());

const ask = async (text: string) =>
  parseAnswer((await rawExchange(h, text, 10_000, {}, (got) => got.includes('\r\n\r\n'))).text);

t.test('userinfo is refused 400 wherever a host is named, never matched after the @', async (t) => {
  const token = await h.token();
  const auth = `Proxy-Authorization: Bearer ${token}\r\n`;
  const accepted = echo.accepted;
  const cases: [string, string][] = [
    [
      'CONNECT with Host: denied@allowed',
      `CONNECT allowed.test:${echo.port} HTTP/1.1\r\nHost: denied.test@allowed.test:${echo.port}\r\n${auth}\r\n`,
    ],
    ['CONNECT authority with userinfo', `CONNECT denied.test@allowed.test:${echo.port} HTTP/1.1\r\n${auth}\r\n`],
    [
      'absolute URL with userinfo',
      `GET http://denied.test@allowed.test:${echo.port}/ HTTP/1.1\r\nHost: allowed.test:${echo.port}\r\n${auth}\r\n`,
    ],
    [
      'absolute form with Host: denied@allowed',
      `GET http://allowed.test:${echo.port}/ HTTP/1.1\r\nHost: denied.test@allowed.test:${echo.port}\r\n${auth}\r\n`,
    ],
    [
      'Host with a percent-encoded name',
      `CONNECT allowed.test:${echo.port} HTTP/1.1\r\nHost: %61llowed.test:${echo.port}\r\n${auth}\r\n`,
    ],
  ];
  for (const [name, text] of cases) {
    const a = await ask(text);
    t.equal(a.status, 400, name);
    t.match(JSON.parse(a.body), { error: { type: 'invalid_request_error' } }, name);
  }
  t.equal(echo.accepted, accepted, 'nothing reached a destination');
});

t.test('names past DNS limits are refused 400, before any lookup', async (t) => {
  const token = await h.token();
  const label63 = 'a'.repeat(63);
  const long = `${[label63, label63, label63, 'a'.repeat(57)].join('.')}.test`; // 254 bytes
  t.equal(long.length, 254);
  const asked = h.lookups.length;
  const before = flows(h).length;
  for (const host of [long, `${'b'.repeat(64)}.test`, 'a..test']) {
    const a = await ask(connectRequest(`${host}:443`, token));
    t.equal(a.status, 400, `CONNECT ${host.slice(0, 20)}… (${host.length} bytes)`);
    t.match(a.body, /is not a host name/);
    const b = await ask(
      `GET http://${host}/ HTTP/1.1\r\nHost: ${host}\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`,
    );
    t.equal(b.status, 400, `absolute form ${host.slice(0, 20)}…`);
  }
  t.equal(h.lookups.length, asked, 'none was looked up');
  t.ok(flows(h).length >= before + 6, 'each refusal recorded');
  // At the limits, a name is a name: 253 bytes and 63-byte labels go on to the lookup (and fail there).
  const max = `${[label63, label63, label63, 'a'.repeat(61)].join('.')}`;
  t.equal(max.length, 253);
  const a = await ask(connectRequest(`${max}:443`, token));
  t.not(a.status, 400, 'a 253-byte name is not refused as malformed');
});

t.test('inside an intercepted tunnel, Host: x@<the tunnel’s address> is refused 400', async (t) => {
  const ca = await generateCa('door parsing interception CA');
  await writeFile(join(dir, 'ca.pem'), ca.certPem);
  await writeFile(join(dir, 'ca-key.pem'), ca.keyPem);
  // The destination's certificate comes from a CA of its own, which the gateway trusts (--upstream-ca).
  const destCa = await generateCa('door parsing destination CA');
  await writeFile(join(dir, 'upstream-ca.pem'), destCa.certPem);
  const https = await startHttps(destCa);
  t.teardown(() => https.close());
  const gw = await startGatewayHarness({
    gateway: { caCert: join(dir, 'ca.pem'), caKey: join(dir, 'ca-key.pem'), upstreamCa: join(dir, 'upstream-ca.pem') },
  });
  t.teardown(() => gw.close());
  const c = await holdConnection(gw, connectRequest(`127.0.0.1:${https.port}`, await gw.token()));
  t.equal(c.status, 200);
  const inner = tls.connect({ socket: c.socket, ca: ca.certPem, host: '127.0.0.1' });
  inner.on('error', () => {});
  await once(inner, 'secureConnect');
  const ok = await exchangeOn(inner, `GET /fine HTTP/1.1\r\nHost: 127.0.0.1:${https.port}\r\n\r\n`);
  t.equal(ok.status, 200, 'the tunnel’s own host');
  const bad = await exchangeOn(inner, `GET /x HTTP/1.1\r\nHost: denied.test@127.0.0.1:${https.port}\r\n\r\n`);
  t.equal(bad.status, 400, 'userinfo in Host is refused, not read as the address after it');
  const url = await holdConnection(gw, connectRequest(`127.0.0.1:${https.port}`, await gw.token()));
  const inner2 = tls.connect({ socket: url.socket, ca: ca.certPem, host: '127.0.0.1' });
  inner2.on('error', () => {});
  await once(inner2, 'secureConnect');
  const withUser = await exchangeOn(
    inner2,
    `GET https://denied.test@127.0.0.1:${https.port}/x HTTP/1.1\r\nHost: 127.0.0.1:${https.port}\r\n\r\n`,
  );
  t.equal(withUser.status, 400, 'an absolute target with userinfo inside the tunnel is refused');
  inner.destroy();
  inner2.destroy();
});

t.test('an IPv6 zone id in a cidr rule is refused where rules are validated', async (t) => {
  t.throws(() => parseDestRule('cidr=fe80::1%eth0/64', '--allow-dest'), GatewayRuleError);
  t.throws(() => parseDestRule('fe80::1%eth0/64', '--deny-dest'), /zone id/);
  t.throws(() => parseDestRule('{"cidr":"fe80::%25eth0/10"}', '--allow-dest'), /zone id/);
  t.throws(() => validateRules([{ cidr: 'fe80::1%eth0/64' }], 'allow'), /allow\[0\]\.cidr.*zone id/);
  t.throws(() => validateRules([{ cidr: 'fe80::1%1' }], 'deny'), /zone id/);
  t.same(validateRules([{ cidr: 'fe80::/64' }], 'allow'), [{ cidr: 'fe80::/64' }], 'the network alone is a rule');
  await t.rejects(
    startGateway({
      addr: '127.0.0.1:0',
      tlsCert: join(h.dir, 'server.pem'),
      tlsKey: join(h.dir, 'server-key.pem'),
      agentJwks: join(h.dir, 'jwks.json'),
      allowDest: ['cidr=fe80::1%eth0/64'],
    }),
    /--allow-dest "cidr=fe80::1%eth0\/64": .*zone id/,
  );
  // A snapshot carrying one is refused at reload; the last good one stays.
  const before = h.logs.length;
  await h.writeSnapshot(
    baseSnapshot({ platform: { destination_policy: { value: { deny: [{ cidr: 'fe80::1%eth0/64' }] } } } }),
  );
  t.ok(
    h.logs.slice(before).some((l) => /policy snapshot reload refused/.test(String(l.msg))),
    'the snapshot with the zone id is refused',
  );
  const r = await runDvx([
    'serve',
    'gateway',
    '--tls-cert',
    join(h.dir, 'server.pem'),
    '--tls-key',
    join(h.dir, 'server-key.pem'),
    '--agent-jwks',
    join(h.dir, 'jwks.json'),
    '--deny-dest',
    'cidr=fe80::1%eth0/64',
  ]);
  t.not(r.code, 0, 'dvx serve gateway refuses to start');
  t.match(r.stderr, /zone id/);
});
