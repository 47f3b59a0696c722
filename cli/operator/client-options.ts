import { readFile } from 'node:fs/promises';
import { rootCertificates } from 'node:tls';
import { type Command, Option } from 'commander';
import { envName, flag, parseBoolean } from '../../core/options.ts';
import { CliError } from '../errors.ts';
import { type Profile, profilesPath, selectProfile } from './profiles.ts';

// The spec's client options (Authentication, "Client authentication options of the command-line
// client") on every operator command, with their `DVX_*` variables, filled in from the chosen profile
// where neither the flag nor the variable is given: flag, then environment, then profile, then default.

export type OutputFormat = 'table' | 'json' | 'jsonl';
export const OUTPUT_FORMATS: readonly OutputFormat[] = ['table', 'json', 'jsonl'];

/** What a command talks to, resolved once per invocation. */
export interface ClientSettings {
  controlplane?: string;
  broker?: string;
  idpKey?: string;
  issuer?: string;
  audience?: string;
  tokenFile?: string;
  /** Trusted roots: the system's plus --ca-cert, or undefined for the system's alone. */
  ca?: string[];
  insecureSkipVerify: boolean;
  output: OutputFormat;
  profile?: string;
}

interface RawClientFlags {
  controlplane?: string;
  broker?: string;
  idpKey?: string;
  issuer?: string;
  audience?: string;
  tokenFile?: string;
  caCert?: string;
  insecureSkipVerify?: boolean;
  output?: string;
  profile?: string;
  profiles?: string;
}

/** Adds the client options to an operator command; `broker` adds --broker (commands served by the enclave broker). */
export function addClientOptions(command: Command, options: { broker?: boolean } = {}): Command {
  command
    .addOption(flag('--controlplane <url>', { description: 'base URL of the operator API (https://host:8443)' }))
    .addOption(
      flag('--idp-key <file>', {
        description: 'service-account key file: mints its own token at --issuer (optionally for --audience)',
      }),
    )
    .addOption(flag('--issuer <url>', { description: 'the OIDC issuer --idp-key mints at' }))
    .addOption(flag('--audience <aud>', { description: 'audience (resource) of the minted token' }))
    .addOption(flag('--token-file <file>', { description: 'a bearer token file, instead of --idp-key' }))
    .addOption(flag('--ca-cert <file>', { description: "CA bundle to trust for the API's TLS certificate" }))
    // A boolean's variable is read in resolveClientSettings: commander would take any value, "false" too, as on.
    .addOption(
      new Option(
        '--insecure-skip-verify',
        `do not verify TLS certificates (development only; env ${envName('insecure-skip-verify')}=true|false)`,
      ),
    )
    .addOption(
      flag('--output <format>', {
        description: 'table (on a terminal), json (when piped) or jsonl',
        choices: OUTPUT_FORMATS,
      }),
    )
    .addOption(flag('--profile <name>', { description: 'named client profile (dvx profile list)' }))
    .addOption(flag('--profiles <file>', { description: 'profiles file (default $XDG_CONFIG_HOME/dvx/config.json)' }));
  if (options.broker)
    command.addOption(flag('--broker <url>', { description: "base URL of the enclave broker's operator listener" }));
  return command;
}

function fromFlagOrEnv(command: Command, key: keyof RawClientFlags): boolean {
  const source = command.getOptionValueSource(key);
  return source === 'cli' || source === 'env';
}

/** Flag, then environment, then profile, then default; reads the CA bundle so a bad path fails before any call. */
export async function resolveClientSettings(command: Command, isTty: boolean): Promise<ClientSettings> {
  const o = command.opts<RawClientFlags>();
  const chosen = await selectProfile(profilesPath(o.profiles), o.profile);
  const p: Profile = chosen?.profile ?? {};
  const pick = <K extends keyof RawClientFlags>(key: K, profileValue: RawClientFlags[K]): RawClientFlags[K] =>
    fromFlagOrEnv(command, key) ? o[key] : (profileValue ?? o[key]);
  let insecure: boolean;
  const insecureEnv = process.env[envName('insecure-skip-verify')];
  if (o.insecureSkipVerify) insecure = true;
  else if (insecureEnv !== undefined && insecureEnv !== '') {
    try {
      insecure = parseBoolean(insecureEnv);
    } catch (err) {
      throw new CliError(`${envName('insecure-skip-verify')}: ${(err as Error).message}`);
    }
  } else insecure = p.insecure_skip_verify ?? false;
  if (insecure)
    process.stderr.write(
      'dvx: warning: TLS certificates are not verified (--insecure-skip-verify; development only)\n',
    );
  const output = (pick('output', p.output) ?? (isTty ? 'table' : 'json')) as OutputFormat;
  const caCert = pick('caCert', p.ca_cert);
  let ca: string[] | undefined;
  if (caCert) {
    let pem: string;
    try {
      pem = await readFile(caCert, 'utf8');
    } catch (err) {
      throw new CliError(
        `cannot read --ca-cert ${caCert}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
      );
    }
    if (!pem.includes('-----BEGIN CERTIFICATE-----'))
      throw new CliError(`--ca-cert ${caCert} holds no PEM certificate`);
    ca = [...rootCertificates, pem];
  }
  const settings: ClientSettings = {
    controlplane: pick('controlplane', p.controlplane),
    broker: pick('broker', p.broker),
    idpKey: pick('idpKey', p.idp_key),
    issuer: pick('issuer', p.issuer),
    audience: pick('audience', p.audience),
    tokenFile: pick('tokenFile', p.token_file),
    ca,
    insecureSkipVerify: insecure,
    output,
    profile: chosen?.name,
  };
  for (const [name, url] of [
    ['--controlplane', settings.controlplane],
    ['--broker', settings.broker],
    ['--issuer', settings.issuer],
  ] as const)
    if (url !== undefined && !/^https?:\/\/[^\s/?#]+(\/[^\s?#]*)?$/i.test(url))
      throw new CliError(`${name} must be an http(s) base URL, got "${url}"`);
    else if (url !== undefined && !secureTransport(url))
      throw new CliError(
        `${name} ${url}: plain http would send the credential in the clear; use https (http is for loopback addresses only)`,
      );
  // The two credentials are alternatives: one given as a flag or variable replaces the profile's other.
  const keyGiven = fromFlagOrEnv(command, 'idpKey');
  const fileGiven = fromFlagOrEnv(command, 'tokenFile');
  if (keyGiven && fileGiven) throw new CliError('--idp-key and --token-file are alternatives: give one');
  if (keyGiven) settings.tokenFile = undefined;
  else if (fileGiven) settings.idpKey = undefined;
  else if (settings.idpKey && settings.tokenFile)
    throw new CliError(`profile "${settings.profile}" holds both idp_key and token_file: keep one`);
  return settings;
}

/**
 * https, or http to this machine (dvx dev's issuer is http://127.0.0.1): the bearer token and the client
 * assertion never cross a network in the clear.
 */
export function secureTransport(url: string): boolean {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return false;
  }
  if (u.protocol === 'https:') return true;
  if (u.protocol !== 'http:') return false;
  const host = u.hostname.replace(/^\[|\]$/g, '');
  return host === 'localhost' || host === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}
