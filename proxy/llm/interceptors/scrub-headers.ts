import type { Dispatcher } from 'undici';

// An undici interceptor (composed on the upstream dispatcher, upstream.ts) that keeps hop-by-hop
// headers (RFC 9110 §7.6.1) and what the connection sets itself (host, expect) from travelling on,
// whatever the caller put in a request. The body's length is the caller's to set: it knows the body.
// The agent's Accept-Encoding stays behind too, replaced by `identity`: answers must reach us
// readable, to be inspected, metered and translated (a provider gzips JSON when asked, and every
// fetch-based SDK asks). Any proxy of ours that forwards a caller's headers composes it.

const DROP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'proxy-authorization',
  'proxy-authenticate',
  'host',
  'expect',
  'accept-encoding',
]);

export function scrubHeaders(): Dispatcher.DispatcherComposeInterceptor {
  return (dispatch) => (opts, handler) => {
    const headers = opts.headers;
    // Only a plain header object is ours to scrub (the proxies pass one).
    if (headers === null || typeof headers !== 'object' || Array.isArray(headers) || Symbol.iterator in headers) {
      return dispatch(opts, handler);
    }
    const out: Record<string, string | string[] | undefined> = {};
    for (const name in headers) {
      if (!DROP.has(name.toLowerCase())) out[name] = (headers as Record<string, string | string[] | undefined>)[name];
    }
    out['accept-encoding'] = 'identity';
    return dispatch({ ...opts, headers: out }, handler);
  };
}
