import type { FastifyReply } from 'fastify';
import { PROBLEM_CONTENT_TYPE, problem, type Problem } from '../core/problem.ts';

// The operator API's error catalogue (STYLE.md rule 2): one stable `type` URI per error, documented in
// docs/api.md. Every error the API answers is one of these as an RFC 9457 problem document.

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
  auditUnavailable: entry('audit-unavailable', 'The change was refused: its audit record could not be made durable', 503),
  internal: entry('internal', 'Internal error', 500),
} as const satisfies Record<string, CatalogueEntry>;

export class ApiError extends Error {
  readonly entry: CatalogueEntry;
  readonly detail: string | undefined;
  constructor(e: CatalogueEntry, detail?: string) {
    super(detail ?? e.title);
    this.entry = e;
    this.detail = detail;
  }
}

export function problemOf(e: CatalogueEntry, detail: string | undefined, instance: string): Problem {
  return problem({ type: e.type, title: e.title, status: e.status, detail, instance });
}

export function sendProblem(reply: FastifyReply, e: CatalogueEntry, detail: string | undefined, instance: string): FastifyReply {
  if (e.status === 401) reply.header('www-authenticate', 'Bearer');
  return reply.code(e.status).type(PROBLEM_CONTENT_TYPE).send(problemOf(e, detail, instance));
}
