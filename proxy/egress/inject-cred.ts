import { hostMatch, isValidHostPattern } from './host-match.ts';
import { GatewayRuleError, MissingCredentialError } from './errors.ts';
import type { SecretSource } from '../llm/secrets-file.ts';

// `--inject-cred` rules (docs/gateway.md, "Credential injection"), shared by the gateway (which adds
// the header to an agent's request, so the agent never holds the credential) and imds (which hands the
// credential to the agent's own process). One rule per flag, written as comma-separated fields:
//
//   host=api.github.com,header=Authorization,secret=github_token,format=Bearer {}
//
//   host     a host glob (host-match.ts): `*` matches any run of characters, dots included; required
//   port     the destination port it applies to; any port when omitted
//   header   the request header to set; required (an agent's own header of that name is replaced)
//   secret   the secret's name: the agent's secret of that name (the broker merges org → group →
//            agent), else its org's; required
//   format   the header value, `{}` standing for the secret (exactly once); `{}` when omitted. It is the
//            last field: everything after `format=` is the value, commas included
//
// The same rule may also be given as a JSON object with these keys. A request to a host of a rule whose
// secret is missing is refused (MissingCredentialError), never sent bare.

export interface InjectRule {
  host: string;
  port: number | null;
  header: string;
  secret: string;
  format: string;
  /** The rule as given, for messages and the audit record. */
  text: string;
}

const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$/;
/** What a header value must not hold: the controls but HTAB (RFC 9110 5.5), CR, LF and NUL among them. */
const HEADER_UNSAFE = /[\x00-\x08\x0a-\x1f\x7f]/;
const SECRET_NAME = /^[A-Za-z0-9][A-Za-z0-9._:/-]{0,255}$/;
/** Headers an injection must never set: they would change how the request is framed or routed. */
const FORBIDDEN = new Set([
  'host',
  'content-length',
  'transfer-encoding',
  'connection',
  'upgrade',
  'te',
  'trailer',
  'keep-alive',
  'proxy-authorization',
  'proxy-connection',
  'expect',
]);

export function parseInjectRule(text: string): InjectRule {
  const fail = (why: string): never => {
    throw new GatewayRuleError(`--inject-cred "${text}": ${why}`);
  };
  const fields = new Map<string, string>();
  const trimmed = text.trim();
  if (trimmed.startsWith('{')) {
    let doc: unknown;
    try {
      doc = JSON.parse(trimmed);
    } catch {
      fail('not valid JSON');
    }
    if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) fail('must be a JSON object');
    for (const [k, v] of Object.entries(doc as Record<string, unknown>)) {
      if (k === 'port' && typeof v === 'number') fields.set(k, String(v));
      else if (typeof v === 'string') fields.set(k, v);
      else fail(`${k} must be a string`);
    }
  } else {
    let rest = trimmed;
    while (rest.length > 0) {
      const eq = rest.indexOf('=');
      if (eq <= 0) fail('fields are key=value, separated by commas');
      const key = rest.slice(0, eq).trim().toLowerCase();
      if (fields.has(key)) fail(`${key} is given twice`);
      if (key === 'format') {
        fields.set(key, rest.slice(eq + 1));
        break;
      }
      const comma = rest.indexOf(',', eq);
      fields.set(key, (comma < 0 ? rest.slice(eq + 1) : rest.slice(eq + 1, comma)).trim());
      rest = comma < 0 ? '' : rest.slice(comma + 1).trim();
    }
  }
  for (const k of fields.keys())
    if (!['host', 'port', 'header', 'secret', 'format'].includes(k))
      fail(`unknown field "${k}" (host, port, header, secret, format)`);
  const host = (fields.get('host') ?? '').toLowerCase();
  if (!host) fail('host is required');
  if (!isValidHostPattern(host)) fail(`host "${host}" is not a host name or glob`);
  let port: number | null = null;
  if (fields.has('port')) {
    const p = fields.get('port')!;
    if (!/^\d{1,5}$/.test(p) || Number(p) < 1 || Number(p) > 65535) fail('port must be 1..65535');
    port = Number(p);
  }
  const header = fields.get('header') ?? '';
  if (!HEADER_NAME.test(header)) fail('header must be an HTTP header name');
  if (FORBIDDEN.has(header.toLowerCase())) fail(`header ${header} cannot be injected`);
  const secret = fields.get('secret') ?? '';
  if (!SECRET_NAME.test(secret)) fail('secret must name a secret');
  const format = fields.get('format') ?? '{}';
  if (format.split('{}').length !== 2) fail('format must hold {} exactly once');
  if (HEADER_UNSAFE.test(format)) fail('format must not hold a line break or another control character');
  return { host, port, header: header.toLowerCase(), secret, format, text };
}

/** The rules that apply to a destination, in the order given. */
export function rulesFor(rules: readonly InjectRule[], host: string, port: number): InjectRule[] {
  return rules.filter((r) => (r.port === null || r.port === port) && hostMatch(r.host, host));
}

/** One credential as it goes on the wire: the header and its value (never logged). */
export interface Injection {
  rule: InjectRule;
  header: string;
  value: string;
}

/**
 * The headers the rules set for this agent and destination; throws MissingCredentialError naming the
 * first rule whose secret the agent (nor its org) has, or whose value cannot go in a header.
 */
export function injectionsFor(
  rules: readonly InjectRule[],
  secrets: SecretSource,
  agent: { agentId: string; orgId: string },
  host: string,
  port: number,
): Injection[] {
  const out: Injection[] = [];
  for (const rule of rulesFor(rules, host, port)) {
    const value = secrets.get(`agent:${agent.agentId}`, rule.secret) ?? secrets.get(`org:${agent.orgId}`, rule.secret);
    if (value === undefined || value === '')
      throw new MissingCredentialError(
        `credential rule for ${rule.host} needs secret "${rule.secret}", which agent ${agent.agentId} does not have`,
      );
    // A value with a line break would split the header, and HTTP refuses the other control characters
    // in a field value (RFC 9110 5.5): refused here, rather than sent (nor logged) or failing the send.
    if (HEADER_UNSAFE.test(value))
      throw new MissingCredentialError(
        `secret "${rule.secret}" cannot be sent in a header (it holds a line break or another control character)`,
      );
    out.push({ rule, header: rule.header, value: rule.format.replace('{}', () => value) });
  }
  return out;
}
