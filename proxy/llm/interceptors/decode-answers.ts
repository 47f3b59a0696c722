import type { IncomingHttpHeaders } from 'node:http';
import type { Duplex, Transform } from 'node:stream';
import { createBrotliDecompress, createGunzip, createInflate, createInflateRaw, createZstdDecompress } from 'node:zlib';
import type { Dispatcher } from 'undici';
import { own } from '../../../core/own.ts';

// An undici interceptor (composed on the upstream dispatcher, upstream.ts) that undoes the content
// coding of an answer, for an upstream that compresses although we asked for `identity`
// (scrub-headers.ts): the proxy must read what it inspects, meters and translates, and the agent then
// gets the plain bytes (the coding's header is dropped). A coding we do not know is left as it came
// (upstream.ts reports it). Answers without a body (to HEAD, 1xx, 204, 304) are left as they are.
//
// Not undici's own `interceptors.decompress`: it reads "deflate" as the zlib wrapper only, where some
// servers send raw deflate (docs/decisions.md, "The request path as steps"). Like it, the decoder is
// pulled only as fast as the reader takes its output, so a small compressed answer never inflates
// faster than it is consumed: a full decoder pauses the upstream, a paused reader stops the decoder.

// zlib-wrapped deflate (RFC 9110 says "deflate" is that) or, as some servers send it, raw deflate.
const zlibWrapped = (first: Buffer) =>
  first.length >= 2 && (first[0] & 0x0f) === 8 && ((first[0] << 8) | first[1]) % 31 === 0;
const inflate = (first: Buffer) => (zlibWrapped(first) ? createInflate() : createInflateRaw());
const DECODERS: Record<string, (first: Buffer) => Transform> = {
  gzip: () => createGunzip(),
  'x-gzip': () => createGunzip(),
  deflate: inflate,
  br: () => createBrotliDecompress(),
  zstd: () => createZstdDecompress(),
};

export function decodeAnswers(): Dispatcher.DispatcherComposeInterceptor {
  return (dispatch) => (opts, handler) =>
    opts.method === 'HEAD' ? dispatch(opts, handler) : dispatch(opts, new Decoding(handler));
}

/** The handler between the dispatcher and the reader, and the controller the reader pauses and resumes. */
class Decoding implements Dispatcher.DispatchHandler, Dispatcher.DispatchController {
  #down: Dispatcher.DispatchHandler;
  #up: Dispatcher.DispatchController | null = null;
  /** The decoder's maker, when the answer has a coding we undo. */
  #make: ((first: Buffer) => Transform) | null = null;
  #decoder: Transform | null = null;
  /** The first bytes, until there are two to choose the decoder by. */
  #head: Buffer | null = null;
  #trailers: IncomingHttpHeaders = {};
  #inputEnded = false;
  #done = false;
  #errored = false;
  #paused = false;

  constructor(handler: Dispatcher.DispatchHandler) {
    this.#down = handler;
  }

  get aborted(): boolean {
    return this.#up?.aborted ?? false;
  }

  get paused(): boolean {
    return this.#paused;
  }

  get reason(): Error | null {
    return this.#up?.reason ?? null;
  }

  pause(): void {
    this.#paused = true;
    this.#up?.pause();
  }

  resume(): void {
    this.#paused = false;
    this.#up?.resume();
    if (this.#decoder) this.#drain();
  }

  abort(reason: Error): void {
    this.#decoder?.destroy();
    if (this.#inputEnded && this.#make) this.#fail(reason);
    else this.#up?.abort(reason);
  }

  onRequestStart(controller: Dispatcher.DispatchController, context: unknown): void {
    this.#up = controller;
    this.#down.onRequestStart?.(this, context);
  }

  onRequestUpgrade(
    _controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: IncomingHttpHeaders,
    socket: Duplex,
  ): void {
    this.#down.onRequestUpgrade?.(this, statusCode, headers, socket);
  }

  onResponseStart(
    controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: IncomingHttpHeaders,
    statusMessage?: string,
  ): void {
    this.#up = controller;
    const coding = String(headers['content-encoding'] ?? '')
      .trim()
      .toLowerCase();
    const bodiless = statusCode < 200 || statusCode === 204 || statusCode === 304;
    this.#make = coding === '' || coding === 'identity' || bodiless ? null : (own(DECODERS, coding) ?? null);
    if (this.#make) {
      const { 'content-encoding': _coding, 'content-length': _length, ...plain } = headers;
      headers = plain;
    }
    this.#down.onResponseStart?.(this, statusCode, headers, statusMessage);
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (!this.#make) {
      this.#down.onResponseData?.(this, chunk);
      return;
    }
    if (this.#decoder) {
      this.#write(chunk);
      return;
    }
    const head = this.#head ? Buffer.concat([this.#head, chunk]) : chunk;
    if (head.length < 2) this.#head = head;
    else this.#start(head);
  }

  onResponseEnd(_controller: Dispatcher.DispatchController, trailers: IncomingHttpHeaders): void {
    if (!this.#make) {
      this.#down.onResponseEnd?.(this, trailers);
      return;
    }
    this.#inputEnded = true;
    this.#trailers = trailers;
    if (!this.#decoder) {
      // An empty body stays empty (zlib refuses empty input).
      if (this.#head === null) {
        this.#finish();
        return;
      }
      this.#start(this.#head);
    }
    this.#decoder!.end();
  }

  onResponseError(_controller: Dispatcher.DispatchController, err: Error): void {
    this.#decoder?.destroy();
    if (this.#errored) return;
    this.#errored = true;
    this.#done = true;
    this.#down.onResponseError?.(this, err);
  }

  #start(first: Buffer): void {
    this.#head = null;
    const decoder = this.#make!(first);
    this.#decoder = decoder;
    decoder.on('readable', () => this.#drain());
    decoder.on('end', () => this.#finish());
    decoder.on('error', (err: Error) => this.#fail(err));
    decoder.on('drain', () => {
      if (!this.#paused && !this.#inputEnded) this.#up?.resume();
    });
    this.#write(first);
  }

  #write(chunk: Buffer): void {
    if (!this.#decoder!.write(chunk)) this.#up?.pause();
  }

  #drain(): void {
    const decoder = this.#decoder!;
    let out: Buffer | null;
    while (!this.#paused && !this.#done && (out = decoder.read() as Buffer | null) !== null) {
      this.#down.onResponseData?.(this, out);
    }
  }

  #finish(): void {
    if (this.#done) return;
    this.#done = true;
    this.#down.onResponseEnd?.(this, this.#trailers);
  }

  /** A corrupt body: the reader's loop errors (once the input has ended, the dispatcher no longer can). */
  #fail(err: Error): void {
    if (this.#done) return;
    this.#decoder?.destroy();
    if (this.#inputEnded) this.onResponseError(this, err);
    else {
      this.#done = true;
      this.#up?.abort(err);
    }
  }
}
