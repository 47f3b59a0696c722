import type { IncomingMessage } from 'node:http';

// The headers of one hop (RFC 9110 §7.6.1) and the request shapes a proxy must not pass on
// (docs/gateway.md, "Interception and capture").
//
// To the destination: the agent's headers in the order sent, without the hop-by-hop ones (Connection
// and every header it names, Keep-Alive, Proxy-*, TE, Trailer, Upgrade, Transfer-Encoding), without
// Host and Content-Length (the dispatcher writes them for the origin and the body that leaves), without
// Expect (node answered the agent's 100-continue itself), and without any `x-dvx-*` header: those are
// the gateway's to set (llmproxy's identity header), never an agent's.
//
// To the agent: the destination's headers without the hop-by-hop ones, and without Alt-Svc, which
// would invite the agent to reach the host over another protocol (HTTP/3 over UDP) than the gateway's.

const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'proxy-connection',
  'http2-settings',
]);
const REQUEST_DROP = new Set([...HOP_BY_HOP, 'host', 'content-length', 'expect']);
const RESPONSE_DROP = new Set([...HOP_BY_HOP, 'alt-svc']);

/** Header names listed in Connection values (they are hop-by-hop too). */
function connectionTokens(values: Iterable<string>): Set<string> {
  const out = new Set<string>();
  for (const v of values)
    for (const token of v.split(',')) {
      const t = token.trim().toLowerCase();
      if (t !== '') out.add(t);
    }
  return out;
}

/** Why this request must not be forwarded (a smuggling shape), or null. */
export function smugglingProblem(req: IncomingMessage): string | null {
  const raw = req.rawHeaders;
  let hosts = 0;
  let lengths = 0;
  let encodings = 0;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i].toLowerCase();
    if (/[\r\n\0]/.test(raw[i + 1])) return `header ${name} holds a line break or NUL`;
    if (name === 'host') hosts++;
    else if (name === 'content-length') lengths++;
    else if (name === 'transfer-encoding') encodings++;
  }
  if (hosts > 1) return 'more than one Host header';
  if (lengths > 1) return 'more than one Content-Length header';
  if (lengths > 0 && encodings > 0) return 'Transfer-Encoding together with Content-Length';
  return null;
}

/**
 * The agent's request headers for the destination as a flat [name, value, …] list; `replaced` names
 * (lower case) are left out, to be set by the gateway.
 */
export function upstreamRequestHeaders(rawHeaders: readonly string[], replaced: ReadonlySet<string>): string[] {
  const listed: string[] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2)
    if (rawHeaders[i].toLowerCase() === 'connection') listed.push(rawHeaders[i + 1]);
  const tokens = connectionTokens(listed);
  const out: string[] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = rawHeaders[i].toLowerCase();
    if (REQUEST_DROP.has(name) || tokens.has(name) || replaced.has(name)) continue;
    if (name.startsWith('proxy-') || name.startsWith('x-dvx-')) continue;
    out.push(rawHeaders[i], rawHeaders[i + 1]);
  }
  return out;
}

/** The destination's response headers for the agent as a flat [name, value, …] list. */
export function agentResponseHeaders(headers: Record<string, string | string[] | undefined>): string[] {
  const connection = headers.connection;
  const tokens = connectionTokens(
    connection === undefined ? [] : Array.isArray(connection) ? connection : [connection],
  );
  const out: string[] = [];
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || RESPONSE_DROP.has(name) || tokens.has(name) || name.startsWith('proxy-')) continue;
    if (Array.isArray(value)) for (const v of value) out.push(name, v);
    else out.push(name, value);
  }
  return out;
}
