import type { GatewayDeps, Interceptor } from './context.ts';

// PLACEHOLDER (replaced by the interception work): terminates a tunnel's TLS.
export async function openInterceptor(_deps: GatewayDeps): Promise<Interceptor> {
  return {
    wants: () => false,
    serve: (client) => client.destroy(),
    close: async () => {},
  };
}
