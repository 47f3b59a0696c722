import https from 'node:https';
import { readFileSync } from 'node:fs';
import { Agent } from 'undici';

// The floor of the proxy benchmark: a bare TLS pass-through on node:https + undici, doing nothing but
// forward the request and stream the response back. Whatever dvx adds is measured against this.
// Usage: node bench/floor-proxy.ts <cert> <key> <upstream-url> <port-file>
const [cert, key, upstream, portFile] = process.argv.slice(2);
const dispatcher = new Agent({ keepAliveTimeout: 30_000, connections: 256 });
const origin = new URL(upstream).origin;
const server = https.createServer({ cert: readFileSync(cert), key: readFileSync(key) }, async (req, res) => {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  try {
    const headers = { ...req.headers };
    delete headers.host;
    delete headers.connection;
    delete headers['content-length'];
    const up = await dispatcher.request({
      origin,
      path: req.url ?? '/',
      method: req.method as 'POST',
      headers,
      body: Buffer.concat(chunks),
    });
    res.writeHead(up.statusCode, { 'content-type': String(up.headers['content-type'] ?? 'application/json') });
    for await (const c of up.body) res.write(c);
    res.end();
  } catch {
    res.writeHead(502).end();
  }
});
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address() as { port: number };
  import('node:fs').then((fs) => fs.writeFileSync(portFile, String(port)));
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
