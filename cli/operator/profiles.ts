import { mkdir, readFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { writeFileAtomic } from '../../core/atomic-file.ts';
import { CliError } from '../errors.ts';
import { EXIT_USAGE } from '../exit-codes.ts';

// Named client profiles, so an operator types the client options once (docs/cli.md, "Profiles").
//
//   $XDG_CONFIG_HOME/dvx/config.json   (~/.config/dvx/config.json when XDG_CONFIG_HOME is unset;
//                                       --profiles FILE or DVX_PROFILES to use another file)
//   {"default_profile": "dev",
//    "profiles": {"dev": {"controlplane": "https://127.0.0.1:8443", "broker": "https://127.0.0.1:8451",
//                         "idp_key": "/abs/.dvx/admin-key.json", "issuer": "http://127.0.0.1:8455",
//                         "audience": "https://…", "ca_cert": "/abs/.dvx/ca.pem"}}}
//
// A profile holds where to find things (URLs, file paths), never a token or a key itself: those stay in
// their own files with their own permissions. Relative paths are read against the config file's folder.

/** The client settings a profile may hold: the spec's client options (Authentication, "Client authentication options"). */
export interface Profile {
  controlplane?: string;
  broker?: string;
  idp_key?: string;
  issuer?: string;
  audience?: string;
  token_file?: string;
  ca_cert?: string;
  insecure_skip_verify?: boolean;
  output?: 'table' | 'json' | 'jsonl';
}

export interface ProfilesFile {
  default_profile?: string;
  profiles: Record<string, Profile>;
}

const STRING_FIELDS = ['controlplane', 'broker', 'idp_key', 'issuer', 'audience', 'token_file', 'ca_cert'] as const;
const PATH_FIELDS = ['idp_key', 'token_file', 'ca_cert'] as const;
export const PROFILE_FIELDS: readonly (keyof Profile)[] = [...STRING_FIELDS, 'insecure_skip_verify', 'output'];
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

/** Where profiles live: an explicit file, else $XDG_CONFIG_HOME/dvx/config.json, else ~/.config/dvx/config.json. */
export function profilesPath(explicit?: string, env: NodeJS.ProcessEnv = process.env): string {
  if (explicit) return resolve(explicit);
  const xdg = env.XDG_CONFIG_HOME;
  const base = xdg && isAbsolute(xdg) ? xdg : join(env.HOME || homedir(), '.config');
  return join(base, 'dvx', 'config.json');
}

export function checkProfileName(name: string): string {
  if (!NAME.test(name))
    throw new CliError(
      `profile name "${name}": letters, digits, ".", "_" and "-", at most 64, starting with a letter or digit`,
    );
  return name;
}

/** Checks a profile read from a file or built from flags: known fields, right types, absolute URLs. */
export function validateProfile(raw: unknown, where: string): Profile {
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw new CliError(`${where}: a profile is a JSON object`);
  const out: Profile = {};
  for (const [k, v] of Object.entries(raw as Record<string, unknown>)) {
    if (!(PROFILE_FIELDS as readonly string[]).includes(k))
      throw new CliError(`${where}: unknown field "${k}" (known: ${PROFILE_FIELDS.join(', ')})`);
    if (k === 'insecure_skip_verify') {
      if (typeof v !== 'boolean') throw new CliError(`${where}: insecure_skip_verify must be true or false`);
      out.insecure_skip_verify = v;
    } else if (k === 'output') {
      if (v !== 'table' && v !== 'json' && v !== 'jsonl')
        throw new CliError(`${where}: output must be table, json or jsonl`);
      out.output = v;
    } else {
      if (typeof v !== 'string' || !v) throw new CliError(`${where}: ${k} must be a non-empty string`);
      if ((k === 'controlplane' || k === 'broker' || k === 'issuer') && !/^https?:\/\/[^\s]+$/i.test(v))
        throw new CliError(`${where}: ${k} must be an http(s) URL`);
      (out as Record<string, string>)[k] = v;
    }
  }
  return out;
}

/** The profiles file; an absent file is an empty one. A file that does not parse is an error, never overwritten. */
export async function readProfiles(path: string): Promise<ProfilesFile> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { profiles: {} };
    throw new CliError(
      `cannot read profiles ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
    );
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new CliError(`profiles ${path} is not valid JSON`);
  }
  if (!doc || typeof doc !== 'object' || Array.isArray(doc)) throw new CliError(`profiles ${path}: a JSON object`);
  const d = doc as { default_profile?: unknown; profiles?: unknown };
  const profiles: Record<string, Profile> = Object.create(null);
  if (d.profiles !== undefined) {
    if (!d.profiles || typeof d.profiles !== 'object' || Array.isArray(d.profiles))
      throw new CliError(`profiles ${path}: "profiles" must be an object`);
    for (const [name, p] of Object.entries(d.profiles)) {
      checkProfileName(name);
      profiles[name] = validateProfile(p, `profiles ${path}, profile "${name}"`);
    }
  }
  if (d.default_profile !== undefined && typeof d.default_profile !== 'string')
    throw new CliError(`profiles ${path}: "default_profile" must be a string`);
  return { ...(d.default_profile ? { default_profile: d.default_profile } : {}), profiles };
}

/** Writes the file whole (temp file + rename, mode 0600), so a crash never leaves half a file. */
export async function writeProfiles(path: string, doc: ProfilesFile): Promise<void> {
  await mkdir(dirname(path), { recursive: true, mode: 0o700 });
  const ordered = { ...(doc.default_profile ? { default_profile: doc.default_profile } : {}), profiles: doc.profiles };
  // Its temporary file is created exclusively: a name planted there is never written or chmod-ed through.
  await writeFileAtomic(path, `${JSON.stringify(ordered, null, 2)}\n`, { mode: 0o600 });
}

/** Adds or replaces one profile; `makeDefault` also selects it (or when no profile is the default yet). */
export async function saveProfile(
  path: string,
  name: string,
  profile: Profile,
  options: { makeDefault?: boolean } = {},
): Promise<void> {
  checkProfileName(name);
  const doc = await readProfiles(path);
  doc.profiles[name] = validateProfile(profile, `profile "${name}"`);
  if (options.makeDefault || !doc.default_profile || !(doc.default_profile in doc.profiles)) doc.default_profile = name;
  await writeProfiles(path, doc);
}

/**
 * The profile a command uses: `--profile NAME` (which must exist), else the file's default (if it exists),
 * else none. Paths in it come back absolute.
 */
export async function selectProfile(
  path: string,
  name: string | undefined,
): Promise<{ name: string; profile: Profile } | null> {
  const doc = await readProfiles(path);
  const chosen = name ?? doc.default_profile;
  if (!chosen) return null;
  const profile = Object.hasOwn(doc.profiles, chosen) ? doc.profiles[chosen] : undefined;
  if (!profile) {
    if (name === undefined) return null;
    throw new CliError(`no profile "${name}" in ${path} (dvx profile list)`, EXIT_USAGE);
  }
  const base = dirname(path);
  const abs: Profile = { ...profile };
  for (const f of PATH_FIELDS) if (abs[f]) abs[f] = resolve(base, abs[f] as string);
  return { name: chosen, profile: abs };
}
