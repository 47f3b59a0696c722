import t from 'tap';
import { parseAnswer, rawExchange, startEcho, startGatewayHarness, type GatewayHarness } from './gateway-harness.ts';

// Attacks on the destination policy at the door (P11 review), with raw CONNECTs through a real gateway
// and real destinations:
//   - a catch-all cidr allow rule (`cidr=0.0.0.0/0,port=N`, the documented spelling of "a port
//     alone", or `::/0`) must not open the guarded ranges (cloud metadata) nor loopback and private
//     ranges, which only a rule naming their range reaches;
//   - an IPv4 address embedded in the NAT64 well-known prefix (`64:ff9b::/96`, what DNS64 answers in
//     IPv6-only clusters, and what an agent can type) is checked as the IPv4 address it reaches: a
//     cidr or address deny rule, and the guards, are not dodged by the spelling.

const echo = await startEcho();
t.teardown(() => echo.close());

async function connect(h: GatewayHarness, target: string) {
  const raw = await rawExchange(
    h,
    `CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: Bearer ${await h.token()}\r\n\r\nping`,
    10_000,
    {},
    (got) => got.endsWith('\r\n\r\nping'),
  );
  return { ...parseAnswer(raw.text), text: raw.text };
}

function refusal(a: { status: number; body: string }): string {
  if (a.status !== 403) return `status ${a.status}`;
  return (JSON.parse(a.body) as { error: { message: string } }).error.message;
}

t.test('a catch-all cidr allow rule does not reach metadata, loopback or private ranges', async (t) => {
  const start = (allowDest: string[]) =>
    startGatewayHarness({
      gateway: { allowDest, connectTimeout: 2_000 },
      resolve: {
        'metadata.test': ['169.254.169.254'],
        'loop.test': ['127.0.0.1'],
        'corp.test': ['10.1.2.3'],
        'v6meta.test': ['fe80::1'],
      },
    });
  for (const rule of [`cidr=0.0.0.0/0,port=${echo.port}`, 'cidr=0.0.0.0/0', 'cidr=::/0', 'cidr=::ffff:0.0.0.0/96']) {
    const h = await start([rule]);
    t.teardown(() => h.close());
    const loop = await connect(h, `loop.test:${echo.port}`);
    t.equal(loop.status, 403, `${rule}: loopback refused (${refusal(loop)})`);
    t.notMatch(loop.text, /ping$/, `${rule}: no byte reached the loopback destination`);
    t.equal((await connect(h, `127.0.0.1:${echo.port}`)).status, 403, `${rule}: loopback literal refused`);
    for (const port of [80, echo.port]) {
      const meta = await connect(h, `metadata.test:${port}`);
      if (rule.includes(',port=') && port !== echo.port) t.equal(meta.status, 403, 'not the rule’s port');
      else t.match(refusal(meta), /169\.254\.169\.254 is a link-local/, `${rule}: metadata refused (port ${port})`);
    }
    if (!rule.includes(',port=')) {
      t.match(refusal(await connect(h, 'corp.test:5432')), /private address 10\.1\.2\.3/, `${rule}: private refused`);
      if (rule === 'cidr=::/0') t.match(refusal(await connect(h, 'v6meta.test:80')), /fe80::1 is a link-local/);
    }
  }
  // A rule that names the range still reaches it.
  const named = await start([`cidr=127.0.0.0/8,port=${echo.port}`, 'cidr=10.0.0.0/8', 'cidr=169.254.169.254/32']);
  t.teardown(() => named.close());
  const loop = await connect(named, `loop.test:${echo.port}`);
  t.equal(loop.status, 200, 'a rule naming 127.0.0.0/8 reaches loopback');
  t.match(loop.text, /\r\n\r\nping$/);
  t.not(
    (await connect(named, 'corp.test:1')).status,
    403,
    'a rule naming 10.0.0.0/8 admits 10.1.2.3 (unreachable here)',
  );
  t.not((await connect(named, 'metadata.test:80')).status, 403, 'a rule naming the metadata address admits it');
});

t.test('NAT64: an embedded IPv4 address is checked as the address it reaches', async (t) => {
  const h = await startGatewayHarness({
    gateway: { denyDest: ['cidr=10.0.0.0/8,reason=no internal networks', '192.0.2.7'], connectTimeout: 2_000 },
    resolve: {
      'dns64.test': ['64:ff9b::a00:5'],
      'dns64-meta.test': ['64:ff9b::a9fe:a9fe'],
      'dns64-public.test': ['64:ff9b::5db8:d70e'],
    },
  });
  t.teardown(() => h.close());
  t.equal(refusal(await connect(h, 'dns64.test:443')), 'destination refused: no internal networks', 'DNS64 answer');
  t.equal(refusal(await connect(h, '[64:ff9b::10.0.0.5]:443')), 'destination refused: no internal networks');
  t.equal(refusal(await connect(h, '[64:ff9b::a00:5]:443')), 'destination refused: no internal networks');
  t.match(
    refusal(await connect(h, '[64:ff9b::192.0.2.7]:443')),
    /denied by the rule host 192\.0\.2\.7/,
    'address rule',
  );
  t.match(refusal(await connect(h, 'dns64-meta.test:80')), /link-local/, 'metadata through NAT64: guarded');
  t.match(refusal(await connect(h, '[64:ff9b::169.254.169.254]:80')), /link-local/);
  const flows = h.audit.filter((r) => r.table === 'network_flow' && r.dst === 'dns64.test:443');
  t.match(flows[0], { outcome: 'deny', dst_ip: '', reason: 'no internal networks' });
  // A public address behind the prefix is a destination like any other (unreachable here: not 403).
  const pub = await connect(h, 'dns64-public.test:443');
  t.not(pub.status, 403, `public address through NAT64 admitted (${pub.status})`);

  // An allow gate by cidr admits the IPv4 address behind the prefix, and the prefix itself.
  const g = await startGatewayHarness({
    gateway: { allowDest: ['cidr=93.184.0.0/16'], connectTimeout: 2_000 },
    resolve: { 'dns64-public.test': ['64:ff9b::5db8:d70e'], 'other.test': ['64:ff9b::808:808'] },
  });
  t.teardown(() => g.close());
  t.not((await connect(g, 'dns64-public.test:443')).status, 403, 'the IPv4 cidr admits its NAT64 spelling');
  t.equal((await connect(g, 'other.test:443')).status, 403, 'an address outside it is refused');
});
