import net from 'node:net';
import t from 'tap';
import { curl, parseAnswer, rawExchange, startEcho, startGatewayHarness, viaGateway } from './gateway-harness.ts';

// What the gateway refuses before anything is forwarded: absolute-form requests without a token, to a
// refused destination, or of another scheme; targets that do not parse (a CONNECT without a port, a
// port out of range, an IPv6 address without brackets, credentials in a URL); a Host header that
// names another host, or two of them. Forwarding an allowed absolute-form request is the exchange's
// (tested with it); here, only that a refusal happens before it, is answered whole and is recorded.

const h = await startGatewayHarness({ gateway: { denyDest: ['host=blocked.test,reason=no blocked hosts'] } });
t.teardown(() => h.close());
const echo = await startEcho();
t.teardown(() => echo.close());

t.test('absolute-form without a token: 407 with Proxy-Authenticate', async (t) => {
  const r = await curl([...viaGateway(h), '-i', `http://127.0.0.1:${echo.port}/`]);
  const a = parseAnswer(r.stdout.replace(/\r?\n/g, '\r\n'));
  t.equal(a.status, 407);
  t.equal(a.headers['proxy-authenticate'], 'Bearer realm="dvx-gateway"');
  t.equal(echo.accepted, 0, 'nothing reached the destination');
});

t.test('absolute-form to a refused destination: 403 naming the reason, recorded, never resolved', async (t) => {
  const before = h.audit.length;
  const r = await curl([...viaGateway(h, await h.token()), '-w', '\n%{http_code}', 'http://blocked.test/x?y=1']);
  const [body, status] = r.stdout.split('\n');
  t.equal(status, '403');
  t.same(JSON.parse(body), {
    type: 'error',
    error: { type: 'destination_denied', message: 'destination refused: no blocked hosts' },
  });
  t.notOk(h.lookups.includes('blocked.test'), 'the refused name was never looked up');
  const [flow] = await h.flowsAfter(before);
  t.match(flow, {
    action: 'http.request',
    proto: 'http',
    dst: 'blocked.test:80',
    dst_host: 'blocked.test',
    dst_port: 80,
    dst_ip: '',
    outcome: 'deny',
    reason: 'no blocked hosts',
    attrs: { method: 'GET', url: 'http://blocked.test/x?y=1', status: '403' },
  });
});

t.test('a refused request with a body: answered, and its connection closed rather than read to the end', async (t) => {
  const raw = await rawExchange(
    h,
    `POST http://blocked.test/upload HTTP/1.1\r\nHost: blocked.test\r\nContent-Length: 1000000000\r\nProxy-Authorization: Bearer ${await h.token()}\r\n\r\nfirst bytes`,
  );
  const a = parseAnswer(raw.text);
  t.equal(a.status, 403);
  t.equal(a.headers.connection, 'close');
  t.ok(raw.closed, 'closed without waiting for a gigabyte');
});

t.test('absolute-form of another scheme, with credentials, or with a Host of another host: 400', async (t) => {
  const token = await h.token();
  const auth = `Proxy-Authorization: Bearer ${token}\r\n`;
  for (const [line, host, why] of [
    ['GET https://example.com/ HTTP/1.1', 'example.com', /open a CONNECT tunnel/],
    ['GET ftp://example.com/file HTTP/1.1', 'example.com', /only http:\/\//],
    ['GET http://user:pw@example.com/ HTTP/1.1', 'example.com', /credentials/],
    ['GET http://example.com/ HTTP/1.1', 'other.example', /does not name the target example\.com:80/],
    ['GET http://example.com:8080/ HTTP/1.1', 'example.com', /does not name the target example\.com:8080/],
    ['GET http://example.com:99999/ HTTP/1.1', 'example.com:99999', /not an absolute URL|port/],
  ] as [string, string, RegExp][]) {
    const raw = await rawExchange(h, `${line}\r\nHost: ${host}\r\n${auth}\r\n`);
    const a = parseAnswer(raw.text);
    t.equal(a.status, 400, line);
    t.match(JSON.parse(a.body), { type: 'error', error: { type: 'invalid_request_error', message: why } }, line);
  }
  const twice = parseAnswer(
    (await rawExchange(h, `GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nHost: evil.example\r\n${auth}\r\n`))
      .text,
  );
  t.equal(twice.status, 400, 'two Host headers');
  t.equal(h.lookups.filter((n) => n === 'example.com').length, 0, 'none of them was resolved');
});

t.test('CONNECT targets that do not parse: 400, recorded with the text asked', async (t) => {
  const token = await h.token();
  for (const target of [
    'example.com',
    ':443',
    'example.com:0',
    'example.com:65536',
    'example.com:+443',
    'example.com:0443',
    '::1:443',
    '[zz::1]:443',
    '[example.com]:443',
    'user@example.com:443',
    'example.com:443/path',
  ]) {
    const before = h.audit.length;
    const raw = await rawExchange(h, `CONNECT ${target} HTTP/1.1\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`);
    const a = parseAnswer(raw.text);
    t.equal(a.status, 400, target);
    t.ok(raw.closed, `${target}: closed`);
    t.match(JSON.parse(a.body), { type: 'error', error: { type: 'invalid_request_error', message: /CONNECT target/ } });
    const [flow] = await h.flowsAfter(before);
    t.match(flow, { dst: target, dst_host: '', dst_port: 0, outcome: 'deny', attrs: { status: '400' } });
  }
  // A Host header that names another host than the CONNECT's.
  const a = parseAnswer(
    (
      await rawExchange(
        h,
        `CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\nHost: elsewhere.example:${echo.port}\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`,
      )
    ).text,
  );
  t.equal(a.status, 400);
  t.match(a.body, /does not name the target/);
  t.equal(echo.accepted, 0);
});

t.test('control characters and smuggling shapes never reach a door', async (t) => {
  const token = await h.token();
  for (const text of [
    `CONNECT exa\u0000mple.com:443 HTTP/1.1\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`,
    `GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nProxy-Authorization: Bearer ${token}\r\n\r\n0\r\n\r\n`,
    `GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nX-A: b\rc\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`,
  ]) {
    const a = parseAnswer((await rawExchange(h, text)).text);
    t.equal(a.status, 400, JSON.stringify(text.slice(0, 40)));
  }
});

t.test('an IPv6 literal in brackets is a target like any other', async (t) => {
  const v6 = net.createServer((s) => s.end('v6 here'));
  const listening = await new Promise<boolean>((resolve) => {
    v6.once('error', () => resolve(false));
    v6.listen(0, '::1', () => resolve(true));
  });
  if (!listening) {
    t.comment('no IPv6 loopback on this machine: nothing to tunnel to');
    return;
  }
  t.teardown(() => new Promise<void>((resolve) => v6.close(() => resolve())));
  const port = (v6.address() as net.AddressInfo).port;
  const before = h.audit.length;
  const raw = await rawExchange(
    h,
    `CONNECT [::1]:${port} HTTP/1.1\r\nHost: [::1]:${port}\r\nProxy-Authorization: Bearer ${await h.token()}\r\n\r\n`,
  );
  t.match(raw.text, /^HTTP\/1\.1 200 Connection Established\r\n\r\nv6 here$/);
  const [flow] = await h.flowsAfter(before);
  t.match(flow, { dst: `[::1]:${port}`, dst_host: '::1', dst_ip: '::1', outcome: 'allow' });
});
