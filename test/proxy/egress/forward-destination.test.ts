import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import {
  baseSnapshot,
  curl,
  parseAnswer,
  rawExchange,
  startEcho,
  startGatewayHarness,
  type GatewayHarness,
  viaGateway,
} from './gateway-harness.ts';

// The destination policy at the door, with curl and raw CONNECTs: --allow-dest and --deny-dest (host
// globs, ports, cidr rules), the snapshot's destination_policy and packs, names that resolve to refused
// addresses, and the guarded ranges. A name refused by its rules is never looked up (the lookup
// records every name it is asked); a refusal is a 403 naming the reason, before any byte reaches the
// destination, and a network_flow record of outcome deny.

const echo = await startEcho();
t.teardown(() => echo.close());

async function connect(h: GatewayHarness, target: string, token?: string) {
  const raw = await rawExchange(
    h,
    `CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: Bearer ${token ?? (await h.token())}\r\n\r\nping`,
    10_000,
    {},
    (got) => got.endsWith('\r\n\r\nping'),
  );
  return { ...parseAnswer(raw.text), text: raw.text };
}

/** The 403's reason, as the agent reads it. */
function reasonOf(a: { status: number; body: string }): string {
  const body = JSON.parse(a.body) as { error: { type: string; message: string } };
  if (body.error.type !== 'destination_denied') throw new Error(`not a destination refusal: ${a.body}`);
  return body.error.message.replace(/^destination refused: /, '');
}

t.test('--allow-dest and --deny-dest: names, globs, ports and cidrs', async (t) => {
  const h = await startGatewayHarness({
    gateway: {
      allowDest: ['good.test', '*.wild.test', `cidr=127.0.0.1/32,port=${echo.port}`],
      denyDest: ['host=bad.wild.test,reason=bad one, with a comma', 'cidr=0.0.0.0/0,port=25,reason=no mail'],
    },
    resolve: { 'good.test': ['127.0.0.1'], 'api.wild.test': ['127.0.0.1'] },
  });
  t.teardown(() => h.close());

  const ok = await connect(h, `good.test:${echo.port}`);
  t.equal(ok.status, 200, 'an exact name reaches its private address');
  t.match(ok.text, /\r\n\r\nping$/, 'and the tunnel carries bytes');

  t.equal((await connect(h, `localhost:${echo.port}`)).status, 200, 'the cidr rule with its port admits localhost');

  const wild = await connect(h, `api.wild.test:${echo.port + 1}`);
  t.equal(wild.status, 403);
  t.equal(
    reasonOf(wild),
    'api.wild.test resolved to the private address 127.0.0.1, which a wildcard host rule does not reach',
  );

  const bad = await connect(h, 'bad.wild.test:443');
  t.equal(reasonOf(bad), 'bad one, with a comma', 'the deny rule’s own reason');
  const mail = await connect(h, 'good.test:25');
  t.equal(reasonOf(mail), 'no mail');
  const other = await connect(h, 'other.test:443');
  t.equal(reasonOf(other), 'not allowed by --allow-dest');
  t.same(
    h.lookups.filter((n) => ['bad.wild.test', 'other.test'].includes(n)),
    [],
    'names refused by their rules are never resolved',
  );
  t.equal(h.lookups.filter((n) => n === 'good.test').length, 2, 'an admitted name is resolved once per attempt');

  await h.flowsAfter(0, 6);
  const before = h.audit.length;
  const curled = await curl([...viaGateway(h, await h.token()), '-w', '%{http_connect}', 'https://bad.wild.test/']);
  t.equal(curled.stdout, '403');
  const [flow] = await h.flowsAfter(before);
  t.match(flow, {
    action: 'connect',
    dst: 'bad.wild.test:443',
    dst_host: 'bad.wild.test',
    dst_port: 443,
    dst_ip: '',
    outcome: 'deny',
    reason: 'bad one, with a comma',
    attrs: { status: '403', bytes_up: '0', bytes_down: '0' },
  });
});

t.test('cidr rules are checked against every address a name resolves to', async (t) => {
  const accepted = echo.accepted;
  const h = await startGatewayHarness({
    gateway: {
      denyDest: [
        'cidr=127.0.0.0/8,reason=no loopback',
        'cidr=10.0.0.0/8,reason=no corp',
        'host=127.0.0.2,reason=no literal',
      ],
    },
    resolve: { 'mixed.test': ['192.168.1.1', '10.1.2.3'], 'rebind.test': ['127.0.0.1'] },
  });
  t.teardown(() => h.close());
  t.equal(
    reasonOf(await connect(h, `localhost:${echo.port}`)),
    'no loopback',
    'localhost resolves to a refused address',
  );
  t.ok(h.lookups.includes('localhost'), 'it had to be resolved to know');
  t.equal(reasonOf(await connect(h, 'mixed.test:443')), 'no corp', 'one refused address refuses the name');
  t.equal(reasonOf(await connect(h, `rebind.test:${echo.port}`)), 'no loopback');
  // Other spellings of an address are the address: the URL host parser's dotted form.
  t.equal(reasonOf(await connect(h, `0x7f.0.0.2:${echo.port}`)), 'no literal', 'hex IPv4 is the dotted address');
  t.equal(reasonOf(await connect(h, `127.2:${echo.port}`)), 'no literal', 'short IPv4 too');
  t.equal(reasonOf(await connect(h, `2130706434:${echo.port}`)), 'no literal', 'and a 32-bit number');
  t.equal(reasonOf(await connect(h, `[::ffff:127.0.0.2]:${echo.port}`)), 'no literal', 'IPv4-mapped IPv6 too');
  t.equal(reasonOf(await connect(h, `[::ffff:7f00:1]:${echo.port}`)), 'no loopback', 'in either spelling');
  t.match(
    reasonOf(await connect(h, '169.254.169.254:80')),
    /link-local, unspecified or multicast address: only an allow rule naming its cidr reaches it/,
    'cloud metadata is guarded without any rule',
  );
  t.equal(echo.accepted, accepted, 'nothing reached the destination');
});

t.test('the snapshot’s destination_policy and packs, per agent, followed on reload', async (t) => {
  const snapshot = (allowEcho: boolean) =>
    baseSnapshot({
      platform: {
        destination_policy: {
          value: {
            allow: [{ host: 'localhost' }, { cidr: '127.0.0.0/8', ...(allowEcho ? {} : { port: 1 }) }],
            deny: [{ cidr: '0.0.0.0/0', port: 9, reason: 'discard is closed' }],
          },
        },
      },
      agents: {
        'agent-2': {
          org_id: 'org-1',
          group_id: null,
          name: 'narrow',
          status: 'active',
          contained: false,
          config: {},
          packs: [{ name: 'web-only', allow: [{ cidr: '0.0.0.0/0', port: 443 }] }],
        },
      },
    });
  const h = await startGatewayHarness({ snapshot: snapshot(true) });
  t.teardown(() => h.close());
  t.equal((await connect(h, `127.0.0.1:${echo.port}`)).status, 200, 'agent-1: the platform gate admits it');
  const narrow = await connect(h, `127.0.0.1:${echo.port}`, await h.token({ sub: 'agent-2' }));
  t.equal(reasonOf(narrow), 'not on the destination allow list', 'agent-2: its own pack is one more gate');
  t.equal(reasonOf(await connect(h, 'localhost:9')), 'discard is closed');
  await h.writeSnapshot(snapshot(false));
  t.equal(
    reasonOf(await connect(h, `127.0.0.1:${echo.port}`)),
    'not on the destination allow list',
    'a reloaded policy applies to the next attempt',
  );
});

t.test(
  'a host under a credential rule is refused as a blind tunnel (no interception CA), never resolved',
  async (t) => {
    const dir = await mkdtemp(join(tmpdir(), 'dvx-gw-secrets-'));
    t.teardown(() => rm(dir, { recursive: true, force: true }));
    const secrets = join(dir, 'secrets.json');
    await writeFile(secrets, JSON.stringify({ 'agent:agent-1': { gh: 'ghp_secret' } }));
    const h = await startGatewayHarness({
      gateway: {
        secretsFile: secrets,
        injectCred: ['host=api.github.test,header=Authorization,secret=gh,format=Bearer {}'],
      },
    });
    t.teardown(() => h.close());
    const a = await connect(h, 'api.github.test:443');
    t.equal(a.status, 403);
    t.equal(
      reasonOf(a),
      'a tunnel to api.github.test:443 must be intercepted (a --inject-cred rule applies to it) and the gateway has no interception CA (--ca-cert)',
    );
    t.notOk(h.lookups.includes('api.github.test'));
  },
);
