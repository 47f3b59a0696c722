// Lookups keyed by outside input (a token's claims, a snapshot's ids, a body's or an upstream's
// strings) read a record's own entries only: `record['__proto__']` or `record['constructor']` on a
// plain object is Object.prototype's, never an entry (docs/decisions.md, "Ids named like Object.prototype members are
// ids"). Records built from such keys have no prototype at all (`dict`).

/** `record[key]` when it is the record's own entry; undefined otherwise (never an inherited member). */
export function own<T>(record: Readonly<Record<string, T>>, key: string): T | undefined {
  return Object.hasOwn(record, key) ? record[key] : undefined;
}

/** An empty record without a prototype: any key, `__proto__` included, is an entry like any other. */
export function dict<T>(): Record<string, T> {
  return Object.create(null) as Record<string, T>;
}
