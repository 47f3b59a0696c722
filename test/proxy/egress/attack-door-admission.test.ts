import { once } from 'node:events';
import tls from 'node:tls';
import t from 'tap';
import type { Lookup } from '../../../proxy/egress/resolve.ts';
import { until } from '../../fixtures/eventually.ts';
import { connectRequest, flows, holdConnection } from './door-clients.ts';
import { startEcho, startGatewayHarness } from './gateway-harness.ts';

// An attacker's review: a client that left while its CONNECT was being admitted (its name being looked
// up) still got a connection opened to the destination, and no record. After every wait of admission
// the client is checked: gone, nothing is opened, and the attempt is recorded `deny`, `client went
// away`. A failure of the gateway's own during admission answers 502 and is recorded, never a socket
// left hanging or a flow without its record.

const echo = await startEcho();
t.teardown(() => echo.close());

const waiting = new Map<string, () => void>();
let asked: ((host: string) => void) | null = null;
const lookup: Lookup = async (host) => {
  if (host === 'broken.test') return [{ address: 'not-an-address', family: 4 }];
  asked?.(host);
  await new Promise<void>((resolve) => waiting.set(host, resolve));
  return [{ address: '127.0.0.1', family: 4 }];
};
const h = await startGatewayHarness({ lookup });
t.teardown(async () => {
  for (const release of waiting.values()) release();
  await h.close();
});

/** Sends `request`, waits until the gateway looks `host` up, then leaves; the lookup then answers. */
async function leaveDuringLookup(request: string, host: string, dst: string): Promise<boolean> {
  const lookedUp = new Promise<void>((resolve) => (asked = (name) => name === host && resolve()));
  const socket = tls.connect({ host: '127.0.0.1', port: h.port, ca: h.ca.certPem, servername: 'localhost' });
  socket.on('error', () => {});
  await once(socket, 'secureConnect');
  socket.write(request);
  await lookedUp;
  socket.destroy();
  await once(socket, 'close');
  // The gateway sees the client leave while the lookup still runs: the attempt ends (and is recorded)
  // without waiting for it; the lookup answering afterwards changes nothing.
  const recorded = await until(() =>
    h.logs.some((l) => l.msg === 'attempt abandoned: client went away' && l.dst === dst),
  );
  waiting.get(host)!();
  return recorded;
}

t.test('a CONNECT whose client leaves during the lookup opens nothing, and is recorded', async (t) => {
  const before = flows(h).length;
  const accepted = echo.accepted;
  t.ok(
    await leaveDuringLookup(
      connectRequest(`gone.test:${echo.port}`, await h.token()),
      'gone.test',
      `gone.test:${echo.port}`,
    ),
    'the attempt ended as its client left, the lookup still running',
  );
  t.ok(await until(() => flows(h).length > before), 'recorded');
  t.match(flows(h).slice(before), [
    { proto: 'tcp', dst: `gone.test:${echo.port}`, outcome: 'deny', reason: 'client went away', agent_id: 'agent-1' },
  ]);
  // A later tunnel to the same destination is the first connection it ever gets from this test.
  const c = await holdConnection(h, connectRequest(`127.0.0.1:${echo.port}`, await h.token()));
  t.equal(c.status, 200);
  c.socket.end();
  await c.closed;
  t.equal(echo.accepted, accepted + 1, 'no connection was opened for the client that left');
});

t.test('an absolute-form request whose client leaves during the lookup is recorded, not forwarded', async (t) => {
  const before = flows(h).length;
  const accepted = echo.accepted;
  const token = await h.token();
  t.ok(
    await leaveDuringLookup(
      `GET http://away.test:${echo.port}/ HTTP/1.1\r\nHost: away.test:${echo.port}\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`,
      'away.test',
      `away.test:${echo.port}`,
    ),
  );
  t.ok(await until(() => flows(h).length > before));
  t.match(flows(h).slice(before), [{ proto: 'http', outcome: 'deny', reason: 'client went away' }]);
  t.equal(echo.accepted, accepted, 'nothing reached the destination');
});

t.test('a failure of the gateway’s own during admission: 502 and a record, not a hung socket', async (t) => {
  const before = flows(h).length;
  const c = await holdConnection(h, connectRequest(`broken.test:${echo.port}`, await h.token()));
  t.equal(c.status, 502);
  await c.closed;
  t.ok(await until(() => flows(h).length > before));
  t.match(flows(h).slice(before), [
    { dst: `broken.test:${echo.port}`, outcome: 'deny', reason: /^gateway error: /, attrs: { status: '502' } },
  ]);
});
