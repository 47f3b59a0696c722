import net from 'node:net';
import type tls from 'node:tls';
import http from 'node:http';
import https from 'node:https';
import { readFileSync, writeFileSync } from 'node:fs';

// The floor of the gateway benchmark: a bare forward proxy on node:net that does nothing but parse
// `CONNECT host:port` and pipe bytes, and forward absolute-form requests with node:http. No identity,
// no policy, no audit. With a certificate and key it listens over TLS (like the gateway), without them
// over plain TCP (like the Debian peers).
// Usage: node bench/floor-connect.ts <port-file> [<cert> <key>]
const [portFile, cert, key] = process.argv.slice(2);

const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
const onRequest = (req: http.IncomingMessage, res: http.ServerResponse) => {
  const url = new URL(req.url ?? '/');
  const headers = { ...req.headers };
  delete headers['proxy-authorization'];
  delete headers['proxy-connection'];
  const up = http.request(
    { host: url.hostname, port: url.port || 80, path: url.pathname + url.search, method: req.method, headers, agent },
    (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    },
  );
  up.on('error', () => res.writeHead(502).end());
  req.pipe(up);
};
const server = cert
  ? https.createServer({ cert: readFileSync(cert), key: readFileSync(key) }, onRequest)
  : http.createServer(onRequest);
server.keepAliveTimeout = 30_000;
server.on('connect', (req: http.IncomingMessage, client: net.Socket | tls.TLSSocket, head: Buffer) => {
  const [host, port] = (req.url ?? '').split(':');
  const upstream = net.connect(Number(port), host, () => {
    client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    if (head.length > 0) upstream.write(head);
    upstream.pipe(client);
    client.pipe(upstream);
  });
  upstream.on('error', () => client.destroy());
  client.on('error', () => upstream.destroy());
});
server.listen(0, '127.0.0.1', () => {
  writeFileSync(portFile, String((server.address() as net.AddressInfo).port));
});
process.on('SIGTERM', () => {
  server.close(() => process.exit(0));
  server.closeAllConnections();
});
