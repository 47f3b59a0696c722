import t from 'tap';
import fc from 'fast-check';
import { canonicalHost, hostMatch, isValidHostPattern } from '../../../proxy/egress/host-match.ts';

// Host globs (every rule of the gateway matches hosts with them): examples, and the invariants as
// properties: case and a trailing dot change nothing, `*.suffix` holds exactly the names under the
// suffix, every other character is literal, and an IP address matches whatever its spelling.

const label = fc.stringMatching(/^[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?$/);
const name = fc.array(label, { minLength: 1, maxLength: 4 }).map((ls) => `${ls.join('.')}.test`);
const randomCase = (s: string, flips: boolean[]) =>
  [...s].map((c, i) => (flips[i % flips.length] ? c.toUpperCase() : c)).join('');
const dotted = (n: number) => [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');

t.test('examples', async (t) => {
  const cases: [string, string, boolean][] = [
    ['api.example.com', 'api.example.com', true],
    ['api.example.com', 'API.Example.COM.', true],
    ['*.example.com', 'api.example.com', true],
    ['*.example.com', 'a.b.example.com', true],
    ['*.example.com', 'example.com', false],
    ['*.example.com', 'evilexample.com', false],
    ['*.example.com', 'example.com.evil.test', false],
    ['api.*.com', 'api.x.com', true],
    ['api.*.com', 'api..com', false],
    ['*', 'anything.at.all', true],
    ['a.b', 'axb', false],
    ['10.0.0.1', '10.0.0.1', true],
    ['10.0.0.1', '167772161', true],
    ['10.0.0.1', '10.1', true],
    ['10.0.0.1', '0xa.0.0.1', true],
    ['::1', '[0:0:0:0:0:0:0:1]', true],
    ['[fd00::1]', 'FD00:0::1', true],
    ['1.2.3.4.5', '1.2.3.4.5', true],
    ['a+b.com', 'aab.com', false],
    ['(a|b)*', 'b.x', false],
  ];
  for (const [pattern, host, expected] of cases) t.equal(hostMatch(pattern, host), expected, `${pattern} ~ ${host}`);
  t.equal(canonicalHost('[::FFFF:127.0.0.1]'), '::ffff:7f00:1');
  t.equal(canonicalHost('Example.COM.'), 'example.com');
  t.equal(canonicalHost('a.b.123'), 'a.b.123', 'ends in a number but is no address: as written');
  for (const ok of ['api.example.com', '*.example.com', '*', '10.0.0.1', '::1', 'under_score.test'])
    t.ok(isValidHostPattern(ok), ok);
  for (const bad of ['', '**.example.com', 'a b', 'a/b', 'a.example.com:443/x', 'x'.repeat(254), 'ä.test'])
    t.notOk(isValidHostPattern(bad), JSON.stringify(bad));
});

t.test('property: case and a trailing dot never change a match', async (t) => {
  fc.assert(
    fc.property(name, name, fc.array(fc.boolean(), { minLength: 1 }), fc.boolean(), (pattern, host, flips, dot) => {
      const glob = `*.${pattern.split('.').slice(1).join('.')}`;
      for (const p of [pattern, glob]) {
        const plain = hostMatch(p, host);
        if (hostMatch(randomCase(p, flips), randomCase(host, flips) + (dot ? '.' : '')) !== plain) return false;
      }
      return true;
    }),
  );
  t.pass();
});

t.test('property: an exact pattern matches itself only; *.suffix exactly the names under it', async (t) => {
  fc.assert(
    fc.property(name, name, label, (a, b, sub) => {
      if (hostMatch(a, b) !== (a === b)) return false;
      if (!hostMatch(`*.${a}`, `${sub}.${a}`)) return false;
      if (!hostMatch(`*.${a}`, `${sub}.${b}.${a}`)) return false;
      if (hostMatch(`*.${a}`, a)) return false;
      if (hostMatch(`*.${a}`, `${sub}${a}`)) return false; // no dot: not under it
      return hostMatch(`*.${a}`, b) === (b.endsWith(`.${a}`) && b.length > a.length + 1);
    }),
  );
  t.pass();
});

t.test('property: every character but * is literal', async (t) => {
  const special = fc.constantFrom('.', '+', '?', '^', '$', '{', '}', '(', ')', '|', '[', ']', '\\', '/');
  fc.assert(
    fc.property(label, special, label, (a, c, b) => {
      const pattern = `${a}${c}${b}`;
      // The pattern matches its own text and nothing that a regex reading of `c` would add.
      return hostMatch(`*${pattern}`, `x${pattern}`) && !hostMatch(`*${pattern}`, `x${a}Z${b}`);
    }),
  );
  t.pass();
});

t.test('property: an IPv4 address in any spelling the resolver reads is the same host', async (t) => {
  fc.assert(
    fc.property(fc.integer({ min: 0, max: 2 ** 32 - 1 }), (n) => {
      const ip = dotted(n);
      const spellings = [
        ip,
        String(n),
        `0x${n.toString(16)}`,
        `${n >>> 24}.${n & 0xffffff}`,
        `${n >>> 24}.${(n >>> 16) & 255}.${n & 0xffff}`,
        `0x${(n >>> 24).toString(16)}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`,
        `${ip}.`,
      ];
      return spellings.every((s) => canonicalHost(s) === ip && hostMatch(ip, s) && hostMatch(s, ip));
    }),
  );
  t.pass();
});

t.test('property: an IPv6 address matches whatever its spelling (brackets, case, zeros)', async (t) => {
  fc.assert(
    fc.property(fc.ipV6(), fc.array(fc.boolean(), { minLength: 1 }), (ip, flips) => {
      const c = canonicalHost(ip);
      return (
        canonicalHost(`[${ip}]`) === c &&
        canonicalHost(randomCase(ip, flips)) === c &&
        hostMatch(ip, `[${randomCase(ip, flips)}]`)
      );
    }),
  );
  t.pass();
});
