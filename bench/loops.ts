import { performance } from 'node:perf_hooks';
import { p50p99 } from './stats.ts';

// Closed-loop drivers (the next call leaves when the last has answered): the shape of the controlplane,
// broker and gateway benches. The proxy bench's open loop (requests on a schedule) is its own.

/** `warm` calls, then `n` sequential calls timed one by one. */
export async function sequential(n: number, once: () => Promise<void>, warm = Math.min(50, n)) {
  for (let i = 0; i < warm; i++) await once();
  const xs: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await once();
    xs.push(performance.now() - t0);
  }
  return p50p99(xs);
}

export interface LatencyAndRate {
  p50: number;
  p99: number;
  /** calls per second with `inFlight` loops running at once */
  rps: number;
}

/**
 * `warm` calls; then half of `seconds` sequential (latency p50/p99), then the other half with
 * `inFlight` loops at once (req/s).
 */
export async function latencyThenRate(
  once: () => Promise<void>,
  seconds: number,
  options: { warm?: number; inFlight?: number } = {},
): Promise<LatencyAndRate> {
  for (let i = 0; i < (options.warm ?? 50); i++) await once();
  const times: number[] = [];
  const until = performance.now() + seconds * 500;
  while (performance.now() < until) {
    const t0 = performance.now();
    await once();
    times.push(performance.now() - t0);
  }
  let done = 0;
  const start = performance.now();
  const stop = start + seconds * 500;
  await Promise.all(
    Array.from({ length: options.inFlight ?? 8 }, async () => {
      while (performance.now() < stop) {
        await once();
        done++;
      }
    }),
  );
  return { ...p50p99(times), rps: done / ((performance.now() - start) / 1000) };
}
