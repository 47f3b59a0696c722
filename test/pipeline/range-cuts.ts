import { isEdge } from '../../pipeline/byte-ranges.ts';

// Where the byte-range tests cut a body: every edge it has (byte-ranges.ts, isEdge), and a few of them
// chosen by a property test's random picks.

/** Every edge of `body`, ascending. */
export function edgesOf(body: Uint8Array): number[] {
  const edges: number[] = [];
  for (let e = 1; e < body.length; e++) if (isEdge(body, e)) edges.push(e);
  return edges;
}

/** The edges `picks` name (each modulo the edge count), distinct and ascending; none when there is no edge. */
export function pickedEdges(body: Uint8Array, picks: readonly number[]): number[] {
  const edges = edgesOf(body);
  if (edges.length === 0) return [];
  return [...new Set(picks.map((p) => edges[p % edges.length]))].sort((a, b) => a - b);
}
