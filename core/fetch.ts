import { Agent, fetch as undiciFetch } from 'undici';

/** WHATWG fetch through undici, trusting an extra CA bundle when given (an issuer's private CA). */
export function fetchTrusting(ca?: Buffer): typeof fetch {
  const dispatcher = ca ? new Agent({ connect: { ca } }) : undefined;
  return ((url: string, init?: RequestInit) =>
    undiciFetch(url, {
      ...(init as object),
      ...(dispatcher ? { dispatcher } : {}),
    } as never)) as unknown as typeof fetch;
}
