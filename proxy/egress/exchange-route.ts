import { newId } from '../../core/ids.ts';
import type { Dispatcher } from 'undici';
import type { AgentIdentity } from '../llm/auth.ts';
import type { Flow, GatewayDeps, PinnedTarget } from './context.ts';
import { ANSWERS, GatewayRefusal, MissingCredentialError, OperatorTokenError } from './errors.ts';
import { credentialUnavailable, operatorTokenRefused } from './exchange-answers.ts';
import { injectionsFor, rulesFor } from './inject-cred.ts';
import type { PinnedPools } from './pinned-pools.ts';
import { lookupRefusal } from './resolve.ts';

// Where one exchange goes and what the gateway adds to it (docs/gateway.md, "Interception and
// capture", "Credential injection"):
//
//   --llm-host        llmproxy (--llmproxy-addr), with the identity headers the route signs
//   --cp-api-host     the control plane, resolved here (it is never a policy destination), with
//                     `Authorization: Bearer <agent-operator token>` minted through the broker
//   anything else     the destination at the address its policy check admitted (pinned-pools.ts)
//
// and, on any of them, the --inject-cred rules of the host: each sets its header (the agent's own of
// that name is replaced). An injected credential and an operator token are authority-gated effects:
// each comes with an `audit_events` record that must be durable before the request leaves
// (exchange.ts sends through audit-wal/gate.ts gated()).

export type RouteKind = 'llmproxy' | 'control-plane' | 'destination';

export interface Route {
  kind: RouteKind;
  origin: string;
  dispatcher: Dispatcher;
  /** Headers the gateway sets (lower-case names), replacing the agent's of the same name. */
  headers: Map<string, string>;
  /** `audit_events` records of the authority-gated effects (credentials, tokens) this request carries. */
  records: Record<string, unknown>[];
  /** Credential values the gateway added: never recorded (capture.ts redacts them). */
  secretValues: string[];
  /** The headers carrying a credential the gateway added (an injected secret, an operator token). */
  credentialHeaders: string[];
}

/** An `audit_events` record of an effect the gateway applies on the agent's behalf. */
function effectRecord(
  deps: GatewayDeps,
  flow: Flow,
  identity: AgentIdentity,
  action: string,
  attrs: Record<string, string>,
): Record<string, unknown> {
  return {
    id: newId(),
    event_time: new Date().toISOString(),
    kind: 'event',
    action,
    actor: `agent:${identity.agentId}`,
    actor_kind: 'agent',
    agent_id: identity.agentId,
    agent_name: identity.agentName,
    org_id: identity.orgId,
    group_id: identity.groupId ?? '',
    enclave_id: deps.options.enclaveId,
    enclave_name: deps.options.enclaveName,
    outcome: 'allow',
    resource: flow.dst,
    scope: `org:${identity.orgId}`,
    source: 'gateway',
    // The request's network_flow record has the same id: one finds the other.
    trace_id: flow.id,
    attrs: { ...attrs, flow_id: flow.id },
  };
}

/** Whether an origin-form target (path and query) is the control plane's operator API, `/api/v1[/…]`. */
export function operatorApiPath(path: string): boolean {
  return /^\/api\/v1(?:[/?]|$)/.test(path);
}

/** Whether `host:port` is served by a route of its own (llmproxy or the control plane), never as a destination. */
export function routedKind(deps: GatewayDeps, host: string, port: number): RouteKind {
  if (deps.llmproxy?.matches(host)) return 'llmproxy';
  if (deps.operatorTokens?.matches(host, port)) return 'control-plane';
  return 'destination';
}

export async function routeOf(
  deps: GatewayDeps,
  pools: PinnedPools,
  target: PinnedTarget,
  scheme: 'http' | 'https',
  identity: AgentIdentity,
  method: string,
  path: string,
  flow: Flow,
): Promise<Route> {
  const kind = routedKind(deps, target.host, target.port);
  const headers = new Map<string, string>();
  const records: Record<string, unknown>[] = [];
  const secretValues: string[] = [];
  const credentialHeaders: string[] = [];
  let upstream: { origin: string; dispatcher: Dispatcher };
  if (kind === 'llmproxy') {
    let routed;
    try {
      routed = await deps.llmproxy!.route(identity, method, path);
    } catch (err) {
      deps.log.error({ err, flow_id: flow.id }, 'llmproxy route failed');
      throw new GatewayRefusal(ANSWERS.upstreamFailed, `llmproxy route failed: ${(err as Error).message}`);
    }
    upstream = routed;
    for (const [name, value] of Object.entries(routed.headers)) {
      headers.set(name.toLowerCase(), value);
      secretValues.push(value);
    }
  } else if (kind === 'control-plane') {
    // The token reaches one surface, the operator API (spec: operator-api, "Agent operators": an
    // agent-operator reads its own audit trail there): the control plane's other paths never get it
    // (its /oauth/token facade, for one, relays the request's Authorization to the identity provider
    // and that provider's answer back to the caller).
    if (operatorApiPath(path)) {
      let token: string;
      try {
        token = await deps.operatorTokens!.token(identity);
      } catch (err) {
        if (err instanceof OperatorTokenError && err.status === 403)
          throw new GatewayRefusal(operatorTokenRefused(err.message), `agent-operator token refused: ${err.message}`);
        deps.log.error({ err, flow_id: flow.id }, 'agent-operator token not minted');
        throw new GatewayRefusal(ANSWERS.upstreamFailed, `agent-operator token not minted: ${(err as Error).message}`);
      }
      headers.set('authorization', `Bearer ${token}`);
      secretValues.push(token);
      credentialHeaders.push('authorization');
      records.push(
        effectRecord(deps, flow, identity, 'agent-operator-token.present', {
          host: target.host,
          header: 'authorization',
        }),
      );
    }
    // The forwarding door leaves a routed host unresolved; resolved here, once, for this request.
    let addresses: { address: string; family: 4 | 6 }[] = [];
    if (target.address !== '') addresses = [{ address: target.address, family: target.family }];
    else
      try {
        addresses = await deps.lookup(target.host, {
          agent: identity.agentId,
          timeoutMs: deps.options.connectTimeout,
        });
      } catch (err) {
        throw lookupRefusal(target.host, deps.options.connectTimeout, err);
      }
    if (addresses.length === 0) throw new GatewayRefusal(ANSWERS.upstreamFailed, `cannot resolve ${target.host}`);
    const { address, family } = addresses[0];
    flow.dstIp = address;
    upstream = pools.get('https', target.host, target.port, address, family);
  } else {
    upstream = pools.get(scheme, target.host, target.port, target.address, target.family);
  }

  // A credential never crosses the network in clear because an agent asked for http://: a rule without
  // a port applies to TLS only; one naming the port is the operator's word that plain http is meant.
  if (kind === 'destination' && scheme === 'http') {
    const bare = rulesFor(deps.injectRules, target.host, target.port).find((r) => r.port === null);
    if (bare !== undefined)
      throw new GatewayRefusal(
        credentialUnavailable(
          `credential rule for ${bare.host} (secret "${bare.secret}") is sent over https only; ` +
            `a rule naming port=${target.port} allows plain http`,
        ),
        'credential refused over plain http',
      );
  }
  let injections;
  try {
    injections = injectionsFor(deps.injectRules, deps.secrets, identity, target.host, target.port);
  } catch (err) {
    if (err instanceof MissingCredentialError)
      throw new GatewayRefusal(credentialUnavailable(err.message), `credential unavailable: ${err.message}`);
    throw err;
  }
  for (const inj of injections) {
    headers.set(inj.header, inj.value);
    if (!credentialHeaders.includes(inj.header)) credentialHeaders.push(inj.header);
    // The value as it goes on the wire, and the secret inside it (the rule's format around it).
    const [before, after] = inj.rule.format.split('{}');
    secretValues.push(inj.value, inj.value.slice(before.length, inj.value.length - after.length));
    records.push(
      effectRecord(deps, flow, identity, 'credential.inject', {
        secret: inj.rule.secret,
        header: inj.header,
        host: target.host,
      }),
    );
  }
  return {
    kind,
    origin: upstream.origin,
    dispatcher: upstream.dispatcher,
    headers,
    records,
    secretValues,
    credentialHeaders,
  };
}
