// Deadlines in wall-clock time (a credential's `exp`, a certificate's notAfter) for many items, kept in
// one binary min-heap under one timer armed for the earliest (docs/decisions.md, "A flow ends with its
// credential"). Adding and removing are O(log n); an item is removed by the handle `add` returned, so
// a flow that ends long before its deadline leaves nothing behind. The timer is re-armed for the next
// deadline each time it fires, and never for more than node's longest delay (2^31-1 ms, ~24.8 days;
// node would take a longer one as 1 ms): a farther deadline is reached by re-arming. A wall clock that
// is set makes it fire early or late; only what is due by the clock is handed over, the rest re-armed.
// It is unref'd: it never keeps a process alive.

/** setTimeout's longest delay. */
const MAX_DELAY_MS = 2 ** 31 - 1;

/** What `add` returns: the handle that removes the item. */
export interface Deadline<T> {
  readonly at: number;
  readonly item: T;
}

interface Entry<T> extends Deadline<T> {
  /** Its place in the heap; -1 once removed or handed over. */
  index: number;
}

export class DeadlineQueue<T> {
  readonly #heap: Entry<T>[] = [];
  readonly #due: (items: T[]) => void;
  readonly #now: () => number;
  #timer: NodeJS.Timeout | null = null;
  /** The deadline the timer is armed for (Infinity: not armed). */
  #armedFor = Number.POSITIVE_INFINITY;

  /** `due` gets, in deadline order, every item whose deadline has passed (never inside `add`). */
  constructor(due: (items: T[]) => void, now: () => number = Date.now) {
    this.#due = due;
    this.#now = now;
  }

  get size(): number {
    return this.#heap.length;
  }

  /** Adds `item`, due at `at` (ms since the epoch); a deadline already passed is due on the next turn. */
  add(at: number, item: T): Deadline<T> {
    // A deadline that is no number is due at once (fail closed), never a heap it would disorder.
    const entry: Entry<T> = { at: Number.isNaN(at) ? 0 : at, item, index: this.#heap.length };
    this.#heap.push(entry);
    this.#up(entry.index);
    this.#arm();
    return entry;
  }

  /** Removes what `add` returned; nothing when it was removed or handed over already. */
  remove(deadline: Deadline<T>): void {
    const entry = deadline as Entry<T>;
    const i = entry.index;
    if (i < 0 || this.#heap[i] !== entry) return;
    entry.index = -1;
    const last = this.#heap.pop()!;
    if (last !== entry) {
      this.#heap[i] = last;
      last.index = i;
      this.#down(i);
      this.#up(last.index);
    }
    if (this.#heap.length === 0) this.#disarm();
  }

  /** Stops the timer and forgets every item. */
  clear(): void {
    for (const e of this.#heap) e.index = -1;
    this.#heap.length = 0;
    this.#disarm();
  }

  #arm(): void {
    const first = this.#heap[0];
    if (first === undefined) {
      this.#disarm();
      return;
    }
    if (this.#timer !== null && first.at >= this.#armedFor) return;
    this.#disarm();
    const delay = Math.min(MAX_DELAY_MS, Math.max(0, first.at - this.#now()));
    this.#armedFor = first.at;
    this.#timer = setTimeout(() => this.#fire(), delay);
    this.#timer.unref();
  }

  #disarm(): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    this.#armedFor = Number.POSITIVE_INFINITY;
  }

  #fire(): void {
    this.#timer = null;
    this.#armedFor = Number.POSITIVE_INFINITY;
    const now = this.#now();
    const due: T[] = [];
    while (this.#heap.length > 0 && this.#heap[0].at <= now) {
      const entry = this.#heap[0];
      this.remove(entry);
      due.push(entry.item);
    }
    this.#arm();
    if (due.length > 0) this.#due(due);
  }

  #up(i: number): void {
    const heap = this.#heap;
    const entry = heap[i];
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (heap[parent].at <= entry.at) break;
      heap[i] = heap[parent];
      heap[i].index = i;
      i = parent;
    }
    heap[i] = entry;
    entry.index = i;
  }

  #down(i: number): void {
    const heap = this.#heap;
    const entry = heap[i];
    const n = heap.length;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= n) break;
      const right = left + 1;
      const child = right < n && heap[right].at < heap[left].at ? right : left;
      if (heap[child].at >= entry.at) break;
      heap[i] = heap[child];
      heap[i].index = i;
      i = child;
    }
    heap[i] = entry;
    entry.index = i;
  }
}
