import { Agent } from 'undici';
import type { Logger } from '../../core/logger.ts';
import type { AgentIdentity } from '../llm/auth.ts';
import { GATEWAY_IDENTITY_HEADER, GatewayIdentitySigner, readSigningKey } from '../llm/gateway-identity.ts';
import { readCaBundle, trusting } from './ca-bundle.ts';
import type { LlmproxyRoute, RoutedUpstream } from './context.ts';
import { GatewayOptionsError, GatewayRuleError } from './errors.ts';
import { hostMatch, isValidHostPattern } from './host-match.ts';
import type { GatewayOptions } from './options.ts';

// --llm-host requests go to llmproxy (docs/gateway.md, "Identity toward llmproxy"): the request is sent
// to --llmproxy-addr as it came (path, query, body, the agent's own provider key), with one header
// added: the gateway's signed word for the agent and this request (../llm/gateway-identity.ts), so
// llmproxy governs it exactly as a call made to it directly. The header is signed per request (an
// ES256 signature is ~0.1 ms): it names the method and path, which a cached one could not.

export async function openLlmproxyRoute(options: GatewayOptions, log: Logger): Promise<LlmproxyRoute> {
  for (const pattern of options.llmHost)
    if (!isValidHostPattern(pattern)) throw new GatewayRuleError(`--llm-host "${pattern}" is not a host name or glob`);
  const hosts = [...options.llmHost];
  const url = new URL(options.llmproxyAddr);
  // The path the agent asked for is the path llmproxy gets, and the one the header names: a base path
  // on --llmproxy-addr would make them differ.
  if ((url.pathname !== '/' && url.pathname !== '') || url.search || url.hash || url.username || url.password)
    throw new GatewayOptionsError('--llmproxy-addr is an origin (https://host:port), without a path');
  const origin = url.origin;
  const signer = new GatewayIdentitySigner(
    await readSigningKey(options.gatewayKey, '--gateway-key', (message, cause) => {
      throw new GatewayOptionsError(message, { cause });
    }),
  );
  const ca = await readCaBundle(options.upstreamCa, '--upstream-ca');
  const dispatcher = new Agent({
    keepAliveTimeout: 30_000,
    pipelining: 1,
    connect: { timeout: options.connectTimeout, ...trusting(ca) },
    headersTimeout: options.upstreamTimeout,
    // A model may think for long between two events of a stream; llmproxy bounds its upstream's silence.
    bodyTimeout: options.upstreamTimeout,
  });
  let closing: Promise<void> | null = null;
  log.info({ llmproxy: origin, llm_hosts: hosts }, 'LLM hosts routed to llmproxy');
  return {
    matches: (host) => hosts.some((pattern) => hostMatch(pattern, host)),
    async route(identity: AgentIdentity, method: string, path: string): Promise<RoutedUpstream> {
      return {
        origin,
        dispatcher,
        headers: { [GATEWAY_IDENTITY_HEADER]: await signer.sign(identity, method, path) },
      };
    },
    close: () => (closing ??= dispatcher.close()),
  };
}
