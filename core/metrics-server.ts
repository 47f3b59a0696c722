import https from 'node:https';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { parseAddr } from './addr.ts';
import type { Logger } from './logger.ts';
import { ServerLimiter, serverOptions, type ServerLimitOptions } from './server-limits.ts';

// The dedicated TLS Prometheus listener of a component (`--metrics-addr`): GET /metrics, nothing else,
// under the same connection bounds as the component's own listener.

export interface MetricsServer {
  port: number;
  close(): Promise<void>;
}

export async function startMetricsServer(o: {
  addr: string;
  cert: Buffer;
  key: Buffer;
  registry: Registry;
  limits: ServerLimitOptions;
  log: Logger;
}): Promise<MetricsServer> {
  const listen = parseAddr(o.addr);
  const server = https.createServer({ cert: o.cert, key: o.key, ...serverOptions(o.limits) }, (req, res) => {
    if (req.url !== '/metrics') {
      res.writeHead(404).end();
      return;
    }
    o.registry.metrics().then(
      (text) => {
        res.writeHead(200, { 'content-type': o.registry.contentType });
        res.end(text);
      },
      (err: Error) => res.writeHead(500).end(err.message),
    );
  });
  new ServerLimiter(o.limits, {
    listener: 'metrics',
    registry: o.registry,
    log: o.log,
    answer: (status) => ({ contentType: 'text/plain; charset=utf-8', body: `${status}\n` }),
  }).attach(server);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(listen.port, listen.host, () => resolve());
  });
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
