import { Registry, Counter, Histogram, Gauge, collectDefaultMetrics } from 'prom-client';

// One registry per process. Components register their metrics against the registry they are given,
// so tests can create a fresh one and read exact values.
export function createRegistry(options: { defaultMetrics?: boolean } = {}): Registry {
  const registry = new Registry();
  if (options.defaultMetrics) collectDefaultMetrics({ register: registry, prefix: 'dvx_' });
  return registry;
}

/** Returns the metric already registered under `name`, or registers the one `make` builds. */
function reuse<T>(registry: Registry, name: string, make: () => T): T {
  const existing = registry.getSingleMetric(name);
  return (existing as T | undefined) ?? make();
}

export function counter<L extends string>(registry: Registry, name: string, help: string, labelNames: readonly L[] = []): Counter<L> {
  return reuse(registry, name, () => new Counter<L>({ name, help, labelNames, registers: [registry] }));
}

export function gauge<L extends string>(registry: Registry, name: string, help: string, labelNames: readonly L[] = []): Gauge<L> {
  return reuse(registry, name, () => new Gauge<L>({ name, help, labelNames, registers: [registry] }));
}

export function histogram<L extends string>(
  registry: Registry, name: string, help: string, labelNames: readonly L[] = [], buckets?: number[],
): Histogram<L> {
  return reuse(registry, name, () => new Histogram<L>({ name, help, labelNames, registers: [registry], ...(buckets ? { buckets } : {}) }));
}

export type { Registry };
