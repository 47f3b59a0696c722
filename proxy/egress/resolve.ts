import { promises as dns } from 'node:dns';
import { isIP } from 'node:net';
import type { DestinationGates, PinnedTarget, Target } from './context.ts';
import { decideResolved, decideRouted, refuseByName } from './destination.ts';
import { ANSWERS, destinationRefused, GatewayRefusal } from './errors.ts';

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

const TIMED_OUT = Symbol('resolution timed out');

/**
 * The destination pinned to its checked address; throws a GatewayRefusal: 403 destination_denied with
 * the reason, 502 when the name does not resolve, 504 when resolution takes longer than `timeoutMs`.
 */
export async function admitDestination(
  gates: DestinationGates,
  target: Target,
  lookup: Lookup,
  timeoutMs: number,
): Promise<PinnedTarget> {
  const byName = refuseByName(gates, target);
  if (byName !== null) throw new GatewayRefusal(destinationRefused(byName), byName);
  let addresses: { address: string; family: 4 | 6 }[];
  if (isIP(target.host) !== 0) addresses = [{ address: target.host, family: isIP(target.host) as 4 | 6 }];
  else {
    let timer: NodeJS.Timeout | undefined;
    try {
      addresses = await Promise.race([
        lookup(target.host),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(TIMED_OUT), timeoutMs);
        }),
      ]);
    } catch (err) {
      if (err === TIMED_OUT)
        throw new GatewayRefusal(ANSWERS.upstreamTimeout, `resolving ${target.host} took longer than ${timeoutMs} ms`);
      const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
      throw new GatewayRefusal(ANSWERS.upstreamFailed, `cannot resolve ${target.host}: ${code}`);
    } finally {
      clearTimeout(timer);
    }
  }
  const verdict = decideResolved(gates, target, addresses);
  if (!verdict.allowed) throw new GatewayRefusal(destinationRefused(verdict.reason), verdict.reason);
  return { ...target, address: verdict.address!, family: verdict.family! };
}

/** A routed host (--llm-host, --cp-api-host): checked by name only, never resolved; its address stays empty. */
export function admitRouted(gates: DestinationGates, target: Target): PinnedTarget {
  const verdict = decideRouted(gates, target);
  if (!verdict.allowed) throw new GatewayRefusal(destinationRefused(verdict.reason), verdict.reason);
  return { ...target, address: '', family: 4 };
}
