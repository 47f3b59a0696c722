// The image's HEALTHCHECK: GET /healthz of the component in this container, exit 0 on a 200, 1 otherwise.
// DVX_HEALTHCHECK_SOCKET (imds: its unix socket, plain HTTP) or DVX_HEALTHCHECK_URL (an https URL: the
// component's listener, e.g. https://127.0.0.1:8460/healthz for the gateway); neither set: the control
// plane's default listener. The certificate is not verified, as a kubelet's HTTPS probe does not verify
// it: the probe proves the listener answers, on loopback, and needs no CA in the container.
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';

const socketPath = process.env.DVX_HEALTHCHECK_SOCKET;
const url = new URL(process.env.DVX_HEALTHCHECK_URL || 'https://127.0.0.1:8443/healthz');
const timeout = 4000;

function done(ok, why) {
  if (!ok) process.stderr.write(`healthcheck: ${why}\n`);
  process.exit(ok ? 0 : 1);
}

const req = socketPath
  ? httpRequest({ socketPath, path: '/healthz', method: 'GET', timeout })
  : url.protocol === 'https:'
    ? httpsRequest(url, { method: 'GET', rejectUnauthorized: false, timeout })
    : done(false, `DVX_HEALTHCHECK_URL must be https (every listener is TLS): ${url.href}`);
req.on('response', (res) => {
  res.resume();
  done(res.statusCode === 200, `status ${res.statusCode}`);
});
req.on('timeout', () => req.destroy(new Error(`no answer within ${timeout} ms`)));
req.on('error', (err) => done(false, err.message));
req.end();
