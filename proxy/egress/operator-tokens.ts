import type { Logger } from '../../core/logger.ts';
import type { OperatorTokenSource } from './context.ts';
import type { GatewayOptions } from './options.ts';

// PLACEHOLDER (replaced by the operator-token work): agent-operator tokens for --cp-api-host.
export async function openOperatorTokens(_options: GatewayOptions, _log: Logger): Promise<OperatorTokenSource> {
  return {
    matches: () => false,
    token: () => Promise.reject(new Error('not built')),
    close: async () => {},
  };
}
