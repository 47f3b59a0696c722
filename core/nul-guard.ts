import type { FastifyRequest } from 'fastify';
import { ApiError } from './errors.ts';
import { PROBLEMS } from './problem.ts';

// PostgreSQL (and PGlite) refuse U+0000 in text and jsonb, so a NUL in a path parameter, a query
// filter or any string of a JSON body reached the store as a 500. It is refused for every operator
// and broker route before any handler runs, as a 400 naming the field. (The token facade is left out:
// its errors are OAuth bodies, and it stores nothing.)

const NUL = '\u0000';

/**
 * The path of the first string (or object key) holding a NUL, walked without recursion (a deep body cannot overflow the
 * stack).
 */
export function nulAt(root: unknown, rootPath: string): string | null {
  const stack: [unknown, string][] = [[root, rootPath]];
  while (stack.length > 0) {
    const [value, path] = stack.pop()!;
    if (typeof value === 'string') {
      if (value.includes(NUL)) return path;
    } else if (Array.isArray(value)) {
      for (let i = value.length - 1; i >= 0; i--) stack.push([value[i], `${path}[${i}]`]);
    } else if (value !== null && typeof value === 'object') {
      for (const [k, v] of Object.entries(value)) {
        const p = path ? `${path}.${k}` : k;
        if (k.includes(NUL)) return p.replaceAll(NUL, '\\u0000');
        stack.push([v, p]);
      }
    }
  }
  return null;
}

/** preValidation hook: 400 for a NUL in the path parameters, the query or the body. */
export async function refuseNul(req: FastifyRequest): Promise<void> {
  if (!req.url.startsWith('/api/') && !req.url.startsWith('/v1/')) return;
  const at = nulAt(req.params, '') ?? nulAt(req.query, '') ?? nulAt(req.body, '');
  if (at !== null)
    throw new ApiError(PROBLEMS.badRequest, `${at || 'body'}: must not contain a NUL character (U+0000)`);
}
