import type { FastifyInstance } from 'fastify';
import type { Logger } from './logger.ts';
import { ApiError } from './errors.ts';
import { refuseNul } from './nul-guard.ts';
import { entryForStatus, PROBLEMS, sendProblem } from './problem.ts';
import { shared } from './fastify-shared.ts';

// Every error a request meets is answered as a problem document of the catalogue (problem.ts), and a
// body or query with a NUL byte is refused before validation (nul-guard.ts). Shared: it applies to the
// whole server it is registered on (the control plane, either listener of the broker).
export const problems = shared(
  'problems',
  async (app: FastifyInstance, { log, component }: { log: Logger; component: string }) => {
    app.setErrorHandler((err: Error & { validation?: unknown; statusCode?: number; code?: string }, req, reply) => {
      if (err instanceof ApiError) return sendProblem(reply, err.entry, err.detail, req.url);
      if (err.validation) return sendProblem(reply, PROBLEMS.badRequest, err.message, req.url);
      if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE')
        return sendProblem(
          reply,
          PROBLEMS.payloadTooLarge,
          `request body exceeds ${app.initialConfig.bodyLimit} bytes`,
          req.url,
        );
      // fastify's own refusals of a request (content type, content length, JSON syntax) keep their status.
      if (err.code?.startsWith('FST_') && err.statusCode && err.statusCode >= 400 && err.statusCode < 500)
        return sendProblem(reply, entryForStatus(err.statusCode), err.message, req.url);
      if (err.statusCode === 400) return sendProblem(reply, PROBLEMS.badRequest, err.message, req.url);
      log.error({ err, request_id: req.id, url: req.url }, `${component} request failed`);
      return sendProblem(reply, PROBLEMS.internal, undefined, req.url);
    });
    app.addHook('preValidation', refuseNul);
  },
);
