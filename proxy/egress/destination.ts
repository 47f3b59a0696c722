import { BlockList, isIP } from 'node:net';
import type { EffectiveGovernance, Rule } from '../../pipeline/policy/governance.ts';
import { validateRules } from '../../pipeline/policy/governance.ts';
import { canonicalHost, hostMatch, isValidHostPattern } from './host-match.ts';
import type { DestinationGates, Target } from './context.ts';
import { GatewayRuleError } from './errors.ts';

// The destination policy (spec: operator-api Rule, destinationPolicyReq, packs; docs/gateway.md,
// "Destination policy"), decided for one agent and one destination:
//
//   deny    every deny rule (every scope, every pack, --deny-dest) refuses what it matches
//   allow   each allow list (a scope's, a pack's, and the --allow-dest rules together) is a gate: the
//           destination must match a rule of every gate; no gate at all leaves destinations open
//   match   a rule matches when each field it has matches: `host` (a glob, host-match.ts) the name
//           the agent asked for, `port` its port, `cidr` the address the connection would go to
//
// The name is resolved once (resolve.ts) and every address is checked: a name with one address under
// a deny rule is refused whole (a name that resolves partly into a refused range is not one to trust),
// and the connection goes only to an address every gate admitted. Two ranges are guarded beyond the
// rules, so that a broad rule does not reach them by surprise:
//   - link-local (cloud metadata), unspecified, multicast and broadcast addresses: reachable only
//     through an allow rule whose `cidr` names their range (lies within it: `169.254.169.254/32`);
//   - loopback and private ranges (RFC 1918, CGNAT, ULA): not through a wildcard host rule (`*.corp`
//     resolving to 10.0.0.5); an exact host name or a cidr rule naming the range reaches them. With no
//     allow gate at all (an open gateway) they are reachable, as everything is.
// A catch-all cidr (`0.0.0.0/0`, `::/0`) names no range: it is the cidr spelling of a wildcard. An
// address under the NAT64 prefix is also checked as the IPv4 address it reaches.

export type DestinationVerdict =
  | { allowed: true; address: string | null; family: 4 | 6 | null }
  | { allowed: false; reason: string };

/** The gates and deny rules of one agent: its governance, then the command line's. */
export function destinationGates(
  governance: EffectiveGovernance | null,
  cli: { allow: readonly Rule[]; deny: readonly Rule[] },
): DestinationGates {
  const allow: DestinationGates['allow'] = (governance?.destination.allow_gates ?? []).map((rules) => ({
    source: 'policy' as const,
    rules,
  }));
  if (cli.allow.length > 0) allow.push({ source: '--allow-dest', rules: [...cli.allow] });
  return { allow, deny: [...(governance?.destination.deny ?? []), ...cli.deny] };
}

/**
 * An `--allow-dest` / `--deny-dest` rule, in one of three spellings:
 *   JSON      `{"host":"*.example.com","port":443,"reason":"…"}` (the API's Rule)
 *   fields    `host=*.example.com,port=443,reason=…` (`reason` is last: it takes the rest, commas too)
 *   short     `HOST`, `HOST:PORT`, `[IPV6]`, `[IPV6]:PORT`, or a `CIDR` (a cidr with a port takes the
 *             field spelling: `cidr=10.0.0.0/8,port=443`)
 */
export function parseDestRule(text: string, flag: '--allow-dest' | '--deny-dest'): Rule {
  const raw = text.trim();
  const fail = (why: string): never => {
    throw new GatewayRuleError(`${flag} "${text}": ${why}`);
  };
  let doc: Record<string, unknown>;
  if (raw.startsWith('{')) {
    try {
      doc = JSON.parse(raw) as Record<string, unknown>;
    } catch {
      return fail('not valid JSON');
    }
  } else if (/^[a-z]+=/i.test(raw)) {
    doc = {};
    let rest = raw;
    while (rest.length > 0) {
      const eq = rest.indexOf('=');
      if (eq <= 0) fail('fields are key=value, separated by commas');
      const key = rest.slice(0, eq).trim().toLowerCase();
      if (!RULE_FIELDS.has(key)) fail(`unknown field "${key}" (cidr, host, port, reason)`);
      if (Object.hasOwn(doc, key)) fail(`${key} is given twice`);
      if (key === 'reason') {
        doc.reason = rest.slice(eq + 1).trim();
        break;
      }
      const comma = rest.indexOf(',', eq);
      const value = (comma < 0 ? rest.slice(eq + 1) : rest.slice(eq + 1, comma)).trim();
      doc[key] = key === 'port' ? (/^\d{1,5}$/.test(value) ? Number(value) : value) : value;
      rest = comma < 0 ? '' : rest.slice(comma + 1).trim();
    }
  } else if (raw.includes('/')) {
    doc = { cidr: raw };
  } else {
    const bracketed = /^\[([0-9a-f:.]+)\](?::(\d{1,5}))?$/i.exec(raw);
    const hostPort = /^([^:[\]]+):(\d{1,5})$/.exec(raw);
    if (bracketed) doc = { host: bracketed[1], ...(bracketed[2] ? { port: Number(bracketed[2]) } : {}) };
    else if (hostPort) doc = { host: hostPort[1], port: Number(hostPort[2]) };
    else doc = { host: raw };
  }
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) fail('must be a JSON object');
  // The API's Rule host is a name; a command-line rule may also name an IPv6 address (`[::1]:443`),
  // which the API's check would refuse for its colons: checked here, the rest of the rule there.
  const v6 = typeof doc.host === 'string' && isIP(canonicalHost(doc.host)) === 6 ? canonicalHost(doc.host) : null;
  let rule: Rule;
  try {
    [rule] = validateRules([v6 === null ? doc : { ...doc, host: 'ipv6.invalid' }], 'rule');
  } catch (err) {
    return fail((err as Error).message);
  }
  if (v6 !== null) rule.host = v6;
  if (rule.host !== undefined) {
    rule.host = canonicalHost(rule.host);
    if (!isValidHostPattern(rule.host)) fail(`host "${rule.host}" is not a host name or glob`);
  }
  if (rule.port !== undefined && (rule.port < 1 || rule.port > 65535)) fail('port must be 1..65535');
  return rule;
}

const RULE_FIELDS = new Set(['cidr', 'host', 'port', 'reason']);

/** A network of addresses: its address, prefix length and family. */
interface Range {
  net: string;
  bits: number;
  family: 4 | 6;
  /** The range alone, to check an address against. */
  list: BlockList;
}

function ranges(list: [string, number][]): { all: BlockList; each: Range[] } {
  const all = new BlockList();
  const each = list.map(([net, bits]) => {
    const family = isIP(net) === 6 ? 6 : 4;
    const one = new BlockList();
    one.addSubnet(net, bits, family === 4 ? 'ipv4' : 'ipv6');
    all.addSubnet(net, bits, family === 4 ? 'ipv4' : 'ipv6');
    return { net, bits, family, list: one } as Range;
  });
  return { all, each };
}

const ALWAYS_GUARDED = ranges([
  ['0.0.0.0', 8],
  ['169.254.0.0', 16],
  ['224.0.0.0', 4],
  ['240.0.0.0', 4], // reserved, 255.255.255.255 included
  ['::', 128],
  ['fe80::', 10],
  ['ff00::', 8],
  ['fd00:ec2::254', 128], // the IPv6 address of a cloud metadata service
]);

const PRIVATE = ranges([
  ['127.0.0.0', 8],
  ['10.0.0.0', 8],
  ['172.16.0.0', 12],
  ['192.168.0.0', 16],
  ['100.64.0.0', 10],
  ['::1', 128],
  ['fc00::', 7],
]);

/**
 * The NAT64 well-known prefix (RFC 6052): `64:ff9b::a.b.c.d` reaches the IPv4 address a.b.c.d through
 * the network's NAT64 gateway. DNS64 answers it for IPv4-only names in IPv6-only clusters, and an agent
 * can type it: such an address is checked as the IPv4 address it reaches too, or a cidr rule, an
 * address rule and the guarded ranges would be dodged by the spelling (P11 review).
 */
const NAT64 = ranges([['64:ff9b::', 96]]).all;

/** The eight 16-bit groups of an IPv6 address in the URL parser's spelling (hex, `::` compression). */
function hextets(v6: string): number[] {
  const [head, tail] = v6.split('::') as [string, string | undefined];
  const h = head === '' ? [] : head.split(':');
  const t = tail === undefined || tail === '' ? [] : tail.split(':');
  const fill = tail === undefined ? [] : Array<string>(8 - h.length - t.length).fill('0');
  return [...h, ...fill, ...t].map((g) => Number.parseInt(g, 16));
}

/** The IPv4 address a NAT64 address reaches, or null. */
function nat64Ipv4(a: { address: string; family: 4 | 6 }): { address: string; family: 4 } | null {
  if (a.family !== 6 || !NAT64.check(a.address, 'ipv6')) return null;
  const g = hextets(a.address);
  const [hi, lo] = [g[6]!, g[7]!];
  return { address: `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`, family: 4 };
}

/** The address as checked: an IPv4-mapped IPv6 address is its IPv4 address (no rule is dodged by the spelling). */
export function normalizeAddress(address: string): { address: string; family: 4 | 6 } {
  const a = canonicalHost(address);
  const family = isIP(a);
  if (family === 0) throw new GatewayRuleError(`"${address}" is not an IP address`);
  if (family === 4) return { address: a, family: 4 };
  // The URL parser writes an IPv6 address one way (RFC 5952 compression, lower case, an IPv4-mapped one
  // in hex): `::ffff:127.0.0.1`, `0:0:0:0:0:ffff:7f00:1` and `::FFFF:7F00:1` are one address.
  const v6 = new URL(`http://[${a}]/`).hostname.slice(1, -1);
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(v6);
  if (mapped) {
    const hi = Number.parseInt(mapped[1]!, 16);
    const lo = Number.parseInt(mapped[2]!, 16);
    return { address: `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`, family: 4 };
  }
  return { address: v6, family: 6 };
}

/** A cidr's network as checked: an IPv4-mapped network of at least /96 is the IPv4 network it maps. */
function cidrNetwork(cidr: string): { net: string; bits: number; family: 4 | 6 } {
  const [net, bits] = cidr.split('/');
  const n = normalizeAddress(net!);
  if (bits === undefined) return { net: n.address, bits: n.family === 4 ? 32 : 128, family: n.family };
  const mapped = n.family === 4 && net!.includes(':');
  // Wider than the IPv4-mapped range (`::ffff:1.2.3.4/64`): an IPv6 network, which BlockList checks
  // IPv4 addresses against as their mapped form.
  if (mapped && Number(bits) < 96) return { net: canonicalHost(net!), bits: Number(bits), family: 6 };
  return { net: n.address, bits: Number(bits) - (mapped ? 96 : 0), family: n.family };
}

const cidrs = new Map<string, BlockList>();

function inCidr(cidr: string, address: string, family: 4 | 6): boolean {
  let list = cidrs.get(cidr);
  if (!list) {
    list = new BlockList();
    const n = cidrNetwork(cidr);
    list.addSubnet(n.net, n.bits, n.family === 4 ? 'ipv4' : 'ipv6');
    if (cidrs.size > 4096) cidrs.clear();
    cidrs.set(cidr, list);
  }
  return list.check(address, family === 4 ? 'ipv4' : 'ipv6');
}

/**
 * Whether `rule` names `range`: a cidr rule whose network lies within it (`10.0.0.0/8`, `127.0.0.1/32`
 * for loopback). A catch-all network (`0.0.0.0/0`, `::/0`, `::ffff:0.0.0.0/96`) contains every guarded
 * and private range without naming any: it is the cidr spelling of a wildcard, and reaches none of them.
 */
function namesRange(rule: Rule, range: Range): boolean {
  if (rule.cidr === undefined) return false;
  const n = cidrNetwork(rule.cidr);
  return n.family === range.family && n.bits >= range.bits && range.list.check(n.net, n.family === 4 ? 'ipv4' : 'ipv6');
}

/** Whether `rule` matches the name, port and (when known) address. A cidr rule never matches an unknown address. */
export function ruleMatches(rule: Rule, target: Target, address: { address: string; family: 4 | 6 } | null): boolean {
  if (rule.port !== undefined && rule.port !== target.port) return false;
  if (rule.host !== undefined && !hostMatch(rule.host, target.host)) return false;
  if (rule.cidr !== undefined && (address === null || !inCidr(rule.cidr, address.address, address.family)))
    return false;
  return true;
}

function describe(rule: Rule): string {
  const parts = [
    rule.host !== undefined ? `host ${rule.host}` : '',
    rule.cidr !== undefined ? `cidr ${rule.cidr}` : '',
    rule.port !== undefined ? `port ${rule.port}` : '',
  ].filter(Boolean);
  return parts.join(' ');
}

const denyReason = (rule: Rule) => rule.reason || `denied by the rule ${describe(rule)}`;
const gateReason = (source: string) =>
  source === '--allow-dest' ? 'not allowed by --allow-dest' : 'not on the destination allow list';

/**
 * What can be decided from the name alone, before anything is resolved (so a refused name is not even
 * looked up): a deny rule without a cidr that matches, or a gate none of whose rules could match this
 * name and port whatever its address. Null when the name may go on to resolution.
 */
export function refuseByName(gates: DestinationGates, target: Target): string | null {
  for (const rule of gates.deny)
    if (rule.cidr === undefined && ruleMatches(rule, target, null)) return denyReason(rule);
  for (const gate of gates.allow) {
    const could = gate.rules.some(
      (r) =>
        (r.port === undefined || r.port === target.port) && (r.host === undefined || hostMatch(r.host, target.host)),
    );
    if (!could) return gateReason(gate.source);
  }
  return null;
}

/** The verdict for a routed host (--llm-host, --cp-api-host): never connected to, so only rules by name apply. */
export function decideRouted(gates: DestinationGates, target: Target): DestinationVerdict {
  for (const rule of gates.deny)
    if (rule.cidr === undefined && ruleMatches(rule, target, null)) return refused(denyReason(rule));
  return { allowed: true, address: null, family: null };
}

function refused(reason: string): DestinationVerdict {
  return { allowed: false, reason };
}

/**
 * One resolved address: where the connection goes, and the addresses it is checked as (itself, and the
 * IPv4 address behind a NAT64 address).
 */
interface Resolved {
  address: string;
  family: 4 | 6;
  views: { address: string; family: 4 | 6 }[];
}

function resolvedOf(raw: string): Resolved {
  const a = normalizeAddress(raw);
  const v4 = nat64Ipv4(a);
  return { ...a, views: v4 ? [a, v4] : [a] };
}

/**
 * Whether `rule` matches the destination as any of its addresses; a target that is an IP literal is
 * also compared by name as each of them (a rule naming `10.0.0.5` refuses `[64:ff9b::10.0.0.5]`).
 */
function matchesAny(rule: Rule, target: Target, a: Resolved): boolean {
  const literal = isIP(target.host) !== 0;
  return a.views.some((v) => ruleMatches(rule, literal ? { host: v.address, port: target.port } : target, v));
}

/** The range of `set` one of the address's views falls in, with that view's address; null when none does. */
function rangeOf(set: { all: BlockList; each: Range[] }, a: Resolved): { range: Range; address: string } | null {
  for (const v of a.views) {
    const kind = v.family === 4 ? 'ipv4' : 'ipv6';
    if (!set.all.check(v.address, kind)) continue;
    const range = set.each.find((r) => r.family === v.family && r.list.check(v.address, kind));
    if (range) return { range, address: v.address };
  }
  return null;
}

/** The verdict for a destination whose name resolved to `addresses` (in resolution order). */
export function decideResolved(
  gates: DestinationGates,
  target: Target,
  addresses: readonly { address: string; family: 4 | 6 }[],
): DestinationVerdict {
  const checked = addresses.map((a) => resolvedOf(a.address));
  if (checked.length === 0) return refused('the name resolved to no address');
  // One address under a deny rule refuses the name.
  for (const a of checked)
    for (const rule of gates.deny) if (matchesAny(rule, target, a)) return refused(denyReason(rule));
  let why = '';
  for (const a of checked) {
    const guarded = rangeOf(ALWAYS_GUARDED, a);
    const isPrivate = rangeOf(PRIVATE, a);
    const guardedWhy = () =>
      `${guarded!.address} is a link-local, unspecified or multicast address: only an allow rule naming its cidr reaches it`;
    if (guarded && gates.allow.length === 0) {
      why ||= guardedWhy();
      continue;
    }
    let ok = true;
    for (const gate of gates.allow) {
      const matching = gate.rules.filter((r) => matchesAny(r, target, a));
      if (matching.length === 0) {
        why ||= gateReason(gate.source);
        ok = false;
        break;
      }
      if (guarded && !matching.some((r) => namesRange(r, guarded.range))) {
        why ||= guardedWhy();
        ok = false;
        break;
      }
      if (
        isPrivate &&
        !matching.some((r) => namesRange(r, isPrivate.range) || (r.host !== undefined && !r.host.includes('*')))
      ) {
        const broad = matching.some((r) => r.cidr !== undefined)
          ? 'a cidr rule not naming its range'
          : 'a wildcard host rule';
        why ||= `${target.host} resolved to the private address ${isPrivate.address}, which ${broad} does not reach`;
        ok = false;
        break;
      }
    }
    if (ok) return { allowed: true, address: a.address, family: a.family };
  }
  return refused(why || 'not on the destination allow list');
}
