import { table } from './measure.ts';

// What a benchmark hands back to `npm run bench -- all`: the rows of its summary (ours against the
// floor or a peer, as a ratio). Its table is what it prints on stdout. A bench's main() may return a
// BenchResult; for one that returns nothing, the runner reads the ratios from its printed tables by
// column name (extractSummary), so a bench edited elsewhere keeps working as long as its headers do.

export interface SummaryRow {
  bench: string;
  measure: string;
  ours: string;
  baseline: string;
  /** ours / baseline in the measure's own unit (time: lower is better; throughput: said in `measure`). */
  ratio: number | null;
  goal?: string;
}

export interface BenchResult {
  summary: SummaryRow[];
}

/** The env variable through which `all` asks a bench's process to write its returned summary (JSON). */
export const SUMMARY_FILE_ENV = 'DVX_BENCH_SUMMARY_FILE';

export function formatRatio(r: number | null): string {
  return r === null || !Number.isFinite(r) ? '—' : `${r.toFixed(2)}×`;
}

export function summaryTable(rows: SummaryRow[]): string {
  return table(
    ['bench', 'measure', 'ours', 'baseline', 'ours / baseline', 'goal'],
    rows.map((r) => [r.bench, r.measure, r.ours, r.baseline, formatRatio(r.ratio), r.goal ?? '']),
  );
}

/** '208 µs', '4.45 ms', '617 ms', '1.2 s' → milliseconds (NaN when it is not a time). */
export function parseMs(cell: string): number {
  const m = /(-?[\d.]+)\s*(µs|ms|s)\b/.exec(cell);
  if (!m) return NaN;
  const v = Number(m[1]);
  return m[2] === 'µs' ? v / 1000 : m[2] === 's' ? v * 1000 : v;
}

interface ParsedTable {
  header: string[];
  rows: Record<string, string>[];
}

/** Every markdown table in a bench's output, rows keyed by header. */
export function parseTables(markdown: string): ParsedTable[] {
  const tables: ParsedTable[] = [];
  const lines = markdown.split('\n');
  for (let i = 0; i + 1 < lines.length; i++) {
    if (!lines[i].startsWith('|') || !/^\|[-| ]+\|$/.test(lines[i + 1].trim())) continue;
    const cells = (l: string) =>
      l
        .trim()
        .replace(/^\||\|$/g, '')
        .split('|')
        .map((c) => c.trim());
    const header = cells(lines[i]);
    const rows: Record<string, string>[] = [];
    let j = i + 2;
    for (; j < lines.length && lines[j].startsWith('|'); j++) {
      const c = cells(lines[j]);
      rows.push(Object.fromEntries(header.map((h, k) => [h, c[k] ?? ''])));
    }
    tables.push({ header, rows });
    i = j - 1;
  }
  return tables;
}

function findTable(markdown: string, columns: string[]): ParsedTable | undefined {
  return parseTables(markdown).find((t) => columns.every((c) => t.header.includes(c)));
}

function missing(bench: string, what: string): SummaryRow[] {
  return [{ bench, measure: `(no table with ${what} in its output)`, ours: '', baseline: '', ratio: null }];
}

const num = (s: string | undefined) => Number.parseFloat(s ?? '');

/** The summary of a bench that printed its tables and returned nothing, read by column name. */
export function extractSummary(bench: string, markdown: string): SummaryRow[] {
  const extract = EXTRACTORS[bench];
  return extract ? extract(markdown) : [];
}

const EXTRACTORS: Record<string, (md: string) => SummaryRow[]> = {
  pipeline(md) {
    const t = findTable(md, ['body', 'contender', 'MB/s (p50)', 'p50']);
    if (!t) return missing('pipeline', '"body, contender, MB/s (p50), p50"');
    const out: SummaryRow[] = [];
    const bodies = [...new Set(t.rows.map((r) => r.body))];
    for (const body of bodies) {
      const at = (prefix: string) => t.rows.find((r) => r.body === body && r.contender.startsWith(prefix));
      const ours = at('ours: full set, inline');
      if (!ours) continue;
      for (const [label, prefix] of [
        ['V8 RegExp, same 10 patterns', 'V8 RegExp: same 10 patterns'],
        ['redact-pii', 'peer: redact-pii'],
      ] as const) {
        const peer = at(prefix);
        if (peer)
          out.push({
            bench: 'pipeline',
            measure: `${body}: full set p50 vs ${label}`,
            ours: ours.p50,
            baseline: peer.p50,
            ratio: parseMs(ours.p50) / parseMs(peer.p50),
          });
      }
      if (/MB/.test(body))
        out.push({
          bench: 'pipeline',
          measure: `${body}: full set throughput (MB/s) vs the 500 MB/s goal`,
          ours: `${ours['MB/s (p50)']} MB/s`,
          baseline: '500 MB/s',
          ratio: num(ours['MB/s (p50)']) / 500,
          goal: '≥ 1.00× (higher is better)',
        });
    }
    return out;
  },
  proxy(md) {
    const t = findTable(md, ['contender', 'body', 'req/s offered', 'p50 added', 'p50 added / floor']);
    if (!t) return missing('proxy', '"contender, body, req/s offered, p50 added, p50 added / floor"');
    const out: SummaryRow[] = [];
    // Each dvx row with the full set on (one row per --workers N), against the floor run on the same
    // cores and against Portkey with its regex guardrail, at the same body and rate: the bench's own ratios.
    for (const r of t.rows.filter((x) => x.contender.startsWith('dvx: full'))) {
      const workers = /--workers \d+/.exec(r.contender)?.[0] ?? '';
      const where = `${r.body} at ${r['req/s offered']} req/s${workers ? `, ${workers}` : ''}`;
      for (const [label, column, goal] of [
        ['p50 added vs the floor', 'p50 added / floor', '≤ 1.2×'],
        ['p99 added vs the floor', 'p99 added / floor', '≤ 1.2×'],
        ['p50 added vs Portkey + regex guardrail', 'p50 added / Portkey+guardrail', '< 1×'],
      ] as const) {
        const ratio = Number.parseFloat(r[column] ?? '');
        if (Number.isFinite(ratio))
          out.push({
            bench: 'proxy',
            measure: `${where}: ${label}`,
            ours: column.startsWith('p99') ? r['p99 added'] : r['p50 added'],
            baseline: '',
            ratio,
            goal,
          });
      }
    }
    return out;
  },
  wal(md) {
    const t = findTable(md, ['appenders', 'contender', 'records/s']);
    if (!t) return missing('wal', '"appenders, contender, records/s"');
    const out: SummaryRow[] = [];
    for (const n of [...new Set(t.rows.map((r) => r.appenders))]) {
      const ours = t.rows.find((r) => r.appenders === n && r.contender.startsWith('ours'));
      const base = t.rows.find((r) => r.appenders === n && r.contender.startsWith('baseline'));
      if (ours && base)
        out.push({
          bench: 'wal',
          measure: `${n} appenders: durable records/s vs fdatasync per record (higher is better)`,
          ours: ours['records/s'],
          baseline: base['records/s'],
          ratio: num(ours['records/s']) / num(base['records/s']),
        });
      if (ours && n === '256')
        out.push({
          bench: 'wal',
          measure: '256 appenders: records/s vs the 100,000/s goal',
          ours: ours['records/s'],
          baseline: '100000',
          ratio: num(ours['records/s']) / 100_000,
          goal: '≥ 1.00× (higher is better)',
        });
    }
    return out;
  },
  controlplane: (md) => versusFloor('controlplane', md, 'contender', 'p50 vs floor'),
  broker: (md) => versusFloor('broker', md, 'contender', 'p50 vs floor'),
  'audit-query'(md) {
    const t = findTable(md, ['persona query', 'ours CH p50', 'baseline CH p50']);
    if (!t) return missing('audit-query', '"persona query, ours CH p50, baseline CH p50"');
    return t.rows.map((r) => ({
      bench: 'audit-query',
      measure: `${r['persona query']}: ClickHouse p50 vs one bare query`,
      ours: r['ours CH p50'],
      baseline: r['baseline CH p50'],
      ratio: parseMs(r['ours CH p50']) / parseMs(r['baseline CH p50']),
    }));
  },
  gateway(md) {
    const col = 'tunnel added p50 (× floor TLS)';
    const t = findTable(md, ['proxy', col, 'req/s (16 tunnels)']);
    if (!t) return missing('gateway', `"proxy, ${col}"`);
    const floor = t.rows.find((r) => r.proxy.startsWith('floor (node:net, TLS)'));
    const squid = t.rows.find((r) => r.proxy.startsWith('squid'));
    const out: SummaryRow[] = [];
    for (const r of t.rows.filter((x) => x.proxy.startsWith('dvx'))) {
      if (floor)
        out.push({
          bench: 'gateway',
          measure: `${r.proxy}: tunnel added p50 vs the TLS floor`,
          ours: r[col].replace(/\s*\(.*\)$/, ''),
          baseline: floor[col].replace(/\s*\(.*\)$/, ''),
          ratio: parseMs(r[col]) / parseMs(floor[col]),
        });
      if (squid)
        out.push({
          bench: 'gateway',
          measure: `${r.proxy}: req/s through 16 tunnels vs squid (higher is better)`,
          ours: r['req/s (16 tunnels)'],
          baseline: squid['req/s (16 tunnels)'],
          ratio: num(r['req/s (16 tunnels)']) / num(squid['req/s (16 tunnels)']),
        });
    }
    return out;
  },
};

/**
 * Our rows against what the bench compares them with: the baseline row just before one (e.g. the call
 * straight to the upstream before the call through llmproxy), else the floor its own ratio column names.
 */
function versusFloor(bench: string, md: string, name: string, ratioCol: string): SummaryRow[] {
  const t = findTable(md, [name, 'p50', ratioCol]);
  if (!t) return missing(bench, `"${name}, p50, ${ratioCol}"`);
  const floors = t.rows.filter((r) => /^(floor|baseline)/.test(r[name]));
  const out: SummaryRow[] = [];
  t.rows.forEach((r, i) => {
    if (!r[name].startsWith('ours') || !Number.isFinite(num(r[ratioCol]))) return;
    const before = t.rows[i - 1];
    if (before?.[name].startsWith('baseline')) {
      out.push({
        bench,
        measure: `${r[name]}: p50 vs ${before[name]}`,
        ours: r.p50,
        baseline: before.p50,
        ratio: parseMs(r.p50) / parseMs(before.p50),
      });
      return;
    }
    const ratio = num(r[ratioCol]);
    // The floor it was compared with has this row's p50 / ratio as its own p50.
    const base = floors.find((f) => Math.abs(parseMs(f.p50) - parseMs(r.p50) / ratio) < parseMs(f.p50) * 0.05);
    out.push({
      bench,
      measure: `${r[name]}: p50 vs ${base ? base[name] : 'its floor'}`,
      ours: r.p50,
      baseline: base?.p50 ?? '',
      ratio,
    });
  });
  return out;
}
