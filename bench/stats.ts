// Order statistics of a benchmark's samples. One definition for every bench: the q-quantile is the
// sample at floor(q·n) of the sorted samples (the last one at most); NaN when there are none.

export function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
}

export function median(xs: number[]): number {
  return quantile(xs, 0.5);
}

export function p50p99(xs: number[]): { p50: number; p99: number } {
  const s = [...xs].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
  return { p50: at(0.5), p99: at(0.99) };
}
