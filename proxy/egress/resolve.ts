import { promises as dns } from 'node:dns';
import { isIP } from 'node:net';
import type { DestinationGates, PinnedTarget, Target } from './context.ts';
import { decideResolved, decideRouted, refuseByName } from './destination.ts';
import { ANSWERS, destinationRefused, GatewayRefusal, LookupBusyError } from './errors.ts';
import { LOOKUP_TIMED_OUT, type BoundedLookup, type LookupRequest } from './lookup-limits.ts';

// A destination admitted and pinned (docs/gateway.md, "Destination policy"): the name is refused by its
// rules before it is looked up when it can be, resolved once (every address, in the resolver's order)
// under --connect-timeout, every address checked, and the connection told the one address that
// passed. Nothing resolves the name again, so an answer that changes between the check and the
// connect (DNS rebinding) changes nothing.

export type Lookup = (host: string) => Promise<{ address: string; family: 4 | 6 }[]>;

/** Every address of a name, as the system resolver gives them (getaddrinfo: /etc/hosts, then DNS). */
export const systemLookup: Lookup = async (host) =>
  (await dns.lookup(host, { all: true, verbatim: true })).map((a) => ({
    address: a.address,
    family: a.family === 6 ? 6 : 4,
  }));

/**
 * The destination pinned to its checked address; throws a GatewayRefusal: 403 destination_denied with
 * the reason, 502 when the name does not resolve, 504 when resolution (waiting for a lookup slot
 * included, lookup-limits.ts) takes longer than `request.timeoutMs`, 503 when too many lookups wait.
 */
export async function admitDestination(
  gates: DestinationGates,
  target: Target,
  lookup: BoundedLookup,
  request: LookupRequest,
): Promise<PinnedTarget> {
  const byName = refuseByName(gates, target);
  if (byName !== null) throw new GatewayRefusal(destinationRefused(byName), byName);
  let addresses: { address: string; family: 4 | 6 }[];
  if (isIP(target.host) !== 0) addresses = [{ address: target.host, family: isIP(target.host) as 4 | 6 }];
  else {
    try {
      addresses = await lookup(target.host, request);
    } catch (err) {
      throw lookupRefusal(target.host, request.timeoutMs, err);
    }
  }
  const verdict = decideResolved(gates, target, addresses);
  if (!verdict.allowed) throw new GatewayRefusal(destinationRefused(verdict.reason), verdict.reason);
  return { ...target, address: verdict.address!, family: verdict.family! };
}

/** Why a lookup gave no address, as the agent's answer: 504 past the deadline, 503 too many waiting, else 502. */
export function lookupRefusal(host: string, timeoutMs: number, err: unknown): GatewayRefusal {
  if (err === LOOKUP_TIMED_OUT)
    return new GatewayRefusal(ANSWERS.upstreamTimeout, `resolving ${host} took longer than ${timeoutMs} ms`);
  if (err instanceof LookupBusyError)
    return new GatewayRefusal(ANSWERS.lookupsBusy, `name lookups at capacity: ${err.message}`);
  const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
  return new GatewayRefusal(ANSWERS.upstreamFailed, `cannot resolve ${host}: ${code}`);
}

/** A routed host (--llm-host, --cp-api-host): checked by name only, never resolved; its address stays empty. */
export function admitRouted(gates: DestinationGates, target: Target): PinnedTarget {
  const verdict = decideRouted(gates, target);
  if (!verdict.allowed) throw new GatewayRefusal(destinationRefused(verdict.reason), verdict.reason);
  return { ...target, address: '', family: 4 };
}
