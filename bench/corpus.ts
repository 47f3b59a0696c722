// Generated LLM-like JSON request bodies: a system prompt, user and assistant turns mixing prose, code
// (with the \n and \" escapes real clients send), numbers and ids, and, at a realistic rate, the things
// the inspectors look for (an email, a card, an SSN, an API key, a custom-pattern hit, a secret).
// Deterministic: the same size always gives the same body.

const WORDS = (
  'the of and to in is you that it he was for on are as with his they at be this have from or one had by word ' +
  'but not what all were we when your can said there use an each which she do how their if will up other about out many ' +
  'then them these so some her would make like him into time has look two more write go see number no way could people ' +
  'function return value request response model token stream error retry timeout deploy cluster service query index'
).split(' ');

const CODE = [
  'function handler(req, res) {\n  const body = JSON.parse(req.body);\n  if (!body.ok) return res.status(400).send("bad");\n}\n',
  // biome-ignore lint/suspicious/noTemplateCurlyInString: code as text, a template literal included
  'for (let i = 0; i < items.length; i++) {\n\tconsole.log(`item ${i}: ${items[i].name}`);\n}\n',
  'SELECT id, name, created_at FROM users WHERE org_id = 42 ORDER BY created_at DESC LIMIT 100;\n',
  'def retry(fn, attempts=3):\n    for n in range(attempts):\n        try:\n            return fn()\n        except Exception as e:\n            print("retry", n, e)\n',
];

const SENSITIVE = [
  'contact jane.doe@example.com for access',
  'card on file 4111 1111 1111 1111 exp 12/28',
  'employee ssn 123-45-6789 in the HR export',
  'set ANTHROPIC_API_KEY=sk-ant-api03-Xy7Qp2Lr9Vt4Kw8Zn1Bc6Df3Gh5Jm0Ns',
  'the Project Nightingale launch moves to Q3',
  'db password is s3cr3t-db-password-2026 do not share',
];

export const BENCH_SECRETS = [
  's3cr3t-db-password-2026',
  'xoxb-2231-slack-bot-token-value',
  'vault-root-token-9f8e7d6c',
];

// Ten custom patterns of the kind operators write (codenames, hostnames, ticket ids, tokens).
export const BENCH_PATTERNS = [
  { pattern: '(?i)project[- ]nightingale', description: 'codename', severity: 'block' },
  { pattern: '\\b[a-z0-9-]+\\.corp\\.example\\.com\\b', description: 'internal host', severity: 'warn' },
  { pattern: '\\bINC-[0-9]{6}\\b', description: 'incident id', severity: 'log' },
  { pattern: '(?i)confidential[: ]+internal', description: 'marking', severity: 'warn' },
  { pattern: '-----BEGIN [A-Z ]*PRIVATE KEY-----', description: 'private key', severity: 'block' },
  { pattern: '\\bxox[baprs]-[0-9A-Za-z-]{10,}', description: 'slack token', severity: 'block' },
  {
    pattern: '\\b(?:10|192\\.168)\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\b',
    description: 'private ip',
    severity: 'log',
  },
  { pattern: '(?i)\\bpassword\\s*[:=]\\s*\\S{6,}', description: 'password assignment', severity: 'warn' },
  { pattern: '\\bacct_[0-9]{8,12}\\b', description: 'account id', severity: 'warn' },
  {
    pattern: 'eyJ[A-Za-z0-9_-]{10,}\\.eyJ[A-Za-z0-9_-]{10,}\\.[A-Za-z0-9_-]{10,}',
    description: 'jwt',
    severity: 'warn',
  },
] as const;

/** The pipeline bench's policy: model allowlist, every built-in, and the ten patterns. */
export const FULL_SET_DOCUMENT = {
  model_policy: { mode: 'allowlist', models: ['claude-*', 'gpt-4o*'] },
  content_inspection: {
    secrets_filter: { enabled: true, severity: 'block' },
    pii_detection: { enabled: true, severity: 'warn' },
    api_key_detection: { enabled: true, severity: 'block' },
    patterns: BENCH_PATTERNS,
  },
};

/** A small deterministic generator (mulberry32): the same seed, the same bodies. */
export function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A request body of about `bytes` bytes; one sensitive snippet per ~64 KB (at least one). */
export function llmRequestBody(bytes: number, seed = 1): Buffer {
  const rand = rng(seed);
  const messages: { role: string; content: string }[] = [];
  let size = 120;
  let sensitiveAt = 0;
  let turn = 0;
  while (size < bytes) {
    let text = '';
    const target = Math.min(bytes - size, 600 + Math.floor(rand() * 3000));
    while (text.length < target) {
      const r = rand();
      if (r < 0.1) text += CODE[Math.floor(rand() * CODE.length)];
      else if (r < 0.15) text += ` ${Math.floor(rand() * 100000)} `;
      else {
        for (let i = 0; i < 12; i++) text += WORDS[Math.floor(rand() * WORDS.length)] + ' ';
        text += rand() < 0.5 ? '. ' : ',\n';
      }
    }
    if (size >= sensitiveAt) {
      text += ' ' + SENSITIVE[Math.floor(rand() * SENSITIVE.length)] + ' ';
      sensitiveAt += 64 * 1024;
    }
    messages.push({ role: turn++ % 2 === 0 ? 'user' : 'assistant', content: text });
    size += JSON.stringify(text).length + 30;
  }
  return Buffer.from(
    JSON.stringify({
      model: 'claude-sonnet-4-5',
      max_tokens: 4096,
      system: 'You are a careful coding assistant.',
      messages,
    }),
  );
}

/**
 * The corpus body with one "…" (U+2026, which NFKC turns into "...") at the start of its first message:
 * real model text holds such characters (an ellipsis, a no-break space, a zero-width joiner in an
 * emoji), and one anywhere makes the normalized view differ from the decoded one, so every inspector
 * that reads it runs over that view as well.
 */
export function withOneNormalized(body: Buffer): Buffer {
  const at = body.indexOf('"content":"') + '"content":"'.length;
  return Buffer.concat([body.subarray(0, at), Buffer.from('…'), body.subarray(at)]);
}

/**
 * The body with a `…` at the start of a message's text about every `every` bytes: model text as it
 * comes, a few characters apart that the normalized view changes.
 */
export function withNormalizedEvery(body: Buffer, every: number): Buffer {
  const marker = Buffer.from('"content":"');
  const out: Buffer[] = [];
  let from = 0;
  for (let at = body.indexOf(marker); at >= 0; at = body.indexOf(marker, from + every)) {
    const text = at + marker.length;
    out.push(body.subarray(from, text), Buffer.from('…'));
    from = text;
  }
  out.push(body.subarray(from));
  return Buffer.concat(out);
}

/**
 * Request bodies that differ in every message: the corpus body with a fixed-width counter at the start
 * of each message's text, rewritten per request in a copy. Parts never repeat, so a per-part inspection
 * cache cannot make a contender look faster than it is on fresh traffic.
 */
export function freshBodies(template: Buffer): () => Buffer {
  const marker = Buffer.from('"content":"');
  const width = 10;
  const parts: Buffer[] = [];
  const slots: number[] = [];
  let from = 0;
  let length = 0;
  for (let at = template.indexOf(marker); at >= 0; at = template.indexOf(marker, at + 1)) {
    const head = template.subarray(from, at + marker.length);
    parts.push(head, Buffer.from(`${'0'.repeat(width)} `));
    length += head.length;
    slots.push(length);
    length += width + 1;
    from = at + marker.length;
  }
  parts.push(template.subarray(from));
  const body = Buffer.concat(parts);
  let n = 0;
  return () => {
    const copy = Buffer.from(body);
    const tag = (n++).toString(36).padStart(width, '0');
    for (const slot of slots) copy.write(tag, slot, width, 'latin1');
    return copy;
  };
}
