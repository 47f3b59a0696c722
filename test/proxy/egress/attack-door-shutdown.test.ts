import { once } from 'node:events';
import net from 'node:net';
import tls from 'node:tls';
import t from 'tap';
import { until } from '../../fixtures/eventually.ts';
import { connectRequest, exchangeOn } from './door-clients.ts';
import { interceptFlags, startCliWorld } from './e2e-cli-harness.ts';

// An attacker's review: at shutdown, a tunnel still open when the grace ended had only its agent's side
// closed; the destination's side was given a further grace the process did not wait for, so the
// tunnel's record was never written. `dvx serve gateway`, SIGTERM with tunnels open (two blind to a
// destination that never closes its side, one intercepted): every side is cut when the grace ends,
// and each tunnel has its one record on stdout before the process exits.

const world = await startCliWorld();
t.teardown(() => world.close());

// A destination that echoes and never ends its side, even when the gateway ends its own.
const sticky = net.createServer({ allowHalfOpen: true }, (s) => {
  s.on('error', () => {});
  s.on('data', (d) => s.write(d));
});
const stickySockets = new Set<net.Socket>();
sticky.on('connection', (s) => {
  stickySockets.add(s);
  s.once('close', () => stickySockets.delete(s));
});
await new Promise<void>((resolve) => sticky.listen(0, '127.0.0.1', () => resolve()));
t.teardown(() => {
  for (const s of stickySockets) s.destroy();
  return new Promise<void>((resolve) => sticky.close(() => resolve()));
});
const stickyPort = (sticky.address() as net.AddressInfo).port;

t.test('SIGTERM with tunnels open: one record per tunnel, written before the process exits', async (t) => {
  const gw = await world.gateway([...interceptFlags(world, null), '--no-capture-host', '127.0.0.1']);
  const token = await world.token();
  const open = async (authority: string) => {
    const socket = tls.connect({ host: '127.0.0.1', port: gw.port, ca: world.ca.certPem, servername: 'localhost' });
    socket.on('error', () => {});
    await once(socket, 'secureConnect');
    let got = '';
    socket.on('data', (d: Buffer) => (got += d.toString('latin1')));
    socket.write(connectRequest(authority, token));
    await until(() => got.includes('\r\n\r\n'));
    t.match(got, /^HTTP\/1\.1 200 /, `tunnel to ${authority} open`);
    return { socket, got: () => got };
  };
  const blind = [await open(`127.0.0.1:${stickyPort}`), await open(`127.0.0.1:${stickyPort}`)];
  for (const b of blind) {
    b.socket.write('ping');
    t.ok(await until(() => b.got().endsWith('ping')), 'bytes both ways');
  }
  const intercepted = await open(`localhost:${world.secureEcho.port}`);
  intercepted.socket.removeAllListeners('data');
  const inner = tls.connect({ socket: intercepted.socket, servername: 'localhost', ca: await interceptCa() });
  inner.on('error', () => {});
  await once(inner, 'secureConnect');
  const answer = await exchangeOn(inner, 'GET /one HTTP/1.1\r\nHost: localhost\r\n\r\n');
  t.equal(answer.status, 200, 'a request inside the intercepted tunnel, which stays open');
  const code = await gw.stop(30_000);
  t.equal(code, 0, `exited cleanly: ${gw.stderr()}`);
  const records = gw.records('network_flow').filter((r) => r.proto === 'tcp');
  t.equal(records.length, 3, 'one record per tunnel');
  for (const r of records.filter((r) => r.dst === `127.0.0.1:${stickyPort}`))
    t.match(r, {
      outcome: 'deny',
      reason: 'the gateway is shutting down',
      attrs: { status: '200', bytes_up: '4', bytes_down: '4' },
    });
  t.match(
    records.find((r) => r.dst === `localhost:${world.secureEcho.port}`),
    {
      reason: 'the gateway is shutting down',
      attrs: { intercepted: 'true', requests: '1' },
    },
  );
  t.equal(gw.records('network_flow').filter((r) => r.proto === 'https').length, 1, 'and the request inside');
});

async function interceptCa(): Promise<string> {
  const { readFile } = await import('node:fs/promises');
  return readFile(world.interceptCaFile, 'utf8');
}
