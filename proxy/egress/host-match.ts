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

/** The host as rules compare it: lower case, brackets and a trailing dot removed. */
export function canonicalHost(host: string): string {
  let h = host.toLowerCase();
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1);
  if (h.endsWith('.') && isIP(h) === 0) h = h.slice(0, -1);
  return h;
}

const compiled = new Map<string, RegExp>();

export function hostMatch(pattern: string, host: string): boolean {
  const p = canonicalHost(pattern);
  const h = canonicalHost(host);
  if (!p.includes('*')) return p === h;
  let re = compiled.get(p);
  if (!re) {
    re = new RegExp(
      `^${p
        .split('*')
        .map((part) => part.replace(/[.]/g, '\\.'))
        .join('.+')}$`,
    );
    if (compiled.size > 4096) compiled.clear();
    compiled.set(p, re);
  }
  return re.test(h);
}
