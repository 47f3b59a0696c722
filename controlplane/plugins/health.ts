import type { FastifyInstance } from 'fastify';
import pkg from '../../package.json' with { type: 'json' };

// GET /healthz: liveness, with the component, its version, and the enclave it runs beside when
// --enclave-id / --enclave-name say so (spec: Server components, "Common flags").
export function health(enclave: { enclave_id?: string; enclave_name?: string }) {
  return async (app: FastifyInstance) => {
    app.get('/healthz', async () => ({ component: 'controlplane', status: 'ok', version: pkg.version, ...enclave }));
  };
}
