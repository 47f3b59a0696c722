import { resolve } from 'node:path';
import { Command, Option } from 'commander';
import { CliError } from '../errors.ts';
import { EXIT_NOT_FOUND } from '../exit-codes.ts';
import { OUTPUT_FORMATS } from '../operator/client-options.ts';
import { render } from '../operator/output.ts';
import {
  checkProfileName,
  type Profile,
  profilesPath,
  readProfiles,
  saveProfile,
  writeProfiles,
} from '../operator/profiles.ts';

// dvx profile list | get NAME | set NAME [options] | delete NAME | use NAME
//
// Named client profiles (docs/cli.md, "Profiles"). `set` takes the client options' own names and keeps
// only what is given on its command line (never the DVX_* environment, so a shell's variables are not
// saved by accident); files are stored as absolute paths.

const profilesOption = () =>
  new Option('--profiles <file>', 'profiles file (default $XDG_CONFIG_HOME/dvx/config.json)').env('DVX_PROFILES');
const outputOption = () => new Option('--output <format>', 'table, json or jsonl').choices(OUTPUT_FORMATS);
const format = (o: { output?: string }) =>
  (o.output ?? (process.stdout.isTTY ? 'table' : 'json')) as (typeof OUTPUT_FORMATS)[number];

export function profileCommand(): Command {
  const group = new Command('profile').description('named client profiles, so the client options are typed once');

  group
    .command('list')
    .description('every profile, the default marked')
    .addOption(profilesOption())
    .addOption(outputOption())
    .action(async (o: { profiles?: string; output?: string }) => {
      const doc = await readProfiles(profilesPath(o.profiles));
      const rows = Object.entries(doc.profiles).map(([name, p]) => ({
        name,
        default: name === doc.default_profile,
        controlplane: p.controlplane ?? null,
        broker: p.broker ?? null,
        credential: p.idp_key ? `idp-key ${p.idp_key}` : p.token_file ? `token-file ${p.token_file}` : null,
      }));
      process.stdout.write(render(rows, format(o)));
    });

  group
    .command('get')
    .description('one profile')
    .argument('<name>')
    .addOption(profilesOption())
    .addOption(outputOption())
    .action(async (name: string, o: { profiles?: string; output?: string }) => {
      const doc = await readProfiles(profilesPath(o.profiles));
      const p = Object.hasOwn(doc.profiles, name) ? doc.profiles[name] : undefined;
      if (!p) throw new CliError(`no profile "${name}"`, EXIT_NOT_FOUND);
      process.stdout.write(render({ name, default: name === doc.default_profile, ...p }, format(o)));
    });

  group
    .command('set')
    .description('create or replace a profile from the client options given here')
    .argument('<name>')
    .option('--controlplane <url>', 'base URL of the operator API')
    .option('--broker <url>', "base URL of the enclave broker's operator listener")
    .option('--idp-key <file>', 'service-account key file (mints its own token)')
    .option('--issuer <url>', 'the OIDC issuer --idp-key mints at')
    .option('--audience <aud>', 'audience of the minted token')
    .option('--token-file <file>', 'a bearer token file')
    .option('--ca-cert <file>', 'CA bundle to trust')
    .option('--insecure-skip-verify', 'do not verify TLS certificates (development only)')
    .addOption(new Option('--default-output <format>', 'output format for this profile').choices(OUTPUT_FORMATS))
    .option('--use', 'also make it the default profile')
    .addOption(profilesOption())
    .action(async (name: string, o: Record<string, string | boolean | undefined>) => {
      checkProfileName(name);
      if (o.idpKey && o.tokenFile) throw new CliError('--idp-key and --token-file are alternatives: give one');
      const abs = (v: unknown) => (typeof v === 'string' ? resolve(v) : undefined);
      const p: Profile = {};
      if (o.controlplane) p.controlplane = String(o.controlplane);
      if (o.broker) p.broker = String(o.broker);
      if (o.idpKey) p.idp_key = abs(o.idpKey);
      if (o.issuer) p.issuer = String(o.issuer);
      if (o.audience) p.audience = String(o.audience);
      if (o.tokenFile) p.token_file = abs(o.tokenFile);
      if (o.caCert) p.ca_cert = abs(o.caCert);
      if (o.insecureSkipVerify) {
        p.insecure_skip_verify = true;
        process.stderr.write('dvx: warning: this profile does not verify TLS certificates (development only)\n');
      }
      if (o.defaultOutput) p.output = o.defaultOutput as Profile['output'];
      const file = profilesPath(o.profiles as string | undefined);
      await saveProfile(file, name, p, { makeDefault: !!o.use });
      process.stderr.write(`profile "${name}" saved in ${file}\n`);
    });

  group
    .command('delete')
    .description('remove a profile')
    .argument('<name>')
    .addOption(profilesOption())
    .action(async (name: string, o: { profiles?: string }) => {
      const file = profilesPath(o.profiles);
      const doc = await readProfiles(file);
      if (!Object.hasOwn(doc.profiles, name)) throw new CliError(`no profile "${name}"`, EXIT_NOT_FOUND);
      delete doc.profiles[name];
      if (doc.default_profile === name) delete doc.default_profile;
      await writeProfiles(file, doc);
      process.stderr.write(`profile "${name}" deleted\n`);
    });

  group
    .command('use')
    .description('make a profile the default')
    .argument('<name>')
    .addOption(profilesOption())
    .action(async (name: string, o: { profiles?: string }) => {
      const file = profilesPath(o.profiles);
      const doc = await readProfiles(file);
      if (!Object.hasOwn(doc.profiles, name)) throw new CliError(`no profile "${name}"`, EXIT_NOT_FOUND);
      doc.default_profile = name;
      await writeProfiles(file, doc);
      process.stderr.write(`default profile: ${name}\n`);
    });

  return group;
}
