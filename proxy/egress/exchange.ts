import type { ExchangeHandler, GatewayDeps } from './context.ts';
import { ANSWERS } from './errors.ts';

// PLACEHOLDER (replaced by the interception work): one HTTP request forwarded.
export function exchangeHandler(_deps: GatewayDeps): ExchangeHandler {
  return (req, res) => {
    req.resume();
    res.writeHead(ANSWERS.upstreamFailed.status, { 'content-type': ANSWERS.upstreamFailed.contentType });
    res.end(ANSWERS.upstreamFailed.body);
  };
}
