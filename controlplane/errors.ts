import type { FastifyReply } from 'fastify';
import { coded } from '../core/errors.ts';
import { PROBLEM_CONTENT_TYPE, problem, type Problem } from '../core/problem.ts';

// The control plane's error catalogue (CONTRIBUTING.md, "Errors"), in two parts: the operator API's problems, one
// stable `type` URI per error (documented in docs/api.md), every answer an RFC 9457 problem document;
// and the package's error classes, each a DvxError with a stable code (docs/errors.md, "controlplane").

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
} as const satisfies Record<string, CatalogueEntry>;

/** A request the operator API refuses: answered as the problem document of its catalogue entry. */
export class ApiError extends coded('DVX_CONTROLPLANE_PROBLEM') {
  readonly entry: CatalogueEntry;
  readonly detail: string | undefined;
  constructor(e: CatalogueEntry, detail?: string, options?: ErrorOptions) {
    super(detail ?? e.title, options);
    this.entry = e;
    this.detail = detail;
  }
}

/** A bearer token the control plane does not accept (bad signature, issuer, audience, org; a disabled account). */
export class AuthenticationError extends coded('DVX_CONTROLPLANE_UNAUTHENTICATED') {}

/** A control-plane option (flag or DVX_* variable) that is missing, malformed or inconsistent. */
export class ControlPlaneOptionsError extends coded('DVX_CONTROLPLANE_OPTIONS_INVALID') {}

/** The KMS refused: unavailable provider, unreadable master key, a wrapped key it cannot unwrap. */
export class KmsError extends coded('DVX_KMS_REFUSED') {}

/** A sealed value of an org whose data key was destroyed by erasure: it can never be opened again. */
export class OrgKeyShredded extends coded('DVX_ORG_KEY_SHREDDED') {}

/** The IdP refused or did not answer a provisioning call (discovery, token, client registration). */
export class IdpError extends coded('DVX_IDP_REFUSED') {}

/** A --idp-key service-account key file that is not a valid key. */
export class KeyFileError extends coded('DVX_IDP_KEY_FILE_INVALID') {}

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
    default:
      return status >= 400 && status < 500 ? PROBLEMS.badRequest : PROBLEMS.internal;
  }
}
