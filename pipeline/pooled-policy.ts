import { deserialize, serialize } from 'node:v8';
import type { ResolvedPolicy } from './policy/types.ts';

// A policy crosses to the pool's workers once per version, not with every task. A task carries the
// policy's version and its bytes (v8.serialize: what postMessage would have cloned) in shared memory,
// which a message shares rather than copies, so a task costs the same whatever the policy holds; a
// worker reads the bytes only when it has no plan of that version yet (plan.ts, PlanCache.getPooled).
// Cloned with every task, a policy cost 15 µs a task with ten patterns, 89 with 100, 357 with 500 (the
// clone's two halves; docs/decisions.md, "A policy crosses to the pool once per version").

export interface PooledPolicy {
  readonly version: string;
  /** The policy, v8.serialize'd, in a SharedArrayBuffer. */
  readonly bytes: Uint8Array;
}

const pooled = new WeakMap<ResolvedPolicy, PooledPolicy>();

/** The policy as a pool task carries it, made once per policy object (again if its version changed). */
export function pooledPolicy(policy: ResolvedPolicy): PooledPolicy {
  const known = pooled.get(policy);
  if (known !== undefined && known.version === policy.version) return known;
  const serialized = serialize(policy);
  const bytes = new Uint8Array(new SharedArrayBuffer(serialized.length));
  bytes.set(serialized);
  const made = { version: policy.version, bytes };
  pooled.set(policy, made);
  return made;
}

/** The policy a pool task carries, read back (a worker compiling its plan). */
export function readPooledPolicy(task: PooledPolicy): ResolvedPolicy {
  return deserialize(Buffer.from(task.bytes)) as ResolvedPolicy;
}
