import type { FastifyRequest, RouteOptions } from 'fastify';
import type { Queryable } from '../../core/sql.ts';
import type { Capability } from './capabilities.ts';
import { requireCapability, type Target } from './guard.ts';

// Declaring a route's capability is what enforces it (spec: Authentication, rules 3–4). A route under
// /api/v1 declares in its config:
//
//   requiredCapability  the capability (null: a valid token is enough); the OpenAPI document's
//                       `x-required-capability`
//   capabilityTarget    whose scope it is checked over, resolved from the request line (never the body)
//   authorize           or: the route's own conditional check (a self read, a body group that narrows);
//                       also on a route open to any token that still checks who calls it (self-service)
//   authorizedInHandler or: why the handler authorizes (the audit scope is the query's predicate)
//
// One preValidation hook runs the check after authentication and before the body is validated, so a
// caller without the capability is refused (403) before it learns anything of the body's shape.

/** Resolves a route's capability target; `label` names it in the OpenAPI document (`x-capability-target`). */
export interface TargetResolver {
  (req: FastifyRequest): Target | Promise<Target>;
  readonly label: string;
}

export function targetResolver(
  label: string,
  resolve: (req: FastifyRequest) => Target | Promise<Target>,
): TargetResolver {
  return Object.assign(resolve, { label });
}

declare module 'fastify' {
  interface FastifyContextConfig {
    requiredCapability?: Capability | null;
    capabilityTarget?: TargetResolver;
    authorize?: (req: FastifyRequest) => Promise<void>;
    authorizedInHandler?: string;
    /** With `authorize` or `authorizedInHandler`: whose scope that check is over, for the document. */
    targetLabel?: string;
    /** The agent-operator kind's one surface (its own audit trail). */
    agentOperator?: boolean;
    /** An SSE route (text/event-stream). */
    stream?: boolean;
  }
}

/** onRoute: a gated route under /api/v1 must say how its capability is checked (a registration error otherwise). */
export function checkDeclaration(route: RouteOptions): void {
  if (!route.url.startsWith('/api/v1/')) return;
  const config = route.config ?? {};
  if (config.requiredCapability === undefined) fail('declares no requiredCapability');
  if (config.requiredCapability === null)
    return void (config.capabilityTarget && fail('a route open to any token has no capabilityTarget'));
  const ways = [config.capabilityTarget, config.authorize, config.authorizedInHandler].filter(
    (w) => w !== undefined,
  ).length;
  if (ways !== 1) fail('declare exactly one of capabilityTarget, authorize, authorizedInHandler');

  function fail(why: string): never {
    throw new Error(`${String(route.method)} ${route.url}: ${why}`);
  }
}

const checked = new WeakMap<FastifyRequest, Target>();

/**
 * The target the hook checked this request's capability over. A handler that loads the resource again
 * compares it with this: between the check and the load the resource may have been deleted and made
 * anew under another owner, and what was authorized is the old one.
 */
export function checkedTarget(req: FastifyRequest): Target | undefined {
  return checked.get(req);
}

/** preValidation: the declared capability over the declared target, or the route's own check. */
export function enforceCapability(db: Queryable) {
  return async (req: FastifyRequest): Promise<void> => {
    const config = req.routeOptions.config;
    if (config.authorize) return config.authorize(req);
    if (config.requiredCapability && config.capabilityTarget) {
      const target = await config.capabilityTarget(req);
      await requireCapability(db, req, config.requiredCapability, target);
      checked.set(req, target);
    }
  };
}
