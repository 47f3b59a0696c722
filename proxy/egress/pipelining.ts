import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';

// One request at a time per connection (docs/gateway.md, "Interception and capture", "Limits").
//
// node parses every request an agent pipelines (HTTP/1.1 lets a client send the next request before
// the answer to the one before) and emits each at once; it only queues their answers. An exchange
// reads a captured body whole (up to 32 MB) before it sends it: were the pipelined requests all served
// as they are parsed, one connection could hold any number of 32 MB bodies while a slow destination
// keeps them, and the gateway's memory would be the agent's to fill. So a request is served only when
// its answer has the connection: node hands the connection to an answer once the one before it is
// done (the response's 'socket' event), which is also the order the agent reads them in.
//
//   the first request               served at once
//   a request behind another        waits; the connection is paused, so its body (and what follows)
//                                   stays in the kernel, not in memory
//   more than MAX_PIPELINED waiting the connection is closed: an agent that pipelines a flood gets
//                                   nothing served past the one in flight
//   the connection closes first     the request is dropped, never served

/** Requests of one connection that may wait for the one in flight; one more closes the connection. */
export const MAX_PIPELINED = 32;

const waiting = new WeakMap<Duplex, number>();

/**
 * Calls `serve` once `res` has its turn on the connection (at once when nothing is before it), or
 * `dropped` (with why) when the connection closes first or too many requests already wait on it.
 */
export function inTurn(
  req: IncomingMessage,
  res: ServerResponse,
  serve: () => void,
  dropped: (why: string) => void,
): void {
  if (res.socket !== null) {
    serve();
    return;
  }
  const socket = req.socket;
  const count = (waiting.get(socket) ?? 0) + 1;
  if (count > MAX_PIPELINED) {
    dropped(`more than ${MAX_PIPELINED} pipelined requests waited on the connection: it was closed`);
    socket.destroy();
    return;
  }
  waiting.set(socket, count);
  // Nothing more is parsed from the connection while requests wait (node reads on as they are served).
  socket.pause();
  const left = () => {
    const n = (waiting.get(socket) ?? 1) - 1;
    waiting.set(socket, n);
    if (n === 0 && !socket.destroyed) socket.resume();
  };
  const onSocket = () => {
    res.off('close', onClose);
    left();
    serve();
  };
  const onClose = () => {
    res.off('socket', onSocket);
    left();
    dropped('the connection closed while the request waited for the one before it (pipelined)');
  };
  res.once('socket', onSocket);
  res.once('close', onClose);
}
