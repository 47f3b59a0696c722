import { isIP } from 'node:net';

// Host globs, the one matcher of the gateway's rules (destination rules' `host`, --inject-cred,
// --llm-host, --no-capture-host): case-insensitive; `*` matches any run of characters, dots included,
// so `*.example.com` matches `api.example.com` and `a.b.example.com` but not `example.com` itself; no
// other character is special. A trailing dot of a fully-qualified name is ignored on both sides. IP
// literals are matched as text (IPv6 without brackets).

const PATTERN = /^[a-z0-9*._:-]{1,253}$/;

export function isValidHostPattern(pattern: string): boolean {
  return PATTERN.test(pattern.toLowerCase()) && !pattern.includes('**');
}

/**
 * The host as rules compare it: lower case, brackets and a trailing dot removed, and an IP address in
 * one spelling (the URL parser's: `127.1`, `2130706433` and `0x7f.0.0.1` are `127.0.0.1`, as the system
 * resolver reads them too; `0:0::1` is `::1`), so a rule naming an address is not dodged by another
 * spelling of it.
 */
export function canonicalHost(host: string): string {
  let h = host.toLowerCase();
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1);
  if (h.endsWith('.') && isIP(h) === 0) h = h.slice(0, -1);
  const family = isIP(h);
  if (family === 6) return ipLiteral(`[${h}]`) ?? h;
  // A name whose last label is a number is an IPv4 address to the URL parser and to getaddrinfo alike.
  // Only a host of name characters is read as an address: the URL parser would find `1.2.3.4` in
  // `user@1.2.3.4` (userinfo), and a rule must never be matched by what follows an `@`.
  if (family === 0 && /^[a-z0-9.]+$/.test(h) && NUMERIC_LAST_LABEL.test(h)) return ipLiteral(h) ?? h;
  return h;
}

const NUMERIC_LAST_LABEL = /(?:^|\.)(?:0x[0-9a-f]*|\d+)$/;

function ipLiteral(host: string): string | null {
  let parsed: string;
  try {
    parsed = new URL(`http://${host}/`).hostname;
  } catch {
    return null; // not an address in any spelling (`1.2.3.4.5`): compared as written
  }
  if (parsed.startsWith('[')) parsed = parsed.slice(1, -1);
  return isIP(parsed) === 0 ? null : parsed;
}

const compiled = new Map<string, RegExp>();

// Every character but `*` is literal, whatever a caller passes (the parsers admit only [a-z0-9._:-], but a
// regex built from an unchecked pattern must not become one the caller did not mean).

export function hostMatch(pattern: string, host: string): boolean {
  const p = canonicalHost(pattern);
  const h = canonicalHost(host);
  if (!p.includes('*')) return p === h;
  let re = compiled.get(p);
  if (!re) {
    re = new RegExp(
      `^${p
        .split('*')
        .map((part) => part.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&'))
        .join('.+')}$`,
    );
    if (compiled.size > 4096) compiled.clear();
    compiled.set(p, re);
  }
  return re.test(h);
}
