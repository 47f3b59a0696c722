// Building blocks of the routes' JSON schemas (validated by fastify, serialized by fast-json-stringify,
// published in the OpenAPI document). A response schema lists every field of its view: a field it
// misses would be dropped from the answer; open-ended values (policy and config values) are `{}`.

export type Schema = Record<string, unknown>;

export const STRING: Schema = { type: 'string' };
export const NULLABLE_STRING: Schema = { type: ['string', 'null'] };
export const BOOLEAN: Schema = { type: 'boolean' };
export const INTEGER: Schema = { type: 'integer' };
export const STRINGS: Schema = { type: 'array', items: STRING };
/** Any JSON value. */
export const ANY: Schema = {};

/** A string a request requires: a string (list it as required), not blank. */
export const TEXT: Schema = { type: 'string', allOf: [{ pattern: '\\S', 'x-error': 'must not be empty' }] };
/** Strings, each non-empty; null is absent. */
export const NON_EMPTY_STRINGS: Schema = {
  type: ['array', 'null'],
  items: { type: 'string', minLength: 1, 'x-error': 'must be a non-empty string' },
};
/** A boolean; null is absent. */
export const NULLABLE_BOOLEAN: Schema = { type: ['boolean', 'null'] };

/** A closed object (unknown fields refused), titled with its spec name when it has one. */
export function object(properties: Record<string, Schema>, required: readonly string[] = [], title?: string): Schema {
  return {
    type: 'object',
    ...(title ? { title } : {}),
    properties,
    ...(required.length ? { required } : {}),
    additionalProperties: false,
  };
}

/** A view: every field listed; `open` fields beyond them are kept (an open-ended view). */
export function viewSchema(title: string, properties: Record<string, Schema>, open = false): Schema {
  return { type: 'object', title, properties, additionalProperties: open };
}

export const arrayOf = (items: Schema): Schema => ({ type: 'array', items });

/** Path parameters, every one a string. */
export function pathParams(...names: string[]): Schema {
  return object(Object.fromEntries(names.map((n) => [n, STRING])), names);
}

/** Query parameters the handler reads (all optional); `closed` refuses any other. */
export function query(names: readonly string[], closed: boolean, each: Schema = STRING): Schema {
  return { type: 'object', properties: Object.fromEntries(names.map((n) => [n, each])), additionalProperties: !closed };
}

/** The responses of a route that answers 204. */
export const NO_CONTENT = { 204: { type: 'null' } } as const;

/** A body the route also accepts absent: validated when one is sent as JSON. */
export function optionalBody(schema: Schema): Schema {
  return { content: { 'application/json': { schema } } };
}
