import type { SecretSource } from '../llm/secrets-file.ts';
import { injectionsFor, type InjectRule } from '../egress/inject-cred.ts';

// The credentials imds hands the agent (GET /v1/credentials, GET /v1/credentials/{secret}): the
// gateway's `--inject-cred` rules, read the other way round. The gateway adds the header to the
// agent's request; imds gives the agent's own process the header and its value, for a client that
// must hold the credential itself (docs/imds.md, "Credentials").
//
// A secret's value is found exactly as the gateway finds it (inject-cred.ts injectionsFor: the agent's
// secret of that name, else its org's; a missing, empty or multi-line value is a MissingCredentialError
// naming the secret, never the value). Several rules may name one secret: the answer is the first
// rule's header and value with the hosts of every rule that sets the same header the same way; rules
// that set another header (or format) follow in `variants`.

/** A rule as listed: what it names, never a value. */
export interface RuleView {
  secret: string;
  host: string;
  port: number | null;
  header: string;
  format: string;
}

export function ruleViews(rules: readonly InjectRule[]): RuleView[] {
  return rules.map((r) => ({ secret: r.secret, host: r.host, port: r.port, header: r.header, format: r.format }));
}

/** The rules of each secret, in the order given (a Map: any name, `__proto__` included, is only a key). */
export function rulesBySecret(rules: readonly InjectRule[]): Map<string, InjectRule[]> {
  const out = new Map<string, InjectRule[]>();
  for (const r of rules) {
    const list = out.get(r.secret);
    if (list) list.push(r);
    else out.set(r.secret, [r]);
  }
  return out;
}

export interface CredentialVariant {
  header: string;
  value: string;
  /** `host` or `host:port` of each rule, globs as given. */
  hosts: string[];
}

export interface CredentialBody extends CredentialVariant {
  name: string;
  variants?: CredentialVariant[];
}

const hostOf = (r: InjectRule) => (r.port === null ? r.host : `${r.host}:${r.port}`);

/**
 * The credential of `name` for this agent from its rules; throws MissingCredentialError (from
 * injectionsFor) when the secret source does not hold it.
 */
export function credentialOf(
  name: string,
  rules: readonly InjectRule[],
  secrets: SecretSource,
  agent: { agentId: string; orgId: string },
): CredentialBody {
  const variants: CredentialVariant[] = [];
  for (const rule of rules) {
    // A rule's host glob matches itself (host-match.ts: `*` matches any run of characters, `*` among
    // them), so this is the gateway's own lookup for exactly this rule.
    const [injection] = injectionsFor([rule], secrets, agent, rule.host, rule.port ?? 0);
    if (injection === undefined) throw new Error(`inject-cred rule "${rule.text}" does not match its own host`);
    const same = variants.find((v) => v.header === injection.header && v.value === injection.value);
    if (same) same.hosts.push(hostOf(rule));
    else variants.push({ header: injection.header, value: injection.value, hosts: [hostOf(rule)] });
  }
  const [first, ...others] = variants;
  if (first === undefined) throw new Error(`no rule names secret "${name}"`);
  return { name, ...first, ...(others.length > 0 ? { variants: others } : {}) };
}
