import { CAPABILITIES } from '../../controlplane/authz/capabilities.ts';
import { CliError } from '../errors.ts';
import { EXIT_USAGE } from '../exit-codes.ts';

// What the control plane accepts as ids, checked before a request is sent (exit 2, nothing sent). The
// forms are the routes' own (controlplane/routes/orgs.ts, agents.ts, roles.ts, grants.ts).

const SLUG = /^[a-z0-9][a-z0-9_-]{0,62}$/;
const AGENT_UID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const ROLE = /^[a-z][a-z0-9-]{1,62}$/;
const PRINCIPAL = /^(user:\S+|group:[^:\s]+:\S+|agent:\S+)$/;
const GRANT_ID = /^[1-9]\d{0,15}$/;

function check(re: RegExp, value: string | undefined, what: string, form: string): string {
  if (value === undefined || !re.test(value))
    throw new CliError(`${what} ${JSON.stringify(value ?? '')} is not valid: ${form}`, EXIT_USAGE);
  return value;
}

const SLUG_FORM = '1–63 lowercase letters, digits, "-" or "_", starting with a letter or digit';

/** An org, group, enclave or connector id. */
export const slug = (value: string | undefined, what: string) => check(SLUG, value, what, SLUG_FORM);
export const agentUid = (value: string | undefined, what = 'agent uid') =>
  check(AGENT_UID, value, what, '1–128 letters, digits, ".", "_" or "-", starting with a letter or digit');
export const roleName = (value: string | undefined, what = 'role') =>
  check(ROLE, value, what, '2–63 lowercase letters, digits or "-", starting with a letter');
export const principal = (value: string | undefined) =>
  check(PRINCIPAL, value, 'principal', 'user:<subject>, group:<org>:<group> or agent:<uid>');
export const grantId = (value: string | undefined) => check(GRANT_ID, value, 'grant id', 'a positive integer');

/** A capability of the control plane's catalogue (controlplane/authz/capabilities.ts). */
export function capability(value: string): string {
  if (!(CAPABILITIES as readonly string[]).includes(value))
    throw new CliError(`unknown capability "${value}" (one of ${CAPABILITIES.join(', ')})`, EXIT_USAGE);
  return value;
}

/** The org a command acts in: --org is required and well-formed. */
export function requireOrg(org: string | undefined): string {
  if (org === undefined) throw new CliError('--org ORG is required', EXIT_USAGE);
  return slug(org, '--org');
}

/** Repeatable option collector for commander. */
export const collect = (value: string, previous: string[] = []) => [...previous, value];
