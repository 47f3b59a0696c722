import { chmod, lstat, mkdir, stat, unlink } from 'node:fs/promises';
import { connect, type Server } from 'node:net';
import { dirname } from 'node:path';
import type { Logger } from '../../core/logger.ts';
import { ImdsSocketError } from './errors.ts';

// The unix socket imds serves on (docs/imds.md, "The socket"): its file permissions are the access
// control, as a cloud metadata service's link-local address is.
//
//   start   the directory is made if missing (0755), and refused when every local user may write to
//           it (o+w without the sticky bit); a socket file left at the path is probed:
//           nothing accepts → stale (a crashed imds): removed; something accepts → refused
//           (ImdsSocketError), never removed; anything that is not a socket → refused, never removed
//   bind    under umask 0177, so the socket never exists with wider bits than owner rw, then
//           chmod to --imds-socket-mode
//   close   removed, if the path still holds the socket this process bound (same inode)

/** How long a probe of an existing socket may take; a server that accepts answers at once. */
const PROBE_TIMEOUT_MS = 1000;

/** `stale`: nothing accepts; `live`: a server accepted; otherwise the error code that leaves it unknown. */
type Probe = 'stale' | 'live' | string;

function probe(path: string): Promise<Probe> {
  return new Promise((resolve) => {
    const socket = connect({ path });
    const done = (result: Probe) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(result);
    };
    // A listener that never accepts in time counts as live: what cannot be shown dead is not removed.
    const timer = setTimeout(() => done('ETIMEDOUT'), PROBE_TIMEOUT_MS);
    socket.once('connect', () => done('live'));
    socket.once('error', (err: NodeJS.ErrnoException) =>
      done(err.code === 'ECONNREFUSED' || err.code === 'ENOENT' ? 'stale' : (err.code ?? 'unknown')),
    );
  });
}

/** Makes the directory and clears a stale socket; throws ImdsSocketError when the path is taken. */
export async function prepareSocketPath(path: string, log: Logger): Promise<void> {
  const dir = dirname(path);
  try {
    await mkdir(dir, { recursive: true, mode: 0o755 });
  } catch (err) {
    throw new ImdsSocketError(
      `cannot make the directory ${dir} of --imds-socket: ${(err as NodeJS.ErrnoException).code ?? 'failed'}`,
      { cause: err },
    );
  }
  // In a directory every local user may write to (and without the sticky bit, which keeps them from
  // removing what is not theirs), anyone could replace the socket with their own and answer the agent.
  const d = await stat(dir);
  if (d.mode & 0o002 && !(d.mode & 0o1000))
    throw new ImdsSocketError(
      `the directory ${dir} of --imds-socket is writable by every local user: anyone could replace the socket`,
    );
  const found = await lstat(path).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return null;
    throw new ImdsSocketError(`cannot inspect --imds-socket ${path}: ${err.code ?? 'failed'}`, { cause: err });
  });
  if (found === null) return;
  if (!found.isSocket())
    throw new ImdsSocketError(`--imds-socket ${path} exists and is not a socket; imds does not remove it`);
  const state = await probe(path);
  if (state === 'live')
    throw new ImdsSocketError(`another server answers on --imds-socket ${path}; refusing to take it over`);
  if (state !== 'stale')
    throw new ImdsSocketError(
      `cannot tell whether a server answers on --imds-socket ${path} (${state}); refusing to remove it`,
    );
  await unlink(path).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return;
    throw new ImdsSocketError(`cannot remove the stale socket ${path}: ${err.code ?? 'failed'}`, { cause: err });
  });
  log.info({ socket: path }, 'stale imds socket removed (nothing answered on it)');
}

export interface BoundSocket {
  /** Removes the socket file, if it is still the one bound here. */
  remove(): Promise<void>;
}

/** Binds `server` on `path` with owner-only bits, then sets `mode`; the file is the process's to remove. */
export async function listenOnSocket(server: Server, path: string, mode: number, log: Logger): Promise<BoundSocket> {
  await new Promise<void>((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException) =>
      reject(new ImdsSocketError(`cannot listen on --imds-socket ${path}: ${err.code ?? err.message}`, { cause: err }));
    server.once('error', onError);
    // bind(2) creates the file with the process's umask: narrowed for the one synchronous bind, so the
    // socket is never connectable by others between bind and chmod.
    const umask = process.umask(0o177);
    try {
      server.listen(path, () => {
        server.off('error', onError);
        resolve();
      });
    } finally {
      process.umask(umask);
    }
  });
  let ino: number;
  try {
    ino = (await lstat(path)).ino;
    await chmod(path, mode);
  } catch (err) {
    server.close();
    throw new ImdsSocketError(
      `cannot set the mode of --imds-socket ${path}: ${(err as NodeJS.ErrnoException).code ?? 'failed'}`,
      { cause: err },
    );
  }
  return {
    async remove() {
      try {
        const now = await lstat(path);
        if (now.isSocket() && now.ino === ino) await unlink(path);
      } catch (err) {
        // Gone already (node unlinks a unix socket when its server closes): nothing left to remove.
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT')
          log.warn({ err, socket: path }, 'imds socket not removed');
      }
    },
  };
}
