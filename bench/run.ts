// npm run bench -- <name>: each benchmark prints one table (ours, a baseline and peers, in one run).
const BENCHES: Record<string, () => Promise<{ main: (args: string[]) => Promise<void> }>> = {
  pipeline: () => import('./pipeline.ts'),
  proxy: () => import('./proxy.ts'),
  wal: () => import('./wal.ts'),
  controlplane: () => import('./controlplane.ts'),
  'audit-query': () => import('./audit-query.ts'),
  broker: () => import('./broker.ts'),
  gateway: () => import('./gateway.ts'),
};

const [name, ...args] = process.argv.slice(2);
if (!name || !(name in BENCHES)) {
  process.stderr.write(`usage: npm run bench -- <${Object.keys(BENCHES).join('|')}> [options]\n`);
  process.exit(2);
}
await (await BENCHES[name]()).main(args);
