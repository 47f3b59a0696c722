// Listen addresses in the Go style the spec uses: ":8480" (every interface), "127.0.0.1:8480", "[::1]:0".
export interface ListenAddr {
  host: string | undefined;
  port: number;
}

export function parseAddr(addr: string): ListenAddr {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d{1,5})$/.exec(addr.trim());
  if (!m) throw new TypeError(`invalid address "${addr}" (expected host:port or :port)`);
  const port = Number(m[3]);
  if (port > 65535) throw new TypeError(`invalid port in "${addr}"`);
  const host = m[1] ?? m[2];
  return { host: host === '' ? undefined : host, port };
}
