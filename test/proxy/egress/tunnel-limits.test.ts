import { spawn } from 'node:child_process';
import net from 'node:net';
import tls from 'node:tls';
import t from 'tap';
import { metric, until } from '../../fixtures/eventually.ts';
import {
  parseAnswer,
  rawExchange,
  startEcho,
  startGatewayHarness,
  startSilent,
  type GatewayHarness,
} from './gateway-harness.ts';

// What bounds a tunnel, with real sockets and small bounds: a client that never finishes its CONNECT
// (the server's headers timeout), a destination that accepts and never answers (the tunnel idle
// timeout), a port that refuses (502), a name that does not resolve (502) or not in time (504), and
// shutdown (new attempts 503, open tunnels carry on within the grace). The only times asserted are
// generous "closed within" bounds.

const h = await startGatewayHarness({
  gateway: {
    headersTimeout: 300,
    requestTimeout: 600,
    idleTimeout: 1_500,
    tunnelIdleTimeout: 1_000,
    connectTimeout: 500,
  },
  resolve: { 'slow.test': [] },
  lookup: (host) =>
    host === 'never.test'
      ? new Promise(() => {})
      : Promise.reject(Object.assign(new Error('no'), { code: 'ENOTFOUND' })),
});
t.teardown(() => h.close());
const echo = await startEcho();
t.teardown(() => echo.close());
const silent = await startSilent();
t.teardown(() => silent.close());

async function connectText(g: GatewayHarness, target: string, extra = '', ms = 10_000) {
  return rawExchange(
    g,
    `CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: Bearer ${await g.token()}\r\n\r\n${extra}`,
    ms,
  );
}

t.test('a client that never finishes its CONNECT is answered 408 and closed (the headers bound)', async (t) => {
  const r = await rawExchange(h, `CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\nHost: 127.0.0.1`, 10_000);
  t.ok(r.closed, 'closed by the headers bound');
  t.equal(parseAnswer(r.text).status, 408);
  t.equal(echo.accepted, 0, 'the destination was never connected to');
});

t.test('a destination that accepts and never answers: the tunnel is closed when idle, recorded', async (t) => {
  const before = h.audit.length;
  const r = await connectText(h, `127.0.0.1:${silent.port}`, 'hello?');
  t.ok(r.closed, 'closed by the tunnel idle bound');
  t.match(r.text, /^HTTP\/1\.1 200 Connection Established\r\n\r\n$/);
  const [flow] = await h.flowsAfter(before);
  t.match(flow, { outcome: 'allow', reason: 'idle for 1000 ms', attrs: { bytes_up: '6', bytes_down: '0' } });
  t.equal(silent.accepted, 1, 'the destination saw one connection');
});

t.test('a tunnel outlives the server’s idle bound while it carries bytes', async (t) => {
  const token = await h.token();
  const got = await new Promise<string>((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port: h.port, ca: h.ca.certPem, servername: 'localhost' }, () =>
      s.write(`CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`),
    );
    let text = '';
    let n = 0;
    s.on('data', (d: Buffer) => {
      text += d.toString('latin1');
      // One character every 200 ms, fifteen times: 3 s in all, past the 1.5 s idle bound of the listener.
      if (text.endsWith('\r\n\r\n') || text.endsWith(String.fromCharCode(96 + n))) {
        if (n === 15) s.end();
        else setTimeout(() => s.write(String.fromCharCode(97 + n++)), 200);
      }
    });
    s.on('error', reject);
    s.on('close', () => resolve(text));
  });
  t.equal(parseAnswer(got).body, 'abcdefghijklmno');
});

t.test('a port that refuses: 502 Upstream request failed, recorded', async (t) => {
  const closed = net.createServer();
  await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', () => resolve()));
  const port = (closed.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => closed.close(() => resolve()));
  const before = h.audit.length;
  const r = await connectText(h, `127.0.0.1:${port}`);
  const a = parseAnswer(r.text);
  t.equal(a.status, 502);
  t.equal(a.headers['content-type'], 'text/plain; charset=utf-8');
  t.equal(a.body, 'Upstream request failed');
  t.ok(r.closed);
  const [flow] = await h.flowsAfter(before);
  t.match(flow, {
    outcome: 'deny',
    dst_ip: '127.0.0.1',
    reason: `cannot connect to 127.0.0.1:${port}: ECONNREFUSED`,
    attrs: { status: '502' },
  });
});

t.test('a destination that does not complete the TCP handshake in time: 504, recorded', async (t) => {
  // A listener whose accept queue (backlog 0) is held full by one connection: the kernel drops the
  // next SYNs, so a connect stays pending. node accepts at once, so the listener is a python socket.
  const listener = spawn('python3', [
    '-c',
    "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen(0)\nprint(s.getsockname()[1],flush=True)\ntime.sleep(60)",
  ]);
  t.teardown(() => listener.kill('SIGKILL'));
  const port = await new Promise<number | null>((resolve) => {
    listener.on('error', () => resolve(null));
    listener.stdout.once('data', (d: Buffer) => resolve(Number(d.toString().trim())));
  });
  if (port === null) {
    t.comment('no python3 here: a listener that never accepts cannot be made');
    return;
  }
  const filler = net.connect(port, '127.0.0.1');
  t.teardown(() => filler.destroy());
  await new Promise<void>((resolve) => filler.once('connect', () => resolve()));
  const before = h.audit.length;
  const r = await connectText(h, `127.0.0.1:${port}`);
  const a = parseAnswer(r.text);
  t.equal(a.status, 504);
  t.match(JSON.parse(a.body), { error: { type: 'timeout_error' } });
  const [flow] = await h.flowsAfter(before);
  t.match(flow, {
    outcome: 'deny',
    reason: `127.0.0.1:${port} not connected within --connect-timeout (500 ms)`,
    attrs: { status: '504' },
  });
});

t.test('a name that does not resolve: 502; one that takes too long: 504; one with no address: 403', async (t) => {
  const before = h.audit.length;
  const nx = parseAnswer((await connectText(h, 'nowhere.test:443')).text);
  t.equal(nx.status, 502);
  t.equal(nx.body, 'Upstream request failed');
  const none = parseAnswer((await connectText(h, 'slow.test:443')).text);
  t.equal(none.status, 403);
  // Last: the lookup that never returns keeps the agent's one lookup slot (lookup-limits.ts) after its
  // caller has given up, so the agent's later names would wait behind it.
  const slow = parseAnswer((await connectText(h, 'never.test:443')).text);
  t.equal(slow.status, 504);
  t.match(JSON.parse(slow.body), { error: { type: 'timeout_error' } });
  const flows = await h.flowsAfter(before, 3);
  t.match(flows, [
    { reason: 'cannot resolve nowhere.test: ENOTFOUND' },
    { reason: 'the name resolved to no address' },
    { reason: 'resolving never.test took longer than 500 ms' },
  ]);
});

t.test('1,000 concurrent tunnels', async (t) => {
  // One client address opens them all: the per-client bound (256 by default) is raised for it.
  const g = await startGatewayHarness({ gateway: { maxConnectionsPerClient: 2_000 } });
  t.teardown(() => g.close());
  const token = await g.token();
  const N = 1_000;
  const sockets: tls.TLSSocket[] = [];
  t.teardown(() => {
    for (const s of sockets) s.destroy();
  });
  const open = (i: number) =>
    new Promise<void>((resolve, reject) => {
      const s = tls.connect({ host: '127.0.0.1', port: g.port, ca: g.ca.certPem, servername: 'localhost' }, () =>
        s.write(`CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`),
      );
      sockets.push(s);
      let text = '';
      s.on('data', (d: Buffer) => {
        text += d.toString('latin1');
        if (text === 'HTTP/1.1 200 Connection Established\r\n\r\n') s.write(`tunnel-${i};`);
        else if (text.endsWith(`tunnel-${i};`)) resolve();
      });
      s.on('error', reject);
      s.on('close', () => reject(new Error(`tunnel ${i} closed early: ${JSON.stringify(text)}`)));
    });
  await Promise.all(Array.from({ length: N }, (_, i) => open(i)));
  t.equal(await metric(g.registry, 'dvx_gateway_tunnels_open', { kind: 'blind' }), N, 'all open at once');
  const before = g.audit.length;
  for (const s of sockets) s.end();
  const flows = await g.flowsAfter(before, N);
  t.equal(
    flows.filter((f) => f.outcome === 'allow' && f.reason === '').length,
    N,
    'each recorded once, closed cleanly',
  );
  t.ok(await until(async () => (await metric(g.registry, 'dvx_gateway_tunnels_open', { kind: 'blind' })) === 0));
});

t.test('shutdown: new attempts get 503, an open tunnel carries on within the grace', async (t) => {
  const g = await startGatewayHarness();
  const token = await g.token();
  const tunnel = tls.connect({ host: '127.0.0.1', port: g.port, ca: g.ca.certPem, servername: 'localhost' });
  t.teardown(() => tunnel.destroy());
  let text = '';
  tunnel.on('data', (d: Buffer) => (text += d.toString('latin1')));
  tunnel.write(`CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`);
  t.ok(await until(() => text.endsWith('\r\n\r\n')), 'tunnel open');
  // A connection with a CONNECT under way (its header not finished) when the shutdown starts.
  const late = tls.connect({ host: '127.0.0.1', port: g.port, ca: g.ca.certPem, servername: 'localhost' });
  t.teardown(() => late.destroy());
  let lateText = '';
  let lateClosed = false;
  late.on('data', (d: Buffer) => (lateText += d.toString('latin1')));
  late.on('close', () => (lateClosed = true));
  await new Promise<void>((resolve) => late.once('secureConnect', () => resolve()));
  late.write(`CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\n`);
  await new Promise((r) => setTimeout(r, 50));
  const closing = g.close();
  late.write(`Proxy-Authorization: Bearer ${token}\r\n\r\n`);
  t.ok(await until(() => lateClosed, 10_000), 'the late attempt is answered and closed');
  t.equal(parseAnswer(lateText).status, 503);
  tunnel.write('still here');
  t.ok(await until(() => text.endsWith('still here'), 4_000), 'the open tunnel still carries bytes');
  tunnel.end();
  await closing;
  t.pass('closed once the tunnel ended');
});
