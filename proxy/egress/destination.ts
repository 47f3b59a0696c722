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
//     through an allow rule whose `cidr` contains the address;
//   - loopback and private ranges (RFC 1918, CGNAT, ULA): not through a wildcard host rule (`*.corp`
//     resolving to 10.0.0.5); an exact host name or a cidr rule reaches them. With no allow gate at
//     all (an open gateway) they are reachable, as everything is.

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

const ALWAYS_GUARDED = new BlockList();
ALWAYS_GUARDED.addSubnet('0.0.0.0', 8, 'ipv4');
ALWAYS_GUARDED.addSubnet('169.254.0.0', 16, 'ipv4');
ALWAYS_GUARDED.addSubnet('224.0.0.0', 4, 'ipv4');
ALWAYS_GUARDED.addSubnet('240.0.0.0', 4, 'ipv4'); // reserved, 255.255.255.255 included
ALWAYS_GUARDED.addAddress('::', 'ipv6');
ALWAYS_GUARDED.addSubnet('fe80::', 10, 'ipv6');
ALWAYS_GUARDED.addSubnet('ff00::', 8, 'ipv6');
ALWAYS_GUARDED.addAddress('fd00:ec2::254', 'ipv6'); // the IPv6 address of a cloud metadata service

const PRIVATE = new BlockList();
PRIVATE.addSubnet('127.0.0.0', 8, 'ipv4');
PRIVATE.addSubnet('10.0.0.0', 8, 'ipv4');
PRIVATE.addSubnet('172.16.0.0', 12, 'ipv4');
PRIVATE.addSubnet('192.168.0.0', 16, 'ipv4');
PRIVATE.addSubnet('100.64.0.0', 10, 'ipv4');
PRIVATE.addAddress('::1', 'ipv6');
PRIVATE.addSubnet('fc00::', 7, 'ipv6');

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

const cidrs = new Map<string, BlockList>();

function inCidr(cidr: string, address: string, family: 4 | 6): boolean {
  let list = cidrs.get(cidr);
  if (!list) {
    list = new BlockList();
    const [net, bits] = cidr.split('/');
    const n = normalizeAddress(net!);
    const mapped = n.family === 4 && net!.includes(':');
    if (bits === undefined) list.addAddress(n.address, n.family === 4 ? 'ipv4' : 'ipv6');
    else if (mapped && Number(bits) < 96)
      // Wider than the IPv4-mapped range (`::ffff:1.2.3.4/64`): an IPv6 network, which BlockList checks
      // IPv4 addresses against as their mapped form.
      list.addSubnet(canonicalHost(net!), Number(bits), 'ipv6');
    else list.addSubnet(n.address, Number(bits) - (mapped ? 96 : 0), n.family === 4 ? 'ipv4' : 'ipv6');
    if (cidrs.size > 4096) cidrs.clear();
    cidrs.set(cidr, list);
  }
  return list.check(address, family === 4 ? 'ipv4' : 'ipv6');
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

/** The verdict for a destination whose name resolved to `addresses` (in resolution order). */
export function decideResolved(
  gates: DestinationGates,
  target: Target,
  addresses: readonly { address: string; family: 4 | 6 }[],
): DestinationVerdict {
  const checked = addresses.map((a) => normalizeAddress(a.address));
  if (checked.length === 0) return refused('the name resolved to no address');
  // One address under a deny rule refuses the name.
  for (const a of checked)
    for (const rule of gates.deny) if (ruleMatches(rule, target, a)) return refused(denyReason(rule));
  let why = '';
  for (const a of checked) {
    const kind = a.family === 4 ? 'ipv4' : 'ipv6';
    const guarded = ALWAYS_GUARDED.check(a.address, kind);
    const isPrivate = PRIVATE.check(a.address, kind);
    if (guarded && gates.allow.length === 0) {
      why ||= `${a.address} is a link-local, unspecified or multicast address: only an allow rule naming its cidr reaches it`;
      continue;
    }
    let ok = true;
    for (const gate of gates.allow) {
      const matching = gate.rules.filter((r) => ruleMatches(r, target, a));
      if (matching.length === 0) {
        why ||= gateReason(gate.source);
        ok = false;
        break;
      }
      if (guarded && !matching.some((r) => r.cidr !== undefined)) {
        why ||= `${a.address} is a link-local, unspecified or multicast address: only an allow rule naming its cidr reaches it`;
        ok = false;
        break;
      }
      if (isPrivate && !matching.some((r) => r.cidr !== undefined || (r.host !== undefined && !r.host.includes('*')))) {
        why ||= `${target.host} resolved to the private address ${a.address}, which a wildcard host rule does not reach`;
        ok = false;
        break;
      }
    }
    if (ok) return { allowed: true, address: a.address, family: a.family };
  }
  return refused(why || 'not on the destination allow list');
}
