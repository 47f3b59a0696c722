import type { FastifyReply } from 'fastify';

// RFC 9457 problem details. Every operator-facing error is one of these (spec: operator-api "Errors"),
// from one catalogue shared by the control plane and the broker: one stable `type` URI per error
// (docs/api.md), thrown as an ApiError (core/errors.ts) and answered by core/problems-plugin.ts.
export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

export interface Problem {
  type: string;
  title: string;
  status: number;
  detail?: string;
  instance?: string;
  [extension: string]: unknown;
}

export interface ProblemInit {
  type: string;
  title: string;
  status: number;
  detail?: string;
  instance?: string;
  extensions?: Record<string, unknown>;
}

export function problem(init: ProblemInit): Problem {
  const body: Problem = { type: init.type, title: init.title, status: init.status };
  if (init.detail !== undefined) body.detail = init.detail;
  if (init.instance !== undefined) body.instance = init.instance;
  if (init.extensions) {
    for (const [k, v] of Object.entries(init.extensions)) {
      if (!(k in body)) body[k] = v;
    }
  }
  return body;
}

export const PROBLEM_BASE = 'https://dvx.dev/problems/';

export interface CatalogueEntry {
  type: string;
  title: string;
  status: number;
}

function entry(slug: string, title: string, status: number): CatalogueEntry {
  return { type: PROBLEM_BASE + slug, title, status };
}

export const PROBLEMS = {
  badRequest: entry('bad-request', 'The request is malformed', 400),
  unauthenticated: entry('unauthenticated', 'A valid bearer token is required', 401),
  forbidden: entry('forbidden', 'The caller lacks the required capability', 403),
  notFound: entry('not-found', 'No such resource', 404),
  conflict: entry('conflict', 'The resource is in a conflicting state', 409),
  idpUnavailable: entry('idp-unavailable', 'The identity provider refused or did not answer', 502),
  notImplemented: entry('not-implemented', 'The operator API is not yet implemented', 501),
  auditUnavailable: entry(
    'audit-unavailable',
    'The change was refused: its audit record could not be made durable',
    503,
  ),
  internal: entry('internal', 'Internal error', 500),
  requestTimeout: entry('request-timeout', 'The request did not arrive in time', 408),
  payloadTooLarge: entry('payload-too-large', 'The request body is too large', 413),
  unsupportedMediaType: entry('unsupported-media-type', 'The request body is not of a supported media type', 415),
  uriTooLong: entry('uri-too-long', 'The request URI or a path segment is too long', 414),
  headersTooLarge: entry('headers-too-large', 'The request header fields are too large', 431),
  controlPlaneUnavailable: entry('controlplane-unavailable', 'The control plane refused or did not answer', 502),
  controlPlaneNotConfigured: entry('no-controlplane', 'This enclave runs without a control plane', 503),
  tooManyRequests: entry('too-many-requests', 'A limit on requests of this kind was reached', 429),
  busy: entry('busy', 'The service is busy: retry shortly', 503),
} as const satisfies Record<string, CatalogueEntry>;

export function problemOf(e: CatalogueEntry, detail: string | undefined, instance?: string): Problem {
  return problem({ type: e.type, title: e.title, status: e.status, detail, instance });
}

export function sendProblem(
  reply: FastifyReply,
  e: CatalogueEntry,
  detail: string | undefined,
  instance: string,
): FastifyReply {
  if (e.status === 401) reply.header('www-authenticate', 'Bearer');
  return reply
    .code(e.status)
    .type(PROBLEM_CONTENT_TYPE)
    .send(problemOf(e, detail, instance));
}

/** The catalogue entry of a status fastify or node gave a request refused before any route ran. */
export function entryForStatus(status: number): CatalogueEntry {
  switch (status) {
    case 408:
      return PROBLEMS.requestTimeout;
    case 413:
      return PROBLEMS.payloadTooLarge;
    case 414:
      return PROBLEMS.uriTooLong;
    case 415:
      return PROBLEMS.unsupportedMediaType;
    case 431:
      return PROBLEMS.headersTooLarge;
    case 404:
      return PROBLEMS.notFound;
    case 429:
      return PROBLEMS.tooManyRequests;
    default:
      return status >= 400 && status < 500 ? PROBLEMS.badRequest : PROBLEMS.internal;
  }
}
