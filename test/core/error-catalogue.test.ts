import { test } from 'tap';
import { readFile, readdir } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { DvxError } from '../../core/errors.ts';

// Every package's error catalogue against docs/errors.md, the way fastify checks lib/errors.js against
// its docs: each class a DvxError with a unique DVX_* code, every code documented, no documented code
// without its class, and no error class declared outside an errors.ts.

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const PACKAGES = ['core', 'pipeline', 'audit-wal', 'proxy', 'controlplane', 'enclave', 'cli'];

async function sources(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(join(ROOT, dir), { withFileTypes: true, recursive: true })) {
    if (entry.isFile() && entry.name.endsWith('.ts')) out.push(relative(ROOT, join(entry.parentPath, entry.name)));
  }
  return out;
}

async function catalogues(): Promise<Map<string, string>> {
  const codes = new Map<string, string>();
  // A class one catalogue re-exports from a lower layer's (the control plane's ApiError is core's) is one entry.
  const classes = new Set<unknown>();
  for (const pkg of PACKAGES) {
    for (const file of (await sources(pkg)).filter((f) => f.endsWith('/errors.ts'))) {
      const mod = (await import(pathToFileURL(join(ROOT, file)).href)) as Record<string, unknown>;
      for (const [name, value] of Object.entries(mod)) {
        if (typeof value !== 'function' || !(value.prototype instanceof Error) || classes.has(value)) continue;
        classes.add(value);
        if (!(value.prototype instanceof DvxError) && value !== DvxError)
          throw new Error(`${file}: ${name} does not extend DvxError`);
        const code = (value as typeof DvxError).code;
        if (value !== DvxError && code === DvxError.code)
          throw new Error(`${file}: ${name} declares no code of its own`);
        const seen = codes.get(code);
        if (seen && seen !== `${file}:${name}`) {
          // A subclass that keeps its parent's code is the one accepted reuse (the same error, narrower).
          const parent = Object.getPrototypeOf(value) as typeof DvxError;
          if (parent.code !== code) throw new Error(`${code} is used by ${seen} and ${file}:${name}`);
          continue;
        }
        codes.set(code, `${file}:${name}`);
      }
    }
  }
  return codes;
}

test('every error class is a DvxError with a unique, documented DVX_* code', async (t) => {
  const codes = await catalogues();
  const docs = await readFile(join(ROOT, 'docs/errors.md'), 'utf8');
  const documented = new Set([...docs.matchAll(/^\| `(DVX_[A-Z0-9_]+)` \|/gm)].map((m) => m[1]));
  for (const [code, where] of codes) {
    t.match(code, /^DVX_[A-Z0-9_]+$/, `${where}: code ${code} is DVX_*`);
    t.ok(documented.has(code), `${code} (${where}) is in docs/errors.md`);
  }
  for (const code of documented) t.ok(codes.has(code), `docs/errors.md lists ${code}, which an errors.ts declares`);
});

test('no error class is declared outside an errors.ts', async (t) => {
  for (const pkg of PACKAGES) {
    for (const file of await sources(pkg)) {
      if (file.endsWith('/errors.ts')) continue;
      const text = await readFile(join(ROOT, file), 'utf8');
      const found = [...text.matchAll(/class (\w+) extends (\w*Error)\b/g)].map((m) => m[1]);
      t.same(found, [], `${file} declares no error class`);
    }
  }
});

test('a DvxError carries its code as an own property, for the log serializer', async (t) => {
  class Sample extends DvxError {
    static override readonly code = 'DVX_SAMPLE';
  }
  const err = new Sample('boom', { cause: new Error('root') });
  t.equal(err.code, 'DVX_SAMPLE');
  t.equal(err.name, 'Sample');
  t.ok(Object.keys(err).includes('code'));
  t.equal((err.cause as Error).message, 'root');
});
