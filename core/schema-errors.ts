import type { FastifyServerOptions } from 'fastify';
import type { ErrorObject } from 'ajv';

// The routes' JSON schemas are validated by fastify (ajv); a refusal is a 400 bad-request Problem whose
// detail starts with the field it is about ("name: is required", "grants[0].agent: must be a string").
// ajv is set up so a schema only checks, never changes, what it is given: unknown fields are refused
// (`additionalProperties: false`), not removed; no type coercion and no defaults (docs/decisions.md,
// "Route schemas and the capability hook"). A schema may name its own message in `x-error`.

type Verbose = ErrorObject & { parentSchema?: { 'x-error'?: string } };

const ARTICLE: Record<string, string> = {
  string: 'a string',
  boolean: 'a boolean',
  integer: 'an integer',
  number: 'a number',
  array: 'an array',
  object: 'a JSON object',
};

/** "/grants/0/agent" → "grants[0].agent". */
function field(pointer: string): string {
  let out = '';
  for (const part of pointer.split('/').slice(1)) {
    const key = part.replaceAll('~1', '/').replaceAll('~0', '~');
    out += /^\d+$/.test(key) ? `[${key}]` : out ? `.${key}` : key;
  }
  return out;
}

/** The detail of one ajv error on `part` (body, params, querystring, headers). */
export function schemaErrorDetail(e: Verbose, part: string): string {
  const at = field(e.instancePath);
  const under = (k: string) => (at ? `${at}.${k}` : k);
  if (e.keyword === 'required') return `${under(String(e.params.missingProperty))}: is required`;
  if (e.keyword === 'additionalProperties') {
    const unknown = under(String(e.params.additionalProperty));
    return part === 'querystring' ? `${unknown}: unknown query parameter` : `${unknown}: unknown field`;
  }
  const name = at || part;
  if (e.parentSchema?.['x-error']) return `${name}: ${e.parentSchema['x-error']}`;
  if (e.keyword === 'type') {
    const types = ([] as string[]).concat(e.params.type as string | string[]).filter((t) => t !== 'null');
    const items = (e.parentSchema as { items?: { type?: string } } | undefined)?.items?.type;
    const article = (t: string) => (t === 'array' && items ? `an array of ${items}s` : (ARTICLE[t] ?? t));
    return `${name}: must be ${types.map(article).join(' or ')}`;
  }
  return `${name}: ${e.message}`;
}

/** The fastify options of route validation: ajv as described above, its errors as the details above. */
export const VALIDATION = {
  ajv: {
    customOptions: { coerceTypes: false, useDefaults: false, removeAdditional: false, allErrors: false, verbose: true },
    onCreate: (ajv: { addKeyword(k: string): unknown }) => ajv.addKeyword('x-error'),
  },
  schemaErrorFormatter: (errors: ErrorObject[], part: string) => new Error(schemaErrorDetail(errors[0], part)),
} as unknown as Pick<FastifyServerOptions, 'ajv' | 'schemaErrorFormatter'>;
