// RFC 9457 problem details. Every operator-facing error is one of these (spec: operator-api "Errors").
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
