import type { Logger } from '../../core/logger.ts';
import type { LlmproxyRoute } from './context.ts';
import type { GatewayOptions } from './options.ts';

// PLACEHOLDER (replaced by the identity-header work): --llm-host requests go to llmproxy.
export async function openLlmproxyRoute(_options: GatewayOptions, _log: Logger): Promise<LlmproxyRoute> {
  return {
    matches: () => false,
    route: () => Promise.reject(new Error('not built')),
    close: async () => {},
  };
}
