import t from 'tap';
import fc from 'fast-check';
import type { Rule } from '../../../pipeline/policy/governance.ts';
import type { DestinationGates, Target } from '../../../proxy/egress/context.ts';
import {
  decideResolved,
  decideRouted,
  destinationGates,
  normalizeAddress,
  parseDestRule,
  refuseByName,
  ruleMatches,
} from '../../../proxy/egress/destination.ts';
import { GatewayRefusal, GatewayRuleError } from '../../../proxy/egress/errors.ts';
import { admitDestination, admitRouted, systemLookup, type Lookup } from '../../../proxy/egress/resolve.ts';
import { LookupLimiter } from '../../../proxy/egress/lookup-limits.ts';
import { silentLogger } from '../../../core/logger.ts';

// The destination policy (destination.ts) and its admission (resolve.ts): the rule spellings, deny
// over allow, each allow list a gate, every resolved address checked and the connection pinned to one
// that passed, the guarded ranges, IPv4-mapped and other spellings of one address, and the resolver's
// failures. Properties where an invariant holds for every rule and address.

const gates = (allow: Rule[][] = [], deny: Rule[] = []): DestinationGates => ({
  allow: allow.map((rules) => ({ source: 'policy' as const, rules })),
  deny,
});
const target = (host: string, port = 443): Target => ({ host, port });
/** A lookup under the gateway's bounds (lookup-limits.ts), as the door uses it. */
const bounded = (lookup: Lookup) => new LookupLimiter(lookup, silentLogger()).lookup;
const v4 = (address: string) => ({ address, family: 4 as const });
const v6 = (address: string) => ({ address, family: 6 as const });
/** What an admission was refused with (null: it was not). */
const refusal = (p: Promise<unknown>) =>
  p.then(
    () => null,
    (err: unknown) => err,
  );

const label = fc.stringMatching(/^[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?$/);
const name = fc.array(label, { minLength: 1, maxLength: 3 }).map((ls) => `${ls.join('.')}.test`);
const port = fc.integer({ min: 1, max: 65535 });
/** Public unicast IPv4 addresses (none of the guarded or private ranges). */
const publicV4 = fc
  .tuple(fc.integer({ min: 11, max: 99 }), fc.nat(255), fc.nat(255), fc.integer({ min: 1, max: 254 }))
  .filter(([a]) => a !== 100 && a !== 127)
  .map((parts) => parts.join('.'));
const reason = fc.stringMatching(/^[A-Za-z][A-Za-z ,.;:=-]{0,30}[A-Za-z.]$/);

t.test('rule spellings', async (t) => {
  const same: [string, Rule][] = [
    ['api.example.com', { host: 'api.example.com' }],
    ['API.Example.com:8443', { host: 'api.example.com', port: 8443 }],
    ['*.example.com', { host: '*.example.com' }],
    ['10.0.0.0/8', { cidr: '10.0.0.0/8' }],
    ['fd00::/8', { cidr: 'fd00::/8' }],
    ['[::1]', { host: '::1' }],
    ['[::1]:443', { host: '::1', port: 443 }],
    ['[FD00:0::1]:22', { host: 'fd00::1', port: 22 }],
    ['cidr=10.0.0.0/8,port=443', { cidr: '10.0.0.0/8', port: 443 }],
    ['host=a.test, port=80, reason=no, really: no', { host: 'a.test', port: 80, reason: 'no, really: no' }],
    ['{"host":"*.corp.test","port":22,"reason":"ssh"}', { host: '*.corp.test', port: 22, reason: 'ssh' }],
    ['{"host":"::1"}', { host: '::1' }],
  ];
  for (const [text, rule] of same) t.same(parseDestRule(text, '--allow-dest'), rule, text);
  const bad: [string, RegExp][] = [
    ['', /host/],
    ['{not json', /not valid JSON/],
    ['[1,2]', /host/],
    ['host=a.test,port=0', /port must be 1\.\.65535/],
    ['host=a.test,port=x', /port/],
    ['host=a.test,host=b.test', /host is given twice/],
    ['host=a.test,bogus=1', /unknown field "bogus"/],
    ['cidr=10.0.0.0/33', /cidr/],
    ['{"host":"a.test","__proto__":{"cidr":"0.0.0.0/0"}}', /unknown field|__proto__/],
    ['{"host":"a.test","constructor":1}', /unknown field|constructor/],
    ['port=443', /a rule names a cidr or a host/],
    ['host=a b', /host/],
  ];
  for (const [text, message] of bad) t.throws(() => parseDestRule(text, '--deny-dest'), message, text);
  t.throws(() => parseDestRule('a b', '--deny-dest'), { name: 'GatewayRuleError', message: /^--deny-dest "a b"/ });
});

t.test('property: the three spellings of a rule are one rule', async (t) => {
  fc.assert(
    fc.property(name, fc.option(port, { nil: undefined }), fc.option(reason, { nil: undefined }), (host, p, r) => {
      const rule: Rule = { host, ...(p === undefined ? {} : { port: p }), ...(r === undefined ? {} : { reason: r }) };
      const fields = [`host=${host}`, p === undefined ? '' : `port=${p}`, r === undefined ? '' : `reason=${r}`]
        .filter(Boolean)
        .join(',');
      const json = parseDestRule(JSON.stringify(rule), '--allow-dest');
      const byFields = parseDestRule(fields, '--allow-dest');
      const short = r === undefined ? parseDestRule(p === undefined ? host : `${host}:${p}`, '--allow-dest') : json;
      return (
        JSON.stringify(json) === JSON.stringify(rule) &&
        JSON.stringify(byFields) === JSON.stringify(rule) &&
        JSON.stringify(short) === JSON.stringify(rule)
      );
    }),
  );
  t.pass();
});

t.test('property: any text is a rule or a GatewayRuleError, never a crash', async (t) => {
  const text = fc.oneof(
    fc.string(),
    fc.string().map((s) => `host=${s}`),
    fc.string().map((s) => `cidr=${s},port=${s}`),
    fc.json(),
    fc.ipV6().map((ip) => `[${ip}]:${ip.length}`),
    fc.ipV4().map((ip) => `${ip}/${ip.length * 3}`),
  );
  fc.assert(
    fc.property(text, (s) => {
      try {
        parseDestRule(s, '--allow-dest');
        return true;
      } catch (err) {
        return err instanceof GatewayRuleError;
      }
    }),
    { numRuns: 500 },
  );
  t.pass();
});

t.test('property: a deny rule that matches refuses, whatever the allow lists say', async (t) => {
  fc.assert(
    fc.property(name, port, publicV4, fc.boolean(), (host, p, address, byCidr) => {
      const deny: Rule = byCidr ? { cidr: `${address}/32` } : { host };
      const g = gates([[{ host }], [{ cidr: '0.0.0.0/0' }]], [deny]);
      const verdict = decideResolved(g, target(host, p), [v4(address)]);
      const byName = refuseByName(g, target(host, p));
      return !verdict.allowed && (byCidr ? byName === null : byName !== null);
    }),
  );
  t.pass();
});

t.test('property: one address under a deny rule refuses the name; an allowed one is pinned', async (t) => {
  fc.assert(
    fc.property(name, fc.uniqueArray(publicV4, { minLength: 1, maxLength: 6 }), fc.nat(), (host, addresses, pick) => {
      const all = addresses.map(v4);
      const open = decideResolved(gates(), target(host), all);
      if (!open.allowed || open.address !== addresses[0]) return false; // the resolver's first
      const denied = addresses[pick % addresses.length]!;
      const refused = decideResolved(gates([], [{ cidr: `${denied}/32`, reason: 'bad' }]), target(host), all);
      if (refused.allowed || refused.reason !== 'bad') return false;
      // An allow gate naming one address: the connection goes there and nowhere else.
      const only = decideResolved(gates([[{ cidr: `${denied}/32` }]]), target(host), all);
      return only.allowed && only.address === denied;
    }),
  );
  t.pass();
});

t.test('property: each allow list is a gate: a destination must pass all of them', async (t) => {
  fc.assert(
    fc.property(name, name, port, publicV4, (host, other, p, address) => {
      const ok = decideResolved(gates([[{ host }], [{ port: p, host: '*' }]]), target(host, p), [v4(address)]);
      const otherPort = decideResolved(gates([[{ host }], [{ port: p, host: '*' }]]), target(host, (p % 65535) + 1), [
        v4(address),
      ]);
      const otherHost = decideResolved(gates([[{ host }]]), target(other, p), [v4(address)]);
      return ok.allowed && !otherPort.allowed && otherHost.allowed === (host === other);
    }),
  );
  t.pass();
});

t.test('guarded and private ranges: not reached by surprise', async (t) => {
  const metadata = [v4('169.254.169.254')];
  t.notOk(decideResolved(gates(), target('metadata.test'), metadata).allowed, 'link-local: not even when open');
  t.notOk(decideResolved(gates([[{ host: 'metadata.test' }]]), target('metadata.test'), metadata).allowed);
  t.ok(decideResolved(gates([[{ cidr: '169.254.169.254/32' }]]), target('metadata.test'), metadata).allowed);
  for (const a of ['0.0.0.0', '224.0.0.1', '255.255.255.255', '::', 'fe80::1', 'ff02::1', 'fd00:ec2::254'])
    t.notOk(decideResolved(gates(), target('x.test'), [normalizeAddress(a)]).allowed, a);
  const internal = [v4('10.1.2.3')];
  t.ok(decideResolved(gates(), target('db.corp.test'), internal).allowed, 'an open gateway reaches private ranges');
  t.notOk(decideResolved(gates([[{ host: '*.corp.test' }]]), target('db.corp.test'), internal).allowed, 'wildcard');
  t.ok(decideResolved(gates([[{ host: 'db.corp.test' }]]), target('db.corp.test'), internal).allowed, 'exact name');
  t.ok(decideResolved(gates([[{ cidr: '10.0.0.0/8' }]]), target('db.corp.test'), internal).allowed, 'cidr');
  const verdict = decideResolved(gates([[{ host: '*.corp.test' }]]), target('x.corp.test'), [v4('192.168.1.1')]);
  t.match(verdict, { allowed: false, reason: /private address 192\.168\.1\.1.*wildcard/ });
  t.match(decideResolved(gates(), target('x.test'), []), { allowed: false, reason: /no address/ });
});

t.test('property: an IPv4-mapped address decides as its IPv4 address', async (t) => {
  const someGates = fc.constantFrom(
    gates(),
    gates([[{ host: '*.test' }]]),
    gates([[{ cidr: '10.0.0.0/8' }]]),
    gates([], [{ cidr: '10.0.0.0/8' }]),
    gates([[{ cidr: '::ffff:10.0.0.0/104' }]]),
    gates([[{ cidr: '::ffff:0.0.0.0/64' }]]),
  );
  fc.assert(
    fc.property(fc.ipV4(), someGates, name, (ip, g, host) => {
      const [a, b, c, d] = ip.split('.').map(Number) as [number, number, number, number];
      const hex = `::ffff:${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
      const plain = decideResolved(g, target(host), [v4(ip)]);
      return [`::ffff:${ip}`, hex, `0:0:0:0:0:FFFF:${ip}`].every(
        (mapped) => JSON.stringify(decideResolved(g, target(host), [v6(mapped)])) === JSON.stringify(plain),
      );
    }),
  );
  t.equal(normalizeAddress('::ffff:a9fe:a9fe').address, '169.254.169.254');
  // A mapped network wider than the mapped range is an IPv6 network holding every IPv4 address (it
  // threw a RangeError, out of a decision, before).
  t.ok(ruleMatches({ cidr: '::ffff:1.2.3.4/64' }, target('x'), v4('9.9.9.9')));
  t.notOk(ruleMatches({ cidr: '::ffff:1.2.3.0/120' }, target('x'), v4('1.2.4.9')));
});

t.test('a rule naming an address is not dodged by another spelling of it', async (t) => {
  const deny = gates([], [parseDestRule('10.0.0.1', '--deny-dest'), parseDestRule('[fd00::1]', '--deny-dest')]);
  for (const spelling of ['10.0.0.1', '167772161', '10.1', '0xa.0.0.1', '012.0.0.1'])
    t.notOk(decideResolved(deny, target(spelling), [v4('10.0.0.1')]).allowed, spelling);
  for (const spelling of ['fd00:0::1', 'FD00:0:0:0:0:0:0:1'])
    t.ok(refuseByName(deny, target(spelling)), `${spelling}: refused by name`);
});

t.test('routed hosts: deny rules by name only; allow lists and cidr rules do not apply', async (t) => {
  const g = gates([[{ host: 'elsewhere.test' }]], [{ host: 'blocked.test', reason: 'nope' }, { cidr: '0.0.0.0/0' }]);
  t.same(decideRouted(g, target('api.anthropic.com')), { allowed: true, address: null, family: null });
  t.same(decideRouted(g, target('blocked.test')), { allowed: false, reason: 'nope' });
  t.same(admitRouted(g, target('api.anthropic.com')), { host: 'api.anthropic.com', port: 443, address: '', family: 4 });
  t.throws(() => admitRouted(g, target('blocked.test')), GatewayRefusal);
});

t.test('gates: the policy gates, then one gate of --allow-dest; deny rules union', async (t) => {
  const d = destinationGates(null, { allow: [{ host: 'a.test' }], deny: [{ host: 'b.test' }] });
  t.same(d, { allow: [{ source: '--allow-dest', rules: [{ host: 'a.test' }] }], deny: [{ host: 'b.test' }] });
  t.same(destinationGates(null, { allow: [], deny: [] }), { allow: [], deny: [] });
  t.equal(refuseByName(d, target('c.test')), 'not allowed by --allow-dest');
});

t.test('admission: refused before lookup, every address checked, pinned, resolver failures', async (t) => {
  let lookups = 0;
  const table: Record<string, { address: string; family: 4 | 6 }[]> = {
    'mixed.test': [v4('93.184.216.34'), v4('10.0.0.5')],
    'public.test': [v6('2606:4700::1'), v4('93.184.216.34')],
  };
  const lookup: Lookup = async (host) => {
    lookups++;
    const found = table[host];
    if (!found) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
    return found;
  };
  const deny = gates([], [{ host: 'blocked.test', reason: 'blocked for tests' }, { cidr: '10.0.0.0/8' }]);
  t.match(
    await refusal(admitDestination(deny, target('blocked.test'), bounded(lookup), { agent: null, timeoutMs: 1000 })),
    {
      answer: { status: 403 },
      reason: 'blocked for tests',
    },
  );
  t.equal(lookups, 0, 'a name refused by name is not looked up');
  const mixed = await admitDestination(deny, target('mixed.test'), bounded(lookup), {
    agent: null,
    timeoutMs: 1000,
  }).catch((e: GatewayRefusal) => e);
  t.match(mixed, { answer: { status: 403 }, reason: /cidr 10\.0\.0\.0\/8/ }, 'one refused address refuses the name');
  t.same(await admitDestination(deny, target('public.test', 8443), bounded(lookup), { agent: null, timeoutMs: 1000 }), {
    host: 'public.test',
    port: 8443,
    address: '2606:4700::1',
    family: 6,
  });
  const literal = await admitDestination(gates(), target('93.184.216.34'), bounded(lookup), {
    agent: null,
    timeoutMs: 1000,
  });
  t.equal(literal.address, '93.184.216.34');
  const before = lookups;
  await admitDestination(gates(), target('::ffff:93.184.216.34'), bounded(lookup), { agent: null, timeoutMs: 1000 });
  t.equal(lookups, before, 'an address is not looked up');
  t.match(
    await refusal(admitDestination(gates(), target('nowhere.test'), bounded(lookup), { agent: null, timeoutMs: 1000 })),
    {
      answer: { status: 502 },
      reason: 'cannot resolve nowhere.test: ENOTFOUND',
    },
  );
  const never: Lookup = () => new Promise(() => {});
  t.match(
    await refusal(admitDestination(gates(), target('slow.test'), bounded(never), { agent: null, timeoutMs: 50 })),
    {
      answer: { status: 504 },
      reason: 'resolving slow.test took longer than 50 ms',
    },
  );
});

t.test('admission through the system resolver: localhost', async (t) => {
  const found = await systemLookup('localhost');
  t.ok(found.length > 0 && found.every((a) => a.address === '127.0.0.1' || a.address === '::1'));
  const pinned = await admitDestination(
    gates([[{ host: 'localhost' }]]),
    target('localhost', 80),
    bounded(systemLookup),
    { agent: null, timeoutMs: 5000 },
  );
  t.ok(['127.0.0.1', '::1'].includes(pinned.address), 'an exact name reaches loopback');
  t.match(
    await refusal(
      admitDestination(gates([[{ host: '*host' }]]), target('localhost', 80), bounded(systemLookup), {
        agent: null,
        timeoutMs: 5000,
      }),
    ),
    { answer: { status: 403 }, reason: /wildcard/ },
    'a wildcard does not',
  );
});
