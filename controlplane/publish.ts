import { join } from 'node:path';
import { mkdir } from 'node:fs/promises';
import { writeFileAtomic } from '../core/atomic-file.ts';
import { coalesced } from '../core/coalesce.ts';
import type { Logger } from '../core/logger.ts';
import type { EventHub } from './events.ts';
import type { Queryable } from '../core/sql.ts';

// --policy-publish / --config-publish: for an enclave co-located with the control plane, the same
// state `dvx policy-pull` / `dvx config-pull` would write, written by the control plane itself into a
// directory (`policy-snapshot.json`, `config.json`) at start and after every committed change, only when
// it changed. `--policy-org` / `--config-org` narrow it to one org.

export interface PublisherOptions {
  db: Queryable;
  hub: EventHub;
  dir: string;
  file: string;
  enclaveId: string;
  org: string;
  build: (db: Queryable, enclaveId: string, org?: string) => Promise<unknown>;
  log: Logger;
}

export async function startPublisher(o: PublisherOptions): Promise<() => void> {
  await mkdir(o.dir, { recursive: true });
  const path = join(o.dir, o.file);
  let last = '';
  const publish = coalesced(async () => {
    try {
      const doc = await o.build(o.db, o.enclaveId, o.org || undefined);
      if (!doc) return void o.log.warn({ enclave: o.enclaveId }, 'publish: no such enclave (yet)');
      const key = JSON.stringify({ ...(doc as object), version: undefined });
      if (key === last) return;
      await writeFileAtomic(path, JSON.stringify(doc, null, 2) + '\n');
      last = key;
      o.log.info({ path, version: (doc as { version?: string }).version }, 'published');
    } catch (err) {
      o.log.error({ err, path }, 'publish failed');
    }
  });
  await publish();
  return o.hub.onWake(() => void publish());
}
